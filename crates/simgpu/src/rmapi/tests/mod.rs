//! Unit tests of the escape layer, without sockets: nodes of the state machine on one fabric
//! directory, their applications played through [`Rm`]'s methods and their daemons through
//! escapes built with `openimex-rmabi`'s structs, as the daemon's RM backend builds them. Each
//! test names the kernel function (open-gpu-kernel-modules 595.45.04) or the section of
//! `docs/reference/driver-interface.md` whose behaviour it asserts.

mod clients;
mod errors;
mod multicast;
mod sequence;
mod validate;

use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use openimex_rmabi::NvHandle;
use openimex_rmabi::escape::{
    NV_ESC_ALLOC_OS_EVENT, NV_ESC_CHECK_VERSION_STR, NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL,
    NV_ESC_RM_FREE, NVOS00_PARAMETERS, NVOS54_PARAMETERS, NVOS64_PARAMETERS,
    nv_ioctl_alloc_os_event_t, nv_ioctl_rm_api_version_t,
};
use openimex_simproto::escape::EscapeCall;
use zerocopy::{FromBytes, IntoBytes};

use super::{Caller, RmApi, RmApiConfig, Served};
use crate::rm::{ClientId, Rm, RmConfig};

const MIB: u64 = 1 << 20;

/// The descriptor number a test's daemon gives its OS event and its capability descriptor.
const EVENT_FD: RawFd = 41;
const CAP_FD: RawFd = 42;

/// A fabric directory shared by the nodes of a test.
struct Domain {
    dir: openimex_harness::ScratchDir,
}

impl Domain {
    fn new(name: &str) -> Self {
        Self {
            dir: openimex_harness::ScratchDir::new(&format!("simgpu-rmapi-{name}")).unwrap(),
        }
    }

    /// Node `slot` (2 GPUs of 2 GiB, sparse) running driver `version`.
    fn node(&self, slot: u16, version: &str) -> Node {
        let root = self.dir.path();
        std::fs::create_dir_all(root.join("fabric")).unwrap();
        let rm = Rm::new(RmConfig {
            slot,
            gpus: 2,
            hbm_bytes: 2048 * MIB,
            fabric_dir: root.join("fabric"),
            cluster_uuid: [7; 16],
            clique_id: 1,
            probe: Default::default(),
            imex_channel_count: openimex_simproto::proto::DEFAULT_IMEX_CHANNEL_COUNT,
        })
        .unwrap();
        let node_dir = root.join(format!("node{slot}"));
        let cap = crate::server::node_files::create(&node_dir, 2, version).unwrap();
        let api = RmApi::new(RmApiConfig {
            version: version.to_owned(),
            layout: openimex_rmabi::layout_for(version).unwrap(),
            cap_path: cap.clone(),
        });
        Node {
            rm,
            api,
            cap,
            node_dir,
            trace: String::new(),
        }
    }
}

/// One node: the state machine and its escape layer.
struct Node {
    rm: Rm,
    api: RmApi,
    cap: PathBuf,
    node_dir: PathBuf,
    /// The trace line of the last escape.
    trace: String,
}

/// One open file of `/dev/nvidiactl` on a node, as a process sees it.
#[derive(Debug, Clone, Copy)]
struct File {
    id: u64,
    /// `osIsAdministrator` of the process.
    admin: bool,
    /// Whether the process holds the GPUs' device files open.
    gpus_open: bool,
}

/// A file of an unprivileged process that opened the GPU device files.
const fn file(id: u64) -> File {
    File {
        id,
        admin: false,
        gpus_open: true,
    }
}

impl Node {
    /// Issues escape `nr` on `f` with `arg`, `params` and the passed descriptors.
    fn escape(
        &mut self,
        f: File,
        nr: u8,
        arg: Vec<u8>,
        params: Vec<u8>,
        fds: Vec<(RawFd, OwnedFd)>,
    ) -> Served {
        let open = f.gpus_open;
        let gpu_accessible = move |_gpu: u32| open;
        let caller = Caller {
            file: f.id,
            admin: f.admin,
            gpu_accessible: &gpu_accessible,
        };
        let call = EscapeCall {
            nr,
            arg,
            params,
            fds,
        };
        let served = self.api.serve(&mut self.rm, &caller, &call);
        self.api.post_os_event(&self.rm);
        self.trace.clone_from(&served.trace);
        served
    }

    /// RM_ALLOC (NVOS64): (status, hObjectNew, the parameters copied back).
    #[expect(clippy::too_many_arguments, reason = "NVOS64's fields, one each")]
    fn alloc(
        &mut self,
        f: File,
        h_root: NvHandle,
        h_parent: NvHandle,
        h_new: NvHandle,
        class: u32,
        params: &[u8],
        fds: Vec<(RawFd, OwnedFd)>,
    ) -> (u32, NvHandle, Vec<u8>) {
        let a = NVOS64_PARAMETERS {
            hRoot: h_root,
            hObjectParent: h_parent,
            hObjectNew: h_new,
            hClass: class,
            paramsSize: params.len() as u32,
            ..Default::default()
        };
        let s = self.escape(
            f,
            NV_ESC_RM_ALLOC,
            a.as_bytes().to_vec(),
            params.to_vec(),
            fds,
        );
        assert_eq!(s.reply.errno, 0, "{}", s.trace);
        let out = NVOS64_PARAMETERS::read_from_bytes(&s.reply.arg).unwrap();
        (out.status, out.hObjectNew, s.reply.params)
    }

    /// RM_CONTROL: (status, the parameters copied back).
    fn control(
        &mut self,
        f: File,
        h_client: NvHandle,
        h_object: NvHandle,
        cmd: u32,
        params: &[u8],
    ) -> (u32, Vec<u8>) {
        let c = NVOS54_PARAMETERS {
            hClient: h_client,
            hObject: h_object,
            cmd,
            paramsSize: params.len() as u32,
            ..Default::default()
        };
        let s = self.escape(
            f,
            NV_ESC_RM_CONTROL,
            c.as_bytes().to_vec(),
            params.to_vec(),
            Vec::new(),
        );
        assert_eq!(s.reply.errno, 0, "{}", s.trace);
        let out = NVOS54_PARAMETERS::read_from_bytes(&s.reply.arg).unwrap();
        (out.status, s.reply.params)
    }

    /// RM_FREE: the status.
    fn free(&mut self, f: File, h_root: NvHandle, h_object: NvHandle) -> u32 {
        let p = NVOS00_PARAMETERS {
            hRoot: h_root,
            hObjectParent: h_root,
            hObjectOld: h_object,
            ..Default::default()
        };
        let s = self.escape(
            f,
            NV_ESC_RM_FREE,
            p.as_bytes().to_vec(),
            Vec::new(),
            Vec::new(),
        );
        assert_eq!(s.reply.errno, 0, "{}", s.trace);
        NVOS00_PARAMETERS::read_from_bytes(&s.reply.arg)
            .unwrap()
            .status
    }

    /// A root client allocated on `f` (the RM picks the handle).
    fn client(&mut self, f: File) -> NvHandle {
        let (s, h, _) = self.alloc(
            f,
            0,
            0,
            0,
            openimex_rmabi::class::NV01_ROOT_CLIENT,
            &[],
            Vec::new(),
        );
        assert_eq!(s, 0);
        h
    }

    /// The version check of `cmd` with `version`: (ioctl errno, the argument copied back).
    fn check_version(
        &mut self,
        f: File,
        cmd: u32,
        version: &str,
    ) -> (i32, nv_ioctl_rm_api_version_t) {
        let mut p = nv_ioctl_rm_api_version_t::query();
        p.cmd = cmd;
        p.versionString[..version.len()].copy_from_slice(version.as_bytes());
        let s = self.escape(
            f,
            NV_ESC_CHECK_VERSION_STR,
            p.as_bytes().to_vec(),
            Vec::new(),
            Vec::new(),
        );
        (
            s.reply.errno,
            nv_ioctl_rm_api_version_t::read_from_bytes(&s.reply.arg).unwrap(),
        )
    }

    /// NV_ESC_ALLOC_OS_EVENT of (hClient, `number`) passing `fd` as `number`: its Status.
    fn alloc_os_event(
        &mut self,
        f: File,
        h_client: NvHandle,
        number: RawFd,
        fd: Option<OwnedFd>,
    ) -> u32 {
        let p = nv_ioctl_alloc_os_event_t {
            hClient: h_client,
            hDevice: 0,
            fd: number as u32,
            Status: 0,
        };
        let fds = fd.map(|fd| vec![(number, fd)]).unwrap_or_default();
        let s = self.escape(
            f,
            NV_ESC_ALLOC_OS_EVENT,
            p.as_bytes().to_vec(),
            Vec::new(),
            fds,
        );
        assert_eq!(s.reply.errno, 0);
        nv_ioctl_alloc_os_event_t::read_from_bytes(&s.reply.arg)
            .unwrap()
            .Status
    }

    /// A descriptor open on the capability device.
    fn cap_fd(&self) -> OwnedFd {
        std::fs::File::open(&self.cap).unwrap().into()
    }

    /// A descriptor of GPU `n`'s device file (not the capability).
    fn gpu_fd(&self, n: u32) -> OwnedFd {
        let p = openimex_simproto::node_dir::gpu_device_path(&self.node_dir, n);
        std::fs::File::open(p).unwrap().into()
    }

    /// An application client subscribed to `channel` (the simulation protocol's side).
    fn app(&mut self, channel: u32) -> ClientId {
        let c = self.rm.connect();
        assert_eq!(self.rm.subscribe(c, channel), Ok(channel));
        c
    }
}

/// A non-blocking eventfd: the daemon's OS event, and the number it passes.
fn eventfd() -> (OwnedFd, OwnedFd) {
    use nix::sys::eventfd::{EfdFlags, EventFd};
    let e: OwnedFd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
        .unwrap()
        .into();
    let passed = e.try_clone().unwrap();
    (e, passed)
}

/// What a read of the eventfd finds: the posts since the last read (0: not readable).
fn posts(e: &OwnedFd) -> u64 {
    let mut b = [0u8; 8];
    match nix::unistd::read(e, &mut b) {
        Ok(8) => u64::from_ne_bytes(b),
        _ => 0,
    }
}

/// The path of a plain file in `dir` (a descriptor that is not the capability).
fn other_file(dir: &Path) -> OwnedFd {
    let p = dir.join("not-a-capability");
    std::fs::write(&p, b"").unwrap();
    std::fs::File::open(p).unwrap().into()
}
