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
//! A pair of daemons shares ONE session, which either side may have dialled ([`Via`];
//! `pair.rs` has the rule). Each daemon dials every peer it has no session with, but the first
//! session up carries the pair, and the peer's arriving session makes the link CONNECTED at
//! once and cancels our waiting retry: a domain keeps half the sessions of one where each side
//! dials the other, and a node that comes up (or a pair that recovers) is connected by one
//! handshake instead of two. A session dialled by the pair's lower node ID is preferred and
//! replaces one dialled by the higher, so when both dial at once both sides converge on the
//! same session. A node's row of the matrix is its view of its pair's session, whichever side
//! dialled it. Requests to a peer go on that session ([`Mesh::session_of`]). Liveness is the
//! pair's: one heartbeat exchange per pair, sent by the lower node ID on the pair's session, on
//! one timer for all sessions (`liveness.rs` has the details).
//!
//! A placeholder entry of the node map (`0.0.0.0`, [`crate::NodeMap::is_placeholder`]) is no
//! peer: its link is INVALID from the start, it is never dialled, a hello claiming its ID is
//! refused (wrong node), and FULL quorum does not wait for it. SIGUSR1 may fill it in
//! (`remap.rs`).
//!
//! # Cost of a large node file
//! Every peer is dialled once at start (the first round), at most [`DialBudget::max_in_flight`]
//! at a time, in ring order from this node (`dial.rs`), the higher node IDs before the lower
//! ones, so daemons started together dial each pair once (`first_round.rs`). After that, retries share one [`DialBudget`]: a burst, then a fixed rate across
//! all peers, so a node file of 10,000 mostly dead entries costs about what a small domain
//! costs, and each dead entry is retried less often the more there are. Retries of peers heard
//! from since start come before entries that never answered, so a peer lost a moment ago is not
//! queued behind thousands of dead entries (`dial.rs` keeps that queue). A peer that comes up
//! opens its session to us, which connects the link without any dial of ours, so formation and
//! recovery do not wait for the budget. Timers are kept ordered, so an input costs O(log n),
//! not O(n).

mod budget;
mod dial;
mod first_round;
mod handshake;
mod liveness;
mod pair;
mod quorum;
mod remap;
mod retry;

pub use budget::DialBudget;
use budget::Tokens;
use dial::{Dialer, DueClass, DueKey};
use first_round::FirstRound;
pub use handshake::{Hello, Verdict};
use pair::Carrier;
pub use pair::Via;
pub use retry::{DialFailure, NOT_LISTENING_CAPS};

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backoff::{Backoff, Rng};
use crate::ids::{ConnId, InstanceId, NodeId};
use crate::nodemap::NodeMap;
use crate::state::{ConnStatus, DaemonState};

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
    /// Heartbeat period of every pair (one exchange per pair, sent by the lower node ID).
    pub heartbeat_interval: Duration,
    /// A pair with no heartbeat (answer) for this long is dead (a hung peer).
    pub peer_timeout: Duration,
    /// How long the owner waits for the answer to a [`Action::Dial`]: one that has not come by
    /// then MUST be reported failed, never ok later. A peer whose hello we answered may take
    /// the pair as connected that long after our answer (`node/grace.rs` relies on it).
    pub dial_timeout: Duration,
    /// Reconnect policy.
    pub backoff: Backoff,
    /// Seed of the jitter generator.
    pub seed: u64,
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
    /// Send a heartbeat to `peer` on the pair's session `via`.
    SendHeartbeat {
        /// Target.
        peer: NodeId,
        /// The pair's session.
        via: Via,
        /// Whether the peer is to answer it (`liveness.rs`: every other heartbeat goes
        /// unanswered while the peer answers the others).
        answer: bool,
    },
    /// Close session `via` of the pair with `peer` (lost, or not the one the pair keeps).
    /// Nothing that arrives on it afterwards is a request of the peer's any more: requests in
    /// flight on it fail at their sender, which asks again on the pair's session.
    CloseSession {
        /// The peer.
        peer: NodeId,
        /// The session.
        via: Via,
    },
    /// Send a goodbye to `peer` (clean shutdown) on the pair's session `via`.
    SendGoodbye {
        /// Target.
        peer: NodeId,
        /// The pair's session.
        via: Via,
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
    /// The session that carries the pair, whichever side dialled it.
    carrier: Option<Carrier>,
    /// The session we dialled that carried the pair when the peer said goodbye (attempt,
    /// instance): left open for the peer to close, and still the peer's for its last requests
    /// (`pair.rs`).
    farewell: Option<(u64, InstanceId)>,
    /// The session we dialled that the pair's preferred session replaced (attempt, instance):
    /// closing, and still the peer's for the requests it sent on it before it saw the switch
    /// (`pair.rs`).
    superseded: Option<(u64, InstanceId)>,
    /// The instance that said goodbye (it is leaving): no session of it carries the pair again
    /// (`pair.rs`). Forgotten when another instance of the node is heard from.
    departed: Option<InstanceId>,
}

impl Link {
    /// A peer not dialled yet.
    fn new(now: Instant) -> Self {
        Self {
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
            carrier: None,
            farewell: None,
            superseded: None,
            departed: None,
        }
    }
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
    /// The node map's entries, as sent in every hello.
    hosts: Arc<[String]>,
    /// Entries of the node map at start-up (it may grow since: [`Mesh::handle_node_map`]).
    base_len: usize,
    budget: DialBudget,
    tokens: Tokens,
    /// Every link's next deadline (retry, heartbeat or liveness), in time order.
    timers: BTreeSet<(Instant, NodeId)>,
    /// Links due for a dial, in the order they get a slot.
    due: BTreeSet<DueKey>,
    in_flight: usize,
    connected: usize,
    /// Links with a session.
    sessions: usize,
    /// Accepted connections that carry a pair, and whose.
    accepted: HashMap<ConnId, NodeId>,
    /// Heartbeat ticks fall on `phase + k * heartbeat_interval` (see `liveness`).
    phase: Instant,
    /// The next heartbeat tick, while there is a session.
    tick: Option<Instant>,
    /// The last tick came late and lost nobody (`liveness`): the next one checks regardless.
    spared_late_tick: bool,
    /// The dials at start (`first_round.rs`).
    first_round: FirstRound,
}

impl Mesh {
    /// A mesh in INITIALIZING. Nothing is dialled before [`Mesh::handle_start`].
    pub fn new(cfg: MeshConfig, now: Instant) -> Self {
        let links = cfg
            .map
            .ids()
            .map(|id| (id != cfg.local).then(|| Link::for_entry(&cfg.map, id, now)))
            .collect();
        let rng = Rng::new(cfg.seed);
        let budget = DialBudget::for_backoff(&cfg.backoff);
        let hosts = cfg.map.hosts().into();
        let base_len = cfg.map.len();
        Self {
            cfg,
            state: DaemonState::Initializing,
            links,
            actions: VecDeque::new(),
            rng,
            started_at: now,
            hosts,
            base_len,
            budget,
            tokens: Tokens {
                tokens: budget.burst,
                next: now,
            },
            timers: BTreeSet::new(),
            due: BTreeSet::new(),
            in_flight: 0,
            connected: 0,
            sessions: 0,
            accepted: HashMap::new(),
            phase: now,
            tick: None,
            spared_late_tick: false,
            first_round: FirstRound::default(),
        }
    }

    /// Replaces the dial budget (default: [`DialBudget::for_backoff`]); the burst starts full.
    pub fn set_dial_budget(&mut self, budget: DialBudget) {
        self.budget = budget;
        self.tokens = Tokens {
            tokens: budget.burst,
            next: self.started_at,
        };
    }

    /// The dial budget.
    pub fn dial_budget(&self) -> DialBudget {
        self.budget
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
            node_map: Arc::clone(&self.hosts),
            map_base_len: self.base_len,
            protocol_version: self.cfg.protocol_version,
        }
    }

    /// This node's row: every node, itself included, in ID order. A peer's cell is this
    /// node's view of the pair's one session, whichever side dialled it.
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
        self.connected
    }

    /// Dials started and not answered yet.
    pub fn dials_in_flight(&self) -> usize {
        self.in_flight
    }

    // ---- lifecycle inputs ----------------------------------------------------------------

    /// Listeners are bound: start dialling every peer and move towards READY.
    pub fn handle_start(&mut self, now: Instant) {
        if self.state != DaemonState::Initializing {
            return;
        }
        self.queue_first_round(now);
        self.pump_dials(now);
        match self.cfg.quorum {
            QuorumPolicy::Full => self.set_state(DaemonState::WaitingForPeers),
            QuorumPolicy::None | QuorumPolicy::Recovery => self.enter_init_gpu(),
        }
        self.check_quorum();
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
        // Sessions stay known until they end, so requests still in flight on them are
        // answered; only their liveness is no longer watched.
        self.tick = None;
        for id in self.peer_ids() {
            let Some(link) = self.link(id) else {
                continue;
            };
            let carrier = link.carrier;
            self.set_dialer(id, Dialer::Idle);
            if let Some(c) = carrier {
                self.actions.push_back(Action::SendGoodbye {
                    peer: id,
                    via: c.via,
                });
            }
        }
    }

    // ---- goodbyes and timers -------------------------------------------------------------

    /// The peer said goodbye (clean shutdown). Ignored when `instance` is not the one we know:
    /// a stale goodbye must not take down a restarted peer's link. The pair's session no
    /// longer carries it but is not closed: the goodbye is answered on it, the leaving peer may
    /// still hand back imports on it ([`Mesh::proven_by`]), and it closes it when it exits.
    /// A goodbye naming a placeholder no node ever ran at here is ignored: no node is there to
    /// leave. One from the instance we knew at a hole (its line removed while it ran) is its
    /// departure like any other (its importers here are disabled before it is answered), but
    /// its link stays INVALID and undialled.
    pub fn handle_goodbye(
        &mut self,
        now: Instant,
        peer: NodeId,
        instance: InstanceId,
        reason: &str,
    ) {
        let hole = self.cfg.map.is_placeholder(peer);
        let Some(link) = self.link(peer) else { return };
        if (hole && link.instance.is_none()) || link.instance.is_some_and(|known| known != instance)
        {
            return;
        }
        let farewell = match link.carrier {
            Some(Carrier {
                via: Via::Dialled { attempt, .. },
                instance,
                ..
            }) => Some((attempt, instance)),
            _ => None,
        };
        self.set_carrier(peer, None);
        if let Some(link) = self.link_mut(peer) {
            link.farewell = farewell;
            link.departed = Some(instance);
        }
        if !hole {
            self.set_status(
                now,
                peer,
                ConnStatus::Disconnected,
                format!("peer said goodbye: {reason}"),
            );
        }
        self.actions.push_back(Action::PeerLeft { peer, instance });
        if self.state != DaemonState::ShuttingDown && !hole {
            // It may come back (restart); retry slowly from the start of the backoff.
            if let Some(link) = self.link_mut(peer) {
                link.failures = 0;
            }
            self.schedule_retry(now, peer, DialFailure::Other);
            self.pump_dials(now);
        }
    }

    /// Timers: heartbeats to send, dead sessions, retries due.
    pub fn handle_timeout(&mut self, now: Instant) {
        let fired: Vec<NodeId> = self
            .timers
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, id)| *id)
            .collect();
        for id in fired {
            let Some(link) = self.link(id) else {
                continue;
            };
            match link.dialer {
                Dialer::Waiting(at) => {
                    let class = if link.instance.is_some() {
                        DueClass::Known
                    } else {
                        DueClass::Unknown
                    };
                    self.set_dialer(id, Dialer::Queued(self.due(class, at, id)));
                }
                // A first-round dial stays one: it needs no token of the retry budget.
                Dialer::PutOff(_, key) => self.set_dialer(id, Dialer::Queued(key)),
                Dialer::Idle | Dialer::Queued(_) | Dialer::InFlight => {}
            }
        }
        if self.tick.is_some_and(|t| t <= now) {
            self.heartbeat_tick(now);
        }
        self.pump_dials(now);
    }

    // ---- outputs -------------------------------------------------------------------------

    /// The next action to perform.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Mesh::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timer = match (self.timers.first().map(|(at, _)| *at), self.tick) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Dials wait for a token only while a slot is free; a finished dial frees one.
        let token = (!self.due.is_empty() && self.in_flight < self.budget.max_in_flight)
            .then_some(self.tokens.next);
        match (timer, token) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ---- internals -----------------------------------------------------------------------

    /// Every peer that names a node (placeholders are not dialled or greeted).
    fn peer_ids(&self) -> Vec<NodeId> {
        self.cfg
            .map
            .ids()
            .filter(|id| *id != self.cfg.local && !self.cfg.map.is_placeholder(*id))
            .collect()
    }

    fn link(&self, id: NodeId) -> Option<&Link> {
        self.links.get(id.index()).and_then(Option::as_ref)
    }

    fn link_mut(&mut self, id: NodeId) -> Option<&mut Link> {
        self.links.get_mut(id.index()).and_then(Option::as_mut)
    }

    fn fail_attempt(&mut self, now: Instant, peer: NodeId, status: ConnStatus, reason: String) {
        if let Some(link) = self.link_mut(peer) {
            link.last_error = Some(reason.clone());
            // A refusal is mutual: the peer's session, if it carries the pair, goes too.
            if let Some(c) = link.carrier {
                self.actions
                    .push_back(Action::CloseSession { peer, via: c.via });
                self.set_carrier(peer, None);
            }
        }
        if self.link(peer).is_some_and(|l| l.status != status) {
            self.set_status(now, peer, status, reason);
        }
        self.schedule_retry(now, peer, DialFailure::Other);
    }

    fn lose(&mut self, now: Instant, peer: NodeId, reason: String) {
        let Some(link) = self.link_mut(peer) else {
            return;
        };
        link.failures = 0;
        if let Some(c) = link.carrier {
            self.actions
                .push_back(Action::CloseSession { peer, via: c.via });
            self.set_carrier(peer, None);
        }
        // Clean-up of a lost peer's imports waits for the grace time (forever by default), so
        // the cell shows R, as NVIDIA's does.
        self.set_status(now, peer, ConnStatus::Recovering, reason);
        self.schedule_retry(now, peer, DialFailure::Other);
    }

    fn set_status(&mut self, now: Instant, peer: NodeId, to: ConnStatus, reason: String) {
        let Some(link) = self.link_mut(peer) else {
            return;
        };
        let from = link.status;
        link.status = to;
        link.reason = reason.clone();
        match (from == ConnStatus::Connected, to == ConnStatus::Connected) {
            (false, true) => self.connected += 1,
            (true, false) => self.connected -= 1,
            _ => {}
        }
        let Some(link) = self.link_mut(peer) else {
            return;
        };
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
}
