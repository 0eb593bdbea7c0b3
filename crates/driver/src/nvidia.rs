//! The `nvidia` backend: the daemon's side of NVIDIA's Resource Manager (RM) interface on
//! `/dev/nvidiactl`, run exactly as `docs/reference/driver-interface.md` §1.6 describes it.
//!
//! Start ([`Nvidia::open`], module `start`): open `<root>/dev/nvidiactl`, the version check
//! (a version outside [`openimex_rmabi::SUPPORTED`] is refused), a root client, a Device and
//! a Subdevice per GPU, the fabric-imex-mgmt capability, an OS event. The session
//! ([`Driver::open_session`]): NV_IMEX_SESSION with this node's ID. Then the OS event is
//! polled and GET_FABRIC_EVENTS drained until `bMoreEvents` is false (module `events`); the
//! exporter's side (dup by UUID, IMPORT_MEM, DESCRIBE in chunks of 512, the dups kept per
//! remote import; ATTACH_REMOTE_GPU / SET_FAILURE for multicast) is module `exporter`, the
//! importer's (IMPORTED_REF, VALIDATE in chunks or IMPORT_FAILED, FINISH_MEM_UNIMPORT in
//! batches of 256, DISABLE_IMPORTERS) module `importer`.
//!
//! Every path is under a driver root (`OPENIMEX_DRIVER_ROOT`, default `/`, module [`files`]).
//! The bytes go through [`transport::Ctl`]: `ioctl(2)` on the kernel's device, or the same
//! escapes over the simulated driver's socket when the root is a simulated tray's node
//! directory — the rest of this module is the same code for both.

pub mod check;
pub mod files;
pub mod rm;
pub mod transport;

mod events;
mod exporter;
mod importer;
mod start;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use openimex_core::NodeId;
use openimex_rmabi::{Layout, NvHandle};

use crate::multicast::RemoteGpuAttach;
use crate::{Driver, DriverError, Event, GpuFabric, Pages, SessionInfo, Status};
use rm::{RmClient, RmError};

pub use start::StartError;

/// One local GPU as the daemon's client holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Its index on this node (the order of the driver's probed IDs).
    pub index: u32,
    /// The RM's GPU ID.
    pub gpu_id: u32,
    /// Its device instance (NV0080 `deviceId`).
    pub device_instance: u32,
    /// The client's Device.
    pub device: NvHandle,
    /// The client's Subdevice.
    pub subdevice: NvHandle,
}

/// The import an IMPORTED_REF is allocated for: what a MEM_IMPORT event named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ImportKey {
    uuid: [u8; 16],
    index: u16,
    import_id: u64,
}

/// The daemon's dups for one remote import (§1.6 "Daemon A" 4): the export object and the
/// fabric memory under the parent IMPORT_MEM chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dup {
    export: NvHandle,
    memory: NvHandle,
    memory_parent: NvHandle,
}

/// The `nvidia` backend on one driver root.
#[derive(Debug)]
pub struct Nvidia {
    rm: RmClient,
    root: PathBuf,
    layout: Layout,
    version: String,
    gpus: Vec<Gpu>,
    /// The GPUs' fabric probes read with their attach at the start, for the first read
    /// ([`Driver::gpu_fabric`]: the daemon's, just after), which then costs no call.
    start_probes: Mutex<Option<Vec<GpuFabric>>>,
    /// `<root>/dev/nvidiaN`, held open (never read) for as long as the client lives.
    _gpu_files: Vec<OwnedFd>,
    event: transport::OsEvent,
    cap: OwnedFd,
    session: Mutex<Option<NvHandle>>,
    /// MEM_IMPORT events not validated yet, by event ID.
    imports: Mutex<HashMap<u64, ImportKey>>,
    /// Export references handed to the daemon, by reference.
    dups: Mutex<HashMap<u64, Dup>>,
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>, DriverError> {
    m.lock()
        .map_err(|_| DriverError::Lost("nvidia backend lock poisoned".into()))
}

impl Nvidia {
    /// Runs the start-up of §1.6 (steps 1–4) on the driver under `root`.
    pub fn open(root: &Path) -> Result<Self, DriverError> {
        start::open(root).map_err(StartError::into_driver_error)
    }

    /// The driver's version string.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The layout family of that version.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The GPUs found.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// The driver root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// "kernel" or "sim": which transport reaches the driver.
    pub fn transport(&self) -> &'static str {
        self.rm.ctl().kind()
    }

    fn session(&self) -> Result<NvHandle, DriverError> {
        lock(&self.session)?.ok_or_else(|| DriverError::Refused {
            call: "control",
            status: Status::InvalidState,
            detail: "no IMEX session open".into(),
        })
    }

    /// Waits up to `wait` for the OS event, then drains the queue if it fired.
    fn wait_and_drain(&self, wait: Duration) -> Result<Vec<Event>, DriverError> {
        let ready = self
            .rm
            .ctl()
            .wait_event(&self.event, wait)
            .map_err(|e| DriverError::Lost(e.to_string()))?;
        if ready { self.drain() } else { Ok(Vec::new()) }
    }
}

/// An RM error as the daemon's: a transport that broke is the driver lost.
fn error(call: &'static str, e: RmError) -> DriverError {
    match e {
        RmError::Transport(t @ transport::TransportError::Lost { .. }) => {
            DriverError::Lost(t.to_string())
        }
        RmError::Status { status, .. } => DriverError::Refused {
            call,
            status: status_of(status),
            detail: e.to_string(),
        },
        other => DriverError::Refused {
            call,
            status: Status::Other,
            detail: other.to_string(),
        },
    }
}

/// The RM status as the daemon's [`Status`] (the statuses it acts on; the rest are `Other`).
fn status_of(code: u32) -> Status {
    use openimex_rmabi::status::*;
    match code {
        NV_ERR_INSUFFICIENT_PERMISSIONS => Status::InsufficientPermissions,
        NV_ERR_OBJECT_NOT_FOUND => Status::ObjectNotFound,
        NV_ERR_INVALID_STATE => Status::InvalidState,
        NV_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
        _ => Status::Other,
    }
}

/// The daemon's [`Status`] as the RM status SET_FAILURE carries (`Other` is NV_ERR_GENERIC:
/// the daemon knows no better).
fn nv_status(s: Status) -> u32 {
    use openimex_rmabi::status::*;
    match s {
        Status::InsufficientPermissions => NV_ERR_INSUFFICIENT_PERMISSIONS,
        Status::ObjectNotFound => NV_ERR_OBJECT_NOT_FOUND,
        Status::InvalidState => NV_ERR_INVALID_STATE,
        Status::InvalidArgument => NV_ERR_INVALID_ARGUMENT,
        Status::Other => NV_ERR_GENERIC,
    }
}

impl Driver for Nvidia {
    fn name(&self) -> &'static str {
        "nvidia"
    }

    fn open_session(&self, node: NodeId) -> Result<SessionInfo, DriverError> {
        let mut session = lock(&self.session)?;
        if session.is_some() {
            return Err(DriverError::SessionBusy);
        }
        *session = Some(start::open_session(self, node)?);
        Ok(SessionInfo {
            version: self.version.clone(),
        })
    }

    fn next_events(&self, wait: Duration) -> Result<Vec<Event>, DriverError> {
        self.session()?;
        self.wait_and_drain(wait)
    }

    fn describe_export(
        &self,
        uuid: [u8; 16],
        index: u16,
        channel: u32,
    ) -> Result<(u64, Pages), DriverError> {
        exporter::describe(self, uuid, index, channel)
    }

    fn release_export_ref(&self, export_ref: u64) -> Result<(), DriverError> {
        exporter::release(self, export_ref)
    }

    fn validate_import(
        &self,
        event_id: u64,
        result: Result<Pages, Status>,
    ) -> Result<(), DriverError> {
        importer::validate(self, event_id, result)
    }

    fn finish_unimport(&self, ids: &[u64]) -> Result<(), DriverError> {
        importer::finish(self, ids)
    }

    fn disable_importers(&self, node: NodeId) -> Result<(), DriverError> {
        importer::disable(self, node)
    }

    fn gpu_fabric(&self) -> Result<Vec<GpuFabric>, DriverError> {
        if let Some(probes) = lock(&self.start_probes)?.take() {
            return Ok(probes);
        }
        start::probe_all(self)
    }

    fn attach_remote_gpu(&self, from: NodeId, attach: &RemoteGpuAttach) -> Result<(), DriverError> {
        exporter::attach_remote_gpu(self, from, attach)
    }

    fn set_multicast_failure(
        &self,
        export_uuid: [u8; 16],
        index: u16,
        channel: u32,
        status: Status,
    ) -> Result<(), DriverError> {
        exporter::set_failure(self, export_uuid, index, channel, status)
    }

    fn event_fd(&self) -> Option<RawFd> {
        Some(self.event.poll.as_raw_fd())
    }

    fn request_events(&self, _wait: Duration) -> Result<(), DriverError> {
        // The driver posts the OS event itself: nothing to ask for.
        Ok(())
    }

    fn take_events(&self) -> Result<Option<Vec<Event>>, DriverError> {
        self.rm
            .ctl()
            .consume_event(&self.event)
            .map_err(|e| DriverError::Lost(e.to_string()))?;
        let events = self.drain()?;
        Ok((!events.is_empty()).then_some(events))
    }
}
