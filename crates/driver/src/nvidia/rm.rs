//! The RM client of the `nvidia` backend: RM_ALLOC, RM_CONTROL and RM_FREE on one root
//! client, built from the ABI's structs ([`openimex_rmabi`]) and issued through the
//! [`Ctl`] transport. Every privileged call of the daemon goes through the one client that
//! owns the IMEX session (`reference/driver-interface.md` §1.2: "capable" is decided per
//! client).

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, Ordering};

use openimex_rmabi::class::client::NV01_ROOT_CLIENT;
use openimex_rmabi::escape::{
    NV_ESC_CHECK_VERSION_STR, NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL, NV_ESC_RM_FREE,
    NV_RM_API_VERSION_CMD_STRICT, NV_RM_API_VERSION_STRING_LENGTH, NVOS00_PARAMETERS,
    NVOS54_PARAMETERS, NVOS64_PARAMETERS, nv_ioctl_rm_api_version_t,
};
use openimex_rmabi::status::{self, NV_OK};
use openimex_rmabi::{AbiError, NvHandle};
use zerocopy::{FromBytes, IntoBytes};

use super::transport::{Ctl, TransportError};

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

/// One root client on an open control device.
#[derive(Debug)]
pub struct RmClient {
    ctl: Ctl,
    client: NvHandle,
    next: AtomicU32,
}

/// The driver's version string: NV_ESC_CHECK_VERSION_STR with QUERY.
pub fn query_version(ctl: &Ctl) -> Result<String, RmError> {
    let mut q = nv_ioctl_rm_api_version_t::query();
    ctl.ioctl(NV_ESC_CHECK_VERSION_STR, q.as_mut_bytes(), &mut [], &[])?;
    Ok(q.version())
}

/// The driver's version string ([`query_version`]), then a STRICT check with it, as the
/// driver's own libraries check theirs (the kernel keeps no per-file state of it).
pub fn check_version(ctl: &Ctl) -> Result<String, RmError> {
    let version = query_version(ctl)?;
    let mut strict = nv_ioctl_rm_api_version_t::query();
    strict.cmd = NV_RM_API_VERSION_CMD_STRICT;
    let n = version.len().min(NV_RM_API_VERSION_STRING_LENGTH - 1);
    strict.versionString[..n].copy_from_slice(&version.as_bytes()[..n]);
    ctl.ioctl(
        NV_ESC_CHECK_VERSION_STR,
        strict.as_mut_bytes(),
        &mut [],
        &[],
    )?;
    Ok(version)
}

impl RmClient {
    /// Allocates a root client (NV01_ROOT_CLIENT, handle chosen by the RM) on `ctl`.
    pub fn new(ctl: Ctl) -> Result<Self, RmError> {
        let mut arg = NVOS64_PARAMETERS {
            hClass: NV01_ROOT_CLIENT,
            ..Default::default()
        };
        ctl.ioctl(NV_ESC_RM_ALLOC, arg.as_mut_bytes(), &mut [], &[])?;
        check(arg.status, || "RM_ALLOC NV01_ROOT_CLIENT".into())?;
        Ok(Self {
            ctl,
            client: arg.hObjectNew,
            next: AtomicU32::new(FIRST_HANDLE),
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

    /// A handle for a new object of this client.
    pub fn new_handle(&self) -> NvHandle {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// RM_ALLOC of `class` under `parent` as `handle`, with `params` (in and out). Returns
    /// the status when it is NV_OK or a warning (e.g. NV_WARN_NOTHING_TO_DO, which creates
    /// no object); an error status is [`RmError::Status`].
    pub fn alloc(
        &self,
        parent: NvHandle,
        handle: NvHandle,
        class: u32,
        params: &mut [u8],
        pass: &[BorrowedFd<'_>],
    ) -> Result<u32, RmError> {
        let mut arg = NVOS64_PARAMETERS {
            hRoot: self.client,
            hObjectParent: parent,
            hObjectNew: handle,
            hClass: class,
            // The kernel follows this pointer to `params` (borrowed for the call); the
            // simulated driver gets `params` in the frame instead.
            pAllocParms: params.as_mut_ptr() as u64,
            paramsSize: params.len() as u32,
            ..Default::default()
        };
        self.ctl
            .ioctl(NV_ESC_RM_ALLOC, arg.as_mut_bytes(), params, pass)?;
        if is_error(arg.status) {
            return Err(RmError::Status {
                call: format!("RM_ALLOC class {class:#x}"),
                status: arg.status,
            });
        }
        Ok(arg.status)
    }

    /// RM_CONTROL `cmd` on `object` with `params` (in and out); warnings count as success.
    pub fn control(&self, object: NvHandle, cmd: u32, params: &mut [u8]) -> Result<u32, RmError> {
        let mut arg = NVOS54_PARAMETERS {
            hClient: self.client,
            hObject: object,
            cmd,
            params: params.as_mut_ptr() as u64,
            paramsSize: params.len() as u32,
            ..Default::default()
        };
        self.ctl
            .ioctl(NV_ESC_RM_CONTROL, arg.as_mut_bytes(), params, &[])?;
        if is_error(arg.status) {
            return Err(RmError::Status {
                call: format!("RM_CONTROL {cmd:#x}"),
                status: arg.status,
            });
        }
        Ok(arg.status)
    }

    /// RM_CONTROL with a typed parameter block.
    pub fn control_typed<T: FromBytes + IntoBytes>(
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
