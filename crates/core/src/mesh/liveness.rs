//! Liveness: one heartbeat per pair, and one timer for every session.
//!
//! The pair's lower node ID sends heartbeats on the pair's session, whichever side dialled it,
//! and the higher one answers those that ask for an answer: every other one while answers
//! arrive, every one otherwise, and every one when the peer timeout is under four intervals.
//! Each side takes the same exchange as proof the pair is alive: the lower node from the
//! answers, the higher one from the heartbeats, both reported by [`Mesh::handle_heartbeat`]
//! with the session they arrived on. A pair silent for `peer_timeout` is lost on both sides.
//! Halving the heartbeats halves the idle traffic of a domain, which grows as n²: at 144 nodes
//! the messages, not the sessions, are what a machine cannot keep up with.
//!
//! Heartbeats are not timed per session: one tick every `heartbeat_interval` sends every
//! heartbeat due and checks every session's silence, so a session costs no timer, and an
//! answer costs an assignment, not a reordering of timers. A session that began carrying its
//! pair less than an interval before a tick sends no heartbeat on it: its handshake has just
//! proved the pair, the next tick is at most one interval later, and while a domain forms (every
//! session new) a tick would otherwise add one heartbeat per pair to the connections' own cost.
//! Loss is still judged from the last sign of life (the handshake counts as one), so the peer
//! timeout allows one heartbeat fewer before it, never a later loss.
//!
//! Ticks fall on a phase the owner may set ([`Mesh::set_heartbeat_phase`]); daemons that share
//! a machine and a phase wake together once per interval instead of once per peer, so each
//! wake-up handles a batch of messages. A loss is seen between `peer_timeout` and
//! `peer_timeout + heartbeat_interval` after the last sign of life. A killed peer is seen at
//! once: its sessions close.
//!
//! A tick that comes a whole interval or more after it was due means this daemon did not run
//! (a starved or stopped process, a machine swapping): the peers' heartbeats may be waiting
//! unread in its sockets, so the silence it measures is its own. Such a tick sends the
//! heartbeats but loses nobody; the next tick, a whole interval later, checks, late or not
//! (a real loss is seen at most one interval later). A 144-node domain forming on 2 cores
//! kept losing pairs to ticks that ran seconds late, and every loss cost a new session.

use std::time::{Duration, Instant};

use super::{Action, Mesh, Via};
use crate::ids::NodeId;
use crate::state::DaemonState;

/// Heartbeats may go unanswered every other tick only with a peer timeout of at least this many
/// heartbeat intervals (`Mesh::may_skip_answer`).
const SKIP_MARGIN: u32 = 4;

impl Mesh {
    /// Aligns heartbeat ticks on `phase + k * heartbeat_interval` (default: the mesh's
    /// creation). The owner may derive it from a clock its neighbours share.
    pub fn set_heartbeat_phase(&mut self, phase: Instant) {
        self.phase = phase;
    }

    /// A heartbeat (on the higher node) or its answer (on the lower one) arrived on session
    /// `via`: the pair's sign of life if `via` carries the pair; ignored otherwise.
    ///
    /// Only the pair's lower node ID sends heartbeats, on the pair's session, and the higher
    /// one answers: the lower node takes the answers and the higher one the heartbeats as proof
    /// the pair is alive, so a silent pair is lost on both sides after `peer_timeout`, checked
    /// on one tick per `heartbeat_interval` for all sessions (aligned by
    /// [`Mesh::set_heartbeat_phase`]).
    pub fn handle_heartbeat(&mut self, now: Instant, via: Via) {
        let Some(peer) = self.carrier_peer(via) else {
            return;
        };
        if let Some(c) = self.link_mut(peer).and_then(|l| l.carrier.as_mut()) {
            c.last_rx = now.max(c.last_rx);
        }
    }

    /// Whether a heartbeat sent now may go unanswered: the last one asked for an answer and the
    /// pair has been heard from since (its answer), and the peer timeout is
    /// at least [`SKIP_MARGIN`] intervals. So answers come every other tick while they come,
    /// every tick while they do not, and the pair never goes two ticks without asking: a
    /// quarter fewer messages per pair, and a hung peer is seen at most one interval later than
    /// with every heartbeat answered.
    fn may_skip_answer(&self, last_rx: Instant, asked_at: Option<Instant>) -> bool {
        let interval = self.cfg.heartbeat_interval;
        self.cfg.peer_timeout >= interval.saturating_mul(SKIP_MARGIN)
            && asked_at.is_some_and(|asked| last_rx >= asked)
    }

    /// Whether this node sends the pair's heartbeats to `peer` (it has the lower ID).
    pub fn sends_heartbeats(&self, peer: NodeId) -> bool {
        self.cfg.local < peer
    }

    /// Arms the tick if it is not: called when a session opens.
    pub(super) fn arm_tick(&mut self, now: Instant) {
        if self.tick.is_none() && self.sessions > 0 && self.state != DaemonState::ShuttingDown {
            self.tick = Some(self.next_tick(now));
        }
    }

    /// The first tick strictly after `now`.
    fn next_tick(&self, now: Instant) -> Instant {
        let period = self.cfg.heartbeat_interval.max(Duration::from_millis(1));
        let Some(since) = now.checked_duration_since(self.phase) else {
            return self.phase;
        };
        let k = since.as_nanos() / period.as_nanos() + 1;
        let k = u32::try_from(k).unwrap_or(u32::MAX);
        self.phase
            .checked_add(period.saturating_mul(k))
            .unwrap_or(now + period)
    }

    /// The tick: loses silent sessions, sends the heartbeats this node owes, arms the next.
    pub(super) fn heartbeat_tick(&mut self, now: Instant) {
        let timeout = self.cfg.peer_timeout;
        let ms = timeout.as_millis();
        if self.state == DaemonState::ShuttingDown {
            self.tick = None;
            return;
        }
        let due = self.tick.unwrap_or(now);
        let late = now.saturating_duration_since(due) >= self.cfg.heartbeat_interval;
        let spare = late && !self.spared_late_tick;
        self.spared_late_tick = spare;
        let ids: Vec<(NodeId, Via, Instant, Instant, Option<Instant>)> = self
            .links
            .iter()
            .enumerate()
            .filter_map(
                |(i, link)| match (link.as_ref()?.carrier, u16::try_from(i)) {
                    (Some(c), Ok(id)) => Some((NodeId(id), c.via, c.last_rx, c.since, c.asked_at)),
                    _ => None,
                },
            )
            .collect();
        for (id, via, last_rx, since, asked_at) in ids {
            let sender = self.sends_heartbeats(id);
            if !spare && now.saturating_duration_since(last_rx) >= timeout {
                let what = if sender {
                    "no heartbeat answer"
                } else {
                    "no heartbeat from the peer"
                };
                self.lose(now, id, format!("{what} for {ms} ms"));
            } else if sender && now.saturating_duration_since(since) < self.cfg.heartbeat_interval {
                // Opened within the last interval: its handshake is the pair's sign of life,
                // and the next tick is soon enough for the first heartbeat.
            } else if sender {
                let answer = !self.may_skip_answer(last_rx, asked_at);
                if let Some(c) = self.link_mut(id).and_then(|l| l.carrier.as_mut()) {
                    c.asked_at = answer.then_some(now);
                }
                self.actions.push_back(Action::SendHeartbeat {
                    peer: id,
                    via,
                    answer,
                });
            }
        }
        // After a spared tick the readers get a whole interval to catch up before the check
        // (the next tick on the phase could be a moment away); the phase resumes after it.
        let interval = self.cfg.heartbeat_interval;
        self.tick = (self.sessions > 0).then(|| match spare {
            true => now + interval,
            false => self.next_tick(now),
        });
    }
}
