//! A node's row of the connectivity matrix, decoded from a reply: the one reading of
//! `NodeReport` cells that the table, the reasons, the picture and the domain check share
//! (a leaf: it depends on no other module of ctl).

use openimex_core::ConnStatus;
use openimex_proto::cmd::NodeReport;

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
