//! A stand-in for the IMEX daemons of in-process simulated nodes, for the tests of code that
//! talks to the driver (the client library, this crate's server tests). Built with the
//! `testing` feature only; it is no part of the simulation.
//!
//! [`LoopbackDaemons`] opens the IMEX session on each node's driver and answers every node's
//! fabric events the way a pair of daemons does over the network, but by asking the exporting
//! node's driver directly: a MEM_IMPORT is answered with DESCRIBE on the exporter (taking the
//! daemon's reference) and VALIDATE on the importer (pages, or the IMPORT_FAILED flag, which
//! carries no status); a MEM_UNIMPORT drops that reference and finishes the unimport
//! (`docs/reference/driver-interface.md` §1.6, §4). There is no network, no peer state and no
//! timer: what is tested is the driver and its clients, not the daemon. It also forwards
//! multicast REMOTE_GPU_ATTACH events to the prime's driver (ATTACH_REMOTE_GPU); [`fm`] plays
//! the Fabric Manager's multicast team set-up.
//!
//! ```no_run
//! use openimex_simgpu::server::{DriverConfig, Server};
//! use openimex_simgpu::testing::LoopbackDaemons;
//! # fn config(slot: u16) -> DriverConfig { unimplemented!() }
//! let a = Server::bind(&config(0))?.spawn()?;
//! let b = Server::bind(&config(1))?.spawn()?;
//! // Node IDs 0 and 1; imports between the two nodes now complete.
//! let daemons = LoopbackDaemons::start(&[(a.socket_path(), 0), (b.socket_path(), 1)])?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openimex_simproto::multicast::McRequest;
use openimex_simproto::proto::{self, FabricEvent, Request, Response, Validation, WireError};

/// Longest one event poll waits, so that stop and pause are seen promptly.
const POLL: Duration = Duration::from_millis(50);

/// Errors starting the stand-in daemons.
#[derive(Debug, thiserror::Error)]
pub enum TestingError {
    /// The driver socket failed.
    #[error("driver {socket}: {source}")]
    Wire {
        /// The socket.
        socket: String,
        /// Why.
        source: WireError,
    },
    /// The driver refused a call or answered something else.
    #[error("driver {socket}: {call}: {answer}")]
    Refused {
        /// The socket.
        socket: String,
        /// The call.
        call: &'static str,
        /// The answer.
        answer: String,
    },
}

/// One node as the stand-in sees it.
#[derive(Debug)]
struct Node {
    node_id: u16,
    token: u64,
    /// The control connection (DESCRIBE, VALIDATE, …); the session connection belongs to the
    /// node's event thread.
    control: Mutex<UnixStream>,
}

#[derive(Debug, Default)]
struct State {
    /// (importer index, import event ID) → (exporter index, the exporter's daemon reference).
    refs: HashMap<(usize, u64), (usize, u64)>,
    /// Protocol errors seen (answers that no daemon should get).
    failures: Vec<String>,
}

#[derive(Debug)]
struct Shared {
    nodes: Vec<Node>,
    state: Mutex<State>,
    stop: AtomicBool,
    paused: AtomicBool,
    /// Event threads currently parked by a pause (or finished).
    parked: AtomicUsize,
    /// Events taken from the drivers.
    handled: AtomicUsize,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fail(&self, what: String) {
        self.state().failures.push(what);
    }

    /// One control call on node `i`; `None` once its driver is gone.
    fn control(&self, i: usize, req: &Request) -> Option<Response> {
        let conn = self.nodes[i]
            .control
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        proto::call(&conn, req, &[]).ok()
    }

    /// Answers one event of node `i`; `None` once a driver is gone.
    fn answer(&self, i: usize, event: FabricEvent) -> Option<()> {
        let importer = &self.nodes[i];
        match event {
            FabricEvent::Import {
                event_id,
                channel,
                export_uuid,
                index,
                export_node,
                ..
            } => {
                let exporter = self.nodes.iter().position(|n| n.node_id == export_node);
                let result = match exporter {
                    // No daemon of that node: the exporter is unreachable.
                    None => Validation::ImportFailed,
                    Some(e) => {
                        let req = Request::DescribeExport {
                            token: self.nodes[e].token,
                            export_uuid,
                            index,
                            channel,
                        };
                        match self.control(e, &req)? {
                            Response::Described { export_ref, pages } => {
                                self.state().refs.insert((i, event_id), (e, export_ref));
                                Validation::Pages(pages)
                            }
                            Response::Error { .. } => Validation::ImportFailed,
                            other => {
                                self.fail(format!("describe answered {other:?}"));
                                Validation::ImportFailed
                            }
                        }
                    }
                };
                let req = Request::Validate {
                    token: importer.token,
                    import_event_id: event_id,
                    result,
                };
                match self.control(i, &req)? {
                    Response::Ok => {}
                    other => self.fail(format!("validate answered {other:?}")),
                }
            }
            FabricEvent::Unimport {
                unimport_event_id,
                import_event_id,
                ..
            } => {
                let held = self.state().refs.remove(&(i, import_event_id));
                if let Some((e, export_ref)) = held {
                    let req = Request::ReleaseExportRef {
                        token: self.nodes[e].token,
                        export_ref,
                    };
                    match self.control(e, &req)? {
                        Response::Ok => {}
                        other => self.fail(format!("release export ref answered {other:?}")),
                    }
                }
                let req = Request::FinishUnimport {
                    token: importer.token,
                    unimport_event_ids: vec![unimport_event_id],
                };
                match self.control(i, &req)? {
                    Response::Ok => {}
                    other => self.fail(format!("finish unimport answered {other:?}")),
                }
            }
            // Nothing of an import depends on it; a daemon only reports it.
            FabricEvent::CliqueIdChange { .. } => {}
            // §1.6 "Multicast" 4: the owner's daemon calls ATTACH_REMOTE_GPU on the prime (which
            // fails the prime itself on a refused attach).
            FabricEvent::RemoteGpuAttach {
                export_uuid,
                export_node,
                gpu,
                ..
            } => {
                let Some(e) = self.nodes.iter().position(|n| n.node_id == export_node) else {
                    self.fail(format!("remote GPU attach to unknown node {export_node}"));
                    return Some(());
                };
                let req = Request::Multicast(McRequest::AttachRemoteGpu {
                    token: self.nodes[e].token,
                    export_uuid,
                    node_id: importer.node_id,
                    gpu,
                });
                match self.control(e, &req)? {
                    Response::Ok | Response::Error { .. } => {}
                    other => self.fail(format!("attach remote GPU answered {other:?}")),
                }
            }
        }
        Some(())
    }

    /// Node `i`'s event loop, on its session connection.
    fn run(&self, i: usize, session: &UnixStream) {
        let token = self.nodes[i].token;
        let wait_ms = u64::try_from(POLL.as_millis()).unwrap_or(u64::MAX);
        while !self.stop.load(Ordering::SeqCst) {
            if self.paused.load(Ordering::SeqCst) {
                self.parked.fetch_add(1, Ordering::SeqCst);
                while self.paused.load(Ordering::SeqCst) && !self.stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                self.parked.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            let req = Request::GetEvents {
                token,
                max: 64,
                wait_ms,
            };
            let events = match proto::call(session, &req, &[]) {
                Ok(Response::Events { events, .. }) => events,
                Ok(other) => {
                    self.fail(format!("get events answered {other:?}"));
                    break;
                }
                // The driver stopped.
                Err(_) => break,
            };
            for event in events {
                // Counted before the answer, which is what a test waits for.
                self.handled.fetch_add(1, Ordering::SeqCst);
                if self.answer(i, event).is_none() {
                    break;
                }
            }
        }
        // A finished thread never handles an event again: it counts as parked.
        self.parked.fetch_add(1, Ordering::SeqCst);
    }
}

/// The IMEX daemons of a set of in-process nodes; see the module docs. Dropping it stops them
/// and closes their connections, which tears the sessions down as a daemon exit does.
#[derive(Debug)]
pub struct LoopbackDaemons {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

fn call(
    socket: &Path,
    conn: &UnixStream,
    what: &'static str,
    req: &Request,
) -> Result<Response, TestingError> {
    match proto::call(conn, req, &[]) {
        Ok(Response::Error { status, detail }) => Err(TestingError::Refused {
            socket: socket.display().to_string(),
            call: what,
            answer: format!("{status}: {detail}"),
        }),
        Ok(r) => Ok(r),
        Err(source) => Err(TestingError::Wire {
            socket: socket.display().to_string(),
            source,
        }),
    }
}

fn connect(socket: &Path) -> Result<UnixStream, TestingError> {
    let conn = UnixStream::connect(socket).map_err(|e| TestingError::Wire {
        socket: socket.display().to_string(),
        source: WireError::Io(e),
    })?;
    let pid = std::process::id();
    call(socket, &conn, "hello", &Request::Hello { pid })?;
    Ok(conn)
}

impl LoopbackDaemons {
    /// Opens the IMEX session as `node_id` on the driver listening at each `socket` (so each
    /// node's driver reports that node ID and allows fabric allocations), and starts answering
    /// their events. Fails if a driver refuses the session (one is already open).
    pub fn start(nodes: &[(&Path, u16)]) -> Result<Self, TestingError> {
        let mut opened = Vec::with_capacity(nodes.len());
        let mut sessions = Vec::with_capacity(nodes.len());
        for &(socket, node_id) in nodes {
            let session = connect(socket)?;
            let token = match call(
                socket,
                &session,
                "open session",
                &Request::OpenSession { node_id },
            )? {
                Response::Session { token } => token,
                other => {
                    return Err(TestingError::Refused {
                        socket: socket.display().to_string(),
                        call: "open session",
                        answer: format!("{other:?}"),
                    });
                }
            };
            opened.push(Node {
                node_id,
                token,
                control: Mutex::new(connect(socket)?),
            });
            sessions.push(session);
        }
        let shared = Arc::new(Shared {
            nodes: opened,
            state: Mutex::new(State::default()),
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            parked: AtomicUsize::new(0),
            handled: AtomicUsize::new(0),
        });
        let mut daemons = Self {
            shared,
            threads: Vec::new(),
        };
        for (i, session) in sessions.into_iter().enumerate() {
            let shared = Arc::clone(&daemons.shared);
            let spawned = std::thread::Builder::new()
                .name(format!("loopback-daemon-{i}"))
                .spawn(move || shared.run(i, &session));
            match spawned {
                Ok(t) => daemons.threads.push(t),
                Err(e) => {
                    return Err(TestingError::Wire {
                        socket: "(thread)".into(),
                        source: WireError::Io(e),
                    });
                }
            }
        }
        Ok(daemons)
    }

    /// Stops answering events (they stay queued in the drivers, imports stay pending) and
    /// returns once no event is being answered any more; false if that took over 10 s.
    pub fn pause(&self) -> bool {
        self.shared.paused.store(true, Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(10);
        while self.shared.parked.load(Ordering::SeqCst) < self.threads.len() {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    /// Answers events again.
    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::SeqCst);
    }

    /// Events taken from the drivers so far, every node (each is answered before the next is
    /// taken).
    pub fn events_handled(&self) -> usize {
        self.shared.handled.load(Ordering::SeqCst)
    }

    /// Daemon references held on exporters for live imports.
    pub fn export_refs(&self) -> usize {
        self.shared.state().refs.len()
    }

    /// Answers from a driver that no daemon should get (empty when all went as the protocol
    /// says).
    pub fn failures(&self) -> Vec<String> {
        self.shared.state().failures.clone()
    }
}

impl Drop for LoopbackDaemons {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The case budget of a property test: `PROPTEST_CASES` when set (a longer run), else
/// `default` (the fixed budget CI runs).
pub fn case_budget(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
