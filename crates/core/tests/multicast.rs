//! Multicast across trays through the daemons (`docs/reference/driver-interface.md` §1.6 "Multicast
//! (NVLS) across nodes" 3-4): the importer's REMOTE_GPU_ATTACH goes to the prime's node, whose
//! daemon calls ATTACH_REMOTE_GPU (which fails the prime itself when it refuses), or
//! SET_FAILURE on an error of its own; an unproven sender touches nothing.

mod sim;

use std::time::Duration;

use openimex_core::node::Action;
use openimex_core::*;
use sim::node::{Setup, dial_attempt, drain};

fn attach(export_node: u16) -> RemoteGpuAttach {
    RemoteGpuAttach {
        event_id: 5,
        channel: 2,
        export_uuid: [4; 16],
        index: 0,
        export_node: NodeId(export_node),
        gpu_probe_handle: 1 << 63 | 1 << 32,
        key: 8,
        clique_id: 1,
        bw_mode: 0,
        bw_mode_epoch: 0,
        page_size: 2 << 20,
    }
}

/// Node 0 of 3, READY, connected to node 1 only.
fn node0() -> (Node, std::time::Instant) {
    let (mut n, now, hellos) = sim::node::node(Setup {
        grace: Some(Duration::ZERO),
        ..Setup::default()
    });
    let started = sim::node::start(&mut n, now);
    let attempt = dial_attempt(&started, 1).expect("dials node 1");
    n.handle_dial_ok(now, NodeId(1), attempt, &hellos[1]);
    n.handle_session_hello(now, 1, true, &hellos[1]);
    drain(&mut n);
    (n, now)
}

#[test]
fn the_importer_forwards_the_attach_to_the_prime_node_when_connected() {
    let (mut n, now) = node0();
    n.handle_driver_event(now, Event::RemoteGpuAttach(attach(1)));
    assert_eq!(
        drain(&mut n),
        vec![Action::SendRemoteGpuAttach {
            peer: NodeId(1),
            attach: attach(1),
        }]
    );
    // Node 2 is not connected: nothing is sent, the refusal is counted.
    n.handle_driver_event(now, Event::RemoteGpuAttach(attach(2)));
    let actions = drain(&mut n);
    assert!(
        matches!(
            actions.as_slice(),
            [Action::Refused {
                reason: "multicast attach: owner not connected",
                ..
            }]
        ),
        "{actions:?}"
    );
}

#[test]
fn the_owner_attaches_the_remote_gpu_and_passes_the_drivers_answer_on() {
    let (mut n, now) = node0();
    n.handle_session_remote_gpu_attach(now, 7, Via::Accepted { conn: 1 }, None, attach(0));
    assert_eq!(
        drain(&mut n),
        vec![Action::AttachRemoteGpu {
            request: 7,
            from: NodeId(1),
            attach: attach(0),
        }]
    );
    n.handle_remote_gpu_attached(now, 7, &attach(0), Ok(()));
    assert_eq!(
        drain(&mut n),
        vec![Action::AnswerRemoteGpuAttach {
            request: 7,
            result: Ok(()),
        }]
    );
    let refused = ImportError::new(Status::InvalidArgument, "page size");
    n.handle_remote_gpu_attached(now, 8, &attach(0), Err(refused.clone()));
    assert_eq!(
        drain(&mut n),
        vec![Action::AnswerRemoteGpuAttach {
            request: 8,
            result: Err(refused),
        }],
        "the driver failed the prime itself: no SET_FAILURE over its status"
    );
}

/// A daemon that is not READY cannot attach: it fails the prime (SET_FAILURE) so that every
/// member learns it, and refuses the peer.
#[test]
fn an_owner_not_ready_fails_the_prime() {
    let (mut n, now, hellos) = sim::node::node(Setup::default());
    n.handle_start(now);
    drain(&mut n);
    n.handle_session_hello(now, 1, true, &hellos[1]);
    drain(&mut n);
    n.handle_session_remote_gpu_attach(now, 4, Via::Accepted { conn: 1 }, None, attach(0));
    let actions = drain(&mut n);
    assert!(
        matches!(
            actions.as_slice(),
            [
                Action::SetMulticastFailure {
                    export_uuid,
                    index: 0,
                    // The importer's channel: the daemon's dup of the prime's export names it.
                    channel: 2,
                    status: Status::InvalidState,
                },
                Action::AnswerRemoteGpuAttach {
                    request: 4,
                    result: Err(_),
                },
            ] if *export_uuid == [4; 16]
        ),
        "{actions:?}"
    );
}

#[test]
fn an_attach_no_session_proves_touches_no_prime() {
    let (mut n, now) = node0();
    n.handle_session_remote_gpu_attach(now, 9, Via::Accepted { conn: 77 }, None, attach(0));
    let actions = drain(&mut n);
    assert!(
        !actions.iter().any(|a| matches!(
            a,
            Action::SetMulticastFailure { .. } | Action::AttachRemoteGpu { .. }
        )),
        "{actions:?}"
    );
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::AnswerRemoteGpuAttach {
                request: 9,
                result: Err(_)
            }
        )),
        "{actions:?}"
    );
}
