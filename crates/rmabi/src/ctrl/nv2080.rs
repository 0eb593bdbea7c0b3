//! `NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO` (`ctrl/ctrl2080/ctrl2080gpu.h`), addressed to
//! a subdevice: the GPU's Fabric Manager probe state, cluster UUID, partition, clique ID
//! and fabric health.
//!
//! The parameter block gained `fabricHealthSummary` in 580.65.06 (48 → 56 bytes). The
//! health-mask fields and values were added over several releases (noted on each
//! constant); they are constants only and do not change the layout.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::ctrl::DrfField;
use crate::{AbiError, Layout, NvStatus, read_exact};

/// `NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO`.
pub const NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO: u32 = 0x2080_01A3;

/// `NV2080_CTRL_GPU_FABRIC_PROBE_STATE_UNSUPPORTED`.
pub const NV2080_CTRL_GPU_FABRIC_PROBE_STATE_UNSUPPORTED: u8 = 0;
/// `NV2080_CTRL_GPU_FABRIC_PROBE_STATE_NOT_STARTED`.
pub const NV2080_CTRL_GPU_FABRIC_PROBE_STATE_NOT_STARTED: u8 = 1;
/// `NV2080_CTRL_GPU_FABRIC_PROBE_STATE_IN_PROGRESS`.
pub const NV2080_CTRL_GPU_FABRIC_PROBE_STATE_IN_PROGRESS: u8 = 2;
/// `NV2080_CTRL_GPU_FABRIC_PROBE_STATE_COMPLETE`: `status` holds the probe result.
pub const NV2080_CTRL_GPU_FABRIC_PROBE_STATE_COMPLETE: u8 = 3;

/// `NV2080_GPU_FABRIC_CLUSTER_UUID_LEN`.
pub const NV2080_GPU_FABRIC_CLUSTER_UUID_LEN: usize = 16;

/// `NV2080_CTRL_GPU_FABRIC_PROBE_CAP_MC_SUPPORTED` (bit 0 of `fabricCaps`).
pub const NV2080_CTRL_GPU_FABRIC_PROBE_CAP_MC_SUPPORTED: u64 = 1 << 0;
/// `NV2080_CTRL_GPU_FABRIC_PROBE_CAP_MC_MUTLINODE_SUPPORTED` (bit 1; the header's spelling).
pub const NV2080_CTRL_GPU_FABRIC_PROBE_CAP_MC_MUTLINODE_SUPPORTED: u64 = 1 << 1;
/// `NV2080_CTRL_GPU_FABRIC_PROBE_CAP_UC_LOOPBACK_SUPPORTED` (bit 2; defined from 595.44.02).
pub const NV2080_CTRL_GPU_FABRIC_PROBE_CAP_UC_LOOPBACK_SUPPORTED: u64 = 1 << 2;

/// `NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW` (bits 1:0 of `fabricHealthMask`).
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW: DrfField = DrfField::new(1, 0);
/// `..._DEGRADED_BW_NOT_SUPPORTED`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_NOT_SUPPORTED: u32 = 0;
/// `..._DEGRADED_BW_TRUE`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE: u32 = 1;
/// `..._DEGRADED_BW_FALSE`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE: u32 = 2;

/// `NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ROUTE_UPDATE` (bits 3:2; defined from 570.86.15).
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ROUTE_UPDATE: DrfField = DrfField::new(3, 2);
/// `..._ROUTE_UPDATE_NOT_SUPPORTED`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ROUTE_UPDATE_NOT_SUPPORTED: u32 = 0;
/// `..._ROUTE_UPDATE_TRUE`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ROUTE_UPDATE_TRUE: u32 = 1;
/// `..._ROUTE_UPDATE_FALSE`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ROUTE_UPDATE_FALSE: u32 = 2;

/// `NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_CONNECTION_UNHEALTHY` (bits 5:4; from 570.86.15).
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_CONNECTION_UNHEALTHY: DrfField = DrfField::new(5, 4);
/// `..._CONNECTION_UNHEALTHY_NOT_SUPPORTED`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_CONNECTION_UNHEALTHY_NOT_SUPPORTED: u32 = 0;
/// `..._CONNECTION_UNHEALTHY_TRUE`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_CONNECTION_UNHEALTHY_TRUE: u32 = 1;
/// `..._CONNECTION_UNHEALTHY_FALSE`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_CONNECTION_UNHEALTHY_FALSE: u32 = 2;

/// `NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY` (bits 7:6; from 570.86.15).
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY: DrfField =
    DrfField::new(7, 6);
/// `..._ACCESS_TIMEOUT_RECOVERY_NOT_SUPPORTED`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_NOT_SUPPORTED: u32 = 0;
/// `..._ACCESS_TIMEOUT_RECOVERY_TRUE`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_TRUE: u32 = 1;
/// `..._ACCESS_TIMEOUT_RECOVERY_FALSE`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_FALSE: u32 = 2;

/// `NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION` (bits 11:8; from 580.65.06).
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION: DrfField =
    DrfField::new(11, 8);
/// `..._INCORRECT_CONFIGURATION_NOT_SUPPORTED`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NOT_SUPPORTED: u32 = 0;
/// `..._INCORRECT_CONFIGURATION_NONE`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE: u32 = 1;
/// `..._INCORRECT_CONFIGURATION_INCORRECT_SYSGUID`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_SYSGUID: u32 = 2;
/// `..._INCORRECT_CONFIGURATION_INCORRECT_CHASSIS_SN`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_CHASSIS_SN: u32 = 3;
/// `..._INCORRECT_CONFIGURATION_NO_PARTITION`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NO_PARTITION: u32 = 4;
/// `..._INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS: u32 = 5;
/// `..._INCORRECT_CONFIGURATION_INCOMPATIBLE_GPU_FW` (from 580.76.05).
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCOMPATIBLE_GPU_FW: u32 = 6;
/// `..._INCORRECT_CONFIGURATION_INVALID_LOCATION` (from 580.76.05).
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INVALID_LOCATION: u32 = 7;
/// `..._INCORRECT_CONFIGURATION_GPU_STATE_INVALID` (580.94.16–.18, 580.126.09 and later
/// 580 tags, 595.44.02 on; not in 590.x).
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_GPU_STATE_INVALID: u32 = 8;

/// `NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED` (bits 13:12; same tags as
/// `GPU_STATE_INVALID`).
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED: DrfField = DrfField::new(13, 12);
/// `..._PARTITION_ASSIGNED_NOT_SUPPORTED`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED_NOT_SUPPORTED: u32 = 0;
/// `..._PARTITION_ASSIGNED_TRUE`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED_TRUE: u32 = 1;
/// `..._PARTITION_ASSIGNED_FALSE`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED_FALSE: u32 = 2;

/// `NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED` (`fabricHealthSummary`, V580 on).
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED: u8 = 0;
/// `NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY: u8 = 1;
/// `NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY: u8 = 2;
/// `NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY`.
pub const NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY: u8 = 3;

/// `NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS` (ctrl2080gpu.h) of 550.40.07 …
/// 575.64.05 (48 bytes). All outputs.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V550 {
    /// `NV2080_CTRL_GPU_FABRIC_PROBE_STATE_*`.
    pub state: u8,
    /// Padding before `status`.
    pub _pad0: [u8; 3],
    /// Probe response status (`NV_STATUS`; valid when `state` is COMPLETE).
    pub status: NvStatus,
    /// Cluster UUID.
    pub clusterUuid: [u8; NV2080_GPU_FABRIC_CLUSTER_UUID_LEN],
    /// Fabric partition ID.
    pub fabricPartitionId: u16,
    /// Padding before the 8-byte-aligned `fabricCaps`.
    pub _pad1: [u8; 6],
    /// `NV2080_CTRL_GPU_FABRIC_PROBE_CAP_*`.
    pub fabricCaps: u64,
    /// Clique ID.
    pub fabricCliqueId: u32,
    /// `NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_*` fields.
    pub fabricHealthMask: u32,
}
assert_layout!(NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V550, size = 48, align = 8,
    state @ 0, _pad0 @ 1, status @ 4, clusterUuid @ 8, fabricPartitionId @ 24, _pad1 @ 26,
    fabricCaps @ 32, fabricCliqueId @ 40, fabricHealthMask @ 44);

/// `NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS` (ctrl2080gpu.h) of 580.65.06 on
/// (56 bytes). All outputs.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580 {
    /// `NV2080_CTRL_GPU_FABRIC_PROBE_STATE_*`.
    pub state: u8,
    /// Padding before `status`.
    pub _pad0: [u8; 3],
    /// Probe response status (`NV_STATUS`; valid when `state` is COMPLETE).
    pub status: NvStatus,
    /// Cluster UUID.
    pub clusterUuid: [u8; NV2080_GPU_FABRIC_CLUSTER_UUID_LEN],
    /// Fabric partition ID.
    pub fabricPartitionId: u16,
    /// Padding before the 8-byte-aligned `fabricCaps`.
    pub _pad1: [u8; 6],
    /// `NV2080_CTRL_GPU_FABRIC_PROBE_CAP_*`.
    pub fabricCaps: u64,
    /// Clique ID.
    pub fabricCliqueId: u32,
    /// `NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_*` fields.
    pub fabricHealthMask: u32,
    /// `NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_*`.
    pub fabricHealthSummary: u8,
    /// Trailing padding.
    pub _pad2: [u8; 7],
}
assert_layout!(NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580, size = 56, align = 8,
    state @ 0, _pad0 @ 1, status @ 4, clusterUuid @ 8, fabricPartitionId @ 24, _pad1 @ 26,
    fabricCaps @ 32, fabricCliqueId @ 40, fabricHealthMask @ 44, fabricHealthSummary @ 48,
    _pad2 @ 49);

/// `NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS` of the V590 family: the same layout as
/// V580.
pub type NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V590 =
    NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580;
/// `NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS` of the V595 family: the same layout as
/// V580.
pub type NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V595 =
    NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580;

/// The probe info independent of the layout family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FabricProbeInfo {
    /// `state`.
    pub state: u8,
    /// `status`.
    pub status: NvStatus,
    /// `clusterUuid`.
    pub cluster_uuid: [u8; NV2080_GPU_FABRIC_CLUSTER_UUID_LEN],
    /// `fabricPartitionId`.
    pub partition_id: u16,
    /// `fabricCaps`.
    pub caps: u64,
    /// `fabricCliqueId`.
    pub clique_id: u32,
    /// `fabricHealthMask`.
    pub health_mask: u32,
    /// `fabricHealthSummary` (V580 on; 0 = NOT_SUPPORTED otherwise).
    pub health_summary: u8,
}

impl FabricProbeInfo {
    /// The parameter block of `layout` (for a simulated driver; `health_summary` is dropped
    /// in V550).
    pub fn encode(&self, layout: Layout) -> Vec<u8> {
        let p = NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580 {
            state: self.state,
            status: self.status,
            clusterUuid: self.cluster_uuid,
            fabricPartitionId: self.partition_id,
            fabricCaps: self.caps,
            fabricCliqueId: self.clique_id,
            fabricHealthMask: self.health_mask,
            fabricHealthSummary: self.health_summary,
            ..Default::default()
        };
        // V550 is the V580 layout without the trailing summary (and its padding).
        p.as_bytes()[..layout.fabric_probe_info_params_size()].to_vec()
    }

    /// Parses a returned parameter block of `layout`.
    pub fn decode(layout: Layout, bytes: &[u8]) -> Result<Self, AbiError> {
        const WHAT: &str = "NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS";
        let p = if layout.has_fabric_health_summary() {
            read_exact::<NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580>(
                WHAT,
                Some(layout),
                bytes,
            )?
        } else {
            let o: NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V550 =
                read_exact(WHAT, Some(layout), bytes)?;
            NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580 {
                state: o.state,
                status: o.status,
                clusterUuid: o.clusterUuid,
                fabricPartitionId: o.fabricPartitionId,
                fabricCaps: o.fabricCaps,
                fabricCliqueId: o.fabricCliqueId,
                fabricHealthMask: o.fabricHealthMask,
                ..Default::default()
            }
        };
        Ok(Self {
            state: p.state,
            status: p.status,
            cluster_uuid: p.clusterUuid,
            partition_id: p.fabricPartitionId,
            caps: p.fabricCaps,
            clique_id: p.fabricCliqueId,
            health_mask: p.fabricHealthMask,
            health_summary: p.fabricHealthSummary,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_health_fields() {
        let i = FabricProbeInfo {
            state: NV2080_CTRL_GPU_FABRIC_PROBE_STATE_COMPLETE,
            status: 0,
            cluster_uuid: [0xAB; 16],
            partition_id: 0x7FFF,
            caps: NV2080_CTRL_GPU_FABRIC_PROBE_CAP_MC_SUPPORTED,
            clique_id: 32766,
            health_mask: (NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NO_PARTITION
                << 8)
                | 2,
            health_summary: NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY,
        };
        let b = i.encode(Layout::V595);
        assert_eq!(b.len(), 56);
        assert_eq!(FabricProbeInfo::decode(Layout::V595, &b).unwrap(), i);
        let b = i.encode(Layout::V550);
        assert_eq!(b.len(), 48);
        assert_eq!(
            FabricProbeInfo::decode(Layout::V550, &b).unwrap(),
            FabricProbeInfo {
                health_summary: 0,
                ..i
            }
        );
        assert_eq!(
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION.get(i.health_mask),
            4
        );
        assert_eq!(
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW.get(i.health_mask),
            2
        );
    }
}
