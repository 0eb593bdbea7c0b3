//! The first round of dials at start (`mesh/first_round.rs`): a domain whose daemons start
//! together opens one connection per pair, and no start order waits for a backoff.

mod sim;

use std::time::{Duration, Instant};

use openimex_core::*;
use sim::{Net, dials};

const MS: Duration = Duration::from_millis(1);

/// `n` meshes of one map, each node `i` its own instance, made at the returned instant.
fn domain(n: usize) -> (Vec<Mesh>, Instant) {
    let map = NodeMap::new(sim::hosts(n));
    #[allow(clippy::disallowed_methods)]
    let t0 = Instant::now();
    let meshes = (0..n)
        .map(|i| {
            let id = u64::try_from(i).unwrap() + 1;
            Mesh::new(sim::config(i, map.clone(), id, QuorumPolicy::None), t0)
        })
        .collect();
    (meshes, t0)
}

/// Node `i` of an `n`-node map, started at the returned instant, with its first dials.
fn started(i: usize, n: usize) -> (Mesh, Instant, Vec<(NodeId, u64)>) {
    let (mut meshes, t0) = domain(n);
    let mut m = meshes.swap_remove(i);
    m.handle_start(t0);
    let out = dials(&mut m);
    (m, t0, out)
}

fn ids(dials: &[(NodeId, u64)]) -> Vec<u16> {
    let mut v: Vec<u16> = dials.iter().map(|(p, _)| p.0).collect();
    v.sort_unstable();
    v
}

/// Every daemon starts at the same instant and every one is up before any dial lands (a rack
/// powered on, a prolog starting the daemons on every node at once). Each pair is dialled
/// once, by its lower node, except the highest node's pairs (that node has no first half to
/// time, and dials its lower peers at once); no other dial follows.
#[test]
fn a_domain_started_together_dials_each_pair_once_by_its_lower_node() {
    for n in [6, 7] {
        started_together(n);
    }
}

fn started_together(n: usize) {
    let (mut meshes, t0) = domain(n);
    let mut out = Vec::new();
    for (i, m) in meshes.iter_mut().enumerate() {
        m.handle_start(t0);
        out.extend(dials(m).into_iter().map(|(p, a)| (i, p, a)));
    }
    let mut pairs: Vec<(usize, usize)> = out.iter().map(|(i, p, _)| (*i, p.index())).collect();
    pairs.sort_unstable();
    let top = n - 1;
    let mut want: Vec<(usize, usize)> = (0..n)
        .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
        .chain((0..top).map(|a| (top, a)))
        .collect();
    want.sort_unstable();
    assert_eq!(pairs, want, "the dials before any lands ({n} nodes)");
    // Every dial lands: the peer takes the hello, the dialler the answer, the peer the session.
    let now = t0 + MS;
    for (a, peer, attempt) in out {
        let b = peer.index();
        let hello_a = meshes[a].hello();
        assert_eq!(meshes[b].handle_hello(now, &hello_a), Verdict::Accept);
        let hello_b = meshes[b].hello();
        meshes[a].handle_dial_ok(now, peer, attempt, &hello_b);
        let conn = u64::try_from(a * n + b).unwrap();
        let from = NodeId(u16::try_from(a).unwrap());
        assert!(meshes[b].handle_session_opened(now, from, hello_a.instance, conn));
    }
    for (i, m) in meshes.iter_mut().enumerate() {
        assert_eq!(
            dials(m),
            vec![],
            "node {i} dials again though every pair is carried"
        );
        assert_eq!(m.connected_peers(), n - 1, "node {i}");
    }
    // Past the longest put-off: still no dial.
    let later = t0 + meshes[0].config().backoff.min + MS;
    for (i, m) in meshes.iter_mut().enumerate() {
        while let Some(t) = m.poll_timeout().filter(|t| *t <= later) {
            m.handle_timeout(t);
            assert_eq!(dials(m), vec![], "node {i}");
        }
    }
}

/// A node dials its higher peers first and its lower ones once each of those dials has
/// answered; a refusal (a peer not up yet) answers at once, so nobody waits for it. The
/// highest node has no first half: it dials every peer at once.
#[test]
fn the_lower_peers_are_dialled_once_every_higher_one_has_answered() {
    for (node, first_half, second_half) in [
        (3, vec![4, 5], vec![0, 1, 2]),
        (1, vec![2, 3, 4, 5], vec![0]),
    ] {
        let (mut m, t0, first) = started(node, 6);
        assert_eq!(
            ids(&first),
            first_half,
            "node {node}: the higher peers first"
        );
        let (last, rest) = first.split_last().unwrap();
        for (peer, attempt) in rest {
            sim::refused(&mut m, t0, *peer, *attempt);
            assert_eq!(
                dials(&mut m),
                vec![],
                "node {node}: a higher peer unanswered"
            );
        }
        sim::refused(&mut m, t0, last.0, last.1);
        assert_eq!(
            ids(&dials(&mut m)),
            second_half,
            "node {node}: then the rest, at once"
        );
    }
    let (_, _, first) = started(5, 6);
    assert_eq!(ids(&first), vec![0, 1, 2, 3, 4]);
}

/// The lower peers are dialled as soon as the last higher peer answered, however long those
/// answers took: a lower peer started with us has dialled us by then, and one whose dial we
/// refused before we were up leaves the pair to us, so waiting longer only holds it back.
#[test]
fn the_lower_peers_are_dialled_when_the_higher_ones_have_answered_however_long_they_took() {
    let (mut m, t0, first) = started(3, 6);
    let answered = t0 + 4 * MS;
    let (last, rest) = first.split_last().unwrap();
    for (peer, attempt) in rest {
        sim::refused(&mut m, answered, *peer, *attempt);
    }
    assert_eq!(dials(&mut m), vec![], "a higher peer has not answered yet");
    // The last one answers later still, with a session (its daemon was up).
    let later = answered + 3 * MS;
    let peer = domain(6).0.swap_remove(last.0.index());
    m.handle_dial_ok(later, last.0, last.1, &peer.hello());
    assert_eq!(ids(&dials(&mut m)), vec![0, 1, 2], "dialled at once");
}

/// A higher peer that swallows our dial (no answer until the dial timeout) holds the lower
/// peers back no longer than a refused dial's retry would: the backoff's first delay.
#[test]
fn a_first_dial_that_hangs_holds_the_lower_peers_back_only_for_the_first_backoff() {
    let (mut m, t0, first) = started(3, 6);
    let put_off = m.config().backoff.min;
    assert_eq!(ids(&first), vec![4, 5]);
    let (now, lower) = loop {
        let t = m.poll_timeout().expect("a timer for the put-off dials");
        assert!(t <= t0 + put_off, "next timer {:?} after the start", t - t0);
        m.handle_timeout(t);
        let out = dials(&mut m);
        if !out.is_empty() {
            break (t, out);
        }
    };
    assert_eq!(ids(&lower), vec![0, 1, 2]);
    assert_eq!(
        now - t0,
        put_off,
        "dialled before the put-off ended, or after"
    );
}

/// Nodes started from the highest ID down: each new node's higher peers are up, its lower
/// ones are not. The pairs form as each node comes up, without any backoff waited out, one
/// session each.
#[test]
fn nodes_started_highest_first_form_at_once() {
    let n = 6;
    let mut net = Net::new(n, QuorumPolicy::None);
    for i in (0..n).rev() {
        net.start(i);
        net.run_for(MS);
    }
    let took = net
        .run_until(Duration::from_secs(30), Net::all_up)
        .expect("formed");
    assert!(
        took < 10 * MS,
        "the last node's dials must connect it at once, took {took:?}"
    );
    for a in 0..n {
        for b in a + 1..n {
            assert_eq!(net.sessions_between(a, b), 1, "nodes {a} and {b}");
        }
    }
}

/// Runs `m`'s timers up to `until`, returning the first dials that come and when.
fn next_dials(m: &mut Mesh, until: Instant) -> Option<(Instant, Vec<(NodeId, u64)>)> {
    while let Some(t) = m.poll_timeout().filter(|t| *t <= until) {
        m.handle_timeout(t);
        let out = dials(m);
        if !out.is_empty() {
            return Some((t, out));
        }
    }
    None
}

/// The highest node starts after two lower peers dialled it into its listener's backlog: it
/// dials the others at once but not those two, whose sessions follow their hellos; a peer
/// whose session never comes is dialled when the backoff's first delay has passed.
#[test]
fn peers_whose_connections_wait_at_the_start_are_not_dialled_back() {
    let (mut meshes, t0) = domain(6);
    let mut m = meshes.swap_remove(5);
    m.handle_peer_connecting(t0, NodeId(1));
    m.handle_peer_connecting(t0, NodeId(3));
    m.handle_start(t0);
    assert_eq!(ids(&dials(&mut m)), vec![0, 2, 4], "the others at once");
    // Node 1's session arrives; node 3's connection was lost before its hello.
    let now = t0 + MS;
    let hello_1 = meshes[1].hello();
    assert_eq!(m.handle_hello(now, &hello_1), Verdict::Accept);
    assert!(m.handle_session_opened(now, NodeId(1), hello_1.instance, 1));
    let put_off = m.config().backoff.min;
    let (at, late) = next_dials(&mut m, t0 + put_off).expect("node 3 dialled in the end");
    assert_eq!(
        ids(&late),
        vec![3],
        "only the peer whose session did not come"
    );
    assert_eq!(at - t0, put_off, "when the put-off ends");
}

/// After the start, a connection accepted from a lower peer puts off the dial the second
/// half would make to it: the others are dialled once the higher peers have answered.
#[test]
fn a_lower_peer_connecting_is_left_out_of_the_second_half() {
    let (mut m, t0, first) = started(3, 6);
    assert_eq!(ids(&first), vec![4, 5]);
    m.handle_peer_connecting(t0 + MS, NodeId(1));
    for (peer, attempt) in &first {
        sim::refused(&mut m, t0 + 2 * MS, *peer, *attempt);
    }
    assert_eq!(
        ids(&dials(&mut m)),
        vec![0, 2],
        "not node 1, whose dial is on its way"
    );
    let until = t0 + MS + m.config().backoff.min;
    let (at, late) = next_dials(&mut m, until).expect("node 1 dialled when no session came");
    assert_eq!(ids(&late), vec![1]);
    assert_eq!(at, until);
}

/// A connection from a peer's address changes nothing for a dial already in flight or a
/// pair already carried.
#[test]
fn a_peer_connecting_leaves_a_dial_in_flight_alone() {
    let (mut m, t0, first) = started(3, 6);
    m.handle_peer_connecting(t0 + MS, NodeId(4));
    let (peer, attempt) = first
        .iter()
        .find(|(p, _)| *p == NodeId(4))
        .copied()
        .unwrap();
    let hello_4 = domain(6).0.swap_remove(4).hello();
    m.handle_dial_ok(t0 + 2 * MS, peer, attempt, &hello_4);
    assert_eq!(m.peer(NodeId(4)).map(|p| p.0), Some(ConnStatus::Connected));
}
