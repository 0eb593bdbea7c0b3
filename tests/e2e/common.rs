//! Helpers shared by the end-to-end tests.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openimex_harness::process::{find_pids_with_args, run_with_timeout, send_signal};
use openimex_harness::{AddrBlock, Cluster, ClusterSpec, Signal};

/// A loopback address and port with nothing listening.
pub(crate) fn dead_endpoint() -> (String, String) {
    let block = AddrBlock::allocate(1, &[50005]).expect("free address");
    (block.ip(0).to_string(), "50005".to_string())
}

/// Time allowed for a domain to form (18 daemons on a loaded 2-core machine included).
pub(crate) const FORM: Duration = Duration::from_secs(60);
/// Time allowed for peers to notice a change (a kill, a departure, a mismatch).
pub(crate) const NOTICE: Duration = Duration::from_secs(30);
/// Time allowed for one command that should fail or finish at once.
pub(crate) const COMMAND: Duration = Duration::from_secs(10);

/// The binary under test: the production `openimex`.
pub(crate) fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_openimex"))
}

/// The lab binary (`openimex-lab`: simulated drivers, Fabric Manager, apps, demo, bench), from
/// the same target directory and profile as [`binary`]. Cargo builds only this package's
/// binaries for its tests, so the first call builds the lab binary too (a no-op when it is up
/// to date, and what `cargo test --workspace` has done already): a test never runs a stale
/// simulator.
pub(crate) fn lab_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let lab = binary().with_file_name("openimex-lab");
            // Run under cargo: build it. Run by hand: it must be there already.
            let Some(cargo) = std::env::var_os("CARGO") else {
                return Ok(lab);
            };
            let release = binary()
                .parent()
                .and_then(|d| d.file_name())
                .is_some_and(|d| d == "release");
            let mut cmd = Command::new(cargo);
            cmd.args([
                "build",
                "--quiet",
                "-p",
                "openimex-lab",
                "--bin",
                "openimex-lab",
            ]);
            if release {
                cmd.arg("--release");
            }
            let out =
                run_with_timeout(&mut cmd, Duration::from_secs(1800)).map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!(
                    "cargo build -p openimex-lab failed:\n{}",
                    text(&out.stderr)
                ));
            }
            Ok(lab)
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}\n  hint: build it with `cargo build -p openimex-lab`"))
}

/// A cluster of `nodes` nodes: daemons of the binary under test, drivers of the lab binary.
pub(crate) fn spec(nodes: usize) -> ClusterSpec {
    ClusterSpec::new(nodes, binary()).with_lab_binary(lab_binary())
}

/// Lossy UTF-8.
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `cmd` with the 10 s limit; a timeout fails the test.
pub(crate) fn run(cmd: &mut Command) -> Output {
    run_long(cmd, COMMAND)
}

/// Runs `cmd` with the limit `timeout`; a timeout fails the test.
pub(crate) fn run_long(cmd: &mut Command, timeout: Duration) -> Output {
    run_with_timeout(cmd, timeout).unwrap_or_else(|e| panic!("{e}"))
}

/// Asserts a command failed the way an operator wants: non-zero exit, a message on stderr,
/// no Rust panic. Returns stderr.
pub(crate) fn assert_clean_failure(out: &Output, what: &str) -> String {
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "{what}: must exit non-zero, got {:?}\nstdout: {}\nstderr: {stderr}",
        out.status,
        text(&out.stdout)
    );
    assert!(
        !stderr.trim().is_empty(),
        "{what}: stderr must explain the failure"
    );
    assert!(
        !stderr.contains("panicked"),
        "{what}: must not panic:\n{stderr}"
    );
    stderr
}

/// SIGKILLs, on drop, every process whose arguments include all of these (for daemons that
/// forked away from the test, which the harness does not track).
pub(crate) struct KillOnDrop(pub(crate) Vec<String>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let args: Vec<&str> = self.0.iter().map(String::as_str).collect();
        for pid in find_pids_with_args(&args) {
            let _ = send_signal(pid, Signal::SIGKILL);
        }
    }
}

/// Now, in ms since the Unix epoch (what `ctl` prints as `time_unix_ms`).
pub(crate) fn unix_ms() -> u64 {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// Waits up to `limit` for `cond`, polling every 50 ms.
pub(crate) fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

/// Node `i`'s imex.log.
pub(crate) fn log(cluster: &Cluster, i: usize) -> String {
    std::fs::read_to_string(cluster.node(i).log_path()).unwrap_or_default()
}

/// Waits until node `i`'s imex.log, past its first `from` bytes, has a line containing every
/// one of `needles`; returns that line.
#[track_caller]
pub(crate) fn wait_log_line(cluster: &Cluster, i: usize, from: usize, needles: &[&str]) -> String {
    let until = Instant::now() + NOTICE;
    loop {
        let text = log(cluster, i);
        let fresh = text.get(from..).unwrap_or_default();
        if let Some(line) = fresh
            .lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
        {
            return line.to_owned();
        }
        assert!(
            Instant::now() < until,
            "node {i} never logged a line with {needles:?}; its log since the signal:\n{fresh}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Says `hello` to a daemon's peer port the way a daemon does: as the first frame of a session
/// on `c`. The answer's first frame (the verdict), or the status the session was refused with.
pub(crate) fn say_hello(
    rt: &tokio::runtime::Runtime,
    c: &mut openimex_proto::peer::peer_client::PeerClient<tonic::transport::Channel>,
    hello: openimex_proto::peer::HelloRequest,
) -> Result<openimex_proto::peer::HelloResponse, tonic::Status> {
    use openimex_proto::peer::SessionMsg;
    use openimex_proto::peer::session_msg::Body;
    rt.block_on(async {
        let first = SessionMsg {
            body: Some(Body::Hello(Box::new(hello))),
            ..SessionMsg::default()
        };
        let mut inbound = c.session(tokio_stream::once(first)).await?.into_inner();
        match inbound.message().await? {
            Some(SessionMsg {
                body: Some(Body::HelloReply(answer)),
                ..
            }) => Ok(*answer),
            other => Err(tonic::Status::internal(format!(
                "the session's first frame is no answer to the hello: {other:?}"
            ))),
        }
    })
}

/// Waits until node `i`'s daemon has taken everything sent to it before this call: sends it a
/// real-time signal it ignores, one not sent before by this test process, and waits for the
/// line the daemon logs for it (`SIGRTMIN+K received: ignored`). The daemon reads the signals
/// it ignores from one signalfd, lowest number first (standard signals before real-time ones),
/// and its log lines are written in order: once this line is in the log, every signal sent
/// before it has been taken and every line logged before it is in the file. What a test
/// asserts did *not* happen, it asserts after this, not after a fixed sleep.
pub(crate) fn log_marker(cluster: &Cluster, i: usize) {
    use openimex_harness::nix::libc;
    use std::sync::atomic::{AtomicI32, Ordering};
    // The hardening test sends SIGRTMIN, SIGRTMIN+1 and SIGRTMAX itself; markers take
    // SIGRTMIN+4 up to SIGRTMAX-1 in turn (the daemon logs one line per signal per 10 s, so a
    // daemon must not see the same marker twice within that: each test's daemons are its own).
    static NEXT: AtomicI32 = AtomicI32::new(0);
    let span = libc::SIGRTMAX() - libc::SIGRTMIN() - 4;
    let k = 4 + NEXT.fetch_add(1, Ordering::Relaxed) % span;
    let signal = libc::SIGRTMIN() + k;
    let pid = cluster.node(i).pid().expect("the daemon runs");
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    let line = format!("SIGRTMIN+{k} received");
    let log = cluster.node(i).log_path();
    let count = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches(&line)
            .count()
    };
    let before = count();
    // SAFETY: kill(2) with a pid and a signal number has no memory effects.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill {pid} {signal}");
    assert!(
        wait_for(NOTICE, || count() > before),
        "node {i} never logged {line:?}:\n{}",
        cluster.logs_tail(40)
    );
}
