//! The `sim` backend: the daemon's side of the simulated GPU driver's socket
//! (`<node-dir>/dev/nvidiactl.sock`, served by `openimex gpu`), spoken with the protocol crate
//! `openimex-simproto` alone: the daemon does not link the simulated driver.
//!
//! Two connections, as the real daemon uses an event fd beside its control fd: the *session*
//! connection owns the IMEX session (closing it is the daemon dying, which the driver treats as
//! session teardown) and carries the event long-polls; the *control* connection carries the
//! other calls, authorised by the session token.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use openimex_core::NodeId;
use openimex_simproto::handle::ExportUuid;
use openimex_simproto::node_dir::socket_path;
use openimex_simproto::proto::{
    self, FabricEvent, FabricPages, MAX_UNIMPORT_TOKENS, NvStatus, Request, Response, Validation,
};

use crate::{Driver, DriverError, Event, GpuFabric, Pages, SessionInfo, Status};

mod multicast;
pub use multicast::remote_gpu_attach;

/// Driver version reported to peers for the simulated driver.
pub const SIM_VERSION: &str = "sim-595.45.04";

/// Control connections of one daemon: calls on different connections run at once, as ioctls
/// from several threads do on the real driver's file descriptor (the daemon makes its calls
/// from two threads: its runtime and its driver worker).
pub const CONTROL_CONNECTIONS: usize = 2;

/// The simulated driver of one node.
#[derive(Debug)]
pub struct SimDriver {
    path: PathBuf,
    session: Mutex<UnixStream>,
    /// Each call takes the first free one (a call blocks only when all are busy).
    control: Vec<Mutex<UnixStream>>,
    token: Mutex<Option<u64>>,
    /// A GET_EVENTS answer read by [`Driver::take_events`], for `next_events` to convert.
    arrived: Mutex<Option<Response>>,
}

/// The simulated driver's status as the daemon's [`Status`] (the statuses the daemon acts on;
/// the rest are `Other`). The one place this mapping is written. There is no inverse: a status
/// never goes back into the driver (a failed import is VALIDATE with the IMPORT_FAILED flag,
/// which carries none).
fn status(s: NvStatus) -> Status {
    match s {
        NvStatus::InsufficientPermissions => Status::InsufficientPermissions,
        NvStatus::ObjectNotFound => Status::ObjectNotFound,
        NvStatus::InvalidState => Status::InvalidState,
        NvStatus::InvalidArgument => Status::InvalidArgument,
        _ => Status::Other,
    }
}

impl SimDriver {
    /// Connects to the simulated driver of the node in `node_dir`.
    pub fn connect(node_dir: &Path) -> Result<Self, DriverError> {
        let path = socket_path(node_dir);
        let open = || {
            UnixStream::connect(&path).map_err(|e| DriverError::Unavailable {
                backend: "sim",
                reason: format!("cannot connect to the simulated GPU driver at {}: {e}", path.display()),
                fix: "start it first with `openimex gpu --node-dir DIR --fabric-dir DIR --slot N`, and point OPENIMEX_SIM_NODE_DIR at DIR",
            })
        };
        let control = (0..CONTROL_CONNECTIONS)
            .map(|_| open().map(Mutex::new))
            .collect::<Result<Vec<_>, _>>()?;
        let driver = Self {
            session: Mutex::new(open()?),
            control,
            token: Mutex::new(None),
            arrived: Mutex::new(None),
            path,
        };
        let pid = std::process::id();
        driver.call(&driver.session, "hello", &Request::Hello { pid })?;
        for conn in &driver.control {
            driver.call(conn, "hello", &Request::Hello { pid })?;
        }
        Ok(driver)
    }

    fn call(
        &self,
        conn: &Mutex<UnixStream>,
        what: &'static str,
        req: &Request,
    ) -> Result<Response, DriverError> {
        let sock = conn
            .lock()
            .map_err(|_| DriverError::Lost("driver connection lock poisoned".into()))?;
        Self::answer(&self.path, what, proto::call_untimed(&sock, req, &[]))
    }

    fn answer(
        path: &Path,
        what: &'static str,
        resp: Result<Response, proto::WireError>,
    ) -> Result<Response, DriverError> {
        let resp = resp.map_err(|e| DriverError::Lost(format!("{}: {e}", path.display())))?;
        match resp {
            Response::Error { status: s, detail } => Err(DriverError::Refused {
                call: what,
                status: status(s),
                detail,
            }),
            other => Ok(other),
        }
    }

    fn token(&self) -> Result<u64, DriverError> {
        self.token
            .lock()
            .map_err(|_| DriverError::Lost("token lock poisoned".into()))?
            .ok_or_else(|| DriverError::Refused {
                call: "control",
                status: Status::InvalidState,
                detail: "no session".into(),
            })
    }

    /// GET_EVENTS, waiting up to `wait`.
    fn events_request(&self, wait: Duration) -> Result<Request, DriverError> {
        Ok(Request::GetEvents {
            token: self.token()?,
            max: 128,
            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        })
    }

    fn control(&self, what: &'static str, req: &Request) -> Result<Response, DriverError> {
        // The first free connection; all busy: wait for the first.
        for conn in &self.control {
            match conn.try_lock() {
                Ok(sock) => {
                    return Self::answer(&self.path, what, proto::call_untimed(&sock, req, &[]));
                }
                Err(std::sync::TryLockError::WouldBlock) => {}
                Err(std::sync::TryLockError::Poisoned(_)) => {
                    return Err(DriverError::Lost("driver connection lock poisoned".into()));
                }
            }
        }
        match self.control.first() {
            Some(conn) => self.call(conn, what, req),
            None => Err(DriverError::Lost("no control connection".into())),
        }
    }
}

fn unexpected(what: &'static str, r: &Response) -> DriverError {
    DriverError::Lost(format!("unexpected answer to {what}: {r:?}"))
}

fn lost(path: &Path, e: &proto::WireError) -> DriverError {
    DriverError::Lost(format!("{}: {e}", path.display()))
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>, DriverError> {
    m.lock()
        .map_err(|_| DriverError::Lost("driver lock poisoned".into()))
}

impl Driver for SimDriver {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn open_session(&self, node: NodeId) -> Result<SessionInfo, DriverError> {
        match self.call(
            &self.session,
            "open session",
            &Request::OpenSession { node_id: node.0 },
        ) {
            Ok(Response::Session { token }) => {
                *self
                    .token
                    .lock()
                    .map_err(|_| DriverError::Lost("token lock poisoned".into()))? = Some(token);
                Ok(SessionInfo {
                    version: SIM_VERSION.to_string(),
                })
            }
            Ok(other) => Err(unexpected("open session", &other)),
            Err(DriverError::Refused { .. }) => Err(DriverError::SessionBusy),
            Err(e) => Err(e),
        }
    }

    fn next_events(&self, wait: Duration) -> Result<Vec<Event>, DriverError> {
        // An answer `take_events` already read, or a long-poll now.
        let arrived = lock(&self.arrived)?.take();
        let resp = match arrived {
            Some(resp) => resp,
            None => self.call(&self.session, "get events", &self.events_request(wait)?)?,
        };
        let Response::Events { events, .. } = resp else {
            return Err(unexpected("get events", &resp));
        };
        Ok(events
            .into_iter()
            .filter_map(|e| match e {
                // The import ID is not passed on: the daemon names the import by its event ID
                // when it validates it, which is all this driver needs. A backend whose VALIDATE
                // goes through IMPORTED_REF {uuid, index, id} (the real driver, §1.6 "Daemon B"
                // 1) needs it in core's `Event::Import`.
                FabricEvent::Import {
                    event_id,
                    channel,
                    export_uuid,
                    index,
                    export_node,
                    import_id: _,
                } => {
                    let uuid = ExportUuid::from_hex(&export_uuid).ok()?;
                    Some(Event::Import {
                        event_id,
                        channel,
                        export_uuid: uuid.0,
                        index,
                        export_node: NodeId(export_node),
                    })
                }
                FabricEvent::Unimport {
                    unimport_event_id,
                    import_event_id,
                    export_node,
                } => Some(Event::Unimport {
                    unimport_event_id,
                    import_event_id,
                    export_node: NodeId(export_node),
                }),
                FabricEvent::CliqueIdChange {
                    gpu_id, clique_id, ..
                } => Some(Event::CliqueIdChange {
                    gpu: gpu_id,
                    clique_id,
                }),
                e @ FabricEvent::RemoteGpuAttach { .. } => {
                    remote_gpu_attach(&e).map(Event::RemoteGpuAttach)
                }
            })
            .collect())
    }

    fn event_fd(&self) -> Option<RawFd> {
        self.session.lock().ok().map(|s| s.as_raw_fd())
    }

    fn request_events(&self, wait: Duration) -> Result<(), DriverError> {
        let req = self.events_request(wait)?;
        let sock = lock(&self.session)?;
        proto::send(&sock, &req, &[]).map_err(|e| lost(&self.path, &e))
    }

    fn take_events(&self) -> Result<Option<Vec<Event>>, DriverError> {
        use nix::errno::Errno;
        use nix::sys::socket::{MsgFlags, recv};
        let resp = {
            let sock = lock(&self.session)?;
            // A look without waiting: the driver writes an answer in one piece, so its first
            // byte means the frame is there.
            let peek = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
            match recv(sock.as_raw_fd(), &mut [0u8; 1], peek) {
                Ok(0) => return Err(lost(&self.path, &proto::WireError::Closed)),
                Ok(_) => {}
                Err(Errno::EAGAIN | Errno::EINTR) => return Ok(None),
                Err(e) => return Err(lost(&self.path, &proto::WireError::Sys(e))),
            }
            let resp = proto::recv_arrived::<Response>(&sock).map(|(r, _)| r);
            Self::answer(&self.path, "get events", resp)?
        };
        *lock(&self.arrived)? = Some(resp);
        self.next_events(Duration::ZERO).map(Some)
    }

    fn describe_export(
        &self,
        uuid: [u8; 16],
        index: u16,
        channel: u32,
    ) -> Result<(u64, Pages), DriverError> {
        let token = self.token()?;
        let export_uuid = ExportUuid(uuid).to_hex();
        let resp = self.control(
            "describe export",
            &Request::DescribeExport {
                token,
                export_uuid,
                index,
                channel,
            },
        )?;
        let Response::Described { export_ref, pages } = resp else {
            return Err(unexpected("describe", &resp));
        };
        let FabricPages {
            size,
            page_size,
            pfns,
            clique_id,
            bw_mode,
            bw_mode_epoch,
        } = pages;
        Ok((
            export_ref,
            Pages {
                size,
                page_size,
                pfns,
                clique_id,
                bw_mode,
                bw_mode_epoch,
            },
        ))
    }

    fn release_export_ref(&self, export_ref: u64) -> Result<(), DriverError> {
        let token = self.token()?;
        self.control(
            "release export ref",
            &Request::ReleaseExportRef { token, export_ref },
        )
        .map(drop)
    }

    /// VALIDATE with the pages, or, for any failure, VALIDATE with the IMPORT_FAILED flag
    /// alone: the daemon's status stays with the daemon (its logs), and the importer's object
    /// reports NV_ERR_INVALID_OBJECT (`reference/driver-interface.md` §1.6 "Daemon B" 2, §4
    /// "Failed import").
    fn validate_import(
        &self,
        import_event_id: u64,
        result: Result<Pages, Status>,
    ) -> Result<(), DriverError> {
        let token = self.token()?;
        let result = match result {
            Ok(p) => Validation::Pages(FabricPages {
                size: p.size,
                page_size: p.page_size,
                pfns: p.pfns,
                clique_id: p.clique_id,
                bw_mode: p.bw_mode,
                bw_mode_epoch: p.bw_mode_epoch,
            }),
            Err(_) => Validation::ImportFailed,
        };
        self.control(
            "validate",
            &Request::Validate {
                token,
                import_event_id,
                result,
            },
        )
        .map(drop)
    }

    /// FINISH_MEM_UNIMPORT takes 1 to 256 tokens per call (`reference/driver-interface.md`
    /// §1.4, §7 "FINISH_MEM_UNIMPORT batching (≤256)"): larger batches go in several calls, in
    /// order, and an empty one makes none.
    fn finish_unimport(&self, ids: &[u64]) -> Result<(), DriverError> {
        if ids.is_empty() {
            return Ok(());
        }
        let token = self.token()?;
        for chunk in ids.chunks(MAX_UNIMPORT_TOKENS) {
            let req = Request::FinishUnimport {
                token,
                unimport_event_ids: chunk.to_vec(),
            };
            self.control("finish unimport", &req)?;
        }
        Ok(())
    }

    fn attach_remote_gpu(
        &self,
        from: NodeId,
        attach: &crate::multicast::RemoteGpuAttach,
    ) -> Result<(), DriverError> {
        self.mc_attach_remote_gpu(from, attach)
    }

    fn set_multicast_failure(&self, export_uuid: [u8; 16], s: Status) -> Result<(), DriverError> {
        self.mc_set_failure(export_uuid, s)
    }

    fn disable_importers(&self, node: NodeId) -> Result<(), DriverError> {
        let token = self.token()?;
        self.control(
            "disable importers",
            &Request::DisableImporters {
                token,
                node: node.0,
            },
        )
        .map(drop)
    }

    /// The GPUs from the driver's hello, then FabricProbeInfo for each.
    fn gpu_fabric(&self) -> Result<Vec<GpuFabric>, DriverError> {
        let pid = std::process::id();
        let resp = self.control("hello", &Request::Hello { pid })?;
        let Response::Hello { gpus, .. } = resp else {
            return Err(unexpected("hello", &resp));
        };
        gpus.iter()
            .map(|g| {
                let resp = self.control(
                    "fabric probe info",
                    &Request::FabricProbeInfo { gpu: g.index },
                )?;
                let Response::FabricProbeInfo(p) = resp else {
                    return Err(unexpected("fabric probe info", &resp));
                };
                let mut out = GpuFabric {
                    gpu: p.gpu,
                    state: p.state.nvml_name().to_string(),
                    ..GpuFabric::default()
                };
                if let Some(i) = p.info {
                    out.cluster_uuid = i.cluster_uuid;
                    out.partition_id = i.partition_id;
                    out.clique_id = i.clique_id;
                    out.bw_mode = i.bw_mode;
                    out.bw_mode_epoch = i.bw_mode_epoch;
                    out.health_mask = i.health_mask;
                    out.health_summary = i.health_summary.name().to_string();
                }
                Ok(out)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::sync::Arc;

    #[test]
    fn driver_statuses_map_to_the_daemons() {
        for (nv, want) in [
            (
                NvStatus::InsufficientPermissions,
                Status::InsufficientPermissions,
            ),
            (NvStatus::ObjectNotFound, Status::ObjectNotFound),
            (NvStatus::InvalidState, Status::InvalidState),
            (NvStatus::InvalidArgument, Status::InvalidArgument),
        ] {
            assert_eq!(status(nv), want, "{nv:?}");
        }
        for s in NvStatus::ALL {
            let back = status(s);
            assert!(
                back == Status::Other
                    || back.as_str() == s.to_string().trim_start_matches("NV_ERR_"),
                "{s:?} -> {back:?}"
            );
        }
        assert_eq!(status(NvStatus::NotReady), Status::Other);
    }

    /// A fake driver on a socket that records every request and answers as the simulated
    /// driver would (refusing FINISH_MEM_UNIMPORT outside 1..=256 tokens).
    pub(super) fn fake_driver(
        dir: &Path,
    ) -> (Arc<Mutex<Vec<Request>>>, std::thread::JoinHandle<()>) {
        let sock = socket_path(dir);
        std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
        let listener = UnixListener::bind(&sock).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let server = std::thread::spawn(move || {
            // The control connections and the session connection.
            let conns: Vec<UnixStream> = (0..1 + CONTROL_CONNECTIONS)
                .map(|_| listener.accept().unwrap().0)
                .collect();
            let serve = |c: UnixStream, log: Arc<Mutex<Vec<Request>>>| {
                std::thread::spawn(move || {
                    while let Ok((req, _)) = proto::recv::<Request>(&c) {
                        let resp = match &req {
                            Request::Hello { .. } => Response::Hello {
                                node_id: 0xFFFF,
                                gpus: Vec::new(),
                                fabric_dir: String::new(),
                            },
                            Request::OpenSession { .. } => Response::Session { token: 7 },
                            Request::FinishUnimport {
                                unimport_event_ids, ..
                            } if unimport_event_ids.is_empty()
                                || unimport_event_ids.len() > MAX_UNIMPORT_TOKENS =>
                            {
                                Response::Error {
                                    status: NvStatus::InvalidArgument,
                                    detail: "numTokens".into(),
                                }
                            }
                            _ => Response::Ok,
                        };
                        log.lock().unwrap().push(req);
                        if proto::send(&c, &resp, &[]).is_err() {
                            break;
                        }
                    }
                })
            };
            let threads: Vec<_> = conns
                .into_iter()
                .map(|c| serve(c, Arc::clone(&log)))
                .collect();
            for t in threads {
                let _ = t.join();
            }
        });
        (seen, server)
    }

    pub(super) fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("openimex-driver-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// `reference/driver-interface.md` §1.4: FINISH_MEM_UNIMPORT's `numTokens` is 1..256, so
    /// 600 tokens go as 256 + 256 + 88, in order, and none makes no call.
    #[test]
    fn finish_unimport_sends_at_most_256_tokens_per_call() {
        let dir = scratch("chunks");
        let (seen, server) = fake_driver(&dir);
        let d = SimDriver::connect(&dir).unwrap();
        d.open_session(NodeId(2)).unwrap();
        let ids: Vec<u64> = (1..=600).collect();
        d.finish_unimport(&ids).unwrap();
        d.finish_unimport(&[]).unwrap();
        d.finish_unimport(&[601]).unwrap();
        drop(d);
        server.join().unwrap();
        let batches: Vec<Vec<u64>> = seen
            .lock()
            .unwrap()
            .iter()
            .filter_map(|r| match r {
                Request::FinishUnimport {
                    token: 7,
                    unimport_event_ids,
                } => Some(unimport_event_ids.clone()),
                _ => None,
            })
            .collect();
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, [256, 256, 88, 1]);
        let flat: Vec<u64> = batches.concat();
        assert_eq!(
            flat,
            (1..=601).collect::<Vec<u64>>(),
            "every token once, in order"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `reference/driver-interface.md` §1.6 "Daemon B" 2 and §4 "Failed import": a failed import
    /// is VALIDATE with the IMPORT_FAILED flag; the daemon's status does not go into it.
    #[test]
    fn a_failed_import_is_validated_with_import_failed_whatever_the_status() {
        let dir = scratch("failed");
        let (seen, server) = fake_driver(&dir);
        let d = SimDriver::connect(&dir).unwrap();
        d.open_session(NodeId(2)).unwrap();
        for s in [
            Status::InsufficientPermissions,
            Status::ObjectNotFound,
            Status::InvalidState,
            Status::InvalidArgument,
            Status::Other,
        ] {
            d.validate_import(5, Err(s)).unwrap();
        }
        drop(d);
        server.join().unwrap();
        let validations: Vec<Validation> = seen
            .lock()
            .unwrap()
            .iter()
            .filter_map(|r| match r {
                Request::Validate {
                    import_event_id: 5,
                    result,
                    ..
                } => Some(result.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(validations, vec![Validation::ImportFailed; 5]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
