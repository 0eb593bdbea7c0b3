//! The importer's bound on imports in flight to each exporter: at most
//! [`MAX_IMPORTS_IN_FLIGHT`] requests sent and not answered per exporter; the rest wait here,
//! in the order the driver posted them, as small request structs rather than as work queued in
//! the daemon. It matches the exporter's bound on the requests it answers at once per session
//! (the daemon's `session_tx::MAX_SERVING`): without this one, a burst the exporter holds back
//! would only pile up in the importer's daemon instead.
//!
//! # Contract
//! The owner MUST report every [`Action::SendImport`] once with [`Node::handle_import_answer`]
//! (the answer, or the transport's error; one it cannot send, as a transport error): its slot
//! stays taken until then.
//!
//! # Decisions
//! - [`Action::SendImport`] is emitted only for a request admitted under the bound; the rest
//!   wait in order.
//! - Each report of a sent request ([`Node::handle_import_answer`], the answer or a transport
//!   error) frees its slot, and the oldest waiting request for that exporter goes in its place.
//!   A slot is freed by the request's own report only, so a late, duplicate or unknown report
//!   frees nothing: the count stays that of requests actually on the wire, including those the
//!   node has given up on meanwhile (the exporter still works on them).
//! - A waiting request whose turn comes while no session carries the pair with its exporter
//!   fails at once as the transport would have failed it (INVALID_STATE, "node N has no session
//!   here": [`Action::ImportNotSent`], then its validation), which frees the slot for the next
//!   one. So when the session goes, the requests it carried fail at their senders, and at the
//!   first of those failures every request waiting behind them fails too.
//! - A waiting request whose import the node gave up on meanwhile (its timeout passed, or the
//!   exporter restarted or left, or this node is shutting down) is dropped when its turn comes,
//!   not sent: the import has failed already, and the exporter would only take a reference for
//!   it that nobody would hand back (a restarted exporter's new instance is unknown to the
//!   give-back of the old one).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

use super::{Action, ImportRequest, Node};
use crate::gpu::{ImportError, Status};
use crate::ids::NodeId;

/// Imports sent to one exporter and not answered yet, at most (the exporter's bound on the
/// requests it answers at once per session).
pub const MAX_IMPORTS_IN_FLIGHT: usize = 256;

/// Imports in flight and waiting, per exporter.
#[derive(Debug)]
pub(super) struct Outbox {
    /// The bound ([`MAX_IMPORTS_IN_FLIGHT`] unless set for a test).
    max: usize,
    /// Requests sent and not reported yet, by exporter.
    in_flight: HashMap<NodeId, HashSet<u64>>,
    /// Requests waiting for a slot, by exporter, oldest first.
    waiting: HashMap<NodeId, VecDeque<ImportRequest>>,
}

impl Default for Outbox {
    fn default() -> Self {
        Self {
            max: MAX_IMPORTS_IN_FLIGHT,
            in_flight: HashMap::new(),
            waiting: HashMap::new(),
        }
    }
}

impl Outbox {
    /// `request` for `exporter` waits behind those before it.
    fn push(&mut self, exporter: NodeId, request: ImportRequest) {
        self.waiting.entry(exporter).or_default().push_back(request);
    }

    /// The oldest request waiting for `exporter`, if a slot is free; counted in flight.
    fn next(&mut self, exporter: NodeId) -> Option<ImportRequest> {
        let sent = self.in_flight.get(&exporter).map_or(0, HashSet::len);
        if sent >= self.max {
            return None;
        }
        let queue = self.waiting.get_mut(&exporter)?;
        let request = queue.pop_front();
        if queue.is_empty() {
            self.waiting.remove(&exporter);
        }
        let request = request?;
        (self.in_flight.entry(exporter).or_default()).insert(request.import_event_id);
        Some(request)
    }

    /// The request `import_event_id` to `exporter` was reported: its slot is free. Whether it
    /// was in flight (a report of anything else frees nothing).
    fn answered(&mut self, exporter: NodeId, import_event_id: u64) -> bool {
        let Some(sent) = self.in_flight.get_mut(&exporter) else {
            return false;
        };
        let was = sent.remove(&import_event_id);
        if sent.is_empty() {
            self.in_flight.remove(&exporter);
        }
        was
    }
}

impl Node {
    /// Imports sent to `exporter` and not answered yet, and those waiting for a slot.
    pub fn imports_to(&self, exporter: NodeId) -> (usize, usize) {
        (
            self.outbox.in_flight.get(&exporter).map_or(0, HashSet::len),
            self.outbox.waiting.get(&exporter).map_or(0, VecDeque::len),
        )
    }

    /// Replaces the bound on imports in flight per exporter (default
    /// [`MAX_IMPORTS_IN_FLIGHT`], at least 1), so tests and the simulation reach it with a
    /// handful of imports. Set it before the first import.
    pub fn set_max_imports_in_flight(&mut self, max: usize) {
        self.outbox.max = max.max(1);
    }

    /// Asks `exporter` for `request` once a slot is free (now, if one is).
    pub(super) fn ask_exporter(&mut self, now: Instant, exporter: NodeId, request: ImportRequest) {
        self.outbox.push(exporter, request);
        self.send_waiting(now, exporter);
    }

    /// Frees the slot of a reported request; returns whether it held one.
    pub(super) fn import_reported(&mut self, exporter: NodeId, import_event_id: u64) -> bool {
        self.outbox.answered(exporter, import_event_id)
    }

    /// Sends the requests waiting for `exporter` while slots are free (see the module doc).
    pub(super) fn send_waiting(&mut self, now: Instant, exporter: NodeId) {
        while let Some(request) = self.outbox.next(exporter) {
            let import_event_id = request.import_event_id;
            if self.imports.in_flight(import_event_id) != Some(exporter) {
                // Given up on while it waited: it has failed already.
                self.outbox.answered(exporter, import_event_id);
                continue;
            }
            if self.session_of(exporter).is_some() {
                self.actions.push_back(Action::SendImport {
                    peer: exporter,
                    request,
                });
                continue;
            }
            self.outbox.answered(exporter, import_event_id);
            let error = ImportError::new(
                Status::InvalidState,
                format!("node {exporter} has no session here"),
            );
            self.actions.push_back(Action::ImportNotSent {
                peer: exporter,
                import_event_id,
                error: error.clone(),
            });
            self.import_answered(now, exporter, import_event_id, Err(error));
        }
    }
}
