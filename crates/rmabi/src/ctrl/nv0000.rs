//! Root-client (`NV01_ROOT*`) controls: GPU enumeration (`ctrl/ctrl0000/ctrl0000gpu.h`)
//! and IMEX channel subscription (`ctrl/ctrl0000/ctrl0000client.h`). Addressed to the
//! client handle itself (`hObject = hClient`).
//!
//! GPU bootstrap of a root client: `GET_PROBED_IDS` (every GPU RM knows) →
//! `ATTACH_IDS` (initialise them; or `NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS`) →
//! `GET_ATTACHED_IDS` → per GPU `GET_ID_INFO_V2` (gives `deviceInstance` for
//! `NV0080_ALLOC_PARAMETERS.deviceId` and `subDeviceInstance` for
//! `NV2080_ALLOC_PARAMETERS.subDeviceId`) and `GET_UUID_FROM_GPU_ID` (the GPU UUID; only
//! for attached GPUs, else `NV_ERR_OBJECT_NOT_FOUND`). GPU ID arrays are terminated by
//! [`NV0000_CTRL_GPU_INVALID_ID`] ([`valid_gpu_ids`]).
//!
//! `GET_PROBED_IDS` gained `gpuFlags[32]` in 580.65.06 (256 → 384 bytes); the rest did not
//! change between 550.40.07 and 595.45.04.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::class::client::NV_MAX_DEVICES;
use crate::ctrl::DrfField;
use crate::{AbiError, Layout, read_exact};

/// `NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS`.
pub const NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS: u32 = 0x201;
/// `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2`.
pub const NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2: u32 = 0x205;
/// `NV0000_CTRL_CMD_GPU_GET_PROBED_IDS`.
pub const NV0000_CTRL_CMD_GPU_GET_PROBED_IDS: u32 = 0x214;
/// `NV0000_CTRL_CMD_GPU_ATTACH_IDS`.
pub const NV0000_CTRL_CMD_GPU_ATTACH_IDS: u32 = 0x215;
/// `NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID`.
pub const NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID: u32 = 0x275;
/// `NV0000_CTRL_CMD_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL`.
pub const NV0000_CTRL_CMD_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL: u32 = 0xD08;

/// `NV0000_CTRL_GPU_MAX_ATTACHED_GPUS`.
pub const NV0000_CTRL_GPU_MAX_ATTACHED_GPUS: usize = 32;
/// `NV0000_CTRL_GPU_MAX_PROBED_GPUS` (= `NV_MAX_DEVICES`).
pub const NV0000_CTRL_GPU_MAX_PROBED_GPUS: usize = NV_MAX_DEVICES;
/// `NV0000_CTRL_GPU_INVALID_ID`: terminates GPU ID arrays.
pub const NV0000_CTRL_GPU_INVALID_ID: u32 = 0xFFFF_FFFF;
/// `NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS`: as the first `ATTACH_IDS` entry, attach all.
pub const NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS: u32 = 0xFFFF;
/// `NV0000_GPU_MAX_GID_LENGTH`.
pub const NV0000_GPU_MAX_GID_LENGTH: usize = 0x100;

/// `NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT` (bits 1:0 of `flags`).
pub const NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT: DrfField = DrfField::new(1, 0);
/// `..._FLAGS_FORMAT_ASCII`: `"GPU-xxxxxxxx-…"` text.
pub const NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT_ASCII: u32 = 0;
/// `..._FLAGS_FORMAT_BINARY`: raw bytes.
pub const NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT_BINARY: u32 = 2;
/// `NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE` (bit 2 of `flags`).
pub const NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE: DrfField = DrfField::new(2, 2);
/// `..._FLAGS_TYPE_SHA1`: the usual 16-byte GPU UUID.
pub const NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE_SHA1: u32 = 0;
/// `..._FLAGS_TYPE_SHA256`.
pub const NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE_SHA256: u32 = 1;

/// The GPU IDs before the first [`NV0000_CTRL_GPU_INVALID_ID`] (and skipping zeros).
pub fn valid_gpu_ids(ids: &[u32]) -> Vec<u32> {
    ids.iter()
        .copied()
        .take_while(|&id| id != NV0000_CTRL_GPU_INVALID_ID)
        .filter(|&id| id != 0)
        .collect()
}

/// `NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS` (ctrl0000gpu.h). Output only.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS {
    /// Attached GPU IDs, terminated by `NV0000_CTRL_GPU_INVALID_ID`.
    pub gpuIds: [u32; NV0000_CTRL_GPU_MAX_ATTACHED_GPUS],
}
assert_layout!(NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS, size = 128, align = 4, gpuIds @ 0);

/// `NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS` (ctrl0000gpu.h) of 550.40.07 … 575.64.05.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V550 {
    /// Probed GPU IDs, terminated by `NV0000_CTRL_GPU_INVALID_ID`.
    pub gpuIds: [u32; NV0000_CTRL_GPU_MAX_PROBED_GPUS],
    /// Excluded GPU IDs, terminated the same way.
    pub excludedGpuIds: [u32; NV0000_CTRL_GPU_MAX_PROBED_GPUS],
}
assert_layout!(NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V550, size = 256, align = 4, gpuIds @ 0, excludedGpuIds @ 128);

/// `NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS` (ctrl0000gpu.h) of 580.65.06 on.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580 {
    /// Probed GPU IDs, terminated by `NV0000_CTRL_GPU_INVALID_ID`.
    pub gpuIds: [u32; NV0000_CTRL_GPU_MAX_PROBED_GPUS],
    /// Excluded GPU IDs, terminated the same way.
    pub excludedGpuIds: [u32; NV0000_CTRL_GPU_MAX_PROBED_GPUS],
    /// Per `gpuIds` entry: `NV0000_CTRL_GPU_PROBED_ID_FLAGS_*` (bit 0: SOC display).
    pub gpuFlags: [u32; NV0000_CTRL_GPU_MAX_PROBED_GPUS],
}
assert_layout!(NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580, size = 384, align = 4,
    gpuIds @ 0, excludedGpuIds @ 128, gpuFlags @ 256);

/// `NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS` of the V590 family: the same layout as V580.
pub type NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V590 = NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580;
/// `NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS` of the V595 family: the same layout as V580.
pub type NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V595 = NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580;

/// The probed GPU IDs from a `GET_PROBED_IDS` block of `layout` (up to the terminator).
pub fn parse_probed_ids(layout: Layout, bytes: &[u8]) -> Result<Vec<u32>, AbiError> {
    const WHAT: &str = "NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS";
    Ok(match layout {
        Layout::V550 => valid_gpu_ids(
            &read_exact::<NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V550>(WHAT, Some(layout), bytes)?
                .gpuIds,
        ),
        _ => valid_gpu_ids(
            &read_exact::<NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580>(WHAT, Some(layout), bytes)?
                .gpuIds,
        ),
    })
}

/// `NV0000_CTRL_GPU_ATTACH_IDS_PARAMS` (ctrl0000gpu.h).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_ATTACH_IDS_PARAMS {
    /// In: GPU IDs to attach, terminated by `NV0000_CTRL_GPU_INVALID_ID` (or
    /// `NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS` first).
    pub gpuIds: [u32; NV0000_CTRL_GPU_MAX_PROBED_GPUS],
    /// Out: the ID that failed to attach (the others were detached again).
    pub failedId: u32,
}
assert_layout!(NV0000_CTRL_GPU_ATTACH_IDS_PARAMS, size = 132, align = 4, gpuIds @ 0, failedId @ 128);

impl NV0000_CTRL_GPU_ATTACH_IDS_PARAMS {
    /// Parameters attaching `ids` (at most 32; the rest of the table is
    /// `NV0000_CTRL_GPU_INVALID_ID`).
    pub fn new(ids: &[u32]) -> Result<Self, AbiError> {
        if ids.len() > NV0000_CTRL_GPU_MAX_PROBED_GPUS {
            return Err(AbiError::TooManyEntries {
                what: "NV0000_CTRL_GPU_ATTACH_IDS_PARAMS.gpuIds",
                count: ids.len(),
                max: NV0000_CTRL_GPU_MAX_PROBED_GPUS,
            });
        }
        let mut gpuIds = [NV0000_CTRL_GPU_INVALID_ID; NV0000_CTRL_GPU_MAX_PROBED_GPUS];
        gpuIds[..ids.len()].copy_from_slice(ids);
        Ok(Self {
            gpuIds,
            failedId: 0,
        })
    }

    /// Parameters attaching every probed GPU.
    pub fn all_probed() -> Self {
        let mut gpuIds = [NV0000_CTRL_GPU_INVALID_ID; NV0000_CTRL_GPU_MAX_PROBED_GPUS];
        gpuIds[0] = NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS;
        Self {
            gpuIds,
            failedId: 0,
        }
    }
}

/// `NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS` (ctrl0000gpu.h). `gpuId` in, the rest out.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS {
    /// In: GPU ID (`NV_ERR_INVALID_ARGUMENT` if unknown).
    pub gpuId: u32,
    /// `NV0000_CTRL_GPU_ID_INFO_*` flags.
    pub gpuFlags: u32,
    /// Device instance: `NV0080_ALLOC_PARAMETERS.deviceId`.
    pub deviceInstance: u32,
    /// Subdevice instance: `NV2080_ALLOC_PARAMETERS.subDeviceId`.
    pub subDeviceInstance: u32,
    /// `NV0000_CTRL_SLI_STATUS_*`.
    pub sliStatus: u32,
    /// Board ID.
    pub boardId: u32,
    /// GPU instance number (probe order).
    pub gpuInstance: u32,
    /// NUMA node, or -1.
    pub numaId: i32,
}
assert_layout!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, size = 32, align = 4,
    gpuId @ 0, gpuFlags @ 4, deviceInstance @ 8, subDeviceInstance @ 12, sliStatus @ 16,
    boardId @ 20, gpuInstance @ 24, numaId @ 28);

/// `NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS` (ctrl0000gpu.h). `gpuId` and `flags` in.
/// RM copies `uuidStrLen` bytes into `gpuUuid`; with `FORMAT_BINARY | TYPE_SHA1` that is
/// the 16-byte GPU UUID.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS {
    /// In: GPU ID (must be attached).
    pub gpuId: u32,
    /// In: `NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_*`.
    pub flags: u32,
    /// Out: the UUID (text or bytes).
    pub gpuUuid: [u8; NV0000_GPU_MAX_GID_LENGTH],
    /// Out: valid bytes in `gpuUuid`.
    pub uuidStrLen: u32,
}
assert_layout!(NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS, size = 268, align = 4,
    gpuId @ 0, flags @ 4, gpuUuid @ 8, uuidStrLen @ 264);

impl NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS {
    /// A request for the binary SHA-1 UUID of `gpu_id`.
    pub fn binary(gpu_id: u32) -> Self {
        Self {
            gpuId: gpu_id,
            flags: NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT_BINARY,
            ..Self::default()
        }
    }

    /// The returned UUID bytes (`uuidStrLen` of them, capped at the array size).
    pub fn uuid(&self) -> &[u8] {
        &self.gpuUuid[..(self.uuidStrLen as usize).min(NV0000_GPU_MAX_GID_LENGTH)]
    }
}

/// `NV0000_CTRL_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL_PARAMS` (ctrl0000client.h): the
/// application side (CUDA) subscribes its client to the channel of an opened
/// `/dev/nvidia-caps-imex-channels/channelN`. One channel per client for its lifetime
/// (a different one gives `NV_ERR_STATE_IN_USE`); a non-channel fd gives
/// `NV_ERR_INSUFFICIENT_PERMISSIONS`; no channels configured gives
/// `NV_ERR_NOT_SUPPORTED` (`cliresCtrlCmdClientSubscribeToImexChannel_IMPL`,
/// client_resource.c, 595.45.04). The header says `channel = -1` picks the first
/// accessible channel, but the implementation ignores the input `channel` and uses the
/// fd's minor.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV0000_CTRL_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL_PARAMS {
    /// **File descriptor** of the opened channel device.
    pub devDescriptor: u64,
    /// Out: the subscribed channel.
    pub channel: u32,
    /// Trailing padding.
    pub _pad0: [u8; 4],
}
assert_layout!(NV0000_CTRL_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL_PARAMS, size = 16, align = 8,
    devDescriptor @ 0, channel @ 8, _pad0 @ 12);

impl_zeroed_default!(
    NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS,
    NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V550,
    NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580,
    NV0000_CTRL_GPU_ATTACH_IDS_PARAMS,
    NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_id_tables() {
        assert_eq!(
            valid_gpu_ids(&[0x100, 0x200, NV0000_CTRL_GPU_INVALID_ID, 0x300]),
            vec![0x100, 0x200]
        );
        let a = NV0000_CTRL_GPU_ATTACH_IDS_PARAMS::new(&[7]).unwrap();
        assert_eq!(valid_gpu_ids(&a.gpuIds), vec![7]);
        assert!(NV0000_CTRL_GPU_ATTACH_IDS_PARAMS::new(&[1; 33]).is_err());
        let mut p = NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580 {
            gpuIds: [NV0000_CTRL_GPU_INVALID_ID; 32],
            ..Default::default()
        };
        p.gpuIds[0] = 0x4100;
        assert_eq!(
            parse_probed_ids(Layout::V580, p.as_bytes()).unwrap(),
            vec![0x4100]
        );
        assert!(parse_probed_ids(Layout::V550, p.as_bytes()).is_err());
    }
}
