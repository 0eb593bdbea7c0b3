//! Domain status from the connectivity matrix: the rule behind `Domain State:` and the
//! top-level JSON `status`.
//!
//! NVIDIA does not document the rule. Observed (docs/reference/imex-guide.md §3): UP when every configured
//! node is READY and the matrix is all `C`; DEGRADED when some nodes are READY and others are
//! not (3 live nodes of 18 slots stays DEGRADED); DOWN when the local daemon is not serving.

use crate::ids::NodeId;
use crate::state::{ConnStatus, DaemonState, DomainStatus};

/// One row of the matrix: a node's state and its view of every node (itself included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    /// The node the row belongs to.
    pub node: NodeId,
    /// Its daemon state, or `Unavailable` when it could not be asked.
    pub state: DaemonState,
    /// Its view of each node, indexed by node ID.
    pub cells: Vec<ConnStatus>,
}

impl NodeRow {
    /// The row of a node that could not be asked: UNAVAILABLE, every cell INVALID.
    pub fn unreachable(node: NodeId, nodes: usize) -> Self {
        Self {
            node,
            state: DaemonState::Unavailable,
            cells: vec![ConnStatus::Invalid; nodes],
        }
    }
}

/// Computes the domain status as seen from `local`.
pub fn domain_status(local: NodeId, rows: &[NodeRow]) -> DomainStatus {
    domain_status_of(
        local,
        rows.iter()
            .map(|r| (r.node, r.state, r.cells.iter().copied())),
    )
}

/// [`domain_status`] over rows given as `(node, state, cells)`, so a large domain's status is
/// computed from its rows as they are, without building a matrix of [`NodeRow`]s. A row whose
/// node is not READY may give no cells.
pub fn domain_status_of<C>(
    local: NodeId,
    rows: impl IntoIterator<Item = (NodeId, DaemonState, C)>,
) -> DomainStatus
where
    C: IntoIterator<Item = ConnStatus>,
{
    let mut local_ready = false;
    let mut all_up = true;
    let mut nodes = 0usize;
    let mut widths = (usize::MAX, 0usize);
    for (node, state, cells) in rows {
        nodes += 1;
        local_ready |= node == local && state == DaemonState::Ready;
        if !all_up {
            continue;
        }
        if state != DaemonState::Ready {
            all_up = false;
            continue;
        }
        let mut width = 0usize;
        for c in cells {
            width += 1;
            if c != ConnStatus::Connected {
                all_up = false;
                break;
            }
        }
        widths = (widths.0.min(width), widths.1.max(width));
    }
    if !local_ready {
        DomainStatus::Down
    } else if all_up && widths == (nodes, nodes) {
        DomainStatus::Up
    } else {
        DomainStatus::Degraded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(node: u16, cells: Vec<ConnStatus>) -> NodeRow {
        NodeRow {
            node: NodeId(node),
            state: DaemonState::Ready,
            cells,
        }
    }

    #[test]
    fn up_degraded_down() {
        use ConnStatus::*;
        let up = vec![ready(0, vec![Connected; 2]), ready(1, vec![Connected; 2])];
        assert_eq!(domain_status(NodeId(0), &up), DomainStatus::Up);

        let one_down = vec![
            ready(0, vec![Connected, Recovering]),
            NodeRow::unreachable(NodeId(1), 2),
        ];
        assert_eq!(domain_status(NodeId(0), &one_down), DomainStatus::Degraded);

        let link_down = vec![
            ready(0, vec![Connected, Connected]),
            ready(1, vec![Recovering, Connected]),
        ];
        assert_eq!(domain_status(NodeId(1), &link_down), DomainStatus::Degraded);

        let local_down = vec![NodeRow::unreachable(NodeId(0), 1)];
        assert_eq!(domain_status(NodeId(0), &local_down), DomainStatus::Down);

        let short = vec![ready(0, vec![Connected; 2]), ready(1, vec![Connected; 1])];
        assert_eq!(domain_status(NodeId(0), &short), DomainStatus::Degraded);

        let mut starting = up.clone();
        starting[0].state = DaemonState::WaitingForPeers;
        assert_eq!(domain_status(NodeId(0), &starting), DomainStatus::Down);
        assert_eq!(domain_status(NodeId(1), &starting), DomainStatus::Degraded);
    }
}
