//! ioctl numbers ("escapes") of `/dev/nvidiactl` and their argument structs.
//!
//! Headers: `src/nvidia/arch/nvalloc/unix/include/nv_escape.h` (RM escapes),
//! `kernel-open/common/inc/nv-ioctl-numbers.h` (OS escapes), `kernel-open/common/inc/nv-ioctl.h`
//! (OS argument structs), `src/common/sdk/nvidia/inc/nvos.h` (`NVOSxx_PARAMETERS`). None of
//! them changed layout between 550.40.07 and 595.45.04.
//!
//! The request number is Linux `_IOWR('F', nr, sizeof(arg))` ([`iowr`]). The kernel
//! (`kernel-open/nvidia/nv.c`, `nvidia_ioctl`) only looks at `_IOC_NR` and `_IOC_SIZE`
//! (not at the direction bits or `_IOC_TYPE`), copies `_IOC_SIZE` bytes in, and copies
//! them back out after the call. Arguments larger than the 14-bit size field go through
//! [`NV_ESC_IOCTL_XFER_CMD`] with an [`nv_ioctl_xfer_t`] (at most
//! [`NV_ABSOLUTE_MAX_IOCTL_SIZE`] bytes); no argument here needs that. From 595.44.02 on,
//! `nv_validate_ioctls` also rejects (with `-EINVAL`) any escape whose `_IOC_SIZE` is not
//! exactly the struct size (for ATTACH_GPUS_TO_FD: a non-zero multiple of 4); before, each
//! escape checked its own size.
//!
//! RM escapes report RM failures in the struct's `status` field with the ioctl itself
//! returning 0; an ioctl error (`-EINVAL`, `-EFAULT`) means the argument was not accepted.

use core::mem::size_of;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::NvHandle;

/// `NV_IOCTL_MAGIC`: the `_IOC_TYPE` of every request.
pub const NV_IOCTL_MAGIC: u8 = b'F';
/// `NV_IOCTL_BASE`: first OS escape number.
pub const NV_IOCTL_BASE: u8 = 200;

/// `NV_ESC_RM_FREE`, argument [`NVOS00_PARAMETERS`].
pub const NV_ESC_RM_FREE: u8 = 0x29;
/// `NV_ESC_RM_CONTROL`, argument [`NVOS54_PARAMETERS`].
pub const NV_ESC_RM_CONTROL: u8 = 0x2A;
/// `NV_ESC_RM_ALLOC`, argument [`NVOS64_PARAMETERS`] (or the older [`NVOS21_PARAMETERS`];
/// the kernel tells them apart by size).
pub const NV_ESC_RM_ALLOC: u8 = 0x2B;
/// `NV_ESC_RM_DUP_OBJECT`, argument [`NVOS55_PARAMETERS`].
pub const NV_ESC_RM_DUP_OBJECT: u8 = 0x34;

/// `NV_ESC_CARD_INFO` (200): array of `nv_ioctl_card_info_t` (not defined here).
pub const NV_ESC_CARD_INFO: u8 = NV_IOCTL_BASE;
/// `NV_ESC_REGISTER_FD` (201), argument [`nv_ioctl_register_fd_t`].
pub const NV_ESC_REGISTER_FD: u8 = NV_IOCTL_BASE + 1;
/// `NV_ESC_ALLOC_OS_EVENT` (206), argument [`nv_ioctl_alloc_os_event_t`].
pub const NV_ESC_ALLOC_OS_EVENT: u8 = NV_IOCTL_BASE + 6;
/// `NV_ESC_FREE_OS_EVENT` (207), argument [`nv_ioctl_free_os_event_t`].
pub const NV_ESC_FREE_OS_EVENT: u8 = NV_IOCTL_BASE + 7;
/// `NV_ESC_STATUS_CODE` (209): `nv_ioctl_status_code_t` (not defined here).
pub const NV_ESC_STATUS_CODE: u8 = NV_IOCTL_BASE + 9;
/// `NV_ESC_CHECK_VERSION_STR` (210), argument [`nv_ioctl_rm_api_version_t`].
pub const NV_ESC_CHECK_VERSION_STR: u8 = NV_IOCTL_BASE + 10;
/// `NV_ESC_IOCTL_XFER_CMD` (211), argument [`nv_ioctl_xfer_t`].
pub const NV_ESC_IOCTL_XFER_CMD: u8 = NV_IOCTL_BASE + 11;
/// `NV_ESC_ATTACH_GPUS_TO_FD` (212): an array of `NvU32` GPU IDs (see [`attach_gpus_to_fd_arg`]).
pub const NV_ESC_ATTACH_GPUS_TO_FD: u8 = NV_IOCTL_BASE + 12;

/// `NV_ABSOLUTE_MAX_IOCTL_SIZE` (`kernel-open/common/inc/nv.h`): largest argument
/// accepted through [`NV_ESC_IOCTL_XFER_CMD`]. (Read from the header; not in the probe.)
pub const NV_ABSOLUTE_MAX_IOCTL_SIZE: usize = 16384;

/// Largest size the 14-bit `_IOC_SIZE` field of a request number holds.
pub const IOC_SIZE_MAX: usize = (1 << 14) - 1;

const IOC_READ_WRITE: u64 = 3;

/// Linux `_IOWR('F', nr, size)`: direction read|write (3) in bits 30–31, `size` in bits
/// 16–29, `'F'` in bits 8–15, `nr` in bits 0–7.
///
/// # Panics
/// If `size` exceeds [`IOC_SIZE_MAX`] (at compile time when used in a `const`); see
/// [`checked_iowr`].
pub const fn iowr(nr: u8, size: usize) -> u64 {
    match checked_iowr(nr, size) {
        Some(v) => v,
        None => panic!("ioctl argument larger than the 14-bit _IOC_SIZE field"),
    }
}

/// [`iowr`], or `None` if `size` does not fit the 14-bit size field.
pub const fn checked_iowr(nr: u8, size: usize) -> Option<u64> {
    if size > IOC_SIZE_MAX {
        return None;
    }
    Some(
        (IOC_READ_WRITE << 30) | ((size as u64) << 16) | ((NV_IOCTL_MAGIC as u64) << 8) | nr as u64,
    )
}

/// Request number of `NV_ESC_RM_FREE`.
pub const NV_IOCTL_RM_FREE: u64 = iowr(NV_ESC_RM_FREE, size_of::<NVOS00_PARAMETERS>());
/// Request number of `NV_ESC_RM_CONTROL`.
pub const NV_IOCTL_RM_CONTROL: u64 = iowr(NV_ESC_RM_CONTROL, size_of::<NVOS54_PARAMETERS>());
/// Request number of `NV_ESC_RM_ALLOC` with [`NVOS64_PARAMETERS`].
pub const NV_IOCTL_RM_ALLOC: u64 = iowr(NV_ESC_RM_ALLOC, size_of::<NVOS64_PARAMETERS>());
/// Request number of `NV_ESC_RM_DUP_OBJECT`.
pub const NV_IOCTL_RM_DUP_OBJECT: u64 = iowr(NV_ESC_RM_DUP_OBJECT, size_of::<NVOS55_PARAMETERS>());
/// Request number of `NV_ESC_REGISTER_FD`.
pub const NV_IOCTL_REGISTER_FD: u64 = iowr(NV_ESC_REGISTER_FD, size_of::<nv_ioctl_register_fd_t>());
/// Request number of `NV_ESC_ALLOC_OS_EVENT`.
pub const NV_IOCTL_ALLOC_OS_EVENT: u64 = iowr(
    NV_ESC_ALLOC_OS_EVENT,
    size_of::<nv_ioctl_alloc_os_event_t>(),
);
/// Request number of `NV_ESC_FREE_OS_EVENT`.
pub const NV_IOCTL_FREE_OS_EVENT: u64 =
    iowr(NV_ESC_FREE_OS_EVENT, size_of::<nv_ioctl_free_os_event_t>());
/// Request number of `NV_ESC_CHECK_VERSION_STR`.
pub const NV_IOCTL_CHECK_VERSION_STR: u64 = iowr(
    NV_ESC_CHECK_VERSION_STR,
    size_of::<nv_ioctl_rm_api_version_t>(),
);
/// Request number of `NV_ESC_IOCTL_XFER_CMD`.
pub const NV_IOCTL_XFER_CMD: u64 = iowr(NV_ESC_IOCTL_XFER_CMD, size_of::<nv_ioctl_xfer_t>());

/// `NVOS00_PARAMETERS` (nvos.h): argument of [`NV_ESC_RM_FREE`]. Freeing the client
/// (`hObjectOld == hRoot`) frees everything under it and its OS events.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS00_PARAMETERS {
    /// Client handle.
    pub hRoot: NvHandle,
    /// Parent of the object.
    pub hObjectParent: NvHandle,
    /// Object to free.
    pub hObjectOld: NvHandle,
    /// Out: `NV_STATUS`.
    pub status: u32,
}
assert_layout!(NVOS00_PARAMETERS, size = 16, align = 4,
    hRoot @ 0, hObjectParent @ 4, hObjectOld @ 8, status @ 12);

/// `NVOS21_PARAMETERS` (nvos.h): the older argument of [`NV_ESC_RM_ALLOC`] (no rights
/// mask). [`NVOS64_PARAMETERS`] is preferred. `pAllocParms` is a user pointer.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS21_PARAMETERS {
    /// Client handle.
    pub hRoot: NvHandle,
    /// Parent.
    pub hObjectParent: NvHandle,
    /// In/out: new handle, 0 to let RM choose.
    pub hObjectNew: NvHandle,
    /// Class of the new object.
    pub hClass: u32,
    /// **User pointer** to the class's allocation parameters.
    pub pAllocParms: u64,
    /// Size of `*pAllocParms`.
    pub paramsSize: u32,
    /// Out: `NV_STATUS`.
    pub status: u32,
}
assert_layout!(NVOS21_PARAMETERS, size = 32, align = 8,
    hRoot @ 0, hObjectParent @ 4, hObjectNew @ 8, hClass @ 12, pAllocParms @ 16,
    paramsSize @ 24, status @ 28);

/// `NVOS54_PARAMETERS` (nvos.h): argument of [`NV_ESC_RM_CONTROL`]. `params` is a **user
/// pointer** to the command's parameter block, whose size must equal `paramsSize` and the
/// compiled `sizeof` exactly (`rs_resource.c`; else `NV_ERR_INVALID_PARAM_STRUCT`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS54_PARAMETERS {
    /// Client handle.
    pub hClient: NvHandle,
    /// Object the command is addressed to.
    pub hObject: NvHandle,
    /// Control command (`NVxxxx_CTRL_CMD_*`).
    pub cmd: u32,
    /// [`NVOS54_FLAGS_NONE`] from user space.
    pub flags: u32,
    /// **User pointer** to the parameter block.
    pub params: u64,
    /// Size of the parameter block.
    pub paramsSize: u32,
    /// Out: `NV_STATUS`.
    pub status: u32,
}
assert_layout!(NVOS54_PARAMETERS, size = 32, align = 8,
    hClient @ 0, hObject @ 4, cmd @ 8, flags @ 12, params @ 16, paramsSize @ 24, status @ 28);

/// `NVOS54_FLAGS_NONE`.
pub const NVOS54_FLAGS_NONE: u32 = 0;

/// `NVOS55_PARAMETERS` (nvos.h): argument of [`NV_ESC_RM_DUP_OBJECT`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS55_PARAMETERS {
    /// Destination client.
    pub hClient: NvHandle,
    /// Parent of the new object.
    pub hParent: NvHandle,
    /// In/out: new handle.
    pub hObject: NvHandle,
    /// Source client.
    pub hClientSrc: NvHandle,
    /// Source object.
    pub hObjectSrc: NvHandle,
    /// `NV04_DUP_HANDLE_FLAGS_*`.
    pub flags: u32,
    /// Out: `NV_STATUS`.
    pub status: u32,
}
assert_layout!(NVOS55_PARAMETERS, size = 28, align = 4,
    hClient @ 0, hParent @ 4, hObject @ 8, hClientSrc @ 12, hObjectSrc @ 16, flags @ 20, status @ 24);

/// `NV04_DUP_HANDLE_FLAGS_NONE`.
pub const NV04_DUP_HANDLE_FLAGS_NONE: u32 = 0;
/// `NV04_DUP_HANDLE_FLAGS_REJECT_KERNEL_DUP_PRIVILEGE`.
pub const NV04_DUP_HANDLE_FLAGS_REJECT_KERNEL_DUP_PRIVILEGE: u32 = 1;

/// `NVOS64_PARAMETERS` (nvos.h): argument of [`NV_ESC_RM_ALLOC`]. `pAllocParms` and
/// `pRightsRequested` are **user pointers** (the latter may be 0).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NVOS64_PARAMETERS {
    /// Client handle (for a root-class alloc: the new client's handle, or 0).
    pub hRoot: NvHandle,
    /// Parent.
    pub hObjectParent: NvHandle,
    /// In/out: new object handle, 0 to let RM choose.
    pub hObjectNew: NvHandle,
    /// Class of the new object.
    pub hClass: u32,
    /// **User pointer** to the allocation parameters (may be 0 where optional).
    pub pAllocParms: u64,
    /// **User pointer** to an `RS_ACCESS_MASK`, or 0.
    pub pRightsRequested: u64,
    /// Size of `*pAllocParms` (must be the class's exact size, see
    /// [`crate::Layout::alloc_params_size`]).
    pub paramsSize: u32,
    /// `NVOS64_FLAGS_*`; 0 from user space.
    pub flags: u32,
    /// Out: `NV_STATUS`.
    pub status: u32,
    /// Trailing padding.
    pub _pad0: [u8; 4],
}
assert_layout!(NVOS64_PARAMETERS, size = 48, align = 8,
    hRoot @ 0, hObjectParent @ 4, hObjectNew @ 8, hClass @ 12, pAllocParms @ 16,
    pRightsRequested @ 24, paramsSize @ 32, flags @ 36, status @ 40, _pad0 @ 44);

/// `NVOS64_FLAGS_NONE`.
pub const NVOS64_FLAGS_NONE: u32 = 0;
/// `NVOS64_FLAGS_FINN_SERIALIZED` (kernel-internal).
pub const NVOS64_FLAGS_FINN_SERIALIZED: u32 = 1;

/// `nv_ioctl_xfer_t` (nv-ioctl.h): argument of [`NV_ESC_IOCTL_XFER_CMD`], wrapping an
/// argument too large for `_IOC_SIZE`. `ptr` is a **user pointer**.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_xfer_t {
    /// The wrapped escape number (`_IOC_NR`).
    pub cmd: u32,
    /// Size of the wrapped argument (≤ [`NV_ABSOLUTE_MAX_IOCTL_SIZE`]).
    pub size: u32,
    /// **User pointer** to the wrapped argument.
    pub ptr: u64,
}
assert_layout!(nv_ioctl_xfer_t, size = 16, align = 8, cmd @ 0, size @ 4, ptr @ 8);

/// `NV_RM_API_VERSION_STRING_LENGTH`.
pub const NV_RM_API_VERSION_STRING_LENGTH: usize = 64;
/// `NV_RM_API_VERSION_CMD_STRICT`: succeed only if `versionString` equals the kernel's
/// version string exactly.
pub const NV_RM_API_VERSION_CMD_STRICT: u32 = 0;
/// `NV_RM_API_VERSION_CMD_RELAXED` (`'1'`): compare only up to and including the first
/// `'.'` (the branch).
pub const NV_RM_API_VERSION_CMD_RELAXED: u32 = b'1' as u32;
/// `NV_RM_API_VERSION_CMD_QUERY` (`'2'`): no check; the kernel writes its version string.
pub const NV_RM_API_VERSION_CMD_QUERY: u32 = b'2' as u32;
/// `NV_RM_API_VERSION_REPLY_UNRECOGNIZED`: what `reply` holds if the kernel did not
/// process the request (the caller should preset it).
pub const NV_RM_API_VERSION_REPLY_UNRECOGNIZED: u32 = 0;
/// `NV_RM_API_VERSION_REPLY_RECOGNIZED`: written by every kernel that handled the request.
pub const NV_RM_API_VERSION_REPLY_RECOGNIZED: u32 = 1;

/// `nv_ioctl_rm_api_version_t` (nv-ioctl.h): argument of [`NV_ESC_CHECK_VERSION_STR`].
///
/// Kernel handling (`RmPerformVersionCheck`, `src/nvidia/arch/nvalloc/unix/src/osapi.c`,
/// same in 550.40.07 and 595.45.04): the escape is only accepted on the control device;
/// the kernel first sets `reply = NV_RM_API_VERSION_REPLY_RECOGNIZED`, then
/// * **QUERY**: copies its NUL-terminated version string (e.g. `"595.45.04"`) into
///   `versionString` and succeeds (ioctl returns 0);
/// * **RELAXED**: succeeds if the strings agree up to the first `'.'`;
/// * **STRICT** (or any other `cmd` value): succeeds if the strings are equal up to the
///   NUL.
///
/// On a mismatch it logs "NVRM: API mismatch", overwrites `versionString` with its own
/// version and fails with `NV_ERR_GENERIC`, which the ioctl returns as `-EINVAL`; the
/// reply field still says RECOGNIZED. So a daemon queries with QUERY and looks the answer
/// up with [`crate::layout_for`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct nv_ioctl_rm_api_version_t {
    /// `NV_RM_API_VERSION_CMD_*`.
    pub cmd: u32,
    /// Out: `NV_RM_API_VERSION_REPLY_*`.
    pub reply: u32,
    /// In (STRICT/RELAXED) or out (QUERY, and on mismatch): NUL-terminated version.
    pub versionString: [u8; NV_RM_API_VERSION_STRING_LENGTH],
}
assert_layout!(nv_ioctl_rm_api_version_t, size = 72, align = 4, cmd @ 0, reply @ 4, versionString @ 8);

impl nv_ioctl_rm_api_version_t {
    /// A QUERY request (reply preset to UNRECOGNIZED).
    pub fn query() -> Self {
        Self {
            cmd: NV_RM_API_VERSION_CMD_QUERY,
            reply: NV_RM_API_VERSION_REPLY_UNRECOGNIZED,
            versionString: [0; NV_RM_API_VERSION_STRING_LENGTH],
        }
    }

    /// The version string up to the first NUL (lossy UTF-8).
    pub fn version(&self) -> String {
        let end = self
            .versionString
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.versionString.len());
        String::from_utf8_lossy(&self.versionString[..end]).into_owned()
    }
}

/// `nv_ioctl_register_fd_t` (nv-ioctl.h): argument of [`NV_ESC_REGISTER_FD`], issued on a
/// GPU device fd (`/dev/nvidiaN`) to link it to a control fd. RM fails with
/// `NV_ERR_INVALID_STATE` if the fd is already linked, `NV_ERR_INVALID_ARGUMENT` if
/// `ctl_fd` is not an nvidiactl fd (or itself linked), `NV_ERR_IN_USE` if the device fd is
/// already reference-counted (escape.c).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct nv_ioctl_register_fd_t {
    /// **File descriptor** of the `/dev/nvidiactl` open (C `int`).
    pub ctl_fd: i32,
}
assert_layout!(nv_ioctl_register_fd_t, size = 4, align = 4, ctl_fd @ 0);

/// `nv_ioctl_alloc_os_event_t` (nv-ioctl.h): argument of [`NV_ESC_ALLOC_OS_EVENT`].
///
/// Issued **on the fd that becomes the event fd** (any nvidia fd; a second nvidiactl open
/// in practice), with `fd` set to that fd's own number. RM records `(hClient, fd)` →
/// that open file (`allocate_os_event`, osapi.c; one event per `(hClient, fd)`, else
/// `NV_ERR_INVALID_ARGUMENT`). Objects that take an OS event (`pOsEvent` of
/// `NV_IMEX_SESSION`, `NV_MEMORY_FABRIC_IMPORT_V2`, …) are then given the fd number;
/// RM signals it so `poll()` on the fd wakes. RM errors are returned in `Status`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct nv_ioctl_alloc_os_event_t {
    /// Client the event belongs to.
    pub hClient: NvHandle,
    /// Unused by the Linux kernel (0).
    pub hDevice: NvHandle,
    /// **File descriptor** number of the fd the ioctl is issued on.
    pub fd: u32,
    /// Out: `NV_STATUS`.
    pub Status: u32,
}
assert_layout!(nv_ioctl_alloc_os_event_t, size = 16, align = 4, hClient @ 0, hDevice @ 4, fd @ 8, Status @ 12);

/// `nv_ioctl_free_os_event_t` (nv-ioctl.h): argument of [`NV_ESC_FREE_OS_EVENT`]; same
/// fields as [`nv_ioctl_alloc_os_event_t`] (`fd` is a **file descriptor** number).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct nv_ioctl_free_os_event_t {
    /// Client the event belongs to.
    pub hClient: NvHandle,
    /// Unused (0).
    pub hDevice: NvHandle,
    /// **File descriptor** number given at allocation.
    pub fd: u32,
    /// Out: `NV_STATUS`.
    pub Status: u32,
}
assert_layout!(nv_ioctl_free_os_event_t, size = 16, align = 4, hClient @ 0, hDevice @ 4, fd @ 8, Status @ 12);

/// Argument of [`NV_ESC_ATTACH_GPUS_TO_FD`]: the GPU IDs (as from
/// `NV0000_CTRL_CMD_GPU_GET_PROBED_IDS`) as native-endian `NvU32`s; the request number
/// encodes the byte length (`iowr(NV_ESC_ATTACH_GPUS_TO_FD, 4 * n)`).
///
/// The kernel (nv.c) accepts any non-zero multiple of 4 bytes, i.e. 1 to
/// [`ATTACH_GPUS_TO_FD_MAX_IDS`] IDs through the 14-bit size field, only on the control
/// device, and only once per fd (a second call fails with `-EINVAL`). It skips zero
/// entries and takes a reference on (opens) every other GPU for the lifetime of the fd;
/// if any ID is unknown it drops the references taken so far and fails with `-EINVAL`.
pub fn attach_gpus_to_fd_arg(gpu_ids: &[u32]) -> Vec<u8> {
    gpu_ids.as_bytes().to_vec()
}

/// Most GPU IDs one `NV_ESC_ATTACH_GPUS_TO_FD` can carry (14-bit size field / 4).
pub const ATTACH_GPUS_TO_FD_MAX_IDS: usize = IOC_SIZE_MAX / 4;

impl_zeroed_default!(
    NVOS00_PARAMETERS,
    NVOS21_PARAMETERS,
    NVOS54_PARAMETERS,
    NVOS55_PARAMETERS,
    NVOS64_PARAMETERS,
    nv_ioctl_xfer_t,
    nv_ioctl_rm_api_version_t,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iowr_matches_hand_computed_values() {
        // _IOWR('F', 0x2A, 32) = (3 << 30) | (32 << 16) | (0x46 << 8) | 0x2A
        assert_eq!(iowr(NV_ESC_RM_CONTROL, 32), 0xC020_462A);
        assert_eq!(NV_IOCTL_RM_CONTROL, 0xC020_462A);
        // NVOS64: 48 bytes, nr 0x2B
        assert_eq!(NV_IOCTL_RM_ALLOC, 0xC030_462B);
        // NVOS00: 16 bytes, nr 0x29
        assert_eq!(NV_IOCTL_RM_FREE, 0xC010_4629);
        // NVOS55: 28 bytes, nr 0x34
        assert_eq!(NV_IOCTL_RM_DUP_OBJECT, 0xC01C_4634);
        // version check: 72 bytes, nr 210 = 0xD2
        assert_eq!(NV_IOCTL_CHECK_VERSION_STR, 0xC048_46D2);
        // register fd: 4 bytes, nr 201 = 0xC9
        assert_eq!(NV_IOCTL_REGISTER_FD, 0xC004_46C9);
        // alloc/free os event: 16 bytes, nr 206/207
        assert_eq!(NV_IOCTL_ALLOC_OS_EVENT, 0xC010_46CE);
        assert_eq!(NV_IOCTL_FREE_OS_EVENT, 0xC010_46CF);
        // attach 4 GPUs: 16 bytes, nr 212 = 0xD4
        assert_eq!(iowr(NV_ESC_ATTACH_GPUS_TO_FD, 16), 0xC010_46D4);
        // the 14-bit size field is full at 0x3FFF
        assert_eq!(iowr(0, IOC_SIZE_MAX), 0xFFFF_4600);
        assert_eq!(checked_iowr(0, IOC_SIZE_MAX + 1), None);
    }

    #[test]
    fn version_query_roundtrip() {
        let mut q = nv_ioctl_rm_api_version_t::query();
        assert_eq!(q.cmd, 0x32);
        q.versionString[..9].copy_from_slice(b"595.45.04");
        assert_eq!(q.version(), "595.45.04");
    }

    #[test]
    fn attach_gpus_arg_is_native_u32s() {
        let a = attach_gpus_to_fd_arg(&[0x100, 0x200]);
        assert_eq!(a.len(), 8);
        assert_eq!(u32::from_ne_bytes(a[4..8].try_into().unwrap()), 0x200);
    }
}
