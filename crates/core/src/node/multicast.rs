//! Multicast (NVLS) across trays, the daemons' part (`docs/reference/driver-interface.md` §1.6
//! "Multicast (NVLS) across nodes" 3-4): a local GPU joined an imported multicast object, so
//! the importer's driver posted REMOTE_GPU_ATTACH; this node forwards it to the prime's node,
//! whose daemon calls ATTACH_REMOTE_GPU on the prime, or SET_FAILURE on any error so that
//! every member learns the team failed. The team itself is set up by the Fabric Manager once
//! the prime counted every attach, and reaches each node's driver without the daemons (§6.10).
//!
//! Decisions: an attach whose prime's node is not connected (or that arrives while this node
//! stops) is not forwarded, and is counted as refused: the importer's object then waits until
//! the prime fails or the application frees it, as with the real daemons. An attach from a
//! peer that no session proves is refused without touching the prime (a forged request must
//! not fail someone's team); a failure of this daemon's own (not READY) fails the prime with
//! SET_FAILURE. A refused ATTACH_REMOTE_GPU does not: the driver failed the prime itself, with
//! the precise status (`_memorymulticastfabricCtrlAttachRemoteGpu`), which a second
//! SET_FAILURE would overwrite.
//!
//! The MEM_UNIMPORT an imported multicast object posts when it goes names its
//! REMOTE_GPU_ATTACH event, which is not an import here: it is finished at once and the owner
//! is not told. The owner's daemon holds nothing for a remote member (the real driver keeps the
//! member in the prime until the prime goes and has no control that detaches one), and the
//! driver does not block the free on it (`_memMulticastFabricGpuInfoRemove`).

use std::time::Instant;

use super::*;

impl Node {
    /// The local driver's REMOTE_GPU_ATTACH.
    pub(super) fn handle_remote_gpu_attach_event(&mut self, attach: RemoteGpuAttach) {
        let owner = attach.export_node;
        if self.connected(owner).is_none() || self.stopping() {
            self.refused(
                "multicast attach: owner not connected",
                format!(
                    "REMOTE_GPU_ATTACH {} for a multicast object of node {owner}, which is not \
                     connected: not forwarded",
                    attach.event_id
                ),
            );
            return;
        }
        self.actions.push_back(Action::SendRemoteGpuAttach {
            peer: owner,
            attach,
        });
    }

    /// A peer's remote GPU attach on session `via`.
    pub fn handle_session_remote_gpu_attach(
        &mut self,
        now: Instant,
        request: RequestId,
        via: Via,
        claimed: Option<PeerId>,
        attach: RemoteGpuAttach,
    ) {
        let _ = now;
        let Some(from) = self.authenticate(via, claimed, PeerRequest::McAttach) else {
            self.actions.push_back(Action::AnswerRemoteGpuAttach {
                request,
                result: Err(ImportError::new(
                    Status::InvalidState,
                    "refused: no session proves that identity; say hello first",
                )),
            });
            return;
        };
        if self.state() != DaemonState::Ready {
            let detail = format!("this daemon is {}, not READY yet", self.state());
            self.fail_attach(
                request,
                &attach,
                ImportError::new(Status::InvalidState, detail),
            );
            return;
        }
        self.actions.push_back(Action::AttachRemoteGpu {
            request,
            from: from.node,
            attach,
        });
    }

    /// The driver's answer to [`Action::AttachRemoteGpu`] for `request` (`attach` is the
    /// action's), passed on to the attaching peer.
    pub fn handle_remote_gpu_attached(
        &mut self,
        now: Instant,
        request: RequestId,
        attach: &RemoteGpuAttach,
        result: Result<(), ImportError>,
    ) {
        let _ = (now, attach);
        self.actions
            .push_back(Action::AnswerRemoteGpuAttach { request, result });
    }

    /// SET_FAILURE on the prime, then the refusal to the attaching peer.
    fn fail_attach(&mut self, request: RequestId, attach: &RemoteGpuAttach, e: ImportError) {
        self.actions.push_back(Action::SetMulticastFailure {
            export_uuid: attach.export_uuid,
            index: attach.index,
            channel: attach.channel,
            status: e.status,
        });
        self.actions.push_back(Action::AnswerRemoteGpuAttach {
            request,
            result: Err(e),
        });
    }
}
