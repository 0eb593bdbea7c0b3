//! Lifecycle beyond formation: a hung peer found by heartbeats, the FULL quorum wait, every
//! shutdown signal, the command service over its unix socket and TCP, and the demo and bench
//! commands end to end.

use std::time::{Duration, Instant};

use openimex_harness::{Cluster, Signal};

use crate::common::{FORM, NOTICE, binary, lab_binary, run, spec, text};

#[test]
fn hung_peer_is_found_by_heartbeats_and_recovers_as_the_same_instance() {
    let mut cluster = Cluster::start(spec(3)).expect("start");
    cluster.wait_up(0, FORM).expect("UP");
    let before = cluster
        .links(0)
        .expect("links")
        .node(2)
        .expect("node 2")
        .instance_id
        .clone();

    // SIGSTOP keeps the sockets open: no reset, no FIN. Only the heartbeats can tell.
    cluster.signal(2, Signal::SIGSTOP).expect("SIGSTOP node 2");
    let seen = cluster
        .wait_links(0, NOTICE, "0->2 RECOVERING after missed heartbeats", |l| {
            l.link(0, 2)
                .is_some_and(|c| c.status == "RECOVERING" && c.reason.contains("heartbeat"))
        })
        .expect("node 0 declares the hung peer lost");
    assert_eq!(seen.status, "DEGRADED", "{}", seen.compact());

    cluster.signal(2, Signal::SIGCONT).expect("SIGCONT node 2");
    cluster.wait_up(0, FORM).expect("UP again after SIGCONT");
    let after = cluster
        .links(0)
        .expect("links")
        .node(2)
        .expect("node 2")
        .instance_id
        .clone();
    assert_eq!(
        before, after,
        "a paused process is the same instance, not a restart"
    );
    assert!(cluster.is_running(2));
}

#[test]
fn full_quorum_waits_for_every_peer_before_ready() {
    let mut cluster =
        Cluster::prepare(spec(2).config("IMEX_WAIT_FOR_QUORUM", "FULL")).expect("prepare");
    cluster.start_node(0).expect("start node 0");
    cluster
        .wait_state(0, "WAITING_FOR_PEERS", NOTICE)
        .expect("node 0 waits for node 1");
    let q = cluster.ctl(0, &["-q"]).expect("ctl -q");
    assert_eq!(text(&q.stdout), "WAITING_FOR_PEERS\n");
    cluster.start_node(1).expect("start node 1");
    cluster
        .wait_state(0, "READY", FORM)
        .expect("node 0 READY once node 1 is connected");
    cluster.wait_up(0, FORM).expect("UP");
}

#[test]
fn sigint_and_sigquit_leave_cleanly_too() {
    let mut cluster = Cluster::start(spec(3)).expect("start");
    cluster.wait_up(0, FORM).expect("UP");
    for (node, sig) in [(1, Signal::SIGINT), (2, Signal::SIGQUIT)] {
        let t = Instant::now();
        cluster.signal(node, sig).expect("signal");
        while cluster.is_running(node) {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "node {node} still running 5 s after {sig}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let exit = cluster.node(node).last_exit().expect("exit status");
        assert_eq!(exit.code(), Some(0), "node {node} after {sig}: {exit:?}");
    }
    cluster
        .wait_links(0, NOTICE, "both peers left with a goodbye", |l| {
            [1, 2].iter().all(|&j| {
                l.link(0, j)
                    .is_some_and(|c| c.status == "DISCONNECTED" && c.reason.contains("goodbye"))
            })
        })
        .expect("departures, not failures");
}

#[test]
fn ctl_reaches_the_daemon_by_unix_socket_and_by_tcp() {
    let cluster = Cluster::start(spec(2)).expect("start");
    cluster.wait_up(0, FORM).expect("UP");
    let node = cluster.node(0);
    let sock = node.socket_path();
    let ip = node.ip().to_string();
    let port = node.cmd_port().to_string();
    let forms: [Vec<String>; 4] = [
        vec![format!("--u={}", sock.display()), "-q".into()],
        vec!["-u".into(), sock.display().to_string(), "-q".into()],
        vec!["-i".into(), ip.clone(), port.clone(), "-q".into()],
        vec!["-i".into(), ip, port, "-N".into(), "-j".into()],
    ];
    for args in forms {
        let out = run(std::process::Command::new(binary()).arg("ctl").args(&args));
        assert!(out.status.success(), "ctl {args:?}: {}", text(&out.stderr));
        let stdout = text(&out.stdout);
        if args.contains(&"-q".to_string()) {
            assert_eq!(stdout, "READY\n", "ctl {args:?}");
        } else {
            assert!(
                stdout.trim_end().ends_with("\"status\":\"UP\"}"),
                "ctl {args:?}: {stdout}"
            );
        }
    }
}

/// The README's run command, in full: a simulated NVL72 (18 trays x 4 GPUs, 5112 imports).
/// About 15 s on 2 cores in a debug build; the bound only catches a hang.
#[test]
fn full_nvl72_demo_passes() {
    let dir = openimex_harness::scratch::ScratchDir::new("demo-svg").expect("scratch dir");
    let svg = dir.path().join("domain.svg");
    let mut cmd = std::process::Command::new(lab_binary());
    cmd.args(["demo", "--json", "--svg"]).arg(&svg);
    let out = openimex_harness::process::run_with_timeout(&mut cmd, Duration::from_secs(300))
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        text(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {stdout}"));
    assert_eq!(summary["nodes"], 18, "{summary}");
    assert_eq!(summary["gpus"], 72, "{summary}");
    assert_eq!(summary["imports"], 72 * 71, "{summary}");
    assert_eq!(summary["errors"], 0, "{summary}");
    assert_eq!(summary["leaked_refs"], 0, "{summary}");
    // Each of the 5112 pairs checked its slot in both directions.
    let slot = 2 * 1024 * 1024 / 72 / 8 * 8;
    assert_eq!(summary["bytes_verified"], 2 * 72 * 71 * slot, "{summary}");
    // The picture drawn while the imports were held: every tray, node 0 holding 68 imports.
    assert_eq!(summary["svg"], svg.to_string_lossy().as_ref(), "{summary}");
    let picture = std::fs::read_to_string(&svg).expect("the demo wrote its picture");
    assert!(
        picture.trim_end().ends_with("</svg>"),
        "a whole SVG document"
    );
    for i in 0..18 {
        assert!(picture.contains(&format!(">#{i} <")), "tray {i} drawn");
    }
}

#[test]
fn bench_formation_reports_daemons_against_bare_processes() {
    let out = run(std::process::Command::new(lab_binary()).args([
        "bench",
        "formation",
        "--nodes",
        "3",
        "--rounds",
        "1",
    ]));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {stdout}\n{}",
        text(&out.stderr)
    );
    for want in [
        "spawn -> domain UP",
        "spawn -> ports open",
        "spawn -> all pairs called",
        "ratio",
    ] {
        assert!(stdout.contains(want), "missing {want:?}: {stdout}");
    }
}

#[test]
fn bench_imports_reports_ratios_to_same_run_baselines() {
    let out = run(std::process::Command::new(lab_binary()).args([
        "bench",
        "imports",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--rounds",
        "1",
    ]));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {stdout}\n{}",
        text(&out.stderr)
    );
    let imports = stdout
        .lines()
        .find(|l| l.contains("imports per run"))
        .and_then(|l| l.rsplit(':').next())
        .map(str::trim);
    assert_eq!(
        imports,
        Some("12"),
        "4 GPUs import 3 buffers each: {stdout}"
    );
    for want in [
        "raw unary gRPC round trip",
        "ratio import p50 / gRPC round trip",
        "local memcpy",
        "ratio fabric copy / memcpy",
    ] {
        assert!(stdout.contains(want), "missing {want:?}: {stdout}");
    }
}
