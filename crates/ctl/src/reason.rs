//! Why a node is not READY or a link not CONNECTED, in words, from a [`DomainReply`] alone.
//!
//! The daemon reports each node's state word and, when asked for reasons (`--links`), each
//! link's reason of its last change; it gives no reason for a state. This module derives one
//! from what the reply does carry: a node that could not be asked is explained by the local
//! node's link to it, a node waiting for its peers by how many of its links are up, and so on.
//! A daemon that knows better says so in the node's `state_reason` (an unconfigured daemon: "not
//! configured: ..."), which wins. `--links`, `domain-check` and `--svg` show these; `-N` adds
//! them after the `Domain State` line and `-N -j` as `reason` keys, only when something is not
//! READY or UP, so a healthy domain's output stays NVIDIA's byte for byte.

use openimex_core::ConnStatus;
use openimex_proto::cmd::{DomainReply, NodeReport};

use crate::cells::{cell, row_for};

/// The local node's report, if the reply has it.
pub fn local(reply: &DomainReply) -> Option<&NodeReport> {
    let id = reply.local_node_id;
    // Reports come in node order: look where it should be before searching.
    let at = usize::try_from(id).ok().and_then(|i| reply.nodes.get(i));
    at.filter(|n| n.node_id == id)
        .or_else(|| reply.nodes.iter().find(|n| n.node_id == id))
}

/// The status of the link from `from` to node `to`, and the reason of its last change when
/// the reply carries reasons (empty otherwise).
pub fn link(reply: &DomainReply, from: &NodeReport, to: u32) -> (ConnStatus, String) {
    // The domain's width: its highest node ID + 1 (a reply restricted to a job has fewer rows).
    let width = (reply.nodes.iter())
        .map(|n| n.node_id as usize + 1)
        .max()
        .unwrap_or(0);
    let (status, _) = cell(from, width, to);
    // Connections come in node order: look where it should be before searching.
    let at = from
        .connections
        .get(to as usize)
        .filter(|c| c.node_id == to);
    let why = at
        .or_else(|| from.connections.iter().find(|c| c.node_id == to))
        .map(|c| c.reason.clone())
        .unwrap_or_default();
    (status, why)
}

/// `STATUS` or `STATUS (reason)`.
fn status_with(status: ConnStatus, why: &str) -> String {
    if why.is_empty() {
        status.as_str().to_string()
    } else {
        format!("{} ({why})", status.as_str())
    }
}

/// Why `node` is not READY; `None` when it is.
pub fn node(reply: &DomainReply, node: &NodeReport) -> Option<String> {
    if node.state == "READY" && node.reachable {
        return None;
    }
    if !node.state_reason.is_empty() {
        return Some(node.state_reason.clone());
    }
    if !node.reachable {
        let asker = reply.local_node_id;
        return Some(match local(reply) {
            Some(me) if me.node_id != node.node_id => match link(reply, me, node.node_id) {
                (ConnStatus::Connected, _) => format!(
                    "could not be asked: node {asker}'s link to it is CONNECTED but it did not \
                     answer the status request in time (hung or overloaded?)"
                ),
                (status @ ConnStatus::Mismatch(_), why) => format!(
                    "could not be asked: node {asker}'s link to it is {}: communication is \
                     disabled until the two agree (same node file, domain and version)",
                    status_with(status, &why)
                ),
                (status @ ConnStatus::Authenticating, why) => format!(
                    "could not be asked: node {asker}'s link to it is {}: authentication is \
                     still in progress",
                    status_with(status, &why)
                ),
                (status, why) => format!(
                    "could not be asked: node {asker}'s link to it is {}; is its daemon \
                     running, and can node {asker} reach {}?",
                    status_with(status, &why),
                    node.host
                ),
            },
            _ => format!("could not be asked from node {asker}"),
        });
    }
    let peers = reply.nodes.len().saturating_sub(1);
    let ids = crate::cells::ids(reply);
    let up = (ids.iter().zip(row_for(node, &ids)))
        .filter(|(id, (s, _))| **id != node.node_id && *s == ConnStatus::Connected)
        .count();
    Some(match node.state.as_str() {
        "WAITING_FOR_PEERS" => format!(
            "waiting for every peer to connect (IMEX_WAIT_FOR_QUORUM=FULL): {up} of {peers} \
             connected"
        ),
        "WAITING_FOR_RECOVERY" => "waiting for the peers that imported from it before it \
                                   restarted (IMEX_WAIT_FOR_QUORUM=RECOVERY)"
            .to_string(),
        "INITIALIZING" => "starting: reading its config, node file and node ID".to_string(),
        "STARTING_AUTH_SERVER" => "starting: setting up authentication".to_string(),
        "INIT_GPU" => "starting: opening the GPU driver session".to_string(),
        "SHUTTING_DOWN" => "shutting down (it was sent SIGTERM, SIGINT or SIGQUIT)".to_string(),
        "READY" => "READY".to_string(),
        other => format!("its daemon reports {other}"),
    })
}

/// Why the domain is not UP, naming the nodes that are not READY and counting the links
/// that are not CONNECTED; `None` when it is UP.
pub fn domain(reply: &DomainReply) -> Option<String> {
    if reply.status == "UP" {
        return None;
    }
    let down: Vec<String> = reply
        .nodes
        .iter()
        .filter(|n| node(reply, n).is_some())
        .map(|n| format!("node {} {}", n.node_id, n.state))
        .collect();
    let ids = crate::cells::ids(reply);
    let links = reply
        .nodes
        .iter()
        .filter(|n| n.reachable)
        .flat_map(|n| {
            (ids.iter().zip(row_for(n, &ids)))
                .filter(move |(to, (s, _))| **to != n.node_id && *s != ConnStatus::Connected)
        })
        .count();
    let mut parts = Vec::new();
    if !down.is_empty() {
        parts.push(down.join(", "));
    }
    if links > 0 {
        parts.push(format!("{links} link(s) not CONNECTED"));
    }
    if parts.is_empty() {
        parts.push(format!("the daemon reports {}", reply.status));
    }
    Some(parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(id: u32, state: &str, cells: &[ConnStatus]) -> NodeReport {
        NodeReport {
            node_id: id,
            host: format!("10.0.0.{}", id + 1),
            state: state.into(),
            reachable: state != "UNAVAILABLE",
            cells: cells.iter().map(|c| c.cell(true)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn every_state_but_ready_has_a_reason() {
        use ConnStatus::{Connected as C, Invalid as I, Recovering as R};
        let reply = DomainReply {
            local_node_id: 0,
            nodes: vec![
                report(0, "READY", &[C, R, C]),
                report(1, "UNAVAILABLE", &[]),
                report(2, "WAITING_FOR_PEERS", &[C, I, C]),
            ],
            status: "DEGRADED".into(),
        };
        assert_eq!(node(&reply, &reply.nodes[0]), None);
        let unavailable = node(&reply, &reply.nodes[1]).expect("a reason");
        assert!(
            unavailable.contains("could not be asked") && unavailable.contains("RECOVERING"),
            "{unavailable}"
        );
        let waiting = node(&reply, &reply.nodes[2]).expect("a reason");
        assert!(waiting.contains("1 of 2 connected"), "{waiting}");
        let dom = domain(&reply).expect("not UP");
        assert!(
            dom.contains("node 1 UNAVAILABLE") && dom.contains("node 2 WAITING_FOR_PEERS"),
            "{dom}"
        );
        assert!(dom.contains("2 link(s) not CONNECTED"), "{dom}");
    }

    #[test]
    fn an_up_domain_has_no_reason() {
        let c = ConnStatus::Connected;
        let reply = DomainReply {
            local_node_id: 0,
            nodes: vec![report(0, "READY", &[c, c]), report(1, "READY", &[c, c])],
            status: "UP".into(),
        };
        assert_eq!(domain(&reply), None);
    }

    #[test]
    fn an_unreachable_nodes_reason_quotes_the_local_link_in_or_out_of_order() {
        use openimex_proto::peer::ConnectionStatus;
        let n = 2000u32;
        let conns = |order: &mut dyn Iterator<Item = u32>| -> Vec<ConnectionStatus> {
            order
                .map(|i| ConnectionStatus {
                    node_id: i,
                    status: "RECOVERING".into(),
                    reason: format!("why {i}"),
                    ..Default::default()
                })
                .collect()
        };
        for reversed in [false, true] {
            let mut local = report(3, "READY", &vec![ConnStatus::Recovering; n as usize]);
            local.connections = match reversed {
                false => conns(&mut (0..n)),
                true => conns(&mut (0..n).rev()),
            };
            let mut nodes: Vec<NodeReport> =
                (0..n).map(|i| report(i, "UNAVAILABLE", &[])).collect();
            nodes[3] = local;
            let reply = DomainReply {
                local_node_id: 3,
                nodes,
                status: "DEGRADED".into(),
            };
            for at in [0, 5, 1999] {
                let why = node(&reply, &reply.nodes[at]).expect("a reason");
                assert!(
                    why.contains("RECOVERING") && why.contains(&format!("(why {at})")),
                    "node {at}, reversed {reversed}: {why}"
                );
            }
        }
    }
}
