//! `IMEX_CONN_WAIT_TIMEOUT` (`NodeConfig::conn_wait_timeout`): the bound on the FULL quorum's
//! start-up wait for peers, driven on virtual time. It ends WAITING_FOR_PEERS with a warning
//! naming the missing peers; it never shortens the RECOVERY wait.

mod sim;

use std::time::{Duration, Instant};

use openimex_core::node::Action;
use openimex_core::*;
use sim::node::{Setup, drain};

const SEC: Duration = Duration::from_secs(1);

fn node(
    quorum: QuorumPolicy,
    timeout: Option<Duration>,
    recover: Vec<NodeId>,
) -> (Node, Instant, Vec<Hello>) {
    sim::node::node(Setup {
        quorum,
        conn_wait_timeout: timeout,
        recover_from: recover,
        recovery_wait: 600 * SEC,
        ..Setup::default()
    })
}

fn opens_driver(actions: &[Action]) -> bool {
    actions.contains(&Action::Mesh(mesh::Action::InitDriver))
}

/// Fires every timer due up to `until` (heartbeats, dial retries, the bounds), in order; a
/// connected peer answers every heartbeat at once, so it stays connected.
fn run_until(n: &mut Node, from: Instant, until: Instant) -> Vec<Action> {
    let mut out = Vec::new();
    let mut at = from;
    while let Some(t) = n.poll_timeout() {
        if t > until {
            break;
        }
        at = t.max(at);
        n.handle_timeout(at);
        let step = drain(n);
        for a in &step {
            if let Action::Mesh(mesh::Action::SendHeartbeat { via, .. }) = a {
                n.handle_heartbeat(at, *via);
            }
        }
        out.extend(step);
        out.extend(drain(n));
    }
    out
}

#[test]
fn full_wait_ends_at_the_timeout_naming_the_missing_peers() {
    let (mut n, now, hellos) = node(QuorumPolicy::Full, Some(70 * SEC), Vec::new());
    n.handle_start(now);
    let start = drain(&mut n);
    assert_eq!(n.state(), DaemonState::WaitingForPeers);
    let attempt = sim::node::dial_attempt(&start, 1).expect("a dial to node 1");
    n.handle_dial_ok(now, NodeId(1), attempt, &hellos[1]);
    drain(&mut n);

    let before = run_until(&mut n, now, now + 69 * SEC);
    assert!(!opens_driver(&before), "{before:?}");
    assert_eq!(n.state(), DaemonState::WaitingForPeers);

    let after = run_until(&mut n, now, now + 70 * SEC);
    assert!(
        after.contains(&Action::PeersWaitOver {
            missing: vec![NodeId(2)],
            waited: 70 * SEC
        }),
        "{after:?}"
    );
    assert!(opens_driver(&after), "{after:?}");
    n.handle_driver_ready(now + 70 * SEC);
    assert_eq!(n.state(), DaemonState::Ready);
}

#[test]
fn without_the_key_the_full_wait_has_no_bound() {
    let (mut n, now, _) = node(QuorumPolicy::Full, None, Vec::new());
    n.handle_start(now);
    drain(&mut n);
    let out = run_until(&mut n, now, now + 3600 * SEC);
    assert!(!opens_driver(&out));
    assert!(
        !out.iter()
            .any(|a| matches!(a, Action::PeersWaitOver { .. }))
    );
    assert_eq!(n.state(), DaemonState::WaitingForPeers);
}

#[test]
fn a_full_quorum_before_the_timeout_gives_no_warning() {
    let (mut n, now, hellos) = node(QuorumPolicy::Full, Some(70 * SEC), Vec::new());
    n.handle_start(now);
    let start = drain(&mut n);
    for peer in [1, 2] {
        let attempt = sim::node::dial_attempt(&start, peer).expect("a dial");
        n.handle_dial_ok(now, NodeId(peer), attempt, &hellos[usize::from(peer)]);
    }
    assert!(opens_driver(&drain(&mut n)));
    n.handle_driver_ready(now);
    let later = run_until(&mut n, now, now + 100 * SEC);
    assert!(
        !later
            .iter()
            .any(|a| matches!(a, Action::PeersWaitOver { .. }))
    );
    assert_eq!(n.state(), DaemonState::Ready);
}

#[test]
fn the_timeout_does_not_shorten_the_recovery_wait() {
    let (mut n, now, _) = node(QuorumPolicy::Recovery, Some(SEC), vec![NodeId(2)]);
    n.handle_start(now);
    drain(&mut n);
    assert_eq!(n.state(), DaemonState::WaitingForRecovery);
    let out = run_until(&mut n, now, now + 599 * SEC);
    assert!(!opens_driver(&out), "recovery ended early: {out:?}");
    assert!(
        !out.iter()
            .any(|a| matches!(a, Action::PeersWaitOver { .. }))
    );
    assert_eq!(n.state(), DaemonState::WaitingForRecovery);
    let out = run_until(&mut n, now, now + 600 * SEC);
    assert!(
        opens_driver(&out),
        "the recovery wait's own bound still ends it"
    );
}
