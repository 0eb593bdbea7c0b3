//! Driver releases and their layout families.
//!
//! The RM structs the daemon uses are not stable: a control's `paramsSize` must equal the
//! `sizeof` the kernel was compiled with (`rs_resource.c`), and several structs gained or
//! widened fields. A [`Layout`] names one set of struct layouts; [`SUPPORTED`] maps every
//! checked release tag to its family; [`layout_for`] looks a running driver's version up.
//!
//! # Families and what changed (verified in the headers of every tag)
//!
//! * **V550** — 550.40.07 (first tag with `NV_IMEX_SESSION`) up to and including every
//!   550, 555, 560, 565, 570 and 575 tag (last: 575.64.05). Remote-GPU-attach event data
//!   40 B, fabric event 64 B, `GET_FABRIC_EVENTS` params 8200 B; `NV_FABRIC_MEMORY_ATTRS`
//!   32 B (no bwMode), `DESCRIBE`/`VALIDATE` 2120 B; `ATTACH_REMOTE_GPU` 24 B;
//!   `NV00FD_ALLOCATION_PARAMETERS.pageSize` is `NvU32`; fabric probe info 48 B;
//!   `GET_PROBED_IDS` 256 B.
//! * **V580** — 580.65.06 … 580.142. `bwModeEpoch` (u64) and `bwMode` (u8) added to the
//!   attach event data (56 B; event 80 B; params 10248 B), to `NV_FABRIC_MEMORY_ATTRS`
//!   (48 B; `DESCRIBE`/`VALIDATE` 2136 B) and to `ATTACH_REMOTE_GPU` (32 B);
//!   `fabricHealthSummary` added to the probe info (56 B); `gpuFlags[32]` added to
//!   `GET_PROBED_IDS` (384 B).
//! * **V590** — 590.44.01, 590.48.01. `pageSize` (u64) added to the attach event data
//!   (64 B; event 88 B; params 11272 B) and to `ATTACH_REMOTE_GPU` (40 B);
//!   `NV00FD_ALLOCATION_PARAMETERS.pageSize` widened to `NvU64` (size stays 80 B, but
//!   `allocFlags`/`numGpus` move from 60/64 to 64/68).
//! * **V595** — 595.44.02, 595.44.03, 595.45.04. `bwMode` widened from `NvU8` to `NvU16`
//!   in the attach event data, `NV_FABRIC_MEMORY_ATTRS` and `ATTACH_REMOTE_GPU`. No size
//!   changes, but `exportUuid` in the attach event moves from offset 41 to 42 of the data.
//!
//! No tag in the range was left out: each of the 101 tags from 550.40.07 to 595.45.04
//! matches exactly one family (`tools/check_tags.py`).

mod supported;

use core::fmt;
use core::mem::size_of;

pub use supported::SUPPORTED;

use crate::AbiError;
use crate::class::nv00fd::{NV00FD_ALLOCATION_PARAMETERS_V550, NV00FD_ALLOCATION_PARAMETERS_V590};
use crate::ctrl::nv0000::{
    NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V550, NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580,
};
use crate::ctrl::nv00f1::{
    NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V550, NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V580,
    NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V590, NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V595,
};
use crate::ctrl::nv00f8::{
    NV_FABRIC_MEMORY_ATTRS_V550, NV_FABRIC_MEMORY_ATTRS_V580, NV_FABRIC_MEMORY_ATTRS_V595,
    NV00F8_CTRL_DESCRIBE_PARAMS_V550, NV00F8_CTRL_DESCRIBE_PARAMS_V580,
    NV00F8_CTRL_DESCRIBE_PARAMS_V595,
};
use crate::ctrl::nv00fb::{
    NV00FB_CTRL_VALIDATE_PARAMS_V550, NV00FB_CTRL_VALIDATE_PARAMS_V580,
    NV00FB_CTRL_VALIDATE_PARAMS_V595,
};
use crate::ctrl::nv00fd::{
    NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V550, NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V580,
    NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V590, NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V595,
};
use crate::ctrl::nv2080::{
    NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V550,
    NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580,
};
use crate::event::raw::{
    NV00F1_CTRL_FABRIC_EVENT_V550, NV00F1_CTRL_FABRIC_EVENT_V580, NV00F1_CTRL_FABRIC_EVENT_V590,
    NV00F1_CTRL_FABRIC_EVENT_V595,
};

/// One set of RM struct layouts, named after the first release that has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layout {
    /// 550.40.07 … 575.64.05.
    V550,
    /// 580.65.06 … 580.142.
    V580,
    /// 590.44.01 … 590.48.01.
    V590,
    /// 595.44.02 … 595.45.04.
    V595,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (from {})", self.name(), self.first_release())
    }
}

impl Layout {
    /// Every family, oldest first.
    pub const ALL: [Layout; 4] = [Layout::V550, Layout::V580, Layout::V590, Layout::V595];

    /// `"V550"`, `"V580"`, …
    pub const fn name(self) -> &'static str {
        match self {
            Layout::V550 => "V550",
            Layout::V580 => "V580",
            Layout::V590 => "V590",
            Layout::V595 => "V595",
        }
    }

    /// The first release tag of the family (the tag its layouts were read from).
    pub const fn first_release(self) -> &'static str {
        match self {
            Layout::V550 => "550.40.07",
            Layout::V580 => "580.65.06",
            Layout::V590 => "590.44.01",
            Layout::V595 => "595.44.02",
        }
    }

    /// The releases of this family in [`SUPPORTED`], in version order.
    pub fn releases(self) -> impl Iterator<Item = &'static str> {
        SUPPORTED
            .iter()
            .filter(move |(_, l)| *l == self)
            .map(|(v, _)| *v)
    }

    /// The newest release of this family in [`SUPPORTED`].
    pub fn last_release(self) -> &'static str {
        self.releases().last().unwrap_or(self.first_release())
    }

    /// The attach event data, `NV_FABRIC_MEMORY_ATTRS` and `ATTACH_REMOTE_GPU` carry
    /// `bwModeEpoch`/`bwMode` (V580 on).
    pub const fn has_bw_mode(self) -> bool {
        !matches!(self, Layout::V550)
    }

    /// Largest `bwMode` the layout can carry (0 where it has none, 255 while it is `NvU8`).
    pub const fn bw_mode_max(self) -> u16 {
        match self {
            Layout::V550 => 0,
            Layout::V580 | Layout::V590 => u8::MAX as u16,
            Layout::V595 => u16::MAX,
        }
    }

    /// The attach event data and `ATTACH_REMOTE_GPU` carry `pageSize` (V590 on).
    pub const fn has_attach_page_size(self) -> bool {
        matches!(self, Layout::V590 | Layout::V595)
    }

    /// `NV00FD_ALLOCATION_PARAMETERS.pageSize` is `NvU64` (V590 on) rather than `NvU32`.
    pub const fn has_u64_multicast_page_size(self) -> bool {
        matches!(self, Layout::V590 | Layout::V595)
    }

    /// `NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS` has `fabricHealthSummary`
    /// (V580 on).
    pub const fn has_fabric_health_summary(self) -> bool {
        !matches!(self, Layout::V550)
    }

    /// `sizeof(NV00F1_CTRL_FABRIC_EVENT)`: 64, 80, 88, 88.
    pub const fn fabric_event_size(self) -> usize {
        match self {
            Layout::V550 => size_of::<NV00F1_CTRL_FABRIC_EVENT_V550>(),
            Layout::V580 => size_of::<NV00F1_CTRL_FABRIC_EVENT_V580>(),
            Layout::V590 => size_of::<NV00F1_CTRL_FABRIC_EVENT_V590>(),
            Layout::V595 => size_of::<NV00F1_CTRL_FABRIC_EVENT_V595>(),
        }
    }

    /// Size of the `data` union of `NV00F1_CTRL_FABRIC_EVENT`: 40, 56, 64, 64.
    pub const fn fabric_event_data_size(self) -> usize {
        self.fabric_event_size() - crate::event::raw::FABRIC_EVENT_DATA_OFFSET
    }

    /// `sizeof(NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS)`: 8200, 10248, 11272, 11272.
    pub const fn fabric_events_params_size(self) -> usize {
        match self {
            Layout::V550 => size_of::<NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V550>(),
            Layout::V580 => size_of::<NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V580>(),
            Layout::V590 => size_of::<NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V590>(),
            Layout::V595 => size_of::<NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V595>(),
        }
    }

    /// `sizeof(NV_FABRIC_MEMORY_ATTRS)`: 32, 48, 48, 48.
    pub const fn fabric_memory_attrs_size(self) -> usize {
        match self {
            Layout::V550 => size_of::<NV_FABRIC_MEMORY_ATTRS_V550>(),
            Layout::V580 | Layout::V590 => size_of::<NV_FABRIC_MEMORY_ATTRS_V580>(),
            Layout::V595 => size_of::<NV_FABRIC_MEMORY_ATTRS_V595>(),
        }
    }

    /// `sizeof(NV00F8_CTRL_DESCRIBE_PARAMS)`: 2120, 2136, 2136, 2136.
    pub const fn describe_params_size(self) -> usize {
        match self {
            Layout::V550 => size_of::<NV00F8_CTRL_DESCRIBE_PARAMS_V550>(),
            Layout::V580 | Layout::V590 => size_of::<NV00F8_CTRL_DESCRIBE_PARAMS_V580>(),
            Layout::V595 => size_of::<NV00F8_CTRL_DESCRIBE_PARAMS_V595>(),
        }
    }

    /// `sizeof(NV00FB_CTRL_VALIDATE_PARAMS)`: 2120, 2136, 2136, 2136.
    pub const fn validate_params_size(self) -> usize {
        match self {
            Layout::V550 => size_of::<NV00FB_CTRL_VALIDATE_PARAMS_V550>(),
            Layout::V580 | Layout::V590 => size_of::<NV00FB_CTRL_VALIDATE_PARAMS_V580>(),
            Layout::V595 => size_of::<NV00FB_CTRL_VALIDATE_PARAMS_V595>(),
        }
    }

    /// `sizeof(NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS)`: 24, 32, 40, 40.
    pub const fn attach_remote_gpu_params_size(self) -> usize {
        match self {
            Layout::V550 => size_of::<NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V550>(),
            Layout::V580 => size_of::<NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V580>(),
            Layout::V590 => size_of::<NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V590>(),
            Layout::V595 => size_of::<NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V595>(),
        }
    }

    /// `sizeof(NV00FD_ALLOCATION_PARAMETERS)`: 80 in every family (the offsets differ).
    pub const fn multicast_alloc_params_size(self) -> usize {
        match self {
            Layout::V550 | Layout::V580 => size_of::<NV00FD_ALLOCATION_PARAMETERS_V550>(),
            Layout::V590 | Layout::V595 => size_of::<NV00FD_ALLOCATION_PARAMETERS_V590>(),
        }
    }

    /// `sizeof(NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS)`: 48, 56, 56, 56.
    pub const fn fabric_probe_info_params_size(self) -> usize {
        match self {
            Layout::V550 => size_of::<NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V550>(),
            _ => size_of::<NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580>(),
        }
    }

    /// `sizeof(NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS)`: 256, 384, 384, 384.
    pub const fn probed_ids_params_size(self) -> usize {
        match self {
            Layout::V550 => size_of::<NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V550>(),
            _ => size_of::<NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580>(),
        }
    }

    /// The exact `paramsSize` RM expects for control `cmd` in this layout, for every
    /// control command this crate defines; `None` for others.
    pub const fn control_params_size(self, cmd: u32) -> Option<usize> {
        crate::ctrl::params_size(self, cmd)
    }

    /// The `paramsSize` of the allocation parameters of `class` in this layout, for every
    /// class this crate defines (`Some(0)`: no parameters; the root classes take an
    /// optional `NvHandle`, reported as 4).
    pub const fn alloc_params_size(self, class: u32) -> Option<usize> {
        crate::class::alloc_params_size(self, class)
    }
}

/// The layout family of driver `version` (e.g. `"580.82.07"`, as returned by
/// `NV_ESC_CHECK_VERSION_STR` with `NV_RM_API_VERSION_CMD_QUERY`). Surrounding whitespace
/// and trailing NULs are ignored; otherwise the version must be a [`SUPPORTED`] tag
/// exactly, because only those were checked.
pub fn layout_for(version: &str) -> Result<Layout, AbiError> {
    let v = version.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    SUPPORTED
        .iter()
        .find(|(tag, _)| *tag == v)
        .map(|(_, l)| *l)
        .ok_or_else(|| AbiError::UnsupportedVersion {
            version: version.to_owned(),
            supported: supported_summary(),
        })
}

/// Compact list of [`SUPPORTED`]: per family, one `first … last` range per driver branch
/// (major number), e.g. `V580: 580.65.06 … 580.142 (21)`. Every tag inside a range is
/// supported.
pub fn supported_summary() -> String {
    let mut parts = Vec::new();
    for layout in Layout::ALL {
        let mut ranges: Vec<String> = Vec::new();
        let mut count = 0;
        let mut branch: Option<(&str, &str, &str)> = None; // (major, first, last)
        let flush = |b: Option<(&str, &str, &str)>, ranges: &mut Vec<String>| {
            if let Some((_, first, last)) = b {
                ranges.push(if first == last {
                    first.to_owned()
                } else {
                    format!("{first} … {last}")
                });
            }
        };
        for v in layout.releases() {
            count += 1;
            let major = v.split('.').next().unwrap_or(v);
            match branch {
                Some((m, first, _)) if m == major => branch = Some((m, first, v)),
                _ => {
                    flush(branch, &mut ranges);
                    branch = Some((major, v, v));
                }
            }
        }
        flush(branch, &mut ranges);
        parts.push(format!(
            "{}: {} ({count})",
            layout.name(),
            ranges.join(", ")
        ));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_unique() {
        let key = |v: &str| {
            v.split('.')
                .map(|p| p.parse::<u32>().unwrap())
                .collect::<Vec<_>>()
        };
        for w in SUPPORTED.windows(2) {
            assert!(key(w[0].0) < key(w[1].0), "{} !< {}", w[0].0, w[1].0);
            assert!(w[0].1 <= w[1].1, "families out of order at {}", w[1].0);
        }
    }

    #[test]
    fn first_release_is_first_in_table() {
        for l in Layout::ALL {
            assert_eq!(l.releases().next(), Some(l.first_release()));
        }
    }

    #[test]
    fn lookup_trims_nul_and_whitespace() {
        assert_eq!(layout_for("595.45.04\0\0").unwrap(), Layout::V595);
        assert_eq!(layout_for(" 550.40.07\n").unwrap(), Layout::V550);
    }

    #[test]
    fn summary_is_compact() {
        let s = supported_summary();
        assert!(
            s.contains("V550: 550.40.07 … 550.163.01, 555.42.02 … 555.58.02"),
            "{s}"
        );
        assert!(s.contains("V580: 580.65.06 … 580.142 (21)"), "{s}");
        assert!(s.contains("V595: 595.44.02 … 595.45.04 (3)"), "{s}");
    }
}
