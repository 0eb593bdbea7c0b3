//! The driver protocol's multicast (NVLS) messages: the NV_MEMORY_MULTICAST_FABRIC (class
//! 0xFD) object's allocation and controls (`docs/reference/driver-interface.md` §1.2-1.4, §1.6
//! "Multicast (NVLS) across nodes"), carried in the driver protocol's `Request::Multicast` and
//! `Response::Multicast`, and the multicast table the drivers keep in the
//! fabric directory (the simulated NVSwitch's multicast group: which HBM ranges a store to the
//! team's address reaches).
//!
//! What the real driver calls a GPU's *fabric probe handle* (the FM's opaque name of a GPU,
//! carried in REMOTE_GPU_ATTACH and ATTACH_REMOTE_GPU) is here [`probe_handle`]: the tray's
//! slot and the GPU's index, so that the prime's driver can name remote members to the FM.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::inband::{FabricGpu, McTeam};
use crate::status::NvStatus;

/// The directory, under the fabric directory, of the multicast tables.
pub const MC_TABLE_DIR: &str = "multicast";

/// The fabric probe handle of a GPU: `(slot << 32) | gpu`, never 0 (bit 63 set), as the FM's
/// handles are never 0.
pub fn probe_handle(gpu: FabricGpu) -> u64 {
    (1 << 63) | (u64::from(gpu.slot) << 32) | u64::from(gpu.gpu)
}

/// The GPU a [`probe_handle`] names (`None` for a handle this simulation never minted).
pub fn probe_handle_gpu(handle: u64) -> Option<FabricGpu> {
    if handle >> 63 == 0 || (handle >> 48) & 0x7fff != 0 {
        return None;
    }
    Some(FabricGpu {
        slot: u16::try_from((handle >> 32) & 0xffff).ok()?,
        gpu: u32::try_from(handle & 0xffff_ffff).ok()?,
    })
}

/// The multicast table of the team at `address_base`: a directory holding one
/// [`McBinding`] file per bound range.
pub fn table_dir(fabric_dir: &Path, address_base: u64) -> PathBuf {
    fabric_dir
        .join(MC_TABLE_DIR)
        .join(format!("{address_base:016x}"))
}

/// One range of GPU memory bound to a multicast object (ATTACH_MEM): a store to the team's
/// addresses `[mc_offset, mc_offset + size)` lands at `[file_offset, file_offset + size)` of
/// `file`. Each driver writes the bindings of its own GPUs, one file each, named by
/// [`McBinding::file_name`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McBinding {
    /// The bound GPU.
    pub gpu: FabricGpu,
    /// Offset in the multicast object.
    pub mc_offset: u64,
    /// Bytes.
    pub size: u64,
    /// The GPU's HBM file.
    pub file: String,
    /// Offset of the memory in that file.
    pub file_offset: u64,
}

impl McBinding {
    /// Its file's name in the table directory (unique per GPU and multicast offset).
    pub fn file_name(&self) -> String {
        format!(
            "{}-{}-{:x}.json",
            self.gpu.slot, self.gpu.gpu, self.mc_offset
        )
    }
}

/// What REMOTE_GPU_ATTACH carries and ATTACH_REMOTE_GPU takes
/// (NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS, §1.4), less the node ID, which the owner's daemon
/// adds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteGpu {
    /// The attaching GPU's [`probe_handle`].
    pub gpu_probe_handle: u64,
    /// The importer's request key (its object's team request ID).
    pub key: u64,
    /// The attaching GPU's clique.
    pub clique_id: u32,
    /// The attaching GPU's NVLink bandwidth mode.
    pub bw_mode: u16,
    /// The epoch of that mode.
    pub bw_mode_epoch: u64,
    /// The importer object's page size.
    pub page_size: u64,
}

/// What cuMulticastBindMem binds: `size` bytes of allocation `mem` from `mem_offset`, at
/// `offset` of the multicast object, for local GPU `gpu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct McBind {
    /// The bound GPU (attached before).
    pub gpu: u32,
    /// Offset in the multicast object.
    pub offset: u64,
    /// The allocation (this client's, on `gpu`).
    pub mem: u64,
    /// Offset in the allocation.
    pub mem_offset: u64,
    /// Bytes.
    pub size: u64,
}

/// A multicast control, on this client's object `mc` unless said otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum McRequest {
    /// cuMulticastCreate: the prime object (no USE_EXPORT_PACKET) for `num_gpus` GPUs.
    Create {
        /// GPUs the team will have, across every node (1 ..= u32::MAX - 1).
        num_gpus: u32,
        /// Bytes (a multiple of the page size).
        size: u64,
        /// 0 for the default (the fabric's 2 MiB page here).
        page_size: u64,
    },
    /// Export of the prime object (NV_MEMORY_EXPORT, FABRIC_MC): a 64-byte handle, hex.
    Export {
        /// The prime object.
        mc: u64,
    },
    /// Import of a multicast handle (0xFD with USE_EXPORT_PACKET): a non-prime object.
    Import {
        /// The 64-byte handle, hex.
        handle: String,
    },
    /// cuMulticastAddDevice (ATTACH_GPU).
    AttachGpu {
        /// The object.
        mc: u64,
        /// GPU index on this node.
        gpu: u32,
    },
    /// cuMulticastBindMem (ATTACH_MEM): needs the team set up.
    AttachMem {
        /// The object.
        mc: u64,
        /// What to bind where.
        bind: McBind,
    },
    /// GET_INFO, waiting up to `wait_ms` while the team is not set up (REGISTER_EVENT and a
    /// wait on it, as libcuda does in cuMulticastBindMem).
    GetInfo {
        /// The object.
        mc: u64,
        /// Bound on the wait (0: answer at once).
        wait_ms: u64,
    },
    /// Daemon, owner side: ATTACH_REMOTE_GPU on the prime object of `export_uuid`, for a GPU
    /// of IMEX node `node_id`.
    AttachRemoteGpu {
        /// Session token.
        token: u64,
        /// The prime's export UUID, hex.
        export_uuid: String,
        /// The attaching node.
        node_id: u16,
        /// The attach.
        gpu: RemoteGpu,
    },
    /// Daemon, owner side: SET_FAILURE on the prime object of `export_uuid`.
    SetFailure {
        /// Session token.
        token: u64,
        /// The prime's export UUID, hex.
        export_uuid: String,
        /// The failure (NV_ERR_NOT_READY is refused: it is the initial state).
        status: NvStatus,
    },
}

/// Where a multicast object stands (GET_INFO).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McInfo {
    /// Bytes (0 on an imported object until its team is set up: the FM gives the size).
    pub size: u64,
    /// Page size.
    pub page_size: u64,
    /// GPUs the team needs (`u32::MAX` on an imported object: the prime counts).
    pub num_max_gpus: u32,
    /// GPUs attached to this object so far.
    pub num_attached_gpus: u32,
    /// The team, once set up.
    pub team: Option<McTeam>,
    /// Members of the team (known once set up).
    pub members: Vec<FabricGpu>,
    /// The multicast table's directory once set up.
    pub table_dir: Option<String>,
}

/// The driver's answer to a [`McRequest`] (failures are the protocol's `Response::Error`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum McResponse {
    /// To `Create` and `Import`: the object's handle.
    Object {
        /// Handle (release with `Release`).
        mc: u64,
    },
    /// To `Export`.
    Exported {
        /// 64-byte handle, hex.
        handle: String,
    },
    /// To `GetInfo` (once set up, or the wait ran out: then `team` is `None`).
    Info(McInfo),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_handles_name_their_gpu_and_are_never_zero() {
        for gpu in [
            FabricGpu { slot: 0, gpu: 0 },
            FabricGpu { slot: 575, gpu: 3 },
        ] {
            let h = probe_handle(gpu);
            assert_ne!(h, 0);
            assert_eq!(probe_handle_gpu(h), Some(gpu));
        }
        assert_eq!(probe_handle_gpu(0), None);
        assert_eq!(probe_handle_gpu(7), None);
    }

    #[test]
    fn bindings_have_distinct_file_names_per_gpu_and_offset() {
        let b = |slot, mc_offset| McBinding {
            gpu: FabricGpu { slot, gpu: 1 },
            mc_offset,
            size: 1,
            file: String::new(),
            file_offset: 0,
        };
        assert_ne!(b(0, 0).file_name(), b(1, 0).file_name());
        assert_ne!(b(0, 0).file_name(), b(0, 2 << 20).file_name());
        assert_eq!(
            table_dir(Path::new("/f"), 0x10),
            PathBuf::from("/f/multicast/0000000000000010")
        );
    }
}
