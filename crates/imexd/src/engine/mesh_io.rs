//! The engine's side of the mesh: what core's mesh actions become (dials, session closes,
//! state changes), which open session carries the pair with a peer, and the heartbeats the
//! sessions heard, handed back to core.

use openimex_core::{Action as MeshAction, ConnStatus, NodeId, Via};

use tracing::{info, warn};

use super::Engine;
use crate::driver_io::Call;
use crate::peer_client;
use crate::session_tx::SessionTx;

impl Engine {
    pub(super) fn perform_mesh(&mut self, action: MeshAction) {
        match action {
            MeshAction::Dial { peer, attempt } => self.dial(peer, attempt),
            MeshAction::SendHeartbeat { via, answer, .. } => {
                if let Some(session) = self.session_by(via) {
                    self.heartbeat_seq += 1;
                    // A full queue means the peer is not reading; the timeout will tell.
                    match answer {
                        true => session.heartbeat(self.heartbeat_seq, false),
                        false => session.heartbeat_unanswered(self.heartbeat_seq),
                    }
                }
            }
            MeshAction::CloseSession { peer, via } => {
                // Retired, not cut: what is in flight on it still gets its answer (the pair
                // may just have moved to its other session), until the node says it has waited
                // long enough (`EndSession`). Its reader reports the end, which the node
                // ignores for a session that no longer carries the pair.
                let session = match via {
                    Via::Dialled { attempt, .. } => {
                        if self.sessions.get(&peer).is_some_and(|(a, _)| *a == attempt) {
                            self.sessions.remove(&peer).map(|(_, link)| link.session)
                        } else {
                            None
                        }
                    }
                    Via::Accepted { conn } => self.accepted.remove(&conn).map(|(s, _)| s),
                };
                if let Some(session) = session {
                    self.retired.insert(via, session.clone());
                    session.retire();
                }
            }
            MeshAction::SendGoodbye { peer, via } => {
                if let Some(session) = self.session_by(via) {
                    self.goodbyes.push((peer, session));
                }
            }
            MeshAction::LinkChanged {
                peer,
                from,
                to,
                reason,
                times_connected,
            } => {
                let hosts = &self.settings.hosts;
                (self.metrics).link_changed(peer, to, times_connected, hosts);
                self.log_link(peer, from, to, &reason, times_connected);
                self.count_connected(from, to);
            }
            MeshAction::PeerRestarted { peer, old, new } => warn!(
                "Node {peer} restarted (instance {old} -> {new}): its previous imports and exports are gone"
            ),
            MeshAction::PeerLeft { peer, instance } => {
                info!("Node {peer} (instance {instance}) left: ending its imports and exports here")
            }
            MeshAction::StateChanged { from, to } => {
                info!("IMEX daemon state {from} -> {to}");
                let _ = self.state_tx.send(to);
            }
            MeshAction::InitDriver => self.driver.call(Call::OpenSession {
                node: self.settings.local,
            }),
        }
    }

    /// The node's wait for a retired session is over: end it if it is still open.
    pub(super) fn end_session(&mut self, via: Via) {
        if let Some(session) = self.retired.remove(&via) {
            session.shutdown();
        }
    }

    /// Hands the node every session's sign of life since the last timer (see
    /// [`SessionTx::heard`]), so its liveness check sees them.
    pub(super) fn collect_heartbeats(&mut self, now: std::time::Instant) {
        for (peer, (attempt, link)) in &self.sessions {
            if link.session.heard() {
                let via = Via::Dialled {
                    peer: *peer,
                    attempt: *attempt,
                };
                self.node.handle_heartbeat(now, via);
            }
        }
        for (conn, (session, _)) in &self.accepted {
            if session.heard() {
                self.node.handle_session_heartbeat(now, *conn);
            }
        }
    }

    /// The session that carries the pair with `peer` now, if any (core's `mesh::pair`).
    pub(super) fn session(&self, peer: NodeId) -> Option<SessionTx> {
        self.node
            .session_of(peer)
            .and_then(|via| self.session_by(via))
    }

    /// The session `via` names, if it is still open here.
    pub(super) fn session_by(&self, via: Via) -> Option<SessionTx> {
        match via {
            Via::Dialled { peer, attempt } => self
                .sessions
                .get(&peer)
                .filter(|(a, _)| *a == attempt)
                .map(|(_, l)| l.session.clone()),
            Via::Accepted { conn } => self.accepted.get(&conn).map(|(s, _)| s.clone()),
        }
    }

    /// The peer's address on the session that carries the pair with `peer`: the address we
    /// dialled, or the one its dial came from.
    pub(super) fn carrier_remote(&self, peer: NodeId) -> Option<std::net::IpAddr> {
        let remote = match self.node.session_of(peer)? {
            Via::Dialled { attempt, .. } => self
                .sessions
                .get(&peer)
                .filter(|(a, _)| *a == attempt)
                .map(|(_, l)| l.remote)?,
            Via::Accepted { conn } => self.accepted.get(&conn).map(|(_, r)| *r)?,
        };
        Some(remote.ip().to_canonical())
    }

    pub(super) fn dial(&mut self, peer: NodeId, attempt: u64) {
        let Some(host) = self.settings.hosts.get(peer.index()).cloned() else {
            return;
        };
        let target = peer_client::Target {
            peer,
            attempt,
            local: self.local_ip,
            scope: self.settings.link_scope,
            host,
            port: self.settings.server_port,
            timeout: self.settings.dial_timeout(),
            keepalive: crate::transport_keepalive(self.settings.peer_timeout),
            tls: self.settings.tls.as_ref().map(|t| t.sides()),
            stats: self.stats.clone(),
            net: self.net.clone(),
        };
        let me = self.cached_identity();
        tokio::spawn(peer_client::dial(target, me, self.tx.clone()));
    }

    pub(super) fn host(&self, peer: NodeId) -> &str {
        self.settings
            .hosts
            .get(peer.index())
            .map_or("?", String::as_str)
    }

    /// Keeps the count of connected peers for the service manager.
    fn count_connected(&mut self, from: ConnStatus, to: ConnStatus) {
        let up = |s| s == ConnStatus::Connected;
        match (up(from), up(to)) {
            (false, true) => self.connected += 1,
            (true, false) => self.connected = self.connected.saturating_sub(1),
            _ => return,
        }
        if let Some(tx) = &self.peers_tx {
            let total = self.node.mesh().config().map.len().saturating_sub(1);
            let peers = crate::notify::Peers {
                connected: self.connected.min(total),
                total,
            };
            let _ = tx.send(peers);
        }
    }
}
