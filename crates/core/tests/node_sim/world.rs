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
//!
//! This file holds the world's state, its construction and the helpers every part uses; the
//! parts: `events.rs` (the queue of timed inputs), `run.rs` (the loop that advances time and
//! drains every node), `lifecycle.rs` (daemons start, die and shut down), `sessions.rs` (dials,
//! session streams, heartbeats, resets), `rpc.rs` (requests and answers on a session),
//! `perform.rs` (what each action of a node does here), `reread.rs` (SIGUSR1 and names that
//! move), `owed.rs` (the deadlines the nodes decide: hellos, retired sessions, goodbyes) and
//! `invariants.rs` (the checks).

mod events;
mod invariants;
mod jobs;
mod lifecycle;
mod owed;
mod perform;
mod reread;
mod rpc;
mod run;
mod sessions;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::io::Write as _;
use std::time::{Duration, Instant};

use openimex_core::node::Action;
use openimex_core::*;

use crate::driver::Driver;
use crate::rng::Rng;
use events::Queued;
use owed::{ConnKey, Retired};
use rpc::{ChannelKey, InFlight, Rpc};
use sessions::{Sess, SessKey};

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
    /// Every node's bound on imports in flight per exporter (`Node::set_max_imports_in_flight`):
    /// small, so a seed's traffic reaches it and imports wait for their turn.
    pub max_imports_in_flight: usize,
}

/// How many kinds of fault the chaos script knows.
pub const FAULT_KINDS: usize = 16;
/// The kinds a seed's weights were drawn for before the uneven heal (issue 28): drawn first,
/// so a seed's other parameters stay what they were.
pub const FAULT_KINDS_BEFORE_28: usize = 10;
/// The kinds before the SIGUSR1 re-read (issue 30), drawn before it for the same reason.
pub const FAULT_KINDS_BEFORE_30: usize = 11;

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
    /// Imports posted while others to the same exporter waited for a slot.
    pub waited: u64,
    /// Imports whose turn came with no session to their exporter (`Action::ImportNotSent`).
    pub not_sent: u64,
    /// SIGUSR1 re-reads, and the peers they dialled again.
    pub rereads: u64,
    pub redialled: u64,
    /// Nodes' lines removed from the nodes file (issue 31), and the holes re-reads made.
    pub lines_removed: u64,
    pub holes: u64,
    /// Hellos sent again with the node map's entries, which the peer asked for (its map's
    /// digest was not the dialler's).
    pub maps_asked: u64,
    /// Connections closed at their hello deadline, retired sessions ended at their wait, and
    /// goodbyes a shutdown stopped waiting for (`owed.rs`).
    pub hello_deadlines: u64,
    pub silent_streams_ended: u64,
    pub retired_ended: u64,
    pub goodbyes_unanswered: u64,
    /// Requests refused because they came on a session the receiver had retired.
    pub refused_on_retired: u64,
    /// GPUs moved to another clique (issue 30), and clique notifications delivered.
    pub gpu_moves: u64,
    pub cliques_told: u64,
    /// Jobs started (issue 31), definitions the nodes accepted and refused.
    pub jobs_started: u64,
    pub jobs_defined: u64,
    pub jobs_refused: u64,
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
        self.waited += o.waited;
        self.not_sent += o.not_sent;
        self.rereads += o.rereads;
        self.redialled += o.redialled;
        self.lines_removed += o.lines_removed;
        self.holes += o.holes;
        self.maps_asked += o.maps_asked;
        self.hello_deadlines += o.hello_deadlines;
        self.silent_streams_ended += o.silent_streams_ended;
        self.retired_ended += o.retired_ended;
        self.goodbyes_unanswered += o.goodbyes_unanswered;
        self.refused_on_retired += o.refused_on_retired;
        self.gpu_moves += o.gpu_moves;
        self.cliques_told += o.cliques_told;
        self.jobs_started += o.jobs_started;
        self.jobs_defined += o.jobs_defined;
        self.jobs_refused += o.jobs_refused;
    }
}

pub struct Daemon {
    pub node: Node,
    pub instance: InstanceId,
    /// Shut down cleanly; the process exits soon.
    pub exiting: bool,
    /// When it shut down.
    pub stopped_at: Option<Instant>,
    /// Its node stopped waiting for the goodbyes (`Action::GoodbyesOver`).
    pub goodbyes_over: bool,
    /// The process would have exited already, but its node still waits for the goodbyes.
    pub exit_due: bool,
    /// What the world did with its jobs (`world/jobs.rs`).
    pub jobs: jobs::DaemonJobs,
}

pub struct Slot {
    pub daemon: Option<Daemon>,
    pub driver: Driver,
    /// The daemon's persist record (a file: it outlives the daemon).
    pub persist: Vec<NodeId>,
    /// The node's job files (they outlive the daemon), by job name.
    pub job_files: BTreeMap<String, openimex_core::jobs::JobSpec>,
}

/// A scripted operation (applications and faults); see `chaos.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    AppTick,
    FaultTick,
    Restart(usize),
    Heal,
    Calm,
    /// SIGUSR1 on this node: it re-reads the nodes file and re-resolves every entry.
    Reread(usize),
    /// Every removed line of the nodes file written back in its place (`reread.rs`).
    RestoreLines,
    /// A prolog or epilog: `World::job_ops[k]`.
    Job(usize),
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
    /// Accepted connections without an accepted hello yet, with when and whether a stranger's.
    unheard: BTreeMap<ConnKey, (Instant, bool)>,
    /// Connections a node closed (its hello deadline), until their end is reported.
    closed_conns: BTreeSet<ConnKey>,
    /// Session streams opened without their first frame yet: (node, instance, stream) →
    /// when.
    silent: BTreeMap<(usize, u64, u64), Instant>,
    next_stream: u64,
    /// Sessions retired by one end or both, until they end.
    retired: BTreeMap<SessKey, Retired>,
    /// The node handling a request that arrived on a session it had retired, meanwhile.
    on_retired: Option<usize>,
    /// Each node's address generation: its entry resolves to 10.9.<node>.<generation>, which a
    /// DNS change moves (`reread.rs`).
    pub addr_gen: Vec<u8>,
    /// The prologs and epilogs scheduled (`Op::Job`).
    pub job_ops: Vec<jobs::JobOp>,
    /// Each node's line in the shared nodes file: `None` present, `Some(true)` deleted,
    /// `Some(false)` written as `0.0.0.0` (`reread.rs`, issue 31's holes).
    pub line_out: Vec<Option<bool>>,
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
                job_files: BTreeMap::new(),
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
            addr_gen: vec![1; p.n],
            job_ops: Vec::new(),
            line_out: vec![None; p.n],
            unheard: BTreeMap::new(),
            closed_conns: BTreeSet::new(),
            silent: BTreeMap::new(),
            next_stream: 1,
            retired: BTreeMap::new(),
            on_retired: None,
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

    /// The extra delay `table` sets for `key`, if any.
    fn extra<K: Ord>(&self, table: &BTreeMap<K, Duration>, key: K) -> Duration {
        table.get(&key).copied().unwrap_or_default()
    }

    fn delay(&mut self) -> Duration {
        let max = self.cond.max_delay;
        self.rng.upto(max)
    }
}
