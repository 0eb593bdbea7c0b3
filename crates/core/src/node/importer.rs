//! The importer side of a node: MEM_IMPORT and MEM_UNIMPORT events from the local driver,
//! the exporters' answers, imports that time out and the give-backs they send, and the unimports
//! told to exporters (delivered now, or queued until the link is back).

use std::time::Instant;

use super::*;

impl Node {
    /// An event from the local driver.
    pub fn handle_driver_event(&mut self, now: Instant, event: Event) {
        match event {
            Event::Import {
                event_id,
                channel,
                export_uuid,
                index,
                export_node,
            } => {
                if self.connected(export_node).is_none() || self.stopping() {
                    // Nobody to ask (or we are leaving): fail now rather than leave the
                    // application hanging.
                    self.actions.push_back(Action::ValidateImport {
                        import_event_id: event_id,
                        result: Err(Status::InvalidState),
                    });
                    return;
                }
                if self.job_admits(channel, export_node, "importer").is_some() {
                    self.actions.push_back(Action::ValidateImport {
                        import_event_id: event_id,
                        result: Err(Self::JOB_REFUSAL),
                    });
                    return;
                }
                self.imports.requested(event_id, export_node);
                self.arm(now + self.import_timeout, Timer::Import(event_id));
                // Sent now, or once the exporter answers one of those in flight (`outbox.rs`).
                let request = ImportRequest {
                    import_event_id: event_id,
                    export_uuid,
                    index,
                    channel,
                };
                self.ask_exporter(now, export_node, request);
            }
            Event::Unimport {
                unimport_event_id,
                import_event_id,
                ..
            } => {
                let step = self.imports.unimport(import_event_id, unimport_event_id);
                self.unimport_step(now, step, import_event_id);
            }
            // The fabric view follows cliques (`cliques.rs`); no import or unimport depends on
            // one.
            Event::CliqueIdChange { gpu, clique_id } => self.clique_id_changed(now, gpu, clique_id),
            Event::RemoteGpuAttach(attach) => self.handle_remote_gpu_attach_event(attach),
        }
    }

    /// `exporter` answered the import (or the request failed before an answer). The request's
    /// slot is free then: the next import waiting for that exporter is sent (`outbox.rs`).
    pub fn handle_import_answer(
        &mut self,
        now: Instant,
        exporter: NodeId,
        import_event_id: u64,
        answer: ImportAnswer,
    ) {
        let freed = self.import_reported(exporter, import_event_id);
        self.import_answered(now, exporter, import_event_id, answer);
        if freed {
            self.send_waiting(now, exporter);
        }
    }

    /// What an answer (or a failure before one) means for the import itself.
    pub(super) fn import_answered(
        &mut self,
        now: Instant,
        exporter: NodeId,
        import_event_id: u64,
        answer: ImportAnswer,
    ) {
        if self.imports.in_flight(import_event_id) != Some(exporter) {
            // Given up on (timeout) or cleaned up: a reference the exporter took for it is
            // handed back, if the instance that answered is still the one we know. (The give-back
            // sent at the timeout covers this too, unless it overtook the request.)
            if let Some((node, instance)) = self.abandoned.remove(&import_event_id)
                && node == exporter
                && answer.is_ok()
                && self.connected(exporter) == Some(instance)
            {
                self.send_unimport(now, exporter, import_event_id, None);
            }
            return;
        }
        self.disarm(Timer::Import(import_event_id));
        let result = if self.stopping() {
            // Our goodbye makes every exporter release what it holds for us, this reference
            // too: mapping it now could map freed memory. Fail it (and hand it back).
            Err(Status::InvalidState)
        } else {
            answer.map_err(|e| e.status)
        };
        let held = result.is_ok();
        self.actions.push_back(Action::ValidateImport {
            import_event_id,
            result,
        });
        if let Some(step) = self.imports.answered(import_event_id, held) {
            self.unimport_step(now, step, import_event_id);
        }
        if !held {
            // The error may be the transport's, after the exporter took a reference.
            self.give_back(now, exporter, import_event_id);
        }
    }

    /// The unimport of `import_event_id` reached `exporter` (`delivered`), or could not.
    pub fn handle_unimport_delivered(
        &mut self,
        now: Instant,
        exporter: NodeId,
        import_event_id: u64,
        delivered: bool,
    ) {
        let _ = now;
        let Some(token) = self.unimports.remove(&(exporter, import_event_id)) else {
            return;
        };
        self.disarm(Timer::Unimport(exporter, import_event_id));
        if !delivered {
            self.imports.undelivered(exporter, import_event_id);
            if self.connected(exporter).is_some() {
                // No link change will flush it: retry after a while.
                self.arm(now + self.import_timeout, Timer::Redeliver(exporter));
            }
        }
        if let Some(token) = token {
            self.actions.push_back(Action::FinishUnimports {
                ids: smallvec::smallvec![token],
            });
        }
    }

    // ---- internals: timeouts, give-backs and unimports told to exporters ----------------

    pub(super) fn import_timed_out(&mut self, now: Instant, import_event_id: u64) {
        let Some(exporter) = self.imports.in_flight(import_event_id) else {
            return;
        };
        if let Some(instance) = self.mesh.peer(exporter).and_then(|(_, i)| i) {
            self.abandoned.insert(import_event_id, (exporter, instance));
        }
        self.actions.push_back(Action::ValidateImport {
            import_event_id,
            result: Err(Status::InvalidState),
        });
        if let Some(step) = self.imports.answered(import_event_id, false) {
            self.unimport_step(now, step, import_event_id);
        }
        // The exporter may have taken a reference (its answer is late or lost): hand it back.
        self.give_back(now, exporter, import_event_id);
    }

    /// Tells `exporter` to drop whatever it took for an import this node gave up on: now, or
    /// when its link is back. Nothing is waiting locally; the exporter answers `released: false`
    /// if it held nothing.
    pub(super) fn give_back(&mut self, now: Instant, exporter: NodeId, import_event_id: u64) {
        if self.connected(exporter).is_some() {
            self.send_unimport(now, exporter, import_event_id, None);
        } else {
            self.imports.undelivered(exporter, import_event_id);
        }
    }

    pub(super) fn unimport_step(&mut self, now: Instant, step: UnimportStep, import_event_id: u64) {
        match step {
            UnimportStep::Deferred => {}
            UnimportStep::FinishNow { unimport_event_id } => {
                self.actions.push_back(Action::FinishUnimports {
                    ids: smallvec::smallvec![unimport_event_id],
                });
            }
            UnimportStep::TellExporter {
                exporter,
                unimport_event_id,
            } => {
                if self.connected(exporter).is_some() {
                    self.send_unimport(now, exporter, import_event_id, Some(unimport_event_id));
                } else {
                    // Tell it when it is back; the local releaser need not wait for that.
                    self.imports.undelivered(exporter, import_event_id);
                    self.actions.push_back(Action::FinishUnimports {
                        ids: smallvec::smallvec![unimport_event_id],
                    });
                }
            }
        }
    }

    pub(super) fn send_unimport(
        &mut self,
        now: Instant,
        exporter: NodeId,
        import_event_id: u64,
        token: Option<u64>,
    ) {
        if let Some(Some(earlier)) = self.unimports.insert((exporter, import_event_id), token) {
            // A second unimport of the same import (a retried delivery): finish the first.
            self.actions.push_back(Action::FinishUnimports {
                ids: smallvec::smallvec![earlier],
            });
        }
        self.arm(
            now + self.import_timeout,
            Timer::Unimport(exporter, import_event_id),
        );
        self.actions.push_back(Action::SendUnimport {
            peer: exporter,
            import_event_id,
        });
    }

    /// A link came up: deliver the unimports that waited for it.
    pub(super) fn flush_undelivered(&mut self, now: Instant, peer: NodeId) {
        for import_event_id in self.imports.take_undelivered(peer) {
            self.send_unimport(now, peer, import_event_id, None);
        }
    }
}
