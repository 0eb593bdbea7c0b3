//! NVIDIA's RM ioctl interface served over the driver's state, byte for byte: what
//! `/dev/nvidiactl` does with `NV_ESC_*` escapes on a real node
//! (`docs/reference/driver-interface.md` §1), as a synchronous state machine over [`Rm`] with no
//! sockets: escape in ([`EscapeCall`]), reply out ([`Served`]). The socket server feeds it
//! (`server::escapes`); the unit tests drive it directly.
//!
//! - Each *file* ([`FileId`]: one connection, one open of `/dev/nvidiactl`) may allocate RM
//!   clients; every client maps to one client of [`Rm`] and has its own handle table
//!   (module `handles`). Closing the file frees every client allocated on it
//!   ([`RmApi::close_file`]).
//! - The escape layer checks each escape's argument size as `nv_validate_ioctls` does and
//!   answers a malformed call with the ioctl's `-EINVAL`; every RM-level error is the RM's
//!   status in the argument's `status` field, with the ioctl returning 0 (module `os` for the
//!   OS-level escapes, `alloc` for RM_ALLOC/RM_FREE, `control` for RM_CONTROL, `imex` for
//!   the IMEX classes' controls, `gpus` for GPU enumeration and the fabric probe).
//! - The structs, numbers and per-release layouts are `openimex-rmabi`'s; the layout served
//!   is the one of the driver version the node runs ([`RmApiConfig::layout`]).
//! - Every status returned names, in a doc comment, the kernel function whose path it
//!   follows (open-gpu-kernel-modules 595.45.04).
//!
//! The kernel does not require a version check before serving RM escapes: `nvidia_ioctl`
//! keeps no per-file "version checked" state and `RmIoctl` serves any escape on any open
//! control file, so neither does this module.

mod alloc;
mod control;
mod gpus;
mod handles;
mod imex;
mod os;
mod status;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::os::fd::{OwnedFd, RawFd};
use std::path::PathBuf;

use openimex_rmabi::Layout;
use openimex_rmabi::escape::{
    NV_ESC_ALLOC_OS_EVENT, NV_ESC_ATTACH_GPUS_TO_FD, NV_ESC_CHECK_VERSION_STR,
    NV_ESC_FREE_OS_EVENT, NV_ESC_REGISTER_FD, NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL, NV_ESC_RM_FREE,
};
use openimex_simproto::escape::{EscapeCall, EscapeReply};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::rm::{ClientId, Rm};

pub use gpus::gpu_id;
pub use status::status_name;

/// One open file of `/dev/nvidiactl` (the socket server uses its connection's number).
pub type FileId = u64;

/// What the escape layer is built with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RmApiConfig {
    /// The driver's version string (NV_ESC_CHECK_VERSION_STR, the procfs banner).
    pub version: String,
    /// The struct layouts served (`openimex_rmabi::layout_for(version)`).
    pub layout: Layout,
    /// The fabric-imex-mgmt capability's device file: a descriptor open on it (same device
    /// and inode when the session is allocated) is the privilege to open the IMEX session.
    pub cap_path: PathBuf,
}

/// Who issues an escape: the file it arrives on and what the kernel would know of the
/// calling process.
pub struct Caller<'a> {
    /// The file.
    pub file: FileId,
    /// `osIsAdministrator()`: the process may administer the system (the socket server: its
    /// peer's uid is 0). Admin clients pass `rmclientIsCapableOrAdmin` checks.
    pub admin: bool,
    /// `osIsGpuAccessible`: whether the calling process holds GPU `index`'s device file open
    /// (`nv_is_gpu_accessible` iterates the process's descriptors).
    pub gpu_accessible: &'a dyn Fn(u32) -> bool,
}

impl std::fmt::Debug for Caller<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("file", &self.file)
            .field("admin", &self.admin)
            .finish_non_exhaustive()
    }
}

/// The answer to one escape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// What goes back to the caller.
    pub reply: EscapeReply,
    /// The trace line (`<escape> <class or control> params=<size> status=<NV_STATUS>`).
    pub trace: String,
    /// Whether the escape may have changed what a blocked call waits for (an import's state,
    /// a pending unimport, a revocation): the server then wakes them.
    pub wakes: bool,
}

/// The IMEX session of the node, as the escape path opened it.
#[derive(Debug)]
struct SessionRec {
    /// The RM client holding the NV_IMEX_SESSION object.
    h_client: u32,
    /// The object.
    h_object: u32,
    /// The state machine's client of that RM client.
    rm: ClientId,
    /// The OS event it posts to (key of the OS event table).
    event: u64,
}

/// Per file: what the OS-level escapes set on it.
#[derive(Debug, Default)]
struct FileState {
    /// NV_ESC_ATTACH_GPUS_TO_FD's list (once per file).
    attached_gpus: Vec<u32>,
}

/// The escape layer's state. See the module doc.
#[derive(Debug)]
pub struct RmApi {
    config: RmApiConfig,
    clients: handles::Clients,
    events: os::OsEvents,
    files: HashMap<FileId, FileState>,
    session: Option<SessionRec>,
    /// [`Rm::events_posted`] when the session's OS event was last signalled.
    signalled: u64,
}

/// An escape's result before it is written back: the ioctl's return, the RM status (for
/// the trace; `None` when the escape layer refused the call before the RM saw it) and the
/// class or control it concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outcome {
    errno: i32,
    status: Option<u32>,
    what: Option<u32>,
    params_size: u32,
    wakes: bool,
}

impl Outcome {
    /// The escape layer's `-EINVAL`.
    fn einval() -> Self {
        Self {
            errno: nix::libc::EINVAL,
            status: None,
            what: None,
            params_size: 0,
            wakes: false,
        }
    }

    /// An OS-level escape that returned `status` in its argument (ioctl 0).
    fn os(status: u32) -> Self {
        Self {
            errno: 0,
            status: Some(status),
            what: None,
            params_size: 0,
            wakes: false,
        }
    }
}

impl RmApi {
    /// An escape layer with no clients.
    pub fn new(config: RmApiConfig) -> Self {
        Self {
            config,
            clients: handles::Clients::default(),
            events: os::OsEvents::default(),
            files: HashMap::new(),
            session: None,
            signalled: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RmApiConfig {
        &self.config
    }

    /// Serves one escape issued on `caller.file`.
    pub fn serve(&mut self, rm: &mut Rm, caller: &Caller<'_>, call: &EscapeCall) -> Served {
        let mut arg = call.arg.clone();
        let mut params = call.params.clone();
        self.files.entry(caller.file).or_default();
        let outcome = match self.validate_size(call.nr, arg.len()) {
            Err(()) => Outcome::einval(),
            Ok(()) => self.dispatch(rm, caller, call, &mut arg, &mut params),
        };
        let trace = format!(
            "{} {} params={} status={}",
            escape_name(call.nr),
            outcome
                .what
                .map_or_else(|| "-".to_owned(), |w| format!("{w:#x}")),
            outcome.params_size,
            outcome
                .status
                .map_or_else(|| "EINVAL".to_owned(), status_name),
        );
        Served {
            reply: EscapeReply {
                errno: outcome.errno,
                arg,
                params,
            },
            trace,
            wakes: outcome.wakes,
        }
    }

    /// `nv_validate_ioctls` (nv.c) with `rm_validate_ioctls` and `RmValidateIoctl`
    /// (osapi.c, escape.c): every escape has a fixed argument size (RM_ALLOC two: NVOS64 or
    /// NVOS21; ATTACH_GPUS_TO_FD a non-empty array of `NvU32`); another size, or an escape no
    /// table knows, is `-EINVAL` before anything runs. The escapes the kernel knows and the
    /// simulation does not serve (RM_DUP_OBJECT, RM_SHARE, the mapping escapes,
    /// IOCTL_XFER_CMD, CARD_INFO, …: nothing the IMEX daemon issues) are `-EINVAL` too.
    fn validate_size(&self, nr: u8, len: usize) -> Result<(), ()> {
        use openimex_rmabi::escape::{
            NVOS00_PARAMETERS, NVOS21_PARAMETERS, NVOS54_PARAMETERS, NVOS64_PARAMETERS,
            nv_ioctl_alloc_os_event_t, nv_ioctl_free_os_event_t, nv_ioctl_register_fd_t,
            nv_ioctl_rm_api_version_t,
        };
        use std::mem::size_of;
        let ok = match nr {
            NV_ESC_RM_ALLOC => {
                len == size_of::<NVOS64_PARAMETERS>() || len == size_of::<NVOS21_PARAMETERS>()
            }
            NV_ESC_RM_FREE => len == size_of::<NVOS00_PARAMETERS>(),
            NV_ESC_RM_CONTROL => len == size_of::<NVOS54_PARAMETERS>(),
            NV_ESC_REGISTER_FD => len == size_of::<nv_ioctl_register_fd_t>(),
            NV_ESC_ALLOC_OS_EVENT => len == size_of::<nv_ioctl_alloc_os_event_t>(),
            NV_ESC_FREE_OS_EVENT => len == size_of::<nv_ioctl_free_os_event_t>(),
            NV_ESC_CHECK_VERSION_STR => len == size_of::<nv_ioctl_rm_api_version_t>(),
            NV_ESC_ATTACH_GPUS_TO_FD => len != 0 && len.is_multiple_of(4),
            _ => false,
        };
        if ok { Ok(()) } else { Err(()) }
    }

    fn dispatch(
        &mut self,
        rm: &mut Rm,
        caller: &Caller<'_>,
        call: &EscapeCall,
        arg: &mut [u8],
        params: &mut [u8],
    ) -> Outcome {
        match call.nr {
            NV_ESC_CHECK_VERSION_STR => self.check_version(arg),
            NV_ESC_ALLOC_OS_EVENT => self.alloc_os_event(caller, call, arg),
            NV_ESC_FREE_OS_EVENT => self.free_os_event(arg),
            NV_ESC_ATTACH_GPUS_TO_FD => self.attach_gpus(rm, caller, arg),
            NV_ESC_REGISTER_FD => self.register_fd(),
            NV_ESC_RM_ALLOC => self.rm_alloc(rm, caller, call, arg, params),
            NV_ESC_RM_FREE => self.rm_free(rm, caller, arg),
            NV_ESC_RM_CONTROL => self.rm_control(rm, caller, arg, params),
            _ => Outcome::einval(),
        }
    }

    /// The file closed (`nvidia_close` → `rm_cleanup_file_private`): every client allocated
    /// on it is freed as RM_FREE of the client would, and its OS events go. Returns the
    /// unimports the frees posted, which the closing thread waits for.
    pub fn close_file(&mut self, rm: &mut Rm, file: FileId) -> Vec<u64> {
        let mine: Vec<u32> = self
            .clients
            .map
            .iter()
            .filter(|(_, c)| c.file == file)
            .map(|(&h, _)| h)
            .collect();
        let mut unimports = Vec::new();
        for h in mine {
            unimports.extend(self.free_client(rm, h));
        }
        self.events.free_file(file);
        self.files.remove(&file);
        unimports
    }

    /// Signals the session's OS event if the driver queued events since it last did
    /// (`osSetEvent` in `_fabricNotifyEvent`, called by every `fabricPostEventsV2`): writes 1
    /// to the event descriptor (an `eventfd` in the simulation). Call after every change.
    pub fn post_os_event(&mut self, rm: &Rm) {
        let posted = rm.events_posted();
        if posted == self.signalled {
            return;
        }
        self.signalled = posted;
        if let Some(s) = &self.session {
            self.events.signal(s.event);
        }
    }

    /// The file whose RM client holds the node's IMEX session, if the escape path opened one.
    pub fn session_file(&self) -> Option<FileId> {
        let s = self.session.as_ref()?;
        self.clients.map.get(&s.h_client).map(|c| c.file)
    }

    /// Whether RM client `h_client` is IMEX-capable (`_rmclientIsCapable` for
    /// NV_RM_CAP_SYS_FABRIC_IMEX_MGMT: it holds the NV_IMEX_SESSION object).
    fn capable(&self, h_client: u32) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| s.h_client == h_client)
    }
}

/// The escape's name in the trace (`NV_ESC_` dropped).
fn escape_name(nr: u8) -> String {
    match nr {
        NV_ESC_RM_ALLOC => "RM_ALLOC".into(),
        NV_ESC_RM_FREE => "RM_FREE".into(),
        NV_ESC_RM_CONTROL => "RM_CONTROL".into(),
        openimex_rmabi::escape::NV_ESC_RM_DUP_OBJECT => "RM_DUP_OBJECT".into(),
        NV_ESC_ALLOC_OS_EVENT => "ALLOC_OS_EVENT".into(),
        NV_ESC_FREE_OS_EVENT => "FREE_OS_EVENT".into(),
        NV_ESC_CHECK_VERSION_STR => "CHECK_VERSION_STR".into(),
        NV_ESC_ATTACH_GPUS_TO_FD => "ATTACH_GPUS_TO_FD".into(),
        NV_ESC_REGISTER_FD => "REGISTER_FD".into(),
        other => format!("ESCAPE_{other:#04x}"),
    }
}

/// Reads a `T` from the start of `bytes` (`None` if too short).
fn read<T: FromBytes>(bytes: &[u8]) -> Option<T> {
    T::read_from_prefix(bytes).ok().map(|(t, _)| t)
}

/// Writes `value` over the start of `bytes` (nothing if too short).
fn write<T: IntoBytes + Immutable>(bytes: &mut [u8], value: &T) {
    let v = value.as_bytes();
    if let Some(dst) = bytes.get_mut(..v.len()) {
        dst.copy_from_slice(v);
    }
}

/// The descriptor the caller knew as `number`, among those passed with the escape.
fn passed_fd(fds: &[(RawFd, OwnedFd)], number: i64) -> Option<&OwnedFd> {
    fds.iter()
        .find(|(n, _)| i64::from(*n) == number)
        .map(|(_, fd)| fd)
}
