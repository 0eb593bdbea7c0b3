//! The key table of `config.cfg`: one entry per known key with its value parser, the
//! checks that involve several keys, and the table of keys openimex does not support yet.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::{AuthMode, AuthSource, Config, DriverKind, GraceTime, Notice, Quorum, Seen};
use crate::ConfigError;
use crate::error::Quoted;

/// One value being parsed: where it is and what it says.
pub(super) struct Value<'a> {
    pub(super) path: &'a Path,
    pub(super) line: usize,
    pub(super) key: &'a str,
    /// The trimmed value as written.
    pub(super) raw: &'a str,
}

type Result<T> = std::result::Result<T, ConfigError>;

impl Value<'_> {
    fn invalid(&self, what: &'static str, expected: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            line: self.line,
            key: self.key.to_owned(),
            value: self.raw.to_owned(),
            what,
            expected: expected.into(),
        }
    }

    fn bool(&self) -> Result<bool> {
        match self.raw {
            "0" => Ok(false),
            "1" => Ok(true),
            _ => Err(self.invalid("boolean", "expected 0 or 1")),
        }
    }

    fn int<T: std::str::FromStr>(&self, what: &'static str, expected: &str) -> Result<T> {
        self.raw.parse().map_err(|_| self.invalid(what, expected))
    }

    fn u64(&self) -> Result<u64> {
        self.int("number", "expected a non-negative integer")
    }

    /// A port other peers dial: 1-65535. Port 0 (the OS picks one at bind time) is refused,
    /// since no peer could know which one was picked.
    fn fixed_port(&self) -> Result<u16> {
        const EXPECTED: &str = "expected an integer 1-65535: every daemon dials its peers on \
                                this port, so it must be a fixed port, the same in every \
                                node's config (NVIDIA's default is 50000)";
        match self.int::<u16>("port", EXPECTED)? {
            0 => Err(self.invalid("port", EXPECTED)),
            n => Ok(n),
        }
    }

    fn opt_port(&self) -> Result<Option<u16>> {
        if self.raw.is_empty() {
            return Ok(None);
        }
        self.int(
            "port",
            "expected an integer 0-65535, or an empty value for none",
        )
        .map(Some)
    }

    /// -1 or an integer >= 0.
    fn minus_one_or_more(&self) -> Result<i64> {
        const EXPECTED: &str = "expected -1 or an integer >= 0";
        match self.int::<i64>("number", EXPECTED)? {
            n if n >= -1 => Ok(n),
            _ => Err(self.invalid("number", EXPECTED)),
        }
    }

    /// Milliseconds > 0.
    fn positive_ms(&self) -> Result<u64> {
        const EXPECTED: &str = "expected a number of milliseconds greater than 0";
        match self.int::<u64>("interval", EXPECTED)? {
            0 => Err(self.invalid("interval", EXPECTED)),
            n => Ok(n),
        }
    }

    fn opt_ip(&self) -> Result<Option<IpAddr>> {
        if self.raw.is_empty() {
            return Ok(None);
        }
        self.raw.parse().map(Some).map_err(|_| {
            self.invalid(
                "IP address",
                "expected an IPv4 or IPv6 address (no port, no brackets), or an empty value",
            )
        })
    }

    /// An `address:port` to listen on (`127.0.0.1:9464`, `[::1]:9464`), or `None` when empty.
    fn opt_socket_addr(&self) -> Result<Option<std::net::SocketAddr>> {
        if self.raw.is_empty() {
            return Ok(None);
        }
        self.raw.parse().map(Some).map_err(|_| {
            self.invalid(
                "address",
                "expected an IP address and port such as 127.0.0.1:9464 or [::1]:9464, or an empty value for none",
            )
        })
    }

    fn opt_string(&self) -> Option<String> {
        (!self.raw.is_empty()).then(|| self.raw.to_owned())
    }

    fn opt_path(&self) -> Option<PathBuf> {
        (!self.raw.is_empty()).then(|| PathBuf::from(self.raw))
    }
}

/// A known key and how to store its value.
pub(super) struct Key {
    pub(super) name: &'static str,
    pub(super) set: fn(&mut Config, &Value<'_>) -> Result<()>,
}

const HEARTBEAT: &str = "OPENIMEX_HEARTBEAT_INTERVAL_MS";
const PEER_TIMEOUT: &str = "OPENIMEX_PEER_TIMEOUT_MS";
const RECONNECT_MIN: &str = "OPENIMEX_RECONNECT_MIN_MS";
const RECONNECT_MAX: &str = "OPENIMEX_RECONNECT_MAX_MS";
const AUTH_ENABLE: &str = "IMEX_ENABLE_AUTH_ENCRYPTION";
const AUTH_MODE: &str = "IMEX_AUTH_ENCRYPTION_MODE";
const AUTH_SOURCE: &str = "IMEX_AUTH_SOURCE";
const CMD_ENABLED: &str = "IMEX_CMD_ENABLED";

/// Every key this crate knows, NVIDIA's first (in the shipped file's order), then ours.
#[rustfmt::skip]
const KEYS: &[Key] = &[
    Key { name: "LOG_LEVEL", set: |c, v| {
        c.log_level = v.int("log level", "expected an integer 0-4 (0 off, 1 CRITICAL, 2 ERROR, 3 WARNING, 4 INFO)")?;
        if c.log_level > 4 {
            return Err(v.invalid("log level", "expected an integer 0-4 (0 off, 1 CRITICAL, 2 ERROR, 3 WARNING, 4 INFO)"));
        }
        Ok(())
    } },
    Key { name: "LOG_FILE_NAME", set: |c, v| { c.log_file_name = v.opt_path(); Ok(()) } },
    Key { name: "STATS_FILE_NAME", set: |c, v| { c.stats_file_name = v.opt_path(); Ok(()) } },
    Key { name: "LOG_APPEND_TO_LOG", set: |c, v| { c.log_append_to_log = v.bool()?; Ok(()) } },
    Key { name: "LOG_FILE_MAX_SIZE", set: |c, v| {
        c.log_file_max_size_mb = v.int("size", "expected a size in MB (a non-negative integer; 0: no cap)")?;
        Ok(())
    } },
    Key { name: "LOG_MAX_ROTATE_COUNT", set: |c, v| {
        c.log_max_rotate_count = v.int("count", "expected 0 (no rotation) or a number of rotated files")?;
        Ok(())
    } },
    Key { name: "LOG_USE_SYSLOG", set: |c, v| { c.log_use_syslog = v.bool()?; Ok(()) } },
    Key { name: "DAEMONIZE", set: |c, v| { c.daemonize = v.bool()?; Ok(()) } },
    Key { name: "BIND_INTERFACE_IP", set: |c, v| { c.bind_interface_ip = v.opt_ip()?; Ok(()) } },
    Key { name: "SERVER_PORT", set: |c, v| { c.server_port = v.fixed_port()?; Ok(()) } },
    Key { name: "IMEX_NODE_CONFIG_FILE", set: |c, v| {
        c.imex_node_config_file = v.opt_path().ok_or_else(|| {
            v.invalid("path", "expected the path of the nodes file (default /etc/nvidia-imex/nodes_config.cfg)")
        })?;
        Ok(())
    } },
    Key { name: "NETWORK_INTERFACE", set: |c, v| { c.network_interface = v.opt_string(); Ok(()) } },
    Key { name: "IMEX_WAIT_FOR_QUORUM", set: |c, v| {
        c.imex_wait_for_quorum = Quorum::from_name(v.raw).ok_or_else(|| {
            v.invalid("value", format!("expected one of {}", Quorum::expected()))
        })?;
        Ok(())
    } },
    Key { name: AUTH_ENABLE, set: |c, v| { c.imex_enable_auth_encryption = v.bool()?; Ok(()) } },
    // Empty or unknown values are judged in `check_combinations`, once we know whether auth is on.
    Key { name: AUTH_MODE, set: |c, v| { c.imex_auth_encryption_mode = AuthMode::from_name(v.raw); Ok(()) } },
    Key { name: AUTH_SOURCE, set: |c, v| { c.imex_auth_source = AuthSource::from_name(v.raw); Ok(()) } },
    Key { name: "IMEX_SERVER_KEY", set: |c, v| { c.imex_server_key = v.opt_string(); Ok(()) } },
    Key { name: "IMEX_SERVER_CERT", set: |c, v| { c.imex_server_cert = v.opt_string(); Ok(()) } },
    Key { name: "IMEX_SERVER_CERT_AUTH", set: |c, v| { c.imex_server_cert_auth = v.opt_string(); Ok(()) } },
    Key { name: "IMEX_CLIENT_KEY", set: |c, v| { c.imex_client_key = v.opt_string(); Ok(()) } },
    Key { name: "IMEX_CLIENT_CERT", set: |c, v| { c.imex_client_cert = v.opt_string(); Ok(()) } },
    Key { name: "IMEX_CLIENT_CERT_AUTH", set: |c, v| { c.imex_client_cert_auth = v.opt_string(); Ok(()) } },
    Key { name: "IMEX_SECURITY_TARGET_OVERRIDE", set: |c, v| {
        c.imex_security_target_override = v.opt_string();
        Ok(())
    } },
    Key { name: "IMEX_GSS_SERVICE_NAME", set: |c, v| {
        c.imex_gss_service_name = v.opt_string().ok_or_else(|| {
            v.invalid("service name", "expected a Kerberos service name (default host)")
        })?;
        Ok(())
    } },
    Key { name: "IMEX_GSS_TIMEOUT_SEC", set: |c, v| { c.imex_gss_timeout_sec = v.minus_one_or_more()?; Ok(()) } },
    Key { name: "IMEX_GSS_RETRY_INTERVAL_SEC", set: |c, v| { c.imex_gss_retry_interval_sec = v.u64()?; Ok(()) } },
    Key { name: "IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC", set: |c, v| {
        c.imex_gss_sec_context_lifetime_sec = v.minus_one_or_more()?;
        Ok(())
    } },
    Key { name: "IMEX_GSS_SHUTDOWN_ON_FAILURE", set: |c, v| { c.imex_gss_shutdown_on_failure = v.bool()?; Ok(()) } },
    Key { name: CMD_ENABLED, set: |c, v| { c.imex_cmd_enabled = v.bool()?; Ok(()) } },
    Key { name: "IMEX_CMD_BIND_INTERFACE_IP", set: |c, v| { c.imex_cmd_bind_interface_ip = v.opt_ip()?; Ok(()) } },
    Key { name: "IMEX_CMD_PORT", set: |c, v| { c.imex_cmd_port = v.opt_port()?; Ok(()) } },
    Key { name: "IMEX_CMD_UNIX_DOMAIN_PATH", set: |c, v| { c.imex_cmd_unix_domain_path = v.opt_path(); Ok(()) } },
    Key { name: "IMEX_NODE_DISCONNECTED_GRACE_TIME", set: |c, v| {
        const EXPECTED: &str = "expected -1 (wait forever), 0 (clean up at once) or a number of seconds";
        c.imex_node_disconnected_grace_time = match v.int::<i64>("grace time", EXPECTED)? {
            -1 => GraceTime::Forever,
            n => GraceTime::Seconds(u64::try_from(n).map_err(|_| v.invalid("grace time", EXPECTED))?),
        };
        Ok(())
    } },
    Key { name: "IMEX_CONN_WAIT_TIMEOUT", set: |c, v| {
        c.imex_conn_wait_timeout = match v.raw {
            "" => None,
            _ => Some(v.int("timeout", "expected a number of seconds, or an empty value")?),
        };
        Ok(())
    } },
    Key { name: "OPENIMEX_DRIVER", set: |c, v| {
        c.driver = match v.raw {
            "" => DriverKind::Auto,
            raw => DriverKind::from_name(raw).ok_or_else(|| {
                v.invalid("driver", format!("expected one of {} (an empty value also means auto)", DriverKind::expected()))
            })?,
        };
        Ok(())
    } },
    Key { name: "OPENIMEX_DOMAIN_ID", set: |c, v| { c.domain_id = v.opt_string(); Ok(()) } },
    Key { name: "OPENIMEX_VERBOSE_LOG_BUFFER_KB", set: |c, v| {
        const EXPECTED: &str = "expected a size in KiB, 0 (no buffer) to 65536 (default 1024)";
        c.verbose_log_buffer_kb = v.int("size", EXPECTED)?;
        if c.verbose_log_buffer_kb > super::MAX_VERBOSE_LOG_BUFFER_KB {
            return Err(v.invalid("size", EXPECTED));
        }
        Ok(())
    } },
    Key { name: HEARTBEAT, set: |c, v| { c.heartbeat_interval_ms = v.positive_ms()?; Ok(()) } },
    Key { name: PEER_TIMEOUT, set: |c, v| { c.peer_timeout_ms = v.positive_ms()?; Ok(()) } },
    Key { name: RECONNECT_MIN, set: |c, v| { c.reconnect_min_ms = v.positive_ms()?; Ok(()) } },
    Key { name: RECONNECT_MAX, set: |c, v| { c.reconnect_max_ms = v.positive_ms()?; Ok(()) } },
    Key { name: "OPENIMEX_HOSTNAME", set: |c, v| { c.host_name = v.opt_string(); Ok(()) } },
    Key { name: "OPENIMEX_PEER_ANY_SOURCE", set: |c, v| { c.peer_any_source = v.bool()?; Ok(()) } },
    Key { name: "OPENIMEX_PERSIST_FILE", set: |c, v| {
        c.persist_file = v.opt_path().ok_or_else(|| v.invalid("path", "expected the path of the persist record".to_string()))?;
        Ok(())
    } },
    Key { name: "OPENIMEX_METRICS_ADDR", set: |c, v| { c.metrics_addr = v.opt_socket_addr()?; Ok(()) } },
    Key { name: "OPENIMEX_JOBS_DIR", set: |c, v| { c.jobs_dir = v.opt_path(); Ok(()) } },
    Key { name: "OPENIMEX_SYSLOG_SOCKET", set: |c, v| {
        c.syslog_socket = v.opt_path().ok_or_else(|| {
            v.invalid("path", "expected the path of the system logger's datagram socket (default /dev/log)")
        })?;
        Ok(())
    } },
    Key { name: "OPENIMEX_STATS_INTERVAL_SEC", set: |c, v| {
        c.stats_interval_sec = v.int("interval", "expected a number of seconds between records of the stats file, or 0 for no stats file (default 30)")?;
        Ok(())
    } },
    Key { name: "OPENIMEX_SIM_NODE_DIR", set: |c, v| { c.sim_node_dir = v.opt_path(); Ok(()) } },
    Key { name: "OPENIMEX_DRIVER_ROOT", set: |c, v| { c.driver_root = v.opt_path(); Ok(()) } },
];

/// The known key spelled exactly `name`.
pub(super) fn find(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// Every key the parser knows, in the order of its table (the configuration reference lists
/// them so: `crate::reference`).
pub(crate) fn names() -> Vec<&'static str> {
    KEYS.iter().map(|k| k.name).collect()
}

/// The keys accepted without effect (the configuration reference says so of them).
pub(crate) fn without_effect() -> Vec<&'static str> {
    NOT_SUPPORTED_YET.iter().map(|(name, _)| *name).collect()
}

/// Names of our own keys, for the "unknown OPENIMEX_ key" error.
pub(super) fn openimex_keys() -> Vec<&'static str> {
    KEYS.iter()
        .map(|k| k.name)
        .filter(|n| n.starts_with("OPENIMEX_"))
        .collect()
}

/// Whether a key's value in the first config matters, given the defaults in the second.
type Matters = fn(&Config, &Config) -> bool;

/// Keys openimex accepts but does not implement yet. A notice is given when the key is in the
/// file and the predicate says its value matters: it differs from the default *and* the
/// settings in force would use it. A key that would have no effect on NVIDIA's daemon either
/// gets no notice (NVIDIA's is silent about it, and stock files such as the Kubernetes DRA
/// driver's template set such keys). Remove an entry when the feature lands.
#[rustfmt::skip]
const NOT_SUPPORTED_YET: &[(&str, Matters)] = &[
    // The TLS keys are built (`cfg/tls.rs`); IMEX_ENABLE_AUTH_ENCRYPTION=1 with a GSSAPI mode
    // is refused at start (`Config::refuse_unbuilt_features`). The GSS keys act only in a
    // GSSAPI mode: with authentication off or SSL_TLS they have no effect on NVIDIA's daemon.
    ("IMEX_GSS_SERVICE_NAME", |c, d| gss_in_force(c) && c.imex_gss_service_name != d.imex_gss_service_name),
    ("IMEX_GSS_TIMEOUT_SEC", |c, d| gss_in_force(c) && c.imex_gss_timeout_sec != d.imex_gss_timeout_sec),
    ("IMEX_GSS_RETRY_INTERVAL_SEC", |c, d| gss_in_force(c) && c.imex_gss_retry_interval_sec != d.imex_gss_retry_interval_sec),
    ("IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC", |c, d| gss_in_force(c) && c.imex_gss_sec_context_lifetime_sec != d.imex_gss_sec_context_lifetime_sec),
    ("IMEX_GSS_SHUTDOWN_ON_FAILURE", |c, d| gss_in_force(c) && c.imex_gss_shutdown_on_failure != d.imex_gss_shutdown_on_failure),
];

/// Whether peers would authenticate with GSSAPI (`IMEX_ENABLE_AUTH_ENCRYPTION=1` with
/// `GSS_AUTH_ENCRYPT` or `GSS_AUTH_ONLY`): the only settings under which the `IMEX_GSS_*`
/// keys act.
fn gss_in_force(c: &Config) -> bool {
    c.imex_enable_auth_encryption
        && matches!(
            c.imex_auth_encryption_mode,
            Some(AuthMode::GssAuthEncrypt | AuthMode::GssAuthOnly)
        )
}

/// The "not supported yet" notices for `cfg`, per [`NOT_SUPPORTED_YET`].
pub(super) fn not_supported_yet(cfg: &Config, seen: &Seen<'_>, path: &Path) -> Vec<Notice> {
    let defaults = Config::default();
    NOT_SUPPORTED_YET
        .iter()
        .filter(|(_, matters)| matters(cfg, &defaults))
        .filter_map(|(key, _)| seen.get(key).map(|&(line, _)| (*key, line)))
        .map(|(key, line)| Notice {
            path: path.to_path_buf(),
            line,
            key: key.to_owned(),
            message: format!(
                "{key} is not supported yet by openimex; the value is accepted and ignored"
            ),
        })
        .collect()
}

/// Rules that involve several keys. Returns notices for values that are ignored.
pub(super) fn check_combinations(
    cfg: &Config,
    seen: &Seen<'_>,
    path: &Path,
) -> Result<Vec<Notice>> {
    if cfg.peer_timeout_ms <= cfg.heartbeat_interval_ms {
        return Err(order_error(
            path,
            seen,
            (HEARTBEAT, cfg.heartbeat_interval_ms),
            (PEER_TIMEOUT, cfg.peer_timeout_ms),
            true,
            "a peer is declared lost after this long without a heartbeat, so the timeout must \
             be greater than the heartbeat interval",
        ));
    }
    if cfg.reconnect_max_ms < cfg.reconnect_min_ms {
        return Err(order_error(
            path,
            seen,
            (RECONNECT_MIN, cfg.reconnect_min_ms),
            (RECONNECT_MAX, cfg.reconnect_max_ms),
            false,
            "the reconnect delay grows from the minimum to the maximum",
        ));
    }
    if cfg.imex_cmd_enabled
        && cfg.imex_cmd_port.is_none()
        && cfg.imex_cmd_unix_domain_path.is_none()
    {
        // Enabled is not the default, so the key is in the file.
        let (line, raw) = seen.get(CMD_ENABLED).copied().unwrap_or((0, "1"));
        return Err(ConfigError::Incomplete {
            path: path.to_path_buf(),
            line,
            key: CMD_ENABLED.to_owned(),
            value: raw.to_owned(),
            needs: "needs IMEX_CMD_PORT or IMEX_CMD_UNIX_DOMAIN_PATH: set one of them \
                    (e.g. IMEX_CMD_PORT=50005), or set IMEX_CMD_ENABLED=0"
                .to_owned(),
        });
    }
    if cfg.driver == DriverKind::Sim && cfg.sim_node_dir.is_none() {
        let (line, raw) = seen.get("OPENIMEX_DRIVER").copied().unwrap_or((0, "sim"));
        return Err(ConfigError::Incomplete {
            path: path.to_path_buf(),
            line,
            key: "OPENIMEX_DRIVER".to_owned(),
            value: raw.to_owned(),
            needs: "needs OPENIMEX_SIM_NODE_DIR: set it to the --node-dir of this node's \
                    `openimex-lab gpu` process"
                .to_owned(),
        });
    }
    check_auth(cfg, seen, path)
}

/// The error for `low` not being below `high` (strictly when `strict`). It goes to `high` if
/// that is in the file, else to `low` (one of them is, or the defaults would be wrong), and
/// names both values and where they come from.
fn order_error(
    path: &Path,
    seen: &Seen<'_>,
    (low, low_value): (&'static str, u64),
    (high, high_value): (&'static str, u64),
    strict: bool,
    why: &str,
) -> ConfigError {
    let origin = |key: &str| match seen.get(key) {
        Some((line, _)) => format!("line {line}"),
        None => "the default".to_owned(),
    };
    let (key, other, other_value, relation) = match seen.get(high) {
        Some(_) => (
            high,
            low,
            low_value,
            if strict { "more than" } else { "at least" },
        ),
        None => (
            low,
            high,
            high_value,
            if strict { "less than" } else { "at most" },
        ),
    };
    let (line, raw) = seen.get(key).copied().unwrap_or((0, ""));
    ConfigError::Invalid {
        path: path.to_path_buf(),
        line,
        key: key.to_owned(),
        value: raw.to_owned(),
        what: "value",
        expected: format!(
            "expected {relation} {other}={other_value} ({}): {why}",
            origin(other)
        ),
    }
}

/// `IMEX_AUTH_ENCRYPTION_MODE` and `IMEX_AUTH_SOURCE` must be valid when auth is on (NVIDIA:
/// "an empty or unexpected value will prevent initialization"); when it is off, an unknown
/// value is only a notice.
fn check_auth(cfg: &Config, seen: &Seen<'_>, path: &Path) -> Result<Vec<Notice>> {
    let mode_expected = format!("expected one of {}", AuthMode::expected());
    let source_expected = format!("expected one of {}", AuthSource::expected());
    let mode_bad = seen
        .get(AUTH_MODE)
        .filter(|_| cfg.imex_auth_encryption_mode.is_none())
        .copied();
    let source_bad = seen
        .get(AUTH_SOURCE)
        .filter(|(_, raw)| cfg.imex_auth_source.is_none() && !raw.is_empty())
        .copied();
    let invalid =
        |key: &'static str, (line, raw): (usize, &str), expected: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            line,
            key: key.to_owned(),
            value: raw.to_owned(),
            what: "value",
            expected,
        };

    if !cfg.imex_enable_auth_encryption {
        let ignored = [
            (AUTH_MODE, mode_bad, mode_expected),
            (AUTH_SOURCE, source_bad, source_expected),
        ];
        return Ok(ignored
            .into_iter()
            .filter_map(|(key, bad, expected)| {
                let (line, raw) = bad.filter(|(_, raw)| !raw.is_empty())?;
                Some(Notice {
                    path: path.to_path_buf(),
                    line,
                    key: key.to_owned(),
                    message: format!(
                        "{key}={} is not a known value ({expected}); ignored because \
                         IMEX_ENABLE_AUTH_ENCRYPTION is 0",
                        Quoted(raw)
                    ),
                })
            })
            .collect());
    }

    let enable_line = seen.get(AUTH_ENABLE).map_or(0, |&(line, _)| line);
    let because = format!("required because IMEX_ENABLE_AUTH_ENCRYPTION=1 at line {enable_line}");
    if let Some(bad) = mode_bad {
        return Err(invalid(
            AUTH_MODE,
            bad,
            format!("{mode_expected} ({because})"),
        ));
    }
    if cfg.imex_auth_encryption_mode == Some(AuthMode::SslTls) && cfg.imex_auth_source.is_none() {
        return Err(match seen.get(AUTH_SOURCE) {
            Some(&bad) => invalid(
                AUTH_SOURCE,
                bad,
                format!("{source_expected} ({because} with IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS)"),
            ),
            None => ConfigError::Incomplete {
                path: path.to_path_buf(),
                line: enable_line,
                key: AUTH_ENABLE.to_owned(),
                value: "1".to_owned(),
                needs: format!(
                    "with IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS needs IMEX_AUTH_SOURCE: set it to one \
                     of {}, or set IMEX_ENABLE_AUTH_ENCRYPTION=0",
                    AuthSource::expected()
                ),
            },
        });
    }
    Ok(Vec::new())
}
