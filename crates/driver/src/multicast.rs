//! Multicast (NVLS) across trays as the daemon sees it (`reference/driver-interface.md` §1.6
//! "Multicast (NVLS) across nodes" 3-4): the REMOTE_GPU_ATTACH event an importer's driver
//! posts when a local GPU joins an imported multicast object, which the importer's daemon
//! forwards to the owner's daemon, and what the owner's daemon does with it: ATTACH_REMOTE_GPU
//! on the prime object ([`crate::Driver::attach_remote_gpu`]), or SET_FAILURE on any error
//! ([`crate::Driver::set_multicast_failure`]).

use openimex_core::NodeId;

/// REMOTE_GPU_ATTACH, and what the owner's ATTACH_REMOTE_GPU takes
/// (NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS, §1.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteGpuAttach {
    /// The importer's event ID (for logs).
    pub event_id: u64,
    /// The importer's IMEX channel.
    pub channel: u32,
    /// The prime's export UUID, 16 bytes.
    pub export_uuid: [u8; 16],
    /// Handle index.
    pub index: u16,
    /// The prime's (exporting) node.
    pub export_node: NodeId,
    /// The attaching GPU's fabric probe handle.
    pub gpu_probe_handle: u64,
    /// The importer's request key.
    pub key: u64,
    /// The attaching GPU's clique.
    pub clique_id: u32,
    /// Its NVLink bandwidth mode.
    pub bw_mode: u16,
    /// The mode's epoch.
    pub bw_mode_epoch: u64,
    /// The importer object's page size.
    pub page_size: u64,
}
