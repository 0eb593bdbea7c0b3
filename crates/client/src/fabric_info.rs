//! [`Context::gpu_fabric_info`]: a GPU's fabric probe as NVML's `nvmlDeviceGetGpuFabricInfoV`
//! presents it to NCCL, NVSHMEM and UCX (`docs/reference/driver-interface.md` §3, §5), read from the
//! driver's NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO.

use openimex_simproto::handle::decode_hex_array;
use openimex_simproto::probe::{HealthSummary, ProbeState};
use openimex_simproto::proto::FabricProbeInfo;
use openimex_simproto::proto::{NvStatus, Request, Response};

use crate::context::unexpected;
use crate::{Context, CuError};

/// `nvmlGpuFabricInfo_v2_t` ({clusterUuid, status, cliqueId, state, healthMask}, NCCL
/// `nvmlwrap.h`), plus the probe's healthSummary and partition, which `openimex-lab app gpus`
/// prints. Before the probe completes only `state` means anything: the rest is zero and
/// `status` is NV_ERR_NOT_READY.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuFabricInfo {
    /// The NVLink domain; all zero before the probe completes.
    pub cluster_uuid: [u8; 16],
    /// The probe's status: `None` is success (NVML_SUCCESS).
    pub status: Option<NvStatus>,
    /// The clique (GPUs of the partition that can do P2P with this one).
    pub clique_id: u32,
    /// NOT_SUPPORTED=0 … COMPLETED=3 ([`ProbeState::code`]).
    pub state: ProbeState,
    /// The packed 2-bit health fields.
    pub health_mask: u32,
    /// HEALTHY, UNHEALTHY or LIMITED_CAPACITY; `None` before the probe completes.
    pub health_summary: Option<HealthSummary>,
    /// The fabric partition.
    pub partition_id: u16,
}

impl GpuFabricInfo {
    /// What NCCL's and UCX's MNNVL checks want (§3): state COMPLETED, status success and a
    /// non-zero clusterUuid.
    pub fn mnnvl_ready(&self) -> bool {
        self.state == ProbeState::Complete && self.status.is_none() && self.cluster_uuid != [0; 16]
    }

    fn from_probe(p: FabricProbeInfo) -> Result<Self, CuError> {
        let mut out = GpuFabricInfo {
            cluster_uuid: [0; 16],
            status: p.status,
            clique_id: 0,
            state: p.state,
            health_mask: 0,
            health_summary: None,
            partition_id: 0,
        };
        if let Some(i) = p.info {
            out.cluster_uuid = decode_hex_array(&i.cluster_uuid).map_err(|_| {
                CuError::Unknown(format!(
                    "driver reported a malformed clusterUuid {:?}",
                    i.cluster_uuid
                ))
            })?;
            out.clique_id = i.clique_id;
            out.health_mask = i.health_mask;
            out.health_summary = Some(i.health_summary);
            out.partition_id = i.partition_id;
        }
        Ok(out)
    }
}

impl Context {
    /// `nvmlDeviceGetGpuFabricInfoV` on local GPU `gpu`: its fabric probe as the driver holds it
    /// now. `CUDA_ERROR_INVALID_VALUE` for an unknown GPU.
    pub fn gpu_fabric_info(&self, gpu: u32) -> Result<GpuFabricInfo, CuError> {
        match self.call(&Request::FabricProbeInfo { gpu }, &[], false)? {
            Response::FabricProbeInfo(p) => GpuFabricInfo::from_probe(p),
            other => Err(unexpected("FabricProbeInfo", &other)),
        }
    }
}
