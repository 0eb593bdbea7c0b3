//! The node's fabric view and its cliques (`node/cliques.rs`, issue 30 item 2): when the GPUs'
//! probes are read (before the start, every FABRIC_REFRESH, at once on CLIQUE_ID_CHANGE —
//! `docs/reference/driver-interface.md` §1.6 "Other events", §5), which peers are told a change,
//! and what a peer's cliques are believed from. Deterministic, in virtual time.

mod sim;

use std::time::{Duration, Instant};

use openimex_core::node::{Action, FABRIC_REFRESH, MAX_PEER_CLIQUES};
use openimex_core::*;
use sim::node::{Setup, drain, peer};

fn gpu(gpu: u32, clique_id: u32) -> GpuFabric {
    GpuFabric {
        gpu,
        state: "COMPLETED".into(),
        clique_id,
        health_summary: "HEALTHY".into(),
        ..GpuFabric::default()
    }
}

/// Node 0 of 3 with two GPUs in clique 7 (read before the start), started, and node 1's
/// session up (accepted on connection 1); node 2 is not connected.
fn node() -> (Node, Instant, Vec<Hello>) {
    let (mut n, now, hellos) = sim::node::node(Setup::default());
    n.handle_gpu_fabric(now, vec![gpu(0, 7), gpu(1, 7)]);
    let (n, _) = sim::node::with_node_1(n, now, &hellos);
    (n, now, hellos)
}

fn reads(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::ReadGpuFabric))
        .count()
}

fn told(actions: &[Action]) -> Vec<(NodeId, Vec<u32>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::SendCliques { peer, cliques, .. } => Some((*peer, cliques.clone())),
            _ => None,
        })
        .collect()
}

/// Runs the node's timers up to `until`, `before` each; returns the actions they asked for.
fn run_each(n: &mut Node, until: Instant, before: impl Fn(&mut Node, Instant)) -> Vec<Action> {
    let mut actions = Vec::new();
    while let Some(at) = n.poll_timeout().filter(|at| *at <= until) {
        before(n, at);
        n.handle_timeout(at);
        actions.extend(drain(n));
    }
    actions
}

/// Runs the node's timers up to `until`; returns the actions they asked for.
fn run_until(n: &mut Node, until: Instant) -> Vec<Action> {
    run_each(n, until, |_, _| {})
}

/// [`run_until`] with node 1 alive: its heartbeats arrive on its session at every step.
fn run_alive_until(n: &mut Node, until: Instant) -> Vec<Action> {
    run_each(n, until, |n, at| n.handle_session_heartbeat(at, 1))
}

#[test]
fn a_read_before_the_start_goes_in_the_first_hellos_and_tells_nobody() {
    let (mut n, now, _) = sim::node::node(Setup::default());
    n.handle_gpu_fabric(now, vec![gpu(0, 7), gpu(1, 9), gpu(2, 7)]);
    // Each clique once, sorted: what the hello carries.
    assert_eq!(n.cliques(), [7, 9]);
    let started = sim::node::start(&mut n, now);
    assert!(told(&started).is_empty(), "{started:?}");
    assert_eq!(reads(&started), 0, "read already: {started:?}");
}

#[test]
fn a_probe_not_completed_names_no_clique() {
    let (mut n, now, _) = sim::node::node(Setup::default());
    let mut probing = gpu(1, 0);
    probing.state = "IN_PROGRESS".into();
    n.handle_gpu_fabric(now, vec![gpu(0, 7), probing]);
    assert_eq!(n.cliques(), [7]);
}

#[test]
fn the_probes_are_read_again_every_refresh_and_never_before() {
    let (mut n, now, _) = node();
    let early = run_until(&mut n, now + FABRIC_REFRESH - Duration::from_millis(1));
    assert_eq!(reads(&early), 0, "{early:?}");
    let first = run_until(&mut n, now + FABRIC_REFRESH);
    assert_eq!(reads(&first), 1, "{first:?}");
    // The next read is a refresh after the last ask, whether or not the read answered (a failed
    // read is not reported).
    let between = run_until(&mut n, now + FABRIC_REFRESH * 2 - Duration::from_millis(1));
    assert_eq!(reads(&between), 0, "{between:?}");
    let second = run_until(&mut n, now + FABRIC_REFRESH * 2);
    assert_eq!(reads(&second), 1, "{second:?}");
}

#[test]
fn a_node_started_without_a_read_asks_for_one_at_once() {
    let (mut n, now, _) = sim::node::node(Setup::default());
    let started = sim::node::start(&mut n, now);
    assert_eq!(reads(&started), 1, "{started:?}");
}

#[test]
fn clique_id_change_is_recorded_at_once_told_to_connected_peers_and_read_again() {
    let (mut n, now, _) = node();
    let later = now + Duration::from_millis(1200);
    n.handle_driver_event(
        later,
        Event::CliqueIdChange {
            gpu: 1,
            clique_id: 8,
        },
    );
    let a = drain(&mut n);
    assert!(
        a.contains(&Action::CliqueChanged {
            gpu: 1,
            from: Some(7),
            to: 8
        }),
        "{a:?}"
    );
    // Before the read answers: the event's clique is the view's.
    assert_eq!(n.cliques(), [7, 8]);
    assert_eq!(n.gpus()[1].clique_id, 8);
    // Node 1 is connected; node 2 is not (its next link-up tells it).
    assert_eq!(told(&a), vec![(NodeId(1), vec![7, 8])]);
    assert_eq!(reads(&a), 1, "a full read at once: {a:?}");
    // The refresh restarts from that read.
    let before = run_until(&mut n, later + FABRIC_REFRESH - Duration::from_millis(1));
    assert_eq!(reads(&before), 0, "{before:?}");
    // The read confirms what the event said: nobody is told twice.
    n.handle_gpu_fabric(later, vec![gpu(0, 7), gpu(1, 8)]);
    assert!(told(&drain(&mut n)).is_empty());
}

#[test]
fn a_link_that_comes_up_after_a_change_is_told_and_before_any_change_nobody_is() {
    let (mut n, now, hellos) = node();
    // Node 2 connects while the cliques are the first read's: its hello answer carried them.
    assert_eq!(
        n.handle_session_hello(now, 2, true, &hellos[2]),
        Verdict::Accept
    );
    assert!(n.handle_session_opened(now, 2));
    assert!(told(&drain(&mut n)).is_empty());
    n.handle_conn_closed(now, 2);
    drain(&mut n);
    assert_eq!(
        n.mesh().peer(NodeId(2)).map(|p| p.0),
        Some(ConnStatus::Recovering)
    );
    // The cliques change while node 2 is away: only node 1 hears of it now.
    n.handle_gpu_fabric(now, vec![gpu(0, 7), gpu(1, 9)]);
    assert_eq!(told(&drain(&mut n)), vec![(NodeId(1), vec![7, 9])]);
    // Node 2 comes back: whatever hello it took, it is told.
    assert_eq!(
        n.handle_session_hello(now, 3, true, &hellos[2]),
        Verdict::Accept
    );
    assert!(n.handle_session_opened(now, 3));
    assert_eq!(told(&drain(&mut n)), vec![(NodeId(2), vec![7, 9])]);
}

#[test]
fn a_health_change_between_reads_is_reported_and_the_same_read_is_not() {
    let (mut n, now, _) = node();
    n.handle_gpu_fabric(now, vec![gpu(0, 7), gpu(1, 7)]);
    let same = drain(&mut n);
    assert!(
        !same
            .iter()
            .any(|a| matches!(a, Action::GpuHealthChanged { .. })),
        "{same:?}"
    );
    let mut sick = gpu(1, 7);
    sick.health_summary = "UNHEALTHY".into();
    sick.health_mask = 0x4;
    n.handle_gpu_fabric(now, vec![gpu(0, 7), sick]);
    let a = drain(&mut n);
    assert!(
        a.contains(&Action::GpuHealthChanged {
            gpu: 1,
            from: ("HEALTHY".into(), 0),
            to: ("UNHEALTHY".into(), 0x4),
        }),
        "{a:?}"
    );
    // Health is no clique: nobody is told.
    assert!(told(&a).is_empty());
}

#[test]
fn a_peers_cliques_come_from_its_hello_and_its_notifications() {
    let (mut n, now, hellos) = node();
    n.handle_peer_cliques(now, peer(&hellos[1]), &[7], 0);
    let a = drain(&mut n);
    assert!(
        a.contains(&Action::PeerCliques {
            peer: NodeId(1),
            cliques: vec![7],
            shared: true,
            notified: false,
        }),
        "{a:?}"
    );
    assert_eq!(n.peer_cliques(NodeId(1)), Some(&[7][..]));
    // Its notification on its session: outside this node's cliques now (§6.8: its memory
    // imports here but does not map).
    n.handle_session_cliques(now, Via::Accepted { conn: 1 }, &[3], 1);
    let a = drain(&mut n);
    assert!(
        a.contains(&Action::PeerCliques {
            peer: NodeId(1),
            cliques: vec![3],
            shared: false,
            notified: true,
        }),
        "{a:?}"
    );
    assert_eq!(n.peer_cliques(NodeId(1)), Some(&[3][..]));
}

#[test]
fn a_notification_on_a_connection_that_proves_nobody_is_refused_and_changes_nothing() {
    let (mut n, now, hellos) = node();
    n.handle_peer_cliques(now, peer(&hellos[1]), &[7], 0);
    drain(&mut n);
    n.handle_session_cliques(now, Via::Accepted { conn: 99 }, &[3], 1);
    let a = drain(&mut n);
    assert!(
        a.iter().any(
            |x| matches!(x, Action::Refused { reason, .. } if *reason == "cliques: no session")
        ),
        "{a:?}"
    );
    assert_eq!(n.peer_cliques(NodeId(1)), Some(&[7][..]));
}

#[test]
fn cliques_of_an_instance_the_mesh_does_not_know_are_not_taken() {
    let (mut n, now, hellos) = node();
    // Node 2 never said hello: its claim is nobody's.
    n.handle_peer_cliques(now, peer(&hellos[2]), &[7], 0);
    assert!(drain(&mut n).is_empty());
    assert_eq!(n.peer_cliques(NodeId(2)), None);
    // Node 1's earlier instance: not the one the mesh knows.
    let mut old = peer(&hellos[1]);
    old.instance = InstanceId(1);
    n.handle_peer_cliques(now, old, &[7], 0);
    assert_eq!(n.peer_cliques(NodeId(1)), None);
}

#[test]
fn a_list_longer_than_any_node_has_is_not_believed() {
    let (mut n, now, hellos) = node();
    let many: Vec<u32> = (0..=MAX_PEER_CLIQUES as u32).collect();
    n.handle_peer_cliques(now, peer(&hellos[1]), &many, 0);
    assert!(drain(&mut n).is_empty());
    assert_eq!(n.peer_cliques(NodeId(1)), None);
}

#[test]
fn a_hello_built_before_a_change_that_arrives_after_its_notification_changes_nothing() {
    let (mut n, now, hellos) = node();
    // Node 1's notification of its change (epoch 1) comes first, on the pair's session...
    n.handle_session_cliques(now, Via::Accepted { conn: 1 }, &[7, 8], 1);
    drain(&mut n);
    // ...then the answer to a dial, built before the change (epoch 0), on another connection.
    n.handle_peer_cliques(now, peer(&hellos[1]), &[7], 0);
    assert!(drain(&mut n).is_empty());
    assert_eq!(n.peer_cliques(NodeId(1)), Some(&[7, 8][..]));
    // A restarted node 1 starts its epochs again: its hello is believed.
    let mut restarted = hellos[1].clone();
    restarted.instance = InstanceId(999);
    assert_eq!(
        n.handle_session_hello(now, 5, true, &restarted),
        Verdict::Accept
    );
    drain(&mut n);
    n.handle_peer_cliques(now, peer(&restarted), &[9], 0);
    assert_eq!(n.peer_cliques(NodeId(1)), Some(&[9][..]));
}

#[test]
fn each_change_counts_an_epoch_and_the_notification_carries_it() {
    let (mut n, now, _) = node();
    assert_eq!(n.cliques_epoch(), 0);
    n.handle_gpu_fabric(now, vec![gpu(0, 7), gpu(1, 9)]);
    let a = drain(&mut n);
    assert!(
        a.contains(&Action::SendCliques {
            peer: NodeId(1),
            cliques: vec![7, 9],
            epoch: 1
        }),
        "{a:?}"
    );
    n.handle_gpu_fabric(now, vec![gpu(0, 9), gpu(1, 9)]);
    drain(&mut n);
    assert_eq!(n.cliques_epoch(), 2);
}

#[test]
fn a_notification_the_session_did_not_take_goes_again_at_the_next_refresh() {
    let (mut n, now, _) = node();
    n.handle_gpu_fabric(now, vec![gpu(0, 7), gpu(1, 9)]);
    assert_eq!(told(&drain(&mut n)), vec![(NodeId(1), vec![7, 9])]);
    // The session did not take it in time (a full send buffer): the link is still up.
    n.handle_cliques_sent(now, NodeId(1), false);
    assert!(drain(&mut n).is_empty(), "not at once: the next refresh");
    let early = run_alive_until(&mut n, now + FABRIC_REFRESH - Duration::from_millis(1));
    assert!(told(&early).is_empty(), "{early:?}");
    let again = run_alive_until(&mut n, now + FABRIC_REFRESH);
    assert_eq!(
        n.mesh().peer(NodeId(1)).map(|p| p.0),
        Some(ConnStatus::Connected)
    );
    assert_eq!(told(&again), vec![(NodeId(1), vec![7, 9])]);
    // Taken this time: the refresh after sends nothing.
    n.handle_cliques_sent(now + FABRIC_REFRESH, NodeId(1), true);
    let after = run_alive_until(&mut n, now + FABRIC_REFRESH * 2);
    assert!(told(&after).is_empty(), "{after:?}");
}

/// Node 0 with its GPUs in clique 7, started: its dial to node 1 (the attempt returned) is in
/// flight when node 1's own session arrives first and carries the pair.
fn crossed() -> (Node, Instant, Vec<Hello>, u64) {
    let (mut n, now, hellos) = sim::node::node(Setup::default());
    n.handle_gpu_fabric(now, vec![gpu(0, 7), gpu(1, 7)]);
    let started = sim::node::start(&mut n, now);
    let to_1 = sim::node::dial_attempt(&started, 1).expect("node 1 dialled at start");
    assert_eq!(
        n.handle_session_hello(now, 1, true, &hellos[1]),
        Verdict::Accept
    );
    assert!(n.handle_session_opened(now, 1));
    drain(&mut n);
    (n, now, hellos, to_1)
}

#[test]
fn a_pair_that_moves_to_its_other_session_after_a_change_is_told_again_on_it() {
    let (mut n, now, hellos, to_1) = crossed();
    // The cliques change: the notification goes on node 1's session...
    n.handle_gpu_fabric(now, vec![gpu(0, 7), gpu(1, 9)]);
    assert_eq!(told(&drain(&mut n)), vec![(NodeId(1), vec![7, 9])]);
    // ...then our own dial's answer comes and the pair moves to it (the lower node's dialled
    // session; node 1 closes the one it dialled): what was handed to that one may go with it,
    // so the peer is told again on the one that carries the pair now.
    n.handle_dial_ok(now, NodeId(1), to_1, &hellos[1]);
    let a = drain(&mut n);
    assert_eq!(told(&a), vec![(NodeId(1), vec![7, 9])]);
    assert_eq!(
        n.session_of(NodeId(1)),
        Some(Via::Dialled {
            peer: NodeId(1),
            attempt: to_1
        })
    );
}

#[test]
fn before_any_change_a_pair_that_moves_sessions_sends_nothing() {
    let (mut n, now, hellos, to_1) = crossed();
    n.handle_dial_ok(now, NodeId(1), to_1, &hellos[1]);
    assert!(told(&drain(&mut n)).is_empty());
}
