//! One session per pair: which of a pair's sessions carries it, and how both sides agree.
//!
//! A pair's session is either one this node dialled ([`Via::Dialled`]) or one the peer dialled
//! to us ([`Via::Accepted`]). The first one up carries the pair, except that a session dialled
//! by the pair's lower node ID is *preferred* and replaces one dialled by the higher: both
//! sides apply the same rule to the same two sessions, so simultaneous dials end with the
//! lower-dialled session on both sides.
//!
//! The losing session is closed by the higher node, which dialled it, once the preferred
//! session has reached it: it replaces its own dialled session then, or closes a dial of its
//! own that completes after. The lower node never closes it: if it did, the higher node could
//! see its session end before the preferred one arrives, and would take the pair for lost (a
//! RECOVERING flap that fails requests in flight and, with a grace time of zero, cleans the
//! peer up). So on the lower node a higher-dialled session that arrives while its own carries
//! the pair is kept open unused, and one that carried the pair until its own dial completed is
//! left open too; either ends when the higher node closes it.
//!
//! A session we dialled proves the peer's identity for requests while it carries the pair
//! (`node/sessions.rs`), and also after the peer said goodbye on it, until it ends: the
//! leaving peer may still hand back imports on it, and refusing those would leave the
//! references it held here taken. Any other session we dialled has been closed by us, and
//! nothing more arrives on it.
//!
//! A session to an instance the mesh no longer knows (the peer restarted) carries nothing and
//! is replaced (and closed) by any session of the current instance; a new session from the
//! side that dialled the current one replaces and closes it too (that side only dials when it
//! has lost its session, so the old one is dead there).
//!
//! The higher node closes its own session as soon as the lower node's session reaches it,
//! which can be before the lower node has the answer to its dial. So on the lower node, the
//! end of the higher-dialled session that carries the pair, while its own dial to the peer is
//! in flight, is a *handover*, not a loss: the link stays CONNECTED without a carrier until
//! that dial answers (its session carries the pair) or fails (the pair is lost then, so a
//! peer that really died is noticed within the dial timeout). Without this, every pair whose
//! dials crossed flapped RECOVERING and waited out a backoff.
//!
//! An instance that said goodbye is leaving: no session of it carries the pair again, though
//! one may still reach us after the goodbye (a dial the peer made before it began to leave,
//! whose stream or answer travels on another connection than the goodbye). Such a session is
//! closed on arrival, and the session the goodbye found carrying the pair stays the peer's for
//! its last requests (its farewell, above) instead of being replaced by it: taking it as the
//! pair's would show a departed peer CONNECTED and refuse the imports it hands back on the
//! session it used before. Only another instance of the node (a restart) is connected again.
//!
//! While a session carries the pair, the link is CONNECTED and nothing is dialled: a queued or
//! waiting retry is cancelled when the peer's session arrives, and only a dial already in
//! flight is let finish (the rule then decides). A pair whose session is lost is RECOVERING on
//! both sides and both retry; whichever gets through first carries the pair again.

use std::time::Instant;

use super::{Action, Dialer, Mesh};
use crate::ids::{ConnId, InstanceId, NodeId};
use crate::state::{ConnStatus, DaemonState};

/// Which session of a pair: one this node dialled, or one the peer dialled to us.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Via {
    /// Our dial to `peer` of this `attempt` (as in [`Action::Dial`]).
    Dialled {
        /// The peer.
        peer: NodeId,
        /// The dial's attempt.
        attempt: u64,
    },
    /// The session the peer opened on inbound connection `conn` (proved by its hello).
    Accepted {
        /// The inbound connection.
        conn: ConnId,
    },
}

/// The session that carries a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Carrier {
    pub(super) via: Via,
    /// The peer instance the session proved (its handshake).
    pub(super) instance: InstanceId,
    /// The pair was last heard from then (see `liveness`).
    pub(super) last_rx: Instant,
    /// It began carrying the pair then: its first heartbeat is due a whole interval later
    /// (see `liveness`).
    pub(super) since: Instant,
    /// When our last heartbeat on it asked for an answer; `None` if it asked for none, or none
    /// was sent yet (see `liveness`).
    pub(super) asked_at: Option<Instant>,
}

impl Mesh {
    /// Where requests to `peer` (imports, unimports, status, goodbye) go now: the session that
    /// carries the pair, whichever side dialled it; `None` while there is none.
    pub fn session_of(&self, peer: NodeId) -> Option<Via> {
        self.link(peer).and_then(|l| l.carrier).map(|c| c.via)
    }

    /// The peer and instance `via` proves, if it carries its pair now (or is a session we
    /// dialled that is closing: the one the peer said goodbye on, or the one the preferred
    /// session replaced, until it ends) and its instance is still the one the mesh knows (a
    /// hello from a restarted peer makes it stale).
    pub fn proven_by(&self, via: Via) -> Option<(NodeId, InstanceId)> {
        let (peer, instance) = match self.carrier_peer(via) {
            Some(peer) => (peer, self.link(peer)?.carrier?.instance),
            None => match via {
                Via::Dialled { peer, attempt } => {
                    let link = self.link(peer)?;
                    match (link.farewell, link.superseded) {
                        (Some((a, instance)), _) | (_, Some((a, instance))) if a == attempt => {
                            (peer, instance)
                        }
                        _ => return None,
                    }
                }
                Via::Accepted { .. } => return None,
            },
        };
        // A node whose entry is a placeholder (its line removed: a hole) proves nothing more.
        let known = self.link(peer)?.instance == Some(instance);
        (known && !self.cfg.map.is_placeholder(peer)).then_some((peer, instance))
    }

    /// The peer `instance` of `peer`, proved on inbound connection `conn` by an accepted hello,
    /// opened its session on it. Returns `false` if the owner must close it at once (this node
    /// is stopping, `instance` is not the one the mesh knows, or the peer's entry is a
    /// placeholder now). `true`: keep it open; it
    /// carries the pair ([`Mesh::session_of`]) unless the pair already has the session it
    /// prefers, our own dial's, and then the peer closes it itself once that session reaches it
    /// (module docs).
    pub fn handle_session_opened(
        &mut self,
        now: Instant,
        peer: NodeId,
        instance: InstanceId,
        conn: ConnId,
    ) -> bool {
        // A hello accepted before the peer's line was removed (a hole now) opens nothing.
        if self.state == DaemonState::ShuttingDown
            || self.link(peer).is_none_or(|l| l.instance != Some(instance))
            || self.departed(peer, instance)
            || self.cfg.map.is_placeholder(peer)
        {
            return false;
        }
        self.session_up(now, peer, Via::Accepted { conn }, instance);
        self.pump_dials(now);
        true
    }

    /// Session `via` ended (stream closed or errored, connection closed). If it carried its
    /// pair, the link is RECOVERING and retried; any other session's end changes nothing.
    pub fn handle_session_lost(&mut self, now: Instant, via: Via, reason: String) {
        if let Via::Dialled { peer, attempt } = via
            && let Some(link) = self.link_mut(peer)
            && link.farewell.is_some_and(|(a, _)| a == attempt)
        {
            link.farewell = None;
        }
        if let Via::Dialled { peer, attempt } = via
            && let Some(link) = self.link_mut(peer)
            && link.superseded.is_some_and(|(a, _)| a == attempt)
        {
            link.superseded = None;
        }
        let Some(peer) = self.carrier_peer(via) else {
            return;
        };
        if self.state == DaemonState::ShuttingDown {
            self.set_carrier(peer, None);
            return;
        }
        if matches!(via, Via::Accepted { .. })
            && self.cfg.local < peer
            && self
                .link(peer)
                .is_some_and(|l| l.dialer == Dialer::InFlight)
        {
            // A handover (module docs): the higher node closes the session it dialled as soon
            // as ours reaches it, which can be before our dial's answer reaches us. The link
            // stays CONNECTED on the strength of that dial; if it fails, the pair is lost then.
            self.set_carrier(peer, None);
            return;
        }
        self.lose(now, peer, format!("connection lost: {reason}"));
        self.pump_dials(now);
    }

    /// Whether `instance` of `peer` said goodbye: it is leaving, and no session of it carries
    /// the pair again (module docs).
    pub(crate) fn departed(&self, peer: NodeId, instance: InstanceId) -> bool {
        self.link(peer)
            .is_some_and(|l| l.departed == Some(instance))
    }

    /// Whether `via` would be preferred for its pair with `peer`: dialled by the lower node ID.
    fn preferred(&self, peer: NodeId, via: Via) -> bool {
        match via {
            Via::Dialled { .. } => self.cfg.local < peer,
            Via::Accepted { .. } => peer < self.cfg.local,
        }
    }

    /// The peer whose pair `via` carries now, if any.
    pub(super) fn carrier_peer(&self, via: Via) -> Option<NodeId> {
        let peer = match via {
            Via::Dialled { peer, .. } => peer,
            Via::Accepted { conn } => *self.accepted.get(&conn)?,
        };
        let link = self.link(peer)?;
        link.carrier.is_some_and(|c| c.via == via).then_some(peer)
    }

    /// A session `via` to `instance` of `peer` is up: applies the rule of the module docs.
    /// Returns whether it carries the pair. Of the two sessions, the loser is closed here if
    /// this node dialled it (or it is dead: stale or superseded by its own side).
    pub(super) fn session_up(
        &mut self,
        now: Instant,
        peer: NodeId,
        via: Via,
        instance: InstanceId,
    ) -> bool {
        let Some(link) = self.link(peer) else {
            return false;
        };
        let mut retired = None;
        if let Some(old) = link.carrier {
            if old.via == via {
                return true;
            }
            let stale = old.instance != instance;
            let same_side =
                matches!(old.via, Via::Dialled { .. }) == matches!(via, Via::Dialled { .. });
            if !(stale || same_side || self.preferred(peer, via)) {
                // The pair keeps the session it prefers.
                if let Via::Dialled { attempt, .. } = via {
                    self.actions.push_back(Action::CloseSession { peer, via });
                    // The peer may have taken it as the pair's until ours reaches it.
                    self.supersede(peer, attempt, instance);
                }
                return false;
            }
            if stale || same_side || matches!(old.via, Via::Dialled { .. }) {
                self.actions
                    .push_back(Action::CloseSession { peer, via: old.via });
            }
            if let Via::Dialled { attempt, .. } = old.via
                && !stale
            {
                // The peer sends on it until it sees the switch: its requests are still its.
                retired = Some((attempt, old.instance));
            }
        }
        self.set_carrier(
            peer,
            Some(Carrier {
                via,
                instance,
                last_rx: now,
                since: now,
                asked_at: None,
            }),
        );
        if let Some((attempt, instance)) = retired {
            self.supersede(peer, attempt, instance);
        }
        // Connected: nothing to dial. A dial in flight is let finish; the rule decides then.
        if matches!(
            self.link(peer).map(|l| l.dialer),
            Some(Dialer::Queued(_) | Dialer::Waiting(_) | Dialer::PutOff(..))
        ) {
            self.set_dialer(peer, Dialer::Idle);
        }
        self.arm_tick(now);
        let Some(link) = self.link_mut(peer) else {
            return true;
        };
        link.failures = 0;
        link.last_error = None;
        if link.status != ConnStatus::Connected {
            link.times_connected += 1;
            let reason = match via {
                Via::Dialled { .. } => format!("handshake accepted (instance {instance})"),
                Via::Accepted { .. } => {
                    format!("peer's session accepted (instance {instance})")
                }
            };
            self.set_status(now, peer, ConnStatus::Connected, reason);
            self.check_quorum();
        }
        true
    }

    /// Our dial `attempt` to `instance` of `peer` lost the pair to the preferred session and is
    /// being closed: the peer may still send on it until that session reaches it (or it took
    /// it as the pair's before ours arrived), so its requests there are still the peer's until
    /// it ends ([`Mesh::proven_by`]). Refusing them would answer a peer's unimport with "no
    /// session", which it takes as delivered, and leave the reference held.
    fn supersede(&mut self, peer: NodeId, attempt: u64, instance: InstanceId) {
        if let Some(link) = self.link_mut(peer) {
            link.superseded = Some((attempt, instance));
        }
    }

    /// The only way a link's carrier changes: keeps the count of sessions, the accepted
    /// connections and the heartbeat tick in step with it.
    pub(super) fn set_carrier(&mut self, peer: NodeId, to: Option<Carrier>) {
        let Some(link) = self.link_mut(peer) else {
            return;
        };
        let from = std::mem::replace(&mut link.carrier, to);
        if to.is_some() {
            link.farewell = None;
        }
        if let Some(c) = from {
            self.sessions -= 1;
            if let Via::Accepted { conn } = c.via {
                self.accepted.remove(&conn);
            }
        }
        if let Some(c) = to {
            self.sessions += 1;
            if let Via::Accepted { conn } = c.via {
                self.accepted.insert(conn, peer);
            }
        }
        if self.sessions == 0 {
            self.tick = None;
        }
    }
}
