//! A node's row of the connectivity matrix, decoded from a reply: the one reading of
//! `NodeReport` cells that the table, the reasons, the picture and the domain check share
//! (a leaf: it depends on no other module of ctl).

use openimex_core::ConnStatus;
use openimex_proto::cmd::{DomainReply, NodeReport};

/// One cell of [`row`] (the link from `node` to node `to`), without decoding the rest: the
/// reasons ask one cell per node of the reply, and a whole row each time made a `--links` of
/// 10,000 nodes quadratic (20 s of CPU in a debug build).
pub fn cell(node: &NodeReport, width: usize, to: u32) -> (ConnStatus, bool) {
    let i = to as usize;
    if i >= width {
        return (ConnStatus::Invalid, false);
    }
    if node.cells.is_empty() {
        node.connections
            .iter()
            .find(|c| c.node_id == to)
            .map_or((ConnStatus::Invalid, false), |c| {
                (c.status.parse().unwrap_or(ConnStatus::Invalid), c.changed)
            })
    } else {
        node.cells
            .get(i)
            .map_or((ConnStatus::Invalid, false), |c| ConnStatus::from_cell(*c))
    }
}

/// A node's row as `(state, changed)` for each of `width` nodes: from its compact cells, or
/// from `connections` in replies of daemons older than cells. Missing cells are INVALID.
pub fn row(node: &NodeReport, width: usize) -> Vec<(ConnStatus, bool)> {
    let mut row = vec![(ConnStatus::Invalid, false); width];
    if node.cells.is_empty() {
        // The first entry for a node wins, as it always did.
        for c in node.connections.iter().rev() {
            if let Some(slot) = row.get_mut(c.node_id as usize) {
                *slot = (c.status.parse().unwrap_or(ConnStatus::Invalid), c.changed);
            }
        }
    } else {
        for (slot, cell) in row.iter_mut().zip(&node.cells) {
            *slot = ConnStatus::from_cell(*cell);
        }
    }
    row
}

/// The node IDs of `reply`'s rows, in order: its columns. Every node of the domain (0, 1, …)
/// in a whole reply; only some in one restricted to a job's members ([`restrict`]).
pub fn ids(reply: &DomainReply) -> Vec<u32> {
    reply.nodes.iter().map(|n| n.node_id).collect()
}

/// `node`'s cells for the columns `ids` (see [`ids`]), as [`row`] gives them.
pub fn row_for(node: &NodeReport, ids: &[u32]) -> Vec<(ConnStatus, bool)> {
    let whole = ids.iter().enumerate().all(|(i, id)| *id as usize == i);
    match whole {
        true => row(node, ids.len()),
        false => ids.iter().map(|id| cell(node, usize::MAX, *id)).collect(),
    }
}

/// `reply` restricted to the nodes `members` (a job's, `ctl -N --job`): their rows only, each
/// row's cells still addressed by node ID, and the domain status over those nodes alone (UP
/// when each is READY and connected to each other), as a daemon would say it of a domain of
/// just them.
pub fn restrict(mut reply: DomainReply, members: &[u32]) -> DomainReply {
    reply.nodes.retain(|n| members.contains(&n.node_id));
    let ids = ids(&reply);
    let local = openimex_core::NodeId(u16::try_from(reply.local_node_id).unwrap_or(u16::MAX));
    let status = openimex_core::domain_status_of(
        local,
        reply.nodes.iter().map(|n| {
            let id = openimex_core::NodeId(u16::try_from(n.node_id).unwrap_or(u16::MAX));
            let state = n
                .state
                .parse()
                .unwrap_or(openimex_core::DaemonState::Unavailable);
            let cells = match n.reachable {
                true => row_for(n, &ids).into_iter().map(|(s, _)| s).collect(),
                false => Vec::new(),
            };
            (id, state, cells)
        }),
    );
    reply.status = status.as_str().to_string();
    reply
}

#[cfg(test)]
mod tests {
    use super::*;
    use ConnStatus::{Connected as C, Recovering as R};

    fn report(id: u32, state: &str, cells: &[ConnStatus]) -> NodeReport {
        NodeReport {
            node_id: id,
            host: format!("10.0.0.{}", id + 1),
            state: state.into(),
            reachable: true,
            cells: cells.iter().map(|c| c.cell(false)).collect(),
            ..Default::default()
        }
    }

    /// Node 1 lost by everyone: the domain is DEGRADED, a job of nodes 0, 2 and 3 is not.
    fn domain() -> DomainReply {
        DomainReply {
            local_node_id: 2,
            nodes: vec![
                report(0, "READY", &[C, R, C, C]),
                report(1, "READY", &[R, C, R, R]),
                report(2, "READY", &[C, R, C, C]),
                report(3, "READY", &[C, R, C, C]),
            ],
            status: "DEGRADED".into(),
        }
    }

    #[test]
    fn a_job_s_view_keeps_its_members_addressed_by_node_id() {
        let job = restrict(domain(), &[0, 2, 3]);
        assert_eq!(job.status, "UP", "the lost node is no member");
        assert_eq!(ids(&job), [0, 2, 3]);
        assert_eq!(row_for(&job.nodes[1], &ids(&job)), [(C, false); 3]);
        let table = crate::render::table(&job, "T", false);
        assert!(table.contains(" Nodes From\\To  0   2   3\n"), "{table}");
        assert!(table.contains("Domain State: UP"), "{table}");
        let json: serde_json::Value =
            serde_json::from_str(&crate::render::json(&job, "T", false)).unwrap();
        let conns = json["nodes"]["2"]["connections"].as_object().unwrap();
        assert_eq!(conns.keys().collect::<Vec<_>>(), ["0", "2", "3"]);
        assert_eq!(conns["3"]["host"], "10.0.0.4");
        assert_eq!(json["status"], "UP");
        // With the lost node in the job, the job is DEGRADED as the domain is.
        let with_1 = restrict(domain(), &[1, 2]);
        assert_eq!(with_1.status, "DEGRADED");
        assert_eq!(
            row_for(&with_1.nodes[1], &ids(&with_1)),
            [(R, false), (C, false)]
        );
        // The whole domain is read as before.
        assert_eq!(
            row_for(&domain().nodes[1], &[0, 1, 2, 3]),
            row(&domain().nodes[1], 4)
        );
    }
}
