//! The crate's one error type.

use crate::version::Layout;

/// Everything that can go wrong when turning driver bytes into values or back.
///
/// None of the decoders panic on malformed input; they return one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AbiError {
    /// A parameter block did not have the size of the C struct (the kernel would answer
    /// `NV_ERR_INVALID_PARAM_STRUCT` or `-EINVAL`).
    #[error("{what}{}: expected {expected} bytes, got {actual}", layout_suffix(*.layout))]
    WrongSize {
        /// The C struct.
        what: &'static str,
        /// The layout family, for structs that differ between families.
        layout: Option<Layout>,
        /// `sizeof` of the C struct.
        expected: usize,
        /// Length of the bytes given.
        actual: usize,
    },

    /// A fabric event whose `type` is none of `NV00F1_CTRL_FABRIC_EVENT_TYPE_*`.
    #[error(
        "unknown fabric event type {type_value} (known: 0 MEM_IMPORT, 1 MEM_UNIMPORT, \
         2 REMOTE_GPU_ATTACH, 3 CLIQUE_ID_CHANGE)"
    )]
    UnknownEventType {
        /// The `type` byte as found.
        type_value: u8,
    },

    /// More entries than the C array holds (or a count field claiming so).
    #[error("{what}: {count} entries, at most {max} fit")]
    TooManyEntries {
        /// The array or count field.
        what: &'static str,
        /// Entries given or claimed.
        count: usize,
        /// Array capacity.
        max: usize,
    },

    /// A value does not fit the C field of this layout (e.g. `bwMode` > 255 where it is
    /// an `NvU8`).
    #[error("{what} = {value} does not fit layout {layout} (max {max})")]
    ValueOutOfRange {
        /// The C field.
        what: &'static str,
        /// The layout family.
        layout: Layout,
        /// The value given.
        value: u64,
        /// The largest value the field holds.
        max: u64,
    },

    /// The driver version is not in [`crate::version::SUPPORTED`].
    #[error(
        "unsupported NVIDIA driver version {version:?}: the RM ioctl structs differ between \
         releases and only these were checked: {supported}. Install one of them, or add \
         the release to openimex-rmabi (run tools/check_tags.py against its \
         open-gpu-kernel-modules tag)"
    )]
    UnsupportedVersion {
        /// The version string as given (e.g. from `NV_ESC_CHECK_VERSION_STR` QUERY).
        version: String,
        /// Compact list of supported releases per family.
        supported: String,
    },
}

fn layout_suffix(layout: Option<Layout>) -> String {
    match layout {
        Some(l) => format!(" (layout {l})"),
        None => String::new(),
    }
}
