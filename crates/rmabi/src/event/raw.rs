//! The C fabric event structs of `ctrl/ctrl00f1.h`, one per layout family.
//!
//! `NV00F1_CTRL_FABRIC_EVENT` is {`type` u8, `id` u64, `imexChannel` u32, `data` union}.
//! The union is held as raw bytes (`data`), 8-byte aligned at offset 24; its members are
//! the `*_EVENT_DATA` structs below, read with the accessors on each event type. Only the
//! remote-GPU-attach member changed between families, and with it the union, event and
//! `GET_FABRIC_EVENTS` sizes:
//!
//! | Family | attach data | event | members added |
//! |---|---|---|---|
//! | V550 | 40 | 64 | — |
//! | V580 | 56 | 80 | `bwModeEpoch` u64 @16, `bwMode` u8 @32 |
//! | V590 | 64 | 88 | `pageSize` u64 @24 |
//! | V595 | 64 | 88 | `bwMode` u8 → u16 (`exportUuid` 41 → 42) |

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::class::nv00e0::NV_MEM_EXPORT_UUID_LEN;

/// `NV00F1_CTRL_FABRIC_EVENT_TYPE_MEM_IMPORT`.
pub const NV00F1_CTRL_FABRIC_EVENT_TYPE_MEM_IMPORT: u8 = 0;
/// `NV00F1_CTRL_FABRIC_EVENT_TYPE_MEM_UNIMPORT`.
pub const NV00F1_CTRL_FABRIC_EVENT_TYPE_MEM_UNIMPORT: u8 = 1;
/// `NV00F1_CTRL_FABRIC_EVENT_TYPE_REMOTE_GPU_ATTACH`.
pub const NV00F1_CTRL_FABRIC_EVENT_TYPE_REMOTE_GPU_ATTACH: u8 = 2;
/// `NV00F1_CTRL_FABRIC_EVENT_TYPE_CLIQUE_ID_CHANGE`.
pub const NV00F1_CTRL_FABRIC_EVENT_TYPE_CLIQUE_ID_CHANGE: u8 = 3;

/// Offset of the `data` union in every `NV00F1_CTRL_FABRIC_EVENT`.
pub const FABRIC_EVENT_DATA_OFFSET: usize = 24;

/// `NV00F1_CTRL_FABRIC_MEM_IMPORT_EVENT_DATA` (ctrl00f1.h; same in every family).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F1_CTRL_FABRIC_MEM_IMPORT_EVENT_DATA {
    /// Import ID chosen by the importer (48 bits); with `exportUuid` and `index` it keys
    /// the import.
    pub id: u64,
    /// Index into the export object.
    pub index: u16,
    /// Node that owns the export.
    pub exportNodeId: u16,
    /// Export UUID (from the packet).
    pub exportUuid: [u8; NV_MEM_EXPORT_UUID_LEN],
    /// Trailing padding.
    pub _pad0: [u8; 4],
}
assert_layout!(NV00F1_CTRL_FABRIC_MEM_IMPORT_EVENT_DATA, size = 32, align = 8,
    id @ 0, index @ 8, exportNodeId @ 10, exportUuid @ 12, _pad0 @ 28);

/// `NV00F1_CTRL_FABRIC_MEM_UNIMPORT_EVENT_DATA` (ctrl00f1.h; same in every family).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F1_CTRL_FABRIC_MEM_UNIMPORT_EVENT_DATA {
    /// Event ID of the matching `MEM_IMPORT` event.
    pub importEventId: u64,
    /// Node that owns the export.
    pub exportNodeId: u16,
    /// Trailing padding.
    pub _pad0: [u8; 6],
}
assert_layout!(NV00F1_CTRL_FABRIC_MEM_UNIMPORT_EVENT_DATA, size = 16, align = 8,
    importEventId @ 0, exportNodeId @ 8, _pad0 @ 10);

/// `NV00F1_CTRL_CLIQUE_ID_CHANGE_GPU_EVENT_DATA` (ctrl00f1.h; same in every family).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F1_CTRL_CLIQUE_ID_CHANGE_GPU_EVENT_DATA {
    /// GPU ID (as in `NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS`).
    pub gpuId: u32,
    /// New clique ID.
    pub cliqueId: u32,
}
assert_layout!(NV00F1_CTRL_CLIQUE_ID_CHANGE_GPU_EVENT_DATA, size = 8, align = 4, gpuId @ 0, cliqueId @ 4);

/// `NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA` (ctrl00f1.h) of 550.40.07 … 575.64.05.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V550 {
    /// Fabric probe handle of the remote GPU.
    pub gpuFabricProbeHandle: u64,
    /// Key the GFM echoes in its team response.
    pub key: u64,
    /// Clique ID of the remote GPU.
    pub cliqueId: u32,
    /// Index into the export object.
    pub index: u16,
    /// Node that owns the export.
    pub exportNodeId: u16,
    /// Export UUID.
    pub exportUuid: [u8; NV_MEM_EXPORT_UUID_LEN],
}
assert_layout!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V550, size = 40, align = 8,
    gpuFabricProbeHandle @ 0, key @ 8, cliqueId @ 16, index @ 20, exportNodeId @ 22,
    exportUuid @ 24);

/// `NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA` (ctrl00f1.h) of 580.65.06 … 580.142.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V580 {
    /// Fabric probe handle of the remote GPU.
    pub gpuFabricProbeHandle: u64,
    /// Key the GFM echoes in its team response.
    pub key: u64,
    /// Active bwModeEpoch of the remote GPU.
    pub bwModeEpoch: u64,
    /// Clique ID of the remote GPU.
    pub cliqueId: u32,
    /// Index into the export object.
    pub index: u16,
    /// Node that owns the export.
    pub exportNodeId: u16,
    /// Active bwMode of the remote GPU (`NvU8` here).
    pub bwMode: u8,
    /// Export UUID (unaligned, offset 33).
    pub exportUuid: [u8; NV_MEM_EXPORT_UUID_LEN],
    /// Trailing padding.
    pub _pad0: [u8; 7],
}
assert_layout!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V580, size = 56, align = 8,
    gpuFabricProbeHandle @ 0, key @ 8, bwModeEpoch @ 16, cliqueId @ 24, index @ 28,
    exportNodeId @ 30, bwMode @ 32, exportUuid @ 33, _pad0 @ 49);

/// `NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA` (ctrl00f1.h) of 590.44.01, 590.48.01.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V590 {
    /// Fabric probe handle of the remote GPU.
    pub gpuFabricProbeHandle: u64,
    /// Key the GFM echoes in its team response.
    pub key: u64,
    /// Active bwModeEpoch of the remote GPU.
    pub bwModeEpoch: u64,
    /// Page size the remote client selected.
    pub pageSize: u64,
    /// Clique ID of the remote GPU.
    pub cliqueId: u32,
    /// Index into the export object.
    pub index: u16,
    /// Node that owns the export.
    pub exportNodeId: u16,
    /// Active bwMode of the remote GPU (`NvU8` here).
    pub bwMode: u8,
    /// Export UUID (unaligned, offset 41).
    pub exportUuid: [u8; NV_MEM_EXPORT_UUID_LEN],
    /// Trailing padding.
    pub _pad0: [u8; 7],
}
assert_layout!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V590, size = 64, align = 8,
    gpuFabricProbeHandle @ 0, key @ 8, bwModeEpoch @ 16, pageSize @ 24, cliqueId @ 32,
    index @ 36, exportNodeId @ 38, bwMode @ 40, exportUuid @ 41, _pad0 @ 57);

/// `NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA` (ctrl00f1.h) of 595.44.02 … 595.45.04.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V595 {
    /// Fabric probe handle of the remote GPU.
    pub gpuFabricProbeHandle: u64,
    /// Key the GFM echoes in its team response.
    pub key: u64,
    /// Active bwModeEpoch of the remote GPU.
    pub bwModeEpoch: u64,
    /// Page size the remote client selected.
    pub pageSize: u64,
    /// Clique ID of the remote GPU.
    pub cliqueId: u32,
    /// Index into the export object.
    pub index: u16,
    /// Node that owns the export.
    pub exportNodeId: u16,
    /// Active bwMode of the remote GPU (`NvU16` from 595.44.02).
    pub bwMode: u16,
    /// Export UUID (offset 42).
    pub exportUuid: [u8; NV_MEM_EXPORT_UUID_LEN],
    /// Trailing padding.
    pub _pad0: [u8; 6],
}
assert_layout!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V595, size = 64, align = 8,
    gpuFabricProbeHandle @ 0, key @ 8, bwModeEpoch @ 16, pageSize @ 24, cliqueId @ 32,
    index @ 36, exportNodeId @ 38, bwMode @ 40, exportUuid @ 42, _pad0 @ 58);

macro_rules! fabric_event {
    ($name:ident, $attach:ty, $data:expr, $size:expr, $fam:literal) => {
        #[doc = concat!("`NV00F1_CTRL_FABRIC_EVENT` (ctrl00f1.h), ", $fam, " family (", stringify!($size), " bytes).")]
        #[doc = ""]
        #[doc = "`data` is the C union; read it with the `import`/`unimport`/`attach`/`clique_id_change` accessors."]
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
        pub struct $name {
            /// `type`: `NV00F1_CTRL_FABRIC_EVENT_TYPE_*`.
            pub type_: u8,
            /// Padding before the 8-byte-aligned `id`.
            pub _pad0: [u8; 7],
            /// Event ID, system-wide and monotonically increasing.
            pub id: u64,
            /// IMEX channel of the client that caused the event (0 for clique changes).
            pub imexChannel: u32,
            /// Padding before the 8-byte-aligned union.
            pub _pad1: [u8; 4],
            /// The `data` union as bytes.
            pub data: [u8; $data],
        }
        assert_layout!($name, size = $size, align = 8,
            type_ @ 0, _pad0 @ 1, id @ 8, imexChannel @ 16, _pad1 @ 20, data @ 24);
        impl_zeroed_default!($name);

        impl $name {
            /// `data.import` (meaningful when `type_` is MEM_IMPORT).
            pub fn import(&self) -> NV00F1_CTRL_FABRIC_MEM_IMPORT_EVENT_DATA {
                read_member(&self.data)
            }
            /// `data.unimport` (MEM_UNIMPORT).
            pub fn unimport(&self) -> NV00F1_CTRL_FABRIC_MEM_UNIMPORT_EVENT_DATA {
                read_member(&self.data)
            }
            /// `data.attach` (REMOTE_GPU_ATTACH).
            pub fn attach(&self) -> $attach {
                read_member(&self.data)
            }
            /// `data.cliqueIdChange` (CLIQUE_ID_CHANGE).
            pub fn clique_id_change(&self) -> NV00F1_CTRL_CLIQUE_ID_CHANGE_GPU_EVENT_DATA {
                read_member(&self.data)
            }
            /// Writes `member` into `data` (the rest of the union is zeroed).
            pub fn set_data<T: IntoBytes + Immutable>(&mut self, member: &T) {
                self.data = [0; $data];
                let b = member.as_bytes();
                self.data[..b.len()].copy_from_slice(b);
            }
        }
    };
}

/// Reads a union member from the start of the union bytes. Every member is at most as
/// large as the union, so the prefix read cannot fail.
fn read_member<T: FromBytes + Default>(data: &[u8]) -> T {
    T::read_from_prefix(data)
        .map(|(v, _)| v)
        .unwrap_or_default()
}

fabric_event!(
    NV00F1_CTRL_FABRIC_EVENT_V550,
    NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V550,
    40,
    64,
    "V550"
);
fabric_event!(
    NV00F1_CTRL_FABRIC_EVENT_V580,
    NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V580,
    56,
    80,
    "V580"
);
fabric_event!(
    NV00F1_CTRL_FABRIC_EVENT_V590,
    NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V590,
    64,
    88,
    "V590"
);
fabric_event!(
    NV00F1_CTRL_FABRIC_EVENT_V595,
    NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V595,
    64,
    88,
    "V595"
);
