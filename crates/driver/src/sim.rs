//! The `sim` backend: the daemon's side of the simulated GPU driver's socket
//! (`<node-dir>/dev/nvidiactl.sock`, served by `openimex gpu`), spoken with the protocol crate
//! `openimex-simproto` alone: the daemon does not link the simulated driver.
//!
//! Two connections, as the real daemon uses an event fd beside its control fd: the *session*
//! connection owns the IMEX session (closing it is the daemon dying, which the driver treats as
//! session teardown) and carries the event long-polls; the *control* connection carries the
//! other calls, authorised by the session token.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use openimex_core::NodeId;
use openimex_simproto::handle::ExportUuid;
use openimex_simproto::node_dir::socket_path;
use openimex_simproto::proto::{
    self, FabricEvent, FabricPages, NvStatus, Request, Response, Validation,
};

use crate::{Driver, DriverError, Event, Pages, SessionInfo, Status};

/// Driver version reported to peers for the simulated driver.
pub const SIM_VERSION: &str = "sim-595.45.04";

/// The simulated driver of one node.
#[derive(Debug)]
pub struct SimDriver {
    path: PathBuf,
    session: Mutex<UnixStream>,
    control: Mutex<UnixStream>,
    token: Mutex<Option<u64>>,
}

/// The simulated driver's status as the daemon's [`Status`] (the statuses the daemon acts on;
/// the rest are `Other`). The one place this mapping is written, with [`nv`] its inverse.
fn status(s: NvStatus) -> Status {
    match s {
        NvStatus::InsufficientPermissions => Status::InsufficientPermissions,
        NvStatus::ObjectNotFound => Status::ObjectNotFound,
        NvStatus::InvalidState => Status::InvalidState,
        NvStatus::InvalidArgument => Status::InvalidArgument,
        _ => Status::Other,
    }
}

/// The status to fail an import with (VALIDATE with IMPORT_FAILED) for a daemon [`Status`].
/// `Other` has no driver status of its own: it becomes NV_ERR_INVALID_ARGUMENT.
fn nv(s: Status) -> NvStatus {
    match s {
        Status::InsufficientPermissions => NvStatus::InsufficientPermissions,
        Status::ObjectNotFound => NvStatus::ObjectNotFound,
        Status::InvalidState => NvStatus::InvalidState,
        Status::InvalidArgument | Status::Other => NvStatus::InvalidArgument,
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
        let driver = Self {
            session: Mutex::new(open()?),
            control: Mutex::new(open()?),
            token: Mutex::new(None),
            path,
        };
        let pid = std::process::id();
        driver.call(&driver.session, "hello", &Request::Hello { pid })?;
        driver.call(&driver.control, "hello", &Request::Hello { pid })?;
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
        let resp = proto::call(&sock, req, &[])
            .map_err(|e| DriverError::Lost(format!("{}: {e}", self.path.display())))?;
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
            .ok_or(DriverError::Refused {
                call: "control",
                status: Status::InvalidState,
                detail: "no session".into(),
            })
    }

    fn control(&self, what: &'static str, req: &Request) -> Result<Response, DriverError> {
        self.call(&self.control, what, req)
    }
}

fn unexpected(what: &'static str, r: &Response) -> DriverError {
    DriverError::Lost(format!("unexpected answer to {what}: {r:?}"))
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
        let token = self.token()?;
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let resp = self.call(
            &self.session,
            "get events",
            &Request::GetEvents {
                token,
                max: 128,
                wait_ms,
            },
        )?;
        let Response::Events { events, .. } = resp else {
            return Err(unexpected("get events", &resp));
        };
        Ok(events
            .into_iter()
            .filter_map(|e| match e {
                FabricEvent::Import {
                    event_id,
                    channel,
                    export_uuid,
                    index,
                    export_node,
                    ..
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
            })
            .collect())
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
        } = pages;
        Ok((
            export_ref,
            Pages {
                size,
                page_size,
                pfns,
                clique_id,
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
            }),
            Err(s) => Validation::Failed(nv(s)),
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

    fn finish_unimport(&self, ids: &[u64]) -> Result<(), DriverError> {
        let token = self.token()?;
        let req = Request::FinishUnimport {
            token,
            unimport_event_ids: ids.to_vec(),
        };
        self.control("finish unimport", &req).map(drop)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_both_ways() {
        for s in [
            Status::InsufficientPermissions,
            Status::ObjectNotFound,
            Status::InvalidState,
            Status::InvalidArgument,
        ] {
            assert_eq!(status(nv(s)), s, "{s:?}");
        }
        assert_eq!(nv(Status::Other), NvStatus::InvalidArgument);
        for s in NvStatus::ALL {
            let back = status(s);
            assert!(back == Status::Other || nv(back) == s, "{s:?} -> {back:?}");
        }
        assert_eq!(status(NvStatus::NotReady), Status::Other);
    }
}
