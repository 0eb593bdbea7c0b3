//! `NV_MEMORY_FABRIC` (`class/cl00f8.h`) and `NV_MEMORY_FABRIC_IMPORT_V2`
//! (`class/cl00f9.h`): the exporter's FLA memory and the importer's pending import.
//!
//! The daemon does not allocate either: CUDA allocates `NV_MEMORY_FABRIC` under a
//! subdevice on the exporting node, and `NV_MEMORY_FABRIC_IMPORT_V2` under the client on
//! the importing node (which posts the `MEM_IMPORT` event). The daemon obtains its own
//! handle to the former with `NV00E0_CTRL_CMD_IMPORT_MEM` and reads it with
//! `NV00F8_CTRL_CMD_DESCRIBE`. The parameter structs are here for a simulated driver.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::NvHandle;
use crate::class::nv00e0::NV_EXPORT_MEM_PACKET;

/// `NV_MEMORY_FABRIC`.
pub const NV_MEMORY_FABRIC: u32 = 0xF8;
/// `NV_MEMORY_FABRIC_IMPORT_V2`.
pub const NV_MEMORY_FABRIC_IMPORT_V2: u32 = 0xF9;

/// `NV_MEMORY_FABRIC_PAGE_SIZE_2M`.
pub const NV_MEMORY_FABRIC_PAGE_SIZE_2M: u64 = 0x20_0000;
/// `NV_MEMORY_FABRIC_PAGE_SIZE_512M`.
pub const NV_MEMORY_FABRIC_PAGE_SIZE_512M: u64 = 0x2000_0000;
/// `NV_MEMORY_FABRIC_PAGE_SIZE_256G` (2^38; defined from 560.28.03 on).
pub const NV_MEMORY_FABRIC_PAGE_SIZE_256G: u64 = 0x40_0000_0000;

/// `NV00F8_ALLOC_FLAGS_DEFAULT` ("sticky": FLA→PA mapping fixed at creation).
pub const NV00F8_ALLOC_FLAGS_DEFAULT: u32 = 0;
/// `NV00F8_ALLOC_FLAGS_FLEXIBLE_FLA`.
pub const NV00F8_ALLOC_FLAGS_FLEXIBLE_FLA: u32 = 1 << 0;
/// `NV00F8_ALLOC_FLAGS_FORCE_NONCONTIGUOUS`.
pub const NV00F8_ALLOC_FLAGS_FORCE_NONCONTIGUOUS: u32 = 1 << 1;
/// `NV00F8_ALLOC_FLAGS_FORCE_CONTIGUOUS`.
pub const NV00F8_ALLOC_FLAGS_FORCE_CONTIGUOUS: u32 = 1 << 2;
/// `NV00F8_ALLOC_FLAGS_READ_ONLY` (debug/develop builds only).
pub const NV00F8_ALLOC_FLAGS_READ_ONLY: u32 = 1 << 3;
/// `NV00F8_ALLOC_FLAGS_FORCE_UC_LOOPBACK` (defined from 595.44.02 on).
pub const NV00F8_ALLOC_FLAGS_FORCE_UC_LOOPBACK: u32 = 1 << 4;

/// The anonymous `map` member of `NV00F8_ALLOCATION_PARAMETERS` (class/cl00f8.h).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F8_ALLOCATION_PARAMETERS_MAP {
    /// Offset into the physical memory.
    pub offset: u64,
    /// Physical memory handle (0 for flexible allocations).
    pub hVidMem: NvHandle,
    /// Reserved (0).
    pub flags: u32,
}
assert_layout!(NV00F8_ALLOCATION_PARAMETERS_MAP, size = 16, align = 8, offset @ 0, hVidMem @ 8, flags @ 12);

/// `NV00F8_ALLOCATION_PARAMETERS` (class/cl00f8.h): allocation parameters of
/// [`NV_MEMORY_FABRIC`].
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F8_ALLOCATION_PARAMETERS {
    /// Alignment (at least the page size).
    pub alignment: u64,
    /// Size of the FLA range.
    pub allocSize: u64,
    /// `NV_MEMORY_FABRIC_PAGE_SIZE_*`.
    pub pageSize: u64,
    /// `NV00F8_ALLOC_FLAGS_*`.
    pub allocFlags: u32,
    /// Padding before the 8-byte-aligned `map`.
    pub _pad0: [u8; 4],
    /// Physical memory to map.
    pub map: NV00F8_ALLOCATION_PARAMETERS_MAP,
}
assert_layout!(NV00F8_ALLOCATION_PARAMETERS, size = 48, align = 8,
    alignment @ 0, allocSize @ 8, pageSize @ 16, allocFlags @ 24, _pad0 @ 28, map @ 32);

/// `NV00F9_IMPORT_ID_MAX`: import IDs are 48 bits (`NVBIT64(48) - 1`).
pub const NV00F9_IMPORT_ID_MAX: u64 = (1 << 48) - 1;

/// `NV00F9_ALLOCATION_PARAMETERS` (class/cl00f9.h): allocation parameters of
/// [`NV_MEMORY_FABRIC_IMPORT_V2`] (importer side; one import is keyed by
/// `expPacket.uuid + index + id`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F9_ALLOCATION_PARAMETERS {
    /// Ignored (the driver uses the client's subscribed channel).
    pub imexChannel: u32,
    /// Export packet to import from.
    pub expPacket: NV_EXPORT_MEM_PACKET,
    /// Index into the export object.
    pub index: u16,
    /// Padding before `flags`.
    pub _pad0: [u8; 2],
    /// Reserved (0).
    pub flags: u32,
    /// Padding before the 8-byte-aligned `pOsEvent`.
    pub _pad1: [u8; 4],
    /// `NvP64`, but holds an optional OS event **file descriptor** number.
    pub pOsEvent: u64,
    /// Caller-chosen 48-bit import ID.
    pub id: u64,
}
assert_layout!(NV00F9_ALLOCATION_PARAMETERS, size = 64, align = 8,
    imexChannel @ 0, expPacket @ 4, index @ 36, _pad0 @ 38, flags @ 40, _pad1 @ 44,
    pOsEvent @ 48, id @ 56);
