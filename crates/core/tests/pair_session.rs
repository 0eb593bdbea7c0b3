//! One session per pair (issue 8 item 1), between two meshes: whichever side dialled it, a
//! pair keeps one session, the lower-dialled one when both dial at once; a peer's session
//! connects the link without a dial back and cancels a waiting retry; a lost session is
//! RECOVERING on both sides and either side's redial restores it; liveness runs on the pair's
//! session whichever side dialled it. (At the node — requests on a dialled session, a session
//! without a hello, heartbeats on an accepted session, a departing peer's hand-backs:
//! `pair_session_node.rs`.)

mod sim;

use std::time::{Duration, Instant};

use openimex_core::*;
use sim::Net;

const SEC: Duration = Duration::from_secs(1);

/// Two meshes fed by hand: node 0 (the lower ID) and node 1.
struct Two {
    m: [Mesh; 2],
    hello: [Hello; 2],
    now: Instant,
    /// Every action each emitted, in order.
    log: Vec<(usize, Action)>,
}

impl Two {
    fn new() -> Self {
        let map = NodeMap::new(sim::hosts(2));
        // The virtual clock needs an origin; only offsets from it matter.
        #[allow(clippy::disallowed_methods)]
        let now = Instant::now();
        let m = [0, 1].map(|i| {
            Mesh::new(
                sim::config(i, map.clone(), 10 + i as u64, QuorumPolicy::None),
                now,
            )
        });
        let hello = [m[0].hello(), m[1].hello()];
        Self {
            m,
            hello,
            now,
            log: Vec::new(),
        }
    }

    /// Starts both; returns each one's dial attempt to the other.
    fn start(&mut self) -> [u64; 2] {
        [0, 1].map(|i| {
            self.m[i].handle_start(self.now);
            self.drain(i)
                .iter()
                .find_map(|a| match a {
                    Action::Dial { attempt, .. } => Some(*attempt),
                    _ => None,
                })
                .expect("dials its peer")
        })
    }

    fn drain(&mut self, i: usize) -> Vec<Action> {
        let out: Vec<Action> = std::iter::from_fn(|| self.m[i].poll_action()).collect();
        self.log.extend(out.iter().map(|a| (i, a.clone())));
        out
    }

    /// Node `i`'s dial of `attempt` reaches the other, which accepts its hello.
    fn dial_ok(&mut self, i: usize, attempt: u64) {
        let j = 1 - i;
        let verdict = self.m[j].handle_hello(self.now, &self.hello[i]);
        assert_eq!(verdict, Verdict::Accept);
        self.drain(j);
        let h = self.hello[j].clone();
        self.m[i].handle_dial_ok(self.now, NodeId(j as u16), attempt, &h);
        self.drain(i);
    }

    /// Node `i`'s session on `conn` reaches the other; returns whether it keeps it open.
    fn opened(&mut self, i: usize, conn: ConnId) -> bool {
        let j = 1 - i;
        let inst = self.hello[i].instance;
        let keep = self.m[j].handle_session_opened(self.now, NodeId(i as u16), inst, conn);
        self.drain(j);
        keep
    }

    fn closes(&self, i: usize) -> Vec<Via> {
        self.log
            .iter()
            .filter_map(|(n, a)| match a {
                Action::CloseSession { via, .. } if *n == i => Some(*via),
                _ => None,
            })
            .collect()
    }

    fn link_changes(&self, i: usize) -> Vec<ConnStatus> {
        self.log
            .iter()
            .filter_map(|(n, a)| match a {
                Action::LinkChanged { to, .. } if *n == i => Some(*to),
                _ => None,
            })
            .collect()
    }

    fn status(&self, i: usize) -> ConnStatus {
        self.m[i].peer(NodeId(1 - i as u16)).expect("a peer").0
    }

    /// Fires every timer of both meshes up to `now + d`; returns the dials each made.
    fn run(&mut self, d: Duration, answer: impl Fn(usize, &Action) -> Option<Via>) -> [usize; 2] {
        let until = self.now + d;
        let mut dials = [0, 0];
        loop {
            let next = [0, 1]
                .into_iter()
                .filter_map(|i| self.m[i].poll_timeout().map(|t| (t, i)))
                .filter(|(t, _)| *t <= until)
                .min();
            let Some((t, i)) = next else { break };
            self.now = self.now.max(t);
            self.m[i].handle_timeout(self.now);
            for a in self.drain(i) {
                if matches!(a, Action::Dial { .. }) {
                    dials[i] += 1;
                }
                if let Some(via) = answer(i, &a) {
                    self.m[i].handle_heartbeat(self.now, via);
                }
            }
        }
        self.now = until;
        dials
    }
}

/// (a) Both dial at once: whatever order the four events take (each side's dial completing,
/// each side seeing the other's session open, which follows that side's completion), both
/// sides end on the session node 0 dialled, node 1 closes its own once, node 0 closes
/// nothing, and neither link ever leaves CONNECTED.
#[test]
fn simultaneous_dials_converge_on_the_lower_dialled_session() {
    // 0: node 0's dial completes; 1: node 1's; 2: node 0's session reaches node 1 (after 0);
    // 3: node 1's session reaches node 0 (after 1).
    let orders = [
        [0, 1, 2, 3],
        [0, 1, 3, 2],
        [1, 0, 2, 3],
        [1, 0, 3, 2],
        [0, 2, 1, 3],
        [1, 3, 0, 2],
    ];
    for order in orders {
        let mut t = Two::new();
        let [a0, a1] = t.start();
        let (c0, c1) = (70, 71); // node 1's conn for node 0's session, node 0's for node 1's
        for step in order {
            match step {
                0 => t.dial_ok(0, a0),
                1 => t.dial_ok(1, a1),
                2 => assert!(t.opened(0, c0), "{order:?}: node 1 keeps node 0's session"),
                3 => assert!(
                    t.opened(1, c1),
                    "{order:?}: node 0 keeps it open for node 1"
                ),
                _ => unreachable!(),
            }
        }
        let winner = (
            Via::Dialled {
                peer: NodeId(1),
                attempt: a0,
            },
            Via::Accepted { conn: c0 },
        );
        assert_eq!(
            (t.m[0].session_of(NodeId(1)), t.m[1].session_of(NodeId(0))),
            (Some(winner.0), Some(winner.1)),
            "{order:?}"
        );
        let loser = Via::Dialled {
            peer: NodeId(0),
            attempt: a1,
        };
        assert_eq!(
            t.closes(1),
            vec![loser],
            "{order:?}: node 1 closes its own dial once"
        );
        assert_eq!(t.closes(0), vec![], "{order:?}: node 0 leaves it to node 1");
        for i in 0..2 {
            assert_eq!(
                t.link_changes(i),
                vec![ConnStatus::Connected],
                "{order:?}: node {i} never flaps"
            );
        }
        assert_eq!(t.m[0].dials_in_flight() + t.m[1].dials_in_flight(), 0);
    }
}

/// (a) The order real connections take: a dial's session reaches the peer *before* the dial's
/// answer reaches the dialler. Node 1's session carries the pair on node 0; node 0's session
/// reaches node 1, which closes its own at once; node 0 sees that session end while its dial
/// is still unanswered. That is a handover, not a loss: node 0 stays CONNECTED and its dial's
/// answer carries the pair. If the dial fails instead, the pair is lost then.
#[test]
fn a_crossed_dial_hands_over_without_a_flap() {
    for dial_fails in [false, true] {
        let mut t = Two::new();
        let [a0, a1] = t.start();
        let (c0, c1) = (70, 71);
        t.dial_ok(1, a1);
        assert!(t.opened(1, c1), "node 0 takes node 1's session");
        assert_eq!(t.status(0), ConnStatus::Connected);
        // Node 0's hello and session reach node 1, which prefers it and closes its own.
        assert_eq!(t.m[1].handle_hello(t.now, &t.hello[0]), Verdict::Accept);
        t.drain(1);
        assert!(t.opened(0, c0));
        assert_eq!(
            t.closes(1),
            vec![Via::Dialled {
                peer: NodeId(0),
                attempt: a1
            }]
        );
        // That close reaches node 0 before the answer to its dial.
        t.m[0].handle_session_lost(t.now, Via::Accepted { conn: c1 }, "closed".into());
        t.drain(0);
        assert_eq!(t.status(0), ConnStatus::Connected, "a handover is no loss");
        assert_eq!(
            t.m[0].session_of(NodeId(1)),
            None,
            "no carrier until the answer"
        );
        if dial_fails {
            sim::refused(&mut t.m[0], t.now, NodeId(1), a0);
            t.drain(0);
            assert_eq!(t.status(0), ConnStatus::Recovering, "the dial failed: lost");
        } else {
            let h = t.hello[1].clone();
            t.m[0].handle_dial_ok(t.now, NodeId(1), a0, &h);
            t.drain(0);
            assert_eq!(
                t.m[0].session_of(NodeId(1)),
                Some(Via::Dialled {
                    peer: NodeId(1),
                    attempt: a0
                })
            );
            assert_eq!(t.link_changes(0), vec![ConnStatus::Connected], "no flap");
            assert_eq!(t.closes(0), vec![], "node 0 closes nothing");
        }
    }
}

/// (e) The higher node's own session, replaced by the lower node's, is still the peer's for
/// what the lower node sent on it before it saw the switch (it may have carried the pair there
/// until then): an unimport refused there would be taken as delivered and leave a reference
/// held. Once it ends it proves nothing; a stale instance never did.
#[test]
fn a_superseded_dialled_session_still_proves_the_peer_until_it_ends() {
    let mut t = Two::new();
    let [_a0, a1] = t.start();
    let (c0, c1) = (70, 71);
    t.dial_ok(1, a1);
    assert!(t.opened(1, c1), "node 0 takes node 1's session");
    assert_eq!(t.m[1].handle_hello(t.now, &t.hello[0]), Verdict::Accept);
    t.drain(1);
    assert!(t.opened(0, c0), "node 1 switches to node 0's session");
    let old = Via::Dialled {
        peer: NodeId(0),
        attempt: a1,
    };
    assert_eq!(t.closes(1), vec![old]);
    let node0 = (NodeId(0), t.hello[0].instance);
    assert_eq!(
        t.m[1].proven_by(old),
        Some(node0),
        "still node 0's while open"
    );
    assert_eq!(
        t.m[1].proven_by(Via::Accepted { conn: c0 }),
        Some(node0),
        "the pair's session"
    );
    t.m[1].handle_session_lost(t.now, old, "closed".into());
    t.drain(1);
    assert_eq!(t.m[1].proven_by(old), None, "ended: proves nothing");
    assert_eq!(t.status(1), ConnStatus::Connected, "the pair is not lost");
}

/// (a) A whole domain started at once keeps exactly one session per pair, both sides naming it.
#[test]
fn a_domain_keeps_one_session_per_pair() {
    let mut net = Net::new(18, QuorumPolicy::None);
    net.start_all();
    net.run_until(10 * SEC, Net::all_up).expect("formed");
    net.run_for(30 * SEC);
    assert!(net.all_up());
    for a in 0..18 {
        for b in a + 1..18 {
            assert_eq!(net.sessions_between(a, b), 1, "pair {a}-{b}");
            let via = net.mesh(a).session_of(Net::id(b)).expect("a session");
            let (key, s) = net.find(a, via).expect("it is live");
            assert_eq!(
                net.mesh(b).session_of(Net::id(a)),
                Some(Net::other_end(key, s, a)),
                "pair {a}-{b}: both sides name the same session"
            );
        }
    }
    // Half the handshakes of a mesh where each side dials the other: one per pair, and a
    // dial of the first round to a node not started yet fails without a session.
    let sessions: usize = net.sessions.len();
    assert_eq!(sessions, 18 * 17 / 2);
}

/// (b) One node starts early and backs off; the others start later. Their dials connect it,
/// and it never dials again: its waiting retries are cancelled by their sessions.
#[test]
fn staggered_start_connects_the_early_node_without_its_dials() {
    for early in [0, 2] {
        let mut net = Net::new(4, QuorumPolicy::None);
        net.start(early);
        net.run_for(60 * SEC);
        let dials_alone = net.dials_by(early);
        assert!(dials_alone > 4, "it retried while alone: {dials_alone}");
        for i in (0..4).filter(|i| *i != early) {
            net.start(i);
        }
        let took = net.run_until(30 * SEC, Net::all_up).expect("formed");
        assert!(
            took < Duration::from_millis(10),
            "the late nodes' sessions connect it at once, took {took:?}"
        );
        net.run_for(60 * SEC);
        assert!(net.all_up());
        assert_eq!(
            net.dials_by(early),
            dials_alone,
            "node {early} dials nobody once the others' sessions are up"
        );
        for j in (0..4).filter(|j| *j != early) {
            assert_eq!(net.sessions_between(early, j), 1);
        }
    }
}

/// (c) A peer's session arriving while our retry waits out its backoff connects the link and
/// cancels the retry.
#[test]
fn an_accepted_session_cancels_a_waiting_retry() {
    let mut t = Two::new();
    let [a0, _] = t.start();
    sim::refused(&mut t.m[0], t.now, NodeId(1), a0);
    t.drain(0);
    let retry_at = t.m[0].poll_timeout().expect("a retry is scheduled");
    assert!(retry_at > t.now);
    assert_eq!(t.m[0].handle_hello(t.now, &t.hello[1]), Verdict::Accept);
    assert!(t.opened(1, 5));
    assert_eq!(t.status(0), ConnStatus::Connected);
    assert_eq!(
        t.m[0].session_of(NodeId(1)),
        Some(Via::Accepted { conn: 5 })
    );
    // Past the old retry time (within the peer timeout: heartbeats are answered here).
    let answer = |i: usize, a: &Action| match a {
        Action::SendHeartbeat { via, .. } if i == 0 => Some(*via),
        _ => None,
    };
    let dials = t.run(20 * SEC, answer);
    assert_eq!(dials[0], 0, "the waiting retry was cancelled");
    assert_eq!(t.status(0), ConnStatus::Connected);
}

/// (d) The pair's session is lost: both sides are RECOVERING and retry; whichever side's
/// redial gets through first carries the pair again, and the other side's retry is cancelled.
#[test]
fn a_lost_pair_session_is_restored_by_either_sides_redial() {
    for redialler in [0, 1] {
        let mut t = Two::new();
        let [a0, a1] = t.start();
        sim::refused(&mut t.m[1], t.now, NodeId(0), a1);
        t.dial_ok(0, a0);
        assert!(t.opened(0, 9));
        let via = [
            Via::Dialled {
                peer: NodeId(1),
                attempt: a0,
            },
            Via::Accepted { conn: 9 },
        ];
        for (i, via) in via.into_iter().enumerate() {
            t.m[i].handle_session_lost(t.now, via, "connection reset".into());
            t.drain(i);
            assert_eq!(t.status(i), ConnStatus::Recovering, "node {i}");
        }
        // Fire timers until the chosen side dials; the other's dial is refused meanwhile.
        let mut attempt = None;
        while attempt.is_none() {
            let (at, i) = [0, 1]
                .into_iter()
                .filter_map(|i| t.m[i].poll_timeout().map(|at| (at, i)))
                .min()
                .expect("both retry");
            t.now = t.now.max(at);
            t.m[i].handle_timeout(t.now);
            for a in t.drain(i) {
                if let Action::Dial { peer, attempt: n } = a {
                    if i == redialler {
                        attempt = Some(n);
                    } else {
                        sim::refused(&mut t.m[i], t.now, peer, n);
                        t.drain(i);
                    }
                }
            }
        }
        let n = attempt.expect("a dial");
        t.dial_ok(redialler, n);
        assert!(t.opened(redialler, 11));
        for i in 0..2 {
            assert_eq!(t.status(i), ConnStatus::Connected, "node {i}");
        }
        let other = 1 - redialler;
        assert_eq!(
            t.m[other].session_of(NodeId(redialler as u16)),
            Some(Via::Accepted { conn: 11 })
        );
        // The other side dials no more.
        let answer = |i: usize, a: &Action| match a {
            Action::SendHeartbeat { via, .. } if i == 0 => Some(*via),
            _ => None,
        };
        assert_eq!(t.run(2 * SEC, answer)[other], 0);
    }
}

/// (d) On the in-memory network: a reset of the pair's session, then both redial.
#[test]
fn a_reset_pair_session_comes_back_as_one() {
    let mut net = Net::new(3, QuorumPolicy::None);
    net.start_all();
    net.run_until(10 * SEC, Net::all_up).expect("formed");
    for _ in 0..5 {
        let via = net.mesh(0).session_of(NodeId(2)).expect("a session");
        let (key, _) = net.find(0, via).expect("live");
        net.end_session(key.0, key.1, None, "connection reset");
        net.pump();
        assert_eq!(net.cell(0, 2), ConnStatus::Recovering);
        assert_eq!(net.cell(2, 0), ConnStatus::Recovering);
        net.run_until(30 * SEC, Net::all_up).expect("restored");
        assert_eq!(net.sessions_between(0, 2), 1);
    }
}

/// (f) On the higher node, the pair's session being one the lower node dialled to it: the
/// heartbeats that arrive on it keep the pair alive; without them it is lost after the peer
/// timeout.
#[test]
fn the_higher_node_takes_heartbeats_on_the_accepted_session() {
    let mut t = Two::new();
    let [a0, a1] = t.start();
    sim::refused(&mut t.m[1], t.now, NodeId(0), a1);
    t.dial_ok(0, a0);
    assert!(t.opened(0, 4));
    let at_1 = Via::Accepted { conn: 4 };
    assert_eq!(t.m[1].session_of(NodeId(0)), Some(at_1));
    assert!(!t.m[1].sends_heartbeats(NodeId(0)));
    // Node 0's heartbeats reach node 1 on the session node 0 dialled; node 0 gets the answers.
    let answer = |i: usize, a: &Action| match a {
        Action::SendHeartbeat { via, .. } if i == 0 => Some(*via),
        _ => None,
    };
    for _ in 0..40 {
        t.run(Duration::from_millis(500), answer);
        t.m[1].handle_heartbeat(t.now, at_1);
        t.drain(1);
    }
    assert_eq!(t.status(1), ConnStatus::Connected);
    assert_eq!(t.status(0), ConnStatus::Connected);
    let last = t.now;
    while t.status(1) == ConnStatus::Connected {
        t.run(Duration::from_millis(100), answer);
    }
    let silent = t.now - last;
    assert!(
        silent >= Duration::from_millis(3000) && silent <= Duration::from_millis(3600),
        "lost {silent:?} after the last heartbeat"
    );
    assert!(
        t.m[1].links()[0]
            .reason
            .contains("no heartbeat from the peer")
    );
}

/// A goodbye that reaches node 1 before the session it came on has opened there (its stream
/// travels behind it on another connection, or the goodbye came by a unary call): the departed
/// instance's session then never carries the pair, the session that carried it when the
/// goodbye came still proves the peer for its last hand-backs, and a dial of ours answered by
/// that instance is closed. Only a new instance connects again (issue 28, seed 2253632).
#[test]
fn a_departed_instance_never_carries_the_pair_again() {
    let mut t = Two::new();
    let [_, a1] = t.start();
    t.dial_ok(1, a1);
    assert!(t.opened(1, 70), "node 0 takes node 1's session");
    let carried = Via::Dialled {
        peer: NodeId(0),
        attempt: a1,
    };
    assert_eq!(t.m[1].session_of(NodeId(0)), Some(carried));
    // Node 0's own dial reaches node 1 (hello accepted), then node 0 says goodbye on it.
    assert_eq!(t.m[1].handle_hello(t.now, &t.hello[0]), Verdict::Accept);
    t.drain(1);
    let node0 = t.hello[0].instance;
    t.m[1].handle_goodbye(t.now, NodeId(0), node0, "shutting down");
    t.drain(1);
    assert_eq!(t.status(1), ConnStatus::Disconnected);
    // Its session opens after the goodbye: refused (closed), the link stays DISCONNECTED, and
    // the session that carried the pair still proves node 0.
    assert!(!t.opened(0, 71), "a departed instance's session is closed");
    assert_eq!(t.status(1), ConnStatus::Disconnected);
    assert_eq!(t.m[1].proven_by(carried), Some((NodeId(0), node0)));
    // A dial of node 1's answered by the departed instance is closed, not connected.
    t.run(Duration::from_secs(10), |_, _| None);
    let attempt = t.log.iter().rev().find_map(|(n, a)| match a {
        Action::Dial { attempt, .. } if *n == 1 => Some(*attempt),
        _ => None,
    });
    let attempt = attempt.expect("node 1 retries after the goodbye");
    let h = t.hello[0].clone();
    t.m[1].handle_dial_ok(t.now, NodeId(0), attempt, &h);
    let a = t.drain(1);
    assert!(
        a.contains(&Action::CloseSession {
            peer: NodeId(0),
            via: Via::Dialled {
                peer: NodeId(0),
                attempt
            }
        }),
        "{a:?}"
    );
    assert_eq!(t.status(1), ConnStatus::Disconnected);
    // A new instance of node 0 connects.
    let mut restarted = t.hello[0].clone();
    restarted.instance = InstanceId(node0.0 + 100);
    assert_eq!(t.m[1].handle_hello(t.now, &restarted), Verdict::Accept);
    t.drain(1);
    assert!(t.m[1].handle_session_opened(t.now, NodeId(0), restarted.instance, 72));
    t.drain(1);
    assert_eq!(t.status(1), ConnStatus::Connected);
}
