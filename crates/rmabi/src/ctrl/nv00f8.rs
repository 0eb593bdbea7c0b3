//! `NV_MEMORY_FABRIC` controls (`ctrl/ctrl00f8.h`): reading the FLA page list of an
//! exported fabric allocation on the exporting node.
//!
//! `NV_FABRIC_MEMORY_ATTRS` gained `bwModeEpoch`/`bwMode` (u8) in 580.65.06 and `bwMode`
//! became `NvU16` in 595.44.02, so `DESCRIBE` (and `NV00FB` `VALIDATE`, which embeds the
//! same attrs) exist per family: 2120 bytes in V550, 2136 from V580 on.
//!
//! `DESCRIBE` (`memoryfabricCtrlCmdDescribe_IMPL`, `src/nvidia/src/kernel/mem_mgr/mem_fabric.c`,
//! 595.45.04): the caller must be IMEX-capable or admin (`NV_ERR_INSUFFICIENT_PERMISSIONS`);
//! input is `offset` (in PFNs); RM fills everything else: `totalPfns` (1 if contiguous,
//! else size / pageSize), up to 512 PFNs from `offset` (FLA address >> 21), `numPfns`,
//! attrs, physAttrs and memFlags. `offset ≥ totalPfns` gives `NV_ERR_OUT_OF_RANGE`. Call
//! it with offset 0, 512, … until `offset + numPfns == totalPfns`.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::{AbiError, Layout, narrow, read_exact};

/// `NV00F8_CTRL_CMD_GET_INFO`.
pub const NV00F8_CTRL_CMD_GET_INFO: u32 = 0xF8_0101;
/// `NV00F8_CTRL_CMD_DESCRIBE`.
pub const NV00F8_CTRL_CMD_DESCRIBE: u32 = 0xF8_0102;
/// `NV00F8_CTRL_DESCRIBE_PFN_ARRAY_SIZE`.
pub const NV00F8_CTRL_DESCRIBE_PFN_ARRAY_SIZE: usize = 512;
/// PFNs are FLA addresses shifted right by this (2 MiB units; `RM_PAGE_SHIFT_HUGE`).
pub const FABRIC_PFN_SHIFT: u32 = 21;

/// `NV_PHYSICAL_MEMORY_ATTRS` (ctrl00f8.h; same in every family).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV_PHYSICAL_MEMORY_ATTRS {
    /// As `NV0041_CTRL_SURFACE_INFO_INDEX_ADDR_SPACE_TYPE`.
    pub addressSpace: u32,
    /// As `NV0041_CTRL_SURFACE_INFO_INDEX_COMPR_COVERAGE`.
    pub compressionCoverage: u32,
}
assert_layout!(NV_PHYSICAL_MEMORY_ATTRS, size = 8, align = 4, addressSpace @ 0, compressionCoverage @ 4);

/// `NV_FABRIC_MEMORY_ATTRS` (ctrl00f8.h) of 550.40.07 … 575.64.05.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV_FABRIC_MEMORY_ATTRS_V550 {
    /// PTE kind.
    pub kind: u32,
    /// Padding before the 8-byte-aligned `pageSize`.
    pub _pad0: [u8; 4],
    /// Page size (2M, 512M or 256G).
    pub pageSize: u64,
    /// Allocation size.
    pub size: u64,
    /// Clique ID of the owner GPU.
    pub cliqueId: u32,
    /// Trailing padding.
    pub _pad1: [u8; 4],
}
assert_layout!(NV_FABRIC_MEMORY_ATTRS_V550, size = 32, align = 8,
    kind @ 0, _pad0 @ 4, pageSize @ 8, size @ 16, cliqueId @ 24, _pad1 @ 28);

/// `NV_FABRIC_MEMORY_ATTRS` (ctrl00f8.h) of 580.65.06 … 590.48.01 (`bwMode` is `NvU8`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV_FABRIC_MEMORY_ATTRS_V580 {
    /// PTE kind.
    pub kind: u32,
    /// Padding before the 8-byte-aligned `pageSize`.
    pub _pad0: [u8; 4],
    /// Page size (2M, 512M or 256G).
    pub pageSize: u64,
    /// Allocation size.
    pub size: u64,
    /// Clique ID of the owner GPU.
    pub cliqueId: u32,
    /// Padding before the 8-byte-aligned `bwModeEpoch`.
    pub _pad1: [u8; 4],
    /// Active bwModeEpoch of the owner GPU.
    pub bwModeEpoch: u64,
    /// Active bwMode of the owner GPU.
    pub bwMode: u8,
    /// Trailing padding.
    pub _pad2: [u8; 7],
}
assert_layout!(NV_FABRIC_MEMORY_ATTRS_V580, size = 48, align = 8,
    kind @ 0, _pad0 @ 4, pageSize @ 8, size @ 16, cliqueId @ 24, _pad1 @ 28, bwModeEpoch @ 32,
    bwMode @ 40, _pad2 @ 41);

/// `NV_FABRIC_MEMORY_ATTRS` (ctrl00f8.h) of 595.44.02 on (`bwMode` is `NvU16`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV_FABRIC_MEMORY_ATTRS_V595 {
    /// PTE kind.
    pub kind: u32,
    /// Padding before the 8-byte-aligned `pageSize`.
    pub _pad0: [u8; 4],
    /// Page size (2M, 512M or 256G).
    pub pageSize: u64,
    /// Allocation size.
    pub size: u64,
    /// Clique ID of the owner GPU.
    pub cliqueId: u32,
    /// Padding before the 8-byte-aligned `bwModeEpoch`.
    pub _pad1: [u8; 4],
    /// Active bwModeEpoch of the owner GPU.
    pub bwModeEpoch: u64,
    /// Active bwMode of the owner GPU.
    pub bwMode: u16,
    /// Trailing padding.
    pub _pad2: [u8; 6],
}
assert_layout!(NV_FABRIC_MEMORY_ATTRS_V595, size = 48, align = 8,
    kind @ 0, _pad0 @ 4, pageSize @ 8, size @ 16, cliqueId @ 24, _pad1 @ 28, bwModeEpoch @ 32,
    bwMode @ 40, _pad2 @ 42);

/// `NV_FABRIC_MEMORY_ATTRS` of the V590 family: the same layout as V580.
pub type NV_FABRIC_MEMORY_ATTRS_V590 = NV_FABRIC_MEMORY_ATTRS_V580;

/// `NV00F8_CTRL_GET_INFO_PARAMS` (ctrl00f8.h; same in every family).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F8_CTRL_GET_INFO_PARAMS {
    /// Out: allocation size.
    pub size: u64,
    /// Out: page size.
    pub pageSize: u64,
    /// Out: `NV00F8_ALLOC_FLAGS_*` given at allocation.
    pub allocFlags: u32,
    /// Out: physical attributes (zero for flexible allocations).
    pub physAttrs: NV_PHYSICAL_MEMORY_ATTRS,
    /// Trailing padding.
    pub _pad0: [u8; 4],
}
assert_layout!(NV00F8_CTRL_GET_INFO_PARAMS, size = 32, align = 8,
    size @ 0, pageSize @ 8, allocFlags @ 16, physAttrs @ 20, _pad0 @ 28);

macro_rules! describe_params {
    ($name:ident, $attrs:ty, $size:expr, $fam:literal,
     $attrs_off:expr, $phys_off:expr, $flags_off:expr) => {
        #[doc = concat!("`NV00F8_CTRL_DESCRIBE_PARAMS` (ctrl00f8.h), ", $fam, " (", stringify!($size), " bytes).")]
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
        pub struct $name {
            /// In: first PFN to return.
            pub offset: u64,
            /// Out: number of PFNs of the allocation.
            pub totalPfns: u64,
            /// Out: PFNs (FLA address >> 21); the first `numPfns` are valid.
            pub pfnArray: [u32; NV00F8_CTRL_DESCRIBE_PFN_ARRAY_SIZE],
            /// Out: number of valid PFNs (≤ 512).
            pub numPfns: u32,
            /// Padding before the 8-byte-aligned `attrs`.
            pub _pad0: [u8; 4],
            /// Out: memory attributes.
            pub attrs: $attrs,
            /// Out: physical attributes.
            pub physAttrs: NV_PHYSICAL_MEMORY_ATTRS,
            /// Out: `NV00F8_ALLOC_FLAGS_*` of the allocation.
            pub memFlags: u32,
            /// Trailing padding.
            pub _pad1: [u8; 4],
        }
        assert_layout!($name, size = $size, align = 8,
            offset @ 0, totalPfns @ 8, pfnArray @ 16, numPfns @ 2064, _pad0 @ 2068,
            attrs @ $attrs_off, physAttrs @ $phys_off, memFlags @ $flags_off, _pad1 @ $flags_off + 4);
        impl_zeroed_default!($name);
    };
}

describe_params!(
    NV00F8_CTRL_DESCRIBE_PARAMS_V550,
    NV_FABRIC_MEMORY_ATTRS_V550,
    2120,
    "V550",
    2072,
    2104,
    2112
);
describe_params!(
    NV00F8_CTRL_DESCRIBE_PARAMS_V580,
    NV_FABRIC_MEMORY_ATTRS_V580,
    2136,
    "V580 and V590",
    2072,
    2120,
    2128
);
describe_params!(
    NV00F8_CTRL_DESCRIBE_PARAMS_V595,
    NV_FABRIC_MEMORY_ATTRS_V595,
    2136,
    "V595",
    2072,
    2120,
    2128
);

/// `NV00F8_CTRL_DESCRIBE_PARAMS` of the V590 family: the same layout as V580.
pub type NV00F8_CTRL_DESCRIBE_PARAMS_V590 = NV00F8_CTRL_DESCRIBE_PARAMS_V580;

/// `NV_FABRIC_MEMORY_ATTRS` independent of the layout family (`bw_mode_epoch`/`bw_mode`
/// are 0 where the layout lacks them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FabricMemoryAttrs {
    /// `kind`.
    pub kind: u32,
    /// `pageSize`.
    pub page_size: u64,
    /// `size`.
    pub size: u64,
    /// `cliqueId`.
    pub clique_id: u32,
    /// `bwModeEpoch` (V580 on).
    pub bw_mode_epoch: u64,
    /// `bwMode` (V580 on; ≤ 255 in V580/V590).
    pub bw_mode: u16,
}

impl From<NV_FABRIC_MEMORY_ATTRS_V550> for FabricMemoryAttrs {
    fn from(a: NV_FABRIC_MEMORY_ATTRS_V550) -> Self {
        Self {
            kind: a.kind,
            page_size: a.pageSize,
            size: a.size,
            clique_id: a.cliqueId,
            ..Default::default()
        }
    }
}

impl From<NV_FABRIC_MEMORY_ATTRS_V580> for FabricMemoryAttrs {
    fn from(a: NV_FABRIC_MEMORY_ATTRS_V580) -> Self {
        Self {
            kind: a.kind,
            page_size: a.pageSize,
            size: a.size,
            clique_id: a.cliqueId,
            bw_mode_epoch: a.bwModeEpoch,
            bw_mode: u16::from(a.bwMode),
        }
    }
}

impl From<NV_FABRIC_MEMORY_ATTRS_V595> for FabricMemoryAttrs {
    fn from(a: NV_FABRIC_MEMORY_ATTRS_V595) -> Self {
        Self {
            kind: a.kind,
            page_size: a.pageSize,
            size: a.size,
            clique_id: a.cliqueId,
            bw_mode_epoch: a.bwModeEpoch,
            bw_mode: a.bwMode,
        }
    }
}

impl FabricMemoryAttrs {
    /// As the V550 struct (drops `bw_mode_epoch`/`bw_mode`).
    pub fn to_v550(&self) -> NV_FABRIC_MEMORY_ATTRS_V550 {
        NV_FABRIC_MEMORY_ATTRS_V550 {
            kind: self.kind,
            pageSize: self.page_size,
            size: self.size,
            cliqueId: self.clique_id,
            ..Default::default()
        }
    }

    /// As the V580/V590 struct; fails if `bw_mode` > 255.
    pub fn to_v580(&self, layout: Layout) -> Result<NV_FABRIC_MEMORY_ATTRS_V580, AbiError> {
        Ok(NV_FABRIC_MEMORY_ATTRS_V580 {
            kind: self.kind,
            pageSize: self.page_size,
            size: self.size,
            cliqueId: self.clique_id,
            bwModeEpoch: self.bw_mode_epoch,
            bwMode: narrow(
                "NV_FABRIC_MEMORY_ATTRS.bwMode",
                layout,
                u64::from(self.bw_mode),
            )?,
            ..Default::default()
        })
    }

    /// As the V595 struct.
    pub fn to_v595(&self) -> NV_FABRIC_MEMORY_ATTRS_V595 {
        NV_FABRIC_MEMORY_ATTRS_V595 {
            kind: self.kind,
            pageSize: self.page_size,
            size: self.size,
            cliqueId: self.clique_id,
            bwModeEpoch: self.bw_mode_epoch,
            bwMode: self.bw_mode,
            ..Default::default()
        }
    }

    /// The C `NV_FABRIC_MEMORY_ATTRS` of `layout`.
    pub fn encode(&self, layout: Layout) -> Result<Vec<u8>, AbiError> {
        Ok(match layout {
            Layout::V550 => self.to_v550().as_bytes().to_vec(),
            Layout::V580 | Layout::V590 => self.to_v580(layout)?.as_bytes().to_vec(),
            Layout::V595 => self.to_v595().as_bytes().to_vec(),
        })
    }

    /// Parses a C `NV_FABRIC_MEMORY_ATTRS` of `layout`.
    pub fn decode(layout: Layout, bytes: &[u8]) -> Result<Self, AbiError> {
        const WHAT: &str = "NV_FABRIC_MEMORY_ATTRS";
        Ok(match layout {
            Layout::V550 => {
                read_exact::<NV_FABRIC_MEMORY_ATTRS_V550>(WHAT, Some(layout), bytes)?.into()
            }
            Layout::V580 | Layout::V590 => {
                read_exact::<NV_FABRIC_MEMORY_ATTRS_V580>(WHAT, Some(layout), bytes)?.into()
            }
            Layout::V595 => {
                read_exact::<NV_FABRIC_MEMORY_ATTRS_V595>(WHAT, Some(layout), bytes)?.into()
            }
        })
    }
}

/// A `DESCRIBE` parameter block independent of the layout family.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Describe {
    /// `offset` (in): first PFN.
    pub offset: u64,
    /// `totalPfns`.
    pub total_pfns: u64,
    /// The first `numPfns` entries of `pfnArray` (≤ 512).
    pub pfns: Vec<u32>,
    /// `attrs`.
    pub attrs: FabricMemoryAttrs,
    /// `physAttrs`.
    pub phys_attrs: NV_PHYSICAL_MEMORY_ATTRS,
    /// `memFlags`.
    pub mem_flags: u32,
}

macro_rules! describe_codec {
    ($ty:ty, $self:ident, $attrs:expr) => {{
        let mut p = <$ty>::default();
        p.offset = $self.offset;
        p.totalPfns = $self.total_pfns;
        p.pfnArray[..$self.pfns.len()].copy_from_slice(&$self.pfns);
        p.numPfns = $self.pfns.len() as u32;
        p.attrs = $attrs;
        p.physAttrs = $self.phys_attrs;
        p.memFlags = $self.mem_flags;
        p.as_bytes().to_vec()
    }};
}

macro_rules! describe_parse {
    ($ty:ty, $layout:ident, $bytes:ident) => {{
        let p: $ty = read_exact("NV00F8_CTRL_DESCRIBE_PARAMS", Some($layout), $bytes)?;
        let n = check_pfn_count("NV00F8_CTRL_DESCRIBE_PARAMS.numPfns", p.numPfns as usize)?;
        Describe {
            offset: p.offset,
            total_pfns: p.totalPfns,
            pfns: p.pfnArray[..n].to_vec(),
            attrs: p.attrs.into(),
            phys_attrs: p.physAttrs,
            mem_flags: p.memFlags,
        }
    }};
}

pub(crate) fn check_pfn_count(what: &'static str, n: usize) -> Result<usize, AbiError> {
    if n > NV00F8_CTRL_DESCRIBE_PFN_ARRAY_SIZE {
        return Err(AbiError::TooManyEntries {
            what,
            count: n,
            max: NV00F8_CTRL_DESCRIBE_PFN_ARRAY_SIZE,
        });
    }
    Ok(n)
}

impl Describe {
    /// The request the daemon sends: everything 0 but `offset`.
    pub fn request(layout: Layout, offset: u64) -> Vec<u8> {
        let mut b = vec![0u8; layout.describe_params_size()];
        b[..8].copy_from_slice(&offset.to_ne_bytes());
        b
    }

    /// The parameter block of `layout` (what RM returns; for a simulated driver). Fails on
    /// more than 512 PFNs or a `bw_mode` the layout cannot hold.
    pub fn encode(&self, layout: Layout) -> Result<Vec<u8>, AbiError> {
        check_pfn_count("NV00F8_CTRL_DESCRIBE_PARAMS.pfnArray", self.pfns.len())?;
        Ok(match layout {
            Layout::V550 => {
                describe_codec!(NV00F8_CTRL_DESCRIBE_PARAMS_V550, self, self.attrs.to_v550())
            }
            Layout::V580 | Layout::V590 => {
                describe_codec!(
                    NV00F8_CTRL_DESCRIBE_PARAMS_V580,
                    self,
                    self.attrs.to_v580(layout)?
                )
            }
            Layout::V595 => {
                describe_codec!(NV00F8_CTRL_DESCRIBE_PARAMS_V595, self, self.attrs.to_v595())
            }
        })
    }

    /// Parses a returned parameter block of `layout`; fails on a wrong size or
    /// `numPfns` > 512.
    pub fn decode(layout: Layout, bytes: &[u8]) -> Result<Self, AbiError> {
        Ok(match layout {
            Layout::V550 => describe_parse!(NV00F8_CTRL_DESCRIBE_PARAMS_V550, layout, bytes),
            Layout::V580 | Layout::V590 => {
                describe_parse!(NV00F8_CTRL_DESCRIBE_PARAMS_V580, layout, bytes)
            }
            Layout::V595 => describe_parse!(NV00F8_CTRL_DESCRIBE_PARAMS_V595, layout, bytes),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Describe {
        Describe {
            offset: 512,
            total_pfns: 1000,
            pfns: (0..488).map(|i| 0x1000 + i).collect(),
            attrs: FabricMemoryAttrs {
                kind: 6,
                page_size: 1 << 21,
                size: 1000 << 21,
                clique_id: 7,
                bw_mode_epoch: 3,
                bw_mode: 2,
            },
            phys_attrs: NV_PHYSICAL_MEMORY_ATTRS {
                addressSpace: 2,
                compressionCoverage: 0,
            },
            mem_flags: 0,
        }
    }

    #[test]
    fn roundtrip_every_layout() {
        for l in Layout::ALL {
            let mut d = sample();
            if !l.has_bw_mode() {
                d.attrs.bw_mode = 0;
                d.attrs.bw_mode_epoch = 0;
            }
            let b = d.encode(l).unwrap();
            assert_eq!(b.len(), l.describe_params_size());
            assert_eq!(Describe::decode(l, &b).unwrap(), d, "{l}");
        }
    }

    #[test]
    fn limits() {
        let mut d = sample();
        d.pfns = vec![0; 513];
        assert!(matches!(
            d.encode(Layout::V595),
            Err(AbiError::TooManyEntries { count: 513, .. })
        ));
        d.pfns.clear();
        d.attrs.bw_mode = 256;
        assert!(matches!(
            d.encode(Layout::V590),
            Err(AbiError::ValueOutOfRange {
                value: 256,
                max: 255,
                ..
            })
        ));
        assert!(d.encode(Layout::V595).is_ok());
        let mut b = sample().encode(Layout::V595).unwrap();
        b[2064..2068].copy_from_slice(&513u32.to_ne_bytes());
        assert!(matches!(
            Describe::decode(Layout::V595, &b),
            Err(AbiError::TooManyEntries { .. })
        ));
        assert_eq!(Describe::request(Layout::V550, 512).len(), 2120);
    }
}
