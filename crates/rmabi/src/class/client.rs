//! The root client, device and subdevice classes: what a daemon allocates before anything
//! else (`class/cl0000.h`, `class/cl0001.h`, `nvos.h`, `class/cl0080.h`, `class/cl2080.h`).
//!
//! # Root client
//!
//! All three root class IDs are accepted from user space: `RmIoctl`'s `NV_ESC_RM_ALLOC`
//! case (`src/nvidia/arch/nvalloc/unix/src/escape.c`) rewrites `NV01_ROOT`,
//! `NV01_ROOT_NON_PRIV` and `NV01_ROOT_CLIENT` to `NV01_ROOT_CLIENT` before allocating, so
//! they behave identically. `nvos.h` asks new code to use [`NV01_ROOT_CLIENT`]; which one
//! nvidia-smi / libnvidia-ml pass cannot be read from source (they are closed). Use
//! `NV01_ROOT_CLIENT` with `hRoot = hObjectParent = hObjectNew` = the chosen client
//! handle (or 0 to let RM choose; RM returns the handle in `hObjectNew`).
//!
//! The allocation parameter is optional (`RS_OPTIONAL(NvHandle)` in `resource_list.h`):
//! `pAllocParms` may be 0 with `paramsSize` 0, or point to an `NvHandle` with
//! `paramsSize` 4. (`NV0000_ALLOCATION_PARAMETERS` in cl0000.h is kernel-internal and is
//! not what user space passes.) The root client must be allocated on the control device
//! (`/dev/nvidiactl`).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::NvHandle;

/// `NV01_ROOT` (cl0000.h).
pub const NV01_ROOT: u32 = 0x0;
/// `NV01_ROOT_NON_PRIV` (cl0001.h / nvos.h).
pub const NV01_ROOT_NON_PRIV: u32 = 0x1;
/// `NV01_ROOT_CLIENT` (nvos.h): the root class for user clients.
pub const NV01_ROOT_CLIENT: u32 = 0x41;

/// `NV01_DEVICE_0` (cl0080.h): a GPU (device), parent: the client. Parameters:
/// [`NV0080_ALLOC_PARAMETERS`].
pub const NV01_DEVICE_0: u32 = 0x80;
/// `NV20_SUBDEVICE_0` (cl2080.h): one GPU of a device, parent: the device. Parameters:
/// [`NV2080_ALLOC_PARAMETERS`].
pub const NV20_SUBDEVICE_0: u32 = 0x2080;

/// `NV_MAX_DEVICES` (nvlimits.h).
pub const NV_MAX_DEVICES: usize = 32;
/// `NV_MAX_SUBDEVICES` (nvlimits.h).
pub const NV_MAX_SUBDEVICES: usize = 8;

/// `NV0080_ALLOC_PARAMETERS` (class/cl0080.h): allocation parameters of
/// [`NV01_DEVICE_0`]. A daemon sets only `deviceId` = the `deviceInstance` returned by
/// `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2` (see [`crate::ctrl::nv0000`]) and leaves the rest 0.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV0080_ALLOC_PARAMETERS {
    /// Device instance (`deviceInstance` of GET_ID_INFO_V2).
    pub deviceId: u32,
    /// Client to share a VA space with (0: none).
    pub hClientShare: NvHandle,
    /// For dup-style allocation (0).
    pub hTargetClient: NvHandle,
    /// For dup-style allocation (0).
    pub hTargetDevice: NvHandle,
    /// `NV_DEVICE_ALLOCATION_FLAGS_*` (0).
    pub flags: u32,
    /// Padding before the 8-byte-aligned `vaSpaceSize`.
    pub _pad0: [u8; 4],
    /// VA space size (0: default).
    pub vaSpaceSize: u64,
    /// Internal VA start (0).
    pub vaStartInternal: u64,
    /// Internal VA limit (0).
    pub vaLimitInternal: u64,
    /// `NV_DEVICE_ALLOCATION_VAMODE_*` (0: default).
    pub vaMode: u32,
    /// Trailing padding.
    pub _pad1: [u8; 4],
}
assert_layout!(NV0080_ALLOC_PARAMETERS, size = 56, align = 8,
    deviceId @ 0, hClientShare @ 4, hTargetClient @ 8, hTargetDevice @ 12, flags @ 16,
    _pad0 @ 20, vaSpaceSize @ 24, vaStartInternal @ 32, vaLimitInternal @ 40, vaMode @ 48,
    _pad1 @ 52);

/// `NV2080_ALLOC_PARAMETERS` (class/cl2080.h): allocation parameters of
/// [`NV20_SUBDEVICE_0`].
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV2080_ALLOC_PARAMETERS {
    /// Subdevice instance (`subDeviceInstance` of GET_ID_INFO_V2; 0 without SLI).
    pub subDeviceId: u32,
}
assert_layout!(NV2080_ALLOC_PARAMETERS, size = 4, align = 4, subDeviceId @ 0);
