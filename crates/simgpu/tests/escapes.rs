//! The RM escapes through real bound drivers (`docs/reference/driver-interface.md` §1.5, §1.6): a
//! daemon per node speaks NVIDIA's ioctl structs over the socket with real descriptors (an
//! `eventfd` as the OS event, the capability device's descriptor, the GPU device files held
//! open), applications speak the simulation protocol, and an import is served end to end.

mod common;

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::config;
use common::node::{Conn, TempDir, status};
use openimex_rmabi::class::client::{NV0080_ALLOC_PARAMETERS, NV2080_ALLOC_PARAMETERS};
use openimex_rmabi::class::nv00e0::NV00E0_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::nv00f1::NV00F1_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::nv00fb::NV00FB_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::{
    NV_IMEX_SESSION, NV_MEMORY_EXPORT, NV_MEMORY_FABRIC_IMPORTED_REF, NV01_DEVICE_0,
    NV01_ROOT_CLIENT, NV20_SUBDEVICE_0,
};
use openimex_rmabi::ctrl::nv0000::{NV0000_CTRL_CMD_GPU_GET_PROBED_IDS, parse_probed_ids};
use openimex_rmabi::ctrl::nv00e0::{NV00E0_CTRL_CMD_IMPORT_MEM, NV00E0_CTRL_IMPORT_MEM_PARAMS};
use openimex_rmabi::ctrl::nv00f1::NV00F1_CTRL_CMD_GET_FABRIC_EVENTS;
use openimex_rmabi::ctrl::nv00f8::{Describe, NV00F8_CTRL_CMD_DESCRIBE};
use openimex_rmabi::ctrl::nv00fb::{NV00FB_CTRL_CMD_VALIDATE, Validate};
use openimex_rmabi::escape::{
    NV_ESC_ALLOC_OS_EVENT, NV_ESC_CHECK_VERSION_STR, NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL,
    NVOS54_PARAMETERS, NVOS64_PARAMETERS, nv_ioctl_alloc_os_event_t, nv_ioctl_rm_api_version_t,
};
use openimex_rmabi::event::parse_fabric_events_params;
use openimex_rmabi::status::{NV_ERR_INSUFFICIENT_PERMISSIONS, NV_OK};
use openimex_rmabi::{FabricEvent, Layout, NvHandle};
use openimex_simgpu::server::{DriverConfig, Server, ServerHandle};
use openimex_simproto::escape;
use openimex_simproto::handle::FabricHandle;
use openimex_simproto::node_dir::{IMEX_CAP_MINOR, cap_device_path, gpu_device_path};
use openimex_simproto::proto::{self, NvStatus, PAGE_SIZE, Request, Response};
use zerocopy::{FromBytes, IntoBytes};

/// One open `/dev/nvidiactl` of a daemon: the socket, and the ioctl over it.
struct Ctl(UnixStream);

impl Ctl {
    fn open(server: &ServerHandle) -> Self {
        Self(UnixStream::connect(server.socket_path()).unwrap())
    }

    /// One escape; `pass` are the descriptors whose numbers `arg` or `params` hold. Returns
    /// the ioctl's errno.
    fn ioctl(&self, nr: u8, arg: &mut [u8], params: &mut [u8], pass: &[RawFd]) -> i32 {
        let mut body = Vec::new();
        escape::encode_call(&mut body, nr, arg, params, pass);
        openimex_simproto::frame::send_frame(&self.0, &body, pass).unwrap();
        let mut reply = Vec::new();
        proto::recv_body(&self.0, &mut reply).unwrap();
        escape::decode_reply(&reply, arg, params).unwrap()
    }

    /// Device allocations of `(handle, GPU)` sent in one write, as the daemon's start sends
    /// its GPUs' (`calls_each`); returns each one's status.
    fn alloc_devices(&self, h_client: NvHandle, devices: &[(NvHandle, u32)]) -> Vec<u32> {
        let mut frames = Vec::new();
        for &(handle, gpu) in devices {
            let mut dev = NV0080_ALLOC_PARAMETERS {
                deviceId: gpu,
                ..Default::default()
            };
            let a = NVOS64_PARAMETERS {
                hRoot: h_client,
                hObjectParent: h_client,
                hObjectNew: handle,
                hClass: NV01_DEVICE_0,
                paramsSize: dev.as_bytes().len() as u32,
                ..Default::default()
            };
            openimex_simproto::frame::push_frame(&mut frames, |out| {
                escape::encode_call(out, NV_ESC_RM_ALLOC, a.as_bytes(), dev.as_mut_bytes(), &[])
            })
            .unwrap();
        }
        openimex_simproto::frame::send_frames(&self.0, &frames).unwrap();
        (devices.iter())
            .map(|_| {
                let (mut reply, mut arg) = (Vec::new(), NVOS64_PARAMETERS::default());
                let mut dev = NV0080_ALLOC_PARAMETERS::default();
                proto::recv_body(&self.0, &mut reply).unwrap();
                let errno = escape::decode_reply(&reply, arg.as_mut_bytes(), dev.as_mut_bytes());
                assert_eq!(errno.unwrap(), 0);
                arg.status
            })
            .collect()
    }

    fn alloc(
        &self,
        h_root: NvHandle,
        h_parent: NvHandle,
        h_new: NvHandle,
        class: u32,
        params: &mut [u8],
        pass: &[RawFd],
    ) -> (u32, NvHandle) {
        let a = NVOS64_PARAMETERS {
            hRoot: h_root,
            hObjectParent: h_parent,
            hObjectNew: h_new,
            hClass: class,
            paramsSize: params.len() as u32,
            ..Default::default()
        };
        let mut arg = a.as_bytes().to_vec();
        assert_eq!(self.ioctl(NV_ESC_RM_ALLOC, &mut arg, params, pass), 0);
        let a = NVOS64_PARAMETERS::read_from_bytes(&arg).unwrap();
        (a.status, a.hObjectNew)
    }

    fn control(&self, h_client: NvHandle, h_object: NvHandle, cmd: u32, params: &mut [u8]) -> u32 {
        let c = NVOS54_PARAMETERS {
            hClient: h_client,
            hObject: h_object,
            cmd,
            paramsSize: params.len() as u32,
            ..Default::default()
        };
        let mut arg = c.as_bytes().to_vec();
        assert_eq!(self.ioctl(NV_ESC_RM_CONTROL, &mut arg, params, &[]), 0);
        NVOS54_PARAMETERS::read_from_bytes(&arg).unwrap().status
    }
}

/// A daemon's files and handles after start-up.
struct Daemon {
    ctl: Ctl,
    h: NvHandle,
    event: OwnedFd,
    _gpu_files: Vec<File>,
}

const SESSION: NvHandle = 0xF1;

/// §1.6 "Start-up" on `server`, as IMEX node `node_id`.
fn start_daemon(server: &ServerHandle, node_dir: &Path, node_id: u16) -> Daemon {
    // The GPUs' device files stay open: `osIsGpuAccessible` looks for them among the
    // process's descriptors when a Device is allocated.
    let gpu_files: Vec<File> = (0..2)
        .map(|n| File::open(gpu_device_path(node_dir, n)).unwrap())
        .collect();
    let ctl = Ctl::open(server);
    let mut v = nv_ioctl_rm_api_version_t::query();
    let mut arg = v.as_bytes().to_vec();
    assert_eq!(
        ctl.ioctl(NV_ESC_CHECK_VERSION_STR, &mut arg, &mut [], &[]),
        0
    );
    v = nv_ioctl_rm_api_version_t::read_from_bytes(&arg).unwrap();
    assert_eq!(v.version(), "595.45.04");
    let (s, h) = ctl.alloc(0, 0, 0, NV01_ROOT_CLIENT, &mut [], &[]);
    assert_eq!(s, NV_OK);
    let mut probed = vec![0; Layout::V595.probed_ids_params_size()];
    assert_eq!(
        ctl.control(h, h, NV0000_CTRL_CMD_GPU_GET_PROBED_IDS, &mut probed),
        NV_OK
    );
    assert_eq!(
        parse_probed_ids(Layout::V595, &probed).unwrap(),
        [0x100, 0x200]
    );
    for i in 0..2u32 {
        let mut dev = NV0080_ALLOC_PARAMETERS {
            deviceId: i,
            ..Default::default()
        };
        let (s, _) = ctl.alloc(h, h, 0x100 + i, NV01_DEVICE_0, dev.as_mut_bytes(), &[]);
        assert_eq!(s, NV_OK);
        let mut sub = NV2080_ALLOC_PARAMETERS { subDeviceId: 0 };
        let (s, _) = ctl.alloc(
            h,
            0x100 + i,
            0x200 + i,
            NV20_SUBDEVICE_0,
            sub.as_mut_bytes(),
            &[],
        );
        assert_eq!(s, NV_OK);
    }
    let event: OwnedFd = nix::sys::eventfd::EventFd::from_flags(
        nix::sys::eventfd::EfdFlags::EFD_NONBLOCK | nix::sys::eventfd::EfdFlags::EFD_CLOEXEC,
    )
    .unwrap()
    .into();
    let ev = event.as_raw_fd();
    let mut e = nv_ioctl_alloc_os_event_t {
        hClient: h,
        hDevice: 0,
        fd: ev as u32,
        Status: 0,
    };
    let mut arg = e.as_bytes().to_vec();
    assert_eq!(
        ctl.ioctl(NV_ESC_ALLOC_OS_EVENT, &mut arg, &mut [], &[ev]),
        0
    );
    e = nv_ioctl_alloc_os_event_t::read_from_bytes(&arg).unwrap();
    assert_eq!(e.Status, NV_OK);
    let cap = File::open(cap_device_path(node_dir, IMEX_CAP_MINOR)).unwrap();
    let mut p = NV00F1_ALLOCATION_PARAMETERS {
        capDescriptor: cap.as_raw_fd() as u64,
        pOsEvent: ev as u64,
        nodeId: node_id,
        ..Default::default()
    };
    // Without the capability's descriptor the session is refused (`osRmCapAcquire`).
    let (s, _) = ctl.alloc(h, h, SESSION, NV_IMEX_SESSION, p.as_mut_bytes(), &[]);
    assert_eq!(s, NV_ERR_INSUFFICIENT_PERMISSIONS);
    let (s, hs) = ctl.alloc(
        h,
        h,
        SESSION,
        NV_IMEX_SESSION,
        p.as_mut_bytes(),
        &[cap.as_raw_fd()],
    );
    assert_eq!((s, hs), (NV_OK, SESSION));
    Daemon {
        ctl,
        h,
        event,
        _gpu_files: gpu_files,
    }
}

/// Waits up to 10 s for the eventfd to become readable; true if it did (and reads it).
fn signalled(event: &OwnedFd) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(event.as_fd(), PollFlags::POLLIN)];
    let ready = poll(&mut fds, PollTimeout::from(10_000u16)).unwrap() > 0;
    if ready {
        let mut b = [0u8; 8];
        nix::unistd::read(event, &mut b).unwrap();
    }
    ready
}

fn server(dir: &Path, slot: u16) -> ServerHandle {
    let c = DriverConfig {
        trace: Some(dir.join(format!("trace{slot}"))),
        hbm_bytes: 64 << 20,
        ..config(dir, slot)
    };
    Server::bind(&c).unwrap().spawn().unwrap()
}

#[test]
fn an_import_is_served_end_to_end_through_the_escapes() {
    let dir = TempDir::new("escapes");
    let (a, b) = (server(&dir.0, 0), server(&dir.0, 1));
    let (node_a, node_b) = (config(&dir.0, 0).node_dir, config(&dir.0, 1).node_dir);
    let da = start_daemon(&a, &node_a, 0);
    let db = start_daemon(&b, &node_b, 1);

    // A JSON session cannot be opened beside the escape path's: one per node.
    let other = Conn::open(&b);
    assert_eq!(
        status(other.call(Request::OpenSession { node_id: 9 })),
        NvStatus::InUse
    );

    // The application on A exports 3 pages of GPU 1; the one on B imports them.
    let exporter = Conn::open(&a);
    exporter.subscribe(&node_a, 0);
    let Response::Created {
        mem, file, offset, ..
    } = exporter.call(Request::Create {
        gpu: 1,
        size: 3 * PAGE_SIZE,
    })
    else {
        panic!("create");
    };
    let Response::Exported { handle } = exporter.call(Request::Export { mem }) else {
        panic!("export");
    };
    let uuid = FabricHandle::from_hex(&handle).unwrap().export_uuid;
    let importer = Conn::open(&b);
    importer.subscribe(&node_b, 0);
    let Response::Imported { import } = importer.call(Request::Import {
        handle,
        import_id: 7,
        wait_ms: 0,
    }) else {
        panic!("import");
    };

    // B's eventfd becomes readable; GET_FABRIC_EVENTS has the import.
    assert!(
        signalled(&db.event),
        "the import was posted to the OS event"
    );
    let mut params = vec![0; Layout::V595.fabric_events_params_size()];
    assert_eq!(
        db.ctl.control(
            db.h,
            SESSION,
            NV00F1_CTRL_CMD_GET_FABRIC_EVENTS,
            &mut params
        ),
        NV_OK
    );
    let (events, more) = parse_fabric_events_params(Layout::V595, &params).unwrap();
    assert!(!more);
    let [
        FabricEvent::Import {
            import_id: 7,
            index: 0,
            export_node: 0,
            channel: 0,
            export_uuid,
            ..
        },
    ] = events[..]
    else {
        panic!("one import event: {events:?}");
    };
    assert_eq!(export_uuid, uuid.0);

    // A: dup by UUID, IMPORT_MEM under the Subdevice of GPU 1, DESCRIBE.
    let mut dup = NV00E0_ALLOCATION_PARAMETERS::dup_by_uuid(uuid.0, 0);
    let (s, he) = da
        .ctl
        .alloc(da.h, da.h, 0xE0, NV_MEMORY_EXPORT, dup.as_mut_bytes(), &[]);
    assert_eq!(s, NV_OK);
    let mut im = NV00E0_CTRL_IMPORT_MEM_PARAMS::new(0, &[0xF8]).unwrap();
    assert_eq!(
        da.ctl
            .control(da.h, he, NV00E0_CTRL_CMD_IMPORT_MEM, im.as_mut_bytes()),
        NV_OK
    );
    assert_eq!(im.memInfos[0].hParent, 0x201);
    let mut req = Describe::request(Layout::V595, 0);
    assert_eq!(
        da.ctl
            .control(da.h, 0xF8, NV00F8_CTRL_CMD_DESCRIBE, &mut req),
        NV_OK
    );
    let d = Describe::decode(Layout::V595, &req).unwrap();
    assert_eq!((d.total_pfns, d.pfns.len()), (3, 3));

    // B: the imported reference and one VALIDATE: the application's import is ready at the
    // exporter's memory.
    let mut r = NV00FB_ALLOCATION_PARAMETERS {
        exportUuid: uuid.0,
        id: 7,
        ..Default::default()
    };
    let (s, href) = db.ctl.alloc(
        db.h,
        db.h,
        0xFB,
        NV_MEMORY_FABRIC_IMPORTED_REF,
        r.as_mut_bytes(),
        &[],
    );
    assert_eq!(s, NV_OK);
    let v = Validate {
        attrs: d.attrs,
        phys_attrs: d.phys_attrs,
        offset: 0,
        total_pfns: d.total_pfns,
        pfns: d.pfns.clone(),
        mem_flags: d.mem_flags,
        ..Default::default()
    };
    let mut vb = v.encode(Layout::V595).unwrap();
    assert_eq!(
        db.ctl
            .control(db.h, href, NV00FB_CTRL_CMD_VALIDATE, &mut vb),
        NV_OK
    );
    assert!(Validate::decode(Layout::V595, &vb).unwrap().done);
    match importer.call(Request::WaitImport {
        import,
        timeout_ms: 10_000,
    }) {
        Response::ImportReady {
            file: f,
            offset: o,
            size,
        } => {
            assert_eq!((f, o, size), (file, offset, 3 * PAGE_SIZE));
        }
        other => panic!("wait import: {other:?}"),
    }

    // The trace has one line per escape, in the documented format.
    let trace = std::fs::read_to_string(dir.0.join("trace1")).unwrap();
    let lines: Vec<&str> = trace.lines().collect();
    assert_eq!(lines[0], "CHECK_VERSION_STR - params=0 status=NV_OK");
    assert_eq!(lines[1], "RM_ALLOC 0x41 params=0 status=NV_OK");
    assert!(lines.contains(&"ALLOC_OS_EVENT - params=0 status=NV_OK"));
    assert!(lines.contains(&"RM_ALLOC 0xf1 params=32 status=NV_ERR_INSUFFICIENT_PERMISSIONS"));
    assert!(lines.contains(&"RM_ALLOC 0xf1 params=32 status=NV_OK"));
    assert!(lines.contains(&"RM_CONTROL 0xf10001 params=11272 status=NV_OK"));
    assert_eq!(
        lines.last(),
        Some(&"RM_CONTROL 0xfb0101 params=2136 status=NV_OK")
    );

    // A's daemon goes away holding its dups: the session is torn down with dangling exports
    // (§4): node ID 0xFFFF and fabric allocations disabled.
    drop(da);
    let until = Instant::now() + Duration::from_secs(10);
    while exporter.stats().session {
        assert!(Instant::now() < until, "A's session was not torn down");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(exporter.stats().node_id, 0xFFFF);
    assert_eq!(
        status(exporter.call(Request::Create {
            gpu: 0,
            size: PAGE_SIZE
        })),
        NvStatus::InvalidState
    );
    drop(db);
}

#[test]
fn an_unsupported_driver_version_is_refused_at_bind() {
    let dir = TempDir::new("escapes-version");
    let c = DriverConfig {
        driver_version: "570.999.99".into(),
        ..config(&dir.0, 0)
    };
    let err = Server::bind(&c).unwrap_err().to_string();
    assert!(err.contains("570.999.99"), "{err}");
    assert!(
        err.contains("595.45.04"),
        "the supported versions are named: {err}"
    );
}

/// A client of a fresh driver whose process holds GPU 0's device file open, with its root
/// client allocated.
struct HoldingGpu0 {
    ctl: Ctl,
    client: NvHandle,
    gpu0: File,
    node_dir: std::path::PathBuf,
    _server: ServerHandle,
    _dir: TempDir,
}

fn holding_gpu0(name: &str) -> HoldingGpu0 {
    let dir = TempDir::new(name);
    let server = server(&dir.0, 0);
    let node_dir = config(&dir.0, 0).node_dir;
    let gpu0 = File::open(gpu_device_path(&node_dir, 0)).unwrap();
    let ctl = Ctl::open(&server);
    let (s, client) = ctl.alloc(0, 0, 0, NV01_ROOT_CLIENT, &mut [], &[]);
    assert_eq!(s, NV_OK);
    HoldingGpu0 {
        ctl,
        client,
        gpu0,
        node_dir,
        _server: server,
        _dir: dir,
    }
}

/// `osIsGpuAccessible` (the reference's §1.6 step 2: a client may allocate a GPU's Device only
/// while its process holds that GPU's device file open) over the socket: the driver looks among
/// the caller's descriptors at each allocation, so a file opened later lets the next one
/// through and a file closed again stops the one after.
#[test]
fn a_device_is_allocated_only_while_the_caller_holds_the_gpus_file() {
    let t = holding_gpu0("escapes-gpu-file");
    let device = |handle: NvHandle, gpu: u32| t.ctl.alloc_devices(t.client, &[(handle, gpu)])[0];
    assert_eq!(device(0x100, 0), NV_OK, "GPU 0's file is held");
    assert_eq!(
        device(0x101, 1),
        NV_ERR_INSUFFICIENT_PERMISSIONS,
        "GPU 1's file is not"
    );
    let gpu1 = File::open(gpu_device_path(&t.node_dir, 1)).unwrap();
    assert_eq!(device(0x102, 1), NV_OK, "GPU 1's file is held now");
    drop(gpu1);
    drop(t.gpu0);
    assert_eq!(
        device(0x103, 0),
        NV_ERR_INSUFFICIENT_PERMISSIONS,
        "the check is made at each allocation, not remembered"
    );
}

/// A batch of allocations sent in one write (the simulated transport's stand-in for one
/// thread's consecutive ioctls, during which its process opens and closes nothing) is checked
/// against the files the process held when it sent the batch, each GPU on its own; the next
/// batch is checked against what it holds then.
#[test]
fn a_batch_of_device_allocations_is_checked_per_gpu_against_the_files_held_then() {
    let t = holding_gpu0("escapes-gpu-file-batch");
    let denied = NV_ERR_INSUFFICIENT_PERMISSIONS;
    assert_eq!(
        t.ctl.alloc_devices(t.client, &[(0x100, 0), (0x101, 1)]),
        [NV_OK, denied],
        "only GPU 0's file is held"
    );
    let gpu1 = File::open(gpu_device_path(&t.node_dir, 1)).unwrap();
    drop(t.gpu0);
    assert_eq!(
        t.ctl.alloc_devices(t.client, &[(0x103, 0), (0x104, 1)]),
        [denied, NV_OK],
        "the next batch sees the files held when it was sent"
    );
    drop(gpu1);
}
