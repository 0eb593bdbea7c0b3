//! The engine: the single task that owns the core [`Node`]. It is a loop — take an input (a
//! peer request, a dial result, a driver event or call result, the node's timer, the shutdown
//! signal), hand it to the node, perform every action the node asks for, and post each action's
//! result back as an input. It decides nothing about peers or imports itself; that is the
//! node's job. Time is tokio's clock, so tests can pause it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use crate::session_tx::SessionTx;
use openimex_core::node::Action;
use openimex_core::{
    ConnId, ConnStatus, DaemonState, ImportAnswer, ImportError, Node, NodeId, RequestId, Via,
};
use openimex_driver::{Driver, DriverError};
use openimex_proto::peer::Identity;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::convert;
use crate::driver_io::{Call, DriverThreads};
use crate::error::{DaemonError, DialError};
use crate::mailbox::{DriverInput, Input, OutLink, PeersSnapshot, Snapshot};
use crate::peer_client;
use crate::peer_client::OwnHello;
use crate::settings::Settings;

/// Peer requests waiting for the node's answer.
#[derive(Default)]
struct Waiting {
    next: RequestId,
    imports: HashMap<RequestId, oneshot::Sender<ImportAnswer>>,
    unimports: HashMap<RequestId, oneshot::Sender<Result<bool, String>>>,
    remote_gpu_attaches: HashMap<RequestId, oneshot::Sender<Result<(), ImportError>>>,
}

impl Waiting {
    fn id(&mut self) -> RequestId {
        self.next += 1;
        self.next
    }
}

pub(crate) struct Engine {
    node: Node,
    settings: Settings,
    driver: DriverThreads,
    driver_name: &'static str,
    driver_version: String,
    tx: mpsc::Sender<Input>,
    /// Sessions this node dialled, by peer, with their attempt.
    sessions: HashMap<NodeId, (u64, OutLink)>,
    /// Sessions peers dialled to this node, by inbound connection.
    accepted: HashMap<ConnId, (SessionTx, std::net::SocketAddr)>,
    waiting: Waiting,
    state_tx: watch::Sender<DaemonState>,
    goodbyes: Vec<(NodeId, SessionTx)>,
    /// Shutting down, the node stopped waiting for the goodbyes (`Action::GoodbyesOver`).
    goodbyes_over: bool,
    /// Sessions the node closed, retired until idle or until the node ends them
    /// (`Action::EndSession`).
    retired: HashMap<Via, SessionTx>,
    /// How to close each inbound connection accepted and not closed yet, when the node says
    /// so (`Action::CloseConn`: no hello in time).
    closers: HashMap<ConnId, crate::mailbox::Closer>,
    /// The same for session streams waiting for their hello (`Action::CloseStream`).
    stream_closers: HashMap<u64, crate::mailbox::Closer>,
    heartbeat_seq: u64,
    dial_log: HashMap<NodeId, (u64, Option<Instant>)>,
    /// Dials leave from this address (the peer listener's), so peers see the node map's
    /// address as the source.
    local_ip: Option<std::net::IpAddr>,
    /// The in-process network dials go over; `None`: TCP.
    net: Option<crate::net::MemNet>,
    /// Writes the persist record, if one is kept, and holds the answers waiting for it.
    persist: Option<crate::persist::Writer>,
    /// Our hello for dials (the identity without the node map's entries, and the entries),
    /// built once and rebuilt when the cliques, the driver version or the node map change.
    me_cache: Option<OwnHello>,
    /// Where the node map's entries are published for the peer and command services.
    hosts_tx: Option<watch::Sender<Arc<Vec<String>>>>,
    /// Counters and histograms of imports, unimports and links (`metrics`).
    metrics: crate::metrics::Events,
    /// The stats file's counts (shared with the sessions and the file's writer).
    stats: crate::stats::Stats,
    /// How many peers are connected, for the service manager (`notify`).
    peers_tx: Option<watch::Sender<crate::notify::Peers>>,
    connected: usize,
    /// The jobs defined from job files, and the problems already logged (`engine/jobs.rs`).
    job_files: jobs::FromFiles,
    /// `ctl jobs wait` (and create/end) callers waiting for a job to stand as they want.
    job_waiters: Vec<jobs::JobWaiter>,
}

/// The node's next deadline (`Node::poll_timeout`), one timer re-armed in place: a fresh
/// `sleep_until` on each turn of the engine's loop registered and dropped a timer entry for
/// every message the engine took.
struct NodeTimer {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    armed: Option<Instant>,
}

impl NodeTimer {
    fn new() -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep_until(Instant::now())),
            armed: None,
        }
    }

    /// Arms the timer for `deadline`; without one it never fires.
    fn set(&mut self, deadline: Option<std::time::Instant>) {
        let deadline = deadline.map(Instant::from_std);
        if deadline != self.armed {
            if let Some(at) = deadline {
                self.sleep.as_mut().reset(at);
            }
            self.armed = deadline;
        }
    }

    /// Resolves once the armed deadline has passed (and disarms); never while unarmed.
    async fn fired(&mut self) {
        match self.armed {
            Some(_) => {
                self.sleep.as_mut().await;
                self.armed = None;
            }
            None => std::future::pending().await,
        }
    }
}

fn now() -> std::time::Instant {
    Instant::now().into_std()
}

impl Engine {
    pub(crate) fn new(
        node: Node,
        settings: Settings,
        driver: Box<dyn Driver>,
        tx: mpsc::Sender<Input>,
        state_tx: watch::Sender<DaemonState>,
    ) -> Result<Self, DaemonError> {
        let driver: Arc<dyn Driver> = Arc::from(driver);
        let driver_name = driver.name();
        let threads =
            DriverThreads::start(driver, tx.clone()).map_err(DaemonError::DriverThread)?;
        Ok(Self {
            node,
            settings,
            driver: threads,
            driver_name,
            driver_version: String::new(),
            tx,
            sessions: HashMap::new(),
            accepted: HashMap::new(),
            waiting: Waiting::default(),
            state_tx,
            goodbyes: Vec::new(),
            goodbyes_over: false,
            retired: HashMap::new(),
            closers: HashMap::new(),
            stream_closers: HashMap::new(),
            heartbeat_seq: 0,
            dial_log: HashMap::new(),
            local_ip: None,
            net: None,
            persist: None,
            me_cache: None,
            hosts_tx: None,
            metrics: crate::metrics::Events::default(),
            stats: crate::stats::Stats::default(),
            peers_tx: None,
            connected: 0,
            job_files: jobs::FromFiles::default(),
            job_waiters: Vec::new(),
        })
    }

    /// Runs until `shutdown` resolves (then says goodbye to every peer, bounded in time) or
    /// the driver is lost (an error).
    pub(crate) async fn run(
        mut self,
        mut rx: mpsc::Receiver<Input>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), DaemonError> {
        tokio::pin!(shutdown);
        let early = self.accepted_before_start(&mut rx).await;
        // Each turn's log lines go to the file in one write (`logging::batch`): a turn is
        // synchronous, so nothing is held while the engine waits.
        let mut result = crate::logging::batch(|| {
            let later = early?;
            self.node.handle_start(now());
            self.perform()?;
            for input in later {
                self.handle(input)?;
                self.perform()?;
            }
            Ok(())
        });
        let mut timer = NodeTimer::new();
        while result.is_ok() {
            timer.set(self.node.poll_timeout());
            tokio::select! {
                () = &mut shutdown => break,
                input = rx.recv() => {
                    let Some(input) = input else { return Err(DaemonError::EngineGone) };
                    result = crate::logging::batch(|| {
                        self.handle(input).and_then(|()| self.perform())
                    });
                }
                () = timer.fired() => {
                    // The session readers woken with this timer run first: what arrived while
                    // the daemon waited for the CPU counts before the liveness check.
                    tokio::task::yield_now().await;
                    let now = now();
                    result = crate::logging::batch(|| {
                        self.collect_heartbeats(now);
                        self.node.handle_timeout(now);
                        self.perform()
                    });
                }
            }
        }
        match result {
            Ok(()) => {
                self.stop(rx).await;
                Ok(())
            }
            Err(e) => {
                // No goodbye: peers must see a failure (RECOVERING), not a clean departure.
                error!("{e}");
                for (_, (_, link)) in self.sessions.drain() {
                    link.reader.abort();
                }
                Err(e)
            }
        }
    }

    /// The connections already in the peer listener's backlog when the daemon starts (peers
    /// that started first and dialled it), handed to core before its first round, which then
    /// does not dial those peers back (`openimex_core::Mesh::handle_peer_connecting`): the
    /// accept loop runs first (a yield lets the runtime poll the listener, the next lets the
    /// woken accept loop run). Any other input that came meanwhile is handled after the start,
    /// in its order, as every input was before.
    async fn accepted_before_start(
        &mut self,
        rx: &mut mpsc::Receiver<Input>,
    ) -> Result<Vec<Input>, DaemonError> {
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        let mut later = Vec::new();
        while let Ok(input) = rx.try_recv() {
            match input {
                Input::ConnAccepted { .. } => self.handle(input)?,
                other => later.push(other),
            }
        }
        Ok(later)
    }

    /// Dials leave from `ip` (the peer listener's address) instead of the routing default.
    pub(crate) fn dial_from(
        mut self,
        ip: Option<std::net::IpAddr>,
        net: Option<crate::net::MemNet>,
    ) -> Self {
        self.local_ip = ip.filter(|ip| !ip.is_unspecified());
        self.net = net;
        self
    }

    /// Keep the persist record at `path` (keyed to `map`).
    pub(crate) fn persist_to(
        mut self,
        path: Option<std::path::PathBuf>,
        map: openimex_core::NodeMap,
    ) -> Self {
        if let Some(path) = path {
            self.persist = Some(crate::persist::Writer::new(path, map, self.tx.clone()));
        }
        self
    }

    /// Count events into `metrics` (shared with the metrics server) and the stats file's
    /// figures into `stats` (shared with the sessions and the file's writer).
    pub(crate) fn count_into(
        mut self,
        metrics: crate::metrics::Events,
        stats: crate::stats::Stats,
    ) -> Self {
        self.metrics = metrics;
        self.stats = stats;
        self
    }

    /// Report how many peers are connected on `peers` (for the service manager).
    pub(crate) fn report_peers(mut self, peers: watch::Sender<crate::notify::Peers>) -> Self {
        self.peers_tx = Some(peers);
        self
    }

    /// Our hello as dials send it, without the node map's entries (`peer_client::OwnHello`).
    fn cached_identity(&mut self) -> OwnHello {
        // The identity carries the node's cliques: a clique change rebuilds it.
        if let Some(me) = &self.me_cache
            && me.identity.cliques_epoch == self.node.cliques_epoch()
        {
            return me.clone();
        }
        let me = OwnHello {
            identity: Arc::new(self.identity(false)),
            map: self.node.mesh().hello().node_map,
        };
        self.me_cache = Some(me.clone());
        me
    }

    fn identity(&self, with_map: bool) -> Identity {
        let cliques = (self.node.cliques(), self.node.cliques_epoch());
        convert::identity(
            &self.node.mesh().hello(),
            &self.driver_version,
            cliques,
            with_map,
        )
    }

    fn handle(&mut self, input: Input) -> Result<(), DaemonError> {
        self.stats.taken(input.request_kind());
        let now = now();
        match input {
            Input::Hello {
                hello,
                cliques,
                conn,
                from_node_address,
                reply,
            } => {
                let verdict = self
                    .node
                    .handle_session_hello(now, conn, from_node_address, &hello);
                if verdict == openimex_core::Verdict::Accept {
                    let from = openimex_core::PeerId {
                        node: hello.node,
                        instance: hello.instance,
                    };
                    self.node
                        .handle_peer_cliques(now, from, &cliques.0, cliques.1);
                }
                // Answer once the driver did what the hello meant (a restarted peer's memory:
                // its importers disabled here), so a recovering peer that gets our answer knows
                // we map nothing of its old instance any more.
                self.perform()?;
                let with_map = !self.node.mesh().shares_map(&hello);
                let answer = (verdict, self.identity(with_map));
                self.driver.call(Call::Then(Box::new(move || {
                    let _ = reply.send(answer);
                })));
            }
            Input::PeerCliques { via, cliques } => {
                (self.node).handle_session_cliques(now, via, &cliques.cliques, cliques.epoch);
            }
            Input::CliquesSent { peer, sent } => self.node.handle_cliques_sent(now, peer, sent),
            Input::PeerJobs { via, jobs } => self.peer_jobs(via, jobs),
            Input::JobsSent { peer, sent } => self.node.handle_jobs_sent(now, peer, sent),
            Input::JobFiles(files) => self.job_files(files),
            Input::Jobs { reply } => {
                let _ = reply.send(self.jobs_report());
            }
            Input::JobChannelClear { channel, reply } => {
                let _ = reply.send(self.channel_clear(channel));
            }
            Input::JobWait { name, want, reply } => {
                self.job_wait(jobs::JobWaiter { name, want, reply });
            }
            Input::Authenticate { via, what, reply } => {
                let ok = self.node.authenticate(via, None, what).is_some();
                let _ = reply.send(ok);
            }
            Input::ConnAccepted {
                conn,
                remote,
                closer,
            } => {
                self.closers.insert(conn, closer);
                let peer = self.node.mesh().config().map.node_at(remote.ip());
                self.node.handle_conn_accepted(now, conn, remote, peer);
            }
            Input::StreamOpened { stream, closer } => {
                self.stream_closers.insert(stream, closer);
                self.node.handle_stream_opened(now, stream);
            }
            Input::StreamHeard { stream } => {
                self.stream_closers.remove(&stream);
                self.node.handle_stream_heard(stream);
            }
            Input::ConnClosed { conn } => {
                self.closers.remove(&conn);
                if let Some((session, _)) = self.accepted.remove(&conn) {
                    session.shutdown();
                }
                self.node.handle_conn_closed(now, conn);
            }
            Input::Refused { reason, detail } => self.node.refused(reason, detail),
            Input::DialOk {
                peer,
                attempt,
                remote,
                cliques,
                link,
            } => {
                if !self.node.mesh().dial_in_flight(peer, attempt) {
                    // A late answer to a superseded attempt, which the node would only close:
                    // never let it replace the session held.
                    tracing::debug!(
                        "dial {attempt} to node {peer} answered after it was superseded: closed"
                    );
                    link.reader.abort();
                    return Ok(());
                }
                // Hold the link before the node decides, so the actions it emits find it.
                if let Some((_, old)) = self.sessions.insert(peer, (attempt, link)) {
                    old.reader.abort();
                }
                self.node.handle_dial_ok(now, peer, attempt, &remote);
                let from = openimex_core::PeerId {
                    node: remote.node,
                    instance: remote.instance,
                };
                (self.node).handle_peer_cliques(now, from, &cliques.0, cliques.1);
            }
            Input::DialFailed {
                peer,
                attempt,
                error,
            } => {
                if let DialError::Tls { reason, .. } = &error {
                    // Counted like the accepting side's refusals: a peer whose certificate we
                    // refuse (or that refuses ours) shows in `ctl --links -j` as one.
                    let host = self.host(peer).to_string();
                    self.node
                        .refused(reason, format!("node {peer} ({host}): {error}"));
                }
                let failure = error.failure();
                let error = error.to_string();
                self.log_dial_failure(peer, &error);
                self.node
                    .handle_dial_failed(now, peer, attempt, failure, error);
            }
            Input::DialRefused {
                peer,
                attempt,
                mismatch,
            } => {
                // A refusal carries its reason code only; the refusing side logs the detail.
                let detail = format!("{}; its log says what differs", mismatch.describe());
                self.node
                    .handle_dial_refused(now, peer, attempt, mismatch, detail);
            }
            Input::SessionOpened {
                conn,
                remote,
                session,
                reply,
            } => {
                // Held before the node decides, so the actions it emits find it.
                self.accepted.insert(conn, (session, remote));
                let carries = self.node.handle_session_opened(now, conn);
                if !carries && let Some((session, _)) = self.accepted.remove(&conn) {
                    session.shutdown();
                }
                let _ = reply.send(carries);
            }
            Input::SessionLost { via, reason } => match via {
                Via::Accepted { conn } => {
                    if let Some((session, _)) = self.accepted.remove(&conn) {
                        session.shutdown();
                    }
                    debug!("session on connection {conn} ended: {reason}");
                    self.node.handle_session_closed(now, conn);
                }
                Via::Dialled { .. } => self.node.handle_session_lost(now, via, reason),
            },
            Input::Goodbye {
                via,
                claimed,
                reason,
                reply,
            } => {
                let reason = convert::bounded(&reason);
                let believed = self.node.handle_session_goodbye(now, via, claimed, &reason);
                if believed {
                    // Acknowledge once the driver disabled our importers of its memory: the
                    // leaving peer releases its references when we answer.
                    self.perform()?;
                    self.driver.call(Call::Then(Box::new(move || {
                        let _ = reply.send(true);
                    })));
                } else {
                    let _ = reply.send(false);
                }
            }
            Input::GoodbyeDelivered { peer, delivered } => {
                self.node.handle_goodbye_delivered(now, peer, delivered);
            }
            Input::Snapshot { reply } => {
                let _ = reply.send(self.snapshot());
            }
            Input::Peers { reply } => {
                let _ = reply.send(PeersSnapshot {
                    local: self.settings.local,
                    state: self.node.state(),
                    peers: self.node.peer_state(),
                    now,
                    wall: std::time::SystemTime::now(),
                });
            }
            Input::PeerImport {
                via,
                claimed,
                request,
                reply,
            } => {
                let id = self.waiting.id();
                self.waiting.imports.insert(id, reply);
                self.node
                    .handle_session_import(now, id, via, claimed, request);
            }
            Input::PeerRemoteGpuAttach { via, attach, reply } => {
                let id = self.waiting.id();
                self.waiting.remote_gpu_attaches.insert(id, reply);
                self.node
                    .handle_session_remote_gpu_attach(now, id, via, None, attach);
            }
            Input::PeerUnimport {
                via,
                claimed,
                import_event_id,
                reply,
            } => {
                self.metrics.unimport_received();
                let id = self.waiting.id();
                self.waiting.unimports.insert(id, reply);
                self.node
                    .handle_session_unimport(now, id, via, claimed, import_event_id);
            }
            Input::ImportAnswered {
                exporter,
                import_event_id,
                answer,
            } => {
                if let Err(e) = &answer {
                    info!(
                        "import {import_event_id} from node {exporter} failed: {} ({})",
                        e.status.as_str(),
                        e.detail
                    );
                }
                (self.metrics).import_completed(import_event_id, answer.is_ok(), now);
                // The node sends the next import waiting for this exporter, if any.
                self.node
                    .handle_import_answer(now, exporter, import_event_id, answer);
            }
            Input::UnimportDelivered {
                exporter,
                import_event_id,
                delivered,
            } => {
                self.metrics.unimport_sent(delivered);
                (self.node).handle_unimport_delivered(now, exporter, import_event_id, delivered);
            }
            Input::Persisted { seq } => {
                if let Some(writer) = &mut self.persist {
                    writer.written(seq);
                }
            }
            Input::Driver(d) => self.handle_driver(now, d)?,
            Input::NodesFile(reread) => self.handle_reread(now, reread),
        }
        Ok(())
    }

    fn handle_driver(
        &mut self,
        now: std::time::Instant,
        input: DriverInput,
    ) -> Result<(), DaemonError> {
        match input {
            DriverInput::SessionOpen { version } => {
                info!(
                    "GPU driver {} session open as node {} (version {version})",
                    self.driver_name, self.settings.local
                );
                self.driver_version = version;
                self.me_cache = None;
                self.node.handle_driver_ready(now);
            }
            DriverInput::Event(event) => {
                debug!("driver event {event:?}");
                self.node.handle_driver_event(now, event);
            }
            DriverInput::GpuFabric(gpus) => self.node.handle_gpu_fabric(now, gpus),
            DriverInput::Described { request, result } => {
                self.node.handle_described(now, request, result);
            }
            DriverInput::RemoteGpuAttached {
                request,
                attach,
                result,
            } => self
                .node
                .handle_remote_gpu_attached(now, request, &attach, result),
            DriverInput::Released { request } => {
                if let Some(reply) = self.waiting.unimports.remove(&request) {
                    let _ = reply.send(Ok(true));
                }
            }
            DriverInput::Failed {
                call: "open session",
                error,
            } => return Err(DaemonError::Driver(error)),
            DriverInput::Failed {
                call,
                error: DriverError::Lost(why),
            } => return Err(DaemonError::DriverLost { call, why }),
            DriverInput::Failed { call, error } => warn!("driver {call} failed: {error}"),
        }
        Ok(())
    }

    /// Performs every pending action of the node.
    fn perform(&mut self) -> Result<(), DaemonError> {
        while let Some(action) = self.node.poll_action() {
            match action {
                Action::Mesh(a) => self.perform_mesh(a),
                a @ (Action::SendRemoteGpuAttach { .. }
                | Action::AttachRemoteGpu { .. }
                | Action::SetMulticastFailure { .. }
                | Action::AnswerRemoteGpuAttach { .. }) => self.perform_multicast(a),
                Action::SendImport { peer, request } => self.send_import(peer, request),
                Action::SendJobs { peer, jobs, epoch } => self.send_jobs(peer, jobs, epoch),
                a @ (Action::ReadGpuFabric
                | Action::SendCliques { .. }
                | Action::CliqueChanged { .. }
                | Action::GpuHealthChanged { .. }
                | Action::PeerCliques { .. }) => self.perform_cliques(a),
                Action::CloseConn { conn } => {
                    if let Some(closer) = self.closers.remove(&conn) {
                        closer.close();
                    }
                }
                Action::CloseStream { stream } => {
                    if let Some(closer) = self.stream_closers.remove(&stream) {
                        closer.close();
                    }
                }
                Action::EndSession { via, .. } => self.end_session(via),
                Action::GoodbyesOver { unanswered } => {
                    self.goodbyes_over = true;
                    if !unanswered.is_empty() {
                        let ms = openimex_core::node::GOODBYE_WAIT.as_millis();
                        warn!("nodes {unanswered:?} did not acknowledge the goodbye in {ms} ms");
                    }
                }
                Action::ImportNotSent {
                    import_event_id, ..
                } => (self.metrics).import_completed(import_event_id, false, now()),
                Action::SendUnimport {
                    peer,
                    import_event_id,
                } => match self.session(peer) {
                    Some(session) => {
                        peer_client::unimport(session, peer, import_event_id, self.tx.clone());
                    }
                    None => {
                        self.node
                            .handle_unimport_delivered(now(), peer, import_event_id, false)
                    }
                },
                Action::ValidateImport {
                    import_event_id,
                    result,
                } => self.call_now(Call::Validate {
                    import_event_id,
                    result,
                })?,
                Action::FinishUnimports { ids } => self.driver.call(Call::Finish { ids }),
                Action::DisableImporters { node } => {
                    self.driver.call(Call::DisableImporters { node });
                }
                Action::DescribeExport {
                    request,
                    export_uuid,
                    index,
                    channel,
                } => self.call_now(Call::Describe {
                    request,
                    export_uuid,
                    index,
                    channel,
                })?,
                Action::ReleaseExportRefs { refs, ack } => {
                    if !refs.is_empty() && ack.is_none() {
                        info!("releasing {} export references", refs.len());
                    }
                    self.driver.call(Call::Release { refs, ack });
                }
                Action::AnswerImport { request, answer } => {
                    self.metrics.import_answered(&answer);
                    if let Some(reply) = self.waiting.imports.remove(&request) {
                        match &mut self.persist {
                            Some(writer) => writer.answer(reply, answer),
                            None => {
                                let _ = reply.send(answer);
                            }
                        }
                    }
                }
                Action::Persist { importers } => {
                    if let Some(writer) = &mut self.persist {
                        writer.write(importers);
                    }
                }
                a @ (Action::RecoveryWait { .. }
                | Action::PeersWaitOver { .. }
                | Action::Recovered { .. }
                | Action::CleanedUp { .. }
                | Action::Refused { .. }) => self.log_action(a),
                Action::AnswerUnimport { request, released } => {
                    if let Some(reply) = self.waiting.unimports.remove(&request) {
                        let _ = reply.send(Ok(released));
                    }
                }
                Action::RefuseUnimport { request, reason } => {
                    if let Some(reply) = self.waiting.unimports.remove(&request) {
                        let _ = reply.send(Err(reason));
                    }
                }
            }
        }
        self.answer_job_waiters();
        Ok(())
    }

    /// Has the driver perform `call` now if it can (`DriverThreads::call_now`), handling
    /// its result at once. It blocks the runtime for the call: why that is kept, with the
    /// figures measured, is at `DriverThreads::call_now`.
    fn call_now(&mut self, call: Call) -> Result<(), DaemonError> {
        match self.driver.call_now(call) {
            Some(input) => self.handle_driver(now(), input),
            None => Ok(()),
        }
    }

    /// Sends `request` (the node admitted it under its bound on imports in flight) on the
    /// session that carries the pair with `peer`. With none here, it fails as a lost session
    /// fails it (the node's contract), and the node moves on to the next one waiting.
    fn send_import(&mut self, peer: NodeId, request: openimex_core::ImportRequest) {
        let import_event_id = request.import_event_id;
        if let Some(session) = self.session(peer) {
            self.metrics.import_sent(import_event_id, now());
            peer_client::import(session, peer, request, self.tx.clone());
            return;
        }
        let answer = Err(ImportError::new(
            openimex_core::Status::InvalidState,
            format!("node {peer} has no session here"),
        ));
        self.metrics.import_completed(import_event_id, false, now());
        (self.node).handle_import_answer(now(), peer, import_event_id, answer);
    }

    fn snapshot(&self) -> Snapshot {
        let links = self.node.links();
        let peers = links
            .iter()
            .filter(|l| l.status == ConnStatus::Connected && l.node != self.settings.local)
            .filter_map(|l| Some((l.node, self.session(l.node)?)))
            .collect();
        Snapshot {
            local: self.settings.local,
            state: self.node.state(),
            instance: self.node.mesh().config().instance,
            links,
            driver_version: self.driver_version.clone(),
            host_name: self.settings.host_name.clone(),
            refusals: self.node.refusals().collect(),
            peers,
            fabric: self.node.gpus().to_vec(),
        }
    }
}

mod cliques;
mod jobs;
mod log;
mod mesh_io;
mod multicast;
mod reload;
mod stop;
#[cfg(test)]
mod tests;
