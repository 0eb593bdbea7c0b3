//! The operator's protocol on the Fabric Manager's control socket
//! (`<fabric_dir>/fabric-manager.ctl` by default, mode 0600): one JSON [`Request`] and one
//! [`Response`] at a time with the driver protocol's framing, any number per connection.
//!
//! Only root or the FM's own user may operate the fabric (SO_PEERCRED, as the simulated driver
//! checks its Fabric Manager controls); anyone else gets one [`Response::Refused`] and the
//! connection closes. [`handle`] is the pure part the server runs under its lock; [`request`]
//! is the client `openimex-lab fabric …` uses.

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use openimex_simproto::proto::{recv, send};
use serde::{Deserialize, Serialize};

use crate::FabricError;
use crate::manager::{Command, GpuChange, Manager, Outbox, Status};

/// The control socket's file name in the fabric directory.
pub const CONTROL_FILE: &str = "fabric-manager.ctl";

/// The default control socket of the FM serving `fabric_dir`.
pub fn control_path(fabric_dir: &Path) -> PathBuf {
    fabric_dir.join(CONTROL_FILE)
}

/// An operator's request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    /// The domain's state.
    Status,
    /// Change the partitions or the fabric's health.
    Apply(Command),
}

/// The FM's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    /// The domain's state.
    Status(Box<Status>),
    /// The command was applied: the GPUs whose answer changed (attached trays got the update).
    Changed {
        /// Per GPU.
        changes: Vec<GpuChange>,
    },
    /// The request was refused; nothing changed.
    Refused {
        /// Why, and how to fix it.
        reason: String,
    },
}

/// Runs one request on the manager: the answer and the probe updates to deliver.
pub fn handle(manager: &mut Manager, req: &Request) -> (Response, Outbox) {
    match req {
        Request::Status => (Response::Status(Box::new(manager.status())), Vec::new()),
        Request::Apply(cmd) => match manager.apply(cmd) {
            Ok((changes, out)) => (Response::Changed { changes }, out),
            Err(e) => (
                Response::Refused {
                    reason: e.to_string(),
                },
                Vec::new(),
            ),
        },
    }
}

/// Whether the peer of `stream` may operate the fabric: root, or the user this process runs as.
pub fn may_operate(stream: &UnixStream) -> bool {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    // /proc/self belongs to this process's effective user.
    let own = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    getsockopt(stream, PeerCredentials).is_ok_and(|c| c.uid() == 0 || Some(c.uid()) == own)
}

/// Longest the client waits for the FM's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends one request to the FM's control socket at `path` and returns its answer.
pub fn request(path: &Path, req: &Request) -> Result<Response, FabricError> {
    let fail = |detail: String, fix: &'static str| FabricError::Control {
        path: path.to_path_buf(),
        detail,
        fix,
    };
    let stream = UnixStream::connect(path).map_err(|e| {
        fail(
            format!("cannot connect: {e}"),
            "start the Fabric Manager (`openimex-lab fabric serve`) or pass its --fabric-dir / --control",
        )
    })?;
    let _ = stream.set_read_timeout(Some(ANSWER_TIMEOUT));
    // A refused peer gets its refusal at once and the connection closes, possibly before the
    // request is written: read the answer even when the send failed.
    let sent = send(&stream, req, &[]);
    match (recv::<Response>(&stream), sent) {
        (Ok((r, _)), _) => Ok(r),
        (Err(_), Err(e)) => Err(fail(
            format!("cannot send the request: {e}"),
            "check that the Fabric Manager is running",
        )),
        (Err(e), Ok(())) => Err(fail(
            format!("no answer: {e}"),
            "check the Fabric Manager's log; only root or its user may operate it",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::default_layout;
    use crate::topology::preset;

    /// Requests and answers cross the framing as they are (the wire form is the contract
    /// between `openimex-lab fabric` and the FM).
    #[test]
    fn requests_and_answers_cross_the_framing() {
        let (a, b) = UnixStream::pair().expect("pair");
        let req = Request::Apply(Command::Move {
            tray: "r0-c3".into(),
            partition: 1,
        });
        send(&a, &req, &[]).expect("send");
        assert_eq!(recv::<Request>(&b).expect("recv").0, req);
        let t = preset("nvl36").expect("preset");
        let mut m = Manager::new(t.clone(), "d", default_layout(&t));
        let (status, out) = handle(&mut m, &Request::Status);
        assert!(out.is_empty());
        send(&b, &status, &[]).expect("send");
        assert_eq!(recv::<Response>(&a).expect("recv").0, status);
    }

    #[test]
    fn a_refused_command_says_why_and_changes_nothing() {
        let t = preset("nvl36").expect("preset");
        let mut m = Manager::new(t.clone(), "d", default_layout(&t));
        let before = m.status();
        let (r, out) = handle(
            &mut m,
            &Request::Apply(Command::SwitchTray {
                name: "nope".into(),
                up: false,
            }),
        );
        let Response::Refused { reason } = r else {
            panic!("not refused: {r:?}");
        };
        assert!(reason.contains("no switch tray named \"nope\""), "{reason}");
        assert!(out.is_empty());
        assert_eq!(m.status(), before);
    }

    #[test]
    fn the_peer_of_a_socket_pair_is_this_user() {
        let (a, _b) = UnixStream::pair().expect("pair");
        assert!(may_operate(&a));
    }

    #[test]
    fn a_missing_socket_is_a_clear_error() {
        let e =
            request(Path::new("/nonexistent/fm.ctl"), &Request::Status).expect_err("no FM there");
        let s = e.to_string();
        assert!(
            s.contains("/nonexistent/fm.ctl") && s.contains("openimex-lab fabric serve"),
            "{s}"
        );
    }
}
