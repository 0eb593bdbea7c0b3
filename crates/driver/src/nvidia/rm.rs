//! The RM client of the `nvidia` backend: RM_ALLOC, RM_CONTROL and RM_FREE on one root
//! client, built from the ABI's structs ([`openimex_rmabi`]) and issued through the
//! [`Ctl`] transport. Every privileged call of the daemon goes through the one client that
//! owns the IMEX session (`docs/reference/driver-interface.md` §1.2: "capable" is decided per
//! client).

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, Ordering};

use openimex_rmabi::class::alloc_params_size;
use openimex_rmabi::class::client::NV01_ROOT_CLIENT;
use openimex_rmabi::escape::{
    NV_ESC_CHECK_VERSION_STR, NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL, NV_ESC_RM_FREE,
    NVOS00_PARAMETERS, NVOS54_PARAMETERS, NVOS64_PARAMETERS, nv_ioctl_rm_api_version_t,
};
use openimex_rmabi::status::{self, NV_OK};
use openimex_rmabi::{AbiError, Layout, NvHandle};
use zerocopy::{FromBytes, IntoBytes};

use smallvec::SmallVec;

use super::transport::{Ctl, Escape, INLINE_CALLS, TransportError};

/// Errors of one RM call.
#[derive(Debug, thiserror::Error)]
pub enum RmError {
    /// The RM refused it with a status.
    #[error("{call} returned {}", status_text(*.status))]
    Status {
        /// What was called (escape and class or command).
        call: String,
        /// The NV_STATUS.
        status: u32,
    },
    /// The transport failed (the ioctl itself, or the driver went away).
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Bytes from the driver that do not fit the ABI.
    #[error("{call}: {source}")]
    Abi {
        /// What was called.
        call: String,
        /// What did not fit.
        source: AbiError,
    },
}

/// `NV_ERR_NAME (0x…)`.
pub fn status_text(code: u32) -> String {
    match status::status_name(code) {
        Some(name) => format!("{name} ({code:#x})"),
        None => format!("NV_STATUS {code:#x}"),
    }
}

/// The first handle the daemon picks for its objects (RM leaves the choice of non-client
/// handles to the caller; any value unused in the client works).
const FIRST_HANDLE: NvHandle = 0xcaf0_0001;

/// One root client on an open control device. Its calls are the daemon's only: every
/// parameter block is checked against the size the driver's version gives its class or
/// command (the kernel copies an allocation's parameters by the class's size, whatever
/// `paramsSize` says), and a command this crate does not know is not sent (some carry user
/// pointers the kernel would follow).
#[derive(Debug)]
pub struct RmClient {
    ctl: Ctl,
    layout: Layout,
    client: NvHandle,
    next: AtomicU32,
    /// Handles of freed objects, handed out again before new ones.
    free: std::sync::Mutex<Vec<NvHandle>>,
}

/// The driver's version string: NV_ESC_CHECK_VERSION_STR with QUERY. No STRICT check with it
/// after: it would compare the string with itself, and the kernel keeps no per-file state of
/// a check (`RmPerformVersionCheck`).
pub fn query_version(ctl: &Ctl) -> Result<String, RmError> {
    let mut q = nv_ioctl_rm_api_version_t::query();
    ctl.ioctl(NV_ESC_CHECK_VERSION_STR, q.as_mut_bytes(), &mut [], &[])?;
    Ok(q.version())
}

impl RmClient {
    /// Allocates a root client (NV01_ROOT_CLIENT, handle chosen by the RM) on `ctl`, for a
    /// driver of `layout`.
    pub fn new(ctl: Ctl, layout: Layout) -> Result<Self, RmError> {
        let mut arg = NVOS64_PARAMETERS {
            hClass: NV01_ROOT_CLIENT,
            ..Default::default()
        };
        ctl.ioctl(NV_ESC_RM_ALLOC, arg.as_mut_bytes(), &mut [], &[])?;
        check(arg.status, || "RM_ALLOC NV01_ROOT_CLIENT".into())?;
        Ok(Self {
            ctl,
            layout,
            client: arg.hObjectNew,
            next: AtomicU32::new(FIRST_HANDLE),
            free: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The client's handle.
    pub fn handle(&self) -> NvHandle {
        self.client
    }

    /// The transport.
    pub fn ctl(&self) -> &Ctl {
        &self.ctl
    }

    /// A handle for a new object of this client: a freed one, else the next never used.
    pub fn new_handle(&self) -> NvHandle {
        if let Some(h) = self.free.lock().ok().and_then(|mut f| f.pop()) {
            return h;
        }
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// `handle`'s object is gone (freed, or never created): the handle may be used again.
    pub fn recycle(&self, handle: NvHandle) {
        if let Ok(mut f) = self.free.lock() {
            f.push(handle);
        }
    }

    fn wrong_size(&self, what: &'static str, expected: Option<usize>, actual: usize) -> RmError {
        RmError::Abi {
            call: what.into(),
            source: openimex_rmabi::AbiError::WrongSize {
                what,
                layout: Some(self.layout),
                expected: expected.unwrap_or(0),
                actual,
            },
        }
    }

    /// RM_ALLOC of `class` under `parent` as `handle`, with `params` (in and out). Returns
    /// the status when it is NV_OK or a warning (e.g. NV_WARN_NOTHING_TO_DO, which creates
    /// no object); an error status is [`RmError::Status`].
    pub(crate) fn alloc(
        &self,
        parent: NvHandle,
        handle: NvHandle,
        class: u32,
        params: &mut [u8],
        pass: &[BorrowedFd<'_>],
    ) -> Result<u32, RmError> {
        let mut arg = self.alloc_arg(parent, handle, class, params)?;
        self.ctl
            .ioctl(NV_ESC_RM_ALLOC, arg.as_mut_bytes(), params, pass)?;
        alloc_status(class, arg.status)
    }

    /// RM_CONTROL `cmd` on `object` with `params` (in and out); warnings count as success.
    pub(crate) fn control(
        &self,
        object: NvHandle,
        cmd: u32,
        params: &mut [u8],
    ) -> Result<u32, RmError> {
        let mut arg = self.control_arg(object, cmd, params)?;
        self.ctl
            .ioctl(NV_ESC_RM_CONTROL, arg.as_mut_bytes(), params, &[])?;
        control_status(cmd, arg.status)
    }

    /// RM calls whose parameters need nothing from one another's answers, made in order as
    /// one batch of the transport ([`Ctl::ioctls`]: one wait for the simulated driver instead
    /// of one per call). Every call is made; the first that failed, in order, is the error, and
    /// each call's parameters hold what the driver copied back.
    pub(crate) fn calls(&self, calls: &mut [RmCall<'_>]) -> Result<(), RmError> {
        self.calls_each(calls)?.into_iter().collect()
    }

    /// [`RmClient::calls`], each call's outcome returned in order; the error of the whole is a
    /// parameter block of the wrong size (nothing made) or the driver lost.
    pub(crate) fn calls_each(
        &self,
        calls: &mut [RmCall<'_>],
    ) -> Result<SmallVec<[Result<(), RmError>; INLINE_CALLS]>, RmError> {
        let mut prepared: SmallVec<[Prepared<'_>; INLINE_CALLS]> =
            SmallVec::with_capacity(calls.len());
        for call in calls.iter_mut() {
            prepared.push(match call {
                RmCall::Alloc {
                    parent,
                    handle,
                    class,
                    params,
                } => Prepared::Alloc(self.alloc_arg(*parent, *handle, *class, params)?, params),
                RmCall::Control {
                    object,
                    cmd,
                    params,
                } => Prepared::Control(self.control_arg(*object, *cmd, params)?, params),
                RmCall::Escape { nr, arg } => Prepared::Escape(*nr, arg),
            });
        }
        let mut escapes: SmallVec<[Escape<'_>; INLINE_CALLS]> = (prepared.iter_mut())
            .map(|p| match p {
                Prepared::Alloc(a, params) => Escape {
                    nr: NV_ESC_RM_ALLOC,
                    arg: a.as_mut_bytes(),
                    params,
                },
                Prepared::Control(a, params) => Escape {
                    nr: NV_ESC_RM_CONTROL,
                    arg: a.as_mut_bytes(),
                    params,
                },
                Prepared::Escape(nr, arg) => Escape {
                    nr: *nr,
                    arg,
                    params: &mut [],
                },
            })
            .collect();
        let done = self.ctl.ioctls(&mut escapes)?;
        drop(escapes);
        Ok((prepared.iter().zip(done))
            .map(|(p, outcome)| {
                outcome?;
                match p {
                    Prepared::Alloc(a, _) => alloc_status(a.hClass, a.status).map(drop),
                    Prepared::Control(a, _) => control_status(a.cmd, a.status).map(drop),
                    Prepared::Escape(..) => Ok(()),
                }
            })
            .collect())
    }

    /// The argument of an RM_ALLOC, its parameters checked against the class's size for
    /// this driver (the kernel copies them by that size, whatever `paramsSize` says).
    fn alloc_arg(
        &self,
        parent: NvHandle,
        handle: NvHandle,
        class: u32,
        params: &mut [u8],
    ) -> Result<NVOS64_PARAMETERS, RmError> {
        let size = alloc_params_size(self.layout, class);
        if size != Some(params.len()) {
            return Err(self.wrong_size("RM_ALLOC parameters", size, params.len()));
        }
        Ok(NVOS64_PARAMETERS {
            hRoot: self.client,
            hObjectParent: parent,
            hObjectNew: handle,
            hClass: class,
            // The kernel follows this pointer to `params` (borrowed for the call); the
            // simulated driver gets `params` in the frame instead.
            pAllocParms: user_pointer(params),
            paramsSize: params.len() as u32,
            ..Default::default()
        })
    }

    /// The argument of an RM_CONTROL, its parameters checked against the command's size.
    fn control_arg(
        &self,
        object: NvHandle,
        cmd: u32,
        params: &mut [u8],
    ) -> Result<NVOS54_PARAMETERS, RmError> {
        let size = self.layout.control_params_size(cmd);
        if size != Some(params.len()) {
            return Err(self.wrong_size("RM_CONTROL parameters", size, params.len()));
        }
        Ok(NVOS54_PARAMETERS {
            hClient: self.client,
            hObject: object,
            cmd,
            params: user_pointer(params),
            paramsSize: params.len() as u32,
            ..Default::default()
        })
    }

    /// RM_CONTROL with a typed parameter block.
    pub(crate) fn control_typed<T: FromBytes + IntoBytes>(
        &self,
        object: NvHandle,
        cmd: u32,
        params: &mut T,
    ) -> Result<u32, RmError> {
        self.control(object, cmd, params.as_mut_bytes())
    }

    /// RM_FREE of `object` under `parent` (and everything under it).
    pub fn free(&self, parent: NvHandle, object: NvHandle) -> Result<(), RmError> {
        let mut arg = NVOS00_PARAMETERS {
            hRoot: self.client,
            hObjectParent: parent,
            hObjectOld: object,
            ..Default::default()
        };
        self.ctl
            .ioctl(NV_ESC_RM_FREE, arg.as_mut_bytes(), &mut [], &[])?;
        check(arg.status, || format!("RM_FREE {object:#x}"))
    }
}

impl Drop for RmClient {
    fn drop(&mut self) {
        // Freeing the client frees every object under it (the session with it); closing the
        // descriptor would do the same, this says it first.
        let _ = self.free(self.client, self.client);
    }
}

/// One call of [`RmClient::calls`].
#[derive(Debug)]
pub(crate) enum RmCall<'a> {
    /// RM_ALLOC of `class` under `parent` as `handle` ([`RmClient::alloc`], no descriptors).
    Alloc {
        /// The parent object.
        parent: NvHandle,
        /// The new object's handle.
        handle: NvHandle,
        /// Its class.
        class: u32,
        /// The class's parameters (in and out).
        params: &'a mut [u8],
    },
    /// RM_CONTROL `cmd` on `object` ([`RmClient::control`]).
    Control {
        /// The object.
        object: NvHandle,
        /// The command.
        cmd: u32,
        /// The command's parameters (in and out).
        params: &'a mut [u8],
    },
    /// Another escape with its argument (in and out) and no parameters or descriptors, as
    /// [`Ctl::ioctl`] makes it: its errno is its only failure.
    Escape {
        /// The escape number.
        nr: u8,
        /// Its argument.
        arg: &'a mut [u8],
    },
}

/// One call of a batch: the argument it is made with (kept to read its status after) and
/// the caller's bytes.
enum Prepared<'c> {
    Alloc(NVOS64_PARAMETERS, &'c mut [u8]),
    Control(NVOS54_PARAMETERS, &'c mut [u8]),
    Escape(u8, &'c mut [u8]),
}

/// An RM_ALLOC's status: NV_OK or a warning returned, an error as [`RmError::Status`].
fn alloc_status(class: u32, status: u32) -> Result<u32, RmError> {
    check(status, || format!("RM_ALLOC class {class:#x}")).map(|()| status)
}

/// An RM_CONTROL's status, as [`alloc_status`].
fn control_status(cmd: u32, status: u32) -> Result<u32, RmError> {
    check(status, || format!("RM_CONTROL {cmd:#x}")).map(|()| status)
}

/// The user pointer of a parameter block: 0 for none (the kernel refuses a pointer with a
/// size of 0, and would read an optional block through any pointer it is given).
fn user_pointer(params: &mut [u8]) -> u64 {
    if params.is_empty() {
        0
    } else {
        params.as_mut_ptr() as u64
    }
}

/// An NV_STATUS that is an error: warnings (0x1xxxx) and NV_OK are not.
pub fn is_error(status: u32) -> bool {
    status != NV_OK && status & 0xffff_0000 != 0x0001_0000
}

/// An error status as [`RmError::Status`], naming the call (made only then: the daemon's
/// calls allocate nothing on success).
fn check(status: u32, call: impl FnOnce() -> String) -> Result<(), RmError> {
    if is_error(status) {
        return Err(RmError::Status {
            call: call(),
            status,
        });
    }
    Ok(())
}
