//! Who is dialled again when SIGUSR1 re-reads the nodes file (`node/remap.rs`, issue 30 item 2):
//! a live session to an address the peer's entry no longer resolves to is dropped and
//! redialled; a peer not connected whose entry resolves elsewhere than at the last read is
//! dialled at once; an entry that does not resolve right now keeps what it has; everyone else
//! is left alone. Deterministic, in virtual time.

mod sim;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use openimex_core::node::{Action, Remapped, ResolvedNodes};
use openimex_core::*;
use sim::node::{Setup, dial_attempt, drain};

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 9, 0, last))
}

/// Node 0 of a 3-node domain whose entries resolved to 10.9.0.{1,2,3} at start-up. Node 1 is
/// connected on the session it dialled (accepted on connection 1, from 10.9.0.2); node 0's dial
/// to node 2 found nothing listening, so node 2 waits out a backoff.
fn node() -> (Node, Instant, NodeMap) {
    let setup = Setup::default();
    let map = NodeMap::new(sim::hosts(setup.nodes));
    let (mut n, now, hellos) = sim::node::node(setup);
    let started = sim::node::start(&mut n, now);
    n.handle_nodes_resolved(vec![vec![ip(1)], vec![ip(2)], vec![ip(3)]]);
    let to_2 = dial_attempt(&started, 2).expect("node 2 dialled at start");
    sim::node::refused(&mut n, now, NodeId(2), to_2);
    n.handle_session_hello(now, 1, true, &hellos[1]);
    assert!(n.handle_session_opened(now, 1));
    drain(&mut n);
    (n, now, map)
}

/// Re-reads the file with entries resolving to `addrs` while node 1's session goes to
/// `session_1`; returns the outcome and the actions that followed.
fn reread(
    n: &mut Node,
    now: Instant,
    map: &NodeMap,
    addrs: [&[IpAddr]; 3],
    session_1: IpAddr,
) -> (Remapped, Vec<Action>) {
    let file = ResolvedNodes {
        map: map.clone(),
        addrs: addrs.iter().map(|a| a.to_vec()).collect(),
        sessions: vec![(NodeId(1), session_1)],
    };
    let remapped = n.handle_nodes_file(now, file).expect("the same map");
    // The persist record is written again after every accepted re-read (it is keyed to the
    // map): not what these tests are about.
    let actions = drain(n)
        .into_iter()
        .filter(|a| !matches!(a, Action::Persist { .. }))
        .collect();
    (remapped, actions)
}

/// The outcome of a re-read that changed nothing.
fn unchanged() -> Remapped {
    Remapped {
        file_in_step: true,
        ..Remapped::default()
    }
}

fn closes_session_1(actions: &[Action]) -> bool {
    let close = Action::Mesh(mesh::Action::CloseSession {
        peer: NodeId(1),
        via: Via::Accepted { conn: 1 },
    });
    actions.contains(&close)
}

#[test]
fn a_live_session_to_an_address_the_entry_no_longer_resolves_to_is_redialled() {
    let (mut n, now, map) = node();
    let (r, a) = reread(&mut n, now, &map, [&[ip(1)], &[ip(20)], &[ip(3)]], ip(2));
    assert_eq!(r.moved, vec![(NodeId(1), vec![ip(20)])]);
    assert_eq!(r.redial, vec![NodeId(1)]);
    assert!(closes_session_1(&a), "{a:?}");
    assert!(dial_attempt(&a, 1).is_some(), "dialled at once: {a:?}");
    assert_eq!(n.session_of(NodeId(1)), None);
}

#[test]
fn a_live_session_to_an_address_the_entry_still_resolves_to_stays() {
    let (mut n, now, map) = node();
    // The entry gained an address (a move by the last read's measure), but the session's
    // address is still among them.
    let (r, a) = reread(
        &mut n,
        now,
        &map,
        [&[ip(1)], &[ip(2), ip(20)], &[ip(3)]],
        ip(2),
    );
    assert_eq!(r.moved, vec![(NodeId(1), vec![ip(2), ip(20)])]);
    assert_eq!(r.redial, vec![]);
    assert!(!closes_session_1(&a), "{a:?}");
    assert!(n.session_of(NodeId(1)).is_some());
    // Whichever of the entry's addresses the session goes to, it is kept.
    let (r, a) = reread(
        &mut n,
        now,
        &map,
        [&[ip(1)], &[ip(2), ip(20)], &[ip(3)]],
        ip(20),
    );
    assert_eq!(r, unchanged());
    assert!(a.is_empty(), "{a:?}");
}

#[test]
fn an_entry_that_does_not_resolve_right_now_keeps_its_session() {
    let (mut n, now, map) = node();
    let (r, a) = reread(&mut n, now, &map, [&[ip(1)], &[], &[]], ip(2));
    assert_eq!(r, unchanged());
    assert!(a.is_empty(), "nothing touched: {a:?}");
    assert!(n.session_of(NodeId(1)).is_some());
}

#[test]
fn a_peer_not_connected_that_resolves_elsewhere_is_dialled_at_once_and_only_once() {
    let (mut n, mut now, map) = node();
    let backoff_until = n.poll_timeout().expect("a retry of node 2 is armed");
    now += Duration::from_millis(1);
    assert!(now < backoff_until, "still in its backoff");
    let (r, a) = reread(&mut n, now, &map, [&[ip(1)], &[ip(2)], &[ip(30)]], ip(2));
    assert_eq!(r.moved, vec![(NodeId(2), vec![ip(30)])]);
    assert_eq!(r.redial, vec![NodeId(2)]);
    assert!(
        dial_attempt(&a, 2).is_some(),
        "not after its backoff: {a:?}"
    );
    assert!(!closes_session_1(&a));
    // Compared with the last read now: the same addresses again are no move.
    let (r, a) = reread(&mut n, now, &map, [&[ip(1)], &[ip(2)], &[ip(30)]], ip(2));
    assert_eq!(r, unchanged());
    assert!(dial_attempt(&a, 2).is_none(), "{a:?}");
}

#[test]
fn a_refused_reread_keeps_the_addresses_it_compares_with() {
    let (mut n, now, map) = node();
    // Node 2's entry edited: refused (it would renumber nobody, but names another node).
    let mut edited = sim::hosts(3);
    edited[2] = "10.8.8.8".into();
    let file = ResolvedNodes {
        map: NodeMap::new(edited),
        addrs: vec![vec![ip(1)], vec![ip(20)], vec![ip(30)]],
        sessions: vec![(NodeId(1), ip(2))],
    };
    assert!(n.handle_nodes_file(now, file).is_err());
    assert_eq!(drain(&mut n), vec![], "nothing changed");
    // Node 1 resolved to 10.9.0.2 at the last accepted read still: its move shows now.
    let (r, _) = reread(&mut n, now, &map, [&[ip(1)], &[ip(21)], &[ip(3)]], ip(2));
    assert_eq!(r.moved, vec![(NodeId(1), vec![ip(21)])]);
    assert_eq!(r.redial, vec![NodeId(1)]);
}
