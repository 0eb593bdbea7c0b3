//! One node of the IMEX domain as a single sans-IO state machine: its peer [`Mesh`], the
//! references it holds on its exports for remote importers, its own imports from remote
//! exporters, and every timer of the export/import lifecycle.
//!
//! # Contract
//! Like [`Mesh`], a [`Node`] performs no I/O and reads no clock. The owner feeds it inputs
//! through `handle_*(now, …)` (`now` never goes backwards), then MUST drain
//! [`Node::poll_action`] until `None` and perform every action, and MUST call
//! [`Node::handle_timeout`] once `now` reaches [`Node::poll_timeout`]. Every action that asks
//! for a result names the input that reports it:
//!
//! | action | result input |
//! |---|---|
//! | [`Action::Mesh`] `Dial` | `handle_dial_ok` / `_failed` / `_refused` |
//! | [`Action::Mesh`] `SendHeartbeat` | [`Node::handle_heartbeat`] (its answer) |
//! | [`Action::Mesh`] `InitDriver` | [`Node::handle_driver_ready`] |
//! | [`Action::SendImport`] | [`Node::handle_import_answer`] |
//! | [`Action::SendUnimport`] | [`Node::handle_unimport_delivered`] |
//! | [`Action::DescribeExport`] | [`Node::handle_described`] |
//! | [`Action::AttachRemoteGpu`] | [`Node::handle_remote_gpu_attached`] |
//! | [`Action::CloseConn`] | [`Node::handle_conn_closed`] (as for any connection) |
//! | [`Action::Mesh`] `SendGoodbye` | [`Node::handle_goodbye_delivered`] |
//! | [`Action::ReadGpuFabric`] | [`Node::handle_gpu_fabric`] (not called if the read failed) |
//! | [`Action::SendCliques`] | [`Node::handle_cliques_sent`] |
//! | [`Action::SendJobs`] | [`Node::handle_jobs_sent`] |
//!
//! The owner also reports the cliques each accepted hello and each dial's answer carried
//! ([`Node::handle_peer_cliques`]) and a peer's notification of new cliques
//! ([`Node::handle_session_cliques`]); its own hellos carry [`Node::cliques`].
//!
//! The other actions are performed in the order given; their only result is success, or the
//! loss of the driver, which ends the daemon.
//!
//! # Sessions
//! A pair of nodes shares one session, dialled by either side ([`Via`]; the rule is in the
//! mesh). Requests to a peer ([`Action::SendImport`], [`Action::SendUnimport`], status, and
//! the goodbye, which names its session) go on [`Node::session_of`]. A request for a peer with
//! no session fails as on a lost session: the owner reports it as a transport error
//! ([`Node::handle_import_answer`] with an error, [`Node::handle_unimport_delivered`] or
//! [`Node::handle_goodbye_delivered`] with `false`). Requests that arrive name the session
//! they came on; `node/sessions.rs` says who that proves. The owner reports a peer's session
//! stream opening and ending ([`Node::handle_session_opened`], [`Node::handle_session_closed`];
//! [`Node::handle_conn_closed`] ends it too) and the end of a session it dialled
//! ([`Node::handle_session_lost`]). Results may arrive late, twice, or for requests
//! the node has meanwhile given up on: each is checked against the node's own tables, so a late
//! answer never corrupts state.
//!
//! # Decisions that live here
//! - How long the owner holds something open while a peer owes it (`node/deadlines.rs`): an
//!   inbound connection's hello ([`HELLO_DEADLINE`] from [`Node::handle_conn_accepted`]), a
//!   session stream's first frame (the same, from [`Node::handle_stream_opened`]), a closed
//!   session's requests in flight ([`RETIRE_WAIT`]), the shutdown's goodbyes
//!   ([`GOODBYE_WAIT`]). And whose dial result the owner may take
//!   ([`Mesh::dial_in_flight`]).
//! - When the GPUs' fabric probes are read ([`FABRIC_REFRESH`], and at once on
//!   CLIQUE_ID_CHANGE) and which peers are told the node's new cliques (`node/cliques.rs`).
//! - Which jobs are defined here, what members are told of them, and which imports they admit
//!   (`node/jobs.rs`, over [`crate::jobs`]).
//! - Which peers SIGUSR1 dials again, from the addresses the owner resolved
//!   ([`Node::handle_nodes_file`], `node/remap.rs`).
//! - At most [`MAX_IMPORTS_IN_FLIGHT`] imports are asked of one exporter and unanswered; the
//!   rest wait in order and go as answers come, or fail when their turn comes while no session
//!   carries the pair (`node/outbox.rs`).
//! - An import whose exporter is not connected fails at once (INVALID_STATE); one that is not
//!   answered within [`NodeConfig::import_timeout`] fails then. An import that was asked and then
//!   failed (timeout, or an error that may be the transport's, after which the exporter may still
//!   have taken a reference) is handed back to the exporter as an unimport, like a success that
//!   arrives after its import was failed, so no reference leaks. An exporter that is told of an
//!   unimport while it is still describing that import releases the reference when it lands.
//! - An unimport is finished locally once the exporter confirms, or at once when the exporter is
//!   unreachable, or when the exporter does not answer within the import timeout; the exporter
//!   is told later: when its link comes back, or after another import timeout if the link
//!   stayed up (the message was lost).
//! - A node that is shutting down validates no more imports: its goodbye makes every exporter
//!   release what it holds for it, so a success that arrives after the goodbye is failed (and
//!   handed back), and new imports fail at once.
//! - A peer lost (RECOVERING) for longer than [`NodeConfig::grace`] is cleaned up as if it had
//!   left, in two steps: its memory is fenced here at once (local importers disabled), and what
//!   it held here is released a fence margin later at the least, so a peer behind a partition
//!   has fenced before its memory can be freed and reused (`node/grace.rs` says why). The
//!   matrix then shows it DISCONNECTED until it is back. The same instance back within the
//!   grace time loses nothing; a new instance is cleaned at once (below).
//! - A peer that restarted (new instance) or left (goodbye): the references held for its
//!   importers are released, imports from it that were still in flight fail, unimports waiting
//!   on it finish, and the local importers of its memory are disabled.
//! - The exporter takes a reference for an importer only while that importer's instance is the
//!   one the mesh knows and its link is CONNECTED here; a reference described for an importer
//!   that restarted meanwhile, or that was cleaned up after its grace time meanwhile, is
//!   released at once. So a lost peer's clean-up never releases a reference taken for an
//!   import it made after coming back (`node/grace.rs`).

mod action;
mod cliques;
mod deadlines;
mod exporter;
mod give_backs;
mod grace;
mod importer;
mod jobs;
mod multicast;
mod outbox;
mod peers;
mod peers_wait;
mod recovery;
mod remap;
mod sessions;

pub use action::Action;
pub use cliques::{FABRIC_REFRESH, MAX_PEER_CLIQUES, cliques_of};
pub use deadlines::{GOODBYE_WAIT, HELLO_DEADLINE, RETIRE_WAIT, StreamId};
pub use jobs::JobsChanged;
pub use outbox::MAX_IMPORTS_IN_FLIGHT;
pub use peers::{CLEANUPS_KEPT_PER_PEER, CleanUp, Cleaned, PeerState};
pub use recovery::PERSIST_LINGER;
pub use remap::{Remapped, ResolvedNodes};
pub use sessions::PeerRequest;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::fabric::{ExportRefs, Imports, UnimportStep};
use crate::gpu::{Event, ImportAnswer, ImportError, Pages, RemoteGpuAttach, Status};
use crate::ids::{InstanceId, NodeId};
use crate::mesh::{self, DialFailure, Hello, LinkView, Mesh, MeshConfig, Verdict, Via};
use crate::state::{ConnStatus, DaemonState, Mismatch};

/// Names a peer request the owner is waiting to answer; chosen by the owner, echoed in the
/// action that answers it.
pub type RequestId = u64;

/// Driver tokens or references an action names: nearly always one (an unimport finished, a
/// reference released), so up to two are held inline and such an action allocates nothing.
pub type Ids = smallvec::SmallVec<[u64; 2]>;

/// Static settings of a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The peer mesh.
    pub mesh: MeshConfig,
    /// How long an import may wait for its exporter's answer, and an unimport for its
    /// exporter's confirmation.
    pub import_timeout: Duration,
    /// Describes in flight for one importer node; more of its imports are refused until some
    /// finish ([`DEFAULT_MAX_DESCRIBES_PER_PEER`]).
    pub max_describes_per_peer: usize,
    /// `IMEX_NODE_DISCONNECTED_GRACE_TIME`: how long a lost peer may stay away before its
    /// imports and exports are cleaned up here; `None` waits for it forever (NVIDIA's default
    /// -1), zero cleans up at once.
    pub grace: Option<Duration>,
    /// Nodes the persist record of the previous run lists as holding references to this node's
    /// memory (only with `IMEX_WAIT_FOR_QUORUM=RECOVERY`; empty: nothing to recover).
    pub recover_from: Vec<NodeId>,
    /// How long the recovery gate waits for them when the grace time is forever.
    pub recovery_wait: Duration,
    /// `IMEX_CONN_WAIT_TIMEOUT`: the longest the FULL quorum waits at start for every peer;
    /// then the node goes on without the missing ones ([`Action::PeersWaitOver`]). `None` waits
    /// until all are connected. It does not shorten the recovery gate (`node/peers_wait.rs`).
    pub conn_wait_timeout: Option<Duration>,
}

/// The default of [`NodeConfig::recovery_wait`].
pub const DEFAULT_RECOVERY_WAIT: Duration = Duration::from_secs(300);

/// The default of [`NodeConfig::max_describes_per_peer`].
pub const DEFAULT_MAX_DESCRIBES_PER_PEER: usize = 4096;

/// Who a peer request says it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerId {
    /// Its node.
    pub node: NodeId,
    /// Its instance.
    pub instance: InstanceId,
}

/// An import asked of an exporter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportRequest {
    /// The importer's MEM_IMPORT event ID (names the import in its unimport).
    pub import_event_id: u64,
    /// Export UUID.
    pub export_uuid: [u8; 16],
    /// Handle index.
    pub index: u16,
    /// The importer's channel.
    pub channel: u32,
}

/// A lifecycle timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Timer {
    /// The import's answer is due.
    Import(u64),
    /// The unimport's confirmation from this exporter is due.
    Unimport(NodeId, u64),
    /// Retry the unimports this exporter was not told of, though its link stayed up.
    Redeliver(NodeId),
    /// The lost peer's grace time is over: fence its memory here.
    Grace(NodeId),
    /// The fence margin after that is over too (and any hello of the peer we answered has
    /// settled, `node/grace.rs`): release what the peer held here.
    GraceRelease(NodeId),
    /// The recovery gate stops waiting.
    RecoveryOver,
    /// Name the nodes the recovery gate still waits for.
    RecoveryLog,
    /// Drop the nodes that no longer hold references from the persist record.
    PersistPrune,
    /// The FULL quorum's wait for peers ends (`IMEX_CONN_WAIT_TIMEOUT`).
    PeersWaitOver,
    /// The inbound connection's hello is due (`node/deadlines.rs`).
    Hello(crate::ids::ConnId),
    /// The session stream's first frame is due (`node/deadlines.rs`).
    StreamHello(StreamId),
    /// The closed session's retirement is over (`node/deadlines.rs`).
    Retire(NodeId, Via),
    /// Shutdown stops waiting for the goodbyes (`node/deadlines.rs`).
    GoodbyeWait,
    /// Read the GPUs' fabric probes again (`node/cliques.rs`).
    FabricRefresh,
}

/// A describe in flight for a peer's import.
#[derive(Debug, Clone, Copy)]
struct Describing {
    importer: PeerId,
    import_event_id: u64,
    /// The importer unimported (gave up on) the import meanwhile.
    cancelled: bool,
}

/// The node. See the module contract.
#[derive(Debug)]
pub struct Node {
    mesh: Mesh,
    import_timeout: Duration,
    exports: ExportRefs,
    imports: Imports,
    describing: HashMap<RequestId, Describing>,
    /// Unimports sent to an exporter, by (exporter, import): the token to finish once it
    /// confirms (`None` for a late delivery whose token was finished already).
    unimports: HashMap<(NodeId, u64), Option<u64>>,
    /// Imports failed by their timeout, with the exporter instance then: a success that still
    /// arrives from that instance is handed back.
    abandoned: HashMap<u64, (NodeId, InstanceId)>,
    /// Give-backs that found nothing held here: their late requests are refused.
    give_backs: give_backs::GiveBacks,
    timers: BTreeSet<(Instant, Timer)>,
    deadlines: HashMap<Timer, Instant>,
    actions: VecDeque<Action>,
    sessions: sessions::Sessions,
    max_describes_per_peer: usize,
    grace: Option<Duration>,
    /// Lost peers cleaned up after their grace time, until they are back.
    cleaned: HashMap<NodeId, Duration>,
    /// When we last accepted a peer's hello: it may count the pair as connected from our
    /// answer, up to a dial timeout later (`node/grace.rs`).
    answered: HashMap<NodeId, Instant>,
    cleanups: peers::CleanupLog,
    /// Imports in flight to each exporter under the bound, and those waiting for a slot.
    outbox: outbox::Outbox,
    /// What each entry of the nodes file resolved to at the last read (`node/remap.rs`).
    resolved: Vec<Vec<std::net::IpAddr>>,
    /// Connections waiting for their hello, and the shutdown's goodbyes (`node/deadlines.rs`).
    owed: deadlines::Deadlines,
    /// The node's GPUs on the fabric, its cliques and its peers' (`node/cliques.rs`).
    cliques: cliques::Cliques,
    /// The jobs defined here, and whom they were told to (`node/jobs.rs`).
    jobs: crate::jobs::Jobs,
    jobs_told: jobs::JobsTold,
    recovery: recovery::Recovery,
    recovery_wait: Duration,
    conn_wait_timeout: Option<Duration>,
}

impl Node {
    /// A node in INITIALIZING. Nothing happens before [`Node::handle_start`].
    pub fn new(cfg: NodeConfig, now: Instant) -> Self {
        Self {
            jobs: crate::jobs::Jobs::new(cfg.mesh.local),
            jobs_told: jobs::JobsTold::new(),
            mesh: Mesh::new(cfg.mesh, now),
            import_timeout: cfg.import_timeout,
            exports: ExportRefs::default(),
            imports: Imports::default(),
            describing: HashMap::new(),
            unimports: HashMap::new(),
            abandoned: HashMap::new(),
            give_backs: give_backs::GiveBacks::default(),
            timers: BTreeSet::new(),
            deadlines: HashMap::new(),
            actions: VecDeque::new(),
            sessions: sessions::Sessions::default(),
            max_describes_per_peer: cfg.max_describes_per_peer,
            grace: cfg.grace,
            cleaned: HashMap::new(),
            answered: HashMap::new(),
            cleanups: peers::CleanupLog::default(),
            outbox: outbox::Outbox::default(),
            resolved: Vec::new(),
            owed: deadlines::Deadlines::default(),
            cliques: cliques::Cliques::default(),
            recovery: recovery::Recovery::new(&cfg.recover_from),
            recovery_wait: cfg.recovery_wait,
            conn_wait_timeout: cfg.conn_wait_timeout,
        }
    }

    // ---- getters -------------------------------------------------------------------------

    /// See [`Mesh::set_heartbeat_phase`].
    pub fn set_heartbeat_phase(&mut self, phase: Instant) {
        self.mesh.set_heartbeat_phase(phase);
    }

    /// The peer mesh (links, daemon state, identity).
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The daemon state.
    pub fn state(&self) -> DaemonState {
        match self.mesh.state() {
            DaemonState::InitGpu if self.recovering() => DaemonState::WaitingForRecovery,
            s => s,
        }
    }

    /// This node's row of the matrix. A lost peer cleaned up after its grace time shows as
    /// DISCONNECTED (NVIDIA's `D`), not RECOVERING, until it is back.
    pub fn links(&self) -> Vec<LinkView> {
        let mut links = self.mesh.links();
        for l in &mut links {
            if self.is_awaited(l.node) {
                l.reason = format!(
                    "{}; awaited for recovery: it held references to this node's memory before \
                     the previous daemon's unclean exit",
                    l.reason
                );
            }
            if let Some(grace) = self.cleaned.get(&l.node)
                && l.status == ConnStatus::Recovering
            {
                l.status = ConnStatus::Disconnected;
                l.reason = format!(
                    "{}; cleaned up after the grace time ({} s)",
                    l.reason,
                    grace.as_secs()
                );
            }
        }
        links
    }

    /// References held on local exports for remote importers.
    pub fn export_refs_held(&self) -> usize {
        self.exports.len()
    }

    /// Imports from remote exporters known here (in flight or held).
    pub fn imports_known(&self) -> usize {
        self.imports.len()
    }

    /// Describes in flight for peers' imports.
    pub fn describes_in_flight(&self) -> usize {
        self.describing.len()
    }

    // ---- mesh inputs ---------------------------------------------------------------------

    /// Listeners are bound: start dialling.
    pub fn handle_start(&mut self, now: Instant) {
        self.start_recovery(now);
        self.mesh.handle_start(now);
        self.start_peers_wait(now);
        self.cliques_start(now);
        self.absorb_mesh(now);
    }

    /// The driver session is open.
    pub fn handle_driver_ready(&mut self, now: Instant) {
        self.mesh.handle_driver_ready(now);
        self.absorb_mesh(now);
    }

    /// SIGTERM/SIGINT/SIGQUIT: goodbye to every peer.
    ///
    /// A clean stop: local imports still waiting for an exporter fail and local releasers are
    /// not kept waiting (every exporter is told by the goodbye). The references held for a
    /// peer's importers are released once that peer acknowledged the goodbye (it has disabled
    /// its importers of our memory then: [`Node::handle_goodbye_delivered`]); those of a peer
    /// that could not be told stay held, so the driver sees them dangling at session close and
    /// keeps fabric allocation disabled until a daemon recovers them (docs/reference/driver-interface.md §4).
    pub fn handle_shutdown(&mut self, now: Instant) {
        let first = self.goodbyes_start();
        self.mesh.handle_shutdown(now);
        self.absorb_mesh(now);
        if first {
            self.goodbyes_sent(now);
        }
        // Stopping, the record is brought to the truth at once (no linger).
        self.sync_persist(now);
        let mut finish = Vec::new();
        let peers: Vec<NodeId> = self.mesh.config().map.ids().collect();
        for peer in peers {
            let drained = self.imports.drain_exporter(peer);
            for import_event_id in drained.unanswered {
                self.disarm(Timer::Import(import_event_id));
                self.actions.push_back(Action::ValidateImport {
                    import_event_id,
                    result: Err(Status::InvalidState),
                });
            }
            finish.extend(drained.finish);
        }
        let waiting: Vec<(NodeId, u64)> = self.unimports.keys().copied().collect();
        for key in waiting {
            self.disarm(Timer::Unimport(key.0, key.1));
            if let Some(Some(token)) = self.unimports.remove(&key) {
                finish.push(token);
            }
        }
        if !finish.is_empty() {
            finish.sort_unstable();
            self.actions
                .push_back(Action::FinishUnimports { ids: finish.into() });
        }
    }

    /// Our goodbye reached `peer` and it acknowledged (`delivered`), or not. Acknowledged, the
    /// references held for its importers are released.
    pub fn handle_goodbye_delivered(&mut self, now: Instant, peer: NodeId, delivered: bool) {
        self.goodbye_reported(peer);
        if !delivered {
            return;
        }
        let refs = self.exports.drain_node(peer);
        if !refs.is_empty() {
            self.release(now, refs.into(), None);
        }
    }

    /// See [`Mesh::handle_dial_ok`].
    pub fn handle_dial_ok(&mut self, now: Instant, peer: NodeId, attempt: u64, remote: &Hello) {
        self.mesh.handle_dial_ok(now, peer, attempt, remote);
        self.absorb_mesh(now);
    }

    /// See [`Mesh::handle_dial_failed`].
    pub fn handle_dial_failed(
        &mut self,
        now: Instant,
        peer: NodeId,
        attempt: u64,
        failure: DialFailure,
        error: String,
    ) {
        self.mesh
            .handle_dial_failed(now, peer, attempt, failure, error);
        self.absorb_mesh(now);
    }

    /// See [`Mesh::handle_dial_refused`].
    pub fn handle_dial_refused(
        &mut self,
        now: Instant,
        peer: NodeId,
        attempt: u64,
        mismatch: Mismatch,
        detail: String,
    ) {
        self.mesh
            .handle_dial_refused(now, peer, attempt, mismatch, detail);
        self.absorb_mesh(now);
    }

    /// See [`Mesh::handle_heartbeat`]: a heartbeat or its answer on session `via`.
    pub fn handle_heartbeat(&mut self, now: Instant, via: Via) {
        self.mesh.handle_heartbeat(now, via);
        self.absorb_mesh(now);
    }

    /// See [`Mesh::handle_session_lost`]: session `via` ended. For an accepted session whose
    /// stream ended, [`Node::handle_session_closed`] says the same.
    pub fn handle_session_lost(&mut self, now: Instant, via: Via, reason: String) {
        self.mesh.handle_session_lost(now, via, reason);
        self.absorb_mesh(now);
    }

    /// Where requests to `peer` go now: see [`Mesh::session_of`].
    pub fn session_of(&self, peer: NodeId) -> Option<Via> {
        self.mesh.session_of(peer)
    }

    /// See [`Mesh::handle_goodbye`].
    pub fn handle_goodbye(&mut self, now: Instant, from: PeerId, reason: &str) {
        self.mesh
            .handle_goodbye(now, from.node, from.instance, reason);
        self.absorb_mesh(now);
    }

    /// See [`Mesh::handle_hello`].
    pub fn handle_hello(&mut self, now: Instant, remote: &Hello) -> Verdict {
        let verdict = self.mesh.handle_hello(now, remote);
        self.absorb_mesh(now);
        if verdict == Verdict::Accept {
            self.answered_hello(now, remote.node);
        }
        verdict
    }

    // ---- time ----------------------------------------------------------------------------

    /// Timers due at `now`: the mesh's, import answers, unimport confirmations.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.mesh.poll_timeout().is_some_and(|t| t <= now) {
            self.mesh.handle_timeout(now);
            self.absorb_mesh(now);
        }
        while let Some(&(at, timer)) = self.timers.first() {
            if at > now {
                break;
            }
            self.disarm(timer);
            match timer {
                Timer::Import(id) => self.import_timed_out(now, id),
                Timer::Unimport(exporter, id) => {
                    // Do not keep the releaser waiting; tell the exporter when it is back.
                    self.handle_unimport_delivered(now, exporter, id, false);
                }
                Timer::Redeliver(exporter) => {
                    if self.connected(exporter).is_some() {
                        self.flush_undelivered(now, exporter);
                    }
                }
                Timer::Grace(peer) => self.grace_over(now, peer),
                Timer::GraceRelease(peer) => self.grace_release(now, peer),
                Timer::RecoveryOver => self.recovery_over(),
                Timer::RecoveryLog => self.recovery_log(now),
                Timer::PersistPrune => self.prune_persist(),
                Timer::PeersWaitOver => self.peers_wait_over(now),
                Timer::Hello(conn) => self.hello_overdue(conn),
                Timer::StreamHello(stream) => self.stream_overdue(stream),
                Timer::Retire(peer, via) => self.retire_over(peer, via),
                Timer::GoodbyeWait => self.goodbye_wait_over(),
                Timer::FabricRefresh => {
                    self.fabric_refresh(now);
                    self.jobs_refresh();
                }
            }
        }
    }

    /// The next action to perform.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Node::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mine = self.timers.first().map(|(at, _)| *at);
        match (self.mesh.poll_timeout(), mine) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ---- internals -----------------------------------------------------------------------

    /// Moves the mesh's actions out, adding what each means for exports and imports.
    fn absorb_mesh(&mut self, now: Instant) {
        while let Some(action) = self.mesh.poll_action() {
            let follow = match &action {
                mesh::Action::PeerRestarted { peer, new, .. } => Some((*peer, Some(*new), false)),
                mesh::Action::PeerLeft { peer, .. } => Some((*peer, None, false)),
                mesh::Action::LinkChanged {
                    peer,
                    to: ConnStatus::Connected,
                    ..
                } => Some((*peer, None, true)),
                _ => None,
            };
            // Lost: the link is retried, or a connected pair's next handshake was refused (a
            // peer whose map no longer holds this node, issue 31: it is gone as surely).
            let lost = match &action {
                mesh::Action::LinkChanged {
                    peer,
                    to: ConnStatus::Recovering,
                    ..
                }
                | mesh::Action::LinkChanged {
                    peer,
                    from: ConnStatus::Connected,
                    to: ConnStatus::Mismatch(_),
                    ..
                } => Some(*peer),
                _ => None,
            };
            let Some(action) = self.gate(action) else {
                continue;
            };
            match &action {
                mesh::Action::CloseSession { peer, via } => self.session_closing(now, *peer, *via),
                mesh::Action::SendGoodbye { peer, .. } => self.goodbye_sent(*peer),
                _ => {}
            }
            self.actions.push_back(Action::Mesh(action));
            match follow {
                Some((peer, _, true)) => {
                    self.recovery_link_up(peer);
                    // Back (the same instance, or a restart already cleaned): no grace running.
                    // References not yet released after a fence stay: the peer's own unimports
                    // release them (it fenced too), or its importers are still live.
                    self.disarm(Timer::Grace(peer));
                    self.disarm(Timer::GraceRelease(peer));
                    self.cleaned.remove(&peer);
                    self.flush_undelivered(now, peer);
                    self.cliques_link_up(peer);
                    self.jobs_link_up(peer);
                }
                Some((peer, current, false)) => {
                    let reason = if current.is_some() {
                        "restarted"
                    } else {
                        "left"
                    };
                    self.disarm(Timer::Grace(peer));
                    self.disarm(Timer::GraceRelease(peer));
                    // That instance's answers no longer matter: it is gone.
                    self.answered.remove(&peer);
                    self.jobs_peer_gone(peer);
                    // Its references went with it (a restart) or it released them (a goodbye).
                    let (_, cleaned) = self.peer_gone(now, peer, current);
                    self.record_cleanup(now, peer, reason, cleaned);
                }
                None => {}
            }
            if let (Some(peer), Some(grace)) = (lost, self.grace) {
                self.arm(now + grace, Timer::Grace(peer));
                if grace.is_zero() {
                    self.disarm(Timer::Grace(peer));
                    self.grace_over(now, peer);
                }
            }
        }
        self.cliques_carriers();
        self.jobs_carriers();
    }

    /// Shutting down: goodbyes are sent, so exporters release what they hold for us.
    fn stopping(&self) -> bool {
        self.mesh.state() == DaemonState::ShuttingDown
    }

    /// The instance of `peer` whose link is connected now.
    fn connected(&self, peer: NodeId) -> Option<InstanceId> {
        match self.mesh.peer(peer) {
            Some((ConnStatus::Connected, instance)) => instance,
            _ => None,
        }
    }

    /// Whether `from` is the instance of that node the mesh knows (it handshook with us).
    fn knows(&self, from: PeerId) -> bool {
        self.mesh
            .peer(from.node)
            .is_some_and(|(_, known)| known == Some(from.instance))
    }

    fn arm(&mut self, at: Instant, timer: Timer) {
        self.disarm(timer);
        self.deadlines.insert(timer, at);
        self.timers.insert((at, timer));
    }

    fn disarm(&mut self, timer: Timer) {
        if let Some(at) = self.deadlines.remove(&timer) {
            self.timers.remove(&(at, timer));
        }
    }

    fn release(&mut self, now: Instant, refs: Ids, ack: Option<RequestId>) {
        self.actions
            .push_back(Action::ReleaseExportRefs { refs, ack });
        self.sync_persist(now);
    }
}
