//! The client against the real simulated driver (`openimex_simgpu::server`), started in-process
//! on two nodes that share a fabric directory, with a loopback stand-in for their IMEX daemons
//! (`openimex_simgpu::testing`): channel descriptor passing, import waits, CUDA error mapping,
//! and contexts on two nodes seeing the same bytes through their mappings. The `cli_*` tests
//! run this test binary again as `openimex-lab app` (see `cli_child`) with piped stdin/stdout.
//!
//! Where a test asserts what the driver does, the comment names the section of
//! `docs/reference/driver-interface.md` that the simulated driver follows there.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ExitCode};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use openimex_client::node_dir::{channel_path, channels_dir, socket_path};
use openimex_client::{Context, FabricHandleBytes, Mappable, pattern};
use openimex_harness::ScratchDir;
use openimex_simproto::proto::{DEFAULT_IMEX_CHANNEL_COUNT, PAGE_SIZE};

mod common;

use common::{Domain, NODE_A, NODE_B, Node, code, eventually};

#[test]
fn no_driver_is_no_device() {
    let dir = ScratchDir::new("client-it-none").expect("scratch dir");
    let e = Context::open(dir.path()).unwrap_err();
    assert_eq!((e.code(), e.name()), (100, "CUDA_ERROR_NO_DEVICE"));
    let text = e.to_string();
    assert!(
        text.contains(&socket_path(dir.path()).display().to_string())
            && text.contains("openimex-lab gpu"),
        "{text}"
    );
}

#[test]
fn export_import_map_share_the_same_bytes() {
    let d = Domain::start("share");
    let a = Context::open(&d.a.dir).unwrap();
    // The driver resolved the passed descriptor to the channel file it is open on (§2: the
    // descriptor is the proof, the channel is the file's number, not anything the client says).
    assert_eq!(
        a.channel(),
        Some(3),
        "lowest-numbered accessible channel, passed as a descriptor"
    );
    // The node ID is the one the daemon opened the session with (§1.6 start-up 5).
    assert_eq!((a.node_id(), a.gpus().len()), (NODE_A, 1));
    let mem = a.mem_create(0, 3 << 20).unwrap();
    // Fabric memory comes in 2 MiB pages (§6.4).
    assert_eq!(mem.size(), 4 << 20, "rounded to 2 MiB by the driver");
    let mut a_view = a.map(&mem).unwrap();
    pattern::fill(&mut a_view, 5);
    let handle = a.export(&mem).unwrap();
    let handle = FabricHandleBytes::from_hex(&handle.to_hex()).unwrap();

    // Node B imports through MEM_IMPORT, the daemons and VALIDATE (§1.6).
    let b = Context::open(&d.b.dir).unwrap();
    assert_eq!((b.node_id(), b.channel()), (NODE_B, Some(3)));
    let imported = b.import(&handle).unwrap();
    let mut b_view = b.map(&imported).unwrap();
    assert_eq!(b_view.len(), 4 << 20);
    assert_eq!(pattern::verify(&b_view, 5), Ok(()));
    assert_ne!(a_view.as_ptr(), b_view.as_ptr(), "two mappings");
    // Zero copy: B's stores are in A's mapping with no call in between, and back.
    pattern::fill(&mut b_view, 6);
    assert_eq!(pattern::verify(&a_view, 6), Ok(()));
    a_view[100] ^= 0xff;
    assert_eq!(pattern::verify(b_view.as_slice(), 6), Err(100));

    // A second context on A imports it locally: the same memory again (the local dup path,
    // which the kernel allows, §8; no daemon involved).
    let a2 = Context::open(&d.a.dir).unwrap();
    let local = a2.import(&handle).unwrap();
    assert_eq!(pattern::verify(&a2.map(&local).unwrap(), 6), Err(100));

    let sa = d.a.stats();
    // Contexts a and a2, and the daemon's session and control connections.
    assert_eq!(
        (
            sa.allocations,
            sa.exports,
            sa.daemon_export_refs,
            sa.clients
        ),
        (1, 1, 1, 4)
    );
    let sb = b.stats().unwrap();
    assert_eq!(
        (sb.import_descriptors, sb.import_refs, sb.clients),
        (1, 1, 3)
    );
    drop(b_view);
    // The release blocks until the daemon finished the unimport, which dropped the exporter's
    // daemon reference (§1.6 unimport, §4).
    b.release(imported).unwrap();
    assert_eq!(b.stats().unwrap().import_descriptors, 0);
    assert_eq!(d.a.stats().daemon_export_refs, 0);
    a2.release(local).unwrap();
    drop(a_view);
    a.release(mem).unwrap();
    let sa = d.a.stats();
    assert_eq!((sa.allocations, sa.exports, sa.hbm_used), (0, 0, 0));
    // The export left the export cache with its last reference, so the exporter's driver
    // answers OBJECT_NOT_FOUND, the importer's daemon sends VALIDATE with IMPORT_FAILED, and the
    // import is NV_ERR_INVALID_OBJECT (§4: exporter frees, failed import).
    let e = b.import(&handle).unwrap_err();
    assert_eq!(
        (e.code(), e.name()),
        (400, "CUDA_ERROR_INVALID_HANDLE"),
        "a released export is an invalid handle: {e}"
    );
    assert!(e.to_string().contains("NV_ERR_INVALID_OBJECT"), "{e}");
    assert_eq!(
        b.stats().unwrap().import_descriptors,
        0,
        "the failed import was released"
    );
    d.check_daemons();
}

#[test]
fn channels_gate_fabric_calls_and_errors_have_cuda_codes() {
    let d = Domain::start("channels");
    // An unsubscribed client cannot create fabric memory (§2 enforcement points, §3 errors).
    let none = Context::open_with_channel(&d.a.dir, None).unwrap();
    assert_eq!(none.channel(), None);
    assert_eq!(code(none.mem_create(0, PAGE_SIZE)), 800);

    let ch7 = Context::open_with_channel(&d.a.dir, Some(&channel_path(&d.a.dir, 7))).unwrap();
    assert_eq!(
        ch7.channel(),
        Some(7),
        "the driver saw channel7's descriptor"
    );
    let a = Context::open(&d.a.dir).unwrap();
    let mem = a.mem_create(0, PAGE_SIZE).unwrap();
    let handle = a.export(&mem).unwrap();
    // Another channel than the exporter's: refused on the exporter's own node (§2: dup by UUID
    // needs the same channel; NOT_PERMITTED). On another node the exporter's daemon enforces
    // it (§2: events carry the channel), and the importer's daemon can only fail the import:
    // VALIDATE with IMPORT_FAILED, so the app sees NV_ERR_INVALID_OBJECT (§4 "Failed import"),
    // not the exporter's INSUFFICIENT_PERMISSIONS.
    assert_eq!(
        code(ch7.import(&handle)),
        800,
        "another channel than the exporter's, same node"
    );
    let b7 = Context::open_with_channel(&d.b.dir, Some(&channel_path(&d.b.dir, 7))).unwrap();
    assert_eq!(
        code(b7.import(&handle)),
        400,
        "another channel than the exporter's, other node: a failed import"
    );
    // IMPORT_V2 needs a subscription (§2).
    assert_eq!(code(none.import(&handle)), 800, "no channel");
    let missing = channel_path(&d.a.dir, 9);
    assert_eq!(
        code(Context::open_with_channel(&d.a.dir, Some(&missing))),
        800,
        "a channel file that does not exist"
    );
    // A descriptor that is not open on a channel file is refused (§2: INSUFFICIENT_PERMISSIONS).
    let not_a_channel = channels_dir(&d.a.dir).join("channelx");
    assert_eq!(
        code(Context::open_with_channel(&d.a.dir, Some(&not_a_channel))),
        800,
        "a file that is no channel"
    );

    assert_eq!(
        code(a.import(&FabricHandleBytes([0; 64]))),
        400,
        "garbage bytes are an invalid handle"
    );
    assert_eq!(code(a.mem_create(0, 0)), 1, "size 0 is an invalid value");
    assert_eq!(code(ch7.release(mem)), 400, "another context's handle");
    assert_eq!(d.a.stats().allocations, 1, "and it was not released");
    d.check_daemons();
}

/// Node A's application exports a page filled with `seed`'s pattern, then the daemons stop
/// answering events: the exporter's context (which owns the allocation) and the handle.
fn exported_with_daemons_paused(d: &Domain, seed: u64) -> (Context, FabricHandleBytes) {
    let a = Context::open(&d.a.dir).unwrap();
    let mem = a.mem_create(0, PAGE_SIZE).unwrap();
    pattern::fill(&mut a.map(&mem).unwrap(), seed);
    let handle = a.export(&mem).unwrap();
    assert!(d.daemons.pause(), "the daemons stop answering events");
    (a, handle)
}

#[test]
fn import_gives_up_with_not_ready_after_the_bound_and_completes_once_the_daemon_answers() {
    let d = Domain::start("not-ready");
    let (_a, handle) = exported_with_daemons_paused(&d, 9);
    let b = Context::open(&d.b.dir).unwrap();
    let start = Instant::now();
    // Using an import before the daemon validated it is NOT_READY (§1.6 import request 4).
    let e = b
        .import_with_timeout(&handle, Duration::from_millis(300))
        .unwrap_err();
    assert_eq!((e.code(), e.name()), (600, "CUDA_ERROR_NOT_READY"), "{e}");
    assert!(
        start.elapsed() >= Duration::from_millis(300) && start.elapsed() < Duration::from_secs(5)
    );
    // The import stays pending in the driver, its MEM_IMPORT queued for the daemon.
    let s = d.b.stats();
    assert_eq!((s.import_descriptors, s.queued_events), (1, 1));

    // A second import of the same handle shares the pending descriptor, posts no second event
    // (§1.6 import request 3), and completes when the daemon answers the first one.
    d.daemons.resume();
    let imported = b.import(&handle).unwrap();
    assert_eq!(pattern::verify(&b.map(&imported).unwrap(), 9), Ok(()));
    let s = d.b.stats();
    assert_eq!(
        (s.import_descriptors, s.import_refs, s.queued_events),
        (1, 2, 0)
    );
    assert_eq!(d.daemons.events_handled(), 1, "one MEM_IMPORT");
    d.check_daemons();
}

/// An import the daemons complete later than the library's first wait (one call that imports
/// and waits up to a second) is waited for on, a slice at a time, within its bound: the import
/// and its wait are one call, the rest `WaitImport`s on the same handle.
#[test]
fn an_import_the_daemons_answer_after_the_first_wait_still_completes() {
    let d = Domain::start("slow-daemon");
    let (_a, handle) = exported_with_daemons_paused(&d, 4);
    let b = Context::open(&d.b.dir).unwrap();
    let start = Instant::now();
    let imported = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(1300));
            d.daemons.resume();
        });
        b.import_with_timeout(&handle, Duration::from_secs(20))
    })
    .unwrap();
    assert!(start.elapsed() >= Duration::from_millis(1300));
    assert_eq!(pattern::verify(&b.map(&imported).unwrap(), 4), Ok(()));
    let s = d.b.stats();
    assert_eq!((s.import_descriptors, s.import_refs), (1, 1));
    assert_eq!(d.daemons.events_handled(), 1, "one MEM_IMPORT");
    b.release(imported).unwrap();
    d.check_daemons();
}

#[test]
fn a_context_is_shared_between_threads() {
    fn sync<T: Send + Sync>(_: &T) {}
    let d = Domain::start("threads");
    let ctx = Context::open(&d.a.dir).unwrap();
    sync(&ctx);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..25 {
                    let m = ctx.mem_create(0, PAGE_SIZE).unwrap();
                    assert_eq!(ctx.stats().unwrap().node_id, NODE_A);
                    ctx.release(m).unwrap();
                }
            });
        }
    });
    let s = ctx.stats().unwrap();
    assert_eq!((s.allocations, s.hbm_used), (0, 0));
}

// ---- driver fidelity (issue 7), each as the real driver does it ----

/// §4 "Failed import" (and §1.6 "Daemon B" 2): whatever the exporter's driver answered the
/// daemons, a failed import reaches the app as NV_ERR_INVALID_OBJECT, which the client maps to
/// CUDA_ERROR_INVALID_HANDLE (§3: "invalid resource handle"). The exporter's statuses here are
/// INSUFFICIENT_PERMISSIONS (would be 800) and OBJECT_NOT_FOUND: neither comes out.
#[test]
fn a_failed_import_is_invalid_object_whatever_the_exporter_answered() {
    let d = Domain::start("failed-import");
    let a = Context::open(&d.a.dir).unwrap();
    let mem = a.mem_create(0, PAGE_SIZE).unwrap();
    let handle = a.export(&mem).unwrap();
    let b7 = Context::open_with_channel(&d.b.dir, Some(&channel_path(&d.b.dir, 7))).unwrap();
    let refused = b7.import(&handle).unwrap_err();
    a.release(mem).unwrap();
    let b = Context::open(&d.b.dir).unwrap();
    let gone = b.import(&handle).unwrap_err();
    for e in [refused, gone] {
        assert_eq!(
            (e.code(), e.name()),
            (400, "CUDA_ERROR_INVALID_HANDLE"),
            "{e}"
        );
        assert!(e.to_string().contains("NV_ERR_INVALID_OBJECT"), "{e}");
    }
    let s = d.b.stats();
    assert_eq!((s.import_descriptors, s.import_refs), (0, 0));
    d.check_daemons();
}

/// §4 and §6.1: fabric allocation is allowed from load, so a node whose daemon never started
/// creates and exports memory (§1.4: the UUID carries node 0xFFFF). §1.4 and §1.6 "Import
/// request" 2: that handle is NOT_SUPPORTED on any other node. §1.6 "Import request" 4 and
/// §6.5: an import on the node with no daemon is NOT_READY at once.
#[test]
fn a_node_with_no_daemon_allocates_exports_and_refuses_imports_as_the_real_driver() {
    let d = Domain::start("no-daemon");
    let fabric_dir = d.dir.path().join("fabric");
    let c = Node::start(d.dir.path(), &fabric_dir, 2, DEFAULT_IMEX_CHANNEL_COUNT);
    let ctx = Context::open(&c.dir).unwrap();
    assert_eq!(ctx.node_id(), 0xFFFF, "no daemon session on node C");
    let mem = ctx
        .mem_create(0, PAGE_SIZE)
        .expect("fabric memory with no daemon ever");
    pattern::fill(&mut ctx.map(&mem).unwrap(), 3);
    let single = ctx.export(&mem).expect("export with no daemon");

    let b = Context::open(&d.b.dir).unwrap();
    let e = b.import(&single).unwrap_err();
    assert_eq!(
        (e.code(), e.name()),
        (801, "CUDA_ERROR_NOT_SUPPORTED"),
        "{e}"
    );
    let e = ctx.import(&single).unwrap_err();
    assert_eq!(e.code(), 801, "not even on its own node: {e}");

    let a = Context::open(&d.a.dir).unwrap();
    let on_a = a.export(&a.mem_create(0, PAGE_SIZE).unwrap()).unwrap();
    let start = Instant::now();
    let e = ctx.import(&on_a).unwrap_err();
    assert_eq!((e.code(), e.name()), (600, "CUDA_ERROR_NOT_READY"), "{e}");
    assert!(e.to_string().contains("IMEX daemon"), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "refused at once, not after the import timeout"
    );
    let s = c.stats();
    assert_eq!(
        (s.import_descriptors, s.import_refs, s.queued_events),
        (0, 0, 0)
    );
    assert_eq!(pattern::verify(&ctx.map(&mem).unwrap(), 3), Ok(()));
    d.check_daemons();
}

/// §1.4 (the import key is `(id << 16) | index` under the UUID; `id` < 2^48 - 1) and §1.6
/// "Import request" 3: imports with the same ID share a descriptor and one trip through the
/// daemons; a different ID gets its own descriptor, event and exporter reference.
#[test]
fn imports_share_a_descriptor_only_with_the_same_import_id() {
    let d = Domain::start("import-id");
    let a = Context::open(&d.a.dir).unwrap();
    let mem = a.mem_create(0, PAGE_SIZE).unwrap();
    pattern::fill(&mut a.map(&mem).unwrap(), 8);
    let handle = a.export(&mem).unwrap();
    let b = Context::open(&d.b.dir).unwrap();
    let t = Duration::from_secs(10);
    let first = b.import_with_id(&handle, 0, t).unwrap();
    let same = b.import(&handle).unwrap();
    let other = b.import_with_id(&handle, 0x1234_5678_9abc, t).unwrap();
    let s = d.b.stats();
    assert_eq!((s.import_descriptors, s.import_refs), (2, 3));
    assert_eq!(d.a.stats().daemon_export_refs, 2);
    assert_eq!(d.daemons.events_handled(), 2, "two MEM_IMPORT events");
    for m in [&first, &same, &other] {
        assert_eq!(pattern::verify(&b.map(m).unwrap(), 8), Ok(()));
    }
    let e = b.import_with_id(&handle, (1 << 48) - 1, t).unwrap_err();
    assert_eq!(e.code(), 1, "2^48 - 1 is reserved: {e}");
    for m in [first, same, other] {
        b.release(m).unwrap();
    }
    assert_eq!(d.b.stats().import_descriptors, 0);
    assert_eq!(d.a.stats().daemon_export_refs, 0);
    d.check_daemons();
}

/// §2: a driver with an IMEX channel count of 0 refuses the channel subscription with
/// NV_ERR_NOT_SUPPORTED, which libcuda reports as CUDA_ERROR_NOT_SUPPORTED (§3).
#[test]
fn a_driver_with_no_imex_channels_is_not_supported() {
    let dir = ScratchDir::new("client-it-nochannels").expect("scratch dir");
    let fabric_dir = dir.path().join("fabric");
    let n = Node::start(dir.path(), &fabric_dir, 0, 0);
    let e = Context::open(&n.dir).unwrap_err();
    assert_eq!(
        (e.code(), e.name()),
        (801, "CUDA_ERROR_NOT_SUPPORTED"),
        "{e}"
    );
    let e = Context::open_with_channel(&n.dir, Some(&channel_path(&n.dir, 3))).unwrap_err();
    assert_eq!(e.code(), 801, "{e}");
    let none = Context::open_with_channel(&n.dir, None).unwrap();
    assert_eq!(code(none.mem_create(0, PAGE_SIZE)), 800, "no channel");
}

// ---- the CLI, as a child process ----

const CHILD_ARGS: &str = "OPENIMEX_CLIENT_TEST_CLI_ARGS";

/// Not a test of its own: the entry point when this binary is re-run as `openimex-lab app`.
#[test]
fn cli_child() {
    let Ok(args) = std::env::var(CHILD_ARGS) else {
        return;
    };
    let args: Vec<OsString> = std::iter::once("openimex-lab app".into())
        .chain(args.split('\u{1f}').map(OsString::from))
        .collect();
    let code = openimex_client::cli::main(args);
    let code = [0, 1, 2]
        .into_iter()
        .find(|c| ExitCode::from(*c) == code)
        .unwrap_or(99);
    std::process::exit(i32::from(code));
}

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        Self::spawn_as(args, None)
    }

    /// As [`Proc::spawn`], as user `uid` if given (the tests run as root).
    fn spawn_as(args: &[&str], uid: Option<u32>) -> Proc {
        let mut child = common::rerun_as("cli_child", (CHILD_ARGS, args.join("\u{1f}")), uid)
            .spawn()
            .unwrap();
        let (tx, lines) = channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                // libtest's own banner.
                if !line.is_empty() && !line.starts_with("running ") && tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Proc {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr: Some(stderr),
        }
    }

    fn line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| "<no line>".into())
    }

    fn ask(&mut self, cmd: &str) -> String {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        self.line()
    }

    /// Closes stdin, waits; exit code, the rest of stdout, stderr.
    fn finish(mut self) -> (i32, String, String) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        let rest: Vec<String> = self.lines.iter().collect();
        (
            status.code().unwrap_or(-1),
            rest.join("\n"),
            self.stderr
                .take()
                .and_then(|t| t.join().ok())
                .unwrap_or_default(),
        )
    }
}

impl Drop for Proc {
    /// A child left running by a failed assertion must not outlive the test.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn run(args: &[&str]) -> (i32, String, String) {
    Proc::spawn(args).finish()
}

fn path_arg(p: &Path) -> String {
    p.display().to_string()
}

/// The user the permission tests run their applications as.
const NOBODY: u32 = 65534;

/// §2 (and the guide's §8): the channel files' permissions are the whole access policy. A
/// process that can open no channel file read-write (user nobody; the files are root's, 0644
/// and 0600) subscribes to none, and fabric export and import fail with NOT_PERMITTED (the
/// driver's NV_ERR_INSUFFICIENT_PERMISSIONS) before any memory is touched. Once a channel file
/// is the user's, its subscription goes through.
#[test]
fn cli_a_user_who_cannot_open_a_channel_is_not_permitted() {
    use std::os::unix::fs::PermissionsExt;
    let d = Domain::start("perm");
    let root = Context::open(&d.a.dir).unwrap();
    assert_eq!(root.channel(), Some(3), "root opens any channel file");
    let handle = root
        .export(&root.mem_create(0, PAGE_SIZE).unwrap())
        .unwrap();
    for ch in [3, 7] {
        let p = channel_path(&d.b.dir, ch);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let node_b = d.b.arg();
    let hex = handle.to_hex();
    let as_nobody = |args: &[&str]| Proc::spawn_as(args, Some(NOBODY)).finish();
    let (rc, _, err) = as_nobody(&["import", "--node-dir", &node_b, "--handle", &hex]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("import failed: CUDA_ERROR_NOT_PERMITTED (800)"),
        "{err}"
    );
    let export = [
        "export",
        "--node-dir",
        &node_b,
        "--size",
        "2M",
        "--pattern",
        "1",
    ];
    let (rc, _, err) = as_nobody(&export);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("CUDA_ERROR_NOT_PERMITTED (800)"), "{err}");
    // Naming a channel file the user cannot open is refused too, and names the file.
    let ch7 = path_arg(&channel_path(&d.b.dir, 7));
    let (rc, _, err) = as_nobody(&["stats", "--node-dir", &node_b, "--channel", &ch7]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("channel7"), "{err}");
    // The same file, given to the user: the subscription succeeds.
    std::os::unix::fs::chown(channel_path(&d.b.dir, 7), Some(NOBODY), Some(NOBODY)).unwrap();
    let (rc, out, err) = as_nobody(&["stats", "--node-dir", &node_b, "--channel", &ch7]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("allocations"), "{out}");
    assert_eq!(d.b.stats().import_descriptors, 0, "nothing was imported");
    d.check_daemons();
}

#[test]
fn cli_export_hold_sees_the_importers_writes() {
    let d = Domain::start("cli");
    let (node_a, node_b) = (d.a.arg(), d.b.arg());
    let hfile = path_arg(&d.dir.path().join("handle"));
    let at_file = format!("@{hfile}");
    let mut exporter = Proc::spawn(&[
        "export",
        "--node-dir",
        &node_a,
        "--gpu",
        "0",
        "--size",
        "4M",
        "--pattern",
        "11",
        "--handle-out",
        &hfile,
        "--hold",
    ]);
    let handle = exporter.line();
    assert_eq!(handle.len(), 128, "{handle}");
    assert_eq!(std::fs::read_to_string(&hfile).unwrap().trim(), handle);

    // The importers run on node B: every import goes through the daemons.
    let (rc, out, err) = run(&[
        "import",
        "--node-dir",
        &node_b,
        "--handle",
        &at_file,
        "--verify",
        "11",
        "--write",
        "0x12",
    ]);
    assert_eq!(
        (rc, out.as_str()),
        (0, "verified 4194304\nwritten 4194304"),
        "{err}"
    );
    assert_eq!(exporter.ask("verify-write 0x12"), "ok");
    assert!(exporter.ask("verify-write 11").starts_with("mismatch at "));

    let (rc, out, err) = run(&[
        "import",
        "--node-dir",
        &node_b,
        "--handle",
        &handle,
        "--verify",
        "11",
    ]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.starts_with("mismatch at ")
            && err.contains("openimex-lab app: verify failed: mismatch at"),
        "{out} / {err}"
    );
    // IMPORT_V2 without a channel subscription (§2).
    let (rc, _, err) = run(&[
        "import",
        "--node-dir",
        &node_b,
        "--handle",
        &handle,
        "--no-channel",
    ]);
    assert_eq!(rc, 1);
    assert!(
        err.contains("openimex-lab app: import failed: CUDA_ERROR_NOT_PERMITTED (800): "),
        "{err}"
    );
    let (rc, _, err) = run(&["import", "--node-dir", &node_b, "--handle", "nothex"]);
    assert!(
        rc == 1 && err.contains("CUDA_ERROR_INVALID_VALUE (1)"),
        "{err}"
    );
    let (rc, _, err) = run(&["import", "--node-dir", &node_b]);
    assert_eq!(rc, 2, "usage: {err}");

    // An importer that holds, then exits without releasing: its driver frees the import as at
    // process exit, through the unimport handshake, and the exporter's daemon reference goes
    // with it (§4: importer process exits).
    let mut holder = Proc::spawn(&[
        "import",
        "--node-dir",
        &node_b,
        "--handle",
        &handle,
        "--verify",
        "0x12",
        "--hold",
        "--no-release",
    ]);
    assert_eq!(
        (holder.line(), holder.line()),
        ("verified 4194304".into(), "holding".into())
    );
    assert_eq!(exporter.ask("write 13"), "written 4194304");
    assert_eq!(holder.ask("verify 13"), "ok");
    assert_eq!(d.b.stats().import_descriptors, 1);
    assert_eq!(d.a.stats().daemon_export_refs, 1);
    assert_eq!(holder.finish().0, 0);
    eventually("the driver sees the importer go", || {
        let s = d.b.stats();
        s.import_descriptors == 0 && s.pending_unimports == 0
    });
    assert_eq!(d.a.stats().daemon_export_refs, 0);

    assert_eq!(exporter.ask("release"), "released");
    assert_eq!(exporter.ask("verify 13"), "error: released");
    let (rc, out, err) = run(&["stats", "--node-dir", &node_a]);
    assert_eq!(rc, 0, "{err}");
    let stats: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (stats["allocations"].as_u64(), stats["node_id"].as_u64()),
        (Some(0), Some(u64::from(NODE_A)))
    );
    let (rc, out, _) = exporter.finish();
    assert_eq!((rc, out.as_str()), (0, ""));
    d.check_daemons();
}

#[test]
fn cli_hold_ends_on_sigterm_with_a_release() {
    use nix::sys::signal::{Signal, kill};
    let d = Domain::start("cli-term");
    let node = d.a.arg();
    let mut exporter = Proc::spawn(&[
        "export",
        "--node-dir",
        &node,
        "--size",
        "2097152",
        "--pattern",
        "1",
        "--hold",
    ]);
    assert_eq!(exporter.line().len(), 128);
    assert_eq!(d.a.stats().allocations, 1);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(exporter.child.id()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    let status = exporter.child.wait().unwrap(); // stdin still open: the signal ends it
    let (_, _, err) = exporter.finish();
    assert_eq!(status.code(), Some(0), "{status:?} {err}");
    // Released by the command itself, not by the driver at disconnect: the count is 0 as soon
    // as the process has exited.
    assert_eq!(d.a.stats().allocations, 0);
}
