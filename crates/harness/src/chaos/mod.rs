//! The chaos engine: a workload of real application processes on a real cluster (simulated
//! GPU drivers and daemons), seeded random faults injected into it one after another, the
//! time each takes to recover, and the invariants checked at the end. `openimex-lab demo --chaos`
//! and the chaos tests both run it.
//!
//! - Workload ([`workload`]): per exporting GPU an `openimex-lab app churn` that allocates,
//!   writes a canary into the new memory, then a pattern of a fresh seed, exports and publishes
//!   the handle, holds it, releases it, again and again; per importing GPU an
//!   `openimex-lab app reader` that imports what every exporter on the other nodes publishes and
//!   checks it continuously. Reads are `ok`, `stale` (the canary: memory freed and reused under
//!   a live mapping), `freed` (zeros: memory freed, not yet reused) or `corrupt`. Dead apps are
//!   started again once their node's daemon is READY, as a scheduler would.
//! - Faults ([`faults`]): drawn with `StdRng::seed_from_u64(seed)`; a fault is a plan of
//!   actions (kill -9, restart, SIGSTOP/SIGCONT, a node's links cut and healed through the
//!   [`partition`] proxies) at offsets. It has *recovered* when the domain is UP and every
//!   (reader, exporter) pair has imported after the last repair step and read the pattern of
//!   that import (a newer import not yet read does not undo it). The time from that step is its
//!   time to recover. The engine injects them and performs their steps (`inject`) and judges
//!   their recovery (`recovery`).
//! - End (`invariants`): no new faults, every node back, the workload recovered, every app
//!   told to release and exit, then: zero stale reads, zero corrupt reads, every driver's
//!   reference counters at zero, the domain UP on every node.
//!
//! The engine runs on the calling thread (the cluster's processes die with it) and polls: app
//! output arrives on a channel from reader threads.

pub mod faults;
mod inject;
mod invariants;
pub mod partition;
mod recovery;
mod report;
pub mod workload;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cluster::is_up;
use crate::{Cluster, ClusterSpec, GpuSpec, HarnessError};
pub use faults::{FaultKind, FaultRecord, Outcome};
use inject::Active;
pub use invariants::REF_COUNTERS;
use recovery::Pair;
pub use report::{ChaosReport, Progress};
use workload::{App, AppTiming, Event, Exit, Line, Role};

/// How faults follow one another.
#[derive(Debug, Clone, Copy)]
pub enum Pacing {
    /// The next fault comes a random pause (between the two bounds) after the previous one
    /// recovered (or was given up on): one time to recover per fault.
    AfterRecovery(Duration, Duration),
    /// One fault every period, recovered or not (long kill/restart series).
    Every(Duration),
}

/// What to run. [`ChaosSpec::all_to_all`] and [`ChaosSpec::one_exporter`] give the usual
/// layouts; adjust the public fields after.
#[derive(Debug, Clone)]
pub struct ChaosSpec {
    /// The binary that runs the daemons (see [`ClusterSpec::binary`]).
    pub binary: PathBuf,
    /// The lab binary: simulated drivers and the applications (see [`ClusterSpec::lab_binary`]).
    pub lab_binary: PathBuf,
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Simulated GPUs per node.
    pub gpus_per_node: u32,
    /// Nodes whose GPUs export.
    pub exporters: Vec<usize>,
    /// Nodes whose GPUs import from every exporter on another node.
    pub readers: Vec<usize>,
    /// Seed of every random choice.
    pub seed: u64,
    /// How long faults are injected.
    pub duration: Duration,
    /// Stop injecting after this many faults.
    pub max_faults: Option<usize>,
    /// The kinds drawn from (uniformly).
    pub kinds: Vec<FaultKind>,
    /// Take the kinds in their order, round robin, instead of drawing them.
    pub cycle_kinds: bool,
    /// How faults follow one another.
    pub pacing: Pacing,
    /// Bound on one recovery (and on the final one).
    pub recover_timeout: Duration,
    /// `IMEX_NODE_DISCONNECTED_GRACE_TIME`, seconds.
    pub grace_secs: u64,
    /// Keep the cluster directory afterwards.
    pub keep_dir: bool,
    /// Run the cluster in names mode with a TCP proxy on every link, so that partitions can be
    /// injected (needs root, for the daemons' private `/etc/hosts`).
    pub partitions: bool,
}

impl ChaosSpec {
    /// Every node exports on every GPU and imports every other node's GPUs; `binary` (the lab
    /// binary) runs every process.
    pub fn all_to_all(binary: impl Into<PathBuf>, nodes: usize, gpus_per_node: u32) -> Self {
        let all: Vec<usize> = (0..nodes).collect();
        let binary = binary.into();
        Self {
            lab_binary: binary.clone(),
            binary,
            nodes,
            gpus_per_node,
            exporters: all.clone(),
            readers: all,
            seed: 1,
            duration: Duration::from_secs(60),
            max_faults: None,
            kinds: FaultKind::ALL.to_vec(),
            cycle_kinds: false,
            pacing: Pacing::AfterRecovery(Duration::from_millis(200), Duration::from_millis(1500)),
            recover_timeout: Duration::from_secs(60),
            grace_secs: 4,
            keep_dir: false,
            partitions: false,
        }
    }

    /// Node 0 exports, the others import (so "exporter" and "importer" faults differ).
    pub fn one_exporter(binary: impl Into<PathBuf>, nodes: usize, gpus_per_node: u32) -> Self {
        Self {
            exporters: vec![0],
            readers: (1..nodes).collect(),
            ..Self::all_to_all(binary, nodes, gpus_per_node)
        }
    }
}

/// Heartbeat and peer timeout of chaos clusters: short, so faults are noticed quickly.
const HEARTBEAT_MS: u64 = 300;
const PEER_TIMEOUT_MS: u64 = 2000;
/// Pause before a dead app is started again.
const RESPAWN: Duration = Duration::from_millis(300);
/// How often the domain and READY states are asked for (each is a `ctl` process).
const CTL_EVERY: Duration = Duration::from_millis(300);
/// A recovery slower than this gets a note saying which pair was last.
const SLOW_RECOVERY: Duration = Duration::from_secs(5);
/// Engine loop period.
const TICK: Duration = Duration::from_millis(20);

/// Runs the workload with faults and the end checks; `progress` is called about once a second.
/// An `Err` means the harness itself could not run (no binary, no addresses); invariant
/// failures are in the report ([`ChaosReport::passed`]).
pub fn run(spec: &ChaosSpec, progress: impl FnMut(&Progress)) -> Result<ChaosReport, HarnessError> {
    let mut engine = Engine::start(spec)?;
    engine.run(progress)
}

/// Per-node state the engine keeps.
#[derive(Debug, Default, Clone)]
struct NodeState {
    stopped: bool,
    /// A daemon the engine killed (or whose driver it killed): not a crash when found dead.
    down: bool,
    ready: Option<(Instant, bool)>,
}

/// Counts of everything the apps reported.
#[derive(Debug, Default, Clone)]
struct Counters {
    imports: u64,
    import_failures: u64,
    other_failures: u64,
    reads: u64,
    stale: u64,
    freed: u64,
    corrupt: u64,
    revoked: u64,
    lost_driver: u64,
    crashes: u64,
    restarts: u64,
    daemon_crashes: u64,
    import_micros: Vec<u64>,
}

struct Engine<'s> {
    spec: &'s ChaosSpec,
    /// Before `cluster`: apps are killed (on drop) before the drivers they talk to.
    apps: Vec<App>,
    events: Receiver<Event>,
    sender: Sender<Event>,
    cluster: Cluster,
    /// The partition proxies (empty unless [`ChaosSpec::partitions`]).
    links: Vec<partition::Link>,
    rng: StdRng,
    nodes: Vec<NodeState>,
    pairs: HashMap<(usize, String), Pair>,
    counts: Counters,
    records: Vec<FaultRecord>,
    active: Option<Active>,
    /// Faults whose steps are done and whose recovery is awaited: (record, since).
    awaiting: Vec<(usize, Instant)>,
    notes: Vec<String>,
    started: Instant,
    domain_checked: Option<(Instant, bool)>,
}

impl<'s> Engine<'s> {
    fn start(spec: &'s ChaosSpec) -> Result<Self, HarnessError> {
        let gpus = GpuSpec {
            gpus_per_node: spec.gpus_per_node,
            hbm_mib: 64,
            channels: 1,
            ..GpuSpec::default()
        };
        let mut cspec = ClusterSpec::new(spec.nodes, &spec.binary)
            .with_lab_binary(&spec.lab_binary)
            .with_gpus(gpus)
            .config(
                "IMEX_NODE_DISCONNECTED_GRACE_TIME",
                spec.grace_secs.to_string(),
            )
            .config("IMEX_WAIT_FOR_QUORUM", "RECOVERY");
        cspec.heartbeat_ms = HEARTBEAT_MS;
        cspec.peer_timeout_ms = PEER_TIMEOUT_MS;
        cspec.keep_dir = spec.keep_dir;
        let (cluster, links) = if spec.partitions {
            let mut cluster = Cluster::prepare(cspec.with_names())?;
            let links = partition::links(&mut cluster)?;
            for i in 0..spec.nodes {
                cluster.start_node(i)?;
            }
            (cluster, links)
        } else {
            (Cluster::start(cspec)?, Vec::new())
        };
        cluster.wait_up(0, Duration::from_secs(120))?;
        let handles = cluster.base_dir().join("handles");
        std::fs::create_dir_all(&handles).map_err(HarnessError::io(
            "create the handle directory",
            &handles,
            "check that the temp dir (TMPDIR) is writable",
        ))?;
        let dirs: Vec<PathBuf> = (0..spec.nodes)
            .map(|i| cluster.node(i).dir().to_path_buf())
            .collect();
        let timing = AppTiming {
            hold_ms: 400,
            canary_ms: 100,
            interval_ms: 50,
        };
        let apps: Vec<App> = workload::layout(
            &dirs,
            spec.gpus_per_node,
            &spec.exporters,
            &spec.readers,
            &handles,
            timing,
        )
        .into_iter()
        .map(App::new)
        .collect();
        let mut pairs = HashMap::new();
        for (i, r) in apps.iter().enumerate() {
            if r.spec.role != Role::Reader {
                continue;
            }
            for e in apps.iter().filter(|e| e.spec.role == Role::Exporter) {
                if e.spec.node != r.spec.node {
                    let fresh = Pair {
                        imported: None,
                        confirmed: None,
                        last_bad: None,
                    };
                    pairs.insert((i, e.spec.name.clone()), fresh);
                }
            }
        }
        let (sender, events) = mpsc::channel();
        Ok(Self {
            spec,
            apps,
            events,
            sender,
            cluster,
            links,
            rng: StdRng::seed_from_u64(spec.seed),
            nodes: vec![NodeState::default(); spec.nodes],
            pairs,
            counts: Counters::default(),
            records: Vec::new(),
            active: None,
            awaiting: Vec::new(),
            notes: Vec::new(),
            started: Instant::now(),
            domain_checked: None,
        })
    }

    fn run(&mut self, mut progress: impl FnMut(&Progress)) -> Result<ChaosReport, HarnessError> {
        self.started = Instant::now();
        let mut last = Instant::now();
        let mut tick = |e: &mut Self, phase: &'static str| {
            if last.elapsed() >= Duration::from_secs(1) {
                last = Instant::now();
                progress(&e.progress(phase));
            }
        };
        // Warm-up: the workload must be running before the first fault (a storm to hit).
        let warm = Instant::now();
        if !self.wait_recovered(warm, &mut |e| tick(e, "warm-up")) {
            self.notes.push(format!(
                "the workload did not reach steady state within {:?}, before any fault",
                self.spec.recover_timeout
            ));
        }
        let window = Instant::now();
        let mut next_fault = Some(Instant::now() + Duration::from_millis(500));
        loop {
            self.step();
            tick(self, "faults");
            let more = window.elapsed() < self.spec.duration
                && self.spec.max_faults.is_none_or(|m| self.records.len() < m);
            if self.active.is_some() {
                continue;
            }
            match self.spec.pacing {
                Pacing::AfterRecovery(lo, hi) => {
                    if !self.awaiting.is_empty() {
                        continue;
                    }
                    if !more {
                        break;
                    }
                    let due = *next_fault.get_or_insert_with(|| {
                        let (lo, hi) = (lo.as_millis() as u64, hi.as_millis() as u64);
                        Instant::now()
                            + Duration::from_millis(self.rng.random_range(lo..=hi.max(lo)))
                    });
                    if Instant::now() >= due {
                        self.inject();
                        next_fault = None;
                    }
                }
                Pacing::Every(period) => {
                    if !more {
                        if self.awaiting.is_empty() {
                            break;
                        }
                        continue;
                    }
                    if next_fault.is_none_or(|due| Instant::now() >= due) {
                        for (record, _) in self.awaiting.drain(..) {
                            self.records[record].outcome = Some(Outcome::Overlapped);
                        }
                        self.inject();
                        next_fault = Some(Instant::now() + period);
                    }
                }
            }
        }
        self.finish(&mut |e| tick(e, "settling"))
    }

    /// Runs the engine until every pair made progress after `since` and the domain is UP, or
    /// for `recover_timeout`. True if it did.
    fn wait_recovered(&mut self, since: Instant, tick: &mut dyn FnMut(&mut Self)) -> bool {
        let deadline = Instant::now() + self.spec.recover_timeout;
        loop {
            self.step();
            tick(self);
            if self.progressed_since(since) && self.domain_up() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }

    /// One round: app output, app and node supervision, the fault's due steps, recoveries.
    fn step(&mut self) {
        if let Ok(ev) = self.events.recv_timeout(TICK) {
            self.handle(ev);
            while let Ok(ev) = self.events.try_recv() {
                self.handle(ev);
            }
        }
        self.supervise_apps();
        self.supervise_nodes();
        self.run_steps();
        self.check_recoveries();
    }

    fn handle(&mut self, ev: Event) {
        let c = &mut self.counts;
        let app = &self.apps[ev.app];
        let who = format!("{} {}", workload::role_name(app.spec.role), app.spec.name);
        if let Some((tag, what)) = ev.line.complaint()
            && let Some(p) = self.pairs.get_mut(&(ev.app, tag.to_owned()))
        {
            p.last_bad = Some(what);
        }
        match ev.line {
            Line::Imported { tag, seed, micros } => {
                c.imports += 1;
                c.import_micros.push(micros);
                if let Some(p) = self.pairs.get_mut(&(ev.app, tag)) {
                    p.imported_at(ev.at, seed);
                }
            }
            Line::Ok { tag, seed, n } => {
                c.reads += n;
                if let Some(p) = self.pairs.get_mut(&(ev.app, tag)) {
                    p.read_good(&seed);
                }
            }
            Line::Fail { op, code, .. } => {
                if op == "import" {
                    c.import_failures += 1;
                    if let Some(r) = self.records.last_mut() {
                        r.import_failures += 1;
                    }
                } else {
                    c.other_failures += 1;
                }
                let _ = code;
            }
            Line::Stale { detail } => {
                c.stale += 1;
                self.note(format!("STALE READ by {who}: canary at {detail}"));
            }
            Line::Corrupt { detail } => {
                c.corrupt += 1;
                self.note(format!("DATA ERROR seen by {who}: {detail}"));
            }
            Line::Freed { .. } => c.freed += 1,
            Line::Exported | Line::Other(_) => {}
        }
    }

    /// Keeps the first notes (a run with a bug would print thousands).
    fn note(&mut self, text: String) {
        if self.notes.len() < 40 {
            let at = self.started.elapsed().as_secs_f64();
            self.notes.push(format!("t={at:.1}s {text}"));
        }
    }

    /// Reaps dead apps (classifying how they died) and starts them again once due and their
    /// node's daemon is READY.
    fn supervise_apps(&mut self) {
        for i in 0..self.apps.len() {
            if let Some((exit, status)) = self.apps[i].reap() {
                match exit {
                    Exit::Revoked => {
                        self.counts.revoked += 1;
                        if let Some(r) = self.records.last_mut() {
                            r.revoked += 1;
                        }
                    }
                    Exit::LostDriver => self.counts.lost_driver += 1,
                    Exit::Crashed => {
                        self.counts.crashes += 1;
                        let note = self.apps[i].crash_note(&status);
                        self.note(format!("app crashed: {note}"));
                    }
                    Exit::Killed | Exit::Clean => {}
                }
                self.apps[i].respawn_at = Some(Instant::now() + RESPAWN);
            }
            let app = &self.apps[i];
            if app.is_running() || app.respawn_at.is_none_or(|t| Instant::now() < t) {
                continue;
            }
            let node = app.spec.node;
            if !self.node_ready(node) {
                continue;
            }
            if self.apps[i].starts > 0 {
                self.counts.restarts += 1;
            }
            let binary = self.spec.lab_binary.clone();
            if let Err(e) = self.apps[i].spawn(&binary, i, &self.sender) {
                self.note(format!("cannot start app {}: {e}", self.apps[i].spec.name));
                self.apps[i].respawn_at = Some(Instant::now() + RESPAWN);
            }
        }
    }

    /// A daemon that died without the engine killing it is a crash: noted, and restarted as an
    /// operator (or systemd) would.
    fn supervise_nodes(&mut self) {
        for n in 0..self.nodes.len() {
            if self.nodes[n].down || self.cluster.is_running(n) {
                continue;
            }
            self.counts.daemon_crashes += 1;
            let log = self.cluster.node(n).logs(Some(15));
            self.note(format!(
                "daemon of node {n} exited on its own; log tail:\n{log}"
            ));
            self.exec(faults::Action::Start(n));
        }
    }

    /// Is node `n`'s daemon READY (`ctl -q`)? Asked at most every [`CTL_EVERY`].
    fn node_ready(&mut self, n: usize) -> bool {
        if self.nodes[n].down || self.nodes[n].stopped {
            return false;
        }
        if let Some((at, ready)) = self.nodes[n].ready
            && at.elapsed() < CTL_EVERY
        {
            return ready;
        }
        let ready = self
            .cluster
            .ctl(n, &["-q"])
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "READY");
        self.nodes[n].ready = Some((Instant::now(), ready));
        ready
    }

    /// The domain UP as node 0 (or the first live node) sees it. Asked at most every
    /// [`CTL_EVERY`].
    fn domain_up(&mut self) -> bool {
        if let Some((at, up)) = self.domain_checked
            && at.elapsed() < CTL_EVERY
        {
            return up;
        }
        let n = self.cluster.len();
        let asked = (0..n).find(|&i| !self.nodes[i].down && !self.nodes[i].stopped);
        let up = asked.is_some_and(|i| self.cluster.domain(i).is_ok_and(|d| is_up(&d, n)));
        self.domain_checked = Some((Instant::now(), up));
        up
    }
}
