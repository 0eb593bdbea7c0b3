//! `NV_IMEX_SESSION` controls (`ctrl/ctrl00f1.h`), addressed to the session object.
//!
//! Implementation: `src/nvidia/src/kernel/compute/imex_session_api.c` (595.45.04).
//! The event structs inside `GET_FABRIC_EVENTS` are in [`crate::event::raw`]; building and
//! parsing whole blocks is [`crate::event::fabric_events_params`] /
//! [`crate::event::parse_fabric_events_params`].

use core::mem::{offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::event::raw::{
    NV00F1_CTRL_FABRIC_EVENT_V550, NV00F1_CTRL_FABRIC_EVENT_V580, NV00F1_CTRL_FABRIC_EVENT_V590,
    NV00F1_CTRL_FABRIC_EVENT_V595,
};
use crate::{AbiError, Layout};

/// `NV00F1_CTRL_CMD_GET_FABRIC_EVENTS`: dequeue up to 128 events. The kernel sets
/// `numEvents` to the number written and `bMoreEvents` if more are queued; the daemon
/// calls it until `bMoreEvents` is false after each wake-up of the session's OS event.
pub const NV00F1_CTRL_CMD_GET_FABRIC_EVENTS: u32 = 0xF1_0001;
/// `NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT`: acknowledge unimport events, waking the threads
/// blocked in the freeing of the imported memory.
pub const NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT: u32 = 0xF1_0002;
/// `NV00F1_CTRL_CMD_DISABLE_IMPORTERS`: robust-channel recovery and disable of every
/// client that imported memory from a node. `NV_ERR_NOT_SUPPORTED` if the session was
/// created with `DISABLE_CHANNEL_RECOVERY` (which the constructor never allows).
pub const NV00F1_CTRL_CMD_DISABLE_IMPORTERS: u32 = 0xF1_0003;

/// `NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE`.
pub const NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE: usize = 128;
/// `NV00F1_CTRL_FINISH_MEM_UNIMPORT_ARRAY_SIZE`.
pub const NV00F1_CTRL_FINISH_MEM_UNIMPORT_ARRAY_SIZE: usize = 256;

macro_rules! get_fabric_events_params {
    ($name:ident, $event:ty, $size:expr, $num:expr, $fam:literal) => {
        #[doc = concat!("`NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS` (ctrl00f1.h), ", $fam, " family (", stringify!($size), " bytes). All fields are outputs.")]
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
        pub struct $name {
            /// The events; the first `numEvents` are valid.
            pub eventArray: [$event; NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE],
            /// Number of valid events.
            pub numEvents: u32,
            /// `NvBool`: more events are queued.
            pub bMoreEvents: u8,
            /// Trailing padding.
            pub _pad0: [u8; 3],
        }
        assert_layout!($name, size = $size, align = 8,
            eventArray @ 0, numEvents @ $num, bMoreEvents @ $num + 4, _pad0 @ $num + 5);
        impl_zeroed_default!($name);
    };
}

get_fabric_events_params!(
    NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V550,
    NV00F1_CTRL_FABRIC_EVENT_V550,
    8200,
    8192,
    "V550"
);
get_fabric_events_params!(
    NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V580,
    NV00F1_CTRL_FABRIC_EVENT_V580,
    10248,
    10240,
    "V580"
);
get_fabric_events_params!(
    NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V590,
    NV00F1_CTRL_FABRIC_EVENT_V590,
    11272,
    11264,
    "V590"
);
get_fabric_events_params!(
    NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V595,
    NV00F1_CTRL_FABRIC_EVENT_V595,
    11272,
    11264,
    "V595"
);

/// Offsets of `numEvents` and `bMoreEvents` in `GET_FABRIC_EVENTS_PARAMS` of `layout`.
pub const fn get_fabric_events_tail_offsets(layout: Layout) -> (usize, usize) {
    match layout {
        Layout::V550 => (
            offset_of!(NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V550, numEvents),
            offset_of!(NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V550, bMoreEvents),
        ),
        Layout::V580 => (
            offset_of!(NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V580, numEvents),
            offset_of!(NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V580, bMoreEvents),
        ),
        Layout::V590 => (
            offset_of!(NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V590, numEvents),
            offset_of!(NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V590, bMoreEvents),
        ),
        Layout::V595 => (
            offset_of!(NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V595, numEvents),
            offset_of!(NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V595, bMoreEvents),
        ),
    }
}

/// `NV00F1_CTRL_FABRIC_UNIMPORT_TOKEN` (ctrl00f1.h).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F1_CTRL_FABRIC_UNIMPORT_TOKEN {
    /// The `id` of the `MEM_UNIMPORT` event being acknowledged (the event ID, not its
    /// `importEventId`).
    pub unimportEventId: u64,
}
assert_layout!(NV00F1_CTRL_FABRIC_UNIMPORT_TOKEN, size = 8, align = 8, unimportEventId @ 0);

/// `NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS` (ctrl00f1.h), inputs only. The kernel
/// rejects `numTokens` of 0 or above 256 (`NV_ERR_INVALID_ARGUMENT`) and silently ignores
/// unknown event IDs (the waiting thread may have gone).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS {
    /// Tokens; the first `numTokens` are used.
    pub tokenArray: [NV00F1_CTRL_FABRIC_UNIMPORT_TOKEN; NV00F1_CTRL_FINISH_MEM_UNIMPORT_ARRAY_SIZE],
    /// 1 ..= 256.
    pub numTokens: u32,
    /// Trailing padding.
    pub _pad0: [u8; 4],
}
assert_layout!(NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS, size = 2056, align = 8,
    tokenArray @ 0, numTokens @ 2048, _pad0 @ 2052);
impl_zeroed_default!(NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS);

impl NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS {
    /// Parameters acknowledging `unimport_event_ids` (1 to 256 of them).
    pub fn new(unimport_event_ids: &[u64]) -> Result<Self, AbiError> {
        let n = unimport_event_ids.len();
        if n > NV00F1_CTRL_FINISH_MEM_UNIMPORT_ARRAY_SIZE {
            return Err(AbiError::TooManyEntries {
                what: "NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS.tokenArray",
                count: n,
                max: NV00F1_CTRL_FINISH_MEM_UNIMPORT_ARRAY_SIZE,
            });
        }
        let mut p = Self::default();
        for (slot, &id) in p.tokenArray.iter_mut().zip(unimport_event_ids) {
            slot.unimportEventId = id;
        }
        p.numTokens = n as u32;
        Ok(p)
    }
}

/// `NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS` (ctrl00f1.h).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS {
    /// The node whose importers are disabled. (The header's comment calls it "an array of
    /// tokens", a copy-paste slip; it is one node ID.)
    pub nodeId: u16,
}
assert_layout!(NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS, size = 2, align = 2, nodeId @ 0);

/// `sizeof(NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS)` of `layout`.
pub const fn get_fabric_events_params_size(layout: Layout) -> usize {
    match layout {
        Layout::V550 => size_of::<NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V550>(),
        Layout::V580 => size_of::<NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V580>(),
        Layout::V590 => size_of::<NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V590>(),
        Layout::V595 => size_of::<NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V595>(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_unimport_limits() {
        let p = NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS::new(&[5, 9]).unwrap();
        assert_eq!(p.numTokens, 2);
        assert_eq!(p.tokenArray[1].unimportEventId, 9);
        assert_eq!(&p.as_bytes()[8..16], &9u64.to_ne_bytes());
        let too_many = vec![0u64; 257];
        assert_eq!(
            NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS::new(&too_many),
            Err(AbiError::TooManyEntries {
                what: "NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS.tokenArray",
                count: 257,
                max: 256
            })
        );
    }

    #[test]
    fn tail_offsets() {
        assert_eq!(get_fabric_events_tail_offsets(Layout::V550), (8192, 8196));
        assert_eq!(get_fabric_events_tail_offsets(Layout::V595), (11264, 11268));
    }
}
