//! `NV_MEMORY_FABRIC_IMPORTED_REF` controls (`ctrl/ctrl00fb.h`): pushing the exporter's
//! page list into a pending import on the importing node.
//!
//! `VALIDATE` embeds `NV_FABRIC_MEMORY_ATTRS`, so it exists per family like `DESCRIBE`
//! (2120 bytes in V550, 2136 from V580 on).
//!
//! Kernel handling (`memoryfabricimportedrefCtrlValidate_IMPL`,
//! `src/nvidia/src/kernel/mem_mgr/mem_fabric_import_ref.c`, 595.45.04): with
//! `flags = IMPORT_FAILED` everything else is ignored and the import is failed. Otherwise
//! `totalPfns` must be non-zero, `offset + numPfns ≤ totalPfns` (`NV_ERR_OUT_OF_RANGE`),
//! `attrs.pageSize` 2M, 512M or 256G and `attrs.size` a non-zero multiple of it
//! (`NV_ERR_INVALID_ARGUMENT`); PFNs are shifted left by 21. `bDone` turns true once the
//! PFNs pushed add up to `totalPfns`, and the memory is then installed. The control does
//! **not** bound `numPfns` by 512 itself, so [`Validate::encode`] refuses more.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::ctrl::nv00f8::{
    FabricMemoryAttrs, NV_FABRIC_MEMORY_ATTRS_V550, NV_FABRIC_MEMORY_ATTRS_V580,
    NV_FABRIC_MEMORY_ATTRS_V595, NV_PHYSICAL_MEMORY_ATTRS, check_pfn_count,
};
use crate::{AbiError, Layout, read_exact};

/// `NV00FB_CTRL_CMD_VALIDATE`.
pub const NV00FB_CTRL_CMD_VALIDATE: u32 = 0xFB_0101;
/// `NV00FB_CTRL_VALIDATE_PFN_ARRAY_SIZE`.
pub const NV00FB_CTRL_VALIDATE_PFN_ARRAY_SIZE: usize = 512;
/// `NV00FB_CTRL_FLAGS_NONE`.
pub const NV00FB_CTRL_FLAGS_NONE: u32 = 0;
/// `NV00FB_CTRL_FLAGS_IMPORT_FAILED`: the export side failed; fail the import.
pub const NV00FB_CTRL_FLAGS_IMPORT_FAILED: u32 = 1;

macro_rules! validate_params {
    ($name:ident, $attrs:ty, $size:expr, $fam:literal, $a:expr) => {
        #[doc = concat!("`NV00FB_CTRL_VALIDATE_PARAMS` (ctrl00fb.h), ", $fam, " (", stringify!($size), " bytes). All inputs but `bDone`.")]
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
        pub struct $name {
            /// Memory attributes, as returned by `DESCRIBE` on the exporter.
            pub attrs: $attrs,
            /// Physical attributes, as returned by `DESCRIBE`.
            pub physAttrs: NV_PHYSICAL_MEMORY_ATTRS,
            /// First PFN of this chunk.
            pub offset: u64,
            /// PFNs of the whole allocation.
            pub totalPfns: u64,
            /// PFNs of this chunk; the first `numPfns` are used.
            pub pfnArray: [u32; NV00FB_CTRL_VALIDATE_PFN_ARRAY_SIZE],
            /// PFNs in this chunk (≤ 512).
            pub numPfns: u32,
            /// `memFlags` from `DESCRIBE`.
            pub memFlags: u32,
            /// `NV00FB_CTRL_FLAGS_*`.
            pub flags: u32,
            /// Out, `NvBool`: all PFNs received, import installed.
            pub bDone: u8,
            /// Trailing padding.
            pub _pad0: [u8; 3],
        }
        assert_layout!($name, size = $size, align = 8,
            attrs @ 0, physAttrs @ $a, offset @ $a + 8, totalPfns @ $a + 16, pfnArray @ $a + 24,
            numPfns @ $a + 2072, memFlags @ $a + 2076, flags @ $a + 2080, bDone @ $a + 2084,
            _pad0 @ $a + 2085);
        impl_zeroed_default!($name);
    };
}

validate_params!(
    NV00FB_CTRL_VALIDATE_PARAMS_V550,
    NV_FABRIC_MEMORY_ATTRS_V550,
    2120,
    "V550",
    32
);
validate_params!(
    NV00FB_CTRL_VALIDATE_PARAMS_V580,
    NV_FABRIC_MEMORY_ATTRS_V580,
    2136,
    "V580 and V590",
    48
);
validate_params!(
    NV00FB_CTRL_VALIDATE_PARAMS_V595,
    NV_FABRIC_MEMORY_ATTRS_V595,
    2136,
    "V595",
    48
);

/// `NV00FB_CTRL_VALIDATE_PARAMS` of the V590 family: the same layout as V580.
pub type NV00FB_CTRL_VALIDATE_PARAMS_V590 = NV00FB_CTRL_VALIDATE_PARAMS_V580;

/// A `VALIDATE` parameter block independent of the layout family.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Validate {
    /// `attrs`.
    pub attrs: FabricMemoryAttrs,
    /// `physAttrs`.
    pub phys_attrs: NV_PHYSICAL_MEMORY_ATTRS,
    /// `offset`.
    pub offset: u64,
    /// `totalPfns`.
    pub total_pfns: u64,
    /// The PFNs of this chunk (≤ 512).
    pub pfns: Vec<u32>,
    /// `memFlags`.
    pub mem_flags: u32,
    /// `flags` (`NV00FB_CTRL_FLAGS_*`).
    pub flags: u32,
    /// `bDone` (out).
    pub done: bool,
}

macro_rules! validate_codec {
    ($ty:ty, $s:ident, $attrs:expr) => {{
        let mut p = <$ty>::default();
        p.attrs = $attrs;
        p.physAttrs = $s.phys_attrs;
        p.offset = $s.offset;
        p.totalPfns = $s.total_pfns;
        p.pfnArray[..$s.pfns.len()].copy_from_slice(&$s.pfns);
        p.numPfns = $s.pfns.len() as u32;
        p.memFlags = $s.mem_flags;
        p.flags = $s.flags;
        p.bDone = u8::from($s.done);
        p.as_bytes().to_vec()
    }};
}

macro_rules! validate_parse {
    ($ty:ty, $layout:ident, $bytes:ident) => {{
        let p: $ty = read_exact("NV00FB_CTRL_VALIDATE_PARAMS", Some($layout), $bytes)?;
        let n = check_pfn_count("NV00FB_CTRL_VALIDATE_PARAMS.numPfns", p.numPfns as usize)?;
        Validate {
            attrs: p.attrs.into(),
            phys_attrs: p.physAttrs,
            offset: p.offset,
            total_pfns: p.totalPfns,
            pfns: p.pfnArray[..n].to_vec(),
            mem_flags: p.memFlags,
            flags: p.flags,
            done: p.bDone != 0,
        }
    }};
}

impl Validate {
    /// A request that fails the import (`flags = IMPORT_FAILED`, nothing else).
    pub fn import_failed() -> Self {
        Self {
            flags: NV00FB_CTRL_FLAGS_IMPORT_FAILED,
            ..Default::default()
        }
    }

    /// The parameter block of `layout`. Fails on more than 512 PFNs or a `bw_mode` the
    /// layout cannot hold.
    pub fn encode(&self, layout: Layout) -> Result<Vec<u8>, AbiError> {
        check_pfn_count("NV00FB_CTRL_VALIDATE_PARAMS.pfnArray", self.pfns.len())?;
        Ok(match layout {
            Layout::V550 => {
                validate_codec!(NV00FB_CTRL_VALIDATE_PARAMS_V550, self, self.attrs.to_v550())
            }
            Layout::V580 | Layout::V590 => {
                validate_codec!(
                    NV00FB_CTRL_VALIDATE_PARAMS_V580,
                    self,
                    self.attrs.to_v580(layout)?
                )
            }
            Layout::V595 => {
                validate_codec!(NV00FB_CTRL_VALIDATE_PARAMS_V595, self, self.attrs.to_v595())
            }
        })
    }

    /// Parses a parameter block of `layout` (e.g. to read `bDone` after the call).
    pub fn decode(layout: Layout, bytes: &[u8]) -> Result<Self, AbiError> {
        Ok(match layout {
            Layout::V550 => validate_parse!(NV00FB_CTRL_VALIDATE_PARAMS_V550, layout, bytes),
            Layout::V580 | Layout::V590 => {
                validate_parse!(NV00FB_CTRL_VALIDATE_PARAMS_V580, layout, bytes)
            }
            Layout::V595 => validate_parse!(NV00FB_CTRL_VALIDATE_PARAMS_V595, layout, bytes),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_offsets() {
        let v = Validate {
            attrs: FabricMemoryAttrs {
                kind: 1,
                page_size: 1 << 21,
                size: 4 << 21,
                clique_id: 9,
                bw_mode_epoch: 0,
                bw_mode: 0,
            },
            phys_attrs: NV_PHYSICAL_MEMORY_ATTRS {
                addressSpace: 2,
                compressionCoverage: 1,
            },
            offset: 0,
            total_pfns: 4,
            pfns: vec![10, 11, 12, 13],
            mem_flags: 0,
            flags: NV00FB_CTRL_FLAGS_NONE,
            done: true,
        };
        for l in Layout::ALL {
            let b = v.encode(l).unwrap();
            assert_eq!(b.len(), l.validate_params_size());
            assert_eq!(Validate::decode(l, &b).unwrap(), v);
        }
        let b = v.encode(Layout::V595).unwrap();
        assert_eq!(b[2132], 1); // bDone
        assert_eq!(&b[2120..2124], &4u32.to_ne_bytes()); // numPfns
        let b = v.encode(Layout::V550).unwrap();
        assert_eq!(b[2116], 1);
        assert_eq!(&b[2104..2108], &4u32.to_ne_bytes());
        let f = Validate::import_failed().encode(Layout::V580).unwrap();
        assert_eq!(&f[2128..2132], &1u32.to_ne_bytes());
    }
}
