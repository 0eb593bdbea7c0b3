//! What a chaos run reports: a progress line while it runs, and at the end the counts, the
//! invariants, and the fault × outcome × time-to-recover table (text and JSON).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

use super::faults::{FaultKind, FaultRecord, Outcome};

/// What the summary's `freed reads` count is, said right under its line.
const FREED_READS: &str = "(freed reads: zeros read through a mapping whose exporter had \
                           already freed the memory, before the revocation reached the \
                           importer; expected under faults, not an error)";

/// A snapshot while the run goes on.
#[derive(Debug, Clone)]
pub struct Progress {
    /// `warm-up`, `faults` or `settling`.
    pub phase: &'static str,
    /// Since the workload started.
    pub elapsed: Duration,
    /// Faults injected so far.
    pub faults_injected: usize,
    /// Imports completed.
    pub imports: u64,
    /// Checks that found the pattern.
    pub reads: u64,
    /// Canary reads (must stay 0).
    pub stale_reads: u64,
    /// Corrupt reads (must stay 0).
    pub data_errors: u64,
    /// Apps started again after a death.
    pub app_restarts: u64,
}

impl Progress {
    /// One line for a terminal.
    pub fn line(&self) -> String {
        format!(
            "[{:>5.1}s {}] faults {} | imports {} | reads {} | stale {} | data errors {} | app restarts {}",
            self.elapsed.as_secs_f64(),
            self.phase,
            self.faults_injected,
            self.imports,
            self.reads,
            self.stale_reads,
            self.data_errors,
            self.app_restarts
        )
    }
}

/// One kind's row: faults injected, count per outcome, sorted recover times (ms).
type KindRow = (usize, BTreeMap<&'static str, usize>, Vec<u64>);

/// The result of a chaos run.
#[derive(Debug, Clone)]
pub struct ChaosReport {
    /// The seed (replay with the same seed and layout).
    pub seed: u64,
    /// Nodes.
    pub nodes: usize,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Wall time of the whole run.
    pub elapsed: Duration,
    /// Every fault injected, in order.
    pub faults: Vec<FaultRecord>,
    /// Imports completed.
    pub imports: u64,
    /// Imports that failed with a driver error (expected while a fault lasts).
    pub import_failures: u64,
    /// Median import time, µs.
    pub import_p50_us: u64,
    /// Checks that found the pattern.
    pub reads: u64,
    /// Reads of the canary: memory freed and reused under a live mapping. Invariant: 0.
    pub stale_reads: u64,
    /// Reads of zeros: memory freed (not reused) under a live mapping, between an exporter
    /// side losing it and the importer's revocation. Reported, not an invariant.
    pub freed_reads: u64,
    /// Reads (or an exporter's self-check) of anything else. Invariant: 0.
    pub data_errors: u64,
    /// Apps killed by their driver (revoked imports), expected after daemon faults.
    pub revoked_apps: u64,
    /// Apps started again after a death.
    pub app_restarts: u64,
    /// Apps that died other than by a fault, a revocation or a lost driver.
    pub app_crashes: u64,
    /// Daemons that exited on their own (a driver kill excepted).
    pub daemon_crashes: u64,
    /// Sum of every node's reference counters after every app released. Invariant: 0.
    pub leaked_refs: u64,
    /// The workload recovered after the last fault and the domain is UP on every node.
    pub recovered: bool,
    /// From the end of the faults to recovered.
    pub final_recover: Option<Duration>,
    /// What went wrong (first occurrences), leaks per node, crashes.
    pub notes: Vec<String>,
}

impl ChaosReport {
    /// Whether every invariant holds: no stale read, no data error, no leaked reference,
    /// recovered.
    pub fn passed(&self) -> bool {
        self.failures().is_empty()
    }

    /// The invariants that failed, in words.
    pub fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        if self.stale_reads > 0 {
            f.push(format!("{} stale reads (canary seen)", self.stale_reads));
        }
        if self.data_errors > 0 {
            f.push(format!("{} data errors", self.data_errors));
        }
        if self.leaked_refs > 0 {
            f.push(format!("{} leaked references", self.leaked_refs));
        }
        if !self.recovered {
            f.push("the domain did not recover".to_owned());
        }
        f
    }

    /// The faults grouped by kind: (kind, injected, outcomes, recover times in ms).
    fn by_kind(&self) -> BTreeMap<FaultKind, KindRow> {
        let mut m: BTreeMap<FaultKind, KindRow> = BTreeMap::new();
        for r in &self.faults {
            let e = m.entry(r.kind).or_default();
            e.0 += 1;
            let outcome = r.outcome.map_or("in progress", Outcome::name);
            *e.1.entry(outcome).or_default() += 1;
            if let Some(t) = r.recover {
                e.2.push(t.as_millis() as u64);
            }
        }
        for e in m.values_mut() {
            e.2.sort_unstable();
        }
        m
    }

    /// The fault × outcome × time-to-recover table, one row per kind.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<24} {:>5}  {:<28} {:>26}\n",
            "fault", "count", "outcome", "recover ms min/p50/max"
        );
        for (kind, (n, outcomes, times)) in self.by_kind() {
            let outcome: Vec<String> = outcomes.iter().map(|(o, c)| format!("{c} {o}")).collect();
            let t = match (times.first(), times.get(times.len() / 2), times.last()) {
                (Some(a), Some(b), Some(c)) => format!("{a}/{b}/{c}"),
                _ => "-".into(),
            };
            let _ = writeln!(
                s,
                "{:<24} {n:>5}  {:<28} {t:>26}",
                kind.name(),
                outcome.join(", ")
            );
        }
        s
    }

    /// The summary as text, table included.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "chaos: seed {} | {} nodes x {} GPUs | {:.1} s",
            self.seed,
            self.nodes,
            self.gpus_per_node,
            self.elapsed.as_secs_f64()
        );
        let _ = writeln!(
            s,
            "  faults injected {} | imports {} (failed during faults {}, p50 {} us) | reads {}",
            self.faults.len(),
            self.imports,
            self.import_failures,
            self.import_p50_us,
            self.reads
        );
        let _ = writeln!(
            s,
            "  stale reads {} | data errors {} | leaked refs {} | recovered {} (in {} ms after the last fault)",
            self.stale_reads,
            self.data_errors,
            self.leaked_refs,
            self.recovered,
            self.final_recover
                .map_or("-".into(), |d| d.as_millis().to_string())
        );
        let _ = writeln!(
            s,
            "  freed reads {} | apps revoked {} | app restarts {} | app crashes {} | daemon crashes {}",
            self.freed_reads,
            self.revoked_apps,
            self.app_restarts,
            self.app_crashes,
            self.daemon_crashes
        );
        let _ = writeln!(s, "    {FREED_READS}");
        s.push_str(&self.table());
        for n in &self.notes {
            let _ = writeln!(s, "  note: {n}");
        }
        s
    }

    /// The summary as one JSON object.
    pub fn to_json(&self) -> Value {
        let ms = |d: Duration| d.as_millis() as u64;
        let faults: Vec<Value> = self
            .faults
            .iter()
            .map(|r| {
                json!({
                    "kind": r.kind.name(),
                    "node": r.node,
                    "target": r.target,
                    "at_ms": ms(r.at),
                    "down_ms": ms(r.down),
                    "outcome": r.outcome.map_or("in progress", Outcome::name),
                    "recover_ms": r.recover.map(ms),
                    "revoked_apps": r.revoked,
                    "import_failures": r.import_failures,
                })
            })
            .collect();
        let table: Vec<Value> = self
            .by_kind()
            .into_iter()
            .map(|(kind, (n, outcomes, times))| {
                json!({
                    "kind": kind.name(),
                    "count": n,
                    "outcomes": outcomes,
                    "recover_ms_min": times.first(),
                    "recover_ms_p50": times.get(times.len() / 2),
                    "recover_ms_max": times.last(),
                })
            })
            .collect();
        json!({
            "seed": self.seed,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "elapsed_ms": ms(self.elapsed),
            "faults_injected": self.faults.len(),
            "imports": self.imports,
            "import_failures": self.import_failures,
            "import_p50_us": self.import_p50_us,
            "reads": self.reads,
            "stale_reads": self.stale_reads,
            "freed_reads": self.freed_reads,
            "data_errors": self.data_errors,
            "revoked_apps": self.revoked_apps,
            "app_restarts": self.app_restarts,
            "app_crashes": self.app_crashes,
            "daemon_crashes": self.daemon_crashes,
            "leaked_refs": self.leaked_refs,
            "recovered": self.recovered,
            "final_recover_ms": self.final_recover.map(ms),
            "passed": self.passed(),
            "failures": self.failures(),
            "table": table,
            "faults": faults,
            "notes": self.notes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_says_what_freed_reads_are() {
        let report = ChaosReport {
            seed: 1,
            nodes: 4,
            gpus_per_node: 2,
            elapsed: Duration::from_secs(60),
            faults: Vec::new(),
            imports: 100,
            import_failures: 4,
            import_p50_us: 900,
            reads: 1000,
            stale_reads: 0,
            freed_reads: 3,
            data_errors: 0,
            revoked_apps: 2,
            app_restarts: 5,
            app_crashes: 0,
            daemon_crashes: 0,
            leaked_refs: 0,
            recovered: true,
            final_recover: Some(Duration::from_millis(800)),
            notes: Vec::new(),
        };
        let text = report.text();
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.contains("freed reads 3"))
            .expect("the count stays");
        assert!(
            lines[at + 1].contains("freed reads: zeros read")
                && lines[at + 1].contains("not an error"),
            "{text}"
        );
    }
}
