//! Waiting for every daemon to say itself that it is READY with all its peers connected,
//! through the service manager's protocol (`openimex_imexd::notify`): each daemon gets a
//! `NOTIFY_SOCKET` of its own and sends `STATUS=READY, all N peers connected` there the moment
//! its own row of `ctl -N` is complete. Nobody polls: the waiter learns of each daemon when
//! it is done, as the formation bench's gRPC mesh floor learns of each probe from the line it
//! prints, and the daemons are not asked anything while they form (a `ctl -N` look makes node
//! 0 ask every peer for its row).

use std::collections::BTreeSet;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::{Cluster, ERROR_LOG_TAIL};
use crate::HarnessError;

/// How often the waiter looks for daemons that exited while none reports.
const CHECK_EXITS: Duration = Duration::from_millis(50);

/// The sockets of [`Cluster::ready_watch`], removed on drop.
pub struct ReadyWatch {
    ready: mpsc::Receiver<usize>,
    nodes: usize,
    paths: Vec<PathBuf>,
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Cluster {
    /// Gives every daemon a `NOTIFY_SOCKET` (at their next start) and listens on each for the
    /// line that says it is READY with all its peers connected, for at most `timeout`.
    pub fn ready_watch(&self, timeout: Duration) -> Result<ReadyWatch, HarnessError> {
        let nodes = self.spec.nodes;
        let want = format!(
            "STATUS=READY, all {} peers connected",
            nodes.saturating_sub(1)
        );
        let (tx, ready) = mpsc::channel();
        let mut paths = Vec::with_capacity(nodes);
        for i in 0..nodes {
            let path = self.base_dir().join(format!("ready-{i}.sock"));
            let io = |action| HarnessError::io(action, &path, "check the cluster's directory");
            let _ = std::fs::remove_file(&path);
            let sock = UnixDatagram::bind(&path).map_err(io("bind the readiness socket of"))?;
            sock.set_read_timeout(Some(timeout))
                .map_err(io("set a read timeout on"))?;
            self.set_node_env(i, "NOTIFY_SOCKET", &path)?;
            paths.push(path);
            let (tx, want) = (tx.clone(), want.clone());
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = sock.recv(&mut buf) {
                    let said = String::from_utf8_lossy(buf.get(..n).unwrap_or_default());
                    if said.lines().any(|l| l == want) {
                        let _ = tx.send(i);
                        return;
                    }
                }
            });
        }
        Ok(ReadyWatch {
            ready,
            nodes,
            paths,
        })
    }
}

impl ReadyWatch {
    /// Waits until every daemon said it is READY with all its peers connected, at most
    /// `timeout`; a daemon that exits meanwhile ends the wait at once.
    pub fn wait(&self, cluster: &Cluster, timeout: Duration) -> Result<(), HarnessError> {
        let what = "every daemon READY with all its peers connected";
        let start = Instant::now();
        let mut done = BTreeSet::new();
        while done.len() < self.nodes {
            cluster.check_unexpected_exits(what)?;
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                let missing: Vec<usize> = (0..self.nodes).filter(|i| !done.contains(i)).collect();
                return Err(HarnessError::WaitTimeout {
                    node: missing.first().copied().unwrap_or(0),
                    what: what.to_owned(),
                    waited: timeout,
                    last: format!("not yet said by nodes {missing:?}"),
                    logs: cluster.logs_tail(ERROR_LOG_TAIL),
                });
            }
            match self.ready.recv_timeout(left.min(CHECK_EXITS)) {
                Ok(i) => {
                    done.insert(i);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(HarnessError::WaitTimeout {
                        node: 0,
                        what: what.to_owned(),
                        waited: start.elapsed(),
                        last: "every readiness socket stopped listening".into(),
                        logs: cluster.logs_tail(ERROR_LOG_TAIL),
                    });
                }
            }
        }
        Ok(())
    }
}
