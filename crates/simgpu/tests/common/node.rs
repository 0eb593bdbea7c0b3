//! A test node's driver and its clients on real sockets: a scratch directory, a started
//! driver, one connection per RM client with the calls the tests make, and a remote handle
//! whose imports stay pending until a daemon answers. Each test crate uses part of it.
#![allow(dead_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use openimex_simgpu::server::{Server, ServerHandle};
use openimex_simgpu::testing::LoopbackDaemons;
use openimex_simproto::handle::{ExportUuid, FabricHandle};
use openimex_simproto::node_dir::channel_path;
use openimex_simproto::proto::{
    self, DriverStats, FabricEvent, NvStatus, PAGE_SIZE, Request, Response,
};

use super::config;

/// A temporary directory (the harness's scratch dir: removed on drop, kept on a panic).
pub(crate) struct TempDir(pub(crate) PathBuf, openimex_harness::ScratchDir);

impl TempDir {
    pub(crate) fn new(name: &str) -> Self {
        let s = openimex_harness::ScratchDir::new(&format!("simgpu-it-{name}")).unwrap();
        Self(s.path().to_path_buf(), s)
    }
}

pub(crate) fn start(dir: &Path, slot: u16) -> ServerHandle {
    Server::bind(&config(dir, slot)).unwrap().spawn().unwrap()
}

/// Two started drivers, node IDs 0 and 1, whose imports loopback daemons answer by asking the
/// other driver directly. Fields drop in order: the daemons before the drivers, the directory
/// last.
pub(crate) struct TwoNodes {
    pub(crate) daemons: LoopbackDaemons,
    pub(crate) a: ServerHandle,
    pub(crate) b: ServerHandle,
    /// Node directories (channels, simulated HBM).
    pub(crate) node_a: PathBuf,
    pub(crate) node_b: PathBuf,
    pub(crate) dir: TempDir,
}

impl TwoNodes {
    pub(crate) fn start(name: &str) -> Self {
        let dir = TempDir::new(name);
        let a = start(&dir.0, 0);
        let b = start(&dir.0, 1);
        let daemons =
            LoopbackDaemons::start(&[(a.socket_path(), 0), (b.socket_path(), 1)]).unwrap();
        Self {
            daemons,
            node_a: config(&dir.0, 0).node_dir,
            node_b: config(&dir.0, 1).node_dir,
            a,
            b,
            dir,
        }
    }
}

/// One connection (one RM client).
pub(crate) struct Conn(pub(crate) UnixStream);

impl Conn {
    pub(crate) fn open(server: &ServerHandle) -> Self {
        let s = UnixStream::connect(server.socket_path()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Self(s)
    }

    pub(crate) fn call(&self, req: Request) -> Response {
        proto::call(&self.0, &req, &[]).unwrap()
    }

    pub(crate) fn subscribe(&self, node_dir: &Path, channel: u32) {
        let f = File::open(channel_path(node_dir, channel)).unwrap();
        let r = proto::call(&self.0, &Request::SubscribeChannel, &[f.as_raw_fd()]).unwrap();
        assert_eq!(r, Response::Subscribed { channel });
    }

    pub(crate) fn session(&self, node_id: u16) -> u64 {
        match self.call(Request::OpenSession { node_id }) {
            Response::Session { token } => token,
            other => panic!("open session: {other:?}"),
        }
    }

    /// Imports `handle`, which must succeed (the import itself may still be pending).
    pub(crate) fn import(&self, handle: &FabricHandle) -> u64 {
        match self.call(Request::Import {
            handle: handle.to_hex(),
            import_id: 0,
            wait_ms: 0,
        }) {
            Response::Imported { import } => import,
            other => panic!("import: {other:?}"),
        }
    }

    /// The daemon's event poll (at most 8), waiting up to `wait_ms` for the first.
    pub(crate) fn events(&self, token: u64, wait_ms: u64) -> Vec<FabricEvent> {
        match self.call(Request::GetEvents {
            token,
            max: 8,
            wait_ms,
        }) {
            Response::Events { events, .. } => events,
            other => panic!("get events: {other:?}"),
        }
    }

    pub(crate) fn stats(&self) -> DriverStats {
        match self.call(Request::Stats) {
            Response::Stats(s) => s,
            other => panic!("stats: {other:?}"),
        }
    }
}

pub(crate) fn status(r: Response) -> NvStatus {
    match r {
        Response::Error { status, .. } => status,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// A handle exported on node 5, which no test node is: imports of it stay pending until a
/// daemon answers.
pub(crate) fn remote_handle(export: u64) -> FabricHandle {
    FabricHandle {
        export_uuid: ExportUuid::new(export, 5),
        index: 0,
        size: PAGE_SIZE,
        cluster_uuid: [3; 16],
    }
}

/// An application of node B that imported a remote handle (pending: no daemon answers), and
/// the import's handle.
pub(crate) fn pending_import(b: &ServerHandle, node_b: &Path, export: u64) -> (Conn, u64) {
    let app = Conn::open(b);
    app.subscribe(node_b, 0);
    let import = app.import(&remote_handle(export));
    (app, import)
}

/// §4 "Importer process exits": `app`, blocked in a wait for its import (whose MEM_IMPORT was
/// `import_event_id`), is killed: the daemon's next events are that import's unimport, at once,
/// not when the wait would have ended.
pub(crate) fn unimported_on_hang_up(daemon: &Conn, token: u64, app: Conn, import_event_id: u64) {
    std::thread::sleep(Duration::from_millis(100));
    let before = Instant::now();
    drop(app);
    let events = daemon.events(token, 10_000);
    assert!(
        matches!(
            events.as_slice(),
            [FabricEvent::Unimport { import_event_id: id, .. }] if *id == import_event_id
        ),
        "{events:?}"
    );
    assert!(
        before.elapsed() < Duration::from_secs(10),
        "the unimport came with the process's death, not with its wait's end"
    );
}
