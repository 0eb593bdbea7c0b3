//! Peer loss with a grace time (`IMEX_NODE_DISCONNECTED_GRACE_TIME`, docs/reference/imex-guide.md §1 and
//! "Connections, Quorum, and Clean up"; docs/reference/driver-interface.md §4 "Peer node dies or
//! disconnects"): -1 waits forever, 0 cleans up at once, N seconds cleans up after N. Clean-up
//! disables the local importers of the peer's memory and drops the references held for it; the
//! matrix shows R before and D after. The same instance back within the grace time loses
//! nothing. The fence (disabling the local importers) comes at the grace time, the release of
//! the references a fence margin (peer timeout + two heartbeat intervals) later, so a peer
//! behind a partition, whose own grace timer runs at most that much behind ours, has fenced its
//! importers before the memory they map can be freed here; and no sooner than a dial timeout, a
//! grace time and a margin after the last hello of the peer we answered.

mod sim;

use std::time::{Duration, Instant};

use openimex_core::node::Action;
use openimex_core::*;
use sim::node::{Setup, dial_attempt, drain, pages};

const SEC: Duration = Duration::from_secs(1);
/// The fence margin of the sim config: its peer timeout (3 s) plus two heartbeat intervals
/// (0.5 s each).
const MARGIN: Duration = Duration::from_millis(4000);

struct One {
    n: Node,
    now: Instant,
    hellos: Vec<Hello>,
    /// The attempt of node 0's live session to node 1.
    attempt: u64,
    /// Node 1 answers dials and heartbeats.
    up: bool,
}

/// Node 0 of a 2-node domain with `grace`, connected to node 1, holding one reference for
/// node 1's import.
fn connected(grace: Option<Duration>) -> One {
    let (mut n, now, hellos) = sim::node::node(Setup {
        nodes: 2,
        grace,
        ..Setup::default()
    });
    let attempt = dial_attempt(&sim::node::start(&mut n, now), 1).expect("dials node 1");
    n.handle_dial_ok(now, NodeId(1), attempt, &hellos[1]);
    n.handle_session_hello(now, 1, true, &hellos[1]);
    let import = ImportRequest {
        import_event_id: 3,
        export_uuid: [1; 16],
        index: 0,
        channel: 0,
    };
    n.handle_session_import(now, 9, Via::Accepted { conn: 1 }, None, import);
    n.handle_described(now, 9, Ok((77, pages(1))));
    drain(&mut n);
    assert_eq!(n.export_refs_held(), 1);
    One {
        n,
        now,
        hellos,
        attempt,
        up: true,
    }
}

/// Performs the node's pending actions as node 1 would answer them; returns them.
fn pump(o: &mut One) -> Vec<Action> {
    let mut out = Vec::new();
    let mut batch = drain(&mut o.n);
    while !batch.is_empty() {
        let mut next = Vec::new();
        for a in &batch {
            match a {
                Action::Mesh(mesh::Action::Dial { peer, attempt }) if o.up => {
                    o.attempt = *attempt;
                    let h = o.hellos[1].clone();
                    o.n.handle_dial_ok(o.now, *peer, *attempt, &h);
                }
                Action::Mesh(mesh::Action::Dial { peer, attempt }) => {
                    sim::node::refused(&mut o.n, o.now, *peer, *attempt);
                }
                Action::Mesh(mesh::Action::SendHeartbeat { via, .. }) if o.up => {
                    o.n.handle_heartbeat(o.now, *via);
                }
                _ => {}
            }
            next.extend(drain(&mut o.n));
        }
        out.append(&mut batch);
        batch = next;
    }
    out
}

/// Advances by `d`, firing every timer on the way; returns the actions.
fn run(o: &mut One, d: Duration) -> Vec<Action> {
    let until = o.now + d;
    let mut out = pump(o);
    while let Some(t) = o.n.poll_timeout().filter(|t| *t <= until) {
        o.now = o.now.max(t);
        o.n.handle_timeout(o.now);
        out.extend(pump(o));
    }
    o.now = until;
    out
}

fn lose(o: &mut One) {
    // Connected for longer than a dial timeout first: the release also waits for the answer to
    // the peer's hello to have settled (`node/grace.rs`), which these tests do not exercise.
    run(o, 4 * SEC);
    o.up = false;
    o.n.handle_session_lost(
        o.now,
        Via::Dialled {
            peer: NodeId(1),
            attempt: o.attempt,
        },
        "reset".into(),
    );
    drain(&mut o.n);
    assert_eq!(o.n.links()[1].status, ConnStatus::Recovering);
}

fn fenced(actions: &[Action]) -> bool {
    actions.contains(&Action::DisableImporters { node: NodeId(1) })
}

fn released(actions: &[Action]) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::ReleaseExportRefs { refs, ack: None } if refs[..] == [77]))
}

fn cleaned(actions: &[Action]) -> bool {
    fenced(actions) && released(actions)
}

#[test]
fn grace_n_cleans_up_after_n_seconds_and_shows_disconnected() {
    let mut o = connected(Some(30 * SEC));
    lose(&mut o);
    let before = run(&mut o, 29 * SEC);
    assert!(
        !cleaned(&before),
        "nothing before the grace time: {before:?}"
    );
    assert_eq!(o.n.export_refs_held(), 1);
    assert_eq!(o.n.links()[1].status, ConnStatus::Recovering, "R before");
    let fence = run(&mut o, 2 * SEC);
    assert!(fenced(&fence), "fenced at the grace time: {fence:?}");
    assert!(
        !released(&fence),
        "released only after the margin: {fence:?}"
    );
    assert_eq!(o.n.export_refs_held(), 1);
    assert_eq!(o.n.links()[1].status, ConnStatus::Disconnected, "D after");
    let release = run(&mut o, MARGIN);
    assert!(released(&release), "{release:?}");
    assert_eq!(o.n.export_refs_held(), 0);
    let c: Vec<_> = o.n.cleanups().collect();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].peer, NodeId(1));
    assert!(c[0].reason.contains("grace"));
    assert_eq!(
        c[0].cleaned.exports_released, 1,
        "the release is on the record"
    );
}

/// Two daemons that lose each other in a partition detect it up to a peer timeout apart. The
/// importer side fences at its grace time; the exporter side must not release (letting the
/// memory be freed and reused) before that, whichever detected first.
#[test]
fn a_partitioned_importer_fences_before_the_exporter_releases() {
    let grace = 10 * SEC;
    let peer_timeout = 3 * SEC;
    // Worst case: the exporter (node 0 here) noticed the loss at once (a reset), the importer
    // a whole peer timeout and heartbeat later.
    let mut exporter = connected(Some(grace));
    let lost_at = exporter.now;
    lose(&mut exporter);
    let importer_fences_at = lost_at + peer_timeout + Duration::from_millis(500) + grace;
    let before = run(&mut exporter, importer_fences_at - lost_at);
    assert!(
        !released(&before),
        "released before the importer fenced: {before:?}"
    );
    assert_eq!(exporter.n.export_refs_held(), 1);
    let after = run(&mut exporter, Duration::from_millis(500));
    assert!(released(&after), "released a heartbeat after: {after:?}");
}

#[test]
fn the_same_instance_back_between_fence_and_release_keeps_its_references() {
    let mut o = connected(Some(5 * SEC));
    lose(&mut o);
    let fence = run(&mut o, 5 * SEC);
    assert!(fenced(&fence) && !released(&fence), "{fence:?}");
    // Node 1 dials in again before the margin is over: its importers may be live (it never
    // lost us) or it fenced and its unimports will release the reference; either way node 0
    // must not release it on its own.
    o.up = true;
    o.n.handle_session_hello(o.now, 2, true, &o.hellos[1].clone());
    assert!(
        o.n.handle_session_opened(o.now, 2),
        "its session carries the pair"
    );
    let mut later = run(&mut o, Duration::ZERO);
    assert_eq!(o.n.links()[1].status, ConnStatus::Connected);
    later.extend(run(&mut o, 60 * SEC));
    assert!(!released(&later), "{later:?}");
    assert_eq!(o.n.export_refs_held(), 1);
}

#[test]
fn grace_zero_cleans_up_at_once() {
    let mut o = connected(Some(Duration::ZERO));
    // Past a dial timeout after the hello (see `lose`).
    run(&mut o, 4 * SEC);
    o.n.handle_session_lost(
        o.now,
        Via::Dialled {
            peer: NodeId(1),
            attempt: o.attempt,
        },
        "reset".into(),
    );
    let at_once = drain(&mut o.n);
    assert!(fenced(&at_once), "fenced at once: {at_once:?}");
    assert_eq!(o.n.export_refs_held(), 1, "released after the margin only");
    o.up = false;
    let release = run(&mut o, MARGIN);
    assert!(released(&release), "{release:?}");
    assert_eq!(o.n.export_refs_held(), 0);
}

#[test]
fn grace_forever_never_cleans_up() {
    let mut o = connected(None);
    lose(&mut o);
    let hour = run(&mut o, 3600 * SEC);
    assert!(!cleaned(&hour));
    assert_eq!(o.n.export_refs_held(), 1);
    assert_eq!(o.n.cleanups().count(), 0);
}

#[test]
fn the_same_instance_back_within_the_grace_time_loses_nothing() {
    let mut o = connected(Some(30 * SEC));
    lose(&mut o);
    let mut actions = run(&mut o, 10 * SEC);
    // Node 1 dials in again (same instance): its session brings the link back at once.
    o.up = true;
    o.n.handle_session_hello(o.now, 2, true, &o.hellos[1].clone());
    assert!(
        o.n.handle_session_opened(o.now, 2),
        "its session carries the pair"
    );
    actions.extend(run(&mut o, Duration::ZERO));
    assert_eq!(o.n.links()[1].status, ConnStatus::Connected);
    actions.extend(run(&mut o, 60 * SEC));
    assert!(!cleaned(&actions), "{actions:?}");
    assert_eq!(o.n.export_refs_held(), 1);
}

#[test]
fn after_a_clean_up_the_same_instance_back_is_told_to_drop_what_it_held_for_us() {
    let mut o = connected(Some(5 * SEC));
    // Node 0 also imports from node 1, and holds that import.
    o.n.handle_driver_event(
        o.now,
        Event::Import {
            event_id: 40,
            channel: 0,
            export_uuid: [2; 16],
            index: 0,
            export_node: NodeId(1),
        },
    );
    drain(&mut o.n);
    o.n.handle_import_answer(o.now, NodeId(1), 40, Ok(pages(9)));
    drain(&mut o.n);
    lose(&mut o);
    let cleanup = run(&mut o, 6 * SEC + MARGIN);
    assert!(cleaned(&cleanup), "{cleanup:?}");
    // Node 1 was only partitioned: back as the same instance, it still holds a reference for
    // node 0's import 40, which node 0 has dropped. Node 0 tells it.
    o.up = true;
    o.n.handle_session_hello(o.now, 3, true, &o.hellos[1].clone());
    assert!(
        o.n.handle_session_opened(o.now, 3),
        "its session carries the pair"
    );
    let back = run(&mut o, Duration::ZERO);
    assert!(
        back.contains(&Action::SendUnimport {
            peer: NodeId(1),
            import_event_id: 40
        }),
        "{back:?}"
    );
    assert_eq!(o.n.links()[1].status, ConnStatus::Connected);
}
