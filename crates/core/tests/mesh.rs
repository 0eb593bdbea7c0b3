//! Deterministic multi-node tests of the mesh engine on an in-memory network, in virtual time.

mod sim;

use std::time::Duration;

use openimex_core::*;
use proptest::prelude::*;
use sim::Net;

const SEC: Duration = Duration::from_secs(1);

#[test]
fn eighteen_nodes_form() {
    let mut net = Net::new(18, QuorumPolicy::None);
    net.start_all();
    let took = net.run_until(10 * SEC, Net::all_up).expect("domain formed");
    // Started together: nodes dialled early fail, but inbound hellos trigger redials at once.
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
        "inbound hello must trigger a redial, took {took:?}"
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
    net.maps[1] = NodeMap::new(other);
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
    // Cap 5 s with jitter in [2.5 s, 5 s]: at most ~1440 attempts an hour, no tight loop.
    assert!(dials <= 1450, "{dials} dials in an hour");
    assert!(dials >= 700, "{dials}: still retrying");
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
