//! Whole nodes on an in-memory network in virtual time: per node a [`Node`] (while its daemon
//! runs) and a driver model (always), sessions (one per dialler and acceptor; a pair keeps one,
//! which carries its RPCs both ways in order, as each side's `session_of` names it), and a
//! queue of timed deliveries. Every input reaches a node through the
//! queue, so a node's actions are always drained before its next input, as its contract asks.
//!
//! The world also judges the invariants: an import is validated or failed within its timeout, a
//! validation never names released memory, memory is never freed while a remote importer still
//! maps it (except by the exporter's own session teardown), a releaser is never blocked for
//! long, and the driver sees no double release, double finish or double validation.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, Instant};

use openimex_core::node::Action;
use openimex_core::*;

use crate::driver::{DescState, Driver, parse_pages};
use crate::rng::Rng;
use crate::sim;

/// Static settings of a run.
#[derive(Debug, Clone)]
pub struct Params {
    pub n: usize,
    pub quorum: QuorumPolicy,
    pub import_timeout: Duration,
    /// Relative weights of the fault kinds (see `chaos.rs`).
    pub fault_weights: [u32; FAULT_KINDS],
    /// Milliseconds between faults, `[lo, hi]`.
    pub fault_gap: (u64, u64),
    /// Milliseconds between application operations, `[lo, hi]`.
    pub app_gap: (u64, u64),
    /// `IMEX_NODE_DISCONNECTED_GRACE_TIME` of every node (`None`: forever).
    pub grace: Option<Duration>,
}

/// How many kinds of fault the chaos script knows.
pub const FAULT_KINDS: usize = 11;
/// The kinds a seed's weights were drawn for before the uneven heal (issue 28): drawn first,
/// so a seed's other parameters stay what they were.
pub const FAULT_KINDS_BEFORE_28: usize = 10;

/// The network and driver conditions, changed by faults.
#[derive(Debug, Clone)]
pub struct Conditions {
    /// Chance that a message is lost, per mille.
    pub loss: u32,
    /// Largest one-way delay.
    pub max_delay: Duration,
    /// Largest driver describe latency.
    pub describe_max: Duration,
    /// Messages from one node to another (either session) that are all lost (scenarios).
    pub drop: BTreeSet<(usize, usize)>,
    /// Extra one-way delay from one node to another (scenarios).
    pub extra: BTreeMap<(usize, usize), Duration>,
    /// Every describe takes exactly this long (scenarios).
    pub describe_fixed: Option<Duration>,
    /// A daemon that shut down exits exactly this long after (scenarios).
    pub linger: Option<Duration>,
    /// Extra delay of a dial from one node to another before it reaches the peer: one side's
    /// dials are slow while the other's are not, so the two sides' links disagree for a while.
    pub dial_extra: BTreeMap<(usize, usize), Duration>,
    /// Extra delay of the session stream a dialler opens (dialler, acceptor), not of the
    /// requests it sends on that connection: requests reach the acceptor on a connection its
    /// hello proved before the session opens there, as the daemon's unary RPCs can.
    pub open_extra: BTreeMap<(usize, usize), Duration>,
    /// Extra one-way delay (from, to) on the session dialled by the third node only.
    pub session_extra: BTreeMap<(usize, usize, usize), Duration>,
}

impl Conditions {
    pub fn calm() -> Self {
        Self {
            loss: 0,
            max_delay: Duration::from_millis(20),
            describe_max: Duration::from_millis(10),
            drop: BTreeSet::new(),
            extra: BTreeMap::new(),
            describe_fixed: None,
            linger: None,
            dial_extra: BTreeMap::new(),
            open_extra: BTreeMap::new(),
            session_extra: BTreeMap::new(),
        }
    }
}

/// Counters for the summary line.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub imports: u64,
    pub validated_ok: u64,
    pub validated_err: u64,
    pub unimports: u64,
    pub faults: u64,
    pub lost: u64,
    pub steps: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.imports += o.imports;
        self.validated_ok += o.validated_ok;
        self.validated_err += o.validated_err;
        self.unimports += o.unimports;
        self.faults += o.faults;
        self.lost += o.lost;
        self.steps += o.steps;
    }
}

pub struct Daemon {
    pub node: Node,
    pub instance: InstanceId,
    /// Shut down cleanly; the process exits soon.
    pub exiting: bool,
}

pub struct Slot {
    pub daemon: Option<Daemon>,
    pub driver: Driver,
    /// The daemon's persist record (a file: it outlives the daemon).
    pub persist: Vec<NodeId>,
}

/// A session: `client` dialled `server` (the key in `World::sessions` names the nodes). RPCs
/// go both ways on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sess {
    /// The dialler's attempt.
    pub attempt: u64,
    /// The dialler's instance.
    pub client: InstanceId,
    /// The acceptor's instance.
    pub server: InstanceId,
    /// The inbound connection the acceptor knows it by.
    pub conn: ConnId,
}

/// (dialler, acceptor) of a session.
type SessKey = (usize, usize);

impl Sess {
    /// The instance of node `at`, one end of session `key`.
    fn inst_at(&self, key: SessKey, at: usize) -> InstanceId {
        if at == key.0 {
            self.client
        } else {
            self.server
        }
    }

    /// How node `at`, one end of session `key`, names it.
    fn via_at(&self, key: SessKey, at: usize) -> Via {
        if at == key.1 {
            Via::Accepted { conn: self.conn }
        } else {
            Via::Dialled {
                peer: World::id(key.1),
                attempt: self.attempt,
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcKind {
    Import(u64),
    Unimport(u64),
    Goodbye,
}

#[derive(Debug, Clone, Copy)]
struct Rpc {
    client: usize,
    client_inst: InstanceId,
    server: usize,
    /// The session it went out on.
    sess: Option<(SessKey, Sess)>,
    kind: RpcKind,
}

#[derive(Debug, Clone)]
pub enum Msg {
    ImportReq(ImportRequest),
    UnimportReq(u64),
    ImportResp(ImportAnswer),
    UnimportResp,
    /// The server refused the unimport (no session proves the sender there): not delivered.
    UnimportRefused,
    Goodbye,
    /// The goodbye was recorded (and the server's actions for it performed).
    GoodbyeResp,
}

#[derive(Debug, Clone)]
enum DialResult {
    /// The server's hello, and the inbound connection it accepted it on.
    Accept(Box<Hello>, ConnId),
    Refused(Mismatch, String),
    ShuttingDown,
    /// Nothing listens there: the peer's daemon is not running.
    NotListening,
    /// The connect timed out (a partition).
    TimedOut,
}

/// A scripted operation (applications and faults); see `chaos.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    AppTick,
    FaultTick,
    Restart(usize),
    Heal,
    Calm,
}

#[derive(Debug, Clone)]
enum Ev {
    /// Deliver what is due on one direction of a session.
    Channel {
        key: ChannelKey,
    },
    RpcFailed {
        rpc: u64,
        why: &'static str,
    },
    /// A dial made at `sent` reaches its peer.
    DialArrive {
        a: usize,
        b: usize,
        attempt: u64,
        a_inst: InstanceId,
        sent: Instant,
    },
    /// The answer to a dial made at `sent` reaches the dialler.
    DialDone {
        a: usize,
        b: usize,
        attempt: u64,
        a_inst: InstanceId,
        sent: Instant,
        result: DialResult,
    },
    /// The dialler's session stream reaches the acceptor.
    SessionOpen {
        key: SessKey,
        sess: Sess,
    },
    /// A's heartbeat reaches B on the pair's session (the pair's sign of life on B's side);
    /// B's transport answers it, if asked, after `answer_in`.
    HeartbeatArrive {
        a: usize,
        b: usize,
        key: SessKey,
        sess: Sess,
        answer_in: Option<Duration>,
    },
    HeartbeatAck {
        a: usize,
        b: usize,
        key: SessKey,
        sess: Sess,
    },
    SessionLost {
        a: usize,
        b: usize,
        attempt: u64,
        a_inst: InstanceId,
    },
    Described {
        node: usize,
        inst: InstanceId,
        request: RequestId,
        result: Result<(u64, Pages), ImportError>,
    },
    DriverReady {
        node: usize,
        inst: InstanceId,
    },
    /// The server sees an inbound connection close.
    ConnClosed {
        node: usize,
        inst: InstanceId,
        conn: ConnId,
    },
    Exit {
        node: usize,
        inst: InstanceId,
    },
    Op(Op),
}

/// One direction of a session: (dialler, acceptor, attempt, towards the acceptor).
type ChannelKey = (usize, usize, u64, bool);

/// A message on the wire.
#[derive(Debug)]
struct InFlight {
    ready: Instant,
    rpc: Option<u64>,
    msg: Msg,
}

struct Queued {
    at: Instant,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// A fabric handle an application published (out of band, as MPI would).
#[derive(Debug, Clone, Copy)]
pub struct Handle {
    pub node: usize,
    pub exp_id: u64,
    pub channel: u32,
}

/// At most this many violations are kept per run.
const MAX_VIOLATIONS: usize = 20;
/// `sim::config`'s peer timeout: when a client behind a partition notices a dead session.
const PEER_TIMEOUT: Duration = Duration::from_millis(3000);
/// TCP's retransmission period behind a partition.
const RETRANSMIT: Duration = Duration::from_millis(200);
/// Driver-event delivery slack on top of the import timeout.
const SLACK: Duration = Duration::from_millis(1);

pub struct World {
    pub now: Instant,
    pub start: Instant,
    pub p: Params,
    pub rng: Rng,
    pub slots: Vec<Slot>,
    queue: BinaryHeap<Reverse<Queued>>,
    seq: u64,
    pub cond: Conditions,
    /// Unordered node pairs (lo, hi) that cannot talk.
    pub cut: BTreeSet<(usize, usize)>,
    /// Sessions by (dialler, acceptor).
    sessions: BTreeMap<SessKey, Sess>,
    /// Sessions (key, attempt) whose stream the acceptor has opened.
    opened: BTreeSet<(SessKey, u64)>,
    /// Messages in flight per direction of a session, in order (TCP).
    channels: BTreeMap<ChannelKey, std::collections::VecDeque<InFlight>>,
    rpcs: BTreeMap<u64, Rpc>,
    /// (server, request) → RPC.
    server_reqs: BTreeMap<(usize, RequestId), u64>,
    next_rpc: u64,
    next_request: RequestId,
    next_conn: ConnId,
    /// (exporter, daemon reference) → (importer, import event) it was described for.
    ref_for: BTreeMap<(usize, u64), (usize, u64)>,
    /// (importer, import event) → the exporter instance whose success answer was delivered.
    answered_by: BTreeMap<(usize, u64), InstanceId>,
    /// (node, peer, its new instance or `None` if it left): checked once `node`'s actions are
    /// drained, when no live mapping of the peer's old memory may remain there.
    gone_checks: Vec<(usize, NodeId, Option<InstanceId>)>,
    next_instance: u64,
    /// The chaos script stops at this time.
    pub chaos_end: Instant,
    pub board: Vec<Handle>,
    /// Applications' live imports: (node, descriptor).
    pub app_imports: Vec<(usize, u64)>,
    /// Applications' live exports: (node, export).
    pub app_exports: Vec<(usize, u64)>,
    pub violations: Vec<String>,
    pub trace: bool,
    pub stats: Stats,
    /// Every action performed, when recording (scenarios).
    pub log: Option<Vec<(usize, Action)>>,
}

impl World {
    pub fn new(p: Params, seed: u64, trace: bool) -> Self {
        // The virtual clock needs an origin; only offsets from it matter.
        #[allow(clippy::disallowed_methods)]
        let start = Instant::now();
        let slots = (0..p.n)
            .map(|i| Slot {
                daemon: None,
                driver: Driver::new(i),
                persist: Vec::new(),
            })
            .collect();
        Self {
            now: start,
            start,
            rng: Rng::new(seed),
            slots,
            queue: BinaryHeap::new(),
            seq: 0,
            cond: Conditions::calm(),
            cut: BTreeSet::new(),
            sessions: BTreeMap::new(),
            opened: BTreeSet::new(),
            channels: BTreeMap::new(),
            rpcs: BTreeMap::new(),
            server_reqs: BTreeMap::new(),
            next_rpc: 1,
            next_request: 1,
            next_conn: 1,
            answered_by: BTreeMap::new(),
            ref_for: BTreeMap::new(),
            gone_checks: Vec::new(),
            next_instance: seed.wrapping_mul(1000),
            chaos_end: start,
            board: Vec::new(),
            app_imports: Vec::new(),
            app_exports: Vec::new(),
            violations: Vec::new(),
            trace,
            stats: Stats::default(),
            log: None,
            p,
        }
    }

    pub fn id(i: usize) -> NodeId {
        NodeId(u16::try_from(i).unwrap())
    }

    pub fn ms(&self) -> f64 {
        (self.now - self.start).as_secs_f64() * 1000.0
    }

    /// Trace a line (only with tracing on; the closure is not run otherwise).
    pub fn note(&self, f: impl FnOnce() -> String) {
        if self.trace {
            let _ = writeln!(std::io::stderr(), "{:>10.3} ms  {}", self.ms(), f());
        }
    }

    pub fn violate(&mut self, what: String) {
        let line = format!("at {:.3} ms: {what}", self.ms());
        if self.trace {
            let _ = writeln!(
                std::io::stderr(),
                "{:>10.3} ms  VIOLATION {what}",
                self.ms()
            );
        }
        if self.violations.len() < MAX_VIOLATIONS {
            self.violations.push(line);
        }
    }

    pub fn alive(&self, i: usize) -> bool {
        self.slots[i].daemon.is_some()
    }

    fn inst(&self, i: usize) -> Option<InstanceId> {
        self.slots[i].daemon.as_ref().map(|d| d.instance)
    }

    fn node_mut(&mut self, i: usize) -> &mut Node {
        &mut self.slots[i].daemon.as_mut().unwrap().node
    }

    pub fn node(&self, i: usize) -> Option<&Node> {
        self.slots[i].daemon.as_ref().map(|d| &d.node)
    }

    pub fn is_cut(&self, a: usize, b: usize) -> bool {
        self.cut.contains(&(a.min(b), a.max(b)))
    }

    fn reachable(&self, a: usize, b: usize) -> bool {
        self.alive(b) && !self.is_cut(a, b)
    }

    pub fn schedule_op(&mut self, at: Instant, op: Op) {
        self.push(at, Ev::Op(op));
    }

    fn push(&mut self, at: Instant, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Queued {
            at: at.max(self.now),
            seq: self.seq,
            ev,
        }));
    }

    /// The extra delay `table` sets for `key`, if any.
    fn extra<K: Ord>(&self, table: &BTreeMap<K, Duration>, key: K) -> Duration {
        table.get(&key).copied().unwrap_or_default()
    }

    fn delay(&mut self) -> Duration {
        let max = self.cond.max_delay;
        self.rng.upto(max)
    }

    // ---- node lifecycle ------------------------------------------------------------------

    /// Start a daemon on node `i` (a new instance).
    pub fn start(&mut self, i: usize) {
        if self.alive(i) {
            return;
        }
        self.next_instance += 1;
        let instance = InstanceId(self.next_instance);
        let map = NodeMap::new(sim::hosts(self.p.n));
        let cfg = NodeConfig {
            mesh: sim::config(i, map, instance.0, self.p.quorum),
            import_timeout: self.p.import_timeout,
            max_describes_per_peer: openimex_core::node::DEFAULT_MAX_DESCRIBES_PER_PEER,
            grace: self.p.grace,
            // The previous daemon's record: with RECOVERY the new one waits for those nodes.
            recover_from: if self.p.quorum == QuorumPolicy::Recovery {
                self.slots[i].persist.clone()
            } else {
                Vec::new()
            },
            recovery_wait: openimex_core::node::DEFAULT_RECOVERY_WAIT,
            conn_wait_timeout: None,
        };
        let mut node = Node::new(cfg, self.now);
        node.handle_start(self.now);
        self.slots[i].daemon = Some(Daemon {
            node,
            instance,
            exiting: false,
        });
        self.note(|| format!("node {i}: daemon started, instance {instance}"));
        self.pump();
    }

    /// kill -9 (or the exit after a clean shutdown): the process is gone, the driver tears its
    /// session down, and peers' sessions to it are reset (unless a partition hides the reset).
    pub fn take_down(&mut self, i: usize, why: &str) {
        let Some(d) = self.slots[i].daemon.take() else {
            return;
        };
        let t = self.slots[i].driver.teardown();
        self.ref_for.retain(|(n, _), _| *n != i);
        self.note(|| {
            format!(
                "node {i}: daemon {} gone ({why}); session teardown: {} failed imports, {} woken, \
                 {} importers disabled, dangling={}, freed {:?}",
                d.instance, t.failed_imports, t.woken, t.disabled, t.dangling, t.freed
            )
        });
        for exp in t.freed {
            self.on_freed(i, exp, true);
        }
        let keys: Vec<(usize, usize)> = self
            .sessions
            .keys()
            .copied()
            .filter(|(a, b)| *a == i || *b == i)
            .collect();
        for (a, b) in keys {
            self.remove_session(a, b, Some(i));
        }
    }

    /// SIGTERM: goodbyes, then the process exits a little later.
    pub fn shutdown(&mut self, i: usize) {
        let now = self.now;
        let Some(d) = self.slots[i].daemon.as_mut() else {
            return;
        };
        if d.exiting {
            return;
        }
        d.exiting = true;
        let inst = d.instance;
        d.node.handle_shutdown(now);
        self.note(|| format!("node {i}: shutdown"));
        let linger = match self.cond.linger {
            Some(d) => d,
            None => self.rng.ms(50, 600),
        };
        self.push(now + linger, Ev::Exit { node: i, inst });
        self.pump();
    }

    /// A connection reset between `a` and `b` (a middlebox, a NIC flap): both sessions drop,
    /// their RPCs fail, both daemons see the reset and redial.
    pub fn reset(&mut self, a: usize, b: usize) {
        self.note(|| format!("sessions between {a} and {b} reset"));
        self.remove_session(a, b, None);
        self.remove_session(b, a, None);
    }

    /// Session (dialler `a`, acceptor `b`) ends: closed by `closer` (it knows; the other end
    /// sees the stream end), or reset (`None`: both ends see it). RPCs on it fail.
    fn remove_session(&mut self, a: usize, b: usize, closer: Option<usize>) {
        let Some(s) = self.sessions.remove(&(a, b)) else {
            return;
        };
        self.note(|| format!("session {a}->{b} (attempt {}) ends", s.attempt));
        self.opened.remove(&((a, b), s.attempt));
        self.channels
            .retain(|k, _| !(k.0 == a && k.1 == b && k.2 == s.attempt));
        // RPCs on it fail; behind a partition only once the client would notice.
        let when = if self.is_cut(a, b) {
            self.now + PEER_TIMEOUT
        } else {
            self.now
        };
        let failed: Vec<u64> = self
            .rpcs
            .iter()
            .filter(|(_, r)| r.sess == Some(((a, b), s)))
            .map(|(id, _)| *id)
            .collect();
        for rpc in failed {
            self.push(
                when,
                Ev::RpcFailed {
                    rpc,
                    why: "connection lost",
                },
            );
        }
        if self.inst(b) == Some(s.server) {
            self.push(
                when,
                Ev::ConnClosed {
                    node: b,
                    inst: s.server,
                    conn: s.conn,
                },
            );
        }
        if closer != Some(a) {
            self.push(
                when,
                Ev::SessionLost {
                    a,
                    b,
                    attempt: s.attempt,
                    a_inst: s.client,
                },
            );
        }
    }

    // ---- main loop -----------------------------------------------------------------------

    /// Advance to the next delivery or timer (at most to `limit`) and process it.
    pub fn step(&mut self, limit: Instant) -> bool {
        let q = self.queue.peek().map(|Reverse(e)| e.at);
        let t = self
            .slots
            .iter()
            .filter_map(|s| s.daemon.as_ref())
            .filter_map(|d| d.node.poll_timeout())
            .min();
        let next = match (q, t) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Some(next) = next.filter(|t| *t <= limit) else {
            self.now = self.now.max(limit);
            self.check_deadlines();
            return false;
        };
        self.now = self.now.max(next);
        self.stats.steps += 1;
        while let Some(Reverse(e)) = self.queue.peek() {
            if e.at > self.now {
                break;
            }
            let Reverse(e) = self.queue.pop().unwrap();
            self.handle(e.ev);
            self.pump();
        }
        let now = self.now;
        for i in 0..self.p.n {
            if let Some(d) = self.slots[i].daemon.as_mut()
                && d.node.poll_timeout().is_some_and(|t| t <= now)
            {
                d.node.handle_timeout(now);
                self.pump();
            }
        }
        self.check_deadlines();
        true
    }

    pub fn run_until(&mut self, until: Instant) {
        while self.step(until) {
            if self.stats.steps > 3_000_000 {
                self.violate("runaway: more than 3,000,000 steps".into());
                return;
            }
        }
    }

    pub fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        self.run_until(until);
    }

    /// Run until `pred` holds (checked between steps), at most `max`. Whether it held.
    pub fn run_while_not(&mut self, max: Duration, pred: impl Fn(&World) -> bool) -> bool {
        let until = self.now + max;
        loop {
            if pred(self) {
                return true;
            }
            if !self.step(until) {
                return pred(self);
            }
        }
    }

    /// Every daemon up, READY, and connected to every peer.
    pub fn all_up(&self) -> bool {
        self.slots.iter().all(|s| {
            s.daemon.as_ref().is_some_and(|d| {
                !d.exiting
                    && d.node.state() == DaemonState::Ready
                    && d.node
                        .links()
                        .iter()
                        .all(|l| l.status == ConnStatus::Connected)
            })
        })
    }

    /// [`World::all_up`], and every pair down to one session, the one both sides name.
    pub fn settled(&self) -> bool {
        if !self.all_up() {
            return false;
        }
        let n = self.p.n;
        (0..n).all(|a| {
            (a + 1..n).all(|b| {
                let named = |x: usize, y: usize| {
                    self.node(x)
                        .and_then(|m| m.session_of(Self::id(y)))
                        .and_then(|via| self.find(x, y, via))
                };
                let count = usize::from(self.sessions.contains_key(&(a, b)))
                    + usize::from(self.sessions.contains_key(&(b, a)));
                count == 1 && named(a, b).is_some() && named(a, b) == named(b, a)
            })
        })
    }

    /// The sessions and what each node names, for a violation's message.
    pub fn sessions_seen(&self) -> String {
        let n = self.p.n;
        let named: Vec<String> = (0..n)
            .flat_map(|a| (0..n).filter(move |b| *b != a).map(move |b| (a, b)))
            .map(|(a, b)| {
                let via = self.node(a).and_then(|m| m.session_of(Self::id(b)));
                format!("{a}->{b}: {via:?}")
            })
            .collect();
        format!("sessions {:?}; named {}", self.sessions, named.join(", "))
    }

    /// Deliver driver events to each daemon and perform every action, until quiet.
    pub fn pump(&mut self) {
        let now = self.now;
        loop {
            let mut did = false;
            for i in 0..self.p.n {
                loop {
                    let slot = &mut self.slots[i];
                    let Some(d) = slot.daemon.as_mut() else { break };
                    if slot.driver.session.map(|s| s.instance) != Some(d.instance) {
                        break;
                    }
                    let Some(ev) = slot.driver.events.pop_front() else {
                        break;
                    };
                    d.node.handle_driver_event(now, ev.clone());
                    self.note(|| format!("node {i}: driver event {ev:?}"));
                    self.drain(i);
                    did = true;
                }
                did |= self.drain(i);
            }
            if !did {
                return;
            }
        }
    }

    fn drain(&mut self, i: usize) -> bool {
        let mut did = false;
        while let Some(action) = self.slots[i]
            .daemon
            .as_mut()
            .and_then(|d| d.node.poll_action())
        {
            did = true;
            self.perform(i, action);
        }
        for (node, peer, new) in std::mem::take(&mut self.gone_checks) {
            let unanswered = self.slots[node].driver.pending_from(peer.index());
            if !unanswered.is_empty() {
                self.violate(format!(
                    "node {node}: learned that node {peer} is gone, but imports {unanswered:?} \
                     asked of it are still waiting (not failed at once)"
                ));
            }
            let stale = self.slots[node].driver.maps_from(peer.index(), new);
            if !stale.is_empty() {
                let how = match new {
                    Some(new) => format!("restarted as {new}"),
                    None => "left".to_string(),
                };
                self.violate(format!(
                    "node {node}: learned that node {peer} {how}, but imports {stale:?} still map \
                     memory of its previous instance (importers not disabled)"
                ));
            }
        }
        did
    }

    // ---- actions -------------------------------------------------------------------------

    fn perform(&mut self, i: usize, action: Action) {
        let now = self.now;
        let inst = self.inst(i).unwrap();
        if let Some(log) = self.log.as_mut() {
            log.push((i, action.clone()));
        }
        match &action {
            Action::Mesh(mesh::Action::SendHeartbeat { .. }) => {}
            a => self.note(|| format!("node {i}: {a:?}")),
        }
        match action {
            Action::Mesh(m) => {
                match m {
                    mesh::Action::PeerRestarted { peer, new, .. } => {
                        self.gone_checks.push((i, peer, Some(new)));
                    }
                    mesh::Action::PeerLeft { peer, .. } => self.gone_checks.push((i, peer, None)),
                    _ => {}
                }
                self.perform_mesh(i, inst, m);
            }
            // Grace-time clean-ups are off here (wait forever, NVIDIA's default); restarts and
            // departures are checked through the mesh actions above.
            Action::CleanedUp { .. } => {}
            Action::Persist { importers } => self.slots[i].persist = importers,
            Action::RecoveryWait { .. }
            | Action::Recovered { .. }
            | Action::PeersWaitOver { .. } => {}
            // Every peer here is honest and says hello first: a refusal is a bookkeeping bug.
            Action::Refused { reason, detail, .. } => {
                self.violate(format!(
                    "node {i}: refused an honest peer ({reason}): {detail}"
                ));
            }
            Action::SendImport { peer, request } => {
                let e = request.import_event_id;
                let via = self.node(i).and_then(|n| n.session_of(peer));
                self.call(
                    i,
                    inst,
                    peer.index(),
                    via,
                    RpcKind::Import(e),
                    Msg::ImportReq(request),
                );
            }
            Action::SendUnimport {
                peer,
                import_event_id,
            } => {
                let via = self.node(i).and_then(|n| n.session_of(peer));
                self.call(
                    i,
                    inst,
                    peer.index(),
                    via,
                    RpcKind::Unimport(import_event_id),
                    Msg::UnimportReq(import_event_id),
                );
            }
            Action::ValidateImport {
                import_event_id,
                result,
            } => self.validate(i, import_event_id, result),
            Action::FinishUnimports { ids } => {
                if let Err(id) = self.slots[i].driver.finish(&ids) {
                    self.violate(format!(
                        "node {i}: FINISH_MEM_UNIMPORT of unimport event {id}, which is not waiting \
                         (finished twice or never posted)"
                    ));
                }
            }
            Action::DisableImporters { node } => {
                let n = self.slots[i].driver.disable_importers(node);
                self.note(|| format!("node {i}: disabled {n} importers of node {node}"));
            }
            Action::DescribeExport {
                request,
                export_uuid,
                index,
                channel,
            } => {
                let result = self.slots[i].driver.describe(&export_uuid, index, channel);
                if let Ok((r, _)) = &result
                    && let Some(rpc) = self
                        .server_reqs
                        .get(&(i, request))
                        .and_then(|rpc| self.rpcs.get(rpc))
                    && let RpcKind::Import(e) = rpc.kind
                {
                    self.ref_for.insert((i, *r), (rpc.client, e));
                }
                let max = self.cond.describe_max;
                let at = now
                    + self
                        .cond
                        .describe_fixed
                        .unwrap_or_else(|| self.rng.upto(max));
                self.push(
                    at,
                    Ev::Described {
                        node: i,
                        inst,
                        request,
                        result,
                    },
                );
            }
            Action::ReleaseExportRefs { refs, ack } => {
                for r in &refs {
                    let Some((b, e)) = self.ref_for.remove(&(i, *r)) else {
                        continue;
                    };
                    let exiting = self.slots[b].daemon.as_ref().is_some_and(|d| d.exiting);
                    if self.slots[b].driver.is_live(e) && !exiting {
                        self.violate(format!(
                            "node {i}: released the reference held for node {b}'s import {e}, \
                             which is still live there"
                        ));
                    }
                }
                match self.slots[i].driver.release_refs(&refs) {
                    Ok(freed) => {
                        for exp in freed {
                            self.on_freed(i, exp, false);
                        }
                    }
                    Err(r) => self.violate(format!(
                        "node {i}: release of daemon reference {r}, which is not held (double \
                         release)"
                    )),
                }
                if let Some(request) = ack {
                    self.respond(i, request, Msg::UnimportResp);
                }
            }
            Action::AnswerImport { request, answer } => {
                self.respond(i, request, Msg::ImportResp(answer));
            }
            Action::AnswerUnimport { request, .. } => {
                self.respond(i, request, Msg::UnimportResp);
            }
            Action::RefuseUnimport { request, .. } => {
                self.respond(i, request, Msg::UnimportRefused);
            }
            // This world's drivers post no multicast events (tests/multicast.rs covers them).
            a @ (Action::SendRemoteGpuAttach { .. }
            | Action::AttachRemoteGpu { .. }
            | Action::SetMulticastFailure { .. }
            | Action::AnswerRemoteGpuAttach { .. }) => {
                self.violate(format!(
                    "node {i}: a multicast action with no multicast: {a:?}"
                ));
            }
        }
    }

    fn perform_mesh(&mut self, a: usize, a_inst: InstanceId, m: mesh::Action) {
        let now = self.now;
        match m {
            mesh::Action::Dial { peer, attempt } => {
                let d = self.delay() + self.extra(&self.cond.dial_extra, (a, peer.index()));
                self.push(
                    now + d,
                    Ev::DialArrive {
                        a,
                        b: peer.index(),
                        attempt,
                        a_inst,
                        sent: now,
                    },
                );
            }
            mesh::Action::SendHeartbeat { peer, via, answer } => {
                let b = peer.index();
                if let Some((key, sess)) = self.find(a, b, via)
                    && !self.is_cut(a, b)
                {
                    let rtt = self.delay().min(Duration::from_millis(500)) * 2;
                    let answer_in = answer.then_some(rtt / 2);
                    self.push(
                        now + rtt / 2,
                        Ev::HeartbeatArrive {
                            a,
                            b,
                            key,
                            sess,
                            answer_in,
                        },
                    );
                }
            }
            mesh::Action::CloseSession { peer, via } => {
                if let Some((key, _)) = self.find(a, peer.index(), via) {
                    self.remove_session(key.0, key.1, Some(a));
                }
            }
            mesh::Action::SendGoodbye { peer, via } => {
                let b = peer.index();
                self.call(a, a_inst, b, Some(via), RpcKind::Goodbye, Msg::Goodbye);
            }
            mesh::Action::InitDriver => {
                let d = self.rng.ms(0, 20);
                self.push(
                    now + d,
                    Ev::DriverReady {
                        node: a,
                        inst: a_inst,
                    },
                );
            }
            mesh::Action::LinkChanged { .. }
            | mesh::Action::PeerRestarted { .. }
            | mesh::Action::PeerLeft { .. }
            | mesh::Action::StateChanged { .. } => {}
        }
    }

    /// The session node `a` names `via` (its peer is `b`), if it is still up.
    fn find(&self, a: usize, b: usize, via: Via) -> Option<(SessKey, Sess)> {
        let key = match via {
            Via::Dialled { .. } => (a, b),
            Via::Accepted { .. } => (b, a),
        };
        let sess = *self.sessions.get(&key)?;
        (sess.via_at(key, a) == via).then_some((key, sess))
    }

    /// Start an RPC from `client` to `server` on the pair's session `via` (as the client's
    /// node names it); it fails at once if there is none.
    fn call(
        &mut self,
        client: usize,
        inst: InstanceId,
        server: usize,
        via: Option<Via>,
        kind: RpcKind,
        msg: Msg,
    ) {
        let rpc = self.next_rpc;
        self.next_rpc += 1;
        let sess = via.and_then(|via| self.find(client, server, via));
        self.rpcs.insert(
            rpc,
            Rpc {
                client,
                client_inst: inst,
                server,
                sess,
                kind,
            },
        );
        if sess.is_none() {
            self.push(
                self.now,
                Ev::RpcFailed {
                    rpc,
                    why: "not connected",
                },
            );
            return;
        }
        if let Some((key, _)) = sess {
            self.send(key, client, Some(rpc), msg);
        }
    }

    /// The server answers the request it knows as `request`.
    fn respond(&mut self, server: usize, request: RequestId, msg: Msg) {
        let Some(rpc) = self.server_reqs.remove(&(server, request)) else {
            return;
        };
        let Some(r) = self.rpcs.get(&rpc).copied() else {
            return;
        };
        if let Some((key, sess)) = r.sess
            && self.sessions.get(&key) == Some(&sess)
        {
            self.send(key, server, Some(rpc), msg);
        }
    }

    /// Put a message from `from` (one end) on session `key`, in order behind earlier ones.
    fn send(&mut self, key: SessKey, from: usize, rpc: Option<u64>, msg: Msg) {
        let Some(&sess) = self.sessions.get(&key) else {
            return;
        };
        let to = if from == key.0 { key.1 } else { key.0 };
        let (client, server, to_server) = (key.0, key.1, to == key.1);
        if self.cond.drop.contains(&(from, to)) {
            self.stats.lost += 1;
            self.note(|| format!("dropped {from}->{to} {msg:?}"));
            return;
        }
        let loss = self.cond.loss;
        if loss > 0 && self.rng.chance(loss) {
            self.stats.lost += 1;
            self.note(|| format!("lost {client}->{server} (to_server={to_server}) {msg:?}"));
            // A lost message: the RPC hangs, or its deadline reports a transport error late.
            if let Some(rpc) = rpc
                && self.rng.chance(500)
            {
                let late = self
                    .p
                    .import_timeout
                    .mul_f64(0.5 + self.rng.below(300) as f64 / 100.0);
                self.push(
                    self.now + late,
                    Ev::RpcFailed {
                        rpc,
                        why: "deadline exceeded",
                    },
                );
            }
            return;
        }
        let d = self.delay()
            + self.extra(&self.cond.extra, (from, to))
            + self.extra(&self.cond.session_extra, (from, to, key.0));
        let key = (client, server, sess.attempt, to_server);
        let q = self.channels.entry(key).or_default();
        let at = q
            .back()
            .map_or(self.now + d, |last| last.ready.max(self.now + d));
        q.push_back(InFlight {
            ready: at,
            rpc,
            msg,
        });
        self.push(at, Ev::Channel { key });
    }

    // ---- inputs --------------------------------------------------------------------------

    fn handle(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Channel { key } => {
                let (client, server, attempt, to_server) = key;
                loop {
                    let Some(sess) = self
                        .sessions
                        .get(&(client, server))
                        .copied()
                        .filter(|s| s.attempt == attempt)
                    else {
                        self.channels.remove(&key);
                        return;
                    };
                    let Some(head) = self.channels.get(&key).and_then(|q| q.front()) else {
                        return;
                    };
                    if head.ready > now {
                        return;
                    }
                    if self.is_cut(client, server) {
                        // TCP retransmits until the partition heals or the session dies.
                        self.push(now + RETRANSMIT, Ev::Channel { key });
                        return;
                    }
                    let m = self
                        .channels
                        .get_mut(&key)
                        .and_then(|q| q.pop_front())
                        .unwrap();
                    let (from, to) = if to_server {
                        (client, server)
                    } else {
                        (server, client)
                    };
                    match m.msg {
                        Msg::ImportReq(_) | Msg::UnimportReq(_) | Msg::Goodbye => {
                            self.deliver_request(from, to, (client, server), sess, m.rpc, m.msg);
                        }
                        Msg::ImportResp(_)
                        | Msg::UnimportResp
                        | Msg::UnimportRefused
                        | Msg::GoodbyeResp => {
                            self.deliver_response(from, m.rpc, m.msg);
                        }
                    }
                    self.pump();
                }
            }
            Ev::RpcFailed { rpc, why } => {
                let Some(r) = self.rpcs.remove(&rpc) else {
                    return;
                };
                if self.inst(r.client) != Some(r.client_inst) {
                    return;
                }
                let exporter = Self::id(r.server);
                self.note(|| {
                    format!(
                        "node {}: rpc {:?} to {} failed: {why}",
                        r.client, r.kind, r.server
                    )
                });
                let n = self.node_mut(r.client);
                match r.kind {
                    RpcKind::Import(e) => n.handle_import_answer(
                        now,
                        exporter,
                        e,
                        Err(ImportError::new(
                            Status::InvalidState,
                            format!("transport error: {why}"),
                        )),
                    ),
                    RpcKind::Unimport(e) => n.handle_unimport_delivered(now, exporter, e, false),
                    RpcKind::Goodbye => n.handle_goodbye_delivered(now, exporter, false),
                }
            }
            Ev::DialArrive {
                a,
                b,
                attempt,
                a_inst,
                sent,
            } => {
                if self.inst(a) != Some(a_inst) {
                    return;
                }
                let d = self.delay();
                if !self.reachable(a, b) {
                    // A dead peer refuses at once; a partition times the connect out.
                    let (wait, result) = if self.alive(b) {
                        (Duration::from_millis(1000), DialResult::TimedOut)
                    } else {
                        (d, DialResult::NotListening)
                    };
                    self.push(
                        now + wait,
                        Ev::DialDone {
                            a,
                            b,
                            attempt,
                            a_inst,
                            sent,
                            result,
                        },
                    );
                    return;
                }
                let hello_a = self.node(a).unwrap().mesh().hello();
                let conn = self.next_conn;
                self.next_conn += 1;
                let verdict = self
                    .node_mut(b)
                    .handle_session_hello(now, conn, true, &hello_a);
                let hello_b = self.node(b).unwrap().mesh().hello();
                let result = match verdict {
                    Verdict::Accept => DialResult::Accept(Box::new(hello_b), conn),
                    Verdict::Refuse { mismatch, detail } => DialResult::Refused(mismatch, detail),
                    Verdict::ShuttingDown => DialResult::ShuttingDown,
                };
                self.push(
                    now + d,
                    Ev::DialDone {
                        a,
                        b,
                        attempt,
                        a_inst,
                        sent,
                        result,
                    },
                );
            }
            Ev::DialDone {
                a,
                b,
                attempt,
                a_inst,
                sent,
                result,
            } => {
                if self.inst(a) != Some(a_inst) {
                    return;
                }
                let peer = Self::id(b);
                // The daemon gives a dial up after its dial timeout: an answer later than that
                // is never taken (its connection is closed).
                let late = self
                    .node(a)
                    .is_some_and(|n| now - sent > n.mesh().config().dial_timeout);
                let superseded = self
                    .sessions
                    .get(&(a, b))
                    .is_some_and(|s| s.client == a_inst && s.attempt > attempt);
                match result {
                    DialResult::Accept(hello, conn) if superseded => {
                        // A late answer to an attempt whose successor's session is up: the
                        // daemon drops it without telling its node (engine: DialOk) and closes
                        // the connection; it never replaces the newer session.
                        self.push(
                            now,
                            Ev::ConnClosed {
                                node: b,
                                inst: hello.instance,
                                conn,
                            },
                        );
                    }
                    DialResult::Accept(hello, conn)
                        if !late
                            && self.reachable(a, b)
                            && self.inst(b) == Some(hello.instance) =>
                    {
                        self.remove_session(a, b, Some(a));
                        let sess = Sess {
                            attempt,
                            client: a_inst,
                            server: hello.instance,
                            conn,
                        };
                        self.sessions.insert((a, b), sess);
                        self.node_mut(a).handle_dial_ok(now, peer, attempt, &hello);
                        // The dialler opens its session stream on the connection.
                        let d = self.delay() + self.extra(&self.cond.open_extra, (a, b));
                        self.push(now + d, Ev::SessionOpen { key: (a, b), sess });
                    }
                    DialResult::Refused(m, detail) => {
                        self.node_mut(a)
                            .handle_dial_refused(now, peer, attempt, m, detail);
                    }
                    DialResult::Accept(hello, conn) => {
                        // Accepted there, but the answer never made it back (or too late).
                        let when = if self.is_cut(a, b) {
                            now + PEER_TIMEOUT
                        } else {
                            now
                        };
                        self.push(
                            when,
                            Ev::ConnClosed {
                                node: b,
                                inst: hello.instance,
                                conn,
                            },
                        );
                        self.node_mut(a).handle_dial_failed(
                            now,
                            peer,
                            attempt,
                            DialFailure::Other,
                            "connection reset".into(),
                        );
                    }
                    DialResult::NotListening => {
                        self.node_mut(a).handle_dial_failed(
                            now,
                            peer,
                            attempt,
                            DialFailure::NotListening,
                            "connection refused".into(),
                        );
                    }
                    DialResult::ShuttingDown | DialResult::TimedOut => {
                        self.node_mut(a).handle_dial_failed(
                            now,
                            peer,
                            attempt,
                            DialFailure::Other,
                            "no answer".into(),
                        );
                    }
                }
            }
            Ev::SessionOpen { key, sess } => {
                let (a, b) = key;
                if self.sessions.get(&key) != Some(&sess) || self.inst(b) != Some(sess.server) {
                    return;
                }
                if self.is_cut(a, b) {
                    // The stream's first message: TCP retransmits it like any other.
                    self.push(now + RETRANSMIT, Ev::SessionOpen { key, sess });
                    return;
                }
                if self.node_mut(b).handle_session_opened(now, sess.conn) {
                    self.opened.insert((key, sess.attempt));
                } else {
                    self.note(|| format!("node {b}: closes the session {a} opened"));
                    self.remove_session(a, b, Some(b));
                }
            }
            Ev::HeartbeatArrive {
                a,
                b,
                key,
                sess,
                answer_in,
            } => {
                // A heartbeat travels on the session's stream, behind its opening: the acceptor
                // neither sees nor answers one before the session opened there (requests may
                // come first: `Conditions::open_extra`).
                let unopened = b == key.1 && !self.opened.contains(&(key, sess.attempt));
                if self.sessions.get(&key) == Some(&sess)
                    && !self.is_cut(a, b)
                    && self.inst(b) == Some(sess.inst_at(key, b))
                    && !unopened
                {
                    match sess.via_at(key, b) {
                        Via::Accepted { conn } => {
                            self.node_mut(b).handle_session_heartbeat(now, conn);
                        }
                        via => self.node_mut(b).handle_heartbeat(now, via),
                    }
                    if let Some(back) = answer_in {
                        self.push(now + back, Ev::HeartbeatAck { a, b, key, sess });
                    }
                }
            }
            Ev::HeartbeatAck { a, b, key, sess } => {
                if self.sessions.get(&key) == Some(&sess) && !self.is_cut(a, b) {
                    let via = sess.via_at(key, a);
                    self.node_mut(a).handle_heartbeat(now, via);
                }
            }
            Ev::SessionLost {
                a,
                b,
                attempt,
                a_inst,
            } => {
                if self.inst(a) == Some(a_inst) {
                    self.node_mut(a).handle_session_lost(
                        now,
                        Via::Dialled {
                            peer: Self::id(b),
                            attempt,
                        },
                        "connection reset".into(),
                    );
                }
            }
            Ev::Described {
                node,
                inst,
                request,
                result,
            } => {
                if self.inst(node) == Some(inst) {
                    self.note(|| {
                        format!("node {node}: described for request {request}: {result:?}")
                    });
                    self.node_mut(node).handle_described(now, request, result);
                }
            }
            Ev::DriverReady { node, inst } => {
                if self.inst(node) != Some(inst) {
                    return;
                }
                if let Err(e) = self.slots[node].driver.open_session(inst) {
                    self.violate(e);
                    return;
                }
                self.node_mut(node).handle_driver_ready(now);
            }
            Ev::ConnClosed { node, inst, conn } => {
                if self.inst(node) == Some(inst) {
                    self.node_mut(node).handle_conn_closed(now, conn);
                }
            }
            Ev::Exit { node, inst } => {
                if self.inst(node) == Some(inst) {
                    self.take_down(node, "exited after shutdown");
                }
            }
            Ev::Op(op) => self.run_op(op),
        }
    }

    fn deliver_request(
        &mut self,
        client: usize,
        server: usize,
        key: SessKey,
        sess: Sess,
        rpc: Option<u64>,
        msg: Msg,
    ) {
        let now = self.now;
        let from = PeerId {
            node: Self::id(client),
            instance: sess.inst_at(key, client),
        };
        let request = self.next_request;
        self.next_request += 1;
        if let Some(rpc) = rpc {
            self.server_reqs.insert((server, request), rpc);
        }
        self.note(|| format!("node {server}: from {client} request {request}: {msg:?}"));
        let n = self.node_mut(server);
        let (via, claimed) = (sess.via_at(key, server), Some(from));
        match msg {
            Msg::ImportReq(req) => n.handle_session_import(now, request, via, claimed, req),
            Msg::UnimportReq(e) => n.handle_session_unimport(now, request, via, claimed, e),
            Msg::Goodbye => {
                n.handle_session_goodbye(now, via, claimed, "shutting down");
                // Answered once the server performed what the departure means (its importers
                // of the client's memory disabled), as the daemon's ack waits for its driver.
                self.pump();
                self.respond(server, request, Msg::GoodbyeResp);
            }
            Msg::ImportResp(_) | Msg::UnimportResp | Msg::UnimportRefused | Msg::GoodbyeResp => {
                unreachable!("response sent to a server")
            }
        }
    }

    fn deliver_response(&mut self, server: usize, rpc: Option<u64>, msg: Msg) {
        let now = self.now;
        let Some(r) = rpc.and_then(|rpc| self.rpcs.remove(&rpc)) else {
            return;
        };
        self.note(|| {
            format!(
                "node {}: answer from {server} for {:?}: {msg:?}",
                r.client, r.kind
            )
        });
        let exporter = Self::id(server);
        if let (RpcKind::Import(e), Msg::ImportResp(Ok(_))) = (r.kind, &msg)
            && let Some((key, sess)) = r.sess
        {
            self.answered_by
                .insert((r.client, e), sess.inst_at(key, server));
        }
        let n = self.node_mut(r.client);
        match (r.kind, msg) {
            (RpcKind::Import(e), Msg::ImportResp(answer)) => {
                n.handle_import_answer(now, exporter, e, answer);
            }
            (RpcKind::Unimport(e), Msg::UnimportResp) => {
                n.handle_unimport_delivered(now, exporter, e, true);
            }
            (RpcKind::Unimport(e), Msg::UnimportRefused) => {
                n.handle_unimport_delivered(now, exporter, e, false);
            }
            (RpcKind::Goodbye, Msg::GoodbyeResp) => n.handle_goodbye_delivered(now, exporter, true),
            (kind, msg) => panic!("mismatched response {msg:?} for {kind:?}"),
        }
    }

    // ---- invariants ----------------------------------------------------------------------

    fn validate(&mut self, i: usize, event: u64, result: Result<Pages, Status>) {
        let answered_by = self.answered_by.remove(&(i, event));
        if let Ok(p) = &result {
            // The success must be one an exporter sent, from the instance this node knows now.
            let exporter = parse_pages(p).map_or(usize::MAX, |(n, _)| n);
            let known = self
                .node(i)
                .and_then(|n| n.mesh().peer(Self::id(exporter)))
                .and_then(|(_, inst)| inst);
            match answered_by {
                None => self.violate(format!(
                    "node {i}: import event {event} validated with pages no exporter sent for it"
                )),
                Some(_)
                    if !self
                        .ref_for
                        .iter()
                        .any(|((n, _), held)| *n == exporter && *held == (i, event)) =>
                {
                    self.violate(format!(
                        "node {i}: import event {event} validated, but node {exporter} holds no \
                         reference for it"
                    ));
                }
                Some(by) if Some(by) != known => self.violate(format!(
                    "node {i}: import event {event} validated with an answer from node {exporter} \
                     instance {by}, but this node knows instance {known:?}"
                )),
                Some(_) => {}
            }
        }
        match self.slots[i].driver.validate(event, &result, answered_by) {
            Err(e) => self.violate(format!("node {i}: {e}")),
            Ok(desc) => {
                if result.is_ok() {
                    self.stats.validated_ok += 1;
                } else {
                    self.stats.validated_err += 1;
                }
                let Ok(pages) = &result else { return };
                let Some((node, exp_id)) = parse_pages(pages) else {
                    self.violate(format!(
                        "node {i}: import event {event} validated with no pages"
                    ));
                    return;
                };
                if let Some((_, key)) = desc
                    && (key.0, key.1) != (node, exp_id)
                {
                    self.violate(format!(
                        "node {i}: import event {event} of export {:?} validated with the pages of \
                         node {node} export {exp_id}",
                        (key.0, key.1)
                    ));
                }
                let freed = self
                    .slots
                    .get(node)
                    .and_then(|s| s.driver.exports.get(&exp_id))
                    .is_none_or(|e| e.freed);
                if freed {
                    self.violate(format!(
                        "node {i}: import event {event} validated against released memory (node \
                         {node} export {exp_id})"
                    ));
                }
            }
        }
    }

    /// Export `exp_id` of `node` was freed: nobody may still map it, unless the exporter's own
    /// session teardown dropped the daemon's references on it (the daemon died: the driver
    /// disables fabric allocation, and importers are revoked once the restarted exporter is
    /// seen), or the mapping node is itself shutting down (its session teardown revokes them).
    pub fn on_freed(&mut self, node: usize, exp_id: u64, by_teardown: bool) {
        let dangled = self.slots[node]
            .driver
            .exports
            .get(&exp_id)
            .is_some_and(|e| e.dangled);
        self.note(|| {
            format!(
                "node {node}: export {exp_id} freed (teardown={by_teardown}, dangled={dangled})"
            )
        });
        if by_teardown || dangled {
            return;
        }
        for j in 0..self.p.n {
            let exiting = self.slots[j].daemon.as_ref().is_some_and(|d| d.exiting);
            let maps = self.slots[j].driver.maps(node, exp_id);
            if maps > 0 && !exiting {
                self.violate(format!(
                    "node {node}: export {exp_id} freed while node {j} still maps it ({maps} live \
                     imports)"
                ));
            }
        }
    }

    fn check_deadlines(&mut self) {
        let now = self.now;
        let import_by = self.p.import_timeout + SLACK;
        let unimport_by = self.p.import_timeout * 2 + SLACK;
        let mut late = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            for (e, (posted, _)) in &s.driver.pending {
                if now > *posted + import_by {
                    late.push((i, *e, true, now - *posted));
                }
            }
            for (u, w) in &s.driver.waiters {
                if now > w.since + unimport_by {
                    late.push((i, *u, false, now - w.since));
                }
            }
        }
        for (i, e, import, age) in late {
            if import {
                self.slots[i].driver.pending.remove(&e);
                self.violate(format!(
                    "node {i}: import event {e} neither validated nor failed after {age:?} \
                     (timeout {:?})",
                    self.p.import_timeout
                ));
            } else {
                self.slots[i].driver.waiters.remove(&e);
                self.violate(format!(
                    "node {i}: releaser of unimport event {e} still blocked after {age:?}"
                ));
            }
        }
    }

    /// The checks once everything is released and the domain is quiet.
    pub fn final_check(&mut self) {
        let mut problems = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            problems.extend(
                s.driver
                    .describe_leaks()
                    .into_iter()
                    .map(|l| format!("leak: {l}")),
            );
            for (u, w) in &s.driver.waiters {
                problems.push(format!(
                    "node {i}: releaser of unimport event {u} (import {}) still blocked",
                    w.import_event_id
                ));
            }
            for e in s.driver.pending.keys() {
                problems.push(format!("node {i}: import event {e} never validated"));
            }
            for d in s.driver.descs.values() {
                if d.state == DescState::Pending {
                    problems.push(format!("node {i}: descriptor {:?} still pending", d.key));
                }
            }
            match s.daemon.as_ref() {
                Some(d) => {
                    let n = &d.node;
                    let mut line = String::new();
                    if n.export_refs_held() != 0 {
                        let _ = write!(line, " export_refs_held={}", n.export_refs_held());
                    }
                    if n.imports_known() != 0 {
                        let _ = write!(line, " imports_known={}", n.imports_known());
                    }
                    if n.describes_in_flight() != 0 {
                        let _ = write!(line, " describes_in_flight={}", n.describes_in_flight());
                    }
                    if !line.is_empty() {
                        problems.push(format!("node {i}: Node not empty at the end:{line}"));
                    }
                }
                None => problems.push(format!("node {i}: daemon down at the end")),
            }
        }
        for p in problems {
            self.violate(p);
        }
    }
}
