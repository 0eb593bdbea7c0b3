//! The GPU driver as the daemon sees it, shaped like the real kernel interface
//! (`docs/reference/driver-interface.md` §1.6): open a session with this node's ID, pull fabric
//! events (import, unimport), describe an export for a remote importer (taking a reference that
//! keeps the memory alive), validate or fail a pending import, finish unimports, disable
//! the importers of a lost node, and read each GPU's fabric probe (clique, bandwidth mode,
//! health).
//!
//! Backends:
//! - [`NoGpu`]: control plane only, for orchestrator CI. Peers see its version as `NO_GPU`,
//!   as NVIDIA's `--nogpu` mode reports. It never produces events.
//! - [`nvidia::Nvidia`]: NVIDIA's Resource Manager interface on `<driver root>/dev/nvidiactl`
//!   (open-gpu-kernel-modules, the driver versions of [`openimex_rmabi::SUPPORTED`]). The
//!   simulated GPU driver (`openimex-lab gpu`) serves the same interface on its node directory,
//!   so the daemon runs this one backend on a laptop and on a GB200.
//!
//! Also the IMEX channel files of a node ([`channels`]): creating them with tight permissions
//! (`openimex channels`, the simulated driver) and finding the ones open to every user.

#![deny(missing_docs)]

pub mod channels;
pub mod multicast;
pub mod nvidia;

use std::path::PathBuf;
use std::time::Duration;

use openimex_core::NodeId;
pub use openimex_core::gpu::{Event, GpuFabric, Pages, Status};

/// Which backend the daemon should use (`OPENIMEX_DRIVER`, or `--nogpu`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// Pick what is available on this host.
    Auto,
    /// Control plane only.
    NoGpu,
    /// NVIDIA's driver interface under this driver root (`/` on a GPU node, a simulated
    /// tray's node directory in tests).
    Nvidia(PathBuf),
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
    #[error("a daemon session is already open on this driver; stop the other daemon first")]
    SessionBusy,
    /// The driver refused a call with a status.
    #[error("the GPU driver refused {call}: {status:?} ({detail})")]
    Refused {
        /// The call.
        call: &'static str,
        /// Its status.
        status: Status,
        /// The driver's detail.
        detail: String,
    },
    /// The connection to the driver broke (the driver went away).
    #[error("lost the GPU driver: {0}")]
    Lost(String),
}

impl DriverError {
    /// The status to hand to a remote importer for this failure.
    pub fn status(&self) -> Status {
        match self {
            Self::Refused { status, .. } => *status,
            _ => Status::InvalidState,
        }
    }
}

/// What an open session reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// Driver version shown in `ctl -N` (`NO_GPU` for [`NoGpu`]).
    pub version: String,
}

/// The daemon's handle on its node's GPU driver. Calls block (run them off the async runtime).
///
/// An error from [`Driver::open_session`] is fatal for the daemon: it cannot serve imports
/// without a session. [`DriverError::Lost`] from any call means the driver went away: the
/// session is gone, and the daemon must stop (a restarted driver needs a new session).
pub trait Driver: Send + Sync + 'static {
    /// Backend name for logs.
    fn name(&self) -> &'static str;
    /// Opens the daemon session as node `node` (the driver's node ID is 0xFFFF until then).
    fn open_session(&self, node: NodeId) -> Result<SessionInfo, DriverError>;
    /// Waits up to `wait` for events and returns those queued (possibly none).
    fn next_events(&self, wait: Duration) -> Result<Vec<Event>, DriverError>;
    /// Exporter side: takes a reference on export (`uuid`, `index`) for an importer on
    /// `channel` and describes it. Returns the reference to release later.
    fn describe_export(
        &self,
        uuid: [u8; 16],
        index: u16,
        channel: u32,
    ) -> Result<(u64, Pages), DriverError>;
    /// Exporter side: drops a reference taken by [`Driver::describe_export`].
    fn release_export_ref(&self, export_ref: u64) -> Result<(), DriverError>;
    /// Importer side: completes the import `event_id` with pages, or fails it with a status.
    fn validate_import(
        &self,
        event_id: u64,
        result: Result<Pages, Status>,
    ) -> Result<(), DriverError>;
    /// Importer side: acknowledges unimports, waking the blocked releasers.
    fn finish_unimport(&self, ids: &[u64]) -> Result<(), DriverError>;
    /// Disables every local client that imported from `node` (lost node clean-up).
    fn disable_importers(&self, node: NodeId) -> Result<(), DriverError>;
    /// Each local GPU's fabric probe (NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO per GPU, with
    /// the bandwidth mode). Needs no session. A driver without GPUs has none.
    fn gpu_fabric(&self) -> Result<Vec<GpuFabric>, DriverError> {
        Ok(Vec::new())
    }
    /// Owner side (multicast): ATTACH_REMOTE_GPU of the GPU of node `from` in `attach` to the
    /// prime object of `attach.export_uuid` (which fails the prime itself on most refusals).
    /// Backends without multicast refuse it (NOT_SUPPORTED, reported as `Other`).
    fn attach_remote_gpu(
        &self,
        from: NodeId,
        attach: &multicast::RemoteGpuAttach,
    ) -> Result<(), DriverError> {
        let _ = (from, attach);
        Err(no_multicast("attach remote GPU"))
    }
    /// Owner side (multicast): SET_FAILURE on the prime object at `index` of `export_uuid`
    /// (reached through a dup of its export on the importer's `channel`), after an error on the way to
    /// ATTACH_REMOTE_GPU, so that every member learns the team failed.
    fn set_multicast_failure(
        &self,
        export_uuid: [u8; 16],
        index: u16,
        channel: u32,
        status: Status,
    ) -> Result<(), DriverError> {
        let _ = (export_uuid, index, channel, status);
        Err(no_multicast("set multicast failure"))
    }
    /// The descriptor events arrive on, if this backend has one (the real driver's event fd):
    /// the daemon then waits for it on its runtime, asking with [`Driver::request_events`] and
    /// reading with [`Driver::take_events`] when it is readable, instead of a thread of its own
    /// blocked in [`Driver::next_events`] handing each batch over (one wake-up fewer per
    /// event). `None`, the default: [`Driver::next_events`] only. Valid while `self` lives.
    fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// Whether every call returns at once, waiting for nothing outside this process (no GPU,
    /// no driver to ask): the daemon then makes them on its runtime thread rather than
    /// handing them to a worker thread and waiting to be told.
    fn answers_at_once(&self) -> bool {
        false
    }
    /// Asks for the events queued within `wait`; the answer makes [`Driver::event_fd`]
    /// readable. Never blocks for the answer. Only for a backend with an event descriptor.
    fn request_events(&self, wait: Duration) -> Result<(), DriverError> {
        let _ = wait;
        Err(DriverError::Lost(
            "this driver has no event descriptor to wait on".into(),
        ))
    }
    /// The answer to the last [`Driver::request_events`] if it has arrived (`None`: not yet;
    /// wait for the descriptor again). Never blocks waiting for it.
    fn take_events(&self) -> Result<Option<Vec<Event>>, DriverError> {
        Ok(None)
    }
}

/// A backend without multicast objects refuses their controls.
fn no_multicast(call: &'static str) -> DriverError {
    DriverError::Refused {
        call,
        status: Status::Other,
        detail: "this GPU driver backend has no multicast objects".into(),
    }
}

/// The control-plane-only driver: no GPU, no fabric events.
#[derive(Debug, Default)]
pub struct NoGpu {
    session: std::sync::Mutex<bool>,
}

impl Driver for NoGpu {
    fn name(&self) -> &'static str {
        "nogpu"
    }

    fn open_session(&self, _node: NodeId) -> Result<SessionInfo, DriverError> {
        let mut open = self
            .session
            .lock()
            .map_err(|_| DriverError::Lost("poisoned".into()))?;
        if *open {
            return Err(DriverError::SessionBusy);
        }
        *open = true;
        Ok(SessionInfo {
            version: "NO_GPU".to_string(),
        })
    }

    fn next_events(&self, wait: Duration) -> Result<Vec<Event>, DriverError> {
        std::thread::sleep(wait);
        Ok(Vec::new())
    }

    fn answers_at_once(&self) -> bool {
        true
    }

    fn describe_export(&self, _: [u8; 16], _: u16, _: u32) -> Result<(u64, Pages), DriverError> {
        Err(DriverError::Refused {
            call: "describe",
            status: Status::ObjectNotFound,
            detail: "no GPU on this node".into(),
        })
    }

    fn release_export_ref(&self, _: u64) -> Result<(), DriverError> {
        Ok(())
    }

    fn validate_import(&self, _: u64, _: Result<Pages, Status>) -> Result<(), DriverError> {
        Ok(())
    }

    fn finish_unimport(&self, _: &[u64]) -> Result<(), DriverError> {
        Ok(())
    }

    fn disable_importers(&self, _: NodeId) -> Result<(), DriverError> {
        Ok(())
    }
}

/// Opens the backend the operator asked for. `Auto` is `nvidia` on the default driver root
/// (`OPENIMEX_DRIVER_ROOT`, else `/`), failing as it does when there is no driver there.
pub fn open(backend: &Backend) -> Result<Box<dyn Driver>, DriverError> {
    match backend {
        Backend::NoGpu => Ok(Box::new(NoGpu::default())),
        Backend::Nvidia(root) => Ok(Box::new(nvidia::Nvidia::open(root)?)),
        Backend::Auto => Ok(Box::new(nvidia::Nvidia::open(
            &nvidia::files::driver_root(None),
        )?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nogpu_has_one_session_slot() {
        let d = open(&Backend::NoGpu).unwrap();
        assert_eq!(d.open_session(NodeId(3)).unwrap().version, "NO_GPU");
        assert!(matches!(
            d.open_session(NodeId(3)),
            Err(DriverError::SessionBusy)
        ));
    }

    /// No driver under the root: the error names `/dev/nvidiactl` under it and what to
    /// install, at once (no retry, no wait).
    #[test]
    fn no_driver_names_nvidiactl_and_what_to_install() {
        let root = std::path::Path::new("/nonexistent/openimex-root");
        let t = std::time::Instant::now();
        let e = open(&Backend::Nvidia(root.into()))
            .err()
            .unwrap()
            .to_string();
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert!(
            e.contains("/nonexistent/openimex-root/dev/nvidiactl does not exist")
                && e.contains("install the NVIDIA GPU driver")
                && e.contains("OPENIMEX_DRIVER=nogpu"),
            "{e}"
        );
    }
}
