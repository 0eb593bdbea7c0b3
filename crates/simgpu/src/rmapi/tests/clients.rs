//! Clients, handles and frees as resserv keeps them: per-client handle tables, clients bound
//! to the file that allocated them, frees of subtrees and of whole clients, and what a freed
//! or closed daemon leaves behind (§4 "Daemon dies or restarts").

use openimex_rmabi::class::client::NV0080_ALLOC_PARAMETERS;
use openimex_rmabi::class::nv00e0::NV00E0_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::{
    NV_MEMORY_EXPORT, NV01_DEVICE_0, NV01_ROOT, NV01_ROOT_CLIENT, NV20_SUBDEVICE_0,
};
use openimex_rmabi::ctrl::nv0000::{
    NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID, NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS,
};
use openimex_rmabi::ctrl::nv00e0::{NV00E0_CTRL_CMD_IMPORT_MEM, NV00E0_CTRL_IMPORT_MEM_PARAMS};
use openimex_rmabi::ctrl::nv2080::{
    FabricProbeInfo, NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO,
    NV2080_CTRL_GPU_FABRIC_PROBE_STATE_COMPLETE,
};
use openimex_rmabi::escape::{NV_ESC_RM_ALLOC, NVOS64_PARAMETERS};
use openimex_rmabi::status::*;
use openimex_simproto::handle::FabricHandle;
use openimex_simproto::proto::{NO_NODE, NvStatus, PAGE_SIZE};
use zerocopy::{FromBytes, IntoBytes};

use super::sequence::start;
use super::*;

#[test]
fn client_handles_are_chosen_by_hroot_or_by_the_rm() {
    // `serverAllocClient` (RS_COMPATABILITY_MODE): `hRoot` names the client, 0 lets the RM
    // pick from RS_CLIENT_HANDLE_BASE; a taken one is NV_ERR_INSERT_DUPLICATE_NAME. Every
    // root class becomes NV01_ROOT_CLIENT (`RmIoctl`), which the argument shows on return.
    let domain = Domain::new("client-handles");
    let mut n = domain.node(0, "595.45.04");
    let f = file(1);
    assert_eq!(n.client(f), 0xC1D0_0000);
    let a = NVOS64_PARAMETERS {
        hRoot: 0xC0FFEE,
        hObjectNew: 0xC0FFEE,
        hClass: NV01_ROOT,
        ..Default::default()
    };
    let s = n.escape(
        f,
        NV_ESC_RM_ALLOC,
        a.as_bytes().to_vec(),
        Vec::new(),
        Vec::new(),
    );
    let out = NVOS64_PARAMETERS::read_from_bytes(&s.reply.arg).unwrap();
    assert_eq!(
        (out.status, out.hObjectNew, out.hClass),
        (NV_OK, 0xC0FFEE, NV01_ROOT_CLIENT)
    );
    let s = n.escape(
        f,
        NV_ESC_RM_ALLOC,
        a.as_bytes().to_vec(),
        Vec::new(),
        Vec::new(),
    );
    let out = NVOS64_PARAMETERS::read_from_bytes(&s.reply.arg).unwrap();
    assert_eq!(out.status, NV_ERR_INSERT_DUPLICATE_NAME);
}

#[test]
fn handles_belong_to_their_client_and_clients_to_their_file() {
    let domain = Domain::new("handles");
    let mut n = domain.node(0, "595.45.04");
    let (f1, f2) = (file(1), file(2));
    let x = n.client(f1);
    let y = n.client(f1);
    let dev = NV0080_ALLOC_PARAMETERS::default();
    // The same handle in two clients is two objects.
    let (s, _, _) = n.alloc(f1, x, x, 0x10, NV01_DEVICE_0, dev.as_bytes(), Vec::new());
    assert_eq!(s, NV_OK);
    let (s, _, _) = n.alloc(f1, y, y, 0x10, NV01_DEVICE_0, dev.as_bytes(), Vec::new());
    assert_eq!(s, NV_OK);
    // Within a client a handle is taken once (`clientValidateNewResourceHandle`).
    let (s, _, _) = n.alloc(f1, x, x, 0x10, NV01_DEVICE_0, dev.as_bytes(), Vec::new());
    assert_eq!(s, NV_ERR_INSERT_DUPLICATE_NAME);
    // One client's object is unknown to another (`clientGetResourceRef`).
    let (s, _, _) = n.alloc(f1, y, 0x11, 0x20, NV20_SUBDEVICE_0, &[0; 4], Vec::new());
    assert_eq!(s, NV_ERR_OBJECT_NOT_FOUND);
    let (s, _, _) = n.alloc(f1, x, x, 0x11, NV01_DEVICE_0, dev.as_bytes(), Vec::new());
    assert_eq!(s, NV_OK);
    let (s, _) = n.control(
        f1,
        y,
        0x11,
        NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO,
        &[0; 56],
    );
    assert_eq!(s, NV_ERR_OBJECT_NOT_FOUND);
    // A Subdevice's parent must be a Device (`serverAllocResourceUnderLock`).
    let (s, _, _) = n.alloc(f1, x, x, 0x21, NV20_SUBDEVICE_0, &[0; 4], Vec::new());
    assert_eq!(s, NV_ERR_INVALID_OBJECT_PARENT);
    // A client used from another file is NV_ERR_INVALID_CLIENT (`rmclientValidate`, strict
    // client validation): for a control, an allocation and a free alike.
    let (s, _) = n.control(f2, x, x, 0x0000_0201, &[0; 128]);
    assert_eq!(s, NV_ERR_INVALID_CLIENT);
    let (s, _, _) = n.alloc(f2, x, x, 0x30, NV01_DEVICE_0, dev.as_bytes(), Vec::new());
    assert_eq!(s, NV_ERR_INVALID_CLIENT);
    assert_eq!(n.free(f2, x, x), NV_ERR_INVALID_CLIENT);
    // An unknown client: a control's NV_ERR_INVALID_CLIENT (`_rmapiRmControl`), an
    // allocation's or a free's NV_ERR_INVALID_OBJECT_HANDLE (`_serverLockClientWithLockInfo`).
    let (s, _) = n.control(f1, 0xBAD, 0xBAD, 0x0000_0201, &[0; 128]);
    assert_eq!(s, NV_ERR_INVALID_CLIENT);
    let (s, _, _) = n.alloc(
        f1,
        0xBAD,
        0xBAD,
        0x30,
        NV01_DEVICE_0,
        dev.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_ERR_INVALID_OBJECT_HANDLE);
    assert_eq!(n.free(f1, 0xBAD, 0xBAD), NV_ERR_INVALID_OBJECT_HANDLE);
    // Freeing an object the client does not have is NV_OK (RS_COMPATABILITY_MODE).
    assert_eq!(n.free(f1, x, 0x999), NV_OK);
    // Freeing a Device frees its Subdevice: the handle can be taken again.
    let (s, _, _) = n.alloc(f1, x, 0x11, 0x12, NV20_SUBDEVICE_0, &[0; 4], Vec::new());
    assert_eq!(s, NV_OK);
    assert_eq!(n.free(f1, x, 0x11), NV_OK);
    let (s, _, _) = n.alloc(f1, x, x, 0x12, NV01_DEVICE_0, dev.as_bytes(), Vec::new());
    assert_eq!(s, NV_OK);
}

#[test]
fn freeing_the_client_releases_its_dups_and_tears_the_session_down() {
    // RM_FREE of the client: the session first (RS_FREE_PRIORITY_HIGH), with the export dup
    // still held: `_checkDanglingExports` disables fabric allocations (§4 "Daemon dies" 1);
    // then the dups release their references, and the memory its creator released goes.
    let domain = Domain::new("free-client");
    let mut a = domain.node(0, "595.45.04");
    let d = start(&mut a, file(1), 0);
    let exporter = a.app(0);
    let created = a.rm.create(exporter, 1, 2 * PAGE_SIZE).unwrap();
    let uuid = FabricHandle::from_hex(&a.rm.export(exporter, created.mem).unwrap())
        .unwrap()
        .export_uuid;
    let dup = NV00E0_ALLOCATION_PARAMETERS::dup_by_uuid(uuid.0, 0);
    let (s, he, _) = a.alloc(
        d.f,
        d.h,
        d.h,
        0,
        NV_MEMORY_EXPORT,
        dup.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_OK);
    let im = NV00E0_CTRL_IMPORT_MEM_PARAMS::new(0, &[0x77]).unwrap();
    let (s, _) = a.control(d.f, d.h, he, NV00E0_CTRL_CMD_IMPORT_MEM, im.as_bytes());
    assert_eq!(s, NV_OK);
    a.rm.release(exporter, created.mem).unwrap();
    assert_eq!(a.rm.stats().allocations, 1, "the dups hold the memory");
    let st = a.rm.stats();
    assert_eq!((st.daemon_export_refs, st.daemon_export_objects), (1, 1));
    assert_eq!(a.free(d.f, d.h, d.h), NV_OK);
    let st = a.rm.stats();
    assert_eq!(
        (
            st.allocations,
            st.daemon_export_refs,
            st.daemon_export_objects,
            st.session
        ),
        (0, 0, 0, false)
    );
    assert_eq!(st.node_id, NO_NODE);
    assert!(
        !a.rm.allow_fabric_alloc(),
        "dangling exports disable fabric allocations"
    );
    assert_eq!(
        a.rm.create(exporter, 0, PAGE_SIZE).err(),
        Some(NvStatus::InvalidState)
    );
}

#[test]
fn closing_the_file_frees_every_client_on_it() {
    // `nvidia_close` → `rm_cleanup_file_private`: the file's clients and OS events go; a
    // session without dups ends without disabling fabric allocations.
    let domain = Domain::new("close-file");
    let mut n = domain.node(0, "595.45.04");
    let d = start(&mut n, file(7), 0);
    let extra = n.client(d.f);
    let other = n.client(file(8));
    assert_eq!(n.api.events.active(), 1);
    let unimports = n.api.close_file(&mut n.rm, d.f.id);
    assert!(unimports.is_empty());
    assert!(!n.rm.stats().session);
    assert!(n.rm.allow_fabric_alloc());
    assert_eq!(n.api.events.active(), 0);
    assert!(!n.api.clients.map.contains_key(&d.h));
    assert!(!n.api.clients.map.contains_key(&extra));
    assert!(
        n.api.clients.map.contains_key(&other),
        "another file's client stays"
    );
    // A new daemon can take the session.
    let d2 = start(&mut n, file(9), 3);
    assert_eq!(n.rm.node_id(), 3);
    let _ = d2;
}

#[test]
fn freeing_the_session_object_alone_ends_the_session_and_its_capability() {
    // The session is torn down when its object is freed; the client stays, and with it the
    // export dups (which now leave the client without the capability: no new session's
    // DUP_BY_UUID channel trust, no IMPORTED_REF).
    let domain = Domain::new("free-session");
    let mut n = domain.node(0, "595.45.04");
    let d = start(&mut n, file(1), 0);
    assert_eq!(n.free(d.f, d.h, d.session), NV_OK);
    assert!(!n.rm.stats().session);
    assert_eq!(n.rm.node_id(), NO_NODE);
    assert!(n.api.clients.map.contains_key(&d.h));
    assert!(!n.api.capable(d.h));
}

#[test]
fn gpu_uuid_and_probe_come_back_in_the_rm_structs() {
    let domain = Domain::new("gpu-info");
    let mut n = domain.node(0, "595.45.04");
    let d = start(&mut n, file(1), 0);
    // `gpuGetGidInfo`: ASCII is `GPU-…` with its NUL (NV_UUID_STR_LEN); the state machine's
    // UUID of the GPU.
    let q = NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS {
        gpuId: 0x200,
        flags: 0,
        gpuUuid: [0; 256],
        uuidStrLen: 0,
    };
    let (s, out) = n.control(
        d.f,
        d.h,
        d.h,
        NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID,
        q.as_bytes(),
    );
    assert_eq!(s, NV_OK);
    let p = NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS::read_from_bytes(&out).unwrap();
    assert_eq!(p.uuidStrLen, 41);
    let text = std::str::from_utf8(&p.gpuUuid[..40]).unwrap();
    assert_eq!(text, n.rm.gpus()[1].uuid);
    let (s, _) = n.control(
        d.f,
        d.h,
        d.h,
        NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID,
        NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS::binary(0x300).as_bytes(),
    );
    assert_eq!(s, NV_ERR_OBJECT_NOT_FOUND, "no third GPU");
    // The fabric probe of GPU 1 through its Subdevice (`subdeviceCtrlCmdGetGpuFabricProbeInfo`).
    let layout = n.api.config().layout;
    let (s, out) = n.control(
        d.f,
        d.h,
        d.gpus[1].1,
        NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO,
        &vec![0; layout.fabric_probe_info_params_size()],
    );
    assert_eq!(s, NV_OK);
    let info = FabricProbeInfo::decode(layout, &out).unwrap();
    assert_eq!(info.state, NV2080_CTRL_GPU_FABRIC_PROBE_STATE_COMPLETE);
    assert_eq!(
        (info.status, info.clique_id, info.cluster_uuid),
        (NV_OK, 1, [7; 16])
    );
}

#[test]
fn gpus_attach_to_a_file_once_and_only_the_nodes() {
    // NV_ESC_ATTACH_GPUS_TO_FD (`nvidia_ioctl`): an array of GPU IDs, once per file
    // (-EINVAL the second time); an ID of no GPU fails `nvidia_dev_get` (-EINVAL).
    use openimex_rmabi::escape::{NV_ESC_ATTACH_GPUS_TO_FD, attach_gpus_to_fd_arg};
    let domain = Domain::new("attach-gpus");
    let mut n = domain.node(0, "595.45.04");
    let attach = |n: &mut Node, f: File, ids: &[u32]| {
        let s = n.escape(
            f,
            NV_ESC_ATTACH_GPUS_TO_FD,
            attach_gpus_to_fd_arg(ids),
            Vec::new(),
            Vec::new(),
        );
        s.reply.errno
    };
    assert_eq!(
        attach(&mut n, file(1), &[0x300]),
        nix::libc::EINVAL,
        "no third GPU"
    );
    assert_eq!(attach(&mut n, file(1), &[0x100, 0x200]), 0);
    assert_eq!(
        attach(&mut n, file(1), &[0x100]),
        nix::libc::EINVAL,
        "once per file"
    );
    assert_eq!(attach(&mut n, file(2), &[0x200]), 0);
    assert_eq!(
        attach(&mut n, file(3), &[]),
        nix::libc::EINVAL,
        "an empty array is no size"
    );
}
