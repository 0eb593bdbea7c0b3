//! Faults under live imports: an importer's or exporter's daemon killed and restarted, a
//! GPU driver that dies. Nothing may keep a mapping to memory that can be freed, and every
//! reference must come back to zero.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::apps::*;
use crate::common::{FORM, NOTICE};

/// Waits until a held process dies of SIGKILL (revoked by its node's driver).
#[track_caller]
pub(crate) fn expect_revoked(mut held: Held) {
    let status = held.wait(NOTICE);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{}: a revoked importer is killed, as the real driver RCs its channels: {status:?}",
        held.what
    );
}

#[test]
fn importer_daemon_killed_revokes_its_importers_and_the_exporter_releases_on_restart() {
    let mut cluster = gpu_cluster(2);
    let (d0, d1) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(1).dir().to_path_buf(),
    );
    let (mut exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 55, "exporter on node 0");
    let imp = held_importer(
        &d1,
        &channel(&cluster, 1, 0),
        &handle,
        55,
        "importer on node 1",
    );
    wait_stats(&d0, NOTICE, "node 0 holds one reference for node 1", |s| {
        num(s, "daemon_export_refs") == 1
    });

    // The importer's daemon dies: its driver tears the session down, which disables (kills)
    // every client that imported remote memory.
    cluster.kill9(1).expect("kill -9 the daemon of node 1");
    expect_revoked(imp);
    wait_stats(&d1, NOTICE, "node 1 dropped the dead import", |s| {
        num(s, "import_refs") == 0 && num(s, "import_descriptors") == 0
    });
    // The exporter keeps its reference while node 1 is away (grace time -1: wait for it).
    assert_eq!(num(&stats(&d0), "daemon_export_refs"), 1);

    // Node 1 comes back as a new instance: node 0 releases what it held for the old one.
    cluster.start_node(1).expect("restart node 1");
    cluster.wait_up(0, FORM).expect("UP again");
    wait_stats(
        &d0,
        NOTICE,
        "node 0 released the old instance's reference",
        |s| num(s, "daemon_export_refs") == 0,
    );
    assert_eq!(
        exp.ask("verify 55"),
        "ok",
        "the exporter's own memory is intact"
    );
    exp.exit();
    wait_all_released(&cluster, "after the exporter exit");
}

#[test]
fn exporter_daemon_killed_then_restarted_revokes_remote_importers() {
    let mut cluster = gpu_cluster(2);
    let (d0, d1) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(1).dir().to_path_buf(),
    );
    let (exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 66, "exporter on node 0");
    let mut imp = held_importer(
        &d1,
        &channel(&cluster, 1, 0),
        &handle,
        66,
        "importer on node 1",
    );

    // The exporter's daemon dies: its driver drops the daemon's (dangling) references.
    cluster.kill9(0).expect("kill -9 the daemon of node 0");
    wait_stats(
        &d0,
        NOTICE,
        "node 0's session is gone and its references dropped",
        |s| s["session"] == Value::Bool(false) && num(s, "daemon_export_refs") == 0,
    );
    // Node 1 waits for node 0 (grace time -1): its importer is left alone meanwhile.
    assert_eq!(imp.ask("verify 66"), "ok");

    // Node 0 restarts as a new instance: node 1 cleans up its imports from the old one and
    // disables (kills) the importers still mapping memory that may now be reused.
    cluster.start_node(0).expect("restart node 0");
    cluster.wait_up(1, FORM).expect("UP again");
    expect_revoked(imp);
    wait_stats(
        &d1,
        NOTICE,
        "node 1 holds nothing from node 0's old instance",
        |s| {
            num(s, "import_refs") == 0
                && num(s, "import_descriptors") == 0
                && num(s, "pending_unimports") == 0
        },
    );
    exp.exit();
    wait_all_released(&cluster, "after the exporter exit");
}

#[test]
fn daemon_exits_with_a_clear_error_when_its_gpu_driver_dies() {
    let mut cluster = gpu_cluster(2);
    cluster.kill_driver(1).expect("kill -9 node 1's GPU driver");
    let deadline = Instant::now() + NOTICE;
    while cluster.is_running(1) {
        assert!(
            Instant::now() < deadline,
            "node 1's daemon must stop when its driver is gone"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let exit = cluster.node(1).last_exit().expect("exit status");
    assert_eq!(
        exit.code(),
        Some(1),
        "a lost driver is a failure exit: {exit:?}"
    );
    let log = std::fs::read_to_string(cluster.node(1).log_path()).unwrap_or_default();
    assert!(
        log.contains("lost the GPU driver"),
        "the log says why:\n{log}"
    );
    // Its peer sees a lost node (not a departure: no goodbye for a failure).
    cluster
        .wait_links(0, NOTICE, "0->1 not connected", |l| {
            l.link(0, 1).is_some_and(|c| c.status == "RECOVERING")
        })
        .expect("node 0 notices");
    // Driver and daemon back: the domain recovers.
    cluster
        .start_node(1)
        .expect("restart node 1 (driver first)");
    cluster.wait_up(0, FORM).expect("UP again");
}

#[test]
fn unimport_during_a_partition_is_delivered_when_the_exporter_is_back() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(1).dir().to_path_buf(),
    );
    let (mut exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 77, "exporter on node 0");
    let imp = held_importer(
        &d1,
        &channel(&cluster, 1, 0),
        &handle,
        77,
        "importer on node 1",
    );
    wait_stats(&d0, NOTICE, "node 0 holds one reference", |s| {
        num(s, "daemon_export_refs") == 1
    });

    // The exporter's daemon hangs (no FIN, no reset): node 1 finds out by heartbeat.
    cluster
        .signal(0, openimex_harness::Signal::SIGSTOP)
        .expect("SIGSTOP node 0's daemon");
    cluster
        .wait_links(1, NOTICE, "1->0 RECOVERING", |l| {
            l.link(1, 0).is_some_and(|c| c.status == "RECOVERING")
        })
        .expect("node 1 notices the hung exporter");
    // The importer releases meanwhile: it must not hang on the unreachable exporter.
    imp.exit();
    wait_stats(&d1, NOTICE, "node 1 finished the unimport locally", |s| {
        num(s, "import_refs") == 0 && num(s, "pending_unimports") == 0
    });

    // Same instance back: the deferred unimport reaches it and its reference goes.
    cluster
        .signal(0, openimex_harness::Signal::SIGCONT)
        .expect("SIGCONT node 0's daemon");
    cluster.wait_up(1, FORM).expect("UP again");
    wait_stats(&d0, NOTICE, "node 0 released the reference", |s| {
        num(s, "daemon_export_refs") == 0
    });
    assert_eq!(exp.ask("verify 77"), "ok");
    exp.exit();
    wait_all_released(&cluster, "after the exporter exit");
}
