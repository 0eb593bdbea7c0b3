//! The exporter side of a node: peers' import and unimport requests, the driver's describes,
//! and the references released when a leaving peer acknowledged our goodbye.

use std::time::Instant;

use super::*;

impl Node {
    /// A peer asks for an import of a local export.
    pub fn handle_peer_import(
        &mut self,
        now: Instant,
        request: RequestId,
        from: PeerId,
        import: ImportRequest,
    ) {
        let _ = now;
        if self.state() != DaemonState::Ready {
            let detail = format!("this daemon is {}, not READY yet", self.state());
            self.actions.push_back(Action::AnswerImport {
                request,
                answer: Err(ImportError::new(Status::InvalidState, detail)),
            });
            return;
        }
        if self.connected(from.node) != Some(from.instance) {
            // Only a CONNECTED link cancels a clean-up under way (`node/grace.rs`): a reference
            // taken for a peer whose link is still lost here could be released by it.
            let detail = format!(
                "node {} instance {} is not connected here (its session is not open); retry \
                 once it is",
                from.node, from.instance
            );
            self.actions.push_back(Action::AnswerImport {
                request,
                answer: Err(ImportError::new(Status::InvalidState, detail)),
            });
            return;
        }
        if self
            .give_backs
            .take(from.node, from.instance, import.import_event_id)
        {
            // Its give-back came first (the request was held on a connection the importer
            // already gave up): a reference taken now would be answered to nobody.
            self.actions.push_back(Action::AnswerImport {
                request,
                answer: Err(ImportError::new(
                    Status::InvalidState,
                    "the importer gave this import up before its request arrived",
                )),
            });
            return;
        }
        if let Some(detail) = self.job_admits(import.channel, from.node, "exporter") {
            self.actions.push_back(Action::AnswerImport {
                request,
                answer: Err(ImportError::new(Self::JOB_REFUSAL, detail)),
            });
            return;
        }
        let pending = self
            .describing
            .values()
            .filter(|d| d.importer.node == from.node)
            .count();
        if pending >= self.max_describes_per_peer {
            self.refused(
                "import: too many in flight",
                format!("node {} has {pending} imports in flight here", from.node),
            );
            self.actions.push_back(Action::AnswerImport {
                request,
                answer: Err(ImportError::new(
                    Status::InvalidState,
                    "too many imports in flight from this node; retry later",
                )),
            });
            return;
        }
        self.describing.insert(
            request,
            Describing {
                importer: from,
                import_event_id: import.import_event_id,
                cancelled: false,
            },
        );
        self.actions.push_back(Action::DescribeExport {
            request,
            export_uuid: import.export_uuid,
            index: import.index,
            channel: import.channel,
        });
        // The record names the importer now, after the describe is asked for, so the engine
        // writes it while the driver describes instead of between the describe and the answer.
        self.sync_persist(now);
    }

    /// The driver described an export for `request` (taking `export_ref`), or refused.
    pub fn handle_described(
        &mut self,
        now: Instant,
        request: RequestId,
        result: Result<(u64, Pages), ImportError>,
    ) {
        let Some(d) = self.describing.remove(&request) else {
            // Not ours: a reference taken for it must not stay held.
            if let Ok((export_ref, _)) = result {
                self.release(now, smallvec::smallvec![export_ref], None);
            }
            return;
        };
        let answer = match result {
            Ok((export_ref, _)) if self.stopping() => {
                // Stopping: no new reference is handed out.
                self.release(now, smallvec::smallvec![export_ref], None);
                Err(ImportError::new(
                    Status::InvalidState,
                    "exporter is stopping",
                ))
            }
            Ok((export_ref, _))
                if !self.knows(d.importer)
                    || self.mesh.departed(d.importer.node, d.importer.instance) =>
            {
                // The importer restarted or left while we described: its import is gone.
                self.release(now, smallvec::smallvec![export_ref], None);
                Err(ImportError::new(
                    Status::InvalidState,
                    "importer restarted or left",
                ))
            }
            Ok((export_ref, _)) if self.cleaned.contains_key(&d.importer.node) => {
                // Its link was lost for the grace time while we described: it fences (or has
                // fenced) this import, and nothing but its return would release the reference.
                self.release(now, smallvec::smallvec![export_ref], None);
                Err(ImportError::new(
                    Status::InvalidState,
                    "importer cleaned up after the grace time",
                ))
            }
            Ok((export_ref, _)) if d.cancelled => {
                // The importer gave up on it while we described.
                self.release(now, smallvec::smallvec![export_ref], None);
                Err(ImportError::new(
                    Status::InvalidState,
                    "import cancelled by the importer",
                ))
            }
            Ok((export_ref, pages)) => {
                let old = self.exports.insert(
                    d.importer.node,
                    d.importer.instance,
                    d.import_event_id,
                    export_ref,
                );
                if let Some(old) = old {
                    self.release(now, smallvec::smallvec![old], None);
                }
                // The record named this importer when its describe began (this only drops
                // nodes whose other describes ended meanwhile).
                self.sync_persist(now);
                Ok(pages)
            }
            Err(e) => {
                self.sync_persist(now);
                Err(e)
            }
        };
        self.actions
            .push_back(Action::AnswerImport { request, answer });
    }

    /// A peer says its import is gone. The answer comes once the reference is released, so
    /// the importer's releaser stays blocked until then, as the real handshake requires.
    pub fn handle_peer_unimport(
        &mut self,
        now: Instant,
        request: RequestId,
        from: PeerId,
        import_event_id: u64,
    ) {
        match self
            .exports
            .remove(from.node, from.instance, import_event_id)
        {
            Some(export_ref) => self.release(now, smallvec::smallvec![export_ref], Some(request)),
            None => {
                // An import the importer gave up on may still be being described: the
                // reference it takes is released when it lands. Or its request has not
                // arrived yet: it is refused when it does.
                let mut describing = false;
                for d in self.describing.values_mut() {
                    if d.importer.node == from.node && d.import_event_id == import_event_id {
                        d.cancelled = true;
                        describing = true;
                    }
                }
                if !describing && self.knows(from) {
                    self.give_backs
                        .mark(from.node, from.instance, import_event_id);
                }
                self.actions.push_back(Action::AnswerUnimport {
                    request,
                    released: false,
                });
            }
        }
    }
}
