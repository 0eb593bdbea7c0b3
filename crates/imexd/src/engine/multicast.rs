//! The engine's multicast actions (`openimex_core::node` multicast): forwarding a local GPU's
//! attach to the prime's node, the driver calls on the prime, and the answer to the peer.

use openimex_core::node::Action;

use super::Engine;
use crate::driver_io::Call;

impl Engine {
    pub(super) fn perform_multicast(&mut self, action: Action) {
        match action {
            Action::SendRemoteGpuAttach { peer, attach } => match self.session(peer) {
                Some(session) => crate::multicast::send(session, peer, attach),
                None => tracing::warn!(
                    "multicast attach {}: node {peer} has no session here, not forwarded",
                    attach.event_id
                ),
            },
            Action::AttachRemoteGpu {
                request,
                from,
                mut attach,
            } => {
                attach.export_node = self.settings.local;
                self.driver.call(Call::AttachRemoteGpu {
                    request,
                    from,
                    attach,
                });
            }
            Action::SetMulticastFailure {
                export_uuid,
                index,
                channel,
                status,
            } => self.driver.call(Call::SetMulticastFailure {
                export_uuid,
                index,
                channel,
                status,
            }),
            Action::AnswerRemoteGpuAttach { request, result } => {
                if let Err(e) = &result {
                    tracing::warn!(
                        "multicast remote attach refused: {} ({})",
                        e.status.as_str(),
                        e.detail
                    );
                }
                if let Some(reply) = self.waiting.remote_gpu_attaches.remove(&request) {
                    let _ = reply.send(result);
                }
            }
            // Only the multicast actions are passed here.
            _ => {}
        }
    }
}
