//! What the escape layer refuses, and with which status, each as the kernel function named
//! refuses it.

use openimex_rmabi::class::NV_IMEX_SESSION;
use openimex_rmabi::class::client::NV0080_ALLOC_PARAMETERS;
use openimex_rmabi::class::nv00e0::NV00E0_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::nv00f1::NV00F1_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::nv00fb::NV00FB_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::{NV_MEMORY_EXPORT, NV_MEMORY_FABRIC_IMPORTED_REF, NV01_DEVICE_0};
use openimex_rmabi::ctrl::nv00e0::{NV00E0_CTRL_CMD_IMPORT_MEM, NV00E0_CTRL_IMPORT_MEM_PARAMS};
use openimex_rmabi::ctrl::nv00f1::{
    NV00F1_CTRL_CMD_DISABLE_IMPORTERS, NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT,
    NV00F1_CTRL_CMD_GET_FABRIC_EVENTS, NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS,
    NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS,
};
use openimex_rmabi::ctrl::nv00f8::{Describe, NV00F8_CTRL_CMD_DESCRIBE};
use openimex_rmabi::escape::{
    NV_ESC_RM_CONTROL, NV_RM_API_VERSION_CMD_RELAXED, NV_RM_API_VERSION_CMD_STRICT,
};
use openimex_rmabi::status::*;
use openimex_simproto::handle::FabricHandle;
use openimex_simproto::proto::{NvStatus, PAGE_SIZE};
use zerocopy::IntoBytes;

use super::sequence::{SESSION, get_events, start};
use super::*;

fn session_params(node_id: u16) -> NV00F1_ALLOCATION_PARAMETERS {
    NV00F1_ALLOCATION_PARAMETERS {
        capDescriptor: CAP_FD as u64,
        pOsEvent: EVENT_FD as u64,
        nodeId: node_id,
        ..Default::default()
    }
}

#[test]
fn a_control_of_the_wrong_size_is_refused_before_the_object_is_looked_up() {
    // `_rmapiRmControl` (control.c): the command's class is in the resource table and
    // defines it, so `paramsSize` must equal the compiled size: NV_ERR_INVALID_ARGUMENT.
    // (`resControlLookup`'s NV_ERR_INVALID_PARAM_STRUCT, rs_resource.c, comes after and is
    // reached only by commands that table does not know.) Nothing is dequeued.
    let domain = Domain::new("param-size");
    let mut b = domain.node(1, "595.45.04");
    let d = start(&mut b, file(1), 1);
    let (s, _) = b.control(
        d.f,
        d.h,
        d.session,
        NV00F1_CTRL_CMD_GET_FABRIC_EVENTS,
        &[0; 11264],
    );
    assert_eq!(s, NV_ERR_INVALID_ARGUMENT);
    assert_eq!(
        b.trace,
        "RM_CONTROL 0xf10001 params=11264 status=NV_ERR_INVALID_ARGUMENT"
    );
    // Same for a root-client command (NV01_ROOT is class 0 of the table) and an object the
    // command's class does not even address: the size check comes first.
    let (s, _) = b.control(d.f, d.h, d.h, NV00F1_CTRL_CMD_DISABLE_IMPORTERS, &[0; 4]);
    assert_eq!(s, NV_ERR_INVALID_ARGUMENT);
    // Exactly sized, the wrong object's class does not export it: NV_ERR_NOT_SUPPORTED.
    let (s, _) = b.control(d.f, d.h, d.h, NV00F1_CTRL_CMD_DISABLE_IMPORTERS, &[0; 2]);
    assert_eq!(s, NV_ERR_NOT_SUPPORTED);
    // A command nobody defines, on the session: NV_ERR_NOT_SUPPORTED (`resControlLookup`).
    let (s, _) = b.control(d.f, d.h, d.session, 0x00F1_0099, &[0; 8]);
    assert_eq!(s, NV_ERR_NOT_SUPPORTED);
    // The NULL command is NV_OK whatever it names.
    let (s, _) = b.control(d.f, d.h, 0xdead, 0x00F1_0000, &[]);
    assert_eq!(s, NV_OK);
}

#[test]
fn an_escape_of_the_wrong_size_or_unknown_is_einval_before_the_rm() {
    // `nv_validate_ioctls` (nv.c) → `RmValidateIoctl` (escape.c): -EINVAL, the RM never runs.
    let domain = Domain::new("escape-size");
    let mut n = domain.node(0, "595.45.04");
    let s = n.escape(
        file(1),
        NV_ESC_RM_CONTROL,
        vec![0; 31],
        Vec::new(),
        Vec::new(),
    );
    assert_eq!(s.reply.errno, nix::libc::EINVAL);
    assert_eq!(s.trace, "RM_CONTROL - params=0 status=EINVAL");
    let s = n.escape(file(1), 0x77, vec![0; 8], Vec::new(), Vec::new());
    assert_eq!(s.reply.errno, nix::libc::EINVAL);
    // The argument comes back as it went.
    assert_eq!(s.reply.arg, vec![0; 8]);
}

#[test]
fn version_check_strict_and_relaxed_as_rm_perform_version_check() {
    let domain = Domain::new("version");
    let mut n = domain.node(0, "580.65.06");
    // STRICT needs the exact string; a mismatch is NV_ERR_GENERIC, -EINVAL from
    // `nvidia_ioctl`, with the driver's string copied back for the message.
    let (errno, v) = n.check_version(file(1), NV_RM_API_VERSION_CMD_STRICT, "580.65.06");
    assert_eq!((errno, v.reply), (0, 1));
    let (errno, v) = n.check_version(file(1), NV_RM_API_VERSION_CMD_STRICT, "580.82.07");
    assert_eq!((errno, v.reply), (nix::libc::EINVAL, 1));
    assert_eq!(v.version(), "580.65.06");
    assert_eq!(
        n.trace,
        "CHECK_VERSION_STR - params=0 status=NV_ERR_GENERIC"
    );
    // RELAXED compares up to the first '.'.
    let (errno, _) = n.check_version(file(1), NV_RM_API_VERSION_CMD_RELAXED, "580.82.07");
    assert_eq!(errno, 0);
    let (errno, _) = n.check_version(file(1), NV_RM_API_VERSION_CMD_RELAXED, "595.45.04");
    assert_eq!(errno, nix::libc::EINVAL);
}

#[test]
fn rm_escapes_are_served_before_any_version_check() {
    // `nvidia_ioctl` keeps no "version checked" state: a client can be allocated first.
    let domain = Domain::new("no-version-first");
    let mut n = domain.node(0, "595.45.04");
    assert_ne!(n.client(file(1)), 0);
}

#[test]
fn a_second_session_is_refused_in_the_same_client_and_anywhere_else() {
    let domain = Domain::new("second-session");
    let mut n = domain.node(0, "595.45.04");
    let d = start(&mut n, file(1), 0);
    // The same client: NV_IMEX_SESSION is single-instance under its parent
    // (`serverAllocResourceUnderLock`): NV_ERR_STATE_IN_USE.
    let p = session_params(0);
    let (s, _, _) = n.alloc(
        d.f,
        d.h,
        d.h,
        0x77,
        NV_IMEX_SESSION,
        p.as_bytes(),
        vec![(CAP_FD, n.cap_fd())],
    );
    assert_eq!(s, NV_ERR_STATE_IN_USE);
    // Another client, even on another file: one session per node (`fabricSetImexEvent`).
    let f2 = file(2);
    let h2 = n.client(f2);
    let (_, ev) = eventfd();
    assert_eq!(n.alloc_os_event(f2, h2, EVENT_FD, Some(ev)), NV_OK);
    let (s, _, _) = n.alloc(
        f2,
        h2,
        h2,
        SESSION,
        NV_IMEX_SESSION,
        p.as_bytes(),
        vec![(CAP_FD, n.cap_fd())],
    );
    assert_eq!(s, NV_ERR_IN_USE);
    assert_eq!(n.trace, "RM_ALLOC 0xf1 params=32 status=NV_ERR_IN_USE");
}

#[test]
fn the_session_needs_the_capability_descriptor() {
    // `imexsessionapiConstruct` → `osRmCapAcquire` → `nv_cap_validate_and_dup_fd`: no
    // descriptor, or one open on another file, is NV_ERR_INSUFFICIENT_PERMISSIONS; the node
    // keeps no session.
    let domain = Domain::new("cap");
    let mut n = domain.node(0, "595.45.04");
    let f = file(1);
    let h = n.client(f);
    let (_, ev) = eventfd();
    assert_eq!(n.alloc_os_event(f, h, EVENT_FD, Some(ev)), NV_OK);
    let p = session_params(0);
    let (s, _, _) = n.alloc(f, h, h, SESSION, NV_IMEX_SESSION, p.as_bytes(), Vec::new());
    assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS);
    let wrong = other_file(&n.node_dir);
    let (s, _, _) = n.alloc(
        f,
        h,
        h,
        SESSION,
        NV_IMEX_SESSION,
        p.as_bytes(),
        vec![(CAP_FD, wrong)],
    );
    assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS);
    let gpu = n.gpu_fd(0);
    let (s, _, _) = n.alloc(
        f,
        h,
        h,
        SESSION,
        NV_IMEX_SESSION,
        p.as_bytes(),
        vec![(CAP_FD, gpu)],
    );
    assert_eq!(
        s, NV_ERR_INSUFFICIENT_PERMISSIONS,
        "a GPU's device file is not the capability"
    );
    assert!(!n.rm.stats().session);
    // The capability under another number than `capDescriptor` names does not count either.
    let (s, _, _) = n.alloc(
        f,
        h,
        h,
        SESSION,
        NV_IMEX_SESSION,
        p.as_bytes(),
        vec![(CAP_FD + 1, n.cap_fd())],
    );
    assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS);
    let (s, _, _) = n.alloc(
        f,
        h,
        h,
        SESSION,
        NV_IMEX_SESSION,
        p.as_bytes(),
        vec![(CAP_FD, n.cap_fd())],
    );
    assert_eq!(s, NV_OK);
}

#[test]
fn the_session_arguments_are_checked_in_the_constructors_order() {
    // `imexsessionapiConstruct`: flags, pOsEvent and nodeId first (NV_ERR_INVALID_ARGUMENT),
    // then the OS event (`osUserHandleToKernelPtr`: NV_ERR_OBJECT_NOT_FOUND), which is looked
    // up by (fd, hClient): another client's event does not count.
    let domain = Domain::new("session-args");
    let mut n = domain.node(0, "595.45.04");
    let f = file(1);
    let h = n.client(f);
    let h2 = n.client(f);
    let (_, ev) = eventfd();
    assert_eq!(n.alloc_os_event(f, h2, EVENT_FD, Some(ev)), NV_OK);
    let cap_path = n.cap.clone();
    let cap = || {
        let fd: OwnedFd = std::fs::File::open(&cap_path).unwrap().into();
        vec![(CAP_FD, fd)]
    };
    let mut p = session_params(0);
    p.flags = 1;
    let (s, _, _) = n.alloc(f, h, h, SESSION, NV_IMEX_SESSION, p.as_bytes(), cap());
    assert_eq!(
        s, NV_ERR_INVALID_ARGUMENT,
        "NV00F1_ALLOC_DISABLE_CHANNEL_RECOVERY cannot be passed"
    );
    let p = session_params(0xFFFF);
    let (s, _, _) = n.alloc(f, h, h, SESSION, NV_IMEX_SESSION, p.as_bytes(), cap());
    assert_eq!(s, NV_ERR_INVALID_ARGUMENT, "NV_FABRIC_INVALID_NODE_ID");
    let p = session_params(0);
    let (s, _, _) = n.alloc(f, h, h, SESSION, NV_IMEX_SESSION, p.as_bytes(), cap());
    assert_eq!(s, NV_ERR_OBJECT_NOT_FOUND, "the event is h2's, not h's");
    // Parameters shorter than the struct fault in the copy-in (`os_memcpy_from_user`).
    let (s, _, _) = n.alloc(
        f,
        h2,
        h2,
        SESSION,
        NV_IMEX_SESSION,
        &p.as_bytes()[..24],
        cap(),
    );
    assert_eq!(s, NV_ERR_INVALID_ADDRESS);
    let (s, _, _) = n.alloc(f, h2, h2, SESSION, NV_IMEX_SESSION, p.as_bytes(), cap());
    assert_eq!(s, NV_OK);
}

#[test]
fn privileged_controls_are_refused_to_a_client_without_the_session() {
    let domain = Domain::new("capable");
    let mut a = domain.node(0, "595.45.04");
    let d = start(&mut a, file(1), 0);
    let exporter = a.app(0);
    let created = a.rm.create(exporter, 0, 4 * PAGE_SIZE).unwrap();
    let handle = a.rm.export(exporter, created.mem).unwrap();
    let uuid = FabricHandle::from_hex(&handle).unwrap().export_uuid;
    // Another client of the daemon's own process (not root): its dup by UUID is held to its
    // own channel subscription, which it has none of (`_memoryexportDup`).
    let f = file(1);
    let other = a.client(f);
    let dup = NV00E0_ALLOCATION_PARAMETERS::dup_by_uuid(uuid.0, 0);
    let (s, _, _) = a.alloc(
        f,
        other,
        other,
        0xE0,
        NV_MEMORY_EXPORT,
        dup.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS);
    // The imported reference is the capable client's only
    // (`memoryfabricimportedrefConstruct`).
    let r = NV00FB_ALLOCATION_PARAMETERS::default();
    let (s, _, _) = a.alloc(
        f,
        other,
        other,
        0xFB,
        NV_MEMORY_FABRIC_IMPORTED_REF,
        r.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS);
    // DESCRIBE on a dup made by the capable client, after the capable client handed nothing
    // over: the other client cannot even name the object (handles are per client).
    let (s, h_export, _) = a.alloc(
        d.f,
        d.h,
        d.h,
        0xE0,
        NV_MEMORY_EXPORT,
        dup.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_OK);
    let im = NV00E0_CTRL_IMPORT_MEM_PARAMS::new(0, &[0xF8]).unwrap();
    let (s, _) = a.control(
        d.f,
        d.h,
        h_export,
        NV00E0_CTRL_CMD_IMPORT_MEM,
        im.as_bytes(),
    );
    assert_eq!(s, NV_OK);
    let req = Describe::request(a.api.config().layout, 0);
    let (s, _) = a.control(f, other, 0xF8, NV00F8_CTRL_CMD_DESCRIBE, &req);
    assert_eq!(s, NV_ERR_OBJECT_NOT_FOUND);
    // The session's controls: the other client cannot name the session object either.
    let (s, _) = a.control(
        f,
        other,
        d.session,
        NV00F1_CTRL_CMD_DISABLE_IMPORTERS,
        &[0; 2],
    );
    assert_eq!(s, NV_ERR_OBJECT_NOT_FOUND);
    // Once the session is freed the daemon's client is no longer capable: DESCRIBE is
    // `rmclientIsCapableOrAdmin`'s (NV_ERR_INSUFFICIENT_PERMISSIONS) for a non-admin process,
    // and an admin process passes.
    assert_eq!(a.free(d.f, d.h, d.session), NV_OK);
    let (s, _) = a.control(d.f, d.h, 0xF8, NV00F8_CTRL_CMD_DESCRIBE, &req);
    assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS);
    let root = File { admin: true, ..d.f };
    let (s, _) = a.control(root, d.h, 0xF8, NV00F8_CTRL_CMD_DESCRIBE, &req);
    assert_eq!(s, NV_OK);
}

#[test]
fn imported_ref_for_nothing_pending_is_nothing_to_do_and_creates_no_object() {
    // `memoryfabricimportedrefConstruct` → `importDescriptorGetUnused` returns NULL:
    // NV_WARN_NOTHING_TO_DO, which `_clientAllocResourceHelper` treats as a failure: the
    // object is deleted and its handle stays free.
    let domain = Domain::new("nothing-pending");
    let mut a = domain.node(0, "595.45.04");
    let mut b = domain.node(1, "595.45.04");
    let _da = start(&mut a, file(1), 0);
    let db = start(&mut b, file(1), 1);
    let r = NV00FB_ALLOCATION_PARAMETERS {
        exportUuid: [9; 16],
        id: 3,
        ..Default::default()
    };
    let (s, h, _) = b.alloc(
        db.f,
        db.h,
        db.h,
        0xFB1,
        NV_MEMORY_FABRIC_IMPORTED_REF,
        r.as_bytes(),
        Vec::new(),
    );
    assert_eq!((s, h), (NV_WARN_NOTHING_TO_DO, 0xFB1));
    assert_eq!(
        b.trace,
        "RM_ALLOC 0xfb params=32 status=NV_WARN_NOTHING_TO_DO"
    );
    // The handle is free: the same value allocates a Device without a duplicate-name error.
    let dev = NV0080_ALLOC_PARAMETERS::default();
    let (s, _, _) = b.alloc(
        db.f,
        db.h,
        db.h,
        0xFB1,
        NV01_DEVICE_0,
        dev.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_OK);
    // A pending import can be claimed once: a second reference is NV_WARN_NOTHING_TO_DO
    // (`extUsageCount > 0`), and flags other than 0 are NV_ERR_INVALID_ARGUMENT.
    let exporter = a.app(0);
    let created = a.rm.create(exporter, 0, PAGE_SIZE).unwrap();
    let handle = a.rm.export(exporter, created.mem).unwrap();
    let importer = b.app(0);
    b.rm.import(importer, &handle, 3).unwrap();
    let uuid = FabricHandle::from_hex(&handle).unwrap().export_uuid;
    let r = NV00FB_ALLOCATION_PARAMETERS {
        exportUuid: uuid.0,
        id: 3,
        ..Default::default()
    };
    let bad = NV00FB_ALLOCATION_PARAMETERS { flags: 1, ..r };
    let (s, _, _) = b.alloc(
        db.f,
        db.h,
        db.h,
        0,
        NV_MEMORY_FABRIC_IMPORTED_REF,
        bad.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_ERR_INVALID_ARGUMENT);
    let (s, _, _) = b.alloc(
        db.f,
        db.h,
        db.h,
        0,
        NV_MEMORY_FABRIC_IMPORTED_REF,
        r.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_OK);
    let (s, _, _) = b.alloc(
        db.f,
        db.h,
        db.h,
        0,
        NV_MEMORY_FABRIC_IMPORTED_REF,
        r.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_WARN_NOTHING_TO_DO);
}

#[test]
fn finish_mem_unimport_takes_one_to_256_tokens() {
    // `imexsessionapiCtrlCmdFinishMemUnimport`: numTokens 0 is NV_ERR_INVALID_ARGUMENT;
    // unknown IDs are ignored.
    let domain = Domain::new("finish");
    let mut b = domain.node(1, "595.45.04");
    let d = start(&mut b, file(1), 1);
    let none = NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS::new(&[]).unwrap();
    let (s, _) = b.control(
        d.f,
        d.h,
        d.session,
        NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT,
        none.as_bytes(),
    );
    assert_eq!(s, NV_ERR_INVALID_ARGUMENT);
    let unknown = NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS::new(&[12345]).unwrap();
    let (s, _) = b.control(
        d.f,
        d.h,
        d.session,
        NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT,
        unknown.as_bytes(),
    );
    assert_eq!(s, NV_OK);
}

#[test]
fn disable_importers_disables_the_clients_that_imported_from_the_node() {
    // `imexsessionapiCtrlCmdDisableImporters` → `rcAndDisableOutstandingClientsWithImportedMemory`
    // (§4 "Peer node dies"): an application holding an import from node 0 is disabled.
    let domain = Domain::new("disable");
    let mut a = domain.node(0, "595.45.04");
    let mut b = domain.node(1, "595.45.04");
    let _da = start(&mut a, file(1), 0);
    let db = start(&mut b, file(1), 1);
    let exporter = a.app(0);
    let created = a.rm.create(exporter, 0, PAGE_SIZE).unwrap();
    let handle = a.rm.export(exporter, created.mem).unwrap();
    let importer = b.app(0);
    let import = b.rm.import(importer, &handle, 1).unwrap();
    let (events, _) = get_events(&mut b, &db);
    assert_eq!(events.len(), 1);
    let p = NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS { nodeId: 0 };
    let (s, _) = b.control(
        db.f,
        db.h,
        db.session,
        NV00F1_CTRL_CMD_DISABLE_IMPORTERS,
        p.as_bytes(),
    );
    assert_eq!(s, NV_OK);
    assert!(b.rm.is_disabled(importer));
    assert_eq!(
        b.rm.wait_import(importer, import),
        Err(NvStatus::ResetRequired)
    );
    assert_eq!(b.rm.take_revoked(), vec![importer]);
}

#[test]
fn a_device_needs_a_gpu_and_its_device_file() {
    // `deviceConstruct`: an instance without a GPU is NV_ERR_INVALID_CLASS
    // (`gpumgrIsDeviceInstanceValid`); a process without the GPU's device file open
    // NV_ERR_INSUFFICIENT_PERMISSIONS (`osIsGpuAccessible`).
    let domain = Domain::new("device");
    let mut n = domain.node(0, "595.45.04");
    let f = file(1);
    let h = n.client(f);
    let p = NV0080_ALLOC_PARAMETERS {
        deviceId: 2,
        ..Default::default()
    };
    let (s, _, _) = n.alloc(f, h, h, 0, NV01_DEVICE_0, p.as_bytes(), Vec::new());
    assert_eq!(s, NV_ERR_INVALID_CLASS);
    let blind = File {
        gpus_open: false,
        ..f
    };
    let (s, _, _) = n.alloc(
        blind,
        h,
        h,
        0,
        NV01_DEVICE_0,
        NV0080_ALLOC_PARAMETERS::default().as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS);
    // IMPORT_MEM of GPU memory needs the Device and Subdevice (`deviceGetByGpu`):
    // NV_ERR_OBJECT_NOT_FOUND without them, in a capable client.
    let d = start(&mut n, file(2), 0);
    let exporter = n.app(0);
    let created = n.rm.create(exporter, 1, PAGE_SIZE).unwrap();
    let uuid = FabricHandle::from_hex(&n.rm.export(exporter, created.mem).unwrap())
        .unwrap()
        .export_uuid;
    assert_eq!(
        n.free(d.f, d.h, d.gpus[1].0),
        NV_OK,
        "GPU 1's Device and its Subdevice go"
    );
    let dup = NV00E0_ALLOCATION_PARAMETERS::dup_by_uuid(uuid.0, 0);
    let (s, he, _) = n.alloc(
        d.f,
        d.h,
        d.h,
        0,
        NV_MEMORY_EXPORT,
        dup.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_OK);
    let im = NV00E0_CTRL_IMPORT_MEM_PARAMS::new(0, &[0xF8]).unwrap();
    let (s, _) = n.control(d.f, d.h, he, NV00E0_CTRL_CMD_IMPORT_MEM, im.as_bytes());
    assert_eq!(s, NV_ERR_OBJECT_NOT_FOUND);
    // A range past numMaxHandles is NV_ERR_OUT_OF_RANGE.
    let im = NV00E0_CTRL_IMPORT_MEM_PARAMS::new(1, &[0xF8]).unwrap();
    let (s, _) = n.control(d.f, d.h, he, NV00E0_CTRL_CMD_IMPORT_MEM, im.as_bytes());
    assert_eq!(s, NV_ERR_OUT_OF_RANGE);
}

#[test]
fn os_events_are_checked_only_for_duplicates_and_found_by_fd_and_client() {
    // `allocate_os_event`: a second (hClient, fd) fails, reported as
    // NV_ERR_INSUFFICIENT_RESOURCES; `free_os_event` of an unknown pair is
    // NV_ERR_INVALID_EVENT.
    let domain = Domain::new("os-events");
    let mut n = domain.node(0, "595.45.04");
    let f = file(1);
    let h = n.client(f);
    let (_, e1) = eventfd();
    let (_, e2) = eventfd();
    assert_eq!(n.alloc_os_event(f, h, EVENT_FD, Some(e1)), NV_OK);
    assert_eq!(
        n.alloc_os_event(f, h, EVENT_FD, Some(e2)),
        NV_ERR_INSUFFICIENT_RESOURCES
    );
    assert_eq!(
        n.alloc_os_event(f, h, EVENT_FD + 1, None),
        NV_ERR_INSUFFICIENT_RESOURCES
    );
    use openimex_rmabi::escape::{NV_ESC_FREE_OS_EVENT, nv_ioctl_free_os_event_t};
    use zerocopy::FromBytes;
    let mut free = |fd: u32| {
        let p = nv_ioctl_free_os_event_t {
            hClient: h,
            hDevice: 0,
            fd,
            Status: 0,
        };
        let s = n.escape(
            f,
            NV_ESC_FREE_OS_EVENT,
            p.as_bytes().to_vec(),
            Vec::new(),
            Vec::new(),
        );
        nv_ioctl_free_os_event_t::read_from_bytes(&s.reply.arg)
            .unwrap()
            .Status
    };
    assert_eq!(free(EVENT_FD as u32), NV_OK);
    assert_eq!(free(EVENT_FD as u32), NV_ERR_INVALID_EVENT);
}

#[test]
fn a_freed_os_event_is_not_posted_to() {
    // FREE_OS_EVENT while the session references it marks it inactive
    // (`free_os_event_under_lock`); `osSetEvent` then posts nothing (`osReferenceObjectCount`).
    let domain = Domain::new("freed-event");
    let mut a = domain.node(0, "595.45.04");
    let mut b = domain.node(1, "595.45.04");
    let _da = start(&mut a, file(1), 0);
    let db = start(&mut b, file(1), 1);
    use openimex_rmabi::escape::{NV_ESC_FREE_OS_EVENT, nv_ioctl_free_os_event_t};
    let p = nv_ioctl_free_os_event_t {
        hClient: db.h,
        hDevice: 0,
        fd: EVENT_FD as u32,
        Status: 0,
    };
    b.escape(
        db.f,
        NV_ESC_FREE_OS_EVENT,
        p.as_bytes().to_vec(),
        Vec::new(),
        Vec::new(),
    );
    let exporter = a.app(0);
    let created = a.rm.create(exporter, 0, PAGE_SIZE).unwrap();
    let handle = a.rm.export(exporter, created.mem).unwrap();
    let importer = b.app(0);
    b.rm.import(importer, &handle, 1).unwrap();
    b.api.post_os_event(&b.rm);
    assert_eq!(posts(&db.event), 0);
    // The event is still queued for GET_FABRIC_EVENTS.
    assert_eq!(get_events(&mut b, &db).0.len(), 1);
}
