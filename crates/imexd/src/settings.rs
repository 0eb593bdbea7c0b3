//! What the daemon needs to run, resolved from the config files by the binary.

use std::path::PathBuf;
use std::time::Duration;

use openimex_core::{Backoff, NodeId, QuorumPolicy};

/// Resolved daemon settings (the config after validation, node identification and flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// This node's ID.
    pub local: NodeId,
    /// Every node-config entry, in node-ID order.
    pub hosts: Vec<String>,
    /// `SERVER_PORT`: every peer listens on it.
    pub server_port: u16,
    /// `OPENIMEX_DOMAIN_ID`; `None` derives it from the node map.
    pub domain_id: Option<String>,
    /// `IMEX_WAIT_FOR_QUORUM`.
    pub quorum: QuorumPolicy,
    /// `OPENIMEX_HEARTBEAT_INTERVAL_MS`.
    pub heartbeat_interval: Duration,
    /// `OPENIMEX_PEER_TIMEOUT_MS`.
    pub peer_timeout: Duration,
    /// `OPENIMEX_RECONNECT_MIN_MS` / `_MAX_MS`.
    pub backoff: Backoff,
    /// Shown by `ctl -H`.
    pub host_name: String,
    /// The command socket to remove on exit.
    pub cmd_unix_path: Option<PathBuf>,
}

impl Settings {
    /// The timeout of one dial (TCP connect plus handshake).
    pub(crate) fn dial_timeout(&self) -> Duration {
        self.peer_timeout
            .clamp(Duration::from_millis(500), Duration::from_secs(5))
    }
}
