//! One module per layout family, re-exporting every raw struct under its plain C name.
//!
//! `use openimex_rmabi::v595 as abi;` then `abi::NV00F1_CTRL_FABRIC_EVENT` is the 595
//! layout. Structs that are the same in every family are re-exported by all four.

macro_rules! family {
    ($(#[$doc:meta])* $m:ident, $layout:ident, $s:ident) => {
        $(#[$doc])*
        pub mod $m {
            paste_family!($layout, $s);
        }
    };
}

macro_rules! paste_family {
    ($layout:ident, $s:ident) => {
        /// This family.
        pub const LAYOUT: crate::Layout = crate::Layout::$layout;

        pub use crate::class::client::{NV0080_ALLOC_PARAMETERS, NV2080_ALLOC_PARAMETERS};
        pub use crate::class::nv00e0::{NV_EXPORT_MEM_PACKET, NV00E0_ALLOCATION_PARAMETERS};
        pub use crate::class::nv00f1::NV00F1_ALLOCATION_PARAMETERS;
        pub use crate::class::nv00f8::{
            NV00F8_ALLOCATION_PARAMETERS, NV00F8_ALLOCATION_PARAMETERS_MAP,
            NV00F9_ALLOCATION_PARAMETERS,
        };
        pub use crate::class::nv00fb::NV00FB_ALLOCATION_PARAMETERS;
        pub use crate::ctrl::nv0000::{
            NV0000_CTRL_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL_PARAMS, NV0000_CTRL_GPU_ATTACH_IDS_PARAMS,
            NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS, NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS,
            NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS,
        };
        pub use crate::ctrl::nv00e0::{
            NV_IMPORT_MEM_INFO, NV00E0_CTRL_EXPORT_MEM_PARAMS, NV00E0_CTRL_GET_INFO_PARAMS,
            NV00E0_CTRL_IMPORT_MEM_PARAMS,
        };
        pub use crate::ctrl::nv00f1::{
            NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS, NV00F1_CTRL_FABRIC_UNIMPORT_TOKEN,
            NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS,
        };
        pub use crate::ctrl::nv00f8::{NV_PHYSICAL_MEMORY_ATTRS, NV00F8_CTRL_GET_INFO_PARAMS};
        pub use crate::ctrl::nv00fd::NV00FD_CTRL_SET_FAILURE_PARAMS;
        pub use crate::escape::{
            NVOS00_PARAMETERS, NVOS21_PARAMETERS, NVOS54_PARAMETERS, NVOS55_PARAMETERS,
            NVOS64_PARAMETERS, nv_ioctl_alloc_os_event_t, nv_ioctl_free_os_event_t,
            nv_ioctl_register_fd_t, nv_ioctl_rm_api_version_t, nv_ioctl_xfer_t,
        };
        pub use crate::event::raw::{
            NV00F1_CTRL_CLIQUE_ID_CHANGE_GPU_EVENT_DATA, NV00F1_CTRL_FABRIC_MEM_IMPORT_EVENT_DATA,
            NV00F1_CTRL_FABRIC_MEM_UNIMPORT_EVENT_DATA,
        };

        family_types!($s);
    };
}

macro_rules! family_types {
    (V550) => {
        pub use crate::class::nv00fd::NV00FD_ALLOCATION_PARAMETERS_V550 as NV00FD_ALLOCATION_PARAMETERS;
        pub use crate::ctrl::nv0000::NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V550 as NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS;
        pub use crate::ctrl::nv00f1::NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V550 as NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS;
        pub use crate::ctrl::nv00f8::NV_FABRIC_MEMORY_ATTRS_V550 as NV_FABRIC_MEMORY_ATTRS;
        pub use crate::ctrl::nv00f8::NV00F8_CTRL_DESCRIBE_PARAMS_V550 as NV00F8_CTRL_DESCRIBE_PARAMS;
        pub use crate::ctrl::nv00fb::NV00FB_CTRL_VALIDATE_PARAMS_V550 as NV00FB_CTRL_VALIDATE_PARAMS;
        pub use crate::ctrl::nv00fd::NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V550 as NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS;
        pub use crate::ctrl::nv2080::NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V550 as NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS;
        pub use crate::event::raw::NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V550 as NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA;
        pub use crate::event::raw::NV00F1_CTRL_FABRIC_EVENT_V550 as NV00F1_CTRL_FABRIC_EVENT;
    };
    (V580) => {
        pub use crate::class::nv00fd::NV00FD_ALLOCATION_PARAMETERS_V580 as NV00FD_ALLOCATION_PARAMETERS;
        pub use crate::ctrl::nv0000::NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580 as NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS;
        pub use crate::ctrl::nv00f1::NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V580 as NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS;
        pub use crate::ctrl::nv00f8::NV_FABRIC_MEMORY_ATTRS_V580 as NV_FABRIC_MEMORY_ATTRS;
        pub use crate::ctrl::nv00f8::NV00F8_CTRL_DESCRIBE_PARAMS_V580 as NV00F8_CTRL_DESCRIBE_PARAMS;
        pub use crate::ctrl::nv00fb::NV00FB_CTRL_VALIDATE_PARAMS_V580 as NV00FB_CTRL_VALIDATE_PARAMS;
        pub use crate::ctrl::nv00fd::NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V580 as NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS;
        pub use crate::ctrl::nv2080::NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580 as NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS;
        pub use crate::event::raw::NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V580 as NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA;
        pub use crate::event::raw::NV00F1_CTRL_FABRIC_EVENT_V580 as NV00F1_CTRL_FABRIC_EVENT;
    };
    (V590) => {
        pub use crate::class::nv00fd::NV00FD_ALLOCATION_PARAMETERS_V590 as NV00FD_ALLOCATION_PARAMETERS;
        pub use crate::ctrl::nv0000::NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V590 as NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS;
        pub use crate::ctrl::nv00f1::NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V590 as NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS;
        pub use crate::ctrl::nv00f8::NV_FABRIC_MEMORY_ATTRS_V590 as NV_FABRIC_MEMORY_ATTRS;
        pub use crate::ctrl::nv00f8::NV00F8_CTRL_DESCRIBE_PARAMS_V590 as NV00F8_CTRL_DESCRIBE_PARAMS;
        pub use crate::ctrl::nv00fb::NV00FB_CTRL_VALIDATE_PARAMS_V590 as NV00FB_CTRL_VALIDATE_PARAMS;
        pub use crate::ctrl::nv00fd::NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V590 as NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS;
        pub use crate::ctrl::nv2080::NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V590 as NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS;
        pub use crate::event::raw::NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V590 as NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA;
        pub use crate::event::raw::NV00F1_CTRL_FABRIC_EVENT_V590 as NV00F1_CTRL_FABRIC_EVENT;
    };
    (V595) => {
        pub use crate::class::nv00fd::NV00FD_ALLOCATION_PARAMETERS_V595 as NV00FD_ALLOCATION_PARAMETERS;
        pub use crate::ctrl::nv0000::NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V595 as NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS;
        pub use crate::ctrl::nv00f1::NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V595 as NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS;
        pub use crate::ctrl::nv00f8::NV_FABRIC_MEMORY_ATTRS_V595 as NV_FABRIC_MEMORY_ATTRS;
        pub use crate::ctrl::nv00f8::NV00F8_CTRL_DESCRIBE_PARAMS_V595 as NV00F8_CTRL_DESCRIBE_PARAMS;
        pub use crate::ctrl::nv00fb::NV00FB_CTRL_VALIDATE_PARAMS_V595 as NV00FB_CTRL_VALIDATE_PARAMS;
        pub use crate::ctrl::nv00fd::NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V595 as NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS;
        pub use crate::ctrl::nv2080::NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V595 as NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS;
        pub use crate::event::raw::NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V595 as NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA;
        pub use crate::event::raw::NV00F1_CTRL_FABRIC_EVENT_V595 as NV00F1_CTRL_FABRIC_EVENT;
    };
}

family!(
    /// Every raw struct in the V550 layout (550.40.07 … 575.64.05).
    v550, V550, V550
);
family!(
    /// Every raw struct in the V580 layout (580.65.06 … 580.142).
    v580, V580, V580
);
family!(
    /// Every raw struct in the V590 layout (590.44.01, 590.48.01).
    v590, V590, V590
);
family!(
    /// Every raw struct in the V595 layout (595.44.02 … 595.45.04).
    v595, V595, V595
);
