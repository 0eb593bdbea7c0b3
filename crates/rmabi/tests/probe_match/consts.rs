//! The Rust value of every constant the gcc probe prints, keyed by its C name.

use openimex_rmabi::class::{client::*, nv00e0::*, nv00f1::*, nv00f8::*, nv00fb::*, nv00fd::*};
use openimex_rmabi::ctrl::{nv0000::*, nv00e0::*, nv00f1::*, nv00f8::*, nv00fb::*, nv00fd::*};
use openimex_rmabi::escape::*;
use openimex_rmabi::event::raw::*;

fn hex(v: u64) -> String {
    format!("0x{v:x}")
}

fn drf(f: openimex_rmabi::ctrl::DrfField) -> String {
    format!("{}:{}", f.hi, f.lo)
}

pub(crate) fn constants() -> Vec<(&'static str, String)> {
    use openimex_rmabi::ctrl::nv2080 as p;
    let mut v: Vec<(&'static str, String)> = vec![
        ("NV_IOCTL_MAGIC", hex(NV_IOCTL_MAGIC.into())),
        ("NV_IOCTL_BASE", hex(NV_IOCTL_BASE.into())),
        ("NV_ESC_RM_FREE", hex(NV_ESC_RM_FREE.into())),
        ("NV_ESC_RM_CONTROL", hex(NV_ESC_RM_CONTROL.into())),
        ("NV_ESC_RM_ALLOC", hex(NV_ESC_RM_ALLOC.into())),
        ("NV_ESC_RM_DUP_OBJECT", hex(NV_ESC_RM_DUP_OBJECT.into())),
        ("NV_ESC_CARD_INFO", hex(NV_ESC_CARD_INFO.into())),
        ("NV_ESC_REGISTER_FD", hex(NV_ESC_REGISTER_FD.into())),
        ("NV_ESC_ALLOC_OS_EVENT", hex(NV_ESC_ALLOC_OS_EVENT.into())),
        ("NV_ESC_FREE_OS_EVENT", hex(NV_ESC_FREE_OS_EVENT.into())),
        ("NV_ESC_STATUS_CODE", hex(NV_ESC_STATUS_CODE.into())),
        (
            "NV_ESC_CHECK_VERSION_STR",
            hex(NV_ESC_CHECK_VERSION_STR.into()),
        ),
        ("NV_ESC_IOCTL_XFER_CMD", hex(NV_ESC_IOCTL_XFER_CMD.into())),
        (
            "NV_ESC_ATTACH_GPUS_TO_FD",
            hex(NV_ESC_ATTACH_GPUS_TO_FD.into()),
        ),
        (
            "NV_RM_API_VERSION_STRING_LENGTH",
            hex(NV_RM_API_VERSION_STRING_LENGTH as u64),
        ),
        (
            "NV_RM_API_VERSION_CMD_STRICT",
            hex(NV_RM_API_VERSION_CMD_STRICT.into()),
        ),
        (
            "NV_RM_API_VERSION_CMD_RELAXED",
            hex(NV_RM_API_VERSION_CMD_RELAXED.into()),
        ),
        (
            "NV_RM_API_VERSION_CMD_QUERY",
            hex(NV_RM_API_VERSION_CMD_QUERY.into()),
        ),
        (
            "NV_RM_API_VERSION_REPLY_UNRECOGNIZED",
            hex(NV_RM_API_VERSION_REPLY_UNRECOGNIZED.into()),
        ),
        (
            "NV_RM_API_VERSION_REPLY_RECOGNIZED",
            hex(NV_RM_API_VERSION_REPLY_RECOGNIZED.into()),
        ),
        ("NVOS54_FLAGS_NONE", hex(NVOS54_FLAGS_NONE.into())),
        ("NVOS64_FLAGS_NONE", hex(NVOS64_FLAGS_NONE.into())),
        (
            "NVOS64_FLAGS_FINN_SERIALIZED",
            hex(NVOS64_FLAGS_FINN_SERIALIZED.into()),
        ),
        (
            "NV04_DUP_HANDLE_FLAGS_NONE",
            hex(NV04_DUP_HANDLE_FLAGS_NONE.into()),
        ),
        (
            "NV04_DUP_HANDLE_FLAGS_REJECT_KERNEL_DUP_PRIVILEGE",
            hex(NV04_DUP_HANDLE_FLAGS_REJECT_KERNEL_DUP_PRIVILEGE.into()),
        ),
        ("NV01_ROOT", hex(NV01_ROOT.into())),
        ("NV01_ROOT_NON_PRIV", hex(NV01_ROOT_NON_PRIV.into())),
        ("NV01_ROOT_CLIENT", hex(NV01_ROOT_CLIENT.into())),
        ("NV01_DEVICE_0", hex(NV01_DEVICE_0.into())),
        ("NV20_SUBDEVICE_0", hex(NV20_SUBDEVICE_0.into())),
        ("NV_IMEX_SESSION", hex(NV_IMEX_SESSION.into())),
        ("NV_MEMORY_EXPORT", hex(NV_MEMORY_EXPORT.into())),
        ("NV_MEMORY_FABRIC", hex(NV_MEMORY_FABRIC.into())),
        (
            "NV_MEMORY_FABRIC_IMPORT_V2",
            hex(NV_MEMORY_FABRIC_IMPORT_V2.into()),
        ),
        (
            "NV_MEMORY_FABRIC_IMPORTED_REF",
            hex(NV_MEMORY_FABRIC_IMPORTED_REF.into()),
        ),
        (
            "NV_MEMORY_MULTICAST_FABRIC",
            hex(NV_MEMORY_MULTICAST_FABRIC.into()),
        ),
        ("NV_MAX_DEVICES", hex(NV_MAX_DEVICES as u64)),
        ("NV_MAX_SUBDEVICES", hex(NV_MAX_SUBDEVICES as u64)),
        (
            "NV00F1_ALLOC_FLAGS_DEFAULT",
            hex(NV00F1_ALLOC_FLAGS_DEFAULT.into()),
        ),
        (
            "NV00F1_ALLOC_DISABLE_CHANNEL_RECOVERY",
            hex(NV00F1_ALLOC_DISABLE_CHANNEL_RECOVERY.into()),
        ),
        ("NV_MEM_EXPORT_UUID_LEN", hex(NV_MEM_EXPORT_UUID_LEN as u64)),
        (
            "NV_MEM_EXPORT_PACKET_LEN",
            hex(NV_MEM_EXPORT_PACKET_LEN as u64),
        ),
        (
            "NV_MEM_EXPORT_METADATA_LEN",
            hex(NV_MEM_EXPORT_METADATA_LEN as u64),
        ),
        (
            "NV_MEM_EXPORT_FLAGS_DEFAULT",
            hex(NV_MEM_EXPORT_FLAGS_DEFAULT.into()),
        ),
        (
            "NV_MEM_EXPORT_FLAGS_DUP_BY_UUID",
            hex(NV_MEM_EXPORT_FLAGS_DUP_BY_UUID.into()),
        ),
        (
            "NV_MEMORY_FABRIC_PAGE_SIZE_2M",
            hex(NV_MEMORY_FABRIC_PAGE_SIZE_2M),
        ),
        (
            "NV_MEMORY_FABRIC_PAGE_SIZE_512M",
            hex(NV_MEMORY_FABRIC_PAGE_SIZE_512M),
        ),
        (
            "NV_MEMORY_FABRIC_PAGE_SIZE_256G",
            hex(NV_MEMORY_FABRIC_PAGE_SIZE_256G),
        ),
        (
            "NV00F8_ALLOC_FLAGS_DEFAULT",
            hex(NV00F8_ALLOC_FLAGS_DEFAULT.into()),
        ),
        (
            "NV00F8_ALLOC_FLAGS_FLEXIBLE_FLA",
            hex(NV00F8_ALLOC_FLAGS_FLEXIBLE_FLA.into()),
        ),
        (
            "NV00F8_ALLOC_FLAGS_FORCE_NONCONTIGUOUS",
            hex(NV00F8_ALLOC_FLAGS_FORCE_NONCONTIGUOUS.into()),
        ),
        (
            "NV00F8_ALLOC_FLAGS_FORCE_CONTIGUOUS",
            hex(NV00F8_ALLOC_FLAGS_FORCE_CONTIGUOUS.into()),
        ),
        (
            "NV00F8_ALLOC_FLAGS_READ_ONLY",
            hex(NV00F8_ALLOC_FLAGS_READ_ONLY.into()),
        ),
        (
            "NV00F8_ALLOC_FLAGS_FORCE_UC_LOOPBACK",
            hex(NV00F8_ALLOC_FLAGS_FORCE_UC_LOOPBACK.into()),
        ),
        ("NV00F9_IMPORT_ID_MAX", hex(NV00F9_IMPORT_ID_MAX)),
        (
            "NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_512M",
            hex(NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_512M),
        ),
        (
            "NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_256G",
            hex(NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_256G),
        ),
        (
            "NV_MEMORY_MULTICAST_FABRIC_ALLOC_FLAGS_USE_EXPORT_PACKET",
            hex(NV_MEMORY_MULTICAST_FABRIC_ALLOC_FLAGS_USE_EXPORT_PACKET.into()),
        ),
        (
            "NV00F1_CTRL_CMD_GET_FABRIC_EVENTS",
            hex(NV00F1_CTRL_CMD_GET_FABRIC_EVENTS.into()),
        ),
        (
            "NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT",
            hex(NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT.into()),
        ),
        (
            "NV00F1_CTRL_CMD_DISABLE_IMPORTERS",
            hex(NV00F1_CTRL_CMD_DISABLE_IMPORTERS.into()),
        ),
        (
            "NV00F1_CTRL_FABRIC_EVENT_TYPE_MEM_IMPORT",
            hex(NV00F1_CTRL_FABRIC_EVENT_TYPE_MEM_IMPORT.into()),
        ),
        (
            "NV00F1_CTRL_FABRIC_EVENT_TYPE_MEM_UNIMPORT",
            hex(NV00F1_CTRL_FABRIC_EVENT_TYPE_MEM_UNIMPORT.into()),
        ),
        (
            "NV00F1_CTRL_FABRIC_EVENT_TYPE_REMOTE_GPU_ATTACH",
            hex(NV00F1_CTRL_FABRIC_EVENT_TYPE_REMOTE_GPU_ATTACH.into()),
        ),
        (
            "NV00F1_CTRL_FABRIC_EVENT_TYPE_CLIQUE_ID_CHANGE",
            hex(NV00F1_CTRL_FABRIC_EVENT_TYPE_CLIQUE_ID_CHANGE.into()),
        ),
        (
            "NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE",
            hex(NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE as u64),
        ),
        (
            "NV00F1_CTRL_FINISH_MEM_UNIMPORT_ARRAY_SIZE",
            hex(NV00F1_CTRL_FINISH_MEM_UNIMPORT_ARRAY_SIZE as u64),
        ),
        (
            "NV00E0_CTRL_CMD_EXPORT_MEM",
            hex(NV00E0_CTRL_CMD_EXPORT_MEM.into()),
        ),
        (
            "NV00E0_CTRL_CMD_IMPORT_MEM",
            hex(NV00E0_CTRL_CMD_IMPORT_MEM.into()),
        ),
        (
            "NV00E0_CTRL_CMD_GET_INFO",
            hex(NV00E0_CTRL_CMD_GET_INFO.into()),
        ),
        (
            "NV00E0_MAX_EXPORT_HANDLES",
            hex(NV00E0_MAX_EXPORT_HANDLES as u64),
        ),
        (
            "NV00E0_MAX_IMPORT_HANDLES",
            hex(NV00E0_MAX_IMPORT_HANDLES as u64),
        ),
        (
            "NV00E0_ADDR_SPACE_TYPE_SYSMEM",
            hex(NV00E0_ADDR_SPACE_TYPE_SYSMEM.into()),
        ),
        (
            "NV00E0_ADDR_SPACE_TYPE_VIDMEM",
            hex(NV00E0_ADDR_SPACE_TYPE_VIDMEM.into()),
        ),
        (
            "NV00E0_ADDR_SPACE_TYPE_FABRIC",
            hex(NV00E0_ADDR_SPACE_TYPE_FABRIC.into()),
        ),
        (
            "NV00E0_ADDR_SPACE_TYPE_FABRIC_MC",
            hex(NV00E0_ADDR_SPACE_TYPE_FABRIC_MC.into()),
        ),
        (
            "NV00F8_CTRL_CMD_GET_INFO",
            hex(NV00F8_CTRL_CMD_GET_INFO.into()),
        ),
        (
            "NV00F8_CTRL_CMD_DESCRIBE",
            hex(NV00F8_CTRL_CMD_DESCRIBE.into()),
        ),
        (
            "NV00F8_CTRL_DESCRIBE_PFN_ARRAY_SIZE",
            hex(NV00F8_CTRL_DESCRIBE_PFN_ARRAY_SIZE as u64),
        ),
        (
            "NV00FB_CTRL_CMD_VALIDATE",
            hex(NV00FB_CTRL_CMD_VALIDATE.into()),
        ),
        (
            "NV00FB_CTRL_VALIDATE_PFN_ARRAY_SIZE",
            hex(NV00FB_CTRL_VALIDATE_PFN_ARRAY_SIZE as u64),
        ),
        ("NV00FB_CTRL_FLAGS_NONE", hex(NV00FB_CTRL_FLAGS_NONE.into())),
        (
            "NV00FB_CTRL_FLAGS_IMPORT_FAILED",
            hex(NV00FB_CTRL_FLAGS_IMPORT_FAILED.into()),
        ),
        (
            "NV00FD_CTRL_CMD_GET_INFO",
            hex(NV00FD_CTRL_CMD_GET_INFO.into()),
        ),
        (
            "NV00FD_CTRL_CMD_ATTACH_MEM",
            hex(NV00FD_CTRL_CMD_ATTACH_MEM.into()),
        ),
        (
            "NV00FD_CTRL_CMD_REGISTER_EVENT",
            hex(NV00FD_CTRL_CMD_REGISTER_EVENT.into()),
        ),
        (
            "NV00FD_CTRL_CMD_ATTACH_GPU",
            hex(NV00FD_CTRL_CMD_ATTACH_GPU.into()),
        ),
        (
            "NV00FD_CTRL_CMD_DETACH_MEM",
            hex(NV00FD_CTRL_CMD_DETACH_MEM.into()),
        ),
        (
            "NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU",
            hex(NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU.into()),
        ),
        (
            "NV00FD_CTRL_CMD_SET_FAILURE",
            hex(NV00FD_CTRL_CMD_SET_FAILURE.into()),
        ),
        (
            "NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO",
            hex(p::NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO.into()),
        ),
        (
            "NV2080_CTRL_GPU_FABRIC_PROBE_STATE_UNSUPPORTED",
            hex(p::NV2080_CTRL_GPU_FABRIC_PROBE_STATE_UNSUPPORTED.into()),
        ),
        (
            "NV2080_CTRL_GPU_FABRIC_PROBE_STATE_NOT_STARTED",
            hex(p::NV2080_CTRL_GPU_FABRIC_PROBE_STATE_NOT_STARTED.into()),
        ),
        (
            "NV2080_CTRL_GPU_FABRIC_PROBE_STATE_IN_PROGRESS",
            hex(p::NV2080_CTRL_GPU_FABRIC_PROBE_STATE_IN_PROGRESS.into()),
        ),
        (
            "NV2080_CTRL_GPU_FABRIC_PROBE_STATE_COMPLETE",
            hex(p::NV2080_CTRL_GPU_FABRIC_PROBE_STATE_COMPLETE.into()),
        ),
        (
            "NV2080_GPU_FABRIC_CLUSTER_UUID_LEN",
            hex(p::NV2080_GPU_FABRIC_CLUSTER_UUID_LEN as u64),
        ),
        (
            "NV2080_CTRL_GPU_FABRIC_PROBE_CAP_MC_SUPPORTED",
            hex(p::NV2080_CTRL_GPU_FABRIC_PROBE_CAP_MC_SUPPORTED),
        ),
        (
            "NV2080_CTRL_GPU_FABRIC_PROBE_CAP_MC_MUTLINODE_SUPPORTED",
            hex(p::NV2080_CTRL_GPU_FABRIC_PROBE_CAP_MC_MUTLINODE_SUPPORTED),
        ),
        (
            "NV2080_CTRL_GPU_FABRIC_PROBE_CAP_UC_LOOPBACK_SUPPORTED",
            hex(p::NV2080_CTRL_GPU_FABRIC_PROBE_CAP_UC_LOOPBACK_SUPPORTED),
        ),
        (
            "NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS",
            hex(NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS.into()),
        ),
        (
            "NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2",
            hex(NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2.into()),
        ),
        (
            "NV0000_CTRL_CMD_GPU_GET_PROBED_IDS",
            hex(NV0000_CTRL_CMD_GPU_GET_PROBED_IDS.into()),
        ),
        (
            "NV0000_CTRL_CMD_GPU_ATTACH_IDS",
            hex(NV0000_CTRL_CMD_GPU_ATTACH_IDS.into()),
        ),
        (
            "NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID",
            hex(NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID.into()),
        ),
        (
            "NV0000_CTRL_CMD_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL",
            hex(NV0000_CTRL_CMD_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL.into()),
        ),
        (
            "NV0000_CTRL_GPU_MAX_ATTACHED_GPUS",
            hex(NV0000_CTRL_GPU_MAX_ATTACHED_GPUS as u64),
        ),
        (
            "NV0000_CTRL_GPU_MAX_PROBED_GPUS",
            hex(NV0000_CTRL_GPU_MAX_PROBED_GPUS as u64),
        ),
        (
            "NV0000_CTRL_GPU_INVALID_ID",
            hex(NV0000_CTRL_GPU_INVALID_ID.into()),
        ),
        (
            "NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS",
            hex(NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS.into()),
        ),
        (
            "NV0000_GPU_MAX_GID_LENGTH",
            hex(NV0000_GPU_MAX_GID_LENGTH as u64),
        ),
        (
            "NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT",
            drf(NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT),
        ),
        (
            "NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT_ASCII",
            hex(NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT_ASCII.into()),
        ),
        (
            "NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT_BINARY",
            hex(NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_FORMAT_BINARY.into()),
        ),
        (
            "NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE",
            drf(NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE),
        ),
        (
            "NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE_SHA1",
            hex(NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE_SHA1.into()),
        ),
        (
            "NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE_SHA256",
            hex(NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID_FLAGS_TYPE_SHA256.into()),
        ),
    ];
    macro_rules! health {
        ($($field:ident, [$($val:ident),*]);* $(;)?) => {$(
            v.push((stringify!($field), drf(p::$field)));
            $( v.push((stringify!($val), hex(p::$val.into()))); )*
        )*};
    }
    health!(
        NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW, [
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_NOT_SUPPORTED,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE];
        NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ROUTE_UPDATE, [
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ROUTE_UPDATE_NOT_SUPPORTED,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ROUTE_UPDATE_TRUE,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ROUTE_UPDATE_FALSE];
        NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_CONNECTION_UNHEALTHY, [
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_CONNECTION_UNHEALTHY_NOT_SUPPORTED,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_CONNECTION_UNHEALTHY_TRUE,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_CONNECTION_UNHEALTHY_FALSE];
        NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY, [
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_NOT_SUPPORTED,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_TRUE,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_FALSE];
        NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION, [
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NOT_SUPPORTED,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_SYSGUID,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_CHASSIS_SN,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NO_PARTITION,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCOMPATIBLE_GPU_FW,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INVALID_LOCATION,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_GPU_STATE_INVALID];
        NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED, [
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED_NOT_SUPPORTED,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED_TRUE,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED_FALSE];
    );
    for (name, val) in [
        (
            "NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED",
            p::NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED,
        ),
        (
            "NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY",
            p::NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
        ),
        (
            "NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY",
            p::NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
        ),
        (
            "NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY",
            p::NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY,
        ),
    ] {
        v.push((name, hex(val.into())));
    }
    v
}
