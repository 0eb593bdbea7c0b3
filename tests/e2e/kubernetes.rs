//! Kubernetes (issue 9, item 7): `dist/kubernetes/openimex-daemonset.yaml`, host-managed mode.
//! The manifest's probe commands (JSON flow sequences, so they parse without a YAML crate) are
//! run as written — our binary and the node's socket substituted for the in-pod paths —
//! against real daemons: the readiness probe passes only when `ctl -q` says READY (not while
//! unconfigured on a placeholder file), the liveness probe whenever the daemon answers, and
//! fails once it is gone. The ConfigMap's keys are started with, and the pod keys that matter
//! (hostNetwork, privileged, the host's /etc/nvidia-imex, a bounded grace period) are there.
//! The job-file path the manifest documents for a ComputeDomain (issue 31) works as written: a
//! node agent's `<UID>.job` in the ConfigMap's OPENIMEX_JOBS_DIR makes the job READY on each
//! node (`ctl jobs wait` on the socket the manifest names), and deleting it ends the job.

use std::path::Path;
use std::process::Command;

use openimex_harness::{Cluster, Signal};

use crate::common::{FORM, NOTICE, binary, run, spec, text};

const MANIFEST: &str = include_str!("../../dist/kubernetes/openimex-daemonset.yaml");
const IN_POD_BINARY: &str = "/usr/bin/openimex";
const IN_POD_SOCKET: &str = "/etc/nvidia-imex/imex_ctrl.sock";
const IN_POD_JOBS_DIR: &str = "/etc/nvidia-imex/jobs";

/// The `command:` of the exec probe under `probe:` (e.g. `readinessProbe:`).
fn probe(probe: &str) -> Vec<String> {
    let mut lines = MANIFEST.lines().skip_while(|l| l.trim() != probe);
    assert!(lines.next().is_some(), "{probe} in the manifest");
    let line = lines
        .map(str::trim)
        .find_map(|l| l.strip_prefix("command: "))
        .unwrap_or_else(|| panic!("{probe} has an exec command"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{probe} command {line}: {e}"))
}

/// The ConfigMap's `config.cfg` as KEY=VALUE pairs.
fn config_map() -> Vec<(String, String)> {
    MANIFEST
        .lines()
        .skip_while(|l| l.trim() != "config.cfg: |")
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=VALUE");
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// `spec` with the ConfigMap's keys, except the host paths and ports the harness gives each
/// node its own of (the host's jobs directory among them).
fn with_manifest_keys(mut spec: openimex_harness::ClusterSpec) -> openimex_harness::ClusterSpec {
    let own = [
        "IMEX_NODE_CONFIG_FILE",
        "IMEX_CMD_UNIX_DOMAIN_PATH",
        "OPENIMEX_PERSIST_FILE",
        "OPENIMEX_JOBS_DIR",
        "LOG_FILE_NAME",
        "SERVER_PORT",
        "IMEX_CMD_PORT",
    ];
    for (k, v) in config_map() {
        if !own.contains(&k.as_str()) {
            spec = spec.config(k, v);
        }
    }
    spec
}

/// Runs a probe command with our binary and `socket` in place of the pod's; true on exit 0.
fn passes(command: &[String], socket: &Path) -> bool {
    let args: Vec<String> = command
        .iter()
        .map(|a| {
            a.replace(IN_POD_BINARY, &binary().display().to_string())
                .replace(IN_POD_SOCKET, &socket.display().to_string())
        })
        .collect();
    run(Command::new(&args[0]).args(&args[1..]))
        .status
        .success()
}

#[test]
fn the_manifest_has_the_pod_keys_host_managed_mode_needs() {
    for want in [
        "kind: DaemonSet",
        "kind: ConfigMap",
        "hostNetwork: true",
        "privileged: true",
        "path: /etc/nvidia-imex",
        "terminationGracePeriodSeconds: 30",
        "IMEX_CMD_UNIX_DOMAIN_PATH=/etc/nvidia-imex/imex_ctrl.sock",
        "command: [\"/usr/bin/openimex\", \"daemon\", \"-c\", \"/etc/openimex/config.cfg\"]",
    ] {
        assert!(
            MANIFEST.lines().any(|l| l.trim() == want),
            "the manifest lacks {want:?}"
        );
    }
    let ready = probe("readinessProbe:");
    assert!(
        ready
            .iter()
            .any(|a| a.contains("ctl -q -u /etc/nvidia-imex/imex_ctrl.sock"))
    );
    assert!(ready.iter().any(|a| a.ends_with("= READY ]")), "{ready:?}");
    assert_eq!(
        probe("livenessProbe:"),
        [IN_POD_BINARY, "ctl", "-q", "-u", IN_POD_SOCKET]
    );
    let keys: Vec<_> = config_map().into_iter().map(|(k, _)| k).collect();
    assert!(
        keys.contains(&"IMEX_NODE_CONFIG_FILE".to_string()),
        "{keys:?}"
    );
}

#[test]
fn the_probes_follow_a_real_daemon_on_its_unix_socket() {
    // The ConfigMap's keys, except the paths and ports the harness gives each node (and the
    // host's jobs directory: no job here).
    let s = with_manifest_keys(spec(2));
    let mut cluster = Cluster::prepare(s).expect("prepare 2 nodes");
    let real = cluster.nodes_lines().to_vec();
    let mut seed = vec!["##".to_string()];
    seed.extend(std::iter::repeat_n("0.0.0.0".to_string(), 9));
    for i in 0..2 {
        cluster.write_nodes_file(i, &seed).expect("placeholders");
        cluster.start_node(i).expect("start");
    }
    let (ready, live) = (probe("readinessProbe:"), probe("livenessProbe:"));
    let sock = cluster.node(0).socket_path();
    cluster
        .wait_state(0, "UNAVAILABLE", NOTICE)
        .expect("unconfigured");
    assert!(!passes(&ready, &sock), "not ready while unconfigured");
    assert!(passes(&live, &sock), "alive while unconfigured");

    for i in 0..2 {
        cluster.write_nodes_file(i, &real).expect("real list");
        cluster.signal(i, Signal::SIGUSR1).expect("SIGUSR1");
    }
    cluster.wait_up(0, FORM).expect("domain UP");
    let out = run(Command::new(binary()).args(["ctl", "-q", "-u"]).arg(&sock));
    assert_eq!(text(&out.stdout), "READY\n", "exactly READY, as DRA wants");
    assert!(passes(&ready, &sock), "ready once READY");
    assert!(passes(&live, &sock), "alive");

    cluster.stop(0, NOTICE).expect("stop node 0");
    assert!(!passes(&ready, &sock), "not ready once gone");
    assert!(!passes(&live, &sock), "not alive once gone");
}

#[test]
fn a_compute_domain_s_job_file_in_the_manifest_s_jobs_dir_makes_its_job() {
    let keys = config_map();
    assert!(
        keys.contains(&("OPENIMEX_JOBS_DIR".to_string(), IN_POD_JOBS_DIR.to_string())),
        "the ConfigMap names the jobs directory under the host's /etc/nvidia-imex: {keys:?}"
    );
    assert!(MANIFEST.contains(&format!("{IN_POD_JOBS_DIR}/<ComputeDomain UID>.job")));
    // The manifest's keys, each node's own paths in place of the host's.
    let s = with_manifest_keys(spec(3));
    let mut cluster = Cluster::prepare(s).expect("prepare 3 nodes");
    let dirs: Vec<_> = (0..3)
        .map(|i| cluster.node(i).dir().join("etc-nvidia-imex-jobs"))
        .collect();
    for (i, dir) in dirs.iter().enumerate() {
        let dir = dir.display().to_string();
        cluster
            .set_node_config(i, "OPENIMEX_JOBS_DIR", &dir)
            .expect("the node's jobs directory");
        cluster.start_node(i).expect("start");
    }
    cluster.wait_up(0, FORM).expect("domain UP");
    // The node agent of a ComputeDomain on nodes 0 and 2, channel 5.
    let uid = "0f8e2a4c-1b3d-4e5f-8a9b-0c1d2e3f4a5b";
    let members = format!("{},{}", cluster.node(0).ip(), cluster.node(2).ip());
    for i in [0, 2] {
        let tmp = dirs[i].join(format!(".{uid}.tmp"));
        std::fs::create_dir_all(&dirs[i]).expect("the host directory");
        std::fs::write(&tmp, format!("CHANNEL=5\nMEMBERS={members}\n")).expect("write");
        std::fs::rename(&tmp, dirs[i].join(format!("{uid}.job"))).expect("move in");
    }
    let wait = |i: usize, state: &str| {
        let sock = cluster.node(i).socket_path();
        let out = run(Command::new(binary()).args(["ctl", "-u"]).arg(&sock).args([
            "jobs",
            "wait",
            uid,
            "--state",
            state,
            "--timeout",
            "30",
        ]));
        assert!(out.status.success(), "node {i}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), format!("{state}\n"));
    };
    for i in [0, 2] {
        wait(i, "READY");
    }
    let sock = cluster.node(1).socket_path();
    let out = run(Command::new(binary())
        .args(["ctl", "-q", "--job", uid, "-u"])
        .arg(&sock));
    assert!(
        !out.status.success(),
        "node 1 runs no pod of it: no such job there"
    );
    for i in [0, 2] {
        std::fs::remove_file(dirs[i].join(format!("{uid}.job"))).expect("unprepare");
        wait(i, "GONE");
    }
}
