//! The words NVIDIA's tools print and parse: daemon states, connection states, domain status.
//! Their spelling is fixed by compatibility (`docs/reference/imex-guide.md` §2–§3); DCGM, the DRA driver and
//! Slurm prologs match on them.

use std::fmt;
use std::str::FromStr;

/// The daemon's own state, as `nvidia-imex-ctl -q` prints it. The order is DCGM's numbering
/// (field 1503).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DaemonState {
    /// Reading config, node file and node ID.
    Initializing,
    /// TLS / GSS set-up (only with auth enabled).
    StartingAuthServer,
    /// `IMEX_WAIT_FOR_QUORUM=FULL`: waiting until every peer is connected.
    WaitingForPeers,
    /// `IMEX_WAIT_FOR_QUORUM=RECOVERY` after an unclean exit: waiting for old importers.
    WaitingForRecovery,
    /// Opening the driver session and subscribing to GPU events.
    InitGpu,
    /// Serving.
    Ready,
    /// After SIGTERM/SIGINT/SIGQUIT.
    ShuttingDown,
    /// Not reachable (used for peers that cannot be asked).
    Unavailable,
}

impl DaemonState {
    /// Every state, in DCGM's numeric order.
    pub const ALL: [DaemonState; 8] = [
        Self::Initializing,
        Self::StartingAuthServer,
        Self::WaitingForPeers,
        Self::WaitingForRecovery,
        Self::InitGpu,
        Self::Ready,
        Self::ShuttingDown,
        Self::Unavailable,
    ];

    /// The word NVIDIA prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Initializing => "INITIALIZING",
            Self::StartingAuthServer => "STARTING_AUTH_SERVER",
            Self::WaitingForPeers => "WAITING_FOR_PEERS",
            Self::WaitingForRecovery => "WAITING_FOR_RECOVERY",
            Self::InitGpu => "INIT_GPU",
            Self::Ready => "READY",
            Self::ShuttingDown => "SHUTTING_DOWN",
            Self::Unavailable => "UNAVAILABLE",
        }
    }

    /// DCGM's number for the state (DCGM_FI_IMEX_DAEMON_STATUS).
    pub fn dcgm_code(self) -> i32 {
        match self {
            Self::Initializing => 0,
            Self::StartingAuthServer => 1,
            Self::WaitingForPeers => 2,
            Self::WaitingForRecovery => 3,
            Self::InitGpu => 4,
            Self::Ready => 5,
            Self::ShuttingDown => 6,
            Self::Unavailable => 7,
        }
    }
}

impl fmt::Display for DaemonState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word that is not one of the fixed vocabulary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {word:?}")]
pub struct UnknownWord {
    /// What vocabulary was expected.
    pub kind: &'static str,
    /// The word received.
    pub word: String,
}

impl FromStr for DaemonState {
    type Err = UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownWord {
                kind: "daemon state",
                word: s.to_string(),
            })
    }
}

/// Why two daemons refuse to talk to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mismatch {
    /// Node maps differ (`!M!`).
    NodeMap,
    /// Domain IDs differ although maps agree (configured `OPENIMEX_DOMAIN_ID`); shown as `!M!`.
    Domain,
    /// Protocol versions differ (`!V!`).
    Version,
    /// The peer at that address says it is a different node ID than its line says.
    WrongNode,
}

impl Mismatch {
    /// What a refusal with this reason means, for the refused side.
    pub fn describe(self) -> &'static str {
        match self {
            Self::NodeMap => "the peer refused our hello: its node map differs",
            Self::Domain => "the peer refused our hello: its domain ID differs",
            Self::Version => "the peer refused our hello: its protocol version differs",
            Self::WrongNode => {
                "the peer refused our hello: we are not the node it expects at this address"
            }
        }
    }
}

/// One cell of the connectivity matrix: how node `from` sees its link to node `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnStatus {
    /// No status available: the row's node could not be reached.
    Invalid,
    /// Never connected since this daemon started.
    NeverConnected,
    /// Lost; clean-up not triggered yet (grace time running or forever).
    Recovering,
    /// Lost and cleaned up, or the peer left with a goodbye.
    Disconnected,
    /// Mutual authentication in progress.
    Authenticating,
    /// Communication disabled: the peers disagree.
    Mismatch(Mismatch),
    /// Ready for operation.
    Connected,
}

impl ConnStatus {
    /// The JSON word (`-N -j`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Invalid => "INVALID",
            Self::NeverConnected => "NEVER_CONNECTED",
            Self::Recovering => "RECOVERING",
            Self::Disconnected => "DISCONNECTED",
            Self::Authenticating => "AUTHENTICATING",
            Self::Mismatch(Mismatch::NodeMap) => "NODE_MAP_MISMATCH",
            Self::Mismatch(Mismatch::Domain) => "DOMAIN_MISMATCH",
            Self::Mismatch(Mismatch::Version) => "VERSION_MISMATCH",
            Self::Mismatch(Mismatch::WrongNode) => "WRONG_NODE",
            Self::Connected => "CONNECTED",
        }
    }

    /// The matrix letter of the `-N` table legend.
    pub fn letter(self) -> &'static str {
        match self {
            Self::Invalid => "I",
            Self::NeverConnected => "N",
            Self::Recovering => "R",
            Self::Disconnected => "D",
            Self::Authenticating => "A",
            Self::Mismatch(Mismatch::Version) => "!V!",
            Self::Mismatch(_) => "!M!",
            Self::Connected => "C",
        }
    }

    /// The one-byte code of the state in the compact rows of the peer and command protocols
    /// (`LinkCode` in `peer.proto`): one byte per cell keeps a 1,000-node matrix at 1 MB.
    pub fn code(self) -> u8 {
        match self {
            Self::Invalid => 0,
            Self::NeverConnected => 1,
            Self::Recovering => 2,
            Self::Disconnected => 3,
            Self::Authenticating => 4,
            Self::Mismatch(Mismatch::NodeMap) => 5,
            Self::Mismatch(Mismatch::Domain) => 6,
            Self::Mismatch(Mismatch::Version) => 7,
            Self::Mismatch(Mismatch::WrongNode) => 8,
            Self::Connected => 9,
        }
    }

    /// Flag added to a cell's code when the link changed since the daemon started.
    pub const CHANGED_BIT: u8 = 0x80;

    /// One cell of a compact row: the state's code, plus [`Self::CHANGED_BIT`] if `changed`.
    pub fn cell(self, changed: bool) -> u8 {
        self.code() | if changed { Self::CHANGED_BIT } else { 0 }
    }

    /// A compact row's cell as (state, changed). A code this version does not know reads as
    /// INVALID ("no status available") rather than as a guess.
    pub fn from_cell(cell: u8) -> (Self, bool) {
        let code = cell & !Self::CHANGED_BIT;
        let status = Self::ALL
            .into_iter()
            .find(|c| c.code() == code)
            .unwrap_or(Self::Invalid);
        (status, cell & Self::CHANGED_BIT != 0)
    }

    /// Every state.
    pub const ALL: [ConnStatus; 10] = [
        Self::Invalid,
        Self::NeverConnected,
        Self::Recovering,
        Self::Disconnected,
        Self::Authenticating,
        Self::Mismatch(Mismatch::NodeMap),
        Self::Mismatch(Mismatch::Domain),
        Self::Mismatch(Mismatch::Version),
        Self::Mismatch(Mismatch::WrongNode),
        Self::Connected,
    ];
}

impl fmt::Display for ConnStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ConnStatus {
    type Err = UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownWord {
                kind: "connection status",
                word: s.to_string(),
            })
    }
}

/// The domain as a whole (DCGM_FI_IMEX_DOMAIN_STATUS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DomainStatus {
    /// Every node READY and every pair connected.
    Up,
    /// The local node is READY but some node or link is not.
    Degraded,
    /// The local node is not READY.
    Down,
}

impl DomainStatus {
    /// The word NVIDIA prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Up => "UP",
            Self::Degraded => "DEGRADED",
            Self::Down => "DOWN",
        }
    }
}

impl fmt::Display for DomainStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_dcgm_order() {
        for (i, s) in DaemonState::ALL.into_iter().enumerate() {
            assert_eq!(s.as_str().parse::<DaemonState>(), Ok(s));
            assert_eq!(usize::try_from(s.dcgm_code()).ok(), Some(i));
        }
        for c in ConnStatus::ALL {
            assert_eq!(c.as_str().parse::<ConnStatus>(), Ok(c));
            for changed in [false, true] {
                assert_eq!(ConnStatus::from_cell(c.cell(changed)), (c, changed));
            }
        }
        let codes: std::collections::BTreeSet<u8> =
            ConnStatus::ALL.into_iter().map(ConnStatus::code).collect();
        assert_eq!(codes.len(), ConnStatus::ALL.len(), "codes are distinct");
        assert_eq!(ConnStatus::from_cell(0x7f), (ConnStatus::Invalid, false));
        assert!("ready".parse::<DaemonState>().is_err());
        assert_eq!(ConnStatus::Mismatch(Mismatch::Version).letter(), "!V!");
        assert_eq!(ConnStatus::Mismatch(Mismatch::NodeMap).letter(), "!M!");
    }
}
