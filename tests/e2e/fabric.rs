//! Fabric memory across nodes, end to end: `openimex app` processes export on one node and
//! import on another through the simulated GPU drivers and the IMEX daemons
//! (DESIGN.md §1–§2, driver-interface.md §4). Each test reads the drivers' counters
//! (`openimex app stats`) to show that references are taken where the driver interface says
//! and always return to zero: no leak, no memory freed under an importer.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use openimex_harness::process::run_with_timeout;
use openimex_harness::{Cluster, GpuSpec};
use serde_json::Value;

use crate::common::{COMMAND, FORM, NOTICE, assert_clean_failure, binary, run, spec, text};

/// Bytes every test exports.
const SIZE: &str = "4M";
/// The same, as the importer reports it.
const SIZE_BYTES: u64 = 4 << 20;
/// How often `wait_stats` asks the driver.
const STATS_INTERVAL: Duration = Duration::from_millis(50);
/// Time allowed for the whole 4-node demo.
const DEMO: Duration = Duration::from_secs(120);
/// The reference counters that must all return to zero once every application is gone.
const REFS: [&str; 6] = [
    "allocations",
    "exports",
    "daemon_export_refs",
    "import_descriptors",
    "import_refs",
    "pending_unimports",
];
/// A driver's node ID without a daemon session.
const NO_NODE: u64 = 0xFFFF;

/// Starts `nodes` nodes with simulated GPUs and waits until the domain is UP and every
/// node's driver has a daemon session under its own node ID.
#[track_caller]
fn gpu_cluster(nodes: usize) -> Cluster {
    let cluster =
        Cluster::start(spec(nodes).with_gpus(GpuSpec::default())).expect("start the nodes");
    cluster.wait_up(0, FORM).expect("domain UP");
    for i in 0..nodes {
        wait_session(&cluster, i);
    }
    cluster
}

/// Waits until node `i`'s driver has a daemon session with node ID `i`.
#[track_caller]
fn wait_session(cluster: &Cluster, i: usize) {
    wait_stats(
        cluster.node(i).dir(),
        NOTICE,
        &format!("node {i}: daemon session open with node ID {i}"),
        |s| s["session"] == Value::Bool(true) && num(s, "node_id") == i as u64,
    );
}

/// Node `i`'s IMEX channel file `channelN`.
fn channel(cluster: &Cluster, i: usize, n: u32) -> PathBuf {
    cluster
        .node(i)
        .dir()
        .join("dev/nvidia-caps-imex-channels")
        .join(format!("channel{n}"))
}

/// `openimex app SUB --node-dir DIR`.
fn app(sub: &str, node_dir: &Path) -> Command {
    let mut cmd = Command::new(binary());
    cmd.arg("app").arg(sub).arg("--node-dir").arg(node_dir);
    cmd
}

/// `app export` of SIZE bytes on GPU 0 with the pattern of `seed`, held, on `channel`.
#[track_caller]
fn exporter(node_dir: &Path, channel: &Path, seed: u64, what: &str) -> (Held, String) {
    let mut cmd = app("export", node_dir);
    cmd.arg("--channel")
        .arg(channel)
        .args(["--gpu", "0", "--size", SIZE, "--pattern"])
        .arg(seed.to_string())
        .arg("--hold");
    let held = Held::spawn(what, &mut cmd);
    let handle = held.line(NOTICE);
    assert!(
        handle.len() == 128 && handle.bytes().all(|b| b.is_ascii_hexdigit()),
        "{what}: the first line must be the handle (128 hex digits), got {handle:?}"
    );
    (held, handle)
}

/// `app import --handle HANDLE` on `channel`, plus `extra` arguments.
fn importer(node_dir: &Path, channel: &Path, handle: &str, extra: &[&str]) -> Command {
    let mut cmd = app("import", node_dir);
    cmd.arg("--channel")
        .arg(channel)
        .args(["--handle", handle])
        .args(extra);
    cmd
}

/// An `app import --hold` of `handle` verifying `seed`, once it says `holding`.
#[track_caller]
fn held_importer(node_dir: &Path, channel: &Path, handle: &str, seed: u64, what: &str) -> Held {
    let seed = seed.to_string();
    let mut cmd = importer(node_dir, channel, handle, &["--hold", "--verify", &seed]);
    let held = Held::spawn(what, &mut cmd);
    held.expect_holding();
    held
}

/// One field of the driver's stats as a number (a missing or non-numeric field fails).
#[track_caller]
fn num(stats: &Value, key: &str) -> u64 {
    let Some(n) = stats[key].as_u64() else {
        panic!("stats field {key:?} missing or not a number: {stats}");
    };
    n
}

/// `openimex app stats` of the node's driver, parsed (without subscribing to a channel).
#[track_caller]
fn stats(node_dir: &Path) -> Value {
    let mut cmd = app("stats", node_dir);
    cmd.arg("--no-channel");
    let out = run(&mut cmd);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "app stats --node-dir {}: {:?}\nstdout: {stdout}\nstderr: {}",
        node_dir.display(),
        out.status,
        text(&out.stderr)
    );
    let line = stdout.lines().last().unwrap_or_default();
    match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => panic!("stats line is not JSON ({e}): {line:?}"),
    }
}

/// Asks the node's driver for its stats every 50 ms until `pred` holds; fails after
/// `timeout` showing the last stats.
#[track_caller]
fn wait_stats(
    node_dir: &Path,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let s = stats(node_dir);
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "waited {timeout:?} for {what} ({}); last stats: {s}",
            node_dir.display()
        );
        thread::sleep(STATS_INTERVAL);
    }
}

/// Every reference counter and the HBM in use are zero.
fn all_released(s: &Value) -> bool {
    REFS.iter().all(|k| num(s, k) == 0) && num(s, "hbm_used") == 0
}

/// Waits until every node's driver holds no reference and no memory.
#[track_caller]
fn wait_all_released(cluster: &Cluster, what: &str) {
    for i in 0..cluster.len() {
        wait_stats(
            cluster.node(i).dir(),
            NOTICE,
            &format!("{what}: node {i} back to zero references and zero HBM"),
            all_released,
        );
    }
}

/// A long-running `openimex app … --hold` child: its stdout read line by line on a thread,
/// its stderr collected for failure messages, killed (and reaped) when dropped.
struct Held {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl Held {
    fn spawn(what: &str, cmd: &mut Command) -> Self {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: cannot spawn {cmd:?}: {e}"));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let mut err_pipe = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
                s.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Self {
            what: what.to_owned(),
            child,
            stdin,
            lines,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The next line of stdout, within `timeout`.
    #[track_caller]
    fn line(&self, timeout: Duration) -> String {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!(
                "{}: no line on stdout within {timeout:?}; stderr so far: {}",
                self.what,
                self.stderr()
            ),
            Err(RecvTimeoutError::Disconnected) => panic!(
                "{}: stdout closed before the expected line (the process ended); stderr: {}",
                self.what,
                self.stderr()
            ),
        }
    }

    /// Reads an importer's `verified BYTES` (the full size) and then `holding`.
    #[track_caller]
    fn expect_holding(&self) {
        let verified = self.line(NOTICE);
        assert_eq!(
            verified,
            format!("verified {SIZE_BYTES}"),
            "{}: stderr: {}",
            self.what,
            self.stderr()
        );
        let holding = self.line(COMMAND);
        assert_eq!(
            holding,
            "holding",
            "{}: stderr: {}",
            self.what,
            self.stderr()
        );
    }

    #[track_caller]
    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        if let Err(e) = writeln!(stdin, "{line}").and_then(|()| stdin.flush()) {
            panic!(
                "{}: cannot send {line:?}: {e}; stderr: {}",
                self.what,
                self.stderr()
            );
        }
    }

    /// Sends one command line and returns the one-line answer.
    #[track_caller]
    fn ask(&mut self, line: &str) -> String {
        self.send(line);
        self.line(COMMAND)
    }

    /// Sends `exit` and waits for the process to end; it must exit 0.
    #[track_caller]
    fn exit(mut self) {
        self.send("exit");
        let status = self.wait(NOTICE);
        assert_eq!(
            status.code(),
            Some(0),
            "{}: `exit` must end in exit 0, got {status:?}; stderr: {}",
            self.what,
            self.stderr()
        );
    }

    /// SIGKILLs the process and reaps it.
    #[track_caller]
    fn kill9(mut self) {
        let _ = self.child.kill();
        let status = self.wait(COMMAND);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "{}: must have died of SIGKILL: {status:?}",
            self.what
        );
    }

    /// Waits up to `timeout` for the process to end.
    #[track_caller]
    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                Ok(None) => panic!(
                    "{}: still running {timeout:?} later; stderr: {}",
                    self.what,
                    self.stderr()
                ),
                Err(e) => panic!("{}: cannot wait for it: {e}", self.what),
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn cross_node_round_trip() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let (mut exp, handle) = exporter(d0, &channel(&cluster, 0, 0), 11, "exporter on node 0");

    let out = run(&mut importer(
        d1,
        &channel(&cluster, 1, 0),
        &handle,
        &["--verify", "11", "--write", "22"],
    ));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "import on node 1 must succeed: {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        text(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            format!("verified {SIZE_BYTES}"),
            format!("written {SIZE_BYTES}")
        ],
        "the importer reads the exporter's pattern and writes its own"
    );

    // Zero copy: node 0's process sees node 1's stores in the same memory.
    assert_eq!(exp.ask("verify-write 22"), "ok", "A must see B's writes");
    exp.exit();
    wait_all_released(&cluster, "after the round trip");
}

#[test]
fn import_without_channel_or_with_another_channel_is_refused() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let (mut exp, handle) = exporter(d0, &channel(&cluster, 0, 0), 12, "exporter on node 0");

    let mut no_channel = app("import", d1);
    no_channel
        .arg("--no-channel")
        .args(["--handle", &handle, "--verify", "12"]);
    let out = run(&mut no_channel);
    let stderr = assert_clean_failure(&out, "import without a channel");
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("CUDA_ERROR_NOT_PERMITTED (800)"),
        "import without a channel: {stderr}"
    );
    assert!(
        !text(&out.stdout).contains("verified"),
        "nothing may be read without a channel: {}",
        text(&out.stdout)
    );

    let out = run(&mut importer(
        d1,
        &channel(&cluster, 1, 1),
        &handle,
        &["--verify", "12"],
    ));
    let stderr = assert_clean_failure(&out, "import with channel1 of memory exported on channel0");
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("CUDA_ERROR_NOT_PERMITTED (800)"),
        "import with another channel: {stderr}"
    );
    assert!(
        !text(&out.stdout).contains("verified"),
        "nothing may be read with another channel: {}",
        text(&out.stdout)
    );

    wait_stats(
        d1,
        NOTICE,
        "node 1 holds no import after the refusals",
        |s| num(s, "import_refs") == 0 && num(s, "import_descriptors") == 0,
    );
    let s0 = stats(d0);
    assert_eq!(
        num(&s0, "daemon_export_refs"),
        0,
        "a refused import takes no reference on the export: {s0}"
    );

    // The export itself is untouched.
    assert_eq!(exp.ask("verify 12"), "ok");
    exp.exit();
    wait_all_released(&cluster, "after the refused imports");
}

#[test]
fn exporter_release_keeps_memory_alive_for_importer() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let (ch0, ch1) = (channel(&cluster, 0, 0), channel(&cluster, 1, 0));

    // Phase 1: the exporter releases its memory while node 1 holds an import of it.
    let (mut exp, handle) = exporter(d0, &ch0, 33, "exporter on node 0");
    let mut imp = held_importer(d1, &ch1, &handle, 33, "importer on node 1");
    assert_eq!(exp.ask("release"), "released");
    let alive = |what: &str| {
        let s = stats(d0);
        assert!(
            num(&s, "daemon_export_refs") == 1
                && num(&s, "allocations") == 1
                && num(&s, "hbm_used") > 0,
            "{what}: node 0 must keep the memory for node 1's importer \
             (daemon_export_refs 1, allocations 1, hbm_used > 0): {s}"
        );
    };
    alive("after the exporter's release");
    assert_eq!(
        imp.ask("verify 33"),
        "ok",
        "the importer still reads the data after the exporter released it"
    );
    alive("after the importer read again");
    imp.exit();
    wait_stats(
        d0,
        NOTICE,
        "node 0 frees the memory once node 1 released it",
        |s| {
            num(s, "daemon_export_refs") == 0
                && num(s, "allocations") == 0
                && num(s, "hbm_used") == 0
        },
    );
    exp.exit();
    wait_all_released(&cluster, "after release, then import exit");

    // Phase 2: the exporter process is SIGKILLed instead.
    let (exp, handle) = exporter(d0, &ch0, 34, "second exporter on node 0");
    let mut imp = held_importer(d1, &ch1, &handle, 34, "second importer on node 1");
    let clients = num(&stats(d0), "clients");
    exp.kill9();
    let s = wait_stats(
        d0,
        NOTICE,
        "node 0's driver notices the exporter's death (one client fewer)",
        |s| num(s, "clients") < clients,
    );
    assert!(
        num(&s, "daemon_export_refs") == 1
            && num(&s, "allocations") == 1
            && num(&s, "hbm_used") > 0,
        "after the exporter died, node 0 must keep the memory for node 1's importer \
         (daemon_export_refs 1, allocations 1, hbm_used > 0): {s}"
    );
    assert_eq!(
        imp.ask("verify 34"),
        "ok",
        "the importer still reads the data after the exporter died"
    );
    imp.exit();
    wait_all_released(&cluster, "after exporter SIGKILL, then import exit");
}

#[test]
fn importer_exit_without_release_is_cleaned_up() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let (mut exp, handle) = exporter(d0, &channel(&cluster, 0, 0), 44, "exporter on node 0");

    let out = run(&mut importer(
        d1,
        &channel(&cluster, 1, 0),
        &handle,
        &["--no-release", "--verify", "44"],
    ));
    assert!(
        out.status.success(),
        "import --no-release must exit 0: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout).trim(), format!("verified {SIZE_BYTES}"));

    wait_stats(
        d1,
        NOTICE,
        "node 1 cleans up the import of the exited process (unimport finished)",
        |s| {
            num(s, "import_refs") == 0
                && num(s, "import_descriptors") == 0
                && num(s, "pending_unimports") == 0
        },
    );
    wait_stats(
        d0,
        NOTICE,
        "node 0 drops the daemon's export reference after the unimport",
        |s| num(s, "daemon_export_refs") == 0,
    );
    // The exporter's own memory is untouched.
    assert_eq!(exp.ask("verify 44"), "ok");
    exp.exit();
    wait_all_released(&cluster, "after the exporter exit");
}

#[test]
fn import_with_no_daemon_on_the_importer_node() {
    let mut cluster = gpu_cluster(2);
    let d0 = cluster.node(0).dir().to_path_buf();
    let d1 = cluster.node(1).dir().to_path_buf();
    let ch1 = channel(&cluster, 1, 0);
    let (mut exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 55, "exporter on node 0");

    cluster.kill9(1).expect("kill -9 node 1's daemon");
    wait_stats(
        &d1,
        NOTICE,
        "node 1's driver loses its session (node ID back to 0xFFFF)",
        |s| s["session"] == Value::Bool(false) && num(s, "node_id") == NO_NODE,
    );
    let out = run(&mut importer(&d1, &ch1, &handle, &["--verify", "55"]));
    let stderr = assert_clean_failure(&out, "import on a node without a daemon");
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("CUDA_ERROR_NOT_SUPPORTED (801)"),
        "an import while the node ID is 0xFFFF must be refused as NOT_SUPPORTED: {stderr}"
    );
    let s1 = stats(&d1);
    assert!(
        num(&s1, "import_refs") == 0 && num(&s1, "import_descriptors") == 0,
        "a refused import holds nothing: {s1}"
    );

    cluster.start_node(1).expect("restart node 1's daemon");
    cluster.wait_up(0, FORM).expect("domain UP again");
    wait_session(&cluster, 1);
    let out = run(&mut importer(&d1, &ch1, &handle, &["--verify", "55"]));
    assert!(
        out.status.success(),
        "the same import must succeed once node 1 has a daemon again: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout).trim(), format!("verified {SIZE_BYTES}"));

    assert_eq!(exp.ask("verify 55"), "ok");
    exp.exit();
    wait_all_released(&cluster, "after the import through the restarted daemon");
}

#[test]
fn many_importers_share_one_descriptor() {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let ch1 = channel(&cluster, 1, 0);
    let (mut exp, handle) = exporter(d0, &channel(&cluster, 0, 0), 66, "exporter on node 0");

    // Started together, so they may also meet while the first import is still pending.
    let importers: Vec<Held> = (0..3)
        .map(|k| {
            let mut cmd = importer(d1, &ch1, &handle, &["--hold", "--verify", "66"]);
            Held::spawn(&format!("importer {k} on node 1"), &mut cmd)
        })
        .collect();
    for imp in &importers {
        imp.expect_holding();
    }

    let s1 = stats(d1);
    assert!(
        num(&s1, "import_descriptors") == 1 && num(&s1, "import_refs") == 3,
        "three imports of one handle on one node share one descriptor \
         (import_descriptors 1, import_refs 3): {s1}"
    );
    let s0 = stats(d0);
    assert_eq!(
        num(&s0, "daemon_export_refs"),
        1,
        "one descriptor, one daemon round trip, one export reference: {s0}"
    );

    for imp in importers {
        imp.exit();
    }
    assert_eq!(exp.ask("verify 66"), "ok");
    exp.exit();
    wait_all_released(
        &cluster,
        "after the three importers and the exporter exited",
    );
}

#[test]
fn demo_json_four_nodes() {
    let mut cmd = Command::new(binary());
    cmd.args(["demo", "--nodes", "4", "--json"]);
    let out = run_with_timeout(&mut cmd, DEMO).unwrap_or_else(|e| panic!("{e}"));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        text(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let summary: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("the last line must be JSON ({e}): {last:?}"));
    let expect = [
        ("nodes", 4),
        ("gpus", 16),
        ("imports", 16 * 15),
        ("errors", 0),
        ("leaked_refs", 0),
    ];
    for (key, want) in expect {
        assert_eq!(num(&summary, key), want, "{key}: {summary}");
    }
    assert!(num(&summary, "bytes_verified") > 0, "{summary}");
    for key in ["formation_ms", "import_p50_us", "import_p99_us"] {
        num(&summary, key);
    }
    assert!(
        num(&summary, "import_p50_us") <= num(&summary, "import_p99_us"),
        "p50 <= p99: {summary}"
    );
    for key in ["imports_per_s", "copy_gbps"] {
        assert!(
            summary[key].as_f64().is_some_and(|v| v > 0.0),
            "{key} must be a positive number: {summary}"
        );
    }
}

/// Waits until a held process dies of SIGKILL (revoked by its node's driver).
#[track_caller]
fn expect_revoked(mut held: Held) {
    let status = held.wait(NOTICE);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{}: a revoked importer is killed, as the real driver RCs its channels: {status:?}",
        held.what
    );
}

#[test]
fn importer_daemon_killed_revokes_its_importers_and_the_exporter_releases_on_restart() {
    let mut cluster = gpu_cluster(2);
    let (d0, d1) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(1).dir().to_path_buf(),
    );
    let (mut exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 55, "exporter on node 0");
    let imp = held_importer(
        &d1,
        &channel(&cluster, 1, 0),
        &handle,
        55,
        "importer on node 1",
    );
    wait_stats(&d0, NOTICE, "node 0 holds one reference for node 1", |s| {
        num(s, "daemon_export_refs") == 1
    });

    // The importer's daemon dies: its driver tears the session down, which disables (kills)
    // every client that imported remote memory.
    cluster.kill9(1).expect("kill -9 the daemon of node 1");
    expect_revoked(imp);
    wait_stats(&d1, NOTICE, "node 1 dropped the dead import", |s| {
        num(s, "import_refs") == 0 && num(s, "import_descriptors") == 0
    });
    // The exporter keeps its reference while node 1 is away (grace time -1: wait for it).
    assert_eq!(num(&stats(&d0), "daemon_export_refs"), 1);

    // Node 1 comes back as a new instance: node 0 releases what it held for the old one.
    cluster.start_node(1).expect("restart node 1");
    cluster.wait_up(0, FORM).expect("UP again");
    wait_stats(
        &d0,
        NOTICE,
        "node 0 released the old instance's reference",
        |s| num(s, "daemon_export_refs") == 0,
    );
    assert_eq!(
        exp.ask("verify 55"),
        "ok",
        "the exporter's own memory is intact"
    );
    exp.exit();
    wait_all_released(&cluster, "after the exporter exit");
}

#[test]
fn exporter_daemon_killed_then_restarted_revokes_remote_importers() {
    let mut cluster = gpu_cluster(2);
    let (d0, d1) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(1).dir().to_path_buf(),
    );
    let (exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 66, "exporter on node 0");
    let mut imp = held_importer(
        &d1,
        &channel(&cluster, 1, 0),
        &handle,
        66,
        "importer on node 1",
    );

    // The exporter's daemon dies: its driver drops the daemon's (dangling) references.
    cluster.kill9(0).expect("kill -9 the daemon of node 0");
    wait_stats(
        &d0,
        NOTICE,
        "node 0's session is gone and its references dropped",
        |s| s["session"] == Value::Bool(false) && num(s, "daemon_export_refs") == 0,
    );
    // Node 1 waits for node 0 (grace time -1): its importer is left alone meanwhile.
    assert_eq!(imp.ask("verify 66"), "ok");

    // Node 0 restarts as a new instance: node 1 cleans up its imports from the old one and
    // disables (kills) the importers still mapping memory that may now be reused.
    cluster.start_node(0).expect("restart node 0");
    cluster.wait_up(1, FORM).expect("UP again");
    expect_revoked(imp);
    wait_stats(
        &d1,
        NOTICE,
        "node 1 holds nothing from node 0's old instance",
        |s| {
            num(s, "import_refs") == 0
                && num(s, "import_descriptors") == 0
                && num(s, "pending_unimports") == 0
        },
    );
    exp.exit();
    wait_all_released(&cluster, "after the exporter exit");
}

#[test]
fn daemon_exits_with_a_clear_error_when_its_gpu_driver_dies() {
    let mut cluster = gpu_cluster(2);
    cluster.kill_driver(1).expect("kill -9 node 1's GPU driver");
    let deadline = Instant::now() + NOTICE;
    while cluster.is_running(1) {
        assert!(
            Instant::now() < deadline,
            "node 1's daemon must stop when its driver is gone"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let exit = cluster.node(1).last_exit().expect("exit status");
    assert_eq!(
        exit.code(),
        Some(1),
        "a lost driver is a failure exit: {exit:?}"
    );
    let log = std::fs::read_to_string(cluster.node(1).log_path()).unwrap_or_default();
    assert!(
        log.contains("lost the GPU driver"),
        "the log says why:\n{log}"
    );
    // Its peer sees a lost node (not a departure: no goodbye for a failure).
    cluster
        .wait_links(0, NOTICE, "0->1 not connected", |l| {
            l.link(0, 1).is_some_and(|c| c.status == "RECOVERING")
        })
        .expect("node 0 notices");
    // Driver and daemon back: the domain recovers.
    cluster
        .start_node(1)
        .expect("restart node 1 (driver first)");
    cluster.wait_up(0, FORM).expect("UP again");
}
