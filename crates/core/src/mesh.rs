//! The mesh engine of one daemon: its links to every peer, the handshake verdicts, liveness,
//! reconnect backoff, quorum and the daemon state.
//!
//! # Contract
//! [`Mesh`] performs no I/O and reads no clock. The owner feeds it inputs through the
//! `handle_*` methods (each takes `now`, which must never go backwards), then MUST drain
//! [`Mesh::poll_action`] until it returns `None` and act on every action before feeding the
//! next input, and MUST call [`Mesh::handle_timeout`] once `now` reaches
//! [`Mesh::poll_timeout`]. Results of a [`Action::Dial`] are reported with the `attempt` it
//! carried; results of superseded attempts are ignored, so late answers cannot corrupt state.
//!
//! Each daemon dials every peer (as NVIDIA's does: "Creating gRPC channels to all peers"), so a
//! pair has two sessions; a node's row of the matrix is its view of its own outbound sessions.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::backoff::{Backoff, Rng};
use crate::ids::{InstanceId, NodeId};
use crate::nodemap::NodeMap;
use crate::state::{ConnStatus, DaemonState, Mismatch};

/// When the daemon may become READY (`IMEX_WAIT_FOR_QUORUM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuorumPolicy {
    /// Never wait for peers.
    None,
    /// Wait for importers of a previous unclean run. Nothing is imported in a control-plane-only
    /// domain, so this waits for nobody until export/import state is persisted.
    Recovery,
    /// Wait until every peer is connected (WAITING_FOR_PEERS).
    Full,
}

/// Static settings of a mesh.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    /// This node.
    pub local: NodeId,
    /// Every node of the domain.
    pub map: NodeMap,
    /// Domain ID sent in and required of every handshake.
    pub domain_id: String,
    /// This daemon instance.
    pub instance: InstanceId,
    /// Wire protocol version.
    pub protocol_version: u32,
    /// Start-up quorum.
    pub quorum: QuorumPolicy,
    /// Heartbeat period on every outbound session.
    pub heartbeat_interval: Duration,
    /// A session with no heartbeat answer for this long is dead (a hung peer).
    pub peer_timeout: Duration,
    /// Reconnect policy.
    pub backoff: Backoff,
    /// Seed of the jitter generator.
    pub seed: u64,
}

/// What a daemon says about itself in a handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Sender's domain ID.
    pub domain_id: String,
    /// Sender's node ID.
    pub node: NodeId,
    /// Sender's instance.
    pub instance: InstanceId,
    /// Sender's node-map digest.
    pub digest: String,
    /// Sender's node map (to explain a mismatch).
    pub node_map: Vec<String>,
    /// Sender's protocol version.
    pub protocol_version: u32,
}

/// The answer to an inbound handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Talk.
    Accept,
    /// This daemon is shutting down: answer "unavailable", so the caller treats it as a failed
    /// dial (its link keeps showing our departure) rather than as a mismatch.
    ShuttingDown,
    /// Refuse, with the reason the caller shows in `ctl`.
    Refuse {
        /// What differs.
        mismatch: Mismatch,
        /// Human-readable detail.
        detail: String,
    },
}

/// What the owner must do. See the module contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Connect to `peer`, handshake, open a session; report with `handle_dial_*`.
    Dial {
        /// Target.
        peer: NodeId,
        /// Echo back in the result.
        attempt: u64,
    },
    /// Send a heartbeat on the outbound session to `peer`.
    SendHeartbeat {
        /// Target.
        peer: NodeId,
    },
    /// Drop the outbound session of this attempt.
    CloseSession {
        /// Target.
        peer: NodeId,
        /// The session's attempt.
        attempt: u64,
    },
    /// Send a goodbye to `peer` (clean shutdown).
    SendGoodbye {
        /// Target.
        peer: NodeId,
    },
    /// A link changed state (log it).
    LinkChanged {
        /// The peer.
        peer: NodeId,
        /// Old state.
        from: ConnStatus,
        /// New state.
        to: ConnStatus,
        /// Why.
        reason: String,
        /// How many times this link has been established since start.
        times_connected: u32,
    },
    /// A peer restarted: whatever its old instance imported or exported is gone.
    PeerRestarted {
        /// The peer.
        peer: NodeId,
        /// Instance seen before.
        old: InstanceId,
        /// Instance now.
        new: InstanceId,
    },
    /// A peer left cleanly (its goodbye was accepted): its importers and exports are ending.
    PeerLeft {
        /// The peer.
        peer: NodeId,
        /// The instance that left.
        instance: InstanceId,
    },
    /// The daemon state changed.
    StateChanged {
        /// Old state.
        from: DaemonState,
        /// New state.
        to: DaemonState,
    },
    /// Open the GPU driver session; then call [`Mesh::handle_driver_ready`].
    InitDriver,
}

/// Where the outbound connection to a peer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialer {
    /// Nothing scheduled (shutting down, or before start).
    Idle,
    /// Waiting for the result of this attempt.
    InFlight,
    /// Next attempt at this time.
    Waiting(Instant),
    /// Session up.
    Session {
        last_rx: Instant,
        next_heartbeat: Instant,
    },
}

/// One peer as this node sees it.
#[derive(Debug, Clone)]
struct Link {
    status: ConnStatus,
    reason: String,
    since: Instant,
    changed: bool,
    dialer: Dialer,
    attempt: u64,
    failures: u32,
    last_error: Option<String>,
    instance: Option<InstanceId>,
    times_connected: u32,
}

/// A read-only view of one link, for the command service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkView {
    /// The peer (or this node, for the diagonal).
    pub node: NodeId,
    /// The cell.
    pub status: ConnStatus,
    /// Whether the state ever changed since start (NVIDIA's `changed`).
    pub changed: bool,
    /// Why it last changed.
    pub reason: String,
    /// The last failed attempt's error, if the link is not connected.
    pub last_error: Option<String>,
    /// When it last changed.
    pub since: Instant,
    /// The peer's instance, once known.
    pub instance: Option<InstanceId>,
}

/// The engine. See the module contract.
#[derive(Debug)]
pub struct Mesh {
    cfg: MeshConfig,
    state: DaemonState,
    links: Vec<Option<Link>>,
    actions: VecDeque<Action>,
    rng: Rng,
    started_at: Instant,
}

impl Mesh {
    /// A mesh in INITIALIZING. Nothing is dialled before [`Mesh::handle_start`].
    pub fn new(cfg: MeshConfig, now: Instant) -> Self {
        let links = cfg
            .map
            .ids()
            .map(|id| {
                (id != cfg.local).then(|| Link {
                    status: ConnStatus::NeverConnected,
                    reason: "not connected yet".to_string(),
                    since: now,
                    changed: false,
                    dialer: Dialer::Idle,
                    attempt: 0,
                    failures: 0,
                    last_error: None,
                    instance: None,
                    times_connected: 0,
                })
            })
            .collect();
        let rng = Rng::new(cfg.seed);
        Self {
            cfg,
            state: DaemonState::Initializing,
            links,
            actions: VecDeque::new(),
            rng,
            started_at: now,
        }
    }

    // ---- getters -------------------------------------------------------------------------

    /// The daemon state.
    pub fn state(&self) -> DaemonState {
        self.state
    }

    /// Static settings.
    pub fn config(&self) -> &MeshConfig {
        &self.cfg
    }

    /// This node's handshake identity.
    pub fn hello(&self) -> Hello {
        Hello {
            domain_id: self.cfg.domain_id.clone(),
            node: self.cfg.local,
            instance: self.cfg.instance,
            digest: self.cfg.map.digest().to_string(),
            node_map: self.cfg.map.hosts().to_vec(),
            protocol_version: self.cfg.protocol_version,
        }
    }

    /// This node's row: every node, itself included, in ID order.
    pub fn links(&self) -> Vec<LinkView> {
        self.cfg
            .map
            .ids()
            .map(|id| match self.link(id) {
                Some(l) => LinkView {
                    node: id,
                    status: l.status,
                    changed: l.changed,
                    reason: l.reason.clone(),
                    last_error: (l.status != ConnStatus::Connected)
                        .then(|| l.last_error.clone())
                        .flatten(),
                    since: l.since,
                    instance: l.instance,
                },
                None => LinkView {
                    node: id,
                    status: ConnStatus::Connected,
                    changed: true,
                    reason: "this node".to_string(),
                    last_error: None,
                    since: self.started_at,
                    instance: Some(self.cfg.instance),
                },
            })
            .collect()
    }

    /// How this node sees `peer` right now: its state and the instance it handshook with
    /// (`None` for this node itself or an unknown ID).
    pub fn peer(&self, peer: NodeId) -> Option<(ConnStatus, Option<InstanceId>)> {
        self.link(peer).map(|l| (l.status, l.instance))
    }

    /// Number of peers whose link is CONNECTED.
    pub fn connected_peers(&self) -> usize {
        self.links
            .iter()
            .flatten()
            .filter(|l| l.status == ConnStatus::Connected)
            .count()
    }

    // ---- lifecycle inputs ----------------------------------------------------------------

    /// Listeners are bound: start dialling every peer and move towards READY.
    pub fn handle_start(&mut self, now: Instant) {
        if self.state != DaemonState::Initializing {
            return;
        }
        for id in self.peer_ids() {
            self.dial(id);
        }
        match self.cfg.quorum {
            QuorumPolicy::Full => self.set_state(DaemonState::WaitingForPeers),
            QuorumPolicy::None | QuorumPolicy::Recovery => self.enter_init_gpu(),
        }
        self.check_quorum();
        let _ = now;
    }

    /// The driver session is open: READY.
    pub fn handle_driver_ready(&mut self, _now: Instant) {
        if self.state == DaemonState::InitGpu {
            self.set_state(DaemonState::Ready);
        }
    }

    /// SIGTERM/SIGINT/SIGQUIT: say goodbye on every live session and stop dialling.
    pub fn handle_shutdown(&mut self, _now: Instant) {
        if self.state == DaemonState::ShuttingDown {
            return;
        }
        self.set_state(DaemonState::ShuttingDown);
        for id in self.peer_ids() {
            let Some(link) = self.link_mut(id) else {
                continue;
            };
            let had_session = matches!(link.dialer, Dialer::Session { .. });
            link.dialer = Dialer::Idle;
            if had_session {
                self.actions.push_back(Action::SendGoodbye { peer: id });
            }
        }
    }

    // ---- dial results --------------------------------------------------------------------

    /// The dial of `attempt` reached the peer, which accepted our hello and answered with its
    /// own; the session is open. The peer's identity is checked here too, so a refusal is
    /// mutual even if only one side noticed.
    pub fn handle_dial_ok(&mut self, now: Instant, peer: NodeId, attempt: u64, remote: &Hello) {
        if !self.is_current(peer, attempt, Dialer::InFlight) {
            self.actions
                .push_back(Action::CloseSession { peer, attempt });
            return;
        }
        if let Verdict::Refuse { mismatch, detail } = self.judge(remote, Some(peer)) {
            self.actions
                .push_back(Action::CloseSession { peer, attempt });
            self.fail_attempt(now, peer, ConnStatus::Mismatch(mismatch), detail);
            return;
        }
        self.note_instance(peer, remote.instance);
        let interval = self.cfg.heartbeat_interval;
        let Some(link) = self.link_mut(peer) else {
            return;
        };
        link.failures = 0;
        link.last_error = None;
        link.times_connected += 1;
        link.dialer = Dialer::Session {
            last_rx: now,
            next_heartbeat: now + interval,
        };
        let reason = format!("handshake accepted (instance {})", remote.instance);
        self.set_status(now, peer, ConnStatus::Connected, reason);
        self.check_quorum();
    }

    /// The dial of `attempt` failed before a session (refused connection, timeout, DNS).
    /// The link keeps its state; the error is kept for `ctl` and the next attempt is scheduled.
    pub fn handle_dial_failed(&mut self, now: Instant, peer: NodeId, attempt: u64, error: String) {
        if !self.is_current(peer, attempt, Dialer::InFlight) {
            return;
        }
        if let Some(link) = self.link_mut(peer) {
            link.last_error = Some(error);
        }
        self.schedule_retry(now, peer);
    }

    /// The peer refused our hello.
    pub fn handle_dial_refused(
        &mut self,
        now: Instant,
        peer: NodeId,
        attempt: u64,
        mismatch: Mismatch,
        detail: String,
    ) {
        if !self.is_current(peer, attempt, Dialer::InFlight) {
            return;
        }
        self.fail_attempt(
            now,
            peer,
            ConnStatus::Mismatch(mismatch),
            format!("peer refused: {detail}"),
        );
    }

    /// A heartbeat answer arrived on the session of `attempt`.
    pub fn handle_heartbeat(&mut self, now: Instant, peer: NodeId, attempt: u64) {
        if let Some(link) = self.link_mut(peer)
            && link.attempt == attempt
            && let Dialer::Session { last_rx, .. } = &mut link.dialer
        {
            *last_rx = now;
        }
    }

    /// The session of `attempt` ended (stream closed or errored).
    pub fn handle_session_lost(
        &mut self,
        now: Instant,
        peer: NodeId,
        attempt: u64,
        reason: String,
    ) {
        let Some(link) = self.link(peer) else { return };
        if link.attempt != attempt || !matches!(link.dialer, Dialer::Session { .. }) {
            return;
        }
        self.lose(now, peer, format!("connection lost: {reason}"));
    }

    /// The peer said goodbye (clean shutdown), on either session. Ignored when `instance` is not
    /// the one we know: a stale goodbye must not take down a restarted peer's link.
    pub fn handle_goodbye(
        &mut self,
        now: Instant,
        peer: NodeId,
        instance: InstanceId,
        reason: &str,
    ) {
        let Some(link) = self.link(peer) else { return };
        if link.instance.is_some_and(|known| known != instance) {
            return;
        }
        let attempt = link.attempt;
        if matches!(link.dialer, Dialer::Session { .. }) {
            self.actions
                .push_back(Action::CloseSession { peer, attempt });
        }
        self.set_status(
            now,
            peer,
            ConnStatus::Disconnected,
            format!("peer said goodbye: {reason}"),
        );
        self.actions.push_back(Action::PeerLeft { peer, instance });
        if self.state != DaemonState::ShuttingDown {
            // It may come back (restart); retry slowly from the start of the backoff.
            if let Some(link) = self.link_mut(peer) {
                link.failures = 0;
            }
            self.schedule_retry(now, peer);
        }
    }

    /// An inbound hello. Returns the verdict to answer with. A refusal changes nothing here:
    /// anyone who can reach the port can send a hello naming a real peer, so only our own dial
    /// to the address in the node map may mark a link mismatched. An accepted peer whose link
    /// is waiting for a retry is dialled at once: it is evidently up, so formation and recovery
    /// do not wait out a backoff.
    pub fn handle_hello(&mut self, now: Instant, remote: &Hello) -> Verdict {
        let _ = now;
        if self.state == DaemonState::ShuttingDown {
            return Verdict::ShuttingDown;
        }
        let verdict = self.judge(remote, None);
        if verdict == Verdict::Accept {
            self.note_instance(remote.node, remote.instance);
            if let Some(link) = self.link(remote.node)
                && matches!(link.dialer, Dialer::Waiting(_))
            {
                self.dial(remote.node);
            }
        }
        verdict
    }

    /// Timers: heartbeats to send, dead sessions, retries due.
    pub fn handle_timeout(&mut self, now: Instant) {
        let timeout = self.cfg.peer_timeout;
        let interval = self.cfg.heartbeat_interval;
        for id in self.peer_ids() {
            let Some(link) = self.link_mut(id) else {
                continue;
            };
            match &mut link.dialer {
                Dialer::Waiting(at) if *at <= now => self.dial(id),
                Dialer::Session {
                    last_rx,
                    next_heartbeat,
                } => {
                    if now.saturating_duration_since(*last_rx) >= timeout {
                        let ms = timeout.as_millis();
                        self.lose(now, id, format!("no heartbeat answer for {ms} ms"));
                    } else if *next_heartbeat <= now {
                        *next_heartbeat = now + interval;
                        self.actions.push_back(Action::SendHeartbeat { peer: id });
                    }
                }
                _ => {}
            }
        }
    }

    // ---- outputs -------------------------------------------------------------------------

    /// The next action to perform.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Mesh::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timeout = self.cfg.peer_timeout;
        self.links
            .iter()
            .flatten()
            .filter_map(|l| match l.dialer {
                Dialer::Waiting(at) => Some(at),
                Dialer::Session {
                    last_rx,
                    next_heartbeat,
                } => Some(next_heartbeat.min(last_rx + timeout)),
                Dialer::Idle | Dialer::InFlight => None,
            })
            .min()
    }

    // ---- internals -----------------------------------------------------------------------

    fn peer_ids(&self) -> Vec<NodeId> {
        self.cfg
            .map
            .ids()
            .filter(|id| *id != self.cfg.local)
            .collect()
    }

    fn link(&self, id: NodeId) -> Option<&Link> {
        self.links.get(id.index()).and_then(Option::as_ref)
    }

    fn link_mut(&mut self, id: NodeId) -> Option<&mut Link> {
        self.links.get_mut(id.index()).and_then(Option::as_mut)
    }

    fn is_current(&self, peer: NodeId, attempt: u64, want: Dialer) -> bool {
        self.link(peer)
            .is_some_and(|l| l.attempt == attempt && l.dialer == want)
    }

    fn judge(&self, remote: &Hello, expected_node: Option<NodeId>) -> Verdict {
        let refuse = |mismatch, detail: String| Verdict::Refuse { mismatch, detail };
        if remote.protocol_version != self.cfg.protocol_version {
            return refuse(
                Mismatch::Version,
                format!(
                    "protocol version {} here, {} on node {}",
                    self.cfg.protocol_version, remote.protocol_version, remote.node
                ),
            );
        }
        if remote.digest != self.cfg.map.digest() {
            return refuse(
                Mismatch::NodeMap,
                self.cfg.map.describe_difference(&remote.node_map),
            );
        }
        if remote.domain_id != self.cfg.domain_id {
            return refuse(
                Mismatch::Domain,
                format!(
                    "domain {:?} here, {:?} on the peer",
                    self.cfg.domain_id, remote.domain_id
                ),
            );
        }
        let wrong = remote.node == self.cfg.local
            || remote.node.index() >= self.cfg.map.len()
            || expected_node.is_some_and(|e| e != remote.node);
        if wrong {
            return refuse(
                Mismatch::WrongNode,
                format!(
                    "peer says it is node {} (expected {:?}, this is node {})",
                    remote.node, expected_node, self.cfg.local
                ),
            );
        }
        Verdict::Accept
    }

    fn note_instance(&mut self, peer: NodeId, instance: InstanceId) {
        let Some(link) = self.link_mut(peer) else {
            return;
        };
        match link.instance.replace(instance) {
            Some(old) if old != instance => {
                self.actions.push_back(Action::PeerRestarted {
                    peer,
                    old,
                    new: instance,
                });
            }
            _ => {}
        }
    }

    fn dial(&mut self, peer: NodeId) {
        if self.state == DaemonState::ShuttingDown {
            return;
        }
        let Some(link) = self.link_mut(peer) else {
            return;
        };
        link.attempt += 1;
        link.dialer = Dialer::InFlight;
        let attempt = link.attempt;
        self.actions.push_back(Action::Dial { peer, attempt });
    }

    fn schedule_retry(&mut self, now: Instant, peer: NodeId) {
        if self.state == DaemonState::ShuttingDown {
            if let Some(link) = self.link_mut(peer) {
                link.dialer = Dialer::Idle;
            }
            return;
        }
        let backoff = self.cfg.backoff;
        let Some(link) = self.links.get_mut(peer.index()).and_then(Option::as_mut) else {
            return;
        };
        let delay = backoff.delay(link.failures, &mut self.rng);
        link.failures = link.failures.saturating_add(1);
        link.dialer = Dialer::Waiting(now + delay);
    }

    fn fail_attempt(&mut self, now: Instant, peer: NodeId, status: ConnStatus, reason: String) {
        if let Some(link) = self.link_mut(peer) {
            link.last_error = Some(reason.clone());
        }
        if self.link(peer).is_some_and(|l| l.status != status) {
            self.set_status(now, peer, status, reason);
        }
        self.schedule_retry(now, peer);
    }

    fn lose(&mut self, now: Instant, peer: NodeId, reason: String) {
        let Some(link) = self.link_mut(peer) else {
            return;
        };
        let attempt = link.attempt;
        link.failures = 0;
        self.actions
            .push_back(Action::CloseSession { peer, attempt });
        // Clean-up of a lost peer's imports waits for the grace time (forever by default), so
        // the cell shows R, as NVIDIA's does.
        self.set_status(now, peer, ConnStatus::Recovering, reason);
        self.schedule_retry(now, peer);
    }

    fn set_status(&mut self, now: Instant, peer: NodeId, to: ConnStatus, reason: String) {
        let Some(link) = self.link_mut(peer) else {
            return;
        };
        let from = link.status;
        link.status = to;
        link.reason = reason.clone();
        link.since = now;
        link.changed = true;
        let times_connected = link.times_connected;
        self.actions.push_back(Action::LinkChanged {
            peer,
            from,
            to,
            reason,
            times_connected,
        });
    }

    fn set_state(&mut self, to: DaemonState) {
        let from = self.state;
        if from != to {
            self.state = to;
            self.actions.push_back(Action::StateChanged { from, to });
        }
    }

    fn enter_init_gpu(&mut self) {
        self.set_state(DaemonState::InitGpu);
        self.actions.push_back(Action::InitDriver);
    }

    fn check_quorum(&mut self) {
        if self.state == DaemonState::WaitingForPeers
            && self.connected_peers() + 1 == self.cfg.map.len()
        {
            self.enter_init_gpu();
        }
    }
}
