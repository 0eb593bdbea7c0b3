//! `DAEMONIZE=1`: fork into the background as NVIDIA's daemon does for systemd `Type=forking`.
//!
//! The parent does not return until the child is serving (or has failed), so `systemctl start`
//! and scripts that run `nvidia-imex -c cfg` and then `nvidia-imex-ctl -q` see a ready daemon,
//! and a start-up failure in the child is the parent's exit status.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;

use nix::unistd::{ForkResult, dup2_stderr, dup2_stdin, dup2_stdout, fork, setsid};

/// What [`daemonize`] returns in the child: report the outcome of start-up through it.
#[derive(Debug)]
pub struct ReadyPipe(Option<File>);

impl ReadyPipe {
    /// Tells the waiting parent that the daemon is serving; the parent exits 0.
    pub fn ready(&mut self) {
        if let Some(mut f) = self.0.take() {
            let _ = f.write_all(b"1");
        }
    }

    /// A pipe for a daemon that did not fork.
    pub fn none() -> Self {
        Self(None)
    }
}

/// Forks. In the parent, waits for the child's report and exits the process (0 when the child
/// reported ready, 1 otherwise). In the child, starts a new session, points stdio at /dev/null
/// and returns the pipe to report readiness on.
///
/// MUST be called before any thread is started (before the tokio runtime exists).
pub fn daemonize() -> std::io::Result<ReadyPipe> {
    let (read_end, write_end): (OwnedFd, OwnedFd) = nix::unistd::pipe()?;
    // SAFETY: called while the process is single-threaded (documented contract), so the child
    // may run arbitrary code after fork.
    match unsafe { fork() }? {
        ForkResult::Parent { .. } => {
            drop(write_end);
            let mut byte = [0u8; 1];
            let ok = matches!(File::from(read_end).read(&mut byte), Ok(1));
            std::process::exit(if ok { 0 } else { 1 });
        }
        ForkResult::Child => {
            drop(read_end);
            setsid()?;
            let devnull = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")?;
            dup2_stdin(&devnull)?;
            dup2_stdout(&devnull)?;
            dup2_stderr(&devnull)?;
            Ok(ReadyPipe(Some(File::from(write_end))))
        }
    }
}
