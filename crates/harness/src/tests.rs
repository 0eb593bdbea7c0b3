//! Tests of the cluster machinery without the real daemon: a shell script stands in for
//! `openimex` (`daemon` loops until SIGTERM; `ctl` prints `<node dir>/ctl.out`).

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::{Cluster, ClusterSpec, HarnessError, ScratchDir};

const FAKE: &str = r#"#!/bin/sh
case "$1" in
daemon)
  if [ -f "$(dirname "$3")/crash" ]; then echo "boom" >&2; exit 7; fi
  trap 'echo "got TERM"; exit 0' TERM
  trap 'echo "resolve: $(getent hosts oimx-n0 oimx-n1 oimx-n2 | tr -s " " | tr "\n" ";")"' USR1
  echo "fake daemon up"
  while true; do sleep 0.05; done ;;
ctl)
  out="$(dirname "$3")/ctl.out"
  if [ -f "$out" ]; then cat "$out"; exit 0; fi
  echo "no daemon at $3" >&2; exit 1 ;;
esac
exit 2
"#;

const UP2: &str = r#"{"nodes":{"0":{"status":"READY","host":"a","connections":{"0":{"host":"a","status":"CONNECTED","changed":true},"1":{"host":"b","status":"CONNECTED","changed":true}},"changed":true,"version":"NO_GPU","hostName":""},"1":{"status":"READY","host":"b","connections":{"0":{"host":"a","status":"CONNECTED","changed":true},"1":{"host":"b","status":"CONNECTED","changed":true}},"changed":true,"version":"NO_GPU","hostName":""}},"timestamp":"12/2/2026 15:40:01.123","status":"UP"}"#;

/// Writes the fake binary into a scratch dir that the caller keeps alive.
fn fake_binary() -> (ScratchDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = ScratchDir::new("fakebin").expect("scratch");
    let path = dir.path().join("openimex");
    fs::write(&path, FAKE).expect("write fake");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
    (dir, path)
}

/// Waits until node `i`'s stdout shows `needle` `count` times (the fake has set its traps).
fn wait_stdout(c: &Cluster, i: usize, needle: &str, count: usize) {
    let start = Instant::now();
    while fs::read_to_string(c.node(i).stdout_path())
        .unwrap_or_default()
        .matches(needle)
        .count()
        < count
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "node {i} never printed {needle}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn read(path: PathBuf) -> String {
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn prepare_writes_config_and_nodes_files() {
    let spec = ClusterSpec::new(3, "/nonexistent/openimex")
        .config("LOG_LEVEL", "2")
        .config("OPENIMEX_EXTRA", "yes");
    let c = Cluster::prepare(spec).expect("prepare");
    assert_eq!(c.len(), 3);
    let ips: Vec<String> = (0..3).map(|i| c.node(i).ip().to_string()).collect();
    for i in 0..3 {
        let n = c.node(i);
        assert_eq!(n.dir(), c.base_dir().join(format!("node-{i:02}")));
        assert_eq!(read(n.nodes_path()), format!("{}\n", ips.join("\n")));
        let cfg = read(n.config_path());
        let lines: Vec<(&str, &str)> = cfg
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split_once('=').expect("KEY=value"))
            .collect();
        let d = |p: PathBuf| p.display().to_string();
        let ip = ips[i].as_str();
        let expected: Vec<(&str, String)> = vec![
            ("DAEMONIZE", "0".into()),
            ("LOG_LEVEL", "2".into()),
            ("LOG_FILE_NAME", d(n.log_path())),
            ("STATS_FILE_NAME", d(n.stats_path())),
            ("LOG_APPEND_TO_LOG", "1".into()),
            ("BIND_INTERFACE_IP", ip.into()),
            ("SERVER_PORT", "50000".into()),
            ("IMEX_NODE_CONFIG_FILE", d(n.nodes_path())),
            ("IMEX_WAIT_FOR_QUORUM", "NONE".into()),
            ("IMEX_CMD_ENABLED", "1".into()),
            ("IMEX_CMD_BIND_INTERFACE_IP", ip.into()),
            ("IMEX_CMD_PORT", "50005".into()),
            ("IMEX_CMD_UNIX_DOMAIN_PATH", d(n.socket_path())),
            ("OPENIMEX_DRIVER", "nogpu".into()),
            ("OPENIMEX_HEARTBEAT_INTERVAL_MS", "500".into()),
            ("OPENIMEX_PEER_TIMEOUT_MS", "3000".into()),
            ("OPENIMEX_PERSIST_FILE", d(n.dir().join("persist.dat"))),
            ("OPENIMEX_EXTRA", "yes".into()),
        ];
        let got: Vec<(&str, String)> = lines.iter().map(|(k, v)| (*k, v.to_string())).collect();
        assert_eq!(got, expected, "config of node {i}:\n{cfg}");
        assert!(n.dir().join("imex.sock").as_os_str().len() < 108);
    }
    // The spec's ports, node by node, on distinct addresses of one block.
    assert_eq!(c.node(1).ip().octets()[3], c.node(0).ip().octets()[3] + 1);
}

#[test]
fn per_node_overrides_and_nodes_file() {
    let mut c = Cluster::prepare(ClusterSpec::new(2, "/nonexistent/openimex")).expect("prepare");
    let hosts = vec![
        "10.0.0.1".to_string(),
        "10.0.0.2".to_string(),
        "10.0.0.3".into(),
    ];
    c.write_nodes_file(1, &hosts).expect("nodes");
    assert_eq!(
        read(c.node(1).nodes_path()),
        "10.0.0.1\n10.0.0.2\n10.0.0.3\n"
    );
    assert_ne!(read(c.node(0).nodes_path()), read(c.node(1).nodes_path()));
    c.set_node_config(1, "DAEMONIZE", "1").expect("set");
    c.set_node_config(1, "X", "y").expect("set");
    let cfg1 = read(c.node(1).config_path());
    assert!(
        cfg1.contains("\nDAEMONIZE=1\n") && cfg1.contains("\nX=y\n"),
        "{cfg1}"
    );
    assert!(!cfg1.contains("DAEMONIZE=0"), "{cfg1}");
    assert!(read(c.node(0).config_path()).contains("\nDAEMONIZE=0\n"));
    assert!(matches!(
        c.write_nodes_file(5, &hosts),
        Err(HarnessError::NoSuchNode { index: 5, len: 2 })
    ));
}

#[test]
fn missing_binary_is_a_spawn_error_with_a_hint() {
    let err = Cluster::start(ClusterSpec::new(1, "/nonexistent/openimex")).expect_err("no binary");
    let text = err.to_string();
    assert!(
        text.contains("/nonexistent/openimex") && text.contains("hint"),
        "{text}"
    );
}

#[test]
fn base_dir_removed_on_drop_unless_kept() {
    let c = Cluster::prepare(ClusterSpec::new(1, "/bin/true")).expect("prepare");
    let dir = c.base_dir().to_owned();
    assert!(dir.is_dir());
    drop(c);
    assert!(!dir.exists());
    let mut spec = ClusterSpec::new(1, "/bin/true");
    spec.keep_dir = true;
    let c = Cluster::prepare(spec).expect("prepare");
    let dir = c.base_dir().to_owned();
    drop(c);
    assert!(dir.is_dir());
    fs::remove_dir_all(dir).expect("clean up");
}

#[test]
fn lifecycle_with_a_fake_daemon() {
    let (_bin_dir, bin) = fake_binary();
    let mut c = Cluster::start(ClusterSpec::new(3, &bin)).expect("start");
    for i in 0..3 {
        assert!(c.is_running(i), "node {i}");
        wait_stdout(&c, i, "fake daemon up", 1);
    }
    assert!(matches!(
        c.start_node(0),
        Err(HarnessError::AlreadyRunning { index: 0, .. })
    ));

    let out = c.stop(1, Duration::from_secs(5)).expect("stop");
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert!(!out.killed);
    assert!(!c.is_running(1));
    assert!(matches!(
        c.stop(1, Duration::from_secs(1)),
        Err(HarnessError::NotRunning { index: 1 })
    ));

    let pid = c.node(2).pid().expect("pid");
    c.kill9(2).expect("kill9");
    assert!(!c.is_running(2));
    assert!(!crate::process::process_alive(pid));
    c.restart(2).expect("restart");
    assert!(c.is_running(2));
    assert_ne!(c.node(2).pid(), Some(pid));
    assert_eq!(c.node(2).starts(), 2);
    wait_stdout(&c, 2, "fake daemon up", 2);

    // SIGSTOP: stop() must still end it (SIGCONT is sent with TERM).
    c.signal(0, Signal::SIGSTOP).expect("stop signal");
    let out = c.stop(0, Duration::from_secs(5)).expect("stop");
    assert_eq!(out.exit_code, Some(0), "{out:?}");

    let logs = c.logs();
    assert!(logs.contains("===== node 2"), "{logs}");
    assert!(logs.contains("start #2 of node 2"), "{logs}");
    assert!(logs.contains("got TERM"), "{logs}");
    c.shutdown().expect("shutdown");
    for i in 0..3 {
        assert!(!c.is_running(i));
    }
}

#[test]
fn stop_kills_a_daemon_that_ignores_term() {
    let (_bin_dir, bin) = fake_binary();
    let stubborn = bin.with_file_name("stubborn");
    fs::write(
        &stubborn,
        "#!/bin/sh\ntrap '' TERM\necho trapped\nwhile true; do sleep 0.05; done\n",
    )
    .expect("w");
    fs::set_permissions(
        &stubborn,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let mut c = Cluster::start(ClusterSpec::new(1, &stubborn)).expect("start");
    wait_stdout(&c, 0, "trapped", 1);
    let out = c.stop(0, Duration::from_millis(300)).expect("stop");
    assert!(out.killed, "{out:?}");
    assert_eq!(out.signal, Some(9));
    c.start_node(0).expect("start again");
    wait_stdout(&c, 0, "trapped", 2);
    let start = Instant::now();
    let err = c
        .shutdown_within(Duration::from_millis(300))
        .expect_err("straggler");
    assert!(
        matches!(err, HarnessError::Stragglers { ref nodes, .. } if nodes == &[0]),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn wait_domain_and_wait_state() {
    let (_bin_dir, bin) = fake_binary();
    let c = Cluster::start(ClusterSpec::new(2, &bin)).expect("start");
    // No ctl.out yet: ctl fails, and the timeout error says so and carries logs.
    let err = c
        .wait_up(0, Duration::from_millis(300))
        .expect_err("not up");
    let text = err.to_string();
    assert!(
        text.contains("timed out") && text.contains("domain UP"),
        "{text}"
    );
    assert!(
        text.contains("no daemon at"),
        "last error must be shown: {text}"
    );
    assert!(
        text.contains("===== node 1"),
        "logs must be attached: {text}"
    );

    fs::write(c.node(0).dir().join("ctl.out"), UP2).expect("w");
    let d = c.wait_up(0, Duration::from_secs(10)).expect("up");
    assert_eq!(d.status, "UP");
    let err = c
        .wait_domain(0, Duration::from_millis(200), "DEGRADED", |d| {
            d.status == "DEGRADED"
        })
        .expect_err("never degraded");
    assert!(
        err.to_string().contains(r#""status":"UP""#),
        "last view shown: {err}"
    );

    fs::write(c.node(1).dir().join("ctl.out"), "READY\n").expect("w");
    c.wait_state(1, "READY", Duration::from_secs(10))
        .expect("ready");
    assert!(
        c.wait_state(1, "INIT_GPU", Duration::from_millis(200))
            .is_err()
    );
    let out = c.ctl(1, &["-q"]).expect("ctl");
    assert_eq!(out.stdout, b"READY\n");
}

#[test]
fn a_daemon_exiting_on_its_own_ends_a_wait_at_once() {
    let (_bin_dir, bin) = fake_binary();
    let mut c = Cluster::prepare(ClusterSpec::new(2, &bin)).expect("prepare");
    fs::write(c.node(1).dir().join("crash"), "").expect("w");
    c.start_node(0).expect("start");
    c.start_node(1).expect("start");
    let start = Instant::now();
    let err = c
        .wait_up(0, Duration::from_secs(30))
        .expect_err("node 1 crashed");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "must not wait for the timeout"
    );
    let text = err.to_string();
    assert!(
        text.contains("node 1 exited on its own (exit code 7)"),
        "{text}"
    );
    assert!(text.contains("boom"), "stderr tail must be shown: {text}");

    // A harness-requested exit is not a crash.
    c.kill9(0).expect("kill9");
    fs::write(c.node(1).dir().join("ctl.out"), "READY\n").expect("w");
    c.wait_state(1, "READY", Duration::from_secs(5))
        .expect("no false crash report");
}

/// The last `resolve:` line of node `i`'s stdout after a SIGUSR1 (the fake runs `getent`).
fn resolve_via(c: &Cluster, i: usize) -> String {
    let before = read(c.node(i).stdout_path()).matches("resolve:").count();
    c.signal(i, Signal::SIGUSR1).expect("usr1");
    wait_stdout(c, i, "resolve:", before + 1);
    let out = read(c.node(i).stdout_path());
    let line = out.lines().rfind(|l| l.starts_with("resolve:"));
    line.expect("a resolve line").to_owned()
}

#[test]
fn names_mode_daemons_resolve_through_their_own_hosts_file() {
    let (_bin_dir, bin) = fake_binary();
    let mut c = Cluster::start(ClusterSpec::new(2, &bin).with_names()).expect("start");
    let (ip0, ip1) = (c.node(0).ip(), c.node(1).ip());
    assert_eq!(read(c.node(0).nodes_path()), "oimx-n0\noimx-n1\n");
    for i in 0..2 {
        wait_stdout(&c, i, "fake daemon up", 1);
        let cfg = read(c.node(i).config_path());
        let own = c.node(i).ip();
        assert!(cfg.contains(&format!("BIND_INTERFACE_IP={own}\n")), "{cfg}");
        let seen = resolve_via(&c, i);
        assert!(
            seen.contains(&format!("{ip0} oimx-n0;")),
            "node {i}: {seen}"
        );
        assert!(
            seen.contains(&format!("{ip1} oimx-n1;")),
            "node {i}: {seen}"
        );
    }
    // The host's own /etc/hosts never learns the names.
    let host = fs::read_to_string("/etc/hosts").unwrap_or_default();
    assert!(!host.contains("oimx-n"), "{host}");

    // Node 1's file changes (in place: the bind mount pins the inode); node 0's does not.
    let spare = c.spare_ip().expect("spare");
    c.set_host(1, "oimx-n1", spare).expect("set_host");
    assert_eq!(c.host_ip(1, "oimx-n1"), Some(spare));
    assert_eq!(c.host_ip(0, "oimx-n1"), Some(ip1));
    let seen1 = resolve_via(&c, 1);
    assert!(seen1.contains(&format!("{spare} oimx-n1;")), "{seen1}");
    let seen0 = resolve_via(&c, 0);
    assert!(seen0.contains(&format!("{ip1} oimx-n1;")), "{seen0}");

    // A node moves: restarted on its new address, everyone's entry rewritten.
    let pid0 = c.node(0).pid();
    let new0 = c.spare_ip().expect("spare");
    c.move_node(0, new0).expect("move");
    assert_eq!(c.node(0).ip(), new0);
    assert_eq!(c.node(0).starts(), 2);
    assert_ne!(c.node(0).pid(), pid0);
    assert!(read(c.node(0).config_path()).contains(&format!("BIND_INTERFACE_IP={new0}\n")));
    wait_stdout(&c, 0, "fake daemon up", 2);
    let seen1 = resolve_via(&c, 1);
    assert!(seen1.contains(&format!("{new0} oimx-n0;")), "{seen1}");

    // A node added at the end: every nodes file and hosts file grows.
    let n = c.add_node().expect("add");
    assert_eq!(n, 2);
    c.start_node(n).expect("start new");
    wait_stdout(&c, n, "fake daemon up", 1);
    let ip2 = c.node(n).ip();
    for i in 0..3 {
        assert_eq!(read(c.node(i).nodes_path()), "oimx-n0\noimx-n1\noimx-n2\n");
        let seen = resolve_via(&c, i);
        assert!(
            seen.contains(&format!("{ip2} oimx-n2;")),
            "node {i}: {seen}"
        );
    }
    c.shutdown().expect("shutdown");
}

#[test]
fn hosts_operations_need_names_mode() {
    let mut c = Cluster::prepare(ClusterSpec::new(2, "/bin/true")).expect("prepare");
    let ip = c.node(0).ip();
    assert!(matches!(
        c.set_host(0, "oimx-n0", ip),
        Err(HarnessError::NotNamesMode { what: "set_host" })
    ));
    assert_eq!(c.host_ip(0, "oimx-n0"), None);
    assert_eq!(c.node_name(1).expect("name"), c.node(1).ip().to_string());
}

/// Run by [`names_mode_without_cap_sys_admin_says_it_needs_root`] in a process without
/// CAP_SYS_ADMIN.
#[test]
#[ignore = "needs a process without CAP_SYS_ADMIN; run through the test below"]
fn names_mode_spawn_without_cap_sys_admin() {
    let (_bin_dir, bin) = fake_binary();
    let err = Cluster::start(ClusterSpec::new(1, &bin).with_names()).expect_err("must fail");
    assert!(
        matches!(err, HarnessError::NamesModeNeedsRoot { index: 0, .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("names mode needs root (CAP_SYS_ADMIN)"),
        "{text}"
    );
}

#[test]
fn names_mode_without_cap_sys_admin_says_it_needs_root() {
    let exe = std::env::current_exe().expect("the test binary");
    let out = crate::process::run_with_timeout(
        std::process::Command::new("setpriv")
            .args(["--inh-caps=-sys_admin", "--bounding-set=-sys_admin"])
            .arg(exe)
            .args([
                "--exact",
                "tests::names_mode_spawn_without_cap_sys_admin",
                "--ignored",
            ]),
        Duration::from_secs(60),
    )
    .expect("run the test binary under setpriv (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
