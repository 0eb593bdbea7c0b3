//! `NV_MEMORY_MULTICAST_FABRIC` (`class/cl00fd.h`): multicast (NVLS) fabric objects.
//!
//! Parent: the client. CUDA allocates the prime object (`cuMulticastCreate`) and, on a
//! remote node, an imported one (`USE_EXPORT_PACKET` plus packet and index). The daemon
//! only addresses the prime object with `NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU` /
//! `SET_FAILURE` (see [`crate::ctrl::nv00fd`]).
//!
//! The allocation parameters changed twice: 545.23.06 added `expPacket` and `index` in
//! front (before the range this crate covers), and 590.44.01 widened `pageSize` from
//! `NvU32` to `NvU64`. The size is 80 bytes in both layouts here, but `allocFlags` and
//! `numGpus` moved, so a block built for the wrong family is silently misread.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::class::nv00e0::NV_EXPORT_MEM_PACKET;
use crate::{AbiError, Layout, narrow, read_exact};

/// `NV_MEMORY_MULTICAST_FABRIC`.
pub const NV_MEMORY_MULTICAST_FABRIC: u32 = 0xFD;

/// `NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_512M`.
pub const NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_512M: u64 = 0x2000_0000;
/// `NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_256G` (defined from 590.44.01 on). The header's
/// value is `0x1000000000000` (2^48), not 256 GiB (2^38, which is what
/// `NV_MEMORY_FABRIC_PAGE_SIZE_256G` is); copied as written. It does not fit the `NvU32`
/// `pageSize` of the V550/V580 layouts.
pub const NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_256G: u64 = 0x1_0000_0000_0000;
/// `NV_MEMORY_MULTICAST_FABRIC_ALLOC_FLAGS_USE_EXPORT_PACKET`: create from `expPacket`
/// (import); `alignment`, `allocSize`, `numGpus` and `pageSize` are then not honoured.
pub const NV_MEMORY_MULTICAST_FABRIC_ALLOC_FLAGS_USE_EXPORT_PACKET: u32 = 1;

/// `NV00FD_ALLOCATION_PARAMETERS` (class/cl00fd.h) of 550.40.07 … 580.142: `pageSize` is
/// `NvU32`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00FD_ALLOCATION_PARAMETERS_V550 {
    /// Export packet (with `USE_EXPORT_PACKET`).
    pub expPacket: NV_EXPORT_MEM_PACKET,
    /// Index into the export object.
    pub index: u16,
    /// Padding before the 8-byte-aligned `alignment`.
    pub _pad0: [u8; 6],
    /// Alignment (at least the page size).
    pub alignment: u64,
    /// Size of the multicast FLA range.
    pub allocSize: u64,
    /// `NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_*` (`NvU32` in this layout).
    pub pageSize: u32,
    /// `NV_MEMORY_MULTICAST_FABRIC_ALLOC_FLAGS_*`.
    pub allocFlags: u32,
    /// Number of GPUs that will attach.
    pub numGpus: u32,
    /// Padding before the 8-byte-aligned `pOsEvent`.
    pub _pad1: [u8; 4],
    /// `NvP64`, but holds an optional OS event **file descriptor** number.
    pub pOsEvent: u64,
}
assert_layout!(NV00FD_ALLOCATION_PARAMETERS_V550, size = 80, align = 8,
    expPacket @ 0, index @ 32, _pad0 @ 34, alignment @ 40, allocSize @ 48, pageSize @ 56,
    allocFlags @ 60, numGpus @ 64, _pad1 @ 68, pOsEvent @ 72);

/// `NV00FD_ALLOCATION_PARAMETERS` (class/cl00fd.h) of 590.44.01 on: `pageSize` is `NvU64`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00FD_ALLOCATION_PARAMETERS_V590 {
    /// Export packet (with `USE_EXPORT_PACKET`).
    pub expPacket: NV_EXPORT_MEM_PACKET,
    /// Index into the export object.
    pub index: u16,
    /// Padding before the 8-byte-aligned `alignment`.
    pub _pad0: [u8; 6],
    /// Alignment (at least the page size).
    pub alignment: u64,
    /// Size of the multicast FLA range.
    pub allocSize: u64,
    /// `NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_*`.
    pub pageSize: u64,
    /// `NV_MEMORY_MULTICAST_FABRIC_ALLOC_FLAGS_*`.
    pub allocFlags: u32,
    /// Number of GPUs that will attach.
    pub numGpus: u32,
    /// `NvP64`, but holds an optional OS event **file descriptor** number.
    pub pOsEvent: u64,
}
assert_layout!(NV00FD_ALLOCATION_PARAMETERS_V590, size = 80, align = 8,
    expPacket @ 0, index @ 32, _pad0 @ 34, alignment @ 40, allocSize @ 48, pageSize @ 56,
    allocFlags @ 64, numGpus @ 68, pOsEvent @ 72);

/// `NV00FD_ALLOCATION_PARAMETERS` of the V580 family: the same layout as V550.
pub type NV00FD_ALLOCATION_PARAMETERS_V580 = NV00FD_ALLOCATION_PARAMETERS_V550;
/// `NV00FD_ALLOCATION_PARAMETERS` of the V595 family: the same layout as V590.
pub type NV00FD_ALLOCATION_PARAMETERS_V595 = NV00FD_ALLOCATION_PARAMETERS_V590;

/// `NV00FD_ALLOCATION_PARAMETERS` independent of the layout family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MulticastAlloc {
    /// `expPacket`.
    pub exp_packet: NV_EXPORT_MEM_PACKET,
    /// `index`.
    pub index: u16,
    /// `alignment`.
    pub alignment: u64,
    /// `allocSize`.
    pub alloc_size: u64,
    /// `pageSize` (must fit `u32` before V590).
    pub page_size: u64,
    /// `allocFlags`.
    pub alloc_flags: u32,
    /// `numGpus`.
    pub num_gpus: u32,
    /// `pOsEvent`: OS event **file descriptor** number, or 0.
    pub os_event: u64,
}

impl MulticastAlloc {
    /// The C parameter block for `layout` (80 bytes). Fails if `page_size` does not fit
    /// the layout's `NvU32`.
    pub fn encode(&self, layout: Layout) -> Result<Vec<u8>, AbiError> {
        Ok(if layout.has_u64_multicast_page_size() {
            NV00FD_ALLOCATION_PARAMETERS_V590 {
                expPacket: self.exp_packet,
                index: self.index,
                _pad0: [0; 6],
                alignment: self.alignment,
                allocSize: self.alloc_size,
                pageSize: self.page_size,
                allocFlags: self.alloc_flags,
                numGpus: self.num_gpus,
                pOsEvent: self.os_event,
            }
            .as_bytes()
            .to_vec()
        } else {
            NV00FD_ALLOCATION_PARAMETERS_V550 {
                expPacket: self.exp_packet,
                index: self.index,
                _pad0: [0; 6],
                alignment: self.alignment,
                allocSize: self.alloc_size,
                pageSize: narrow(
                    "NV00FD_ALLOCATION_PARAMETERS.pageSize",
                    layout,
                    self.page_size,
                )?,
                allocFlags: self.alloc_flags,
                numGpus: self.num_gpus,
                _pad1: [0; 4],
                pOsEvent: self.os_event,
            }
            .as_bytes()
            .to_vec()
        })
    }

    /// Parses a parameter block of `layout` (must be exactly 80 bytes).
    pub fn decode(layout: Layout, bytes: &[u8]) -> Result<Self, AbiError> {
        const WHAT: &str = "NV00FD_ALLOCATION_PARAMETERS";
        Ok(if layout.has_u64_multicast_page_size() {
            let p: NV00FD_ALLOCATION_PARAMETERS_V590 = read_exact(WHAT, Some(layout), bytes)?;
            Self {
                exp_packet: p.expPacket,
                index: p.index,
                alignment: p.alignment,
                alloc_size: p.allocSize,
                page_size: p.pageSize,
                alloc_flags: p.allocFlags,
                num_gpus: p.numGpus,
                os_event: p.pOsEvent,
            }
        } else {
            let p: NV00FD_ALLOCATION_PARAMETERS_V550 = read_exact(WHAT, Some(layout), bytes)?;
            Self {
                exp_packet: p.expPacket,
                index: p.index,
                alignment: p.alignment,
                alloc_size: p.allocSize,
                page_size: u64::from(p.pageSize),
                alloc_flags: p.allocFlags,
                num_gpus: p.numGpus,
                os_event: p.pOsEvent,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_every_layout() {
        let m = MulticastAlloc {
            exp_packet: NV_EXPORT_MEM_PACKET {
                uuid: [7; 16],
                opaque: [9; 16],
            },
            index: 3,
            alignment: 1 << 29,
            alloc_size: 1 << 31,
            page_size: NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_512M,
            alloc_flags: NV_MEMORY_MULTICAST_FABRIC_ALLOC_FLAGS_USE_EXPORT_PACKET,
            num_gpus: 4,
            os_event: 12,
        };
        for l in Layout::ALL {
            let b = m.encode(l).unwrap();
            assert_eq!(b.len(), 80);
            assert_eq!(MulticastAlloc::decode(l, &b).unwrap(), m);
        }
        // allocFlags sits at 60 before V590 and at 64 from V590 on.
        assert_eq!(m.encode(Layout::V580).unwrap()[60], 1);
        assert_eq!(m.encode(Layout::V590).unwrap()[64], 1);
    }

    #[test]
    fn page_size_256g_needs_u64_layout() {
        let m = MulticastAlloc {
            page_size: NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_256G,
            ..Default::default()
        };
        assert!(matches!(
            m.encode(Layout::V580),
            Err(AbiError::ValueOutOfRange { .. })
        ));
        assert!(m.encode(Layout::V595).is_ok());
        assert!(matches!(
            MulticastAlloc::decode(Layout::V595, &[0; 79]),
            Err(AbiError::WrongSize {
                expected: 80,
                actual: 79,
                ..
            })
        ));
    }
}
