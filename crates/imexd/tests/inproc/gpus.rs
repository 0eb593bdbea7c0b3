//! A GPU driver for the in-process layer: the daemon's side of the driver interface with GPUs
//! whose fabric probes the test sets and CLIQUE_ID_CHANGE events it posts
//! (`docs/reference/driver-interface.md` §1.6 "Other events", §5), answered at once on the
//! daemon's runtime thread so virtual time stays exact. Events arrive as the real driver's do:
//! its event descriptor turns readable and the daemon takes the queue. Its import path is the
//! least the daemon's lifecycle needs: exports the test names are described with one page, and
//! the test posts MEM_IMPORT events and reads back what each was validated with; the driver's
//! own import semantics are the simulated driver's (`crates/simgpu`, and the real processes'
//! tests in `tests/e2e`). Everything else is the `nogpu` driver's.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openimex_core::{Event, GpuFabric, NodeId, Pages, Status};
use openimex_driver::{Driver, DriverError, SessionInfo};

struct Shared {
    gpus: Mutex<Vec<GpuFabric>>,
    events: Mutex<Vec<Event>>,
    /// The event descriptor (polled by the daemon) and the end the driver posts on.
    polled: UnixStream,
    posted: UnixStream,
    /// The calls that are not about the GPUs' probes or events.
    nogpu: openimex_driver::NoGpu,
    /// Probe reads so far.
    reads: Mutex<u64>,
    /// Exports the test made (UUID, index), and describes taken of them so far.
    exports: Mutex<Vec<([u8; 16], u16)>>,
    describes: Mutex<u64>,
    /// Import event → whether it was validated with pages (`false`: failed).
    validated: Mutex<std::collections::BTreeMap<u64, bool>>,
}

/// The test's handle on a node's GPUs.
#[derive(Clone)]
pub(crate) struct Gpus(Arc<Shared>);

/// A healthy GPU whose probe completed, in `clique_id`.
pub(crate) fn gpu(gpu: u32, clique_id: u32) -> GpuFabric {
    GpuFabric {
        gpu,
        state: "COMPLETED".into(),
        cluster_uuid: "00000000000000000000000000000001".into(),
        clique_id,
        health_summary: "HEALTHY".into(),
        ..GpuFabric::default()
    }
}

impl Gpus {
    /// A node with these GPUs.
    pub(crate) fn new(gpus: Vec<GpuFabric>) -> Self {
        let (polled, posted) = UnixStream::pair().expect("a socket pair");
        polled.set_nonblocking(true).expect("non-blocking");
        // A post that finds the socket full finds it readable already: the daemon takes every
        // queued event at its next read (and the test, on the daemons' thread, must not block).
        posted.set_nonblocking(true).expect("non-blocking");
        Self(Arc::new(Shared {
            gpus: Mutex::new(gpus),
            events: Mutex::new(Vec::new()),
            polled,
            posted,
            nogpu: openimex_driver::NoGpu::default(),
            reads: Mutex::new(0),
            exports: Mutex::new(Vec::new()),
            describes: Mutex::new(0),
            validated: Mutex::new(std::collections::BTreeMap::new()),
        }))
    }

    /// The driver to hand a daemon.
    pub(crate) fn driver(&self) -> Box<dyn Driver> {
        Box::new(GpuDriver(Arc::clone(&self.0)))
    }

    /// A probe update moves `gpu` to `clique_id`; with `event`, the driver posts
    /// CLIQUE_ID_CHANGE to the daemon's session (otherwise only a read of the probe sees it).
    pub(crate) fn move_gpu(&self, gpu: u32, clique_id: u32, event: bool) {
        let mut gpus = self.0.gpus.lock().expect("gpus");
        if let Some(g) = gpus.iter_mut().find(|g| g.gpu == gpu) {
            g.clique_id = clique_id;
        }
        if event {
            (self.0.events.lock().expect("events")).push(Event::CliqueIdChange { gpu, clique_id });
            self.post();
        }
    }

    /// Makes the event descriptor readable (the driver's OS event).
    fn post(&self) {
        match (&self.0.posted).write(&[1]) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("post the OS event: {e}"),
        }
    }

    /// The fabric health of `gpu` changes (no event: the daemon sees it on its next read).
    pub(crate) fn set_health(&self, gpu: u32, summary: &str, mask: u32) {
        let mut gpus = self.0.gpus.lock().expect("gpus");
        if let Some(g) = gpus.iter_mut().find(|g| g.gpu == gpu) {
            g.health_summary = summary.into();
            g.health_mask = mask;
        }
    }

    /// An application on this node exports memory under `uuid` (index 0).
    pub(crate) fn export(&self, uuid: [u8; 16]) {
        self.0.exports.lock().expect("exports").push((uuid, 0));
    }

    /// An application on this node imports `uuid` (index 0) of node `from`: MEM_IMPORT
    /// `event_id` is posted to the daemon.
    pub(crate) fn import(&self, event_id: u64, uuid: [u8; 16], from: NodeId) {
        self.import_on(0, event_id, uuid, from);
    }

    /// [`Gpus::import`] by an application subscribed to IMEX channel `channel`.
    pub(crate) fn import_on(&self, channel: u32, event_id: u64, uuid: [u8; 16], from: NodeId) {
        (self.0.events.lock().expect("events")).push(Event::Import {
            event_id,
            channel,
            export_uuid: uuid,
            index: 0,
            export_node: from,
        });
        self.post();
    }

    /// Describes the daemon took of this node's exports for its peers.
    pub(crate) fn describes(&self) -> u64 {
        *self.0.describes.lock().expect("describes")
    }

    /// Whether import `event_id` was validated, with pages (`Some(true)`) or refused.
    pub(crate) fn validated_one(&self, event_id: u64) -> Option<bool> {
        self.0
            .validated
            .lock()
            .expect("validated")
            .get(&event_id)
            .copied()
    }

    /// Import events validated so far, and how many of them with pages.
    pub(crate) fn validated(&self) -> (usize, usize) {
        let v = self.0.validated.lock().expect("validated");
        (v.len(), v.values().filter(|ok| **ok).count())
    }

    /// How many times the daemon read the probes.
    pub(crate) fn reads(&self) -> u64 {
        *self.0.reads.lock().expect("reads")
    }
}

struct GpuDriver(Arc<Shared>);

impl Driver for GpuDriver {
    fn name(&self) -> &'static str {
        "inproc-gpus"
    }

    fn open_session(&self, node: NodeId) -> Result<SessionInfo, DriverError> {
        self.0.nogpu.open_session(node)
    }

    fn next_events(&self, _wait: Duration) -> Result<Vec<Event>, DriverError> {
        Ok(std::mem::take(&mut *self.0.events.lock().expect("events")))
    }

    fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.0.polled.as_raw_fd())
    }

    fn answers_at_once(&self) -> bool {
        true
    }

    fn request_events(&self, _wait: Duration) -> Result<(), DriverError> {
        Ok(())
    }

    fn take_events(&self) -> Result<Option<Vec<Event>>, DriverError> {
        let mut buf = [0u8; 64];
        while matches!((&self.0.polled).read(&mut buf), Ok(n) if n > 0) {}
        let events = std::mem::take(&mut *self.0.events.lock().expect("events"));
        Ok((!events.is_empty()).then_some(events))
    }

    fn describe_export(&self, u: [u8; 16], i: u16, c: u32) -> Result<(u64, Pages), DriverError> {
        if !self.0.exports.lock().expect("exports").contains(&(u, i)) {
            return self.0.nogpu.describe_export(u, i, c);
        }
        let mut n = self.0.describes.lock().expect("describes");
        *n += 1;
        let pages = Pages {
            size: 2 << 20,
            page_size: 2 << 20,
            pfns: vec![*n],
            clique_id: 1,
            bw_mode: 0,
            bw_mode_epoch: 0,
            kind: 0,
            phys_addr_space: 0,
            compression_coverage: 0,
            mem_flags: 0,
        };
        Ok((*n, pages))
    }

    fn release_export_ref(&self, export_ref: u64) -> Result<(), DriverError> {
        self.0.nogpu.release_export_ref(export_ref)
    }

    fn validate_import(&self, id: u64, result: Result<Pages, Status>) -> Result<(), DriverError> {
        (self.0.validated.lock().expect("validated")).insert(id, result.is_ok());
        Ok(())
    }

    fn finish_unimport(&self, ids: &[u64]) -> Result<(), DriverError> {
        self.0.nogpu.finish_unimport(ids)
    }

    fn disable_importers(&self, node: NodeId) -> Result<(), DriverError> {
        self.0.nogpu.disable_importers(node)
    }

    fn gpu_fabric(&self) -> Result<Vec<GpuFabric>, DriverError> {
        *self.0.reads.lock().expect("reads") += 1;
        Ok(self.0.gpus.lock().expect("gpus").clone())
    }
}
