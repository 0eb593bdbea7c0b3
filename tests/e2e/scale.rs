//! Issue 13: `ctl -N` at the sizes NVIDIA's format allows, and large node files. Two real
//! daemons sit in node files of 1,000 and 10,000 entries whose other entries are loopback
//! addresses where nothing listens (127.253.x.y: the harness never hands those out), so every
//! other node is unreachable, as in a large domain where most trays are down.

use std::time::{Duration, Instant};

use openimex_harness::{Cluster, GpuSpec, LinksView};
use serde_json::Value;

use crate::apps::{channel, exporter, held_importer, wait_session};
use crate::common::{spec, text};

/// A node file of `n` entries: cluster node `i` at index `at[i]`, placeholders elsewhere.
fn node_file(cluster: &Cluster, n: usize, at: [usize; 2]) -> Vec<String> {
    let mut hosts: Vec<String> = (0..n)
        .map(|i| format!("127.253.{}.{}", i / 250, i % 250 + 1))
        .collect();
    for (node, index) in at.into_iter().enumerate() {
        hosts[index] = cluster.node(node).ip().to_string();
    }
    hosts
}

/// Waits until the node at index `at[0]` (cluster node 0) sees the one at `at[1]` (cluster
/// node 1) connected and the other way round, on both, through our `--links` view (small: no
/// row for a node that could not be asked).
fn wait_pair(cluster: &Cluster, at: [usize; 2]) {
    let [a, b] = at.map(|i| u32::try_from(i).expect("index fits"));
    let connected = |l: &LinksView, from: u32, to: u32| {
        l.link(from, to).is_some_and(|c| c.status == "CONNECTED")
    };
    for i in 0..2 {
        cluster
            .wait_links(i, FORM_10K, "the two live nodes connected", |l| {
                connected(l, a, b) && connected(l, b, a)
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Gives both cluster nodes `hosts` as their node file.
fn write_node_files(cluster: &Cluster, hosts: &[String]) {
    for i in 0..2 {
        cluster
            .write_nodes_file(i, hosts)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn ctl_n_answers_for_a_thousand_node_domain() {
    const N: usize = 1000;
    const AT: [usize; 2] = [0, 637];
    let mut cluster = Cluster::prepare(spec(2)).expect("prepare 2 nodes");
    let hosts = node_file(&cluster, N, AT);
    write_node_files(&cluster, &hosts);
    for i in 0..2 {
        cluster.start_node(i).unwrap_or_else(|e| panic!("{e}"));
    }
    wait_pair(&cluster, AT);

    // Bounded by the harness's ctl timeout (10 s).
    let started = Instant::now();
    let out = cluster.ctl(0, &["-N", "-j"]).expect("ctl -N -j runs");
    let took = started.elapsed();
    let stderr = text(&out.stderr);
    assert!(
        out.status.success(),
        "ctl -N -j on {N} nodes: {:?}\n{stderr}",
        out.status
    );
    let raw = text(&out.stdout);
    eprintln!("ctl -N -j on {N} nodes: {} bytes in {took:?}", raw.len());
    let line = raw.strip_suffix('\n').unwrap_or(&raw);
    assert!(!line.contains('\n'), "-N -j prints one line");
    let last = line.rfind("\"status\":").expect("a status");
    assert!(
        line[last..].starts_with("\"status\":\"DEGRADED\""),
        "the last \"status\": is the domain's: {}",
        &line[last..]
    );
    let v: Value = serde_json::from_str(line).expect("valid JSON");
    let nodes = v["nodes"].as_object().expect("nodes is an object");
    assert_eq!(nodes.len(), N, "one entry per configured node");
    assert_eq!(v["status"], "DEGRADED");

    // The two live nodes: READY, each connected to the other and to itself.
    for (me, peer) in [(AT[0], AT[1]), (AT[1], AT[0])] {
        let node = &v["nodes"][me.to_string()];
        assert_eq!(node["status"], "READY", "node {me}");
        assert_eq!(node["host"], hosts[me].as_str(), "node {me}");
        assert_eq!(node["version"], "NO_GPU", "node {me}");
        let conns = node["connections"].as_object().expect("connections");
        assert_eq!(conns.len(), N, "node {me} has a cell for every node");
        for to in [me, peer] {
            assert_eq!(conns[&to.to_string()]["status"], "CONNECTED", "{me}->{to}");
            assert_eq!(conns[&to.to_string()]["changed"], true, "{me}->{to}");
        }
        // A placeholder was dialled and never answered.
        let dead = &conns["1"];
        assert_eq!(dead["status"], "NEVER_CONNECTED", "{me}->1: {dead}");
        assert_eq!(dead["host"], hosts[1].as_str());
    }
    // Every other node: UNAVAILABLE, rebuilt from the node file, every cell INVALID.
    for i in (0..N).filter(|i| !AT.contains(i)) {
        let node = &v["nodes"][i.to_string()];
        assert_eq!(node["status"], "UNAVAILABLE", "node {i}");
        assert_eq!(node["host"], hosts[i].as_str(), "node {i}");
        assert_eq!(node["version"], "", "node {i}");
        assert_eq!(node["changed"], false, "node {i}");
        let conns = node["connections"].as_object().expect("connections");
        assert_eq!(conns.len(), N, "node {i}");
        assert!(
            conns
                .values()
                .all(|c| c["status"] == "INVALID" && c["changed"] == false),
            "node {i}: every cell INVALID"
        );
    }

    // The text table: every node listed, the local one marked, a row of N letters each.
    let out = cluster.ctl(0, &["-N"]).expect("ctl -N runs");
    assert!(out.status.success(), "ctl -N: {}", text(&out.stderr));
    let table = text(&out.stdout);
    assert_eq!(table.lines().filter(|l| l.starts_with("Node #")).count(), N);
    let local = format!("Node #0   * {} *", hosts[0]);
    assert!(table.contains(&local), "the local node is marked: {local}");
    let row = table
        .lines()
        .find(|l| l.trim_start().starts_with("500 "))
        .expect("row of node 500");
    assert_eq!(row.split_whitespace().filter(|c| *c == "I").count(), N);
    // NVIDIA's table ends at the domain state; ours follows: why, and a line per down node.
    let (nvidia, why) = table.split_at(table.find("Why: ").expect("a Why line"));
    assert!(nvidia.ends_with("Domain State: DEGRADED\n"));
    assert_eq!(
        why.lines().filter(|l| l.starts_with("  Node #")).count(),
        N - 2
    );
}

/// A hang catcher for a daemon with a 10,000-entry nodes file: 30-41 s was seen on a loaded
/// 2-core machine, so the shared 60 s bound was too tight there.
const FORM_10K: Duration = Duration::from_secs(180);

#[test]
fn two_live_nodes_among_ten_thousand_entries_form() {
    const N: usize = 10_000;
    const AT: [usize; 2] = [3, N - 1];
    let mut cluster = Cluster::prepare(spec(2)).expect("prepare 2 nodes");
    let hosts = node_file(&cluster, N, AT);
    write_node_files(&cluster, &hosts);
    // The first daemon alone: it dials 9,999 dead entries, then retries within its budget.
    cluster.start_node(0).expect("start node 0");
    cluster
        .wait_state(0, "READY", FORM_10K)
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(std::time::Duration::from_secs(2));
    // The second comes up later: its hello is dialled back at once, whatever the first's
    // budget is busy with.
    let started = Instant::now();
    cluster.start_node(1).expect("start node 1");
    wait_pair(&cluster, AT);
    eprintln!(
        "two live nodes among {N} entries connected {:?} after the second started",
        started.elapsed()
    );
    for i in 0..2 {
        let q = cluster.ctl(i, &["-q"]).expect("ctl -q runs");
        assert_eq!(text(&q.stdout), "READY\n", "node {i}: {}", text(&q.stderr));
    }
}

/// Issue 8: a 144-node domain (NVL576 class: 144 trays of 4 GPUs) forms UP, `ctl -N -j`
/// answers for all of it within the command limit, and an export on node 0 is imported on
/// node 143. 288 processes, too many for a debug build inside `cargo test`'s budget: ignored
/// there, run by `.ci/run` on the release build. Correctness only; formation time is measured
/// by `openimex-lab bench formation --nodes 144`.
#[test]
#[ignore = "144 daemons and 144 drivers: .ci/run runs it on the release build"]
fn a_144_node_domain_forms_answers_ctl_and_serves_an_import() {
    const N: usize = 144;
    // 144 daemons and drivers formed in 36 to 100 s on a shared, loaded 2-core machine.
    const FORM_144: Duration = Duration::from_secs(240);
    let gpus = GpuSpec {
        gpus_per_node: 1,
        hbm_mib: 64,
        channels: 1,
        ..GpuSpec::default()
    };
    let mut cluster = Cluster::start(spec(N).with_gpus(gpus)).expect("start 144 nodes");
    cluster
        .wait_up(0, FORM_144)
        .unwrap_or_else(|e| panic!("{e}"));

    // `ctl -N -j` on a node in the middle answers with one row per node, and shows every node
    // READY and every cell CONNECTED. Polled, not one snapshot: with 288 processes on two
    // cores, a heartbeat can miss the peer timeout while the last nodes start, and the link
    // is re-established a moment later; a domain that never shows the whole matrix fails.
    let out = cluster
        .ctl(71, &["-N", "-j"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "ctl -N -j: {}", text(&out.stderr));
    let v: Value = serde_json::from_str(&text(&out.stdout)).expect("ctl -N -j prints JSON");
    let nodes = v["nodes"].as_object().expect("a nodes object");
    assert_eq!(nodes.len(), N, "one row per node");
    cluster
        .wait_domain(
            71,
            FORM_144,
            "node 71 shows all 144 nodes READY and every link CONNECTED",
            |d| d.nodes.len() == N && d.all_ready() && d.all_connected(),
        )
        .unwrap_or_else(|e| panic!("{e}"));

    // An import across the whole domain: node 143 maps node 0's export.
    for i in [0, N - 1] {
        wait_session(&cluster, i);
    }
    let (d0, dn) = (cluster.node(0).dir(), cluster.node(N - 1).dir());
    let (exp, handle) = exporter(d0, &channel(&cluster, 0, 0), 8, "exporter on node 0");
    let imp = held_importer(
        dn,
        &channel(&cluster, N - 1, 0),
        &handle,
        8,
        "importer on 143",
    );
    drop(imp);
    drop(exp);
    cluster.shutdown().unwrap_or_else(|e| panic!("{e}"));
}
