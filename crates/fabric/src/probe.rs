//! The GPU fabric probe: its numeric encodings and the Fabric Manager's per-GPU answer.
//!
//! The values are those of NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO and of the FM's in-band
//! probe response (driver-interface §5; field layout in the driver's `nvlink_inband_msg.h`),
//! so a later simulated driver can hand them to NVML-shaped tools unchanged.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Probe state (§5: "state UNSUPPORTED=0, NOT_STARTED=1, IN_PROGRESS=2, COMPLETE=3"; NVML
/// names the last COMPLETED).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[repr(u32)]
pub enum ProbeState {
    /// The GPU has no fabric probe (not NVLink-connected).
    Unsupported = 0,
    /// The probe has not been sent.
    NotStarted = 1,
    /// Sent, no answer yet: fabric memory allocation still fails.
    InProgress = 2,
    /// Answered: clusterUuid, cliqueId and the FLA range are valid.
    Complete = 3,
}

/// `TryFrom<u32>` for a field enum: the variant a driver reports as the value, or the value
/// back when it is none of them.
macro_rules! decode_u32 {
    ($t:ident: $($v:ident),+) => {
        impl TryFrom<u32> for $t {
            type Error = u32;

            fn try_from(value: u32) -> Result<Self, u32> {
                [$(Self::$v),+].into_iter().find(|s| *s as u32 == value).ok_or(value)
            }
        }
    };
}

decode_u32!(ProbeState: Unsupported, NotStarted, InProgress, Complete);
decode_u32!(HealthSummary: NotSupported, Healthy, Unhealthy, LimitedCapacity);

/// Fabric caps bits (§5: "caps MC_SUPPORTED=bit0, MC_MULTINODE_SUPPORTED=bit1,
/// UC_LOOPBACK_SUPPORTED=bit2").
pub mod caps {
    /// Multicast (NVLS) objects can be created.
    pub const MC_SUPPORTED: u64 = 1 << 0;
    /// Multicast teams may span nodes.
    pub const MC_MULTINODE_SUPPORTED: u64 = 1 << 1;
    /// Unicast loopback through the switch.
    pub const UC_LOOPBACK_SUPPORTED: u64 = 1 << 2;
}

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

/// The health summary (§5 "healthSummary HEALTHY / UNHEALTHY / LIMITED_CAPACITY"; values 1, 2,
/// 3 and NOT_SUPPORTED 0 in `nvlink_inband_msg.h` and NVML).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[repr(u32)]
pub enum HealthSummary {
    /// Not reported.
    NotSupported = 0,
    /// Full bandwidth.
    Healthy = 1,
    /// No usable fabric connection.
    Unhealthy = 2,
    /// Working, below full bandwidth.
    LimitedCapacity = 3,
}

/// The FM's answer to one GPU's probe (§5: "clusterUuid, fabricPartitionId, cliqueId, FLA and
/// GPA ranges, health, caps").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProbeInfo {
    /// Probe state.
    pub state: ProbeState,
    /// Names the NVLink domain; equal for every GPU of it.
    pub cluster_uuid: [u8; 16],
    /// The fabric partition the GPU is in (`fabricPartitionId`, u16), if any.
    pub partition_id: Option<u16>,
    /// The GPUs that can do P2P with this one share its cliqueId; 0 outside any partition.
    pub clique_id: u32,
    /// First FLA address of the GPU's window.
    pub fla_base: u64,
    /// Size of the window.
    pub fla_range: u64,
    /// [`caps`] bits.
    pub caps: u64,
    /// Health fields.
    pub health_mask: HealthMask,
    /// Health summary.
    pub health_summary: HealthSummary,
}

/// The clusterUuid of the NVLink domain named `domain`: the first 16 bytes of
/// SHA-256("openimex-nvlink-domain" || domain), so every FM of the same domain name agrees and
/// different domains differ.
pub fn cluster_uuid(domain: &str) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(b"openimex-nvlink-domain\0");
    h.update(domain.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize()[..16]);
    out
}

/// A clusterUuid as 8-4-4-4-12 hex.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_the_driver() {
        assert_eq!(ProbeState::Complete as u32, 3);
        assert_eq!(ProbeState::NotStarted as u32, 1);
        assert_eq!(caps::MC_SUPPORTED | caps::MC_MULTINODE_SUPPORTED, 0b011);
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
        assert_eq!(HealthSummary::LimitedCapacity as u32, 3);
        for v in 0..4 {
            assert_eq!(ProbeState::try_from(v).map(|s| s as u32), Ok(v));
            assert_eq!(HealthSummary::try_from(v).map(|s| s as u32), Ok(v));
        }
        assert_eq!(ProbeState::try_from(4), Err(4));
    }

    #[test]
    fn cluster_uuid_is_deterministic_and_per_domain() {
        assert_eq!(cluster_uuid("nvl72"), cluster_uuid("nvl72"));
        assert_ne!(cluster_uuid("nvl72"), cluster_uuid("nvl36"));
        assert_ne!(cluster_uuid("nvl72"), [0; 16]);
        assert_eq!(uuid_string(&[0xab; 16]).len(), 36);
    }
}
