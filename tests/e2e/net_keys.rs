//! Issue 9, item 1: `NETWORK_INTERFACE` and `IMEX_CONN_WAIT_TIMEOUT` with NVIDIA's meaning.
//!
//! - Two daemons in two network namespaces joined by a veth pair, each end holding only an
//!   IPv6 link-local address (`fe80::1`, `fe80::2`), form an UP domain: one picks its address
//!   from the nodes file with `NETWORK_INTERFACE` set, the other is given `BIND_INTERFACE_IP`
//!   and finds the interface itself. Both dial the other's link-local address with the scope.
//! - An interface name the host does not have fails start-up at the key's line.
//! - With `IMEX_WAIT_FOR_QUORUM=FULL` and `IMEX_CONN_WAIT_TIMEOUT`, a daemon whose peer never
//!   comes up goes on to READY after the timeout, with a warning naming the peer.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use openimex_harness::netns::{LinkLocalPair, NetNs};
use openimex_harness::{Cluster, DomainView, ScratchDir};

use crate::common::{FORM, assert_clean_failure, binary, run, spec, text, wait_for};

/// A daemon started by the test, killed (and reaped) on drop, before its namespace goes.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Node `i`'s config for the link-local domain, its unix socket and its log.
fn link_local_node(dir: &Path, i: usize, extra: &str) -> (PathBuf, PathBuf, PathBuf) {
    let node = dir.join(format!("node{i}"));
    std::fs::create_dir_all(&node).expect("node dir");
    let (cfg, sock, log) = (
        node.join("config.cfg"),
        node.join("imex.sock"),
        node.join("imex.log"),
    );
    std::fs::write(node.join("nodes.cfg"), "fe80::1\nfe80::2\n").expect("nodes file");
    let text = format!(
        "DAEMONIZE=0\nLOG_LEVEL=4\nLOG_FILE_NAME={}\nSERVER_PORT=50000\n\
         IMEX_NODE_CONFIG_FILE={}\nIMEX_WAIT_FOR_QUORUM=NONE\nIMEX_CMD_ENABLED=1\n\
         IMEX_CMD_UNIX_DOMAIN_PATH={}\nOPENIMEX_DRIVER=nogpu\nOPENIMEX_PERSIST_FILE={}\n\
         OPENIMEX_HEARTBEAT_INTERVAL_MS=200\nOPENIMEX_PEER_TIMEOUT_MS=2000\n{extra}",
        log.display(),
        node.join("nodes.cfg").display(),
        sock.display(),
        node.join("persist.dat").display(),
    );
    std::fs::write(&cfg, text).expect("config");
    (cfg, sock, log)
}

/// Starts the daemon on `cfg` inside `ns`, its stderr next to its log.
fn spawn_in(ns: &NetNs, cfg: &Path, log: &Path) -> Daemon {
    let stderr = std::fs::File::create(log.with_extension("stderr")).expect("stderr file");
    let child = ns
        .command(&binary())
        .arg("daemon")
        .arg("-c")
        .arg(cfg)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn the daemon in its namespace");
    Daemon(child)
}

/// `ctl -u <sock> <args>` from the test's namespace (a socket file crosses namespaces).
fn ctl_u(sock: &Path, args: &[&str]) -> std::process::Output {
    run(std::process::Command::new(binary())
        .arg("ctl")
        .arg("-u")
        .arg(sock)
        .args(args))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn link_local_domain_forms_up_across_two_namespaces() {
    let pair = LinkLocalPair::create(
        "ll",
        [
            "fe80::1".parse().expect("ip"),
            "fe80::2".parse().expect("ip"),
        ],
    )
    .expect("namespaces");
    let mut dir = ScratchDir::new("netkeys").expect("scratch dir");
    let if0 = format!("NETWORK_INTERFACE={}\n", LinkLocalPair::IFNAME);
    let nodes = [
        // Bind IP picked from the nodes file: a link-local entry is this host's on the interface.
        link_local_node(dir.path(), 0, &if0),
        // Bind IP given, interface left empty: the only interface holding it gives the scope.
        link_local_node(
            dir.path(),
            1,
            "BIND_INTERFACE_IP=fe80::2\nNETWORK_INTERFACE=\n",
        ),
    ];
    let daemons: Vec<Daemon> = pair
        .ns
        .iter()
        .zip(&nodes)
        .map(|(ns, (cfg, _, log))| spawn_in(ns, cfg, log))
        .collect();
    let sock0 = &nodes[0].1;
    let mut last = String::new();
    let up = wait_for(FORM, || {
        let out = ctl_u(sock0, &["-N", "-j"]);
        last = text(&out.stdout) + &text(&out.stderr);
        DomainView::parse(&text(&out.stdout)).is_ok_and(|d| d.status == "UP" && d.nodes.len() == 2)
    });
    let logs = || {
        nodes
            .iter()
            .map(|(_, _, log)| {
                format!(
                    "{}:\n{}{}",
                    log.display(),
                    read(log),
                    read(&log.with_extension("stderr"))
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    if !up {
        dir.keep();
    }
    assert!(
        up,
        "no UP domain over link-local addresses; last ctl: {last}\n{}",
        logs()
    );
    let log0 = read(&nodes[0].2);
    assert!(
        log0.contains(
            "Identified this node as ID 0, using bind IP of 'fe80::1', and network interface of imex0"
        ),
        "{log0}"
    );
    let log1 = read(&nodes[1].2);
    assert!(
        log1.contains(
            "Identified this node as ID 1, using bind IP of 'fe80::2', and network interface of imex0"
        ),
        "{log1}"
    );
    // The daemon's own node map, over its command service: fe80::1 is this node.
    let out = ctl_u(sock0, &["-m"]);
    let map = text(&out.stdout);
    assert!(
        map.lines()
            .any(|l| l.trim_start().starts_with("0  fe80::1")
                && l.ends_with("fe80::1  <- this node")),
        "{map}\n{}",
        text(&out.stderr)
    );
    drop(daemons);
    drop(pair);
}

#[test]
fn an_unknown_network_interface_fails_start_up_at_its_line() {
    let cluster =
        Cluster::prepare(spec(1).config("NETWORK_INTERFACE", "nosuch-if0")).expect("files");
    let cfg = cluster.node(0).config_path();
    let line = read(&cfg)
        .lines()
        .position(|l| l.starts_with("NETWORK_INTERFACE="))
        .expect("the key is written")
        + 1;
    let out = run(std::process::Command::new(binary())
        .arg("daemon")
        .arg("-c")
        .arg(&cfg));
    let stderr = assert_clean_failure(&out, "daemon with an unknown NETWORK_INTERFACE");
    let want = format!(
        "{}:{line}: NETWORK_INTERFACE=\"nosuch-if0\": this host has no network interface of that name",
        cfg.display()
    );
    assert!(stderr.contains(&want), "want {want}\ngot {stderr}");
    assert!(stderr.contains("or leave it empty"), "{stderr}");
}

#[test]
fn full_quorum_goes_ready_after_the_conn_wait_timeout_without_a_dead_peer() {
    let mut cluster = Cluster::prepare(
        spec(2)
            .config("IMEX_WAIT_FOR_QUORUM", "FULL")
            .config("IMEX_CONN_WAIT_TIMEOUT", "2"),
    )
    .expect("files");
    // Node 1 never starts.
    cluster.start_node(0).expect("start node 0");
    let ready = cluster.wait_state(0, "READY", Duration::from_secs(60));
    let log = read(&cluster.node(0).log_path());
    assert!(ready.is_ok(), "{ready:?}\n{log}");
    assert!(
        log.contains(&format!(
            "IMEX_CONN_WAIT_TIMEOUT (2 s) passed with nodes 1 ({}) still not connected",
            cluster.addrs().ip(1)
        )),
        "{log}"
    );
    assert!(log.contains("[WARNING]"), "{log}");
    let wait_line = log
        .find("waiting at most 2 s for every peer")
        .expect("start-up note");
    let warn_line = log
        .find("IMEX_CONN_WAIT_TIMEOUT (2 s) passed")
        .expect("warning");
    assert!(wait_line < warn_line, "{log}");
}

/// ctl's `-d` lists the configuration exactly as the daemon logged it at start, and `-m` the
/// daemon's node map with its own entry marked, both from the running daemon; with the daemon
/// stopped, ctl computes them from the file and says so. `--help` says the meaning is ours.
#[test]
fn ctl_dump_matches_the_daemon_log_and_map_marks_this_node() {
    let mut cluster =
        Cluster::start(spec(2).config("IMEX_CONN_WAIT_TIMEOUT", "70")).expect("cluster");
    cluster.wait_up(1, FORM).expect("domain UP");
    let out = cluster.ctl(1, &["-d"]).expect("ctl -d");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dump = text(&out.stdout);
    let log = read(&cluster.node(1).log_path());
    let mut lines = dump.lines();
    assert!(
        lines
            .next()
            .is_some_and(|h| h.contains("the running daemon at")),
        "{dump}"
    );
    let mut checked = 0;
    for line in lines {
        assert!(
            log.contains(&format!("] {line}\n")),
            "{line:?} not in the daemon's log:\n{log}"
        );
        checked += 1;
    }
    assert!(checked > 20, "{dump}");
    assert!(dump.contains("\nIMEX_CONN_WAIT_TIMEOUT = 70\n"), "{dump}");

    let ip1 = cluster.addrs().ip(1).to_string();
    let this_node = |map: &str| -> Vec<String> {
        map.lines()
            .filter(|l| l.ends_with("<- this node"))
            .map(String::from)
            .collect()
    };
    let out = cluster.ctl(1, &["-m"]).expect("ctl -m");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let map = text(&out.stdout);
    assert!(
        map.starts_with("Node map (openimex's -m): the node map of the running daemon"),
        "{map}"
    );
    let marked = this_node(&map);
    assert_eq!(marked.len(), 1, "{map}");
    assert!(
        marked[0].trim_start().starts_with('1') && marked[0].contains(&ip1),
        "{map}"
    );

    cluster.stop(1, FORM).expect("stop node 1");
    let out = cluster.ctl(1, &["-m", "-j"]).expect("ctl -m -j");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["local_node_id"], 1, "{doc}");
    let source = doc["source"].as_str().unwrap_or_default();
    assert!(
        source.contains("computed by ctl from") && source.contains("the daemon did not answer"),
        "{doc}"
    );

    let help = run(std::process::Command::new(binary()).args(["ctl", "--help"]));
    let help = text(&help.stdout);
    assert!(help.matches("Meaning ours").count() == 2, "{help}");
}

/// NVIDIA's case for the key: a link-local bind IP present on several interfaces. Without
/// `NETWORK_INTERFACE` start-up fails naming both interfaces and the key; with it, the daemon
/// binds on the named one and comes up.
#[test]
fn link_local_on_two_interfaces_needs_network_interface() {
    let ns = NetNs::create("two").expect("namespace");
    // Two veth pairs inside one namespace; the first end of each holds fe80::1.
    for (dev, peer) in [("lla0", "lla0p"), ("lla1", "lla1p")] {
        ns.ip(&["link", "add", dev, "type", "veth", "peer", "name", peer])
            .expect("veth pair");
        for end in [dev, peer] {
            ns.ip(&["link", "set", end, "addrgenmode", "none"])
                .expect("no auto address");
        }
        ns.ip(&["addr", "add", "fe80::1/64", "dev", dev, "nodad"])
            .expect("address");
        for end in [dev, peer] {
            ns.ip(&["link", "set", end, "up"]).expect("up");
        }
    }
    let dir = ScratchDir::new("netkeys2").expect("scratch dir");
    let (cfg, sock, log) = link_local_node(dir.path(), 0, "");
    let out = run(ns.command(&binary()).arg("daemon").arg("-c").arg(&cfg));
    let stderr = assert_clean_failure(&out, "link-local bind IP on two interfaces");
    assert!(
        stderr.contains("NETWORK_INTERFACE is not set: "),
        "{stderr}"
    );
    assert!(stderr.contains("it is on lla0 and lla1"), "{stderr}");

    let mut text_cfg = read(&cfg);
    text_cfg.push_str("NETWORK_INTERFACE=lla1\n");
    std::fs::write(&cfg, text_cfg).expect("config");
    let daemon = spawn_in(&ns, &cfg, &log);
    let ready = wait_for(FORM, || {
        text(&ctl_u(&sock, &["-q"]).stdout).trim() == "READY"
    });
    let logged = read(&log);
    assert!(ready, "{logged}");
    assert!(
        logged.contains("using bind IP of 'fe80::1', and network interface of lla1"),
        "{logged}"
    );
    drop(daemon);
}
