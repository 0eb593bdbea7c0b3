//! The session stream of a pair, as either end sees it: one gRPC bidirectional stream that
//! carries the pair's heartbeats and, both ways, every request between the two daemons with its
//! answer (`SessionMsg` in peer.proto). The dialling end holds the client half, the accepting
//! end the server half; both run the same [`run`] loop over their half and send through a
//! [`SessionTx`]. A pair has one session (core's `mesh::pair`), so either end may send requests
//! on it, and either end may close it ([`SessionTx::shutdown`]: when the pair keeps its other
//! session).
//!
//! Why on the stream rather than one unary RPC per request: the stream is already open and its
//! hello already proved who is on the other end, so a request is one frame each way; a unary
//! RPC costs a new HTTP/2 stream, headers and a fresh client per request, and had to name (and
//! have checked) the sender again.
//!
//! A request is answered by a task of its own, so a slow answer (an import waiting for the
//! driver) never holds up the heartbeats or the other requests behind it; at most
//! `session_tx::MAX_SERVING` at once per session.

use openimex_core::Via;
use openimex_core::node::PeerRequest;
use openimex_proto::peer::session_msg::Body;
use openimex_proto::peer::{GoodbyeReply, NodeStatus, SessionMsg, UnimportReply};
use tokio::sync::mpsc;
use tonic::Status;

use crate::convert;
use crate::mailbox::{Input, ask};
use crate::session_tx::SessionTx;

/// Reads `inbound` until it ends: answers heartbeats, reports signs of life to the engine,
/// hands answers to the calls waiting for them and answers the peer's requests. Returns why
/// the session ended; every call still waiting has failed by then.
pub(crate) async fn run<S>(
    mut inbound: S,
    tx: SessionTx,
    via: Via,
    engine: mpsc::Sender<Input>,
) -> String
where
    S: Unpin + tokio_stream::Stream<Item = Result<SessionMsg, tonic::Status>>,
{
    use tokio_stream::StreamExt;
    let reason = loop {
        let next = tokio::select! {
            next = inbound.next() => next,
            () = tx.stopped() => break "closed here".to_string(),
        };
        let msg = match next {
            Some(Ok(msg)) => msg,
            Some(Err(status)) => break status.message().to_string(),
            None => break "peer closed the session".to_string(),
        };
        tx.stats().arrived(&msg);
        match msg.body {
            None => tx.received_heartbeat(
                msg.heartbeat_seq,
                msg.heartbeat_ack,
                msg.heartbeat_no_answer,
            ),
            // The peer's words end up in logs and import errors: made safe here.
            Some(Body::Refused(why)) => tx.resolve(msg.id, Body::Refused(convert::bounded(&why))),
            Some(
                body @ (Body::ImportReply(_)
                | Body::UnimportReply(_)
                | Body::StatusReply(_)
                | Body::GoodbyeReply(_)
                | Body::RemoteGpuAttachReply(_)
                | Body::HelloReply(_)),
            ) => tx.resolve(msg.id, body),
            // A notification: nothing answers it.
            Some(Body::CliquesChanged(c)) => {
                let input = Input::PeerCliques { via, cliques: c };
                if engine.send(input).await.is_err() {
                    break "the daemon is stopping".to_string();
                }
            }
            Some(Body::JobsHeld(jobs)) => {
                if engine.send(Input::PeerJobs { via, jobs }).await.is_err() {
                    break "the daemon is stopping".to_string();
                }
            }
            Some(request) => {
                // Bounded: past MAX_SERVING, what the peer sends next waits in the transport.
                tokio::select! {
                    () = tx.room_to_serve() => {}
                    () = tx.stopped() => break "closed here".to_string(),
                }
                let engine = engine.clone();
                let ticket = tx
                    .stats()
                    .request_arrived(crate::stats::Kind::of_body(&request));
                tx.answer_later(msg.id, move || {
                    ticket.served(async move {
                        serve(request, via, &engine)
                            .await
                            .unwrap_or_else(Body::Refused)
                    })
                });
            }
        }
    };
    // Both directions end together: a peer that stopped sending is not sent to either.
    tx.shutdown();
    reason
}

/// Answers one request of the peer through the engine.
async fn serve(request: Body, via: Via, engine: &mpsc::Sender<Input>) -> Result<Body, String> {
    let stopping = |_| "daemon is stopping".to_string();
    match request {
        Body::Import(req) => {
            let request = convert::import_request(&req)?;
            let answer = ask(engine, |reply| Input::PeerImport {
                via,
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
                via,
                claimed: None,
                import_event_id: req.import_event_id,
                reply,
            })
            .await
            .map_err(stopping)??;
            Ok(Body::UnimportReply(UnimportReply { released }))
        }
        Body::Goodbye(req) => {
            let believed = ask(engine, |reply| Input::Goodbye {
                via,
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
        Body::RemoteGpuAttach(req) => crate::multicast::serve(&req, via, engine).await,
        Body::Status(req) => status_row(engine, via, req.reasons, req.fabric)
            .await
            .map(|row| Body::StatusReply(Box::new(row)))
            .map_err(|s| s.message().to_string()),
        Body::Hello(_) => Err("a hello only opens a session".to_string()),
        _ => Err("not a request".to_string()),
    }
}

/// This node's status row for the peer on `via`, if a session proves it (asked on the session,
/// or by the unary `Status` RPC of older callers).
pub(crate) async fn status_row(
    engine: &mpsc::Sender<Input>,
    via: Via,
    reasons: bool,
    fabric: bool,
) -> Result<NodeStatus, Status> {
    let ok = ask(engine, |reply| Input::Authenticate {
        via,
        what: PeerRequest::Status,
        reply,
    })
    .await?;
    if !ok {
        return Err(Status::permission_denied(
            "no session on this connection; say hello first",
        ));
    }
    let snap = ask(engine, |reply| Input::Snapshot { reply }).await?;
    Ok(convert::node_status(
        &snap,
        &snap.host_name,
        reasons,
        fabric,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session_tx::CallError;
    use openimex_core::NodeId;
    use openimex_proto::peer::ImportReply;
    use tokio_stream::StreamExt;

    /// What [`reader`] returns.
    type Reader = (
        SessionTx,
        crate::session_tx::Outbound,
        mpsc::Sender<Result<SessionMsg, tonic::Status>>,
        mpsc::Receiver<Input>,
        tokio::task::JoinHandle<String>,
    );

    /// A session reader over `via` with channels `depth` deep: the session's sender, its
    /// outbound frames, the peer's side of the inbound stream, the engine's mailbox and the
    /// reader's task.
    fn reader(via: Via, depth: usize) -> Reader {
        let (tx, out) = SessionTx::new(&crate::stats::Stats::default());
        let (in_tx, in_rx) = mpsc::channel::<Result<SessionMsg, tonic::Status>>(depth);
        let (engine, engine_rx) = mpsc::channel(depth);
        let task = tokio::spawn(run(
            tokio_stream::wrappers::ReceiverStream::new(in_rx),
            tx.clone(),
            via,
            engine,
        ));
        (tx, out, in_tx, engine_rx, task)
    }

    #[tokio::test]
    async fn answers_reach_their_calls_and_the_end_fails_the_rest() {
        let via = Via::Dialled {
            peer: NodeId(1),
            attempt: 1,
        };
        let (tx, mut out_rx, in_tx, _engine_rx, reader) = reader(via, 8);
        let a = tokio::spawn({
            let tx = tx.clone();
            async move { tx.call(Body::Unimport(Default::default())).await }
        });
        let b = tokio::spawn({
            let tx = tx.clone();
            async move { tx.call(Body::Import(Default::default())).await }
        });
        let first = out_rx.next().await.expect("a request frame");
        let second = out_rx.next().await.expect("a request frame");
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

    /// Waits until the session's reader has noted a sign of life (taking it), failing with
    /// `what` after 5 s.
    async fn heard_within_5s(tx: &SessionTx, what: &str) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while !tx.heard() {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn heartbeats_are_answered_and_noted_for_the_engine() {
        let (tx, mut out_rx, in_tx, mut engine_rx, _reader) = reader(Via::Accepted { conn: 9 }, 8);
        assert!(!tx.heard(), "nothing heard yet");
        in_tx
            .send(Ok(SessionMsg {
                heartbeat_seq: 41,
                ..SessionMsg::default()
            }))
            .await
            .expect("send");
        let ack = out_rx.next().await.expect("an answer");
        assert_eq!((ack.heartbeat_seq, ack.heartbeat_ack), (41, true));
        assert!(tx.heard(), "a heartbeat is a sign of life");
        assert!(!tx.heard(), "taken once");
        assert_eq!(
            tx.heartbeat_rtt(),
            None,
            "only heartbeats sent here are timed"
        );
        tx.heartbeat(42, false);
        let sent = out_rx.next().await.expect("our heartbeat");
        assert_eq!((sent.heartbeat_seq, sent.heartbeat_ack), (42, false));
        // An answer is a sign of life too, and is not answered again.
        in_tx
            .send(Ok(SessionMsg {
                heartbeat_seq: 42,
                heartbeat_ack: true,
                ..SessionMsg::default()
            }))
            .await
            .expect("send");
        heard_within_5s(&tx, "the answer is noted").await;
        assert!(out_rx.try_next().is_none(), "an answer is not answered");
        assert!(
            tx.heartbeat_rtt().is_some(),
            "the answer timed its heartbeat"
        );
        assert!(engine_rx.try_recv().is_err(), "no message per heartbeat");

        // A heartbeat that asks for no answer is a sign of life, and gets none.
        in_tx
            .send(Ok(SessionMsg {
                heartbeat_seq: 43,
                heartbeat_no_answer: true,
                ..SessionMsg::default()
            }))
            .await
            .expect("send");
        heard_within_5s(&tx, "the heartbeat is noted").await;
        assert!(out_rx.try_next().is_none(), "no answer asked, none sent");
        // And ours asks for none, untimed.
        tx.heartbeat_unanswered(44);
        let sent = out_rx.next().await.expect("our heartbeat");
        assert_eq!(
            (
                sent.heartbeat_seq,
                sent.heartbeat_ack,
                sent.heartbeat_no_answer
            ),
            (44, false, true)
        );
    }

    /// A burst of requests is answered at most `MAX_SERVING` at a time: the next one reaches
    /// the engine only when an answer is done.
    #[tokio::test(flavor = "current_thread")]
    async fn requests_in_flight_are_bounded_per_session() {
        use crate::session_tx::MAX_SERVING;
        let (tx, _out, in_tx, mut engine_rx, _reader) =
            reader(Via::Accepted { conn: 4 }, MAX_SERVING + 8);
        for id in 1..=MAX_SERVING as u64 + 2 {
            let frame = SessionMsg {
                id,
                body: Some(Body::Unimport(Default::default())),
                ..SessionMsg::default()
            };
            in_tx.send(Ok(frame)).await.expect("send");
        }
        let mut replies = Vec::new();
        while replies.len() < MAX_SERVING {
            match engine_rx.recv().await {
                Some(Input::PeerUnimport { reply, .. }) => replies.push(reply),
                Some(_) => {}
                None => panic!("the engine mailbox closed"),
            }
        }
        // Everything runnable runs on this one thread: the reader is held, not just slow.
        for _ in 0..1000 {
            tokio::task::yield_now().await;
        }
        assert!(engine_rx.try_recv().is_err(), "no request past the bound");
        let _ = replies.pop().expect("a reply").send(Ok(true));
        match engine_rx.recv().await {
            Some(Input::PeerUnimport { .. }) => {}
            _ => panic!("the next request reaches the engine once one is answered"),
        }
        tx.shutdown();
    }

    /// An unimport the exporter's core refuses (no session proves the sender on this
    /// connection) goes back as a refusal, which the importer does not take as delivered
    /// (`peer_client::unimport`), and one it answers goes back as a reply.
    #[tokio::test]
    async fn a_refused_unimport_is_answered_as_a_refusal_not_as_a_reply() {
        let (tx, mut out_rx, in_tx, mut engine_rx, _reader) = reader(Via::Accepted { conn: 5 }, 8);
        for (id, answer) in [(7, Err("no session".to_string())), (8, Ok(false))] {
            let frame = SessionMsg {
                id,
                body: Some(Body::Unimport(Default::default())),
                ..SessionMsg::default()
            };
            in_tx.send(Ok(frame)).await.expect("send");
            match engine_rx.recv().await {
                Some(Input::PeerUnimport { reply, .. }) => {
                    let _ = reply.send(answer);
                }
                _ => panic!("the unimport reaches the engine"),
            }
            let sent = out_rx.next().await.expect("an answer");
            assert_eq!(sent.id, id);
            match (id, sent.body) {
                (7, Some(Body::Refused(why))) => assert!(why.contains("no session"), "{why}"),
                (8, Some(Body::UnimportReply(r))) => assert!(!r.released),
                (_, body) => panic!("unimport {id} answered with {body:?}"),
            }
        }
        tx.shutdown();
    }

    #[tokio::test]
    async fn shutdown_ends_the_reader_the_outbound_stream_and_waiting_calls() {
        let (tx, mut out, _in_tx, _engine_rx, reader) = reader(Via::Accepted { conn: 3 }, 8);
        let call = tokio::spawn({
            let tx = tx.clone();
            async move { tx.call(Body::Unimport(Default::default())).await }
        });
        assert!(out.next().await.is_some(), "the request went out");
        // Clones still live in the reader and in the call: shutdown ends them anyway.
        tx.shutdown();
        assert_eq!(reader.await.expect("join"), "closed here");
        assert_eq!(call.await.expect("join"), Err(CallError::Closed));
        assert!(out.next().await.is_none(), "the outbound stream ends");
    }
}
