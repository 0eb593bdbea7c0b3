//! `NV_IMEX_SESSION` (`class/cl00f1.h`): the IMEX daemon's session object.
//!
//! Parent: the client (`resource_list.h`: `RS_REQUIRED(NV00F1_ALLOCATION_PARAMETERS)`,
//! not multi-instance). Only one session can exist system-wide: a second one fails with
//! `NV_ERR_IN_USE` (`fabricSetImexEvent_IMPL`, `src/nvidia/src/kernel/compute/fabric.c`). A client that owns a session is "IMEX-capable" for the privileged
//! controls, so the daemon issues every privileged call on the session's client.
//!
//! Constructor checks (`imexsessionapiConstruct_IMPL`,
//! `src/nvidia/src/kernel/compute/imex_session_api.c`, same in 550.40.07 and 595.45.04):
//! `flags` must be 0, `pOsEvent` must be non-zero (so the event fd cannot be fd 0), and
//! `nodeId` must not be `0xFFFF` (`NV_FABRIC_INVALID_NODE_ID`), else
//! `NV_ERR_INVALID_ARGUMENT`; `pOsEvent` must name an OS event of this client
//! (`osUserHandleToKernelPtr`); `capDescriptor` must be an fd of the `fabric-imex-mgmt`
//! capability device, or, where capabilities are not implemented, the caller must be
//! admin (`NV_ERR_INSUFFICIENT_PERMISSIONS`).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `NV_IMEX_SESSION`.
pub const NV_IMEX_SESSION: u32 = 0xF1;

/// `NV00F1_ALLOC_FLAGS_DEFAULT`.
pub const NV00F1_ALLOC_FLAGS_DEFAULT: u32 = 0;
/// `NV00F1_ALLOC_DISABLE_CHANNEL_RECOVERY` (bit 0). Defined, and honoured on session
/// teardown, but the constructor rejects any non-zero `flags`, so it cannot be passed.
pub const NV00F1_ALLOC_DISABLE_CHANNEL_RECOVERY: u32 = 1 << 0;

/// `NV_FABRIC_INVALID_NODE_ID` (`src/nvidia/generated/g_fabric_nvoc.h`): not a valid
/// `nodeId`; also the node ID stamped into exports made while no IMEX session existed.
pub const NV_FABRIC_INVALID_NODE_ID: u16 = 0xFFFF;

/// `NV00F1_ALLOCATION_PARAMETERS` (class/cl00f1.h): allocation parameters of
/// [`NV_IMEX_SESSION`].
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F1_ALLOCATION_PARAMETERS {
    /// **File descriptor** of the opened `/dev/nvidia-caps/nvidia-cap<minor>` device
    /// (minor from `/proc/driver/nvidia/capabilities/fabric-imex-mgmt`), as a u64.
    pub capDescriptor: u64,
    /// Must be [`NV00F1_ALLOC_FLAGS_DEFAULT`] (0).
    pub flags: u32,
    /// Padding before the 8-byte-aligned `pOsEvent`.
    pub _pad0: [u8; 4],
    /// `NvP64`, but holds the **file descriptor** number registered with
    /// `NV_ESC_ALLOC_OS_EVENT` (non-zero).
    pub pOsEvent: u64,
    /// This node's ID in the IMEX domain (not 0xFFFF).
    pub nodeId: u16,
    /// Trailing padding.
    pub _pad1: [u8; 6],
}
assert_layout!(NV00F1_ALLOCATION_PARAMETERS, size = 32, align = 8,
    capDescriptor @ 0, flags @ 8, _pad0 @ 12, pOsEvent @ 16, nodeId @ 24, _pad1 @ 26);
