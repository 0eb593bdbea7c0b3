//! GET_FABRIC_EVENTS drained until `bMoreEvents` is false, and each fabric event as the
//! daemon's [`Event`] (`docs/reference/driver-interface.md` §1.5 "OS event mechanism", §1.4
//! NV00F1_CTRL_FABRIC_EVENT).

use openimex_core::NodeId;
use openimex_rmabi::ctrl::nv00f1::{
    NV00F1_CTRL_CMD_GET_FABRIC_EVENTS, NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE,
    get_fabric_events_tail_offsets,
};
use openimex_rmabi::event::FabricEvent;

use super::{ImportKey, Nvidia, lock};
use crate::multicast::RemoteGpuAttach;
use crate::{DriverError, Event};

thread_local! {
    /// GET_FABRIC_EVENTS' parameter block, kept by the thread that drains.
    static PARAMS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Nvidia {
    /// Every queued event: GET_FABRIC_EVENTS (up to 128 a call) until `bMoreEvents` is false.
    pub(super) fn drain(&self) -> Result<Vec<Event>, DriverError> {
        let session = self.session()?;
        let size = self.layout.fabric_events_params_size();
        let event_size = self.layout.fabric_event_size();
        let (num_at, more_at) = get_fabric_events_tail_offsets(self.layout);
        let mut out = Vec::new();
        // The parameter block is this thread's, kept between drains (11 KiB in 595).
        PARAMS.with_borrow_mut(|params| {
            params.resize(size, 0);
            loop {
                params.fill(0);
                // A daemon that cannot read its events would hold its session and hear
                // nothing: any failure here is the driver lost, and the daemon stops.
                self.rm
                    .control(session, NV00F1_CTRL_CMD_GET_FABRIC_EVENTS, params)
                    .map_err(|e| DriverError::Lost(format!("GET_FABRIC_EVENTS: {e}")))?;
                let word = |at: usize| {
                    params
                        .get(at..at + 4)
                        .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                };
                let num = word(num_at) as usize;
                let more = params.get(more_at).is_some_and(|&b| b != 0);
                if num > NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE {
                    return Err(DriverError::Lost(format!(
                        "GET_FABRIC_EVENTS returned numEvents {num}, more than the \
                         {NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE} it holds"
                    )));
                }
                for bytes in params[..num * event_size].chunks_exact(event_size) {
                    // An event of a type this build does not know is dequeued already: said
                    // and skipped, the others are kept.
                    match FabricEvent::decode(self.layout, bytes) {
                        Ok(e) => {
                            if let Some(ev) = self.convert(e)? {
                                out.push(ev);
                            }
                        }
                        Err(e) => tracing::warn!("a fabric event skipped: {e}"),
                    }
                }
                if !more {
                    return Ok(out);
                }
            }
        })
    }

    /// One event as the daemon's; an import is remembered for its VALIDATE, which names it
    /// by (UUID, index, import ID) where the daemon names it by event ID.
    fn convert(&self, e: FabricEvent) -> Result<Option<Event>, DriverError> {
        Ok(Some(match e {
            FabricEvent::Import {
                id,
                channel,
                import_id,
                index,
                export_node,
                export_uuid,
            } => {
                lock(&self.imports)?.insert(
                    id,
                    ImportKey {
                        uuid: export_uuid,
                        index,
                        import_id,
                    },
                );
                Event::Import {
                    event_id: id,
                    channel,
                    export_uuid,
                    index,
                    export_node: NodeId(export_node),
                }
            }
            FabricEvent::Unimport {
                id,
                import_event_id,
                export_node,
                ..
            } => {
                // An import unimported before it was validated needs no VALIDATE any more.
                lock(&self.imports)?.remove(&import_event_id);
                Event::Unimport {
                    unimport_event_id: id,
                    import_event_id,
                    export_node: NodeId(export_node),
                }
            }
            FabricEvent::CliqueIdChange {
                gpu_id, clique_id, ..
            } => {
                let Some(gpu) = self.gpus.iter().find(|g| g.gpu_id == gpu_id) else {
                    tracing::warn!(
                        gpu_id,
                        clique_id,
                        "CLIQUE_ID_CHANGE for a GPU this client did not attach: ignored"
                    );
                    return Ok(None);
                };
                Event::CliqueIdChange {
                    gpu: gpu.index,
                    clique_id,
                }
            }
            FabricEvent::RemoteGpuAttach {
                id,
                channel,
                probe_handle,
                key,
                bw_mode_epoch,
                page_size,
                clique_id,
                index,
                export_node,
                bw_mode,
                export_uuid,
            } => Event::RemoteGpuAttach(RemoteGpuAttach {
                event_id: id,
                channel,
                export_uuid,
                index,
                export_node: NodeId(export_node),
                gpu_probe_handle: probe_handle,
                key,
                clique_id,
                bw_mode,
                bw_mode_epoch,
                page_size,
            }),
        }))
    }
}
