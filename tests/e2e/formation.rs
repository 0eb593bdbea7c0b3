//! A domain forms, and the outputs orchestrators parse have NVIDIA's exact shape: `ctl -q`
//! prints `READY\n` (the DRA readiness probe), `ctl -N -j` is one line of JSON with keys in
//! NVIDIA's order and the domain status last (DCGM takes the last `"status":`).

use openimex_harness::{Cluster, is_ctl_timestamp};
use serde_json::Value;

use crate::common::{FORM, spec, text};

/// Keys of an object in the order printed.
fn keys(v: &Value) -> Vec<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// Checks the raw `ctl -N -j` text of a healthy 2-node domain, byte-level properties first.
fn check_domain_json(raw: &str, hosts: &[String]) {
    let line = raw.strip_suffix('\n').unwrap_or(raw);
    assert!(!line.contains('\n'), "-N -j must print one line:\n{raw}");
    assert!(!line.is_empty(), "-N -j printed nothing");

    // DCGM: the last `"status":` in the text is the domain status.
    let at = line
        .rfind("\"status\":")
        .expect("no \"status\": in -N -j output");
    assert!(
        line[at..].starts_with("\"status\":\"UP\""),
        "the last \"status\": must be the domain's UP, found {}",
        &line[at..]
    );
    let nodes_at = line.find("\"nodes\":").expect("no \"nodes\":");
    let ts_at = line.rfind("\"timestamp\":").expect("no \"timestamp\":");
    assert!(
        nodes_at < ts_at && ts_at < at,
        "order must be nodes, timestamp, status: {line}"
    );

    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON ({e}): {line}"));
    assert_eq!(
        keys(&v),
        ["nodes", "timestamp", "status"],
        "top-level keys: {line}"
    );
    let ts = v["timestamp"].as_str().expect("timestamp is a string");
    assert!(
        is_ctl_timestamp(ts),
        "timestamp {ts:?} is not M/D/YYYY HH:MM:SS.mmm"
    );
    assert_eq!(v["status"], "UP");

    let nodes = v["nodes"].as_object().expect("nodes is an object");
    assert_eq!(
        nodes.len(),
        hosts.len(),
        "one entry per configured node: {line}"
    );
    for (i, host) in hosts.iter().enumerate() {
        let node = &v["nodes"][i.to_string()];
        assert_eq!(
            keys(node),
            [
                "status",
                "host",
                "connections",
                "changed",
                "version",
                "hostName"
            ],
            "node {i} keys: {node}"
        );
        assert_eq!(node["status"], "READY", "node {i}: {node}");
        assert_eq!(node["host"], host.as_str(), "node {i}: {node}");
        assert_eq!(node["version"], "NO_GPU", "node {i} (nogpu driver): {node}");
        assert!(
            node["changed"].is_boolean() && node["hostName"].is_string(),
            "{node}"
        );
        for (j, peer) in hosts.iter().enumerate() {
            let conn = &node["connections"][j.to_string()];
            assert_eq!(
                keys(conn),
                ["host", "status", "changed"],
                "cell {i}->{j}: {conn}"
            );
            assert_eq!(conn["host"], peer.as_str(), "cell {i}->{j}: {conn}");
            assert_eq!(conn["status"], "CONNECTED", "cell {i}->{j}: {conn}");
        }
    }
}

#[test]
fn two_nodes_form() {
    let cluster = Cluster::start(spec(2)).expect("start 2 nodes");
    let hosts: Vec<String> = (0..2).map(|i| cluster.node(i).ip().to_string()).collect();
    for i in 0..2 {
        let d = cluster.wait_up(i, FORM).expect("domain UP");
        for from in 0..2u32 {
            assert_eq!(
                d.node_status(from),
                Some("READY"),
                "node {i}'s view: {}",
                d.compact()
            );
            for to in 0..2u32 {
                assert_eq!(
                    d.connection(from, to),
                    Some("CONNECTED"),
                    "cell {from}->{to} in node {i}'s view: {}",
                    d.compact()
                );
            }
        }

        let q = cluster.ctl(i, &["-q"]).expect("ctl -q");
        assert!(
            q.status.success(),
            "ctl -q on node {i}: {:?} {}",
            q.status,
            text(&q.stderr)
        );
        assert_eq!(
            text(&q.stdout),
            "READY\n",
            "ctl -q on node {i} must print exactly READY\\n"
        );

        let n = cluster.ctl(i, &["-N", "-j"]).expect("ctl -N -j");
        assert!(
            n.status.success(),
            "ctl -N -j on node {i}: {}",
            text(&n.stderr)
        );
        check_domain_json(&text(&n.stdout), &hosts);
    }
}

/// Established TCP connections whose server end is one of `listeners` (each connection shows
/// once per end in /proc/net/tcp; the server end names it once).
fn connections_to(listeners: &[std::net::SocketAddrV4]) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // 01: ESTABLISHED
            f.len() > 3
                && f[3] == "01"
                && parse_proc_addr(f[1]).is_some_and(|a| listeners.contains(&a))
        })
        .count()
}

/// `0100007F:1F90` → 127.0.0.1:8080 (the address is in host byte order).
fn parse_proc_addr(s: &str) -> Option<std::net::SocketAddrV4> {
    let (ip, port) = s.split_once(':')?;
    let ip = u32::from_str_radix(ip, 16).ok()?;
    let port = u16::from_str_radix(port, 16).ok()?;
    Some(std::net::SocketAddrV4::new(
        std::net::Ipv4Addr::from(ip.swap_bytes()),
        port,
    ))
}

/// One session per pair (issue 8): a domain of n daemons that all dial each other at start
/// settles on n(n-1)/2 peer connections, not n(n-1), and stays there.
#[test]
fn a_domain_keeps_one_connection_per_pair() {
    let n = 6;
    let cluster =
        Cluster::start(spec(n).config("OPENIMEX_STATS_INTERVAL_SEC", "1")).expect("start");
    cluster.wait_up(0, FORM).expect("UP");
    let listeners: Vec<std::net::SocketAddrV4> = (0..n)
        .map(|i| std::net::SocketAddrV4::new(cluster.node(i).ip(), cluster.node(i).server_port()))
        .collect();
    let pairs = n * (n - 1) / 2;
    // Simultaneous dials leave a second session for a moment; the higher node closes it.
    let settled = crate::common::wait_for(FORM, || connections_to(&listeners) == pairs);
    assert!(
        settled,
        "{} peer connections for {pairs} pairs",
        connections_to(&listeners)
    );
    // Several heartbeat periods later (three of node 0's one-second stats records, each with
    // heartbeats in it: the daemon's own account that time passed with its sessions alive),
    // still one per pair, and the domain still UP.
    let stats = cluster.node(0).stats_path();
    let records = || -> Vec<String> {
        std::fs::read_to_string(&stats)
            .unwrap_or_default()
            .split("Performance statistics for last ")
            .skip(1)
            .map(str::to_owned)
            .collect()
    };
    let settled_at = records().len();
    let beats = crate::common::wait_for(FORM, || {
        let r = records();
        r.len() >= settled_at + 3
            && r[settled_at..]
                .iter()
                .all(|rec| rec.contains("\"Heartbeat\""))
    });
    assert!(
        beats,
        "no three heartbeat intervals recorded:\n{}",
        records().join("\n")
    );
    assert_eq!(connections_to(&listeners), pairs);
    cluster.wait_up(n - 1, FORM).expect("still UP");
}
