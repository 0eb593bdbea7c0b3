//! The configuration reference: every key of `config.cfg`, its default, what it does and
//! whether openimex implements it, rendered as the Markdown table of
//! `docs/operator/configuration.md`.
//!
//! The table cannot drift from the parser:
//! - the keys and their order are the parser's own key table (`cfg/keys.rs`, `KEYS`), and
//!   so is the list of keys accepted without effect (`NOT_SUPPORTED_YET`);
//! - every default is read from [`Config::default`], and the accepted values of the keys that
//!   take a name from the enums the parser uses ([`Quorum::ALL`], [`AuthMode::ALL`],
//!   [`AuthSource::ALL`], [`DriverKind::ALL`]);
//! - only the prose is written here, one [`KeyDoc`] per key. A key of the parser's table with
//!   no entry here renders as **undocumented**, and [`undocumented`] and [`unknown`] name the
//!   differences; the test `tests/docs_reference.rs` fails on either, and when the document's
//!   generated block differs from [`markdown`] (`OPENIMEX_BLESS=1` rewrites it).

use std::fmt::Display;
use std::path::Path;

use crate::{AuthMode, AuthSource, Config, DriverKind, Quorum};

/// The line before the generated block in the document.
pub const BEGIN_MARKER: &str = "<!-- BEGIN GENERATED: config keys. Edit crates/config/src/reference.rs, then run \
     OPENIMEX_BLESS=1 cargo test -p openimex-config --test docs_reference -->";
/// The line after the generated block in the document.
pub const END_MARKER: &str = "<!-- END GENERATED: config keys -->";

/// The document the block lives in, relative to the workspace root.
pub const DOCUMENT: &str = "docs/operator/configuration.md";

/// Whether openimex implements a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// One of NVIDIA's keys, implemented as NVIDIA documents it.
    Yes,
    /// One of NVIDIA's keys, implemented with the limits the text says.
    Partly(&'static str),
    /// A key of openimex's own (`OPENIMEX_*`); NVIDIA's daemon does not know it.
    Ours,
}

/// The accepted names of a key that takes one, from the parser's enums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choices {
    /// The key takes a number, a path, an address or free text.
    None,
    /// [`Quorum`].
    Quorum,
    /// [`AuthMode`].
    AuthMode,
    /// [`AuthSource`].
    AuthSource,
    /// [`DriverKind`].
    Driver,
}

impl Choices {
    fn names(self) -> Vec<&'static str> {
        match self {
            Choices::None => Vec::new(),
            Choices::Quorum => Quorum::ALL.iter().map(|v| v.as_str()).collect(),
            Choices::AuthMode => AuthMode::ALL.iter().map(|v| v.as_str()).collect(),
            Choices::AuthSource => AuthSource::ALL.iter().map(|v| v.as_str()).collect(),
            Choices::Driver => DriverKind::ALL.iter().map(|v| v.as_str()).collect(),
        }
    }
}

/// The documentation of one key.
#[derive(Debug, Clone, Copy)]
pub struct KeyDoc {
    /// The key, as the parser spells it.
    pub key: &'static str,
    /// Its default, read from [`Config::default`] (`""` for an empty value).
    pub default: fn(&Config) -> String,
    /// What it does (Markdown, one paragraph).
    pub meaning: &'static str,
    /// The names it accepts, if it takes one.
    pub choices: Choices,
    /// Whether openimex implements it.
    pub support: Support,
}

fn flag(b: bool) -> String {
    u8::from(b).to_string()
}

fn opt<T: Display>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

fn path(p: Option<&Path>) -> String {
    p.map(|p| p.display().to_string()).unwrap_or_default()
}

macro_rules! doc {
    ($key:literal, $default:expr, $support:expr, $meaning:literal) => {
        doc!($key, $default, $support, Choices::None, $meaning)
    };
    ($key:literal, $default:expr, $support:expr, $choices:expr, $meaning:literal) => {
        KeyDoc {
            key: $key,
            default: $default,
            meaning: $meaning,
            choices: $choices,
            support: $support,
        }
    };
}

use Support::{Ours, Partly, Yes};

/// The prose of every key, NVIDIA's first, then ours.
#[rustfmt::skip]
const DOCS: &[KeyDoc] = &[
    doc!("LOG_LEVEL", |c| c.log_level.to_string(), Yes,
        "What the log keeps: 0 nothing (but the SIGHUP and stop dumps), 1 and 2 ERROR, 3 adds WARNING, 4 adds INFO. What it keeps out goes to the verbose buffer that SIGHUP writes."),
    doc!("LOG_FILE_NAME", |c| path(c.log_file_name.as_deref()), Yes,
        "The log file, in NVIDIA's line format. Empty, or a file that cannot be opened: stderr."),
    doc!("STATS_FILE_NAME", |c| path(c.stats_file_name.as_deref()), Yes,
        "The performance statistics file (a record every `OPENIMEX_STATS_INTERVAL_SEC`). Empty or unopenable: stderr; the same name as `LOG_FILE_NAME`: into the main log."),
    doc!("LOG_APPEND_TO_LOG", |c| flag(c.log_append_to_log), Yes,
        "1 appends to the log and stats files, 0 truncates them at start."),
    doc!("LOG_FILE_MAX_SIZE", |c| c.log_file_max_size_mb.to_string(), Yes,
        "Cap of the log file in MB (2^20 bytes); 0: no cap. A line is never split across files."),
    doc!("LOG_MAX_ROTATE_COUNT", |c| c.log_max_rotate_count.to_string(), Yes,
        "0: the file stops at the cap with one last line saying so. N > 0: the full file becomes `name.1` (newest) … `name.N` (oldest, purged at the next rotation), about cap × (N+1) in all."),
    doc!("LOG_USE_SYSLOG", |c| flag(c.log_use_syslog), Yes,
        "1 sends every line to syslog instead (facility daemon, severity from the level; under systemd it lands in the journal). If the socket is missing or refuses, the log goes to the file (or stderr) behind one ERROR line."),
    doc!("DAEMONIZE", |c| flag(c.daemonize), Yes,
        "1 forks into the background once the daemon serves (systemd `Type=forking`). Under `Type=notify` (`NOTIFY_SOCKET` set) the daemon stays in the foreground whatever this says."),
    doc!("BIND_INTERFACE_IP", |c| opt(c.bind_interface_ip), Yes,
        "The peer listener's address. Empty: the local address that the nodes file lists (this node's entry)."),
    doc!("SERVER_PORT", |c| c.server_port.to_string(), Yes,
        "The peer port, the same on every node: 1-65535 (peers dial it, so 0 is refused). `daemon -p PORT` overrides it."),
    doc!("IMEX_NODE_CONFIG_FILE", |c| c.imex_node_config_file.display().to_string(), Yes,
        "The nodes file: one address or DNS name per line, the node ID being the index among entry lines. A relative path is taken from the config file's directory."),
    doc!("NETWORK_INTERFACE", |c| opt(c.network_interface.as_deref()), Yes,
        "The peer listener's interface. It gives an IPv6 link-local bind address its scope (required when that address is on several interfaces); with several entries of this host, the one on that interface is taken. An unknown name fails the start at its line."),
    doc!("IMEX_WAIT_FOR_QUORUM", |c| c.imex_wait_for_quorum.to_string(), Yes, Choices::Quorum,
        "What the daemon waits for before READY. `NONE`: nothing. `RECOVERY`: after an unclean exit, the nodes that held imports of this node's memory (the persist record). `FULL`: every peer (bounded by `IMEX_CONN_WAIT_TIMEOUT`)."),
    doc!("IMEX_ENABLE_AUTH_ENCRYPTION", |c| flag(c.imex_enable_auth_encryption), Yes,
        "1 turns on peer authentication and encryption. It fails closed: missing or unusable material stops the start naming the file, line, key, value and fix."),
    doc!("IMEX_AUTH_ENCRYPTION_MODE", |c| opt(c.imex_auth_encryption_mode), Partly("`SSL_TLS` only; the GSSAPI modes are refused at start"), Choices::AuthMode,
        "How peers authenticate when `IMEX_ENABLE_AUTH_ENCRYPTION=1`: mutual TLS 1.3, or GSSAPI (Kerberos). Empty or unknown with authentication on: the start fails."),
    doc!("IMEX_AUTH_SOURCE", |c| opt(c.imex_auth_source), Yes, Choices::AuthSource,
        "How the six key, certificate and CA values are read: `FILE` paths, `ENV_PATH` names of environment variables holding paths, `ENV_VAL` names of variables holding the PEM text."),
    doc!("IMEX_SERVER_KEY", |c| opt(c.imex_server_key.as_deref()), Yes,
        "The key the accepting side presents (per `IMEX_AUTH_SOURCE`)."),
    doc!("IMEX_SERVER_CERT", |c| opt(c.imex_server_cert.as_deref()), Yes,
        "The certificate the accepting side presents; it must name this node's nodes-file entry."),
    doc!("IMEX_SERVER_CERT_AUTH", |c| opt(c.imex_server_cert_auth.as_deref()), Yes,
        "The CA a dialling peer's client certificate must chain to."),
    doc!("IMEX_CLIENT_KEY", |c| opt(c.imex_client_key.as_deref()), Yes,
        "The key the dialling side presents."),
    doc!("IMEX_CLIENT_CERT", |c| opt(c.imex_client_cert.as_deref()), Yes,
        "The certificate the dialling side presents; it must name this node's entry."),
    doc!("IMEX_CLIENT_CERT_AUTH", |c| opt(c.imex_client_cert_auth.as_deref()), Yes,
        "The CA the accepting peer's certificate must chain to."),
    doc!("IMEX_SECURITY_TARGET_OVERRIDE", |c| opt(c.imex_security_target_override.as_deref()), Yes,
        "A name to check every peer's certificate against instead of its nodes-file entry (a `CN=` prefix is dropped; it must be among the certificate's subject alternative names)."),
    doc!("IMEX_GSS_SERVICE_NAME", |c| c.imex_gss_service_name.clone(), Yes,
        "GSSAPI service principal name."),
    doc!("IMEX_GSS_TIMEOUT_SEC", |c| c.imex_gss_timeout_sec.to_string(), Yes,
        "GSSAPI: seconds before a failing peer is cleaned up (-1: retry forever)."),
    doc!("IMEX_GSS_RETRY_INTERVAL_SEC", |c| c.imex_gss_retry_interval_sec.to_string(), Yes,
        "GSSAPI: seconds between retries."),
    doc!("IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC", |c| c.imex_gss_sec_context_lifetime_sec.to_string(), Yes,
        "GSSAPI: security context lifetime (-1: the credential's)."),
    doc!("IMEX_GSS_SHUTDOWN_ON_FAILURE", |c| flag(c.imex_gss_shutdown_on_failure), Yes,
        "GSSAPI: 1 stops the daemon on a fatal failure, 0 drops only that peer."),
    doc!("IMEX_CMD_ENABLED", |c| flag(c.imex_cmd_enabled), Yes,
        "1 runs the command service `ctl` talks to; it needs `IMEX_CMD_PORT` or `IMEX_CMD_UNIX_DOMAIN_PATH` (or both)."),
    doc!("IMEX_CMD_BIND_INTERFACE_IP", |c| opt(c.imex_cmd_bind_interface_ip), Yes,
        "The command port's address. Empty: every interface, as NVIDIA's."),
    doc!("IMEX_CMD_PORT", |c| opt(c.imex_cmd_port), Yes,
        "The command service's TCP port (NVIDIA's files use 50005). Empty: no TCP port. Any local user can reach a TCP port, so the commands that change state are taken on the unix socket only."),
    doc!("IMEX_CMD_UNIX_DOMAIN_PATH", |c| path(c.imex_cmd_unix_domain_path.as_deref()), Yes,
        "The command service's unix socket, mode 0660 whatever the umask (root-only unless a site gives it a group). The Kubernetes DRA driver's host-managed mode wants `/etc/nvidia-imex/imex_ctrl.sock`."),
    doc!("IMEX_NODE_DISCONNECTED_GRACE_TIME", |c| c.imex_node_disconnected_grace_time.to_string(), Yes,
        "How long a lost peer is waited for before its imports and exports are cleaned up: -1 forever, 0 at once, N seconds. N > 0 declares a peer silent for N seconds dead; where a frozen host may still run applications, keep -1."),
    doc!("IMEX_CONN_WAIT_TIMEOUT", |c| opt(c.imex_conn_wait_timeout), Yes,
        "Seconds the `FULL` quorum waits for every peer; then the daemon goes on to READY and logs the peers still missing. It does not shorten the `RECOVERY` wait. Empty: wait for all (NVIDIA's legacy Slurm key)."),
    doc!("OPENIMEX_DRIVER", |c| c.driver.to_string(), Ours, Choices::Driver,
        "The GPU driver backend: `nvidia` the RM interface under the driver root (`auto` means the same), `nogpu` control plane only (as `--nogpu`), `sim` `nvidia` with `OPENIMEX_SIM_NODE_DIR` as the driver root."),
    doc!("OPENIMEX_DOMAIN_ID", |c| opt(c.domain_id.as_deref()), Ours,
        "The domain identity every handshake checks. Empty: derived from the node map's first entry, so it stays the same when SIGUSR1 appends nodes (a placeholder first entry filled in re-derives it)."),
    doc!("OPENIMEX_VERBOSE_LOG_BUFFER_KB", |c| c.verbose_log_buffer_kb.to_string(), Ours,
        "Size in KiB (0-65536, 0 = off) of the in-memory buffer of the messages below `LOG_LEVEL` that SIGHUP and a clean stop write to the log. NVIDIA documents no key for its buffer."),
    doc!("OPENIMEX_HEARTBEAT_INTERVAL_MS", |c| c.heartbeat_interval_ms.to_string(), Ours,
        "Heartbeat period per pair of nodes (the lower node ID sends; the higher answers every heartbeat that asks: every other one while answers arrive, with a peer timeout of four intervals or more)."),
    doc!("OPENIMEX_PEER_TIMEOUT_MS", |c| c.peer_timeout_ms.to_string(), Ours,
        "A peer silent this long is lost (hung TCP, SIGSTOP, partition). Must exceed the heartbeat interval."),
    doc!("OPENIMEX_RECONNECT_MIN_MS", |c| c.reconnect_min_ms.to_string(), Ours,
        "First reconnect delay (jittered, doubling up to the maximum)."),
    doc!("OPENIMEX_RECONNECT_MAX_MS", |c| c.reconnect_max_ms.to_string(), Ours,
        "Reconnect backoff cap. A refused connection is retried only after 2-4 times the cap, as a safety net (the peer dials us when its daemon starts); the dial budget allows 24 retries per cap across all peers after a burst of 64."),
    doc!("OPENIMEX_HOSTNAME", |c| opt(c.host_name.as_deref()), Ours,
        "The name `ctl -H` shows. Empty: the system host name."),
    doc!("OPENIMEX_PEER_ANY_SOURCE", |c| flag(c.peer_any_source), Ours,
        "1 accepts a peer's hello from any source address, not only from the nodes file's address for the node it names (multi-homed hosts whose routes pick another address)."),
    doc!("OPENIMEX_PERSIST_FILE", |c| c.persist_file.display().to_string(), Ours,
        "The persist record of the `RECOVERY` quorum: the nodes holding references to this node's memory."),
    doc!("OPENIMEX_METRICS_ADDR", |c| opt(c.metrics_addr), Ours,
        "`address:port` (`127.0.0.1:9464`, `[::1]:9464`) where the daemon serves Prometheus metrics on `GET /metrics` over plain HTTP. Empty: no listener."),
    doc!("OPENIMEX_JOBS_DIR", |c| path(c.jobs_dir.as_deref()), Ours,
        "A directory of job files, one `<job>.job` per job (`CHANNEL=`, `MEMBERS=`, optional `OWNER=uid:gid`), read at start and at once when a file is written, moved or deleted. Once a job is defined, an import goes only inside a job both nodes hold. Empty: no jobs."),
    doc!("OPENIMEX_SYSLOG_SOCKET", |c| c.syslog_socket.display().to_string(), Ours,
        "The unix datagram socket `LOG_USE_SYSLOG=1` sends to (journald's or rsyslog's)."),
    doc!("OPENIMEX_STATS_INTERVAL_SEC", |c| c.stats_interval_sec.to_string(), Ours,
        "Seconds between two records of the stats file; 0 writes no stats file. NVIDIA's sample says 30 s and documents no key."),
    doc!("OPENIMEX_SIM_NODE_DIR", |c| path(c.sim_node_dir.as_deref()), Ours,
        "With `OPENIMEX_DRIVER=sim`: the `--node-dir` of this node's `openimex-lab gpu`."),
    doc!("OPENIMEX_DRIVER_ROOT", |c| path(c.driver_root.as_deref()), Ours,
        "Where the driver's files are (`dev/nvidiactl`, `dev/nvidia-caps/`, `proc/driver/nvidia/`), as the Kubernetes DRA driver's `driverRoot`. Empty: the `OPENIMEX_DRIVER_ROOT` environment variable, else `/`. A simulated tray's node directory is one."),
];

/// The documentation of every key, NVIDIA's first, then ours.
pub fn docs() -> &'static [KeyDoc] {
    DOCS
}

/// Every key the parser knows, in the order of its table (`cfg/keys.rs`, `KEYS`).
pub fn parser_keys() -> Vec<&'static str> {
    crate::cfg::keys::names()
}

/// The keys the parser accepts without effect (`cfg/keys.rs`, `NOT_SUPPORTED_YET`).
pub fn accepted_without_effect() -> Vec<&'static str> {
    crate::cfg::keys::without_effect()
}

/// Keys of the parser's table that have no [`KeyDoc`].
pub fn undocumented() -> Vec<&'static str> {
    parser_keys()
        .into_iter()
        .filter(|k| !DOCS.iter().any(|d| d.key == *k))
        .collect()
}

/// Keys with a [`KeyDoc`] that the parser's table does not have.
pub fn unknown() -> Vec<&'static str> {
    let known = parser_keys();
    DOCS.iter()
        .map(|d| d.key)
        .filter(|k| !known.contains(k))
        .collect()
}

/// A table cell: `|` escaped, and an empty value said as such.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn code_or_empty(value: &str) -> String {
    if value.is_empty() {
        "(empty)".to_owned()
    } else {
        format!("`{}`", cell(value))
    }
}

/// The reference table, as Markdown: one row per key of the parser's table, in its order.
pub fn markdown() -> String {
    let defaults = Config::default();
    let without_effect = accepted_without_effect();
    let mut out = String::new();
    out.push_str("| Key | Default | What it does | Supported |\n");
    out.push_str("|---|---|---|---|\n");
    for key in parser_keys() {
        let Some(doc) = DOCS.iter().find(|d| d.key == key) else {
            out.push_str(&format!("| `{key}` | | **undocumented** | |\n"));
            continue;
        };
        let mut meaning = doc.meaning.to_owned();
        let names = doc.choices.names();
        if !names.is_empty() {
            let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            meaning.push_str(&format!(" Values: {}.", names.join(", ")));
        }
        let support = if without_effect.contains(&key) {
            "accepted, no effect (GSSAPI is not built)".to_owned()
        } else {
            match doc.support {
                Support::Yes => "yes".to_owned(),
                Support::Partly(limits) => format!("partly: {limits}"),
                Support::Ours => "openimex only".to_owned(),
            }
        };
        out.push_str(&format!(
            "| `{key}` | {} | {} | {} |\n",
            code_or_empty(&(doc.default)(&defaults)),
            cell(&meaning),
            cell(&support),
        ));
    }
    out
}

/// `text` with the block between [`BEGIN_MARKER`] and [`END_MARKER`] replaced by [`markdown`],
/// or `None` when the markers are missing or out of order.
pub fn regenerate(text: &str) -> Option<String> {
    let begin = text.find(BEGIN_MARKER)? + BEGIN_MARKER.len();
    let end = text[begin..].find(END_MARKER)? + begin;
    Some(format!(
        "{}\n{}{}",
        &text[..begin],
        markdown(),
        &text[end..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_table_is_read_with_its_constants() {
        let keys = parser_keys();
        assert_eq!(keys.first(), Some(&"LOG_LEVEL"));
        assert!(keys.contains(&"OPENIMEX_HEARTBEAT_INTERVAL_MS"), "{keys:?}");
        assert!(keys.contains(&"IMEX_ENABLE_AUTH_ENCRYPTION"), "{keys:?}");
        assert!(accepted_without_effect().contains(&"IMEX_GSS_SERVICE_NAME"));
    }

    #[test]
    fn regenerate_replaces_only_the_block() {
        let text = format!("before\n{BEGIN_MARKER}\nold\n{END_MARKER}\nafter\n");
        let new = regenerate(&text).unwrap();
        assert!(new.starts_with(&format!("before\n{BEGIN_MARKER}\n| Key |")));
        assert!(new.ends_with(&format!("|\n{END_MARKER}\nafter\n")));
        assert_eq!(regenerate("no markers"), None);
    }
}
