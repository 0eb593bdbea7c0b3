//! NVLink in-band messages between a tray's GPU driver and the domain's Fabric Manager (FM).
//!
//! On a real rack each GPU's RM talks to the Global Fabric Manager over NVLink in-band
//! messages (`nvlink_inband_msg.h`): GPU_PROBE_REQ / GPU_PROBE_RSP when the driver loads, the
//! FM's probe updates when a partition or the fabric's health changes (a changed cliqueId makes
//! the driver post CLIQUE_ID_CHANGE to its daemon), and MC_TEAM_SETUP_REQ / _RSP for multicast
//! teams (`docs/reference/driver-interface.md` §1.6 "Multicast" step 5, §5). The IMEX daemons are
//! never on this path: the FM answers every participating driver directly.
//!
//! Here the "NVLink" is a unix stream socket in the fabric directory that every tray shares
//! ([`fm_socket_path`]), served by `openimex-lab fabric serve`. Each tray's driver keeps one
//! connection to it: it sends [`ToFm::Attach`] first and then whatever it needs; the FM sends
//! [`FromFm`] messages at any time (answers and unsolicited updates alike). The framing is the
//! driver protocol's (`proto::send` and `proto::recv`, whose module depends on this one for
//! the multicast types, not the other way round), with no descriptors; the integration test
//! `tests/inband_framing.rs` sends messages of both directions through it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::probe::ProbeInfo;

/// The FM's in-band socket's file name in the fabric directory.
pub const FM_SOCKET_FILE: &str = "fabric-manager.sock";

/// The in-band socket of the FM serving the fabric directory `fabric_dir`.
pub fn fm_socket_path(fabric_dir: &Path) -> PathBuf {
    fabric_dir.join(FM_SOCKET_FILE)
}

/// One GPU of the NVLink domain: the tray's slot (the driver's `--slot`, the compute tray's
/// position in the domain) and the GPU's index on that tray.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FabricGpu {
    /// The tray's slot.
    pub slot: u16,
    /// GPU index on the tray.
    pub gpu: u32,
}

/// A driver's message to the FM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToFm {
    /// First message of a connection: the tray at `slot` with `gpus` GPUs is up; it stands for
    /// GPU_PROBE_REQ of each of its GPUs. The FM answers with one [`FromFm::Probe`] per GPU, or
    /// [`FromFm::Refused`] (and closes) when the topology has no such tray or GPU count.
    Attach {
        /// The tray's slot.
        slot: u16,
        /// GPUs the driver has.
        gpus: u32,
    },
    /// MC_TEAM_SETUP_REQ: the multicast object's prime driver sends it once the last of its
    /// `members` attached (§1.6 step 5). The FM answers every member's driver with
    /// [`FromFm::McTeam`] (the same `team_key`), including this one.
    McTeamSetup {
        /// Names the team in the answer: unique per request from this driver (the prime's
        /// export UUID in hex is a good choice).
        team_key: String,
        /// Bytes of the multicast object.
        size: u64,
        /// Every GPU that attached, the prime's own included.
        members: Vec<FabricGpu>,
    },
    /// MC_TEAM_RELEASE_REQ: the team's object is freed; the FM forgets its address range.
    McTeamRelease {
        /// The team's handle from [`FromFm::McTeam`].
        team_handle: u64,
    },
    /// The prime object failed (SET_FAILURE, a refused remote attach) while remote GPUs had
    /// attached: the FM answers each of `members`' drivers with [`FromFm::McTeam`] carrying
    /// `Err(reason)` and the same `team_key`, so that the failure reaches every member.
    McTeamFailed {
        /// The team's key (the prime's export UUID in hex).
        team_key: String,
        /// The remote GPUs that attached so far, or the one whose attach was refused.
        members: Vec<FabricGpu>,
        /// The failure (its status name first).
        reason: String,
    },
}

/// The FM's message to a driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromFm {
    /// GPU_PROBE_RSP, and later the FM's probe updates for the same GPU: the probe is COMPLETE
    /// with this answer, which replaces any earlier one.
    Probe {
        /// GPU index on the tray.
        gpu: u32,
        /// The answer.
        info: ProbeInfo,
    },
    /// The attach was refused (e.g. the topology has no tray at that slot); the connection
    /// closes after it and the probes stay where they were.
    Refused {
        /// Why, for the driver's log.
        reason: String,
    },
    /// MC_TEAM_SETUP_RSP, sent to every member's driver.
    McTeam {
        /// The request's key.
        team_key: String,
        /// Every member of the team (so each driver finds its own GPUs in it).
        members: Vec<FabricGpu>,
        /// The outcome: `Ok` with the team, or the FM's reason for refusing it.
        result: Result<McTeam, String>,
    },
}

/// A multicast team the FM set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct McTeam {
    /// The team's handle (names it in [`ToFm::McTeamRelease`]).
    pub team_handle: u64,
    /// First address of the team's multicast range.
    pub address_base: u64,
    /// Bytes of the range.
    pub address_size: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_lives_in_the_fabric_directory() {
        assert_eq!(
            fm_socket_path(Path::new("/f")),
            PathBuf::from("/f/fabric-manager.sock")
        );
    }
}
