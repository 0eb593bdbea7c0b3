//! Give-backs that arrived before their import: an importer that gave up on an import (its
//! timeout, or a failed request) tells the exporter to drop whatever it took for it, and that
//! give-back can overtake the request itself. A request held on a connection behind a
//! partition reaches the exporter when the partition heals, on the old connection, while the
//! give-back travels on the new session and may land first. The exporter then holds nothing
//! to drop, and a reference taken for the late request would be answered into a connection the
//! importer already closed: held forever. So a give-back that found nothing is remembered here,
//! and the request that arrives after it is refused.
//!
//! Only a give-back leaves a mark: an importer sends an unimport only for an import it already
//! requested, and never requests the same import event twice, so a mark cannot refuse an import
//! that is still wanted. Marks are per importer instance (a restart forgets them with the rest of
//! that instance) and bounded per node, oldest first out; a mark pushed out by a flood of
//! give-backs for imports that were answered long ago costs nothing.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::ids::{InstanceId, NodeId};

/// Marks kept per importing node.
pub(super) const MAX_MARKS: usize = 4096;

/// One importing node's marks, for its current instance.
#[derive(Debug)]
struct Marks {
    instance: InstanceId,
    order: VecDeque<u64>,
    ids: HashSet<u64>,
}

/// Give-backs that found nothing held, per importing node.
#[derive(Debug, Default)]
pub(super) struct GiveBacks {
    by_node: HashMap<NodeId, Marks>,
}

impl GiveBacks {
    /// `importer` gave back `import_event_id` and nothing was held or being described for it.
    pub(super) fn mark(&mut self, node: NodeId, instance: InstanceId, import_event_id: u64) {
        let marks = self.by_node.entry(node).or_insert_with(|| Marks {
            instance,
            order: VecDeque::new(),
            ids: HashSet::new(),
        });
        if marks.instance != instance {
            // A new instance: the old one's imports are gone with it.
            marks.instance = instance;
            marks.order.clear();
            marks.ids.clear();
        }
        if !marks.ids.insert(import_event_id) {
            return;
        }
        marks.order.push_back(import_event_id);
        if marks.order.len() > MAX_MARKS
            && let Some(oldest) = marks.order.pop_front()
        {
            marks.ids.remove(&oldest);
        }
    }

    /// Whether an import request from `importer` for `import_event_id` was given back before it
    /// arrived (the mark is used up).
    pub(super) fn take(
        &mut self,
        node: NodeId,
        instance: InstanceId,
        import_event_id: u64,
    ) -> bool {
        let Some(marks) = self.by_node.get_mut(&node) else {
            return false;
        };
        if marks.instance != instance || !marks.ids.remove(&import_event_id) {
            return false;
        }
        marks.order.retain(|id| *id != import_event_id);
        if marks.ids.is_empty() {
            self.by_node.remove(&node);
        }
        true
    }

    /// `node` restarted or left: its marks go with its old instance.
    pub(super) fn forget(&mut self, node: NodeId) {
        self.by_node.remove(&node);
    }

    /// Marks held, over every node (for tests and bounds).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_node.values().map(|m| m.ids.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(n: u64) -> InstanceId {
        InstanceId(n)
    }

    #[test]
    fn a_mark_refuses_one_request_of_that_instance_only() {
        let mut g = GiveBacks::default();
        let node = NodeId(1);
        g.mark(node, inst(7), 42);
        assert!(
            !g.take(node, inst(8), 42),
            "another instance's import is not refused"
        );
        assert!(
            !g.take(NodeId(2), inst(7), 42),
            "another node's import is not refused"
        );
        assert!(!g.take(node, inst(7), 43), "another import is not refused");
        assert!(g.take(node, inst(7), 42));
        assert!(!g.take(node, inst(7), 42), "the mark is used up");
        assert_eq!(g.len(), 0);
    }

    #[test]
    fn a_new_instance_or_a_departure_forgets_the_marks() {
        let mut g = GiveBacks::default();
        let node = NodeId(1);
        g.mark(node, inst(7), 1);
        g.mark(node, inst(8), 2);
        assert!(
            !g.take(node, inst(7), 1),
            "the old instance's marks went with it"
        );
        assert!(g.take(node, inst(8), 2));
        g.mark(node, inst(8), 3);
        g.forget(node);
        assert!(!g.take(node, inst(8), 3));
    }

    #[test]
    fn marks_are_bounded_per_node_oldest_first() {
        let mut g = GiveBacks::default();
        let node = NodeId(1);
        for id in 0..(MAX_MARKS as u64 + 10) {
            g.mark(node, inst(1), id);
            g.mark(node, inst(1), id);
        }
        assert_eq!(g.len(), MAX_MARKS);
        assert!(
            !g.take(node, inst(1), 0),
            "the oldest marks were pushed out"
        );
        assert!(g.take(node, inst(1), MAX_MARKS as u64 + 9));
    }
}
