//! Clean-up of a peer that is gone: at once for a restart or a departure, after the grace time
//! (`IMEX_NODE_DISCONNECTED_GRACE_TIME`) for a peer that is only lost.
//!
//! A lost peer is cleaned in two steps. At the end of the grace time its memory is *fenced*
//! here: the local importers of its memory are disabled, imports in flight to it fail and
//! unimports waiting on it finish. What it held here (references on this node's exports for
//! its importers) is *released* only a fence margin later (at the least) — the peer timeout
//! plus two heartbeat intervals. The release is what lets the exporting application's memory
//! be freed and reused, so it must come after the peer has fenced *its* importers of that memory. A
//! peer behind a partition runs the same grace timer from its own loss detection, which lags
//! or leads ours by at most a peer timeout and a heartbeat; the margin adds one more heartbeat
//! so that its fence comes strictly first, and none of its importers can read memory freed
//! here. (The pair's lower node hears the higher one only every other interval while answers
//! arrive, `mesh::liveness`, so its last sign of life may be two intervals old where the higher
//! node's is one: the two detections differ by at most three intervals, inside that bound,
//! because answers are skipped only with a peer timeout of four intervals or more.) Releasing
//! at the same
//! instant (as the fence) would be a race between two daemons' timers.
//!
//! The margin cannot help a peer whose daemon is frozen (SIGSTOP, a hung host) for longer than
//! the grace time while its applications keep running: nothing on that node can disable them
//! until the daemon runs again. A daemon starved of the CPU for an interval or more is outside
//! the margin's reckoning too: its liveness tick spares that late check (`mesh::liveness`), so
//! its loss detection lags by its own delay plus one heartbeat; as for a frozen daemon, no
//! fixed margin covers a delay without bound. A grace time of N seconds declares that a peer
//! silent for N seconds is dead; where that may not hold, NVIDIA's default (-1, wait forever)
//! is the safe setting.
//!
//! If the peer comes back (same instance) between the fence and the release, the references
//! stay: the peer fenced too and its queued unimports release them, or it never lost us and
//! its importers are still using them. "Comes back" means its link is CONNECTED here again,
//! and that alone cancels the release.
//!
//! The peer may count the pair as alive later than our last sign of it: whenever we answer
//! its hello (while the pair is lost here, or while our own session still carries it and its
//! new one is kept unused), it counts the pair connected from when the answer reaches it,
//! which is within its dial timeout ([`MeshConfig::dial_timeout`]) or never; it then loses the
//! pair a peer timeout and at most an interval later (nothing else of ours answers it: a
//! session's heartbeats travel behind its opening, and a session we closed answers none), and
//! fences a grace time after that. So the release also waits a grace time, a fence margin and
//! a dial timeout after the last hello of it we answered: the answer's way, then the peer's
//! loss detection and grace time, with a heartbeat interval to spare. Only a restart or a
//! departure of that instance forgets the answer.
//!
//! Which references the release may touch: only those of imports the peer made before it
//! fenced ours, never one it made after coming back. A peer is served only while the pair's
//! link is CONNECTED here (`exporter.rs`), and that cancels the release: so a request that
//! reaches us on a connection its hello proved, ahead of the session it opens (a unary call),
//! takes no reference while a clean-up is under way; and a describe that lands after the
//! fence, for an import asked before it, is released at once.
//!
//! [`MeshConfig::dial_timeout`]: crate::mesh::MeshConfig::dial_timeout

use std::time::{Duration, Instant};

use super::{Action, Cleaned, Node, Timer};
use crate::ids::{InstanceId, NodeId};

impl Node {
    /// How long after fencing a lost peer's memory the references it held are released.
    pub(super) fn fence_margin(&self) -> Duration {
        let mesh = self.mesh.config();
        mesh.peer_timeout + 2 * mesh.heartbeat_interval
    }

    /// A lost peer stayed away for its whole grace time: fence its memory here now, release
    /// what it held here after [`Node::fence_margin`] at the least (IMEX guide "Connections,
    /// Quorum, and Clean up"; docs/reference/driver-interface.md §4 "Peer node dies or disconnects").
    pub(super) fn grace_over(&mut self, now: Instant, peer: NodeId) {
        if self.connected(peer).is_some() || self.cleaned.contains_key(&peer) {
            return;
        }
        self.cleaned.insert(peer, self.grace.unwrap_or_default());
        // The peer may be alive behind a partition, still holding references for imports we
        // now drop: tell it when it is back (a restart forgets them first).
        let (maybe_held, cleaned) = self.fence(peer);
        for import_event_id in maybe_held {
            self.imports.undelivered(peer, import_event_id);
        }
        self.record_cleanup(now, peer, "lost for longer than the grace time", cleaned);
        let at = self.release_due(now, peer);
        self.arm(at, Timer::GraceRelease(peer));
    }

    /// When what a lost peer held here may be released: a fence margin after our fence, and
    /// no earlier than a grace time, a fence margin and a dial timeout after the last hello of
    /// it we answered (module docs).
    fn release_due(&self, fenced: Instant, peer: NodeId) -> Instant {
        let at = fenced + self.fence_margin();
        self.answered
            .get(&peer)
            .map_or(at, |answered| at.max(self.answer_settled(*answered)))
    }

    /// When a peer we answered at `answered` has, at the latest, fenced our memory if it lost
    /// the pair just after: a dial timeout, a grace time and a fence margin later.
    fn answer_settled(&self, answered: Instant) -> Instant {
        answered
            + self.mesh.config().dial_timeout
            + self.grace.unwrap_or_default()
            + self.fence_margin()
    }

    /// We accepted the hello of `peer`: it may take the pair as connected from our answer. A
    /// release of what it holds here that is due sooner waits (module docs).
    pub(super) fn answered_hello(&mut self, now: Instant, peer: NodeId) {
        self.answered.insert(peer, now);
        if let Some(&due) = self.deadlines.get(&Timer::GraceRelease(peer)) {
            let settled = self.answer_settled(now);
            if settled > due {
                self.arm(settled, Timer::GraceRelease(peer));
            }
        }
    }

    /// The release step of a lost peer's clean-up (a fence margin or more after its fence)
    /// and it is still away: release the references held for its importers.
    pub(super) fn grace_release(&mut self, now: Instant, peer: NodeId) {
        if self.connected(peer).is_some() {
            return;
        }
        let released = self.release_held_for(now, peer, None);
        self.cleanups.add_released(peer, released);
    }

    /// A peer's old instance is gone (restart, or clean departure): release what we held for
    /// its importers, fail what we asked of it, finish the unimports that wait on it, and
    /// disable local clients still mapping its memory (it may be freed or reused).
    /// Returns the imports that instance may still hold references for, and what was cleaned.
    pub(super) fn peer_gone(
        &mut self,
        now: Instant,
        peer: NodeId,
        current: Option<InstanceId>,
    ) -> (Vec<u64>, Cleaned) {
        let exports_released = self.release_held_for(now, peer, current);
        self.give_backs.forget(peer);
        let (maybe_held, mut cleaned) = self.fence(peer);
        cleaned.exports_released = exports_released;
        (maybe_held, cleaned)
    }

    /// Releases the references held for `peer`'s importers (only those of instances other than
    /// `current`, when given). Returns how many.
    fn release_held_for(
        &mut self,
        now: Instant,
        peer: NodeId,
        current: Option<InstanceId>,
    ) -> usize {
        let refs = match current {
            Some(instance) => self.exports.drain_stale(peer, instance),
            None => self.exports.drain_node(peer),
        };
        let n = refs.len();
        if n > 0 {
            self.release(now, refs.into(), None);
        }
        n
    }

    /// Fences `peer`'s memory here: fails what we asked of it, finishes the unimports that wait
    /// on it, and disables the local importers of its memory. Returns the imports the peer may
    /// still hold references for, and what was cleaned (without released references).
    fn fence(&mut self, peer: NodeId) -> (Vec<u64>, Cleaned) {
        let mut cleaned = Cleaned::default();
        let drained = self.imports.drain_exporter(peer);
        cleaned.imports_dropped = drained.unanswered.len() + drained.held.len();
        let mut maybe_held = drained.maybe_held();
        self.disarm(Timer::Redeliver(peer));
        for import_event_id in drained.unanswered {
            self.disarm(Timer::Import(import_event_id));
            self.actions.push_back(Action::ValidateImport {
                import_event_id,
                result: Err(crate::gpu::Status::InvalidState),
            });
        }
        let mut finish = drained.finish;
        let waiting: Vec<(NodeId, u64)> = self
            .unimports
            .keys()
            .filter(|(node, _)| *node == peer)
            .copied()
            .collect();
        for key in waiting {
            self.disarm(Timer::Unimport(key.0, key.1));
            maybe_held.push(key.1);
            if let Some(Some(token)) = self.unimports.remove(&key) {
                finish.push(token);
            }
        }
        self.abandoned.retain(|_, (node, _)| *node != peer);
        cleaned.unimports_finished = finish.len();
        if !finish.is_empty() {
            finish.sort_unstable();
            self.actions
                .push_back(Action::FinishUnimports { ids: finish.into() });
        }
        self.actions
            .push_back(Action::DisableImporters { node: peer });
        maybe_held.sort_unstable();
        maybe_held.dedup();
        (maybe_held, cleaned)
    }
}
