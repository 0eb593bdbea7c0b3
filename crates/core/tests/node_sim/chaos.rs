//! One seeded run: applications export and import while faults strike (kill -9 and restart,
//! clean shutdown with goodbyes, partitions and heals, uneven heals after which the two sides
//! disagree on the link, message loss, long delays and slow driver calls, names that move and
//! SIGUSR1 re-reads, strangers that connect and never say hello); then the faults stop, the
//! domain heals, the applications release everything, and the final invariants are checked.

use std::time::Duration;

use openimex_core::QuorumPolicy;
use openimex_core::node::{FABRIC_REFRESH, RETIRE_WAIT};

use crate::driver::ImportCall;
use crate::rng::Rng;
use crate::world::{
    Conditions, FAULT_KINDS, FAULT_KINDS_BEFORE_28, FAULT_KINDS_BEFORE_30, Handle, Op, Params,
    Stats, World,
};

/// What one seed did.
pub struct Outcome {
    pub violations: Vec<String>,
    pub stats: Stats,
    /// A digest of the run, to check that a seed replays identically.
    pub digest: u64,
}

/// The parameters a seed draws.
pub fn params(seed: u64) -> Params {
    let mut rng = Rng::new(seed ^ 0xA5A5_5A5A);
    let n = [2, 3, 3, 4, 4, 5][rng.below(6)];
    let quorum = if rng.chance(150) {
        QuorumPolicy::Full
    } else {
        QuorumPolicy::None
    };
    // Each seed has its own mix of faults and pace.
    let mut fault_weights = [0; FAULT_KINDS];
    for w in fault_weights.iter_mut().take(FAULT_KINDS_BEFORE_28) {
        *w = rng.below(4) as u32;
    }
    if fault_weights.iter().all(|w| *w == 0) {
        fault_weights[rng.below(FAULT_KINDS_BEFORE_28)] = 1;
    }
    let lo = 200 + rng.below(1300) as u64;
    let fault_gap = (lo, lo + 500 + rng.below(2500) as u64);
    let lo = 5 + rng.below(60) as u64;
    let app_gap = (lo, lo + 50 + rng.below(200) as u64);
    let import_timeout = rng.ms(400, 2500);
    // Drawn last, so the other parameters of a seed are what they were before grace times.
    // A lost peer is cleaned up after its grace time while it may be alive behind a partition:
    // the invariants then check that it fenced its importers before our memory went.
    let grace = if rng.chance(400) {
        None
    } else {
        Some(rng.ms(0, 4000))
    };
    for w in (fault_weights.iter_mut())
        .take(FAULT_KINDS_BEFORE_30)
        .skip(FAULT_KINDS_BEFORE_28)
    {
        *w = rng.below(4) as u32;
    }
    // Drawn last too (issue 30): the bound on imports in flight per exporter, mostly small so
    // imports wait for their turn, sometimes the daemon's.
    let max_imports_in_flight = [1, 2, 4, openimex_core::node::MAX_IMPORTS_IN_FLIGHT][rng.below(4)];
    for w in fault_weights.iter_mut().skip(FAULT_KINDS_BEFORE_30) {
        *w = rng.below(4) as u32;
    }
    Params {
        n,
        quorum,
        import_timeout,
        fault_weights,
        fault_gap,
        app_gap,
        grace,
        max_imports_in_flight,
    }
}

pub fn run_seed(seed: u64, trace: bool) -> Outcome {
    let p = params(seed);
    let mut w = World::new(p.clone(), seed, trace);
    w.note(|| format!("seed {seed}: {p:?}"));
    for i in 0..p.n {
        w.start(i);
    }
    // Let the domain form, then let applications and faults loose.
    w.run_while_not(Duration::from_secs(10), World::all_up);
    let chaos = w.rng.ms(5_000, 15_000);
    w.chaos_end = w.now + chaos;
    let now = w.now;
    w.schedule_op(now, Op::AppTick);
    let first_fault = w.rng.ms(200, 2_000);
    w.schedule_op(now + first_fault, Op::FaultTick);
    let end = w.chaos_end;
    w.run_until(end);
    quiesce(&mut w);
    let digest = digest(&w);
    Outcome {
        violations: w.violations,
        stats: w.stats,
        digest,
    }
}

/// Stop the faults, heal, bring every daemon back, release everything, let it settle, check.
pub fn quiesce(w: &mut World) {
    w.note(|| "---- quiesce: heal, restart, release everything ----".into());
    w.cut.clear();
    w.cond = Conditions::calm();
    // A daemon that is exiting finishes exiting first.
    w.run_while_not(Duration::from_secs(10), |w| {
        w.slots
            .iter()
            .all(|s| s.daemon.as_ref().is_none_or(|d| !d.exiting))
    });
    // Removed lines go back where they were, and every daemon re-reads the file.
    w.restore_lines();
    for i in 0..w.p.n {
        w.reread(i);
    }
    for i in 0..w.p.n {
        w.start(i);
    }
    if !w.run_while_not(Duration::from_secs(60), World::all_up) {
        w.violate("the domain did not re-form after the faults stopped".into());
    }
    release_all(w);
    let settle = w.p.import_timeout * 3 + Duration::from_secs(4);
    w.run_for(settle);
    // One session per pair: both sides name the same one, and no other is left open. A late
    // SIGUSR1 may have just dropped a session the peer still counts on: the peer learns when
    // its heartbeats go unanswered or the retired session ends (its retire wait), then redials.
    let converge = RETIRE_WAIT + Duration::from_secs(3);
    if !w.run_while_not(converge, World::settled) {
        let seen = w.sessions_seen();
        w.violate(format!(
            "the domain did not settle on one session per pair: {seen}"
        ));
    }
    // Every node reads its probes again within a refresh, and tells its peers what changed.
    let told = FABRIC_REFRESH + Duration::from_secs(1);
    if !w.run_while_not(told, |w| w.cliques_disagree().is_none()) {
        let why = w.cliques_disagree().unwrap_or_default();
        w.violate(format!("the cliques did not settle: {why}"));
    }
    w.final_check();
}

/// Every application releases its imports and exports.
pub fn release_all(w: &mut World) {
    while let Some((node, desc)) = w.app_imports.pop() {
        release_import(w, node, desc);
    }
    while let Some((node, exp)) = w.app_exports.pop() {
        release_export(w, node, exp);
    }
    w.pump();
}

pub fn release_import(w: &mut World, node: usize, desc: u64) {
    let now = w.now;
    if let Some(u) = w.slots[node].driver.release_import(now, desc) {
        w.stats.unimports += 1;
        w.note(|| {
            format!("node {node}: app releases descriptor {desc}: unimport event {u}, blocked")
        });
    } else {
        w.note(|| format!("node {node}: app releases descriptor {desc}"));
    }
}

pub fn release_export(w: &mut World, node: usize, exp: u64) {
    w.note(|| format!("node {node}: app releases export {exp}"));
    if let Some(freed) = w.slots[node].driver.release_export(exp) {
        // Released by its creator: no daemon reference was left, so nobody may map it.
        w.on_freed(node, freed, false);
    }
}

impl World {
    pub fn run_op(&mut self, op: Op) {
        let now = self.now;
        let chaos = now < self.chaos_end;
        match op {
            Op::AppTick if chaos => {
                self.app_op();
                let (lo, hi) = self.p.app_gap;
                let next = self.rng.ms(lo, hi);
                self.schedule_op(now + next, Op::AppTick);
            }
            Op::FaultTick if chaos => {
                self.fault();
                let (lo, hi) = self.p.fault_gap;
                let next = self.rng.ms(lo, hi);
                self.schedule_op(now + next, Op::FaultTick);
            }
            Op::AppTick | Op::FaultTick => {}
            Op::Restart(i) => {
                if self.slots[i].daemon.as_ref().is_some_and(|d| d.exiting) {
                    let later = self.rng.ms(50, 300);
                    self.schedule_op(now + later, Op::Restart(i));
                } else {
                    self.start(i);
                }
            }
            Op::Heal => {
                self.note(|| "heal".into());
                self.cut.clear();
            }
            Op::Calm => {
                self.note(|| "network calm".into());
                self.cond = Conditions::calm();
            }
            Op::Reread(i) => self.reread(i),
            Op::RestoreLines => self.restore_lines(),
            Op::Job(k) => self.job_op(k),
        }
    }

    fn app_op(&mut self) {
        let n = self.p.n;
        let now = self.now;
        match self.rng.below(100) {
            0..30 => {
                let node = self.rng.below(n);
                let channel = u32::from(self.rng.chance(50));
                let npages = 1 + self.rng.below(4) as u64;
                if let Some(exp_id) = self.slots[node].driver.create_export(channel, npages) {
                    self.note(|| format!("node {node}: app exports {exp_id} (channel {channel})"));
                    self.board.push(Handle {
                        node,
                        exp_id,
                        channel,
                    });
                    self.app_exports.push((node, exp_id));
                }
            }
            30..70 => {
                let node = self.rng.below(n);
                // Recent handles mostly; sometimes an old one (maybe released since).
                let remote: Vec<Handle> = self
                    .board
                    .iter()
                    .rev()
                    .filter(|h| h.node != node)
                    .take(if self.rng.chance(800) { 6 } else { 1000 })
                    .copied()
                    .collect();
                let Some(&h) = self.rng.pick(&remote) else {
                    return;
                };
                let id = self.rng.below(2) as u16;
                let channel = if self.rng.chance(50) {
                    h.channel ^ 1
                } else {
                    h.channel
                };
                let call = self.slots[node]
                    .driver
                    .import(now, h.node, h.exp_id, id, channel);
                self.note(|| {
                    format!(
                        "node {node}: app imports node {} export {} id {id}: {call:?}",
                        h.node, h.exp_id
                    )
                });
                if let ImportCall::Ok { desc, posted } = call {
                    if posted {
                        self.stats.imports += 1;
                    }
                    self.app_imports.push((node, desc));
                }
            }
            70..88 => {
                if self.app_imports.is_empty() {
                    return;
                }
                let k = self.rng.below(self.app_imports.len());
                let (node, desc) = self.app_imports.swap_remove(k);
                release_import(self, node, desc);
            }
            _ => {
                if self.app_exports.is_empty() {
                    return;
                }
                let k = self.rng.below(self.app_exports.len());
                let (node, exp) = self.app_exports.swap_remove(k);
                release_export(self, node, exp);
            }
        }
    }

    fn fault(&mut self) {
        let n = self.p.n;
        let now = self.now;
        self.stats.faults += 1;
        let i = self.rng.below(n);
        let total: u32 = self.p.fault_weights.iter().sum();
        let mut pick = self.rng.below(total as usize) as u32;
        let kind = self
            .p
            .fault_weights
            .iter()
            .position(|w| {
                if pick < *w {
                    true
                } else {
                    pick -= w;
                    false
                }
            })
            .unwrap();
        match kind {
            0 => {
                self.note(|| format!("FAULT kill -9 node {i}"));
                self.take_down(i, "kill -9");
                let back = self.rng.ms(100, 5_000);
                self.schedule_op(now + back, Op::Restart(i));
            }
            1 => {
                self.note(|| format!("FAULT kill -9 node {i}, restarted at once"));
                self.take_down(i, "kill -9");
                self.start(i);
            }
            2 => {
                self.note(|| format!("FAULT shutdown node {i}"));
                self.shutdown(i);
                let back = self.rng.ms(300, 5_000);
                self.schedule_op(now + back, Op::Restart(i));
            }
            3 => {
                self.note(|| format!("FAULT isolate node {i}"));
                for j in (0..n).filter(|j| *j != i) {
                    self.cut.insert((i.min(j), i.max(j)));
                }
                let heal = self.rng.ms(300, 7_000);
                self.schedule_op(now + heal, Op::Heal);
            }
            4 => {
                let side: Vec<bool> = (0..n).map(|_| self.rng.chance(500)).collect();
                self.note(|| format!("FAULT partition {side:?}"));
                for a in 0..n {
                    for b in a + 1..n {
                        if side[a] != side[b] {
                            self.cut.insert((a, b));
                        }
                    }
                }
                let heal = self.rng.ms(300, 7_000);
                self.schedule_op(now + heal, Op::Heal);
            }
            5 => {
                self.cond.loss = 50 + self.rng.below(400) as u32;
                let loss = self.cond.loss;
                self.note(|| format!("FAULT message loss {loss}/1000"));
                let calm = self.rng.ms(300, 3_000);
                self.schedule_op(now + calm, Op::Calm);
            }
            6 => {
                let t = self.p.import_timeout;
                self.cond.max_delay = self.rng.upto(t * 2);
                self.cond.describe_max = self.rng.upto(t * 2);
                let c = self.cond.clone();
                self.note(|| format!("FAULT slow network and driver {c:?}"));
                let calm = self.rng.ms(300, 4_000);
                self.schedule_op(now + calm, Op::Calm);
            }
            7 => {
                let t = self.p.import_timeout;
                self.cond.describe_max = t / 2 + self.rng.upto(t * 3);
                let c = self.cond.clone();
                self.note(|| format!("FAULT slow driver {c:?}"));
                let calm = self.rng.ms(300, 4_000);
                self.schedule_op(now + calm, Op::Calm);
            }
            8 => {
                let j = self.rng.below(n);
                if i != j {
                    self.note(|| format!("FAULT connection reset {i} <-> {j}"));
                    self.reset(i, j);
                }
            }
            9 => {
                let j = self.rng.below(n);
                if i != j {
                    self.note(|| format!("FAULT cut {i} <-> {j}"));
                    self.cut.insert((i.min(j), i.max(j)));
                    let heal = self.rng.ms(300, 7_000);
                    self.schedule_op(now + heal, Op::Heal);
                }
            }
            10 => self.uneven_cut(i),
            11 => self.moved_and_reread(i),
            12 => {
                // Strangers open connections and never say hello (issue 30).
                self.note(|| format!("FAULT strangers connect to node {i}"));
                self.strangers(i);
            }
            13 => self.gpu_moves(i),
            14 => self.job_starts(i),
            _ => self.line_removed(i),
        }
    }

    /// A Fabric Manager probe update moves one of node `i`'s GPUs to another clique (issue 30):
    /// mostly with CLIQUE_ID_CHANGE, sometimes seen only by the node's next read of the probes.
    fn gpu_moves(&mut self, i: usize) {
        let gpu = self.rng.below(2) as u32;
        let clique_id = 1 + self.rng.below(3) as u32;
        let event = self.rng.chance(700);
        self.note(|| {
            format!("FAULT node {i}'s GPU {gpu} moves to clique {clique_id} (event: {event})")
        });
        self.slots[i].driver.move_gpu(gpu, clique_id, event);
        self.stats.gpu_moves += 1;
    }

    /// Node `i`'s name moves to another address (a DNS change), or nothing changes; every node
    /// re-reads its nodes file (SIGUSR1) at a moment of its own (issue 30).
    fn moved_and_reread(&mut self, i: usize) {
        if self.rng.chance(700) {
            self.addr_gen[i] = self.addr_gen[i].wrapping_add(1).max(1);
            let to = self.addr(i);
            self.note(|| format!("FAULT node {i}'s entry now resolves to {to}"));
        } else {
            self.note(|| "FAULT SIGUSR1 everywhere, nothing moved".into());
        }
        self.everyone_rereads();
    }

    /// A cut that heals unevenly (issue 28): i's dials to j are slow and the session j opens
    /// reaches i late, behind j's requests, so after the heal one side counts the pair
    /// connected while the other is still lost (and maybe cleaning it up), for a while or until
    /// the next cut.
    fn uneven_cut(&mut self, i: usize) {
        let (n, now) = (self.p.n, self.now);
        let j = self.rng.below(n);
        if i == j {
            return;
        }
        let slow = self.rng.ms(200, 5_000);
        let late = self.rng.ms(50, 3_500);
        self.note(|| {
            format!(
                "FAULT uneven cut {i} <-> {j}: {i}'s dials +{slow:?}, {j}'s sessions open at \
                 {i} +{late:?}"
            )
        });
        self.cut.insert((i.min(j), i.max(j)));
        self.cond.dial_extra.insert((i, j), slow);
        self.cond.open_extra.insert((j, i), late);
        let heal = self.rng.ms(300, 7_000);
        self.schedule_op(now + heal, Op::Heal);
        let calm = heal + self.rng.ms(500, 6_000);
        self.schedule_op(now + calm, Op::Calm);
    }
}

/// FNV-1a over what a run leaves behind, so two runs of one seed can be compared.
fn digest(w: &World) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    };
    let s = w.stats;
    for x in [
        s.imports,
        s.validated_ok,
        s.validated_err,
        s.unimports,
        s.faults,
        s.lost,
        s.steps,
        u64::try_from((w.now - w.start).as_micros()).unwrap(),
        w.violations.len() as u64,
    ] {
        eat(x);
    }
    h
}
