//! [`ReadyChild`]: a helper process of the bench (a listen-probe baseline, the raw gRPC
//! server) that says `ready…` on its first stdout line, and is killed when dropped.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::HarnessError;
use crate::process::{describe, die_with_parent};

/// A running helper process; SIGKILLed and reaped on drop.
#[derive(Debug)]
pub struct ReadyChild {
    child: Child,
    line: String,
}

impl ReadyChild {
    /// Spawns `binary args…` and waits up to `timeout` for a first stdout line starting with
    /// `ready`. Its stderr goes to ours, so a helper that fails says why.
    pub fn spawn<I, S>(binary: &Path, args: I, timeout: Duration) -> Result<Self, HarnessError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        die_with_parent(&mut cmd);
        let command = describe(&cmd);
        let child = cmd.spawn().map_err(|source| HarnessError::Spawn {
            program: binary.to_owned(),
            source,
            hint: "build the openimex binary first (cargo build) and pass its path",
        })?;
        // Owned from here: an early return kills it.
        let mut me = Self {
            child,
            line: String::new(),
        };
        let Some(stdout) = me.child.stdout.take() else {
            return Err(HarnessError::parse(
                "helper stdout",
                "not captured",
                &command,
            ));
        };
        // A reader thread, because a pipe read has no time limit of its own.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let res = BufReader::new(stdout).read_line(&mut line).map(|_| line);
            let _ = tx.send(res);
        });
        match rx.recv_timeout(timeout) {
            Ok(Ok(line)) if line.starts_with("ready") => {
                me.line = line.trim_end().to_owned();
                Ok(me)
            }
            Ok(Ok(line)) => Err(HarnessError::parse(
                "helper's first line",
                "expected `ready`",
                &format!("{command}: {line:?}"),
            )),
            Ok(Err(e)) => Err(HarnessError::parse(
                "helper's first line",
                e.to_string(),
                &command,
            )),
            Err(_) => Err(HarnessError::CommandTimeout {
                command,
                waited: timeout,
                stdout: String::new(),
                stderr: "it never said ready".into(),
            }),
        }
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The `ready…` line it printed (without the newline).
    pub fn ready_line(&self) -> &str {
        &self.line
    }
}

impl Drop for ReadyChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
