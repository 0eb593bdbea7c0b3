//! The importer's bound on imports in flight per exporter (`node/outbox.rs`, issue 30 item 2):
//! past it an import waits, in order, and goes when one to the same exporter is answered; the
//! waiting ones fail when their turn comes with no session to the exporter; one the node gave up
//! on while it waited is never sent.

mod sim;

use std::time::{Duration, Instant};

use openimex_core::node::{Action, MAX_IMPORTS_IN_FLIGHT};
use openimex_core::*;
use sim::node::{Setup, drain};

/// Node 0 of a 3-node domain, started, with nodes 1 and 2 connected on sessions they dialled
/// (accepted on connections 1 and 2).
fn node() -> (Node, Instant) {
    let (mut n, now, hellos) = sim::node::node(Setup::default());
    sim::node::start(&mut n, now);
    for conn in [1, 2] {
        n.handle_session_hello(now, conn, true, &hellos[conn as usize]);
        assert!(n.handle_session_opened(now, conn));
    }
    drain(&mut n);
    (n, now)
}

/// The driver posts MEM_IMPORT `event_id` of an export of `exporter`.
fn post(n: &mut Node, now: Instant, event_id: u64, exporter: u16) {
    n.handle_driver_event(
        now,
        Event::Import {
            event_id,
            channel: 0,
            export_uuid: [exporter as u8; 16],
            index: 0,
            export_node: NodeId(exporter),
        },
    );
}

/// The imports sent, as (exporter, event).
fn sent(actions: &[Action]) -> Vec<(u16, u64)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::SendImport { peer, request } => Some((peer.0, request.import_event_id)),
            _ => None,
        })
        .collect()
}

/// The imports validated, as (event, status or `None` for pages).
fn validated(actions: &[Action]) -> Vec<(u64, Option<Status>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ValidateImport {
                import_event_id,
                result,
            } => Some((*import_event_id, result.as_ref().err().copied())),
            _ => None,
        })
        .collect()
}

fn ok(pfn: u64) -> ImportAnswer {
    Ok(sim::node::pages(pfn))
}

#[test]
fn the_import_past_the_bound_waits_and_goes_when_one_is_answered() {
    let (mut n, mut now) = node();
    let max = MAX_IMPORTS_IN_FLIGHT as u64;
    for e in 1..=max + 2 {
        post(&mut n, now, e, 1);
    }
    let a = drain(&mut n);
    let expected: Vec<(u16, u64)> = (1..=max).map(|e| (1, e)).collect();
    assert_eq!(sent(&a), expected, "exactly the bound goes, in order");
    assert_eq!(n.imports_to(NodeId(1)), (MAX_IMPORTS_IN_FLIGHT, 2));
    // Another exporter has a bound of its own.
    post(&mut n, now, 1000, 2);
    assert_eq!(sent(&drain(&mut n)), vec![(2, 1000)]);
    // Nothing goes while nothing is answered, however long it takes (short of the timeout).
    now += Duration::from_secs(9);
    n.handle_timeout(now);
    assert_eq!(sent(&drain(&mut n)), vec![]);
    // An answer (here out of order) lets the oldest waiting one go, and only that one.
    n.handle_import_answer(now, NodeId(1), 7, ok(7));
    let a = drain(&mut n);
    assert_eq!(validated(&a), vec![(7, None)]);
    assert_eq!(sent(&a), vec![(1, max + 1)]);
    // A failed request frees its slot as well.
    let e = ImportError::new(Status::InvalidState, "exporter node 1: session reset");
    n.handle_import_answer(now, NodeId(1), 8, Err(e));
    assert_eq!(sent(&drain(&mut n)), vec![(1, max + 2)]);
    assert_eq!(n.imports_to(NodeId(1)), (MAX_IMPORTS_IN_FLIGHT, 0));
    // With nothing waiting, answers only free slots, until one more may go at once.
    n.handle_import_answer(now, NodeId(1), 9, ok(9));
    drain(&mut n);
    post(&mut n, now, 2000, 1);
    assert_eq!(sent(&drain(&mut n)), vec![(1, 2000)]);
    post(&mut n, now, 2001, 1);
    assert_eq!(sent(&drain(&mut n)), vec![], "and only one");
}

#[test]
fn a_late_or_repeated_answer_frees_no_slot() {
    let (mut n, now) = node();
    n.set_max_imports_in_flight(1);
    for e in 1..=3 {
        post(&mut n, now, e, 1);
    }
    assert_eq!(sent(&drain(&mut n)), vec![(1, 1)]);
    n.handle_import_answer(now, NodeId(1), 1, ok(1));
    assert_eq!(sent(&drain(&mut n)), vec![(1, 2)]);
    // The same answer again, and one for an import never sent: 2 still holds the slot.
    n.handle_import_answer(now, NodeId(1), 1, ok(1));
    n.handle_import_answer(now, NodeId(1), 3, ok(3));
    assert_eq!(sent(&drain(&mut n)), vec![]);
    assert_eq!(n.imports_to(NodeId(1)), (1, 1));
}

#[test]
fn waiting_imports_fail_when_the_session_to_their_exporter_is_gone() {
    let (mut n, now) = node();
    n.set_max_imports_in_flight(2);
    for e in 1..=4 {
        post(&mut n, now, e, 1);
    }
    assert_eq!(sent(&drain(&mut n)), vec![(1, 1), (1, 2)]);
    // The session ends: what it carried fails at the sender, which frees the slots.
    n.handle_conn_closed(now, 1);
    drain(&mut n);
    assert_eq!(n.session_of(NodeId(1)), None);
    let reset = || ImportError::new(Status::InvalidState, "exporter node 1: session ended");
    n.handle_import_answer(now, NodeId(1), 1, Err(reset()));
    let a = drain(&mut n);
    assert_eq!(sent(&a), vec![], "nothing is sent without a session");
    assert_eq!(
        validated(&a),
        vec![
            (1, Some(Status::InvalidState)),
            (3, Some(Status::InvalidState)),
            (4, Some(Status::InvalidState))
        ],
        "the failed one, then every waiting one in its turn (each failure frees the slot)"
    );
    assert!(
        a.contains(&Action::ImportNotSent {
            peer: NodeId(1),
            import_event_id: 3,
            error: ImportError::new(Status::InvalidState, "node 1 has no session here"),
        }),
        "the daemon counts it as it counted its own failure: {a:?}"
    );
    n.handle_import_answer(now, NodeId(1), 2, Err(reset()));
    assert_eq!(
        validated(&drain(&mut n)),
        vec![(2, Some(Status::InvalidState))]
    );
    assert_eq!(n.imports_to(NodeId(1)), (0, 0));
    assert_eq!(n.imports_known(), 0);
}

#[test]
fn a_waiting_import_the_node_gave_up_on_is_never_sent() {
    let (mut n, mut now) = node();
    n.set_max_imports_in_flight(1);
    post(&mut n, now, 1, 1);
    now += Duration::from_secs(1);
    post(&mut n, now, 2, 1);
    assert_eq!(sent(&drain(&mut n)), vec![(1, 1)]);
    // Both time out (10 s) before the exporter answers the first.
    now += Duration::from_secs(10);
    n.handle_timeout(now);
    let a = drain(&mut n);
    assert_eq!(
        validated(&a),
        vec![
            (1, Some(Status::InvalidState)),
            (2, Some(Status::InvalidState))
        ]
    );
    n.handle_import_answer(now, NodeId(1), 1, ok(1));
    let a = drain(&mut n);
    assert_eq!(
        sent(&a),
        vec![],
        "2 failed already: sent now, it would only take a reference to hand back"
    );
    assert_eq!(n.imports_to(NodeId(1)), (0, 0));
}
