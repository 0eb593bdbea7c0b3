//! The command line around the daemon: `ctl` with no daemon to talk to, the `nvidia-imex` /
//! `nvidia-imex-ctl` names that existing units and tools call, and DAEMONIZE=1 forking the
//! way systemd's `Type=forking` expects.

use std::fs::File;
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use openimex_harness::process::{find_pids_with_args, process_alive, send_signal};
use openimex_harness::{Cluster, ScratchDir, Signal};

use crate::common::{
    COMMAND, FORM, KillOnDrop, assert_clean_failure, binary, dead_endpoint, lab_binary, run, spec,
    text,
};

#[test]
fn ctl_without_daemon_fails_clearly() {
    let (ip, port) = dead_endpoint();
    let out = run(Command::new(binary()).args(["ctl", "-i", &ip, &port, "-q"]));
    let stderr = assert_clean_failure(&out, "ctl -i (no daemon) -q");
    assert!(
        stderr.contains(&ip) && stderr.contains(&port),
        "stderr must name {ip} port {port}:\n{stderr}"
    );

    // -c with a config whose command socket is stale (left by a crashed daemon) and whose
    // command port has no listener.
    let cluster = Cluster::prepare(spec(1)).expect("prepare");
    let node = cluster.node(0);
    drop(UnixListener::bind(node.socket_path()).expect("create a stale socket file"));
    let out = run(Command::new(binary())
        .args(["ctl", "-c"])
        .arg(node.config_path())
        .arg("-N"));
    let stderr = assert_clean_failure(&out, "ctl -c (no daemon) -N");
    let sock = node.socket_path().display().to_string();
    assert!(
        stderr.contains(&sock) || stderr.contains(&node.ip().to_string()),
        "stderr must name the socket {sock} or the address {}:\n{stderr}",
        node.ip()
    );
}

#[test]
fn nvidia_named_links() {
    let dir = ScratchDir::new("links").expect("scratch dir");
    let out = run(Command::new(binary()).arg("install-links").arg(dir.path()));
    assert!(
        out.status.success(),
        "install-links: {:?}\n{}",
        out.status,
        text(&out.stderr)
    );
    let daemon = dir.path().join("nvidia-imex");
    let ctl = dir.path().join("nvidia-imex-ctl");
    for p in [&daemon, &ctl] {
        assert!(
            p.is_file(),
            "{} must exist and lead to the binary",
            p.display()
        );
    }

    let (ip, port) = dead_endpoint();
    let out = run(Command::new(&ctl).args(["-i", &ip, &port, "-q"]));
    let stderr = assert_clean_failure(&out, "nvidia-imex-ctl -i (no daemon) -q");
    assert!(
        stderr.contains(&ip),
        "nvidia-imex-ctl must behave as ctl:\n{stderr}"
    );

    let out = run(Command::new(&daemon).arg("--help"));
    assert!(
        out.status.success(),
        "nvidia-imex --help: {:?}\n{}",
        out.status,
        text(&out.stderr)
    );
    assert!(!out.stdout.is_empty(), "nvidia-imex --help prints help");
}

#[test]
fn daemonize_forks() {
    let cluster = Cluster::prepare(spec(1).config("DAEMONIZE", "1")).expect("prepare");
    let node = cluster.node(0);
    let cfg = node.config_path().display().to_string();
    let _cleanup = KillOnDrop(vec!["daemon".into(), cfg.clone()]);

    // Run it as systemd's Type=forking does: the command must return once the daemon is up.
    let started = Instant::now();
    let mut child = Command::new(binary())
        .args(["daemon", "-c", &cfg])
        .stdin(Stdio::null())
        .stdout(File::create(node.dir().join("fg.stdout")).expect("stdout file"))
        .stderr(File::create(node.dir().join("fg.stderr")).expect("stderr file"))
        .spawn()
        .expect("spawn openimex daemon");
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if started.elapsed() > COMMAND {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`openimex daemon -c` with DAEMONIZE=1 did not return within {COMMAND:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    let stderr = std::fs::read_to_string(node.dir().join("fg.stderr")).unwrap_or_default();
    assert_eq!(
        status.code(),
        Some(0),
        "the foreground command exits 0: {stderr}"
    );

    cluster
        .wait_state(0, "READY", FORM)
        .expect("the forked daemon serves ctl -q");

    let pids = find_pids_with_args(&["daemon", &cfg]);
    assert_eq!(
        pids.len(),
        1,
        "exactly one daemon process for {cfg}: {pids:?}"
    );
    let pid = pids[0];
    assert_ne!(
        pid,
        child.id(),
        "the daemon is not the process that returned"
    );

    send_signal(pid, Signal::SIGTERM).expect("SIGTERM the daemon");
    let t = Instant::now();
    while process_alive(pid) {
        assert!(
            t.elapsed() < COMMAND,
            "the daemon (pid {pid}) is still alive {COMMAND:?} after SIGTERM"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let q = cluster.ctl(0, &["-q"]).expect("ctl -q");
    assert!(
        !q.status.success(),
        "no daemon answers after it exited: {}",
        text(&q.stdout)
    );
}

/// Issue 30: the production binary offers the operator's commands and none of the lab's; asked
/// for a lab command it says where that lives (exit 2, clap's status for a usage error). The
/// lab binary offers both sets, so one binary runs a whole simulated domain.
#[test]
fn the_production_binary_has_no_lab_commands_and_points_to_the_lab_binary() {
    let production = [
        "daemon",
        "ctl",
        "install-links",
        "channels",
        "certs",
        "init",
        "driver-check",
    ];
    let lab = ["demo", "bench", "fabric", "gpu", "app"];
    let subcommands = |help: &str| -> Vec<String> {
        help.lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect()
    };
    let out = run(Command::new(binary()).arg("--help"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = subcommands(&text(&out.stdout));
    for name in production {
        assert!(listed.iter().any(|l| l == name), "{name} in {listed:?}");
    }
    for name in lab {
        assert!(!listed.iter().any(|l| l == name), "{name} in {listed:?}");
        let out = run(Command::new(binary()).args([name, "--help"]));
        assert_eq!(out.status.code(), Some(2), "openimex {name}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("command of the lab binary")
                && stderr.contains(&format!("cargo run --release -p openimex-lab -- {name}")),
            "{stderr}"
        );
    }
    let out = run(Command::new(lab_binary()).arg("--help"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = subcommands(&text(&out.stdout));
    for name in production.iter().chain(&lab) {
        assert!(listed.iter().any(|l| l == name), "{name} in {listed:?}");
    }
}
