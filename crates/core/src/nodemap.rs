//! The node map: every node of the domain by ID, the digest peers compare, and the rules for a
//! map that grows while the daemon runs (SIGUSR1 re-reads the nodes file): which new maps may
//! replace it (`reread.rs`), and which peer maps are compatible with it during a rolling reload.

mod reread;

pub use reread::{MapRefusal, Reread};

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

    /// Whether `node`'s entry is a placeholder (`0.0.0.0` / `::`): the line holds the ID, but
    /// names no node yet. A placeholder is never dialled, never this node, and never accepted
    /// as a peer's identity; it shows UNAVAILABLE with INVALID links.
    pub fn is_placeholder(&self, node: NodeId) -> bool {
        self.host(node).is_some_and(is_placeholder)
    }

    /// Number of placeholder entries.
    pub fn placeholders(&self) -> usize {
        self.hosts.iter().filter(|h| is_placeholder(h)).count()
    }

    /// All entries in node-ID order.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The node whose entry is `ip` written as an address (IPv4, or IPv6 with or without
    /// brackets and a zone): the peer a connection from `ip` comes from. An entry that is a
    /// name says nothing here (it would need resolving), nor does a placeholder.
    pub fn node_at(&self, ip: std::net::IpAddr) -> Option<NodeId> {
        let ip = ip.to_canonical();
        let index = self.hosts.iter().position(|h| {
            let h = h.trim().trim_start_matches('[').trim_end_matches(']');
            let h = h.split('%').next().unwrap_or(h);
            h.parse::<std::net::IpAddr>()
                .is_ok_and(|a| a.to_canonical() == ip && !a.is_unspecified())
        })?;
        u16::try_from(index).ok().map(NodeId)
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

    /// The domain ID used when none is configured: a digest of the *first entry* only.
    ///
    /// Why not of the whole map: the map may grow (entries appended, SIGUSR1), and a daemon
    /// started before the growth and one started after must still agree on the domain ID, or
    /// they would refuse each other for good. Why not the map at start-up: a node added later
    /// starts with the longer map. Entry 0 is never edited while a domain lives (an edit is
    /// refused), so every daemon of the domain derives the same ID whenever it started. The
    /// exceptions are entry 0 turning into a placeholder (its line removed: a hole) or a
    /// placeholder entry 0 filled in, both by SIGUSR1: a daemon whose ID was derived re-derives
    /// it then (`Mesh::handle_node_map`), so that it agrees with a daemon started on that file
    /// (with the hole written as `0.0.0.0`), and until every daemon has reloaded, those that
    /// have not refuse the others' new sessions (domain mismatch). Keeping foreign domains
    /// apart does not rest on this ID alone: the node maps themselves must agree on every
    /// entry both have (see [`NodeMap::accepts`]).
    pub fn derived_domain_id(&self) -> String {
        let first = self.hosts.first().map_or(&[][..], std::slice::from_ref);
        format!("nm-{}", &digest_of(first)[..16])
    }

    /// Whether a peer with map `peer` (digest `peer_digest`, `peer_base` entries at its
    /// start-up; 0 when not sent) may share the domain with this map (`base` entries at our
    /// start-up). Equal digests always may. Otherwise the maps must agree on every entry both
    /// have, and the longer one may differ only by entries appended since its daemon started:
    /// that is a rolling reload (not every daemon gets SIGUSR1 at the same instant), which
    /// converges once all have reloaded. Two daemons *started* with different maps are refused,
    /// as before. The error says what differs.
    ///
    /// Placeholders (`0.0.0.0`) filled in on one side only are compatible too (a rolling
    /// fill-in): an entry that is a placeholder on either side is no node there, so the two
    /// maps cannot give one ID to two different nodes. The side that still has the placeholder
    /// neither dials that ID nor accepts a peer claiming it (the handshake's wrong-node check),
    /// so that node joins it only once it has reloaded. Two different *real* entries at one
    /// ID are refused, whatever else agrees.
    pub fn accepts(
        &self,
        base: usize,
        peer: &[String],
        peer_digest: &str,
        peer_base: usize,
    ) -> Result<(), String> {
        if peer_digest == self.digest {
            return Ok(());
        }
        if let Some(i) = self
            .hosts
            .iter()
            .zip(peer)
            .position(|(a, b)| !same_entry(a, b) && !is_placeholder(a) && !is_placeholder(b))
        {
            let (a, b) = (&self.hosts[i], &peer[i]);
            return Err(format!(
                "node map entry {i} is {a:?} here and {b:?} on the peer"
            ));
        }
        if digest_of(peer) != peer_digest {
            return Err("the peer's node-map digest does not match its entries".to_string());
        }
        let (mine, theirs) = (self.len(), peer.len());
        let peer_base = if peer_base == 0 { theirs } else { peer_base };
        let (longer_base, shorter, who) = match mine > theirs {
            true => (base, theirs, "this daemon"),
            false => (peer_base, mine, "the peer"),
        };
        if longer_base > shorter {
            return Err(format!(
                "node map has {mine} entries here and {theirs} on the peer ({who} started with \
                 {longer_base} entries; only entries appended after start-up, by SIGUSR1, may \
                 differ)"
            ));
        }
        Ok(())
    }
}

/// Whether a nodes-file entry is a placeholder: the unspecified address `0.0.0.0` or `::` (any
/// spelling). The config crate's parser lets placeholders repeat; see its `nodes` module.
pub fn is_placeholder(host: &str) -> bool {
    host.trim()
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.to_canonical().is_unspecified())
}

/// Entries name the same node (the digest's normalisation: trimmed, case-insensitive).
pub(crate) fn same_entry(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

/// Node IDs are 16-bit; a map never has more entries (the config parser refuses them).
pub(crate) fn id_of(index: usize) -> NodeId {
    NodeId(u16::try_from(index).unwrap_or(u16::MAX))
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
        let differs = a.accepts(2, c.hosts(), c.digest(), 2).unwrap_err();
        assert!(differs.contains("entry 0"), "{differs}");
    }

    fn map(hosts: &[&str]) -> NodeMap {
        NodeMap::new(hosts.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn node_at_finds_the_entry_written_as_that_address_only() {
        let m = map(&["10.0.0.1", "node-b", "[fd00::2]", "fe80::3%eth0", "0.0.0.0"]);
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(m.node_at(ip("10.0.0.1")), Some(NodeId(0)));
        assert_eq!(
            m.node_at(ip("::ffff:10.0.0.1")),
            Some(NodeId(0)),
            "a mapped IPv4"
        );
        assert_eq!(m.node_at(ip("fd00::2")), Some(NodeId(2)));
        assert_eq!(m.node_at(ip("fe80::3")), Some(NodeId(3)));
        assert_eq!(m.node_at(ip("10.0.0.9")), None, "no entry");
        assert_eq!(
            m.node_at(ip("0.0.0.0")),
            None,
            "a placeholder names no node"
        );
    }

    #[test]
    fn derived_domain_id_survives_growth_but_not_a_new_first_entry() {
        let a = map(&["n0", "n1"]);
        assert_eq!(
            a.derived_domain_id(),
            map(&["N0", "n1", "n2"]).derived_domain_id()
        );
        assert_ne!(
            a.derived_domain_id(),
            map(&["n9", "n1"]).derived_domain_id()
        );
    }

    #[test]
    fn a_map_grown_after_start_up_accepts_its_prefix_and_nothing_else() {
        let old = map(&["n0", "n1", "n2"]);
        let new = map(&["n0", "n1", "n2", "n3"]);
        // Grown by SIGUSR1 from 3 entries: both sides accept each other.
        assert_eq!(old.accepts(3, new.hosts(), new.digest(), 3), Ok(()));
        assert_eq!(new.accepts(3, old.hosts(), old.digest(), 3), Ok(()));
        // Started with 4 (a node added later): refused until the others reload.
        let err = old.accepts(3, new.hosts(), new.digest(), 4).unwrap_err();
        assert!(err.contains("3 entries here and 4"), "{err}");
        assert!(new.accepts(4, old.hosts(), old.digest(), 3).is_err());
        // A common entry differs: refused whatever the lengths.
        let other = map(&["n0", "x1", "n2", "n3"]);
        let err = old
            .accepts(3, other.hosts(), other.digest(), 3)
            .unwrap_err();
        assert!(err.contains("entry 1"), "{err}");
        // A digest that does not match the entries sent with it.
        assert!(old.accepts(3, new.hosts(), "bogus", 3).is_err());
    }
}
