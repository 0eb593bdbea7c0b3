//! The first round of dials, at start: one connection per pair when a domain starts together.
//!
//! A node dials every peer at start, and a pair keeps one session whichever side dialled it
//! (`pair.rs`). When both nodes of a pair are up and each dials the other at once, the pair
//! gets two connections and closes one: each side paid a TCP connection, a TLS and HTTP/2
//! start and a hello for nothing. A domain whose daemons start together (a rack powered on,
//! a prolog or a DaemonSet starting every daemon at once) did that for nearly every pair: 291
//! connections accepted for the 153 pairs of 18 daemons started by `bench`, where a gRPC mesh
//! that dials one way needs 153.
//!
//! So the first round goes in two halves. First the peers with a higher node ID: the pair's
//! preferred session (`pair.rs`) is the one its lower node dials. Then, once every one of
//! those dials has answered (a refusal from a peer not up yet answers at once), the peers with
//! a lower ID that have not opened their session to us meanwhile. A lower peer that started
//! when we did dials us in its own first half, at its start, and that dial takes about as long
//! as ours took: by the time ours have answered, it has mostly arrived, and the pair is not
//! dialled again. So in a domain started together each pair is dialled once, by its lower
//! node, except the highest node's pairs: it has no first half to time, and it dials at once,
//! since its lower peers may be waiting for it (below). A peer that is not up is dialled by
//! whichever of the two starts later, without waiting: when nodes start one after another from
//! the lowest ID, each new node's higher peers refuse at once and its lower ones (whose dials
//! it refused before it was up, and which leave the pair to it) are dialled straight away;
//! from the highest ID down, each new node's higher peers answer its dials. The second half
//! waits at most the backoff's first delay, so a first-half dial that hangs (a peer that
//! swallows connections) holds nobody up longer than a refused dial's retry would.
//!
//! A peer whose connection to us is already accepted when we start, or when its dial comes
//! due, is not dialled back at once either ([`Mesh::handle_peer_connecting`]): that connection
//! is its dial, and its hello follows within a round trip. Its address names it (the owner
//! looks the connection's source up in the node map); its dial is put off by the backoff's
//! first delay, as an accepted hello puts it off, and goes out then if no session came. In
//! an 18-node formation traced on 2 cores (2026-12-08), 10 of the 153 pairs were connected
//! twice: half by the highest node, which dialled at its start peers whose connections were
//! already waiting in its listener's backlog, and most others by a dial that left 2–6 ms after
//! the peer's own connection was accepted, before its hello reached the engine.
//!
//! The second half does not wait again as long as the first half took (it did until
//! 2026-12-07): daemons started one after another do not start in exactly that order, and a
//! node whose first half found a higher peer already up held every pair with its lower peers
//! (which had left those pairs to it) back by twice that peer's handshake. Measured on 2
//! cores, daemons started in ID order as the bench starts them: formation of 18 daemons 85 →
//! 77 ms, of 72 705 → 681 ms, of 144 unchanged, with as many connections accepted (161–166
//! for 153 pairs at 18, 2,565–2,600 for 2,556 at 72, either way).

use std::collections::BTreeSet;
use std::time::Instant;

use super::dial::DueClass;
use super::{Dialer, Mesh};
use crate::ids::NodeId;

/// Where the first round stands.
#[derive(Debug, Default)]
pub(super) struct FirstRound {
    /// Peers of the first half (higher IDs) whose dial has not answered yet.
    first: BTreeSet<NodeId>,
    /// Peers of the second half (lower IDs), their dial put off until `first` is empty (or
    /// until the backoff's first delay has passed).
    second: BTreeSet<NodeId>,
    /// Peers whose connection to us was accepted before the start: not in the round, their
    /// dial put off from the start ([`Mesh::handle_peer_connecting`]).
    connecting: BTreeSet<NodeId>,
}

impl Mesh {
    /// Queues the first round: the higher peers now, the lower ones once those dials have
    /// answered.
    pub(super) fn queue_first_round(&mut self, now: Instant) {
        let local = self.cfg.local;
        let connecting = std::mem::take(&mut self.first_round.connecting);
        let (first, second): (Vec<NodeId>, Vec<NodeId>) = (self.peer_ids().into_iter())
            .filter(|p| !connecting.contains(p))
            .partition(|p| *p > local);
        for id in connecting {
            if self.link(id).is_some() {
                let key = self.due(DueClass::FirstRound, now, id);
                self.set_dialer(id, Dialer::PutOff(now + self.cfg.backoff.min, key));
            }
        }
        for id in &first {
            let key = self.due(DueClass::FirstRound, now, *id);
            self.set_dialer(*id, Dialer::Queued(key));
        }
        self.first_round.first = first.into_iter().collect();
        let wait = !self.first_round.first.is_empty();
        for id in second {
            let key = self.due(DueClass::FirstRound, now, id);
            if wait {
                self.set_dialer(id, Dialer::PutOff(now + self.cfg.backoff.min, key));
                self.first_round.second.insert(id);
            } else {
                self.set_dialer(id, Dialer::Queued(key));
            }
        }
    }

    /// `peer`'s dialer became `to` ([`Mesh::set_dialer`]): a first-half dial that is neither
    /// waiting for a slot nor in flight any more has answered (or is no longer needed). A
    /// second-half peer whose put-off ended otherwise (its session arrived, its time came)
    /// leaves the round.
    pub(super) fn first_round_step(&mut self, peer: NodeId, to: Dialer) {
        let round = &mut self.first_round;
        if !matches!(to, Dialer::PutOff(..)) {
            round.second.remove(&peer);
        }
        if !matches!(to, Dialer::Queued(_) | Dialer::InFlight) {
            round.first.remove(&peer);
        }
    }

    /// Before the start, a connection from `peer` was accepted: the first round puts its dial
    /// off instead of queueing it.
    pub(super) fn first_round_connecting(&mut self, peer: NodeId) {
        if self.link(peer).is_some() {
            self.first_round.connecting.insert(peer);
        }
    }

    /// `peer` said hello: if its dial waits for the first half to answer, it no longer does
    /// (its session follows the hello; [`Mesh::handle_hello`] puts the dial off from now).
    pub(super) fn first_round_heard(&mut self, peer: NodeId) -> bool {
        self.first_round.second.remove(&peer)
    }

    /// Once every first-half dial has answered: the second half is dialled now
    /// ([`Mesh::pump_dials`] asks).
    pub(super) fn first_round_release(&mut self) {
        let round = &mut self.first_round;
        if !round.first.is_empty() || round.second.is_empty() {
            return;
        }
        for id in std::mem::take(&mut round.second) {
            if let Some(Dialer::PutOff(_, key)) = self.link(id).map(|l| l.dialer) {
                self.set_dialer(id, Dialer::Queued(key));
            }
        }
    }
}
