//! The GPU driver's threads. Driver calls block, so none runs on the async runtime:
//! - one *worker* thread performs the engine's driver calls in the order the engine asked for
//!   them (so a release precedes its acknowledgement, a validate precedes the unimport it
//!   deferred) and posts each result back to the engine;
//! - [`DESCRIBERS`] *describer* threads take the describes (an exporter's reference and page
//!   list for a peer's import), which depend on nothing else queued: in an import storm they run
//!   at once instead of one driver round trip after another. Order does not matter for them
//!   because the core node settles a describe that finishes late (its importer gone, cancelled,
//!   or the daemon stopping) by releasing the reference it took;
//! - one *event pump* thread, started once the session is open, long-polls the driver for
//!   fabric events and posts them.
//!
//! Any error is posted as [`DriverInput::Failed`]; the engine stops the daemon on
//! [`DriverError::Lost`], as the `Driver` trait requires.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use openimex_core::{ImportError, NodeId, Pages, Status};
use openimex_driver::{Driver, DriverError};
use tokio::sync::mpsc;

use crate::mailbox::{DriverInput, Input};

/// How long the event pump waits in one long-poll (bounds how long it outlives a stop).
const EVENT_POLL: Duration = Duration::from_millis(500);

/// Describes in flight at once (the simulated driver keeps a control connection for each, and
/// one for the worker).
pub(crate) const DESCRIBERS: usize = 4;

/// A call for the worker.
pub(crate) enum Call {
    /// Open the daemon session as `node`; on success the event pump starts.
    OpenSession { node: NodeId },
    /// Take a reference on an export for a peer's import and describe it.
    Describe {
        request: u64,
        export_uuid: [u8; 16],
        index: u16,
        channel: u32,
    },
    /// Drop references; then report `ack` (a peer unimport to answer).
    Release { refs: Vec<u64>, ack: Option<u64> },
    /// Complete or fail a pending import.
    Validate {
        import_event_id: u64,
        result: Result<Pages, Status>,
    },
    /// Acknowledge unimports.
    Finish { ids: Vec<u64> },
    /// Disable the local importers of `node`.
    DisableImporters { node: NodeId },
    /// ATTACH_REMOTE_GPU on a prime for a peer's multicast attach.
    AttachRemoteGpu {
        request: u64,
        from: NodeId,
        attach: openimex_core::RemoteGpuAttach,
    },
    /// SET_FAILURE on a prime.
    SetMulticastFailure {
        export_uuid: [u8; 16],
        status: Status,
    },
    /// Run this once every call queued before it is done (an answer that must follow them),
    /// describes excepted: they run on their own threads.
    Then(Box<dyn FnOnce() + Send>),
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OpenSession { node } => write!(f, "OpenSession({node})"),
            Self::Describe { request, .. } => write!(f, "Describe({request})"),
            Self::Release { refs, ack } => write!(f, "Release({refs:?}, {ack:?})"),
            Self::Validate {
                import_event_id, ..
            } => write!(f, "Validate({import_event_id})"),
            Self::Finish { ids } => write!(f, "Finish({ids:?})"),
            Self::DisableImporters { node } => write!(f, "DisableImporters({node})"),
            Self::AttachRemoteGpu { request, from, .. } => {
                write!(f, "AttachRemoteGpu({request}, {from})")
            }
            Self::SetMulticastFailure { status, .. } => {
                write!(f, "SetMulticastFailure({})", status.as_str())
            }
            Self::Then(_) => f.write_str("Then"),
        }
    }
}

/// The running driver threads.
pub(crate) struct DriverThreads {
    calls: Option<std_mpsc::Sender<Call>>,
    describes: Option<std_mpsc::Sender<Call>>,
    /// The worker, then the describers.
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl DriverThreads {
    /// Starts the worker. Results go to `engine`.
    pub(crate) fn start(
        driver: Arc<dyn Driver>,
        engine: mpsc::Sender<Input>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = std_mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::with_capacity(1 + DESCRIBERS);
        let (d, e, s) = (driver.clone(), engine.clone(), stop.clone());
        threads.push(
            std::thread::Builder::new()
                .name("driver-calls".into())
                .spawn(move || work(d, &rx, e, s))?,
        );
        // One queue for all describers: each takes the next describe when it is free.
        let (describe_tx, describe_rx) = std_mpsc::channel();
        let describe_rx = Arc::new(std::sync::Mutex::new(describe_rx));
        for i in 0..DESCRIBERS {
            let (d, e, s, rx) = (
                driver.clone(),
                engine.clone(),
                stop.clone(),
                describe_rx.clone(),
            );
            threads.push(
                std::thread::Builder::new()
                    .name(format!("driver-describe-{i}"))
                    .spawn(move || work(d, &SharedQueue(rx), e, s))?,
            );
        }
        Ok(Self {
            calls: Some(tx),
            describes: Some(describe_tx),
            threads,
            stop,
        })
    }

    /// Queues a call. Never blocks.
    pub(crate) fn call(&self, call: Call) {
        let queue = match call {
            Call::Describe { .. } => &self.describes,
            _ => &self.calls,
        };
        if let Some(tx) = queue {
            // The threads only exit after `stop`, so a send cannot fail before then.
            let _ = tx.send(call);
        }
    }

    /// Stops the event pump, lets the worker and the describers finish the calls already
    /// queued, and waits for them. Returns once no driver call is in progress.
    pub(crate) async fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.calls = None;
        self.describes = None;
        let threads = std::mem::take(&mut self.threads);
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

impl Drop for DriverThreads {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn post(engine: &mpsc::Sender<Input>, input: DriverInput) -> bool {
    engine.blocking_send(Input::Driver(input)).is_ok()
}

/// Where a thread takes its calls from: its own queue, or one shared by the describers.
trait Queue {
    fn next(&self) -> Option<Call>;
}

impl Queue for std_mpsc::Receiver<Call> {
    fn next(&self) -> Option<Call> {
        self.recv().ok()
    }
}

/// The describers' queue.
struct SharedQueue(Arc<std::sync::Mutex<std_mpsc::Receiver<Call>>>);

impl Queue for SharedQueue {
    fn next(&self) -> Option<Call> {
        // Held while waiting, so one idle describer waits and the others wait for the lock.
        self.0.lock().ok()?.recv().ok()
    }
}

fn work(
    driver: Arc<dyn Driver>,
    calls: &dyn Queue,
    engine: mpsc::Sender<Input>,
    stop: Arc<AtomicBool>,
) {
    while let Some(call) = calls.next() {
        let input = match perform(&driver, call, &engine, &stop) {
            Ok(Some(input)) => input,
            Ok(None) => continue,
            Err((call, error)) => DriverInput::Failed { call, error },
        };
        if !post(&engine, input) {
            return;
        }
    }
}

type Outcome = Result<Option<DriverInput>, (&'static str, DriverError)>;

fn perform(
    driver: &Arc<dyn Driver>,
    call: Call,
    engine: &mpsc::Sender<Input>,
    stop: &Arc<AtomicBool>,
) -> Outcome {
    match call {
        Call::OpenSession { node } => {
            let info = driver.open_session(node).map_err(|e| ("open session", e))?;
            spawn_event_pump(driver.clone(), engine.clone(), stop.clone())
                .map_err(|e| ("open session", DriverError::Lost(e.to_string())))?;
            Ok(Some(DriverInput::SessionOpen {
                version: info.version,
            }))
        }
        Call::Describe {
            request,
            export_uuid,
            index,
            channel,
        } => {
            let result = match driver.describe_export(export_uuid, index, channel) {
                Ok(described) => Ok(described),
                Err(e @ DriverError::Lost(_)) => return Err(("describe", e)),
                Err(e) => Err(ImportError::new(e.status(), e.to_string())),
            };
            Ok(Some(DriverInput::Described { request, result }))
        }
        Call::Release { refs, ack } => {
            for r in refs {
                driver
                    .release_export_ref(r)
                    .map_err(|e| ("release export reference", e))?;
            }
            Ok(ack.map(|request| DriverInput::Released { request }))
        }
        Call::Validate {
            import_event_id,
            result,
        } => {
            driver
                .validate_import(import_event_id, result)
                .map_err(|e| ("validate import", e))?;
            Ok(None)
        }
        Call::Finish { ids } => {
            driver
                .finish_unimport(&ids)
                .map_err(|e| ("finish unimport", e))?;
            Ok(None)
        }
        Call::Then(then) => {
            then();
            Ok(None)
        }
        Call::DisableImporters { node } => {
            driver
                .disable_importers(node)
                .map_err(|e| ("disable importers", e))?;
            Ok(None)
        }
        Call::AttachRemoteGpu {
            request,
            from,
            attach,
        } => {
            let result = match driver.attach_remote_gpu(from, &attach) {
                Ok(()) => Ok(()),
                Err(e @ DriverError::Lost(_)) => return Err(("attach remote GPU", e)),
                Err(e) => Err(ImportError::new(e.status(), e.to_string())),
            };
            Ok(Some(DriverInput::RemoteGpuAttached {
                request,
                attach,
                result,
            }))
        }
        Call::SetMulticastFailure {
            export_uuid,
            status,
        } => match driver.set_multicast_failure(export_uuid, status) {
            Err(e @ DriverError::Lost(_)) => Err(("set multicast failure", e)),
            // The prime may be gone, or failed already: nothing more to do.
            Err(e) => {
                tracing::info!("SET_FAILURE on a multicast object: {e}");
                Ok(None)
            }
            Ok(()) => Ok(None),
        },
    }
}

/// Starts the thread that long-polls the driver for events until `stop` is set.
fn spawn_event_pump(
    driver: Arc<dyn Driver>,
    engine: mpsc::Sender<Input>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("driver-events".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match driver.next_events(EVENT_POLL) {
                    Ok(events) => {
                        for ev in events {
                            if !post(&engine, DriverInput::Event(ev)) {
                                return;
                            }
                        }
                    }
                    Err(error) => {
                        if !stop.load(Ordering::Relaxed) {
                            post(
                                &engine,
                                DriverInput::Failed {
                                    call: "event poll",
                                    error,
                                },
                            );
                        }
                        return;
                    }
                }
            }
        })
        .map(drop)
}
