//! A peer is who its session proves: one node, fed inbound connections by hand. Requests on a
//! connection without an accepted hello, or claiming another identity, are refused and counted;
//! a refused hello changes no link; references belong to the importer instance that took them;
//! imports in flight per peer are bounded.

mod sim;

use std::time::Instant;

use openimex_core::node::Action;
use openimex_core::*;
use sim::node::{Setup, drain, peer};

const IMPORT: ImportRequest = ImportRequest {
    import_event_id: 7,
    export_uuid: [9; 16],
    index: 0,
    channel: 0,
};

/// Node 0 of a 3-node domain, started, and its peers' hellos as they would send them.
fn node(max_describes: usize) -> (Node, Instant, Vec<Hello>) {
    let (mut n, now, hellos) = sim::node::node(Setup {
        max_describes,
        ..Setup::default()
    });
    sim::node::start(&mut n, now);
    (n, now, hellos)
}

fn refusals(n: &Node) -> Vec<(&'static str, u64)> {
    n.refusals().collect()
}

fn answered_err(actions: &[Action]) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::AnswerImport { answer: Err(_), .. }))
}

#[test]
fn requests_without_a_session_are_refused_and_counted() {
    let (mut n, now, hellos) = node(16);
    let p1 = peer(&hellos[1]);
    n.handle_session_import(now, 1, Via::Accepted { conn: 50 }, Some(p1), IMPORT);
    let a = drain(&mut n);
    assert!(answered_err(&a), "{a:?}");
    assert!(!a.iter().any(|a| matches!(a, Action::DescribeExport { .. })));
    n.handle_session_unimport(now, 2, Via::Accepted { conn: 50 }, Some(p1), 7);
    let a = drain(&mut n);
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::RefuseUnimport { request: 2, .. })),
        "refused, not answered as delivered: {a:?}"
    );
    assert!(!n.handle_session_goodbye(now, Via::Accepted { conn: 50 }, Some(p1), "forged"));
    assert_eq!(n.links()[1].status, ConnStatus::NeverConnected);
    assert_eq!(
        refusals(&n),
        vec![
            ("goodbye: no session", 1),
            ("import: no session", 1),
            ("unimport: no session", 1)
        ]
    );
}

#[test]
fn an_accepted_hello_binds_the_connection_to_that_peer_until_it_closes() {
    let (mut n, now, hellos) = node(16);
    let p1 = peer(&hellos[1]);
    assert_eq!(
        n.handle_session_hello(now, 5, true, &hellos[1]),
        Verdict::Accept
    );
    drain(&mut n);
    assert_eq!(n.session_peer(5), Some(p1));
    // Claiming another node, or another instance, on that session is refused.
    let p2 = peer(&hellos[2]);
    n.handle_session_import(now, 1, Via::Accepted { conn: 5 }, Some(p2), IMPORT);
    assert!(answered_err(&drain(&mut n)));
    let other_instance = PeerId {
        instance: InstanceId(1),
        ..p1
    };
    n.handle_session_import(
        now,
        2,
        Via::Accepted { conn: 5 },
        Some(other_instance),
        IMPORT,
    );
    assert!(answered_err(&drain(&mut n)));
    assert_eq!(refusals(&n), vec![("import: identity mismatch", 2)]);
    // Its own identity is that peer's, but an import takes a reference, and one is taken only
    // for a CONNECTED peer: not before its session opens (a lost peer's clean-up may be under
    // way, node/grace.rs), so no describe.
    n.handle_session_import(now, 3, Via::Accepted { conn: 5 }, Some(p1), IMPORT);
    let a = drain(&mut n);
    assert!(answered_err(&a), "{a:?}");
    assert!(!a.iter().any(|a| matches!(a, Action::DescribeExport { .. })));
    assert!(n.handle_session_opened(now, 5));
    drain(&mut n);
    // Its own identity (or none) is that peer's request.
    n.handle_session_import(now, 3, Via::Accepted { conn: 5 }, Some(p1), IMPORT);
    assert!(matches!(
        drain(&mut n).as_slice(),
        [
            Action::DescribeExport { request: 3, .. },
            Action::Persist { .. }
        ]
    ));
    n.handle_conn_closed(now, 5);
    assert_eq!(n.session_peer(5), None);
    n.handle_session_import(now, 4, Via::Accepted { conn: 5 }, None, IMPORT);
    assert!(answered_err(&drain(&mut n)));
}

#[test]
fn a_refused_hello_changes_no_link_and_a_foreign_address_proves_nothing() {
    let (mut n, now, hellos) = node(16);
    assert_eq!(
        n.handle_session_hello(now, 1, true, &hellos[1]),
        Verdict::Accept
    );
    drain(&mut n);
    let before = n.links();
    // The right identity from the wrong address: refused, counted, nothing else.
    let restarted = Hello {
        instance: InstanceId(999),
        ..hellos[1].clone()
    };
    assert!(matches!(
        n.handle_session_hello(now, 2, false, &restarted),
        Verdict::Refuse { .. }
    ));
    let a = drain(&mut n);
    assert!(
        !a.iter()
            .any(|a| matches!(a, Action::Mesh(mesh::Action::PeerRestarted { .. }))),
        "a restart is believed only from the node's address: {a:?}"
    );
    // A mismatched hello naming node 1 from its own address.
    let mismatched = Hello {
        digest: "0".repeat(64),
        ..hellos[1].clone()
    };
    assert!(matches!(
        n.handle_session_hello(now, 3, true, &mismatched),
        Verdict::Refuse {
            mismatch: Mismatch::NodeMap,
            ..
        }
    ));
    drain(&mut n);
    assert_eq!(n.links(), before, "no link changed");
    assert_eq!(n.session_peer(2), None);
    assert_eq!(n.session_peer(3), None);
    assert_eq!(
        refusals(&n),
        vec![
            ("hello: node map mismatch", 1),
            ("hello: wrong source address", 1)
        ]
    );
}

#[test]
fn a_reference_is_released_only_by_the_instance_that_holds_it() {
    let (mut n, now, hellos) = node(16);
    n.handle_session_hello(now, 1, true, &hellos[1]);
    assert!(n.handle_session_opened(now, 1));
    drain(&mut n);
    n.handle_session_import(now, 10, Via::Accepted { conn: 1 }, None, IMPORT);
    drain(&mut n);
    n.handle_described(
        now,
        10,
        Ok((
            555,
            Pages {
                size: 2 << 20,
                page_size: 2 << 20,
                pfns: vec![1],
                clique_id: 0,
                bw_mode: 0,
                bw_mode_epoch: 0,
                kind: 0,
                phys_addr_space: 0,
                compression_coverage: 0,
                mem_flags: 0,
            },
        )),
    );
    drain(&mut n);
    assert_eq!(n.export_refs_held(), 1);
    // Another instance of node 1 (proved on another session) unimports the same event ID.
    let other = PeerId {
        node: NodeId(1),
        instance: InstanceId(4),
    };
    n.handle_peer_unimport(now, 11, other, 7);
    assert_eq!(
        drain(&mut n),
        vec![Action::AnswerUnimport {
            request: 11,
            released: false
        }]
    );
    assert_eq!(n.export_refs_held(), 1);
    n.handle_session_unimport(now, 12, Via::Accepted { conn: 1 }, None, 7);
    assert_eq!(
        drain(&mut n),
        vec![
            Action::ReleaseExportRefs {
                refs: vec![555].into(),
                ack: Some(12)
            },
            // Node 1 holds nothing here any more: the persist record says so a linger later.
        ]
    );
    n.handle_timeout(now + PERSIST_LINGER);
    assert!(drain(&mut n).contains(&Action::Persist { importers: vec![] }));
    assert_eq!(n.export_refs_held(), 0);
}

#[test]
fn imports_in_flight_per_peer_are_bounded() {
    let (mut n, now, hellos) = node(2);
    n.handle_session_hello(now, 1, true, &hellos[1]);
    assert!(n.handle_session_opened(now, 1));
    drain(&mut n);
    for r in 0..3 {
        let import = ImportRequest {
            import_event_id: r,
            ..IMPORT
        };
        n.handle_session_import(now, r, Via::Accepted { conn: 1 }, None, import);
    }
    let a = drain(&mut n);
    let described = a
        .iter()
        .filter(|a| matches!(a, Action::DescribeExport { .. }))
        .count();
    assert_eq!(described, 2, "{a:?}");
    assert!(answered_err(&a));
    assert_eq!(refusals(&n), vec![("import: too many in flight", 1)]);
    assert_eq!(n.describes_in_flight(), 2);
}
