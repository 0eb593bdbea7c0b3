//! The node's GPUs as the RM names them: their IDs, the root client's enumeration controls
//! (NV0000_CTRL_CMD_GPU_*) and a Subdevice's fabric probe
//! (NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO).
//!
//! A real GPU ID encodes its PCI location (`gpuGenerateGpuId`: domain, bus, device); the
//! simulated GPU of index `i` has ID `0x100 * (i + 1)` (bus `i + 1`, device 0), its device
//! instance is `i` and its subdevice instance 0 (one GPU per device). Every GPU is probed and
//! attached from the start (as with persistence mode on a real node), none is excluded.

use openimex_rmabi::Layout;
use openimex_rmabi::ctrl::nv0000::{
    NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT,
    NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT_BINARY,
    NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE,
    NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE_SHA1,
    NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS, NV0000_CTRL_GPU_ATTACH_IDS_PARAMS,
    NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS, NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS,
    NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V550, NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580,
    NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS, NV0000_CTRL_GPU_INVALID_ID,
    NV0000_CTRL_GPU_MAX_PROBED_GPUS,
};
use openimex_rmabi::ctrl::nv2080::{
    FabricProbeInfo, NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
    NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY,
    NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
};
use openimex_simproto::handle::decode_hex_array;
use openimex_simproto::probe::{HealthSummary, ProbeState};

use super::status::Handled;
use super::status::{self, NV_ERR_INVALID_ARGUMENT, NV_ERR_OBJECT_NOT_FOUND, NV_OK};
use super::{RmApi, read, write};
use crate::rm::{Rm, gpu_uuid};

/// `NV0000_CTRL_NO_NUMA_NODE` (ctrl0000gpu.h): the simulated GPUs have no NUMA memory.
/// Not in `openimex-rmabi`.
const NO_NUMA_NODE: i32 = -1;
/// `NV_ERR_INVALID_FLAGS`.
use openimex_rmabi::status::NV_ERR_INVALID_FLAGS;
/// `NV_UUID_STR_LEN` (gpu_uuid.h): `GPU-` and 32 hex digits in 8-4-4-4-12 groups, and
/// the NUL. Not in `openimex-rmabi`.
const UUID_STR_LEN: usize = 16 * 2 + 9;

/// The simulated GPU ID of GPU `index`: `0x100 * (index + 1)`.
pub const fn gpu_id(index: u32) -> u32 {
    0x100 * (index + 1)
}

/// The index of the GPU whose ID is `id` on a node of `gpus` GPUs.
pub(super) fn gpu_index(id: u32, gpus: u32) -> Option<u32> {
    (id.is_multiple_of(0x100) && id >= 0x100)
        .then(|| id / 0x100 - 1)
        .filter(|&i| i < gpus)
}

/// The node's GPU IDs in a GPU ID array of 32, terminated by NV0000_CTRL_GPU_INVALID_ID.
fn id_array(gpus: u32) -> [u32; NV0000_CTRL_GPU_MAX_PROBED_GPUS] {
    let mut ids = [NV0000_CTRL_GPU_INVALID_ID; NV0000_CTRL_GPU_MAX_PROBED_GPUS];
    for (slot, i) in ids.iter_mut().zip(0..gpus) {
        *slot = gpu_id(i);
    }
    ids
}

impl RmApi {
    /// NV0000_CTRL_CMD_GPU_GET_PROBED_IDS (`gpumgrGetProbedGpuIds`): every GPU, the rest of
    /// the array and every excluded slot NV0000_CTRL_GPU_INVALID_ID, flags 0 (V580 on).
    pub(super) fn get_probed_ids(&self, rm: &Rm, params: &mut [u8]) -> Handled {
        let ids = id_array(rm.config().gpus);
        let none = [NV0000_CTRL_GPU_INVALID_ID; NV0000_CTRL_GPU_MAX_PROBED_GPUS];
        match self.config.layout {
            Layout::V550 => write(
                params,
                &NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V550 {
                    gpuIds: ids,
                    excludedGpuIds: none,
                },
            ),
            _ => write(
                params,
                &NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580 {
                    gpuIds: ids,
                    excludedGpuIds: none,
                    gpuFlags: [0; NV0000_CTRL_GPU_MAX_PROBED_GPUS],
                },
            ),
        }
        (NV_OK, false)
    }

    /// NV0000_CTRL_CMD_GPU_ATTACH_IDS (`cliresCtrlCmdGpuAttachIds`): NV_OK for
    /// ATTACH_ALL_PROBED_IDS; else every ID up to the first invalid one must be probed
    /// (`_cliresValidateGpuIdAgainstProbed`: NV_ERR_INVALID_ARGUMENT).
    pub(super) fn attach_ids(&self, rm: &Rm, params: &mut [u8]) -> Handled {
        let Some(p) = read::<NV0000_CTRL_GPU_ATTACH_IDS_PARAMS>(params) else {
            return (NV_ERR_INVALID_ARGUMENT, false);
        };
        if p.gpuIds[0] == NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS {
            return (NV_OK, false);
        }
        let gpus = rm.config().gpus;
        let ok = p
            .gpuIds
            .iter()
            .take_while(|&&id| id != NV0000_CTRL_GPU_INVALID_ID)
            .all(|&id| gpu_index(id, gpus).is_some());
        (if ok { NV_OK } else { NV_ERR_INVALID_ARGUMENT }, false)
    }

    /// NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS (`gpumgrGetAttachedGpuIds`).
    pub(super) fn get_attached_ids(&self, rm: &Rm, params: &mut [u8]) -> Handled {
        write(
            params,
            &NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS {
                gpuIds: id_array(rm.config().gpus),
            },
        );
        (NV_OK, false)
    }

    /// NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2 (`gpumgrGetGpuIdInfoV2`): an unknown ID is
    /// NV_ERR_INVALID_ARGUMENT; else device instance = index, subdevice instance 0,
    /// `gpuInstance` = index, no NUMA node, flags and SLI status 0 (not in use, not SLI,
    /// not mobile, not the boot GPU).
    pub(super) fn get_id_info_v2(&self, rm: &Rm, params: &mut [u8]) -> Handled {
        let Some(mut p) = read::<NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS>(params) else {
            return (NV_ERR_INVALID_ARGUMENT, false);
        };
        let Some(i) = gpu_index(p.gpuId, rm.config().gpus) else {
            return (NV_ERR_INVALID_ARGUMENT, false);
        };
        p.gpuInstance = i;
        p.deviceInstance = i;
        p.subDeviceInstance = 0;
        p.boardId = 0;
        p.gpuFlags = 0;
        p.numaId = NO_NUMA_NODE;
        p.sliStatus = 0;
        write(params, &p);
        (NV_OK, false)
    }

    /// NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID (`cliresCtrlCmdGpuGetUuidFromGpuId` →
    /// `gpuGetGidInfo`): an unknown ID is NV_ERR_OBJECT_NOT_FOUND; a type other than SHA1
    /// NV_ERR_INVALID_FLAGS; BINARY gives the 16 bytes, ASCII `GPU-…` with its NUL
    /// (`NV_UUID_STR_LEN`, 41).
    pub(super) fn get_uuid_from_gpu_id(&self, rm: &Rm, params: &mut [u8]) -> Handled {
        let Some(mut p) = read::<NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS>(params) else {
            return (NV_ERR_INVALID_ARGUMENT, false);
        };
        let cfg = rm.config();
        let Some(i) = gpu_index(p.gpuId, cfg.gpus) else {
            return (NV_ERR_OBJECT_NOT_FOUND, false);
        };
        if NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE.get(p.flags)
            != NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE_SHA1
        {
            return (NV_ERR_INVALID_FLAGS, false);
        }
        let text = gpu_uuid(&cfg.cluster_uuid, cfg.slot, i);
        p.gpuUuid = [0; openimex_rmabi::ctrl::nv0000::NV0000_GPU_MAX_GID_LENGTH];
        if NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT.get(p.flags)
            == NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT_BINARY
        {
            let hex: String = text
                .trim_start_matches("GPU-")
                .chars()
                .filter(|c| *c != '-')
                .collect();
            let bin: [u8; 16] = decode_hex_array(&hex).unwrap_or([0; 16]);
            p.gpuUuid[..16].copy_from_slice(&bin);
            p.uuidStrLen = 16;
        } else {
            let b = text.as_bytes();
            let n = b.len().min(UUID_STR_LEN - 1);
            p.gpuUuid[..n].copy_from_slice(&b[..n]);
            p.uuidStrLen = UUID_STR_LEN as u32;
        }
        write(params, &p);
        (NV_OK, false)
    }

    /// NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO (`subdeviceCtrlCmdGetGpuFabricProbeInfo`):
    /// UNSUPPORTED, NOT_STARTED or IN_PROGRESS write the state only; COMPLETE the response
    /// (its status, clusterUuid, partition, caps, clique, health mask and, V580 on, summary).
    pub(super) fn fabric_probe_info(&self, rm: &Rm, gpu: u32, params: &mut [u8]) -> Handled {
        let layout = self.config.layout;
        let info = match rm.probe_info(gpu) {
            Ok(i) => i,
            Err(s) => return (status::code(s), false),
        };
        let state = u8::try_from(info.state.code()).unwrap_or(0);
        match (info.state, &info.info) {
            (ProbeState::Complete, Some(i)) => {
                let summary = match i.health_summary {
                    HealthSummary::Healthy => NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
                    HealthSummary::Unhealthy => NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
                    HealthSummary::LimitedCapacity => {
                        NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY
                    }
                };
                let p = FabricProbeInfo {
                    state,
                    status: NV_OK,
                    cluster_uuid: decode_hex_array(&i.cluster_uuid).unwrap_or([0; 16]),
                    partition_id: i.partition_id,
                    caps: i.caps,
                    clique_id: i.clique_id,
                    health_mask: i.health_mask,
                    health_summary: summary,
                };
                let b = p.encode(layout);
                if let Some(dst) = params.get_mut(..b.len()) {
                    dst.copy_from_slice(&b);
                }
            }
            _ => {
                if let Some(b) = params.first_mut() {
                    *b = state;
                }
            }
        }
        (NV_OK, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_ids_are_pci_like_and_map_back_to_their_index() {
        assert_eq!([gpu_id(0), gpu_id(1), gpu_id(3)], [0x100, 0x200, 0x400]);
        for i in 0..4 {
            assert_eq!(gpu_index(gpu_id(i), 4), Some(i));
        }
        for bad in [0, 0x80, 0x101, 0x500, NV0000_CTRL_GPU_INVALID_ID] {
            assert_eq!(gpu_index(bad, 4), None, "{bad:#x}");
        }
    }
}
