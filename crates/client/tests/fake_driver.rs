//! The client against a small in-test fake driver that speaks `openimex_simgpu::proto`:
//! wire handling, channel descriptor passing, import waits, CUDA error mapping, and two
//! contexts seeing the same bytes through their mappings. The `cli_*` tests run this test
//! binary again as `openimex app` (see `cli_child`) with piped stdin/stdout.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openimex_client::{
    Context, CuError, FabricHandleBytes, Mappable, channel_dir, driver_socket, pattern,
};
use openimex_simgpu::handle::{ExportUuid, FabricHandle};
use openimex_simgpu::proto::{self, DriverStats, GpuInfo, NvStatus, PAGE_SIZE, Request, Response};

const NODE: u16 = 3;

/// One object of the fake driver.
#[derive(Clone)]
struct Obj {
    owner: usize,
    offset: u64,
    size: u64,
    channel: u32,
    /// For imports: `WaitImport` calls seen (the first answers NOT_READY, as a pending import).
    waits: u32,
    import: bool,
}

#[derive(Default)]
struct State {
    next: u64,
    objs: HashMap<u64, Obj>,
    /// Export UUID (hex) → allocation.
    exports: HashMap<String, u64>,
    hbm_end: u64,
    clients: usize,
    /// Imports never complete.
    stall: bool,
}

struct Fake {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
}

static DIRS: AtomicUsize = AtomicUsize::new(0);

impl Fake {
    /// A node directory with channels 3 and 7 (and a file that is no channel), and a driver.
    fn start() -> Fake {
        let n = DIRS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("oimx-client-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(channel_dir(&dir)).unwrap();
        std::fs::create_dir_all(dir.join("fabric")).unwrap();
        for ch in ["channel7", "channel3", "channelx"] {
            std::fs::write(channel_dir(&dir).join(ch), b"").unwrap();
        }
        let listener = UnixListener::bind(driver_socket(&dir)).unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let (st, fabric) = (state.clone(), dir.join("fabric"));
        std::thread::spawn(move || {
            for (client, conn) in listener.incoming().enumerate() {
                let Ok(conn) = conn else { return };
                let (st, fabric) = (st.clone(), fabric.clone());
                std::thread::spawn(move || serve(&conn, client, &st, &fabric));
            }
        });
        Fake { dir, state }
    }

    fn stats(&self) -> DriverStats {
        Context::open(&self.dir).unwrap().stats().unwrap()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn serve(conn: &UnixStream, client: usize, state: &Mutex<State>, fabric: &Path) {
    state.lock().unwrap().clients += 1;
    let mut channel = None;
    while let Ok((req, fds)) = proto::recv::<Request>(conn) {
        let resp =
            handle(req, &fds, client, &mut channel, state, fabric).unwrap_or_else(|status| {
                Response::Error {
                    status,
                    detail: "fake driver".into(),
                }
            });
        if proto::send(conn, &resp, &[]).is_err() {
            break;
        }
    }
    // Disconnect frees the client's objects, as process exit does.
    let mut st = state.lock().unwrap();
    st.clients -= 1;
    st.objs.retain(|_, o| o.owner != client);
    let State { objs, exports, .. } = &mut *st;
    exports.retain(|_, mem| objs.contains_key(mem));
}

fn handle(
    req: Request,
    fds: &[std::os::fd::OwnedFd],
    client: usize,
    channel: &mut Option<u32>,
    state: &Mutex<State>,
    fabric: &Path,
) -> Result<Response, NvStatus> {
    use NvStatus::*;
    let hbm = "hbm-n0003-g00";
    // WaitImport sleeps without the lock.
    if let Request::WaitImport { import, timeout_ms } = req {
        let (stall, obj) = {
            let mut st = state.lock().unwrap();
            let stall = st.stall;
            let o = st
                .objs
                .get_mut(&import)
                .filter(|o| o.owner == client && o.import)
                .ok_or(InvalidObjectHandle)?;
            o.waits += 1;
            (stall, o.clone())
        };
        if stall || obj.waits == 1 {
            std::thread::sleep(Duration::from_millis(timeout_ms.min(20)));
            return Err(NotReady);
        }
        return Ok(Response::ImportReady {
            size: obj.size,
            file: fabric.join(hbm).display().to_string(),
            offset: obj.offset,
        });
    }
    let mut st = state.lock().unwrap();
    st.next += 1;
    let id = st.next;
    Ok(match req {
        Request::Hello { .. } => Response::Hello {
            node_id: NODE,
            gpus: vec![GpuInfo {
                index: 0,
                uuid: "GPU-fake".into(),
                hbm_bytes: 1 << 30,
                fabric_state: "COMPLETED".into(),
                cluster_uuid: "01".into(),
                clique_id: 1,
                health: "HEALTHY".into(),
                fabric_base: 0,
            }],
            fabric_dir: fabric.display().to_string(),
        },
        Request::SubscribeChannel => {
            // The channel is the number in the name of the file the descriptor is open on.
            let [fd] = fds else {
                return Err(InsufficientPermissions);
            };
            let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                .map_err(|_| InsufficientPermissions)?;
            let name = link
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let n: u32 = name
                .strip_prefix("channel")
                .and_then(|n| n.parse().ok())
                .ok_or(InsufficientPermissions)?;
            if channel.is_some_and(|c| c != n) {
                return Err(StateInUse);
            }
            *channel = Some(n);
            Response::Subscribed { channel: n }
        }
        Request::Create { gpu, size } => {
            let ch = channel.ok_or(InsufficientPermissions)?;
            if gpu != 0 || size == 0 {
                return Err(InvalidArgument);
            }
            let size = size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
            let offset = st.hbm_end;
            st.hbm_end += size;
            let f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(fabric.join(hbm))
                .map_err(|_| NoMemory)?;
            f.set_len(st.hbm_end).map_err(|_| NoMemory)?;
            st.objs.insert(
                id,
                Obj {
                    owner: client,
                    offset,
                    size,
                    channel: ch,
                    waits: 0,
                    import: false,
                },
            );
            // A relative name: the client resolves it in the fabric directory.
            Response::Created {
                mem: id,
                size,
                file: hbm.into(),
                offset,
            }
        }
        Request::Export { mem } => {
            let ch = channel.ok_or(InsufficientPermissions)?;
            let o = st
                .objs
                .get(&mem)
                .filter(|o| o.owner == client && !o.import)
                .ok_or(InvalidObjectHandle)?;
            if o.channel != ch {
                return Err(InsufficientPermissions);
            }
            let h = FabricHandle {
                export_uuid: ExportUuid::new(mem, NODE),
                index: 0,
                size: o.size,
                cluster_uuid: [1; 16],
            };
            st.exports.insert(h.export_uuid.to_hex(), mem);
            Response::Exported { handle: h.to_hex() }
        }
        Request::Import { handle } => {
            let ch = channel.ok_or(InsufficientPermissions)?;
            let h = FabricHandle::from_hex(&handle)?;
            let mem = *st
                .exports
                .get(&h.export_uuid.to_hex())
                .ok_or(ObjectNotFound)?;
            let o = st.objs.get(&mem).cloned().ok_or(ObjectNotFound)?;
            if o.channel != ch {
                return Err(InsufficientPermissions);
            }
            st.objs.insert(
                id,
                Obj {
                    owner: client,
                    waits: 0,
                    import: true,
                    ..o
                },
            );
            Response::Imported { import: id }
        }
        Request::Release { handle } => {
            st.objs
                .get(&handle)
                .filter(|o| o.owner == client)
                .ok_or(InvalidObjectHandle)?;
            st.objs.remove(&handle);
            st.exports.retain(|_, mem| *mem != handle);
            Response::Ok
        }
        Request::Stats => Response::Stats(DriverStats {
            node_id: NODE,
            session: true,
            allocations: st.objs.values().filter(|o| !o.import).count(),
            exports: st.exports.len(),
            import_descriptors: st.objs.values().filter(|o| o.import).count(),
            import_refs: st.objs.values().filter(|o| o.import).count(),
            clients: st.clients,
            ..DriverStats::default()
        }),
        _ => return Err(NotSupported),
    })
}

fn code<T: std::fmt::Debug>(r: Result<T, CuError>) -> u32 {
    r.expect_err("expected a CUDA error").code()
}

#[test]
fn no_driver_is_no_device() {
    let dir = std::env::temp_dir().join(format!("oimx-client-none-{}", std::process::id()));
    let e = Context::open(&dir).unwrap_err();
    assert_eq!((e.code(), e.name()), (100, "CUDA_ERROR_NO_DEVICE"));
    let text = e.to_string();
    assert!(
        text.contains(&driver_socket(&dir).display().to_string()) && text.contains("openimex gpu"),
        "{text}"
    );
}

#[test]
fn export_import_map_share_the_same_bytes() {
    let fake = Fake::start();
    let a = Context::open(&fake.dir).unwrap();
    assert_eq!(
        a.channel(),
        Some(3),
        "lowest-numbered accessible channel, passed as a descriptor"
    );
    assert_eq!((a.node_id(), a.gpus().len()), (NODE, 1));
    let mem = a.mem_create(0, 3 << 20).unwrap();
    assert_eq!(mem.size(), 4 << 20, "rounded to 2 MiB by the driver");
    let mut a_view = a.map(&mem).unwrap();
    pattern::fill(&mut a_view, 5);
    let handle = a.export(&mem).unwrap();
    let handle = FabricHandleBytes::from_hex(&handle.to_hex()).unwrap();

    let b = Context::open(&fake.dir).unwrap();
    let imported = b.import(&handle).unwrap(); // the fake answers NOT_READY once first
    let mut b_view = b.map(&imported).unwrap();
    assert_eq!(b_view.len(), 4 << 20);
    assert_eq!(pattern::verify(&b_view, 5), Ok(()));
    assert_ne!(a_view.as_ptr(), b_view.as_ptr(), "two mappings");
    // Zero copy: B's stores are in A's mapping with no call in between, and back.
    pattern::fill(&mut b_view, 6);
    assert_eq!(pattern::verify(&a_view, 6), Ok(()));
    a_view[100] ^= 0xff;
    assert_eq!(pattern::verify(b_view.as_slice(), 6), Err(100));

    let s = b.stats().unwrap();
    assert_eq!(
        (s.allocations, s.exports, s.import_descriptors, s.clients),
        (1, 1, 1, 2)
    );
    drop(b_view);
    b.release(imported).unwrap();
    drop(a_view);
    a.release(mem).unwrap();
    let s = b.stats().unwrap();
    assert_eq!((s.allocations, s.exports, s.import_descriptors), (0, 0, 0));
    assert_eq!(
        code(b.import(&handle)),
        400,
        "a released export is an invalid handle"
    );
}

#[test]
fn channels_gate_fabric_calls_and_errors_have_cuda_codes() {
    let fake = Fake::start();
    let none = Context::open_with_channel(&fake.dir, None).unwrap();
    assert_eq!(none.channel(), None);
    assert_eq!(code(none.mem_create(0, PAGE_SIZE)), 800);

    let ch7 = Context::open_with_channel(&fake.dir, Some(&channel_dir(&fake.dir).join("channel7")))
        .unwrap();
    assert_eq!(
        ch7.channel(),
        Some(7),
        "the driver saw channel7's descriptor"
    );
    let a = Context::open(&fake.dir).unwrap();
    let mem = a.mem_create(0, PAGE_SIZE).unwrap();
    let handle = a.export(&mem).unwrap();
    assert_eq!(
        code(ch7.import(&handle)),
        800,
        "another channel than the exporter's"
    );
    assert_eq!(code(none.import(&handle)), 800, "no channel");
    let missing = channel_dir(&fake.dir).join("channel9");
    assert_eq!(
        code(Context::open_with_channel(&fake.dir, Some(&missing))),
        800
    );

    assert_eq!(
        code(a.import(&FabricHandleBytes([0; 64]))),
        400,
        "garbage bytes are an invalid handle"
    );
    assert_eq!(code(a.mem_create(0, 0)), 1, "size 0 is an invalid value");
    assert_eq!(code(ch7.release(mem)), 400, "another context's handle");
    assert_eq!(a.stats().unwrap().allocations, 1, "and it was not released");
}

#[test]
fn import_gives_up_with_not_ready_after_the_bound() {
    let fake = Fake::start();
    let a = Context::open(&fake.dir).unwrap();
    let handle = a.export(&a.mem_create(0, PAGE_SIZE).unwrap()).unwrap();
    fake.state.lock().unwrap().stall = true;
    let start = Instant::now();
    let e = a
        .import_with_timeout(&handle, Duration::from_millis(300))
        .unwrap_err();
    assert_eq!((e.code(), e.name()), (600, "CUDA_ERROR_NOT_READY"), "{e}");
    assert!(
        start.elapsed() >= Duration::from_millis(300) && start.elapsed() < Duration::from_secs(5)
    );
}

#[test]
fn a_context_is_shared_between_threads() {
    fn sync<T: Send + Sync>(_: &T) {}
    let fake = Fake::start();
    let ctx = Context::open(&fake.dir).unwrap();
    sync(&ctx);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..25 {
                    let m = ctx.mem_create(0, PAGE_SIZE).unwrap();
                    assert_eq!(ctx.stats().unwrap().node_id, NODE);
                    ctx.release(m).unwrap();
                }
            });
        }
    });
    assert_eq!(ctx.stats().unwrap().allocations, 0);
}

// ---- the CLI, as a child process ----

const CHILD_ARGS: &str = "OPENIMEX_CLIENT_TEST_CLI_ARGS";

/// Not a test of its own: the entry point when this binary is re-run as `openimex app`.
#[test]
fn cli_child() {
    let Ok(args) = std::env::var(CHILD_ARGS) else {
        return;
    };
    let args: Vec<OsString> = std::iter::once("openimex app".into())
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
    stderr: std::thread::JoinHandle<String>,
}

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "cli_child",
                "--nocapture",
                "--quiet",
                "--test-threads=1",
            ])
            .env(CHILD_ARGS, args.join("\u{1f}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
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
            stderr,
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
            self.stderr.join().unwrap(),
        )
    }
}

fn run(args: &[&str]) -> (i32, String, String) {
    Proc::spawn(args).finish()
}

#[test]
fn cli_export_hold_sees_the_importers_writes() {
    let fake = Fake::start();
    let node = fake.dir.display().to_string();
    let hfile = fake.dir.join("handle").display().to_string();
    let at_file = format!("@{hfile}");
    let mut exporter = Proc::spawn(&[
        "export",
        "--node-dir",
        &node,
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

    let (rc, out, err) = run(&[
        "import",
        "--node-dir",
        &node,
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
        &node,
        "--handle",
        &handle,
        "--verify",
        "11",
    ]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.starts_with("mismatch at ") && err.contains("openimex app: verify failed: mismatch at"),
        "{out} / {err}"
    );
    let (rc, _, err) = run(&[
        "import",
        "--node-dir",
        &node,
        "--handle",
        &handle,
        "--no-channel",
    ]);
    assert_eq!(rc, 1);
    assert!(
        err.contains("openimex app: import failed: CUDA_ERROR_NOT_PERMITTED (800): "),
        "{err}"
    );
    let (rc, _, err) = run(&["import", "--node-dir", &node, "--handle", "nothex"]);
    assert!(
        rc == 1 && err.contains("CUDA_ERROR_INVALID_VALUE (1)"),
        "{err}"
    );
    let (rc, _, err) = run(&["import", "--node-dir", &node]);
    assert_eq!(rc, 2, "usage: {err}");

    // An importer that holds, then exits without releasing: the driver cleans up after it.
    let mut holder = Proc::spawn(&[
        "import",
        "--node-dir",
        &node,
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
    assert_eq!(fake.stats().import_descriptors, 1);
    assert_eq!(holder.finish().0, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake.stats().import_descriptors != 0 {
        assert!(
            Instant::now() < deadline,
            "the driver never saw the importer go"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    assert_eq!(exporter.ask("release"), "released");
    assert_eq!(exporter.ask("verify 13"), "error: released");
    let (rc, out, err) = run(&["stats", "--node-dir", &node]);
    assert_eq!(rc, 0, "{err}");
    let stats: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (stats["allocations"].as_u64(), stats["node_id"].as_u64()),
        (Some(0), Some(u64::from(NODE)))
    );
    let (rc, out, _) = exporter.finish();
    assert_eq!((rc, out.as_str()), (0, ""));
}

#[test]
fn cli_hold_ends_on_sigterm_with_a_release() {
    use nix::sys::signal::{Signal, kill};
    let fake = Fake::start();
    let node = fake.dir.display().to_string();
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
    assert_eq!(fake.stats().allocations, 1);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(exporter.child.id()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    let status = exporter.child.wait().unwrap(); // stdin still open: the signal ends it
    let (_, _, err) = exporter.finish();
    assert_eq!(status.code(), Some(0), "{status:?} {err}");
    assert_eq!(fake.stats().allocations, 0);
}
