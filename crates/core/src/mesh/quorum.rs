//! The FULL quorum (`IMEX_WAIT_FOR_QUORUM=FULL`): WAITING_FOR_PEERS until every peer of the
//! node map is connected, then on to INIT_GPU. The wait has no deadline of its own here; the
//! node's `IMEX_CONN_WAIT_TIMEOUT` timer ends it through [`Mesh::stop_waiting_for_peers`].

use super::Mesh;
use crate::ids::NodeId;
use crate::state::{ConnStatus, DaemonState};

impl Mesh {
    /// Whether the FULL quorum wait is on (WAITING_FOR_PEERS).
    pub fn waiting_for_peers(&self) -> bool {
        self.state == DaemonState::WaitingForPeers
    }

    /// Gives up the FULL quorum wait: goes on to INIT_GPU without the peers still missing, and
    /// returns them (in ID order). `None` when the wait is not on (it ended or never began).
    pub fn stop_waiting_for_peers(&mut self) -> Option<Vec<NodeId>> {
        if !self.waiting_for_peers() {
            return None;
        }
        let missing = self
            .peer_ids()
            .into_iter()
            .filter(|&id| {
                self.link(id)
                    .is_none_or(|l| l.status != ConnStatus::Connected)
            })
            .collect();
        self.enter_init_gpu();
        Some(missing)
    }

    pub(super) fn check_quorum(&mut self) {
        if self.state == DaemonState::WaitingForPeers
            && self.connected_peers() + 1 + self.cfg.map.placeholders() == self.cfg.map.len()
        {
            self.enter_init_gpu();
        }
    }
}
