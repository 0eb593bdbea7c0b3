//! Faults: a node killed with SIGKILL and restarted as a new instance, a node leaving cleanly
//! on SIGTERM (a goodbye, not a failure), and a node with a different node map (refused with
//! a named reason, never a silent partial domain).

use std::net::Ipv4Addr;
use std::time::Duration;

use openimex_harness::{Cluster, DomainView};

use crate::common::{FORM, NOTICE, spec, text};

#[test]
fn eighteen_nodes_form_and_survive_kill9() {
    const N: usize = 18;
    const VICTIM: usize = 7;
    let mut cluster = Cluster::start(spec(N)).expect("start 18 nodes");
    cluster.wait_up(0, FORM).expect("18-node domain UP");

    let before = cluster.links(0).expect("links on node 0");
    let old_id = before
        .node(VICTIM as u32)
        .expect("node 7 in links")
        .instance_id
        .clone();
    assert!(
        !old_id.is_empty(),
        "a reachable node has an instance id: {}",
        before.compact()
    );
    let own = cluster.links(VICTIM).expect("links on node 7");
    assert_eq!(
        own.node(VICTIM as u32).map(|n| n.instance_id.as_str()),
        Some(old_id.as_str()),
        "node 7's own instance id must match what node 0 reports"
    );

    cluster.kill9(VICTIM).expect("kill -9 node 7");
    let degraded = |d: &DomainView| {
        d.status == "DEGRADED"
            && d.node_status(VICTIM as u32) == Some("UNAVAILABLE")
            && (0..N as u32).filter(|&j| j != VICTIM as u32).all(|j| {
                d.connection(j, VICTIM as u32)
                    .is_some_and(|c| c != "CONNECTED")
            })
    };
    let d = cluster
        .wait_domain(
            0,
            NOTICE,
            "DEGRADED with node 7 UNAVAILABLE and unconnected",
            degraded,
        )
        .expect("node 0 notices the kill");
    // Everyone else is still fine.
    for j in (0..N as u32).filter(|&j| j != VICTIM as u32) {
        assert_eq!(d.node_status(j), Some("READY"), "node {j}: {}", d.compact());
    }

    cluster.restart(VICTIM).expect("restart node 7");
    cluster
        .wait_up(0, FORM)
        .expect("domain UP again after the restart");
    let after = cluster.links(0).expect("links on node 0");
    let new_id = &after
        .node(VICTIM as u32)
        .expect("node 7 in links")
        .instance_id;
    assert!(!new_id.is_empty(), "{}", after.compact());
    assert_ne!(new_id, &old_id, "a restarted daemon is a new instance");
}

#[test]
fn sigterm_node_leaves_cleanly() {
    let mut cluster = Cluster::start(spec(3)).expect("start 3 nodes");
    cluster.wait_up(0, FORM).expect("domain UP");

    let out = cluster
        .stop(2, Duration::from_secs(10))
        .expect("SIGTERM node 2");
    assert_eq!(
        out.exit_code,
        Some(0),
        "SIGTERM must end in exit 0: {out:?}"
    );
    assert!(!out.killed, "{out:?}");
    assert!(
        out.elapsed < Duration::from_secs(5),
        "exit within 5 s of SIGTERM: {out:?}"
    );

    let links = cluster
        .wait_links(0, NOTICE, "link 0->2 DISCONNECTED by goodbye", |l| {
            l.link(0, 2).is_some_and(|c| {
                c.status == "DISCONNECTED" && c.reason.to_lowercase().contains("goodbye")
            })
        })
        .expect("node 0 records node 2's departure as a goodbye");
    assert_ne!(links.status, "UP", "{}", links.compact());
    cluster
        .wait_domain(0, NOTICE, "DEGRADED with node 2 UNAVAILABLE", |d| {
            d.status == "DEGRADED" && d.node_status(2) == Some("UNAVAILABLE")
        })
        .expect("domain DEGRADED after a departure");
}

#[test]
fn mismatched_node_maps_refuse() {
    let mut cluster = Cluster::prepare(spec(2)).expect("prepare 2 nodes");
    let o = cluster.node(0).ip().octets();
    let stranger = Ipv4Addr::new(o[0], o[1], o[2], 99);
    let hosts = [cluster.node(0).ip(), cluster.node(1).ip(), stranger].map(|ip| ip.to_string());
    cluster
        .write_nodes_file(1, &hosts)
        .expect("node 1 gets a third entry");
    cluster.start_node(0).expect("start node 0");
    cluster.start_node(1).expect("start node 1");

    let d = cluster
        .wait_domain(0, NOTICE, "connection 0->1 NODE_MAP_MISMATCH", |d| {
            d.connection(0, 1) == Some("NODE_MAP_MISMATCH")
        })
        .expect("node 0 names the mismatch");
    assert_ne!(
        d.status,
        "UP",
        "a mismatched domain is not UP: {}",
        d.compact()
    );

    let table = cluster.ctl(0, &["-N"]).expect("ctl -N");
    assert!(table.status.success(), "ctl -N: {}", text(&table.stderr));
    let table = text(&table.stdout);
    // The legend also mentions !M!: look only at the matrix below its header.
    let matrix: String = table
        .lines()
        .skip_while(|l| !l.contains("From\\To"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Domain State"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(matrix.contains("!M!"), "the matrix must show !M!:\n{table}");
    let state = table.lines().find(|l| l.starts_with("Domain State:"));
    assert!(
        state.is_some_and(|s| s != "Domain State: UP"),
        "domain state line must be present and not UP:\n{table}"
    );

    let links = cluster.links(0).expect("links on node 0");
    let link = links.link(0, 1).expect("link 0->1");
    assert_eq!(link.status, "NODE_MAP_MISMATCH", "{}", links.compact());
    assert!(
        link.reason.to_lowercase().contains("node map"),
        "the reason must say what differs: {:?}",
        link.reason
    );
}
