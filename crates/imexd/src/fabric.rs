//! Export/import through the daemons: the engine's handling of driver events (MEM_IMPORT,
//! MEM_UNIMPORT) on the importer side and of peer requests on the exporter side.
//!
//! Driver calls block, so they run on tokio's blocking pool; their results come back to the
//! engine as [`FabricInput`]s. Who holds what is kept in the core tables
//! ([`ExportRefs`](openimex_core::ExportRefs), [`Imports`](openimex_core::Imports)), which
//! decide every release and acknowledgement.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use openimex_core::{ConnStatus, Hello, InstanceId, NodeId, UnimportStep};
use openimex_driver::{Driver, DriverError, Event, Pages, Status};
use openimex_proto::peer::{ImportReply, ImportRequest, UnimportRequest, peer_client::PeerClient};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use crate::convert;
use crate::engine::{Engine, Input};

/// How long an importer waits for the exporter's answer before failing the import.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the event pump waits in one long-poll.
const EVENT_POLL: Duration = Duration::from_millis(500);

/// What the exporter answers an import with.
pub(crate) type ImportAnswer = Result<Pages, (Status, String)>;

/// Fabric messages to the engine.
pub(crate) enum FabricInput {
    /// An event from the driver.
    Driver(Event),
    /// The driver went away: the session is gone.
    DriverLost(String),
    /// The exporter answered (or the request failed).
    ImportAnswered {
        import_event_id: u64,
        exporter: NodeId,
        answer: ImportAnswer,
    },
    /// A peer asks us (the exporter) for an import.
    PeerImport {
        from: Hello,
        import_event_id: u64,
        uuid: [u8; 16],
        index: u16,
        channel: u32,
        reply: oneshot::Sender<ImportAnswer>,
    },
    /// Our driver described (or refused) an export for a peer's import.
    Described {
        importer: NodeId,
        instance: InstanceId,
        import_event_id: u64,
        result: Result<(u64, Pages), DriverError>,
        reply: oneshot::Sender<ImportAnswer>,
    },
    /// A peer unimported.
    PeerUnimport {
        from: Hello,
        import_event_id: u64,
        reply: oneshot::Sender<bool>,
    },
}

/// Starts the thread that long-polls the driver for events. It stops when `stop` is set.
pub(crate) fn spawn_event_pump(
    driver: Arc<dyn Driver>,
    tx: mpsc::Sender<Input>,
    stop: Arc<AtomicBool>,
) {
    let spawned = std::thread::Builder::new()
        .name("driver-events".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match driver.next_events(EVENT_POLL) {
                    Ok(events) => {
                        for ev in events {
                            if tx
                                .blocking_send(Input::Fabric(FabricInput::Driver(ev)))
                                .is_err()
                            {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        let _ =
                            tx.blocking_send(Input::Fabric(FabricInput::DriverLost(e.to_string())));
                        return;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        warn!("cannot start the driver event thread: {e}");
    }
}

/// Runs a blocking driver call off the runtime, logging a failure.
fn blocking(
    driver: &Arc<dyn Driver>,
    what: &'static str,
    f: impl FnOnce(&dyn Driver) -> Result<(), DriverError> + Send + 'static,
) {
    let driver = driver.clone();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = f(driver.as_ref()) {
            warn!("driver {what} failed: {e}");
        }
    });
}

impl Engine {
    /// Handles one fabric message. Returns the driver's loss, which ends the daemon.
    pub(crate) fn handle_fabric(&mut self, input: FabricInput) -> Result<(), String> {
        match input {
            FabricInput::Driver(Event::Import {
                event_id,
                channel,
                export_uuid,
                index,
                export_node,
            }) => {
                self.import_requested(event_id, channel, export_uuid, index, export_node);
            }
            FabricInput::Driver(Event::Unimport {
                unimport_event_id,
                import_event_id,
                export_node,
            }) => {
                debug!(
                    "unimport {unimport_event_id} of import {import_event_id} from node {export_node}"
                );
                let step = self.imports.unimport(import_event_id, unimport_event_id);
                self.unimport_step(step, import_event_id);
            }
            FabricInput::DriverLost(e) => return Err(e),
            FabricInput::ImportAnswered {
                import_event_id,
                exporter,
                answer,
            } => {
                let held = answer.is_ok();
                if let Err((status, detail)) = &answer {
                    info!(
                        "import {import_event_id} from node {exporter} failed: {} ({detail})",
                        status.as_str()
                    );
                }
                let result = answer.map_err(|(s, _)| s);
                blocking(&self.driver, "validate", move |d| {
                    d.validate_import(import_event_id, result)
                });
                if let Some(step) = self.imports.answered(import_event_id, held) {
                    self.unimport_step(step, import_event_id);
                }
            }
            FabricInput::PeerImport {
                from,
                import_event_id,
                uuid,
                index,
                channel,
                reply,
            } => {
                if !self.knows(&from) {
                    let detail = format!(
                        "node {} instance {} is not connected here; reconnect first",
                        from.node, from.instance
                    );
                    let _ = reply.send(Err((Status::InvalidState, detail)));
                    return Ok(());
                }
                let (tx, driver) = (self.tx.clone(), self.driver.clone());
                let (importer, instance) = (from.node, from.instance);
                tokio::task::spawn_blocking(move || {
                    let result = driver.describe_export(uuid, index, channel);
                    let input = FabricInput::Described {
                        importer,
                        instance,
                        import_event_id,
                        result,
                        reply,
                    };
                    let _ = tx.blocking_send(Input::Fabric(input));
                });
            }
            FabricInput::Described {
                importer,
                instance,
                import_event_id,
                result,
                reply,
            } => match result {
                Ok((export_ref, pages)) => {
                    if !self.knows_instance(importer, instance) {
                        // The importer restarted while we described: its import is gone.
                        blocking(&self.driver, "release export ref", move |d| {
                            d.release_export_ref(export_ref)
                        });
                        let _ =
                            reply.send(Err((Status::InvalidState, "importer restarted".into())));
                        return Ok(());
                    }
                    if let Some(old) =
                        self.export_refs
                            .insert(importer, instance, import_event_id, export_ref)
                    {
                        blocking(&self.driver, "release export ref", move |d| {
                            d.release_export_ref(old)
                        });
                    }
                    let _ = reply.send(Ok(pages));
                }
                Err(e) => {
                    let _ = reply.send(Err((e.status(), e.to_string())));
                }
            },
            FabricInput::PeerUnimport {
                from,
                import_event_id,
                reply,
            } => {
                match self.export_refs.remove(from.node, import_event_id) {
                    Some(export_ref) => {
                        let driver = self.driver.clone();
                        // Answer only once the reference is gone: the importer's releaser stays
                        // blocked until then, as the real handshake requires.
                        tokio::task::spawn_blocking(move || {
                            if let Err(e) = driver.release_export_ref(export_ref) {
                                warn!("driver release export ref failed: {e}");
                            }
                            let _ = reply.send(true);
                        });
                    }
                    None => {
                        let _ = reply.send(false);
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether `from` is the instance of that node our mesh knows (it handshook with us).
    fn knows(&self, from: &Hello) -> bool {
        self.knows_instance(from.node, from.instance)
    }

    fn knows_instance(&self, node: NodeId, instance: InstanceId) -> bool {
        self.mesh
            .peer(node)
            .is_some_and(|(_, known)| known == Some(instance))
    }

    fn peer_channel(&self, peer: NodeId) -> Option<tonic::transport::Channel> {
        let connected = self
            .mesh
            .peer(peer)
            .is_some_and(|(status, _)| status == ConnStatus::Connected);
        connected
            .then(|| self.sessions.get(&peer).map(|(_, l)| l.channel.clone()))
            .flatten()
    }

    fn import_requested(
        &mut self,
        event_id: u64,
        channel: u32,
        uuid: [u8; 16],
        index: u16,
        exporter: NodeId,
    ) {
        let Some(ch) = self.peer_channel(exporter) else {
            // Nobody to ask: fail the import now rather than leave the application hanging.
            info!(
                "import {event_id} from node {exporter} failed: node {exporter} is not connected"
            );
            blocking(&self.driver, "validate", move |d| {
                d.validate_import(event_id, Err(Status::InvalidState))
            });
            return;
        };
        self.imports.requested(event_id, exporter);
        let me = convert::identity(&self.mesh.hello(), &self.driver_version);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let req = ImportRequest {
                from: Some(me),
                import_event_id: event_id,
                export_uuid: uuid.to_vec(),
                index: u32::from(index),
                channel,
            };
            let answer =
                match tokio::time::timeout(IMPORT_TIMEOUT, PeerClient::new(ch).import(req)).await {
                    Ok(Ok(r)) => answer_of(r.into_inner()),
                    Ok(Err(s)) => Err((
                        Status::InvalidState,
                        format!("exporter node {exporter}: {}", s.message()),
                    )),
                    Err(_) => Err((
                        Status::InvalidState,
                        format!("exporter node {exporter} did not answer in time"),
                    )),
                };
            let _ = tx
                .send(Input::Fabric(FabricInput::ImportAnswered {
                    import_event_id: event_id,
                    exporter,
                    answer,
                }))
                .await;
        });
    }

    fn unimport_step(&mut self, step: UnimportStep, import_event_id: u64) {
        match step {
            UnimportStep::Deferred => {}
            UnimportStep::FinishNow { unimport_event_id } => {
                blocking(&self.driver, "finish unimport", move |d| {
                    d.finish_unimport(&[unimport_event_id])
                });
            }
            UnimportStep::TellExporter {
                exporter,
                unimport_event_id,
            } => {
                let Some(ch) = self.peer_channel(exporter) else {
                    // Tell it when it is back; the local releaser need not wait for that.
                    self.imports.undelivered(exporter, import_event_id);
                    blocking(&self.driver, "finish unimport", move |d| {
                        d.finish_unimport(&[unimport_event_id])
                    });
                    return;
                };
                let me = convert::identity(&self.mesh.hello(), &self.driver_version);
                let driver = self.driver.clone();
                tokio::spawn(async move {
                    let req = UnimportRequest {
                        from: Some(me),
                        import_event_id,
                    };
                    match tokio::time::timeout(IMPORT_TIMEOUT, PeerClient::new(ch).unimport(req))
                        .await
                    {
                        Ok(Ok(_)) => {}
                        Ok(Err(s)) => warn!(
                            "unimport {import_event_id} on node {exporter} failed: {}",
                            s.message()
                        ),
                        Err(_) => warn!("unimport {import_event_id} on node {exporter} timed out"),
                    }
                    let _ = tokio::task::spawn_blocking(move || {
                        driver.finish_unimport(&[unimport_event_id])
                    })
                    .await;
                });
            }
        }
    }

    /// A link came up: deliver unimports that waited for it.
    pub(crate) fn flush_pending_unimports(&mut self, peer: NodeId) {
        let Some(ch) = self.peer_channel(peer) else {
            return;
        };
        let ids = self.imports.take_undelivered(peer);
        if ids.is_empty() {
            return;
        }
        let me = convert::identity(&self.mesh.hello(), &self.driver_version);
        tokio::spawn(async move {
            for import_event_id in ids {
                let req = UnimportRequest {
                    from: Some(me.clone()),
                    import_event_id,
                };
                if let Err(e) = PeerClient::new(ch.clone()).unimport(req).await {
                    warn!(
                        "late unimport {import_event_id} on node {peer} failed: {}",
                        e.message()
                    );
                }
            }
        });
    }

    /// A peer's old instance is gone (restart, or clean departure): release what we held for
    /// its importers, forget our imports from it, and disable local clients still mapping its
    /// memory (it may be freed or reused).
    pub(crate) fn peer_gone(&mut self, peer: NodeId, current: Option<InstanceId>) {
        let refs = match current {
            Some(inst) => self.export_refs.drain_stale(peer, inst),
            None => self.export_refs.drain_node(peer),
        };
        let finish = self.imports.drain_exporter(peer);
        if !refs.is_empty() {
            info!(
                "releasing {} export references held for node {peer}'s previous importers",
                refs.len()
            );
        }
        blocking(&self.driver, "clean-up of a departed peer", move |d| {
            for r in refs {
                d.release_export_ref(r)?;
            }
            if !finish.is_empty() {
                d.finish_unimport(&finish)?;
            }
            d.disable_importers(peer)
        });
    }
}

fn answer_of(r: ImportReply) -> ImportAnswer {
    if r.error.is_empty() {
        Ok(Pages {
            size: r.size,
            page_size: r.page_size,
            pfns: r.pfns,
            clique_id: r.clique_id,
        })
    } else {
        Err((Status::parse(&r.error), r.detail))
    }
}

/// The wire form of an answer.
pub(crate) fn reply_of(a: ImportAnswer) -> ImportReply {
    match a {
        Ok(p) => ImportReply {
            error: String::new(),
            detail: String::new(),
            size: p.size,
            page_size: p.page_size,
            pfns: p.pfns,
            clique_id: p.clique_id,
        },
        Err((s, detail)) => ImportReply {
            error: s.as_str().to_string(),
            detail,
            ..Default::default()
        },
    }
}
