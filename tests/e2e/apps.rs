//! Helpers for the fabric tests: clusters with simulated GPUs, `openimex-lab app` processes
//! (one-shot and held, with bounded reads of their answers) and the drivers' counters.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use openimex_harness::{Cluster, ClusterSpec, GpuSpec};
use serde_json::Value;

use crate::common::{COMMAND, FORM, NOTICE, lab_binary, run, spec, text};

/// Bytes every test exports.
pub(crate) const SIZE: &str = "4M";
/// The same, as the importer reports it.
pub(crate) const SIZE_BYTES: u64 = 4 << 20;
/// How often `wait_stats` asks the driver.
pub(crate) const STATS_INTERVAL: Duration = Duration::from_millis(50);
/// Time allowed for the whole 4-node demo.
pub(crate) const DEMO: Duration = Duration::from_secs(120);
/// The reference counters that must all return to zero once every application is gone.
pub(crate) const REFS: [&str; 7] = openimex_harness::chaos::REF_COUNTERS;
/// A driver's node ID without a daemon session.
pub(crate) const NO_NODE: u64 = 0xFFFF;

/// Starts `nodes` nodes with simulated GPUs and waits until the domain is UP and every
/// node's driver has a daemon session under its own node ID.
#[track_caller]
pub(crate) fn gpu_cluster(nodes: usize) -> Cluster {
    gpu_cluster_with(nodes, &[])
}

/// [`gpu_cluster`] with extra config keys on every node.
#[track_caller]
pub(crate) fn gpu_cluster_with(nodes: usize, config: &[(&str, &str)]) -> Cluster {
    let spec = config
        .iter()
        .fold(spec(nodes).with_gpus(GpuSpec::default()), |s, (k, v)| {
            s.config(*k, *v)
        });
    gpu_cluster_from(spec)
}

/// Starts `spec` (which has GPUs) and waits as [`gpu_cluster`] does.
#[track_caller]
pub(crate) fn gpu_cluster_from(spec: ClusterSpec) -> Cluster {
    let nodes = spec.nodes;
    let cluster = Cluster::start(spec).expect("start the nodes");
    cluster.wait_up(0, FORM).expect("domain UP");
    for i in 0..nodes {
        wait_session(&cluster, i);
    }
    cluster
}

/// Waits until node `i`'s driver has a daemon session with node ID `i`.
#[track_caller]
pub(crate) fn wait_session(cluster: &Cluster, i: usize) {
    wait_stats(
        cluster.node(i).dir(),
        NOTICE,
        &format!("node {i}: daemon session open with node ID {i}"),
        |s| s["session"] == Value::Bool(true) && num(s, "node_id") == i as u64,
    );
}

/// Node `i`'s IMEX channel file `channelN`.
pub(crate) fn channel(cluster: &Cluster, i: usize, n: u32) -> PathBuf {
    openimex_simproto::node_dir::channel_path(cluster.node(i).dir(), n)
}

/// `openimex-lab app SUB --node-dir DIR`.
pub(crate) fn app(sub: &str, node_dir: &Path) -> Command {
    let mut cmd = Command::new(lab_binary());
    cmd.arg("app").arg(sub).arg("--node-dir").arg(node_dir);
    cmd
}

/// `app export` of SIZE bytes on GPU 0 with the pattern of `seed`, held, on `channel`.
#[track_caller]
pub(crate) fn exporter(node_dir: &Path, channel: &Path, seed: u64, what: &str) -> (Held, String) {
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
pub(crate) fn importer(node_dir: &Path, channel: &Path, handle: &str, extra: &[&str]) -> Command {
    let mut cmd = app("import", node_dir);
    cmd.arg("--channel")
        .arg(channel)
        .args(["--handle", handle])
        .args(extra);
    cmd
}

/// An `app import --hold` of `handle` verifying `seed`, once it says `holding`.
#[track_caller]
pub(crate) fn held_importer(
    node_dir: &Path,
    channel: &Path,
    handle: &str,
    seed: u64,
    what: &str,
) -> Held {
    let seed = seed.to_string();
    let mut cmd = importer(node_dir, channel, handle, &["--hold", "--verify", &seed]);
    let held = Held::spawn(what, &mut cmd);
    held.expect_holding();
    held
}

/// An export of `seed` on node 0 and its import held on node 1 (channel 0 on both), once node
/// 0 holds node 1's reference: (exporter, importer).
#[track_caller]
pub(crate) fn held_import_0_to_1(cluster: &Cluster, seed: u64) -> (Held, Held) {
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let (exp, handle) = exporter(d0, &channel(cluster, 0, 0), seed, "exporter on node 0");
    let imp = held_importer(d1, &channel(cluster, 1, 0), &handle, seed, "importer on 1");
    wait_stats(d0, NOTICE, "node 0 holds node 1's reference", |s| {
        num(s, "daemon_export_refs") == 1
    });
    (exp, imp)
}

/// One field of the driver's stats as a number (a missing or non-numeric field fails).
#[track_caller]
pub(crate) fn num(stats: &Value, key: &str) -> u64 {
    let Some(n) = stats[key].as_u64() else {
        panic!("stats field {key:?} missing or not a number: {stats}");
    };
    n
}

/// `openimex-lab app stats` of the node's driver, parsed (without subscribing to a channel).
#[track_caller]
pub(crate) fn stats(node_dir: &Path) -> Value {
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
pub(crate) fn wait_stats(
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
pub(crate) fn all_released(s: &Value) -> bool {
    REFS.iter().all(|k| num(s, k) == 0) && num(s, "hbm_used") == 0
}

/// Waits until every node's driver holds no reference and no memory.
#[track_caller]
pub(crate) fn wait_all_released(cluster: &Cluster, what: &str) {
    for i in 0..cluster.len() {
        wait_stats(
            cluster.node(i).dir(),
            NOTICE,
            &format!("{what}: node {i} back to zero references and zero HBM"),
            all_released,
        );
    }
}

/// A long-running `openimex-lab app … --hold` child: its stdout read line by line on a thread,
/// its stderr collected for failure messages, killed (and reaped) when dropped.
pub(crate) struct Held {
    pub(crate) what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl Held {
    pub(crate) fn spawn(what: &str, cmd: &mut Command) -> Self {
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

    pub(crate) fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The next line of stdout, within `timeout`.
    #[track_caller]
    pub(crate) fn line(&self, timeout: Duration) -> String {
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
    pub(crate) fn expect_holding(&self) {
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
    pub(crate) fn send(&mut self, line: &str) {
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
    pub(crate) fn ask(&mut self, line: &str) -> String {
        self.send(line);
        self.line(COMMAND)
    }

    /// Sends `exit` and waits for the process to end; it must exit 0.
    #[track_caller]
    pub(crate) fn exit(mut self) {
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
    pub(crate) fn kill9(mut self) {
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
    pub(crate) fn wait(&mut self, timeout: Duration) -> ExitStatus {
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
