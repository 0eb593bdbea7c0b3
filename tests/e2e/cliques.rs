//! Cliques enforced and fabric health reported, end to end (issue 14 items 3 and 4): real
//! daemons on three nodes with simulated GPUs. A Fabric Manager's probe update (the root-only
//! CompleteFabricProbe control, the entry point the Fabric Manager uses) moves node 1's GPUs to
//! another clique; its driver posts CLIQUE_ID_CHANGE on channel 0, its daemon logs it, and
//! `ctl --fabric` on either side shows the new clique and marks the other node outside
//! (`docs/reference/driver-interface.md` §1.6 "Other events", §5). Memory of node 1 imports on
//! node 0 but its map is refused with the driver's NV_ERR_INVALID_STATE, which the app reports
//! as CUDA_ERROR_ILLEGAL_STATE (401), while memory of node 2 (same clique) maps and verifies
//! (§1.6 "Map", §6.8). A GPU's health change (LIMITED_CAPACITY with DEGRADED_BW) shows in
//! `ctl --fabric` and in the metrics. A daemon tells its peers its node's cliques (in its hello,
//! and in a session notification when they change), and a peer outside the receiver's clique
//! is logged.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use openimex_fabric_manager::probe::{Flag, HealthField, HealthMask};
use openimex_harness::{Cluster, ClusterSpec, FabricManagerSpec, GpuSpec};
use openimex_simproto::probe::{HealthSummary, ProbeInfo};
use openimex_simproto::proto::{self, Request, Response};
use serde_json::Value;

use crate::apps::*;
use crate::common::{
    FORM, NOTICE, assert_clean_failure, binary, lab_binary, run, spec, text, wait_for,
    wait_log_line,
};

/// The metrics port (each node has its own loopback address).
const METRICS_PORT: u16 = 9464;
const GPUS: u32 = 2;

/// The Fabric Manager's probe update for GPU `gpu` of the node in `node_dir`: its current
/// answer with `change` applied.
fn probe_update(node_dir: &Path, gpu: u32, change: impl FnOnce(&mut ProbeInfo)) {
    let socket = openimex_simproto::node_dir::socket_path(node_dir);
    let conn = UnixStream::connect(&socket).expect("connect to the driver");
    conn.set_read_timeout(Some(NOTICE)).expect("timeout");
    let Ok(Response::FabricProbeInfo(p)) =
        proto::call(&conn, &Request::FabricProbeInfo { gpu }, &[])
    else {
        panic!("no probe info for GPU {gpu}");
    };
    let mut info = p.info.expect("the probe is complete");
    change(&mut info);
    let req = Request::CompleteFabricProbe { gpu, info };
    assert_eq!(proto::call(&conn, &req, &[]).expect("call"), Response::Ok);
}

/// `ctl --fabric -j` on node `i`.
fn fabric_json(cluster: &Cluster, i: usize) -> Value {
    let out = cluster.ctl(i, &["--fabric", "-j"]).expect("run ctl");
    assert!(
        out.status.success(),
        "ctl --fabric -j: {}",
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("ctl --fabric -j is JSON")
}

/// Waits until node `i`'s `ctl --fabric -j` satisfies `ok`; returns it.
#[track_caller]
fn wait_fabric(cluster: &Cluster, i: usize, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    let done = wait_for(NOTICE, || {
        last = fabric_json(cluster, i);
        ok(&last)
    });
    assert!(done, "node {i}: {what}; last ctl --fabric -j:\n{last:#}");
    last
}

fn node_cliques(v: &Value, node: usize) -> Vec<u64> {
    v["nodes"][node]["cliques"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

fn outside(v: &Value, node: usize) -> bool {
    v["nodes"][node]["outside_clique"] == Value::Bool(true)
}

/// `GET /metrics` of node `i`.
fn scrape(cluster: &Cluster, i: usize) -> String {
    let addr = SocketAddr::from((cluster.node(i).ip(), METRICS_PORT));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

#[test]
fn a_clique_change_is_logged_shown_and_enforced_and_health_is_reported() {
    let spec = spec(3).with_gpus(GpuSpec {
        gpus_per_node: GPUS,
        hbm_mib: 256,
        channels: 1,
        ..GpuSpec::default()
    });
    let mut cluster = Cluster::prepare(spec).expect("prepare 3 nodes");
    let metrics = SocketAddr::from((cluster.node(0).ip(), METRICS_PORT)).to_string();
    cluster
        .set_node_config(0, "OPENIMEX_METRICS_ADDR", &metrics)
        .expect("set the metrics address");
    for i in 0..3 {
        cluster.start_node(i).expect("start a node");
    }
    cluster.wait_up(0, FORM).expect("domain UP");
    for i in 0..3 {
        wait_session(&cluster, i);
    }
    let dirs: Vec<&Path> = (0..3).map(|i| cluster.node(i).dir()).collect();

    // Every node starts in the drivers' default clique, 1: nobody is outside.
    let before = wait_fabric(&cluster, 0, "every node's clique known", |v| {
        (0..3).all(|n| node_cliques(v, n) == [1])
    });
    assert!((0..3).all(|n| !outside(&before, n)), "{before:#}");
    assert_eq!(before["gpus"][0]["bw_mode_name"], "FULL");

    // Exports on node 1 (to become another clique) and node 2 (staying in node 0's).
    let (exp1, h1) = exporter(dirs[1], &channel(&cluster, 1, 0), 31, "exporter on node 1");
    let (exp2, h2) = exporter(dirs[2], &channel(&cluster, 2, 0), 32, "exporter on node 2");

    // The Fabric Manager moves node 1's GPUs to clique 2 (§5: a partition change).
    let log_from = std::fs::metadata(cluster.node(1).log_path()).map_or(0, |m| m.len() as usize);
    let log0_from = std::fs::metadata(cluster.node(0).log_path()).map_or(0, |m| m.len() as usize);
    for gpu in 0..GPUS {
        probe_update(dirs[1], gpu, |i| i.clique_id = 2);
    }
    // §1.6 "Other events": CLIQUE_ID_CHANGE reaches node 1's daemon, which names the GPU and
    // the old and new clique.
    let line = wait_log_line(
        &cluster,
        1,
        log_from,
        &["CLIQUE_ID_CHANGE", "GPU 0", "1 to clique 2"],
    );
    assert!(line.contains("CLIQUE_ID_CHANGE"), "{line}");
    wait_log_line(&cluster, 1, log_from, &["CLIQUE_ID_CHANGE", "GPU 1"]);
    // Node 1's daemon tells its peers on their sessions; node 0 logs node 1 outside its clique.
    wait_log_line(
        &cluster,
        0,
        log0_from,
        &[
            "peer node 1 is in clique(s) [2]",
            "outside this node's clique(s) [1]",
        ],
    );

    // ctl --fabric on node 0 and on node 1 show the new clique and mark the other side.
    let v0 = wait_fabric(&cluster, 0, "node 1 in clique 2, outside", |v| {
        node_cliques(v, 1) == [2] && outside(v, 1)
    });
    assert!(!outside(&v0, 2), "node 2 shares node 0's clique: {v0:#}");
    let v1 = wait_fabric(&cluster, 1, "node 1 sees itself in clique 2", |v| {
        v["cliques"] == serde_json::json!([2]) && outside(v, 0) && outside(v, 2)
    });
    assert_eq!(v1["gpus"][1]["clique_id"], 2, "{v1:#}");
    let out = cluster.ctl(0, &["--fabric"]).expect("ctl --fabric");
    let table = text(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.trim_start().starts_with('1') && l.contains(&cluster.node(1).ip().to_string()))
        .unwrap_or_else(|| panic!("no row for node 1:\n{table}"));
    assert!(row.contains("OUTSIDE this node's clique"), "{table}");

    // §6.8: node 1's memory imports on node 0 but does not map there: the driver's
    // NV_ERR_INVALID_STATE is CUDA_ERROR_ILLEGAL_STATE (401) to the app.
    let out = run(&mut importer(
        dirs[0],
        &channel(&cluster, 0, 0),
        &h1,
        &["--verify", "31"],
    ));
    let stderr = assert_clean_failure(&out, "map of memory from another clique");
    assert!(
        stderr.contains("CUDA_ERROR_ILLEGAL_STATE (401)")
            && stderr.contains("cliqueId does not match"),
        "the map across cliques is refused with the driver's status: {stderr}"
    );
    assert!(
        !text(&out.stdout).contains("verified"),
        "{}",
        text(&out.stdout)
    );
    // Node 2's memory (same clique) maps and verifies, on either GPU of node 0.
    let out = run(&mut importer(
        dirs[0],
        &channel(&cluster, 0, 0),
        &h2,
        &["--verify", "32", "--gpu", "1"],
    ));
    assert!(
        out.status.success() && text(&out.stdout).contains("verified"),
        "in-clique import: {}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    // §5 health: GPU 1 of node 0 loses bandwidth (a switch tray down): LIMITED_CAPACITY with
    // DEGRADED_BW. The daemon's periodic read shows it in ctl --fabric and in the metrics.
    let degraded = HealthMask::healthy(true)
        .with(HealthField::DegradedBw, Flag::True)
        .0;
    probe_update(dirs[0], 1, |i| {
        i.health_summary = HealthSummary::LimitedCapacity;
        i.health_mask = degraded;
    });
    let v = wait_fabric(&cluster, 0, "GPU 1 LIMITED_CAPACITY", |v| {
        v["gpus"][1]["health_summary"] == "LIMITED_CAPACITY"
    });
    assert_eq!(v["gpus"][1]["health"]["DEGRADED_BW"], "TRUE", "{v:#}");
    assert_eq!(v["gpus"][0]["health_summary"], "HEALTHY", "{v:#}");
    let series = "openimex_gpu_fabric_health{gpu=\"1\",summary=\"LIMITED_CAPACITY\"} 1";
    let mut body = String::new();
    let shown = wait_for(NOTICE, || {
        body = scrape(&cluster, 0);
        body.contains(series)
    });
    assert!(shown, "no {series} in the metrics:\n{body}");
    assert!(
        body.contains("openimex_gpu_fabric_clique_id{gpu=\"0\"} 1"),
        "{body}"
    );

    exp1.exit();
    exp2.exit();
    wait_all_released(&cluster, "after the exports end");

    // Each daemon's hello carries its node's cliques: node 1's daemon restarted, node 0 logs
    // it as outside its clique.
    let from0 = std::fs::metadata(cluster.node(0).log_path()).map_or(0, |m| m.len() as usize);
    cluster.restart(1).expect("restart node 1's daemon");
    wait_log_line(
        &cluster,
        0,
        from0,
        &[
            "peer node 1 is in clique(s) [2]",
            "outside this node's clique(s) [1]",
        ],
    );
}

/// The same path driven by the Fabric Manager itself (§5: "A clique change emits a
/// CLIQUE_ID_CHANGE event to the daemon"; §6.8): the operator creates a partition of tray 1
/// at run time, the FM posts the probe updates to tray 1's driver, its daemon logs
/// CLIQUE_ID_CHANGE, `ctl --fabric` on tray 0 marks tray 1 outside, and tray 1's memory
/// imported on tray 0 is refused at map (CUDA_ERROR_ILLEGAL_STATE, 401). Moving the tray back
/// makes the same import map and verify.
#[test]
fn a_partition_made_by_the_fabric_manager_reaches_the_daemons_and_the_map_check() {
    let mut spec = ClusterSpec::from_topology(FabricManagerSpec::preset("nvl36"), binary())
        .expect("spec from the topology")
        .with_lab_binary(lab_binary());
    spec.nodes = 2;
    let cluster = gpu_cluster_from(spec);
    for i in 0..2 {
        wait_session(&cluster, i);
    }
    wait_fabric(&cluster, 0, "both trays in clique 1", |v| {
        (0..2).all(|n| node_cliques(v, n) == [1])
    });
    let dirs: Vec<&Path> = (0..2).map(|i| cluster.node(i).dir()).collect();
    let (exp, h) = exporter(dirs[1], &channel(&cluster, 1, 0), 41, "exporter on tray 1");

    let log_from = std::fs::metadata(cluster.node(1).log_path()).map_or(0, |m| m.len() as usize);
    let out = cluster
        .fabric(&["partition", "create", "1"])
        .expect("run openimex-lab fabric");
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_log_line(
        &cluster,
        1,
        log_from,
        &["CLIQUE_ID_CHANGE", "GPU 0", "1 to clique 2"],
    );
    wait_fabric(&cluster, 0, "tray 1 in clique 2, outside", |v| {
        node_cliques(v, 1) == [2] && outside(v, 1)
    });
    let out = run(&mut importer(
        dirs[0],
        &channel(&cluster, 0, 0),
        &h,
        &["--verify", "41"],
    ));
    let stderr = assert_clean_failure(&out, "map across the FM's partitions");
    assert!(
        stderr.contains("CUDA_ERROR_ILLEGAL_STATE (401)"),
        "the map across partitions is refused with the driver's status: {stderr}"
    );

    // Back in one partition: the same memory maps and verifies.
    let out = cluster
        .fabric(&["partition", "move", "1", "0"])
        .expect("run openimex-lab fabric");
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_fabric(&cluster, 0, "tray 1 back in clique 1", |v| {
        node_cliques(v, 1) == [1] && !outside(v, 1)
    });
    let out = run(&mut importer(
        dirs[0],
        &channel(&cluster, 0, 0),
        &h,
        &["--verify", "41"],
    ));
    assert!(
        out.status.success() && text(&out.stdout).contains("verified"),
        "same clique again: {}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    exp.exit();
    wait_all_released(&cluster, "after the export ends");
}
