//! An import that waits (`Import` with `wait_ms`): cuMemImportFromShareableHandle allocates the
//! IMPORT_V2 object, which succeeds at once, then waits on the object's OS event until the
//! daemon's VALIDATE signals it (`docs/reference/driver-interface.md` §1.6 "Import request" 1-4,
//! "Daemon B" 3). The simulated driver takes both in one call, so its answer names the new
//! handle whatever the outcome: the caller owns it, and releases it.

use std::thread;
use std::time::{Duration, Instant};

mod common;

use common::config;
use common::node::{Conn, TempDir, TwoNodes, remote_handle, start, status, unimported_on_hang_up};
use openimex_simgpu::server::ServerHandle;
use openimex_simproto::proto::{self, FabricEvent, NvStatus, Request, Response, Validation};

const MIB: u64 = 1 << 20;

/// An `Import` of `handle` (hex) that waits up to `wait_ms`.
fn waiting_import(handle: String, wait_ms: u64) -> Request {
    Request::Import {
        handle,
        import_id: 0,
        wait_ms,
    }
}

/// Node B's driver with a daemon session and one subscribed application: the scratch
/// directory, the driver, the daemon's connection and token, and the application.
fn node_b(name: &str) -> (TempDir, ServerHandle, Conn, u64, Conn) {
    let dir = TempDir::new(name);
    let b = start(&dir.0, 1);
    let node_b = config(&dir.0, 1).node_dir;
    let daemon = Conn::open(&b);
    let token = daemon.session(1);
    let app = Conn::open(&b);
    app.subscribe(&node_b, 0);
    (dir, b, daemon, token, app)
}

/// The one MEM_IMPORT the daemon's next poll returns.
fn the_import_event(daemon: &Conn, token: u64) -> u64 {
    let events = daemon.events(token, 10_000);
    let [FabricEvent::Import { event_id, .. }] = events.as_slice() else {
        panic!("one MEM_IMPORT for the one import: {events:?}")
    };
    *event_id
}

/// The daemon fails the import (no exporter here to describe its pages).
fn fail(daemon: &Conn, token: u64, import_event_id: u64) {
    let r = daemon.call(Request::Validate {
        token,
        import_event_id,
        result: Validation::ImportFailed,
    });
    assert_eq!(r, Response::Ok);
}

/// The application releases its import, after which the node holds nothing of it.
fn release_leaves_nothing(app: &Conn, import: u64) {
    assert_eq!(app.call(Request::Release { handle: import }), Response::Ok);
    let stats = app.stats();
    assert_eq!((stats.import_descriptors, stats.import_refs), (0, 0));
}

/// §1.6 "Daemon B" 3: the import completes when the daemons validate it, and the one call
/// answers with the memory and the handle, which is then the caller's like any import's.
#[test]
fn an_import_that_waits_answers_with_the_memory_and_the_handle_once_validated() {
    // In drop order, last first: the daemons, the drivers, the directory.
    let TwoNodes {
        dir: _dir,
        a,
        b,
        node_a,
        node_b,
        daemons: _daemons,
    } = TwoNodes::start("import-wait-ok");
    let ca = Conn::open(&a);
    ca.subscribe(&node_a, 0);
    let Response::Created {
        mem, file, offset, ..
    } = ca.call(Request::Create {
        gpu: 0,
        size: 2 * MIB,
    })
    else {
        panic!("create")
    };
    let Response::Exported { handle } = ca.call(Request::Export { mem }) else {
        panic!("export")
    };
    let cb = Conn::open(&b);
    cb.subscribe(&node_b, 0);

    let answer = cb.call(waiting_import(handle, 20_000));
    let Response::ImportWaited { import, outcome } = answer else {
        panic!("an import that waits answers ImportWaited, not {answer:?}")
    };
    let ready = Response::ImportReady {
        size: 2 * MIB,
        file,
        offset,
    };
    assert_eq!(*outcome, ready, "the exporter's memory");
    // The handle is a live import of this client: waiting on it again answers at once, and
    // releasing it is the unimport handshake, after which nothing is left on either node.
    assert_eq!(
        cb.call(Request::WaitImport {
            import,
            timeout_ms: 1
        }),
        ready
    );
    assert_eq!(cb.call(Request::Release { handle: import }), Response::Ok);
    let stats = cb.stats();
    assert_eq!((stats.import_descriptors, stats.import_refs), (0, 0));
    assert_eq!(ca.stats().daemon_export_refs, 0);
}

/// §1.6 "Import request" 4 and §4 "Failed import": an import nobody validates within the wait
/// is still pending when the call answers (NotReady, as `WaitImport`'s timeout), with one
/// MEM_IMPORT event posted; the handle waits on, and a failed VALIDATE fails it, after which
/// the caller releases it and nothing is left.
#[test]
fn an_import_whose_wait_ends_first_stays_pending_and_its_handle_waits_on() {
    let (_dir, _b, daemon, token, app) = node_b("import-wait-pending");
    let started = Instant::now();
    let answer = app.call(waiting_import(remote_handle(31).to_hex(), 200));
    let Response::ImportWaited { import, outcome } = answer else {
        panic!("{answer:?}")
    };
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "the call waited"
    );
    assert_eq!(status(*outcome), NvStatus::NotReady);
    let event_id = the_import_event(&daemon, token);

    let waiter = thread::spawn(move || {
        let r = app.call(Request::WaitImport {
            import,
            timeout_ms: 20_000,
        });
        (app, r)
    });
    thread::sleep(Duration::from_millis(100));
    fail(&daemon, token, event_id);
    let (app, r) = waiter.join().unwrap();
    assert_eq!(status(r), NvStatus::InvalidObject);
    release_leaves_nothing(&app, import);
}

/// §1.6 "Import request" 4 and §4 "Failed import": an import the daemons fail while the call
/// waits answers with the failure and the handle, which the caller releases.
#[test]
fn an_import_that_fails_while_it_waits_answers_with_the_failure_and_the_handle() {
    let (_dir, _b, daemon, token, app) = node_b("import-wait-failed");
    let caller = thread::spawn(move || {
        let r = app.call(waiting_import(remote_handle(32).to_hex(), 20_000));
        (app, r)
    });
    fail(&daemon, token, the_import_event(&daemon, token));
    let (app, r) = caller.join().unwrap();
    let Response::ImportWaited { import, outcome } = r else {
        panic!("{r:?}")
    };
    assert_eq!(status(*outcome), NvStatus::InvalidObject);
    release_leaves_nothing(&app, import);
}

/// §4 "Importer process exits": a process killed while its import waits is gone at once: the
/// import, still pending, is unimported with an event for the daemon now, not when the wait
/// would have ended.
#[test]
fn an_importer_killed_while_its_import_waits_is_unimported_at_once() {
    let (_dir, _b, daemon, token, app) = node_b("import-wait-killed");
    proto::send(
        &app.0,
        &waiting_import(remote_handle(33).to_hex(), 60_000),
        &[],
    )
    .unwrap();
    let event_id = the_import_event(&daemon, token);
    unimported_on_hang_up(&daemon, token, app, event_id);
}
