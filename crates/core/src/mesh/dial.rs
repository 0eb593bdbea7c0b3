//! Dialling peers: where our dialling of each peer stands ([`Dialer`]), the queue of dials
//! waiting for a slot ([`DueKey`]: first round, then peers heard from, then the rest), and the
//! results of a dial (`handle_dial_*`). [`Mesh::set_dialer`] is the only way a dialer changes,
//! so the timers, the due queue and the count of dials in flight never drift from the links.
//! `retry.rs` decides when a failed dial is tried again, and `budget.rs` paces the retries.

use std::time::Instant;

use super::{Action, DialFailure, Hello, Mesh, Verdict, Via};
use crate::ids::NodeId;
use crate::state::{ConnStatus, DaemonState, Mismatch};

/// A dial waiting for a slot, in the order slots are given: first-round dials (which need no
/// token), then retries of peers heard from since start, then the rest; in each class the
/// longest waiting first, and among those queued at the same time, in ring order from this node
/// ([`Mesh::due`]).
pub(super) type DueKey = (DueClass, Instant, u32, NodeId);

/// See [`DueKey`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum DueClass {
    FirstRound,
    Known,
    Unknown,
}

/// Where our dialling of a peer stands (the pair's session is
/// [`Link::carrier`](super::Link::carrier)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialer {
    /// Nothing scheduled (the pair has a session, or shutting down, or before start).
    Idle,
    /// Due, waiting for a dial slot (the budget, or the bound on dials in flight).
    Queued(DueKey),
    /// Waiting for the result of this attempt.
    InFlight,
    /// Next attempt at this time.
    Waiting(Instant),
    /// A dial that was due, put off until this time because the peer's hello arrived and its
    /// session should follow (`handshake.rs`); then due again with its place kept.
    PutOff(Instant, DueKey),
}

impl Mesh {
    /// The dial of `attempt` reached the peer, which accepted our hello and answered with its
    /// own; the session ([`Via::Dialled`]) is open. The peer's identity is checked here too, so
    /// a refusal is mutual even if only one side noticed. If the pair already has a session,
    /// the rule of `pair.rs` decides which one it keeps; the other is closed
    /// ([`Action::CloseSession`]).
    pub fn handle_dial_ok(&mut self, now: Instant, peer: NodeId, attempt: u64, remote: &Hello) {
        let via = Via::Dialled { peer, attempt };
        if !self.is_current(peer, attempt, Dialer::InFlight) {
            self.actions.push_back(Action::CloseSession { peer, via });
            return;
        }
        if let Verdict::Refuse { mismatch, detail } = self.judge(remote, Some(peer)) {
            self.actions.push_back(Action::CloseSession { peer, via });
            self.fail_attempt(now, peer, ConnStatus::Mismatch(mismatch), detail);
            self.pump_dials(now);
            return;
        }
        self.note_instance(peer, remote.instance);
        if self.departed(peer, remote.instance) {
            // Answered before the peer began to leave; it said goodbye since (pair.rs).
            self.actions.push_back(Action::CloseSession { peer, via });
            self.schedule_retry(now, peer, DialFailure::Other);
            self.pump_dials(now);
            return;
        }
        self.set_dialer(peer, Dialer::Idle);
        self.session_up(now, peer, via, remote.instance);
        self.pump_dials(now);
    }

    /// The dial of `attempt` failed before a session (refused connection, timeout, DNS).
    /// The link keeps its state; the error is kept for `ctl` and the next attempt is scheduled
    /// (`retry.rs`: after a refused connection, at several times the backoff's cap).
    pub fn handle_dial_failed(
        &mut self,
        now: Instant,
        peer: NodeId,
        attempt: u64,
        failure: DialFailure,
        error: String,
    ) {
        if !self.is_current(peer, attempt, Dialer::InFlight) {
            return;
        }
        let Some(link) = self.link_mut(peer) else {
            return;
        };
        if link.carrier.is_some() {
            // The peer's session carries the pair meanwhile: nothing to retry.
            self.set_dialer(peer, Dialer::Idle);
        } else if link.status == ConnStatus::Connected {
            // A handover whose dial failed (pair.rs): the pair is lost after all.
            link.last_error = Some(error.clone());
            self.lose(now, peer, format!("connection lost: {error}"));
        } else {
            link.last_error = Some(error);
            self.schedule_retry(now, peer, failure);
        }
        self.pump_dials(now);
    }

    /// The peer refused our hello.
    pub fn handle_dial_refused(
        &mut self,
        now: Instant,
        peer: NodeId,
        attempt: u64,
        mismatch: Mismatch,
        detail: String,
    ) {
        if !self.is_current(peer, attempt, Dialer::InFlight) {
            return;
        }
        self.fail_attempt(
            now,
            peer,
            ConnStatus::Mismatch(mismatch),
            format!("peer refused: {detail}"),
        );
        self.pump_dials(now);
    }

    /// The queue key of a dial to `peer` of `class`, due at `at`. Dials due together (the first
    /// round) go in ring order: the peer after this node first, wrapping round to the one before
    /// it. When a domain starts together, each node is then first in one node's queue, not in
    /// every node's (in ID order all would dial node 0 first, then node 1, piling their
    /// handshakes on the lowest IDs); and when nodes start one after another in ID order (a
    /// loop over a node list), a starting node dials the nodes not yet up first, whose refusals
    /// cost a connect each and free their slots at once, so its dials to them are not still
    /// queued when they come up and dial it (two sessions for one pair).
    pub(super) fn due(&self, class: DueClass, at: Instant, peer: NodeId) -> DueKey {
        let n = u32::try_from(self.cfg.map.len()).unwrap_or(u32::MAX).max(1);
        let ring = (u32::from(peer.0) + n - u32::from(self.cfg.local.0) % n) % n;
        (class, at, ring, peer)
    }

    /// Whether `attempt` is the dial to `peer` the mesh waits for. Any other's result is
    /// ignored ([`Mesh::handle_dial_ok`] closes its session), so an owner that holds sessions
    /// MUST NOT let a late answer to a superseded attempt replace the session it holds.
    pub fn dial_in_flight(&self, peer: NodeId, attempt: u64) -> bool {
        self.is_current(peer, attempt, Dialer::InFlight)
    }

    pub(super) fn is_current(&self, peer: NodeId, attempt: u64, want: Dialer) -> bool {
        self.link(peer)
            .is_some_and(|l| l.attempt == attempt && l.dialer == want)
    }

    pub(super) fn dial(&mut self, peer: NodeId) {
        if self.state == DaemonState::ShuttingDown {
            return;
        }
        let Some(link) = self.link_mut(peer) else {
            return;
        };
        link.attempt += 1;
        let attempt = link.attempt;
        self.set_dialer(peer, Dialer::InFlight);
        self.actions.push_back(Action::Dial { peer, attempt });
    }

    /// Dials queued links while a slot is free: first-round dials need only a free slot,
    /// retries also a token of the budget.
    pub(super) fn pump_dials(&mut self, now: Instant) {
        if self.state == DaemonState::ShuttingDown {
            return;
        }
        self.first_round_release();
        while self.in_flight < self.budget.max_in_flight {
            let Some(&(class, _, _, peer)) = self.due.first() else {
                return;
            };
            if class != DueClass::FirstRound && !self.tokens.take(now, &self.budget) {
                return;
            }
            self.dial(peer);
        }
    }

    /// When a link's timer fires, if it has one.
    /// Sessions have none: the heartbeat tick covers them all.
    pub(super) fn deadline(dialer: Dialer) -> Option<Instant> {
        match dialer {
            Dialer::Waiting(at) | Dialer::PutOff(at, _) => Some(at),
            Dialer::Idle | Dialer::Queued(_) | Dialer::InFlight => None,
        }
    }

    /// The only way a link's dialer changes: keeps the timers, the due queue and the count of
    /// dials in flight in step with it.
    pub(super) fn set_dialer(&mut self, peer: NodeId, to: Dialer) {
        let Some(from) = self.link(peer).map(|l| l.dialer) else {
            return;
        };
        if let Some(at) = Self::deadline(from) {
            self.timers.remove(&(at, peer));
        }
        match from {
            Dialer::Queued(key) => {
                self.due.remove(&key);
            }
            Dialer::InFlight => self.in_flight -= 1,
            Dialer::Idle | Dialer::Waiting(_) | Dialer::PutOff(..) => {}
        }
        if let Some(at) = Self::deadline(to) {
            self.timers.insert((at, peer));
        }
        match to {
            Dialer::Queued(key) => {
                self.due.insert(key);
            }
            Dialer::InFlight => self.in_flight += 1,
            Dialer::Idle | Dialer::Waiting(_) | Dialer::PutOff(..) => {}
        }
        if let Some(link) = self.link_mut(peer) {
            link.dialer = to;
        }
        self.first_round_step(peer, to);
    }
}
