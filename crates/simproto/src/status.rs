//! The real driver's status codes (`NV_ERR_*`) that the simulation returns: what every
//! request of the driver protocol, the multicast controls and the probe answer report. A leaf,
//! so the message modules share it without importing one another.

use serde::{Deserialize, Serialize};

/// The real driver's status codes (`NV_ERR_*`) that the simulation returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum NvStatus {
    /// NV_ERR_INSUFFICIENT_PERMISSIONS: no channel, or a different channel than the exporter's.
    #[error("NV_ERR_INSUFFICIENT_PERMISSIONS")]
    InsufficientPermissions,
    /// NV_ERR_NOT_READY: the import has not completed yet; or IMPORT_V2 found no daemon session
    /// to post its MEM_IMPORT event to.
    #[error("NV_ERR_NOT_READY")]
    NotReady,
    /// NV_ERR_INVALID_STATE: no daemon session (it went away), or fabric allocation disabled.
    #[error("NV_ERR_INVALID_STATE")]
    InvalidState,
    /// NV_ERR_INVALID_OBJECT: the import failed (the daemon reported IMPORT_FAILED).
    #[error("NV_ERR_INVALID_OBJECT")]
    InvalidObject,
    /// NV_ERR_NOT_SUPPORTED: import of a packet whose export node ID is 0xFFFF (exported while
    /// no daemon ran: a single-node UUID), or channel subscription with a channel count of 0.
    #[error("NV_ERR_NOT_SUPPORTED")]
    NotSupported,
    /// NV_ERR_OBJECT_NOT_FOUND: unknown export UUID (freed, or never existed).
    #[error("NV_ERR_OBJECT_NOT_FOUND")]
    ObjectNotFound,
    /// NV_ERR_IN_USE: a second daemon session.
    #[error("NV_ERR_IN_USE")]
    InUse,
    /// NV_ERR_STATE_IN_USE: subscribing a client to a second, different channel.
    #[error("NV_ERR_STATE_IN_USE")]
    StateInUse,
    /// NV_ERR_INVALID_ARGUMENT: malformed request (bad handle bytes, size 0, unknown GPU …).
    #[error("NV_ERR_INVALID_ARGUMENT")]
    InvalidArgument,
    /// NV_ERR_NO_MEMORY: HBM exhausted.
    #[error("NV_ERR_NO_MEMORY")]
    NoMemory,
    /// NV_ERR_INVALID_OBJECT_HANDLE: a handle this client does not own.
    #[error("NV_ERR_INVALID_OBJECT_HANDLE")]
    InvalidObjectHandle,
    /// The client was disabled (its channels RC'd) by DISABLE_IMPORTERS or session teardown;
    /// every later GPU operation fails (NV_ERR_RESET_REQUIRED on real hardware).
    #[error("NV_ERR_RESET_REQUIRED")]
    ResetRequired,
    /// NV_ERR_INVALID_DEVICE: a multicast attach whose GPU's clique (or bandwidth mode) differs
    /// from the team's, or a bind on a GPU that did not attach (`mem_multicast_fabric.c`).
    #[error("NV_ERR_INVALID_DEVICE")]
    InvalidDevice,
    /// NV_ERR_INVALID_OPERATION: a multicast attach beyond the team's GPU count.
    #[error("NV_ERR_INVALID_OPERATION")]
    InvalidOperation,
    /// NV_ERR_INSERT_DUPLICATE_NAME: a GPU attached twice to one multicast object.
    #[error("NV_ERR_INSERT_DUPLICATE_NAME")]
    InsertDuplicateName,
    /// NV_ERR_GENERIC: what a multicast failure reported as NV_ERR_NOT_READY becomes.
    #[error("NV_ERR_GENERIC")]
    Generic,
}

impl NvStatus {
    /// Every status, for exhaustive tables and tests.
    pub const ALL: [NvStatus; 16] = [
        NvStatus::InsufficientPermissions,
        NvStatus::NotReady,
        NvStatus::InvalidState,
        NvStatus::InvalidObject,
        NvStatus::NotSupported,
        NvStatus::ObjectNotFound,
        NvStatus::InUse,
        NvStatus::StateInUse,
        NvStatus::InvalidArgument,
        NvStatus::NoMemory,
        NvStatus::InvalidObjectHandle,
        NvStatus::ResetRequired,
        NvStatus::InvalidDevice,
        NvStatus::InvalidOperation,
        NvStatus::InsertDuplicateName,
        NvStatus::Generic,
    ];
}
