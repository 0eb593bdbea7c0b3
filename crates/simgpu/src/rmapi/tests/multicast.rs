//! Multicast through the escapes (`docs/reference/driver-interface.md` §1.6 "Multicast" 3-4): the
//! importing node's REMOTE_GPU_ATTACH event, the owner's daemon's dup of the prime and its
//! ATTACH_REMOTE_GPU / SET_FAILURE; and the clique change event naming the GPU by its ID.

use openimex_rmabi::FabricEvent;
use openimex_rmabi::class::NV_MEMORY_EXPORT;
use openimex_rmabi::class::nv00e0::NV00E0_ALLOCATION_PARAMETERS;
use openimex_rmabi::ctrl::nv00e0::{
    NV00E0_ADDR_SPACE_TYPE_FABRIC_MC, NV00E0_CTRL_CMD_IMPORT_MEM, NV00E0_CTRL_IMPORT_MEM_PARAMS,
};
use openimex_rmabi::ctrl::nv00fd::{
    AttachRemoteGpu, NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU, NV00FD_CTRL_CMD_SET_FAILURE,
    NV00FD_CTRL_SET_FAILURE_PARAMS,
};
use openimex_rmabi::status::*;
use openimex_simproto::handle::FabricHandle;
use openimex_simproto::inband::ToFm;
use openimex_simproto::proto::PAGE_SIZE;
use zerocopy::{FromBytes, IntoBytes};

use super::sequence::{get_events, start};
use super::*;

#[test]
fn a_remote_attach_is_forwarded_to_the_prime_through_the_daemons_dup() {
    let domain = Domain::new("mc-attach");
    let mut a = domain.node(0, "595.45.04");
    let mut b = domain.node(1, "595.45.04");
    let layout = a.api.config().layout;
    let da = start(&mut a, file(1), 0);
    let db = start(&mut b, file(1), 1);
    a.rm.set_fm_link(true);
    // A prime of 2 GPUs on A (one local), exported; B imports it and attaches its GPU 0.
    let owner = a.app(0);
    let mc = a.rm.mc_create(owner, 2, 2 * PAGE_SIZE, 0).unwrap();
    a.rm.mc_attach_gpu(owner, mc, 0).unwrap();
    let handle = a.rm.mc_export(owner, mc).unwrap();
    let uuid = FabricHandle::from_hex(&handle).unwrap().export_uuid;
    let member = b.app(0);
    let imported = b.rm.mc_import(member, &handle).unwrap();
    b.rm.mc_attach_gpu(member, imported, 0).unwrap();
    let (events, _) = get_events(&mut b, &db);
    let [
        ev @ FabricEvent::RemoteGpuAttach {
            export_uuid,
            export_node: 0,
            page_size,
            ..
        },
    ] = events[..]
    else {
        panic!("one REMOTE_GPU_ATTACH expected: {events:?}");
    };
    assert_eq!((export_uuid, page_size), (uuid.0, PAGE_SIZE));

    // A's daemon: dup by UUID, IMPORT_MEM gives the multicast object, parented to the
    // client (device-less memory, `_memoryexportFindImporterParent`).
    let dup = NV00E0_ALLOCATION_PARAMETERS::dup_by_uuid(uuid.0, 0);
    let (s, he, out) = a.alloc(
        da.f,
        da.h,
        da.h,
        0xE0,
        NV_MEMORY_EXPORT,
        dup.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_OK);
    assert_eq!(
        NV00E0_ALLOCATION_PARAMETERS::read_from_bytes(&out)
            .unwrap()
            .deviceInstanceMask,
        0
    );
    let im = NV00E0_CTRL_IMPORT_MEM_PARAMS::new(0, &[0xFD]).unwrap();
    let (s, out) = a.control(da.f, da.h, he, NV00E0_CTRL_CMD_IMPORT_MEM, im.as_bytes());
    assert_eq!(s, NV_OK);
    let im = NV00E0_CTRL_IMPORT_MEM_PARAMS::read_from_bytes(&out).unwrap();
    assert_eq!(
        (im.memInfos[0].hParent, im.memInfos[0].addrSpace),
        (da.h, NV00E0_ADDR_SPACE_TYPE_FABRIC_MC)
    );

    // SET_FAILURE with NV_OK is NV_ERR_INVALID_ARGUMENT, and nothing fails
    // (`_memorymulticastfabricCtrlSetFailure`).
    let ok = NV00FD_CTRL_SET_FAILURE_PARAMS { status: NV_OK };
    let (s, _) = a.control(da.f, da.h, 0xFD, NV00FD_CTRL_CMD_SET_FAILURE, ok.as_bytes());
    assert_eq!(s, NV_ERR_INVALID_ARGUMENT);

    // ATTACH_REMOTE_GPU with the event's fields and B's node: the last attach, so the prime
    // sends the team request to the Fabric Manager (§1.6 "Multicast" 5).
    let attach = AttachRemoteGpu::from_event(&ev, 1).unwrap();
    let (s, _) = a.control(
        da.f,
        da.h,
        0xFD,
        NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU,
        &attach.encode(layout).unwrap(),
    );
    assert_eq!(s, NV_OK, "{}", a.trace);
    let msgs = a.rm.take_fm_messages();
    let [ToFm::McTeamSetup { members, .. }] = &msgs[..] else {
        panic!("one team request expected: {msgs:?}");
    };
    assert_eq!(members.len(), 2);
    // Another attach finds the team full: NV_ERR_INVALID_OPERATION, and the prime fails.
    let (s, _) = a.control(
        da.f,
        da.h,
        0xFD,
        NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU,
        &attach.encode(layout).unwrap(),
    );
    assert_eq!(s, NV_ERR_INVALID_OPERATION);
    // Without the session (and not admin) the daemon's client may not fail the prime:
    // `rmclientIsCapableOrAdmin` first, NV_ERR_INSUFFICIENT_PERMISSIONS.
    assert_eq!(a.free(da.f, da.h, da.session), NV_OK);
    let fail = NV00FD_CTRL_SET_FAILURE_PARAMS {
        status: NV_ERR_GENERIC,
    };
    let (s, _) = a.control(
        da.f,
        da.h,
        0xFD,
        NV00FD_CTRL_CMD_SET_FAILURE,
        fail.as_bytes(),
    );
    assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS);
}

#[test]
fn a_clique_change_names_the_gpu_by_its_id() {
    // `_gpuFabricProbeSendCliqueIdChangeEvent`: CLIQUE_ID_CHANGE on channel 0 with the GPU's
    // ID (0x100 * (index + 1) here), not its index.
    let domain = Domain::new("clique");
    let mut n = domain.node(0, "595.45.04");
    let d = start(&mut n, file(1), 0);
    let mut info = n.rm.default_probe_info(1);
    info.clique_id = 9;
    n.rm.complete_probe(1, info).unwrap();
    let (events, _) = get_events(&mut n, &d);
    let [
        FabricEvent::CliqueIdChange {
            gpu_id,
            clique_id,
            channel,
            ..
        },
    ] = events[..]
    else {
        panic!("one CLIQUE_ID_CHANGE expected: {events:?}");
    };
    assert_eq!((gpu_id, clique_id, channel), (0x200, 9, 0));
}
