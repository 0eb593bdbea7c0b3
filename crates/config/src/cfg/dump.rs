//! The configuration dump the daemon logs at start (docs/reference/imex-guide.md §9), one `label = value` entry
//! per option: NVIDIA's labels for the options its dump is known to show, in its order, then
//! the other keys under their own names. `ctl -d` prints the same entries.

use std::path::Path;

use super::{Config, GraceTime};

/// The options of `cfg`, as `(label, value)` in dump order.
pub fn dump(cfg: &Config) -> Vec<(String, String)> {
    let path = |p: Option<&Path>| p.map(|p| p.display().to_string()).unwrap_or_default();
    let opt = |v: Option<String>| v.unwrap_or_default();
    let flag = |b: bool| u8::from(b).to_string();
    let entries: Vec<(&str, String)> = vec![
        // NVIDIA's labels, as its 570 daemon writes them (§9).
        ("Logging level", cfg.log_level.to_string()),
        ("Logging file name/path", path(cfg.log_file_name.as_deref())),
        ("Append to log file", flag(cfg.log_append_to_log)),
        (
            "Max Log file size",
            format!("{} (MBs)", cfg.log_file_max_size_mb),
        ),
        ("Use Syslog file", flag(cfg.log_use_syslog)),
        (
            "IMEX Library communication bind interface",
            opt(cfg.bind_interface_ip.map(|ip| ip.to_string())),
        ),
        (
            "IMEX library communication bind port",
            cfg.server_port.to_string(),
        ),
        // The rest under their key names.
        ("STATS_FILE_NAME", path(cfg.stats_file_name.as_deref())),
        ("LOG_MAX_ROTATE_COUNT", cfg.log_max_rotate_count.to_string()),
        ("DAEMONIZE", flag(cfg.daemonize)),
        (
            "IMEX_NODE_CONFIG_FILE",
            cfg.imex_node_config_file.display().to_string(),
        ),
        ("NETWORK_INTERFACE", opt(cfg.network_interface.clone())),
        ("IMEX_WAIT_FOR_QUORUM", cfg.imex_wait_for_quorum.to_string()),
        (
            "IMEX_CONN_WAIT_TIMEOUT",
            opt(cfg.imex_conn_wait_timeout.map(|s| s.to_string())),
        ),
        (
            "IMEX_ENABLE_AUTH_ENCRYPTION",
            flag(cfg.imex_enable_auth_encryption),
        ),
        ("IMEX_CMD_ENABLED", flag(cfg.imex_cmd_enabled)),
        (
            "IMEX_CMD_BIND_INTERFACE_IP",
            opt(cfg.imex_cmd_bind_interface_ip.map(|ip| ip.to_string())),
        ),
        (
            "IMEX_CMD_PORT",
            opt(cfg.imex_cmd_port.map(|p| p.to_string())),
        ),
        (
            "IMEX_CMD_UNIX_DOMAIN_PATH",
            path(cfg.imex_cmd_unix_domain_path.as_deref()),
        ),
        (
            "IMEX_NODE_DISCONNECTED_GRACE_TIME",
            match cfg.imex_node_disconnected_grace_time {
                GraceTime::Forever => "-1".to_owned(),
                GraceTime::Seconds(s) => s.to_string(),
            },
        ),
        ("OPENIMEX_DRIVER", cfg.driver.as_str().to_owned()),
        ("OPENIMEX_DOMAIN_ID", opt(cfg.domain_id.clone())),
        (
            "OPENIMEX_HEARTBEAT_INTERVAL_MS",
            cfg.heartbeat_interval_ms.to_string(),
        ),
        ("OPENIMEX_PEER_TIMEOUT_MS", cfg.peer_timeout_ms.to_string()),
        (
            "OPENIMEX_RECONNECT_MIN_MS",
            cfg.reconnect_min_ms.to_string(),
        ),
        (
            "OPENIMEX_RECONNECT_MAX_MS",
            cfg.reconnect_max_ms.to_string(),
        ),
        ("OPENIMEX_PEER_ANY_SOURCE", flag(cfg.peer_any_source)),
        (
            "OPENIMEX_PERSIST_FILE",
            cfg.persist_file.display().to_string(),
        ),
        (
            "OPENIMEX_METRICS_ADDR",
            opt(cfg.metrics_addr.map(|a| a.to_string())),
        ),
        (
            "OPENIMEX_JOBS_DIR",
            opt(cfg.jobs_dir.as_ref().map(|d| d.display().to_string())),
        ),
        (
            "OPENIMEX_VERBOSE_LOG_BUFFER_KB",
            cfg.verbose_log_buffer_kb.to_string(),
        ),
    ];
    entries
        .into_iter()
        .map(|(label, value)| (label.to_owned(), value))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_labels_first_then_keys_with_the_values_in_effect() {
        let c = Config::parse(
            "SERVER_PORT=50123\nNETWORK_INTERFACE=eth1\nIMEX_CONN_WAIT_TIMEOUT=70\n",
            Path::new("cfg"),
        )
        .unwrap();
        let d = dump(&c);
        assert_eq!(d[0], ("Logging level".to_owned(), "4".to_owned()));
        assert_eq!(
            d[6],
            (
                "IMEX library communication bind port".to_owned(),
                "50123".to_owned()
            )
        );
        let get = |k: &str| d.iter().find(|(l, _)| l == k).map(|(_, v)| v.as_str());
        assert_eq!(get("NETWORK_INTERFACE"), Some("eth1"));
        assert_eq!(get("IMEX_CONN_WAIT_TIMEOUT"), Some("70"));
        assert_eq!(get("IMEX_WAIT_FOR_QUORUM"), Some("RECOVERY"));
        assert_eq!(get("IMEX_NODE_DISCONNECTED_GRACE_TIME"), Some("-1"));
    }
}
