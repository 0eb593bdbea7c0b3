//! A give-back that overtakes its import: an importer that gave up on an import tells the
//! exporter at once, and after a healed partition that give-back (on the new session) can land
//! before the request held on the old connection. The exporter refuses the late request
//! instead of taking a reference nobody will hand back (docs/reference/driver-interface.md §4, "Peer node dies
//! or disconnects": references held for an importer are released only by its unimport or its
//! cleanup, so one taken for an answer that is never read would be held until the importer
//! restarts).

mod sim;

use std::time::Instant;

use openimex_core::node::Action;
use openimex_core::*;
use sim::node::{Setup, drain, peer};

fn import(id: u64) -> ImportRequest {
    ImportRequest {
        import_event_id: id,
        export_uuid: [9; 16],
        index: 0,
        channel: 0,
    }
}

/// Node 0 of a 3-node domain, started, with node 1's session accepted and opened on
/// connection 1 (imports are served only to a CONNECTED peer).
fn node() -> (Node, Instant, Vec<Hello>) {
    let (mut n, now, hellos) = sim::node::node(Setup::default());
    sim::node::start(&mut n, now);
    n.handle_session_hello(now, 1, true, &hellos[1]);
    assert!(n.handle_session_opened(now, 1));
    drain(&mut n);
    (n, now, hellos)
}

fn described(actions: &[Action]) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::DescribeExport { .. }))
}

fn refused(actions: &[Action], request: u64) -> bool {
    actions.iter().any(|a| {
        matches!(a, Action::AnswerImport { request: r, answer: Err(e) }
            if *r == request && e.detail.contains("gave this import up"))
    })
}

#[test]
fn a_request_that_arrives_after_its_give_back_takes_no_reference() {
    let (mut n, now, _) = node();
    let via = Via::Accepted { conn: 1 };
    n.handle_session_unimport(now, 10, via, None, 7);
    assert_eq!(
        drain(&mut n),
        vec![Action::AnswerUnimport {
            request: 10,
            released: false
        }]
    );
    n.handle_session_import(now, 11, via, None, import(7));
    let a = drain(&mut n);
    assert!(refused(&a, 11), "{a:?}");
    assert!(!described(&a), "no describe, so no reference: {a:?}");
    assert_eq!(n.export_refs_held(), 0);
    assert_eq!(n.describes_in_flight(), 0);
    // The mark is used up and names only that import: others go through.
    n.handle_session_import(now, 12, via, None, import(8));
    assert!(described(&drain(&mut n)));
}

#[test]
fn a_give_back_while_describing_cancels_and_leaves_no_mark() {
    let (mut n, now, _) = node();
    let via = Via::Accepted { conn: 1 };
    n.handle_session_import(now, 11, via, None, import(7));
    assert!(described(&drain(&mut n)));
    n.handle_session_unimport(now, 12, via, None, 7);
    drain(&mut n);
    n.handle_described(now, 11, Ok((555, sim::node::pages(1))));
    let a = drain(&mut n);
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::ReleaseExportRefs { refs, .. } if refs[..] == [555])),
        "the reference the describe took is released: {a:?}"
    );
    assert_eq!(n.export_refs_held(), 0);
}

#[test]
fn only_the_importer_instance_that_gave_back_is_refused() {
    let (mut n, now, hellos) = node();
    // Another instance of node 1 (not the one connected here) gives back event 7: it proves
    // nothing about the connected instance's imports.
    let other = PeerId {
        node: NodeId(1),
        instance: InstanceId(peer(&hellos[1]).instance.0 + 1),
    };
    n.handle_peer_unimport(now, 10, other, 7);
    drain(&mut n);
    n.handle_session_import(now, 11, Via::Accepted { conn: 1 }, None, import(7));
    assert!(described(&drain(&mut n)));
    // Node 2's give-back does not refuse node 1's import of the same event ID.
    n.handle_session_hello(now, 2, true, &hellos[2]);
    assert!(n.handle_session_opened(now, 2));
    drain(&mut n);
    n.handle_session_unimport(now, 12, Via::Accepted { conn: 2 }, None, 9);
    drain(&mut n);
    n.handle_session_import(now, 13, Via::Accepted { conn: 1 }, None, import(9));
    assert!(described(&drain(&mut n)));
}
