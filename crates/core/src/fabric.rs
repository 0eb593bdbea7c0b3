//! Who holds what across the domain: the exporter side's references on local exports held for
//! remote importers, and the importer side's imports by MEM_IMPORT event.
//!
//! These tables decide clean-up. An exporter reference is released exactly once: on the
//! importer's unimport, or when the importer is gone (restarted as a new instance, or lost and
//! cleaned up). An unimport is acknowledged to the driver exactly once, after the exporter has
//! dropped its reference (or can no longer hold one).

use std::collections::{BTreeMap, HashMap};

use crate::ids::{InstanceId, NodeId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    instance: InstanceId,
    export_ref: u64,
}

/// Exporter side: references held on local exports on behalf of remote importers, keyed by
/// (importer node, importer's MEM_IMPORT event ID).
#[derive(Debug, Default)]
pub struct ExportRefs {
    held: HashMap<(NodeId, u64), Held>,
    /// References held per importer node. An entry that falls to zero is kept (there is one
    /// per node of the map at most): with one import at a time the count goes 0 → 1 → 0 on
    /// every import, and removing the last entry of the map freed its node, which the next
    /// import allocated again.
    per_node: BTreeMap<NodeId, usize>,
}

impl ExportRefs {
    /// Records a reference taken for `importer`'s import. A reference already recorded under
    /// the same key (a retried request) is returned, to be released: one import, one reference.
    pub fn insert(
        &mut self,
        importer: NodeId,
        instance: InstanceId,
        import_event_id: u64,
        export_ref: u64,
    ) -> Option<u64> {
        let old = self
            .held
            .insert(
                (importer, import_event_id),
                Held {
                    instance,
                    export_ref,
                },
            )
            .map(|h| h.export_ref);
        if old.is_none() {
            *self.per_node.entry(importer).or_default() += 1;
        }
        old
    }

    /// The importer nodes references are held for now, in ID order.
    pub fn holders(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.per_node
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(node, _)| *node)
    }

    /// References held for `importer` now.
    pub fn held_for(&self, importer: NodeId) -> usize {
        self.per_node.get(&importer).copied().unwrap_or(0)
    }

    fn forget(&mut self, importer: NodeId) {
        if let Some(n) = self.per_node.get_mut(&importer) {
            *n = n.saturating_sub(1);
        }
    }

    /// The importer's instance `instance` unimported: the reference to release, if that
    /// instance holds one (an unimport from any other instance releases nothing).
    pub fn remove(
        &mut self,
        importer: NodeId,
        instance: InstanceId,
        import_event_id: u64,
    ) -> Option<u64> {
        let key = (importer, import_event_id);
        if self.held.get(&key)?.instance != instance {
            return None;
        }
        let h = self.held.remove(&key)?;
        self.forget(importer);
        Some(h.export_ref)
    }

    /// Every reference held for `importer` (it is gone), to release.
    pub fn drain_node(&mut self, importer: NodeId) -> Vec<u64> {
        self.drain_where(|node, _| node == importer)
    }

    /// References held for instances of `importer` other than `current` (it restarted: its old
    /// imports died with the old process), to release.
    pub fn drain_stale(&mut self, importer: NodeId, current: InstanceId) -> Vec<u64> {
        self.drain_where(|node, inst| node == importer && inst != current)
    }

    fn drain_where(&mut self, pred: impl Fn(NodeId, InstanceId) -> bool) -> Vec<u64> {
        let keys: Vec<_> = self
            .held
            .iter()
            .filter(|(k, h)| pred(k.0, h.instance))
            .map(|(k, _)| *k)
            .collect();
        let mut refs = Vec::with_capacity(keys.len());
        for k in keys {
            if let Some(h) = self.held.remove(&k) {
                self.forget(k.0);
                refs.push(h.export_ref);
            }
        }
        refs.sort_unstable();
        refs
    }

    /// Number of references held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ImportState {
    /// Asked the exporter; no answer yet. Holds an unimport that arrived meanwhile.
    Requested { unimport: Option<u64> },
    /// The exporter holds a reference for it.
    Held,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Import {
    exporter: NodeId,
    state: ImportState,
}

/// What to do when an unimport event arrives or an import answer lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnimportStep {
    /// Ask the exporter to drop its reference, then finish `unimport_event_id`.
    TellExporter {
        /// The exporter.
        exporter: NodeId,
        /// Token to finish afterwards.
        unimport_event_id: u64,
    },
    /// Nothing is held remotely: finish `unimport_event_id` now.
    FinishNow {
        /// Token to finish.
        unimport_event_id: u64,
    },
    /// The import is still being answered; the unimport will be handled when it lands.
    Deferred,
}

/// What [`Imports::drain_exporter`] left to do.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Drained {
    /// Imports still waiting for the gone exporter's answer: fail them.
    pub unanswered: Vec<u64>,
    /// Unimports that waited on those answers: finish them.
    pub finish: Vec<u64>,
    /// Imports the exporter answered and may still hold references for.
    pub held: Vec<u64>,
    /// Unimports that were waiting to be delivered to it.
    pub undelivered: Vec<u64>,
}

impl Drained {
    /// Every import the (same instance of the) exporter may still hold a reference for.
    pub fn maybe_held(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .held
            .iter()
            .chain(&self.unanswered)
            .chain(&self.undelivered)
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// Importer side: this node's imports from remote exporters, by MEM_IMPORT event ID.
#[derive(Debug, Default)]
pub struct Imports {
    imports: HashMap<u64, Import>,
    /// Unimports the exporter could not be told about yet (it was unreachable), by exporter.
    undelivered: HashMap<NodeId, Vec<u64>>,
}

impl Imports {
    /// A MEM_IMPORT event was forwarded to `exporter`.
    pub fn requested(&mut self, import_event_id: u64, exporter: NodeId) {
        self.imports.insert(
            import_event_id,
            Import {
                exporter,
                state: ImportState::Requested { unimport: None },
            },
        );
    }

    /// The exporter answered. `held` is whether it now holds a reference (success). Returns
    /// the step for an unimport that arrived while the request was in flight.
    pub fn answered(&mut self, import_event_id: u64, held: bool) -> Option<UnimportStep> {
        let entry = self.imports.get_mut(&import_event_id)?;
        let pending = match entry.state {
            ImportState::Requested { unimport } => unimport,
            ImportState::Held => None,
        };
        let exporter = entry.exporter;
        if held {
            entry.state = ImportState::Held;
        } else {
            // A failed import posts no unimport later; forget it.
            self.imports.remove(&import_event_id);
        }
        let unimport_event_id = pending?;
        if held {
            self.imports.remove(&import_event_id);
            Some(UnimportStep::TellExporter {
                exporter,
                unimport_event_id,
            })
        } else {
            Some(UnimportStep::FinishNow { unimport_event_id })
        }
    }

    /// An unimport event for `import_event_id` arrived.
    pub fn unimport(&mut self, import_event_id: u64, unimport_event_id: u64) -> UnimportStep {
        match self.imports.get_mut(&import_event_id) {
            Some(Import {
                state: ImportState::Requested { unimport },
                ..
            }) => {
                *unimport = Some(unimport_event_id);
                UnimportStep::Deferred
            }
            Some(Import {
                exporter,
                state: ImportState::Held,
            }) => {
                let exporter = *exporter;
                self.imports.remove(&import_event_id);
                UnimportStep::TellExporter {
                    exporter,
                    unimport_event_id,
                }
            }
            None => UnimportStep::FinishNow { unimport_event_id },
        }
    }

    /// The exporter of `import_event_id` could not be told of its unimport (unreachable). The
    /// local releaser is not kept waiting for it; the exporter is told when it is back.
    pub fn undelivered(&mut self, exporter: NodeId, import_event_id: u64) {
        self.undelivered
            .entry(exporter)
            .or_default()
            .push(import_event_id);
    }

    /// The link to `exporter` is up again: the unimports to tell it now.
    pub fn take_undelivered(&mut self, exporter: NodeId) -> Vec<u64> {
        self.undelivered.remove(&exporter).unwrap_or_default()
    }

    /// The exporter of `import_event_id` while its request is in flight, `None` once answered
    /// (or never requested, or forgotten).
    pub fn in_flight(&self, import_event_id: u64) -> Option<NodeId> {
        self.imports
            .get(&import_event_id)
            .filter(|i| matches!(i.state, ImportState::Requested { .. }))
            .map(|i| i.exporter)
    }

    /// The exporter is gone (restarted or cleaned up): forget its imports, and any unimport not
    /// yet delivered to it (the old instance's references went with it).
    pub fn drain_exporter(&mut self, exporter: NodeId) -> Drained {
        let undelivered = self.undelivered.remove(&exporter).unwrap_or_default();
        let ids: Vec<u64> = self
            .imports
            .iter()
            .filter(|(_, i)| i.exporter == exporter)
            .map(|(id, _)| *id)
            .collect();
        let mut drained = Drained {
            undelivered,
            ..Drained::default()
        };
        for id in ids {
            match self.imports.remove(&id) {
                Some(Import {
                    state: ImportState::Requested { unimport },
                    ..
                }) => {
                    drained.unanswered.push(id);
                    drained.finish.extend(unimport);
                }
                Some(Import {
                    state: ImportState::Held,
                    ..
                }) => drained.held.push(id),
                None => {}
            }
        }
        drained.unanswered.sort_unstable();
        drained.finish.sort_unstable();
        drained.held.sort_unstable();
        drained
    }

    /// Imports known (requested or held), counted by exporter: one pass, so a view of every
    /// peer costs one walk of the table, not one per peer.
    pub fn per_exporter(&self) -> HashMap<NodeId, usize> {
        let mut counts = HashMap::new();
        for i in self.imports.values() {
            *counts.entry(i.exporter).or_default() += 1;
        }
        counts
    }

    /// Unimports `exporter` has not been told of yet.
    pub fn undelivered_to(&self, exporter: NodeId) -> usize {
        self.undelivered.get(&exporter).map_or(0, Vec::len)
    }

    /// Imports known (requested or held).
    pub fn len(&self) -> usize {
        self.imports.len()
    }

    /// True when none.
    pub fn is_empty(&self) -> bool {
        self.imports.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);

    #[test]
    fn export_refs_released_once_by_unimport_or_departure() {
        let mut t = ExportRefs::default();
        assert_eq!(t.insert(B, InstanceId(1), 10, 100), None);
        assert_eq!(t.insert(B, InstanceId(1), 11, 101), None);
        assert_eq!(t.insert(A, InstanceId(5), 10, 102), None);
        assert_eq!(
            t.remove(B, InstanceId(2), 10),
            None,
            "another instance's unimport releases nothing"
        );
        assert_eq!(t.remove(B, InstanceId(1), 10), Some(100));
        assert_eq!(
            t.remove(B, InstanceId(1), 10),
            None,
            "a second unimport releases nothing"
        );
        assert_eq!(t.drain_stale(B, InstanceId(1)), Vec::<u64>::new());
        assert_eq!(
            t.drain_stale(B, InstanceId(2)),
            vec![101],
            "restarted importer"
        );
        assert_eq!(t.holders().collect::<Vec<_>>(), vec![A]);
        assert_eq!(t.drain_node(A), vec![102]);
        assert!(t.is_empty());
        assert_eq!(t.holders().count(), 0, "no node holds anything");
        assert_eq!(t.insert(B, InstanceId(1), 12, 103), None);
        assert_eq!(
            t.insert(B, InstanceId(1), 12, 104),
            Some(103),
            "a retried request swaps refs"
        );
    }

    #[test]
    fn unimport_paths() {
        let mut t = Imports::default();
        t.requested(1, A);
        assert_eq!(t.answered(1, true), None);
        assert_eq!(
            t.unimport(1, 50),
            UnimportStep::TellExporter {
                exporter: A,
                unimport_event_id: 50
            }
        );
        assert!(t.is_empty());

        // Unimport while the request is in flight: deferred, then told once the answer lands.
        t.requested(2, A);
        assert_eq!(t.unimport(2, 51), UnimportStep::Deferred);
        assert_eq!(
            t.answered(2, true),
            Some(UnimportStep::TellExporter {
                exporter: A,
                unimport_event_id: 51
            })
        );
        t.requested(3, A);
        assert_eq!(t.unimport(3, 52), UnimportStep::Deferred);
        assert_eq!(
            t.answered(3, false),
            Some(UnimportStep::FinishNow {
                unimport_event_id: 52
            })
        );

        // Unknown (failed earlier, or exporter gone): finish now.
        assert_eq!(
            t.unimport(99, 53),
            UnimportStep::FinishNow {
                unimport_event_id: 53
            }
        );

        // Exporter gone: in-flight unimports finish, held imports are forgotten.
        t.requested(4, B);
        t.requested(5, B);
        t.answered(5, true);
        assert_eq!(t.unimport(4, 54), UnimportStep::Deferred);
        assert_eq!(t.in_flight(4), Some(B));
        assert_eq!(t.in_flight(5), None, "answered");
        assert_eq!(
            t.drain_exporter(B),
            Drained {
                unanswered: vec![4],
                finish: vec![54],
                held: vec![5],
                undelivered: vec![],
            }
        );
        assert!(t.is_empty());
        assert_eq!(
            t.answered(4, true),
            None,
            "a late answer after clean-up does nothing"
        );
    }
}
