//! The processes of a local domain: spawning them in the background (stdin closed, stdout and
//! stderr to files, so they outlive `local up`; they stay in its process group, so a Ctrl-C
//! while `up` waits stops them too, and one in a later job does not), the record of their pids
//! in the domain directory (`local.pids`, one `KIND NODE PID ARG` line each, appended as each
//! starts, so `local down` finds even those of an interrupted `up`), telling a recorded pid
//! from a reused one (its command line must still hold the recorded argument), and stopping
//! them: SIGTERM, then SIGKILL after a bounded wait.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use openimex_harness::Signal;
use openimex_harness::process::{process_alive, send_signal};

/// How long daemons get to say goodbye to their peers before SIGKILL.
const DAEMON_STOP: Duration = Duration::from_secs(10);
/// How long drivers get after SIGTERM.
const DRIVER_STOP: Duration = Duration::from_secs(5);
/// How long a SIGKILLed process may take to disappear.
const KILL_WAIT: Duration = Duration::from_secs(2);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(20);

/// What a recorded process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A node's simulated GPU driver (`gpu --node-dir DIR`).
    Driver,
    /// A node's IMEX daemon (`daemon -c CONFIG`).
    Daemon,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Driver => "driver",
            Kind::Daemon => "daemon",
        }
    }

    fn from_word(word: &str) -> Option<Self> {
        match word {
            "driver" => Some(Kind::Driver),
            "daemon" => Some(Kind::Daemon),
            _ => None,
        }
    }
}

/// One started process, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) kind: Kind,
    pub(super) node: usize,
    pub(super) pid: u32,
    /// An argument of its command line that names this domain's node: a pid reused by another
    /// process does not have it.
    pub(super) arg: String,
}

impl Record {
    /// True while the recorded process runs (not a zombie, and still the one recorded).
    pub(super) fn running(&self) -> bool {
        process_alive(self.pid) && has_arg(self.pid, &self.arg)
    }

    /// `daemon of node 2 (pid 1234)`.
    pub(super) fn describe(&self) -> String {
        format!(
            "{} of node {} (pid {})",
            self.kind.word(),
            self.node,
            self.pid
        )
    }
}

/// Whether process `pid`'s command line holds `arg` as one argument.
fn has_arg(pid: u32, arg: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == arg.as_bytes()))
}

/// Reads the record file; a missing file is no record. Lines that do not parse are skipped
/// with a warning naming the line (a hand-edited file must not stop `local down`).
pub(super) fn read_records(path: &Path) -> Result<Vec<Record>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "cannot read the local domain's process record {}; check its permissions",
                    path.display()
                )
            });
        }
    };
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut parts = line.splitn(4, ' ');
        let parsed = (|| {
            let kind = Kind::from_word(parts.next()?)?;
            let node = parts.next()?.parse().ok()?;
            let pid = parts.next()?.parse().ok()?;
            let arg = parts.next()?.to_owned();
            Some(Record {
                kind,
                node,
                pid,
                arg,
            })
        })();
        match parsed {
            Some(r) => records.push(r),
            None if line.trim().is_empty() => {}
            None => eprintln!(
                "openimex-lab: warning: {}:{}: not a process record (`KIND NODE PID ARG`), \
                 skipped: {line}",
                path.display(),
                i + 1
            ),
        }
    }
    Ok(records)
}

/// Appends `record` to the record file (created if missing).
fn append_record(path: &Path, record: &Record) -> Result<()> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| {
            format!(
                "cannot write the process record {}; check that the directory is writable",
                path.display()
            )
        })?;
    writeln!(
        f,
        "{} {} {} {}",
        record.kind.word(),
        record.node,
        record.pid,
        record.arg
    )
    .with_context(|| format!("cannot write the process record {}", path.display()))
}

/// A file for a process's stdout or stderr, appended to across runs.
fn output_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| {
            format!(
                "cannot open {} for a process's output; check that the directory is writable",
                path.display()
            )
        })
}

/// What to start for one node.
pub(super) struct Spawn<'a> {
    pub(super) kind: Kind,
    pub(super) node: usize,
    pub(super) program: &'a Path,
    pub(super) args: Vec<String>,
    /// The argument that identifies it (one of `args`).
    pub(super) arg: String,
    pub(super) stdout: PathBuf,
    pub(super) stderr: PathBuf,
    pub(super) cwd: &'a Path,
}

/// The processes started by one `local up`, stopped (SIGKILL, reaped), their record and
/// their sockets removed when dropped unless [`Started::keep`] was called: a failed `up`
/// leaves nothing running.
pub(super) struct Started {
    record_file: PathBuf,
    /// The sockets the processes create (left behind by a SIGKILL).
    sockets: Vec<PathBuf>,
    children: Vec<(Record, Child)>,
    keep: bool,
}

impl Started {
    pub(super) fn new(record_file: PathBuf, sockets: Vec<PathBuf>) -> Self {
        Self {
            record_file,
            sockets,
            children: Vec::new(),
            keep: false,
        }
    }

    /// Starts `s` in the background and records it.
    pub(super) fn spawn(&mut self, s: Spawn<'_>) -> Result<&Record> {
        let stdout = output_file(&s.stdout)?;
        let stderr = if s.stderr == s.stdout {
            stdout
                .try_clone()
                .with_context(|| format!("cannot share {}", s.stdout.display()))?
        } else {
            output_file(&s.stderr)?
        };
        let mut cmd = Command::new(s.program);
        cmd.args(&s.args)
            .current_dir(s.cwd)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            // Not a service manager's child: it must not report readiness to one.
            .env_remove("NOTIFY_SOCKET");
        let child = cmd.spawn().with_context(|| {
            format!(
                "cannot start {} for node {} ({} {}); check that the binary exists and is \
                 executable",
                s.kind.word(),
                s.node,
                s.program.display(),
                s.args.join(" ")
            )
        })?;
        let record = Record {
            kind: s.kind,
            node: s.node,
            pid: child.id(),
            arg: s.arg,
        };
        self.children.push((record.clone(), child));
        append_record(&self.record_file, &record)?;
        let (record, _) = self.children.last().context("the process just started")?;
        Ok(record)
    }

    /// The exit of a started process that is no longer running, with its record.
    pub(super) fn exited(&mut self) -> Option<(Record, String)> {
        self.children
            .iter_mut()
            .find_map(|(r, c)| match c.try_wait() {
                Ok(Some(status)) => Some((
                    r.clone(),
                    openimex_harness::process::describe_status(&status),
                )),
                _ => None,
            })
    }

    /// Leaves the processes running (they outlive this process).
    pub(super) fn keep(mut self) -> Vec<Record> {
        self.keep = true;
        self.children.iter().map(|(r, _)| r.clone()).collect()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for (_, child) in &mut self.children {
            let _ = child.kill();
        }
        for (_, child) in &mut self.children {
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.record_file);
        for socket in &self.sockets {
            remove_socket(socket);
        }
    }
}

/// Removes `path` if it is a socket (a stopped process's; never a file of another kind).
pub(super) fn remove_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// What [`stop`] did.
#[derive(Debug, Default)]
pub(super) struct Stopped {
    /// Processes that exited after SIGTERM.
    pub(super) terminated: Vec<Record>,
    /// Processes SIGKILLed after the wait.
    pub(super) killed: Vec<Record>,
    /// Processes still there after SIGKILL (should not happen).
    pub(super) remaining: Vec<Record>,
}

/// Stops the running ones among `records`: daemons first (SIGTERM: they leave their peers
/// cleanly), then drivers; whatever is left after its wait gets SIGKILL.
pub(super) fn stop(records: &[Record]) -> Stopped {
    let mut out = Stopped::default();
    for (kind, limit) in [(Kind::Daemon, DAEMON_STOP), (Kind::Driver, DRIVER_STOP)] {
        let group: Vec<&Record> = records
            .iter()
            .filter(|r| r.kind == kind && r.running())
            .collect();
        for r in &group {
            let _ = send_signal(r.pid, Signal::SIGTERM);
            let _ = send_signal(r.pid, Signal::SIGCONT);
        }
        wait_gone(&group, limit);
        let (gone, stuck): (Vec<&Record>, Vec<&Record>) =
            group.into_iter().partition(|r| !r.running());
        out.terminated.extend(gone.into_iter().cloned());
        // One wait for all of them: n stuck processes cost one KILL_WAIT, not n.
        for r in &stuck {
            let _ = send_signal(r.pid, Signal::SIGKILL);
        }
        wait_gone(&stuck, KILL_WAIT);
        for r in stuck {
            match r.running() {
                true => out.remaining.push(r.clone()),
                false => out.killed.push(r.clone()),
            }
        }
    }
    out
}

/// Waits up to `limit` for every one of `records` to stop running.
fn wait_gone(records: &[&Record], limit: Duration) {
    let start = Instant::now();
    while records.iter().any(|r| r.running()) && start.elapsed() < limit {
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_lines_are_skipped() {
        let dir = std::env::temp_dir().join(format!("openimex-local-procs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let file = dir.join("local.pids");
        let _ = std::fs::remove_file(&file);
        assert!(read_records(&file).expect("missing is empty").is_empty());
        let r = Record {
            kind: Kind::Daemon,
            node: 2,
            pid: 42,
            arg: "/a dir/node2/config.cfg".into(),
        };
        append_record(&file, &r).expect("append");
        let mut f = OpenOptions::new().append(true).open(&file).expect("open");
        writeln!(f, "garbage line").expect("write");
        let back = read_records(&file).expect("read");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(back, vec![r]);
    }

    #[test]
    fn a_reused_pid_is_not_ours() {
        // This test process runs, but its command line does not hold the recorded argument.
        let me = Record {
            kind: Kind::Driver,
            node: 0,
            pid: std::process::id(),
            arg: "/no/such/node0".into(),
        };
        assert!(!me.running());
    }
}
