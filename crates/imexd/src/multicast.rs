//! Multicast (NVLS) remote GPU attaches on the peer session (`docs/reference/driver-interface.md`
//! §1.6 "Multicast (NVLS) across nodes" 3-4): the wire form of the driver's REMOTE_GPU_ATTACH,
//! the importer's request to the prime's node, and the prime's node's serving of it through
//! the engine (which calls ATTACH_REMOTE_GPU, or SET_FAILURE on any error).

use openimex_core::{ImportError, NodeId, RemoteGpuAttach, Status, Via};
use openimex_proto::peer::session_msg::Body;
use openimex_proto::peer::{RemoteGpuAttachReply, RemoteGpuAttachRequest};
use tokio::sync::mpsc;

use crate::mailbox::{Input, ask};
use crate::session_tx::SessionTx;

/// The wire form of an attach.
pub(crate) fn wire(a: &RemoteGpuAttach) -> RemoteGpuAttachRequest {
    RemoteGpuAttachRequest {
        event_id: a.event_id,
        channel: a.channel,
        export_uuid: a.export_uuid.to_vec(),
        index: u32::from(a.index),
        gpu_probe_handle: a.gpu_probe_handle,
        key: a.key,
        clique_id: a.clique_id,
        bw_mode: u32::from(a.bw_mode),
        bw_mode_epoch: a.bw_mode_epoch,
        page_size: a.page_size,
    }
}

/// A peer's attach as the core's (for a prime of node `owner`), or what is wrong with it.
pub(crate) fn attach_of(
    r: &RemoteGpuAttachRequest,
    owner: NodeId,
) -> Result<RemoteGpuAttach, String> {
    let (export_uuid, index) = crate::convert::export_uuid_and_index(&r.export_uuid, r.index)?;
    let bw_mode =
        u16::try_from(r.bw_mode).map_err(|_| format!("bwMode {} out of range", r.bw_mode))?;
    Ok(RemoteGpuAttach {
        event_id: r.event_id,
        channel: r.channel,
        export_uuid,
        index,
        export_node: owner,
        gpu_probe_handle: r.gpu_probe_handle,
        key: r.key,
        clique_id: r.clique_id,
        bw_mode,
        bw_mode_epoch: r.bw_mode_epoch,
        page_size: r.page_size,
    })
}

/// Serves a peer's attach on the session `via` (the owner's side). The prime's node is this
/// one: the engine fills it in.
pub(crate) async fn serve(
    req: &RemoteGpuAttachRequest,
    via: Via,
    engine: &mpsc::Sender<Input>,
) -> Result<Body, String> {
    let attach = attach_of(req, NodeId(0))?;
    let result = ask(engine, |reply| Input::PeerRemoteGpuAttach {
        via,
        attach,
        reply,
    })
    .await
    .map_err(|_| "daemon is stopping".to_string())?;
    let (error, detail) = match result {
        Ok(()) => (String::new(), String::new()),
        Err(e) => (e.status.as_str().to_string(), e.detail),
    };
    Ok(Body::RemoteGpuAttachReply(RemoteGpuAttachReply {
        error,
        detail,
    }))
}

/// Sends the attach to the prime's node `owner` and logs its answer: the team's outcome
/// reaches this node's driver from the Fabric Manager, not from this answer.
pub(crate) fn send(session: SessionTx, owner: NodeId, attach: RemoteGpuAttach) {
    tokio::spawn(async move {
        let event_id = attach.event_id;
        let result = match session.call(Body::RemoteGpuAttach(wire(&attach))).await {
            Ok(Body::RemoteGpuAttachReply(r)) if r.error.is_empty() => Ok(()),
            Ok(Body::RemoteGpuAttachReply(r)) => Err(ImportError::new(
                Status::parse(&r.error),
                crate::convert::bounded(&r.detail),
            )),
            Ok(_) => Err(ImportError::new(Status::Other, "unexpected answer")),
            Err(e) => Err(ImportError::new(Status::InvalidState, e.to_string())),
        };
        match result {
            Ok(()) => tracing::info!("multicast attach {event_id}: node {owner} attached the GPU"),
            Err(e) => tracing::warn!(
                "multicast attach {event_id}: node {owner} refused it: {} ({})",
                e.status.as_str(),
                e.detail
            ),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attach_crosses_the_wire_intact_and_bad_fields_are_refused() {
        let a = RemoteGpuAttach {
            event_id: 3,
            channel: 4,
            export_uuid: [9; 16],
            index: 2,
            export_node: NodeId(6),
            gpu_probe_handle: 1 << 63 | 7,
            key: 11,
            clique_id: 12,
            bw_mode: 1,
            bw_mode_epoch: 13,
            page_size: 2 << 20,
        };
        assert_eq!(attach_of(&wire(&a), NodeId(6)), Ok(a.clone()));
        let mut short = wire(&a);
        short.export_uuid.pop();
        assert!(attach_of(&short, NodeId(6)).is_err());
        let mut big = wire(&a);
        big.bw_mode = 70_000;
        assert!(attach_of(&big, NodeId(6)).is_err());
    }
}
