//! Who may open the IMEX session (`docs/reference/driver-interface.md` §1.4, §1.5: the real driver
//! wants a descriptor of the root-only fabric-imex-mgmt capability in NV_IMEX_SESSION's
//! `capDescriptor`): an unprivileged local user is refused with
//! NV_ERR_INSUFFICIENT_PERMISSIONS, so it cannot take the session while no daemon holds it and
//! answer other users' imports; root opens it. The unprivileged client is this test binary run
//! again as user nobody (see `session_child`).

use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use openimex_harness::ScratchDir;
mod common;

use common::config;
use openimex_simgpu::server::Server;
use openimex_simproto::proto::{self, NvStatus, Request};

const CHILD_SOCKET: &str = "OPENIMEX_SIMGPU_TEST_SESSION_SOCKET";

/// The unprivileged user.
const NOBODY: u32 = 65534;

/// Asks for the IMEX session on `socket`; the answer, `Debug`-printed.
fn open_session(socket: &Path) -> String {
    let conn = UnixStream::connect(socket).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    format!(
        "{:?}",
        proto::call(&conn, &Request::OpenSession { node_id: 7 }, &[]).expect("call")
    )
}

/// Not a test of its own: the entry point when this binary is re-run as another user.
#[test]
fn session_child() {
    if let Ok(socket) = std::env::var(CHILD_SOCKET) {
        println!("answer: {}", open_session(Path::new(&socket)));
    }
}

#[test]
fn only_root_opens_the_imex_session() {
    let dir = ScratchDir::new("simgpu-session").expect("scratch dir");
    let config = config(dir.path(), 0);
    let server = Server::bind(&config).expect("bind").spawn().expect("spawn");
    // `nobody` must be able to reach this binary (a checkout may be private).
    let exe = std::env::current_exe().expect("this binary");
    let offered = openimex_harness::runnable_by_everyone(&exe).expect("reachable");
    let out = Command::new(offered.path())
        .args([
            "--exact",
            "session_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_SOCKET, server.socket_path())
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let answer = stdout
        .lines()
        .find_map(|l| l.split_once("answer: ").map(|(_, a)| a))
        .unwrap_or_else(|| {
            panic!(
                "no answer from the child: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(
        answer.contains(&format!("{:?}", NvStatus::InsufficientPermissions))
            && answer.contains("fabric-imex-mgmt"),
        "{answer}"
    );
    assert!(!server.stats().session, "no session was opened");

    let root = open_session(server.socket_path());
    assert!(root.starts_with("Session"), "{root}");
    server.stop();
}
