//! What `ctl --peers` shows, from the node's own tables: per peer the references held for its
//! importers, the imports from it, the unimports owed to it, and its clean-ups with reason,
//! time and counts; the clean-up history stays bounded however often a peer flaps.

mod sim;

use std::time::{Duration, Instant};

use openimex_core::node::{Action, CLEANUPS_KEPT_PER_PEER};
use openimex_core::*;
use sim::node::{Setup, dial_attempt, drain, pages};

const EXPORT: ImportRequest = ImportRequest {
    import_event_id: 3,
    export_uuid: [1; 16],
    index: 0,
    channel: 0,
};

/// Node 0 of 3 with grace time 0, connected both ways to nodes 1 and 2.
struct Three {
    n: Node,
    now: Instant,
    hellos: Vec<Hello>,
    /// The session of the pair with node 1.
    via1: Via,
    /// The last inbound connection number used.
    conn: ConnId,
}

fn connected() -> Three {
    let (mut n, now, hellos) = sim::node::node(Setup {
        grace: Some(Duration::ZERO),
        ..Setup::default()
    });
    let started = sim::node::start(&mut n, now);
    let mut attempt1 = 0;
    for peer in [1u16, 2] {
        let attempt = dial_attempt(&started, peer).expect("dials every peer");
        let h = &hellos[usize::from(peer)];
        n.handle_dial_ok(now, NodeId(peer), attempt, h);
        n.handle_session_hello(now, u64::from(peer), true, h);
        if peer == 1 {
            attempt1 = attempt;
        }
    }
    drain(&mut n);
    Three {
        n,
        now,
        hellos,
        via1: Via::Dialled {
            peer: NodeId(1),
            attempt: attempt1,
        },
        conn: 2,
    }
}

fn of(n: &Node, peer: u16) -> PeerState {
    n.peer_state()
        .into_iter()
        .find(|p| p.node == NodeId(peer))
        .expect("every peer has a row")
}

/// (exports held, imports, unimports pending, clean-ups in all) for `peer`.
fn counts(n: &Node, peer: u16) -> (usize, usize, usize, u64) {
    let p = of(n, peer);
    (
        p.exports_held,
        p.imports,
        p.unimports_pending,
        p.cleanups_total,
    )
}

fn import_from(t: &mut Three, event_id: u64, peer: u16) {
    t.n.handle_driver_event(
        t.now,
        Event::Import {
            event_id,
            channel: 0,
            export_uuid: [2; 16],
            index: 0,
            export_node: NodeId(peer),
        },
    );
    drain(&mut t.n);
}

/// Node 1 dials in again and node 0 redials: the same instance is back.
fn reconnect1(t: &mut Three) {
    let h = t.hellos[1].clone();
    t.conn += 1;
    t.n.handle_session_hello(t.now, t.conn, true, &h);
    // Node 1 dialled in: its session carries the pair, no dial of node 0 needed.
    assert!(t.n.handle_session_opened(t.now, t.conn));
    drain(&mut t.n);
    t.via1 = Via::Accepted { conn: t.conn };
    assert_eq!(t.n.session_of(NodeId(1)), Some(t.via1));
    assert_eq!(of(&t.n, 1).status, ConnStatus::Connected);
}

#[test]
fn counts_follow_an_import_an_unimport_and_a_clean_up() {
    let mut t = connected();
    let rows = t.n.peer_state();
    assert_eq!(
        rows.iter().map(|p| p.node).collect::<Vec<_>>(),
        vec![NodeId(1), NodeId(2)],
        "one row per peer, not this node"
    );
    assert!(rows.iter().all(|p| p.status == ConnStatus::Connected));
    assert_eq!(rows[0].instance, Some(t.hellos[1].instance));
    assert_eq!(counts(&t.n, 1), (0, 0, 0, 0));

    // Exporter side: node 1 imports from node 0, which takes a reference for it.
    t.n.handle_session_import(t.now, 9, Via::Accepted { conn: 1 }, None, EXPORT);
    drain(&mut t.n);
    assert_eq!(
        counts(&t.n, 1).0,
        0,
        "no reference before the describe lands"
    );
    t.n.handle_described(t.now, 9, Ok((77, pages(1))));
    drain(&mut t.n);
    assert_eq!(counts(&t.n, 1), (1, 0, 0, 0));
    assert_eq!(counts(&t.n, 2), (0, 0, 0, 0), "node 2 holds nothing");

    // Importer side: two imports from node 1, one answered so far.
    import_from(&mut t, 40, 1);
    import_from(&mut t, 41, 1);
    assert_eq!(counts(&t.n, 1), (1, 2, 0, 0), "in flight counts");
    for id in [40, 41] {
        t.n.handle_import_answer(t.now, NodeId(1), id, Ok(pages(id)));
    }
    drain(&mut t.n);
    assert_eq!(counts(&t.n, 1), (1, 2, 0, 0));

    // Unimport of 40: node 1 is told and has not confirmed yet.
    t.n.handle_driver_event(
        t.now,
        Event::Unimport {
            unimport_event_id: 90,
            import_event_id: 40,
            export_node: NodeId(1),
        },
    );
    let a = drain(&mut t.n);
    assert!(a.contains(&Action::SendUnimport {
        peer: NodeId(1),
        import_event_id: 40
    }));
    assert_eq!(counts(&t.n, 1), (1, 1, 1, 0));

    // Node 1 is lost; grace time 0 cleans up at once.
    let lost_at = t.now + Duration::from_secs(7);
    t.now = lost_at;
    t.n.handle_session_lost(t.now, t.via1, "reset".into());
    drain(&mut t.n);
    let p = of(&t.n, 1);
    assert_eq!(p.status, ConnStatus::Disconnected);
    assert_eq!(
        (p.exports_held, p.imports),
        (1, 0),
        "fenced at once; the reference held for node 1 goes after the fence margin"
    );
    assert_eq!(p.cleanups[0].cleaned.exports_released, 0);
    assert_eq!(
        p.unimports_pending, 2,
        "the unconfirmed unimport and the dropped held import are owed to node 1 when it is back"
    );
    assert_eq!(p.cleanups_total, 1);
    let c = &p.cleanups[0];
    assert_eq!((c.peer, c.at), (NodeId(1), lost_at));
    assert!(c.reason.contains("grace"), "{}", c.reason);
    assert_eq!(
        c.cleaned,
        Cleaned {
            exports_released: 0,
            imports_dropped: 1,
            unimports_finished: 1,
        }
    );
    assert_eq!(counts(&t.n, 2), (0, 0, 0, 0), "node 2 untouched");
    assert_eq!(t.n.cleanups().count(), 1);

    // The fence margin (sim config: peer timeout 3 s + two 0.5 s heartbeats) later, the
    // reference held for node 1 is released and the clean-up's record says so. (Node 2 is not
    // answering heartbeats in this harness, so it is lost meanwhile too; only node 1 is checked.)
    t.now += Duration::from_secs(4);
    t.n.handle_timeout(t.now);
    for a in drain(&mut t.n) {
        if let Action::Mesh(mesh::Action::Dial { peer, attempt }) = a {
            sim::node::refused(&mut t.n, t.now, peer, attempt);
            drain(&mut t.n);
        }
    }
    let p = of(&t.n, 1);
    assert_eq!((p.exports_held, p.imports, p.cleanups_total), (0, 0, 1));
    assert_eq!(p.cleanups[0].cleaned.exports_released, 1);

    // Back (same instance): the owed unimports are sent and count until confirmed.
    reconnect1(&mut t);
    assert_eq!(counts(&t.n, 1), (0, 0, 2, 1));
    for id in [40, 41] {
        t.n.handle_unimport_delivered(t.now, NodeId(1), id, true);
    }
    drain(&mut t.n);
    assert_eq!(counts(&t.n, 1), (0, 0, 0, 1));
}

#[test]
fn a_flapping_peer_keeps_a_bounded_history_and_a_total() {
    let mut t = connected();
    let flaps = CLEANUPS_KEPT_PER_PEER + 5;
    let mut last = t.now;
    for _ in 0..flaps {
        t.now += Duration::from_secs(1);
        last = t.now;
        t.n.handle_session_lost(t.now, t.via1, "reset".into());
        drain(&mut t.n);
        reconnect1(&mut t);
    }
    let p = of(&t.n, 1);
    assert_eq!(p.cleanups_total, flaps as u64);
    assert_eq!(p.cleanups.len(), CLEANUPS_KEPT_PER_PEER);
    assert_eq!(
        p.cleanups.last().map(|c| c.at),
        Some(last),
        "the latest kept"
    );
    assert!(
        p.cleanups.windows(2).all(|w| w[0].at < w[1].at),
        "oldest first"
    );
    assert_eq!(t.n.cleanups().count(), CLEANUPS_KEPT_PER_PEER);
    assert_eq!(of(&t.n, 2).cleanups_total, 0);
}
