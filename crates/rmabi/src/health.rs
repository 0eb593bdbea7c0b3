//! The GPU's fabric health mask (`fabricHealthMask` of NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO):
//! its 2-bit fields, the 4-bit INCORRECT_CONFIGURATION reason, and their names as NVML and
//! `nvidia-smi` print them. The Fabric Manager (simulated) builds masks; the control CLI decodes
//! them; both read the same bits the kernel's `NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_*` fields
//! define ([`crate::ctrl::nv2080`]).

use serde::Serialize;

/// The value of a 2-bit health field (§5 "a health mask with 2-bit fields"; encodings
/// `..._NOT_SUPPORTED 0`, `..._TRUE 1`, `..._FALSE 2` of `nvlink_inband_msg.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[repr(u32)]
pub enum Flag {
    /// The FM does not report this field.
    NotSupported = 0,
    /// The condition holds.
    True = 1,
    /// The condition does not hold.
    False = 2,
}

/// A 2-bit field of the health mask, by its bit offset (§5 lists DEGRADED_BW, ROUTE_UPDATE,
/// CONNECTION_UNHEALTHY, ACCESS_TIMEOUT_RECOVERY, PARTITION_ASSIGNED; bits 1:0, 3:2, 5:4, 7:6
/// and 13:12 in `nvlink_inband_msg.h`; 11:8 is INCORRECT_CONFIGURATION).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[repr(u32)]
pub enum HealthField {
    /// Bandwidth below nominal (a switch tray or link lost). Bits 1:0.
    DegradedBw = 0,
    /// Routes are being updated. Bits 3:2.
    RouteUpdate = 2,
    /// The GPU's fabric connection is unhealthy. Bits 5:4.
    ConnectionUnhealthy = 4,
    /// Recovering from an access timeout. Bits 7:6.
    AccessTimeoutRecovery = 6,
    /// The GPU is in a fabric partition. Bits 13:12.
    PartitionAssigned = 12,
}

impl HealthField {
    /// Every 2-bit field.
    pub const ALL: [HealthField; 5] = [
        HealthField::DegradedBw,
        HealthField::RouteUpdate,
        HealthField::ConnectionUnhealthy,
        HealthField::AccessTimeoutRecovery,
        HealthField::PartitionAssigned,
    ];

    /// NVML's name of the field (the suffix of NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_*), what
    /// tools print.
    pub fn name(self) -> &'static str {
        match self {
            HealthField::DegradedBw => "DEGRADED_BW",
            HealthField::RouteUpdate => "ROUTE_UPDATE",
            HealthField::ConnectionUnhealthy => "CONNECTION_UNHEALTHY",
            HealthField::AccessTimeoutRecovery => "ACCESS_TIMEOUT_RECOVERY",
            HealthField::PartitionAssigned => "PARTITION_ASSIGNED",
        }
    }
}

/// The 4-bit INCORRECT_CONFIGURATION reason, bits 11:8 (§5 "plus a 4-bit
/// INCORRECT_CONFIGURATION reason"; values of `nvlink_inband_msg.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[repr(u32)]
pub enum IncorrectConfiguration {
    /// Not reported.
    NotSupported = 0,
    /// Configuration is correct.
    None = 1,
    /// Wrong system GUID.
    IncorrectSysguid = 2,
    /// Wrong chassis serial number.
    IncorrectChassisSn = 3,
    /// No partition (deprecated by NVIDIA; PARTITION_ASSIGNED replaces it).
    NoPartition = 4,
    /// Too few NVLinks trained.
    InsufficientNvlinks = 5,
    /// GPU firmware incompatible with the fabric.
    IncompatibleGpuFw = 6,
    /// The tray sits where the topology has none.
    InvalidLocation = 7,
    /// The GPU's state is invalid.
    GpuStateInvalid = 8,
}

/// Bit offset of the INCORRECT_CONFIGURATION field.
const INCORRECT_CONFIGURATION_SHIFT: u32 = 8;

/// The fabric health mask: 2-bit fields and one 4-bit field in a u32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(transparent)]
pub struct HealthMask(pub u32);

impl HealthMask {
    /// A healthy GPU's mask: every field reported and false, configuration correct, in a
    /// partition or not as `assigned` says.
    pub fn healthy(assigned: bool) -> HealthMask {
        let mut m = HealthMask(0);
        for f in HealthField::ALL {
            m = m.with(f, Flag::False);
        }
        m.with(
            HealthField::PartitionAssigned,
            if assigned { Flag::True } else { Flag::False },
        )
        .with_config(IncorrectConfiguration::None)
    }

    /// This mask with `field` set to `value`.
    #[must_use]
    pub fn with(self, field: HealthField, value: Flag) -> HealthMask {
        let shift = field as u32;
        HealthMask((self.0 & !(0b11 << shift)) | ((value as u32) << shift))
    }

    /// This mask with the INCORRECT_CONFIGURATION reason set.
    #[must_use]
    pub fn with_config(self, value: IncorrectConfiguration) -> HealthMask {
        let shift = INCORRECT_CONFIGURATION_SHIFT;
        HealthMask((self.0 & !(0b1111 << shift)) | ((value as u32) << shift))
    }

    /// The raw 2-bit value of `field` (0, 1 or 2; 3 is undefined).
    pub fn raw(self, field: HealthField) -> u32 {
        (self.0 >> field as u32) & 0b11
    }

    /// Whether `field` is TRUE.
    pub fn is(self, field: HealthField) -> bool {
        self.raw(field) == Flag::True as u32
    }

    /// The raw 4-bit INCORRECT_CONFIGURATION value.
    pub fn config_raw(self) -> u32 {
        (self.0 >> INCORRECT_CONFIGURATION_SHIFT) & 0b1111
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctrl::nv2080::*;

    #[test]
    fn each_field_sits_where_the_header_puts_it() {
        let header = [
            (
                HealthField::DegradedBw,
                NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW,
            ),
            (
                HealthField::RouteUpdate,
                NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ROUTE_UPDATE,
            ),
            (
                HealthField::ConnectionUnhealthy,
                NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_CONNECTION_UNHEALTHY,
            ),
            (
                HealthField::AccessTimeoutRecovery,
                NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY,
            ),
            (
                HealthField::PartitionAssigned,
                NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED,
            ),
        ];
        let config = NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION;
        assert_eq!((config.lo, config.hi), (INCORRECT_CONFIGURATION_SHIFT, 11));
        for (field, drf) in header {
            assert_eq!(field as u32, drf.lo, "{}", field.name());
            assert_eq!(drf.hi - drf.lo, 1, "{} is two bits", field.name());
        }
        assert_eq!(
            Flag::True as u32,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
        );
        assert_eq!(
            Flag::False as u32,
            NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
        );
    }

    #[test]
    fn fields_are_set_in_place_and_read_back() {
        let m = HealthMask(0).with(HealthField::DegradedBw, Flag::True);
        assert_eq!(m.0, 0x1);
        let m = m.with(HealthField::PartitionAssigned, Flag::False);
        assert_eq!(m.0, 0x2001);
        let m = m.with_config(IncorrectConfiguration::InsufficientNvlinks);
        assert_eq!(m.0, 0x2501);
        assert_eq!(m.config_raw(), 5);
        assert!(m.is(HealthField::DegradedBw));
        assert!(!m.is(HealthField::PartitionAssigned));
        // Setting a field replaces it, it does not OR into it.
        assert_eq!(
            m.with(HealthField::DegradedBw, Flag::False)
                .raw(HealthField::DegradedBw),
            2
        );
        // Healthy: 2-bit fields FALSE (0b10), config NONE, partition TRUE.
        assert_eq!(HealthMask::healthy(true).0, 0x11aa);
    }
}
