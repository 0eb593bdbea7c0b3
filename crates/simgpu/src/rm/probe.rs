//! Each GPU's fabric probe (`reference/driver-interface.md` §5, §6.9): its state, the Fabric
//! Manager's response once it came, and what the rest of the driver reads from it (may fabric
//! memory be allocated on the GPU, which clique owns its memory).
//!
//! The response is set through one entry point, [`Rm::complete_probe`], so that whoever plays
//! the Fabric Manager (the start-up flags today, a simulated FM process later) drives it the
//! same way.

use openimex_simproto::handle::encode_hex;
use openimex_simproto::probe::{
    CAP_MC_MULTINODE_SUPPORTED, CAP_MC_SUPPORTED, HealthSummary, ProbeInfo, ProbeState,
};
use openimex_simproto::proto::{FabricProbeInfo, NvStatus};

use super::Rm;
use crate::fabric::GpuAddr;

/// Where the GPUs' probes stand when the driver starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProbeStart {
    /// Completed at once with the configured clusterUuid and cliqueId (the driver plays its own
    /// Fabric Manager): every GPU can allocate fabric memory from the start.
    #[default]
    Complete,
    /// The probe was sent and no Fabric Manager answered yet (IN_PROGRESS).
    Pending,
    /// The probe was not sent (NOT_STARTED).
    NotStarted,
}

/// One GPU's probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Probe {
    pub(super) state: ProbeState,
    pub(super) info: Option<ProbeInfo>,
}

impl Probe {
    pub(super) fn at_start(start: ProbeStart) -> Self {
        let state = match start {
            // Completed right after construction, through `complete_probe`.
            ProbeStart::Complete | ProbeStart::Pending => ProbeState::InProgress,
            ProbeStart::NotStarted => ProbeState::NotStarted,
        };
        Self { state, info: None }
    }
}

/// The detail of the refusal, the real driver's log line (`mem_fabric.c`, §5).
pub const NO_FLA_RANGE: &str = "UC FLA ranges should be initialized by this time!";

impl Rm {
    /// The probe response the driver gives its own GPU when it plays the Fabric Manager
    /// ([`ProbeStart::Complete`]): the configured clusterUuid and cliqueId, partition 0, the
    /// GPU's fabric window as its FLA range, multicast caps, healthy.
    pub fn default_probe_info(&self, gpu: u32) -> ProbeInfo {
        let addr = GpuAddr {
            node: self.config.slot,
            gpu,
        };
        ProbeInfo {
            cluster_uuid: encode_hex(&self.config.cluster_uuid),
            partition_id: 0,
            clique_id: self.config.clique_id,
            fla_base: addr.base(),
            fla_size: crate::fabric::WINDOW_BYTES,
            caps: CAP_MC_SUPPORTED | CAP_MC_MULTINODE_SUPPORTED,
            health_mask: 0,
            health_summary: HealthSummary::Healthy,
        }
    }

    /// The Fabric Manager's response for `gpu`: the probe is COMPLETE from now on. A later call
    /// replaces the response (the FM's probe updates). NV_ERR_INVALID_ARGUMENT for an unknown
    /// GPU, a malformed clusterUuid or an empty FLA range; NV_ERR_NOT_SUPPORTED on a GPU whose
    /// probe is UNSUPPORTED.
    pub fn complete_probe(&mut self, gpu: u32, info: ProbeInfo) -> Result<(), NvStatus> {
        let valid_uuid = info.cluster_uuid.len() == 32
            && info.cluster_uuid.bytes().all(|b| b.is_ascii_hexdigit());
        if !valid_uuid || info.fla_size == 0 {
            return Err(NvStatus::InvalidArgument);
        }
        let probe = self.probe_mut(gpu)?;
        if probe.state == ProbeState::Unsupported {
            return Err(NvStatus::NotSupported);
        }
        tracing::info!(
            gpu,
            clique_id = info.clique_id,
            partition_id = info.partition_id,
            cluster_uuid = %info.cluster_uuid,
            "fabric probe complete"
        );
        probe.state = ProbeState::Complete;
        // One spelling of the clusterUuid, so that equal domains compare equal.
        let cluster_uuid = info.cluster_uuid.to_ascii_lowercase();
        probe.info = Some(ProbeInfo {
            cluster_uuid,
            ..info
        });
        Ok(())
    }

    /// NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO on `gpu`.
    pub fn probe_info(&self, gpu: u32) -> Result<FabricProbeInfo, NvStatus> {
        let probe = self
            .probes
            .get(gpu as usize)
            .ok_or(NvStatus::InvalidArgument)?;
        let complete = probe.state == ProbeState::Complete;
        Ok(FabricProbeInfo {
            gpu,
            state: probe.state,
            status: (!complete).then_some(NvStatus::NotReady),
            info: probe.info.clone().filter(|_| complete),
        })
    }

    /// Whether fabric memory may be allocated on `gpu`: its probe must have set up the unicast
    /// FLA range. NV_ERR_INVALID_STATE otherwise, as `memoryfabricConstruct` answers (§5).
    pub(super) fn check_fla_range(&self, gpu: u32) -> Result<(), NvStatus> {
        match self.probes.get(gpu as usize) {
            Some(p) if p.state == ProbeState::Complete => Ok(()),
            Some(_) => Err(NvStatus::InvalidState),
            None => Err(NvStatus::InvalidArgument),
        }
    }

    /// The clique that owns memory of `gpu` (0 before its probe completed).
    pub(super) fn gpu_clique(&self, gpu: u32) -> u32 {
        self.probes
            .get(gpu as usize)
            .and_then(|p| p.info.as_ref())
            .map_or(0, |i| i.clique_id)
    }

    fn probe_mut(&mut self, gpu: u32) -> Result<&mut Probe, NvStatus> {
        self.probes
            .get_mut(gpu as usize)
            .ok_or(NvStatus::InvalidArgument)
    }
}
