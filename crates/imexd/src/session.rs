//! The session stream of a pair, as either end sees it: one gRPC bidirectional stream that
//! carries the pair's heartbeats and, both ways, every request between the two daemons with its
//! answer (`SessionMsg` in peer.proto). The dialling end holds the client half, the accepting
//! end the server half; both run the same [`run`] loop over their half and send through a
//! [`SessionTx`].
//!
//! Why on the stream rather than one unary RPC per request: the stream is already open and its
//! hello already proved who is on the other end, so a request is one frame each way; a unary
//! RPC costs a new HTTP/2 stream, headers and a fresh client per request, and had to name (and
//! have checked) the sender again.
//!
//! A request is answered by a task of its own, so a slow answer (an import waiting for the
//! driver) never holds up the heartbeats or the other requests behind it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use openimex_core::{ConnId, NodeId};
use openimex_proto::peer::session_msg::Body;
use openimex_proto::peer::{GoodbyeReply, SessionMsg, UnimportReply};
use tokio::sync::{mpsc, oneshot};

use crate::convert;
use crate::mailbox::{Input, ask};

/// Frames queued for sending on one session. Requests wait for room (a task each); heartbeats
/// are dropped when it is full (the peer is not reading; the liveness timeout will tell).
pub(crate) const QUEUE: usize = 1024;

/// Which end of the session this is, which says how its heartbeats are reported and how the
/// sender of a request is proved.
#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    /// We dialled `peer` (its hello answer proved it); `attempt` names the session to the node.
    Dialled { peer: NodeId, attempt: u64 },
    /// The peer dialled us on inbound connection `conn` (its hello there proved it).
    Accepted { conn: ConnId },
}

/// Requests sent and not answered yet, by id.
#[derive(Default)]
struct Pending {
    next: u64,
    calls: HashMap<u64, oneshot::Sender<Body>>,
    /// The session ended: new calls fail at once.
    closed: bool,
}

/// The sending side of a session: clone it freely.
#[derive(Clone)]
pub(crate) struct SessionTx {
    out: mpsc::Sender<SessionMsg>,
    pending: Arc<Mutex<Pending>>,
}

/// Why a request on a session got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The session ended before the answer.
    Closed,
    /// The peer refused the request, saying why.
    Refused(String),
    /// The answer was not the reply the request needs.
    Unexpected,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Closed => f.write_str("the session ended before the answer"),
            Self::Refused(why) => write!(f, "refused: {why}"),
            Self::Unexpected => f.write_str("the peer answered with the wrong kind of reply"),
        }
    }
}

impl SessionTx {
    /// A session sending through `out`.
    pub(crate) fn new(out: mpsc::Sender<SessionMsg>) -> Self {
        Self {
            out,
            pending: Arc::new(Mutex::new(Pending::default())),
        }
    }

    /// Sends a heartbeat (or its answer) if there is room.
    pub(crate) fn heartbeat(&self, seq: u64, ack: bool) {
        let _ = self.out.try_send(SessionMsg {
            heartbeat_seq: seq,
            heartbeat_ack: ack,
            ..SessionMsg::default()
        });
    }

    /// Sends a request and waits for its answer. No timer here: callers that need one (the
    /// core node fails imports on its own timeout) bound the wait themselves.
    pub(crate) async fn call(&self, body: Body) -> Result<Body, CallError> {
        let (tx, rx) = oneshot::channel();
        let id = {
            let Ok(mut p) = self.pending.lock() else {
                return Err(CallError::Closed);
            };
            if p.closed {
                return Err(CallError::Closed);
            }
            p.next += 1;
            let id = p.next;
            p.calls.insert(id, tx);
            id
        };
        let frame = SessionMsg {
            id,
            body: Some(body),
            ..SessionMsg::default()
        };
        if self.out.send(frame).await.is_err() {
            self.forget(id);
            return Err(CallError::Closed);
        }
        match rx.await {
            Ok(Body::Refused(why)) => Err(CallError::Refused(convert::bounded(&why))),
            Ok(body) => Ok(body),
            Err(_) => Err(CallError::Closed),
        }
    }

    /// Sends the answer to the peer's request `id`.
    async fn answer(&self, id: u64, body: Body) {
        let _ = self
            .out
            .send(SessionMsg {
                id,
                body: Some(body),
                ..SessionMsg::default()
            })
            .await;
    }

    fn forget(&self, id: u64) {
        if let Ok(mut p) = self.pending.lock() {
            p.calls.remove(&id);
        }
    }

    /// Hands an answer to the call waiting for it; an answer nobody waits for is dropped.
    fn resolve(&self, id: u64, body: Body) {
        let waiter = self
            .pending
            .lock()
            .ok()
            .and_then(|mut p| p.calls.remove(&id));
        if let Some(w) = waiter {
            let _ = w.send(body);
        }
    }

    /// The session ended: every waiting call fails, and so does every later one.
    fn close(&self) {
        if let Ok(mut p) = self.pending.lock() {
            p.closed = true;
            p.calls.clear();
        }
    }
}

/// Reads `inbound` until it ends: answers heartbeats, reports signs of life to the engine,
/// hands answers to the calls waiting for them and answers the peer's requests. Returns why
/// the session ended; every call still waiting has failed by then.
pub(crate) async fn run<S>(
    mut inbound: S,
    tx: SessionTx,
    end: End,
    engine: mpsc::Sender<Input>,
) -> String
where
    S: Unpin + tokio_stream::Stream<Item = Result<SessionMsg, tonic::Status>>,
{
    use tokio_stream::StreamExt;
    let reason = loop {
        let msg = match inbound.next().await {
            Some(Ok(msg)) => msg,
            Some(Err(status)) => break status.message().to_string(),
            None => break "peer closed the session".to_string(),
        };
        match msg.body {
            None => {
                if !msg.heartbeat_ack {
                    tx.heartbeat(msg.heartbeat_seq, true);
                }
                // The pair's sign of life, either way. A full mailbox drops it: the next will do.
                let _ = engine.try_send(match end {
                    End::Dialled { peer, attempt } => Input::Heartbeat { peer, attempt },
                    End::Accepted { conn } => Input::PeerHeartbeat { conn },
                });
            }
            Some(
                body @ (Body::ImportReply(_)
                | Body::UnimportReply(_)
                | Body::StatusReply(_)
                | Body::GoodbyeReply(_)
                | Body::Refused(_)),
            ) => tx.resolve(msg.id, body),
            Some(request) => {
                let (tx, engine) = (tx.clone(), engine.clone());
                tokio::spawn(async move {
                    let answer = serve(request, end, &engine)
                        .await
                        .unwrap_or_else(Body::Refused);
                    tx.answer(msg.id, answer).await;
                });
            }
        }
    };
    tx.close();
    reason
}

/// Answers one request of the peer through the engine.
async fn serve(request: Body, end: End, engine: &mpsc::Sender<Input>) -> Result<Body, String> {
    let stopping = |_| "daemon is stopping".to_string();
    let End::Accepted { conn } = end else {
        // Requests travel on the requester's own (dialled) session.
        return Err("requests go on the session the requester dialled".to_string());
    };
    match request {
        Body::Import(req) => {
            let request = convert::import_request(&req)?;
            let answer = ask(engine, |reply| Input::PeerImport {
                conn,
                claimed: None,
                request,
                reply,
            })
            .await
            .map_err(stopping)?;
            Ok(Body::ImportReply(convert::reply(answer)))
        }
        Body::Unimport(req) => {
            let released = ask(engine, |reply| Input::PeerUnimport {
                conn,
                claimed: None,
                import_event_id: req.import_event_id,
                reply,
            })
            .await
            .map_err(stopping)?;
            Ok(Body::UnimportReply(UnimportReply { released }))
        }
        Body::Goodbye(req) => {
            let believed = ask(engine, |reply| Input::Goodbye {
                conn,
                claimed: None,
                reason: req.reason,
                reply,
            })
            .await
            .map_err(stopping)?;
            if believed {
                Ok(Body::GoodbyeReply(GoodbyeReply {}))
            } else {
                Err("no session proves that identity on this connection".to_string())
            }
        }
        Body::Status(req) => crate::peer_server::status_row(engine, conn, req.reasons)
            .await
            .map(Body::StatusReply)
            .map_err(|s| s.message().to_string()),
        _ => Err("not a request".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openimex_proto::peer::ImportReply;

    #[tokio::test]
    async fn answers_reach_their_calls_and_the_end_fails_the_rest() {
        let (out_tx, mut out_rx) = mpsc::channel(8);
        let tx = SessionTx::new(out_tx);
        let (in_tx, in_rx) = mpsc::channel::<Result<SessionMsg, tonic::Status>>(8);
        let (engine, _engine_rx) = mpsc::channel(8);
        let reader = tokio::spawn(run(
            tokio_stream::wrappers::ReceiverStream::new(in_rx),
            tx.clone(),
            End::Dialled {
                peer: NodeId(1),
                attempt: 1,
            },
            engine,
        ));
        let a = tokio::spawn({
            let tx = tx.clone();
            async move { tx.call(Body::Unimport(Default::default())).await }
        });
        let b = tokio::spawn({
            let tx = tx.clone();
            async move { tx.call(Body::Import(Default::default())).await }
        });
        let first = out_rx.recv().await.expect("a request frame");
        let second = out_rx.recv().await.expect("a request frame");
        assert_ne!(first.id, second.id, "each request has its own id");
        // Answer only the import; the unimport is cut off by the session's end.
        let import_id = if matches!(first.body, Some(Body::Import(_))) {
            first.id
        } else {
            second.id
        };
        let reply = ImportReply {
            size: 7,
            ..ImportReply::default()
        };
        in_tx
            .send(Ok(SessionMsg {
                id: import_id,
                body: Some(Body::ImportReply(reply.clone())),
                ..SessionMsg::default()
            }))
            .await
            .expect("send");
        assert_eq!(
            b.await.expect("join"),
            Ok(Body::ImportReply(reply)),
            "the answer with the request's id"
        );
        drop(in_tx);
        assert_eq!(reader.await.expect("join"), "peer closed the session");
        assert_eq!(a.await.expect("join"), Err(CallError::Closed));
        assert_eq!(
            tx.call(Body::Unimport(Default::default())).await,
            Err(CallError::Closed),
            "no call after the end"
        );
    }

    #[tokio::test]
    async fn heartbeats_are_answered_and_reported() {
        let (out_tx, mut out_rx) = mpsc::channel(8);
        let tx = SessionTx::new(out_tx);
        let (in_tx, in_rx) = mpsc::channel::<Result<SessionMsg, tonic::Status>>(8);
        let (engine, mut engine_rx) = mpsc::channel(8);
        tokio::spawn(run(
            tokio_stream::wrappers::ReceiverStream::new(in_rx),
            tx,
            End::Accepted { conn: 9 },
            engine,
        ));
        in_tx
            .send(Ok(SessionMsg {
                heartbeat_seq: 41,
                ..SessionMsg::default()
            }))
            .await
            .expect("send");
        let ack = out_rx.recv().await.expect("an answer");
        assert_eq!((ack.heartbeat_seq, ack.heartbeat_ack), (41, true));
        assert!(matches!(
            engine_rx.recv().await,
            Some(Input::PeerHeartbeat { conn: 9 })
        ));
        // An answer is a sign of life too, and is not answered again.
        in_tx
            .send(Ok(SessionMsg {
                heartbeat_seq: 42,
                heartbeat_ack: true,
                ..SessionMsg::default()
            }))
            .await
            .expect("send");
        assert!(matches!(
            engine_rx.recv().await,
            Some(Input::PeerHeartbeat { conn: 9 })
        ));
        assert!(out_rx.try_recv().is_err(), "an answer is not answered");
    }

    #[tokio::test]
    async fn a_request_on_a_dialled_session_is_refused() {
        let (out_tx, mut out_rx) = mpsc::channel(8);
        let tx = SessionTx::new(out_tx);
        let (in_tx, in_rx) = mpsc::channel::<Result<SessionMsg, tonic::Status>>(8);
        let (engine, _engine_rx) = mpsc::channel(8);
        tokio::spawn(run(
            tokio_stream::wrappers::ReceiverStream::new(in_rx),
            tx,
            End::Dialled {
                peer: NodeId(2),
                attempt: 3,
            },
            engine,
        ));
        in_tx
            .send(Ok(SessionMsg {
                id: 5,
                body: Some(Body::Unimport(Default::default())),
                ..SessionMsg::default()
            }))
            .await
            .expect("send");
        let answer = out_rx.recv().await.expect("an answer");
        assert_eq!(answer.id, 5);
        assert!(matches!(answer.body, Some(Body::Refused(_))));
    }
}
