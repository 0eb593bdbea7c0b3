//! The performance statistics of NVIDIA's stats file (docs/reference/imex-guide.md §6, `STATS_FILE_NAME`): what
//! is counted, where, and the record taken from it every interval.
//!
//! This module owns the counting; [`record`] owns the text of one record and [`writer`] the
//! thread that writes a record every `OPENIMEX_STATS_INTERVAL_SEC` and a last one at the stop.
//!
//! # What each figure is here
//!
//! - `IncomingMessages` / `OutgoingMessages`, keyed by the peer-to-peer message's type
//!   ([`Kind`]): every frame of a session stream, counted once per interval (the counts are
//!   reset by each record).
//!   - An incoming request (import, unimport, status, goodbye) is *received* when its session's
//!     reader takes the frame, *starts* when the engine takes it from its mailbox, and is
//!     *answered* when its answer is ready: `avgQueueTimeMillis` is received→started,
//!     `avgOperTimeMillis` started→answered (an import's includes the driver's describe),
//!     `avgTotalTimeMillis` received→answered. The reader notes the request
//!     (`request_arrived`); the engine marks the start (`taken`) of the oldest noted request of
//!     the same kind: the mailbox is first in, first out, so that is the one it took, unless two
//!     readers raced to the mailbox with requests of one kind a few microseconds apart.
//!   - Heartbeats, their answers and the answers to our requests are handled by the reader as
//!     they arrive, without a queue: counted, with zero times.
//!   - An outgoing message (`Trip`) is queued from the moment it is built until the session's
//!     send queue takes it (the wait there is the peer's back-pressure); for a request, the
//!     operation is the wait for the peer's answer; answers and heartbeats have none.
//! - `QueueStats`:
//!   - `ProcessorQueue` is the engine's mailbox, the queue of work not yet processed:
//!     `queueDepth` is every input waiting in it, `oldestDurationMillis` the age of the oldest
//!     peer request waiting in it (only peer requests carry their arrival time).
//!   - `PendingFreeQueue` is the daemon's analogue of NVIDIA's frees waiting to complete: the
//!     unimports this node sent to exporters and whose confirmation it still awaits (the GPU
//!     driver holds the application's free until then).
//!
//! Recording is cheap: one short `Mutex` section per message, never held across an await.
//! The hooks in the message paths are one-line calls into this module.

pub mod record;
pub mod writer;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use openimex_proto::peer::SessionMsg;
use openimex_proto::peer::session_msg::Body;
pub use record::{Group, MessageStat, QueueStat, Record};
pub use writer::{StatsFile, StatsOptions};

/// A peer-to-peer message type, as the stats file names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// An importer asks the exporter for an import.
    ImportRequest,
    /// The exporter's answer to an import.
    ImportResponse,
    /// An importer tells the exporter it unimported.
    UnimportRequest,
    /// The exporter's confirmation of an unimport.
    UnimportResponse,
    /// A status row asked for `ctl -N`.
    StatusRequest,
    /// A status row.
    StatusResponse,
    /// A peer leaving cleanly.
    Goodbye,
    /// The acknowledgement of a goodbye.
    GoodbyeResponse,
    /// A heartbeat (sent by the pair's lower node).
    Heartbeat,
    /// The answer to a heartbeat.
    HeartbeatAck,
    /// A request refused by the other end.
    Refused,
    /// An importer forwards a multicast remote GPU attach to the prime's node.
    RemoteGpuAttachRequest,
    /// The prime's node's answer to it.
    RemoteGpuAttachResponse,
}

/// Every kind, in the order a record lists them.
pub const KINDS: [Kind; 13] = [
    Kind::ImportRequest,
    Kind::ImportResponse,
    Kind::UnimportRequest,
    Kind::UnimportResponse,
    Kind::StatusRequest,
    Kind::StatusResponse,
    Kind::Goodbye,
    Kind::GoodbyeResponse,
    Kind::Heartbeat,
    Kind::HeartbeatAck,
    Kind::Refused,
    Kind::RemoteGpuAttachRequest,
    Kind::RemoteGpuAttachResponse,
];

impl Kind {
    /// The name in the stats file.
    pub fn name(self) -> &'static str {
        match self {
            Kind::ImportRequest => "ImportRequest",
            Kind::ImportResponse => "ImportResponse",
            Kind::UnimportRequest => "UnimportRequest",
            Kind::UnimportResponse => "UnimportResponse",
            Kind::StatusRequest => "StatusRequest",
            Kind::StatusResponse => "StatusResponse",
            Kind::Goodbye => "Goodbye",
            Kind::GoodbyeResponse => "GoodbyeResponse",
            Kind::Heartbeat => "Heartbeat",
            Kind::HeartbeatAck => "HeartbeatAck",
            Kind::Refused => "Refused",
            Kind::RemoteGpuAttachRequest => "RemoteGpuAttachRequest",
            Kind::RemoteGpuAttachResponse => "RemoteGpuAttachResponse",
        }
    }

    /// The kind of a session frame's body.
    pub(crate) fn of_body(body: &Body) -> Kind {
        match body {
            Body::Import(_) => Kind::ImportRequest,
            Body::ImportReply(_) => Kind::ImportResponse,
            Body::Unimport(_) => Kind::UnimportRequest,
            Body::UnimportReply(_) => Kind::UnimportResponse,
            Body::Status(_) => Kind::StatusRequest,
            Body::StatusReply(_) => Kind::StatusResponse,
            Body::Goodbye(_) => Kind::Goodbye,
            Body::GoodbyeReply(_) => Kind::GoodbyeResponse,
            Body::Refused(_) => Kind::Refused,
            // A pushed part of the sender's status row: counted with the rows, so the stats
            // file keeps NVIDIA's message kinds.
            Body::CliquesChanged(_) | Body::JobsHeld(_) => Kind::StatusResponse,
            Body::RemoteGpuAttach(_) => Kind::RemoteGpuAttachRequest,
            Body::RemoteGpuAttachReply(_) => Kind::RemoteGpuAttachResponse,
            // A handshake frame: each session's first is read before its frames are counted,
            // so only a stray one (refused) gets here; NVIDIA's kinds have no handshake.
            Body::Hello(_) => Kind::StatusRequest,
            Body::HelloReply(_) => Kind::StatusResponse,
        }
    }

    /// The kind of a session frame (no body: a heartbeat or its answer).
    fn of(msg: &SessionMsg) -> Kind {
        match &msg.body {
            Some(body) => Kind::of_body(body),
            None if msg.heartbeat_ack => Kind::HeartbeatAck,
            None => Kind::Heartbeat,
        }
    }

    /// A request: answered by the other end.
    fn is_request(self) -> bool {
        matches!(
            self,
            Kind::ImportRequest | Kind::UnimportRequest | Kind::StatusRequest | Kind::Goodbye
        )
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The sums of one direction and kind since the last record.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Sums {
    count: u64,
    queue: Duration,
    oper: Duration,
    total: Duration,
}

impl Sums {
    fn add(&mut self, queue: Duration, oper: Duration) {
        self.count += 1;
        self.queue += queue;
        self.oper += oper;
        self.total += queue + oper;
    }
}

/// Which way a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    In,
    Out,
}

/// An incoming request noted by [`Stats::request_arrived`]: its number and when it arrived.
#[derive(Debug, Clone, Copy)]
struct Noted {
    seq: u64,
    received: Instant,
}

/// The incoming requests of one kind between their arrival and their answer. Numbered rather
/// than shared (an `Arc` per request was an allocation on every import's path); both
/// collections keep their capacity, so a request allocates nothing here once warm.
#[derive(Debug, Default)]
struct Waiting {
    /// Noted, not yet taken by the engine, oldest first.
    queue: VecDeque<Noted>,
    /// Taken by the engine, not yet answered: when each started.
    started: HashMap<u64, Instant>,
}

impl Waiting {
    /// Forgets request `seq`: when the engine started it, if it had taken it (otherwise it is
    /// taken out of the queue).
    fn forget(&mut self, seq: u64) -> Option<Instant> {
        let started = self.started.remove(&seq);
        if started.is_none() {
            self.queue.retain(|n| n.seq != seq);
        }
        started
    }
}

/// Drops a request's traces if its answer never comes (its session closed first, and the
/// answering future with it).
struct Forget {
    stats: Stats,
    kind: Kind,
    seq: u64,
    armed: bool,
}

impl Drop for Forget {
    fn drop(&mut self) {
        if self.armed {
            lock(&self.stats.0.waiting)[self.kind.index()].forget(self.seq);
        }
    }
}

/// Everything one daemon counts for its stats file: its sessions, its engine and the file's
/// writer share it ([`crate::World::stats`]). Cheap to clone; one per daemon, so several
/// daemons in one process count apart.
#[derive(Clone, Default)]
pub struct Stats(Arc<Counts>);

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stats").finish_non_exhaustive()
    }
}

/// What [`Stats`] shares.
#[derive(Default)]
struct Counts {
    /// Per direction and kind since the last record.
    sums: Mutex<[[Sums; KINDS.len()]; 2]>,
    /// Incoming requests not yet answered, per kind.
    waiting: Mutex<[Waiting; KINDS.len()]>,
    /// The next incoming request's number.
    next_request: AtomicU64,
    /// The depth of the engine's mailbox (see [`Stats::watch_mailbox`]).
    mailbox: Mutex<Option<Depth>>,
    /// Unimports sent and not yet confirmed, by a sequence number: the first is the oldest.
    unimports: Mutex<BTreeMap<u64, Instant>>,
    next_unimport: AtomicU64,
}

/// A lock whose holder panicked still guards consistent counters: go on with them.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Counts {
    fn add(&self, dir: Dir, kind: Kind, queue: Duration, oper: Duration) {
        let d = match dir {
            Dir::In => 0,
            Dir::Out => 1,
        };
        lock(&self.sums)[d][kind.index()].add(queue, oper);
    }
}

/// How many inputs wait in the engine's mailbox now.
pub(crate) type Depth = Box<dyn Fn() -> usize + Send + Sync>;

/// `depth` tells `ProcessorQueue`'s depth: the engine's mailbox, read through a weak handle by
/// the caller so the stats never keep it open (`mailbox::depth_of`). Taken as a function, not
/// the mailbox, so the stats need not know the engine's inputs.
impl Stats {
    pub(crate) fn watch_mailbox(&self, depth: Depth) {
        *lock(&self.0.mailbox) = Some(depth);
    }

    /// Hook of the session reader, for a frame that is not a request (see [`Stats::request_arrived`]): a
    /// heartbeat or an answer, handled at once.
    pub(crate) fn arrived(&self, msg: &SessionMsg) {
        let kind = Kind::of(msg);
        if !kind.is_request() {
            self.0.add(Dir::In, kind, Duration::ZERO, Duration::ZERO);
        }
    }

    /// Hook of the session reader: an incoming request of `kind` arrived now. Its [`Ticket`] times
    /// and counts it once its answer is ready ([`Ticket::served`]), per the module doc.
    pub(crate) fn request_arrived(&self, kind: Kind) -> Ticket {
        let received = Instant::now();
        let seq = self.0.next_request.fetch_add(1, Ordering::Relaxed);
        lock(&self.0.waiting)[kind.index()]
            .queue
            .push_back(Noted { seq, received });
        Ticket {
            // A request whose answer never comes is forgotten when its ticket goes.
            forget: Forget {
                stats: self.clone(),
                kind,
                seq,
                armed: true,
            },
            received,
        }
    }

    /// Hook of the engine, as it takes an input from its mailbox: the processing of a peer
    /// request of `kind` starts (`None`: not a request [`Stats::request_arrived`] notes).
    pub(crate) fn taken(&self, kind: Option<Kind>) {
        let Some(kind) = kind else {
            return;
        };
        let now = Instant::now();
        let mut w = lock(&self.0.waiting);
        let w = &mut w[kind.index()];
        if let Some(noted) = w.queue.pop_front() {
            w.started.insert(noted.seq, now);
        }
    }

    /// The record of the interval that ends now, over `seconds` seconds; the counts start
    /// again from zero.
    pub fn take(&self, seconds: u64) -> Record {
        self.0.take(seconds)
    }
}

/// An incoming request, noted on arrival ([`Stats::request_arrived`]).
pub(crate) struct Ticket {
    forget: Forget,
    received: Instant,
}

impl Ticket {
    /// `answer`, then the request counted.
    pub(crate) fn served<F: Future<Output = Body>>(self, answer: F) -> Served<F> {
        Served {
            answer,
            ticket: self,
        }
    }
}

pin_project_lite::pin_project! {
    /// The future [`Ticket::served`] returns. A struct rather than an `async` block, which
    /// would keep the captured future next to the one it awaits (twice the size of every
    /// request task), or need a box per request to avoid that.
    pub(crate) struct Served<F> {
        #[pin]
        answer: F,
        ticket: Ticket,
    }
}

impl<F: Future<Output = Body>> Future for Served<F> {
    type Output = Body;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Body> {
        let this = self.project();
        let body = std::task::ready!(this.answer.poll(cx));
        let Ticket { forget, received } = this.ticket;
        forget.armed = false;
        let (kind, seq, received) = (forget.kind, forget.seq, *received);
        let done = Instant::now();
        // Answered without reaching the engine (a malformed request, a stopping daemon): all
        // of its time was its own handling.
        let stats = &forget.stats.0;
        let started = lock(&stats.waiting)[kind.index()]
            .forget(seq)
            .unwrap_or(received);
        stats.add(
            Dir::In,
            kind,
            started.saturating_duration_since(received),
            done.saturating_duration_since(started),
        );
        Poll::Ready(body)
    }
}

/// One outgoing message, from when it is built to when it left (and, for a request, was
/// answered). Counted when dropped, if it was sent.
pub(crate) struct Trip {
    stats: Stats,
    kind: Kind,
    built: Instant,
    sent: Option<Instant>,
    /// Its entry among the unimports awaiting confirmation.
    unimport: Option<u64>,
}

impl Trip {
    /// An outgoing frame with `body`, built now.
    pub(crate) fn out(stats: &Stats, body: &Body) -> Trip {
        let kind = Kind::of_body(body);
        let built = Instant::now();
        let unimport = (kind == Kind::UnimportRequest).then(|| {
            let seq = stats.0.next_unimport.fetch_add(1, Ordering::Relaxed);
            lock(&stats.0.unimports).insert(seq, built);
            seq
        });
        Trip {
            stats: stats.clone(),
            kind,
            built,
            sent: None,
            unimport,
        }
    }

    /// An outgoing heartbeat (`ack`: the answer to one), built now.
    pub(crate) fn heartbeat(stats: &Stats, ack: bool) -> Trip {
        Trip {
            stats: stats.clone(),
            kind: if ack {
                Kind::HeartbeatAck
            } else {
                Kind::Heartbeat
            },
            built: Instant::now(),
            sent: None,
            unimport: None,
        }
    }

    /// The session's send queue took it; a request now waits for its answer.
    pub(crate) fn sent(&mut self) {
        self.sent = Some(Instant::now());
    }

    /// It was sent if `ok`; nothing more to wait for. Returns `ok`.
    pub(crate) fn sent_if(mut self, ok: bool) -> bool {
        if ok {
            self.sent();
        }
        ok
    }
}

impl Drop for Trip {
    fn drop(&mut self) {
        if let Some(seq) = self.unimport {
            lock(&self.stats.0.unimports).remove(&seq);
        }
        if let Some(sent) = self.sent {
            let queue = sent.saturating_duration_since(self.built);
            // Only a request waits for something once sent: its answer.
            let oper = match self.kind.is_request() {
                true => sent.elapsed(),
                false => Duration::ZERO,
            };
            self.stats.0.add(Dir::Out, self.kind, queue, oper);
        }
    }
}

impl Counts {
    fn take(&self, seconds: u64) -> Record {
        let now = Instant::now();
        let sums = std::mem::take(&mut *lock(&self.sums));
        let (waiting, oldest_waiting) = {
            let w = lock(&self.waiting);
            let oldest = w
                .iter()
                .filter_map(|k| k.queue.front().map(|n| n.received))
                .min();
            (w.iter().map(|k| k.queue.len()).sum::<usize>(), oldest)
        };
        let mailbox = lock(&self.mailbox).as_ref().map_or(0, |depth| depth());
        let (unimports, oldest_unimport) = {
            let u = lock(&self.unimports);
            (u.len(), u.values().next().copied())
        };
        let age =
            |t: Option<Instant>| t.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        let group = |d: usize| -> Group {
            KINDS
                .iter()
                .filter(|k| sums[d][k.index()].count > 0)
                .map(|&k| {
                    let s = sums[d][k.index()];
                    (k, MessageStat::average(s.count, s.queue, s.oper, s.total))
                })
                .collect()
        };
        Record {
            seconds,
            processor: QueueStat::new(mailbox.max(waiting), age(oldest_waiting)),
            pending_free: QueueStat::new(unimports, age(oldest_unimport)),
            incoming: group(0),
            outgoing: group(1),
        }
    }
}

#[cfg(test)]
mod tests;
