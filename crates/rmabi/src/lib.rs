//! The NVIDIA Resource Manager (RM) ioctl ABI that the IMEX daemon uses, as plain data.
//!
//! This crate owns the byte layouts, command numbers, class IDs, flags and status codes of
//! the parts of NVIDIA's open-gpu-kernel-modules RM API that an IMEX daemon touches on
//! `/dev/nvidiactl`: the ioctl escapes and their argument structs ([`escape`]), the RM
//! classes and their allocation parameters ([`class`]), the control commands and their
//! parameter blocks ([`ctrl`]), the fabric events of an IMEX session ([`event`]), the
//! `NV_STATUS` codes ([`status`]), the fabric health mask's fields ([`health`]) and the table
//! of driver releases with the layout family of each ([`version`]).
//!
//! **Nothing here does I/O.** There are no file descriptors, no `ioctl()` calls, no
//! `unsafe`: a real-driver backend or the simulated driver build on these types.
//!
//! # Where the layouts come from
//!
//! Every struct is `#[repr(C)]` with explicit `_pad*` bytes where C has implicit padding,
//! and derives zerocopy's `FromBytes`, `IntoBytes`, `KnownLayout` and `Immutable`, so it
//! can be moved to and from the driver's bytes without `unsafe`. Sizes and offsets were
//! read by compiling the SDK headers of each release tag with gcc 12 on x86_64 (LP64) and
//! printing `sizeof`/`offsetof` (`tools/probe.c`, driven by `tools/check_tags.py`; the
//! outputs are in `tools/expected/`). Each type states its C name and header, and has
//! compile-time asserts of its size, alignment and every field offset; the test
//! `tests/probe_match.rs` additionally compares every Rust type with the gcc output.
//!
//! Structs that changed between releases exist once per **layout family** (see
//! [`version::Layout`]), with the family's name as a suffix (`_V550`, `_V580`, `_V590`,
//! `_V595`; every family has an alias, so `NV00F1_CTRL_FABRIC_EVENT_V590` exists even
//! though it is a new layout only in V590). The modules [`v550`], [`v580`], [`v590`] and
//! [`v595`] re-export the complete set for one family under the plain C names. The
//! reference tag of each family:
//!
//! | Family | Read from tag | Releases |
//! |---|---|---|
//! | [`Layout::V550`] | 550.40.07 | 550.40.07 … 575.64.05 (all 550, 555, 560, 565, 570, 575 tags) |
//! | [`Layout::V580`] | 580.65.06 | 580.65.06 … 580.142 |
//! | [`Layout::V590`] | 590.44.01 | 590.44.01, 590.48.01 |
//! | [`Layout::V595`] | 595.44.02 | 595.44.02, 595.44.03, 595.45.04 |
//!
//! Structs that did not change in that range were read from 595.45.04 and checked against
//! every tag from 550.40.07 on.
//!
//! Where a family changes a struct the daemon must fill or parse, there is also a
//! version-independent Rust type with `encode(layout)`/`decode(layout, bytes)`:
//! [`event::FabricEvent`], [`class::nv00fd::MulticastAlloc`],
//! [`ctrl::nv00fd::AttachRemoteGpu`], [`ctrl::nv00f8::FabricMemoryAttrs`],
//! [`ctrl::nv00f8::Describe`], [`ctrl::nv00fb::Validate`] and
//! [`ctrl::nv2080::FabricProbeInfo`].
//!
//! Naming: raw ABI types and their fields keep the C spelling (`NVOS54_PARAMETERS`,
//! `hClient`), so they can be grepped in the headers; `type` becomes `type_`. The
//! version-independent types use Rust naming.
#![forbid(unsafe_code)]
#![allow(non_camel_case_types, non_snake_case)]

/// Compile-time asserts of a type's size, alignment and field offsets (numbers from the
/// gcc probe, `tools/expected/`).
macro_rules! assert_layout {
    ($t:ty, size = $size:expr, align = $align:expr $(, $f:ident @ $off:expr)* $(,)?) => {
        const _: () = assert!(core::mem::size_of::<$t>() == $size);
        const _: () = assert!(core::mem::align_of::<$t>() == $align);
        $( const _: () = assert!(core::mem::offset_of!($t, $f) == $off); )*
    };
}

/// `impl Default` as all-zero bytes (arrays longer than 32 have no `Default`).
macro_rules! impl_zeroed_default {
    ($($t:ty),* $(,)?) => {
        $(
            impl Default for $t {
                fn default() -> Self {
                    <$t as zerocopy::FromZeros>::new_zeroed()
                }
            }
        )*
    };
}

pub mod class;
pub mod ctrl;
pub mod error;
pub mod escape;
pub mod event;
mod families;
pub mod health;
pub mod status;
pub mod version;

pub use error::AbiError;
pub use event::FabricEvent;
pub use families::{v550, v580, v590, v595};
pub use version::{Layout, SUPPORTED, layout_for};

/// `NvHandle`: an RM object handle (client, device, subdevice, memory, …).
pub type NvHandle = u32;

/// `NV_STATUS` as carried in parameter blocks (see [`status`]).
pub type NvStatus = u32;

/// Reads `T` from exactly `bytes`, or says which struct had the wrong size.
pub(crate) fn read_exact<T: zerocopy::FromBytes>(
    what: &'static str,
    layout: Option<Layout>,
    bytes: &[u8],
) -> Result<T, AbiError> {
    T::read_from_bytes(bytes).map_err(|_| AbiError::WrongSize {
        what,
        layout,
        expected: core::mem::size_of::<T>(),
        actual: bytes.len(),
    })
}

/// Converts `value` to the narrower C field type `T`, or says it does not fit.
pub(crate) fn narrow<T: TryFrom<u64>>(
    what: &'static str,
    layout: Layout,
    value: u64,
) -> Result<T, AbiError> {
    T::try_from(value).map_err(|_| AbiError::ValueOutOfRange {
        what,
        layout,
        value,
        max: u64::MAX >> (64 - 8 * core::mem::size_of::<T>()),
    })
}
