//! RM classes the daemon allocates or meets, and their allocation parameters.
//!
//! Class IDs are the `hClass` of [`crate::escape::NVOS64_PARAMETERS`]; the parameter
//! struct is what `pAllocParms` points to and its size must be passed as `paramsSize`
//! (see [`alloc_params_size`]). Parents and flags come from
//! `src/nvidia/src/kernel/rmapi/resource_list.h`.

pub mod client;
pub mod nv00e0;
pub mod nv00f1;
pub mod nv00f8;
pub mod nv00fb;
pub mod nv00fd;

use core::mem::size_of;

pub use client::{
    NV01_DEVICE_0, NV01_ROOT, NV01_ROOT_CLIENT, NV01_ROOT_NON_PRIV, NV20_SUBDEVICE_0,
};
pub use nv00e0::NV_MEMORY_EXPORT;
pub use nv00f1::NV_IMEX_SESSION;
pub use nv00f8::{NV_MEMORY_FABRIC, NV_MEMORY_FABRIC_IMPORT_V2};
pub use nv00fb::NV_MEMORY_FABRIC_IMPORTED_REF;
pub use nv00fd::NV_MEMORY_MULTICAST_FABRIC;

use crate::Layout;

/// `paramsSize` of the allocation parameters of `class` in `layout`, for the classes this
/// crate defines. The root classes take an optional `NvHandle` (4 bytes; `pAllocParms`
/// may also be 0 with `paramsSize` 0).
pub const fn alloc_params_size(layout: Layout, class: u32) -> Option<usize> {
    Some(match class {
        NV01_ROOT | NV01_ROOT_NON_PRIV | NV01_ROOT_CLIENT => size_of::<crate::NvHandle>(),
        NV01_DEVICE_0 => size_of::<client::NV0080_ALLOC_PARAMETERS>(),
        NV20_SUBDEVICE_0 => size_of::<client::NV2080_ALLOC_PARAMETERS>(),
        NV_IMEX_SESSION => size_of::<nv00f1::NV00F1_ALLOCATION_PARAMETERS>(),
        NV_MEMORY_EXPORT => size_of::<nv00e0::NV00E0_ALLOCATION_PARAMETERS>(),
        NV_MEMORY_FABRIC => size_of::<nv00f8::NV00F8_ALLOCATION_PARAMETERS>(),
        NV_MEMORY_FABRIC_IMPORT_V2 => size_of::<nv00f8::NV00F9_ALLOCATION_PARAMETERS>(),
        NV_MEMORY_FABRIC_IMPORTED_REF => size_of::<nv00fb::NV00FB_ALLOCATION_PARAMETERS>(),
        NV_MEMORY_MULTICAST_FABRIC => layout.multicast_alloc_params_size(),
        _ => return None,
    })
}
