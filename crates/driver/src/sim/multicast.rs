//! The `sim` backend's multicast controls (the owner's side of §1.6 "Multicast" 4) and the
//! translation of the simulated driver's REMOTE_GPU_ATTACH event.

use openimex_core::NodeId;
use openimex_simproto::handle::ExportUuid;
use openimex_simproto::multicast::{McRequest, RemoteGpu};
use openimex_simproto::proto::{FabricEvent, NvStatus, Request};

use super::SimDriver;
use crate::multicast::RemoteGpuAttach;
use crate::{DriverError, Status};

impl SimDriver {
    /// ATTACH_REMOTE_GPU on the prime of `a.export_uuid` for node `from`'s GPU.
    pub(super) fn mc_attach_remote_gpu(
        &self,
        from: NodeId,
        a: &RemoteGpuAttach,
    ) -> Result<(), DriverError> {
        let token = self.token()?;
        let req = McRequest::AttachRemoteGpu {
            token,
            export_uuid: ExportUuid(a.export_uuid).to_hex(),
            node_id: from.0,
            gpu: RemoteGpu {
                gpu_probe_handle: a.gpu_probe_handle,
                key: a.key,
                clique_id: a.clique_id,
                bw_mode: a.bw_mode,
                bw_mode_epoch: a.bw_mode_epoch,
                page_size: a.page_size,
            },
        };
        self.control("attach remote GPU", &Request::Multicast(req))
            .map(drop)
    }

    /// SET_FAILURE on the prime of `export_uuid` with the daemon's status (`Other` is
    /// NV_ERR_GENERIC: the daemon knows no better).
    pub(super) fn mc_set_failure(
        &self,
        export_uuid: [u8; 16],
        s: Status,
    ) -> Result<(), DriverError> {
        let token = self.token()?;
        let status = match s {
            Status::InsufficientPermissions => NvStatus::InsufficientPermissions,
            Status::ObjectNotFound => NvStatus::ObjectNotFound,
            Status::InvalidState => NvStatus::InvalidState,
            Status::InvalidArgument => NvStatus::InvalidArgument,
            Status::Other => NvStatus::Generic,
        };
        let req = McRequest::SetFailure {
            token,
            export_uuid: ExportUuid(export_uuid).to_hex(),
            status,
        };
        self.control("set multicast failure", &Request::Multicast(req))
            .map(drop)
    }
}

/// The daemon's view of a REMOTE_GPU_ATTACH event (`None` for another event or a malformed
/// UUID).
pub fn remote_gpu_attach(e: &FabricEvent) -> Option<RemoteGpuAttach> {
    let FabricEvent::RemoteGpuAttach {
        event_id,
        channel,
        export_uuid,
        index,
        export_node,
        gpu,
    } = e
    else {
        return None;
    };
    Some(RemoteGpuAttach {
        event_id: *event_id,
        channel: *channel,
        export_uuid: ExportUuid::from_hex(export_uuid).ok()?.0,
        index: *index,
        export_node: NodeId(*export_node),
        gpu_probe_handle: gpu.gpu_probe_handle,
        key: gpu.key,
        clique_id: gpu.clique_id,
        bw_mode: gpu.bw_mode,
        bw_mode_epoch: gpu.bw_mode_epoch,
        page_size: gpu.page_size,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{fake_driver, scratch};
    use super::*;
    use crate::Driver;

    /// §1.6 "Multicast" 3-4: the event's fields reach ATTACH_REMOTE_GPU unchanged, with the
    /// attaching node added; SET_FAILURE carries the daemon's status.
    #[test]
    fn the_remote_attach_event_becomes_attach_remote_gpu_and_set_failure() {
        let gpu = RemoteGpu {
            gpu_probe_handle: 1 << 63 | 5 << 32 | 2,
            key: 9,
            clique_id: 3,
            bw_mode: 1,
            bw_mode_epoch: 4,
            page_size: 2 << 20,
        };
        let event = FabricEvent::RemoteGpuAttach {
            event_id: 11,
            channel: 6,
            export_uuid: ExportUuid::new(8, 0).to_hex(),
            index: 0,
            export_node: 0,
            gpu: gpu.clone(),
        };
        let attach = remote_gpu_attach(&event).unwrap();
        assert_eq!(attach.export_node, NodeId(0));
        assert_eq!(
            remote_gpu_attach(&FabricEvent::Unimport {
                unimport_event_id: 1,
                import_event_id: 1,
                export_node: 0,
            }),
            None
        );

        let dir = scratch("mc-attach");
        let (seen, server) = fake_driver(&dir);
        let d = SimDriver::connect(&dir).unwrap();
        d.open_session(NodeId(0)).unwrap();
        d.attach_remote_gpu(NodeId(5), &attach).unwrap();
        d.set_multicast_failure(attach.export_uuid, Status::Other)
            .unwrap();
        drop(d);
        server.join().unwrap();
        let mc: Vec<McRequest> = seen
            .lock()
            .unwrap()
            .iter()
            .filter_map(|r| match r {
                Request::Multicast(m) => Some(m.clone()),
                _ => None,
            })
            .collect();
        let uuid = ExportUuid::new(8, 0).to_hex();
        assert_eq!(
            mc,
            vec![
                McRequest::AttachRemoteGpu {
                    token: 7,
                    export_uuid: uuid.clone(),
                    node_id: 5,
                    gpu,
                },
                McRequest::SetFailure {
                    token: 7,
                    export_uuid: uuid,
                    status: NvStatus::Generic,
                },
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
