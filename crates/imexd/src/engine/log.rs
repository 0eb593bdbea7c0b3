//! The engine's log lines about links and dials, in NVIDIA's wording where it has one, and
//! the node's actions that are only log lines.

use std::time::Duration;

use openimex_core::{ConnStatus, NodeId};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use openimex_core::node::Action;

use super::Engine;

impl Engine {
    pub(super) fn log_link(
        &self,
        peer: NodeId,
        from: ConnStatus,
        to: ConnStatus,
        reason: &str,
        times: u32,
    ) {
        let host = self.host(peer);
        let port = self.settings.server_port;
        match to {
            ConnStatus::Connected => info!(
                "Connection established to node {peer} with ip address {host}. Number of times connected: {times}"
            ),
            ConnStatus::Recovering => {
                warn!("Connection lost to node {peer}: {host}:{port} ({reason})")
            }
            ConnStatus::Disconnected => info!("Node {peer} ({host}) left the domain: {reason}"),
            ConnStatus::Mismatch(_) => {
                error!("Node {peer} ({host}:{port}) {to}: {reason}; communication disabled")
            }
            _ => info!("Connection to node {peer} ({host}) {from} -> {to}: {reason}"),
        }
    }

    /// NVIDIA logs a failing target about once a minute; so do we, with the attempt count.
    pub(super) fn log_dial_failure(&mut self, peer: NodeId, error: &str) {
        let now = Instant::now();
        let host = self.host(peer).to_string();
        let port = self.settings.server_port;
        let entry = self.dial_log.entry(peer).or_insert((0, None));
        entry.0 += 1;
        let due = entry
            .1
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60));
        if due {
            entry.1 = Some(now);
            info!(
                "Attempting connection for target node {peer} - {host}:{port}, attempt #{}: {error}",
                entry.0
            );
        } else {
            debug!(
                "connection attempt #{} to node {peer} failed: {error}",
                entry.0
            );
        }
    }

    /// The node's actions that are only log lines: the recovery gate, the FULL quorum's wait,
    /// clean-ups and refusals.
    pub(super) fn log_action(&self, action: Action) {
        match action {
            Action::RecoveryWait { awaiting, wait } => {
                if wait.is_zero() {
                    warn!("Waiting for recovery: still awaiting nodes {awaiting:?}");
                } else {
                    warn!(
                        "Waiting for recovery: nodes {awaiting:?} held references to this node's memory before the previous daemon's unclean exit; fabric allocation stays disabled until each reconnects or {} s pass",
                        wait.as_secs()
                    );
                }
            }
            Action::PeersWaitOver { missing, waited } => {
                let names: Vec<String> = missing
                    .iter()
                    .map(|p| format!("{p} ({})", self.host(*p)))
                    .collect();
                warn!(
                    "IMEX_CONN_WAIT_TIMEOUT ({} s) passed with nodes {} still not connected: continuing initialization without them (they join when they come up)",
                    waited.as_secs(),
                    names.join(", ")
                );
            }
            Action::Recovered { peer, how } => info!("Recovery: node {peer} {how}"),
            Action::CleanedUp { peer, reason } => warn!(
                "Node {peer} {reason}: its imports and exports here are cleaned up (importers of its memory disabled, references held for it released)"
            ),
            // Sparingly: the first few, then at every power of two.
            Action::Refused {
                reason,
                count,
                detail,
            } if count <= 3 || count.is_power_of_two() => {
                warn!("refused ({reason}, {count} so far): {detail}");
            }
            // Only the log actions are passed here.
            _ => {}
        }
    }
}
