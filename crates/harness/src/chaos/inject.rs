//! Injecting faults: the next one drawn from the spec's kinds (or taken in turn), its plan's
//! steps run when due, and each step performed on the cluster, the apps and the partition
//! proxies. Once the last step ran, the fault's recovery is awaited (`recovery`).

use std::time::{Duration, Instant};

use rand::Rng;

use super::faults::{self, FaultRecord};
use super::workload::Role;
use super::{Engine, HEARTBEAT_MS, PEER_TIMEOUT_MS, TICK, partition};
use crate::{HarnessError, Signal};

/// A fault in progress.
pub(super) struct Active {
    record: usize,
    injected: Instant,
    steps: Vec<(Duration, faults::Action)>,
    /// When the last step ran (recovery is measured from there).
    repaired: Option<Instant>,
}

impl Engine<'_> {
    /// Draws and starts the next fault.
    pub(super) fn inject(&mut self) {
        let apps_of = |role: Role| -> Vec<(usize, usize, String)> {
            self.apps
                .iter()
                .enumerate()
                .filter(|(_, a)| a.spec.role == role)
                .map(|(i, a)| (i, a.spec.node, a.spec.name.clone()))
                .collect()
        };
        let (exporter_apps, reader_apps) = (apps_of(Role::Exporter), apps_of(Role::Reader));
        let targets = faults::Targets {
            exporter_apps: &exporter_apps,
            reader_apps: &reader_apps,
            exporter_nodes: &self.spec.exporters,
            reader_nodes: &self.spec.readers,
            nodes: self.spec.nodes,
            cleanup_after: Duration::from_millis(PEER_TIMEOUT_MS)
                + Duration::from_secs(self.spec.grace_secs),
            heartbeat: Duration::from_millis(HEARTBEAT_MS),
            peer_timeout: Duration::from_millis(PEER_TIMEOUT_MS),
        };
        let n = self.spec.kinds.len().max(1);
        let pick = if self.spec.cycle_kinds {
            self.records.len() % n
        } else {
            self.rng.random_range(0..n)
        };
        let Some(&kind) = self.spec.kinds.get(pick) else {
            return;
        };
        if kind.needs_proxies() && self.links.is_empty() {
            self.note(format!(
                "{} needs ChaosSpec::partitions: skipped",
                kind.name()
            ));
            return;
        }
        let Some(plan) = faults::plan(kind, &mut self.rng, &targets) else {
            self.note(format!("no target for {}", kind.name()));
            return;
        };
        self.records.push(FaultRecord {
            kind,
            node: plan.node,
            target: plan.target,
            at: self.started.elapsed(),
            down: Duration::ZERO,
            outcome: None,
            recover: None,
            revoked: 0,
            import_failures: 0,
        });
        self.active = Some(Active {
            record: self.records.len() - 1,
            injected: Instant::now(),
            steps: plan.steps,
            repaired: None,
        });
        self.run_steps();
    }

    /// Runs the active fault's steps that are due; once the last ran, its recovery is awaited.
    pub(super) fn run_steps(&mut self) {
        let Some(mut active) = self.active.take() else {
            return;
        };
        while let Some(&(offset, action)) = active.steps.first() {
            if active.injected.elapsed() < offset {
                break;
            }
            active.steps.remove(0);
            self.exec(action);
            active.repaired = Some(Instant::now());
        }
        if active.steps.is_empty() {
            let done = active.repaired.unwrap_or(active.injected);
            self.records[active.record].down = done - active.injected;
            self.awaiting.push((active.record, done));
        } else {
            self.active = Some(active);
        }
    }

    /// Performs one fault step.
    pub(super) fn exec(&mut self, action: faults::Action) {
        use faults::Action;
        let result = match action {
            Action::KillApp(i) => {
                self.apps[i].kill();
                Ok(())
            }
            Action::Kill9(n) => {
                self.nodes[n].down = true;
                self.nodes[n].ready = None;
                if self.cluster.is_running(n) {
                    self.cluster.kill9(n)
                } else {
                    Ok(())
                }
            }
            Action::KillDriver(n) => {
                self.nodes[n].down = true;
                self.nodes[n].ready = None;
                // The node's applications lose their GPU driver with it: a job does not
                // outlive the driver (and would otherwise keep mappings nobody can revoke).
                for a in self.apps.iter_mut().filter(|a| a.spec.node == n) {
                    a.kill();
                }
                self.cluster.kill_driver(n)
            }
            Action::Stop(n) => {
                self.nodes[n].stopped = true;
                self.nodes[n].ready = None;
                self.cluster.signal(n, Signal::SIGSTOP)
            }
            Action::Cont(n) => {
                self.nodes[n].stopped = false;
                self.cluster.signal(n, Signal::SIGCONT)
            }
            Action::Start(n) => self.start_node(n),
            Action::Cut(n) | Action::Heal(n) => {
                partition::cut(&self.links, n, matches!(action, Action::Cut(_)));
                Ok(())
            }
        };
        if let Err(e) = result {
            self.note(format!("fault step {action:?} failed: {e}"));
        }
    }

    /// Brings node `n` back: SIGCONT if stopped, waits (up to 5 s) for a daemon that is exiting
    /// on its own (its driver died) or kills it, then starts driver and daemon.
    fn start_node(&mut self, n: usize) -> Result<(), HarnessError> {
        if self.nodes[n].stopped {
            self.nodes[n].stopped = false;
            let _ = self.cluster.signal(n, Signal::SIGCONT);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.cluster.is_running(n) && Instant::now() < deadline {
            std::thread::sleep(TICK);
        }
        if self.cluster.is_running(n) {
            self.cluster.kill9(n)?;
        }
        self.nodes[n].ready = None;
        let started = self.cluster.start_node(n);
        self.nodes[n].down = started.is_err();
        started
    }
}
