//! The simulated GPU driver of each node (`openimex-lab gpu`): started before the node's daemon,
//! kept running across daemon kills and restarts (it is the node's "kernel module"), stopped
//! last. All nodes of a cluster share one fabric directory (the simulated NVLink domain).

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::HarnessError;
use crate::process::die_with_parent;

/// How long a driver may take to say `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Simulated GPUs per node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSpec {
    /// GPUs per node (4 on a GB200 compute tray).
    pub gpus_per_node: u32,
    /// HBM per GPU, MiB (sparse files; only what is written takes disk).
    pub hbm_mib: u64,
    /// IMEX channel files per node (`channel0` … `channelN-1`).
    pub channels: u32,
    /// The driver version the simulated drivers report and whose RM layouts they serve
    /// (`openimex-lab gpu --driver-version`); `None`: the simulated driver's default.
    pub driver_version: Option<&'static str>,
    /// Each driver appends one line per escape it serves to `<node dir>/driver-trace.log`
    /// (`openimex-lab gpu --trace`).
    pub trace: bool,
}

/// The file a node's simulated driver traces its escapes to ([`GpuSpec::trace`]).
pub fn trace_path(node_dir: &Path) -> std::path::PathBuf {
    node_dir.join("driver-trace.log")
}

impl Default for GpuSpec {
    fn default() -> Self {
        Self {
            gpus_per_node: 4,
            hbm_mib: 1024,
            channels: 2,
            driver_version: None,
            trace: false,
        }
    }
}

/// Starts `binary gpu` for node `slot` and waits for its `ready` line. With `fabric_manager`
/// the driver takes its probe answers from the domain's Fabric Manager (`--fabric-manager`).
pub(crate) fn start_driver(
    binary: &Path,
    node_dir: &Path,
    fabric_dir: &Path,
    slot: usize,
    spec: GpuSpec,
    fabric_manager: bool,
) -> Result<Child, HarnessError> {
    let log = node_dir.join("gpu.log");
    let stderr = append_log(&log)?;
    let mut cmd = Command::new(binary);
    cmd.arg("gpu")
        .arg("--node-dir")
        .arg(node_dir)
        .arg("--fabric-dir")
        .arg(fabric_dir)
        .arg("--slot")
        .arg(slot.to_string())
        .arg("--gpus")
        .arg(spec.gpus_per_node.to_string())
        .arg("--hbm-mib")
        .arg(spec.hbm_mib.to_string())
        .arg("--channels")
        .arg(spec.channels.to_string());
    if fabric_manager {
        cmd.arg("--fabric-manager");
    }
    if let Some(v) = spec.driver_version {
        cmd.arg("--driver-version").arg(v);
    }
    if spec.trace {
        cmd.arg("--trace").arg(trace_path(node_dir));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    spawn_ready(cmd, binary, &log, "start the simulated GPU driver")
}

/// Opens a process's log file for appending (its stderr).
pub(crate) fn append_log(log: &Path) -> Result<std::fs::File, HarnessError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(HarnessError::io(
            "open the log",
            log,
            "check that the cluster directory is writable",
        ))
}

/// Spawns `cmd` (stdout piped, stderr to `log`) and waits for its `ready` line: the simulated
/// GPU driver's and the Fabric Manager's start-up contract.
pub(crate) fn spawn_ready(
    mut cmd: Command,
    binary: &Path,
    log: &Path,
    action: &'static str,
) -> Result<Child, HarnessError> {
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(|source| HarnessError::Spawn {
        program: binary.to_owned(),
        source,
        hint: "build the openimex binary first (cargo build) and pass its path",
    })?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        return Err(ready_failed(log, action, "its stdout was not captured"));
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let res = BufReader::new(stdout).read_line(&mut line).map(|_| line);
        let _ = tx.send(res);
    });
    match rx.recv_timeout(READY_TIMEOUT) {
        Ok(Ok(line)) if line.starts_with("ready") => Ok(child),
        other => {
            let _ = child.kill();
            let _ = child.wait();
            let why = match other {
                Ok(Ok(line)) => format!("it printed {line:?} instead of `ready`"),
                Ok(Err(e)) => format!("reading its stdout failed: {e}"),
                Err(_) => format!("it did not say `ready` within {READY_TIMEOUT:?}"),
            };
            Err(ready_failed(log, action, &why))
        }
    }
}

fn ready_failed(log: &Path, action: &'static str, why: &str) -> HarnessError {
    let tail = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = tail.lines().rev().take(20).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    HarnessError::Io {
        action,
        path: PathBuf::from(log),
        source: std::io::Error::other(format!("{why}; its log ends with:\n{}", tail.join("\n"))),
        hint: "see the log named above",
    }
}
