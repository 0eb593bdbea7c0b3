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
//! driver) never holds up the heartbeats or the other requests behind it.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use openimex_core::Via;
use openimex_proto::peer::session_msg::Body;
use openimex_proto::peer::{GoodbyeReply, SessionMsg, UnimportReply};
use tokio::sync::{mpsc, oneshot};

use crate::convert;
use crate::mailbox::{Input, ask};

/// Frames queued for sending on one session. Requests wait for room (a task each); heartbeats
/// are dropped when it is full (the peer is not reading; the liveness timeout will tell).
pub(crate) const QUEUE: usize = 1024;

/// How long a retired session waits for what is in flight on it.
pub(crate) const RETIRE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A session's stop: once set, its reader and its outbound stream end, even while clones of
/// its sender live on in tasks still answering.
#[derive(Default)]
struct Stop {
    set: AtomicBool,
    wakers: Mutex<Vec<Waker>>,
}

impl Stop {
    fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        let wakers = self.wakers.lock().map(|mut w| std::mem::take(&mut *w));
        for w in wakers.into_iter().flatten() {
            w.wake();
        }
    }

    fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.set.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        if let Ok(mut w) = self.wakers.lock()
            && !w.iter().any(|k| k.will_wake(cx.waker()))
        {
            w.push(cx.waker().clone());
        }
        // Set between the first look and the registration: seen now.
        if self.set.load(Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// The frames a session sends, as the stream tonic writes: ends at the session's stop.
pub(crate) struct Outbound {
    rx: mpsc::Receiver<SessionMsg>,
    stop: Arc<Stop>,
}

impl tokio_stream::Stream for Outbound {
    type Item = SessionMsg;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SessionMsg>> {
        if self.stop.poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        self.rx.poll_recv(cx)
    }
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
    stop: Arc<Stop>,
    /// The peer's requests being answered here.
    serving: Arc<AtomicUsize>,
    /// A heartbeat or an answer arrived since the engine last looked ([`SessionTx::heard`]).
    heard: Arc<AtomicBool>,
    /// The last heartbeat sent here and the round trip of the last one answered.
    rtt: Arc<Mutex<Rtt>>,
}

/// Heartbeat round trips, measured by the end that sends them (the pair's lower node).
#[derive(Default)]
struct Rtt {
    sent: Option<(u64, tokio::time::Instant)>,
    last: Option<std::time::Duration>,
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
    /// A new session, and the stream of frames it sends (for tonic to write).
    pub(crate) fn new() -> (Self, Outbound) {
        let (out, rx) = mpsc::channel(QUEUE);
        let stop = Arc::new(Stop::default());
        let tx = Self {
            out,
            pending: Arc::new(Mutex::new(Pending::default())),
            stop: Arc::clone(&stop),
            serving: Arc::new(AtomicUsize::new(0)),
            heard: Arc::new(AtomicBool::new(false)),
            rtt: Arc::default(),
        };
        (tx, Outbound { rx, stop })
    }

    /// Ends the session once nothing is in flight on it (our calls answered, the peer's
    /// requests answered), or after [`RETIRE_WAIT`]: a pair that moves to its other session
    /// (core's `mesh::pair`) fails no request it had already sent on this one.
    pub(crate) fn retire(self) {
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + RETIRE_WAIT;
            while self.busy() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            self.shutdown();
        });
    }

    /// Whether the pair was heard from on this session since the last call. The engine asks
    /// every session once per timer of the core node (the heartbeat tick among them) instead of
    /// being sent a message per heartbeat: at 144 nodes that is ~290 fewer wake-ups a second
    /// per daemon, for a sign of life credited at most one tick late.
    pub(crate) fn heard(&self) -> bool {
        self.heard.swap(false, Ordering::AcqRel)
    }

    /// The round trip of the last heartbeat sent on this session and answered, if any (only
    /// the end that sends heartbeats measures them).
    pub(crate) fn heartbeat_rtt(&self) -> Option<std::time::Duration> {
        self.rtt.lock().ok().and_then(|r| r.last)
    }

    /// The answer to heartbeat `seq` arrived.
    fn heartbeat_answered(&self, seq: u64) {
        if let Ok(mut rtt) = self.rtt.lock()
            && let Some((sent, at)) = rtt.sent
            && sent == seq
        {
            rtt.last = Some(at.elapsed());
            rtt.sent = None;
        }
    }

    fn busy(&self) -> bool {
        self.serving.load(Ordering::SeqCst) > 0
            || self
                .pending
                .lock()
                .is_ok_and(|p| !p.closed && !p.calls.is_empty())
    }

    /// Ends the session from this side: its calls fail, its reader and its outbound stream
    /// end (the peer sees the stream end).
    pub(crate) fn shutdown(&self) {
        self.close();
        self.stop.set();
    }

    /// Sends a heartbeat (or its answer) if there is room.
    pub(crate) fn heartbeat(&self, seq: u64, ack: bool) {
        if !ack && let Ok(mut rtt) = self.rtt.lock() {
            rtt.sent = Some((seq, tokio::time::Instant::now()));
        }
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
        if !self.send(frame).await {
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
        let frame = SessionMsg {
            id,
            body: Some(body),
            ..SessionMsg::default()
        };
        self.send(frame).await;
    }

    /// Queues a frame, waiting for room, but not past the session's stop: a full queue that
    /// nobody reads any more must not hold a caller forever. Whether it was queued.
    async fn send(&self, frame: SessionMsg) -> bool {
        tokio::select! {
            sent = self.out.send(frame) => sent.is_ok(),
            () = std::future::poll_fn(|cx| self.stop.poll(cx)) => false,
        }
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
    via: Via,
    engine: mpsc::Sender<Input>,
) -> String
where
    S: Unpin + tokio_stream::Stream<Item = Result<SessionMsg, tonic::Status>>,
{
    use tokio_stream::StreamExt;
    let stop = Arc::clone(&tx.stop);
    let reason = loop {
        let next = tokio::select! {
            next = inbound.next() => next,
            () = std::future::poll_fn(|cx| stop.poll(cx)) => break "closed here".to_string(),
        };
        let msg = match next {
            Some(Ok(msg)) => msg,
            Some(Err(status)) => break status.message().to_string(),
            None => break "peer closed the session".to_string(),
        };
        match msg.body {
            None => {
                // The pair's sign of life, either way; the engine collects it (`heard`).
                tx.heard.store(true, Ordering::Release);
                if msg.heartbeat_ack {
                    tx.heartbeat_answered(msg.heartbeat_seq);
                } else {
                    tx.heartbeat(msg.heartbeat_seq, true);
                }
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
                tx.serving.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let answer = serve(request, via, &engine)
                        .await
                        .unwrap_or_else(Body::Refused);
                    tx.answer(msg.id, answer).await;
                    tx.serving.fetch_sub(1, Ordering::SeqCst);
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
            .map_err(stopping)?;
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
        Body::Status(req) => crate::peer_server::status_row(engine, via, req.reasons)
            .await
            .map(Body::StatusReply)
            .map_err(|s| s.message().to_string()),
        _ => Err("not a request".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openimex_core::NodeId;
    use openimex_proto::peer::ImportReply;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn answers_reach_their_calls_and_the_end_fails_the_rest() {
        let (tx, mut out_rx) = SessionTx::new();
        let (in_tx, in_rx) = mpsc::channel::<Result<SessionMsg, tonic::Status>>(8);
        let (engine, _engine_rx) = mpsc::channel(8);
        let reader = tokio::spawn(run(
            tokio_stream::wrappers::ReceiverStream::new(in_rx),
            tx.clone(),
            Via::Dialled {
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

    #[tokio::test]
    async fn heartbeats_are_answered_and_noted_for_the_engine() {
        let (tx, mut out_rx) = SessionTx::new();
        let (in_tx, in_rx) = mpsc::channel::<Result<SessionMsg, tonic::Status>>(8);
        let (engine, mut engine_rx) = mpsc::channel(8);
        tokio::spawn(run(
            tokio_stream::wrappers::ReceiverStream::new(in_rx),
            tx.clone(),
            Via::Accepted { conn: 9 },
            engine,
        ));
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
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while !tx.heard() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the answer is noted"
            );
            tokio::task::yield_now().await;
        }
        assert!(out_rx.rx.try_recv().is_err(), "an answer is not answered");
        assert!(
            tx.heartbeat_rtt().is_some(),
            "the answer timed its heartbeat"
        );
        assert!(engine_rx.try_recv().is_err(), "no message per heartbeat");
    }

    #[tokio::test]
    async fn shutdown_ends_the_reader_the_outbound_stream_and_waiting_calls() {
        let (tx, mut out) = SessionTx::new();
        let (_in_tx, in_rx) = mpsc::channel::<Result<SessionMsg, tonic::Status>>(8);
        let (engine, _engine_rx) = mpsc::channel(8);
        let reader = tokio::spawn(run(
            tokio_stream::wrappers::ReceiverStream::new(in_rx),
            tx.clone(),
            Via::Accepted { conn: 3 },
            engine,
        ));
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

    #[tokio::test]
    async fn a_call_waiting_for_room_ends_at_the_stop() {
        let (tx, _out) = SessionTx::new();
        // Nobody reads the outbound stream: fill its queue.
        for seq in 0..QUEUE as u64 {
            tx.heartbeat(seq, false);
        }
        let call = tokio::spawn({
            let tx = tx.clone();
            async move { tx.call(Body::Unimport(Default::default())).await }
        });
        tokio::task::yield_now().await;
        tx.shutdown();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), call).await;
        assert_eq!(
            ended.expect("not held forever").expect("join"),
            Err(CallError::Closed)
        );
    }
}
