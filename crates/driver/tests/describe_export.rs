//! The exporting node's side of an import (`docs/reference/driver-interface.md` §1.6 "Daemon
//! A"), its dup, IMPORT_MEM and first DESCRIBE made in one batch: an export's pages are
//! described, and an index beyond the export fails as IMPORT_MEM fails it (the RM's
//! NV_ERR_OUT_OF_RANGE), not as the DESCRIBE of the memory it did not make, which the batch
//! sent too; neither leaves a reference behind. The simulated driver's server, the daemon's
//! backend and an application context in one process.

mod common;

use openimex_client::Context;
use openimex_core::NodeId;
use openimex_driver::nvidia::Nvidia;
use openimex_driver::{Driver, DriverError, Status};
use openimex_simproto::handle::FabricHandle;

#[test]
fn an_export_is_described_and_an_index_beyond_it_fails_at_import_mem() {
    let tray = common::tray("describe-export", 0, 1, [4u8; 16]);
    let nv = Nvidia::open(&tray.node).expect("the backend starts");
    nv.open_session(NodeId(0)).expect("session as node 0");
    let app = Context::open(&tray.node).expect("an application context");
    let memory = app.mem_create(0, 4 << 20).expect("4 MiB on GPU 0");
    let handle = app.export(&memory).expect("exported");
    let handle = FabricHandle::from_bytes(&handle.0).expect("a fabric handle");
    let uuid = handle.export_uuid.0;
    let channel = app.channel().unwrap_or(0);

    let (reference, pages) = nv
        .describe_export(uuid, handle.index, channel)
        .expect("the export described");
    assert_eq!(pages.size, 4 << 20, "{pages:?}");
    assert!(!pages.pfns.is_empty(), "{pages:?}");
    assert_eq!(
        pages.pfns.len() as u64 * pages.page_size,
        pages.size,
        "every page of it"
    );

    match nv.describe_export(uuid, handle.index + 1, channel) {
        Err(DriverError::Refused { status, detail, .. }) => {
            assert_eq!(status, Status::Other, "{detail}");
            assert!(
                detail.contains("RM_CONTROL 0xe00102") && detail.contains("NV_ERR_OUT_OF_RANGE"),
                "IMPORT_MEM's own failure: {detail}"
            );
        }
        other => panic!("an index beyond the export must fail: {other:?}"),
    }
    let held = tray.server().stats();
    assert_eq!(
        (held.daemon_export_refs, held.daemon_export_objects),
        (1, 1),
        "the described export's dups held (its memory and its export object), the failed \
         index's export object freed: {held:?}"
    );
    nv.release_export_ref(reference)
        .expect("the reference released");
    let after = tray.server().stats();
    assert_eq!(
        (after.daemon_export_refs, after.daemon_export_objects),
        (0, 0),
        "nothing left held: {after:?}"
    );
}
