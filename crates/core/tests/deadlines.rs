//! The deadlines the node decides and its owner performs (`node/deadlines.rs`, issue 30 item
//! 2): the hello deadline of an inbound connection, the retire wait of a closed session, the
//! shutdown's wait for goodbyes, and which dial result the owner may take. Deterministic, in
//! virtual time: each fires at exactly its deadline and not a nanosecond before.

mod sim;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use openimex_core::node::{Action, GOODBYE_WAIT, HELLO_DEADLINE, RETIRE_WAIT};
use openimex_core::*;
use sim::node::{Setup, dial_attempt, drain};

const NS: Duration = Duration::from_nanos(1);

fn stranger() -> SocketAddr {
    "10.66.0.1:40000".parse().expect("an address")
}

/// Node 0 of a 3-node domain, started (its dials to nodes 1 and 2 in flight).
fn node() -> (Node, Instant, Vec<Hello>, Vec<Action>) {
    let (mut n, now, hellos) = sim::node::node(Setup::default());
    let started = sim::node::start(&mut n, now);
    (n, now, hellos, started)
}

fn closes(actions: &[Action], conn: ConnId) -> bool {
    actions.contains(&Action::CloseConn { conn })
}

fn refused_for_silence(actions: &[Action]) -> bool {
    actions.iter().any(|a| {
        matches!(a, Action::Refused { reason, detail, .. }
            if *reason == "connection: no hello in time" && detail.contains("10.66.0.1:40000"))
    })
}

#[test]
fn a_silent_connection_is_closed_at_the_hello_deadline_and_not_before() {
    let (mut n, start, _, _) = node();
    let t0 = start + Duration::from_millis(3);
    n.handle_conn_accepted(t0, 7, stranger(), None);
    assert_eq!(n.conns_unheard(), 1);
    let due = t0 + HELLO_DEADLINE;
    assert!(n.poll_timeout().is_some_and(|t| t <= due));
    // Every timer before the deadline may fire: the connection stays.
    while let Some(t) = n.poll_timeout().filter(|t| *t < due) {
        n.handle_timeout(t);
        assert!(!closes(&drain(&mut n), 7), "closed early, at {:?}", t - t0);
    }
    n.handle_timeout(due - NS);
    assert!(!closes(&drain(&mut n), 7), "a nanosecond early");
    assert_eq!(
        n.poll_timeout(),
        Some(due),
        "the deadline is the next timer"
    );
    n.handle_timeout(due);
    let a = drain(&mut n);
    assert!(closes(&a, 7), "{a:?}");
    assert!(refused_for_silence(&a), "counted: {a:?}");
    assert_eq!(n.conns_unheard(), 0);
    // Its end, reported as any connection's, changes nothing more.
    n.handle_conn_closed(due, 7);
    n.handle_timeout(due + HELLO_DEADLINE);
    assert!(!closes(&drain(&mut n), 7));
}

#[test]
fn an_accepted_hello_stops_the_clock_and_a_refused_one_does_not() {
    let (mut n, t0, hellos, _) = node();
    n.handle_conn_accepted(t0, 1, stranger(), None);
    n.handle_conn_accepted(t0, 2, stranger(), None);
    // Connection 1 proves node 1; connection 2 claims node 2 from the wrong address.
    assert_eq!(
        n.handle_session_hello(t0, 1, true, &hellos[1]),
        Verdict::Accept
    );
    assert!(matches!(
        n.handle_session_hello(t0, 2, false, &hellos[2]),
        Verdict::Refuse { .. }
    ));
    drain(&mut n);
    assert_eq!(n.conns_unheard(), 1);
    n.handle_timeout(t0 + HELLO_DEADLINE);
    let a = drain(&mut n);
    assert!(closes(&a, 2), "a refused hello proves nobody: {a:?}");
    assert!(
        !closes(&a, 1),
        "an accepted one keeps its connection: {a:?}"
    );
}

#[test]
fn a_connection_that_hung_up_is_not_closed_again() {
    let (mut n, t0, _, _) = node();
    n.handle_conn_accepted(t0, 3, stranger(), None);
    n.handle_conn_closed(t0 + Duration::from_secs(4), 3);
    drain(&mut n);
    n.handle_timeout(t0 + HELLO_DEADLINE);
    let a = drain(&mut n);
    assert!(!closes(&a, 3), "{a:?}");
    assert!(!refused_for_silence(&a), "nothing counted: {a:?}");
}

#[test]
fn a_silent_session_stream_is_ended_at_the_hello_deadline_unless_its_hello_came() {
    let (mut n, t0, _, _) = node();
    n.handle_stream_opened(t0, 41);
    n.handle_stream_opened(t0, 42);
    n.handle_stream_heard(42);
    let due = t0 + HELLO_DEADLINE;
    n.handle_timeout(due - NS);
    let a = drain(&mut n);
    assert!(!a.contains(&Action::CloseStream { stream: 41 }), "{a:?}");
    n.handle_timeout(due);
    let a = drain(&mut n);
    assert!(a.contains(&Action::CloseStream { stream: 41 }), "{a:?}");
    assert!(
        !a.contains(&Action::CloseStream { stream: 42 }),
        "its hello came: {a:?}"
    );
    assert!(
        !a.iter().any(|a| matches!(a, Action::Refused { .. })),
        "a stream's silence is not counted: {a:?}"
    );
}

#[test]
fn a_closed_session_is_ended_at_the_retire_wait_and_not_before() {
    let (mut n, t0, hellos, _) = node();
    // Node 1's session carries the pair; then its entry resolves elsewhere (SIGUSR1): the
    // session is closed.
    n.handle_session_hello(t0, 1, true, &hellos[1]);
    assert!(n.handle_session_opened(t0, 1));
    drain(&mut n);
    let t1 = t0 + Duration::from_millis(20);
    let map = NodeMap::new(sim::hosts(3));
    assert!(n.handle_node_map(t1, map, &[NodeId(1)]).is_ok());
    let closed = Action::Mesh(mesh::Action::CloseSession {
        peer: NodeId(1),
        via: Via::Accepted { conn: 1 },
    });
    let a = drain(&mut n);
    assert!(a.contains(&closed), "{a:?}");
    let ended = Action::EndSession {
        peer: NodeId(1),
        via: Via::Accepted { conn: 1 },
    };
    let due = t1 + RETIRE_WAIT;
    while let Some(t) = n.poll_timeout().filter(|t| *t < due) {
        n.handle_timeout(t);
        assert!(
            !drain(&mut n).contains(&ended),
            "ended early, at {:?}",
            t - t1
        );
    }
    n.handle_timeout(due - NS);
    assert!(!drain(&mut n).contains(&ended), "a nanosecond early");
    n.handle_timeout(due);
    assert!(drain(&mut n).contains(&ended));
}

/// Node 0 with both peers' sessions accepted (connections 1 and 2), shut down at `t1`.
fn shut_down() -> (Node, Instant) {
    let (mut n, t0, hellos, _) = node();
    for conn in [1, 2] {
        n.handle_session_hello(t0, conn, true, &hellos[conn as usize]);
        assert!(n.handle_session_opened(t0, conn));
    }
    drain(&mut n);
    let t1 = t0 + Duration::from_secs(1);
    n.handle_shutdown(t1);
    let a = drain(&mut n);
    let goodbyes = a
        .iter()
        .filter(|a| matches!(a, Action::Mesh(mesh::Action::SendGoodbye { .. })))
        .count();
    assert_eq!(goodbyes, 2, "{a:?}");
    assert!(!a.iter().any(|a| matches!(a, Action::GoodbyesOver { .. })));
    (n, t1)
}

fn over(actions: &[Action]) -> Option<Vec<NodeId>> {
    actions.iter().find_map(|a| match a {
        Action::GoodbyesOver { unanswered } => Some(unanswered.clone()),
        _ => None,
    })
}

#[test]
fn the_shutdown_stops_waiting_once_every_goodbye_is_reported() {
    let (mut n, t1) = shut_down();
    n.handle_goodbye_delivered(t1 + Duration::from_millis(5), NodeId(2), true);
    assert_eq!(over(&drain(&mut n)), None, "node 1 is still owed");
    // A failed goodbye is a report too.
    n.handle_goodbye_delivered(t1 + Duration::from_millis(9), NodeId(1), false);
    assert_eq!(over(&drain(&mut n)), Some(vec![]));
    // Once.
    n.handle_timeout(t1 + GOODBYE_WAIT);
    assert_eq!(over(&drain(&mut n)), None);
}

#[test]
fn the_shutdown_waits_for_goodbyes_exactly_the_goodbye_wait() {
    let (mut n, t1) = shut_down();
    n.handle_goodbye_delivered(t1 + Duration::from_millis(5), NodeId(1), true);
    drain(&mut n);
    let due = t1 + GOODBYE_WAIT;
    n.handle_timeout(due - NS);
    assert_eq!(over(&drain(&mut n)), None, "a nanosecond early");
    assert_eq!(n.poll_timeout(), Some(due));
    n.handle_timeout(due);
    assert_eq!(over(&drain(&mut n)), Some(vec![NodeId(2)]));
}

#[test]
fn with_nobody_to_tell_the_shutdown_does_not_wait() {
    let (mut n, t0, _, _) = node();
    n.handle_shutdown(t0);
    assert_eq!(over(&drain(&mut n)), Some(vec![]));
    n.handle_shutdown(t0);
    assert_eq!(over(&drain(&mut n)), None, "once");
}

#[test]
fn only_the_dial_the_mesh_waits_for_may_be_taken() {
    let (mut n, t0, hellos, started) = node();
    let attempt = dial_attempt(&started, 1).expect("node 1 dialled at start");
    assert!(n.mesh().dial_in_flight(NodeId(1), attempt));
    assert!(!n.mesh().dial_in_flight(NodeId(1), attempt + 1));
    assert!(!n.mesh().dial_in_flight(NodeId(1), attempt - 1));
    n.handle_dial_ok(t0, NodeId(1), attempt, &hellos[1]);
    drain(&mut n);
    assert!(
        !n.mesh().dial_in_flight(NodeId(1), attempt),
        "answered: a second answer to it is late"
    );
}
