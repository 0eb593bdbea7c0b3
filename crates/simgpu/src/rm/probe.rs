//! Each GPU's fabric probe (`docs/reference/driver-interface.md` §5, §6.9): its state, the Fabric
//! Manager's response once it came, and what the rest of the driver reads from it (may fabric
//! memory be allocated on the GPU, which clique owns its memory).
//!
//! The response is set through one entry point, [`Rm::complete_probe`], so that whoever plays
//! the Fabric Manager (the start-up flags today, a simulated FM process later) drives it the
//! same way.

use openimex_simproto::handle::encode_hex;
use openimex_simproto::probe::{
    BW_MODE_FULL, CAP_MC_MULTINODE_SUPPORTED, CAP_MC_SUPPORTED, HealthSummary, ProbeInfo,
    ProbeState,
};
use openimex_simproto::proto::{FabricEvent, FabricProbeInfo, NvStatus};

use super::Rm;
use crate::fla::GpuAddr;

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

/// The owner GPU's fabric attributes that travel with its memory (§6.4) and that a mapping
/// GPU must match (§6.8).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct MemAttrs {
    pub(super) clique_id: u32,
    pub(super) bw_mode: u16,
    pub(super) bw_mode_epoch: u64,
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
            fla_size: crate::fla::WINDOW_BYTES,
            caps: CAP_MC_SUPPORTED | CAP_MC_MULTINODE_SUPPORTED,
            health_mask: 0,
            health_summary: HealthSummary::Healthy,
            bw_mode: BW_MODE_FULL,
            bw_mode_epoch: 0,
        }
    }

    /// The Fabric Manager's response for `gpu`: the probe is COMPLETE from now on. A later call
    /// replaces the response (the FM's probe updates). NV_ERR_INVALID_ARGUMENT for an unknown
    /// GPU, a malformed clusterUuid or an empty FLA range; NV_ERR_NOT_SUPPORTED on a GPU whose
    /// probe is UNSUPPORTED.
    ///
    /// An update that changes the clique of a GPU whose probe was already complete posts
    /// CLIQUE_ID_CHANGE {gpuId, new cliqueId} on channel 0 to the daemon's event queue, as
    /// `gpuFabricProbeReceiveUpdateKernelCallback` does (`_gpuFabricProbeSendCliqueIdChangeEvent`,
    /// `docs/reference/driver-interface.md` §1.6 "Other events", §5). The first response is not a
    /// change. Without a daemon session the real post fails (`_fabricNotifyEvent`: no IMEX event
    /// to signal, NV_ERR_NOT_READY) and the event is dropped; the probe update still applies.
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
        let changed_from = match (&probe.state, &probe.info) {
            (ProbeState::Complete, Some(old)) if old.clique_id != info.clique_id => {
                Some(old.clique_id)
            }
            _ => None,
        };
        probe.state = ProbeState::Complete;
        // One spelling of the clusterUuid, so that equal domains compare equal.
        let cluster_uuid = info.cluster_uuid.to_ascii_lowercase();
        let clique_id = info.clique_id;
        probe.info = Some(ProbeInfo {
            cluster_uuid,
            ..info
        });
        if let Some(old) = changed_from {
            tracing::info!(gpu, old, new = clique_id, "cliqueId changed");
            if self.session.is_some() {
                let event_id = self.next_event();
                self.post_event(FabricEvent::CliqueIdChange {
                    event_id,
                    channel: 0,
                    gpu_id: gpu,
                    clique_id,
                });
            }
        }
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

    /// The fabric attributes memory of `gpu` carries (`NV_FABRIC_MEMORY_ATTRS`: cliqueId,
    /// bwMode, bwModeEpoch; all 0 before its probe completed, as `memoryfabricCtrlGetInfo`
    /// reports them for a GPU without a probe).
    pub(super) fn gpu_attrs(&self, gpu: u32) -> MemAttrs {
        self.probes
            .get(gpu as usize)
            .and_then(|p| p.info.as_ref())
            .map_or(MemAttrs::default(), |i| MemAttrs {
                clique_id: i.clique_id,
                bw_mode: i.bw_mode,
                bw_mode_epoch: i.bw_mode_epoch,
            })
    }

    /// Whether imported memory whose owner had `owner` attributes may be mapped on `gpu`, in
    /// `memoryfabricimportv2IsGpuMapAllowed`'s order: a GPU whose probe is not complete cannot
    /// report its clique (refused), then cliqueId, bwMode and bwModeEpoch must equal the
    /// owner's. Its callers (`dmaAllocMapping_GM107`, `nvGpuOpsDupMemory`) turn a refusal into
    /// NV_ERR_INVALID_STATE ("Mapping Gpu is not attached to the given memory object"). The
    /// error names the first field that differs.
    pub(super) fn check_map_allowed(&self, gpu: u32, owner: MemAttrs) -> Result<(), String> {
        let probe = self
            .probes
            .get(gpu as usize)
            .ok_or_else(|| format!("GPU {gpu} is not on this node"))?;
        let Some(mine) = probe
            .info
            .as_ref()
            .filter(|_| probe.state == ProbeState::Complete)
        else {
            return Err(format!(
                "GPU {gpu}'s fabric probe is {}: it has no cliqueId",
                probe.state.nvml_name()
            ));
        };
        if mine.clique_id != owner.clique_id {
            return Err(format!(
                "cliqueId does not match: owner {}, mapper {} (GPU {gpu})",
                owner.clique_id, mine.clique_id
            ));
        }
        if mine.bw_mode != owner.bw_mode {
            return Err(format!(
                "bwMode does not match: owner {}, mapper {} (GPU {gpu})",
                owner.bw_mode, mine.bw_mode
            ));
        }
        if mine.bw_mode_epoch != owner.bw_mode_epoch {
            return Err(format!(
                "bwModeEpoch does not match: owner {}, mapper {} (GPU {gpu})",
                owner.bw_mode_epoch, mine.bw_mode_epoch
            ));
        }
        Ok(())
    }

    fn probe_mut(&mut self, gpu: u32) -> Result<&mut Probe, NvStatus> {
        self.probes
            .get_mut(gpu as usize)
            .ok_or(NvStatus::InvalidArgument)
    }
}
