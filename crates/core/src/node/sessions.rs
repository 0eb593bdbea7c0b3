//! Who a peer is, proved per session. A pair shares one session ([`Via`]), dialled by either
//! side. On a session the peer dialled ([`Via::Accepted`]), its node ID and instance are
//! established once per inbound connection by an accepted hello that came from the node map's
//! address for that node; every later request on that connection is that peer's. On a session
//! we dialled ([`Via::Dialled`]), our own handshake proved the peer (it answered our hello), and
//! requests on it are the peer's only while that attempt carries the pair with the instance we
//! handshook with (or, after the peer said goodbye on it, until it ends: the leaving peer hands
//! back imports on it). Any identity a request claims must agree. Requests on a connection or session
//! that proves nobody are refused and counted, and so is every refused hello — which changes no
//! link (only our own dial may mark a link mismatched). A restart is believed only from such a
//! hello or our own handshake. References an exporter holds belong to the importer instance its
//! session proved: only that instance's unimport, loss or restart releases them.
//!
//! Proving the peer is not enough to serve its imports: an import takes a reference, and one is
//! served only while the pair's link is CONNECTED here with that instance (`exporter.rs`). A
//! request on a connection whose hello was accepted, ahead of the session that connection opens
//! or by a unary call, may come from a peer whose clean-up after the grace time is under way
//! here; a reference taken for it would be released by that clean-up while the peer maps it
//! (`grace.rs`). It is refused with INVALID_STATE, which the importer's application sees as a
//! failed import it may retry. Unimports, goodbyes and status rows are served on any session
//! that proves the peer: they take nothing.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use super::{Action, ImportRequest, Node, PeerId, RequestId};
use crate::gpu::{ImportError, Status};
use crate::ids::ConnId;
use crate::mesh::{Hello, Verdict, Via};
use crate::state::Mismatch;

/// A peer request that needs the session it arrives on to prove its sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRequest {
    /// An import.
    Import,
    /// An unimport.
    Unimport,
    /// A goodbye.
    Goodbye,
    /// A status row (for `ctl -N`).
    Status,
    /// A session stream opened on a connection ([`Node::handle_session_opened`]).
    Session,
    /// A multicast remote GPU attach.
    McAttach,
    /// A notification that the peer's cliques changed.
    Cliques,
    /// The list of the jobs the peer shares with this node.
    Jobs,
}

impl PeerRequest {
    /// The keys its refusals are counted under: no session, identity mismatch.
    fn refusals(self) -> (&'static str, &'static str) {
        match self {
            Self::Import => ("import: no session", "import: identity mismatch"),
            Self::Unimport => ("unimport: no session", "unimport: identity mismatch"),
            Self::Goodbye => ("goodbye: no session", "goodbye: identity mismatch"),
            Self::Status => ("status: no session", "status: identity mismatch"),
            Self::Session => ("session: no session", "session: identity mismatch"),
            Self::McAttach => (
                "multicast attach: no session",
                "multicast attach: identity mismatch",
            ),
            Self::Cliques => ("cliques: no session", "cliques: identity mismatch"),
            Self::Jobs => ("jobs: no session", "jobs: identity mismatch"),
        }
    }
}

impl std::fmt::Display for PeerRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Import => "import",
            Self::Unimport => "unimport",
            Self::Goodbye => "goodbye",
            Self::Status => "status",
            Self::Session => "session",
            Self::McAttach => "multicast attach",
            Self::Cliques => "cliques",
            Self::Jobs => "jobs",
        })
    }
}

/// Sessions by connection, and what was refused.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    by_conn: HashMap<ConnId, PeerId>,
    refusals: BTreeMap<&'static str, u64>,
}

/// Why a peer message was refused (the key it is counted under).
fn hello_reason(m: Mismatch) -> &'static str {
    match m {
        Mismatch::NodeMap => "hello: node map mismatch",
        Mismatch::Domain => "hello: domain mismatch",
        Mismatch::Version => "hello: protocol version",
        Mismatch::WrongNode => "hello: wrong node",
    }
}

impl Node {
    /// Refusals by reason since start.
    pub fn refusals(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.sessions.refusals.iter().map(|(k, v)| (*k, *v))
    }

    /// The peer proved on `conn`, if any.
    pub fn session_peer(&self, conn: ConnId) -> Option<PeerId> {
        self.sessions.by_conn.get(&conn).copied()
    }

    /// Counts a refusal (also those the daemon decides before a message reaches the node, such
    /// as connection limits) and asks the owner to log it.
    pub fn refused(&mut self, reason: &'static str, detail: String) {
        let count = self.sessions.refusals.entry(reason).or_default();
        *count += 1;
        let count = *count;
        self.actions.push_back(Action::Refused {
            reason,
            count,
            detail,
        });
    }

    /// A hello on inbound connection `conn`. `from_node_address` says whether the connection
    /// comes from the node map's address for the node the hello names (the owner resolves
    /// it). Accepted, the connection is that peer's session.
    pub fn handle_session_hello(
        &mut self,
        now: Instant,
        conn: ConnId,
        from_node_address: bool,
        remote: &Hello,
    ) -> Verdict {
        if !from_node_address {
            self.refused(
                "hello: wrong source address",
                format!(
                    "a hello naming node {} came from an address that is not node {}'s",
                    remote.node, remote.node
                ),
            );
            return Verdict::Refuse {
                mismatch: Mismatch::WrongNode,
                detail: "not from that node's address".into(),
            };
        }
        let verdict = self.handle_hello(now, remote);
        match &verdict {
            Verdict::Accept => {
                self.conn_heard(conn);
                self.sessions.by_conn.insert(
                    conn,
                    PeerId {
                        node: remote.node,
                        instance: remote.instance,
                    },
                );
            }
            Verdict::Refuse { mismatch, detail } => {
                let detail = format!("hello naming node {}: {detail}", remote.node);
                self.refused(hello_reason(*mismatch), detail);
            }
            Verdict::MapNeeded | Verdict::ShuttingDown => {}
        }
        verdict
    }

    /// The peer proved on inbound connection `conn` opened its session stream on it. Returns
    /// whether that session carries the pair ([`Mesh::handle_session_opened`]); `false`: the
    /// owner closes it at once. A connection without an accepted hello is refused and counted.
    ///
    /// [`Mesh::handle_session_opened`]: crate::mesh::Mesh::handle_session_opened
    pub fn handle_session_opened(&mut self, now: Instant, conn: ConnId) -> bool {
        let Some(peer) = self.session_peer(conn) else {
            let (no_session, _) = PeerRequest::Session.refusals();
            self.refused(
                no_session,
                "session opened on a connection without a hello".into(),
            );
            return false;
        };
        let up = self
            .mesh
            .handle_session_opened(now, peer.node, peer.instance, conn);
        self.absorb_mesh(now);
        up
    }

    /// The session stream the peer opened on inbound connection `conn` ended: if it carried
    /// the pair, the link is lost (RECOVERING) and retried.
    pub fn handle_session_closed(&mut self, now: Instant, conn: ConnId) {
        self.mesh
            .handle_session_lost(now, Via::Accepted { conn }, "session stream ended".into());
        self.absorb_mesh(now);
    }

    /// A heartbeat on the session stream of inbound connection `conn`: the pair's sign of life
    /// (see [`Mesh::handle_heartbeat`](crate::mesh::Mesh::handle_heartbeat)) if that session
    /// carries the pair with the instance the mesh knows; ignored otherwise.
    pub fn handle_session_heartbeat(&mut self, now: Instant, conn: ConnId) {
        if let Some(peer) = self.session_peer(conn)
            && self
                .mesh
                .peer(peer.node)
                .is_some_and(|(_, known)| known == Some(peer.instance))
        {
            self.handle_heartbeat(now, Via::Accepted { conn });
        }
    }

    /// Inbound connection `conn` closed: the identity it proved is forgotten, and the session
    /// on it, if it carried the pair, is lost (as [`Node::handle_session_closed`]).
    pub fn handle_conn_closed(&mut self, now: Instant, conn: ConnId) {
        self.conn_gone(conn);
        self.sessions.by_conn.remove(&conn);
        self.mesh
            .handle_session_lost(now, Via::Accepted { conn }, "connection closed".into());
        self.absorb_mesh(now);
    }

    /// The peer of a request on session `via`, or `None` (refused and counted) when `via`
    /// proves nobody (a connection without an accepted hello; a dialled session that no longer
    /// carries its pair, or whose instance the mesh no longer knows) or the request claims
    /// another identity.
    pub fn authenticate(
        &mut self,
        via: Via,
        claimed: Option<PeerId>,
        what: PeerRequest,
    ) -> Option<PeerId> {
        let (no_session, mismatch) = what.refusals();
        let proven = match via {
            Via::Accepted { conn } => self.session_peer(conn),
            Via::Dialled { .. } => self
                .mesh
                .proven_by(via)
                .map(|(node, instance)| PeerId { node, instance }),
        };
        let Some(peer) = proven else {
            let detail = match via {
                Via::Accepted { .. } => format!("{what} on a connection without a hello"),
                Via::Dialled { peer, attempt } => format!(
                    "{what} from node {peer} on our dial {attempt}, which no longer carries the \
                     pair with the instance it handshook with"
                ),
            };
            self.refused(no_session, detail);
            return None;
        };
        if let Some(c) = claimed
            && c != peer
        {
            self.refused(
                mismatch,
                format!(
                    "{what} claiming node {} instance {} on node {} instance {}'s session",
                    c.node, c.instance, peer.node, peer.instance
                ),
            );
            return None;
        }
        Some(peer)
    }

    /// An import request on session `via`.
    pub fn handle_session_import(
        &mut self,
        now: Instant,
        request: RequestId,
        via: Via,
        claimed: Option<PeerId>,
        import: ImportRequest,
    ) {
        match self.authenticate(via, claimed, PeerRequest::Import) {
            Some(peer) => self.handle_peer_import(now, request, peer, import),
            None => self.actions.push_back(Action::AnswerImport {
                request,
                answer: Err(ImportError::new(
                    Status::InvalidState,
                    "refused: no session proves that identity; say hello first",
                )),
            }),
        }
    }

    /// An unimport request on session `via`. Refused, it releases nothing, and the refusal is
    /// not an answer the importer may take as delivered.
    pub fn handle_session_unimport(
        &mut self,
        now: Instant,
        request: RequestId,
        via: Via,
        claimed: Option<PeerId>,
        import_event_id: u64,
    ) {
        match self.authenticate(via, claimed, PeerRequest::Unimport) {
            Some(peer) => self.handle_peer_unimport(now, request, peer, import_event_id),
            None => self.actions.push_back(Action::RefuseUnimport {
                request,
                reason: "no session proves that identity on this connection; send it again on \
                         the pair's session"
                    .to_string(),
            }),
        }
    }

    /// A goodbye on session `via`. Returns whether it was believed.
    pub fn handle_session_goodbye(
        &mut self,
        now: Instant,
        via: Via,
        claimed: Option<PeerId>,
        reason: &str,
    ) -> bool {
        match self.authenticate(via, claimed, PeerRequest::Goodbye) {
            Some(peer) => {
                self.handle_goodbye(now, peer, reason);
                true
            }
            None => false,
        }
    }
}
