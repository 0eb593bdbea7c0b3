//! Control commands (`NV_ESC_RM_CONTROL`, [`crate::escape::NVOS54_PARAMETERS`]) and their
//! parameter blocks, one file per class.
//!
//! A command value is `(interface ID << 8) | message ID`, e.g. `0xF10001`; it goes in
//! `NVOS54_PARAMETERS.cmd`, the block's address in `params`, and its exact size in
//! `paramsSize` ([`params_size`]).

pub mod nv0000;
pub mod nv00e0;
pub mod nv00f1;
pub mod nv00f8;
pub mod nv00fb;
pub mod nv00fd;
pub mod nv2080;

use core::mem::size_of;

use crate::Layout;

/// A `DRF` bit field `hi:lo` of a 32-bit value, as the headers write them
/// (`#define NAME hi:lo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DrfField {
    /// Highest bit.
    pub hi: u32,
    /// Lowest bit.
    pub lo: u32,
}

impl DrfField {
    /// Field `hi:lo`.
    pub const fn new(hi: u32, lo: u32) -> Self {
        Self { hi, lo }
    }

    /// The field's mask, in place.
    pub const fn mask(self) -> u32 {
        (u32::MAX >> (31 - (self.hi - self.lo))) << self.lo
    }

    /// The field's value in `v`.
    pub const fn get(self, v: u32) -> u32 {
        (v & self.mask()) >> self.lo
    }

    /// `v` with the field set to `field`.
    pub const fn set(self, v: u32, field: u32) -> u32 {
        (v & !self.mask()) | ((field << self.lo) & self.mask())
    }
}

/// The exact `paramsSize` of control `cmd` in `layout`, for every command this crate
/// defines a parameter struct for; `None` otherwise.
pub const fn params_size(layout: Layout, cmd: u32) -> Option<usize> {
    Some(match cmd {
        nv0000::NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS => {
            size_of::<nv0000::NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS>()
        }
        nv0000::NV0000_CTRL_CMD_GPU_GET_PROBED_IDS => layout.probed_ids_params_size(),
        nv0000::NV0000_CTRL_CMD_GPU_ATTACH_IDS => {
            size_of::<nv0000::NV0000_CTRL_GPU_ATTACH_IDS_PARAMS>()
        }
        nv0000::NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2 => {
            size_of::<nv0000::NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS>()
        }
        nv0000::NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID => {
            size_of::<nv0000::NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS>()
        }
        nv0000::NV0000_CTRL_CMD_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL => {
            size_of::<nv0000::NV0000_CTRL_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL_PARAMS>()
        }
        nv00e0::NV00E0_CTRL_CMD_EXPORT_MEM => size_of::<nv00e0::NV00E0_CTRL_EXPORT_MEM_PARAMS>(),
        nv00e0::NV00E0_CTRL_CMD_IMPORT_MEM => size_of::<nv00e0::NV00E0_CTRL_IMPORT_MEM_PARAMS>(),
        nv00e0::NV00E0_CTRL_CMD_GET_INFO => size_of::<nv00e0::NV00E0_CTRL_GET_INFO_PARAMS>(),
        nv00f1::NV00F1_CTRL_CMD_GET_FABRIC_EVENTS => layout.fabric_events_params_size(),
        nv00f1::NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT => {
            size_of::<nv00f1::NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS>()
        }
        nv00f1::NV00F1_CTRL_CMD_DISABLE_IMPORTERS => {
            size_of::<nv00f1::NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS>()
        }
        nv00f8::NV00F8_CTRL_CMD_GET_INFO => size_of::<nv00f8::NV00F8_CTRL_GET_INFO_PARAMS>(),
        nv00f8::NV00F8_CTRL_CMD_DESCRIBE => layout.describe_params_size(),
        nv00fb::NV00FB_CTRL_CMD_VALIDATE => layout.validate_params_size(),
        nv00fd::NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU => layout.attach_remote_gpu_params_size(),
        nv00fd::NV00FD_CTRL_CMD_SET_FAILURE => size_of::<nv00fd::NV00FD_CTRL_SET_FAILURE_PARAMS>(),
        nv2080::NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO => layout.fabric_probe_info_params_size(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drf_fields() {
        let f = DrfField::new(11, 8);
        assert_eq!(f.mask(), 0xF00);
        assert_eq!(f.get(0x1234), 0x2);
        assert_eq!(f.set(0xFFFF_FFFF, 0), 0xFFFF_F0FF);
        assert_eq!(DrfField::new(31, 0).mask(), u32::MAX);
        assert_eq!(DrfField::new(2, 2).mask(), 4);
    }

    #[test]
    fn sizes_by_command() {
        assert_eq!(
            params_size(Layout::V595, nv00f1::NV00F1_CTRL_CMD_GET_FABRIC_EVENTS),
            Some(11272)
        );
        assert_eq!(
            params_size(Layout::V550, nv00f1::NV00F1_CTRL_CMD_GET_FABRIC_EVENTS),
            Some(8200)
        );
        assert_eq!(
            params_size(Layout::V580, nv00f8::NV00F8_CTRL_CMD_DESCRIBE),
            Some(2136)
        );
        assert_eq!(
            params_size(Layout::V550, nv00fb::NV00FB_CTRL_CMD_VALIDATE),
            Some(2120)
        );
        assert_eq!(
            params_size(Layout::V590, nv00fd::NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU),
            Some(40)
        );
        assert_eq!(params_size(Layout::V595, 0xDEAD), None);
    }
}
