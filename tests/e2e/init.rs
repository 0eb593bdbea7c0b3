//! `openimex init`: the files it writes start a working domain with mutual TLS on, and `ctl`
//! finds the daemon from its config.cfg alone.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use openimex_harness::Cluster;
use serde_json::Value;

use crate::common::{FORM, binary, run, spec, text, wait_for};

/// The daemons, killed and reaped on drop, whatever the test's outcome.
struct Daemons(Vec<Child>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `openimex init` for the cluster's nodes, on this host: every node's files under
/// `<node 0's dir>/init/node{id}`, where its config points (`--install-dir` with `{id}`).
/// Returns that base directory, the nodes' addresses and init's output.
pub(crate) fn init_on_one_host(cluster: &Cluster) -> (PathBuf, Vec<String>, Output) {
    let ips: Vec<String> = (0..cluster.len())
        .map(|i| cluster.node(i).ip().to_string())
        .collect();
    let base = cluster.node(0).dir().join("init");
    let install = base.join("node{id}");
    let out = run(Command::new(binary()).args([
        "init",
        "--nodes",
        &ips.join(","),
        "--out",
        &base.display().to_string(),
        "--install-dir",
        &install.display().to_string(),
    ]));
    assert!(out.status.success(), "init: {}", text(&out.stderr));
    (base, ips, out)
}

#[test]
fn init_writes_a_tls_domain_that_forms_up() {
    // The cluster only lends addresses and directories; the daemons run on init's files.
    let cluster = Cluster::prepare(spec(3)).expect("prepare 3 nodes");
    let (base, ips, _) = init_on_one_host(&cluster);
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&base.join("ca.key")), 0o600);
    assert_eq!(mode(&base.join("node1/node.key")), 0o600);
    let config = std::fs::read_to_string(base.join("node1/config.cfg")).expect("config");
    assert!(
        config.contains("IMEX_ENABLE_AUTH_ENCRYPTION=1\n"),
        "{config}"
    );

    // A second run does not overwrite the domain's keys.
    let again = run(Command::new(binary()).args([
        "init",
        "--nodes",
        &ips.join(","),
        "--out",
        &base.display().to_string(),
    ]));
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("--force"),
        "{}",
        text(&again.stderr)
    );

    // What only this test needs: no GPU, in the foreground (init wrote each node's own
    // address, log, stats file and record: one host).
    let mut configs = Vec::new();
    for i in 0..ips.len() {
        let path = base.join(format!("node{i}")).join("config.cfg");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open config");
        for line in ["DAEMONIZE=0", "OPENIMEX_DRIVER=nogpu"] {
            writeln!(f, "{line}").expect("append");
        }
        configs.push(path.display().to_string());
    }
    let _daemons = Daemons(
        configs
            .iter()
            .map(|c| {
                Command::new(binary())
                    .args(["daemon", "-c", c])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn daemon")
            })
            .collect(),
    );

    // ctl finds the daemon from the config alone (its root-only unix socket).
    let domain = || {
        let out = run(Command::new(binary()).args(["ctl", "-c", &configs[0], "-N", "-j"]));
        serde_json::from_slice::<Value>(&out.stdout).ok()
    };
    assert!(
        wait_for(FORM, || domain().is_some_and(|d| d["status"] == "UP")),
        "the init domain did not come UP: {:?}",
        domain()
    );
    let socket = base.join("node0/imex_ctrl.sock");
    assert_eq!(mode(&socket), 0o660, "root:root 0660: root only");
    let dump = run(Command::new(binary()).args(["ctl", "-c", &configs[2], "-d"]));
    let dump = text(&dump.stdout);
    assert!(
        dump.contains("IMEX_ENABLE_AUTH_ENCRYPTION = 1"),
        "the daemons run with TLS on:\n{dump}"
    );
}
