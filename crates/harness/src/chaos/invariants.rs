//! The end of a chaos run: every node brought back, the workload recovered, every app told to
//! release and exit, and the invariants measured: reference counters back to zero on every
//! node, the domain UP as every node sees it (stale reads and data errors were counted as
//! they came).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Engine;
use super::report::{ChaosReport, Progress};
use super::workload::Exit;
use crate::cluster::is_up;
use crate::process::run_with_timeout;
use crate::{HarnessError, Signal};

/// The driver counters (`openimex-lab app stats`) that must all be zero once every application is
/// gone: anything left is a leaked reference.
pub const REF_COUNTERS: [&str; 7] = [
    "allocations",
    "exports",
    "daemon_export_refs",
    "daemon_export_objects",
    "import_descriptors",
    "import_refs",
    "pending_unimports",
];

/// Bound on the apps' release and exit (an unimport waits for both daemons).
const RELEASE: Duration = Duration::from_secs(20);
/// Bound on the counters reaching zero after the apps are gone.
const DRAIN: Duration = Duration::from_secs(30);

impl Engine<'_> {
    /// The counts so far.
    pub(super) fn progress(&self, phase: &'static str) -> Progress {
        Progress {
            phase,
            elapsed: self.started.elapsed(),
            faults_injected: self.records.len(),
            imports: self.counts.imports,
            reads: self.counts.reads,
            stale_reads: self.counts.stale,
            data_errors: self.counts.corrupt,
            app_restarts: self.counts.restarts,
        }
    }

    /// Brings everything back, lets it settle, releases every app and checks the invariants.
    pub(super) fn finish(
        &mut self,
        tick: &mut dyn FnMut(&mut Self),
    ) -> Result<ChaosReport, HarnessError> {
        for n in 0..self.nodes.len() {
            super::partition::cut(&self.links, n, false);
            if self.nodes[n].stopped {
                self.nodes[n].stopped = false;
                let _ = self.cluster.signal(n, Signal::SIGCONT);
            }
            if self.nodes[n].down || !self.cluster.is_running(n) {
                self.exec(super::faults::Action::Start(n));
            }
        }
        let settle = Instant::now();
        let settled = self.wait_recovered(settle, tick);
        let final_recover = settled.then(|| settle.elapsed());
        if !settled {
            self.note(format!(
                "the workload did not recover within {:?} after the last fault",
                self.spec.recover_timeout
            ));
        }

        // Release: every app releases what it holds and exits, readers first (their
        // unimports go through both daemons), then the exporters.
        for role in [super::Role::Reader, super::Role::Exporter] {
            for a in self.apps.iter_mut().filter(|a| a.spec.role == role) {
                a.respawn_at = None;
                a.ask_exit();
            }
            let deadline = Instant::now() + RELEASE;
            for i in 0..self.apps.len() {
                if self.apps[i].spec.role != role {
                    continue;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                match self.apps[i].finish(left) {
                    Some((Exit::Crashed, status)) => {
                        self.counts.crashes += 1;
                        let note = self.apps[i].crash_note(&status);
                        self.note(format!("app crashed while releasing: {note}"));
                    }
                    Some((Exit::Killed, _)) => {
                        let name = self.apps[i].spec.name.clone();
                        self.note(format!("{name} did not exit within {RELEASE:?}: killed"));
                    }
                    Some((Exit::Revoked, _)) => self.counts.revoked += 1,
                    _ => {}
                }
            }
        }
        let quiet = Instant::now() + Duration::from_millis(300);
        while let Ok(ev) = self
            .events
            .recv_timeout(quiet.saturating_duration_since(Instant::now()))
        {
            self.handle(ev);
        }

        let mut leaked = 0;
        for n in 0..self.nodes.len() {
            let (left, detail) = self.wait_refs_zero(n);
            if left > 0 {
                self.note(format!("node {n} leaked references: {detail}"));
            }
            leaked += left;
        }
        let nodes = self.cluster.len();
        let mut all_up = true;
        for n in 0..nodes {
            let up = self.cluster.domain(n).is_ok_and(|d| is_up(&d, nodes));
            if !up {
                self.note(format!("node {n} does not see the domain UP at the end"));
            }
            all_up &= up;
        }
        let mut micros = std::mem::take(&mut self.counts.import_micros);
        micros.sort_unstable();
        let c = &self.counts;
        Ok(ChaosReport {
            seed: self.spec.seed,
            nodes,
            gpus_per_node: self.spec.gpus_per_node,
            elapsed: self.started.elapsed(),
            faults: self.records.clone(),
            imports: c.imports,
            import_failures: c.import_failures,
            import_p50_us: micros.get(micros.len() / 2).copied().unwrap_or(0),
            reads: c.reads,
            stale_reads: c.stale,
            freed_reads: c.freed,
            data_errors: c.corrupt,
            revoked_apps: c.revoked,
            app_restarts: c.restarts,
            app_crashes: c.crashes,
            daemon_crashes: c.daemon_crashes,
            leaked_refs: leaked,
            recovered: settled && all_up,
            final_recover,
            notes: self.notes.clone(),
        })
    }

    /// Waits up to [`DRAIN`] for node `n`'s counters to reach zero; returns what is left and
    /// the counters as text.
    fn wait_refs_zero(&self, n: usize) -> (u64, String) {
        let deadline = Instant::now() + DRAIN;
        loop {
            let (left, detail) = match self.driver_stats(n) {
                Ok(s) => {
                    let left: u64 = REF_COUNTERS
                        .iter()
                        .map(|k| s[*k].as_u64().unwrap_or(0))
                        .sum();
                    (left, s.to_string())
                }
                // An unreadable driver counts as one leak: the check cannot pass.
                Err(e) => (1, e),
            };
            if left == 0 || Instant::now() >= deadline {
                return (left, detail);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `openimex-lab app stats` of node `n`'s driver, parsed.
    fn driver_stats(&self, n: usize) -> Result<Value, String> {
        let mut cmd = Command::new(&self.spec.lab_binary);
        cmd.args(["app", "stats", "--no-channel", "--node-dir"])
            .arg(self.cluster.node(n).dir());
        let out = run_with_timeout(&mut cmd, Duration::from_secs(10)).map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().last().unwrap_or_default();
        serde_json::from_str(line).map_err(|e| {
            format!(
                "app stats of node {n}: {e}: {line:?} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}
