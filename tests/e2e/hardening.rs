//! Issue 13's signals and smaller items, end to end: every asynchronous signal whose default
//! action would kill the daemon (or the simulated GPU driver) is logged and ignored, and
//! SIGTERM still leaves cleanly afterwards; the command socket's mode does not follow the
//! umask; huge config values are echoed cut; SERVER_PORT=0 and `-p 0` are refused;
//! `install-links` refuses a missing directory; `app import --handle @FILE` reads a bounded
//! amount.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use openimex_harness::nix::libc;
use openimex_harness::{Cluster, ScratchDir, Signal};

use crate::common::{
    FORM, NOTICE, assert_clean_failure, binary, lab_binary, log_marker, run, spec, text, wait_for,
};

/// The asynchronous signals whose default action ends a process (man 7 signal), apart from
/// TERM/INT/QUIT (a clean stop) and HUP/USR1 (NVIDIA's behaviours), with the name the log
/// gives each.
fn ignored_signals() -> Vec<(libc::c_int, String)> {
    let mut v: Vec<(libc::c_int, String)> = [
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGVTALRM, "SIGVTALRM"),
        (libc::SIGPROF, "SIGPROF"),
        (libc::SIGIO, "SIGIO"),
        (libc::SIGPWR, "SIGPWR"),
        (libc::SIGSTKFLT, "SIGSTKFLT"),
        (libc::SIGXCPU, "SIGXCPU"),
        (libc::SIGXFSZ, "SIGXFSZ"),
    ]
    .into_iter()
    .map(|(s, n)| (s, n.to_owned()))
    .collect();
    v.push((libc::SIGRTMIN(), "SIGRTMIN".to_owned()));
    v.push((libc::SIGRTMIN() + 1, "SIGRTMIN+1".to_owned()));
    v.push((libc::SIGRTMAX(), "SIGRTMAX".to_owned()));
    v
}

/// `kill(pid, sig)` for any signal number (nix's `Signal` has no real-time signals).
fn kill(pid: u32, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is a child of this test.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

#[test]
fn ignored_signals_are_logged_and_sigterm_still_leaves_cleanly() {
    let mut cluster = Cluster::start(spec(2)).expect("start");
    cluster.wait_up(0, FORM).expect("UP");
    cluster.wait_up(1, FORM).expect("UP on node 1");
    let pid = cluster.node(1).pid().expect("node 1 runs");
    let log = cluster.node(1).log_path();
    let signals = ignored_signals();

    for (sig, _) in &signals {
        kill(pid, *sig);
    }
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let all_logged = wait_for(NOTICE, || {
        let l = read_log();
        signals
            .iter()
            .all(|(_, n)| l.contains(&format!("{n} received")))
    });
    let l = read_log();
    let missing: Vec<&str> = signals
        .iter()
        .map(|(_, n)| n.as_str())
        .filter(|n| !l.contains(&format!("{n} received")))
        .collect();
    assert!(
        all_logged,
        "not logged: {missing:?}\n{}",
        cluster.logs_tail(40)
    );
    assert!(
        cluster.is_running(1),
        "node 1 died: {}",
        cluster.logs_tail(40)
    );
    let q = cluster.ctl(1, &["-q"]).expect("ctl -q");
    assert_eq!(text(&q.stdout), "READY\n", "{}", text(&q.stderr));
    cluster
        .wait_up(1, FORM)
        .expect("node 1 still sees the domain UP");
    cluster
        .wait_up(0, FORM)
        .expect("node 0 still sees the domain UP");

    // A flood: one line for the first of each signal per 10 s, the rest only counted.
    let before = read_log().matches("SIGUSR2 received").count();
    for _ in 0..2000 {
        kill(pid, libc::SIGUSR2);
    }
    // Every SIGUSR2 sent has been taken (and logged or counted) once a later signal is logged.
    log_marker(&cluster, 1);
    let after = read_log().matches("SIGUSR2 received").count();
    assert!(
        after - before <= 1,
        "a flood of SIGUSR2 must not flood the log: {} more lines",
        after - before
    );
    assert!(cluster.is_running(1), "node 1 died in the SIGUSR2 flood");
    // Real-time signals queue, one record each: a flood of them is read a batch at a time on
    // the daemon's one runtime thread, which keeps answering meanwhile.
    for _ in 0..5000 {
        kill(pid, libc::SIGRTMIN());
    }
    let q = cluster
        .ctl(1, &["-q"])
        .expect("ctl -q after a SIGRTMIN flood");
    assert_eq!(text(&q.stdout), "READY\n", "{}", text(&q.stderr));
    assert!(cluster.is_running(1), "node 1 died in the SIGRTMIN flood");

    let out = cluster.stop(1, Duration::from_secs(10)).expect("SIGTERM");
    assert_eq!(out.exit_code, Some(0), "{out:?}\n{}", cluster.logs_tail(40));
    assert!(!out.killed, "{out:?}");
    assert!(out.elapsed < Duration::from_secs(5), "{out:?}");
    cluster
        .wait_links(0, NOTICE, "0->1 DISCONNECTED by goodbye", |l| {
            l.link(0, 1).is_some_and(|c| {
                c.status == "DISCONNECTED" && c.reason.to_lowercase().contains("goodbye")
            })
        })
        .expect("node 0 records node 1's departure as a goodbye");
    let sock = cluster.node(1).socket_path();
    assert!(
        !sock.exists(),
        "{} must be removed on a clean stop",
        sock.display()
    );
}

/// Kills the child on drop (a failed assertion must not leave a process behind).
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to `limit` for the child to exit.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn gpu_driver_ignores_signals_and_stops_cleanly() {
    let dir = ScratchDir::new("gpu-signals").expect("scratch dir");
    let stderr_path = dir.path().join("stderr");
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let mut child = Reap(
        Command::new(lab_binary())
            .arg("gpu")
            .arg("--node-dir")
            .arg(dir.path().join("node"))
            .arg("--fabric-dir")
            .arg(dir.path().join("fabric"))
            .args(["--gpus", "1", "--hbm-mib", "2"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn openimex-lab gpu"),
    );
    let stdout = child.0.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("ready line");
    let sock = line
        .trim()
        .strip_prefix("ready ")
        .unwrap_or_else(|| panic!("not a ready line: {line:?}"))
        .to_owned();
    assert!(Path::new(&sock).exists());

    let mut signals = ignored_signals();
    signals.push((libc::SIGHUP, "SIGHUP".to_owned()));
    signals.push((libc::SIGUSR1, "SIGUSR1".to_owned()));
    for (sig, _) in &signals {
        kill(child.0.id(), *sig);
    }
    let logged = wait_for(NOTICE, || {
        let e = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        signals
            .iter()
            .all(|(_, n)| e.contains(&format!("{n} received")))
    });
    let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert!(logged, "not every signal logged:\n{err}");
    assert!(
        child.0.try_wait().expect("try_wait").is_none(),
        "the driver died:\n{err}"
    );
    assert!(Path::new(&sock).exists(), "socket gone while running");

    kill(child.0.id(), libc::SIGTERM);
    let status = wait_exit(&mut child.0, Duration::from_secs(5)).expect("exit within 5 s");
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(!Path::new(&sock).exists(), "{sock} must be removed");
}

#[test]
fn command_socket_mode_does_not_follow_the_umask() {
    let cluster = Cluster::prepare(spec(1)).expect("prepare");
    let node = cluster.node(0);
    let sock = node.socket_path();
    for umask in ["000", "077", "022"] {
        let _ = std::fs::remove_file(&sock);
        let mut daemon = Reap(
            Command::new("/bin/sh")
                .arg("-c")
                .arg(format!("umask {umask} && exec \"$0\" daemon -c \"$1\""))
                .arg(binary())
                .arg(node.config_path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn daemon"),
        );
        let ready = wait_for(FORM, || {
            cluster
                .ctl(0, &["-q"])
                .is_ok_and(|o| text(&o.stdout) == "READY\n")
        });
        assert!(ready, "umask {umask}: not READY\n{}", cluster.logs_tail(20));
        let mode = std::fs::metadata(&sock)
            .expect("socket exists")
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o7777,
            0o660,
            "umask {umask}: socket mode {:04o}",
            mode & 0o7777
        );
        kill(daemon.0.id(), libc::SIGTERM);
        let status = wait_exit(&mut daemon.0, Duration::from_secs(5)).expect("exit");
        assert_eq!(status.code(), Some(0), "umask {umask}: {status:?}");
    }
}

/// A config for a daemon that never gets far: `extra` lines appended.
fn write_config(dir: &Path, nodes: &str, extra: &str) -> std::path::PathBuf {
    let nodes_path = dir.join("nodes_config.cfg");
    std::fs::write(&nodes_path, nodes).expect("write nodes");
    let cfg = dir.join("config.cfg");
    std::fs::write(
        &cfg,
        format!(
            "DAEMONIZE=0\nLOG_FILE_NAME={}\nIMEX_NODE_CONFIG_FILE={}\nOPENIMEX_DRIVER=nogpu\n{extra}",
            dir.join("imex.log").display(),
            nodes_path.display()
        ),
    )
    .expect("write config");
    cfg
}

#[test]
fn huge_config_and_node_lines_are_echoed_cut() {
    let dir = ScratchDir::new("huge-cfg").expect("scratch dir");
    const BIG: usize = 10 << 20;
    let cfg = write_config(
        dir.path(),
        "127.0.0.1\n",
        &format!("SERVER_PORT={}\n", "7".repeat(BIG)),
    );
    let out = run(Command::new(binary()).arg("daemon").arg("-c").arg(&cfg));
    let stderr = assert_clean_failure(&out, "10 MB config value");
    assert!(stderr.len() < 2048, "{} bytes of stderr", stderr.len());
    for want in [
        format!("{}:5: SERVER_PORT=\"777", cfg.display()),
        format!("…\" ({BIG} characters)"),
        "expected an integer 1-65535".to_owned(),
    ] {
        assert!(stderr.contains(&want), "missing {want:?}:\n{stderr}");
    }

    const NODE: usize = 100 << 10;
    let cfg = write_config(
        dir.path(),
        &format!("127.0.0.1\n{}\n", "n".repeat(NODE)),
        "",
    );
    let out = run(Command::new(binary()).arg("daemon").arg("-c").arg(&cfg));
    let stderr = assert_clean_failure(&out, "100 KB node line");
    assert!(stderr.len() < 2048, "{} bytes of stderr", stderr.len());
    let nodes = dir.path().join("nodes_config.cfg");
    for want in [
        format!("{}:2: node \"nnn", nodes.display()),
        format!("…\" ({NODE} characters)"),
        "write one IPv4 or IPv6 address or DNS name per line".to_owned(),
    ] {
        assert!(stderr.contains(&want), "missing {want:?}:\n{stderr}");
    }
}

#[test]
fn peer_port_zero_is_refused() {
    let dir = ScratchDir::new("port0").expect("scratch dir");
    let cfg = write_config(dir.path(), "127.0.0.1\n", "SERVER_PORT=0\n");
    let out = run(Command::new(binary()).arg("daemon").arg("-c").arg(&cfg));
    let stderr = assert_clean_failure(&out, "SERVER_PORT=0");
    let at = format!("{}:5: SERVER_PORT=\"0\"", cfg.display());
    assert!(stderr.contains(&at), "missing {at:?}:\n{stderr}");
    assert!(stderr.contains("1-65535"), "{stderr}");

    let cfg = write_config(dir.path(), "127.0.0.1\n", "");
    let out = run(Command::new(binary())
        .args(["daemon", "-p", "0", "-c"])
        .arg(&cfg));
    let stderr = assert_clean_failure(&out, "-p 0");
    assert!(stderr.contains("1-65535"), "{stderr}");
}

#[test]
fn install_links_refuses_a_missing_directory() {
    let dir = ScratchDir::new("links-missing").expect("scratch dir");
    let missing = dir.path().join("usr/lcoal/bin");
    let out = run(Command::new(binary()).arg("install-links").arg(&missing));
    let stderr = assert_clean_failure(&out, "install-links into a missing directory");
    assert!(stderr.contains(&missing.display().to_string()), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(stderr.contains("mkdir -p"), "{stderr}");
    assert!(!dir.path().join("usr").exists(), "nothing may be created");

    let file = dir.path().join("a-file");
    std::fs::write(&file, "").expect("write file");
    let out = run(Command::new(binary()).arg("install-links").arg(&file));
    let stderr = assert_clean_failure(&out, "install-links into a file");
    assert!(stderr.contains("not a directory"), "{stderr}");
}

#[test]
fn app_import_reads_a_bounded_handle_file() {
    let dir = ScratchDir::new("handle-zero").expect("scratch dir");
    let t = Instant::now();
    let out = run(Command::new(lab_binary())
        .args(["app", "import", "--node-dir"])
        .arg(dir.path())
        .args(["--handle", "@/dev/zero"]));
    let stderr = assert_clean_failure(&out, "--handle @/dev/zero");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("/dev/zero"), "{stderr}");
    assert!(stderr.contains("more than 4096 bytes"), "{stderr}");
    assert!(stderr.contains("128 hex digits"), "{stderr}");
}

/// SIGHUP (a verbose-buffer dump) and SIGUSR1 (a nodes-file re-read) are logged and do not
/// stop the daemon (the signal is the harness's enum, as other tests send it).
#[test]
fn hup_and_usr1_do_not_stop_the_daemon() {
    let mut cluster = Cluster::start(spec(1)).expect("start");
    cluster.wait_state(0, "READY", FORM).expect("READY");
    for sig in [Signal::SIGHUP, Signal::SIGUSR1] {
        cluster.signal(0, sig).expect("signal");
    }
    let log = cluster.node(0).log_path();
    let logged = wait_for(NOTICE, || {
        let l = std::fs::read_to_string(&log).unwrap_or_default();
        l.contains("SIGHUP received") && l.contains("SIGUSR1 received")
    });
    assert!(logged, "{}", cluster.logs_tail(20));
    assert!(cluster.is_running(0));
}
