//! The recovery gate (`IMEX_WAIT_FOR_QUORUM=RECOVERY`, docs/reference/imex-guide.md §4) and the persist record.
//!
//! The record lists the nodes that hold references to this node's memory, and it is brought up
//! to date before a reference is handed to a peer, so an unclean exit leaves a truthful list.
//! On the next start those nodes may still map memory the old daemon's exit left dangling: the
//! node reports WAITING_FOR_RECOVERY and does not open the driver session (which would re-enable
//! fabric allocation, docs/reference/driver-interface.md §4) until each of them has reconnected — its hello
//! answer to us comes after its driver disabled its importers of our memory, as a new instance
//! of ours means — or has been declared lost after the grace time (or, when that is forever,
//! after [`super::NodeConfig::recovery_wait`]). While waiting, the record keeps listing them, so
//! a crash during recovery still waits for them next time.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::{Action, Node, Timer};
use crate::ids::NodeId;
use crate::mesh;
use crate::state::DaemonState;

/// How often the nodes still awaited are named in the log.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// How long the persist record keeps naming a node after its last reference here ended.
pub const PERSIST_LINGER: Duration = Duration::from_secs(2);

/// The gate's state.
#[derive(Debug, Default)]
pub(super) struct Recovery {
    awaiting: BTreeSet<NodeId>,
    active: bool,
    /// The mesh asked to open the driver session while the gate was closed.
    held_init: bool,
    /// Nodes in the persist record as last written.
    persisted: Vec<NodeId>,
    /// Where [`Node::persist_needed`] lists the nodes the record must name: kept, as it is
    /// checked on every import and release and differs from the record only now and then.
    needed: Vec<NodeId>,
}

impl Recovery {
    pub(super) fn new(recover_from: &[NodeId]) -> Self {
        Self {
            awaiting: recover_from.iter().copied().collect(),
            active: !recover_from.is_empty(),
            held_init: false,
            persisted: recover_from.to_vec(),
            needed: Vec::new(),
        }
    }
}

impl Node {
    /// The nodes the recovery gate still waits for (empty once open).
    pub fn recovery_awaited(&self) -> Vec<NodeId> {
        self.recovery.awaiting.iter().copied().collect()
    }

    /// Whether the recovery gate still waits for `peer`.
    pub(super) fn is_awaited(&self, peer: NodeId) -> bool {
        self.recovery.awaiting.contains(&peer)
    }

    pub(super) fn recovering(&self) -> bool {
        self.recovery.active
    }

    /// At start: when there is something to recover, arm the gate's deadline and its log.
    pub(super) fn start_recovery(&mut self, now: Instant) {
        if !self.recovery.active {
            return;
        }
        let wait = self.grace.unwrap_or(self.recovery_wait);
        self.arm(now + wait, Timer::RecoveryOver);
        self.arm(now + LOG_EVERY, Timer::RecoveryLog);
        self.actions.push_back(Action::RecoveryWait {
            awaiting: self.recovery_awaited(),
            wait,
        });
    }

    /// A mesh action seen while the gate is closed: the state it enters and the driver session
    /// it opens are held back. Returns the action to pass on, if any.
    pub(super) fn gate(&mut self, action: mesh::Action) -> Option<mesh::Action> {
        if !self.recovery.active {
            return Some(action);
        }
        match action {
            mesh::Action::StateChanged {
                from,
                to: DaemonState::InitGpu,
            } => Some(mesh::Action::StateChanged {
                from,
                to: DaemonState::WaitingForRecovery,
            }),
            mesh::Action::InitDriver => {
                self.recovery.held_init = true;
                None
            }
            other => Some(other),
        }
    }

    /// `peer`'s link came up: if it was awaited, it has dropped what it held.
    pub(super) fn recovery_link_up(&mut self, peer: NodeId) {
        if self.recovery.active && self.recovery.awaiting.remove(&peer) {
            self.actions.push_back(Action::Recovered {
                peer,
                how: "reconnected to this instance and dropped its imports of our memory",
            });
            self.recovery_check();
        }
    }

    /// The gate's deadline: every node still awaited is declared lost.
    pub(super) fn recovery_over(&mut self) {
        for peer in std::mem::take(&mut self.recovery.awaiting) {
            self.actions.push_back(Action::Recovered {
                peer,
                how: "declared lost: it did not reconnect within the recovery wait",
            });
        }
        self.recovery_check();
    }

    pub(super) fn recovery_log(&mut self, now: Instant) {
        if self.recovery.active {
            self.actions.push_back(Action::RecoveryWait {
                awaiting: self.recovery_awaited(),
                wait: Duration::ZERO,
            });
            self.arm(now + LOG_EVERY, Timer::RecoveryLog);
        }
    }

    fn recovery_check(&mut self) {
        if !self.recovery.active || !self.recovery.awaiting.is_empty() {
            return;
        }
        self.recovery.active = false;
        self.disarm(Timer::RecoveryOver);
        self.disarm(Timer::RecoveryLog);
        if self.recovery.held_init {
            self.recovery.held_init = false;
            self.actions
                .push_back(Action::Mesh(mesh::Action::StateChanged {
                    from: DaemonState::WaitingForRecovery,
                    to: DaemonState::InitGpu,
                }));
            self.actions
                .push_back(Action::Mesh(mesh::Action::InitDriver));
        }
        // The gate's nodes leave the record at once: the wait they stood for is over.
        self.prune_persist();
    }

    /// Writes the persist record again as it stands (its key, the node map, changed).
    pub(super) fn rewrite_persist(&mut self) {
        let importers = self.recovery.persisted.clone();
        self.actions.push_back(Action::Persist { importers });
    }

    /// The nodes the persist record must name now: those holding references, those whose
    /// imports are being described (each may hold one the moment its answer goes out), and
    /// those the gate still waits for; in [`Recovery::needed`], taken out (put it back).
    fn persist_needed(&mut self) -> Vec<NodeId> {
        let mut importers = std::mem::take(&mut self.recovery.needed);
        importers.clear();
        importers.extend(self.exports.holders());
        importers.extend(self.describing.values().map(|d| d.importer.node));
        importers.extend(self.recovery.awaiting.iter().copied());
        importers.sort_unstable();
        importers.dedup();
        importers
    }

    /// Brings the persist record up to date. A node that must be added is written at once
    /// (an answer waits for it). A node that only left is dropped [`PERSIST_LINGER`] later
    /// ([`Timer::PersistPrune`]), or at once when stopping: naming a node that holds nothing
    /// costs at most a recovery wait for it after a crash, while rewriting the file each time
    /// an application releases its last import from a node and imports again cost a file
    /// write and rename on the path of every such import.
    pub(super) fn sync_persist(&mut self, now: Instant) {
        let needed = self.persist_needed();
        if needed == self.recovery.persisted {
            self.recovery.needed = needed;
            self.disarm(Timer::PersistPrune);
            return;
        }
        let grows = needed
            .iter()
            .any(|n| self.recovery.persisted.binary_search(n).is_err());
        if grows || self.stopping() {
            self.write_persist(needed);
        } else {
            self.recovery.needed = needed;
            if !self.deadlines.contains_key(&Timer::PersistPrune) {
                self.arm(now + PERSIST_LINGER, Timer::PersistPrune);
            }
        }
    }

    /// [`Timer::PersistPrune`]: drops the nodes that no longer hold anything from the record
    /// (the record becomes exact).
    pub(super) fn prune_persist(&mut self) {
        let needed = self.persist_needed();
        if needed == self.recovery.persisted {
            self.recovery.needed = needed;
        } else {
            self.write_persist(needed);
        }
    }

    fn write_persist(&mut self, importers: Vec<NodeId>) {
        self.disarm(Timer::PersistPrune);
        self.recovery.persisted = importers.clone();
        self.actions.push_back(Action::Persist { importers });
    }
}
