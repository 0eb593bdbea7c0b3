//! The GPU fabric probe: its numeric encodings and the Fabric Manager's per-GPU answer.
//!
//! The values are those of NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO and of the FM's in-band
//! probe response (docs/reference/driver-interface.md §5; field layout in the driver's `nvlink_inband_msg.h`),
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

pub use openimex_rmabi::health::{Flag, HealthField, HealthMask, IncorrectConfiguration};

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
