//! The GPU driver's vocabulary as the node's logic sees it (`docs/reference/driver-interface.md`
//! §1.6): the fabric events the driver posts, the page list DESCRIBE returns, and the statuses
//! that cross from one node's driver to another's. The `driver` crate re-exports these, so the
//! daemon, its backends and core speak the same types.

use crate::ids::NodeId;

/// The driver's status codes that cross the daemon (the real driver's `NV_ERR_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// NV_ERR_INSUFFICIENT_PERMISSIONS (channel mismatch).
    InsufficientPermissions,
    /// NV_ERR_OBJECT_NOT_FOUND (no such export).
    ObjectNotFound,
    /// NV_ERR_INVALID_STATE (no session, exporter unreachable).
    InvalidState,
    /// NV_ERR_INVALID_ARGUMENT.
    InvalidArgument,
    /// Anything else the backend reported.
    Other,
}

impl Status {
    /// A stable name for the wire and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InsufficientPermissions => "INSUFFICIENT_PERMISSIONS",
            Self::ObjectNotFound => "OBJECT_NOT_FOUND",
            Self::InvalidState => "INVALID_STATE",
            Self::InvalidArgument => "INVALID_ARGUMENT",
            Self::Other => "OTHER",
        }
    }

    /// Parses [`Status::as_str`]; unknown words are `Other`.
    pub fn parse(s: &str) -> Self {
        [
            Self::InsufficientPermissions,
            Self::ObjectNotFound,
            Self::InvalidState,
            Self::InvalidArgument,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
        .unwrap_or(Self::Other)
    }
}

/// The fabric page list of an export, as DESCRIBE returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pages {
    /// Bytes.
    pub size: u64,
    /// Page size in bytes.
    pub page_size: u64,
    /// Fabric PFNs.
    pub pfns: Vec<u64>,
    /// Owner GPU's clique.
    pub clique_id: u32,
    /// Owner GPU's NVLink bandwidth mode (`NV_FABRIC_MEMORY_ATTRS.bwMode`); a mapping GPU must
    /// have the same (§6.8).
    pub bw_mode: u16,
    /// Owner GPU's bandwidth mode epoch (`NV_FABRIC_MEMORY_ATTRS.bwModeEpoch`).
    pub bw_mode_epoch: u64,
    /// The memory's page kind (`NV_FABRIC_MEMORY_ATTRS.kind`), passed through to VALIDATE.
    pub kind: u32,
    /// `physAttrs.addressSpace` of DESCRIBE, passed through to VALIDATE.
    pub phys_addr_space: u32,
    /// `physAttrs.compressionCoverage` of DESCRIBE, passed through to VALIDATE.
    pub compression_coverage: u32,
    /// `memFlags` of DESCRIBE, passed through to VALIDATE.
    pub mem_flags: u32,
}

/// A fabric event from the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// MEM_IMPORT: a local client waits for memory exported by `export_node`.
    Import {
        /// Names the import when it is validated or failed.
        event_id: u64,
        /// The importer's channel.
        channel: u32,
        /// Export UUID, 16 bytes.
        export_uuid: [u8; 16],
        /// Handle index.
        index: u16,
        /// Exporting node.
        export_node: NodeId,
    },
    /// MEM_UNIMPORT: a local releaser is blocked until the unimport is finished.
    Unimport {
        /// Token to finish.
        unimport_event_id: u64,
        /// The import it undoes.
        import_event_id: u64,
        /// Exporting node.
        export_node: NodeId,
    },
    /// CLIQUE_ID_CHANGE (channel 0): a Fabric Manager probe update moved local GPU `gpu` to
    /// clique `clique_id` (`docs/reference/driver-interface.md` §1.6 "Other events", §5). Nothing
    /// of the import state machine depends on it; the node's fabric view follows it.
    CliqueIdChange {
        /// The GPU's ID on this node.
        gpu: u32,
        /// Its new clique.
        clique_id: u32,
    },
    /// REMOTE_GPU_ATTACH: a local GPU joined an imported multicast object; the prime's node
    /// must add it to the team (`docs/reference/driver-interface.md` §1.6 "Multicast" 3-4).
    RemoteGpuAttach(RemoteGpuAttach),
}

/// One local GPU's fabric probe as the daemon keeps it (NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO
/// plus the bandwidth mode, §5): what `ctl --fabric` and the metrics report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFabric {
    /// GPU index on this node.
    pub gpu: u32,
    /// The probe's state, NVML's word (NOT_STARTED, IN_PROGRESS, COMPLETED, NOT_SUPPORTED).
    pub state: String,
    /// The NVLink domain, 32 hex digits (empty before the probe completes).
    pub cluster_uuid: String,
    /// The fabric partition.
    pub partition_id: u16,
    /// The clique (0 before the probe completes).
    pub clique_id: u32,
    /// NVLINK_INBAND_BW_MODE_* value.
    pub bw_mode: u16,
    /// Bandwidth mode epoch.
    pub bw_mode_epoch: u64,
    /// The packed health fields (NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_*).
    pub health_mask: u32,
    /// HEALTHY, UNHEALTHY, LIMITED_CAPACITY (empty before the probe completes).
    pub health_summary: String,
}

/// The name of an NVLink bandwidth mode: the suffix of its NVLINK_INBAND_BW_MODE_* macro
/// (`nvlink_inband_msg.h`: FULL 0, OFF 1, MIN 2, HALF 3, 3QUARTER 4).
pub fn bw_mode_name(mode: u16) -> String {
    match mode {
        0 => "FULL".into(),
        1 => "OFF".into(),
        2 => "MIN".into(),
        3 => "HALF".into(),
        4 => "3QUARTER".into(),
        other => format!("MODE_{other}"),
    }
}

/// REMOTE_GPU_ATTACH as the importer's driver posts it, and what the owner's
/// ATTACH_REMOTE_GPU takes (NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS, §1.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteGpuAttach {
    /// The importer's event ID (for logs and the answer).
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

/// Why an import failed, as the exporter (or the importer's own daemon) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportError {
    /// The driver status.
    pub status: Status,
    /// What happened, for logs.
    pub detail: String,
}

impl ImportError {
    /// An error with `status` and `detail`.
    pub fn new(status: Status, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
        }
    }
}

/// What an exporter answers an import with.
pub type ImportAnswer = Result<Pages, ImportError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_words_round_trip() {
        for s in [
            Status::InsufficientPermissions,
            Status::ObjectNotFound,
            Status::InvalidState,
            Status::InvalidArgument,
        ] {
            assert_eq!(Status::parse(s.as_str()), s);
        }
        assert_eq!(Status::parse("nonsense"), Status::Other);
    }
}
