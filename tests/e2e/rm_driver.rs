//! Issue 29: the daemon speaks the GPU driver's real interface. Real daemon processes on the
//! `nvidia` backend over simulated drivers (their node directories are the driver roots):
//! the golden trace of what a daemon issues, matched to `docs/reference/driver-interface.md` §1.6
//! step by step on two driver versions whose layouts differ; `openimex driver-check`; and the
//! faults an operator meets (no driver, the session held, the capability missing, not root).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use openimex_harness::{Cluster, GpuSpec, trace_path};
use openimex_rmabi::Layout;
use serde_json::Value;

use crate::apps::{channel, exporter, held_importer, num, wait_session, wait_stats};
use crate::common::{COMMAND, FORM, NOTICE, assert_clean_failure, binary, run, spec, text};

/// One escape as the simulated driver traced it: `NAME CLASS_OR_CMD params=N status=S`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Traced {
    escape: String,
    what: String,
    params: usize,
    status: String,
}

fn read_trace(node_dir: &Path) -> Vec<Traced> {
    let text = std::fs::read_to_string(trace_path(node_dir)).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let escape = it.next()?.to_string();
            let what = it.next()?.to_string();
            let params = it.next()?.strip_prefix("params=")?.parse().ok()?;
            let status = it.next()?.strip_prefix("status=")?.to_string();
            Some(Traced {
                escape,
                what,
                params,
                status,
            })
        })
        .collect()
}

/// A step of §1.6: the escape, the class or control (`-` for the OS-level escapes) and the
/// parameter size the layout gives.
fn step(escape: &str, what: &str, params: usize) -> (String, String, usize) {
    (escape.to_string(), what.to_string(), params)
}

/// Checks that `trace` holds `steps` in order (other calls may come between: event drains,
/// probes), each with NV_OK (or the warning named), and returns the index after the last.
#[track_caller]
fn expect_in_order(
    trace: &[Traced],
    from: usize,
    steps: &[(String, String, usize)],
    what: &str,
) -> usize {
    let mut at = from;
    for (escape, class, params) in steps {
        let found = trace[at..]
            .iter()
            .position(|t| &t.escape == escape && &t.what == class && t.params == *params);
        match found {
            Some(i) => {
                let t = &trace[at + i];
                assert!(
                    t.status == "NV_OK" || t.status.starts_with("NV_WARN"),
                    "{what}: {escape} {class} returned {}",
                    t.status
                );
                at += i + 1;
            }
            None => panic!(
                "{what}: expected {escape} {class} params={params} after call {at}; the trace from there:\n{}",
                trace[at..]
                    .iter()
                    .map(|t| format!(
                        "{} {} params={} status={}",
                        t.escape, t.what, t.params, t.status
                    ))
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
        }
    }
    at
}

/// Every call the daemon made is one §1.6 names (nothing else was issued).
#[track_caller]
fn only_known_calls(trace: &[Traced], what: &str) {
    const KNOWN: &[&str] = &[
        "CHECK_VERSION_STR -",
        "RM_ALLOC 0x41",
        "RM_CONTROL 0x214",
        "RM_CONTROL 0x215",
        "ATTACH_GPUS_TO_FD -",
        "RM_CONTROL 0x205",
        "RM_ALLOC 0x80",
        "RM_ALLOC 0x2080",
        "ALLOC_OS_EVENT -",
        "RM_CONTROL 0x208001a3",
        "RM_ALLOC 0xf1",
        "RM_CONTROL 0xf10001",
        "RM_CONTROL 0xf10002",
        "RM_CONTROL 0xf10003",
        "RM_ALLOC 0xe0",
        "RM_CONTROL 0xe00102",
        "RM_CONTROL 0xf80102",
        "RM_ALLOC 0xfb",
        "RM_CONTROL 0xfb0101",
        "RM_FREE 0xfb",
        "RM_FREE 0xf8",
        "RM_FREE 0xe0",
        "RM_FREE 0x41",
    ];
    for t in trace {
        let key = format!("{} {}", t.escape, t.what);
        assert!(
            KNOWN.contains(&key.as_str()),
            "{what}: the daemon issued {key} (params={}, {}), which §1.6 does not name",
            t.params,
            t.status
        );
    }
}

/// The start of §1.6 on a node with `gpus` GPUs: version check, root client, GPUs attached
/// (every GPU's instances read, then a Device and a Subdevice each), the OS event, the
/// session.
fn start_steps(layout: Layout, gpus: usize) -> Vec<(String, String, usize)> {
    let mut s = vec![
        step("CHECK_VERSION_STR", "-", 0),
        step("RM_ALLOC", "0x41", 0),
        step("RM_CONTROL", "0x214", layout.probed_ids_params_size()),
        step("RM_CONTROL", "0x215", 132),
        step("ATTACH_GPUS_TO_FD", "-", 0),
    ];
    for _ in 0..gpus {
        s.push(step("RM_CONTROL", "0x205", 32));
    }
    for _ in 0..gpus {
        s.push(step("RM_ALLOC", "0x80", 56));
        s.push(step("RM_ALLOC", "0x2080", 4));
    }
    s.push(step("ALLOC_OS_EVENT", "-", 0));
    s.push(step("RM_ALLOC", "0xf1", 32));
    s
}

/// The golden trace on `version`: start both daemons, serve one import (node 1 imports node
/// 0's export), one unimport, one lost peer (node 0 killed; node 1 cleans up at once with a
/// grace time of 0) and a clean stop of node 1.
fn golden_trace(version: &'static str) {
    let layout = openimex_rmabi::layout_for(version).expect("a supported version");
    let gpus = GpuSpec {
        gpus_per_node: 2,
        hbm_mib: 64,
        channels: 1,
        driver_version: Some(version),
        trace: true,
    };
    let s = spec(2)
        .with_gpus(gpus)
        .config("IMEX_NODE_DISCONNECTED_GRACE_TIME", "0");
    let mut cluster = Cluster::start(s).expect("start 2 nodes");
    cluster.wait_up(0, FORM).expect("domain UP");
    for i in 0..2 {
        wait_session(&cluster, i);
    }
    let (d0, d1) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(1).dir().to_path_buf(),
    );
    let what = format!("driver {version}");
    for d in [&d0, &d1] {
        let trace = read_trace(d);
        expect_in_order(
            &trace,
            0,
            &start_steps(layout, 2),
            &format!("{what}: start"),
        );
    }
    // One import and its unimport.
    let (exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 7, "exporter on node 0");
    let imp = held_importer(
        &d1,
        &channel(&cluster, 1, 0),
        &handle,
        7,
        "importer on node 1",
    );
    wait_stats(&d0, NOTICE, "node 0 holds node 1's reference", |s| {
        num(s, "daemon_export_refs") == 1
    });
    let events = step("RM_CONTROL", "0xf10001", layout.fabric_events_params_size());
    let t1 = read_trace(&d1);
    let after_start_1 = expect_in_order(&t1, 0, &start_steps(layout, 2), &what);
    let imported = expect_in_order(
        &t1,
        after_start_1,
        &[
            events.clone(),
            step("RM_ALLOC", "0xfb", 32),
            step("RM_CONTROL", "0xfb0101", layout.validate_params_size()),
            step("RM_FREE", "0xfb", 0),
        ],
        &format!("{what}: importer side of one import (§1.6 Daemon B)"),
    );
    let t0 = read_trace(&d0);
    let after_start_0 = expect_in_order(&t0, 0, &start_steps(layout, 2), &what);
    let described = expect_in_order(
        &t0,
        after_start_0,
        &[
            step("RM_ALLOC", "0xe0", 244),
            step("RM_CONTROL", "0xe00102", 1540),
            step("RM_CONTROL", "0xf80102", layout.describe_params_size()),
        ],
        &format!("{what}: exporter side of one import (§1.6 Daemon A)"),
    );
    imp.exit();
    wait_stats(&d0, NOTICE, "node 0 released node 1's reference", |s| {
        num(s, "daemon_export_refs") == 0
    });
    let t1 = read_trace(&d1);
    expect_in_order(
        &t1,
        imported,
        &[events.clone(), step("RM_CONTROL", "0xf10002", 2056)],
        &format!("{what}: importer side of the unimport"),
    );
    let t0 = read_trace(&d0);
    expect_in_order(
        &t0,
        described,
        &[step("RM_FREE", "0xf8", 0), step("RM_FREE", "0xe0", 0)],
        &format!("{what}: exporter frees its two dups on unimport"),
    );
    // A lost peer, with imports both ways: node 1 imports node 0's export again, node 0
    // imports an export of node 1; then node 1's daemon dies. Node 0 (grace time 0) frees
    // the dups it held for node 1's import (§4 "Peer node dies": "drop any dups it held on
    // behalf of that node's importers") and disables its own importers of node 1, whose
    // application the driver then revokes.
    let imp1 = held_importer(
        &d1,
        &channel(&cluster, 1, 0),
        &handle,
        7,
        "importer on node 1",
    );
    let (exp1, handle1) = exporter(&d1, &channel(&cluster, 1, 0), 8, "exporter on node 1");
    let imp0 = held_importer(
        &d0,
        &channel(&cluster, 0, 0),
        &handle1,
        8,
        "importer on node 0",
    );
    wait_stats(&d0, NOTICE, "node 0 holds node 1's reference again", |s| {
        num(s, "daemon_export_refs") == 1
    });
    let before_loss = read_trace(&d0).len();
    cluster.kill9(1).expect("kill -9 node 1's daemon");
    let deadline = Instant::now() + NOTICE;
    let lost = loop {
        let t0 = read_trace(&d0);
        let seen = |what: &str| {
            t0[before_loss..]
                .iter()
                .any(|t| t.what == what && (t.escape == "RM_CONTROL" || t.escape == "RM_FREE"))
        };
        if seen("0xf10003") && seen("0xe0") {
            break t0;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: node 0 never cleaned up after node 1 (DISABLE_IMPORTERS, the dups' RM_FREE)"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    expect_in_order(
        &lost,
        before_loss,
        &[step("RM_FREE", "0xf8", 0), step("RM_FREE", "0xe0", 0)],
        &format!("{what}: the exporter frees its dups for the lost importer"),
    );
    let disabled = expect_in_order(
        &lost,
        before_loss,
        &[step("RM_CONTROL", "0xf10003", 2)],
        &format!("{what}: DISABLE_IMPORTERS for the lost node"),
    );
    crate::fabric_faults::expect_revoked(imp0);
    wait_stats(&d0, NOTICE, "node 0 holds nothing for node 1", |s| {
        num(s, "daemon_export_refs") == 0 && num(s, "daemon_export_objects") == 0
    });
    drop((imp1, exp1));
    exp.exit();
    // A clean stop frees the client (and the session with it).
    cluster.stop(0, COMMAND).expect("stop node 0");
    let t0 = read_trace(&d0);
    expect_in_order(
        &t0,
        disabled.min(t0.len()),
        &[step("RM_FREE", "0x41", 0)],
        &format!("{what}: the clean stop frees the client"),
    );
    only_known_calls(&t0, &format!("{what}: node 0"));
    only_known_calls(&read_trace(&d1), &format!("{what}: node 1"));
}

#[test]
fn golden_trace_on_595() {
    golden_trace("595.45.04");
}

/// 580.65.06 has other sizes for the fabric events, DESCRIBE and VALIDATE: the daemon follows
/// the driver's version.
#[test]
fn golden_trace_on_580() {
    let (old, new) = (
        openimex_rmabi::layout_for("580.65.06").unwrap(),
        openimex_rmabi::layout_for("595.45.04").unwrap(),
    );
    assert_ne!(
        old.fabric_events_params_size(),
        new.fabric_events_params_size()
    );
    golden_trace("580.65.06");
}

/// `openimex driver-check -j` on a simulated tray: before a daemon runs, a daemon could start
/// (exit 0, the GPUs' probes COMPLETED; with `--open-session` the session is available); with
/// the daemon running, `--open-session` finds the session held by it (exit 1). Without it the
/// session is not opened: doing so re-enables fabric allocations the kernel disabled after an
/// abrupt daemon exit.
#[test]
fn driver_check_reports_the_simulated_node_and_the_held_session() {
    let gpus = GpuSpec {
        gpus_per_node: 2,
        hbm_mib: 64,
        channels: 3,
        ..GpuSpec::default()
    };
    let mut cluster = Cluster::prepare(spec(1).with_gpus(gpus)).expect("prepare a node");
    cluster.start_driver(0).expect("start the driver");
    let root = cluster.node(0).dir().to_path_buf();
    let check_with = |root: &Path, extra: &[&str]| {
        let out = run(Command::new(binary())
            .args(["driver-check", "-j"])
            .args(extra)
            .arg("--driver-root")
            .arg(root));
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("JSON ({e}): {}\n{}", text(&out.stdout), text(&out.stderr)));
        (out.status.code(), v)
    };
    let check = |root: &Path| check_with(root, &[]);
    let (code, v) = check(&root);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["session"]["state"], "NOT_ASKED", "{v:#}");
    let (code, v) = check_with(&root, &["--open-session"]);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["transport"], "sim", "{v:#}");
    assert_eq!(v["versionSupported"]["ok"], true, "{v:#}");
    assert_eq!(v["capabilityDevice"]["ok"], true, "{v:#}");
    assert_eq!(v["channels"], serde_json::json!([0, 1, 2]), "{v:#}");
    assert_eq!(v["gpus"].as_array().map(Vec::len), Some(2), "{v:#}");
    assert_eq!(v["gpus"][0]["state"], "COMPLETED", "{v:#}");
    assert_eq!(v["session"]["state"], "AVAILABLE", "{v:#}");
    cluster.start_node(0).expect("start the daemon");
    cluster.wait_up(0, FORM).expect("UP");
    wait_session(&cluster, 0);
    let (code, v) = check_with(&root, &["--open-session"]);
    assert_eq!(code, Some(1), "{v:#}");
    assert_eq!(v["session"]["state"], "HELD_BY_ANOTHER_DAEMON", "{v:#}");
    // The daemon kept its session through the check.
    wait_session(&cluster, 0);
    // No driver there at all.
    let (code, v) = check(Path::new("/nonexistent/openimex-root"));
    assert_eq!(code, Some(1), "{v:#}");
    let detail = v["nvidiactl"]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("/nonexistent/openimex-root/dev/nvidiactl does not exist")
            && detail.contains("install the NVIDIA GPU driver"),
        "{v:#}"
    );
}

/// `OPENIMEX_DRIVER=nvidia` with no driver under the root: the daemon fails at once, naming
/// `/dev/nvidiactl` and what to install.
#[test]
fn nvidia_without_a_driver_fails_at_once_naming_nvidiactl() {
    let mut cluster = Cluster::prepare(
        spec(1)
            .config("OPENIMEX_DRIVER", "nvidia")
            .config("OPENIMEX_DRIVER_ROOT", "/nonexistent/openimex-root"),
    )
    .expect("prepare");
    let config = cluster.node(0).config_path();
    let t = Instant::now();
    let out = run(Command::new(binary()).arg("daemon").arg("-c").arg(&config));
    let took = t.elapsed();
    let stderr = assert_clean_failure(&out, "daemon without a driver");
    assert!(
        stderr.contains("/nonexistent/openimex-root/dev/nvidiactl does not exist")
            && stderr.contains("install the NVIDIA GPU driver"),
        "{stderr}"
    );
    // Under a second on an idle machine; the bound only catches a wait or a retry loop.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let _ = cluster.is_running(0);
}

/// A copy of node `i`'s config for a second daemon on the same node (and driver root): its own
/// server port and log, no command service, so that it gets as far as opening the session.
fn second_daemon_config(cluster: &Cluster, i: usize) -> std::path::PathBuf {
    let node = cluster.node(i);
    let text = std::fs::read_to_string(node.config_path()).expect("read the config");
    let log = node.dir().join("second.log");
    let lines: Vec<String> = text
        .lines()
        .map(|l| match l.split_once('=') {
            Some(("SERVER_PORT", _)) => "SERVER_PORT=50900".to_string(),
            Some(("IMEX_CMD_ENABLED", _)) => "IMEX_CMD_ENABLED=0".to_string(),
            Some(("LOG_FILE_NAME", _)) => format!("LOG_FILE_NAME={}", log.display()),
            Some(("STATS_FILE_NAME", _)) => "STATS_FILE_NAME=".to_string(),
            Some(("OPENIMEX_PERSIST_FILE", _)) => {
                format!(
                    "OPENIMEX_PERSIST_FILE={}",
                    node.dir().join("second.dat").display()
                )
            }
            _ => l.to_string(),
        })
        .collect();
    let path = node.dir().join("second.cfg");
    std::fs::write(&path, lines.join("\n") + "\n").expect("write the config");
    path
}

/// A second daemon on a node whose session a daemon holds: NV_IMEX_SESSION answers
/// NV_ERR_IN_USE (one session per node, §1.2), and it stops saying so; the first keeps serving.
#[test]
fn a_second_daemon_finds_the_session_held_and_stops() {
    let gpus = GpuSpec {
        gpus_per_node: 1,
        hbm_mib: 16,
        channels: 1,
        ..GpuSpec::default()
    };
    let mut cluster = Cluster::start(spec(1).with_gpus(gpus)).expect("start a node");
    cluster.wait_up(0, FORM).expect("UP");
    wait_session(&cluster, 0);
    let config = second_daemon_config(&cluster, 0);
    let out = crate::common::run_long(
        Command::new(binary()).arg("daemon").arg("-c").arg(&config),
        NOTICE,
    );
    assert!(!out.status.success(), "the second daemon must stop");
    let log = std::fs::read_to_string(cluster.node(0).dir().join("second.log")).unwrap_or_default();
    let said = format!("{log}{}", text(&out.stderr));
    assert!(
        said.contains(
            "a daemon session is already open on this driver; stop the other daemon first"
        ),
        "{said}"
    );
    assert!(cluster.is_running(0), "the first daemon keeps running");
    wait_session(&cluster, 0);
}

/// The capability's device node missing (no `nvidia-modprobe` run, no `mknod`): the daemon
/// stops at start, naming the file and the `mknod` line with the major from `/proc/devices`.
#[test]
fn a_missing_capability_device_names_the_file_and_the_mknod_line() {
    let gpus = GpuSpec {
        gpus_per_node: 1,
        hbm_mib: 16,
        channels: 1,
        ..GpuSpec::default()
    };
    let cluster = Cluster::prepare(spec(1).with_gpus(gpus)).expect("prepare a node");
    cluster.start_driver(0).expect("start the driver");
    let root = cluster.node(0).dir();
    let node = openimex_simproto::node_dir::cap_device_path(root, 512);
    std::fs::remove_file(&node).expect("remove the capability's device node");
    let out = run(Command::new(binary())
        .arg("daemon")
        .arg("-c")
        .arg(cluster.node(0).config_path()));
    let stderr = assert_clean_failure(&out, "daemon without the capability's device node");
    assert!(
        stderr.contains(&format!(
            "{}: the fabric-imex-mgmt capability's device node does not exist",
            node.display()
        )) && stderr.contains(&format!("mknod -m 400 {} c 509 512", node.display())),
        "{stderr}"
    );
    // And without the procfs file, the file is named with what to install.
    std::fs::remove_file(root.join("proc/driver/nvidia/capabilities/fabric-imex-mgmt"))
        .expect("remove the procfs file");
    let out = run(Command::new(binary())
        .arg("daemon")
        .arg("-c")
        .arg(cluster.node(0).config_path()));
    let stderr = assert_clean_failure(&out, "daemon without the capability's procfs file");
    assert!(
        stderr.contains("capabilities/fabric-imex-mgmt: does not exist")
            && stderr.contains("load an NVIDIA driver with IMEX support"),
        "{stderr}"
    );
}

/// Not root: the capability is root's (its device node mode 0400), so `driver-check` run as
/// another user reports it unusable, says why and what to do, and exits 1. Needs root to
/// start the check as another user; skipped (and said so) otherwise.
#[test]
fn not_root_the_capability_is_refused_with_what_to_do() {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to this process's effective user.
    if std::fs::metadata("/proc/self").map(|m| m.uid()).ok() != Some(0) {
        eprintln!("skipped: needs root to run driver-check as another user");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let gpus = GpuSpec {
        gpus_per_node: 1,
        hbm_mib: 16,
        channels: 1,
        ..GpuSpec::default()
    };
    let cluster = Cluster::prepare(spec(1).with_gpus(gpus)).expect("prepare a node");
    cluster.start_driver(0).expect("start the driver");
    let root = cluster.node(0).dir();
    // Another user may reach the driver root (as /dev is world-searchable on a real node).
    let mut dir = Some(root);
    while let Some(d) = dir {
        // Each directory up to / that others may not enter yet (the harness's are 0700).
        let mode = std::fs::metadata(d).expect("stat").permissions().mode();
        if mode & 0o001 == 0 {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode | 0o011))
                .expect("chmod");
        }
        dir = d.parent();
    }
    // The binary under test may sit in a directory only root may enter (a fresh clone in a
    // mktemp directory): the other user runs a copy next to the driver root.
    let exe = root
        .parent()
        .expect("the cluster directory")
        .join("openimex-as-nobody");
    // Copied by a child process, not by this one: a write descriptor opened here could be
    // inherited by a child another test thread forks at that moment, and while any process
    // holds it open exec fails with ETXTBSY ("Text file busy").
    let copied = Command::new("cp")
        .arg(binary())
        .arg(&exe)
        .status()
        .expect("run cp");
    assert!(
        copied.success(),
        "cp {} {}",
        binary().display(),
        exe.display()
    );
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = run(Command::new(&exe)
        .args(["driver-check", "-j", "--driver-root"])
        .arg(root)
        .uid(65534)
        .gid(65534));
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("JSON ({e}): {}\n{}", text(&out.stdout), text(&out.stderr)));
    assert_eq!(out.status.code(), Some(1), "{v:#}");
    assert_eq!(v["capabilityDevice"]["ok"], false, "{v:#}");
    let detail = v["capabilityDevice"]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("nvidia-cap512: permission denied (the capability is root's)")
            && detail.contains("run the daemon as root"),
        "{v:#}"
    );
}
