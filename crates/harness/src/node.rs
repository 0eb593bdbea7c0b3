//! One node of a harness cluster: its directory and files (config.cfg, nodes_config.cfg, logs,
//! command socket) and the daemon process currently running for it, if any.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::HarnessError;
use crate::names;
use crate::process::{describe_status, die_with_parent};

/// The longest unix socket path Linux accepts (`sun_path` is 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Files and process of one node. Obtained through [`crate::Cluster::node`].
#[derive(Debug)]
pub struct Node {
    index: usize,
    dir: PathBuf,
    ip: Ipv4Addr,
    server_port: u16,
    cmd_port: u16,
    proc: Mutex<Proc>,
    /// The node's simulated GPU driver, when the cluster has GPUs.
    pub(crate) gpu: Mutex<Option<std::process::Child>>,
    /// Variables set in the daemon's environment on top of the harness's own.
    pub(crate) env: Mutex<Vec<(OsString, OsString)>>,
}

/// The process side of a node, behind a lock so that `&self` observers (the `wait_*` loops)
/// can notice a daemon that died on its own.
#[derive(Debug, Default)]
pub(crate) struct Proc {
    /// The running daemon, until it is reaped.
    pub(crate) child: Option<Child>,
    /// How the previous daemon ended.
    pub(crate) last_exit: Option<ExitStatus>,
    /// Set when the harness itself asked the daemon to go (TERM/INT/QUIT/KILL).
    pub(crate) exit_expected: bool,
    /// How many times a daemon was spawned for this node.
    pub(crate) starts: u32,
}

impl Proc {
    /// Reaps the child if it has exited; returns its status then.
    pub(crate) fn reap(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                self.last_exit = Some(status);
                Some(status)
            }
            _ => None,
        }
    }

    /// Pid of the running (not yet reaped) daemon.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Node {
    /// Creates the node directory `<base>/node-NN` (no files yet).
    pub(crate) fn create(
        base: &Path,
        index: usize,
        ip: Ipv4Addr,
        server_port: u16,
        cmd_port: u16,
    ) -> Result<Self, HarnessError> {
        let dir = base.join(format!("node-{index:02}"));
        fs::create_dir_all(&dir).map_err(HarnessError::io(
            "create node directory",
            &dir,
            "check that the temp dir (TMPDIR) is writable",
        ))?;
        let node = Self {
            index,
            dir,
            ip,
            server_port,
            cmd_port,
            proc: Mutex::new(Proc::default()),
            gpu: Mutex::new(None),
            env: Mutex::new(Vec::new()),
        };
        let sock = node.socket_path();
        if sock.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(HarnessError::Io {
                action: "use unix socket path",
                path: sock,
                source: std::io::Error::other("longer than the 107 bytes Linux allows"),
                hint: "point TMPDIR at a shorter directory, e.g. TMPDIR=/tmp",
            });
        }
        Ok(node)
    }

    /// Index of the node (its line in the nodes file).
    pub fn index(&self) -> usize {
        self.index
    }
    /// The node directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Address the daemon binds (peer and command service).
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }
    /// `SERVER_PORT` (peer gRPC).
    pub fn server_port(&self) -> u16 {
        self.server_port
    }
    /// `IMEX_CMD_PORT` (command service over TCP).
    pub fn cmd_port(&self) -> u16 {
        self.cmd_port
    }
    /// `<dir>/config.cfg`.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.cfg")
    }
    /// `<dir>/nodes_config.cfg`.
    pub fn nodes_path(&self) -> PathBuf {
        self.dir.join("nodes_config.cfg")
    }
    /// `<dir>/hosts`: the daemon's `/etc/hosts` in names mode.
    pub fn hosts_path(&self) -> PathBuf {
        self.dir.join("hosts")
    }
    /// `<dir>/imex.log` (`LOG_FILE_NAME`).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("imex.log")
    }
    /// `<dir>/imex-stats.log` (`STATS_FILE_NAME`): never the machine's `/var/log`.
    pub fn stats_path(&self) -> PathBuf {
        self.dir.join("imex-stats.log")
    }
    /// `<dir>/imex.sock` (`IMEX_CMD_UNIX_DOMAIN_PATH`).
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join("imex.sock")
    }
    /// `<dir>/stdout.log`: the daemon's stdout, appended across restarts.
    pub fn stdout_path(&self) -> PathBuf {
        self.dir.join("stdout.log")
    }
    /// `<dir>/stderr.log`: the daemon's stderr, appended across restarts.
    pub fn stderr_path(&self) -> PathBuf {
        self.dir.join("stderr.log")
    }
    /// Gives the node a new address (its config must be rewritten and the daemon restarted).
    pub(crate) fn set_ip(&mut self, ip: Ipv4Addr) {
        self.ip = ip;
    }
    /// Pid of the daemon the harness believes running (not yet reaped), if any.
    pub fn pid(&self) -> Option<u32> {
        self.lock().pid()
    }
    /// How many times a daemon was spawned for this node.
    pub fn starts(&self) -> u32 {
        self.lock().starts
    }
    /// How the previous daemon of this node ended, once it was reaped.
    pub fn last_exit(&self) -> Option<ExitStatus> {
        self.lock().last_exit
    }

    /// The process state. A poisoned lock (a panic while holding it) still holds valid data.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Proc> {
        self.proc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The harness's standard keys for this node, in the order they are written.
    pub(crate) fn base_config(
        &self,
        heartbeat_ms: u64,
        peer_timeout_ms: u64,
    ) -> Vec<(String, String)> {
        let d = |p: PathBuf| p.display().to_string();
        [
            ("DAEMONIZE", "0".to_string()),
            ("LOG_LEVEL", "4".to_string()),
            ("LOG_FILE_NAME", d(self.log_path())),
            ("STATS_FILE_NAME", d(self.stats_path())),
            ("LOG_APPEND_TO_LOG", "1".to_string()),
            ("BIND_INTERFACE_IP", self.ip.to_string()),
            ("SERVER_PORT", self.server_port.to_string()),
            ("IMEX_NODE_CONFIG_FILE", d(self.nodes_path())),
            ("IMEX_WAIT_FOR_QUORUM", "NONE".to_string()),
            ("IMEX_CMD_ENABLED", "1".to_string()),
            ("IMEX_CMD_BIND_INTERFACE_IP", self.ip.to_string()),
            ("IMEX_CMD_PORT", self.cmd_port.to_string()),
            ("IMEX_CMD_UNIX_DOMAIN_PATH", d(self.socket_path())),
            ("OPENIMEX_DRIVER", "nogpu".to_string()),
            ("OPENIMEX_HEARTBEAT_INTERVAL_MS", heartbeat_ms.to_string()),
            ("OPENIMEX_PEER_TIMEOUT_MS", peer_timeout_ms.to_string()),
            // Each node its own record (the default is one path per machine).
            ("OPENIMEX_PERSIST_FILE", d(self.dir.join("persist.dat"))),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Writes `config.cfg` from `pairs` (see [`render_config`]).
    pub(crate) fn write_config(&self, pairs: &[(String, String)]) -> Result<(), HarnessError> {
        let path = self.config_path();
        fs::write(&path, render_config(pairs)).map_err(HarnessError::io(
            "write config file",
            path,
            "check that the cluster directory is writable",
        ))
    }

    /// Writes `nodes_config.cfg`: one host per line, line index = node ID.
    pub(crate) fn write_nodes(&self, hosts: &[String]) -> Result<(), HarnessError> {
        let path = self.nodes_path();
        let mut text = hosts.join("\n");
        text.push('\n');
        fs::write(&path, text).map_err(HarnessError::io(
            "write nodes file",
            path,
            "check that the cluster directory is writable",
        ))
    }

    /// Spawns `binary daemon -c <config>` with stdout/stderr appended to the node's files;
    /// with `names`, in a mount namespace of its own where `<dir>/hosts` is `/etc/hosts`.
    /// The caller holds the process lock and has checked that no daemon is running.
    pub(crate) fn spawn(
        &self,
        proc: &mut Proc,
        binary: &Path,
        names: bool,
    ) -> Result<(), HarnessError> {
        if names {
            names::check_executable(binary)?;
        }
        let stdout = self.open_append(&self.stdout_path())?;
        let stderr = self.open_append(&self.stderr_path())?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let marker = format!(
            "=== openimex-harness: start #{} of node {} at unix time {}.{:03} ===\n",
            proc.starts + 1,
            self.index,
            now.as_secs(),
            now.subsec_millis()
        );
        for mut f in [&stdout, &stderr] {
            let _ = f.write_all(marker.as_bytes());
        }
        let mut cmd = Command::new(binary);
        cmd.arg("daemon")
            .arg("-c")
            .arg(self.config_path())
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            // A test run under a service manager must not have its daemons report to it.
            .env_remove("NOTIFY_SOCKET")
            .envs(self.env.lock().unwrap_or_else(|e| e.into_inner()).clone());
        die_with_parent(&mut cmd);
        if names {
            names::private_hosts(&mut cmd, &self.hosts_path())?;
        }
        let child = cmd.spawn().map_err(|source| match names {
            // The binary was checked above: the failure is the namespace hook's.
            true => HarnessError::NamesModeNeedsRoot {
                index: self.index,
                hosts: self.hosts_path(),
                source,
            },
            false => HarnessError::Spawn {
                program: binary.to_owned(),
                source,
                hint: "build the openimex binary first (cargo build) and pass its path",
            },
        })?;
        proc.child = Some(child);
        proc.exit_expected = false;
        proc.starts += 1;
        Ok(())
    }

    fn open_append(&self, path: &Path) -> Result<File, HarnessError> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(HarnessError::io(
                "open log file",
                path,
                "check that the cluster directory is writable",
            ))
    }

    /// The node's logs (imex.log, stdout, stderr), each cut to its last `tail` lines
    /// (`None`: whole files), under a header naming the node.
    pub(crate) fn logs(&self, tail: Option<usize>) -> String {
        let state = {
            let p = self.lock();
            match (p.pid(), p.last_exit) {
                (Some(pid), _) => format!("running, pid {pid}"),
                (None, Some(s)) => describe_status(&s),
                (None, None) => "never started".into(),
            }
        };
        let mut out = format!(
            "===== node {} ({}) — {state} — {} =====\n",
            self.index,
            self.ip,
            self.dir.display()
        );
        for (name, path) in [
            ("imex.log", self.log_path()),
            ("gpu.log", self.dir.join("gpu.log")),
            ("stdout", self.stdout_path()),
            ("stderr", self.stderr_path()),
        ] {
            match fs::read(&path) {
                Ok(bytes) if !bytes.is_empty() => {
                    let text = String::from_utf8_lossy(&bytes);
                    out.push_str(&format!("--- {name} ---\n"));
                    out.push_str(&tail_lines(&text, tail));
                    if !text.ends_with('\n') {
                        out.push('\n');
                    }
                }
                Ok(_) => out.push_str(&format!("--- {name}: empty ---\n")),
                Err(_) if name == "gpu.log" => {}
                Err(_) => out.push_str(&format!("--- {name}: missing ---\n")),
            }
        }
        out
    }
}

/// Renders KEY=value lines, a header comment first. A key given twice is written once, at
/// its first position, with the *last* value: extra keys override the standard ones in
/// place, so the file means the same to a parser whether it keeps the first or last value.
pub fn render_config(pairs: &[(String, String)]) -> String {
    let mut merged: Vec<(&str, &str)> = Vec::with_capacity(pairs.len());
    for (k, v) in pairs {
        match merged.iter_mut().find(|(mk, _)| *mk == k.as_str()) {
            Some(slot) => slot.1 = v,
            None => merged.push((k, v)),
        }
    }
    let mut text = String::from("# written by openimex-harness\n");
    for (k, v) in merged {
        text.push_str(k);
        text.push('=');
        text.push_str(v);
        text.push('\n');
    }
    text
}

/// The last `n` lines of `text` (all of it for `None`), noting how many were left out.
pub(crate) fn tail_lines(text: &str, n: Option<usize>) -> String {
    let lines: Vec<&str> = text.lines().collect();
    match n {
        Some(n) if lines.len() > n => {
            let mut s = format!("[… {} earlier lines]\n", lines.len() - n);
            s.push_str(&lines[lines.len() - n..].join("\n"));
            s.push('\n');
            s
        }
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_overrides_in_place_and_appends_new_keys() {
        let pairs: Vec<(String, String)> = [
            ("DAEMONIZE", "0"),
            ("LOG_LEVEL", "4"),
            ("DAEMONIZE", "1"),
            ("EXTRA", "x=y"),
            ("EXTRA", "z"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            render_config(&pairs),
            "# written by openimex-harness\nDAEMONIZE=1\nLOG_LEVEL=4\nEXTRA=z\n"
        );
    }

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(
            tail_lines("a\nb\nc\n", Some(2)),
            "[… 1 earlier lines]\nb\nc\n"
        );
        assert_eq!(tail_lines("a\nb\n", Some(5)), "a\nb\n");
        assert_eq!(tail_lines("a\nb\n", None), "a\nb\n");
    }
}
