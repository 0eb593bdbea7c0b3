//! `IMEX_CONN_WAIT_TIMEOUT`: the bound on the FULL quorum's start-up wait for peers.
//!
//! The key is a legacy one (NVIDIA's Slurm prolog example sets it to 70; docs/reference/imex-guide.md §1), read
//! here as the longest a node with `IMEX_WAIT_FOR_QUORUM=FULL` stays in WAITING_FOR_PEERS:
//! when it passes with peers still missing, the node goes on to INIT_GPU and READY without
//! them, and says so ([`Action::PeersWaitOver`] names them; the owner logs a warning). The
//! missing peers are still dialled, and join as they come up.
//!
//! It does not bound the RECOVERY wait (`node/recovery.rs`): that one keeps fabric allocation
//! disabled while nodes may still map memory the previous daemon left dangling, and ending it
//! early would hand that memory out again under them. Its bound stays the grace time (or the
//! default recovery wait); the owner logs that the key does not apply to it.

use std::time::Instant;

use super::{Action, Node, Timer};

impl Node {
    /// At start: arm the bound if the mesh entered the FULL wait.
    pub(super) fn start_peers_wait(&mut self, now: Instant) {
        if let Some(wait) = self.conn_wait_timeout
            && self.mesh.waiting_for_peers()
        {
            self.arm(now + wait, Timer::PeersWaitOver);
        }
    }

    /// The bound passed: go on without the peers still missing (if still waiting).
    pub(super) fn peers_wait_over(&mut self, now: Instant) {
        let Some(missing) = self.mesh.stop_waiting_for_peers() else {
            return;
        };
        self.actions.push_back(Action::PeersWaitOver {
            missing,
            waited: self.conn_wait_timeout.unwrap_or_default(),
        });
        self.absorb_mesh(now);
    }
}
