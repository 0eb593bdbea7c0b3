//! A clean stop under live imports (issue 7 item 2): SIGTERM says goodbye, the peers disable
//! their importers of this node's memory and acknowledge, and only then are the references held
//! for them released, so the driver's session ends with nothing dangling and fabric allocation
//! stays enabled (docs/reference/driver-interface.md §4 "Daemon dies or restarts", item 1). A peer that cannot
//! be told (hung) keeps its references dangling: the driver then disables fabric allocation, as
//! it does for a crash, so no memory a remote importer may map is reused. Either way the daemon
//! exits 0 within 5 s.

use std::time::Duration;

use openimex_harness::Signal;

use crate::apps::*;
use crate::common::{FORM, NOTICE};

/// The driver log of node `i` (its `openimex-lab gpu` output, `gpu.log` in the node directory).
fn driver_log(cluster: &openimex_harness::Cluster, i: usize) -> String {
    std::fs::read_to_string(cluster.node(i).dir().join("gpu.log")).expect("the driver's gpu.log")
}

/// What the driver said when the daemon's session closed: whether fabric allocation stays
/// enabled (the last "IMEX session of node N closed" line of its log, waited for).
#[track_caller]
fn allocation_enabled_after_close(cluster: &openimex_harness::Cluster, i: usize) -> bool {
    let until = std::time::Instant::now() + NOTICE;
    loop {
        let log = driver_log(cluster, i);
        if let Some(line) = log
            .lines()
            .rev()
            .find(|l| l.contains("IMEX session of node"))
        {
            return line.contains("fabric allocations still enabled");
        }
        assert!(
            std::time::Instant::now() < until,
            "no session-close line in:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_releases_references_after_peers_acknowledge_and_keeps_allocation_enabled() {
    let mut cluster = gpu_cluster(2);
    let (d0, d1) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(1).dir().to_path_buf(),
    );
    let (mut exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 31, "exporter on node 0");
    let mut imp = held_importer(&d1, &channel(&cluster, 1, 0), &handle, 31, "importer on 1");
    wait_stats(&d0, NOTICE, "node 0 holds node 1's reference", |s| {
        num(s, "daemon_export_refs") == 1
    });

    let out = cluster
        .stop(0, Duration::from_secs(10))
        .expect("SIGTERM node 0");
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(5), "{out:?}");
    // Node 1 disabled (killed) its importer of node 0's memory before acknowledging.
    let status = imp.wait(NOTICE);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{status:?}"
    );
    let s0 = stats(&d0);
    assert_eq!(s0["session"], serde_json::Value::Bool(false));
    assert_eq!(num(&s0, "daemon_export_refs"), 0, "nothing left dangling");
    assert!(
        !driver_log(&cluster, 0).contains("Abrupt"),
        "the driver saw a clean shutdown"
    );
    assert!(
        allocation_enabled_after_close(&cluster, 0),
        "fabric allocation stays enabled after a clean stop"
    );
    assert_eq!(exp.ask("verify 31"), "ok");
    cluster.start_node(0).expect("start node 0 again");
    cluster.wait_up(1, FORM).expect("UP again");
    exp.exit();
    wait_all_released(&cluster, "after the exporter exit");
}

#[test]
fn sigterm_with_a_hung_peer_exits_in_time_and_leaves_its_references_dangling() {
    let mut cluster = gpu_cluster(2);
    let d0 = cluster.node(0).dir().to_path_buf();
    let d1 = cluster.node(1).dir().to_path_buf();
    let (exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 32, "exporter on node 0");
    let imp = held_importer(&d1, &channel(&cluster, 1, 0), &handle, 32, "importer on 1");
    wait_stats(&d0, NOTICE, "node 0 holds node 1's reference", |s| {
        num(s, "daemon_export_refs") == 1
    });
    cluster.signal(1, Signal::SIGSTOP).expect("SIGSTOP node 1");

    let out = cluster
        .stop(0, Duration::from_secs(10))
        .expect("SIGTERM node 0");
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(5), "{out:?}");
    // Node 1 could not be told: its importer may still map node 0's memory, so the reference
    // stayed held until the session closed, and the driver disabled fabric allocation.
    assert!(
        !allocation_enabled_after_close(&cluster, 0),
        "fabric allocation is disabled while a remote importer may still map this memory"
    );
    assert!(driver_log(&cluster, 0).contains("Abrupt"));
    cluster.signal(1, Signal::SIGCONT).expect("SIGCONT node 1");
    drop(imp);
    drop(exp);
}
