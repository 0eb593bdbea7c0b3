//! Multicast (NVLS) across trays through real daemons (`docs/reference/driver-interface.md` §1.6
//! "Multicast (NVLS) across nodes" 3-5): the importer's GPU attaches go from its driver
//! (REMOTE_GPU_ATTACH) through its daemon to the prime's daemon, which calls
//! ATTACH_REMOTE_GPU on the prime. With no Fabric Manager (the drivers play their own), the
//! team is refused once its last GPU attached, and the prime's objects report it; releasing
//! everything leaves nothing in either driver. A single-tray team through `openimex-lab app
//! multicast` (§6.10: a store lands in every bound GPU, load-reduce sums them), and its
//! process killed with -9: the driver frees the team and its table with it.

use std::time::Duration;

use openimex_client::{Context, CuError};

use serde_json::Value;

use crate::apps::{Held, app, gpu_cluster, num, wait_stats};
use crate::common::{NOTICE, run, text};

#[test]
fn remote_attaches_reach_the_prime_through_the_daemons() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let a = Context::open(d0).expect("a context on node 0");
    let b = Context::open(d1).expect("a context on node 1");
    let size = a.multicast_granularity();
    let prime = a.multicast_create(3, size).expect("create");
    let handle = prime.export().expect("export");
    prime.add_device(0).expect("node 0's GPU 0 joins");
    let imported = b.multicast_import(&handle).expect("import on node 1");
    imported.add_device(0).expect("node 1's GPU 0 joins");
    imported.add_device(1).expect("node 1's GPU 1 joins");

    // Both attaches crossed the daemons; the second completed the count, and no FM can set a
    // team across trays up: the prime fails, and says why.
    let deadline = std::time::Instant::now() + NOTICE;
    let refused = loop {
        match prime.info(Duration::ZERO) {
            Err(e @ CuError::NotSupported(_)) => break e,
            Err(CuError::NotReady(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => panic!("expected the team refused with NOT_SUPPORTED, got {other:?}"),
        }
    };
    assert_eq!(refused.code(), 801, "{refused}");
    let mem = a.mem_create(0, size).expect("memory");
    let late = prime.bind_mem(0, 0, &mem, 0, size).unwrap_err();
    assert_eq!(
        late.name(),
        "CUDA_ERROR_NOT_SUPPORTED",
        "a use of the failed team"
    );
    // The importer heard nothing from an FM: its object is not ready.
    let waiting = imported.info(Duration::ZERO).unwrap_err();
    assert_eq!(waiting.name(), "CUDA_ERROR_NOT_READY", "{waiting}");

    imported.release().expect("release on node 1");
    prime.release().expect("release on node 0");
    a.release(mem).expect("release the memory");
    for (ctx, node) in [(&a, 0), (&b, 1)] {
        let s = ctx.stats().expect("stats");
        assert_eq!(
            (s.multicast_objects, s.multicast_bindings, s.allocations),
            (0, 0, 0),
            "node {node}: nothing left"
        );
    }
}

#[test]
fn a_single_tray_team_stores_everywhere_and_a_killed_holder_leaks_nothing() {
    let cluster = gpu_cluster(1);
    let d0 = cluster.node(0).dir();
    let out = run(&mut app("multicast", d0));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let line: Value = serde_json::from_str(text(&out.stdout).trim()).expect("one JSON line");
    assert_eq!(line["gpus"], 4);
    assert_eq!(line["stored"], true, "the store landed in all 4 GPUs");
    assert_eq!(line["load_reduce_u32"], 1 + 2 + 3 + 4);

    let mut cmd = app("multicast", d0);
    cmd.arg("--hold");
    let held = Held::spawn("multicast holder", &mut cmd);
    let first: Value = serde_json::from_str(&held.line(NOTICE)).expect("one JSON line");
    assert_eq!(first["stored"], true);
    wait_stats(d0, NOTICE, "the held team and its 4 bindings", |s| {
        num(s, "multicast_objects") == 1 && num(s, "multicast_bindings") == 4
    });
    let tables = cluster.fabric_dir().join("multicast");
    assert_eq!(std::fs::read_dir(&tables).map_or(0, |d| d.count()), 1);
    held.kill9();
    wait_stats(d0, NOTICE, "nothing left after kill -9", |s| {
        num(s, "multicast_objects") == 0
            && num(s, "multicast_bindings") == 0
            && num(s, "allocations") == 0
            && num(s, "hbm_used") == 0
    });
    assert_eq!(
        std::fs::read_dir(&tables).map_or(0, |d| d.count()),
        0,
        "no stale team table"
    );
}

/// Multicast under a daemon kill -9 (issue 14; §4 "Daemon dies or restarts"): node 1's
/// daemon dies while an application there holds an imported object whose two GPUs attached
/// (the prime, needing three, counted them: with no FM the full team is refused,
/// NV_ERR_NOT_SUPPORTED). The session teardown disables every holder of an imported multicast
/// object (`rcAndDisableOutstandingClientsWithImportedMemory` matches `bImported` objects of
/// any node): the application is killed and its object freed. The prime is untouched; the
/// restarted daemon opens a new session, and releasing leaves nothing stale in either driver.
#[test]
fn the_importers_daemon_killed_9_revokes_the_importer_and_leaves_nothing_stale() {
    let mut cluster = crate::apps::gpu_cluster(2);
    let (d0, d1) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(1).dir().to_path_buf(),
    );
    let a = Context::open(&d0).expect("a context on node 0");
    let size = a.multicast_granularity();
    let prime = a.multicast_create(3, size).unwrap();
    prime.add_device(0).unwrap();
    let mut cmd = crate::apps::app("multicast", &d1);
    cmd.args(["--gpus", "0,1", "--size", &size.to_string(), "--hold"])
        .args(["--import", &prime.export().unwrap().to_hex()]);
    let mut importer = crate::apps::Held::spawn("node 1's importer", &mut cmd);
    let deadline = std::time::Instant::now() + NOTICE;
    while !matches!(prime.info(Duration::ZERO), Err(CuError::NotSupported(_))) {
        assert!(
            std::time::Instant::now() < deadline,
            "node 1's attaches never reached the prime"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    cluster.kill9(1).expect("kill -9 the daemon of node 1");
    let status = importer.wait(NOTICE);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the revoked importer is killed, as its channels are RC'd: {status:?}; its stderr: {}",
        importer.stderr()
    );
    wait_stats(&d1, NOTICE, "node 1: the importer's object freed", |s| {
        num(s, "multicast_objects") == 0 && num(s, "allocations") == 0
    });
    cluster.start_node(1).expect("restart node 1");
    cluster.wait_up(0, crate::common::FORM).expect("UP again");
    crate::apps::wait_session(&cluster, 1);
    assert!(
        matches!(prime.info(Duration::ZERO), Err(CuError::NotSupported(_))),
        "the prime keeps its state"
    );
    prime.release().unwrap();
    for (d, node) in [(&d0, 0), (&d1, 1)] {
        wait_stats(d, NOTICE, &format!("node {node}: nothing left"), |s| {
            num(s, "multicast_objects") == 0 && num(s, "allocations") == 0
        });
    }
}
