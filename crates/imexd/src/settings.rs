//! What the daemon needs to run, resolved from the config files by the binary.

use std::path::PathBuf;
use std::time::Duration;

use openimex_core::{Backoff, InstanceId, NodeId, QuorumPolicy};

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
    /// How long an import waits for its exporter (and an unimport for its confirmation).
    pub import_timeout: Duration,
    /// `OPENIMEX_PEER_ANY_SOURCE`: accept a peer's hello from any source address, not only
    /// the node file's address for that node (multi-homed hosts). Off by default.
    pub peer_any_source: bool,
    /// `IMEX_NODE_DISCONNECTED_GRACE_TIME`: `None` waits for a lost peer forever (-1), zero
    /// cleans up at once, else after that long.
    pub grace: Option<Duration>,
    /// `OPENIMEX_PERSIST_FILE`: the persist record; `None` keeps none (no recovery wait).
    pub persist_path: Option<PathBuf>,
    /// `IMEX_NODE_CONFIG_FILE`: read again on SIGUSR1 (`None`: nothing to re-read).
    pub nodes_file: Option<PathBuf>,
    /// `OPENIMEX_JOBS_DIR`: the job files, watched while the daemon runs (`None`: no jobs from
    /// files).
    pub jobs_dir: Option<PathBuf>,
    /// Where the driver's IMEX channels are: a job's channel is created there when the job is
    /// defined and removed when it ends (`None`: no driver, no channels).
    pub channels: Option<openimex_driver::channels::ChannelDir>,
    /// The peer listener's interface (`NETWORK_INTERFACE`, else the one holding the bind IP),
    /// for the log; `None` when not known.
    pub network_interface: Option<String>,
    /// The scope ID (interface index) IPv6 link-local addresses of the nodes file are dialled
    /// with, and dials leave a link-local bind IP with; 0 when none is known.
    pub link_scope: u32,
    /// `IMEX_CONN_WAIT_TIMEOUT`: the longest the FULL quorum waits at start for every peer
    /// before going on without the missing ones; `None` waits until they are all connected.
    pub conn_wait_timeout: Option<Duration>,
    /// `IMEX_ENABLE_AUTH_ENCRYPTION=1` with `SSL_TLS`: mutual TLS on every peer connection;
    /// `None`: plaintext (the default).
    pub tls: Option<crate::tls::Tls>,
    /// The config file the daemon was started with, and its options as logged at start
    /// (`label`, `value`), served to `ctl -d`.
    pub config_dump: (PathBuf, Vec<(String, String)>),
}

/// The default of [`Settings::import_timeout`].
pub const DEFAULT_IMPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// What makes one daemon start unlike another: its instance ID (random per start, so peers can
/// tell a restart) and the seed of its reconnect jitter. Passed in, so tests can pin them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entropy {
    /// This start's instance ID.
    pub instance: InstanceId,
    /// Seed of the backoff jitter.
    pub seed: u64,
}

impl Entropy {
    /// Fresh values from the OS's random source. Read from it directly: `rand::random` would
    /// first seed a ChaCha generator for the thread, whose set-up asks the CPU for its features
    /// (`cpuid`, which a hypervisor traps: about 70 µs of a daemon's start on the bench's VMs)
    /// to draw two numbers. Like `rand::random`, panics only if the OS has no random source.
    pub fn random() -> Self {
        use rand::{RngCore as _, TryRngCore as _};
        let mut os = rand::rngs::OsRng.unwrap_err();
        Self {
            instance: InstanceId(os.next_u64()),
            seed: os.next_u64(),
        }
    }
}

impl Settings {
    /// The timeout of one dial (TCP connect plus handshake).
    pub(crate) fn dial_timeout(&self) -> Duration {
        self.peer_timeout
            .clamp(Duration::from_millis(500), Duration::from_secs(5))
    }
}
