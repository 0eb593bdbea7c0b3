//! The node map: every node of the domain by ID, and the digest peers compare.

use sha2::{Digest, Sha256};

use crate::ids::NodeId;

/// The ordered list of node-config entries. Index = node ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMap {
    hosts: Vec<String>,
    digest: String,
}

impl NodeMap {
    /// Builds the map from node-config entries in file order.
    pub fn new(hosts: Vec<String>) -> Self {
        let digest = digest_of(&hosts);
        Self { hosts, digest }
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// True when the map has no node (the config parser refuses that; kept for completeness).
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The entry of `node` as written in the node config.
    pub fn host(&self, node: NodeId) -> Option<&str> {
        self.hosts.get(node.index()).map(String::as_str)
    }

    /// All entries in node-ID order.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Every node ID of the domain.
    pub fn ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.hosts.len()).filter_map(|i| u16::try_from(i).ok().map(NodeId))
    }

    /// SHA-256 over the normalised entries (lower case, in order), hex. Equal maps have equal
    /// digests on every node, whatever comments or blank lines their files hold.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The domain ID used when none is configured: a prefix of the digest, so two domains with
    /// different maps never take each other's traffic.
    pub fn derived_domain_id(&self) -> String {
        format!("nm-{}", &self.digest[..16])
    }

    /// Says how `other` differs from this map, for a refusal message.
    pub fn describe_difference(&self, other: &[String]) -> String {
        if other.len() != self.hosts.len() {
            return format!(
                "node map has {} entries here and {} on the peer",
                self.hosts.len(),
                other.len()
            );
        }
        for (i, (a, b)) in self.hosts.iter().zip(other).enumerate() {
            if !a.eq_ignore_ascii_case(b) {
                return format!("node map entry {i} is {a:?} here and {b:?} on the peer");
            }
        }
        "node maps differ".to_string()
    }
}

fn digest_of(hosts: &[String]) -> String {
    let mut h = Sha256::new();
    for host in hosts {
        h.update(host.trim().to_ascii_lowercase().as_bytes());
        h.update(b"\n");
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_depends_on_order_and_content_not_case() {
        let a = NodeMap::new(vec!["10.0.0.1".into(), "node-b".into()]);
        let b = NodeMap::new(vec!["10.0.0.1".into(), "NODE-B".into()]);
        let c = NodeMap::new(vec!["node-b".into(), "10.0.0.1".into()]);
        assert_eq!(a.digest(), b.digest());
        assert_ne!(a.digest(), c.digest());
        assert_eq!(a.digest().len(), 64);
        assert!(a.describe_difference(c.hosts()).contains("entry 0"));
        assert!(
            a.describe_difference(&["x".into()])
                .contains("2 entries here and 1")
        );
    }
}
