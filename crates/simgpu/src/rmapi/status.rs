//! NV_STATUS codes on the escape path: the numbers are `openimex-rmabi`'s; the state
//! machine's statuses ([`NvStatus`], the simulation protocol's) map onto them one to one by
//! name.

pub(super) use openimex_rmabi::status::{
    NV_ERR_GENERIC, NV_ERR_IN_USE, NV_ERR_INSERT_DUPLICATE_NAME, NV_ERR_INSUFFICIENT_PERMISSIONS,
    NV_ERR_INSUFFICIENT_RESOURCES, NV_ERR_INVALID_ADDRESS, NV_ERR_INVALID_ARGUMENT,
    NV_ERR_INVALID_CLASS, NV_ERR_INVALID_CLIENT, NV_ERR_INVALID_DEVICE, NV_ERR_INVALID_EVENT,
    NV_ERR_INVALID_OBJECT, NV_ERR_INVALID_OBJECT_HANDLE, NV_ERR_INVALID_OBJECT_PARENT,
    NV_ERR_INVALID_OPERATION, NV_ERR_INVALID_STATE, NV_ERR_NO_MEMORY, NV_ERR_NOT_READY,
    NV_ERR_NOT_SUPPORTED, NV_ERR_OBJECT_NOT_FOUND, NV_ERR_OUT_OF_RANGE, NV_ERR_RESET_REQUIRED,
    NV_ERR_STATE_IN_USE, NV_OK, NV_WARN_NOTHING_TO_DO,
};
use openimex_simproto::proto::NvStatus;

/// What a control handler hands back: the status, and whether blocked calls may have
/// become answerable.
pub(super) type Handled = (u32, bool);

/// The name of NV_STATUS `code` (`NV_OK`, `NV_ERR_IN_USE`, …), or its hex value when no
/// release names it.
pub fn status_name(code: u32) -> String {
    openimex_rmabi::status::status_name(code).map_or_else(|| format!("{code:#010x}"), str::to_owned)
}

/// The code of a state-machine status.
pub(super) fn code(s: NvStatus) -> u32 {
    match s {
        NvStatus::InsufficientPermissions => NV_ERR_INSUFFICIENT_PERMISSIONS,
        NvStatus::NotReady => NV_ERR_NOT_READY,
        NvStatus::InvalidState => NV_ERR_INVALID_STATE,
        NvStatus::InvalidObject => NV_ERR_INVALID_OBJECT,
        NvStatus::NotSupported => NV_ERR_NOT_SUPPORTED,
        NvStatus::ObjectNotFound => NV_ERR_OBJECT_NOT_FOUND,
        NvStatus::InUse => NV_ERR_IN_USE,
        NvStatus::StateInUse => NV_ERR_STATE_IN_USE,
        NvStatus::InvalidArgument => NV_ERR_INVALID_ARGUMENT,
        NvStatus::NoMemory => NV_ERR_NO_MEMORY,
        NvStatus::InvalidObjectHandle => NV_ERR_INVALID_OBJECT_HANDLE,
        NvStatus::ResetRequired => NV_ERR_RESET_REQUIRED,
        NvStatus::InvalidDevice => NV_ERR_INVALID_DEVICE,
        NvStatus::InvalidOperation => NV_ERR_INVALID_OPERATION,
        NvStatus::InsertDuplicateName => NV_ERR_INSERT_DUPLICATE_NAME,
        NvStatus::Generic => NV_ERR_GENERIC,
    }
}

/// The state-machine status of `code`, if it has one (the statuses a multicast failure can
/// carry to the objects of the node); others become NV_ERR_GENERIC there.
pub(super) fn from_code(code: u32) -> NvStatus {
    NvStatus::ALL
        .into_iter()
        .find(|s| self::code(*s) == code)
        .unwrap_or(NvStatus::Generic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_machine_status_has_the_code_of_its_name() {
        for s in NvStatus::ALL {
            assert_eq!(status_name(code(s)), s.to_string());
            assert_eq!(from_code(code(s)), s);
        }
        assert_eq!(status_name(NV_OK), "NV_OK");
        assert_eq!(status_name(NV_WARN_NOTHING_TO_DO), "NV_WARN_NOTHING_TO_DO");
    }
}
