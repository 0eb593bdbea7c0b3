//! The daemon's whole call sequence (`docs/reference/driver-interface.md` §1.6) through escapes, on
//! an exporting node A and an importing node B, at the layout of each driver family: start-up
//! (version, client, GPUs, Device/Subdevice, OS event, session), an application's import
//! served by dup by UUID + IMPORT_MEM + DESCRIBE in chunks on A and IMPORTED_REF + VALIDATE
//! in chunks on B, the unimport handshake, DISABLE_IMPORTERS and the frees.

use openimex_rmabi::Layout;
use openimex_rmabi::class::client::{NV0080_ALLOC_PARAMETERS, NV2080_ALLOC_PARAMETERS};
use openimex_rmabi::class::nv00e0::NV00E0_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::nv00f1::NV00F1_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::nv00fb::NV00FB_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::{
    NV_IMEX_SESSION, NV_MEMORY_EXPORT, NV_MEMORY_FABRIC_IMPORTED_REF, NV01_DEVICE_0,
    NV20_SUBDEVICE_0,
};
use openimex_rmabi::ctrl::nv0000::{
    NV0000_CTRL_CMD_GPU_ATTACH_IDS, NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2,
    NV0000_CTRL_CMD_GPU_GET_PROBED_IDS, NV0000_CTRL_GPU_ATTACH_IDS_PARAMS,
    NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, parse_probed_ids,
};
use openimex_rmabi::ctrl::nv00e0::{
    NV00E0_ADDR_SPACE_TYPE_FABRIC, NV00E0_CTRL_CMD_IMPORT_MEM, NV00E0_CTRL_IMPORT_MEM_PARAMS,
};
use openimex_rmabi::ctrl::nv00f1::{
    NV00F1_CTRL_CMD_DISABLE_IMPORTERS, NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT,
    NV00F1_CTRL_CMD_GET_FABRIC_EVENTS, NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS,
    NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS,
};
use openimex_rmabi::ctrl::nv00f8::{Describe, NV00F8_CTRL_CMD_DESCRIBE};
use openimex_rmabi::ctrl::nv00fb::{NV00FB_CTRL_CMD_VALIDATE, Validate};
use openimex_rmabi::escape::{NV_RM_API_VERSION_CMD_QUERY, NV_RM_API_VERSION_REPLY_RECOGNIZED};
use openimex_rmabi::event::parse_fabric_events_params;
use openimex_rmabi::status::{NV_ERR_OUT_OF_RANGE, NV_OK};
use openimex_rmabi::{FabricEvent, NvHandle};
use openimex_simproto::handle::FabricHandle;
use openimex_simproto::proto::{NO_NODE, PAGE_SIZE};
use std::os::fd::OwnedFd;
use zerocopy::{FromBytes, IntoBytes};

use super::*;
use crate::fla::GpuAddr;
use crate::rm::{ImportState, Released};

/// A daemon after start-up (§1.6 "Start-up").
pub(super) struct Daemon {
    pub(super) f: File,
    pub(super) h: NvHandle,
    pub(super) session: NvHandle,
    pub(super) event: OwnedFd,
    /// (Device, Subdevice) of each GPU, by index.
    pub(super) gpus: Vec<(NvHandle, NvHandle)>,
}

pub(super) const SESSION: NvHandle = 0x5e55;

/// Start-up as the daemon does it on `node` as IMEX node `node_id`.
pub(super) fn start(node: &mut Node, f: File, node_id: u16) -> Daemon {
    // 1. The version check: QUERY returns the driver's version (`RmPerformVersionCheck`).
    let (errno, v) = node.check_version(f, NV_RM_API_VERSION_CMD_QUERY, "");
    assert_eq!((errno, v.reply), (0, NV_RM_API_VERSION_REPLY_RECOGNIZED));
    assert_eq!(v.version(), node.api.config().version);
    // 2. The root client, the GPUs, a Device and a Subdevice per GPU.
    let h = node.client(f);
    let layout = node.api.config().layout;
    let (s, probed) = node.control(
        f,
        h,
        h,
        NV0000_CTRL_CMD_GPU_GET_PROBED_IDS,
        &vec![0; layout.probed_ids_params_size()],
    );
    assert_eq!(s, NV_OK);
    let ids = parse_probed_ids(layout, &probed).unwrap();
    assert_eq!(ids, [0x100, 0x200], "0x100 * (index + 1)");
    let attach = NV0000_CTRL_GPU_ATTACH_IDS_PARAMS::new(&ids).unwrap();
    let (s, _) = node.control(f, h, h, NV0000_CTRL_CMD_GPU_ATTACH_IDS, attach.as_bytes());
    assert_eq!(s, NV_OK);
    let mut gpus = Vec::new();
    for (i, id) in (0u32..).zip(ids) {
        let q = NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS {
            gpuId: id,
            ..Default::default()
        };
        let (s, out) = node.control(f, h, h, NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2, q.as_bytes());
        assert_eq!(s, NV_OK);
        let info = NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS::read_from_bytes(&out).unwrap();
        assert_eq!((info.deviceInstance, info.subDeviceInstance), (i, 0));
        let dev = NV0080_ALLOC_PARAMETERS {
            deviceId: info.deviceInstance,
            ..Default::default()
        };
        let (s, hd, _) = node.alloc(
            f,
            h,
            h,
            0x1000 + i,
            NV01_DEVICE_0,
            dev.as_bytes(),
            Vec::new(),
        );
        assert_eq!(s, NV_OK, "{}", node.trace);
        let sub = NV2080_ALLOC_PARAMETERS { subDeviceId: 0 };
        let (s, hs, _) = node.alloc(
            f,
            h,
            hd,
            0x2000 + i,
            NV20_SUBDEVICE_0,
            sub.as_bytes(),
            Vec::new(),
        );
        assert_eq!(s, NV_OK, "{}", node.trace);
        gpus.push((hd, hs));
    }
    // 3-5. The OS event, then the session with the capability's descriptor.
    let (event, passed) = eventfd();
    assert_eq!(node.alloc_os_event(f, h, EVENT_FD, Some(passed)), NV_OK);
    assert_eq!(node.trace, "ALLOC_OS_EVENT - params=0 status=NV_OK");
    let p = NV00F1_ALLOCATION_PARAMETERS {
        capDescriptor: CAP_FD as u64,
        pOsEvent: EVENT_FD as u64,
        nodeId: node_id,
        ..Default::default()
    };
    let cap = node.cap_fd();
    let (s, hs, _) = node.alloc(
        f,
        h,
        h,
        SESSION,
        NV_IMEX_SESSION,
        p.as_bytes(),
        vec![(CAP_FD, cap)],
    );
    assert_eq!((s, hs), (NV_OK, SESSION), "{}", node.trace);
    assert_eq!(node.trace, "RM_ALLOC 0xf1 params=32 status=NV_OK");
    assert_eq!(node.rm.node_id(), node_id);
    Daemon {
        f,
        h,
        session: SESSION,
        event,
        gpus,
    }
}

/// GET_FABRIC_EVENTS once: the events and `bMoreEvents`, decoded in the node's layout.
pub(super) fn get_events(node: &mut Node, d: &Daemon) -> (Vec<FabricEvent>, bool) {
    let layout = node.api.config().layout;
    let (s, out) = node.control(
        d.f,
        d.h,
        d.session,
        NV00F1_CTRL_CMD_GET_FABRIC_EVENTS,
        &vec![0; layout.fabric_events_params_size()],
    );
    assert_eq!(s, NV_OK, "{}", node.trace);
    parse_fabric_events_params(layout, &out).unwrap()
}

/// The whole unicast sequence at driver `version`, with an export of 600 pages (DESCRIBE and
/// VALIDATE take two chunks of at most 512 PFNs).
fn unicast_sequence(version: &str, name: &str) {
    let domain = Domain::new(name);
    let mut a = domain.node(0, version);
    let mut b = domain.node(1, version);
    let layout = a.api.config().layout;
    let da = start(&mut a, file(1), 0);
    let db = start(&mut b, file(1), 1);

    // The application on A exports 600 pages of GPU 1 (after a first allocation, so that
    // the offset is not 0); the application on B imports them with import ID 5.
    let exporter = a.app(0);
    a.rm.create(exporter, 1, 2 * MIB).unwrap();
    let created = a.rm.create(exporter, 1, 600 * PAGE_SIZE).unwrap();
    let handle = a.rm.export(exporter, created.mem).unwrap();
    let uuid = FabricHandle::from_hex(&handle).unwrap().export_uuid;
    let importer = b.app(0);
    let import = b.rm.import(importer, &handle, 5).unwrap();
    assert_eq!(b.rm.wait_import(importer, import), Ok(ImportState::Pending));

    // B's daemon is woken (`osSetEvent` on the eventfd, which the server does after every
    // change, from whichever thread made it) and finds MEM_IMPORT.
    assert_eq!(posts(&db.event), 0, "nothing posted yet");
    b.api.post_os_event(&b.rm);
    assert!(posts(&db.event) >= 1, "the OS event was signalled");
    b.api.post_os_event(&b.rm);
    assert_eq!(posts(&db.event), 0, "one signal per batch of new events");
    let (events, more) = get_events(&mut b, &db);
    assert!(!more);
    assert_eq!(
        b.trace,
        format!(
            "RM_CONTROL 0xf10001 params={} status=NV_OK",
            layout.fabric_events_params_size()
        )
    );
    let [
        FabricEvent::Import {
            id: import_event,
            channel,
            import_id,
            index,
            export_node,
            export_uuid,
        },
    ] = events[..]
    else {
        panic!("one MEM_IMPORT expected, got {events:?}");
    };
    assert_eq!(
        (channel, import_id, index, export_node, export_uuid),
        (0, 5, 0, 0, uuid.0)
    );

    // A's daemon: dup by UUID with the importer's channel; the cached parameters come back.
    let dup = NV00E0_ALLOCATION_PARAMETERS::dup_by_uuid(uuid.0, channel);
    let (s, h_export, out) = a.alloc(
        da.f,
        da.h,
        da.h,
        0xE001,
        NV_MEMORY_EXPORT,
        dup.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_OK, "{}", a.trace);
    let cached = NV00E0_ALLOCATION_PARAMETERS::read_from_bytes(&out).unwrap();
    assert_eq!(cached.packet.uuid, uuid.0);
    assert_eq!((cached.numMaxHandles, cached.numCurHandles), (1, 1));
    assert_eq!(cached.deviceInstanceMask, 1 << 1, "the memory is on GPU 1");
    // IMPORT_MEM: the fabric memory dup, parented to the daemon's Subdevice of GPU 1.
    let im = NV00E0_CTRL_IMPORT_MEM_PARAMS::new(0, &[0xF801]).unwrap();
    let (s, out) = a.control(
        da.f,
        da.h,
        h_export,
        NV00E0_CTRL_CMD_IMPORT_MEM,
        im.as_bytes(),
    );
    assert_eq!(s, NV_OK, "{}", a.trace);
    let im = NV00E0_CTRL_IMPORT_MEM_PARAMS::read_from_bytes(&out).unwrap();
    assert_eq!(im.memInfos[0].hParent, da.gpus[1].1);
    assert_eq!(im.memInfos[0].addrSpace, NV00E0_ADDR_SPACE_TYPE_FABRIC);
    // DESCRIBE at 0 and 512: 600 PFNs, the fabric addresses of the allocation >> 21.
    let first_pfn = (GpuAddr { node: 0, gpu: 1 }.base() + created.location.offset) >> 21;
    let mut chunks = Vec::new();
    for offset in [0, 512] {
        let (s, out) = a.control(
            da.f,
            da.h,
            0xF801,
            NV00F8_CTRL_CMD_DESCRIBE,
            &Describe::request(layout, offset),
        );
        assert_eq!(s, NV_OK, "{}", a.trace);
        let d = Describe::decode(layout, &out).unwrap();
        assert_eq!(d.total_pfns, 600);
        assert_eq!(d.attrs.page_size, PAGE_SIZE);
        assert_eq!(d.attrs.size, 600 * PAGE_SIZE);
        assert_eq!(d.attrs.clique_id, 1);
        let want: Vec<u32> = (offset..600.min(offset + 512))
            .map(|k| (first_pfn + k) as u32)
            .collect();
        assert_eq!(d.pfns, want);
        chunks.push(d);
    }
    let (s, _) = a.control(
        da.f,
        da.h,
        0xF801,
        NV00F8_CTRL_CMD_DESCRIBE,
        &Describe::request(layout, 600),
    );
    assert_eq!(s, NV_ERR_OUT_OF_RANGE, "offset past the PFNs");

    // B's daemon: the imported reference, then VALIDATE in the same two chunks.
    let r = NV00FB_ALLOCATION_PARAMETERS {
        exportUuid: uuid.0,
        index: 0,
        id: 5,
        ..Default::default()
    };
    let (s, h_ref, _) = b.alloc(
        db.f,
        db.h,
        db.h,
        0xFB01,
        NV_MEMORY_FABRIC_IMPORTED_REF,
        r.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_OK, "{}", b.trace);
    for (i, d) in chunks.iter().enumerate() {
        let v = Validate {
            attrs: d.attrs,
            phys_attrs: d.phys_attrs,
            offset: d.offset,
            total_pfns: d.total_pfns,
            pfns: d.pfns.clone(),
            mem_flags: d.mem_flags,
            ..Default::default()
        };
        let (s, out) = b.control(
            db.f,
            db.h,
            h_ref,
            NV00FB_CTRL_CMD_VALIDATE,
            &v.encode(layout).unwrap(),
        );
        assert_eq!(s, NV_OK, "{}", b.trace);
        let done = Validate::decode(layout, &out).unwrap().done;
        assert_eq!(done, i == 1, "bDone once every PFN is in");
        if i == 0 {
            assert_eq!(b.rm.wait_import(importer, import), Ok(ImportState::Pending));
        }
    }
    // The application's import completes at the exporter's memory.
    let Ok(ImportState::Ready(loc)) = b.rm.wait_import(importer, import) else {
        panic!("import not ready");
    };
    assert_eq!(
        (loc.file, loc.offset, loc.size),
        (
            created.location.file.clone(),
            created.location.offset,
            created.location.size
        )
    );
    // Freeing the reference posts nothing.
    posts(&db.event);
    assert_eq!(b.free(db.f, db.h, h_ref), NV_OK);
    assert_eq!(posts(&db.event), 0);
    assert_eq!(get_events(&mut b, &db).0, []);

    // Unimport: the application's release blocks until FINISH_MEM_UNIMPORT names it.
    let Ok(Released::Unimporting(unimport)) = b.rm.release(importer, import) else {
        panic!("the last release of a remote import unimports");
    };
    b.api.post_os_event(&b.rm);
    assert!(posts(&db.event) >= 1);
    let (events, _) = get_events(&mut b, &db);
    assert_eq!(
        events,
        [FabricEvent::Unimport {
            id: unimport,
            channel: 0,
            import_event_id: import_event,
            export_node: 0
        }]
    );
    assert!(b.rm.unimport_pending(unimport));
    let fin = NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS::new(&[unimport]).unwrap();
    let (s, _) = b.control(
        db.f,
        db.h,
        db.session,
        NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT,
        fin.as_bytes(),
    );
    assert_eq!(s, NV_OK);
    assert!(
        !b.rm.unimport_pending(unimport),
        "the blocked releaser is released"
    );

    // A: the exporter frees its memory; the daemon's dups keep it until they go.
    a.rm.release(exporter, created.mem).unwrap();
    assert_eq!(a.rm.stats().allocations, 2, "held by the daemon's dups");
    assert_eq!(a.free(da.f, da.h, 0xF801), NV_OK);
    assert_eq!(a.rm.stats().allocations, 2, "the export dup still holds it");
    assert_eq!(a.free(da.f, da.h, h_export), NV_OK);
    assert_eq!(a.rm.stats().allocations, 1);
    assert_eq!(a.rm.stats().exports, 0, "out of the export cache");

    // DISABLE_IMPORTERS of A's node on B (nothing imported from it any more).
    let p = NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS { nodeId: 0 };
    let (s, _) = b.control(
        db.f,
        db.h,
        db.session,
        NV00F1_CTRL_CMD_DISABLE_IMPORTERS,
        p.as_bytes(),
    );
    assert_eq!(s, NV_OK);

    // Freeing the clients tears the sessions down (§4): node IDs back to 0xFFFF.
    assert_eq!(a.free(da.f, da.h, da.h), NV_OK);
    assert_eq!(b.free(db.f, db.h, db.h), NV_OK);
    for n in [&a, &b] {
        let st = n.rm.stats();
        assert!(!st.session);
        assert_eq!(st.node_id, NO_NODE);
        assert_eq!(st.daemon_export_refs, 0);
    }
}

#[test]
fn the_daemon_sequence_serves_an_import_at_595() {
    unicast_sequence("595.45.04", "seq-595");
}

#[test]
fn the_same_sequence_at_an_older_family_decodes_in_its_layout() {
    // 580 and 550 differ from 595 in the event (80 and 64 bytes against 88), the DESCRIBE and
    // VALIDATE blocks (no bwMode in 550) and GET_PROBED_IDS (no gpuFlags in 550).
    assert_eq!(
        openimex_rmabi::layout_for("580.65.06").unwrap(),
        Layout::V580
    );
    assert_eq!(Layout::V580.fabric_event_size(), 80);
    assert_eq!(Layout::V550.fabric_event_size(), 64);
    unicast_sequence("580.65.06", "seq-580");
    unicast_sequence("550.163.01", "seq-550");
}

#[test]
fn a_block_of_one_layout_does_not_decode_in_another() {
    // What the daemon would see if the driver served the wrong family: the sizes differ,
    // so the control is refused before anything is dequeued.
    let domain = Domain::new("wrong-layout");
    let mut b = domain.node(1, "550.163.01");
    let d = start(&mut b, file(1), 1);
    let (s, _) = b.control(
        d.f,
        d.h,
        d.session,
        NV00F1_CTRL_CMD_GET_FABRIC_EVENTS,
        &vec![0; Layout::V595.fabric_events_params_size()],
    );
    assert_eq!(s, openimex_rmabi::status::NV_ERR_INVALID_ARGUMENT);
    assert_eq!(
        b.trace,
        "RM_CONTROL 0xf10001 params=11272 status=NV_ERR_INVALID_ARGUMENT"
    );
}

#[test]
fn events_come_128_at_a_time_with_more_events_set() {
    // `fabricExtractEventsV2`: at most NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE per call,
    // oldest first, `bMoreEvents` while some stay queued.
    let domain = Domain::new("more-events");
    let mut a = domain.node(0, "595.45.04");
    let mut b = domain.node(1, "595.45.04");
    let _da = start(&mut a, file(1), 0);
    let db = start(&mut b, file(1), 1);
    let exporter = a.app(0);
    let created = a.rm.create(exporter, 0, PAGE_SIZE).unwrap();
    let handle = a.rm.export(exporter, created.mem).unwrap();
    let importer = b.app(0);
    for id in 1..=130 {
        b.rm.import(importer, &handle, id).unwrap();
    }
    let (first, more) = get_events(&mut b, &db);
    assert_eq!((first.len(), more), (128, true));
    let (rest, more) = get_events(&mut b, &db);
    assert_eq!((rest.len(), more), (2, false));
    let ids: Vec<u64> = first
        .iter()
        .chain(&rest)
        .map(|e| match e {
            FabricEvent::Import { import_id, .. } => *import_id,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ids, (1..=130).collect::<Vec<u64>>(), "oldest first");
}
