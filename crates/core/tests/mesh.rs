//! Deterministic multi-node tests of the mesh engine on an in-memory network, in virtual time.

mod sim;

use std::time::Duration;

use openimex_core::*;
use proptest::prelude::*;
use sim::{Net, dials};

const SEC: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

#[test]
fn eighteen_nodes_form() {
    let mut net = Net::new(18, QuorumPolicy::None);
    net.start_all();
    let took = net.run_until(10 * SEC, Net::all_up).expect("domain formed");
    // Started together: nodes dialled early fail, but the later nodes' sessions connect them.
    assert!(took <= SEC, "formation took {took:?} of virtual time");
}

#[test]
fn staggered_start_forms_without_waiting_out_backoff() {
    let mut net = Net::new(4, QuorumPolicy::None);
    net.start(0);
    net.run_for(60 * SEC); // node 0 backs off to the cap for its absent peers
    for i in 1..4 {
        net.start(i);
    }
    let took = net.run_until(30 * SEC, Net::all_up).expect("formed");
    assert!(
        took < Duration::from_millis(10),
        "the late nodes' sessions must connect it at once, took {took:?}"
    );
}

#[test]
fn kill9_then_restart_shows_new_instance() {
    let mut net = Net::new(18, QuorumPolicy::None);
    net.start_all();
    net.run_until(10 * SEC, Net::all_up).unwrap();
    let old = net.mesh(0).links()[7].instance.unwrap();
    net.kill(7);
    for i in (0..18).filter(|i| *i != 7) {
        assert_eq!(
            net.cell(i, 7),
            ConnStatus::Recovering,
            "node {i} sees 7 lost"
        );
        assert!(net.mesh(i).links()[7].reason.contains("connection lost"));
    }
    net.run_for(20 * SEC);
    net.start(7);
    net.run_until(30 * SEC, Net::all_up).expect("UP again");
    let new = net.mesh(0).links()[7].instance.unwrap();
    assert_ne!(old, new);
    let restarts = net
        .log
        .iter()
        .filter(|(_, a)| matches!(a, Action::PeerRestarted { peer, old: o, new: n } if peer.index() == 7 && *o == old && *n == new))
        .count();
    assert_eq!(restarts, 17, "every other node learns that 7 restarted");
}

#[test]
fn hung_peer_detected_by_heartbeat_timeout() {
    let mut net = Net::new(3, QuorumPolicy::None);
    net.start_all();
    net.run_until(10 * SEC, Net::all_up).unwrap();
    net.isolate(2);
    net.run_for(Duration::from_millis(2900));
    assert_eq!(
        net.cell(0, 2),
        ConnStatus::Connected,
        "not declared dead before the timeout"
    );
    net.run_for(Duration::from_millis(700));
    assert_eq!(net.cell(0, 2), ConnStatus::Recovering);
    assert!(net.mesh(0).links()[2].reason.contains("no heartbeat"));
    net.heal();
    net.run_until(30 * SEC, Net::all_up)
        .expect("recovers after the partition heals");
    // Same instance came back: nothing to clean up.
    assert!(
        !net.log
            .iter()
            .any(|(_, a)| matches!(a, Action::PeerRestarted { .. }))
    );
}

#[test]
fn goodbye_marks_departure_not_failure() {
    let mut net = Net::new(3, QuorumPolicy::None);
    net.start_all();
    net.run_until(10 * SEC, Net::all_up).unwrap();
    net.shutdown(2);
    let left = net
        .log
        .iter()
        .filter(|(_, a)| matches!(a, Action::PeerLeft { peer, .. } if peer.index() == 2))
        .count();
    assert_eq!(left, 2, "both peers record the departure once");
    for i in 0..2 {
        assert_eq!(net.cell(i, 2), ConnStatus::Disconnected);
        assert!(net.mesh(i).links()[2].reason.contains("goodbye"));
    }
    net.run_for(60 * SEC);
    assert_eq!(
        net.cell(0, 2),
        ConnStatus::Disconnected,
        "dial failures keep the departure state"
    );
    assert!(net.mesh(0).links()[2].last_error.is_some());
}

#[test]
fn a_stopping_daemon_answers_hellos_as_shutting_down_not_as_a_mismatch() {
    let mut net = Net::new(2, QuorumPolicy::None);
    net.start_all();
    net.run_until(10 * SEC, Net::all_up).unwrap();
    let now = net.now;
    let hello_0 = net.mesh(0).hello();
    let m1 = net.nodes[1].as_mut().unwrap();
    m1.handle_shutdown(now);
    assert_eq!(m1.handle_hello(now, &hello_0), Verdict::ShuttingDown);
    // Node 0 dials while 1 is still answering: a failed dial, never `!M!`.
    net.pump();
    net.run_for(10 * SEC);
    assert!(
        !matches!(net.cell(0, 1), ConnStatus::Mismatch(_)),
        "{:?}",
        net.mesh(0).links()[1]
    );
}

#[test]
fn stale_goodbye_from_old_instance_is_ignored() {
    let mut net = Net::new(2, QuorumPolicy::None);
    net.start_all();
    net.run_until(10 * SEC, Net::all_up).unwrap();
    let now = net.now;
    let m = net.nodes[0].as_mut().unwrap();
    m.handle_goodbye(now, NodeId(1), InstanceId(42), "stale");
    assert_eq!(net.cell(0, 1), ConnStatus::Connected);
}

#[test]
fn node_map_mismatch_is_refused_on_both_sides() {
    let mut net = Net::new(2, QuorumPolicy::None);
    let mut other = sim::hosts(2);
    other.push("10.9.9.9".into());
    net.maps.insert(1, NodeMap::new(other));
    net.start_all();
    net.run_for(30 * SEC);
    for (a, b) in [(0, 1), (1, 0)] {
        assert_eq!(
            net.cell(a, b),
            ConnStatus::Mismatch(Mismatch::NodeMap),
            "{a}->{b}"
        );
        assert!(
            net.mesh(a).links()[b].reason.contains("entries"),
            "{}",
            net.mesh(a).links()[b].reason
        );
    }
    assert!(net.sessions.is_empty());
    assert_eq!(
        domain_status(NodeId(0), &rows(&net)),
        DomainStatus::Degraded
    );
}

#[test]
fn full_quorum_waits_for_every_peer() {
    let mut net = Net::new(3, QuorumPolicy::Full);
    net.start(0);
    net.start(1);
    net.run_for(10 * SEC);
    assert_eq!(net.mesh(0).state(), DaemonState::WaitingForPeers);
    net.start(2);
    net.run_until(10 * SEC, Net::all_up)
        .expect("ready once all are connected");
}

#[test]
fn a_peer_down_for_an_hour_costs_little() {
    let mut net = Net::new(2, QuorumPolicy::None);
    net.start(0);
    net.run_for(3600 * SEC);
    let dials = net.dials_to(1);
    // Refused, so retried at NOT_LISTENING_CAPS times the cap's delay (cap 5 s, jitter in
    // [2.5 s, 5 s]: every 10-20 s): at most 360 attempts an hour, no tight loop, and never
    // given up.
    assert!(dials <= 365, "{dials} dials in an hour");
    assert!(dials >= 175, "{dials}: still retrying");
}

fn rows(net: &Net) -> Vec<NodeRow> {
    let n = net.nodes.len();
    (0..n)
        .map(|i| match &net.nodes[i] {
            Some(m) => NodeRow {
                node: Net::id(i),
                state: m.state(),
                cells: m.links().iter().map(|l| l.status).collect(),
            },
            None => NodeRow::unreachable(Net::id(i), n),
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    Kill(usize),
    Restart(usize),
    Isolate(usize),
    Heal,
    Shutdown(usize),
    Wait(u64),
}

fn op(n: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..n).prop_map(Op::Kill),
        (0..n).prop_map(Op::Restart),
        (0..n).prop_map(Op::Isolate),
        Just(Op::Heal),
        (0..n).prop_map(Op::Shutdown),
        (0u64..8000).prop_map(Op::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Whatever faults happen, once they stop (heal, restart the dead) the domain converges to
    /// UP, every node knows every peer's current instance, and each domain row agrees.
    #[test]
    fn converges_after_any_faults(ops in proptest::collection::vec(op(5), 0..30)) {
        let mut net = Net::new(5, QuorumPolicy::None);
        net.start_all();
        for op in ops {
            match op {
                Op::Kill(i) => if net.nodes[i].is_some() { net.kill(i) },
                Op::Restart(i) => { if net.nodes[i].is_some() { net.kill(i) } net.start(i) }
                Op::Isolate(i) => net.isolate(i),
                Op::Heal => net.heal(),
                Op::Shutdown(i) => if net.nodes[i].is_some() { net.shutdown(i) },
                Op::Wait(ms) => net.run_for(Duration::from_millis(ms)),
            }
        }
        net.heal();
        for i in 0..5 {
            if net.nodes[i].is_none() { net.start(i) }
        }
        prop_assert!(net.run_until(60 * SEC, Net::all_up).is_some(), "did not converge");
        for a in 0..5 {
            for b in (0..5).filter(|b| *b != a) {
                prop_assert_eq!(net.mesh(a).links()[b].instance, Some(net.mesh(b).config().instance));
            }
            prop_assert_eq!(domain_status(Net::id(a), &rows(&net)), DomainStatus::Up);
        }
    }
}

// ---- dial budget: a large node file costs what a small domain costs ----------------------

/// Whether every node in `live` is READY and connected to every other node in `live`.
fn live_connected(net: &Net, live: &[usize]) -> bool {
    live.iter().all(|&a| {
        net.nodes[a].as_ref().is_some_and(|m| {
            m.state() == DaemonState::Ready
                && live.iter().all(|&b| {
                    a == b
                        || m.peer(Net::id(b))
                            .is_some_and(|(s, _)| s == ConnStatus::Connected)
                })
        })
    })
}

/// Dials of node `from`, per target.
fn dials_per_peer(net: &Net, from: usize) -> Vec<usize> {
    let mut per = vec![0; net.nodes.len()];
    for (a, act) in &net.log {
        if let (true, Action::Dial { peer, .. }) = (*a == from, act) {
            per[peer.index()] += 1;
        }
    }
    per
}

#[test]
fn ten_thousand_dead_entries_are_dialled_within_the_budget() {
    let n = 10_000;
    let mut net = Net::new(n, QuorumPolicy::None);
    net.start(0);
    let first_round = net.dials_by(0);
    assert_eq!(first_round, n - 1, "the first round dials every entry once");
    assert_eq!(net.mesh(0).state(), DaemonState::Ready);

    let hour = 3600 * SEC;
    net.run_for(hour);
    let budget = net.mesh(0).dial_budget();
    let retries = net.dials_by(0) - first_round;
    let per_interval = usize::try_from(hour.as_nanos() / budget.interval.as_nanos()).unwrap();
    let allowed = budget.burst as usize + per_interval;
    // Without the budget the same hour costs about 9,999 / 3.75 s * 3600 s = 9.6 million dials.
    assert!(
        retries <= allowed,
        "{retries} retries in an hour, the budget allows {allowed}"
    );
    assert!(
        retries >= allowed * 9 / 10,
        "{retries} retries in an hour: the budget ({allowed}) should be used, not starved"
    );
    // Fair: every dead entry was retried, none much more often than the others.
    let per = dials_per_peer(&net, 0);
    let (min, max) = per[1..]
        .iter()
        .fold((usize::MAX, 0), |(lo, hi), &d| (lo.min(d), hi.max(d)));
    assert!(min >= 2, "some entry was never retried in an hour");
    assert!(
        max <= min + 2,
        "retries are unfair: {min}..={max} dials per entry"
    );
}

#[test]
fn the_budget_does_not_slow_a_healthy_domain() {
    let form = |budget: Option<DialBudget>, staggered: bool| {
        let mut net = Net::new(18, QuorumPolicy::None);
        net.budget = budget;
        if staggered {
            net.start(0);
            net.run_for(60 * SEC);
            for i in 1..18 {
                net.start(i);
            }
        } else {
            net.start_all();
        }
        let took = net.run_until(30 * SEC, Net::all_up).expect("formed");
        let dials: usize = (0..18).map(|i| net.dials_by(i)).sum();
        (took, dials)
    };
    for staggered in [false, true] {
        let with = form(None, staggered);
        let without = form(Some(DialBudget::UNLIMITED), staggered);
        assert_eq!(
            with, without,
            "18 nodes (staggered: {staggered}): (formation time, dials) with the default budget vs none"
        );
        assert!(with.0 <= SEC, "formation took {:?}", with.0);
    }
}

#[test]
fn live_nodes_among_ten_thousand_entries_form_and_recover_at_once() {
    let n = 10_000;
    let live: Vec<usize> = (0..18).map(|k| k * 555 + 3).collect();
    let mut net = Net::new(n, QuorumPolicy::None);
    net.start(live[0]);
    // Ten minutes alone: its budget goes to thousands of dead entries.
    net.run_for(600 * SEC);
    for &i in &live[1..] {
        net.start(i);
    }
    let took = net
        .run_until(SEC, |net| live_connected(net, &live))
        .expect("the 18 live nodes form");
    assert!(
        took < Duration::from_millis(10),
        "a node that starts dials every peer, and its sessions connect them at once: took {took:?}"
    );

    // kill -9 and restart a minute later: its sessions bring it back at once.
    net.kill(live[5]);
    net.run_for(60 * SEC);
    net.start(live[5]);
    let took = net
        .run_until(SEC, |net| live_connected(net, &live))
        .expect("back after a restart");
    assert!(took < Duration::from_millis(10), "restart took {took:?}");

    // A partition heals without a restart (nobody starts a session at once): retries of peers
    // that were up come before the dead entries, so it takes a backoff, not a tour of 10,000.
    net.isolate(live[7]);
    net.run_for(20 * SEC);
    assert!(!live_connected(&net, &live));
    net.heal();
    let took = net
        .run_until(60 * SEC, |net| live_connected(net, &live))
        .expect("healed");
    let budget = net.mesh(live[7]).dial_budget();
    let bound = 5 * SEC + budget.interval * 17 + SEC;
    assert!(
        took <= bound,
        "partition heal took {took:?} (bound {bound:?})"
    );
}

#[test]
fn dials_in_flight_are_bounded_and_a_peer_session_needs_no_dial() {
    let (mut m, hello_900, t0) = node_0_and_hello_of(1000, 900);
    let cap = m.dial_budget().max_in_flight;
    m.handle_start(t0);
    let first = dials(&mut m);
    assert_eq!(
        first.len(),
        cap,
        "the first round starts {cap} dials, no more"
    );
    assert_eq!(m.dials_in_flight(), cap);
    assert_eq!(
        m.poll_timeout(),
        None,
        "no timer while every slot is taken: a finished dial frees one"
    );
    // One answer, one more dial.
    let (peer, attempt) = first[0];
    sim::refused(&mut m, t0, peer, attempt);
    let next = dials(&mut m);
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!(next[0].0, NodeId(u16::try_from(cap + 1).unwrap()));
    // Node 900 (queued, not dialled yet) says hello and opens its session: connected at once,
    // beyond the bound, and its queued dial is cancelled.
    assert_eq!(m.handle_hello(t0, &hello_900), Verdict::Accept);
    assert!(m.handle_session_opened(t0, NodeId(900), hello_900.instance, 7));
    assert_eq!(dials(&mut m), vec![]);
    assert_eq!(m.peer(NodeId(900)).unwrap().0, ConnStatus::Connected);
    assert_eq!(m.session_of(NodeId(900)), Some(Via::Accepted { conn: 7 }));
    assert_eq!(m.dials_in_flight(), cap);
    // Every other entry is dialled in turn as slots free up; node 900 never.
    let mut all = Vec::new();
    for (peer, attempt) in first[1..].iter().chain(&next) {
        sim::refused(&mut m, t0, *peer, *attempt);
        all.extend(dials(&mut m));
    }
    while let Some((peer, attempt)) = all.pop() {
        assert_ne!(peer, NodeId(900), "a connected peer is not dialled");
        sim::refused(&mut m, t0, peer, attempt);
        all.extend(dials(&mut m));
    }
}

/// The first round goes round the ring from the node after this one: node 3 of 6 dials 4, 5,
/// 0, 1, 2. When a domain starts together each node is then first in one queue rather than
/// every node dialling node 0 first; when nodes start in ID order, the ones not up yet refuse
/// first, before they can start and dial us while our dial to them waits (two sessions for one
/// pair).
#[test]
fn the_first_round_dials_round_the_ring_from_the_next_node() {
    let map = NodeMap::new(sim::hosts(6));
    #[allow(clippy::disallowed_methods)]
    let t0 = std::time::Instant::now();
    let mut m = Mesh::new(sim::config(3, map, 1, QuorumPolicy::None), t0);
    // One slot: each dial goes out when the one before it is answered.
    m.set_dial_budget(DialBudget {
        max_in_flight: 1,
        ..m.dial_budget()
    });
    m.handle_start(t0);
    let mut order = Vec::new();
    let mut out = dials(&mut m);
    while let Some((peer, attempt)) = out.pop() {
        order.push(peer.0);
        sim::refused(&mut m, t0, peer, attempt);
        out.extend(dials(&mut m));
        assert!(out.len() <= 1, "one dial at a time: {out:?}");
    }
    assert_eq!(order, vec![4, 5, 0, 1, 2]);
}

#[test]
fn a_peer_session_while_our_dial_is_out_ends_the_dialling() {
    let (mut m, hello_1, t0) = node_0_and_hello_of(2, 1);
    m.handle_start(t0);
    let dial = |m: &mut Mesh| {
        std::iter::from_fn(|| m.poll_action()).find_map(|a| match a {
            Action::Dial { peer, attempt } => Some((peer, attempt)),
            _ => None,
        })
    };
    let (peer, attempt) = dial(&mut m).expect("first dial");
    // The peer's session arrives while our dial to it is still out (it started just after).
    assert_eq!(m.handle_hello(t0, &hello_1), Verdict::Accept);
    assert!(m.handle_session_opened(t0, peer, hello_1.instance, 3));
    assert_eq!(m.peer(peer).unwrap().0, ConnStatus::Connected);
    assert_eq!(dial(&mut m), None, "one dial at a time");
    // Our dial fails: the pair is carried, so nothing is retried.
    sim::refused(&mut m, t0, peer, attempt);
    assert_eq!(m.peer(peer).unwrap().0, ConnStatus::Connected);
    assert_eq!(m.dials_in_flight(), 0);
    // (Nobody answers heartbeats here, so stay within the peer timeout.)
    let later = t0 + 2 * SEC;
    while let Some(t) = m.poll_timeout().filter(|t| *t <= later) {
        m.handle_timeout(t);
        assert_eq!(dial(&mut m), None, "no dial while the peer's session is up");
    }
}

/// The first dial after `t` (running the timers), and when it went out.
fn next_dial_after(
    m: &mut Mesh,
    t: std::time::Instant,
) -> Option<(std::time::Instant, NodeId, u64)> {
    let mut now = t;
    for _ in 0..1000 {
        if let Some((peer, attempt)) = dials(m).first().copied() {
            return Some((now, peer, attempt));
        }
        now = now.max(m.poll_timeout()?);
        m.handle_timeout(now);
    }
    None
}

/// A refused dial's retry is only a safety net (`mesh/retry.rs`): the peer dials us when it
/// starts, and a retry that goes out while that dial is still being set up gives the pair two
/// connections. So it waits `NOT_LISTENING_CAPS` times the backoff's delay at its cap, never
/// sooner, and it is not forgotten either.
#[test]
fn a_refused_dial_leaves_the_pair_to_the_peers_own_dial_and_retries_after_the_cap() {
    let (mut m, hello_1, t0) = node_0_and_hello_of(2, 1);
    let backoff = m.config().backoff;
    m.handle_start(t0);
    let (_, peer, attempt) = next_dial_after(&mut m, t0).expect("first dial");
    // Nothing listens there: node 1's daemon has not started.
    sim::refused(&mut m, t0, peer, attempt);
    let (at, _, again) = next_dial_after(&mut m, t0).expect("a retry, as a safety net");
    let (low, high) = (
        backoff.max / 2 * NOT_LISTENING_CAPS,
        backoff.max * NOT_LISTENING_CAPS,
    );
    assert!(
        at - t0 >= low && at - t0 <= high,
        "retried {:?} after a refused connection: outside {low:?}..={high:?} (the cap is {:?}, \
         the first delay {:?})",
        at - t0,
        backoff.max,
        backoff.min
    );
    // It starts meanwhile and dials us: connected by its session, our retry cancelled.
    sim::refused(&mut m, at, peer, again);
    let started = at + 300 * MS;
    assert_eq!(m.handle_hello(started, &hello_1), Verdict::Accept);
    assert!(m.handle_session_opened(started, peer, hello_1.instance, 3));
    assert_eq!(m.peer(peer).unwrap().0, ConnStatus::Connected);
    assert_eq!(dials(&mut m), vec![]);
    assert_eq!(m.dials_in_flight(), 0);

    // Any other failure (here a connect that timed out) keeps the backoff's first delay.
    let (mut m, _, t0) = node_0_and_hello_of(2, 1);
    m.handle_start(t0);
    let (_, peer, attempt) = next_dial_after(&mut m, t0).expect("first dial");
    m.handle_dial_failed(
        t0,
        peer,
        attempt,
        DialFailure::Other,
        "no answer within 2000 ms".into(),
    );
    let (at, _, _) = next_dial_after(&mut m, t0).expect("a retry");
    assert!(
        at - t0 <= backoff.min,
        "retried {:?} after a timeout",
        at - t0
    );
}

#[test]
fn an_accepted_hello_puts_off_our_queued_dial_to_that_peer() {
    let (mut m, hello_900, t0) = node_0_and_hello_of(1000, 900);
    let put_off = m.config().backoff.min;
    // One retry, then no token for an hour: only first-round dials go out.
    m.set_dial_budget(DialBudget {
        burst: 1,
        interval: Duration::from_secs(3600),
        max_in_flight: 32,
    });
    m.handle_start(t0);
    let mut out = dials(&mut m);
    // Node 900 is far down the first round's queue; its hello arrives before our dial to it.
    assert_eq!(m.handle_hello(t0, &hello_900), Verdict::Accept);
    // Its session does not follow here. Every slot frees up and refills, quickly, many times:
    // the queue reaches 900's place, yet no dial to it before the put-off ends.
    let mut now = t0;
    let mut dialled_900 = None;
    for _ in 0..5000 {
        let Some((peer, attempt)) = out.pop() else {
            match m.poll_timeout() {
                Some(t) => {
                    now = now.max(t);
                    m.handle_timeout(now);
                    out.extend(dials(&mut m));
                    continue;
                }
                None => break,
            }
        };
        if peer == NodeId(900) {
            dialled_900 = Some(now);
            break;
        }
        now += Duration::from_micros(20);
        sim::refused(&mut m, now, peer, attempt);
        out.extend(dials(&mut m));
    }
    let at = dialled_900.expect("the dial goes out once the put-off ends (no session came)");
    assert!(
        at >= t0 + put_off,
        "dialled {:?} after the hello, before the put-off of {put_off:?}",
        at - t0
    );
    // Put off, it is still a first-round dial: it does not wait for the retry budget.
    assert!(
        at < t0 + put_off + SEC,
        "dialled {:?} after the hello: it waited for a retry token",
        at - t0
    );
}

/// Node 0 of a pair whose peer (node 1) opened its session to it at the returned start.
fn pair_with_accepted_session() -> (Mesh, Via, std::time::Instant) {
    let (mut m, hello_1, t0) = node_0_and_hello_of(2, 1);
    m.handle_start(t0);
    assert_eq!(m.handle_hello(t0, &hello_1), Verdict::Accept);
    assert!(m.handle_session_opened(t0, NodeId(1), hello_1.instance, 3));
    while m.poll_action().is_some() {}
    (m, Via::Accepted { conn: 3 }, t0)
}

#[test]
fn a_tick_that_runs_late_loses_nobody_and_the_next_one_checks() {
    let (mut m, via, t0) = pair_with_accepted_session();
    let cfg = m.config().clone();
    let peer = NodeId(1);
    // Answers on time for 2 s.
    let mut now = t0;
    while now < t0 + 2 * SEC {
        now = m.poll_timeout().unwrap();
        m.handle_timeout(now);
        m.handle_heartbeat(now, via);
    }
    let heard = now;
    // This daemon does not run for longer than the peer timeout (starved): its first tick comes
    // late, with the peer's answers still unread in the socket. Nobody is lost on it.
    let late = heard + cfg.peer_timeout + SEC;
    assert!(m.poll_timeout().unwrap() < late);
    m.handle_timeout(late);
    assert_eq!(m.peer(peer).unwrap().0, ConnStatus::Connected, "spared");
    // The reader catches up: the answers count, and the next tick (on time) keeps the pair.
    m.handle_heartbeat(late, via);
    let next = m.poll_timeout().unwrap();
    assert_eq!(
        next,
        late + cfg.heartbeat_interval,
        "a whole interval to catch up"
    );
    m.handle_timeout(next);
    assert_eq!(m.peer(peer).unwrap().0, ConnStatus::Connected);

    // Late again, and this time the peer really is silent: the late tick spares, the next
    // one (on time) loses it, one interval later than an on-time check would have.
    let late = next + cfg.peer_timeout + SEC;
    m.handle_timeout(late);
    assert_eq!(m.peer(peer).unwrap().0, ConnStatus::Connected);
    let next = m.poll_timeout().unwrap();
    m.handle_timeout(next);
    assert_eq!(m.peer(peer).unwrap().0, ConnStatus::Recovering);
    assert!(m.links()[1].reason.contains("no heartbeat answer"));
}

#[test]
fn late_ticks_in_a_row_spare_only_the_first() {
    let (mut m, _via, t0) = pair_with_accepted_session();
    let cfg = m.config().clone();
    // Every tick runs late (a daemon that never catches up) and the peer is silent: still
    // lost, on the second late tick.
    let mut now = t0 + cfg.peer_timeout + SEC;
    m.handle_timeout(now);
    assert_eq!(m.peer(NodeId(1)).unwrap().0, ConnStatus::Connected);
    now = m.poll_timeout().unwrap() + 2 * cfg.heartbeat_interval;
    m.handle_timeout(now);
    assert_eq!(m.peer(NodeId(1)).unwrap().0, ConnStatus::Recovering);
}

/// The heartbeats among the actions `m` has queued: whether each asks for an answer.
fn heartbeats(m: &mut Mesh) -> Vec<bool> {
    std::iter::from_fn(|| m.poll_action())
        .filter_map(|a| match a {
            Action::SendHeartbeat { answer, .. } => Some(answer),
            _ => None,
        })
        .collect()
}

/// Ticks `m` until `until`, answering every heartbeat that asks for it at once; returns what
/// each tick's heartbeat asked.
fn tick_answering(m: &mut Mesh, via: Via, until: std::time::Instant) -> Vec<bool> {
    let mut asked = Vec::new();
    while m.poll_timeout().unwrap() < until {
        let now = m.poll_timeout().unwrap();
        m.handle_timeout(now);
        for answer in heartbeats(m) {
            if answer {
                m.handle_heartbeat(now, via);
            }
            asked.push(answer);
        }
    }
    asked
}

#[test]
fn while_answers_arrive_every_other_heartbeat_asks_for_none_and_a_silent_peer_is_still_lost() {
    let (mut m, via, t0) = pair_with_accepted_session();
    let cfg = m.config().clone();
    assert!(cfg.peer_timeout >= 4 * cfg.heartbeat_interval);
    // Answered whenever asked for 5 s: every other heartbeat asks, a quarter fewer messages.
    let asked = tick_answering(&mut m, via, t0 + 5 * SEC);
    assert!(asked.len() >= 9, "{asked:?}");
    assert!(
        asked.windows(2).all(|w| w[0] != w[1]),
        "answers asked every other tick: {asked:?}"
    );
    assert_eq!(m.peer(NodeId(1)).unwrap().0, ConnStatus::Connected);
    // The peer goes silent. The first heartbeat may ask for nothing (the last one was
    // answered), every later one asks; the pair is lost a peer timeout after its last answer,
    // which came one or two intervals before the silence.
    let mut now = m.poll_timeout().unwrap();
    let silent_from = now;
    let mut asked = Vec::new();
    loop {
        m.handle_timeout(now);
        asked.extend(heartbeats(&mut m));
        if m.peer(NodeId(1)).unwrap().0 != ConnStatus::Connected {
            break;
        }
        now = m.poll_timeout().unwrap();
        assert!(now <= silent_from + cfg.peer_timeout + cfg.heartbeat_interval);
    }
    assert!(asked.iter().skip(1).all(|a| *a), "{asked:?}");
    assert!(now >= silent_from + cfg.peer_timeout - 2 * cfg.heartbeat_interval);
    assert!(m.links()[1].reason.contains("no heartbeat answer"));
}

/// A session that began carrying its pair less than an interval before a tick sends no
/// heartbeat on that tick (its handshake has just proved the pair; while a domain forms every
/// session is that new), and its first at the next tick; a peer silent from the handshake on is
/// still lost a peer timeout after it, no later.
#[test]
fn a_new_session_sends_its_first_heartbeat_a_whole_interval_on_and_is_lost_on_time() {
    let (mut m, hello_1, t0) = node_0_and_hello_of(2, 1);
    let cfg = m.config().clone();
    m.handle_start(t0);
    // Ticks fall on t0 + k intervals: opened half an interval before the first.
    let opened = t0 + cfg.heartbeat_interval / 2;
    assert_eq!(m.handle_hello(opened, &hello_1), Verdict::Accept);
    assert!(m.handle_session_opened(opened, NodeId(1), hello_1.instance, 3));
    while m.poll_action().is_some() {}
    let first = m.poll_timeout().unwrap();
    assert_eq!(first, t0 + cfg.heartbeat_interval);
    m.handle_timeout(first);
    assert_eq!(
        heartbeats(&mut m),
        Vec::<bool>::new(),
        "none half an interval in"
    );
    let second = m.poll_timeout().unwrap();
    assert_eq!(second, first + cfg.heartbeat_interval);
    m.handle_timeout(second);
    assert_eq!(
        heartbeats(&mut m),
        vec![true],
        "the first, asking for an answer"
    );
    // No answer ever comes: lost at the first tick a peer timeout after the handshake.
    let mut now = second;
    while m.peer(NodeId(1)).unwrap().0 == ConnStatus::Connected {
        now = m.poll_timeout().unwrap();
        m.handle_timeout(now);
        assert!(
            now <= opened + cfg.peer_timeout + cfg.heartbeat_interval,
            "lost late"
        );
    }
    assert!(now >= opened + cfg.peer_timeout, "lost early");
    assert!(m.links()[1].reason.contains("no heartbeat answer"));
}

#[test]
fn with_a_peer_timeout_under_four_intervals_every_heartbeat_asks_for_an_answer() {
    let map = NodeMap::new(sim::hosts(2));
    #[allow(clippy::disallowed_methods)]
    let t0 = std::time::Instant::now();
    let mut cfg = sim::config(0, map.clone(), 1, QuorumPolicy::None);
    cfg.peer_timeout = 3 * cfg.heartbeat_interval;
    let mut m = Mesh::new(cfg, t0);
    let hello = Mesh::new(sim::config(1, map, 2, QuorumPolicy::None), t0).hello();
    m.handle_start(t0);
    assert_eq!(m.handle_hello(t0, &hello), Verdict::Accept);
    assert!(m.handle_session_opened(t0, NodeId(1), hello.instance, 3));
    while m.poll_action().is_some() {}
    let asked = tick_answering(&mut m, Via::Accepted { conn: 3 }, t0 + 5 * SEC);
    assert!(asked.len() >= 9 && asked.iter().all(|a| *a), "{asked:?}");
    assert_eq!(m.peer(NodeId(1)).unwrap().0, ConnStatus::Connected);
}

/// Node 0 of an `n`-entry map (not started), the hello node `peer` of the same map sends, and
/// the instant both were made at.
fn node_0_and_hello_of(n: usize, peer: usize) -> (Mesh, Hello, std::time::Instant) {
    let map = NodeMap::new(sim::hosts(n));
    #[allow(clippy::disallowed_methods)]
    let t0 = std::time::Instant::now();
    let hello = Mesh::new(sim::config(peer, map.clone(), 2, QuorumPolicy::None), t0).hello();
    (
        Mesh::new(sim::config(0, map, 1, QuorumPolicy::None), t0),
        hello,
        t0,
    )
}
