//! Waiting for a domain state through one long-lived `ctl -N -j --watch` instead of a `ctl`
//! process per look: the watch asks the daemon every interval and prints a view only when it
//! changed, so the waiter sees a change within one interval and no process is started per look.
//! The formation bench waits this way: a `ctl` per look cost about 1.5 ms of CPU each, on a
//! machine whose two cores the forming daemons already fill, and up to 10 ms of sleep plus a
//! process start between a change and its sight.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::{Cluster, ERROR_LOG_TAIL};
use crate::HarnessError;
use crate::domain::DomainView;
use crate::process::{describe, describe_status, die_with_parent};

/// How often the waiter looks for daemons that exited while no view arrives.
const CHECK_EXITS: Duration = Duration::from_millis(50);

/// The `ctl --watch` process, killed and reaped on drop.
struct Watch(Child);

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Cluster {
    /// Like [`Cluster::wait_domain_every`], through one `ctl -N -j --watch --interval
    /// INTERVAL` on node `i` (see the module docs). `interval` is at least 10 ms (ctl's
    /// floor). The watch may start before the daemon listens: ctl reports the failed call on
    /// stderr and goes on asking.
    pub fn wait_domain_watching(
        &self,
        i: usize,
        timeout: Duration,
        interval: Duration,
        what: &str,
        pred: impl Fn(&DomainView) -> bool,
    ) -> Result<DomainView, HarnessError> {
        let interval = interval.as_millis().max(10).to_string();
        let mut cmd = self.ctl_command(i, &["-N", "-j", "--watch", "--interval", &interval])?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        die_with_parent(&mut cmd);
        let command = describe(&cmd);
        let mut child = cmd.spawn().map_err(|source| HarnessError::Spawn {
            program: self.spec.binary.clone(),
            source,
            hint: "build the openimex binary first (cargo build) and pass its path",
        })?;
        let (stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
        let mut watch = Watch(child);
        let (tx, views) = mpsc::channel();
        thread::spawn(move || {
            if let Some(out) = stdout {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            }
        });
        let start = Instant::now();
        let mut last = String::from("(no view yet)");
        loop {
            self.check_unexpected_exits(what)?;
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(HarnessError::WaitTimeout {
                    node: i,
                    what: what.to_owned(),
                    waited: timeout,
                    last,
                    logs: self.logs_tail(ERROR_LOG_TAIL),
                });
            }
            match views.recv_timeout(left.min(CHECK_EXITS)) {
                Ok(line) => match DomainView::parse(&line) {
                    Ok(view) if pred(&view) => return Ok(view),
                    Ok(view) => last = view.compact(),
                    Err(e) => last = crate::error::truncate(&e.to_string(), 4000),
                },
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // The watch ended on its own: say how, with what it said.
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = watch.0.wait().map_or_else(
                        |e| format!("cannot wait for it: {e}"),
                        |s| describe_status(&s),
                    );
                    let mut said = String::new();
                    if let Some(err) = stderr.as_mut() {
                        let _ = err.read_to_string(&mut said);
                    }
                    return Err(HarnessError::CommandFailed {
                        command,
                        status,
                        stdout: last,
                        stderr: said,
                    });
                }
            }
        }
    }
}
