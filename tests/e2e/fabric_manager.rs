//! The simulated Fabric Manager with real processes: `openimex-lab fabric serve`, the trays'
//! drivers started with `--fabric-manager` (their probes come from it), and the operator's
//! `openimex-lab fabric …` commands on its control socket (docs/reference/driver-interface.md §5: the probe, the
//! clusterUuid and cliqueId, partitions, health; allocation refused until the probe completes).
//!
//! Every cluster here runs the first trays of a preset against an FM serving the whole domain.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use openimex_fabric_manager::probe::{HealthField, cluster_uuid};
use openimex_harness::{Cluster, ClusterSpec, FabricManagerSpec};
use serde_json::Value;

use crate::apps::*;
use crate::common::{FORM, NOTICE, assert_clean_failure, binary, lab_binary, run, text, wait_for};

/// The user tests run unprivileged commands as.
const NOBODY: &str = "65534";

/// The first `nodes` trays of `preset`, drivers taking their probes from the domain's FM.
fn fm_spec(preset: &str, nodes: usize) -> ClusterSpec {
    let mut spec = ClusterSpec::from_topology(FabricManagerSpec::preset(preset), binary())
        .expect("spec from the topology")
        .with_lab_binary(lab_binary());
    spec.nodes = nodes;
    spec
}

/// `openimex-lab app gpus -j` on node `i`: one JSON object per GPU.
fn gpus(cluster: &Cluster, i: usize) -> Vec<Value> {
    let out = run(app("gpus", cluster.node(i).dir()).arg("-j"));
    assert!(out.status.success(), "app gpus: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// Waits until every GPU of node `i` satisfies `want`.
#[track_caller]
fn wait_gpus(cluster: &Cluster, i: usize, what: &str, want: impl Fn(&Value) -> bool) {
    let ok = wait_for(NOTICE, || {
        let g = gpus(cluster, i);
        !g.is_empty() && g.iter().all(&want)
    });
    assert!(
        ok,
        "node {i}: {what}; app gpus shows {:?}\nFM log:\n{}",
        gpus(cluster, i),
        cluster
            .fabric_manager()
            .map(|f| f.log())
            .unwrap_or_default()
    );
}

/// `app export` of SIZE bytes on node `i`'s GPU `gpu`, not held: creation and export only.
fn export_once(cluster: &Cluster, i: usize, gpu: u32) -> Output {
    let mut cmd = app("export", cluster.node(i).dir());
    cmd.arg("--channel").arg(channel(cluster, i, 0)).args([
        "--gpu",
        &gpu.to_string(),
        "--size",
        SIZE,
        "--pattern",
        "3",
    ]);
    run(&mut cmd)
}

/// `openimex-lab fabric ARGS` against the cluster's FM; must succeed. Its stdout.
#[track_caller]
fn fabric_ok(cluster: &Cluster, args: &[&str]) -> String {
    let out = cluster.fabric(args).expect("run openimex-lab fabric");
    assert!(
        out.status.success(),
        "fabric {args:?}: {:?}\n{}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The FM's status as JSON.
fn status(cluster: &Cluster) -> Value {
    serde_json::from_str(&fabric_ok(cluster, &["status", "--json"])).expect("status JSON")
}

fn hex(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether the 2-bit health field `f` of `mask` is TRUE (§5 "a health mask with 2-bit fields").
fn flag(g: &Value, f: HealthField) -> bool {
    let mask = g["health_mask"].as_u64().unwrap_or(0);
    (mask >> (f as u32)) & 0b11 == 1
}

/// §5: until the FM answers, a GPU's probe is IN_PROGRESS and fabric memory allocation on it
/// fails ("UC FLA ranges should be initialized"); once the FM starts (after the drivers),
/// every probe is COMPLETED with the FM's clusterUuid and a cross-node import works.
#[test]
fn a_driver_started_before_the_fm_waits_then_completes() {
    let mut cluster = Cluster::prepare(fm_spec("nvl36", 2)).expect("prepare");
    for i in 0..2 {
        cluster.start_node(i).expect("start the node");
    }
    cluster.wait_up(0, FORM).expect("domain UP");
    for i in 0..2 {
        wait_session(&cluster, i);
    }
    for g in gpus(&cluster, 0) {
        assert_eq!(g["fabric_state"], "IN_PROGRESS", "{g}");
    }
    let out = export_once(&cluster, 0, 0);
    let stderr = assert_clean_failure(&out, "export before the probe completes");
    assert!(
        stderr.contains("UC FLA ranges should be initialized"),
        "{stderr}"
    );

    cluster.start_fabric_manager().expect("start the FM");
    let uuid = hex(&cluster_uuid("nvl36"));
    for i in 0..2 {
        wait_gpus(
            &cluster,
            i,
            "probe COMPLETED with the FM's clusterUuid",
            |g| g["fabric_state"] == "COMPLETED" && g["cluster_uuid"] == uuid.as_str(),
        );
    }
    let (exp, imp) = held_import_0_to_1(&cluster, 7);
    drop(imp);
    exp.exit();
    wait_all_released(&cluster, "after the import");
    let s = status(&cluster);
    let attached: Vec<bool> = s["trays"]
        .as_array()
        .expect("trays")
        .iter()
        .map(|t| t["attached"] == true)
        .collect();
    assert_eq!(&attached[..3], [true, true, false], "{s}");
}

/// §5 "cliqueId names the set of GPUs within a fabric partition": a partition created at run
/// time gives the GPUs of its tray a new cliqueId in `app gpus -j`; the others keep theirs.
#[test]
fn a_partition_change_at_run_time_reaches_the_moved_trays_gpus() {
    let mut cluster = Cluster::prepare(fm_spec("nvl36", 2)).expect("prepare");
    cluster.start_fabric_manager().expect("FM");
    for i in 0..2 {
        cluster.start_driver(i).expect("driver");
        wait_gpus(&cluster, i, "clique 1", |g| g["clique_id"] == 1);
    }
    let out = fabric_ok(&cluster, &["partition", "create", "1"]);
    assert!(out.contains("slot 1 gpu 0: cliqueId 1 -> 2"), "{out}");
    assert!(!out.contains("slot 0 gpu"), "{out}");
    wait_gpus(&cluster, 1, "clique 2 in partition 1", |g| {
        g["clique_id"] == 2 && g["partition_id"] == 1
    });
    assert!(gpus(&cluster, 0).iter().all(|g| g["clique_id"] == 1));
    let out = fabric_ok(&cluster, &["partition", "move", "1", "0"]);
    assert!(out.contains("cliqueId 2 -> 1"), "{out}");
    wait_gpus(&cluster, 1, "back in clique 1", |g| g["clique_id"] == 1);
    // A refusal says why and exits non-zero.
    let out = cluster.fabric(&["partition", "delete", "7"]).expect("run");
    let err = assert_clean_failure(&out, "delete of a missing partition");
    assert!(err.contains("no partition with id 7"), "{err}");
}

/// §5 health: a switch tray down lowers every GPU's bandwidth (DEGRADED_BW, LIMITED_CAPACITY)
/// without cutting any off, so a live cross-node mapping keeps reading and writing, and the
/// daemons report it per GPU (`ctl --fabric`); up again, every GPU is HEALTHY.
#[test]
fn a_switch_tray_down_degrades_every_gpu_while_traffic_continues() {
    let cluster = gpu_cluster_from(fm_spec("nvl36", 2));
    for i in 0..2 {
        wait_gpus(&cluster, i, "COMPLETED", |g| {
            g["fabric_state"] == "COMPLETED"
        });
    }
    let (mut exp, mut imp) = held_import_0_to_1(&cluster, 21);
    let out = fabric_ok(&cluster, &["switch-tray", "down", "r0-s3"]);
    assert!(out.starts_with("36 GPUs changed"), "{out}");
    for i in 0..2 {
        wait_gpus(&cluster, i, "DEGRADED_BW, LIMITED_CAPACITY", |g| {
            g["health"] == "LIMITED_CAPACITY"
                && flag(g, HealthField::DegradedBw)
                && !flag(g, HealthField::ConnectionUnhealthy)
        });
    }
    assert_eq!(imp.ask("verify 21"), "ok", "the import still reads");
    assert!(imp.ask("write 22").starts_with("written"), "and writes");
    assert_eq!(exp.ask("verify-write 22"), "ok", "the owner sees the write");
    let s = status(&cluster);
    let down: Vec<&Value> = s["switch_trays"]
        .as_array()
        .expect("switch trays")
        .iter()
        .filter(|t| t["up"] == false)
        .collect();
    assert_eq!(down.len(), 1, "{s}");
    assert_eq!(down[0]["name"], "r0-s3");
    // The daemon reports each GPU's fabric health as its driver has it (`ctl --fabric`).
    let mut last = Value::Null;
    let shown = wait_for(NOTICE, || {
        let out = cluster.ctl(1, &["--fabric", "-j"]).expect("run ctl");
        last = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        last["gpus"].as_array().is_some_and(|g| {
            !g.is_empty()
                && g.iter().all(|g| {
                    g["health_summary"] == "LIMITED_CAPACITY"
                        && g["health"]["DEGRADED_BW"] == "TRUE"
                })
        })
    });
    assert!(
        shown,
        "ctl --fabric on node 1 after the switch tray went down:\n{last:#}"
    );

    fabric_ok(&cluster, &["switch-tray", "up", "r0-s3"]);
    for i in 0..2 {
        wait_gpus(&cluster, i, "HEALTHY again", |g| {
            g["health"] == "HEALTHY" && !flag(g, HealthField::DegradedBw)
        });
    }
    imp.exit();
    exp.exit();
    wait_all_released(&cluster, "after the fault");
}

/// Starts `openimex-lab gpu --fabric-manager` for `slot` in `node_dir` on `fabric_dir`; its stderr
/// goes to `node_dir/gpu.log`.
fn stray_driver(node_dir: &Path, fabric_dir: &Path, slot: u16) -> std::process::Child {
    std::fs::create_dir_all(node_dir).expect("node dir");
    let log = std::fs::File::create(node_dir.join("gpu.log")).expect("log");
    Command::new(lab_binary())
        .arg("gpu")
        .arg("--node-dir")
        .arg(node_dir)
        .arg("--fabric-dir")
        .arg(fabric_dir)
        .args(["--slot", &slot.to_string(), "--fabric-manager"])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn the driver")
}

/// §5: the FM answers only trays its topology has; a tray it refuses stays IN_PROGRESS. The
/// FM killed -9 and restarted: the GPUs keep their probes meanwhile (allocation still works)
/// and the drivers attach again.
#[test]
fn an_unknown_slot_is_refused_and_drivers_survive_an_fm_restart() {
    let mut cluster = Cluster::prepare(fm_spec("nvl36", 2)).expect("prepare");
    cluster.start_fabric_manager().expect("FM");
    for i in 0..2 {
        cluster.start_driver(i).expect("driver");
        wait_gpus(&cluster, i, "COMPLETED", |g| {
            g["fabric_state"] == "COMPLETED"
        });
    }
    let stray_dir = cluster.base_dir().join("stray");
    let mut stray = stray_driver(&stray_dir, &cluster.fabric_dir(), 20);
    let refused = wait_for(NOTICE, || {
        std::fs::read_to_string(stray_dir.join("gpu.log"))
            .is_ok_and(|l| l.contains("refused this tray") && l.contains("slot 20"))
    });
    let stray_gpus = run(Command::new(lab_binary())
        .args(["app", "gpus", "-j", "--node-dir"])
        .arg(&stray_dir));
    let _ = stray.kill();
    let _ = stray.wait();
    assert!(
        refused,
        "the stray driver's log: {}",
        std::fs::read_to_string(stray_dir.join("gpu.log")).unwrap_or_default()
    );
    assert!(
        text(&stray_gpus.stdout).contains("IN_PROGRESS"),
        "{}",
        text(&stray_gpus.stdout)
    );

    cluster.kill_fabric_manager();
    // The FM is gone: the probes stay as they were and memory can still be allocated.
    let out = export_once(&cluster, 1, 1);
    assert!(
        out.status.success(),
        "export with the FM down: {}",
        text(&out.stderr)
    );
    assert!(
        gpus(&cluster, 0)
            .iter()
            .all(|g| g["fabric_state"] == "COMPLETED")
    );

    // Restarted over its stale socket files, it gets both trays back.
    cluster.start_fabric_manager().expect("FM again");
    let back = wait_for(NOTICE, || {
        let s = status(&cluster);
        s["trays"][0]["attached"] == true && s["trays"][1]["attached"] == true
    });
    assert!(back, "status: {}", status(&cluster));
    fabric_ok(&cluster, &["partition", "split", "9"]);
    wait_gpus(&cluster, 1, "the restarted FM's update", |g| {
        g["clique_id"] == 2
    });
}

/// Runs `openimex-lab fabric ARGS` as `nobody`.
fn as_nobody(args: &[&str]) -> Output {
    let offered =
        openimex_harness::runnable_by_everyone(&lab_binary()).expect("a reachable binary");
    run(Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
        .arg(offered.path())
        .arg("fabric")
        .args(args))
}

/// The control socket is the operator's: mode 0600, and even when opened up, the FM checks the
/// peer (root or its own user) as the driver checks its Fabric Manager controls (§5, §1.4).
#[test]
fn the_control_socket_refuses_a_non_root_user() {
    let mut cluster = Cluster::prepare(fm_spec("nvl36", 1)).expect("prepare");
    cluster.start_fabric_manager().expect("FM");
    let ctl = cluster.fabric_dir().join("fabric-manager.ctl");
    let mode = std::fs::metadata(&ctl)
        .expect("control socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let ctl_s = ctl.display().to_string();
    let out = as_nobody(&["switch-tray", "down", "r0-s0", "--control", &ctl_s]);
    let err = assert_clean_failure(&out, "nobody on a 0600 socket");
    assert!(err.contains("cannot connect"), "{err}");

    // Opened up (directories traversable, socket 0666): the FM itself refuses.
    for dir in [cluster.base_dir().to_path_buf(), cluster.fabric_dir()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    }
    std::fs::set_permissions(&ctl, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let out = as_nobody(&["switch-tray", "down", "r0-s0", "--control", &ctl_s]);
    let err = assert_clean_failure(&out, "nobody through SO_PEERCRED");
    assert!(err.contains("needs root"), "{err}");
    let s = status(&cluster);
    assert!(
        s["switch_trays"]
            .as_array()
            .expect("switch trays")
            .iter()
            .all(|t| t["up"] == true),
        "nothing changed: {s}"
    );
}

/// `openimex-lab fabric serve` as an operator meets it: bad topologies fail at once naming the
/// preset or the file:line; one FM per fabric directory (a second exits 1 saying so); SIGTERM
/// exits 0 and removes both sockets.
#[test]
fn serve_refuses_bad_topologies_and_a_second_fm_and_stops_cleanly() {
    let mut cluster = Cluster::prepare(fm_spec("nvl36", 1)).expect("prepare");
    let fabric_dir = cluster.fabric_dir();
    let serve = |extra: &[&str]| {
        let mut cmd = Command::new(lab_binary());
        cmd.args(["fabric", "serve", "--fabric-dir"])
            .arg(&fabric_dir)
            .args(extra);
        run(&mut cmd)
    };
    let err = assert_clean_failure(&serve(&["--topology", "nvl9"]), "unknown preset");
    assert!(err.contains("no topology preset named \"nvl9\""), "{err}");
    let file = cluster.base_dir().join("bad.topo");
    std::fs::write(&file, "rack a\nswitch-tray a-s0 osfp=x\n").expect("write");
    let err = assert_clean_failure(
        &serve(&["--file", &file.display().to_string()]),
        "bad topology file",
    );
    assert!(err.contains("bad.topo:2:"), "{err}");

    cluster.start_fabric_manager().expect("FM");
    let err = assert_clean_failure(&serve(&["--topology", "nvl36"]), "a second FM");
    assert!(err.contains("already serving"), "{err}");
    // The first one is unharmed.
    status(&cluster);

    let fm = cluster.fabric_manager_mut().expect("FM");
    let exit = fm.terminate(NOTICE).expect("the FM exits on SIGTERM");
    assert_eq!(exit.code(), Some(0), "{exit:?}");
    for f in ["fabric-manager.sock", "fabric-manager.ctl"] {
        assert!(!cluster.fabric_dir().join(f).exists(), "{f} removed");
    }
}
