//! The handshake: what a daemon says about itself ([`Hello`]), how an inbound one is judged
//! ([`Verdict`]), and what an accepted one teaches the mesh (the peer's instance, so a restart
//! is seen). Only our own dial's verdict may mark a link mismatched.

use std::sync::Arc;
use std::time::Instant;

use super::{Action, Dialer, Mesh};
use crate::ids::{InstanceId, NodeId};
use crate::state::{DaemonState, Mismatch};

/// What a daemon says about itself in a handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Sender's domain ID.
    pub domain_id: String,
    /// Sender's node ID.
    pub node: NodeId,
    /// Sender's instance.
    pub instance: InstanceId,
    /// Sender's node-map digest.
    pub digest: String,
    /// Sender's node map (to explain a mismatch, and to accept a map grown by SIGUSR1).
    /// Shared: a daemon hands its hello to every dial, and a node map may have thousands of
    /// entries.
    pub node_map: Arc<[String]>,
    /// How many entries the sender's node map had when it started (0: not said, take all);
    /// the rest were appended by SIGUSR1. See [`NodeMap::accepts`](crate::nodemap::NodeMap::accepts).
    pub map_base_len: usize,
    /// Sender's protocol version.
    pub protocol_version: u32,
}

/// The answer to an inbound handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Talk.
    Accept,
    /// This daemon is shutting down: answer "unavailable", so the caller treats it as a failed
    /// dial (its link keeps showing our departure) rather than as a mismatch.
    ShuttingDown,
    /// Neither accepted nor refused: the hello left its node map's entries out (a daemon's
    /// dial sends only their digest, which decides between daemons of one map) and its digest
    /// is not ours, so its entries decide (a map grown by SIGUSR1, a hole filled in, or what
    /// differs). The caller is asked to send its hello again with them; nothing is counted.
    MapNeeded,
    /// Refuse, with the reason the caller shows in `ctl`.
    Refuse {
        /// What differs.
        mismatch: Mismatch,
        /// Human-readable detail.
        detail: String,
    },
}

impl Mesh {
    /// An inbound hello. Returns the verdict to answer with. A refusal changes nothing here:
    /// anyone who can reach the port can send a hello naming a real peer, so only our own dial
    /// to the address in the node map may mark a link mismatched. An accepted hello only
    /// records the peer's instance: the link comes up when the peer opens its session
    /// ([`Mesh::handle_session_opened`]), with no dial of ours.
    ///
    /// Our dial to that peer, if it is still waiting for a slot, is put off by the backoff's
    /// first delay: the peer's session follows its hello within a round trip and makes that
    /// dial unneeded, and at formation (every node dialling every other, a few at a time) a
    /// dial that would open a second session only for the pair to close one costs each side a
    /// TCP connection, a TLS and HTTP/2 start and a hello. If the session does not follow, the
    /// dial is due again then, with its place kept (a first-round dial needs no retry token).
    /// A first-round dial put off until the first half of the round has answered
    /// (`first_round.rs`) is put off from the hello the same way.
    pub fn handle_hello(&mut self, now: Instant, remote: &Hello) -> Verdict {
        if self.state == DaemonState::ShuttingDown {
            return Verdict::ShuttingDown;
        }
        let verdict = self.judge(remote, None);
        if verdict == Verdict::Accept {
            self.note_instance(remote.node, remote.instance);
            self.put_off_for_session(now, remote.node);
        }
        verdict
    }

    /// A connection from `peer`'s address in the node map was accepted and has not said its
    /// hello yet (the owner looks the source address up; a connection from anywhere else says
    /// nothing). It is `peer`'s dial, whose hello and session follow within a round trip, so
    /// our dial to `peer` is put off as an accepted hello puts it off ([`Mesh::handle_hello`]),
    /// and one that would come with the first round is put off from the start
    /// (`first_round.rs`). If no session comes, the dial is due when the put-off ends. Only a
    /// dial still waiting for a slot or for the first half is put off: one in flight, or a
    /// retry waiting out its delay, is left as it is.
    pub fn handle_peer_connecting(&mut self, now: Instant, peer: NodeId) {
        match self.state {
            DaemonState::ShuttingDown => {}
            DaemonState::Initializing => self.first_round_connecting(peer),
            _ => self.put_off_for_session(now, peer),
        }
    }

    /// `peer`'s session is on its way: our dial to it, if it is still waiting for a slot (or
    /// for the first round's first half), is put off by the backoff's first delay.
    fn put_off_for_session(&mut self, now: Instant, peer: NodeId) {
        let dialer = (self.link(peer))
            .filter(|l| l.carrier.is_none())
            .map(|l| l.dialer);
        // A dial put off for the first round's second half is put off from now too.
        let key = match dialer {
            Some(Dialer::Queued(key)) => Some(key),
            Some(Dialer::PutOff(_, key)) if self.first_round_heard(peer) => Some(key),
            _ => None,
        };
        if let Some(key) = key {
            let at = now + self.cfg.backoff.min;
            self.set_dialer(peer, Dialer::PutOff(at, key));
            // The first round's second half may be due now (`first_round.rs`).
            self.pump_dials(now);
        }
    }

    /// Whether `remote` has our node map (same digest): an answer to its hello needs none of
    /// our entries, which only explain a mismatch or admit a map grown by SIGUSR1 (at 144
    /// nodes they are most of an answer's bytes).
    pub fn shares_map(&self, remote: &Hello) -> bool {
        remote.digest == self.cfg.map.digest()
    }

    pub(super) fn judge(&self, remote: &Hello, expected_node: Option<NodeId>) -> Verdict {
        let refuse = |mismatch, detail: String| Verdict::Refuse { mismatch, detail };
        if remote.protocol_version != self.cfg.protocol_version {
            return refuse(
                Mismatch::Version,
                format!(
                    "protocol version {} here, {} on node {}",
                    self.cfg.protocol_version, remote.protocol_version, remote.node
                ),
            );
        }
        let map = &self.cfg.map;
        // An inbound hello without entries (a daemon's dial sends none) whose digest is not ours
        // is asked for them. An answer to our dial is judged as it comes: the peer leaves its
        // entries out only when its digest is the one we sent (imexd puts ours back), so an
        // answer without them and of another digest is a mismatch.
        if expected_node.is_none() && remote.node_map.is_empty() && remote.digest != map.digest() {
            return Verdict::MapNeeded;
        }
        if let Err(detail) = map.accepts(
            self.base_len,
            &remote.node_map,
            &remote.digest,
            remote.map_base_len,
        ) {
            return refuse(Mismatch::NodeMap, detail);
        }
        if remote.domain_id != self.cfg.domain_id {
            return refuse(
                Mismatch::Domain,
                format!(
                    "domain {:?} here, {:?} on the peer",
                    self.cfg.domain_id, remote.domain_id
                ),
            );
        }
        let wrong = remote.node == self.cfg.local
            || remote.node.index() >= self.cfg.map.len()
            || self.cfg.map.is_placeholder(remote.node)
            || expected_node.is_some_and(|e| e != remote.node);
        if wrong {
            return refuse(
                Mismatch::WrongNode,
                format!(
                    "peer says it is node {} (expected {:?}, this is node {})",
                    remote.node, expected_node, self.cfg.local
                ),
            );
        }
        Verdict::Accept
    }

    pub(super) fn note_instance(&mut self, peer: NodeId, instance: InstanceId) {
        let Some(link) = self.link_mut(peer) else {
            return;
        };
        if link.departed.is_some_and(|d| d != instance) {
            link.departed = None;
        }
        match link.instance.replace(instance) {
            Some(old) if old != instance => {
                self.actions.push_back(Action::PeerRestarted {
                    peer,
                    old,
                    new: instance,
                });
            }
            _ => {}
        }
    }
}
