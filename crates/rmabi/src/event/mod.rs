//! Fabric events of an IMEX session, version-independent.
//!
//! The kernel queues events for the IMEX session and hands them out through
//! `NV00F1_CTRL_CMD_GET_FABRIC_EVENTS`. [`FabricEvent`] is one event independent of the
//! layout family; [`FabricEvent::encode`]/[`FabricEvent::decode`] convert one C
//! `NV00F1_CTRL_FABRIC_EVENT` of a [`Layout`], and [`fabric_events_params`] /
//! [`parse_fabric_events_params`] a whole parameter block. The C structs are in [`raw`].
//!
//! Fields a layout lacks (`bw_mode_epoch`, `bw_mode` before V580, `page_size` before
//! V590) decode as 0 and are not encoded. An event whose `type` is unknown is an
//! [`AbiError::UnknownEventType`], never a panic.

pub mod raw;

use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::class::nv00e0::NV_MEM_EXPORT_UUID_LEN;
use crate::ctrl::nv00f1::{
    NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE, get_fabric_events_params_size,
    get_fabric_events_tail_offsets,
};
use crate::{AbiError, Layout, narrow, read_exact};
use raw::*;

/// One fabric event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FabricEvent {
    /// `MEM_IMPORT` (0): an importer on this node waits for memory exported by
    /// `export_node`. The import is keyed by (`export_uuid`, `index`, `import_id`).
    Import {
        /// Event ID.
        id: u64,
        /// IMEX channel of the importer.
        channel: u32,
        /// `import.id`: the importer's 48-bit import ID.
        import_id: u64,
        /// `import.index`.
        index: u16,
        /// `import.exportNodeId`.
        export_node: u16,
        /// `import.exportUuid`.
        export_uuid: [u8; NV_MEM_EXPORT_UUID_LEN],
    },
    /// `MEM_UNIMPORT` (1): the import of event `import_event_id` is gone; acknowledge with
    /// `FINISH_MEM_UNIMPORT` naming this event's `id`.
    Unimport {
        /// Event ID (the token for `FINISH_MEM_UNIMPORT`).
        id: u64,
        /// IMEX channel.
        channel: u32,
        /// `unimport.importEventId`.
        import_event_id: u64,
        /// `unimport.exportNodeId`.
        export_node: u16,
    },
    /// `REMOTE_GPU_ATTACH` (2): a GPU on this node joins a multicast object exported by
    /// `export_node`; forward to `NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU` there.
    RemoteGpuAttach {
        /// Event ID.
        id: u64,
        /// IMEX channel.
        channel: u32,
        /// `attach.gpuFabricProbeHandle`.
        probe_handle: u64,
        /// `attach.key`.
        key: u64,
        /// `attach.bwModeEpoch` (0 in V550).
        bw_mode_epoch: u64,
        /// `attach.pageSize` (0 before V590).
        page_size: u64,
        /// `attach.cliqueId`.
        clique_id: u32,
        /// `attach.index`.
        index: u16,
        /// `attach.exportNodeId`.
        export_node: u16,
        /// `attach.bwMode` (0 in V550; at most 255 in V580/V590).
        bw_mode: u16,
        /// `attach.exportUuid`.
        export_uuid: [u8; NV_MEM_EXPORT_UUID_LEN],
    },
    /// `CLIQUE_ID_CHANGE` (3): a local GPU's clique ID changed (channel 0).
    CliqueIdChange {
        /// Event ID.
        id: u64,
        /// IMEX channel (0).
        channel: u32,
        /// `cliqueIdChange.gpuId`.
        gpu_id: u32,
        /// `cliqueIdChange.cliqueId`.
        clique_id: u32,
    },
}

impl FabricEvent {
    /// The event ID.
    pub fn id(&self) -> u64 {
        match *self {
            FabricEvent::Import { id, .. }
            | FabricEvent::Unimport { id, .. }
            | FabricEvent::RemoteGpuAttach { id, .. }
            | FabricEvent::CliqueIdChange { id, .. } => id,
        }
    }

    /// The IMEX channel.
    pub fn channel(&self) -> u32 {
        match *self {
            FabricEvent::Import { channel, .. }
            | FabricEvent::Unimport { channel, .. }
            | FabricEvent::RemoteGpuAttach { channel, .. }
            | FabricEvent::CliqueIdChange { channel, .. } => channel,
        }
    }

    /// The C `type` value (`NV00F1_CTRL_FABRIC_EVENT_TYPE_*`).
    pub fn type_value(&self) -> u8 {
        match self {
            FabricEvent::Import { .. } => NV00F1_CTRL_FABRIC_EVENT_TYPE_MEM_IMPORT,
            FabricEvent::Unimport { .. } => NV00F1_CTRL_FABRIC_EVENT_TYPE_MEM_UNIMPORT,
            FabricEvent::RemoteGpuAttach { .. } => NV00F1_CTRL_FABRIC_EVENT_TYPE_REMOTE_GPU_ATTACH,
            FabricEvent::CliqueIdChange { .. } => NV00F1_CTRL_FABRIC_EVENT_TYPE_CLIQUE_ID_CHANGE,
        }
    }

    /// The bytes of one `NV00F1_CTRL_FABRIC_EVENT` of `layout`
    /// ([`Layout::fabric_event_size`] bytes; padding and unused union bytes are 0).
    /// Fails only if `bw_mode` does not fit the layout's `NvU8`.
    pub fn encode(&self, layout: Layout) -> Result<Vec<u8>, AbiError> {
        Ok(match layout {
            Layout::V550 => encode_raw::<NV00F1_CTRL_FABRIC_EVENT_V550>(self, layout)?
                .as_bytes()
                .to_vec(),
            Layout::V580 => encode_raw::<NV00F1_CTRL_FABRIC_EVENT_V580>(self, layout)?
                .as_bytes()
                .to_vec(),
            Layout::V590 => encode_raw::<NV00F1_CTRL_FABRIC_EVENT_V590>(self, layout)?
                .as_bytes()
                .to_vec(),
            Layout::V595 => encode_raw::<NV00F1_CTRL_FABRIC_EVENT_V595>(self, layout)?
                .as_bytes()
                .to_vec(),
        })
    }

    /// Parses one `NV00F1_CTRL_FABRIC_EVENT` of `layout` (exactly
    /// [`Layout::fabric_event_size`] bytes).
    pub fn decode(layout: Layout, bytes: &[u8]) -> Result<FabricEvent, AbiError> {
        const WHAT: &str = "NV00F1_CTRL_FABRIC_EVENT";
        match layout {
            Layout::V550 => decode_raw(&read_exact::<NV00F1_CTRL_FABRIC_EVENT_V550>(
                WHAT,
                Some(layout),
                bytes,
            )?),
            Layout::V580 => decode_raw(&read_exact::<NV00F1_CTRL_FABRIC_EVENT_V580>(
                WHAT,
                Some(layout),
                bytes,
            )?),
            Layout::V590 => decode_raw(&read_exact::<NV00F1_CTRL_FABRIC_EVENT_V590>(
                WHAT,
                Some(layout),
                bytes,
            )?),
            Layout::V595 => decode_raw(&read_exact::<NV00F1_CTRL_FABRIC_EVENT_V595>(
                WHAT,
                Some(layout),
                bytes,
            )?),
        }
    }
}

/// Builds a `NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS` block of `layout` holding `events`
/// (what the kernel returns; for a simulated driver and tests). At most 128 events.
pub fn fabric_events_params(
    layout: Layout,
    events: &[FabricEvent],
    more: bool,
) -> Result<Vec<u8>, AbiError> {
    if events.len() > NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE {
        return Err(AbiError::TooManyEntries {
            what: "NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS.eventArray",
            count: events.len(),
            max: NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE,
        });
    }
    let size = layout.fabric_event_size();
    let mut out = vec![0u8; get_fabric_events_params_size(layout)];
    for (i, ev) in events.iter().enumerate() {
        out[i * size..(i + 1) * size].copy_from_slice(&ev.encode(layout)?);
    }
    let (num_at, more_at) = get_fabric_events_tail_offsets(layout);
    out[num_at..num_at + 4].copy_from_slice(&(events.len() as u32).to_ne_bytes());
    out[more_at] = u8::from(more);
    Ok(out)
}

/// Parses a `NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS` block of `layout`: the first
/// `numEvents` events and `bMoreEvents`. Fails on a wrong block size, on `numEvents` >
/// 128, and on the first event that does not decode (see
/// [`parse_fabric_events_params_each`] to keep the others).
pub fn parse_fabric_events_params(
    layout: Layout,
    bytes: &[u8],
) -> Result<(Vec<FabricEvent>, bool), AbiError> {
    let (events, more) = parse_fabric_events_params_each(layout, bytes)?;
    Ok((events.into_iter().collect::<Result<_, _>>()?, more))
}

/// Like [`parse_fabric_events_params`], but returns each event's own result, so one
/// event of an unknown type does not lose the others (they are already dequeued from
/// the kernel). The block itself must still have the right size and `numEvents` ≤ 128.
pub fn parse_fabric_events_params_each(
    layout: Layout,
    bytes: &[u8],
) -> Result<(Vec<Result<FabricEvent, AbiError>>, bool), AbiError> {
    let expected = get_fabric_events_params_size(layout);
    if bytes.len() != expected {
        return Err(AbiError::WrongSize {
            what: "NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS",
            layout: Some(layout),
            expected,
            actual: bytes.len(),
        });
    }
    let (num_at, more_at) = get_fabric_events_tail_offsets(layout);
    let mut num = [0u8; 4];
    num.copy_from_slice(&bytes[num_at..num_at + 4]);
    let num = u32::from_ne_bytes(num) as usize;
    if num > NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE {
        return Err(AbiError::TooManyEntries {
            what: "NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS.numEvents",
            count: num,
            max: NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE,
        });
    }
    let size = layout.fabric_event_size();
    let events = bytes[..num * size]
        .chunks_exact(size)
        .map(|b| FabricEvent::decode(layout, b))
        .collect();
    Ok((events, bytes[more_at] != 0))
}

/// The remote-GPU-attach fields common to every layout (absent ones are 0).
struct Attach {
    probe_handle: u64,
    key: u64,
    bw_mode_epoch: u64,
    page_size: u64,
    clique_id: u32,
    index: u16,
    export_node: u16,
    bw_mode: u16,
    export_uuid: [u8; NV_MEM_EXPORT_UUID_LEN],
}

/// The per-family part of encoding/decoding: the event header and the attach member.
trait RawEvent: FromBytes + IntoBytes + Immutable + Default {
    fn header(&self) -> (u8, u64, u32);
    fn set_header(&mut self, type_: u8, id: u64, channel: u32);
    fn import_data(&self) -> NV00F1_CTRL_FABRIC_MEM_IMPORT_EVENT_DATA;
    fn unimport_data(&self) -> NV00F1_CTRL_FABRIC_MEM_UNIMPORT_EVENT_DATA;
    fn clique_data(&self) -> NV00F1_CTRL_CLIQUE_ID_CHANGE_GPU_EVENT_DATA;
    fn put<T: IntoBytes + Immutable>(&mut self, member: &T);
    fn attach_data(&self) -> Attach;
    fn put_attach(&mut self, a: &Attach, layout: Layout) -> Result<(), AbiError>;
}

macro_rules! raw_event_common {
    () => {
        fn header(&self) -> (u8, u64, u32) {
            (self.type_, self.id, self.imexChannel)
        }
        fn set_header(&mut self, type_: u8, id: u64, channel: u32) {
            self.type_ = type_;
            self.id = id;
            self.imexChannel = channel;
        }
        fn import_data(&self) -> NV00F1_CTRL_FABRIC_MEM_IMPORT_EVENT_DATA {
            self.import()
        }
        fn unimport_data(&self) -> NV00F1_CTRL_FABRIC_MEM_UNIMPORT_EVENT_DATA {
            self.unimport()
        }
        fn clique_data(&self) -> NV00F1_CTRL_CLIQUE_ID_CHANGE_GPU_EVENT_DATA {
            self.clique_id_change()
        }
        fn put<T: IntoBytes + Immutable>(&mut self, member: &T) {
            self.set_data(member)
        }
    };
}

impl RawEvent for NV00F1_CTRL_FABRIC_EVENT_V550 {
    raw_event_common!();
    fn attach_data(&self) -> Attach {
        let a = self.attach();
        Attach {
            probe_handle: a.gpuFabricProbeHandle,
            key: a.key,
            bw_mode_epoch: 0,
            page_size: 0,
            clique_id: a.cliqueId,
            index: a.index,
            export_node: a.exportNodeId,
            bw_mode: 0,
            export_uuid: a.exportUuid,
        }
    }
    fn put_attach(&mut self, a: &Attach, _layout: Layout) -> Result<(), AbiError> {
        self.put(&NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V550 {
            gpuFabricProbeHandle: a.probe_handle,
            key: a.key,
            cliqueId: a.clique_id,
            index: a.index,
            exportNodeId: a.export_node,
            exportUuid: a.export_uuid,
        });
        Ok(())
    }
}

impl RawEvent for NV00F1_CTRL_FABRIC_EVENT_V580 {
    raw_event_common!();
    fn attach_data(&self) -> Attach {
        let a = self.attach();
        Attach {
            probe_handle: a.gpuFabricProbeHandle,
            key: a.key,
            bw_mode_epoch: a.bwModeEpoch,
            page_size: 0,
            clique_id: a.cliqueId,
            index: a.index,
            export_node: a.exportNodeId,
            bw_mode: u16::from(a.bwMode),
            export_uuid: a.exportUuid,
        }
    }
    fn put_attach(&mut self, a: &Attach, layout: Layout) -> Result<(), AbiError> {
        self.put(&NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V580 {
            gpuFabricProbeHandle: a.probe_handle,
            key: a.key,
            bwModeEpoch: a.bw_mode_epoch,
            cliqueId: a.clique_id,
            index: a.index,
            exportNodeId: a.export_node,
            bwMode: narrow(
                "NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA.bwMode",
                layout,
                u64::from(a.bw_mode),
            )?,
            exportUuid: a.export_uuid,
            _pad0: [0; 7],
        });
        Ok(())
    }
}

impl RawEvent for NV00F1_CTRL_FABRIC_EVENT_V590 {
    raw_event_common!();
    fn attach_data(&self) -> Attach {
        let a = self.attach();
        Attach {
            probe_handle: a.gpuFabricProbeHandle,
            key: a.key,
            bw_mode_epoch: a.bwModeEpoch,
            page_size: a.pageSize,
            clique_id: a.cliqueId,
            index: a.index,
            export_node: a.exportNodeId,
            bw_mode: u16::from(a.bwMode),
            export_uuid: a.exportUuid,
        }
    }
    fn put_attach(&mut self, a: &Attach, layout: Layout) -> Result<(), AbiError> {
        self.put(&NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V590 {
            gpuFabricProbeHandle: a.probe_handle,
            key: a.key,
            bwModeEpoch: a.bw_mode_epoch,
            pageSize: a.page_size,
            cliqueId: a.clique_id,
            index: a.index,
            exportNodeId: a.export_node,
            bwMode: narrow(
                "NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA.bwMode",
                layout,
                u64::from(a.bw_mode),
            )?,
            exportUuid: a.export_uuid,
            _pad0: [0; 7],
        });
        Ok(())
    }
}

impl RawEvent for NV00F1_CTRL_FABRIC_EVENT_V595 {
    raw_event_common!();
    fn attach_data(&self) -> Attach {
        let a = self.attach();
        Attach {
            probe_handle: a.gpuFabricProbeHandle,
            key: a.key,
            bw_mode_epoch: a.bwModeEpoch,
            page_size: a.pageSize,
            clique_id: a.cliqueId,
            index: a.index,
            export_node: a.exportNodeId,
            bw_mode: a.bwMode,
            export_uuid: a.exportUuid,
        }
    }
    fn put_attach(&mut self, a: &Attach, _layout: Layout) -> Result<(), AbiError> {
        self.put(&NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V595 {
            gpuFabricProbeHandle: a.probe_handle,
            key: a.key,
            bwModeEpoch: a.bw_mode_epoch,
            pageSize: a.page_size,
            cliqueId: a.clique_id,
            index: a.index,
            exportNodeId: a.export_node,
            bwMode: a.bw_mode,
            exportUuid: a.export_uuid,
            _pad0: [0; 6],
        });
        Ok(())
    }
}

fn encode_raw<R: RawEvent>(ev: &FabricEvent, layout: Layout) -> Result<R, AbiError> {
    let mut r = R::default();
    r.set_header(ev.type_value(), ev.id(), ev.channel());
    match *ev {
        FabricEvent::Import {
            import_id,
            index,
            export_node,
            export_uuid,
            ..
        } => {
            r.put(&NV00F1_CTRL_FABRIC_MEM_IMPORT_EVENT_DATA {
                id: import_id,
                index,
                exportNodeId: export_node,
                exportUuid: export_uuid,
                _pad0: [0; 4],
            });
        }
        FabricEvent::Unimport {
            import_event_id,
            export_node,
            ..
        } => {
            r.put(&NV00F1_CTRL_FABRIC_MEM_UNIMPORT_EVENT_DATA {
                importEventId: import_event_id,
                exportNodeId: export_node,
                _pad0: [0; 6],
            });
        }
        FabricEvent::RemoteGpuAttach {
            probe_handle,
            key,
            bw_mode_epoch,
            page_size,
            clique_id,
            index,
            export_node,
            bw_mode,
            export_uuid,
            ..
        } => {
            let a = Attach {
                probe_handle,
                key,
                bw_mode_epoch,
                page_size,
                clique_id,
                index,
                export_node,
                bw_mode,
                export_uuid,
            };
            r.put_attach(&a, layout)?;
        }
        FabricEvent::CliqueIdChange {
            gpu_id, clique_id, ..
        } => {
            r.put(&NV00F1_CTRL_CLIQUE_ID_CHANGE_GPU_EVENT_DATA {
                gpuId: gpu_id,
                cliqueId: clique_id,
            });
        }
    }
    Ok(r)
}

fn decode_raw<R: RawEvent>(r: &R) -> Result<FabricEvent, AbiError> {
    let (type_, id, channel) = r.header();
    Ok(match type_ {
        NV00F1_CTRL_FABRIC_EVENT_TYPE_MEM_IMPORT => {
            let d = r.import_data();
            FabricEvent::Import {
                id,
                channel,
                import_id: d.id,
                index: d.index,
                export_node: d.exportNodeId,
                export_uuid: d.exportUuid,
            }
        }
        NV00F1_CTRL_FABRIC_EVENT_TYPE_MEM_UNIMPORT => {
            let d = r.unimport_data();
            FabricEvent::Unimport {
                id,
                channel,
                import_event_id: d.importEventId,
                export_node: d.exportNodeId,
            }
        }
        NV00F1_CTRL_FABRIC_EVENT_TYPE_REMOTE_GPU_ATTACH => {
            let a = r.attach_data();
            FabricEvent::RemoteGpuAttach {
                id,
                channel,
                probe_handle: a.probe_handle,
                key: a.key,
                bw_mode_epoch: a.bw_mode_epoch,
                page_size: a.page_size,
                clique_id: a.clique_id,
                index: a.index,
                export_node: a.export_node,
                bw_mode: a.bw_mode,
                export_uuid: a.export_uuid,
            }
        }
        NV00F1_CTRL_FABRIC_EVENT_TYPE_CLIQUE_ID_CHANGE => {
            let d = r.clique_data();
            FabricEvent::CliqueIdChange {
                id,
                channel,
                gpu_id: d.gpuId,
                clique_id: d.cliqueId,
            }
        }
        other => return Err(AbiError::UnknownEventType { type_value: other }),
    })
}
