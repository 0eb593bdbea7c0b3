//! `NV_MEMORY_EXPORT` (`class/cl00e0.h`): export objects, and the fabric export packet.
//!
//! Parent: the client. An exporting application allocates one (the packet comes back as
//! output); the daemon re-opens an existing one by UUID with
//! [`NV_MEM_EXPORT_FLAGS_DUP_BY_UUID`] (packet as input, the whole cached parameter block
//! comes back), passing the event's channel in `imexChannel`. `NvRmDupObject` is not
//! supported on this class.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::class::client::NV_MAX_DEVICES;

/// `NV_MEMORY_EXPORT`.
pub const NV_MEMORY_EXPORT: u32 = 0xE0;

/// `NV_MEM_EXPORT_UUID_LEN`.
pub const NV_MEM_EXPORT_UUID_LEN: usize = 16;
/// `NV_MEM_EXPORT_PACKET_LEN`.
pub const NV_MEM_EXPORT_PACKET_LEN: usize = 32;
/// `NV_MEM_EXPORT_METADATA_LEN`.
pub const NV_MEM_EXPORT_METADATA_LEN: usize = 64;

/// `NV_MEM_EXPORT_FLAGS_DEFAULT`: allocate a new export object.
pub const NV_MEM_EXPORT_FLAGS_DEFAULT: u32 = 0;
/// `NV_MEM_EXPORT_FLAGS_DUP_BY_UUID`: open the existing export object named by
/// `packet.uuid`.
pub const NV_MEM_EXPORT_FLAGS_DUP_BY_UUID: u32 = 1;

/// `NV_EXPORT_MEM_PACKET` (class/cl00e0.h): identifies an export object universally. The
/// kernel reads `uuid` as its private `MEM_EXPORT_UUID` {`expId` u64, `nodeId` u16, `unused[6]`}
/// (`mem_export.c`) and only copies `opaque` around.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV_EXPORT_MEM_PACKET {
    /// Export UUID.
    pub uuid: [u8; NV_MEM_EXPORT_UUID_LEN],
    /// Opaque to the kernel.
    pub opaque: [u8; 16],
}
assert_layout!(NV_EXPORT_MEM_PACKET, size = 32, align = 1, uuid @ 0, opaque @ 16);

/// `NV00E0_ALLOCATION_PARAMETERS` (class/cl00e0.h): allocation parameters of
/// [`NV_MEMORY_EXPORT`]; also the output of `NV00E0_CTRL_CMD_GET_INFO`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV00E0_ALLOCATION_PARAMETERS {
    /// IMEX channel. A non-daemon caller's subscribed channel must match; the daemon
    /// passes the channel of the event it serves, which must equal the export's.
    pub imexChannel: u32,
    /// Out on allocation; in with DUP_BY_UUID.
    pub packet: NV_EXPORT_MEM_PACKET,
    /// In on allocation; out when duplicating.
    pub numMaxHandles: u16,
    /// Padding before `flags`.
    pub _pad0: [u8; 2],
    /// `NV_MEM_EXPORT_FLAGS_*` (out when duplicating: the flags at allocation).
    pub flags: u32,
    /// Opaque to the kernel (CUDA-private); in on allocation, out when duplicating.
    pub metadata: [u8; NV_MEM_EXPORT_METADATA_LEN],
    /// Out: attached device instance mask.
    pub deviceInstanceMask: u32,
    /// Out: attached GPU instance ID masks, indexed by device instance (MIG unsupported).
    pub giIdMasks: [u32; NV_MAX_DEVICES],
    /// Out: number of memory handles currently attached.
    pub numCurHandles: u16,
    /// Trailing padding.
    pub _pad1: [u8; 2],
}
assert_layout!(NV00E0_ALLOCATION_PARAMETERS, size = 244, align = 4,
    imexChannel @ 0, packet @ 4, numMaxHandles @ 36, _pad0 @ 38, flags @ 40, metadata @ 44,
    deviceInstanceMask @ 108, giIdMasks @ 112, numCurHandles @ 240, _pad1 @ 242);

impl_zeroed_default!(NV00E0_ALLOCATION_PARAMETERS);

impl NV00E0_ALLOCATION_PARAMETERS {
    /// Parameters that re-open the export named by `uuid` on `channel` (what the daemon
    /// does on the exporting node).
    pub fn dup_by_uuid(uuid: [u8; NV_MEM_EXPORT_UUID_LEN], channel: u32) -> Self {
        Self {
            imexChannel: channel,
            packet: NV_EXPORT_MEM_PACKET {
                uuid,
                opaque: [0; 16],
            },
            flags: NV_MEM_EXPORT_FLAGS_DUP_BY_UUID,
            ..Self::default()
        }
    }
}
