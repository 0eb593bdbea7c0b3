//! What `ctl --peers` shows, end to end (issue 7 item 6, "Visible state"): per peer the
//! references a node holds for that peer's importers, its imports from that peer, the
//! unimports it owes that peer, and each clean-up of that peer with its reason and time. The
//! numbers come from live daemons driving real imports, a release and a kill -9.

use openimex_harness::{PeerView, PeersView, is_ctl_timestamp};

use crate::apps::*;
use crate::common::{NOTICE, text, unix_ms};

/// Peer `peer` of a view; every configured peer has a row.
#[track_caller]
fn row(v: &PeersView, peer: u32) -> &PeerView {
    v.peer(peer)
        .unwrap_or_else(|| panic!("no row for peer {peer}: {}", v.compact()))
}

/// (exports held, imports, unimports pending) for `peer`, or `None` without a row.
fn counts(v: &PeersView, peer: u32) -> Option<(u64, u64, u64)> {
    v.peer(peer)
        .map(|p| (p.exports_held, p.imports, p.unimports_pending))
}

#[test]
fn ctl_peers_shows_references_imports_and_clean_ups_with_reason_and_time() {
    let mut cluster = gpu_cluster_with(3, &[("IMEX_NODE_DISCONNECTED_GRACE_TIME", "0")]);
    let dirs: Vec<_> = (0..3)
        .map(|i| cluster.node(i).dir().to_path_buf())
        .collect();

    let v = cluster.peers(0).expect("ctl --peers -j on node 0");
    assert_eq!(v.local_node, 0);
    assert_eq!(
        v.peers.iter().map(|p| p.node).collect::<Vec<_>>(),
        vec![1, 2],
        "one row per peer, not the node itself: {}",
        v.compact()
    );
    for p in &v.peers {
        assert_eq!(p.status, "CONNECTED", "{}", v.compact());
        assert_eq!(
            (
                p.exports_held,
                p.imports,
                p.unimports_pending,
                p.cleanups_total
            ),
            (0, 0, 0, 0),
            "nothing held yet: {}",
            v.compact()
        );
    }

    // Node 0 exports; nodes 1 and 2 import and hold.
    let (exp, handle) = exporter(&dirs[0], &channel(&cluster, 0, 0), 61, "exporter on node 0");
    let import_on = |i: usize| {
        let what = format!("importer on node {i}");
        held_importer(&dirs[i], &channel(&cluster, i, 0), &handle, 61, &what)
    };
    let (mut imp1, imp2) = (import_on(1), import_on(2));
    let v0 = cluster
        .wait_peers(
            0,
            NOTICE,
            "node 0 holds one reference each for 1 and 2",
            |v| counts(v, 1) == Some((1, 0, 0)) && counts(v, 2) == Some((1, 0, 0)),
        )
        .expect("node 0's view");
    assert_eq!(row(&v0, 1).host, cluster.node(1).ip().to_string());
    for i in [1, 2] {
        let v = cluster.peers(i).expect("ctl --peers -j");
        assert_eq!(
            counts(&v, 0),
            Some((0, 1, 0)),
            "node {i} imports once from node 0: {}",
            v.compact()
        );
    }
    let v1 = cluster.peers(1).expect("node 1's view");
    assert_eq!(counts(&v1, 2), Some((0, 0, 0)), "{}", v1.compact());
    // The text view: a row for node 0 with one import and no clean-up.
    let out = cluster.ctl(1, &["--peers"]).expect("ctl --peers");
    let table = text(&out.stdout);
    assert!(out.status.success(), "{table}{}", text(&out.stderr));
    assert!(table.contains("Exports held"), "{table}");
    let node0 = table
        .lines()
        .find(|l| l.starts_with("0 "))
        .unwrap_or_else(|| panic!("no row for node 0: {table}"));
    let cols: Vec<&str> = node0.split_whitespace().collect();
    assert_eq!(
        cols.get(2..8),
        Some(&["CONNECTED", "0", "1", "0", "0", "-"][..]),
        "{table}"
    );

    // Node 2 releases its import: node 0 drops its reference, node 2 owes nothing.
    imp2.exit();
    cluster
        .wait_peers(0, NOTICE, "node 0 released node 2's reference", |v| {
            counts(v, 2) == Some((0, 0, 0)) && counts(v, 1) == Some((1, 0, 0))
        })
        .expect("node 0 after the release");
    cluster
        .wait_peers(2, NOTICE, "node 2 no longer imports from node 0", |v| {
            counts(v, 0) == Some((0, 0, 0))
        })
        .expect("node 2 after the release");

    // Node 0's daemon dies; with grace time 0, nodes 1 and 2 clean node 0 up at once.
    let before = unix_ms();
    cluster.kill9(0).expect("kill -9 node 0's daemon");
    for i in [1u32, 2] {
        let v = cluster
            .wait_peers(i as usize, NOTICE, "node 0 cleaned up", |v| {
                v.peer(0).is_some_and(|p| p.cleanups_total >= 1)
            })
            .expect("a clean-up of node 0");
        let p = row(&v, 0);
        assert_eq!(
            p.cleanups_total,
            1,
            "one loss, one clean-up: {}",
            v.compact()
        );
        assert_eq!(p.status, "DISCONNECTED", "{}", v.compact());
        assert_eq!((p.exports_held, p.imports), (0, 0), "{}", v.compact());
        let c = &p.cleanups[0];
        assert!(
            c.reason.contains("lost"),
            "the reason names the loss: {}",
            v.compact()
        );
        assert!(is_ctl_timestamp(&c.time), "{}", v.compact());
        let at = v.raw["peers"][0]["cleanups"][0]["time_unix_ms"]
            .as_u64()
            .unwrap_or_default();
        assert!(
            (before..=unix_ms()).contains(&at),
            "cleaned up after the kill and before now ({before}..): {}",
            v.compact()
        );
        // Node 1 still held its import: dropped here, and owed to node 0 should it come
        // back as the same instance. Node 2 had released everything already.
        let held = u64::from(i == 1);
        assert_eq!(c.imports_dropped, held, "{}", v.compact());
        assert_eq!(p.unimports_pending, held, "{}", v.compact());
        assert_eq!(counts(&v, 3 - i), Some((0, 0, 0)), "{}", v.compact());
    }
    // The clean-up disabled node 1's importer of node 0's memory.
    let status = imp1.wait(NOTICE);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the importer of a cleaned-up peer is revoked: {status:?}"
    );
    let table = text(&cluster.ctl(1, &["--peers"]).expect("ctl --peers").stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("0 ") && l.contains("lost for longer than the grace time")),
        "the text row shows the last clean-up's reason: {table}"
    );
    drop(exp);
}
