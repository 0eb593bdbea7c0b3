//! The importer's bound on imports in flight to each exporter: at most [`MAX_IN_FLIGHT`]
//! requests sent and not answered per peer; the rest wait here, in order, as the core's small
//! request structs rather than as a task each waiting for room in the session's queue. The
//! match of the exporter's bound on requests it answers at once per session
//! (`session_tx::MAX_SERVING`): without this one a burst held back there would only move into
//! tasks here.

use std::collections::{HashMap, VecDeque};

use openimex_core::{ImportError, ImportRequest, NodeId, Status};

use super::{Engine, now};
use crate::peer_client;

/// Imports sent to one exporter and not answered yet, at most (the exporter's bound).
pub(super) const MAX_IN_FLIGHT: usize = crate::session_tx::MAX_SERVING;

/// Imports in flight and waiting, per exporter.
#[derive(Default)]
pub(super) struct Outbox {
    in_flight: HashMap<NodeId, usize>,
    waiting: HashMap<NodeId, VecDeque<ImportRequest>>,
}

impl Outbox {
    /// `request` for `peer`: returned if it may go now (counted as in flight), else kept.
    pub(super) fn admit(&mut self, peer: NodeId, request: ImportRequest) -> Option<ImportRequest> {
        let sent = self.in_flight.entry(peer).or_default();
        if *sent < MAX_IN_FLIGHT {
            *sent += 1;
            return Some(request);
        }
        self.waiting.entry(peer).or_default().push_back(request);
        None
    }

    /// An import sent to `peer` was answered (or failed): the next one waiting for `peer`, if
    /// any, now counted as in flight in its place.
    pub(super) fn answered(&mut self, peer: NodeId) -> Option<ImportRequest> {
        if let Some(queue) = self.waiting.get_mut(&peer)
            && let Some(next) = queue.pop_front()
        {
            if queue.is_empty() {
                self.waiting.remove(&peer);
            }
            return Some(next);
        }
        if let Some(sent) = self.in_flight.get_mut(&peer) {
            *sent = sent.saturating_sub(1);
            if *sent == 0 {
                self.in_flight.remove(&peer);
            }
        }
        None
    }
}

impl Engine {
    /// Sends `request` (admitted by the outbox) on the session with `peer`; with none, fails
    /// it at once, and so every import waiting for `peer` behind it.
    pub(super) fn send_import(&mut self, peer: NodeId, request: ImportRequest) {
        let mut next = Some(request);
        while let Some(request) = next.take() {
            let import_event_id = request.import_event_id;
            if let Some(session) = self.session(peer) {
                self.metrics.import_sent(import_event_id, now());
                peer_client::import(session, peer, request, self.tx.clone());
                return;
            }
            let answer = Err(ImportError::new(
                Status::InvalidState,
                format!("node {peer} has no session here"),
            ));
            self.metrics.import_completed(import_event_id, false, now());
            self.node
                .handle_import_answer(now(), peer, import_event_id, answer);
            next = self.outbox.answered(peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: u64) -> ImportRequest {
        ImportRequest {
            import_event_id: id,
            export_uuid: [1; 16],
            index: 0,
            channel: 0,
        }
    }

    #[test]
    fn past_the_bound_imports_wait_in_order_and_go_as_answers_come() {
        let (a, b) = (NodeId(1), NodeId(2));
        let mut outbox = Outbox::default();
        for id in 0..MAX_IN_FLIGHT as u64 {
            assert!(outbox.admit(a, request(id)).is_some(), "{id} goes at once");
        }
        assert!(
            outbox.admit(a, request(1000)).is_none(),
            "past the bound it waits"
        );
        assert!(outbox.admit(a, request(1001)).is_none());
        assert!(
            outbox.admit(b, request(7)).is_some(),
            "another exporter has its own bound"
        );
        let next = outbox.answered(a).map(|r| r.import_event_id);
        assert_eq!(next, Some(1000), "an answer lets the oldest waiting go");
        assert_eq!(outbox.answered(a).map(|r| r.import_event_id), Some(1001));
        // Nothing waits now: answers only lower the count, until there is room again.
        assert!(outbox.answered(a).is_none());
        assert!(outbox.admit(a, request(2000)).is_some(), "room for one");
        assert!(outbox.admit(a, request(2001)).is_none(), "and only one");
    }
}
