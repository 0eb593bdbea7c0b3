//! Tests of `config.cfg` parsing: defaults, NVIDIA's shipped layout, every error kind, notices.

use super::*;
use std::net::Ipv4Addr;

const NVIDIA_CFG: &str = include_str!("../../testdata/nvidia-config.cfg");
/// The Kubernetes DRA driver's stock template's keys (issue 32).
const DRA_CFG: &str = include_str!("../../testdata/dra-compute-domain-daemon.cfg");

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("cfg"))
}

fn err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

fn notice_keys(cfg: &Config) -> Vec<(usize, &str)> {
    cfg.notices()
        .iter()
        .map(|n| (n.line, n.key.as_str()))
        .collect()
}

/// Authentication keys and the notices: what warns, and what stays quiet.
mod notices;

#[test]
fn empty_file_gives_every_default() {
    for text in ["", "\n\n# only comments\n   \n\t# indented\n"] {
        let c = parse(text).unwrap();
        assert_eq!(c.log_level, 4);
        assert_eq!(
            c.log_file_name,
            Some(PathBuf::from("/var/log/nvidia-imex.log"))
        );
        assert_eq!(
            c.stats_file_name,
            Some(PathBuf::from("/var/log/nvidia-imex-stats.log"))
        );
        assert!(c.log_append_to_log);
        assert_eq!(c.log_file_max_size_mb, 1024);
        assert_eq!(c.log_max_rotate_count, 0);
        assert!(!c.log_use_syslog);
        assert!(c.daemonize);
        assert_eq!(c.bind_interface_ip, None);
        assert_eq!(c.server_port, 50000);
        assert_eq!(
            c.imex_node_config_file,
            PathBuf::from("/etc/nvidia-imex/nodes_config.cfg")
        );
        assert_eq!(c.network_interface, None);
        assert_eq!(c.imex_wait_for_quorum, Quorum::Recovery);
        assert!(!c.imex_enable_auth_encryption);
        assert_eq!(c.imex_auth_encryption_mode, Some(AuthMode::SslTls));
        assert_eq!(c.imex_auth_source, None);
        assert_eq!(c.imex_server_key, None);
        assert_eq!(c.imex_server_cert, None);
        assert_eq!(c.imex_server_cert_auth, None);
        assert_eq!(c.imex_client_key, None);
        assert_eq!(c.imex_client_cert, None);
        assert_eq!(c.imex_client_cert_auth, None);
        assert_eq!(c.imex_security_target_override, None);
        assert_eq!(c.imex_gss_service_name, "host");
        assert_eq!(c.imex_gss_timeout_sec, -1);
        assert_eq!(c.imex_gss_retry_interval_sec, 5);
        assert_eq!(c.imex_gss_sec_context_lifetime_sec, -1);
        assert!(c.imex_gss_shutdown_on_failure);
        assert!(!c.imex_cmd_enabled);
        assert_eq!(c.imex_cmd_bind_interface_ip, None);
        assert_eq!(c.imex_cmd_port, None);
        assert_eq!(c.imex_cmd_unix_domain_path, None);
        assert_eq!(c.imex_node_disconnected_grace_time, GraceTime::Forever);
        assert_eq!(c.imex_conn_wait_timeout, None);
        assert_eq!(c.driver, DriverKind::Auto);
        assert_eq!(c.domain_id, None);
        assert_eq!(c.heartbeat_interval_ms, 1000);
        assert_eq!(c.peer_timeout_ms, 5000);
        assert_eq!(c.reconnect_min_ms, 250);
        assert_eq!(c.reconnect_max_ms, 5000);
        assert_eq!(c.host_name, None);
        assert!(c.notices().is_empty());
        assert_eq!(
            c.node_config_file_origin,
            Some((PathBuf::from("cfg"), None))
        );
        assert_eq!(
            Config {
                node_config_file_origin: None,
                ..c
            },
            Config::default()
        );
    }
}

#[test]
fn nvidia_shipped_layout_parses() {
    let c = Config::parse(NVIDIA_CFG, Path::new("/etc/nvidia-imex/config.cfg")).unwrap();
    let want = Config {
        log_max_rotate_count: 3,
        imex_cmd_enabled: true,
        imex_cmd_port: Some(50005),
        imex_conn_wait_timeout: Some(70),
        notices: c.notices.clone(),
        node_config_file_origin: c.node_config_file_origin.clone(),
        ..Config::default()
    };
    assert_eq!(c, want);
    // The log keys, NETWORK_INTERFACE and IMEX_CONN_WAIT_TIMEOUT=70 are implemented.
    assert_eq!(notice_keys(&c), []);
}

#[test]
fn dra_style_values() {
    let text = "LOG_FILE_NAME=\nSTATS_FILE_NAME=\nDAEMONIZE=0\nIMEX_CMD_ENABLED=1\n\
                IMEX_CMD_BIND_INTERFACE_IP=10.1.2.3\nIMEX_CMD_UNIX_DOMAIN_PATH=/var/run/imex.sock\n\
                IMEX_WAIT_FOR_QUORUM=NONE\nIMEX_NODE_DISCONNECTED_GRACE_TIME=30\n\
                BIND_INTERFACE_IP=fd00::5\n";
    let c = parse(text).unwrap();
    assert_eq!(c.log_file_name, None);
    assert_eq!(c.stats_file_name, None);
    assert!(!c.daemonize);
    assert_eq!(
        c.imex_cmd_bind_interface_ip,
        Some(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)))
    );
    assert_eq!(c.imex_cmd_port, None);
    assert_eq!(
        c.imex_cmd_unix_domain_path,
        Some(PathBuf::from("/var/run/imex.sock"))
    );
    assert_eq!(c.imex_wait_for_quorum, Quorum::None);
    assert_eq!(c.imex_node_disconnected_grace_time, GraceTime::Seconds(30));
    assert_eq!(c.bind_interface_ip, Some("fd00::5".parse().unwrap()));
    // The empty stats file (stderr) and the grace time are implemented: no notice.
    assert!(c.notices().is_empty(), "{:?}", c.notices());
}

#[test]
fn openimex_keys() {
    let text = "OPENIMEX_DRIVER=sim\nOPENIMEX_DOMAIN_ID=dom-1\nOPENIMEX_HEARTBEAT_INTERVAL_MS=200\n\
                OPENIMEX_PEER_TIMEOUT_MS=1000\nOPENIMEX_RECONNECT_MIN_MS=10\n\
                OPENIMEX_RECONNECT_MAX_MS=10\nOPENIMEX_HOSTNAME=tray-7\nOPENIMEX_SIM_NODE_DIR=/n0\n";
    let c = parse(text).unwrap();
    assert_eq!(c.driver, DriverKind::Sim);
    assert_eq!(c.domain_id.as_deref(), Some("dom-1"));
    assert_eq!((c.heartbeat_interval_ms, c.peer_timeout_ms), (200, 1000));
    assert_eq!((c.reconnect_min_ms, c.reconnect_max_ms), (10, 10));
    assert_eq!(c.host_name.as_deref(), Some("tray-7"));
    assert!(c.notices().is_empty());
    for (value, kind) in [
        ("nogpu", DriverKind::NoGpu),
        ("nvidia", DriverKind::Nvidia),
        ("", DriverKind::Auto),
    ] {
        assert_eq!(
            parse(&format!("OPENIMEX_DRIVER={value}")).unwrap().driver,
            kind
        );
    }
    assert_eq!(
        parse("OPENIMEX_DRIVER=auto").unwrap().driver,
        DriverKind::Auto
    );
    assert!(
        !c.peer_any_source,
        "peers must say hello from their own address by default"
    );
    assert!(parse("OPENIMEX_PEER_ANY_SOURCE=1").unwrap().peer_any_source);
    assert_eq!(
        c.persist_file,
        PathBuf::from("/var/run/nvidia-imex/persist.dat"),
        "NVIDIA's path by default"
    );
    assert_eq!(
        parse("OPENIMEX_PERSIST_FILE=/run/n0/persist.dat")
            .unwrap()
            .persist_file,
        PathBuf::from("/run/n0/persist.dat")
    );
    assert_eq!(c.metrics_addr, None, "no metrics unless asked");
    assert_eq!(
        parse("OPENIMEX_METRICS_ADDR=127.0.0.1:9464")
            .unwrap()
            .metrics_addr,
        Some(std::net::SocketAddr::from(([127, 0, 0, 1], 9464)))
    );
    let e = parse("#\nOPENIMEX_METRICS_ADDR=localhost")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("cfg:2: OPENIMEX_METRICS_ADDR=\"localhost\"") && e.contains("127.0.0.1:9464"),
        "{e}"
    );
    let e = parse("OPENIMEX_PEER_ANY_SOURCE=yes")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("OPENIMEX_PEER_ANY_SOURCE") && e.contains("0 or 1"),
        "{e}"
    );
}

#[test]
fn whitespace_and_equals_in_values() {
    let c = parse("  SERVER_PORT =  123  \r\nLOG_FILE_NAME = /tmp/a=b #c\n").unwrap();
    assert_eq!(c.server_port, 123);
    assert_eq!(c.log_file_name, Some(PathBuf::from("/tmp/a=b #c")));
    let c = Config::parse("\u{feff}SERVER_PORT=1\n", Path::new("cfg")).unwrap();
    assert_eq!(c.server_port, 1);
}

#[test]
fn relative_nodes_file_is_resolved_against_config_dir() {
    let c = Config::parse(
        "IMEX_NODE_CONFIG_FILE=nodes.cfg",
        Path::new("/etc/openimex/config.cfg"),
    )
    .unwrap();
    assert_eq!(
        c.imex_node_config_file,
        PathBuf::from("/etc/openimex/nodes.cfg")
    );
    let c = Config::parse(
        "IMEX_NODE_CONFIG_FILE=/abs/n.cfg",
        Path::new("/etc/x/config.cfg"),
    )
    .unwrap();
    assert_eq!(c.imex_node_config_file, PathBuf::from("/abs/n.cfg"));
}

#[test]
fn bad_port() {
    let mut text = "# c\n".repeat(11);
    text.push_str("SERVER_PORT=70000\n");
    let e = Config::parse(&text, Path::new("/etc/nvidia-imex/config.cfg")).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "/etc/nvidia-imex/config.cfg:12: SERVER_PORT=\"70000\" is not a valid port: \
             {SERVER_PORT_EXPECTED}"
        )
    );
    assert!(matches!(e, ConfigError::Invalid { line: 12, .. }));
    assert_eq!(
        err("\nSERVER_PORT=abc"),
        format!("cfg:2: SERVER_PORT=\"abc\" is not a valid port: {SERVER_PORT_EXPECTED}")
    );
    assert_eq!(
        err("SERVER_PORT="),
        format!("cfg:1: SERVER_PORT=\"\" is not a valid port: {SERVER_PORT_EXPECTED}")
    );
    assert!(err("IMEX_CMD_ENABLED=1\nIMEX_CMD_PORT=-1").starts_with("cfg:2: IMEX_CMD_PORT=\"-1\""));
}

const SERVER_PORT_EXPECTED: &str = "expected an integer 1-65535: every daemon dials its peers \
     on this port, so it must be a fixed port, the same in every node's config (NVIDIA's \
     default is 50000)";

/// Port 0 would let the OS pick a port no peer can know: refused with file:line and the fix.
#[test]
fn server_port_zero_is_refused() {
    let e = parse("# peers\nSERVER_PORT=0\n").unwrap_err();
    assert!(matches!(e, ConfigError::Invalid { line: 2, .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("cfg:2: SERVER_PORT=\"0\" is not a valid port: {SERVER_PORT_EXPECTED}")
    );
    assert_eq!(parse("SERVER_PORT=1").unwrap().server_port, 1);
    assert_eq!(parse("SERVER_PORT=65535").unwrap().server_port, 65535);
    // The command port is dialled by ctl from the same config, not by peers: 0 stays allowed.
    let c = parse("IMEX_CMD_ENABLED=1\nIMEX_CMD_PORT=0\n").unwrap();
    assert_eq!(c.imex_cmd_port, Some(0));
}

/// A 10 MB line, key or value is echoed cut to `ECHO_MAX` characters with `…` and its full
/// length, keeping file:line and the fix.
#[test]
fn huge_lines_are_cut_in_errors_and_notices() {
    const BIG: usize = 10 << 20;
    let huge = "x".repeat(BIG);
    let cut = format!(
        "\"{}…\" ({BIG} characters)",
        &huge[..crate::error::ECHO_MAX]
    );

    let msg = err(&format!("# c\n{huge}\n"));
    assert_eq!(
        msg,
        format!(
            "cfg:2: line {cut} is not KEY=value: write KEY=value or start the line with # for a \
             comment"
        )
    );

    let value = "9".repeat(BIG);
    let msg = err(&format!("SERVER_PORT={value}"));
    assert!(
        msg.starts_with("cfg:1: SERVER_PORT=\"999"),
        "{}",
        &msg[..200]
    );
    assert!(msg.len() < 600, "{} bytes: {}", msg.len(), &msg[..600]);
    assert!(
        msg.contains(&format!(
            "…\" ({BIG} characters) is not a valid port: expected"
        )),
        "{msg}"
    );

    let msg = err(&format!("OPENIMEX_{huge}=1"));
    assert!(
        msg.starts_with("cfg:1: unknown key OPENIMEX_xxx"),
        "{}",
        &msg[..200]
    );
    assert!(
        msg.contains(&format!("… ({} characters): keys starting", BIG + 9)),
        "{msg}"
    );
    assert!(msg.len() < 1000, "{} bytes", msg.len());

    let c = parse(&format!("{huge}=1\n")).unwrap();
    let notice = c.notices()[0].to_string();
    assert!(notice.len() < 300, "{} bytes", notice.len());
    assert!(
        notice.ends_with(&format!("… ({BIG} characters) ignored")),
        "{notice}"
    );

    let c = parse(&format!("IMEX_AUTH_SOURCE={huge}\n")).unwrap();
    let notice = c.notices()[0].to_string();
    assert!(notice.contains(&cut), "{notice}");
    assert!(notice.len() < 400, "{} bytes", notice.len());
}

/// Control characters in an echoed value are escaped, not written to the terminal or log.
#[test]
fn control_characters_are_escaped_in_errors() {
    assert_eq!(
        err("DAEMONIZE=\u{1b}[2J\u{7}"),
        "cfg:1: DAEMONIZE=\"\\u{1b}[2J\\u{7}\" is not a valid boolean: expected 0 or 1"
    );
}

#[test]
fn bad_bool() {
    assert_eq!(
        err("DAEMONIZE=yes"),
        "cfg:1: DAEMONIZE=\"yes\" is not a valid boolean: expected 0 or 1"
    );
    assert!(err("\n\nLOG_USE_SYSLOG=true").starts_with("cfg:3: LOG_USE_SYSLOG=\"true\""));
}

#[test]
fn bad_quorum() {
    assert_eq!(
        err("#\n\nIMEX_WAIT_FOR_QUORUM=SOMETIMES"),
        "cfg:3: IMEX_WAIT_FOR_QUORUM=\"SOMETIMES\" is not a valid value: expected one of NONE, \
         RECOVERY, FULL"
    );
    assert!(err("IMEX_WAIT_FOR_QUORUM=recovery").contains("\"recovery\""));
    assert_eq!(
        parse("IMEX_WAIT_FOR_QUORUM=FULL")
            .unwrap()
            .imex_wait_for_quorum,
        Quorum::Full
    );
}

#[test]
fn line_without_equals() {
    let text = "LOG_LEVEL=4\n".repeat(6) + "BLAH\n";
    assert_eq!(
        err(&text),
        "cfg:7: line \"BLAH\" is not KEY=value: write KEY=value or start the line with # for a \
         comment"
    );
    assert_eq!(
        err("=5"),
        "cfg:1: line \"=5\" has no key before '=': write KEY=value or start the line with # for \
         a comment"
    );
}

#[test]
fn unknown_openimex_key_is_an_error() {
    let msg = err("LOG_LEVEL=3\nOPENIMEX_HEARTBEAT_MS=100");
    assert!(
        msg.starts_with("cfg:2: unknown key OPENIMEX_HEARTBEAT_MS: keys starting with OPENIMEX_")
    );
    assert!(msg.contains("OPENIMEX_HEARTBEAT_INTERVAL_MS"), "{msg}");
    assert!(err("openimex_drvier=sim").starts_with("cfg:1: unknown key openimex_drvier"));
}

#[test]
fn cmd_enabled_needs_an_endpoint() {
    assert_eq!(
        err("IMEX_CMD_PORT=\nIMEX_CMD_ENABLED=1\nIMEX_CMD_UNIX_DOMAIN_PATH="),
        "cfg:2: IMEX_CMD_ENABLED=1 needs IMEX_CMD_PORT or IMEX_CMD_UNIX_DOMAIN_PATH: set one of \
         them (e.g. IMEX_CMD_PORT=50005), or set IMEX_CMD_ENABLED=0"
    );
    assert!(parse("IMEX_CMD_ENABLED=0").is_ok());
    assert!(parse("IMEX_CMD_ENABLED=1\nIMEX_CMD_UNIX_DOMAIN_PATH=/run/x.sock").is_ok());
}

#[test]
fn peer_timeout_must_exceed_heartbeat() {
    assert_eq!(
        err("OPENIMEX_HEARTBEAT_INTERVAL_MS=1000\nOPENIMEX_PEER_TIMEOUT_MS=1000"),
        "cfg:2: OPENIMEX_PEER_TIMEOUT_MS=\"1000\" is not a valid value: expected more than \
         OPENIMEX_HEARTBEAT_INTERVAL_MS=1000 (line 1): a peer is declared lost after this long \
         without a heartbeat, so the timeout must be greater than the heartbeat interval"
    );
    let msg = err("#\nOPENIMEX_HEARTBEAT_INTERVAL_MS=6000");
    assert!(
        msg.starts_with(
            "cfg:2: OPENIMEX_HEARTBEAT_INTERVAL_MS=\"6000\" is not a valid value: expected less \
             than OPENIMEX_PEER_TIMEOUT_MS=5000 (the default)"
        ),
        "{msg}"
    );
    assert!(err("OPENIMEX_HEARTBEAT_INTERVAL_MS=0").contains("greater than 0"));
}

#[test]
fn reconnect_bounds() {
    let msg = err("OPENIMEX_RECONNECT_MIN_MS=100\nOPENIMEX_RECONNECT_MAX_MS=50");
    assert!(
        msg.starts_with("cfg:2: OPENIMEX_RECONNECT_MAX_MS=\"50\""),
        "{msg}"
    );
    assert!(
        msg.contains("expected at least OPENIMEX_RECONNECT_MIN_MS=100 (line 1)"),
        "{msg}"
    );
    let msg = err("OPENIMEX_RECONNECT_MIN_MS=9000");
    assert!(
        msg.contains("expected at most OPENIMEX_RECONNECT_MAX_MS=5000 (the default)"),
        "{msg}"
    );
    assert!(
        err("OPENIMEX_RECONNECT_MIN_MS=0").starts_with("cfg:1: OPENIMEX_RECONNECT_MIN_MS=\"0\"")
    );
}

#[test]
fn other_value_errors() {
    let cases = [
        (
            "LOG_LEVEL=5",
            "LOG_LEVEL=\"5\" is not a valid log level: expected an integer 0-4",
        ),
        ("LOG_LEVEL=-1", "LOG_LEVEL=\"-1\" is not a valid log level"),
        (
            "IMEX_NODE_DISCONNECTED_GRACE_TIME=-2",
            "expected -1 (wait forever), 0 (clean up at once)",
        ),
        (
            "IMEX_NODE_DISCONNECTED_GRACE_TIME=",
            "is not a valid grace time",
        ),
        ("IMEX_GSS_TIMEOUT_SEC=-5", "expected -1 or an integer >= 0"),
        (
            "IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC=x",
            "expected -1 or an integer >= 0",
        ),
        (
            "IMEX_GSS_RETRY_INTERVAL_SEC=-1",
            "expected a non-negative integer",
        ),
        (
            "BIND_INTERFACE_IP=10.0.0.1:50000",
            "is not a valid IP address",
        ),
        (
            "IMEX_CMD_BIND_INTERFACE_IP=eth0",
            "is not a valid IP address",
        ),
        (
            "IMEX_NODE_CONFIG_FILE=",
            "expected the path of the nodes file",
        ),
        ("IMEX_GSS_SERVICE_NAME=", "expected a Kerberos service name"),
        (
            "IMEX_CONN_WAIT_TIMEOUT=soon",
            "expected a number of seconds",
        ),
        (
            "OPENIMEX_DRIVER=cuda",
            "OPENIMEX_DRIVER=\"cuda\" is not a valid driver: expected one of",
        ),
        ("LOG_FILE_MAX_SIZE=1G", "expected a size in MB"),
    ];
    for (text, want) in cases {
        let msg = err(text);
        assert!(msg.starts_with("cfg:1: "), "{msg}");
        assert!(msg.contains(want), "{text}: {msg}");
    }
    assert_eq!(
        parse("IMEX_NODE_DISCONNECTED_GRACE_TIME=0")
            .unwrap()
            .imex_node_disconnected_grace_time,
        GraceTime::Seconds(0)
    );
}

#[test]
fn load_reads_and_reports_missing_files() {
    let e = Config::load(Path::new("/nonexistent/openimex/config.cfg")).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("failed to read config file /nonexistent/openimex/config.cfg: "));
    assert!(matches!(e, ConfigError::Io { .. }));

    let dir = std::env::temp_dir().join(format!("openimex-config-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.cfg");
    std::fs::write(&path, "SERVER_PORT=4242\nIMEX_NODE_CONFIG_FILE=nodes.cfg\n").unwrap();
    let c = Config::load(&path);
    std::fs::remove_dir_all(&dir).unwrap();
    let c = c.unwrap();
    assert_eq!(c.server_port, 4242);
    assert_eq!(c.imex_node_config_file, dir.join("nodes.cfg"));
}

#[test]
fn enum_spellings_round_trip() {
    for q in Quorum::ALL {
        assert_eq!(Quorum::from_name(&q.to_string()), Some(*q));
    }
    for m in AuthMode::ALL {
        assert_eq!(AuthMode::from_name(m.as_str()), Some(*m));
    }
    for s in AuthSource::ALL {
        assert_eq!(AuthSource::from_name(s.as_str()), Some(*s));
    }
    assert_eq!(GraceTime::Forever.to_string(), "-1");
    assert_eq!(GraceTime::Seconds(9).to_string(), "9");
}

#[test]
fn unreadable_nodes_file_error_points_at_the_config_line() {
    let text = "LOG_LEVEL=4\nIMEX_NODE_CONFIG_FILE=/nonexistent/openimex/nodes.cfg\n";
    let c = Config::parse(text, Path::new("/etc/x/config.cfg")).unwrap();
    let msg = c.load_nodes().unwrap_err().to_string();
    assert!(msg.starts_with("/etc/x/config.cfg:2: IMEX_NODE_CONFIG_FILE: Failed to read node configuration file /nonexistent/openimex/nodes.cfg"), "{msg}");
    let c = Config::parse("", Path::new("/etc/x/config.cfg")).unwrap();
    let msg = c.load_nodes().unwrap_err().to_string();
    assert!(
        msg.contains("IMEX_NODE_CONFIG_FILE is not set, so the default applies"),
        "{msg}"
    );
}

#[test]
fn sim_driver_needs_its_node_dir() {
    let msg = err("OPENIMEX_DRIVER=sim\n");
    assert!(
        msg.starts_with("cfg:1: OPENIMEX_DRIVER=sim needs OPENIMEX_SIM_NODE_DIR"),
        "{msg}"
    );
    let c = parse("OPENIMEX_DRIVER=sim\nOPENIMEX_SIM_NODE_DIR=/run/openimex/node0\n").unwrap();
    assert_eq!(c.driver, DriverKind::Sim);
    assert_eq!(c.sim_node_dir, Some(PathBuf::from("/run/openimex/node0")));
}

#[test]
fn the_driver_root_is_a_path_and_empty_means_the_default() {
    assert_eq!(parse("").unwrap().driver_root, None);
    assert_eq!(parse("OPENIMEX_DRIVER_ROOT=\n").unwrap().driver_root, None);
    let c = parse("OPENIMEX_DRIVER=nvidia\nOPENIMEX_DRIVER_ROOT=/run/nvidia/driver\n").unwrap();
    assert_eq!(c.driver, DriverKind::Nvidia);
    assert_eq!(c.driver_root, Some(PathBuf::from("/run/nvidia/driver")));
}

#[test]
fn verbose_log_buffer_size() {
    assert_eq!(
        parse("").unwrap().verbose_log_buffer_kb,
        DEFAULT_VERBOSE_LOG_BUFFER_KB
    );
    assert_eq!(DEFAULT_VERBOSE_LOG_BUFFER_KB, 1024);
    for (raw, kb) in [("0", 0), ("1", 1), ("65536", MAX_VERBOSE_LOG_BUFFER_KB)] {
        let c = parse(&format!("OPENIMEX_VERBOSE_LOG_BUFFER_KB={raw}")).unwrap();
        assert_eq!(c.verbose_log_buffer_kb, kb);
        assert!(c.notices().is_empty());
    }
    for raw in ["65537", "-1", "1M", ""] {
        let e = err(&format!("OPENIMEX_VERBOSE_LOG_BUFFER_KB={raw}"));
        assert!(
            e.contains("cfg:1") && e.contains("OPENIMEX_VERBOSE_LOG_BUFFER_KB"),
            "{e}"
        );
        assert!(e.contains("KiB") && e.contains("65536"), "{e}");
    }
}

#[test]
fn log_keys_are_implemented_and_take_their_values() {
    let c = parse(
        "LOG_FILE_MAX_SIZE=1\nLOG_MAX_ROTATE_COUNT=3\nLOG_USE_SYSLOG=1\n\
         OPENIMEX_SYSLOG_SOCKET=/run/test/log.sock\n",
    )
    .unwrap();
    assert!(c.notices().is_empty(), "{:?}", c.notices());
    assert_eq!(c.log_file_max_size_mb, 1);
    assert_eq!(c.log_max_rotate_count, 3);
    assert!(c.log_use_syslog);
    assert_eq!(c.syslog_socket, PathBuf::from("/run/test/log.sock"));
    assert_eq!(
        parse("").unwrap().syslog_socket,
        PathBuf::from(DEFAULT_SYSLOG_SOCKET)
    );
    let e = err("LOG_LEVEL=4\nOPENIMEX_SYSLOG_SOCKET=");
    assert!(
        e.starts_with("cfg:2: OPENIMEX_SYSLOG_SOCKET") && e.contains("/dev/log"),
        "{e}"
    );
    let e = err("LOG_MAX_ROTATE_COUNT=-1");
    assert!(e.contains("cfg:1") && e.contains("rotated files"), "{e}");
}

#[test]
fn stats_file_and_interval() {
    let c = parse("").unwrap();
    assert_eq!(c.stats_interval_sec, DEFAULT_STATS_INTERVAL_SEC);
    assert_eq!(DEFAULT_STATS_INTERVAL_SEC, 30, "NVIDIA's sample interval");
    let c = parse("STATS_FILE_NAME=/tmp/s.log\nOPENIMEX_STATS_INTERVAL_SEC=0\n").unwrap();
    assert_eq!(c.stats_file_name, Some(PathBuf::from("/tmp/s.log")));
    assert_eq!(c.stats_interval_sec, 0, "0 turns the stats file off");
    assert!(
        c.notices().is_empty(),
        "implemented: no notice {:?}",
        c.notices()
    );
    for raw in ["-1", "30s", ""] {
        let e = err(&format!("OPENIMEX_STATS_INTERVAL_SEC={raw}"));
        assert!(
            e.contains("cfg:1") && e.contains("OPENIMEX_STATS_INTERVAL_SEC"),
            "{e}"
        );
        assert!(
            e.contains("seconds") && e.contains("0 for no stats file"),
            "{e}"
        );
    }
}
