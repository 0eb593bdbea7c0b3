//! The recovery gate and the persist record (`IMEX_WAIT_FOR_QUORUM=RECOVERY`, docs/reference/imex-guide.md §4;
//! docs/reference/driver-interface.md §4: a new session re-enables fabric allocation, so it must not open while
//! nodes may still map memory the previous daemon left dangling).

mod sim;

use std::time::{Duration, Instant};

use openimex_core::node::Action;
use openimex_core::*;
use sim::node::{Setup, drain};

const SEC: Duration = Duration::from_secs(1);

fn node(recover_from: Vec<NodeId>, grace: Option<Duration>) -> (Node, Instant, Vec<Hello>) {
    sim::node::node(Setup {
        quorum: QuorumPolicy::Recovery,
        grace,
        recover_from,
        recovery_wait: 60 * SEC,
        ..Setup::default()
    })
}

fn dial_attempt(actions: &[Action], peer: u16) -> u64 {
    sim::node::dial_attempt(actions, peer).expect("a dial")
}

fn opens_driver(actions: &[Action]) -> bool {
    actions.contains(&Action::Mesh(mesh::Action::InitDriver))
}

const IMPORT: ImportRequest = ImportRequest {
    import_event_id: 5,
    export_uuid: [3; 16],
    index: 0,
    channel: 0,
};

#[test]
fn waits_for_every_recorded_importer_before_opening_the_driver() {
    let (mut n, now, hellos) = node(vec![NodeId(1), NodeId(2)], None);
    n.handle_start(now);
    let start = drain(&mut n);
    assert!(!opens_driver(&start), "{start:?}");
    assert_eq!(n.state(), DaemonState::WaitingForRecovery);
    assert!(start.contains(&Action::Mesh(mesh::Action::StateChanged {
        from: DaemonState::Initializing,
        to: DaemonState::WaitingForRecovery
    })));
    assert_eq!(n.recovery_awaited(), vec![NodeId(1), NodeId(2)]);
    assert!(n.links()[1].reason.contains("awaited for recovery"));
    // Nothing is handed out meanwhile.
    n.handle_session_hello(now, 1, true, &hellos[1]);
    drain(&mut n);
    n.handle_session_import(now, 1, Via::Accepted { conn: 1 }, None, IMPORT);
    assert!(matches!(
        drain(&mut n).as_slice(),
        [Action::AnswerImport { answer: Err(_), .. }]
    ));

    n.handle_dial_ok(now, NodeId(1), dial_attempt(&start, 1), &hellos[1]);
    let one = drain(&mut n);
    assert!(!opens_driver(&one));
    assert!(
        one.iter()
            .any(|a| matches!(a, Action::Recovered { peer, .. } if peer.0 == 1))
    );
    assert_eq!(n.recovery_awaited(), vec![NodeId(2)]);

    n.handle_dial_ok(now, NodeId(2), dial_attempt(&start, 2), &hellos[2]);
    let two = drain(&mut n);
    assert!(opens_driver(&two), "{two:?}");
    assert!(two.contains(&Action::Mesh(mesh::Action::StateChanged {
        from: DaemonState::WaitingForRecovery,
        to: DaemonState::InitGpu
    })));
    assert!(
        two.contains(&Action::Persist { importers: vec![] }),
        "the record is cleared once recovered: {two:?}"
    );
    n.handle_driver_ready(now);
    assert_eq!(n.state(), DaemonState::Ready);
}

#[test]
fn an_importer_that_never_returns_is_declared_lost_after_the_wait() {
    let (mut n, now, _) = node(vec![NodeId(2)], Some(20 * SEC));
    n.handle_start(now);
    drain(&mut n);
    let t = n.poll_timeout().expect("a deadline");
    let mut at = now;
    let mut out = Vec::new();
    while !opens_driver(&out) {
        at = n.poll_timeout().expect("timers").max(at);
        assert!(at <= now + 21 * SEC, "waited past the grace time");
        n.handle_timeout(at);
        out.extend(drain(&mut n));
    }
    assert!(t <= now + 20 * SEC);
    assert!(at >= now + 20 * SEC, "not before the grace time");
    assert!(out.iter().any(
        |a| matches!(a, Action::Recovered { peer, how } if peer.0 == 2 && how.contains("lost"))
    ));
    assert!(
        out.iter().any(
            |a| matches!(a, Action::RecoveryWait { awaiting, .. } if awaiting == &vec![NodeId(2)])
        ),
        "the awaited node is named while waiting"
    );
}

/// A node with nothing to recover, READY, with node 1 connected on connection 1.
fn ready_with_node_1() -> (Node, Instant) {
    let (mut n, now, hellos) = node(Vec::new(), None);
    n.handle_start(now);
    let start = drain(&mut n);
    assert!(opens_driver(&start), "nothing to recover: no wait");
    n.handle_driver_ready(now);
    n.handle_session_hello(now, 1, true, &hellos[1]);
    n.handle_dial_ok(now, NodeId(1), dial_attempt(&start, 1), &hellos[1]);
    drain(&mut n);
    (n, now)
}

#[test]
fn the_record_names_an_importer_before_it_gets_the_pages() {
    let (mut n, now) = ready_with_node_1();
    n.handle_session_import(now, 7, Via::Accepted { conn: 1 }, None, IMPORT);
    // Written while the driver describes: the describe is asked for first.
    let asked = drain(&mut n);
    let describe = asked
        .iter()
        .position(|a| matches!(a, Action::DescribeExport { .. }))
        .expect("described");
    let persist = asked
        .iter()
        .position(|a| {
            *a == Action::Persist {
                importers: vec![NodeId(1)],
            }
        })
        .expect("the record names node 1 when its describe begins");
    assert!(describe < persist, "{asked:?}");
    let pages = Pages {
        size: 2 << 20,
        page_size: 2 << 20,
        pfns: vec![4],
        clique_id: 0,
        bw_mode: 0,
        bw_mode_epoch: 0,
        kind: 0,
        phys_addr_space: 0,
        compression_coverage: 0,
        mem_flags: 0,
    };
    n.handle_described(now, 7, Ok((70, pages)));
    let a = drain(&mut n);
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::AnswerImport { answer: Ok(_), .. })),
        "answered: {a:?}"
    );
    assert!(
        !a.iter().any(|a| matches!(a, Action::Persist { .. })),
        "no second write: {a:?}"
    );
}

#[test]
fn a_failed_describe_drops_the_importer_from_the_record() {
    let (mut n, now) = ready_with_node_1();
    n.handle_session_import(now, 7, Via::Accepted { conn: 1 }, None, IMPORT);
    drain(&mut n);
    n.handle_described(
        now,
        7,
        Err(ImportError::new(Status::ObjectNotFound, "no such export")),
    );
    let a = drain(&mut n);
    assert!(
        !a.iter().any(|a| matches!(a, Action::Persist { .. })),
        "the record keeps naming node 1 for a linger: {a:?}"
    );
    n.handle_timeout(now + PERSIST_LINGER);
    assert_eq!(
        persists(&drain(&mut n)),
        vec![Vec::<NodeId>::new()],
        "node 1 holds nothing"
    );
}

fn persists(actions: &[Action]) -> Vec<Vec<NodeId>> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Persist { importers } => Some(importers.clone()),
            _ => None,
        })
        .collect()
}

/// Import, release, import again from the same node: the record is written for the first
/// import only (a write on every import's path cost a file write and rename); the node is
/// dropped once it held nothing for a whole linger, and at once on a clean stop.
#[test]
fn a_node_that_imports_again_soon_costs_no_record_write() {
    let (mut n, mut now) = ready_with_node_1();
    let via = Via::Accepted { conn: 1 };
    let pages = || Pages {
        size: 2 << 20,
        page_size: 2 << 20,
        pfns: vec![4],
        clique_id: 0,
        bw_mode: 0,
        bw_mode_epoch: 0,
        kind: 0,
        phys_addr_space: 0,
        compression_coverage: 0,
        mem_flags: 0,
    };
    let mut writes = Vec::new();
    for round in 0..5u64 {
        let import = ImportRequest {
            import_event_id: 10 + round,
            ..IMPORT
        };
        n.handle_session_import(now, 100 + 2 * round, via, None, import);
        n.handle_described(now, 100 + 2 * round, Ok((70 + round, pages())));
        n.handle_session_unimport(now, 101 + 2 * round, via, None, 10 + round);
        writes.extend(persists(&drain(&mut n)));
        now += PERSIST_LINGER / 4;
        n.handle_timeout(now);
        writes.extend(persists(&drain(&mut n)));
    }
    assert_eq!(n.export_refs_held(), 0);
    assert_eq!(
        writes,
        vec![vec![NodeId(1)]],
        "one write, for the first import"
    );
    // Nothing held for a whole linger after the first release: dropped once.
    n.handle_timeout(now + PERSIST_LINGER);
    assert_eq!(persists(&drain(&mut n)), vec![Vec::<NodeId>::new()]);
    n.handle_timeout(now + 3 * PERSIST_LINGER);
    assert!(persists(&drain(&mut n)).is_empty(), "written once");

    // A clean stop right after a release leaves the exact record at once. (The pair was silent
    // past the peer timeout meanwhile: node 1 opens its session again first, since imports are
    // served only to a CONNECTED peer.)
    let now = now + 3 * PERSIST_LINGER;
    assert!(n.handle_session_opened(now, 1));
    drain(&mut n);
    let import = ImportRequest {
        import_event_id: 50,
        ..IMPORT
    };
    n.handle_session_import(now, 200, via, None, import);
    n.handle_described(now, 200, Ok((90, pages())));
    n.handle_session_unimport(now, 201, via, None, 50);
    assert_eq!(persists(&drain(&mut n)), vec![vec![NodeId(1)]]);
    n.handle_shutdown(now);
    assert_eq!(persists(&drain(&mut n)), vec![Vec::<NodeId>::new()]);
}
