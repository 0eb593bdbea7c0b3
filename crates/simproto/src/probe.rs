//! The GPU fabric probe as the driver exposes it: the probe state machine's values, the result
//! the Fabric Manager hands each GPU, and the NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO answer
//! (`docs/reference/driver-interface.md` §1.3, §5).
//!
//! On a real node the GPU's RM sends a probe request over NVLink in-band messages to the
//! Global Fabric Manager at load; its response fills the clusterUuid, fabric partition ID,
//! cliqueId, FLA range, caps and health (`gpu_fabric_probe.c`). Until that response arrives the
//! GPU has no unicast FLA range and fabric memory allocation on it fails (§5). Here the
//! response arrives as [`ProbeInfo`], through the driver's `CompleteFabricProbe` control or at
//! start from `openimex-lab gpu`'s flags.

use serde::{Deserialize, Serialize};

/// NV2080_CTRL_GPU_FABRIC_PROBE_STATE_* (§5). NVML's `nvmlGpuFabricState_t` has the same
/// values (NOT_SUPPORTED=0 … COMPLETED=3, NCCL `nvmlwrap.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ProbeState {
    /// 0: the GPU is not on an NVLink fabric.
    Unsupported,
    /// 1: the probe has not been sent.
    NotStarted,
    /// 2: sent, no Fabric Manager response yet.
    InProgress,
    /// 3: the Fabric Manager answered; [`ProbeInfo`] holds its response.
    Complete,
}

impl ProbeState {
    /// The control's numeric value (also NVML's).
    pub fn code(self) -> u32 {
        match self {
            Self::Unsupported => 0,
            Self::NotStarted => 1,
            Self::InProgress => 2,
            Self::Complete => 3,
        }
    }

    /// NVML's name (`NVML_GPU_FABRIC_STATE_*`), what tools and `openimex-lab app gpus` print.
    pub fn nvml_name(self) -> &'static str {
        match self {
            Self::Unsupported => "NOT_SUPPORTED",
            Self::NotStarted => "NOT_STARTED",
            Self::InProgress => "IN_PROGRESS",
            Self::Complete => "COMPLETED",
        }
    }
}

/// Fabric caps bit: the GPU supports multicast (NVLS).
pub const CAP_MC_SUPPORTED: u64 = 1 << 0;
/// Fabric caps bit: multicast across nodes.
pub const CAP_MC_MULTINODE_SUPPORTED: u64 = 1 << 1;
/// Fabric caps bit: unicast loopback.
pub const CAP_UC_LOOPBACK_SUPPORTED: u64 = 1 << 2;

/// NVLINK_INBAND_BW_MODE_FULL: every NVLink at full bandwidth (`nvlink_inband_msg.h`), the
/// mode a GPU reports unless the Fabric Manager asked for a reduced one.
pub const BW_MODE_FULL: u16 = 0;
/// NVLINK_INBAND_BW_MODE_OFF.
pub const BW_MODE_OFF: u16 = 1;
/// NVLINK_INBAND_BW_MODE_MIN.
pub const BW_MODE_MIN: u16 = 2;
/// NVLINK_INBAND_BW_MODE_HALF.
pub const BW_MODE_HALF: u16 = 3;
/// NVLINK_INBAND_BW_MODE_3QUARTER.
pub const BW_MODE_3QUARTER: u16 = 4;

/// The probe's healthSummary (§5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HealthSummary {
    /// Every link and route as configured.
    Healthy,
    /// The GPU cannot use the fabric reliably.
    Unhealthy,
    /// Working, with less bandwidth (e.g. a switch tray down).
    LimitedCapacity,
}

impl HealthSummary {
    /// The name tools print.
    pub fn name(self) -> &'static str {
        match self {
            Self::Healthy => "HEALTHY",
            Self::Unhealthy => "UNHEALTHY",
            Self::LimitedCapacity => "LIMITED_CAPACITY",
        }
    }
}

/// The Fabric Manager's probe response for one GPU: what completes its probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeInfo {
    /// The NVLink domain (e.g. one NVL72 rack), hex (32 digits).
    pub cluster_uuid: String,
    /// The fabric partition the GPU is in.
    pub partition_id: u16,
    /// The set of GPUs of the partition that can do P2P with this one.
    pub clique_id: u32,
    /// First address of the GPU's unicast FLA range.
    pub fla_base: u64,
    /// Bytes of the FLA range (0 is refused: allocation needs a range).
    pub fla_size: u64,
    /// [`CAP_MC_SUPPORTED`] | [`CAP_MC_MULTINODE_SUPPORTED`] | [`CAP_UC_LOOPBACK_SUPPORTED`].
    pub caps: u64,
    /// 2-bit health fields (DEGRADED_BW, ROUTE_UPDATE, CONNECTION_UNHEALTHY,
    /// ACCESS_TIMEOUT_RECOVERY, PARTITION_ASSIGNED) and the 4-bit INCORRECT_CONFIGURATION
    /// reason, as the control packs them; 0 reports none.
    pub health_mask: u32,
    /// The summary.
    pub health_summary: HealthSummary,
    /// The GPU's NVLink bandwidth mode, one of the `BW_MODE_*` values (the probe request's and
    /// `knvlinkGetBWMode`'s `bwMode`). Memory carries its owner's and a mapping GPU must have
    /// the same (`memoryfabricimportv2IsGpuMapAllowed`, §6.8). Absent: [`BW_MODE_FULL`].
    #[serde(default)]
    pub bw_mode: u16,
    /// Bumped each time the bandwidth mode changes (`knvlinkGetBWModeEpoch`); a mapping GPU
    /// must be in the owner's epoch. Absent: 0.
    #[serde(default)]
    pub bw_mode_epoch: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers are the control's and NVML's (`docs/reference/driver-interface.md` §5).
    #[test]
    fn states_and_caps_have_the_drivers_values() {
        let states = [
            ProbeState::Unsupported,
            ProbeState::NotStarted,
            ProbeState::InProgress,
            ProbeState::Complete,
        ];
        let codes: Vec<u32> = states.iter().map(|s| s.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3]);
        assert_eq!(ProbeState::Complete.nvml_name(), "COMPLETED");
        assert_eq!(
            (
                CAP_MC_SUPPORTED,
                CAP_MC_MULTINODE_SUPPORTED,
                CAP_UC_LOOPBACK_SUPPORTED
            ),
            (1, 2, 4)
        );
        let json = serde_json::to_string(&ProbeState::InProgress).unwrap();
        assert_eq!(json, "\"IN_PROGRESS\"");
        assert_eq!(HealthSummary::LimitedCapacity.name(), "LIMITED_CAPACITY");
    }

    /// NVLINK_INBAND_BW_MODE_* (`nvlink_inband_msg.h`); an answer without the fields (an older
    /// Fabric Manager) means full bandwidth, epoch 0.
    #[test]
    fn bandwidth_modes_have_the_drivers_values_and_default_to_full() {
        assert_eq!(
            [
                BW_MODE_FULL,
                BW_MODE_OFF,
                BW_MODE_MIN,
                BW_MODE_HALF,
                BW_MODE_3QUARTER
            ],
            [0, 1, 2, 3, 4]
        );
        let json = r#"{"cluster_uuid":"00","partition_id":0,"clique_id":1,"fla_base":0,
            "fla_size":1,"caps":0,"health_mask":0,"health_summary":"HEALTHY"}"#;
        let info: ProbeInfo = serde_json::from_str(json).unwrap();
        assert_eq!((info.bw_mode, info.bw_mode_epoch), (BW_MODE_FULL, 0));
    }
}
