//! The importer's side when the driver refuses a VALIDATE (issue 29, review): pages an
//! exporter described that the driver cannot take (here a page size of 0, which
//! `memoryfabricimportedrefCtrlValidate` refuses) must not leave the application's import
//! pending for ever. The backend then fails the import with IMPORT_FAILED on the same
//! IMPORTED_REF, and the application's import ends with an error at once. Real processes'
//! pieces in one: the simulated driver's server on its socket, the daemon's backend, and an
//! application context.

mod common;

use std::time::{Duration, Instant};

use openimex_client::{Context, FabricHandleBytes};
use openimex_core::NodeId;
use openimex_driver::nvidia::Nvidia;
use openimex_driver::{Driver, Event, Pages};
use openimex_simproto::handle::{ExportUuid, FabricHandle};

#[test]
fn a_validate_the_driver_refuses_fails_the_import_instead_of_leaving_it_pending() {
    let cluster = [3u8; 16];
    let tray = common::tray("validate-fallback", 1, 1, cluster);
    let node = tray.node.clone();
    let nv = Nvidia::open(&node).expect("the backend starts");
    nv.open_session(NodeId(1)).expect("session as node 1");
    // An export of node 0's that an application here imports.
    let handle = FabricHandleBytes(
        FabricHandle {
            export_uuid: ExportUuid::new(7, 0),
            index: 0,
            size: 2 << 20,
            cluster_uuid: cluster,
        }
        .to_bytes(),
    );
    let app_node = node.clone();
    let app = std::thread::spawn(move || {
        let ctx = Context::open(&app_node).expect("an application context");
        let t = Instant::now();
        let r = ctx.import_with_timeout(&handle, Duration::from_secs(20));
        (r.map(drop), t.elapsed())
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let event_id = loop {
        let events = nv.next_events(Duration::from_millis(200)).expect("events");
        if let Some(id) = events.iter().find_map(|e| match e {
            Event::Import { event_id, .. } => Some(*event_id),
            _ => None,
        }) {
            break id;
        }
        assert!(Instant::now() < deadline, "no MEM_IMPORT event");
    };
    let bad = Pages {
        size: 2 << 20,
        page_size: 0,
        pfns: vec![1],
        clique_id: 1,
        bw_mode: 0,
        bw_mode_epoch: 0,
        kind: 0,
        phys_addr_space: 0,
        compression_coverage: 0,
        mem_flags: 0,
    };
    nv.validate_import(event_id, Ok(bad))
        .expect("the refused VALIDATE is answered with IMPORT_FAILED");
    let (result, took) = app.join().expect("the application thread");
    assert!(result.is_err(), "the import must fail, not succeed");
    assert!(
        took < Duration::from_secs(15),
        "the import ended with the failure, not by timing out ({took:?})"
    );
    let stats = tray.server().stats();
    assert_eq!(stats.import_descriptors, 0, "{stats:?}");
    drop(nv);
}
