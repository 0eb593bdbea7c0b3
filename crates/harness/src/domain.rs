//! Parsed views of `ctl` JSON: [`DomainView`] for NVIDIA's `-N -j` shape, [`LinksView`] for
//! our own `--links -j` and [`PeersView`] for our own `--peers -j`. Parsing never panics: a missing key or a wrong type is a
//! [`HarnessError::Parse`] that quotes the text.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::HarnessError;

/// `ctl -N -j`: the whole domain as one node sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct DomainView {
    /// Top-level domain status: UP, DEGRADED or DOWN.
    pub status: String,
    /// `M/D/YYYY HH:MM:SS.mmm`.
    pub timestamp: String,
    /// Every configured node, by node index.
    pub nodes: BTreeMap<u32, NodeView>,
    /// The parsed JSON as printed (key order preserved).
    pub raw: Value,
}

/// One entry of `nodes` in `ctl -N -j`.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    /// Daemon state word (READY, …) or UNAVAILABLE.
    pub status: String,
    /// The nodes-file entry.
    pub host: String,
    /// Driver version, `NO_GPU`, or empty.
    pub version: String,
    /// `hostName` if present (NVIDIA's 570 output has none).
    pub host_name: Option<String>,
    /// Peer index → connection status word (CONNECTED, …).
    pub connections: BTreeMap<u32, String>,
}

impl DomainView {
    /// Parses the stdout of `ctl -N -j`.
    pub fn parse(text: &str) -> Result<Self, HarnessError> {
        const WHAT: &str = "ctl -N -j output";
        let raw: Value = serde_json::from_str(text.trim())
            .map_err(|e| HarnessError::parse(WHAT, e.to_string(), text))?;
        let top = as_object(&raw, "top level", WHAT, text)?;
        let mut nodes = BTreeMap::new();
        for (key, node) in as_object(field(top, "nodes", WHAT, text)?, "nodes", WHAT, text)? {
            let index = parse_index(key, WHAT, text)?;
            let obj = as_object(node, "a node", WHAT, text)?;
            let mut connections = BTreeMap::new();
            let conns = field(obj, "connections", WHAT, text)?;
            for (peer, conn) in as_object(conns, "connections", WHAT, text)? {
                let conn = as_object(conn, "a connection", WHAT, text)?;
                connections.insert(
                    parse_index(peer, WHAT, text)?,
                    string(conn, "status", WHAT, text)?,
                );
            }
            let host_name = match obj.get("hostName") {
                None => None,
                Some(_) => Some(string(obj, "hostName", WHAT, text)?),
            };
            nodes.insert(
                index,
                NodeView {
                    status: string(obj, "status", WHAT, text)?,
                    host: string(obj, "host", WHAT, text)?,
                    version: string(obj, "version", WHAT, text)?,
                    host_name,
                    connections,
                },
            );
        }
        Ok(Self {
            status: string(top, "status", WHAT, text)?,
            timestamp: string(top, "timestamp", WHAT, text)?,
            nodes,
            raw,
        })
    }

    /// True if there is at least one node and every connection of every node is CONNECTED.
    pub fn all_connected(&self) -> bool {
        !self.nodes.is_empty()
            && self.nodes.values().all(|n| {
                !n.connections.is_empty() && n.connections.values().all(|c| c == "CONNECTED")
            })
    }

    /// True if every node is READY.
    pub fn all_ready(&self) -> bool {
        !self.nodes.is_empty() && self.nodes.values().all(|n| n.status == "READY")
    }

    /// Status word of node `i`.
    pub fn node_status(&self, i: u32) -> Option<&str> {
        self.nodes.get(&i).map(|n| n.status.as_str())
    }

    /// Status word of the connection `from → to` (row `from`, column `to`).
    pub fn connection(&self, from: u32, to: u32) -> Option<&str> {
        self.nodes
            .get(&from)?
            .connections
            .get(&to)
            .map(String::as_str)
    }

    /// The JSON on one line, for messages.
    pub fn compact(&self) -> String {
        self.raw.to_string()
    }
}

/// `ctl --links -j`: our own view with instance ids and reasons.
#[derive(Debug, Clone, PartialEq)]
pub struct LinksView {
    /// The node that answered.
    pub local_node: u32,
    /// Domain status: UP, DEGRADED or DOWN.
    pub status: String,
    /// Every configured node, in the order printed.
    pub nodes: Vec<LinkNodeView>,
    /// The parsed JSON as printed.
    pub raw: Value,
}

/// One node of [`LinksView`].
#[derive(Debug, Clone, PartialEq)]
pub struct LinkNodeView {
    /// Node index.
    pub node: u32,
    /// The nodes-file entry.
    pub host: String,
    /// Daemon state word, or UNAVAILABLE.
    pub state: String,
    /// Random per daemon start (hex); empty when unreachable.
    pub instance_id: String,
    /// Whether the answering node could reach it.
    pub reachable: bool,
    /// Its connections to its peers.
    pub connections: Vec<LinkView>,
}

/// One connection of a [`LinkNodeView`].
#[derive(Debug, Clone, PartialEq)]
pub struct LinkView {
    /// The peer's index.
    pub node: u32,
    /// Connection status word (CONNECTED, DISCONNECTED, NODE_MAP_MISMATCH, …).
    pub status: String,
    /// Why it is in that state, in words.
    pub reason: String,
}

impl LinksView {
    /// Parses the stdout of `ctl --links -j`.
    pub fn parse(text: &str) -> Result<Self, HarnessError> {
        const WHAT: &str = "ctl --links -j output";
        let raw: Value = serde_json::from_str(text.trim())
            .map_err(|e| HarnessError::parse(WHAT, e.to_string(), text))?;
        let top = as_object(&raw, "top level", WHAT, text)?;
        let mut nodes = Vec::new();
        for node in as_array(field(top, "nodes", WHAT, text)?, "nodes", WHAT, text)? {
            let obj = as_object(node, "a node", WHAT, text)?;
            let mut connections = Vec::new();
            let conns = field(obj, "connections", WHAT, text)?;
            for conn in as_array(conns, "connections", WHAT, text)? {
                let c = as_object(conn, "a connection", WHAT, text)?;
                connections.push(LinkView {
                    node: number(c, "node", WHAT, text)?,
                    status: string(c, "status", WHAT, text)?,
                    reason: string(c, "reason", WHAT, text)?,
                });
            }
            nodes.push(LinkNodeView {
                node: number(obj, "node", WHAT, text)?,
                host: string(obj, "host", WHAT, text)?,
                state: string(obj, "state", WHAT, text)?,
                instance_id: string(obj, "instance_id", WHAT, text)?,
                reachable: boolean(obj, "reachable", WHAT, text)?,
                connections,
            });
        }
        Ok(Self {
            local_node: number(top, "local_node", WHAT, text)?,
            status: string(top, "status", WHAT, text)?,
            nodes,
            raw,
        })
    }

    /// The entry of node `i`.
    pub fn node(&self, i: u32) -> Option<&LinkNodeView> {
        self.nodes.iter().find(|n| n.node == i)
    }

    /// The connection `from → to`.
    pub fn link(&self, from: u32, to: u32) -> Option<&LinkView> {
        self.node(from)?.connections.iter().find(|c| c.node == to)
    }

    /// The JSON on one line, for messages.
    pub fn compact(&self) -> String {
        self.raw.to_string()
    }
}

/// `ctl --peers -j`: one daemon's view of each of its peers.
#[derive(Debug, Clone, PartialEq)]
pub struct PeersView {
    /// The node that answered.
    pub local_node: u32,
    /// Its daemon state word.
    pub state: String,
    /// Every peer (not the answering node), in node order.
    pub peers: Vec<PeerView>,
    /// The parsed JSON as printed.
    pub raw: Value,
}

/// One peer of [`PeersView`].
#[derive(Debug, Clone, PartialEq)]
pub struct PeerView {
    /// The peer's index.
    pub node: u32,
    /// The nodes-file entry.
    pub host: String,
    /// Connection status word of the link to it.
    pub status: String,
    /// References the answering node holds on its exports for the peer's importers.
    pub exports_held: u64,
    /// The answering node's imports from the peer.
    pub imports: u64,
    /// Unimports the peer has yet to confirm or be told of.
    pub unimports_pending: u64,
    /// Clean-ups of the peer since the daemon started.
    pub cleanups_total: u64,
    /// The latest clean-ups kept, oldest first.
    pub cleanups: Vec<CleanUpView>,
}

/// One clean-up of a [`PeerView`].
#[derive(Debug, Clone, PartialEq)]
pub struct CleanUpView {
    /// Why, in words.
    pub reason: String,
    /// When, as ctl prints timestamps ([`is_ctl_timestamp`]).
    pub time: String,
    /// References released for the peer's importers.
    pub exports_released: u64,
    /// Imports from the peer dropped.
    pub imports_dropped: u64,
}

impl PeersView {
    /// Parses the stdout of `ctl --peers -j`.
    pub fn parse(text: &str) -> Result<Self, HarnessError> {
        const WHAT: &str = "ctl --peers -j output";
        let raw: Value = serde_json::from_str(text.trim())
            .map_err(|e| HarnessError::parse(WHAT, e.to_string(), text))?;
        let top = as_object(&raw, "top level", WHAT, text)?;
        let mut peers = Vec::new();
        for peer in as_array(field(top, "peers", WHAT, text)?, "peers", WHAT, text)? {
            let obj = as_object(peer, "a peer", WHAT, text)?;
            let mut cleanups = Vec::new();
            let list = field(obj, "cleanups", WHAT, text)?;
            for c in as_array(list, "cleanups", WHAT, text)? {
                let c = as_object(c, "a clean-up", WHAT, text)?;
                cleanups.push(CleanUpView {
                    reason: string(c, "reason", WHAT, text)?,
                    time: string(c, "time", WHAT, text)?,
                    exports_released: count(c, "exports_released", WHAT, text)?,
                    imports_dropped: count(c, "imports_dropped", WHAT, text)?,
                });
            }
            peers.push(PeerView {
                node: number(obj, "node", WHAT, text)?,
                host: string(obj, "host", WHAT, text)?,
                status: string(obj, "status", WHAT, text)?,
                exports_held: count(obj, "exports_held", WHAT, text)?,
                imports: count(obj, "imports", WHAT, text)?,
                unimports_pending: count(obj, "unimports_pending", WHAT, text)?,
                cleanups_total: count(obj, "cleanups_total", WHAT, text)?,
                cleanups,
            });
        }
        Ok(Self {
            local_node: number(top, "local_node", WHAT, text)?,
            state: string(top, "state", WHAT, text)?,
            peers,
            raw,
        })
    }

    /// The entry of peer `i`.
    pub fn peer(&self, i: u32) -> Option<&PeerView> {
        self.peers.iter().find(|p| p.node == i)
    }

    /// The JSON on one line, for messages.
    pub fn compact(&self) -> String {
        self.raw.to_string()
    }
}

/// True if `s` is NVIDIA's ctl timestamp `M/D/YYYY HH:MM:SS.mmm`: month and day without zero
/// padding, everything else fixed width.
pub fn is_ctl_timestamp(s: &str) -> bool {
    fn num(
        part: &str,
        min_len: usize,
        max_len: usize,
        range: std::ops::RangeInclusive<u32>,
    ) -> bool {
        let ok_len = (min_len..=max_len).contains(&part.len());
        let digits = part.bytes().all(|b| b.is_ascii_digit());
        // No zero padding where the width may vary.
        let unpadded = min_len == max_len || !part.starts_with('0');
        ok_len && digits && unpadded && part.parse().is_ok_and(|n: u32| range.contains(&n))
    }
    let Some((date, time)) = s.split_once(' ') else {
        return false;
    };
    let date: Vec<&str> = date.split('/').collect();
    let Some((hms, millis)) = time.split_once('.') else {
        return false;
    };
    let hms: Vec<&str> = hms.split(':').collect();
    date.len() == 3
        && hms.len() == 3
        && num(date[0], 1, 2, 1..=12)
        && num(date[1], 1, 2, 1..=31)
        && num(date[2], 4, 4, 1970..=9999)
        && num(hms[0], 2, 2, 0..=23)
        && num(hms[1], 2, 2, 0..=59)
        && num(hms[2], 2, 2, 0..=60)
        && num(millis, 3, 3, 0..=999)
}

fn field<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    what: &'static str,
    text: &str,
) -> Result<&'a Value, HarnessError> {
    obj.get(key)
        .ok_or_else(|| HarnessError::parse(what, format!("missing key \"{key}\""), text))
}

fn as_object<'a>(
    v: &'a Value,
    name: &str,
    what: &'static str,
    text: &str,
) -> Result<&'a Map<String, Value>, HarnessError> {
    v.as_object()
        .ok_or_else(|| HarnessError::parse(what, format!("{name} is not an object: {v}"), text))
}

fn as_array<'a>(
    v: &'a Value,
    name: &str,
    what: &'static str,
    text: &str,
) -> Result<&'a Vec<Value>, HarnessError> {
    v.as_array()
        .ok_or_else(|| HarnessError::parse(what, format!("{name} is not an array: {v}"), text))
}

fn string(
    obj: &Map<String, Value>,
    key: &str,
    what: &'static str,
    text: &str,
) -> Result<String, HarnessError> {
    let v = field(obj, key, what, text)?;
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| HarnessError::parse(what, format!("\"{key}\" is not a string: {v}"), text))
}

fn number(
    obj: &Map<String, Value>,
    key: &str,
    what: &'static str,
    text: &str,
) -> Result<u32, HarnessError> {
    let v = field(obj, key, what, text)?;
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            HarnessError::parse(what, format!("\"{key}\" is not a node index: {v}"), text)
        })
}

fn count(
    obj: &Map<String, Value>,
    key: &str,
    what: &'static str,
    text: &str,
) -> Result<u64, HarnessError> {
    let v = field(obj, key, what, text)?;
    v.as_u64()
        .ok_or_else(|| HarnessError::parse(what, format!("\"{key}\" is not a count: {v}"), text))
}

fn boolean(
    obj: &Map<String, Value>,
    key: &str,
    what: &'static str,
    text: &str,
) -> Result<bool, HarnessError> {
    let v = field(obj, key, what, text)?;
    v.as_bool()
        .ok_or_else(|| HarnessError::parse(what, format!("\"{key}\" is not a boolean: {v}"), text))
}

fn parse_index(key: &str, what: &'static str, text: &str) -> Result<u32, HarnessError> {
    key.parse()
        .map_err(|_| HarnessError::parse(what, format!("key \"{key}\" is not a node index"), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEALTHY: &str = include_str!("../testdata/ctl-N-j.570.172.healthy.json");
    const UNCONFIGURED: &str = include_str!("../testdata/ctl-N-j.570.172.unconfigured.json");
    const PARTIAL: &str = include_str!("../testdata/ctl-N-j.580.30.partial.json");

    #[test]
    fn healthy_sample() {
        let v = DomainView::parse(HEALTHY).expect("parse");
        assert_eq!(v.status, "UP");
        assert_eq!(v.timestamp, "8/8/2025 17:38:02.641");
        assert!(is_ctl_timestamp(&v.timestamp));
        assert_eq!(v.nodes.len(), 2);
        assert!(v.all_connected() && v.all_ready());
        assert_eq!(v.node_status(1), Some("READY"));
        assert_eq!(v.connection(0, 1), Some("CONNECTED"));
        assert_eq!(v.connection(1, 1), Some("CONNECTED"));
        assert_eq!(v.connection(1, 2), None);
        assert_eq!(v.nodes[&0].host, "192.168.103.159");
        assert_eq!(v.nodes[&0].version, "570.172.08");
        assert_eq!(v.nodes[&0].host_name, None);
        // Key order as printed (serde_json's preserve_order).
        let keys: Vec<&String> = v.raw.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["nodes", "timestamp", "status"]);
    }

    #[test]
    fn unconfigured_sample() {
        let v = DomainView::parse(UNCONFIGURED).expect("parse");
        assert_eq!(v.status, "DOWN");
        assert_eq!(v.node_status(0), Some("UNAVAILABLE"));
        assert_eq!(v.connection(0, 0), Some("INVALID"));
        assert!(!v.all_connected());
        assert!(!v.all_ready());
    }

    #[test]
    fn partial_sample_with_sparse_indexes() {
        let v = DomainView::parse(PARTIAL).expect("parse");
        assert_eq!(v.status, "DEGRADED");
        assert_eq!(v.nodes.keys().copied().collect::<Vec<_>>(), [1, 3]);
        assert_eq!(v.connection(3, 6), Some("CONNECTED"));
        assert_eq!(v.nodes[&3].host_name.as_deref(), Some(""));
        assert_eq!(v.nodes[&1].version, "580.30");
    }

    #[test]
    fn malformed_domain_json_is_an_error_not_a_panic() {
        for bad in [
            "",
            "READY",
            "[]",
            r#"{"nodes":{},"timestamp":"1/1/2026 00:00:00.000"}"#,
            r#"{"nodes":{"x":{}},"timestamp":"t","status":"UP"}"#,
            r#"{"nodes":{"0":{"status":"READY","host":"h","version":"v","connections":{"0":{"status":5}}}},"timestamp":"t","status":"UP"}"#,
        ] {
            let err = DomainView::parse(bad).expect_err(bad);
            assert!(
                err.to_string().contains("cannot parse ctl -N -j output"),
                "{err}"
            );
        }
    }

    const LINKS: &str = r#"{"local_node":0,"status":"DEGRADED","nodes":[
        {"node":0,"host":"127.20.1.1","state":"READY","instance_id":"9f3c0011aabbccdd","reachable":true,
         "connections":[{"node":0,"status":"CONNECTED","reason":"self"},
                        {"node":1,"status":"DISCONNECTED","reason":"peer said goodbye"}]},
        {"node":1,"host":"127.20.1.2","state":"UNAVAILABLE","instance_id":"","reachable":false,
         "connections":[]}]}"#;

    #[test]
    fn links_view() {
        let v = LinksView::parse(LINKS).expect("parse");
        assert_eq!(v.local_node, 0);
        assert_eq!(v.status, "DEGRADED");
        assert_eq!(v.nodes.len(), 2);
        let n0 = v.node(0).expect("node 0");
        assert_eq!(n0.instance_id, "9f3c0011aabbccdd");
        assert!(n0.reachable);
        let l = v.link(0, 1).expect("link 0->1");
        assert_eq!(l.status, "DISCONNECTED");
        assert!(l.reason.contains("goodbye"));
        let n1 = v.node(1).expect("node 1");
        assert!(!n1.reachable);
        assert_eq!(n1.state, "UNAVAILABLE");
        assert!(v.link(1, 0).is_none());
        assert!(v.node(2).is_none());
    }

    #[test]
    fn malformed_links_json_is_an_error() {
        for bad in [
            r#"{"local_node":-1,"status":"UP","nodes":[]}"#,
            r#"{"local_node":0,"status":"UP","nodes":{}}"#,
            r#"{"local_node":0,"status":"UP","nodes":[{"node":0}]}"#,
        ] {
            assert!(LinksView::parse(bad).is_err(), "{bad}");
        }
    }

    const PEERS: &str = r#"{"local_node":1,"state":"READY","peers":[
        {"node":0,"host":"127.20.1.1","status":"DISCONNECTED","instance_id":"9f3c0011aabbccdd",
         "exports_held":0,"imports":0,"unimports_pending":1,"cleanups_total":1,
         "cleanups":[{"reason":"lost for longer than the grace time","time":"12/3/2026 16:30:00.125",
                      "time_unix_ms":1796315400125,"exports_released":0,"imports_dropped":1,
                      "unimports_finished":0}]},
        {"node":2,"host":"127.20.1.3","status":"CONNECTED","instance_id":null,
         "exports_held":2,"imports":0,"unimports_pending":0,"cleanups_total":0,"cleanups":[]}]}"#;

    #[test]
    fn peers_view() {
        let v = PeersView::parse(PEERS).expect("parse");
        assert_eq!((v.local_node, v.state.as_str()), (1, "READY"));
        let p0 = v.peer(0).expect("peer 0");
        assert_eq!(p0.status, "DISCONNECTED");
        assert_eq!(
            (p0.imports, p0.unimports_pending, p0.cleanups_total),
            (0, 1, 1)
        );
        assert!(p0.cleanups[0].reason.contains("grace"));
        assert!(is_ctl_timestamp(&p0.cleanups[0].time));
        assert_eq!(p0.cleanups[0].imports_dropped, 1);
        assert_eq!(v.peer(2).map(|p| p.exports_held), Some(2));
        assert!(v.peer(1).is_none(), "not itself");
    }

    #[test]
    fn malformed_peers_json_is_an_error() {
        for bad in [
            r#"{"local_node":0,"state":"READY"}"#,
            r#"{"local_node":0,"state":"READY","peers":[{"node":1}]}"#,
            r#"{"local_node":0,"state":"READY","peers":[{"node":1,"host":"h","status":"CONNECTED","exports_held":-1,"imports":0,"unimports_pending":0,"cleanups_total":0,"cleanups":[]}]}"#,
        ] {
            assert!(PeersView::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn timestamps() {
        for good in [
            "12/2/2026 15:40:01.123",
            "5/12/2025 06:08:10.580",
            "9/4/2026 00:37:39.905",
            "1/1/2000 23:59:59.000",
        ] {
            assert!(is_ctl_timestamp(good), "{good}");
        }
        for bad in [
            "",
            "05/12/2025 06:08:10.580",
            "5/02/2025 06:08:10.580",
            "13/1/2025 06:08:10.580",
            "5/12/25 06:08:10.580",
            "5/12/2025 6:08:10.580",
            "5/12/2025 06:08:10",
            "5/12/2025 06:08:10.58",
            "5/12/2025T06:08:10.580",
            "5/12/2025 06:08:10.580 ",
            "2025-05-12 06:08:10.580",
        ] {
            assert!(!is_ctl_timestamp(bad), "{bad}");
        }
    }
}
