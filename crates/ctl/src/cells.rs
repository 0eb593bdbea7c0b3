//! A node's row of the connectivity matrix, decoded from a reply: the one reading of
//! `NodeReport` cells that the table, the reasons, the picture and the domain check share
//! (a leaf: it depends on no other module of ctl).

use openimex_core::ConnStatus;
use openimex_proto::cmd::NodeReport;

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
