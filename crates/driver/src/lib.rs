//! The GPU driver as the daemon sees it, shaped like the real kernel interface
//! (`reference/driver-interface.md`): open a session with this node's ID, then (with the
//! export/import work) a stream of fabric events and the controls that answer them.
//!
//! Backends:
//! - [`NoGpu`]: control plane only, for orchestrator CI. Peers see its version as `NO_GPU`,
//!   as NVIDIA's `--nogpu` mode reports.
//! - `sim` (the simulated GPU driver) and `nvidia` (open-gpu-kernel-modules) arrive with later
//!   work; selecting them today fails with [`DriverError::Unavailable`] saying what to use.

#![deny(missing_docs)]

use openimex_core::NodeId;

/// Which backend the daemon should use (`OPENIMEX_DRIVER`, or `--nogpu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Pick what is available on this host.
    Auto,
    /// Control plane only.
    NoGpu,
    /// The simulated GPU driver.
    Sim,
    /// NVIDIA's kernel driver.
    Nvidia,
}

/// Errors of the driver interface.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The requested backend cannot be used on this host or in this build.
    #[error("GPU driver backend {backend} is not available: {reason}; {fix}")]
    Unavailable {
        /// Backend name.
        backend: &'static str,
        /// Why.
        reason: String,
        /// What the operator can do.
        fix: &'static str,
    },
    /// A session is already open (the driver has one daemon slot per node).
    #[error(
        "a daemon session is already open on this driver (node {node}); stop the other daemon first"
    )]
    SessionBusy {
        /// Node ID of the open session.
        node: NodeId,
    },
}

/// What an open session reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// Driver version shown in `ctl -N` (`NO_GPU` for [`NoGpu`]).
    pub version: String,
}

/// The daemon's handle on its node's GPU driver.
///
/// An error from [`Driver::open_session`] is fatal for the daemon: it cannot serve imports
/// without a session, so it exits non-zero with the error.
pub trait Driver: Send + 'static {
    /// Backend name for logs.
    fn name(&self) -> &'static str;
    /// Opens the daemon session as node `node` (the driver's node ID stays 0xFFFF until then).
    fn open_session(&mut self, node: NodeId) -> Result<SessionInfo, DriverError>;
}

/// The control-plane-only driver: no GPU, no fabric events.
#[derive(Debug, Default)]
pub struct NoGpu {
    session: Option<NodeId>,
}

impl Driver for NoGpu {
    fn name(&self) -> &'static str {
        "nogpu"
    }

    fn open_session(&mut self, node: NodeId) -> Result<SessionInfo, DriverError> {
        if let Some(open) = self.session {
            return Err(DriverError::SessionBusy { node: open });
        }
        self.session = Some(node);
        Ok(SessionInfo {
            version: "NO_GPU".to_string(),
        })
    }
}

const CHOOSE: &str = "set OPENIMEX_DRIVER=nogpu in the config (or pass --nogpu) to run the control plane without GPUs";

/// Opens the backend the operator asked for.
pub fn open(backend: Backend) -> Result<Box<dyn Driver>, DriverError> {
    match backend {
        Backend::NoGpu => Ok(Box::new(NoGpu::default())),
        Backend::Sim => Err(DriverError::Unavailable {
            backend: "sim",
            reason: "the simulated GPU driver is not part of this build yet".to_string(),
            fix: CHOOSE,
        }),
        Backend::Nvidia => Err(DriverError::Unavailable {
            backend: "nvidia",
            reason: "this build has no NVIDIA kernel driver backend".to_string(),
            fix: CHOOSE,
        }),
        Backend::Auto => Err(DriverError::Unavailable {
            backend: "auto",
            reason: "no GPU driver found on this host (no NVIDIA driver backend, no simulated driver configured)"
                .to_string(),
            fix: CHOOSE,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nogpu_has_one_session_slot() {
        let mut d = open(Backend::NoGpu).unwrap();
        assert_eq!(d.open_session(NodeId(3)).unwrap().version, "NO_GPU");
        assert!(matches!(
            d.open_session(NodeId(3)),
            Err(DriverError::SessionBusy { .. })
        ));
    }

    #[test]
    fn unavailable_backends_say_how_to_choose() {
        for b in [Backend::Auto, Backend::Sim, Backend::Nvidia] {
            let e = open(b).err().unwrap().to_string();
            assert!(
                e.contains("OPENIMEX_DRIVER=nogpu") && e.contains("--nogpu"),
                "{e}"
            );
        }
    }
}
