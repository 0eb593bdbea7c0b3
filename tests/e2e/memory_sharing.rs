//! Fabric memory across nodes, end to end: `openimex-lab app` processes export on one node and
//! import on another through the simulated GPU drivers and the IMEX daemons
//! (docs/DESIGN.md §1–§2, docs/reference/driver-interface.md §4). Each test reads the drivers' counters
//! (`openimex-lab app stats`) to show that references are taken where the driver interface says
//! and always return to zero: no leak, no memory freed under an importer. Where a test asserts a
//! driver status, its comment names the section of `docs/reference/driver-interface.md` the
//! simulated driver follows there.

use std::process::Command;
use std::time::{Duration, Instant};

use openimex_harness::process::run_with_timeout;
use openimex_harness::{Cluster, GpuSpec};
use serde_json::Value;

use crate::apps::*;
use crate::common::{FORM, NOTICE, assert_clean_failure, lab_binary, run, spec, text};

#[test]
fn cross_node_round_trip() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let (mut exp, handle) = exporter(d0, &channel(&cluster, 0, 0), 11, "exporter on node 0");

    let out = run(&mut importer(
        d1,
        &channel(&cluster, 1, 0),
        &handle,
        &["--verify", "11", "--write", "22"],
    ));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "import on node 1 must succeed: {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        text(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            format!("verified {SIZE_BYTES}"),
            format!("written {SIZE_BYTES}")
        ],
        "the importer reads the exporter's pattern and writes its own"
    );

    // Zero copy: node 0's process sees node 1's stores in the same memory.
    assert_eq!(exp.ask("verify-write 22"), "ok", "A must see B's writes");
    exp.exit();
    wait_all_released(&cluster, "after the round trip");

    // The memory is gone: its handle no longer resolves on the exporter's node.
    let out = run(&mut importer(
        d1,
        &channel(&cluster, 1, 0),
        &handle,
        &["--verify", "11"],
    ));
    let stderr = assert_clean_failure(&out, "import of a released export");
    assert!(
        stderr.contains("CUDA_ERROR_INVALID_HANDLE (400)"),
        "a freed export is an invalid handle: {stderr}"
    );
    wait_all_released(&cluster, "after the refused import");
}

#[test]
fn import_without_channel_or_with_another_channel_is_refused() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let (mut exp, handle) = exporter(d0, &channel(&cluster, 0, 0), 12, "exporter on node 0");

    let mut no_channel = app("import", d1);
    no_channel
        .arg("--no-channel")
        .args(["--handle", &handle, "--verify", "12"]);
    let out = run(&mut no_channel);
    let stderr = assert_clean_failure(&out, "import without a channel");
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("CUDA_ERROR_NOT_PERMITTED (800)"),
        "import without a channel: {stderr}"
    );
    assert!(
        !text(&out.stdout).contains("verified"),
        "nothing may be read without a channel: {}",
        text(&out.stdout)
    );

    // Another channel, across nodes: the exporter's daemon refuses the dup (§2), and the
    // importer's daemon can only fail the import with VALIDATE's IMPORT_FAILED flag, which
    // carries no status: the app sees NV_ERR_INVALID_OBJECT (§4 "Failed import"), never the
    // exporter's INSUFFICIENT_PERMISSIONS.
    let out = run(&mut importer(
        d1,
        &channel(&cluster, 1, 1),
        &handle,
        &["--verify", "12"],
    ));
    let stderr = assert_clean_failure(&out, "import with channel1 of memory exported on channel0");
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("CUDA_ERROR_INVALID_HANDLE (400)")
            && stderr.contains("NV_ERR_INVALID_OBJECT"),
        "import with another channel is a failed import (INVALID_OBJECT): {stderr}"
    );
    assert!(
        !text(&out.stdout).contains("verified"),
        "nothing may be read with another channel: {}",
        text(&out.stdout)
    );

    wait_stats(
        d1,
        NOTICE,
        "node 1 holds no import after the refusals",
        |s| num(s, "import_refs") == 0 && num(s, "import_descriptors") == 0,
    );
    let s0 = stats(d0);
    assert_eq!(
        num(&s0, "daemon_export_refs"),
        0,
        "a refused import takes no reference on the export: {s0}"
    );

    // The export itself is untouched.
    assert_eq!(exp.ask("verify 12"), "ok");
    exp.exit();
    wait_all_released(&cluster, "after the refused imports");
}

#[test]
fn exporter_release_keeps_memory_alive_for_importer() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let (ch0, ch1) = (channel(&cluster, 0, 0), channel(&cluster, 1, 0));

    // Phase 1: the exporter releases its memory while node 1 holds an import of it.
    let (mut exp, handle) = exporter(d0, &ch0, 33, "exporter on node 0");
    let mut imp = held_importer(d1, &ch1, &handle, 33, "importer on node 1");
    assert_eq!(exp.ask("release"), "released");
    let alive = |what: &str| {
        let s = stats(d0);
        assert!(
            num(&s, "daemon_export_refs") == 1
                && num(&s, "allocations") == 1
                && num(&s, "hbm_used") > 0,
            "{what}: node 0 must keep the memory for node 1's importer \
             (daemon_export_refs 1, allocations 1, hbm_used > 0): {s}"
        );
    };
    alive("after the exporter's release");
    assert_eq!(
        imp.ask("verify 33"),
        "ok",
        "the importer still reads the data after the exporter released it"
    );
    alive("after the importer read again");
    imp.exit();
    wait_stats(
        d0,
        NOTICE,
        "node 0 frees the memory once node 1 released it",
        |s| {
            num(s, "daemon_export_refs") == 0
                && num(s, "allocations") == 0
                && num(s, "hbm_used") == 0
        },
    );
    exp.exit();
    wait_all_released(&cluster, "after release, then import exit");

    // Phase 2: the exporter process is SIGKILLed instead.
    let (exp, handle) = exporter(d0, &ch0, 34, "second exporter on node 0");
    let mut imp = held_importer(d1, &ch1, &handle, 34, "second importer on node 1");
    let clients = num(&stats(d0), "clients");
    exp.kill9();
    let s = wait_stats(
        d0,
        NOTICE,
        "node 0's driver notices the exporter's death (one client fewer)",
        |s| num(s, "clients") < clients,
    );
    assert!(
        num(&s, "daemon_export_refs") == 1
            && num(&s, "allocations") == 1
            && num(&s, "hbm_used") > 0,
        "after the exporter died, node 0 must keep the memory for node 1's importer \
         (daemon_export_refs 1, allocations 1, hbm_used > 0): {s}"
    );
    assert_eq!(
        imp.ask("verify 34"),
        "ok",
        "the importer still reads the data after the exporter died"
    );
    imp.exit();
    wait_all_released(&cluster, "after exporter SIGKILL, then import exit");
}

#[test]
fn importer_exit_without_release_is_cleaned_up() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let (mut exp, handle) = exporter(d0, &channel(&cluster, 0, 0), 44, "exporter on node 0");

    let out = run(&mut importer(
        d1,
        &channel(&cluster, 1, 0),
        &handle,
        &["--no-release", "--verify", "44"],
    ));
    assert!(
        out.status.success(),
        "import --no-release must exit 0: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout).trim(), format!("verified {SIZE_BYTES}"));

    wait_stats(
        d1,
        NOTICE,
        "node 1 cleans up the import of the exited process (unimport finished)",
        |s| {
            num(s, "import_refs") == 0
                && num(s, "import_descriptors") == 0
                && num(s, "pending_unimports") == 0
        },
    );
    wait_stats(
        d0,
        NOTICE,
        "node 0 drops the daemon's export reference after the unimport",
        |s| num(s, "daemon_export_refs") == 0,
    );
    // The exporter's own memory is untouched.
    assert_eq!(exp.ask("verify 44"), "ok");
    exp.exit();
    wait_all_released(&cluster, "after the exporter exit");
}

#[test]
fn import_with_no_daemon_on_the_importer_node() {
    let mut cluster = gpu_cluster(2);
    let d0 = cluster.node(0).dir().to_path_buf();
    let d1 = cluster.node(1).dir().to_path_buf();
    let ch1 = channel(&cluster, 1, 0);
    let (mut exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 55, "exporter on node 0");

    cluster.kill9(1).expect("kill -9 node 1's daemon");
    wait_stats(
        &d1,
        NOTICE,
        "node 1's driver loses its session (node ID back to 0xFFFF)",
        |s| s["session"] == Value::Bool(false) && num(s, "node_id") == NO_NODE,
    );
    // The packet names node 0, a real node: IMPORT_V2 passes its export-node check (§1.4,
    // §1.6 "Import request" 2) and fails to post its MEM_IMPORT with no daemon session:
    // NV_ERR_NOT_READY at once (§1.6 "Import request" 4, §6.5), not after the 30 s timeout.
    let started = Instant::now();
    let out = run(&mut importer(&d1, &ch1, &handle, &["--verify", "55"]));
    let stderr = assert_clean_failure(&out, "import on a node without a daemon");
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("CUDA_ERROR_NOT_READY (600)") && stderr.contains("NV_ERR_NOT_READY"),
        "an import on a node with no daemon must be refused as NOT_READY: {stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refused at once: {:?}",
        started.elapsed()
    );
    let s1 = stats(&d1);
    assert!(
        num(&s1, "import_refs") == 0 && num(&s1, "import_descriptors") == 0,
        "a refused import holds nothing: {s1}"
    );

    cluster.start_node(1).expect("restart node 1's daemon");
    cluster.wait_up(0, FORM).expect("domain UP again");
    wait_session(&cluster, 1);
    let out = run(&mut importer(&d1, &ch1, &handle, &["--verify", "55"]));
    assert!(
        out.status.success(),
        "the same import must succeed once node 1 has a daemon again: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout).trim(), format!("verified {SIZE_BYTES}"));

    assert_eq!(exp.ask("verify 55"), "ok");
    exp.exit();
    wait_all_released(&cluster, "after the import through the restarted daemon");
}

#[test]
fn many_importers_share_one_descriptor() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let ch1 = channel(&cluster, 1, 0);
    let (mut exp, handle) = exporter(d0, &channel(&cluster, 0, 0), 66, "exporter on node 0");

    // Started together, so they may also meet while the first import is still pending.
    let importers: Vec<Held> = (0..3)
        .map(|k| {
            let mut cmd = importer(d1, &ch1, &handle, &["--hold", "--verify", "66"]);
            Held::spawn(&format!("importer {k} on node 1"), &mut cmd)
        })
        .collect();
    for imp in &importers {
        imp.expect_holding();
    }

    let s1 = stats(d1);
    assert!(
        num(&s1, "import_descriptors") == 1 && num(&s1, "import_refs") == 3,
        "three imports of one handle on one node share one descriptor \
         (import_descriptors 1, import_refs 3): {s1}"
    );
    let s0 = stats(d0);
    assert_eq!(
        num(&s0, "daemon_export_refs"),
        1,
        "one descriptor, one daemon round trip, one export reference: {s0}"
    );

    for imp in importers {
        imp.exit();
    }
    assert_eq!(exp.ask("verify 66"), "ok");
    exp.exit();
    wait_all_released(
        &cluster,
        "after the three importers and the exporter exited",
    );
}

/// (d) §1.4 and §6.1: the import cache key is `(id << 16) | index` under the export UUID, and
/// the 48-bit import ID travels from the import request into the MEM_IMPORT event: imports of
/// one handle with the same ID share a descriptor, with another ID they get their own
/// descriptor, their own trip through the daemons and their own exporter reference.
#[test]
fn imports_with_different_import_ids_do_not_share_a_descriptor() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let ch1 = channel(&cluster, 1, 0);
    let (mut exp, handle) = exporter(d0, &channel(&cluster, 0, 0), 67, "exporter on node 0");

    let importers: Vec<Held> = [("0", "a"), ("0", "b"), ("281474976710654", "c")]
        .into_iter()
        .map(|(id, k)| {
            let mut cmd = importer(
                d1,
                &ch1,
                &handle,
                &["--hold", "--verify", "67", "--import-id", id],
            );
            Held::spawn(
                &format!("importer {k} (import ID {id}) on node 1"),
                &mut cmd,
            )
        })
        .collect();
    for imp in &importers {
        imp.expect_holding();
    }
    let s1 = stats(d1);
    assert!(
        num(&s1, "import_descriptors") == 2 && num(&s1, "import_refs") == 3,
        "IDs 0, 0 and 2^48-2: two descriptors, three references: {s1}"
    );
    let s0 = stats(d0);
    assert_eq!(
        num(&s0, "daemon_export_refs"),
        2,
        "one exporter reference per descriptor: {s0}"
    );
    // The reserved ID 2^48 - 1 is refused before anything is asked of the driver.
    let out = run(&mut importer(
        d1,
        &ch1,
        &handle,
        &["--import-id", "281474976710655"],
    ));
    let stderr = assert_clean_failure(&out, "import ID 2^48 - 1");
    assert_eq!(out.status.code(), Some(2), "a usage error: {stderr}");

    for imp in importers {
        imp.exit();
    }
    assert_eq!(exp.ask("verify 67"), "ok");
    exp.exit();
    wait_all_released(&cluster, "after the importers with their own IDs exited");
}

/// (a) §4 "Daemon dies or restarts" 1 and §6.1: `bAllowFabricMemAlloc` is set from load, so a
/// node whose daemon was never started creates and exports fabric memory; §1.4 "Export
/// packet": its UUID carries node ID 0xFFFF. (b) §1.4 and §1.6 "Import request" 2: IMPORT_V2
/// refuses such a packet with NV_ERR_NOT_SUPPORTED, on whichever node.
#[test]
fn fabric_memory_with_no_daemon_ever_is_allocated_and_its_handle_is_single_node() {
    let cluster =
        Cluster::prepare(spec(2).with_gpus(GpuSpec::default())).expect("prepare the nodes");
    cluster.start_driver(0).expect("node 0's GPU driver");
    cluster.start_driver(1).expect("node 1's GPU driver");
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    for d in [d0, d1] {
        let s = stats(d);
        assert!(
            s["session"] == Value::Bool(false) && num(&s, "node_id") == NO_NODE,
            "no daemon has ever run: {s}"
        );
    }
    let (mut exp, handle) = exporter(
        d0,
        &channel(&cluster, 0, 0),
        77,
        "exporter on node 0, which never had a daemon",
    );
    // Bytes 12..14 of the handle are the export UUID's node ID (little-endian).
    assert_eq!(
        &handle[24..28],
        "ffff",
        "exported with no daemon: node ID 0xFFFF in the UUID ({handle})"
    );
    assert_eq!(num(&stats(d0), "allocations"), 1);

    let out = run(&mut importer(
        d1,
        &channel(&cluster, 1, 0),
        &handle,
        &["--verify", "77"],
    ));
    let stderr = assert_clean_failure(&out, "import of a single-node handle");
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("CUDA_ERROR_NOT_SUPPORTED (801)") && stderr.contains("0xFFFF"),
        "a handle exported with no daemon is NOT_SUPPORTED elsewhere: {stderr}"
    );
    assert_eq!(
        exp.ask("verify 77"),
        "ok",
        "the exporter's memory is intact"
    );
    exp.exit();
    for d in [d0, d1] {
        wait_stats(d, NOTICE, "back to zero", all_released);
    }
}

/// (e) §2: `NVreg_ImexChannelCount=0` disables IMEX channels: SUBSCRIBE_TO_IMEX_CHANNEL is
/// NV_ERR_NOT_SUPPORTED, so an application opening a channel file gets
/// CUDA_ERROR_NOT_SUPPORTED, and without one it cannot create fabric memory.
#[test]
fn a_driver_loaded_with_no_imex_channels_refuses_subscription_as_not_supported() {
    let dir = openimex_harness::ScratchDir::new("gpu-no-channels").expect("scratch dir");
    let node_dir = dir.path().join("node");
    let mut cmd = Command::new(lab_binary());
    cmd.arg("gpu")
        .arg("--node-dir")
        .arg(&node_dir)
        .arg("--fabric-dir")
        .arg(dir.path().join("fabric"))
        .args(["--gpus", "1", "--hbm-mib", "64", "--channels", "1"])
        .args(["--imex-channel-count", "0"]);
    let gpu = Held::spawn("openimex-lab gpu --imex-channel-count 0", &mut cmd);
    let ready = gpu.line(NOTICE);
    assert!(ready.starts_with("ready "), "{ready}");

    let ch0 = openimex_simproto::node_dir::channel_path(&node_dir, 0);
    assert!(ch0.exists(), "the channel file is there, but no channel");
    let mut export = app("export", &node_dir);
    export
        .arg("--channel")
        .arg(&ch0)
        .args(["--size", SIZE, "--pattern", "1"]);
    let out = run(&mut export);
    let stderr = assert_clean_failure(&out, "export with the channel count 0");
    assert!(
        stderr.contains("CUDA_ERROR_NOT_SUPPORTED (801)") && stderr.contains("channel count is 0"),
        "subscription is NOT_SUPPORTED: {stderr}"
    );
    let mut export = app("export", &node_dir);
    export
        .arg("--no-channel")
        .args(["--size", SIZE, "--pattern", "1"]);
    let out = run(&mut export);
    let stderr = assert_clean_failure(&out, "export without a channel");
    assert!(
        stderr.contains("CUDA_ERROR_NOT_PERMITTED (800)"),
        "no channel, no fabric memory: {stderr}"
    );
    drop(gpu);
}

#[test]
fn demo_json_four_nodes() {
    let mut cmd = Command::new(lab_binary());
    cmd.args(["demo", "--nodes", "4", "--json"]);
    let out = run_with_timeout(&mut cmd, DEMO).unwrap_or_else(|e| panic!("{e}"));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        text(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let summary: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("the last line must be JSON ({e}): {last:?}"));
    let expect = [
        ("nodes", 4),
        ("gpus", 16),
        ("imports", 16 * 15),
        ("errors", 0),
        ("leaked_refs", 0),
    ];
    for (key, want) in expect {
        assert_eq!(num(&summary, key), want, "{key}: {summary}");
    }
    assert!(num(&summary, "bytes_verified") > 0, "{summary}");
    for key in ["formation_ms", "import_p50_us", "import_p99_us"] {
        num(&summary, key);
    }
    assert!(
        num(&summary, "import_p50_us") <= num(&summary, "import_p99_us"),
        "p50 <= p99: {summary}"
    );
    for key in ["imports_per_s", "copy_gbps"] {
        assert!(
            summary[key].as_f64().is_some_and(|v| v > 0.0),
            "{key} must be a positive number: {summary}"
        );
    }
}

#[test]
fn gpus_report_their_fabric_probe() {
    let cluster = gpu_cluster(2);
    let mut seen = Vec::new();
    for i in 0..2 {
        let mut cmd = app("gpus", cluster.node(i).dir());
        cmd.args(["--no-channel", "-j"]);
        let out = run(&mut cmd);
        assert!(out.status.success(), "app gpus: {}", text(&out.stderr));
        let gpus: Vec<Value> = text(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(gpus.len(), 4, "GpuSpec::default() has 4 GPUs per tray");
        for g in gpus {
            assert_eq!(g["fabric_state"], "COMPLETED", "{g}");
            assert!(
                g["uuid"].as_str().is_some_and(|u| u.starts_with("GPU-")),
                "{g}"
            );
            seen.push(g);
        }
    }
    // One NVLink domain: the same clusterUuid and clique everywhere; distinct GPUs and
    // distinct fabric windows.
    assert!(
        seen.windows(2)
            .all(|w| w[0]["cluster_uuid"] == w[1]["cluster_uuid"])
    );
    assert!(
        seen.windows(2)
            .all(|w| w[0]["clique_id"] == w[1]["clique_id"])
    );
    let mut uuids: Vec<_> = seen.iter().map(|g| g["uuid"].to_string()).collect();
    let mut bases: Vec<_> = seen.iter().map(|g| g["fabric_base"].to_string()).collect();
    uuids.sort();
    uuids.dedup();
    bases.sort();
    bases.dedup();
    assert_eq!((uuids.len(), bases.len()), (8, 8));
}
