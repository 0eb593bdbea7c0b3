//! Placeholder nodes files (issue 9): AWS ParallelCluster seeds `nodes_config.cfg` with a `##`
//! comment and nine `0.0.0.0` lines. A daemon on that file starts *unconfigured* (`ctl -q`
//! UNAVAILABLE, `ctl -N -j` exit 0 in the shape of NVIDIA's unconfigured sample, domain DOWN),
//! and comes up configured, same PID, once the real list is written and SIGUSR1 arrives. In a
//! configured domain a placeholder line is a node UNAVAILABLE with INVALID links (domain
//! DEGRADED), and filling it in with SIGUSR1 brings the domain UP. Every other duplicate, and a
//! file without placeholders that does not name this host, still stop the start.

use std::process::{Command, Stdio};

use openimex_harness::process::{find_pids_with_args, send_signal};
use openimex_harness::{Cluster, Signal};
use serde_json::Value;

use crate::common::{COMMAND, FORM, KillOnDrop, NOTICE, binary, run, spec, text};
use crate::systemd::Manager;

/// NVIDIA's `ctl -N -j` on a node whose nodes file holds only placeholders.
const UNCONFIGURED_SAMPLE: &str =
    include_str!("../../crates/harness/testdata/ctl-N-j.570.172.unconfigured.json");

/// ParallelCluster's seed: `##` and nine `0.0.0.0` lines.
fn seed() -> Vec<String> {
    let mut lines = vec!["##".to_string()];
    lines.extend(std::iter::repeat_n("0.0.0.0".to_string(), 9));
    lines
}

/// Every key path of `v` in document order, with the leaf values; `hostName` (a 580-series
/// key NVIDIA's 570 sample lacks, empty without -H), our `reason` keys and the timestamp's
/// value left out.
fn shape(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                if k == "hostName" || k == "reason" {
                    continue;
                }
                let path = format!("{at}/{k}");
                if k == "timestamp" {
                    out.push(path);
                } else {
                    shape(child, &path, out);
                }
            }
        }
        leaf => out.push(format!("{at}={leaf}")),
    }
}

#[test]
fn a_placeholder_file_starts_unconfigured_then_sigusr1_brings_the_domain_up() {
    let mut cluster = Cluster::prepare(spec(2)).expect("prepare 2 nodes");
    let real = cluster.nodes_lines().to_vec();
    for i in 0..2 {
        cluster.write_nodes_file(i, &seed()).expect("seed file");
        cluster.start_node(i).expect("start on the seed file");
    }
    for i in 0..2 {
        cluster
            .wait_state(i, "UNAVAILABLE", NOTICE)
            .expect("an unconfigured daemon answers ctl -q UNAVAILABLE");
    }
    let q = cluster.ctl(0, &["-q"]).expect("ctl -q");
    assert_eq!(text(&q.stdout).trim(), "UNAVAILABLE", "{q:?}");

    let out = cluster.ctl(0, &["-N", "-j"]).expect("ctl -N -j");
    assert!(out.status.success(), "ctl -N -j must exit 0: {out:?}");
    let ours: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let nvidia: Value = serde_json::from_str(UNCONFIGURED_SAMPLE).expect("sample");
    let (mut a, mut b) = (Vec::new(), Vec::new());
    shape(&ours, "", &mut a);
    shape(&nvidia, "", &mut b);
    assert_eq!(a, b, "key order and values of the unconfigured sample");
    // Ours on top: the node says it is not configured (no IMEX work), not that it is broken.
    let why = ours["nodes"]["0"]["reason"].as_str().unwrap_or_default();
    assert!(why.starts_with("not configured: "), "node reason: {why:?}");
    let d = cluster.domain(0).expect("parse -N -j");
    assert_eq!(d.status, "DOWN");

    // The job writes the real list; SIGUSR1 re-executes each daemon in place.
    let pids: Vec<_> = (0..2).map(|i| cluster.node(i).pid()).collect();
    for i in 0..2 {
        cluster.write_nodes_file(i, &real).expect("real list");
        cluster.signal(i, Signal::SIGUSR1).expect("SIGUSR1");
    }
    for i in 0..2 {
        let d = cluster.wait_up(i, FORM).expect("domain UP after SIGUSR1");
        assert_eq!(d.nodes.len(), 2, "{}", d.compact());
    }
    let now: Vec<_> = (0..2).map(|i| cluster.node(i).pid()).collect();
    assert_eq!(now, pids, "re-executed in place: same PIDs");
    let q = cluster.ctl(1, &["-q"]).expect("ctl -q");
    assert_eq!(text(&q.stdout).trim(), "READY");
}

/// A configured 3-entry domain whose entry `hole` is `0.0.0.0`: the two real nodes form, the
/// placeholder is UNAVAILABLE with INVALID links (DEGRADED); filled in, with SIGUSR1 to the
/// running two and the third started, the domain is UP with no restart. Entry 0 is the one the
/// derived domain ID comes from, so a last and a first placeholder are both tried.
fn fill_in(hole: usize) {
    let mut cluster = Cluster::prepare(spec(3)).expect("prepare 3 nodes");
    let real = cluster.nodes_lines().to_vec();
    let mut holed = real.clone();
    holed[hole] = "0.0.0.0".to_string();
    let live: Vec<usize> = (0..3).filter(|&i| i != hole).collect();
    let (a, b) = (live[0], live[1]);
    for &i in &live {
        cluster
            .write_nodes_file(i, &holed)
            .expect("file with a placeholder");
        cluster.start_node(i).expect("start");
    }
    let (a32, b32, h32) = (a as u32, b as u32, hole as u32);
    let d = cluster
        .wait_domain(a, FORM, "two real nodes connected", |d| {
            d.connection(a32, b32) == Some("CONNECTED")
                && d.connection(b32, a32) == Some("CONNECTED")
        })
        .expect("the two real nodes form");
    assert_eq!(d.status, "DEGRADED", "{}", d.compact());
    assert_eq!(d.node_status(h32), Some("UNAVAILABLE"), "{}", d.compact());
    assert_eq!(d.nodes[&h32].host, "0.0.0.0");
    for from in 0..3 {
        assert_eq!(d.connection(from, h32), Some("INVALID"), "{}", d.compact());
    }

    let pids: Vec<_> = live.iter().map(|&i| cluster.node(i).pid()).collect();
    for i in 0..3 {
        cluster.write_nodes_file(i, &real).expect("filled in");
    }
    for &i in &live {
        cluster.signal(i, Signal::SIGUSR1).expect("SIGUSR1");
    }
    cluster.start_node(hole).expect("start the filled-in node");
    for i in 0..3 {
        let d = cluster.wait_up(i, FORM).expect("3 nodes UP");
        assert_eq!(d.nodes[&h32].host, real[hole], "{}", d.compact());
    }
    let now: Vec<_> = live.iter().map(|&i| cluster.node(i).pid()).collect();
    assert_eq!(now, pids, "no daemon restarted");
    let added = format!(
        "re-read (SIGUSR1): 1 node added (node {hole} {})",
        real[hole]
    );
    for &i in &live {
        let log = std::fs::read_to_string(cluster.node(i).log_path()).unwrap_or_default();
        let line = log.lines().find(|l| l.contains("re-read (SIGUSR1)"));
        assert!(
            line.is_some_and(|l| l.ends_with(&added)),
            "node {i}: a filled-in placeholder is a node added, not a move: {line:?}"
        );
    }
}

#[test]
fn a_placeholder_line_is_unavailable_and_filling_it_in_brings_the_domain_up() {
    fill_in(2);
}

#[test]
fn filling_in_a_placeholder_at_entry_0_brings_the_domain_up() {
    fill_in(0);
}

/// Under systemd (`Type=notify`): the unconfigured start is complete (`READY=1` with
/// `STATUS=UNAVAILABLE…`), the re-execution is a reload (`RELOADING=1`), and the new image
/// reports `READY=1` with `STATUS=READY`, in the same process.
#[test]
fn under_systemd_the_unconfigured_start_is_ready_and_the_re_execution_a_reload() {
    let mut cluster = Cluster::prepare(spec(1)).expect("prepare");
    let path = cluster.base_dir().join("notify.sock");
    let mut manager = Manager::bind(&path);
    cluster
        .set_node_env(0, "NOTIFY_SOCKET", &path)
        .expect("environment");
    let real = cluster.nodes_lines().to_vec();
    cluster.write_nodes_file(0, &seed()).expect("seed file");
    cluster.start_node(0).expect("start");
    let ready = manager.wait_line("READY=1", NOTICE, &cluster);
    assert!(
        ready
            .lines()
            .any(|l| l.starts_with("STATUS=UNAVAILABLE: unconfigured")),
        "{ready}"
    );
    let pid = cluster.node(0).pid();
    cluster.write_nodes_file(0, &real).expect("real list");
    cluster.signal(0, Signal::SIGUSR1).expect("SIGUSR1");
    manager.wait_line("RELOADING=1", NOTICE, &cluster);
    let ready = manager.wait_line("READY=1", FORM, &cluster);
    assert!(ready.lines().any(|l| l == "STATUS=READY"), "{ready}");
    assert_eq!(cluster.node(0).pid(), pid, "same process");
    assert!(cluster.is_running(0));
    let d = cluster.wait_up(0, FORM).expect("a 1-node domain UP");
    assert_eq!(d.nodes[&0].host, real[0]);
}

/// With `DAEMONIZE=1` (NVIDIA's default, systemd `Type=forking`): the unconfigured daemon forks
/// as usual, and its re-execution does not fork again: the daemon keeps its PID.
#[test]
fn a_daemonized_unconfigured_daemon_keeps_its_pid_across_the_re_execution() {
    let cluster = Cluster::prepare(spec(1).config("DAEMONIZE", "1")).expect("prepare");
    let real = cluster.nodes_lines().to_vec();
    cluster.write_nodes_file(0, &seed()).expect("seed file");
    let cfg = cluster.node(0).config_path().display().to_string();
    let _cleanup = KillOnDrop(vec!["daemon".into(), cfg.clone()]);
    let out = run(Command::new(binary())
        .args(["daemon", "-c", &cfg])
        .stdin(Stdio::null()));
    assert!(
        out.status.success(),
        "the foreground command exits 0: {out:?}"
    );
    cluster
        .wait_state(0, "UNAVAILABLE", NOTICE)
        .expect("the forked daemon answers UNAVAILABLE");
    let pids = find_pids_with_args(&["daemon", &cfg]);
    assert_eq!(pids.len(), 1, "{pids:?}");

    cluster.write_nodes_file(0, &real).expect("real list");
    send_signal(pids[0], Signal::SIGUSR1).expect("SIGUSR1");
    cluster
        .wait_state(0, "READY", FORM)
        .expect("READY after the re-execution");
    assert_eq!(
        find_pids_with_args(&["daemon", &cfg]),
        pids,
        "same single PID"
    );
    send_signal(pids[0], Signal::SIGTERM).expect("SIGTERM");
    assert!(
        crate::common::wait_for(COMMAND, || find_pids_with_args(&["daemon", &cfg])
            .is_empty()),
        "the daemon stops on SIGTERM"
    );
}

/// Without a placeholder, a file that does not name this host is still refused at start-up;
/// and a real address listed twice is refused with its file:line, placeholders around it or not.
#[test]
fn without_a_placeholder_or_with_a_real_duplicate_the_daemon_still_refuses_to_start() {
    let cluster = Cluster::prepare(spec(1)).expect("prepare");
    let cfg = cluster.node(0).config_path().display().to_string();
    let nodes = cluster.node(0).nodes_path().display().to_string();
    let cases = [
        (vec!["192.0.2.1"], "is not in nodes file".to_string()),
        (
            vec!["##", "0.0.0.0", "192.0.2.1", "0.0.0.0", "192.0.2.1"],
            format!("{nodes}:5: node \"192.0.2.1\" is listed twice (first at line 3)"),
        ),
    ];
    for (lines, want) in cases {
        let lines: Vec<String> = lines.into_iter().map(String::from).collect();
        cluster.write_nodes_file(0, &lines).expect("nodes file");
        let out = run(Command::new(binary()).args(["daemon", "-c", &cfg]));
        let stderr = crate::common::assert_clean_failure(&out, "start");
        assert!(stderr.contains(&want), "{want:?} in: {stderr}");
    }
}
