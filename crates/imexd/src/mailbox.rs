//! The engine's mailbox: every message another task, thread or RPC handler sends the engine,
//! and what it answers with. A leaf module: the engine, the peer and command services, the
//! dialler and the driver threads all depend on it, and it on none of them.

use openimex_core::node::PeerRequest;
use openimex_core::{
    ConnId, DaemonState, Event, Hello, ImportAnswer, ImportError, ImportRequest, InstanceId,
    LinkView, Mismatch, NodeId, Pages, PeerId, PeerState, Verdict, Via,
};
use openimex_driver::DriverError;
use openimex_proto::peer::Identity;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tonic::transport::Channel;

use crate::error::DialError;
use crate::session_tx::SessionTx;

/// Messages to the engine.
pub(crate) enum Input {
    /// An inbound handshake on connection `conn`, answered with the verdict and this
    /// daemon's identity. `from_node_address`: the connection comes from the node file's
    /// address for the node the hello names.
    Hello {
        hello: Hello,
        /// The cliques the hello names, and their epoch.
        cliques: (Vec<u32>, u64),
        conn: ConnId,
        from_node_address: bool,
        reply: oneshot::Sender<(Verdict, Identity)>,
    },
    /// Does connection `conn` carry a session (for `what`)? A refusal is counted.
    Authenticate {
        via: Via,
        what: PeerRequest,
        reply: oneshot::Sender<bool>,
    },
    /// A peer's notification on session `via` that its cliques changed.
    PeerCliques {
        via: Via,
        cliques: openimex_proto::peer::CliquesChanged,
    },
    /// Whether the session to `peer` took our cliques notification (`Action::SendCliques`).
    CliquesSent { peer: NodeId, sent: bool },
    /// A peer's list of the jobs it shares with this node, on session `via`.
    PeerJobs {
        via: Via,
        jobs: openimex_proto::peer::JobsHeld,
    },
    /// Whether the session to `peer` took our jobs list (`Action::SendJobs`).
    JobsSent { peer: NodeId, sent: bool },
    /// A read of the jobs directory: the jobs of its valid files and the others' problems.
    JobFiles(JobFiles),
    /// Our goodbye reached `peer` and it acknowledged (`delivered`), or not.
    GoodbyeDelivered { peer: NodeId, delivered: bool },
    /// An inbound connection was accepted (sent before anything else about it); `closer`
    /// closes it when the node says so (no hello in time).
    ConnAccepted {
        conn: ConnId,
        remote: std::net::SocketAddr,
        closer: Closer,
    },
    /// An inbound connection closed.
    ConnClosed { conn: ConnId },
    /// A session stream opened on an inbound connection and waits for its first frame (the
    /// hello); `closer` ends that wait when the node says so (no hello in time).
    StreamOpened { stream: u64, closer: Closer },
    /// The first frame of `stream` arrived (or the wait for it ended).
    StreamHeard { stream: u64 },
    /// Something was refused before it reached the node (connection limits): count it.
    Refused {
        reason: &'static str,
        detail: String,
    },
    /// A dial succeeded and its session is open.
    DialOk {
        peer: NodeId,
        attempt: u64,
        remote: Hello,
        /// The cliques the answer names, and their epoch.
        cliques: (Vec<u32>, u64),
        link: OutLink,
    },
    /// A dial failed before a session.
    DialFailed {
        peer: NodeId,
        attempt: u64,
        error: DialError,
    },
    /// The peer refused our handshake.
    DialRefused {
        peer: NodeId,
        attempt: u64,
        mismatch: Mismatch,
    },
    /// The peer proved on inbound connection `conn` opened its session stream there; answered
    /// with whether it carries the pair (otherwise it is closed at once).
    SessionOpened {
        conn: ConnId,
        remote: std::net::SocketAddr,
        session: SessionTx,
        reply: oneshot::Sender<bool>,
    },
    /// A session ended (its stream closed or failed, or it was closed here).
    SessionLost { via: Via, reason: String },
    /// A peer leaves cleanly; answered with whether it was believed.
    Goodbye {
        via: Via,
        claimed: Option<PeerId>,
        reason: String,
        reply: oneshot::Sender<bool>,
    },
    /// A snapshot for the command service or a peer's status query.
    Snapshot { reply: oneshot::Sender<Snapshot> },
    /// Every peer as this node sees it, for `ctl --peers`.
    Peers {
        reply: oneshot::Sender<PeersSnapshot>,
    },
    /// The jobs defined here and their states, for `ctl jobs`.
    Jobs {
        reply: oneshot::Sender<openimex_proto::cmd::JobsReply>,
    },
    /// The owner's word that `channel`'s ended job left no process here (`ctl jobs clear`):
    /// the job that ended holding it, if it was quarantined.
    JobChannelClear {
        channel: u32,
        reply: oneshot::Sender<Option<String>>,
    },
    /// Answer once the job stands as `want` says (`ctl jobs wait`, and `create`/`end` waiting
    /// for the engine to have read the file): the job as it stands then (`None`: not held). A
    /// waiter whose asker is gone is dropped.
    JobWait {
        name: String,
        want: JobWant,
        reply: oneshot::Sender<Option<openimex_proto::cmd::JobReport>>,
    },
    /// A peer asks us (the exporter) for an import.
    PeerImport {
        via: Via,
        claimed: Option<PeerId>,
        request: ImportRequest,
        reply: oneshot::Sender<ImportAnswer>,
    },
    /// A peer's multicast remote GPU attach (we own the prime).
    PeerRemoteGpuAttach {
        via: Via,
        attach: openimex_core::RemoteGpuAttach,
        reply: oneshot::Sender<Result<(), ImportError>>,
    },
    /// A peer unimported (answered with whether a reference was released, or refused: the
    /// importer must send it again on the pair's session).
    PeerUnimport {
        via: Via,
        claimed: Option<PeerId>,
        import_event_id: u64,
        reply: oneshot::Sender<Result<bool, String>>,
    },
    /// The exporter answered our import (or the request failed).
    ImportAnswered {
        exporter: NodeId,
        import_event_id: u64,
        answer: ImportAnswer,
    },
    /// Our unimport reached the exporter, or could not.
    UnimportDelivered {
        exporter: NodeId,
        import_event_id: u64,
        delivered: bool,
    },
    /// The persist record of this sequence number (and every earlier one) is written.
    Persisted { seq: u64 },
    /// Something from the GPU driver's threads.
    Driver(DriverInput),
    /// The nodes file read again and resolved (SIGUSR1), or the start-up entries resolved.
    NodesFile(Reread),
}

/// A re-read of the nodes file (see `nodes_file`).
pub(crate) struct Reread {
    /// The start-up entries resolved (no re-read): the baseline later re-reads compare with.
    pub(crate) initial: bool,
    /// The file, or why it could not be read or parsed (with file:line).
    pub(crate) result: Result<NodesFile, String>,
}

/// The nodes file as read and resolved.
pub(crate) struct NodesFile {
    /// The file.
    pub(crate) path: std::path::PathBuf,
    /// Its entries, in node-ID order.
    pub(crate) hosts: Vec<String>,
    /// The line of each entry (empty for the start-up baseline).
    pub(crate) lines: Vec<usize>,
    /// What each entry resolves to now (sorted; empty: does not resolve).
    pub(crate) addrs: Vec<Vec<std::net::IpAddr>>,
}

/// The node map's entries as they stand (they grow when SIGUSR1 appends nodes): the engine
/// publishes, the peer service (hello source checks) and the command service (`ctl` rows) read.
pub(crate) type Hosts = tokio::sync::watch::Receiver<std::sync::Arc<Vec<String>>>;

/// What the driver threads report.
pub(crate) enum DriverInput {
    /// The session is open.
    SessionOpen { version: String },
    /// A fabric event.
    Event(Event),
    /// A describe for a peer's import finished.
    Described {
        request: u64,
        result: Result<(u64, Pages), ImportError>,
    },
    /// The GPUs' fabric probes as read.
    GpuFabric(Vec<openimex_core::GpuFabric>),
    /// References were released for a peer's unimport: answer it.
    Released { request: u64 },
    /// ATTACH_REMOTE_GPU for a peer's multicast attach finished.
    RemoteGpuAttached {
        request: u64,
        attach: openimex_core::RemoteGpuAttach,
        result: Result<(), ImportError>,
    },
    /// A driver call failed. `Lost` stops the daemon; anything else is logged.
    Failed {
        call: &'static str,
        error: DriverError,
    },
}

/// An open outbound session.
pub(crate) struct OutLink {
    /// The connection, held for as long as the session (never read).
    pub(crate) _connection: Channel,
    /// Heartbeats and requests go here.
    pub(crate) session: SessionTx,
    /// The task reading the session.
    pub(crate) reader: AbortHandle,
    /// The address dialled (the node's entry as resolved then).
    pub(crate) remote: std::net::SocketAddr,
}

/// What the command service needs from the engine at one instant.
pub(crate) struct Snapshot {
    pub(crate) local: NodeId,
    pub(crate) state: DaemonState,
    pub(crate) instance: InstanceId,
    pub(crate) links: Vec<LinkView>,
    pub(crate) driver_version: String,
    /// This host's name (`ctl -N`'s hostname column).
    pub(crate) host_name: String,
    /// Peer messages refused since start, by reason.
    pub(crate) refusals: Vec<(&'static str, u64)>,
    /// Sessions of the peers connected right now, to ask for their rows.
    pub(crate) peers: Vec<(NodeId, SessionTx)>,
    /// This node's GPUs on the fabric, as last read (`fabric`).
    pub(crate) fabric: Vec<openimex_core::GpuFabric>,
}

/// What `ctl --peers` needs from the engine at one instant.
pub(crate) struct PeersSnapshot {
    pub(crate) local: NodeId,
    pub(crate) state: DaemonState,
    pub(crate) peers: Vec<PeerState>,
    /// The engine's clock when taken, and the wall clock at the same moment: clean-up times
    /// are converted to wall-clock time against them (the node keeps engine-clock instants).
    pub(crate) now: std::time::Instant,
    pub(crate) wall: std::time::SystemTime,
}

/// Sends the engine a request built around a reply channel and awaits the answer. The engine
/// only goes away when the daemon stops, so both failures mean "stopping".
pub(crate) async fn ask<T>(
    engine: &mpsc::Sender<Input>,
    request: impl FnOnce(oneshot::Sender<T>) -> Input,
) -> Result<T, Stopping> {
    let (reply, rx) = oneshot::channel();
    engine.send(request(reply)).await.map_err(|_| Stopping)?;
    rx.await.map_err(|_| Stopping)
}

/// The engine is gone: the daemon is stopping.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopping;

impl From<Stopping> for tonic::Status {
    fn from(_: Stopping) -> Self {
        tonic::Status::unavailable("daemon is stopping")
    }
}

impl Input {
    /// The peer request this input starts, if it is one the stats file times
    /// (`stats::request_arrived`).
    pub(crate) fn request_kind(&self) -> Option<crate::stats::Kind> {
        use crate::stats::Kind;
        match self {
            Input::PeerImport { .. } => Some(Kind::ImportRequest),
            Input::PeerUnimport { .. } => Some(Kind::UnimportRequest),
            Input::PeerRemoteGpuAttach { .. } => Some(Kind::RemoteGpuAttachRequest),
            Input::Goodbye { .. } => Some(Kind::Goodbye),
            Input::Authenticate {
                what: PeerRequest::Status,
                ..
            } => Some(Kind::StatusRequest),
            _ => None,
        }
    }
}

/// The engine's hold on an inbound connection or session stream it may close (core's hello
/// deadline, `Action::CloseConn` and `Action::CloseStream`): once closed, the connection's next
/// read fails, which ends it, and a TLS handshake or a wait for a stream's hello still running
/// on it stops.
#[derive(Clone, Default)]
pub(crate) struct Closer(std::sync::Arc<CloseFlag>);

#[derive(Default)]
struct CloseFlag {
    set: std::sync::atomic::AtomicBool,
    /// The connection's last read, woken to fail.
    reader: std::sync::Mutex<Option<std::task::Waker>>,
    /// Tasks waiting ([`Closer::closed`]).
    tasks: tokio::sync::Notify,
}

impl Closer {
    /// Closes the connection.
    pub(crate) fn close(&self) {
        self.0.set.store(true, std::sync::atomic::Ordering::Release);
        self.0.tasks.notify_waiters();
        if let Some(w) = self.0.reader.lock().ok().and_then(|mut w| w.take()) {
            w.wake();
        }
    }

    /// Whether it is closed; if not, `cx` is woken when it is.
    pub(crate) fn poll_closed(&self, cx: &std::task::Context<'_>) -> bool {
        if let Ok(mut w) = self.0.reader.lock() {
            match w.as_ref() {
                Some(old) if old.will_wake(cx.waker()) => {}
                _ => *w = Some(cx.waker().clone()),
            }
        }
        self.0.set.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Resolves once it is closed.
    pub(crate) async fn closed(&self) {
        loop {
            // Registered before the look, so a close between the two is not missed.
            let told = self.0.tasks.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if self.0.set.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            told.await;
        }
    }
}

/// The depth of the mailbox `tx` sends to, read through a weak handle (so whoever holds it
/// never keeps the mailbox open; 0 once it is gone).
pub(crate) fn depth_of(tx: &mpsc::Sender<Input>) -> crate::stats::Depth {
    let weak = tx.downgrade();
    Box::new(move || {
        weak.upgrade()
            .map_or(0, |tx| tx.max_capacity() - tx.capacity())
    })
}

/// What an [`Input::JobWait`] waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JobWant {
    /// The job held in the state of this word (`JobState::word`).
    State(String),
    /// The job no longer held.
    Gone,
    /// A read of the jobs directory has taken the job's file, which defines the job as this
    /// says: the job held, or this definition refused by the node (answered `None`). What `ctl
    /// jobs create` waits for after writing the file, however long the daemon takes to read
    /// it, and also when the read came first (the wait and the read race).
    Read(openimex_core::jobs::JobSpec),
}

/// What one read of the jobs directory found (`jobs_dir`).
#[derive(Debug, Default)]
pub(crate) struct JobFiles {
    /// The jobs of the valid files.
    pub(crate) jobs: Vec<openimex_config::jobfile::JobFile>,
    /// Why each other `.job` file is no job.
    pub(crate) problems: Vec<String>,
    /// The quarantine as the daemon's record (`jobs_dir::QUARANTINE_FILE`) says: (channel,
    /// the job that ended).
    pub(crate) quarantined: Vec<(u32, String)>,
}
