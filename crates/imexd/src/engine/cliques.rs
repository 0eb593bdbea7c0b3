//! The engine's fabric-view actions (`openimex_core::node` cliques): reading the GPUs' fabric
//! probes off the runtime, telling a peer the node's new cliques, and the log lines the node
//! asks for (a CLIQUE_ID_CHANGE, a health change, a peer's cliques).

use std::time::Duration;

use openimex_core::node::Action;
use openimex_proto::peer::CliquesChanged;
use openimex_proto::peer::session_msg::Body;
use tracing::{debug, info};

use super::{Engine, now};
use crate::driver_io::Call;
use crate::mailbox::Input;

/// How long one peer may take to take the notification.
pub(super) const NOTIFY_TIMEOUT: Duration = Duration::from_secs(2);

impl Engine {
    /// Hands a notification (`what`, for the log) to `peer`'s session: at once when its queue
    /// has room, the common case (no task, nothing reported back); else from a task that waits
    /// up to [`NOTIFY_TIMEOUT`] for room and, if it gets none, tells the engine `not_sent`.
    /// `false`: not handed and nothing will report it (no session, or it stopped).
    pub(super) fn notify(
        &mut self,
        peer: openimex_core::NodeId,
        body: Body,
        what: &'static str,
        not_sent: impl FnOnce(openimex_core::NodeId) -> Input + Send + 'static,
    ) -> bool {
        let Some(session) = self.session(peer) else {
            return false;
        };
        let body = match session.try_notify(body) {
            Ok(sent) => {
                if !sent {
                    debug!("could not tell node {peer} {what}: its session stopped");
                }
                return sent;
            }
            Err(body) => body,
        };
        let engine = self.tx.clone();
        tokio::spawn(async move {
            let sent = tokio::time::timeout(NOTIFY_TIMEOUT, session.notify(body)).await;
            if !matches!(sent, Ok(true)) {
                debug!("could not tell node {peer} {what}");
                let _ = engine.send(not_sent(peer)).await;
            }
        });
        true
    }

    pub(super) fn perform_cliques(&mut self, action: Action) {
        match action {
            Action::ReadGpuFabric => self.driver.call(Call::ReadFabric),
            Action::SendCliques {
                peer,
                cliques,
                epoch,
            } => {
                let body = Body::CliquesChanged(CliquesChanged { cliques, epoch });
                let not_sent = |peer| Input::CliquesSent { peer, sent: false };
                if !self.notify(peer, body, "this node's new cliques", not_sent) {
                    self.node.handle_cliques_sent(now(), peer, false);
                }
            }
            Action::CliqueChanged { gpu, from, to } => {
                let from = from.map_or_else(|| "?".to_string(), |c| c.to_string());
                info!("CLIQUE_ID_CHANGE: GPU {gpu} moved from clique {from} to clique {to}");
            }
            Action::GpuHealthChanged { gpu, from, to } => info!(
                "GPU {gpu} fabric health {} (mask {:#x}) -> {} (mask {:#x})",
                from.0, from.1, to.0, to.1
            ),
            Action::PeerCliques {
                peer,
                cliques,
                shared,
                notified,
            } => {
                if notified {
                    info!("peer node {peer} reports new clique(s) {cliques:?}");
                }
                let mine = self.node.cliques();
                match shared {
                    true => debug!("peer node {peer} is in clique(s) {cliques:?}, as this node"),
                    false => info!(
                        "peer node {peer} is in clique(s) {cliques:?}, outside this node's clique(s) {mine:?}: its memory does not map on this node's GPUs"
                    ),
                }
            }
            // Only the fabric-view actions are passed here.
            _ => {}
        }
    }
}
