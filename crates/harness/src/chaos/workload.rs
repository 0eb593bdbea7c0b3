//! The workload's processes: one `openimex-lab app churn` per exporting GPU and one
//! `openimex-lab app reader` per importing GPU (following every exporter on the other nodes),
//! their stdout parsed into `Event`s on reader threads, and their exits classified.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::HarnessError;
use crate::process::{describe_status, die_with_parent};

/// Lines of an app's stderr kept for reports.
const STDERR_KEEP: usize = 20;
/// The apps' exit code for "my GPU driver is gone" (`app churn`/`app reader`).
const LOST_DRIVER: i32 = 3;

/// What an app does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `app churn`: exports generation after generation.
    Exporter,
    /// `app reader`: imports what the exporters of other nodes publish, and checks it.
    Reader,
}

/// How one workload process is started (again after each death).
#[derive(Debug, Clone)]
pub(crate) struct AppSpec {
    pub(crate) role: Role,
    pub(crate) node: usize,
    /// `n{node}g{gpu}`: the exporter's handle file name, the tag readers print.
    pub(crate) name: String,
    pub(crate) args: Vec<String>,
}

/// One parsed line of an app, stamped when it was read.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) app: usize,
    pub(crate) at: Instant,
    pub(crate) line: Line,
}

/// The line protocol of `app churn` and `app reader` (see the client's `cli/workload.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Line {
    Exported,
    Imported {
        tag: String,
        seed: String,
        micros: u64,
    },
    /// `n` checks of the import of `seed` found the pattern.
    Ok {
        tag: String,
        seed: String,
        n: u64,
    },
    /// A driver call failed: expected while a fault lasts. A reader's import or map names the
    /// exporter it was for.
    Fail {
        op: String,
        code: String,
        tag: Option<String>,
    },
    Stale {
        detail: String,
    },
    Freed {
        detail: String,
    },
    Corrupt {
        detail: String,
    },
    Other(String),
}

impl Line {
    /// A reader's complaint about one exporter's memory: that exporter's tag, and what went
    /// wrong (a failed import or map; freed, stale or corrupt words read).
    pub(crate) fn complaint(&self) -> Option<(&str, &'static str)> {
        let (tag, what) = match self {
            Line::Fail {
                tag: Some(t), op, ..
            } if op == "map" => (t.as_str(), "map failed"),
            Line::Fail { tag: Some(t), .. } => (t.as_str(), "import failed"),
            Line::Freed { detail } => (detail.as_str(), "read freed memory"),
            Line::Stale { detail } => (detail.as_str(), "read a canary"),
            Line::Corrupt { detail } => (detail.as_str(), "read corrupt words"),
            _ => return None,
        };
        // A detail opens with the exporter's tag.
        Some((tag.split_whitespace().next()?, what))
    }

    pub(crate) fn parse(line: &str) -> Line {
        let w: Vec<&str> = line.split_whitespace().collect();
        let rest = |n: usize| w.get(n..).map(|r| r.join(" ")).unwrap_or_default();
        match w.as_slice() {
            ["exported", ..] => Line::Exported,
            ["imported", tag, seed, micros] => Line::Imported {
                tag: (*tag).to_owned(),
                seed: (*seed).to_owned(),
                micros: micros.parse().unwrap_or(0),
            },
            ["ok", tag, seed, n] => Line::Ok {
                tag: (*tag).to_owned(),
                seed: (*seed).to_owned(),
                n: n.parse().unwrap_or(0),
            },
            ["fail", op @ ("import" | "map"), tag, _seed, code] => Line::Fail {
                op: (*op).to_owned(),
                code: (*code).to_owned(),
                tag: Some((*tag).to_owned()),
            },
            ["fail", op, .., code] => Line::Fail {
                op: (*op).to_owned(),
                code: (*code).to_owned(),
                tag: None,
            },
            ["stale", ..] => Line::Stale { detail: rest(1) },
            ["freed", ..] => Line::Freed { detail: rest(1) },
            ["corrupt", ..] => Line::Corrupt { detail: rest(1) },
            _ => Line::Other(line.to_owned()),
        }
    }
}

/// How an app's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The engine killed it (a fault, or the end of the run).
    Killed,
    /// SIGKILL from its node's driver: its imports were revoked (the job dies, as on RC).
    Revoked,
    /// Its driver went away (exit 3).
    LostDriver,
    /// Exit 0 (it was told to stop).
    Clean,
    /// Anything else: a crash worth reporting.
    Crashed,
}

/// A running (or dead, awaiting respawn) workload process.
pub(crate) struct App {
    pub(crate) spec: AppSpec,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// Set when the engine killed it, so its death is not taken for a revocation.
    killed_by_us: bool,
    /// When to start it again (None while running or when it must stay down).
    pub(crate) respawn_at: Option<Instant>,
    /// How many times it was started.
    pub(crate) starts: u32,
}

impl App {
    pub(crate) fn new(spec: AppSpec) -> Self {
        Self {
            spec,
            child: None,
            stdin: None,
            stderr: Arc::new(Mutex::new(VecDeque::new())),
            killed_by_us: false,
            respawn_at: Some(Instant::now()),
            starts: 0,
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the process: stdout lines go to `events` as app `index`.
    pub(crate) fn spawn(
        &mut self,
        binary: &Path,
        index: usize,
        events: &Sender<Event>,
    ) -> Result<(), HarnessError> {
        let mut cmd = Command::new(binary);
        cmd.arg("app")
            .args(&self.spec.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|source| HarnessError::Spawn {
            program: binary.to_owned(),
            source,
            hint: "build the openimex binary first (cargo build)",
        })?;
        if let Some(out) = child.stdout.take() {
            let tx = events.clone();
            thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    let ev = Event {
                        app: index,
                        at: Instant::now(),
                        line: Line::parse(&line),
                    };
                    if tx.send(ev).is_err() {
                        break;
                    }
                }
            });
        }
        if let Some(mut err) = child.stderr.take() {
            let sink = self.stderr.clone();
            thread::spawn(move || {
                let mut text = String::new();
                let _ = err.read_to_string(&mut text);
                let mut kept = sink.lock().unwrap_or_else(|e| e.into_inner());
                for l in text.lines() {
                    if kept.len() == STDERR_KEEP {
                        kept.pop_front();
                    }
                    kept.push_back(l.to_owned());
                }
            });
        }
        self.stdin = child.stdin.take();
        self.child = Some(child);
        self.killed_by_us = false;
        self.respawn_at = None;
        self.starts += 1;
        Ok(())
    }

    /// SIGKILLs it (a fault); its death is then [`Exit::Killed`].
    pub(crate) fn kill(&mut self) {
        if let Some(c) = self.child.as_mut() {
            self.killed_by_us = true;
            let _ = c.kill();
        }
    }

    /// Asks it to release what it holds and exit (`exit` on stdin, then stdin closed).
    pub(crate) fn ask_exit(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "exit").and_then(|()| stdin.flush());
        }
    }

    /// Reaps the process if it has ended.
    pub(crate) fn reap(&mut self) -> Option<(Exit, ExitStatus)> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        self.stdin = None;
        let exit = match (status.code(), status.signal()) {
            _ if self.killed_by_us => Exit::Killed,
            (Some(0), _) => Exit::Clean,
            (Some(LOST_DRIVER), _) => Exit::LostDriver,
            (None, Some(9)) => Exit::Revoked,
            _ => Exit::Crashed,
        };
        Some((exit, status))
    }

    /// Why a crashed app died, for the report.
    pub(crate) fn crash_note(&self, status: &ExitStatus) -> String {
        let kept = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        let tail: Vec<&str> = kept.iter().map(String::as_str).collect();
        format!(
            "{} {} ({}): {}; stderr: {}",
            role_name(self.spec.role),
            self.spec.name,
            self.spec.args.first().map_or("", String::as_str),
            describe_status(status),
            tail.join(" | ")
        )
    }

    /// Waits up to `timeout` for it to end (after [`App::ask_exit`]); kills it after that.
    pub(crate) fn finish(&mut self, timeout: Duration) -> Option<(Exit, ExitStatus)> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.reap() {
                return Some(r);
            }
            self.child.as_ref()?;
            if Instant::now() >= deadline {
                self.kill();
                let status = self.child.take()?.wait().ok()?;
                return Some((Exit::Killed, status));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(crate) fn role_name(role: Role) -> &'static str {
    match role {
        Role::Exporter => "exporter",
        Role::Reader => "reader",
    }
}

/// Timing of the workload's processes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AppTiming {
    pub(crate) hold_ms: u64,
    pub(crate) canary_ms: u64,
    pub(crate) interval_ms: u64,
}

/// The apps of a layout: exporters (one per GPU of each exporting node) first, then readers
/// (one per GPU of each reading node, following every exporter on another node).
pub(crate) fn layout(
    node_dirs: &[PathBuf],
    gpus: u32,
    exporters: &[usize],
    readers: &[usize],
    handles: &Path,
    t: AppTiming,
) -> Vec<AppSpec> {
    let name = |n: usize, g: u32| format!("n{n}g{g}");
    let mut apps = Vec::new();
    for &n in exporters {
        for g in 0..gpus {
            let args = vec![
                "churn".into(),
                "--node-dir".into(),
                node_dirs[n].display().to_string(),
                "--gpu".into(),
                g.to_string(),
                "--size".into(),
                "2M".into(),
                "--handle-file".into(),
                handles.join(name(n, g)).display().to_string(),
                "--hold-ms".into(),
                t.hold_ms.to_string(),
                "--canary-ms".into(),
                t.canary_ms.to_string(),
            ];
            apps.push(AppSpec {
                role: Role::Exporter,
                node: n,
                name: name(n, g),
                args,
            });
        }
    }
    for &n in readers {
        for g in 0..gpus {
            let mut args = vec![
                "reader".into(),
                "--node-dir".into(),
                node_dirs[n].display().to_string(),
                "--interval-ms".into(),
                t.interval_ms.to_string(),
                // A reader imports its sources one after another: a short bound keeps one
                // unreachable exporter from holding up the others for long.
                "--import-timeout".into(),
                "2".into(),
            ];
            for &e in exporters.iter().filter(|&&e| e != n) {
                for eg in 0..gpus {
                    args.push("--source".into());
                    args.push(handles.join(name(e, eg)).display().to_string());
                }
            }
            apps.push(AppSpec {
                role: Role::Reader,
                node: n,
                name: name(n, g),
                args,
            });
        }
    }
    apps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse() {
        assert_eq!(Line::parse("exported 3 abc"), Line::Exported);
        assert_eq!(
            Line::parse("imported n0g1 ff 1234"),
            Line::Imported {
                tag: "n0g1".into(),
                seed: "ff".into(),
                micros: 1234
            }
        );
        assert_eq!(
            Line::parse("ok n0g1 ff 7"),
            Line::Ok {
                tag: "n0g1".into(),
                seed: "ff".into(),
                n: 7
            }
        );
        assert_eq!(
            Line::parse("fail import n0g1 ff CUDA_ERROR_NOT_READY"),
            Line::Fail {
                op: "import".into(),
                code: "CUDA_ERROR_NOT_READY".into(),
                tag: Some("n0g1".into()),
            }
        );
        assert_eq!(
            Line::parse("fail create CUDA_ERROR_INVALID_VALUE"),
            Line::Fail {
                op: "create".into(),
                code: "CUDA_ERROR_INVALID_VALUE".into(),
                tag: None,
            }
        );
        assert_eq!(
            Line::parse("stale n0g1 ff 4096"),
            Line::Stale {
                detail: "n0g1 ff 4096".into()
            }
        );
        assert!(matches!(Line::parse("what"), Line::Other(_)));
        assert_eq!(
            Line::parse("fail map n0g1 ff CUDA_ERROR_ILLEGAL_STATE").complaint(),
            Some(("n0g1", "map failed"))
        );
        assert_eq!(
            Line::parse("freed n2g0 ab 64").complaint(),
            Some(("n2g0", "read freed memory"))
        );
        assert_eq!(Line::parse("fail create CUDA_ERROR_OOM").complaint(), None);
        assert_eq!(Line::parse("ok n0g1 ff 7").complaint(), None);
    }

    #[test]
    fn readers_follow_exporters_on_other_nodes_only() {
        let dirs: Vec<PathBuf> = (0..3).map(|i| PathBuf::from(format!("/n{i}"))).collect();
        let t = AppTiming {
            hold_ms: 1,
            canary_ms: 1,
            interval_ms: 1,
        };
        let apps = layout(&dirs, 2, &[0, 1], &[1, 2], Path::new("/h"), t);
        assert_eq!(apps.len(), 8);
        let reader_n1 = apps
            .iter()
            .find(|a| a.role == Role::Reader && a.node == 1)
            .expect("a reader on node 1");
        let sources = reader_n1.args.iter().filter(|a| *a == "--source").count();
        assert_eq!(sources, 2, "node 1 follows node 0's two GPUs only");
        let reader_n2 = apps
            .iter()
            .find(|a| a.role == Role::Reader && a.node == 2)
            .expect("a reader on node 2");
        assert_eq!(
            reader_n2.args.iter().filter(|a| *a == "--source").count(),
            4
        );
    }
}
