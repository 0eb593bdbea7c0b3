//! The engine's log lines about links and dials, in NVIDIA's wording where it has one.

use std::time::Duration;

use openimex_core::{ConnStatus, NodeId};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

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
}
