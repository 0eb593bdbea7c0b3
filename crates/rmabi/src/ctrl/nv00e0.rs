//! `NV_MEMORY_EXPORT` controls (`ctrl/ctrl00e0.h`; unchanged 550.40.07 … 595.45.04).
//!
//! On the exporting node the daemon re-opens the export by UUID, then `IMPORT_MEM` dups
//! the attached memory objects into its own client under handles it chooses. If the
//! exporter attached them with a device/subdevice parent, the daemon's client must
//! already own a Device (and Subdevice) for that GPU, because the dups are parented there.
//! `EXPORT_MEM` (application side) is here for a simulated driver; RM's Unix layer reads
//! its `devDescriptor` (a GPU **file descriptor**, `RmGetDeviceFd` in escape.c).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::NvHandle;
use crate::class::nv00e0::NV00E0_ALLOCATION_PARAMETERS;

/// `NV00E0_CTRL_CMD_EXPORT_MEM`.
pub const NV00E0_CTRL_CMD_EXPORT_MEM: u32 = 0xE0_0101;
/// `NV00E0_CTRL_CMD_IMPORT_MEM`.
pub const NV00E0_CTRL_CMD_IMPORT_MEM: u32 = 0xE0_0102;
/// `NV00E0_CTRL_CMD_GET_INFO`.
pub const NV00E0_CTRL_CMD_GET_INFO: u32 = 0xE0_0103;

/// `NV00E0_MAX_EXPORT_HANDLES`.
pub const NV00E0_MAX_EXPORT_HANDLES: usize = 256;
/// `NV00E0_MAX_IMPORT_HANDLES`.
pub const NV00E0_MAX_IMPORT_HANDLES: usize = 128;

/// `NV00E0_ADDR_SPACE_TYPE_SYSMEM`.
pub const NV00E0_ADDR_SPACE_TYPE_SYSMEM: u8 = 1;
/// `NV00E0_ADDR_SPACE_TYPE_VIDMEM`.
pub const NV00E0_ADDR_SPACE_TYPE_VIDMEM: u8 = 2;
/// `NV00E0_ADDR_SPACE_TYPE_FABRIC` (an `NV_MEMORY_FABRIC` object).
pub const NV00E0_ADDR_SPACE_TYPE_FABRIC: u8 = 3;
/// `NV00E0_ADDR_SPACE_TYPE_FABRIC_MC` (an `NV_MEMORY_MULTICAST_FABRIC` object).
pub const NV00E0_ADDR_SPACE_TYPE_FABRIC_MC: u8 = 4;

/// `NV00E0_CTRL_EXPORT_MEM_PARAMS` (ctrl00e0.h): attach memory handles at
/// `[index, index + numHandles)`; a zero handle detaches its slot.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV00E0_CTRL_EXPORT_MEM_PARAMS {
    /// First slot.
    pub index: u16,
    /// Padding before `hParent`.
    pub _pad0: [u8; 2],
    /// Parent of the handles (client, device or subdevice).
    pub hParent: NvHandle,
    /// Memory handles.
    pub handles: [NvHandle; NV00E0_MAX_EXPORT_HANDLES],
    /// Number of handles.
    pub numHandles: u16,
    /// Padding before the 8-byte-aligned `devDescriptor`.
    pub _pad1: [u8; 6],
    /// **File descriptor** of the GPU (`/dev/nvidiaN`), filled by RM's user-mode shim.
    pub devDescriptor: u64,
}
assert_layout!(NV00E0_CTRL_EXPORT_MEM_PARAMS, size = 1048, align = 8,
    index @ 0, _pad0 @ 2, hParent @ 4, handles @ 8, numHandles @ 1032, _pad1 @ 1034,
    devDescriptor @ 1040);

/// `NV_IMPORT_MEM_INFO` (ctrl00e0.h): what `IMPORT_MEM` reports per imported object.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV_IMPORT_MEM_INFO {
    /// Parent the dup was created under.
    pub hParent: NvHandle,
    /// `NV00E0_ADDR_SPACE_TYPE_*`.
    pub addrSpace: u8,
    /// Trailing padding.
    pub _pad0: [u8; 3],
}
assert_layout!(NV_IMPORT_MEM_INFO, size = 8, align = 4, hParent @ 0, addrSpace @ 4, _pad0 @ 5);

/// `NV00E0_CTRL_IMPORT_MEM_PARAMS` (ctrl00e0.h): dup the objects attached at
/// `[index, index + numHandles)` into the caller's client, under `handles` (chosen by the
/// caller; at most 128 per call).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV00E0_CTRL_IMPORT_MEM_PARAMS {
    /// In: first slot.
    pub index: u16,
    /// In: number of handles.
    pub numHandles: u16,
    /// In: handles for the dups.
    pub handles: [NvHandle; NV00E0_MAX_IMPORT_HANDLES],
    /// Out: per handle, parent and address space.
    pub memInfos: [NV_IMPORT_MEM_INFO; NV00E0_MAX_IMPORT_HANDLES],
}
assert_layout!(NV00E0_CTRL_IMPORT_MEM_PARAMS, size = 1540, align = 4,
    index @ 0, numHandles @ 2, handles @ 4, memInfos @ 516);

impl NV00E0_CTRL_IMPORT_MEM_PARAMS {
    /// Parameters importing `handles.len()` (≤ 128) objects from slot `index`.
    pub fn new(index: u16, handles: &[NvHandle]) -> Result<Self, crate::AbiError> {
        if handles.len() > NV00E0_MAX_IMPORT_HANDLES {
            return Err(crate::AbiError::TooManyEntries {
                what: "NV00E0_CTRL_IMPORT_MEM_PARAMS.handles",
                count: handles.len(),
                max: NV00E0_MAX_IMPORT_HANDLES,
            });
        }
        let mut p = <Self as zerocopy::FromZeros>::new_zeroed();
        p.index = index;
        p.numHandles = handles.len() as u16;
        p.handles[..handles.len()].copy_from_slice(handles);
        Ok(p)
    }
}

/// `NV00E0_CTRL_GET_INFO_PARAMS` (ctrl00e0.h): the export's cached allocation parameters.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00E0_CTRL_GET_INFO_PARAMS {
    /// Out.
    pub info: NV00E0_ALLOCATION_PARAMETERS,
}
assert_layout!(NV00E0_CTRL_GET_INFO_PARAMS, size = 244, align = 4, info @ 0);

impl_zeroed_default!(NV00E0_CTRL_EXPORT_MEM_PARAMS, NV00E0_CTRL_IMPORT_MEM_PARAMS);
