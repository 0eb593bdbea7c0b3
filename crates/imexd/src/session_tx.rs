//! The sending side of a pair's session (see `session`): [`SessionTx`] queues heartbeats,
//! requests and answers, matches answers to the calls waiting for them, and stops the session
//! from this side; [`Outbound`] is the stream of frames tonic writes. A leaf: it knows nothing of
//! the engine, so the engine's mailbox can hold sessions without importing the reader loop.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use openimex_proto::peer::SessionMsg;
use openimex_proto::peer::session_msg::Body;
use tokio::sync::{mpsc, oneshot};

/// Frames queued for sending on one session. Requests wait for room (a task each); heartbeats
/// are dropped when it is full (the peer is not reading; the liveness timeout will tell).
pub(crate) const QUEUE: usize = 1024;

/// The peer's requests answered at once on one session, at most: past it the reader waits for
/// one to finish before reading on ([`SessionTx::room_to_serve`]), so a burst waits in the
/// transport (the peer's flow control) instead of as a task each here (10,000 at an exporter
/// held ~15 MiB). The importer's bound on imports in flight per exporter is the same number
/// (core's `node/outbox.rs`), so an importer's burst waits in its core, not here.
pub(crate) const MAX_SERVING: usize = openimex_core::node::MAX_IMPORTS_IN_FLIGHT;

/// A session frame carrying `body` under request `id` (0: the handshake or a notification).
pub(crate) fn frame(id: u64, body: Body) -> SessionMsg {
    SessionMsg {
        id,
        body: Some(body),
        ..SessionMsg::default()
    }
}

/// A session's stop: once set, its reader and its outbound stream end, even while clones of
/// its sender live on in tasks still answering.
///
/// Tasks wait on a [`tokio::sync::Notify`], whose waiters leave it when their wait is dropped;
/// the outbound stream (one poller) keeps one waker slot. A list of wakers kept here until the
/// stop grew by one per request answered on the session (each answer's task polls the stop
/// while it sends), which at an exporter holding 10,000 imports was ~11 MiB of finished tasks.
#[derive(Default)]
struct Stop {
    set: AtomicBool,
    tasks: tokio::sync::Notify,
    stream: Mutex<Option<Waker>>,
}

impl Stop {
    fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.tasks.notify_waiters();
        if let Some(w) = self.stream.lock().ok().and_then(|mut w| w.take()) {
            w.wake();
        }
    }

    fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// For the outbound stream: its waker replaces the one before.
    fn poll_stream(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_set() {
            return Poll::Ready(());
        }
        if let Ok(mut w) = self.stream.lock() {
            match &mut *w {
                Some(k) if k.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
        }
        // Set between the first look and the registration: seen now.
        if self.is_set() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Resolves once the stop is set; dropping it leaves nothing behind.
    async fn wait(&self) {
        loop {
            // Registered before the look, so a stop between the two is not missed.
            let told = self.tasks.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if self.is_set() {
                return;
            }
            told.await;
        }
    }

    /// Wakers kept for the stream (tests check nothing accumulates).
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.stream
            .lock()
            .map(|w| usize::from(w.is_some()))
            .unwrap_or(0)
    }
}

/// The frames a session sends, as the stream tonic writes: ends at the session's stop.
pub(crate) struct Outbound {
    rx: mpsc::Receiver<SessionMsg>,
    stop: Arc<Stop>,
}

impl Outbound {
    /// The next frame queued, if one is (tests look without waiting).
    #[cfg(test)]
    pub(crate) fn try_next(&mut self) -> Option<SessionMsg> {
        self.rx.try_recv().ok()
    }
}

impl tokio_stream::Stream for Outbound {
    type Item = SessionMsg;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SessionMsg>> {
        if self.stop.poll_stream(cx).is_ready() {
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
    /// Frames unboxed, so queuing one allocates nothing: a queue's first block holds 32 of them
    /// (4.3 KiB, a frame being 136 bytes: its rare, large parts are boxed, `proto/build.rs`).
    out: mpsc::Sender<SessionMsg>,
    pending: Arc<Mutex<Pending>>,
    stop: Arc<Stop>,
    /// The peer's requests being answered here.
    serving: Arc<AtomicUsize>,
    /// A heartbeat or an answer arrived since the engine last looked ([`SessionTx::heard`]).
    heard: Arc<AtomicBool>,
    /// Told when something in flight ends ([`SessionTx::retire`] waits on it).
    idle: Arc<tokio::sync::Notify>,
    /// Retired ([`SessionTx::retire`]): its heartbeats are no longer answered.
    retired: Arc<AtomicBool>,
    /// The last heartbeat sent here and the round trip of the last one answered.
    rtt: Arc<Mutex<Rtt>>,
    /// The daemon's stats file counts, which every frame sent here and read on it adds to.
    stats: crate::stats::Stats,
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
    /// A new session counting into `stats`, and the stream of frames it sends (for tonic to
    /// write).
    pub(crate) fn new(stats: &crate::stats::Stats) -> (Self, Outbound) {
        let (out, rx) = mpsc::channel(QUEUE);
        let stop = Arc::new(Stop::default());
        let tx = Self {
            out,
            pending: Arc::new(Mutex::new(Pending::default())),
            stop: Arc::clone(&stop),
            serving: Arc::new(AtomicUsize::new(0)),
            heard: Arc::new(AtomicBool::new(false)),
            idle: Arc::default(),
            retired: Arc::default(),
            rtt: Arc::default(),
            stats: stats.clone(),
        };
        (tx, Outbound { rx, stop })
    }

    /// Queues the session's first frame: the hello, or the answer to the peer's. Called on a
    /// new session before it is handed to anyone, so nothing can be queued ahead of it and the
    /// queue has room.
    pub(crate) fn open_with(&self, body: Body) {
        let queued = self.out.try_send(frame(0, body)).is_ok();
        debug_assert!(queued, "the first frame of a new session");
    }

    /// Ends the session once nothing is in flight on it (our calls answered, the peer's
    /// requests answered): a pair that moves to its other session (core's `mesh::pair`) fails
    /// no request it had already sent on this one. How long it may wait is core's decision
    /// (`RETIRE_WAIT`, `node/deadlines.rs`): past it the engine ends the session
    /// ([`SessionTx::shutdown`]), which ends this wait too. Its heartbeats go unanswered from
    /// now: the node no longer counts this session, and an answer would tell the peer the pair
    /// is alive for up to that wait after the node lost it, longer than the clean-up of a lost
    /// peer allows for (core's `node/grace.rs`).
    pub(crate) fn retire(self) {
        self.retired.store(true, Ordering::Release);
        tokio::spawn(async move {
            loop {
                // Registered before the look, so a change between the two is not missed.
                let idle = self.idle.notified();
                tokio::pin!(idle);
                idle.as_mut().enable();
                if !self.busy() {
                    break;
                }
                tokio::select! {
                    () = idle => {}
                    () = self.stop.wait() => return,
                }
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

    /// A heartbeat (`ack` false: answered here) or the answer to ours arrived: the pair's
    /// sign of life, which the engine collects ([`SessionTx::heard`]).
    pub(crate) fn received_heartbeat(&self, seq: u64, ack: bool, no_answer: bool) {
        self.heard.store(true, Ordering::Release);
        if ack {
            self.heartbeat_answered(seq);
        } else if !no_answer && !self.retired.load(Ordering::Acquire) {
            self.heartbeat(seq, true);
        }
    }

    /// Answers the peer's request `id` with the future `answer` makes, on a task of
    /// its own; the session counts as busy until the answer is queued ([`SessionTx::retire`]).
    /// The future is made on the task, where it is awaited: a future captured by the task
    /// would be kept twice in it (the capture, then the one awaited).
    pub(crate) fn answer_later<F>(&self, id: u64, answer: impl FnOnce() -> F + Send + 'static)
    where
        F: std::future::Future<Output = Body> + Send,
    {
        let tx = self.clone();
        tx.serving.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let body = answer().await;
            tx.answer(id, body).await;
            tx.serving.fetch_sub(1, Ordering::SeqCst);
            tx.idle.notify_waiters();
        });
    }

    /// Resolves once fewer than [`MAX_SERVING`] of the peer's requests are being answered.
    pub(crate) async fn room_to_serve(&self) {
        loop {
            // Registered before the look, so an answer finishing between the two is not missed.
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.serving.load(Ordering::SeqCst) < MAX_SERVING {
                return;
            }
            idle.await;
        }
    }

    /// Resolves once the session is stopped ([`SessionTx::shutdown`]).
    pub(crate) async fn stopped(&self) {
        self.stop.wait().await;
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

    /// Sends heartbeat `seq` asking for no answer (core's `Mesh::may_skip_answer`): it proves
    /// us alive to the peer, and is not timed.
    pub(crate) fn heartbeat_unanswered(&self, seq: u64) {
        self.send_heartbeat(SessionMsg {
            heartbeat_seq: seq,
            heartbeat_no_answer: true,
            ..SessionMsg::default()
        });
    }

    /// Sends a heartbeat (or its answer) if there is room.
    pub(crate) fn heartbeat(&self, seq: u64, ack: bool) {
        if !ack && let Ok(mut rtt) = self.rtt.lock() {
            rtt.sent = Some((seq, tokio::time::Instant::now()));
        }
        self.send_heartbeat(SessionMsg {
            heartbeat_seq: seq,
            heartbeat_ack: ack,
            ..SessionMsg::default()
        });
    }

    fn send_heartbeat(&self, msg: SessionMsg) {
        let trip = crate::stats::Trip::heartbeat(&self.stats, msg.heartbeat_ack);
        trip.sent_if(self.out.try_send(msg).is_ok());
    }

    /// Sends a request and waits for its answer. No timer here: callers that need one (the
    /// core node fails imports on its own timeout) bound the wait themselves.
    pub(crate) async fn call(&self, body: Body) -> Result<Body, CallError> {
        let mut trip = crate::stats::Trip::out(&self.stats, &body);
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
        if !self.send(frame(id, body)).await {
            self.forget(id);
            return Err(CallError::Closed);
        }
        trip.sent();
        match rx.await {
            // Made safe to log by the reader (`session::run`) before it got here.
            Ok(Body::Refused(why)) => Err(CallError::Refused(why)),
            Ok(body) => Ok(body),
            Err(_) => Err(CallError::Closed),
        }
    }

    /// The stats file counts this session adds to.
    pub(crate) fn stats(&self) -> &crate::stats::Stats {
        &self.stats
    }

    /// Sends a notification: a frame with id 0 that is never answered (nothing waits for it).
    pub(crate) async fn notify(&self, body: Body) -> bool {
        self.send(frame(0, body)).await
    }

    /// Queues a notification if the session's queue has room now, without waiting:
    /// `Ok(true)` queued, `Ok(false)` the session has stopped, `Err(body)` its queue is full
    /// ([`SessionTx::notify`] waits for room).
    pub(crate) fn try_notify(&self, body: Body) -> Result<bool, Body> {
        if self.stop.is_set() {
            return Ok(false);
        }
        match self.out.try_send(frame(0, body)) {
            Ok(()) => Ok(true),
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(false),
            Err(mpsc::error::TrySendError::Full(msg)) => match msg.body {
                Some(body) => Err(body),
                None => Ok(false),
            },
        }
    }

    /// Sends the answer to the peer's request `id`.
    async fn answer(&self, id: u64, body: Body) {
        let trip = crate::stats::Trip::out(&self.stats, &body);
        trip.sent_if(self.send(frame(id, body)).await);
    }

    /// Queues a frame, waiting for room, but not past the session's stop: a full queue that
    /// nobody reads any more must not hold a caller forever. Whether it was queued.
    async fn send(&self, frame: SessionMsg) -> bool {
        tokio::select! {
            sent = self.out.send(frame) => sent.is_ok(),
            () = self.stop.wait() => false,
        }
    }

    fn forget(&self, id: u64) {
        if let Ok(mut p) = self.pending.lock() {
            p.calls.remove(&id);
        }
        self.idle.notify_waiters();
    }

    /// Hands an answer to the call waiting for it; an answer nobody waits for is dropped.
    pub(crate) fn resolve(&self, id: u64, body: Body) {
        let waiter = self
            .pending
            .lock()
            .ok()
            .and_then(|mut p| p.calls.remove(&id));
        if let Some(w) = waiter {
            let _ = w.send(body);
        }
        self.idle.notify_waiters();
    }

    /// The session ended: every waiting call fails, and so does every later one.
    fn close(&self) {
        if let Ok(mut p) = self.pending.lock() {
            p.closed = true;
            p.calls.clear();
        }
        self.idle.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_small_enough_to_queue_unboxed() {
        // Every session's queue holds its first 32 frames in one block from the start: at
        // 400 bytes a frame (the identities and the handshake inline) that was 12.5 KiB per
        // session. A new large field belongs in `proto/build.rs`'s boxed list.
        let size = std::mem::size_of::<SessionMsg>();
        assert!(size <= 160, "a session frame is {size} bytes");
    }

    #[tokio::test]
    async fn a_retired_session_answers_no_heartbeat() {
        use tokio_stream::StreamExt;
        let (tx, mut out) = SessionTx::new(&crate::stats::Stats::default());
        tx.received_heartbeat(1, false, false);
        let ack = out.next().await.expect("answered while in use");
        assert_eq!((ack.heartbeat_seq, ack.heartbeat_ack), (1, true));
        // A call in flight keeps the retired session open for its answer.
        let call = tokio::spawn({
            let tx = tx.clone();
            async move { tx.call(Body::Unimport(Default::default())).await }
        });
        let request = out.next().await.expect("the call's request");
        tx.clone().retire();
        tx.received_heartbeat(2, false, false);
        tx.resolve(request.id, Body::UnimportReply(Default::default()));
        assert!(
            call.await.expect("join").is_ok(),
            "the call still gets its answer"
        );
        let rest: Vec<SessionMsg> = out.collect().await;
        assert!(
            rest.iter().all(|m| !m.heartbeat_ack),
            "no heartbeat answered after the retirement: {rest:?}"
        );
    }

    #[tokio::test]
    async fn a_call_waiting_for_room_ends_at_the_stop() {
        let (tx, _out) = SessionTx::new(&crate::stats::Stats::default());
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

    /// Counts the clones of a waker still alive: the test's own `Arc` is one.
    struct Counted;
    impl std::task::Wake for Counted {
        fn wake(self: Arc<Self>) {}
    }

    #[tokio::test]
    async fn a_send_that_waited_keeps_no_waker_once_done() {
        let (tx, mut out) = SessionTx::new(&crate::stats::Stats::default());
        for seq in 0..QUEUE as u64 {
            tx.heartbeat(seq, false);
        }
        let counted = Arc::new(Counted);
        let waker = Waker::from(Arc::clone(&counted));
        let mut cx = Context::from_waker(&waker);
        {
            let mut send = Box::pin(tx.notify(Body::Unimport(Default::default())));
            // The queue is full: the send waits, on the queue and on the stop.
            assert!(send.as_mut().poll(&mut cx).is_pending());
            assert!(Arc::strong_count(&counted) > 2, "registered while it waits");
            assert!(out.try_next().is_some());
            assert_eq!(send.as_mut().poll(&mut cx), Poll::Ready(true));
        }
        drop(waker);
        // Before, the stop kept every waiting task's waker until the session ended: one
        // finished task's memory per answer sent (an exporter with 10,000 imports: ~11 MiB).
        assert_eq!(
            Arc::strong_count(&counted),
            1,
            "no waker kept after the send"
        );
    }

    #[tokio::test]
    async fn the_outbound_stream_keeps_one_waker_however_often_polled() {
        let (tx, mut out) = SessionTx::new(&crate::stats::Stats::default());
        let counted: Vec<Arc<Counted>> = (0..3).map(|_| Arc::new(Counted)).collect();
        for c in &counted {
            let waker = Waker::from(Arc::clone(c));
            let mut cx = Context::from_waker(&waker);
            // Nothing queued: the stream waits, on its queue and on the stop.
            assert!(tokio_stream::Stream::poll_next(Pin::new(&mut out), &mut cx).is_pending());
        }
        assert_eq!(
            tx.stop.kept(),
            1,
            "each poll's waker replaces the one before"
        );
        tx.shutdown();
        let waker = Waker::from(Arc::clone(&counted[0]));
        let mut cx = Context::from_waker(&waker);
        assert_eq!(
            tokio_stream::Stream::poll_next(Pin::new(&mut out), &mut cx),
            Poll::Ready(None),
            "the stream ends at the stop"
        );
    }
}
