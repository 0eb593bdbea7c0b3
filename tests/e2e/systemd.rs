//! systemd integration (issue 9, item 5): a real daemon started with `NOTIFY_SOCKET` pointing
//! at a datagram socket the test binds, as systemd starts a `Type=notify` unit — STATUS lines
//! on the way, `READY=1` only once `ctl -q` answers READY (never while it waits for a peer),
//! RELOADING=1 / READY=1 around SIGUSR1, STOPPING=1 on SIGTERM, and the foreground kept
//! although the config says DAEMONIZE=1. Then the unit file in `dist/systemd`: its keys, and
//! its command line accepted by our parser (and by `systemd-analyze verify` where installed).

use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use openimex_harness::{Cluster, Signal};

use crate::common::{COMMAND, FORM, NOTICE, binary, run, spec, text};

/// How long a daemon waiting for its peer is watched for a premature READY=1.
const NO_READY_WINDOW: Duration = Duration::from_secs(3);

/// The service manager's side: the socket and every datagram received so far.
pub(crate) struct Manager {
    sock: UnixDatagram,
    got: Vec<String>,
}

impl Manager {
    pub(crate) fn bind(path: &Path) -> Self {
        let sock = UnixDatagram::bind(path).expect("bind the notify socket");
        Self {
            sock,
            got: Vec::new(),
        }
    }

    /// The next datagram within `limit`, or `None`.
    pub(crate) fn next(&mut self, limit: Duration) -> Option<String> {
        self.sock
            .set_read_timeout(Some(limit.max(Duration::from_millis(1))))
            .expect("read timeout");
        let mut buf = [0u8; 4096];
        match self.sock.recv(&mut buf) {
            Ok(n) => {
                let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                self.got.push(msg.clone());
                Some(msg)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("receiving on the notify socket: {e}"),
        }
    }

    /// Receives until a datagram has `line` among its lines (within `limit`); returns it.
    #[track_caller]
    pub(crate) fn wait_line(&mut self, line: &str, limit: Duration, cluster: &Cluster) -> String {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.next(left) {
                Some(msg) if msg.lines().any(|l| l == line) => return msg,
                Some(_) => {}
                None => panic!(
                    "no {line:?} within {limit:?}; received {:?}\n{}",
                    self.got,
                    cluster.logs_tail(40)
                ),
            }
        }
    }
}

fn has_line(msgs: &[String], line: &str) -> bool {
    msgs.iter().any(|m| m.lines().any(|l| l == line))
}

fn ctl_q(cluster: &Cluster, i: usize) -> String {
    text(&cluster.ctl(i, &["-q"]).expect("ctl -q").stdout)
}

#[test]
fn notify_socket_sees_states_ready_only_when_ready_reload_and_stop() {
    let mut cluster =
        Cluster::prepare(spec(2).config("IMEX_WAIT_FOR_QUORUM", "FULL")).expect("prepare");
    let path = cluster.base_dir().join("notify.sock");
    let mut manager = Manager::bind(&path);
    cluster
        .set_node_env(0, "NOTIFY_SOCKET", &path)
        .expect("node 0's environment");
    // NVIDIA's default: under a manager that waits for READY=1 it must not fork.
    cluster
        .set_node_config(0, "DAEMONIZE", "1")
        .expect("DAEMONIZE=1");
    cluster.start_node(0).expect("start node 0");

    // Its peer is missing: FULL quorum waits, and says so. A SIGUSR1 meanwhile is part of
    // the start: no RELOADING=1, and above all no READY=1 when its re-read is over.
    manager.wait_line("STATUS=WAITING_FOR_PEERS", NOTICE, &cluster);
    cluster
        .signal(0, Signal::SIGUSR1)
        .expect("SIGUSR1 while waiting");
    let until = Instant::now() + NO_READY_WINDOW;
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        if manager.next(left).is_none() {
            break;
        }
    }
    assert!(
        !has_line(&manager.got, "READY=1") && !has_line(&manager.got, "RELOADING=1"),
        "READY=1 or RELOADING=1 while waiting for a peer: {:?}",
        manager.got
    );
    let log = std::fs::read_to_string(cluster.node(0).log_path()).unwrap_or_default();
    assert!(
        log.contains("re-read (SIGUSR1)"),
        "the re-read was over: {log}"
    );
    assert_eq!(ctl_q(&cluster, 0), "WAITING_FOR_PEERS\n");
    assert!(
        cluster.is_running(0),
        "DAEMONIZE=1 with NOTIFY_SOCKET: the process systemd started must stay, not fork"
    );
    let log = std::fs::read_to_string(cluster.node(0).log_path()).unwrap_or_default();
    assert!(
        log.contains("DAEMONIZE=1 not applied: NOTIFY_SOCKET is set"),
        "{log}"
    );

    // The peer comes: READY=1, and at that moment ctl already answers READY.
    cluster.start_node(1).expect("start node 1");
    let ready = manager.wait_line("READY=1", FORM, &cluster);
    assert!(ready.lines().any(|l| l == "STATUS=READY"), "{ready}");
    assert_eq!(ctl_q(&cluster, 0), "READY\n", "READY=1 came before READY");
    let before_ready = manager.got.len() - 1;
    assert!(
        !has_line(&manager.got[..before_ready], "READY=1"),
        "{:?}",
        manager.got
    );
    // With every peer connected, the status says so (what the formation bench waits for).
    manager.wait_line("STATUS=READY, all 1 peers connected", FORM, &cluster);

    // SIGUSR1: RELOADING=1 with the monotonic clock, then READY=1 once the map is applied.
    cluster.signal(0, Signal::SIGUSR1).expect("SIGUSR1");
    let reloading = manager.wait_line("RELOADING=1", NOTICE, &cluster);
    assert!(
        reloading.lines().any(|l| l
            .strip_prefix("MONOTONIC_USEC=")
            .is_some_and(|v| v.parse::<u64>().is_ok_and(|us| us > 0))),
        "{reloading}"
    );
    let reloaded = manager.wait_line("READY=1", NOTICE, &cluster);
    assert!(reloaded.lines().any(|l| l == "STATUS=READY"), "{reloaded}");
    assert!(cluster.is_running(0), "same process after SIGUSR1");

    // SIGTERM: STOPPING=1, and a clean exit within the unit's bound.
    let stop = cluster
        .stop(0, Duration::from_secs(10))
        .expect("stop node 0");
    assert_eq!(stop.exit_code, Some(0), "{stop:?}");
    manager.wait_line("STOPPING=1", COMMAND, &cluster);
    let stopping = manager
        .got
        .iter()
        .position(|m| m.lines().any(|l| l == "STOPPING=1"))
        .expect("STOPPING=1 received");
    assert!(
        !has_line(&manager.got[stopping + 1..], "READY=1"),
        "READY=1 after STOPPING=1: {:?}",
        manager.got
    );
}

#[test]
fn an_unusable_notify_socket_is_logged_and_the_daemon_serves_anyway() {
    let mut cluster = Cluster::prepare(spec(1)).expect("prepare");
    let gone = cluster.base_dir().join("no-manager.sock");
    // Not a socket address at all; then a path where no manager listens.
    let values = [
        "relative/notify.sock".to_owned(),
        gone.display().to_string(),
    ];
    for (i, value) in values.into_iter().enumerate() {
        cluster
            .set_node_env(0, "NOTIFY_SOCKET", &value)
            .expect("environment");
        cluster.start_node(0).expect("start");
        cluster
            .wait_state(0, "READY", FORM)
            .unwrap_or_else(|e| panic!("NOTIFY_SOCKET={value}: {e}"));
        let log = std::fs::read_to_string(cluster.node(0).log_path()).unwrap_or_default();
        let expect = match i {
            0 => "cannot use NOTIFY_SOCKET=relative/notify.sock: neither an absolute path",
            _ => "cannot notify the service manager at NOTIFY_SOCKET=",
        };
        assert_eq!(log.matches(expect).count(), 1, "{expect:?} once in:\n{log}");
        let stop = cluster.stop(0, Duration::from_secs(10)).expect("stop");
        assert_eq!(stop.exit_code, Some(0), "{stop:?}");
    }
}

/// `dist/systemd/openimex.service`, by section: key -> every value given.
fn unit() -> (PathBuf, BTreeMap<(String, String), Vec<String>>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/systemd/openimex.service");
    let body =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut keys: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for (n, line) in body.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        assert!(
            !line.ends_with('\\'),
            "{}:{}: keep each setting on one line",
            path.display(),
            n + 1
        );
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{}:{}: not KEY=value: {line}", path.display(), n + 1));
        assert!(
            !section.is_empty(),
            "{}:{}: outside a section",
            path.display(),
            n + 1
        );
        keys.entry((section.clone(), key.trim().to_owned()))
            .or_default()
            .push(value.trim().to_owned());
    }
    (path, keys)
}

fn one<'a>(keys: &'a BTreeMap<(String, String), Vec<String>>, section: &str, key: &str) -> &'a str {
    match keys
        .get(&(section.to_owned(), key.to_owned()))
        .map(Vec::as_slice)
    {
        Some([v]) => v,
        other => panic!("[{section}] {key}: expected one value, got {other:?}"),
    }
}

#[test]
fn unit_file_is_type_notify_reloads_with_usr1_bounds_its_stop_and_aliases_nvidia_imex() {
    let (path, keys) = unit();
    assert_eq!(one(&keys, "Service", "Type"), "notify");
    assert_eq!(one(&keys, "Service", "NotifyAccess"), "main");
    assert_eq!(
        one(&keys, "Service", "ExecReload"),
        "/bin/kill -USR1 $MAINPID"
    );
    assert_eq!(one(&keys, "Service", "KillSignal"), "SIGTERM");
    let stop: u64 = one(&keys, "Service", "TimeoutStopSec")
        .parse()
        .expect("TimeoutStopSec in seconds");
    assert!(
        (5..=90).contains(&stop),
        "a bounded stop, past the daemon's 5 s: {stop}"
    );
    assert_eq!(one(&keys, "Service", "Restart"), "on-failure");
    assert_eq!(one(&keys, "Install", "Alias"), "nvidia-imex.service");
    assert_eq!(one(&keys, "Install", "WantedBy"), "multi-user.target");
    // Hardening must not fence off the GPU driver's device nodes.
    for key in [
        "PrivateDevices",
        "DevicePolicy",
        "DeviceAllow",
        "ProtectClock",
    ] {
        assert!(
            !keys.contains_key(&("Service".to_owned(), key.to_owned())),
            "{key} would put /dev/nvidia* behind a device allow-list"
        );
    }

    // ExecStart: our binary, the daemon in the foreground on NVIDIA's config path, with
    // arguments our parser takes (`--help` last: clap parses every argument before it).
    let exec = one(&keys, "Service", "ExecStart");
    let argv: Vec<&str> = exec.split_whitespace().collect();
    assert_eq!(
        argv.as_slice(),
        [
            "/usr/bin/openimex",
            "daemon",
            "-c",
            "/etc/nvidia-imex/config.cfg"
        ],
        "{}",
        path.display()
    );
    assert_eq!(
        openimex_config::DEFAULT_CONFIG_PATH,
        "/etc/nvidia-imex/config.cfg"
    );
    let out = run(Command::new(binary()).args(&argv[1..]).arg("--help"));
    assert!(
        out.status.success() && text(&out.stdout).contains("-c <CONFIG>"),
        "{exec} --help: {:?}\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );

    // Optional: systemd's own checker, on a copy whose ExecStart is the binary under test.
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let dir = openimex_harness::ScratchDir::new("unit").expect("scratch dir");
        let copy = dir.path().join("openimex.service");
        let body = std::fs::read_to_string(&path).expect("unit file");
        let body = body.replace("/usr/bin/openimex", &binary().display().to_string());
        std::fs::write(&copy, body).expect("write the copy");
        let out = run(Command::new("systemd-analyze")
            .arg("verify")
            .arg(&copy)
            .current_dir(dir.path()));
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success()
                && !["Unknown", "nvalid", "ignoring", "Failed"]
                    .iter()
                    .any(|w| said.contains(w)),
            "systemd-analyze verify: {:?}\n{said}",
            out.status
        );
    }
}
