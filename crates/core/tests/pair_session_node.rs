//! One session per pair (issue 8 item 1), at the node: requests on a session we dialled are
//! the peer's only while that session carries the pair, a session opened without a hello is
//! refused, heartbeats on a session the peer dialled keep the pair alive, and a departing peer
//! hands back on the session it said goodbye on. (The pair's session between two meshes:
//! `pair_session.rs`.)

mod sim;

use std::time::Duration;

use openimex_core::*;
use sim::node::{Setup, drain, peer};

const SEC: Duration = Duration::from_secs(1);

const IMPORT: ImportRequest = ImportRequest {
    import_event_id: 7,
    export_uuid: [9; 16],
    index: 0,
    channel: 0,
};

fn refusals(n: &Node) -> Vec<(&'static str, u64)> {
    n.refusals().collect()
}

fn described(actions: &[node::Action]) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, node::Action::DescribeExport { .. }))
}

/// Node 0, started, with the session it dialled to node 1 up: the node, the time, the hellos,
/// the dial's attempt.
fn dialled_node_1() -> (Node, std::time::Instant, Vec<Hello>, u64) {
    let (mut n, now, hellos) = sim::node::node(Setup::default());
    let started = sim::node::start(&mut n, now);
    let a1 = sim::node::dial_attempt(&started, 1).expect("dials node 1");
    n.handle_dial_ok(now, NodeId(1), a1, &hellos[1]);
    drain(&mut n);
    (n, now, hellos, a1)
}

/// (e) A request on a session we dialled is the peer's while that attempt carries the pair
/// with the instance it handshook with; on a stale attempt, another peer's session, or after
/// the peer restarted, it is refused and counted as "no session"; claiming another identity is
/// an identity mismatch.
#[test]
fn requests_on_a_dialled_session_are_the_peers_only_while_it_carries_the_pair() {
    let (mut n, now, hellos, a1) = dialled_node_1();
    let via = Via::Dialled {
        peer: NodeId(1),
        attempt: a1,
    };
    assert_eq!(n.session_of(NodeId(1)), Some(via));
    let p1 = peer(&hellos[1]);

    n.handle_session_import(now, 1, via, Some(p1), IMPORT);
    assert!(
        described(&drain(&mut n)),
        "the current attempt proves node 1"
    );
    n.handle_session_import(now, 2, via, None, IMPORT);
    assert!(described(&drain(&mut n)), "with no claim, too");
    let forged = PeerId {
        instance: InstanceId(1),
        ..p1
    };
    n.handle_session_import(now, 3, via, Some(forged), IMPORT);
    assert!(!described(&drain(&mut n)));
    // Node 2 has no session: our dial number means nothing for it.
    let not_2 = Via::Dialled {
        peer: NodeId(2),
        attempt: a1,
    };
    n.handle_session_import(now, 4, not_2, None, IMPORT);
    assert!(!described(&drain(&mut n)));

    // The session is lost and a new dial carries the pair: the old attempt proves nothing.
    n.handle_session_lost(now, via, "reset".into());
    let mut later = now;
    let mut a2 = None;
    while a2.is_none() {
        later = later.max(n.poll_timeout().expect("a retry"));
        n.handle_timeout(later);
        a2 = sim::node::dial_attempt(&drain(&mut n), 1);
    }
    let a2 = a2.expect("a redial");
    n.handle_dial_ok(later, NodeId(1), a2, &hellos[1]);
    drain(&mut n);
    // An unimport on the stale session is refused, not answered: the importer sends it again
    // on the pair's session instead of taking it as delivered.
    n.handle_session_unimport(later, 5, via, Some(p1), 7);
    let a = drain(&mut n);
    assert!(
        a.iter()
            .any(|a| matches!(a, node::Action::RefuseUnimport { request: 5, .. })),
        "{a:?}"
    );
    assert!(!n.handle_session_goodbye(later, via, Some(p1), "stale"));
    assert_eq!(n.links()[1].status, ConnStatus::Connected);
    let current = Via::Dialled {
        peer: NodeId(1),
        attempt: a2,
    };
    n.handle_session_import(later, 6, current, Some(p1), IMPORT);
    assert!(described(&drain(&mut n)));

    // Node 1 restarts: its new instance's hello makes our session to the old one stale.
    let restarted = Hello {
        instance: InstanceId(555),
        ..hellos[1].clone()
    };
    assert_eq!(
        n.handle_session_hello(later, 40, true, &restarted),
        Verdict::Accept
    );
    drain(&mut n);
    n.handle_session_import(later, 7, current, Some(p1), IMPORT);
    assert!(!described(&drain(&mut n)), "the old instance's session");

    assert_eq!(
        refusals(&n),
        vec![
            ("goodbye: no session", 1),
            ("import: identity mismatch", 1),
            ("import: no session", 2),
            ("unimport: no session", 1),
        ]
    );
}

/// (e) A session opened on a connection without an accepted hello is refused and counted.
#[test]
fn a_session_opened_without_a_hello_is_refused() {
    let (mut n, now, _) = sim::node::node(Setup::default());
    sim::node::start(&mut n, now);
    assert!(!n.handle_session_opened(now, 3));
    assert_eq!(refusals(&n), vec![("session: no session", 1)]);
    assert_eq!(n.links()[1].status, ConnStatus::NeverConnected);
}

/// (f) On the lower node, the pair's session being one the peer dialled: heartbeats go on it,
/// answers on it keep the pair alive, answers on another session do not, and silence loses
/// the pair after the peer timeout.
#[test]
fn heartbeats_on_an_accepted_session_keep_the_pair_alive() {
    let (mut n, now, hellos) = sim::node::node(Setup {
        nodes: 2,
        ..Setup::default()
    });
    let started = sim::node::start(&mut n, now);
    let a1 = sim::node::dial_attempt(&started, 1).expect("dials node 1");
    sim::node::refused(&mut n, now, NodeId(1), a1);
    n.handle_session_hello(now, 8, true, &hellos[1]);
    assert!(n.handle_session_opened(now, 8));
    drain(&mut n);
    let via = Via::Accepted { conn: 8 };
    assert_eq!(n.session_of(NodeId(1)), Some(via));

    // Answered for 30 s: alive, every heartbeat on the accepted session.
    let mut t = now;
    let mut beats = 0;
    let answered_until = now + 30 * SEC;
    loop {
        let at = n.poll_timeout().expect("the tick");
        if at > answered_until + 10 * SEC {
            break;
        }
        t = t.max(at);
        n.handle_timeout(t);
        for a in drain(&mut n) {
            if let node::Action::Mesh(Action::SendHeartbeat {
                peer,
                via: v,
                answer,
            }) = a
            {
                assert_eq!((peer, v), (NodeId(1), via));
                beats += 1;
                if t <= answered_until {
                    if answer {
                        n.handle_heartbeat(t, v);
                    }
                } else {
                    // An answer on some other session proves nothing about this one.
                    n.handle_heartbeat(
                        t,
                        Via::Dialled {
                            peer: NodeId(1),
                            attempt: a1,
                        },
                    );
                }
            }
        }
        if t <= answered_until {
            assert_eq!(n.links()[1].status, ConnStatus::Connected, "at {t:?}");
        }
        if n.links()[1].status == ConnStatus::Recovering {
            break;
        }
    }
    assert!(beats >= 60, "{beats} heartbeats");
    assert_eq!(n.links()[1].status, ConnStatus::Recovering);
    assert!(n.links()[1].reason.contains("no heartbeat answer"));
    let silent = t - answered_until;
    assert!(
        silent >= Duration::from_millis(2500) && silent <= Duration::from_millis(4000),
        "lost {silent:?} after the last answer"
    );
}

/// (e) A peer that said goodbye on the session we dialled may still hand back imports on it:
/// refusing them would leave their references taken. A describe that lands after the goodbye
/// is released at once (a stopping importer validates nothing more, and one that left for good
/// may never hand it back); its hand-back is still served, not refused. Once that session
/// ends, it proves nothing.
#[test]
fn a_departing_peer_hands_back_on_the_session_it_said_goodbye_on() {
    let (mut n, now, hellos, a1) = dialled_node_1();
    let via = Via::Dialled {
        peer: NodeId(1),
        attempt: a1,
    };
    let p1 = peer(&hellos[1]);
    n.handle_session_import(now, 1, via, Some(p1), IMPORT);
    assert!(described(&drain(&mut n)));
    assert!(n.handle_session_goodbye(now, via, Some(p1), "shutting down"));
    drain(&mut n);
    assert_eq!(n.links()[1].status, ConnStatus::Disconnected);
    assert_eq!(n.session_of(NodeId(1)), None);
    // The describe lands after the goodbye: its reference is released at once.
    n.handle_described(now, 1, Ok((55, sim::node::pages(1))));
    let a = drain(&mut n);
    assert!(
        a.contains(&node::Action::ReleaseExportRefs {
            refs: vec![55].into(),
            ack: None
        }),
        "{a:?}"
    );
    assert!(
        a.iter().any(|a| matches!(
            a,
            node::Action::AnswerImport {
                request: 1,
                answer: Err(_)
            }
        )),
        "{a:?}"
    );
    assert_eq!(n.export_refs_held(), 0);
    // Node 1, stopping, fails that import and hands it back on the same session: served.
    n.handle_session_unimport(now, 2, via, Some(p1), IMPORT.import_event_id);
    assert_eq!(
        drain(&mut n),
        vec![node::Action::AnswerUnimport {
            request: 2,
            released: false
        }]
    );
    assert!(refusals(&n).is_empty());
    // Node 1 exits: the session ends and proves nothing more.
    n.handle_session_lost(now, via, "closed".into());
    drain(&mut n);
    n.handle_session_unimport(now, 3, via, Some(p1), IMPORT.import_event_id);
    drain(&mut n);
    assert_eq!(refusals(&n), vec![("unimport: no session", 1)]);
}
