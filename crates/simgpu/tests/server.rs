//! The driver server on real sockets, in-process: channel descriptors over SCM_RIGHTS, blocking
//! calls, the daemon's event loop, clients that vanish, and the zero-copy data path between two
//! "nodes" sharing a fabric directory.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

mod common;

use common::config;
use common::node::{
    Conn, TempDir, TwoNodes, pending_import, remote_handle, start, status, unimported_on_hang_up,
};
use openimex_simgpu::server::{Server, ServerError};
use openimex_simproto::handle::FabricHandle;
use openimex_simproto::node_dir::channel_path;
use openimex_simproto::proto::{
    self, DriverStats, FabricEvent, NvStatus, Request, Response, Validation,
};

const MIB: u64 = 1 << 20;

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

fn map(file: &str, offset: u64, size: u64) -> memmap2::MmapMut {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    // SAFETY: the range is fabric memory shared on purpose with other processes; the test
    // only reads and writes plain bytes through it and keeps it alive while it is mapped.
    unsafe {
        memmap2::MmapOptions::new()
            .offset(offset)
            .len(size as usize)
            .map_mut(&f)
    }
    .unwrap()
}

#[test]
fn subscription_needs_a_descriptor_of_this_nodes_channel_file() {
    let dir = TempDir::new("subscribe");
    let a = start(&dir.0, 0);
    let b = start(&dir.0, 1);
    let node_a = config(&dir.0, 0).node_dir;
    let node_b = config(&dir.0, 1).node_dir;
    let c = Conn::open(&a);
    assert_eq!(
        status(c.call(Request::SubscribeChannel)),
        NvStatus::InsufficientPermissions,
        "no descriptor"
    );
    let null = File::open("/dev/null").unwrap();
    let r = proto::call(&c.0, &Request::SubscribeChannel, &[null.as_raw_fd()]).unwrap();
    assert_eq!(
        status(r),
        NvStatus::InsufficientPermissions,
        "not a channel"
    );
    let foreign = File::open(channel_path(&node_b, 0)).unwrap();
    let r = proto::call(&c.0, &Request::SubscribeChannel, &[foreign.as_raw_fd()]).unwrap();
    assert_eq!(
        status(r),
        NvStatus::InsufficientPermissions,
        "another node's channel"
    );
    // A read-only descriptor is the channel as well (§2: "authenticated purely by 'this fd is
    // open on an nv-caps-imex inode'"): read permission on the file is access to the channel.
    c.subscribe(&node_a, 1);
    c.subscribe(&node_a, 1);
    let ch0 = File::open(channel_path(&node_a, 0)).unwrap();
    let r = proto::call(&c.0, &Request::SubscribeChannel, &[ch0.as_raw_fd()]).unwrap();
    assert_eq!(status(r), NvStatus::StateInUse);
    // Channel files are created owner-only (§2: the file permissions are the whole access
    // policy, so a world-writable default would share every job's memory with every user).
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(channel_path(&node_a, 0))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    drop(b);
}

#[test]
fn a_second_driver_is_refused_and_a_stale_socket_is_replaced() {
    let dir = TempDir::new("bind");
    let a = start(&dir.0, 0);
    assert!(matches!(
        Server::bind(&config(&dir.0, 0)),
        Err(ServerError::AlreadyRunning(_))
    ));
    let sock = a.socket_path().to_path_buf();
    a.stop();
    assert!(!sock.exists(), "the socket file goes on stop");
    // A driver that died without cleaning up leaves a socket nobody answers on.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let again = start(&dir.0, 0);
    let c = Conn::open(&again);
    assert!(matches!(
        c.call(Request::Hello { pid: 1 }),
        Response::Hello {
            node_id: 0xFFFF,
            ..
        }
    ));
}

#[test]
fn release_blocks_until_the_daemon_finishes_the_unimport_or_goes_away() {
    let dir = TempDir::new("unimport");
    let b = start(&dir.0, 1);
    let node_b = config(&dir.0, 1).node_dir;
    let daemon = Conn::open(&b);
    let token = daemon.session(1);
    assert_eq!(
        status(Conn::open(&b).call(Request::OpenSession { node_id: 2 })),
        NvStatus::InUse
    );
    let remote = remote_handle(7);

    // An importer whose import stays pending, then is released.
    let app = Conn::open(&b);
    app.subscribe(&node_b, 0);
    let import = app.import(&remote);
    assert_eq!(
        status(app.call(Request::WaitImport {
            import,
            timeout_ms: 50
        })),
        NvStatus::NotReady
    );
    let Response::Events {
        events,
        more: false,
    } = daemon.call(Request::GetEvents {
        token,
        max: 8,
        wait_ms: 1000,
    })
    else {
        panic!()
    };
    let [
        FabricEvent::Import {
            event_id,
            export_node: 5,
            ..
        },
    ] = events.as_slice()
    else {
        panic!("{events:?}")
    };
    let (tx, rx) = mpsc::channel();
    let releaser = thread::spawn(move || {
        tx.send(app.call(Request::Release { handle: import }))
            .unwrap();
        app
    });
    let events = daemon.events(token, 5000);
    let [
        FabricEvent::Unimport {
            unimport_event_id,
            import_event_id,
            export_node: 5,
        },
    ] = events.as_slice()
    else {
        panic!("{events:?}")
    };
    assert_eq!(import_event_id, event_id);
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "release must block until FINISH_MEM_UNIMPORT"
    );
    assert_eq!(daemon.stats().pending_unimports, 1);
    assert_eq!(
        daemon.call(Request::FinishUnimport {
            token,
            unimport_event_ids: vec![*unimport_event_id]
        }),
        Response::Ok
    );
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        Response::Ok
    );
    let app = releaser.join().unwrap();

    // Same again, but the daemon dies instead of finishing: the release completes, and the
    // long-polling GetEvents of a vanished daemon does not hold the session open.
    let import = app.import(&remote);
    let (tx, rx) = mpsc::channel();
    let releaser = thread::spawn(move || {
        tx.send(app.call(Request::Release { handle: import }))
            .unwrap()
    });
    eventually("the unimport is posted", || {
        daemon.stats().pending_unimports == 1
    });
    let events = daemon.events(token, 1000);
    assert!(
        matches!(
            events.as_slice(),
            [FabricEvent::Import { .. }, FabricEvent::Unimport { .. }]
        ),
        "{events:?}"
    );
    // The daemon dies in the middle of a long poll on an empty queue.
    let poller = daemon.0.try_clone().unwrap();
    proto::send(
        &poller,
        &Request::GetEvents {
            token,
            max: 8,
            wait_ms: 60_000,
        },
        &[],
    )
    .unwrap();
    thread::sleep(Duration::from_millis(50));
    drop((daemon, poller));
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        Response::Ok
    );
    releaser.join().unwrap();
    let s = Conn::open(&b).stats();
    assert_eq!(
        (
            s.session,
            s.node_id,
            s.pending_unimports,
            s.import_descriptors
        ),
        (false, 0xFFFF, 0, 0)
    );
}

#[test]
fn imported_memory_is_the_exporters_memory_and_vanishing_clients_leak_nothing() {
    // Node IDs 0 and 1; B's imports are answered by asking A's driver directly.
    // In drop order, last first: the daemons, the drivers, the directory.
    let TwoNodes {
        dir: _dir,
        a,
        b,
        node_a,
        node_b,
        daemons,
    } = TwoNodes::start("datapath");

    // Client A creates, writes through its own mapping, exports.
    let ca = Conn::open(&a);
    ca.subscribe(&node_a, 0);
    ca.call(Request::Create {
        gpu: 1,
        size: 2 * MIB,
    }); // so the next one is not at offset 0
    let Response::Created {
        mem,
        size,
        file,
        offset,
    } = ca.call(Request::Create {
        gpu: 1,
        size: 3 * MIB,
    })
    else {
        panic!()
    };
    assert_eq!((size, offset), (4 * MIB, 2 * MIB));
    let mut mine = map(&file, offset, size);
    for (i, b) in mine.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let Response::Exported { handle } = ca.call(Request::Export { mem }) else {
        panic!()
    };

    // Two processes on B import it: one event, both read A's bytes, writes go both ways.
    let cb = Conn::open(&b);
    cb.subscribe(&node_b, 0);
    let cb2 = Conn::open(&b);
    cb2.subscribe(&node_b, 0);
    let Response::Imported { import } = cb.call(Request::Import {
        handle: handle.clone(),
        import_id: 0,
        wait_ms: 0,
    }) else {
        panic!()
    };
    let Response::Imported { import: import2 } = cb2.call(Request::Import {
        handle: handle.clone(),
        import_id: 0,
        wait_ms: 0,
    }) else {
        panic!()
    };
    let ready = cb.call(Request::WaitImport {
        import,
        timeout_ms: 10_000,
    });
    let Response::ImportReady {
        size: isize,
        file: ifile,
        offset: ioff,
    } = ready
    else {
        panic!("{ready:?}")
    };
    assert_eq!((isize, ifile.as_str(), ioff), (size, file.as_str(), offset));
    assert!(matches!(
        cb2.call(Request::WaitImport {
            import: import2,
            timeout_ms: 10_000
        }),
        Response::ImportReady { .. }
    ));
    let mut theirs = map(&ifile, ioff, isize);
    assert!(
        theirs
            .iter()
            .enumerate()
            .all(|(i, b)| *b == (i % 251) as u8),
        "B reads A's bytes"
    );
    theirs[12345] = 0xEE;
    assert_eq!(mine[12345], 0xEE, "A sees B's store");
    assert_eq!(Conn::open(&b).stats().import_descriptors, 1);
    assert_eq!(Conn::open(&a).stats().daemon_export_refs, 1);
    drop(theirs);

    // A releases its allocation: the importer's daemon reference keeps it alive.
    assert_eq!(ca.call(Request::Release { handle: mem }), Response::Ok);
    assert_eq!(mine[7], 7, "still A's data");
    assert_eq!(Conn::open(&a).stats().exports, 1);

    // Both importers vanish without releasing: the last one's exit unimports through the
    // daemons, which drop A's reference, which frees the memory.
    drop(cb);
    drop(cb2);
    eventually("B's imports are unimported", || {
        let s = Conn::open(&b).stats();
        s.import_descriptors == 0
            && s.import_refs == 0
            && s.pending_unimports == 0
            && s.queued_events == 0
    });
    eventually("A's exported memory is freed", || {
        let s = Conn::open(&a).stats();
        s.daemon_export_refs == 0 && s.exports == 0 && s.allocations == 1
    });
    assert!(mine.iter().all(|b| *b == 0), "freed memory is zeroed");

    // A vanishes too: its remaining allocation is freed.
    drop(ca);
    eventually("A's allocations are freed", || {
        let s = Conn::open(&a).stats();
        s.allocations == 0 && s.hbm_used == 0
    });
    assert_eq!(
        daemons.events_handled(),
        2,
        "one import and one unimport event"
    );
    assert_eq!(daemons.export_refs(), 0);
    assert_eq!(daemons.failures(), Vec::<String>::new());
    // Only the daemon's session and control connections (plus the asking one) remain. The
    // connections the checks above opened and dropped end on their own threads, so the count
    // is awaited rather than read once.
    for (server, node_id) in [(&a, 0), (&b, 1)] {
        let want = DriverStats {
            node_id,
            session: true,
            clients: 3,
            ..DriverStats::default()
        };
        eventually("only the daemon's connections remain", || {
            Conn::open(server).stats() == want
        });
    }
}

#[test]
fn connections_beyond_the_limit_are_closed_and_freed_slots_are_reused() {
    let dir = TempDir::new("max-clients");
    let server = Server::bind(&config(&dir.0, 0))
        .unwrap()
        .max_clients(3)
        .spawn()
        .unwrap();
    let held: Vec<Conn> = (0..3).map(|_| Conn::open(&server)).collect();
    for c in &held {
        c.stats();
    }
    // A fourth is closed at once: its call finds the connection gone, not a hang.
    let fourth = Conn::open(&server);
    assert!(proto::call(&fourth.0, &Request::Stats, &[]).is_err());
    // Once one leaves, a new client is served.
    drop(held);
    eventually("a freed slot serves a new client", || {
        let c = Conn::open(&server);
        proto::call(&c.0, &Request::Stats, &[]).is_ok()
    });
}

/// Issue 7's driver fidelity on the wire (`docs/reference/driver-interface.md`): §4 and §6.1 fabric
/// allocation and export with no daemon ever (the UUID says node 0xFFFF); §1.4 and §1.6
/// "Import request" 2 a packet naming node 0xFFFF is NOT_SUPPORTED; §1.6 "Import request" 4 and
/// §6.5 an import on a node with no daemon is NOT_READY at once, keeping nothing.
#[test]
fn with_no_daemon_memory_is_created_and_exported_but_imports_are_refused_as_the_real_driver_does() {
    let dir = TempDir::new("no-daemon");
    let a = start(&dir.0, 0);
    let node_a = config(&dir.0, 0).node_dir;
    let c = Conn::open(&a);
    c.subscribe(&node_a, 0);
    let Response::Created { mem, .. } = c.call(Request::Create {
        gpu: 0,
        size: 2 * MIB,
    }) else {
        panic!("fabric allocation with no daemon ever must succeed")
    };
    let Response::Exported { handle } = c.call(Request::Export { mem }) else {
        panic!("export with no daemon must succeed")
    };
    let h = FabricHandle::from_hex(&handle).unwrap();
    assert_eq!(h.export_uuid.node(), 0xFFFF);
    let r = c.call(Request::Import {
        handle,
        import_id: 0,
        wait_ms: 0,
    });
    let Response::Error { status, detail } = r else {
        panic!("{r:?}")
    };
    assert_eq!(status, NvStatus::NotSupported, "{detail}");
    assert!(detail.contains("0xFFFF"), "{detail}");

    // An import that would wait is refused at once all the same: there is nothing to wait for.
    let remote = remote_handle(7);
    let r = c.call(Request::Import {
        handle: remote.to_hex(),
        import_id: 0,
        wait_ms: 60_000,
    });
    let Response::Error { status, detail } = r else {
        panic!("{r:?}")
    };
    assert_eq!(status, NvStatus::NotReady, "{detail}");
    assert!(detail.contains("no IMEX daemon"), "{detail}");
    let s = c.stats();
    assert_eq!(
        (
            s.import_descriptors,
            s.import_refs,
            s.queued_events,
            s.allocations
        ),
        (0, 0, 0, 1)
    );
}

/// §2: a driver loaded with an IMEX channel count of 0 refuses every subscription with
/// NV_ERR_NOT_SUPPORTED, even with a channel file's descriptor.
#[test]
fn a_channel_count_of_zero_makes_subscription_not_supported() {
    let dir = TempDir::new("no-channels");
    let mut cfg = config(&dir.0, 0);
    cfg.imex_channel_count = 0;
    let a = Server::bind(&cfg).unwrap().spawn().unwrap();
    let c = Conn::open(&a);
    let f = File::open(channel_path(&cfg.node_dir, 0)).unwrap();
    let r = proto::call(&c.0, &Request::SubscribeChannel, &[f.as_raw_fd()]).unwrap();
    let Response::Error {
        status: refused,
        detail,
    } = r
    else {
        panic!("{r:?}")
    };
    assert_eq!(refused, NvStatus::NotSupported);
    assert!(detail.contains("channel count is 0"), "{detail}");
    assert_eq!(
        status(c.call(Request::Create {
            gpu: 0,
            size: 2 * MIB
        })),
        NvStatus::InsufficientPermissions,
        "no channel, no fabric memory"
    );
}

/// §1.4: FINISH_MEM_UNIMPORT's `numTokens` is 1..256; outside it, NV_ERR_INVALID_ARGUMENT.
#[test]
fn finish_unimport_refuses_zero_or_more_than_256_tokens() {
    let dir = TempDir::new("tokens");
    let b = start(&dir.0, 1);
    let daemon = Conn::open(&b);
    let token = daemon.session(1);
    for n in [0u64, 257] {
        assert_eq!(
            status(daemon.call(Request::FinishUnimport {
                token,
                unimport_event_ids: (1..=n).collect(),
            })),
            NvStatus::InvalidArgument,
            "{n} tokens"
        );
    }
    for n in [1u64, 256] {
        assert_eq!(
            daemon.call(Request::FinishUnimport {
                token,
                unimport_event_ids: (1..=n).collect(),
            }),
            Response::Ok,
            "{n} tokens (unknown IDs are ignored)"
        );
    }
}

/// `app` waits for `import` on a thread of its own: the answer comes on the channel, the
/// connection back when the thread is joined.
fn waiting(
    app: Conn,
    import: u64,
    timeout_ms: u64,
) -> (
    thread::JoinHandle<Conn>,
    mpsc::Receiver<Result<Response, proto::WireError>>,
) {
    let (tx, rx) = mpsc::channel();
    let t = thread::spawn(move || {
        let req = Request::WaitImport { import, timeout_ms };
        let _ = tx.send(proto::call(&app.0, &req, &[]));
        app
    });
    (t, rx)
}

/// §1.6 "Import request" 3-4 and "Daemon B" 3: VALIDATE initialises the waiting importers'
/// objects and signals their events, and only theirs. Each application blocked in its import
/// wait is answered when the daemon validates its own import, whatever else is validated or
/// queued on the node meanwhile; a wait nobody answers ends at its timeout with NotReady.
#[test]
fn each_import_wait_is_answered_by_the_validate_of_its_own_import() {
    let dir = TempDir::new("waits");
    let b = start(&dir.0, 1);
    let node_b = config(&dir.0, 1).node_dir;
    let daemon = Conn::open(&b);
    let token = daemon.session(1);
    let apps: Vec<(Conn, u64)> = (0..3)
        .map(|e| pending_import(&b, &node_b, 10 + e))
        .collect();
    let events = daemon.events(token, 1000);
    let ids: Vec<u64> = events
        .iter()
        .map(|e| match e {
            FabricEvent::Import { event_id, .. } => *event_id,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ids.len(), 3, "{events:?}");
    let waiters: Vec<_> = apps
        .into_iter()
        .enumerate()
        .map(|(i, (app, import))| waiting(app, import, if i == 2 { 300 } else { 20_000 }))
        .collect();
    thread::sleep(Duration::from_millis(100));
    // Failed imports (no exporter here to describe pages): each object reports
    // NV_ERR_INVALID_OBJECT from its VALIDATE on (§4 "Failed import").
    let fail = |id: u64| Request::Validate {
        token,
        import_event_id: id,
        result: Validation::ImportFailed,
    };
    // The second import first: only its application is answered.
    assert_eq!(daemon.call(fail(ids[1])), Response::Ok);
    let answer = waiters[1]
        .1
        .recv_timeout(Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(status(answer), NvStatus::InvalidObject);
    assert!(
        waiters[0]
            .1
            .recv_timeout(Duration::from_millis(200))
            .is_err(),
        "another import's VALIDATE must not answer this wait"
    );
    // Nobody validates the third: its wait ends at its timeout.
    assert_eq!(
        status(
            waiters[2]
                .1
                .recv_timeout(Duration::from_secs(5))
                .unwrap()
                .unwrap()
        ),
        NvStatus::NotReady
    );
    assert_eq!(daemon.call(fail(ids[0])), Response::Ok);
    let answer = waiters[0]
        .1
        .recv_timeout(Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(status(answer), NvStatus::InvalidObject);
    // The connections are still in step: each answers its next request.
    for (t, _) in waiters {
        let app = t.join().unwrap();
        assert!(matches!(app.call(Request::Stats), Response::Stats(_)));
    }
}

/// §4 "Importer process exits" and §1.6 "Unimport" 5: a process killed while it waits for its
/// import (a fatal signal ends the real wait at once) is gone at once: its import, still in
/// progress, is unimported with an event for the daemon now, not when the wait would have
/// timed out, and a driver stopping with waits in progress stops at once.
#[test]
fn an_importer_killed_in_its_import_wait_is_unimported_at_once() {
    let dir = TempDir::new("killed-wait");
    let b = start(&dir.0, 1);
    let node_b = config(&dir.0, 1).node_dir;
    let daemon = Conn::open(&b);
    let token = daemon.session(1);
    let (app, import) = pending_import(&b, &node_b, 21);
    let events = daemon.events(token, 1000);
    let [FabricEvent::Import { event_id, .. }] = events.as_slice() else {
        panic!("{events:?}")
    };
    // The application waits a minute for its import, and dies in the wait.
    proto::send(
        &app.0,
        &Request::WaitImport {
            import,
            timeout_ms: 60_000,
        },
        &[],
    )
    .unwrap();
    unimported_on_hang_up(&daemon, token, app, *event_id);

    // Another application waits; the driver stops under it.
    let (app, import) = pending_import(&b, &node_b, 22);
    let (waiter, rx) = waiting(app, import, 60_000);
    thread::sleep(Duration::from_millis(100));
    let stopping = Instant::now();
    b.stop();
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "the stop waited for a wait"
    );
    // Its connection closes; an error answer may get there first (the stopping driver ends
    // the wait with NV_ERR_INVALID_STATE), never a ready import.
    match rx.recv_timeout(Duration::from_secs(5)).unwrap() {
        Err(_) | Ok(Response::Error { .. }) => {}
        Ok(other) => panic!("a stopped driver answered a wait with {other:?}"),
    }
    waiter.join().unwrap();
}

/// §1.2 NV_IMEX_SESSION: one session system-wide, NV_ERR_IN_USE to a second daemon while the
/// first lives. §4 "Daemon dies or restarts": a dead daemon's session is destroyed as the
/// kernel closes its descriptors, before its parent can reap it, so a successor started the
/// moment the predecessor is gone gets the session, every time, whether the predecessor died
/// between two calls or with its event poll blocked in the driver (as a daemon's is).
#[test]
fn a_daemon_gone_never_keeps_its_successor_from_the_session() {
    let dir = TempDir::new("successor");
    let a = start(&dir.0, 0);
    let mut daemon = Conn::open(&a);
    let mut token = daemon.session(1);
    for round in 0..300 {
        assert_eq!(
            status(Conn::open(&a).call(Request::OpenSession { node_id: 1 })),
            NvStatus::InUse,
            "round {round}: a second daemon while the first lives"
        );
        let poll = (round % 2 == 1).then(|| {
            let stream = daemon.0.try_clone().unwrap();
            let poll = thread::spawn(move || {
                let req = Request::GetEvents {
                    token,
                    max: 8,
                    wait_ms: 20_000,
                };
                // The answer never comes: the connection is shut under the call.
                proto::call(&stream, &req, &[]).is_err()
            });
            // Time to be parked (if it is not yet, the hang-up finds it unread: also a death).
            thread::sleep(Duration::from_millis(5));
            poll
        });
        // The daemon dies: every descriptor of its connection closes at once.
        daemon.0.shutdown(std::net::Shutdown::Both).unwrap();
        drop(daemon);
        let successor = Conn::open(&a);
        match successor.call(Request::OpenSession { node_id: 1 }) {
            Response::Session { token: t } => token = t,
            other => panic!("round {round}: the successor was answered {other:?}"),
        }
        if let Some(poll) = poll {
            assert!(
                poll.join().unwrap(),
                "round {round}: the dead poll was answered"
            );
        }
        daemon = successor;
    }
}
