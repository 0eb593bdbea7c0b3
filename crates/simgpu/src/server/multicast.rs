//! The server's side of the multicast (class 0xFD) requests: one [`Rm`] call each, the
//! daemon-only controls behind the same capability check as the IMEX session, and the wait of
//! GET_INFO for the team (libcuda's cuMulticastBindMem waits on the object's event until the
//! Fabric Manager answered).

use std::os::unix::net::UnixStream;
use std::sync::MutexGuard;
use std::time::Instant;

use openimex_simproto::multicast::{McRequest, McResponse};
use openimex_simproto::proto::{NvStatus, Response};

use super::Shared;
use super::calls::{deadline, error, may_manage_fabric, peer_gone};
use crate::rm::{ClientId, Rm};

/// Answers one multicast request (the caller holds the driver's lock, `rm`).
pub(super) fn handle(
    shared: &Shared,
    client: ClientId,
    stream: &UnixStream,
    req: McRequest,
    mut rm: MutexGuard<'_, Rm>,
) -> Response {
    let object = |mc| Response::Multicast(McResponse::Object { mc });
    let result = match req {
        McRequest::Create {
            num_gpus,
            size,
            page_size,
        } => rm.mc_create(client, num_gpus, size, page_size).map(object),
        McRequest::Export { mc } => rm
            .mc_export(client, mc)
            .map(|handle| Response::Multicast(McResponse::Exported { handle })),
        McRequest::Import { handle } => rm.mc_import(client, &handle).map(object),
        McRequest::AttachGpu { mc, gpu } => {
            rm.mc_attach_gpu(client, mc, gpu).map(|()| Response::Ok)
        }
        McRequest::AttachMem { mc, bind } => {
            rm.mc_attach_mem(client, mc, &bind).map(|()| Response::Ok)
        }
        McRequest::GetInfo { mc, wait_ms } => {
            let until = deadline(wait_ms);
            loop {
                match rm.mc_info(client, mc) {
                    // A revoked client's process is being killed: its wait ends with it (the
                    // real wait is the process's own), and the kill's disconnect frees its
                    // objects now, not at the wait's deadline.
                    Err(NvStatus::NotReady) if rm.is_disabled(client) => {
                        break Err(NvStatus::ResetRequired);
                    }
                    // The caller died in the wait (a fatal signal ends a real ioctl at once):
                    // stop waiting, so the disconnect frees its objects now.
                    Err(NvStatus::NotReady) if peer_gone(stream) => {
                        break Err(NvStatus::InvalidState);
                    }
                    Err(NvStatus::NotReady)
                        if !shared.stopping() && until.is_some_and(|d| Instant::now() < d) =>
                    {
                        rm = shared.wait(rm, until);
                    }
                    other => break other.map(|i| Response::Multicast(McResponse::Info(i))),
                }
            }
        }
        McRequest::AttachRemoteGpu {
            token,
            export_uuid,
            node_id,
            gpu,
        } => {
            if !may_manage_fabric(stream) {
                return denied();
            }
            rm.mc_attach_remote_gpu(token, &export_uuid, node_id, gpu)
                .map(|()| Response::Ok)
        }
        McRequest::SetFailure {
            token,
            export_uuid,
            status,
        } => {
            if !may_manage_fabric(stream) {
                return denied();
            }
            rm.mc_set_failure(token, &export_uuid, status)
                .map(|()| Response::Ok)
        }
    };
    result.unwrap_or_else(|s| error(s, s.to_string()))
}

/// ATTACH_REMOTE_GPU and SET_FAILURE need the IMEX capability or admin.
fn denied() -> Response {
    error(
        NvStatus::InsufficientPermissions,
        "ATTACH_REMOTE_GPU and SET_FAILURE are the IMEX daemon's: only root or the user the \
         driver runs as may; run the IMEX daemon as root",
    )
}
