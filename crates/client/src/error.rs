//! CUDA-named errors ([`CuError`]) and how driver statuses map onto them.
//!
//! The driver answers with the real driver's `NV_ERR_*` statuses ([`NvStatus`]); an application
//! sees what libcuda would return for the same situation. The mapping ([`CuError::from_nv`]):
//!
//! | driver status                     | CUDA error                            |
//! |-----------------------------------|---------------------------------------|
//! | `NV_ERR_INSUFFICIENT_PERMISSIONS` | `CUDA_ERROR_NOT_PERMITTED` (800)      |
//! | `NV_ERR_STATE_IN_USE`             | `CUDA_ERROR_NOT_PERMITTED` (800)      |
//! | `NV_ERR_NOT_SUPPORTED`            | `CUDA_ERROR_NOT_SUPPORTED` (801)      |
//! | `NV_ERR_OBJECT_NOT_FOUND`         | `CUDA_ERROR_INVALID_HANDLE` (400)     |
//! | `NV_ERR_INVALID_OBJECT`           | `CUDA_ERROR_INVALID_HANDLE` (400): a failed import |
//! | `NV_ERR_INVALID_OBJECT_HANDLE`    | `CUDA_ERROR_INVALID_HANDLE` (400)     |
//! | `NV_ERR_INVALID_ARGUMENT`         | `CUDA_ERROR_INVALID_VALUE` (1), but `CUDA_ERROR_INVALID_HANDLE` (400) on calls whose argument is a handle (export, import, release: [`CuError::from_nv_on_handle`]) |
//! | `NV_ERR_NOT_READY`                | `CUDA_ERROR_NOT_READY` (600)          |
//! | `NV_ERR_INVALID_STATE`            | `CUDA_ERROR_ILLEGAL_STATE` (401)      |
//! | `NV_ERR_IN_USE`                   | `CUDA_ERROR_ILLEGAL_STATE` (401)      |
//! | `NV_ERR_NO_MEMORY`                | `CUDA_ERROR_OUT_OF_MEMORY` (2)        |
//! | `NV_ERR_RESET_REQUIRED`           | `CUDA_ERROR_LAUNCH_FAILED` (719)      |
//! | `NV_ERR_INVALID_DEVICE`           | `CUDA_ERROR_INVALID_DEVICE` (101): a multicast member of another clique, a bind on a GPU that did not join |
//! | `NV_ERR_INVALID_OPERATION`        | `CUDA_ERROR_ILLEGAL_STATE` (401): a multicast team already full |
//! | `NV_ERR_INSERT_DUPLICATE_NAME`    | `CUDA_ERROR_INVALID_VALUE` (1): a GPU added twice |
//! | `NV_ERR_GENERIC`                  | `CUDA_ERROR_UNKNOWN` (999)            |
//!
//! A failed import is always `NV_ERR_INVALID_OBJECT`, whatever went wrong between the daemons
//! (the export is gone, the exporter's daemon refused the channel, the exporter's node is
//! unreachable): the daemon fails it with VALIDATE's IMPORT_FAILED flag, which carries no status
//! (`docs/reference/driver-interface.md` §4 "Failed import"). Field reports of such failures read
//! `cuMemImportFromShareableHandle: invalid resource handle` (§3), which is this code.
//!
//! Errors of our own side: no driver socket is `CUDA_ERROR_NO_DEVICE` (100), a failed socket,
//! open or mmap call is `CUDA_ERROR_OPERATING_SYSTEM` (304), an answer that makes no sense for
//! the request is `CUDA_ERROR_UNKNOWN` (999).
//!
//! `NV_ERR_RESET_REQUIRED` means the driver disabled this client (its channels were RC'd after
//! the node it imported from was lost, or the IMEX session was torn down). On a real GPU the
//! work in flight faults and CUDA reports the sticky `CUDA_ERROR_LAUNCH_FAILED`: the context
//! can no longer be used, and neither can this [`Context`](crate::Context).

use std::path::PathBuf;

use openimex_simproto::proto::{NvStatus, WireError};

/// A CUDA driver API error. [`CuError::code`] is CUDA's number, [`CuError::name`] its name;
/// the text after the name says what happened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CuError {
    /// CUDA_ERROR_INVALID_VALUE (1): a bad argument (size 0, unknown GPU, malformed handle text).
    #[error("CUDA_ERROR_INVALID_VALUE (1): {0}")]
    InvalidValue(String),
    /// CUDA_ERROR_OUT_OF_MEMORY (2): the GPU's HBM is exhausted.
    #[error("CUDA_ERROR_OUT_OF_MEMORY (2): {0}")]
    OutOfMemory(String),
    /// CUDA_ERROR_NO_DEVICE (100): no driver answers on the node's socket.
    #[error(
        "CUDA_ERROR_NO_DEVICE (100): no GPU driver at {}: {reason} (is `openimex-lab gpu` running for this node?)",
        socket.display()
    )]
    NoDevice {
        /// The socket that was tried (`<node-dir>/dev/nvidiactl`).
        socket: PathBuf,
        /// Why connecting failed.
        reason: String,
    },
    /// CUDA_ERROR_INVALID_DEVICE (101): a GPU that cannot join this multicast team (another
    /// clique or bandwidth mode), or a bind on a GPU that did not join it.
    #[error("CUDA_ERROR_INVALID_DEVICE (101): {0}")]
    InvalidDevice(String),
    /// CUDA_ERROR_OPERATING_SYSTEM (304): an OS call failed (opening or mapping the memory).
    #[error("CUDA_ERROR_OPERATING_SYSTEM (304): {0}")]
    OperatingSystem(String),
    /// CUDA_ERROR_OPERATING_SYSTEM (304): the driver socket failed or closed mid-call.
    #[error("CUDA_ERROR_OPERATING_SYSTEM (304): {0}")]
    Transport(#[source] WireError),
    /// CUDA_ERROR_INVALID_HANDLE (400): a failed import (NV_ERR_INVALID_OBJECT: the daemons
    /// could not complete it, e.g. the export was freed or is on another channel), an unknown
    /// export on this node, a handle this context does not own.
    #[error("CUDA_ERROR_INVALID_HANDLE (400): {0}")]
    InvalidHandle(String),
    /// CUDA_ERROR_ILLEGAL_STATE (401): the node's IMEX daemon session went away while an
    /// import was in use, fabric allocation is disabled (a daemon died holding exports), or
    /// imported memory was mapped on a GPU whose cliqueId, bwMode or bwModeEpoch differs from
    /// the owner GPU's (the map check's NV_ERR_INVALID_STATE, §6.8).
    #[error("CUDA_ERROR_ILLEGAL_STATE (401): {0}")]
    IllegalState(String),
    /// CUDA_ERROR_NOT_READY (600): the import did not complete within the bound, or there is
    /// no IMEX daemon on this node to post it to (IMPORT_V2's NV_ERR_NOT_READY).
    #[error("CUDA_ERROR_NOT_READY (600): {0}")]
    NotReady(String),
    /// CUDA_ERROR_LAUNCH_FAILED (719): the driver disabled this client (see the module docs).
    #[error("CUDA_ERROR_LAUNCH_FAILED (719): {0}")]
    LaunchFailed(String),
    /// CUDA_ERROR_NOT_PERMITTED (800): no IMEX channel, or not the exporter's channel.
    #[error("CUDA_ERROR_NOT_PERMITTED (800): {0}")]
    NotPermitted(String),
    /// CUDA_ERROR_NOT_SUPPORTED (801): import of a handle exported while its node had no IMEX
    /// daemon (export node ID 0xFFFF), or a driver with no IMEX channels (channel count 0).
    #[error("CUDA_ERROR_NOT_SUPPORTED (801): {0}")]
    NotSupported(String),
    /// CUDA_ERROR_UNKNOWN (999): the driver answered something that does not fit the request.
    #[error("CUDA_ERROR_UNKNOWN (999): {0}")]
    Unknown(String),
}

impl CuError {
    /// The general mapping of a driver status (table in the module docs); the text is the
    /// status name.
    pub fn from_nv(status: NvStatus) -> CuError {
        Self::from_driver(status, &status.to_string(), false)
    }

    /// As [`CuError::from_nv`], for a call whose argument is a handle (export, import,
    /// release): there `NV_ERR_INVALID_ARGUMENT` means the handle is bad, `CUDA_ERROR_INVALID_HANDLE`.
    pub fn from_nv_on_handle(status: NvStatus) -> CuError {
        Self::from_driver(status, &status.to_string(), true)
    }

    /// The mapping, with the driver's detail text appended to the status name.
    pub(crate) fn from_driver(status: NvStatus, detail: &str, handle_arg: bool) -> CuError {
        let text = if detail.is_empty() || detail == status.to_string() {
            status.to_string()
        } else {
            format!("{status}: {detail}")
        };
        match status {
            NvStatus::InsufficientPermissions | NvStatus::StateInUse => Self::NotPermitted(text),
            NvStatus::NotSupported => Self::NotSupported(text),
            NvStatus::ObjectNotFound | NvStatus::InvalidObject | NvStatus::InvalidObjectHandle => {
                Self::InvalidHandle(text)
            }
            NvStatus::InvalidArgument if handle_arg => Self::InvalidHandle(text),
            NvStatus::InvalidArgument => Self::InvalidValue(text),
            NvStatus::NotReady => Self::NotReady(text),
            NvStatus::InvalidState | NvStatus::InUse => Self::IllegalState(text),
            NvStatus::NoMemory => Self::OutOfMemory(text),
            NvStatus::ResetRequired => Self::LaunchFailed(text),
            NvStatus::InvalidDevice => Self::InvalidDevice(text),
            NvStatus::InvalidOperation => Self::IllegalState(text),
            NvStatus::InsertDuplicateName => Self::InvalidValue(text),
            NvStatus::Generic => Self::Unknown(text),
        }
    }

    /// CUDA's numeric code (`CUresult`).
    pub fn code(&self) -> u32 {
        match self {
            Self::InvalidValue(_) => 1,
            Self::OutOfMemory(_) => 2,
            Self::NoDevice { .. } => 100,
            Self::InvalidDevice(_) => 101,
            Self::OperatingSystem(_) | Self::Transport(_) => 304,
            Self::InvalidHandle(_) => 400,
            Self::IllegalState(_) => 401,
            Self::NotReady(_) => 600,
            Self::LaunchFailed(_) => 719,
            Self::NotPermitted(_) => 800,
            Self::NotSupported(_) => 801,
            Self::Unknown(_) => 999,
        }
    }

    /// CUDA's name for the code, e.g. `"CUDA_ERROR_NOT_PERMITTED"`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::InvalidValue(_) => "CUDA_ERROR_INVALID_VALUE",
            Self::OutOfMemory(_) => "CUDA_ERROR_OUT_OF_MEMORY",
            Self::NoDevice { .. } => "CUDA_ERROR_NO_DEVICE",
            Self::InvalidDevice(_) => "CUDA_ERROR_INVALID_DEVICE",
            Self::OperatingSystem(_) | Self::Transport(_) => "CUDA_ERROR_OPERATING_SYSTEM",
            Self::InvalidHandle(_) => "CUDA_ERROR_INVALID_HANDLE",
            Self::IllegalState(_) => "CUDA_ERROR_ILLEGAL_STATE",
            Self::NotReady(_) => "CUDA_ERROR_NOT_READY",
            Self::LaunchFailed(_) => "CUDA_ERROR_LAUNCH_FAILED",
            Self::NotPermitted(_) => "CUDA_ERROR_NOT_PERMITTED",
            Self::NotSupported(_) => "CUDA_ERROR_NOT_SUPPORTED",
            Self::Unknown(_) => "CUDA_ERROR_UNKNOWN",
        }
    }
}

impl From<WireError> for CuError {
    fn from(e: WireError) -> Self {
        Self::Transport(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_statuses_map_to_cuda_codes() {
        let table = [
            (
                NvStatus::InsufficientPermissions,
                800,
                "CUDA_ERROR_NOT_PERMITTED",
            ),
            (NvStatus::NotReady, 600, "CUDA_ERROR_NOT_READY"),
            (NvStatus::InvalidState, 401, "CUDA_ERROR_ILLEGAL_STATE"),
            (NvStatus::InvalidObject, 400, "CUDA_ERROR_INVALID_HANDLE"),
            (NvStatus::NotSupported, 801, "CUDA_ERROR_NOT_SUPPORTED"),
            (NvStatus::ObjectNotFound, 400, "CUDA_ERROR_INVALID_HANDLE"),
            (NvStatus::InUse, 401, "CUDA_ERROR_ILLEGAL_STATE"),
            (NvStatus::StateInUse, 800, "CUDA_ERROR_NOT_PERMITTED"),
            (NvStatus::InvalidArgument, 1, "CUDA_ERROR_INVALID_VALUE"),
            (NvStatus::NoMemory, 2, "CUDA_ERROR_OUT_OF_MEMORY"),
            (
                NvStatus::InvalidObjectHandle,
                400,
                "CUDA_ERROR_INVALID_HANDLE",
            ),
            (NvStatus::ResetRequired, 719, "CUDA_ERROR_LAUNCH_FAILED"),
            (NvStatus::InvalidDevice, 101, "CUDA_ERROR_INVALID_DEVICE"),
            (NvStatus::InvalidOperation, 401, "CUDA_ERROR_ILLEGAL_STATE"),
            (NvStatus::InsertDuplicateName, 1, "CUDA_ERROR_INVALID_VALUE"),
            (NvStatus::Generic, 999, "CUDA_ERROR_UNKNOWN"),
        ];
        assert_eq!(table.len(), NvStatus::ALL.len());
        for (status, code, name) in table {
            let e = CuError::from_nv(status);
            assert_eq!((e.code(), e.name()), (code, name), "{status:?}");
            assert!(
                e.to_string().starts_with(&format!("{name} ({code}): ")),
                "{e}"
            );
            assert!(e.to_string().contains(&status.to_string()), "{e}");
        }
        // On handle-taking calls a bad argument is a bad handle; nothing else changes.
        for status in NvStatus::ALL {
            let on_handle = CuError::from_nv_on_handle(status);
            let expected = if status == NvStatus::InvalidArgument {
                400
            } else {
                CuError::from_nv(status).code()
            };
            assert_eq!(on_handle.code(), expected, "{status:?}");
        }
    }

    #[test]
    fn detail_follows_the_status_and_local_errors_have_codes() {
        let e = CuError::from_driver(
            NvStatus::InsufficientPermissions,
            "client has no IMEX channel",
            false,
        );
        assert_eq!(
            e.to_string(),
            "CUDA_ERROR_NOT_PERMITTED (800): NV_ERR_INSUFFICIENT_PERMISSIONS: client has no IMEX channel"
        );
        let e = CuError::NoDevice {
            socket: "/n/dev/nvidiactl".into(),
            reason: "not found".into(),
        };
        assert_eq!((e.code(), e.name()), (100, "CUDA_ERROR_NO_DEVICE"));
        assert!(
            e.to_string().contains("/n/dev/nvidiactl")
                && e.to_string().contains("openimex-lab gpu"),
            "{e}"
        );
        let e = CuError::from(WireError::Closed);
        assert_eq!((e.code(), e.name()), (304, "CUDA_ERROR_OPERATING_SYSTEM"));
        assert_eq!(CuError::Unknown(String::new()).code(), 999);
        assert_eq!(
            CuError::OperatingSystem(String::new()).name(),
            "CUDA_ERROR_OPERATING_SYSTEM"
        );
    }
}
