//! `NV_MEMORY_MULTICAST_FABRIC` controls (`ctrl/ctrl00fd.h`) the daemon issues on the
//! exporting node's prime multicast object.
//!
//! `ATTACH_REMOTE_GPU` gained `bwModeEpoch`/`bwMode` (u8) in 580.65.06, `pageSize` in
//! 590.44.01 and a `NvU16` `bwMode` in 595.44.02 (24 → 32 → 40 → 40 bytes). From V590 on
//! the kernel replaces a `pageSize` of 0 with 512 MiB before checking it against the
//! prime object (`_memMulticastfabricRemoteAttachResolveDefaults`, mem_multicast_fabric.c).
//! Both controls need an IMEX-capable client.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::{AbiError, Layout, NvStatus, narrow, read_exact};

/// `NV00FD_CTRL_CMD_GET_INFO`.
pub const NV00FD_CTRL_CMD_GET_INFO: u32 = 0xFD_0101;
/// `NV00FD_CTRL_CMD_ATTACH_MEM`.
pub const NV00FD_CTRL_CMD_ATTACH_MEM: u32 = 0xFD_0102;
/// `NV00FD_CTRL_CMD_REGISTER_EVENT`.
pub const NV00FD_CTRL_CMD_REGISTER_EVENT: u32 = 0xFD_0103;
/// `NV00FD_CTRL_CMD_ATTACH_GPU` (carries a GPU **file descriptor** in `devDescriptor`).
pub const NV00FD_CTRL_CMD_ATTACH_GPU: u32 = 0xFD_0104;
/// `NV00FD_CTRL_CMD_DETACH_MEM`.
pub const NV00FD_CTRL_CMD_DETACH_MEM: u32 = 0xFD_0105;
/// `NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU`: add a remote node's GPU to the multicast team.
pub const NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU: u32 = 0xFD_0106;
/// `NV00FD_CTRL_CMD_SET_FAILURE`: fail the prime object.
pub const NV00FD_CTRL_CMD_SET_FAILURE: u32 = 0xFD_0107;

/// `NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS` (ctrl00fd.h) of 550.40.07 … 575.64.05.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V550 {
    /// Fabric probe handle of the remote GPU (from the attach event).
    pub gpuFabricProbeHandle: u64,
    /// Key (from the attach event).
    pub key: u64,
    /// Clique ID of the remote GPU.
    pub cliqueId: u32,
    /// Node the remote GPU is on.
    pub nodeId: u16,
    /// Trailing padding.
    pub _pad0: [u8; 2],
}
assert_layout!(NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V550, size = 24, align = 8,
    gpuFabricProbeHandle @ 0, key @ 8, cliqueId @ 16, nodeId @ 20, _pad0 @ 22);

/// `NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS` (ctrl00fd.h) of 580.65.06 … 580.142.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V580 {
    /// Fabric probe handle of the remote GPU.
    pub gpuFabricProbeHandle: u64,
    /// Key.
    pub key: u64,
    /// Active bwModeEpoch of the remote GPU.
    pub bwModeEpoch: u64,
    /// Clique ID of the remote GPU.
    pub cliqueId: u32,
    /// Node the remote GPU is on.
    pub nodeId: u16,
    /// Active bwMode (`NvU8`).
    pub bwMode: u8,
    /// Trailing padding.
    pub _pad0: [u8; 1],
}
assert_layout!(NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V580, size = 32, align = 8,
    gpuFabricProbeHandle @ 0, key @ 8, bwModeEpoch @ 16, cliqueId @ 24, nodeId @ 28,
    bwMode @ 30, _pad0 @ 31);

/// `NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS` (ctrl00fd.h) of 590.44.01, 590.48.01.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V590 {
    /// Fabric probe handle of the remote GPU.
    pub gpuFabricProbeHandle: u64,
    /// Key.
    pub key: u64,
    /// Active bwModeEpoch of the remote GPU.
    pub bwModeEpoch: u64,
    /// Page size requested by the remote client (must match the prime; 0 = 512M).
    pub pageSize: u64,
    /// Clique ID of the remote GPU.
    pub cliqueId: u32,
    /// Node the remote GPU is on.
    pub nodeId: u16,
    /// Active bwMode (`NvU8`).
    pub bwMode: u8,
    /// Trailing padding.
    pub _pad0: [u8; 1],
}
assert_layout!(NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V590, size = 40, align = 8,
    gpuFabricProbeHandle @ 0, key @ 8, bwModeEpoch @ 16, pageSize @ 24, cliqueId @ 32,
    nodeId @ 36, bwMode @ 38, _pad0 @ 39);

/// `NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS` (ctrl00fd.h) of 595.44.02 on.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V595 {
    /// Fabric probe handle of the remote GPU.
    pub gpuFabricProbeHandle: u64,
    /// Key.
    pub key: u64,
    /// Active bwModeEpoch of the remote GPU.
    pub bwModeEpoch: u64,
    /// Page size requested by the remote client (must match the prime; 0 = 512M).
    pub pageSize: u64,
    /// Clique ID of the remote GPU.
    pub cliqueId: u32,
    /// Node the remote GPU is on.
    pub nodeId: u16,
    /// Active bwMode (`NvU16`).
    pub bwMode: u16,
}
assert_layout!(NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V595, size = 40, align = 8,
    gpuFabricProbeHandle @ 0, key @ 8, bwModeEpoch @ 16, pageSize @ 24, cliqueId @ 32,
    nodeId @ 36, bwMode @ 38);

/// `NV00FD_CTRL_SET_FAILURE_PARAMS` (ctrl00fd.h; same in every family).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00FD_CTRL_SET_FAILURE_PARAMS {
    /// Failure status (`NV_STATUS`, not `NV_OK`).
    pub status: NvStatus,
}
assert_layout!(NV00FD_CTRL_SET_FAILURE_PARAMS, size = 4, align = 4, status @ 0);

/// `NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS` independent of the layout family. Fields the
/// layout lacks are not encoded (and decode as 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttachRemoteGpu {
    /// `gpuFabricProbeHandle`.
    pub probe_handle: u64,
    /// `key`.
    pub key: u64,
    /// `bwModeEpoch` (V580 on).
    pub bw_mode_epoch: u64,
    /// `pageSize` (V590 on).
    pub page_size: u64,
    /// `cliqueId`.
    pub clique_id: u32,
    /// `nodeId`: the node the attach event came from.
    pub node_id: u16,
    /// `bwMode` (V580 on; ≤ 255 in V580/V590).
    pub bw_mode: u16,
}

impl AttachRemoteGpu {
    /// The parameter block of `layout`; fails if `bw_mode` does not fit.
    pub fn encode(&self, layout: Layout) -> Result<Vec<u8>, AbiError> {
        const BW: &str = "NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS.bwMode";
        Ok(match layout {
            Layout::V550 => NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V550 {
                gpuFabricProbeHandle: self.probe_handle,
                key: self.key,
                cliqueId: self.clique_id,
                nodeId: self.node_id,
                _pad0: [0; 2],
            }
            .as_bytes()
            .to_vec(),
            Layout::V580 => NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V580 {
                gpuFabricProbeHandle: self.probe_handle,
                key: self.key,
                bwModeEpoch: self.bw_mode_epoch,
                cliqueId: self.clique_id,
                nodeId: self.node_id,
                bwMode: narrow(BW, layout, u64::from(self.bw_mode))?,
                _pad0: [0; 1],
            }
            .as_bytes()
            .to_vec(),
            Layout::V590 => NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V590 {
                gpuFabricProbeHandle: self.probe_handle,
                key: self.key,
                bwModeEpoch: self.bw_mode_epoch,
                pageSize: self.page_size,
                cliqueId: self.clique_id,
                nodeId: self.node_id,
                bwMode: narrow(BW, layout, u64::from(self.bw_mode))?,
                _pad0: [0; 1],
            }
            .as_bytes()
            .to_vec(),
            Layout::V595 => NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V595 {
                gpuFabricProbeHandle: self.probe_handle,
                key: self.key,
                bwModeEpoch: self.bw_mode_epoch,
                pageSize: self.page_size,
                cliqueId: self.clique_id,
                nodeId: self.node_id,
                bwMode: self.bw_mode,
            }
            .as_bytes()
            .to_vec(),
        })
    }

    /// Parses a parameter block of `layout`.
    pub fn decode(layout: Layout, bytes: &[u8]) -> Result<Self, AbiError> {
        const WHAT: &str = "NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS";
        Ok(match layout {
            Layout::V550 => {
                let p: NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V550 =
                    read_exact(WHAT, Some(layout), bytes)?;
                Self {
                    probe_handle: p.gpuFabricProbeHandle,
                    key: p.key,
                    clique_id: p.cliqueId,
                    node_id: p.nodeId,
                    ..Default::default()
                }
            }
            Layout::V580 => {
                let p: NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V580 =
                    read_exact(WHAT, Some(layout), bytes)?;
                Self {
                    probe_handle: p.gpuFabricProbeHandle,
                    key: p.key,
                    bw_mode_epoch: p.bwModeEpoch,
                    page_size: 0,
                    clique_id: p.cliqueId,
                    node_id: p.nodeId,
                    bw_mode: u16::from(p.bwMode),
                }
            }
            Layout::V590 => {
                let p: NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V590 =
                    read_exact(WHAT, Some(layout), bytes)?;
                Self {
                    probe_handle: p.gpuFabricProbeHandle,
                    key: p.key,
                    bw_mode_epoch: p.bwModeEpoch,
                    page_size: p.pageSize,
                    clique_id: p.cliqueId,
                    node_id: p.nodeId,
                    bw_mode: u16::from(p.bwMode),
                }
            }
            Layout::V595 => {
                let p: NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V595 =
                    read_exact(WHAT, Some(layout), bytes)?;
                Self {
                    probe_handle: p.gpuFabricProbeHandle,
                    key: p.key,
                    bw_mode_epoch: p.bwModeEpoch,
                    page_size: p.pageSize,
                    clique_id: p.cliqueId,
                    node_id: p.nodeId,
                    bw_mode: p.bwMode,
                }
            }
        })
    }

    /// The parameters for forwarding a `REMOTE_GPU_ATTACH` event received from node
    /// `node_id` (`None` if `event` is another kind).
    pub fn from_event(event: &crate::FabricEvent, node_id: u16) -> Option<Self> {
        match *event {
            crate::FabricEvent::RemoteGpuAttach {
                probe_handle,
                key,
                bw_mode_epoch,
                page_size,
                clique_id,
                bw_mode,
                ..
            } => Some(Self {
                probe_handle,
                key,
                bw_mode_epoch,
                page_size,
                clique_id,
                node_id,
                bw_mode,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_sizes() {
        let a = AttachRemoteGpu {
            probe_handle: 0x1111,
            key: 0x2222,
            bw_mode_epoch: 5,
            page_size: 1 << 29,
            clique_id: 3,
            node_id: 4,
            bw_mode: 200,
        };
        for (l, size) in [
            (Layout::V550, 24),
            (Layout::V580, 32),
            (Layout::V590, 40),
            (Layout::V595, 40),
        ] {
            let b = a.encode(l).unwrap();
            assert_eq!(b.len(), size);
            assert_eq!(b.len(), l.attach_remote_gpu_params_size());
            let mut want = a;
            if !l.has_bw_mode() {
                want.bw_mode = 0;
                want.bw_mode_epoch = 0;
            }
            if !l.has_attach_page_size() {
                want.page_size = 0;
            }
            assert_eq!(AttachRemoteGpu::decode(l, &b).unwrap(), want);
        }
        let wide = AttachRemoteGpu { bw_mode: 300, ..a };
        assert!(wide.encode(Layout::V580).is_err());
        assert_eq!(
            &wide.encode(Layout::V595).unwrap()[38..40],
            &300u16.to_ne_bytes()
        );
    }
}
