//! `config.cfg`: NVIDIA's IMEX daemon configuration file, plus openimex's own `OPENIMEX_*` keys.
//!
//! # Format
//!
//! One `KEY=value` per line. Blank lines and lines whose first non-blank character is `#` are
//! ignored. Whitespace around the key and around the value is trimmed; the value is everything
//! after the first `=`, so it may itself contain `=` or `#` (there are no trailing comments and
//! no quoting: `LOG_FILE_NAME="x"` names a file whose name starts with a quote). A value may be
//! empty; for keys that take an address, a path or a name, empty means "not set" (for
//! `LOG_FILE_NAME` and `STATS_FILE_NAME` that is stderr). Numeric and 0/1 keys need a value.
//! Keys are case-sensitive, like NVIDIA's.
//!
//! # Decisions where NVIDIA's behaviour is unknown
//!
//! - A key given twice: the later line wins, and a [`Notice`] names both lines.
//! - A key this crate does not know is accepted and reported as a [`Notice`] ("unknown key KEY
//!   ignored"), never silently dropped, because other IMEX versions have keys we lack. An unknown key starting with `OPENIMEX_` is
//!   an error instead: that prefix is ours, so it is a typo.
//! - Keys openimex accepts but does not implement yet produce a "not supported yet" [`Notice`]
//!   when set to something other than their default under settings that would use them (the
//!   `IMEX_GSS_*` keys only with authentication on in a GSSAPI mode: otherwise NVIDIA's daemon
//!   ignores them too, silently). The list lives in one table (`keys::NOT_SUPPORTED_YET`) so
//!   entries are removed as features land.
//! - `IMEX_AUTH_ENCRYPTION_MODE` and `IMEX_AUTH_SOURCE` with an empty or unknown value are an
//!   error only when `IMEX_ENABLE_AUTH_ENCRYPTION=1` (as NVIDIA documents); otherwise they are
//!   ignored with a notice.
//! - `IMEX_ENABLE_AUTH_ENCRYPTION=1` parses (`ctl` reads the same file). With `SSL_TLS` the
//!   daemon loads the six key/certificate/CA values ([`Config::tls_material`], module `tls`);
//!   with a GSSAPI mode it refuses to start ([`Config::refuse_unbuilt_features`]): failing
//!   closed beats running the domain in plaintext with a warning.
//!
//! The daemon must log every notice once at warn level after start ([`Config::notices`]).

mod dump;
pub(crate) mod keys;
#[cfg(test)]
mod tests;
mod tls;
mod unbuilt;

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub use dump::dump;
pub use tls::{EnvLookup, TlsIdentity, TlsMaterial};

use crate::error::Clip;
use crate::{ConfigError, NodeConfig};

/// `IMEX_WAIT_FOR_QUORUM`: what the daemon waits for before it reports READY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quorum {
    /// `NONE`: never wait for other nodes.
    None,
    /// `RECOVERY` (default): after an unclean exit, wait until the nodes that had imported
    /// from this node reconnect.
    Recovery,
    /// `FULL`: wait for every node (undocumented by NVIDIA, but still accepted).
    Full,
}

/// `IMEX_AUTH_ENCRYPTION_MODE`: how peers authenticate and encrypt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthMode {
    /// `SSL_TLS` (default): gRPC over mutual TLS.
    SslTls,
    /// `GSS_AUTH_ENCRYPT`: GSSAPI (Kerberos) authentication, integrity and encryption.
    GssAuthEncrypt,
    /// `GSS_AUTH_ONLY`: GSSAPI authentication and integrity, no encryption.
    GssAuthOnly,
}

/// `IMEX_AUTH_SOURCE`: how the `IMEX_SERVER_*` / `IMEX_CLIENT_*` values are interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthSource {
    /// `FILE`: the values are file paths.
    File,
    /// `ENV_PATH`: the values name environment variables that hold file paths.
    EnvPath,
    /// `ENV_VAL`: the values name environment variables that hold the PEM text itself.
    EnvVal,
}

/// `OPENIMEX_DRIVER`: which GPU driver backend the daemon uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriverKind {
    /// Empty, absent or `auto`: the daemon picks (NVIDIA driver if present, else no GPU).
    Auto,
    /// `nogpu`: run without GPUs (like `nvidia-imex --nogpu`).
    NoGpu,
    /// `sim`: the simulated GPU driver of `OPENIMEX_SIM_NODE_DIR`: the same as `nvidia` with
    /// that node directory as the driver root (kept so that older configs go on working).
    Sim,
    /// `nvidia`: NVIDIA's kernel driver (RM ioctls on `<OPENIMEX_DRIVER_ROOT>/dev/nvidiactl`;
    /// the simulated driver's node directory is a driver root too); fail if it is missing.
    Nvidia,
}

/// `IMEX_NODE_DISCONNECTED_GRACE_TIME`: how long to wait after losing a peer before cleaning
/// up its imports and exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GraceTime {
    /// `-1` (default): never clean up until the peer comes back.
    Forever,
    /// `N >= 0`: clean up after N seconds; `0` means at once.
    Seconds(u64),
}

macro_rules! names {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every variant, in documentation order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The spelling used in the config file.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }

            /// The variant spelled exactly `s` (case-sensitive), if any.
            pub(crate) fn from_name(s: &str) -> Option<$ty> {
                $ty::ALL.iter().copied().find(|v| v.as_str() == s)
            }

            /// "A, B, C": the accepted spellings, for error messages.
            pub(crate) fn expected() -> String {
                $ty::ALL.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ")
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

names!(Quorum { None => "NONE", Recovery => "RECOVERY", Full => "FULL" });
names!(AuthMode {
    SslTls => "SSL_TLS",
    GssAuthEncrypt => "GSS_AUTH_ENCRYPT",
    GssAuthOnly => "GSS_AUTH_ONLY",
});
names!(AuthSource { File => "FILE", EnvPath => "ENV_PATH", EnvVal => "ENV_VAL" });
names!(DriverKind { Auto => "auto", NoGpu => "nogpu", Sim => "sim", Nvidia => "nvidia" });

impl fmt::Display for GraceTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GraceTime::Forever => f.write_str("-1"),
            GraceTime::Seconds(n) => write!(f, "{n}"),
        }
    }
}

/// Something the daemon must log once at warn level after start: an unknown key, a key given
/// twice, a key set to a value openimex does not implement yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The config file.
    pub path: PathBuf,
    /// 1-based line number the notice is about.
    pub line: usize,
    /// The key the notice is about, as written.
    pub key: String,
    /// The message, without the `path:line: ` prefix.
    pub message: String,
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.path.display(), self.line, self.message)
    }
}

/// Default of `OPENIMEX_VERBOSE_LOG_BUFFER_KB`: 1 MiB, some 8000 lines of 120 bytes.
pub const DEFAULT_VERBOSE_LOG_BUFFER_KB: u32 = 1024;
/// Default of `OPENIMEX_STATS_INTERVAL_SEC`: NVIDIA's sample record covers 30 seconds.
pub const DEFAULT_STATS_INTERVAL_SEC: u64 = 30;
/// Largest `OPENIMEX_VERBOSE_LOG_BUFFER_KB`: 64 MiB, so one dump stays one short write.
pub const MAX_VERBOSE_LOG_BUFFER_KB: u32 = 64 * 1024;

/// Default of `OPENIMEX_SYSLOG_SOCKET`: where syslog(3) sends, served by systemd-journald or
/// rsyslog.
pub const DEFAULT_SYSLOG_SOCKET: &str = "/dev/log";

/// The parsed `config.cfg`. One public field per key (NVIDIA's keys in the order of the
/// shipped file, then openimex's own), named after the key in snake case. [`Config::default`]
/// holds the documented defaults, which is also what an empty file yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `LOG_LEVEL`: 0 off, 1 CRITICAL, 2 ERROR, 3 WARNING, 4 INFO (default 4).
    pub log_level: u8,
    /// `LOG_FILE_NAME`: log file; `None` (empty value) means stderr.
    /// Default `/var/log/nvidia-imex.log`.
    pub log_file_name: Option<PathBuf>,
    /// `STATS_FILE_NAME`: statistics file; `None` (empty value) means stderr.
    /// Default `/var/log/nvidia-imex-stats.log`.
    pub stats_file_name: Option<PathBuf>,
    /// `LOG_APPEND_TO_LOG`: append to the log file (true, default) or overwrite it.
    pub log_append_to_log: bool,
    /// `LOG_FILE_MAX_SIZE`: log file size cap in MB of 2^20 bytes (default 1024); 0: no cap.
    pub log_file_max_size_mb: u64,
    /// `LOG_MAX_ROTATE_COUNT`: 0 (default) no rotation, logging stops at the cap; N keeps N
    /// rotated files (`name.1` newest … `name.N` oldest).
    pub log_max_rotate_count: u32,
    /// `LOG_USE_SYSLOG`: send every log line to syslog (the datagram socket
    /// [`Config::syslog_socket`]) instead of the file (default false).
    pub log_use_syslog: bool,
    /// `DAEMONIZE`: fork into the background (default true).
    pub daemonize: bool,
    /// `BIND_INTERFACE_IP`: peer-listener address; `None` (empty, default) means "find this
    /// host's address in the nodes file" ([`crate::identify_local`]).
    pub bind_interface_ip: Option<IpAddr>,
    /// `SERVER_PORT`: peer gRPC port, 1-65535 (default 50000). 0 is refused: every peer dials
    /// this port on this node's address from its own config, so it cannot be one the OS picks.
    pub server_port: u16,
    /// `IMEX_NODE_CONFIG_FILE`: the nodes file (default `/etc/nvidia-imex/nodes_config.cfg`).
    /// A relative path in the file is resolved against the directory of the config file, so
    /// the result does not depend on the daemon's working directory.
    pub imex_node_config_file: PathBuf,
    /// `NETWORK_INTERFACE`: the interface of the peer listener, which gives an IPv6
    /// link-local bind address its scope ([`crate::iface`]); `None` when empty (default).
    pub network_interface: Option<String>,
    /// Where `NETWORK_INTERFACE` was set (file, line), for errors about it.
    pub network_interface_at: Option<(PathBuf, usize)>,
    /// `IMEX_WAIT_FOR_QUORUM`: `NONE`, `RECOVERY` (default) or `FULL`, upper case only.
    pub imex_wait_for_quorum: Quorum,
    /// `IMEX_ENABLE_AUTH_ENCRYPTION`: peer authentication and encryption (default false).
    pub imex_enable_auth_encryption: bool,
    /// `IMEX_AUTH_ENCRYPTION_MODE`: default `Some(SslTls)`; `None` when the value is empty (or
    /// unknown while auth is off). Empty or unknown with auth on is an error.
    pub imex_auth_encryption_mode: Option<AuthMode>,
    /// `IMEX_AUTH_SOURCE`: `FILE`, `ENV_PATH` or `ENV_VAL`; `None` when empty (default).
    pub imex_auth_source: Option<AuthSource>,
    /// `IMEX_SERVER_KEY`, interpreted per `IMEX_AUTH_SOURCE`; `None` when empty.
    pub imex_server_key: Option<String>,
    /// `IMEX_SERVER_CERT`, interpreted per `IMEX_AUTH_SOURCE`; `None` when empty.
    pub imex_server_cert: Option<String>,
    /// `IMEX_SERVER_CERT_AUTH` (CA), interpreted per `IMEX_AUTH_SOURCE`; `None` when empty.
    pub imex_server_cert_auth: Option<String>,
    /// `IMEX_CLIENT_KEY`, interpreted per `IMEX_AUTH_SOURCE`; `None` when empty.
    pub imex_client_key: Option<String>,
    /// `IMEX_CLIENT_CERT`, interpreted per `IMEX_AUTH_SOURCE`; `None` when empty.
    pub imex_client_cert: Option<String>,
    /// `IMEX_CLIENT_CERT_AUTH` (CA), interpreted per `IMEX_AUTH_SOURCE`; `None` when empty.
    pub imex_client_cert_auth: Option<String>,
    /// Where `IMEX_ENABLE_AUTH_ENCRYPTION=1` was set (file, line); `None` while auth is off.
    pub auth_enabled_at: Option<(PathBuf, usize)>,
    /// The lines of the six `IMEX_{SERVER,CLIENT}_{KEY,CERT,CERT_AUTH}` keys that are set, so
    /// errors about the material they name point at them ([`Config::tls_material`]).
    pub tls_key_lines: Vec<(&'static str, usize)>,
    /// The line of `IMEX_SECURITY_TARGET_OVERRIDE` (0 when not set).
    pub override_line: usize,
    /// `IMEX_SECURITY_TARGET_OVERRIDE`: name to check peer certificates against instead of
    /// the peer's address; `None` when empty.
    pub imex_security_target_override: Option<String>,
    /// `IMEX_GSS_SERVICE_NAME`: Kerberos service principal name (default `host`).
    pub imex_gss_service_name: String,
    /// `IMEX_GSS_TIMEOUT_SEC`: -1 (default, retry forever) or seconds >= 0.
    pub imex_gss_timeout_sec: i64,
    /// `IMEX_GSS_RETRY_INTERVAL_SEC`: seconds between GSSAPI retries (default 5).
    pub imex_gss_retry_interval_sec: u64,
    /// `IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC`: -1 (default, credential lifetime) or seconds >= 0.
    pub imex_gss_sec_context_lifetime_sec: i64,
    /// `IMEX_GSS_SHUTDOWN_ON_FAILURE`: on fatal GSSAPI failure shut down (true, default) or
    /// only drop that peer.
    pub imex_gss_shutdown_on_failure: bool,
    /// `IMEX_CMD_ENABLED`: run the command service used by `nvidia-imex-ctl`. Default false
    /// (NVIDIA does not state one; every shipped file sets 1). When true, `IMEX_CMD_PORT` or
    /// `IMEX_CMD_UNIX_DOMAIN_PATH` must be set.
    pub imex_cmd_enabled: bool,
    /// `IMEX_CMD_BIND_INTERFACE_IP`: command-service address; `None` (empty) means all
    /// interfaces.
    pub imex_cmd_bind_interface_ip: Option<IpAddr>,
    /// `IMEX_CMD_PORT`: command-service TCP port; `None` when empty (shipped files use 50005).
    pub imex_cmd_port: Option<u16>,
    /// `IMEX_CMD_UNIX_DOMAIN_PATH`: command-service Unix socket; `None` when empty.
    pub imex_cmd_unix_domain_path: Option<PathBuf>,
    /// `IMEX_NODE_DISCONNECTED_GRACE_TIME`: -1 forever (default), 0 at once, N seconds.
    pub imex_node_disconnected_grace_time: GraceTime,
    /// `IMEX_CONN_WAIT_TIMEOUT` (legacy, NVIDIA's Slurm example): seconds the FULL quorum
    /// waits at start for every peer before going on without the missing ones; `None` when
    /// absent or empty (wait for all).
    pub imex_conn_wait_timeout: Option<u64>,

    /// `OPENIMEX_DRIVER`: `nogpu`, `sim`, `nvidia`; empty, absent or `auto` = [`DriverKind::Auto`].
    pub driver: DriverKind,
    /// `OPENIMEX_DOMAIN_ID`: domain identifier; `None` (empty, default) means the daemon
    /// derives it from the node map.
    pub domain_id: Option<String>,
    /// `OPENIMEX_HEARTBEAT_INTERVAL_MS`: peer heartbeat interval, > 0 (default 1000).
    pub heartbeat_interval_ms: u64,
    /// `OPENIMEX_PEER_TIMEOUT_MS`: a peer silent this long is lost; must exceed the heartbeat
    /// interval (default 5000).
    pub peer_timeout_ms: u64,
    /// `OPENIMEX_RECONNECT_MIN_MS`: first reconnect delay, > 0 (default 250).
    pub reconnect_min_ms: u64,
    /// `OPENIMEX_RECONNECT_MAX_MS`: reconnect back-off cap, >= the minimum (default 5000).
    pub reconnect_max_ms: u64,
    /// `OPENIMEX_HOSTNAME`: host name shown by `ctl -H`; `None` (empty, default) means the
    /// system host name.
    pub host_name: Option<String>,
    /// `OPENIMEX_PEER_ANY_SOURCE`: accept a peer's hello from any source address, not only
    /// from the nodes file's address for the node it names (multi-homed hosts whose routes
    /// pick another address). 0 (default) or 1.
    pub peer_any_source: bool,
    /// `OPENIMEX_PERSIST_FILE`: where the record of nodes holding references to this node's
    /// memory is kept for the RECOVERY quorum (default NVIDIA's
    /// `/var/run/nvidia-imex/persist.dat`).
    pub persist_file: PathBuf,
    /// `OPENIMEX_METRICS_ADDR`: `address:port` where the daemon serves Prometheus metrics on
    /// `GET /metrics` over plain HTTP; `None` (empty, default) serves none.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `OPENIMEX_JOBS_DIR`: the directory of job files (one `<job>.job` per job, see
    /// [`crate::jobfile`]), watched while the daemon runs; `None` (empty, default): no jobs
    /// from files.
    pub jobs_dir: Option<PathBuf>,

    /// `OPENIMEX_VERBOSE_LOG_BUFFER_KB`: size of the in-memory buffer of the messages
    /// `LOG_LEVEL` keeps out of the log, written to the log on SIGHUP and at shutdown; 0 turns
    /// it off (default [`DEFAULT_VERBOSE_LOG_BUFFER_KB`], at most
    /// [`MAX_VERBOSE_LOG_BUFFER_KB`]). NVIDIA documents no key for its buffer's size.
    pub verbose_log_buffer_kb: u32,

    /// `OPENIMEX_SYSLOG_SOCKET`: the system logger's unix datagram socket that
    /// `LOG_USE_SYSLOG=1` sends to (default [`DEFAULT_SYSLOG_SOCKET`]).
    pub syslog_socket: PathBuf,

    /// `OPENIMEX_STATS_INTERVAL_SEC`: seconds between two records of the performance
    /// statistics file (`STATS_FILE_NAME`); 0 writes no stats file. Default
    /// [`DEFAULT_STATS_INTERVAL_SEC`], the interval of NVIDIA's sample, which documents no key.
    pub stats_interval_sec: u64,

    /// `OPENIMEX_SIM_NODE_DIR`: the node directory of the simulated GPU driver
    /// (`openimex-lab gpu --node-dir`), used with `OPENIMEX_DRIVER=sim`.
    pub sim_node_dir: Option<PathBuf>,

    /// `OPENIMEX_DRIVER_ROOT`: where the GPU driver's files are (`dev/nvidiactl`,
    /// `dev/nvidia-caps/`, `proc/driver/nvidia/`), as the Kubernetes DRA driver's
    /// `driverRoot`; `None` (empty, default) means the `OPENIMEX_DRIVER_ROOT` environment
    /// variable, else `/`. A simulated tray's node directory is one.
    pub driver_root: Option<PathBuf>,

    /// Warnings found while parsing; see [`Config::notices`]. Empty for [`Config::default`].
    pub notices: Vec<Notice>,

    /// The file this config was read from, and the line that set `IMEX_NODE_CONFIG_FILE`
    /// (none when the default applies), so errors about the nodes file can point at it.
    pub node_config_file_origin: Option<(PathBuf, Option<usize>)>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            log_level: 4,
            log_file_name: Some(PathBuf::from("/var/log/nvidia-imex.log")),
            stats_file_name: Some(PathBuf::from("/var/log/nvidia-imex-stats.log")),
            log_append_to_log: true,
            log_file_max_size_mb: 1024,
            log_max_rotate_count: 0,
            log_use_syslog: false,
            daemonize: true,
            bind_interface_ip: None,
            server_port: 50000,
            imex_node_config_file: PathBuf::from("/etc/nvidia-imex/nodes_config.cfg"),
            network_interface: None,
            network_interface_at: None,
            imex_wait_for_quorum: Quorum::Recovery,
            imex_enable_auth_encryption: false,
            imex_auth_encryption_mode: Some(AuthMode::SslTls),
            imex_auth_source: None,
            imex_server_key: None,
            imex_server_cert: None,
            imex_server_cert_auth: None,
            imex_client_key: None,
            imex_client_cert: None,
            imex_client_cert_auth: None,
            auth_enabled_at: None,
            tls_key_lines: Vec::new(),
            override_line: 0,
            imex_security_target_override: None,
            imex_gss_service_name: "host".to_owned(),
            imex_gss_timeout_sec: -1,
            imex_gss_retry_interval_sec: 5,
            imex_gss_sec_context_lifetime_sec: -1,
            imex_gss_shutdown_on_failure: true,
            imex_cmd_enabled: false,
            imex_cmd_bind_interface_ip: None,
            imex_cmd_port: None,
            imex_cmd_unix_domain_path: None,
            imex_node_disconnected_grace_time: GraceTime::Forever,
            imex_conn_wait_timeout: None,
            driver: DriverKind::Auto,
            domain_id: None,
            heartbeat_interval_ms: 1000,
            peer_timeout_ms: 5000,
            reconnect_min_ms: 250,
            reconnect_max_ms: 5000,
            host_name: None,
            peer_any_source: false,
            persist_file: PathBuf::from("/var/run/nvidia-imex/persist.dat"),
            metrics_addr: None,
            jobs_dir: None,
            verbose_log_buffer_kb: DEFAULT_VERBOSE_LOG_BUFFER_KB,
            syslog_socket: PathBuf::from(DEFAULT_SYSLOG_SOCKET),
            stats_interval_sec: DEFAULT_STATS_INTERVAL_SEC,
            sim_node_dir: None,
            driver_root: None,
            notices: Vec::new(),
            node_config_file_origin: None,
        }
    }
}

/// Where a key was set: 1-based line and the trimmed value as written.
type Seen<'t> = HashMap<&'static str, (usize, &'t str)>;

impl Config {
    /// Parse the text of a config file. `path` is only used in error messages and notices,
    /// and to resolve a relative `IMEX_NODE_CONFIG_FILE`.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let mut cfg = Config::default();
        let mut seen: Seen<'_> = HashMap::new();
        let mut notices = Vec::new();
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);

        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let syntax = |problem| ConfigError::Syntax {
                path: path.to_path_buf(),
                line,
                text: trimmed.to_owned(),
                problem,
            };
            let (key, value) = trimmed
                .split_once('=')
                .ok_or_else(|| syntax("is not KEY=value"))?;
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() {
                return Err(syntax("has no key before '='"));
            }
            let Some(known) = keys::find(key) else {
                notices.push(unknown_key(path, line, key)?);
                continue;
            };
            if let Some((first, _)) = seen.insert(known.name, (line, value)) {
                notices.push(Notice {
                    path: path.to_path_buf(),
                    line,
                    key: key.to_owned(),
                    message: format!(
                        "{key} is set twice (lines {first} and {line}); the later value is used"
                    ),
                });
            }
            (known.set)(
                &mut cfg,
                &keys::Value {
                    path,
                    line,
                    key,
                    raw: value,
                },
            )?;
        }

        let config_dir = path
            .parent()
            .filter(|_| cfg.imex_node_config_file.is_relative());
        if let Some(dir) = config_dir {
            cfg.imex_node_config_file = dir.join(&cfg.imex_node_config_file);
        }
        notices.extend(keys::check_combinations(&cfg, &seen, path)?);
        notices.extend(keys::not_supported_yet(&cfg, &seen, path));
        notices.sort_by_key(|n| n.line);
        cfg.notices = notices;
        let node_line = seen.get("IMEX_NODE_CONFIG_FILE").map(|(line, _)| *line);
        cfg.node_config_file_origin = Some((path.to_path_buf(), node_line));
        cfg.network_interface_at = seen
            .get("NETWORK_INTERFACE")
            .filter(|_| cfg.network_interface.is_some())
            .map(|&(line, _)| (path.to_path_buf(), line));
        cfg.auth_enabled_at = seen
            .get("IMEX_ENABLE_AUTH_ENCRYPTION")
            .filter(|_| cfg.imex_enable_auth_encryption)
            .map(|&(line, _)| (path.to_path_buf(), line));
        cfg.override_line = seen
            .get("IMEX_SECURITY_TARGET_OVERRIDE")
            .filter(|(_, raw)| !raw.is_empty())
            .map_or(0, |&(line, _)| line);
        cfg.tls_key_lines = tls::KEYS
            .iter()
            .filter_map(|key| {
                seen.get(key)
                    .filter(|(_, raw)| !raw.is_empty())
                    .map(|&(line, _)| (*key, line))
            })
            .collect();
        Ok(cfg)
    }

    /// Read and parse a config file. An unreadable file is a [`ConfigError::Io`] naming the
    /// file and carrying the OS error.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text, path)
    }

    /// Reads the nodes file this config names. When it cannot be read, the error also points at
    /// the line of the config that names it (or says the default applies).
    pub fn load_nodes(&self) -> Result<NodeConfig, ConfigError> {
        NodeConfig::load(&self.imex_node_config_file).map_err(|e| match e {
            ConfigError::NodesIo { path, source, .. } => {
                let set_at = match &self.node_config_file_origin {
                    Some((cfg, Some(line))) => {
                        format!("{}:{line}: IMEX_NODE_CONFIG_FILE: ", cfg.display())
                    }
                    Some((cfg, None)) => format!(
                        "{}: IMEX_NODE_CONFIG_FILE is not set, so the default applies: ",
                        cfg.display()
                    ),
                    None => String::new(),
                };
                ConfigError::NodesIo {
                    set_at,
                    path,
                    source,
                }
            }
            other => other,
        })
    }

    /// Things the daemon must log once at warn level after start, in line order: unknown
    /// keys, keys given twice, keys set to a value openimex does not support yet, ignored
    /// values. Each displays as `path:line: message`.
    pub fn notices(&self) -> &[Notice] {
        &self.notices
    }
}

/// The notice for a key this crate does not know, or the error if it has our prefix.
fn unknown_key(path: &Path, line: usize, key: &str) -> Result<Notice, ConfigError> {
    let upper = key.to_ascii_uppercase();
    let known = keys::find(&upper);
    if upper.starts_with("OPENIMEX_") && known.is_none() {
        return Err(ConfigError::UnknownOpenimexKey {
            path: path.to_path_buf(),
            line,
            key: key.to_owned(),
            known: keys::openimex_keys().join(", "),
        });
    }
    let hint = match known {
        Some(k) => format!(" (keys are case-sensitive: did you mean {}?)", k.name),
        None => String::new(),
    };
    Ok(Notice {
        path: path.to_path_buf(),
        line,
        key: key.to_owned(),
        message: format!("unknown key {} ignored{hint}", Clip(key)),
    })
}
