//! Identifiers: node IDs (line index in the node config) and instance IDs (random per start).

use std::fmt;

/// A node's ID: its 0-based index among the entries of the node config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u16);

impl NodeId {
    /// The ID as an index into per-node vectors.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A daemon instance: drawn at random on every start, so a peer that reconnects with a
/// different value has restarted and lost everything it knew.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InstanceId(pub u64);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// One inbound connection, as the daemon numbers them. A peer's identity belongs to the
/// connection whose hello proved it; every later request on it is that peer's.
pub type ConnId = u64;
