//! Names mode and SIGUSR1 (issue 7, item 4): daemons that find each other through DNS names,
//! each with its own `/etc/hosts` as Kubernetes pods of the DRA driver have, and SIGUSR1
//! re-reading the nodes file and re-resolving the names without a restart (same PID): a node
//! that moved is reached at its new address, appended lines join, live imports between other
//! nodes are untouched, a removed line becomes a hole (nobody renumbered, issue 31), and an
//! edited or reordered line, or the daemon's own line removed, is refused while the daemon
//! keeps its map.

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use openimex_harness::{Cluster, GpuSpec, Signal};
use serde_json::Value;

use crate::apps::*;
use crate::common::{FORM, NOTICE, log, spec, wait_log_line};

/// Lines of `text` that speak of node `j` ("node 1", "Node 1 (", not "node 10").
fn lines_about(text: &str, j: usize) -> Vec<String> {
    let word = format!("node {j}");
    text.lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.match_indices(&word).any(|(at, _)| {
                !l[at + word.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit())
            })
        })
        .map(str::to_owned)
        .collect()
}

/// The driver's reference counters of a node (see [`REFS`]).
fn refs(node_dir: &Path) -> Vec<(String, Value)> {
    let s = stats(node_dir);
    REFS.iter()
        .map(|k| (k.to_string(), s[*k].clone()))
        .collect()
}

#[test]
fn names_mode_cluster_forms_up_through_private_hosts_files() {
    let cluster = Cluster::start(spec(2).with_names()).expect("start 2 nodes in names mode");
    let d = cluster.wait_up(1, FORM).expect("domain UP");
    for i in 0..2 {
        let name = cluster.node_name(i).expect("name").to_owned();
        assert_eq!(name, format!("oimx-n{i}"));
        let host = d.nodes.get(&(i as u32)).map(|n| n.host.clone());
        assert_eq!(host.as_deref(), Some(name.as_str()), "{}", d.compact());
    }
}

#[test]
fn sigusr1_reaches_a_moved_node_at_its_new_address_and_leaves_live_imports_alone() {
    let spec3 = spec(3).with_names().with_gpus(GpuSpec::default());
    let mut cluster = gpu_cluster_from(spec3);
    let (d0, d1) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(1).dir().to_path_buf(),
    );
    let (mut exp, mut imp) = held_import_0_to_1(&cluster, 41);
    let before = (refs(&d0), refs(&d1));
    let pids = [cluster.node(0).pid(), cluster.node(1).pid()];
    let link01 = cluster.links(0).expect("links").link(0, 1).cloned();
    let marks = [log(&cluster, 0).len(), log(&cluster, 1).len()];

    // Node 2 is rescheduled on another address: restarted there, every hosts file rewritten in
    // place (as the DRA driver rewrites the pods' /etc/hosts), then SIGUSR1 to the others.
    let old_ip = cluster.node(2).ip();
    let new_ip = cluster.spare_ip().expect("a spare address");
    cluster.move_node(2, new_ip).expect("move node 2");
    for i in 0..3 {
        assert_eq!(
            cluster.host_ip(i, "oimx-n2"),
            Some(new_ip),
            "node {i}'s hosts"
        );
    }
    for i in 0..2 {
        cluster.signal(i, Signal::SIGUSR1).expect("SIGUSR1");
    }
    for (i, &mark) in marks.iter().enumerate() {
        let line = wait_log_line(&cluster, i, mark, &["re-read (SIGUSR1)"]);
        assert!(
            line.contains(&format!("node 2 (oimx-n2) now resolves to {new_ip}")),
            "node {i} must say where node 2 went: {line}"
        );
    }
    for i in 0..3 {
        cluster
            .wait_up(i, FORM)
            .expect("UP again with node 2 at its new address");
    }
    let d = cluster.domain(0).expect("ctl -N -j");
    assert_eq!(d.nodes.len(), 3, "{}", d.compact());
    assert_ne!(old_ip, new_ip);
    assert_eq!(cluster.node(2).ip(), new_ip);

    // Same processes, and nothing happened between nodes 0 and 1.
    assert_eq!([cluster.node(0).pid(), cluster.node(1).pid()], pids);
    assert_eq!((cluster.node(0).starts(), cluster.node(1).starts()), (1, 1));
    assert_eq!(cluster.links(0).expect("links").link(0, 1).cloned(), link01);
    for (i, j) in [(0, 1), (1, 0)] {
        let since = log(&cluster, i)
            .get(marks[i]..)
            .unwrap_or_default()
            .to_owned();
        let about = lines_about(&since, j);
        assert!(
            about.is_empty(),
            "node {i} must not touch node {j}: {about:#?}"
        );
    }
    assert_eq!(
        imp.ask("verify 41"),
        "ok",
        "the import still reads node 0's data"
    );
    assert_eq!(
        exp.ask("verify 41"),
        "ok",
        "the export still holds its data"
    );
    assert_eq!((refs(&d0), refs(&d1)), before, "reference counts unchanged");
    imp.exit();
    exp.exit();
    wait_all_released(&cluster, "after the import and the export ended");
}

#[test]
fn sigusr1_adds_appended_nodes_without_a_restart() {
    let mut cluster = Cluster::start(spec(3).with_names()).expect("start 3 nodes");
    cluster.wait_up(0, FORM).expect("3 nodes UP");
    let pids: Vec<_> = (0..3).map(|i| cluster.node(i).pid()).collect();
    let marks: Vec<usize> = (0..3).map(|i| log(&cluster, i).len()).collect();

    let n = cluster
        .add_node()
        .expect("a fourth node in every nodes file");
    assert_eq!(n, 3);
    cluster.start_node(n).expect("start node 3");
    for i in 0..3 {
        cluster.signal(i, Signal::SIGUSR1).expect("SIGUSR1");
    }
    for (i, &mark) in marks.iter().enumerate() {
        wait_log_line(
            &cluster,
            i,
            mark,
            &["re-read (SIGUSR1)", "1 node added (node 3 oimx-n3)"],
        );
    }
    for i in 0..4 {
        let d = cluster.wait_up(i, FORM).expect("4 nodes UP");
        assert_eq!(d.nodes.len(), 4, "{}", d.compact());
    }
    let now: Vec<_> = (0..3).map(|i| cluster.node(i).pid()).collect();
    assert_eq!(now, pids, "no daemon restarted");
}

#[test]
fn a_bad_nodes_file_edit_is_refused_and_the_daemon_keeps_its_map() {
    let mut cluster = Cluster::start(spec(3).with_names()).expect("start 3 nodes");
    cluster.wait_up(0, FORM).expect("3 nodes UP");
    let pid = cluster.node(0).pid();
    let path = cluster.node(0).nodes_path();
    let lines = cluster.nodes_lines().to_vec();
    let shown = path.display().to_string();

    let mark = log(&cluster, 0).len();
    cluster.signal(0, Signal::SIGUSR1).expect("SIGUSR1");
    wait_log_line(&cluster, 0, mark, &["re-read (SIGUSR1): nothing changed"]);

    // An edited line: node 1 would become another node. Refused, naming the line.
    let edited = [lines[0].clone(), "oimx-n9".to_string(), lines[2].clone()];
    cluster.write_nodes_file(0, &edited).expect("edit line 2");
    let mark = log(&cluster, 0).len();
    cluster.signal(0, Signal::SIGUSR1).expect("SIGUSR1");
    let line = wait_log_line(&cluster, 0, mark, &["refused", &format!("{shown}:2")]);
    assert!(
        line.contains("node 1's entry changed from \"oimx-n1\" to \"oimx-n9\""),
        "{line}"
    );
    assert!(
        line.contains("a node leaves by removing its line"),
        "the fix: {line}"
    );
    assert!(
        line.contains("keeps running with the node map it has (3 nodes)"),
        "{line}"
    );

    // Its own line removed: a running daemon cannot stop being its node.
    let own = [lines[1].clone(), lines[2].clone()];
    cluster.write_nodes_file(0, &own).expect("remove line 1");
    let mark = log(&cluster, 0).len();
    cluster.signal(0, Signal::SIGUSR1).expect("SIGUSR1");
    let line = wait_log_line(&cluster, 0, mark, &["refused", &shown]);
    assert!(line.contains("this node's own entry (node 0"), "{line}");
    assert!(line.contains("stop this daemon"), "the fix: {line}");

    // Reordered lines: refused too, naming the line.
    let swapped = [lines[0].clone(), lines[2].clone(), lines[1].clone()];
    cluster
        .write_nodes_file(0, &swapped)
        .expect("swap lines 2 and 3");
    let mark = log(&cluster, 0).len();
    cluster.signal(0, Signal::SIGUSR1).expect("SIGUSR1");
    let line = wait_log_line(&cluster, 0, mark, &["refused", &format!("{shown}:3")]);
    assert!(line.contains("reordered"), "{line}");
    assert!(line.contains("would become node 3"), "{line}");

    // An unreadable file: the map stays.
    std::fs::remove_file(&path).expect("remove the nodes file");
    let mark = log(&cluster, 0).len();
    cluster.signal(0, Signal::SIGUSR1).expect("SIGUSR1");
    let line = wait_log_line(
        &cluster,
        0,
        mark,
        &["cannot re-read the nodes file", &shown],
    );
    assert!(line.contains("(3 nodes)"), "{line}");

    assert!(cluster.is_running(0));
    assert_eq!(cluster.node(0).pid(), pid, "same process");
    // ctl reads the nodes file too: put it back (no SIGUSR1 follows) to ask node 0.
    cluster
        .write_nodes_file(0, &lines)
        .expect("restore the nodes file");
    let d = cluster.wait_up(0, FORM).expect("still UP on the old map");
    assert_eq!(d.nodes.len(), 3, "{}", d.compact());
}

/// Issue 31: "a removed line becomes a hole and nobody is renumbered". Node 1's line goes from
/// every nodes file and every daemon gets SIGUSR1: nodes 0 and 2 keep their IDs (node 2 is not
/// renumbered to 1) and their live import, show node 1 as a placeholder, say how to keep the
/// file in step, and refuse node 1, which refuses the file (its own line is gone) and keeps
/// running; written back in place, node 1 joins again at its ID, same processes throughout.
#[test]
fn a_removed_line_becomes_a_hole_and_nobody_is_renumbered() {
    let cluster = gpu_cluster(3);
    for i in 0..3 {
        cluster.wait_up(i, FORM).expect("3 nodes UP");
    }
    let lines = cluster.nodes_lines().to_vec();
    let pids: Vec<_> = (0..3).map(|i| cluster.node(i).pid()).collect();
    let (d0, d2) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(2).dir().to_path_buf(),
    );
    let (exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 43, "exporter on node 0");
    let mut imp = held_importer(&d2, &channel(&cluster, 2, 0), &handle, 43, "importer on 2");
    wait_stats(&d0, NOTICE, "node 0 holds node 2's reference", |s| {
        num(s, "daemon_export_refs") == 1
    });
    let before = (refs(&d0), refs(&d2));
    let link02 = cluster.links(0).expect("links").link(0, 2).cloned();

    let removed = [lines[0].clone(), lines[2].clone()];
    let marks: Vec<usize> = (0..3).map(|i| log(&cluster, i).len()).collect();
    for i in 0..3 {
        cluster
            .write_nodes_file(i, &removed)
            .expect("remove line 2");
        cluster.signal(i, Signal::SIGUSR1).expect("SIGUSR1");
    }
    for i in [0, 2] {
        let line = wait_log_line(&cluster, i, marks[i], &["re-read (SIGUSR1)", "removed"]);
        assert!(
            line.contains(
                "1 node removed, a hole now: its ID is not reused and nobody is renumbered"
            ),
            "node {i}: {line}"
        );
        assert!(
            line.contains(&format!("node 1 {}", lines[1])),
            "node {i}: {line}"
        );
        let warn = wait_log_line(&cluster, i, marks[i], &["write 0.0.0.0 where the line was"]);
        assert!(
            warn.contains(&format!("{}, 0.0.0.0, {}", lines[0], lines[2])),
            "{warn}"
        );
    }
    let own = wait_log_line(&cluster, 1, marks[1], &["refused", "own entry (node 1"]);
    assert!(own.contains("stop this daemon"), "{own}");

    // Nodes 0 and 2 see node 1 as a placeholder and node 2 where it was.
    for i in [0, 2] {
        let d = cluster
            .wait_domain(i, FORM, "node 1 a hole", |d| {
                d.nodes.get(&1).is_some_and(|n| n.status == "UNAVAILABLE")
            })
            .expect("node 1 UNAVAILABLE");
        assert_eq!(d.nodes.len(), 3, "{}", d.compact());
        assert_eq!(d.nodes[&1].host, "0.0.0.0", "{}", d.compact());
        assert_eq!(
            d.nodes[&2].host,
            lines[2],
            "node 2 not renumbered: {}",
            d.compact()
        );
        assert_eq!(d.nodes[&0].host, lines[0], "{}", d.compact());
        let links = cluster.links(i).expect("links");
        assert_eq!(links.local_node, i as u32, "node {i} keeps its ID");
        assert_eq!(
            links.link(i as u32, 1).map(|l| l.status.clone()).as_deref(),
            Some("INVALID"),
            "node {i}: {}",
            d.compact()
        );
    }
    assert_eq!(
        cluster.links(0).expect("links").link(0, 2).cloned(),
        link02,
        "the pair 0-2 is untouched"
    );
    assert_eq!(
        imp.ask("verify 43"),
        "ok",
        "the import still reads node 0's data"
    );
    assert_eq!((refs(&d0), refs(&d2)), before, "reference counts unchanged");

    // Written back in place: node 1 joins again at its ID.
    let marks: Vec<usize> = (0..3).map(|i| log(&cluster, i).len()).collect();
    for i in 0..3 {
        cluster
            .write_nodes_file(i, &lines)
            .expect("restore the file");
        cluster.signal(i, Signal::SIGUSR1).expect("SIGUSR1");
    }
    for i in [0, 2] {
        wait_log_line(&cluster, i, marks[i], &["1 node added (node 1"]);
    }
    for i in 0..3 {
        let d = cluster.wait_up(i, FORM).expect("3 nodes UP again");
        assert_eq!(d.nodes[&1].host, lines[1], "{}", d.compact());
    }
    let now: Vec<_> = (0..3).map(|i| cluster.node(i).pid()).collect();
    assert_eq!(now, pids, "no daemon restarted");
    imp.exit();
    exp.exit();
    wait_all_released(&cluster, "after the import and the export ended");
}

/// A TCP forwarder from `listen` to `target`: a second address at which a node can be reached.
/// Counts the connections it accepted. Stops accepting when dropped (open ones run out).
struct Forwarder {
    listen: SocketAddr,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Forwarder {
    fn start(listen: SocketAddr, target: SocketAddr) -> Self {
        let listener = TcpListener::bind(listen).expect("bind the forwarder");
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, halt) = (Arc::clone(&accepted), Arc::clone(&stop));
        std::thread::spawn(move || {
            for inbound in listener.incoming() {
                if halt.load(Ordering::Acquire) {
                    return;
                }
                let (Ok(inbound), Ok(outbound)) = (inbound, TcpStream::connect(target)) else {
                    continue;
                };
                count.fetch_add(1, Ordering::AcqRel);
                for (mut from, mut to) in [
                    (
                        inbound.try_clone().expect("clone"),
                        outbound.try_clone().expect("clone"),
                    ),
                    (outbound, inbound),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Self {
            listen,
            accepted,
            stop,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Acquire)
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.listen);
    }
}

#[test]
fn sigusr1_drops_a_live_session_to_an_address_the_name_no_longer_resolves_to() {
    // Hellos through the forwarder come from its address, not the node file's.
    let spec3 = spec(3).with_names().config("OPENIMEX_PEER_ANY_SOURCE", "1");
    let mut cluster = Cluster::start(spec3).expect("start 3 nodes");
    cluster.wait_up(0, FORM).expect("3 nodes UP");
    let port = cluster.node(2).server_port();
    let direct = cluster.node(2).ip();
    let spare = cluster.spare_ip().expect("a spare address");
    let forwarder = Forwarder::start(
        SocketAddr::from((spare, port)),
        SocketAddr::from((direct, port)),
    );
    let link01 = cluster.links(0).expect("links").link(0, 1).cloned();

    // Only node 0 learns that oimx-n2 is now at the forwarder; its session to node 2's own
    // address is alive, so only the re-read can move it.
    let mark = log(&cluster, 0).len();
    cluster
        .set_host(0, "oimx-n2", spare)
        .expect("rewrite node 0's hosts");
    cluster.signal(0, Signal::SIGUSR1).expect("SIGUSR1");
    let line = wait_log_line(&cluster, 0, mark, &["re-read (SIGUSR1)"]);
    assert!(
        line.contains(&format!(
            "node 2 (oimx-n2) now resolves to {spare} (re-dialling)"
        )),
        "{line}"
    );
    wait_log_line(
        &cluster,
        0,
        mark,
        &["Connection established to node 2", "times connected: 2"],
    );
    assert!(
        forwarder.accepted() >= 1,
        "node 0 must dial node 2 at its new address"
    );
    cluster.wait_up(0, FORM).expect("UP through the forwarder");
    assert_eq!(cluster.links(0).expect("links").link(0, 1).cloned(), link01);

    // And back: the session through the forwarder is dropped for the direct address.
    let mark = log(&cluster, 0).len();
    cluster
        .set_host(0, "oimx-n2", direct)
        .expect("rewrite node 0's hosts");
    drop(forwarder);
    cluster.signal(0, Signal::SIGUSR1).expect("SIGUSR1");
    wait_log_line(&cluster, 0, mark, &[&format!("now resolves to {direct}")]);
    wait_log_line(
        &cluster,
        0,
        mark,
        &["Connection established to node 2", "times connected: 3"],
    );
    cluster.wait_up(0, FORM).expect("UP directly again");
    assert_eq!(cluster.links(0).expect("links").link(0, 1).cloned(), link01);
}
