//! Waiting for every daemon to say itself that it is READY with all its peers connected,
//! through the service manager's protocol (`openimex_imexd::notify`): each daemon gets a
//! `NOTIFY_SOCKET` of its own and sends `STATUS=READY, all N peers connected` there the moment
//! its own row of `ctl -N` is complete. Nobody polls: the waiter learns of each daemon when
//! it is done, as the formation bench's gRPC mesh floor learns of each probe from the line it
//! prints, and the daemons are not asked anything while they form (a `ctl -N` look makes node
//! 0 ask every peer for its row).

use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::{Cluster, ERROR_LOG_TAIL};
use crate::HarnessError;

/// How often the waiter looks for daemons that exited while none reports.
const CHECK_EXITS: Duration = Duration::from_millis(50);

/// The sockets of [`Cluster::ready_watch`], removed on drop. They are read by the thread that
/// waits, with one `poll` over all of them: a thread per socket would make each daemon's spawn
/// (a fork of this process) copy one more stack's mappings per node, which at 144 nodes cost
/// the daemons' side of the formation bench more than its probes' (perf, 2026-12-08).
pub struct ReadyWatch {
    sockets: Vec<UnixDatagram>,
    /// Which daemons have said the line (kept from one wait to the next).
    said: Vec<bool>,
    want: String,
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
    /// Gives every daemon a `NOTIFY_SOCKET` (at their next start) and binds each, to be read
    /// by [`ReadyWatch::wait`] for the line that says it is READY with all its peers connected.
    pub fn ready_watch(&self) -> Result<ReadyWatch, HarnessError> {
        let nodes = self.spec.nodes;
        let want = format!(
            "STATUS=READY, all {} peers connected",
            nodes.saturating_sub(1)
        );
        let mut sockets = Vec::with_capacity(nodes);
        let mut paths = Vec::with_capacity(nodes);
        for i in 0..nodes {
            let path = self.base_dir().join(format!("ready-{i}.sock"));
            let io = |action| HarnessError::io(action, &path, "check the cluster's directory");
            let _ = std::fs::remove_file(&path);
            let sock = UnixDatagram::bind(&path).map_err(io("bind the readiness socket of"))?;
            paths.push(path.clone());
            sock.set_nonblocking(true)
                .map_err(io("make non-blocking the readiness socket of"))?;
            self.set_node_env(i, "NOTIFY_SOCKET", &path)?;
            sockets.push(sock);
        }
        Ok(ReadyWatch {
            said: vec![false; sockets.len()],
            sockets,
            want,
            paths,
        })
    }
}

impl ReadyWatch {
    /// The daemons that have not said the line yet.
    fn missing(&self) -> Vec<usize> {
        (0..self.said.len()).filter(|&i| !self.said[i]).collect()
    }

    /// Waits until every daemon said it is READY with all its peers connected, at most
    /// `timeout`; a daemon that exits meanwhile ends the wait at once.
    pub fn wait(&mut self, cluster: &Cluster, timeout: Duration) -> Result<(), HarnessError> {
        let what = "every daemon READY with all its peers connected";
        let start = Instant::now();
        let mut buf = [0u8; 4096];
        while self.said.contains(&false) {
            cluster.check_unexpected_exits(what)?;
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                let missing = self.missing();
                return Err(HarnessError::WaitTimeout {
                    node: missing.first().copied().unwrap_or(0),
                    what: what.to_owned(),
                    waited: timeout,
                    last: format!("not yet said by nodes {missing:?}"),
                    logs: cluster.logs_tail(ERROR_LOG_TAIL),
                });
            }
            let waiting = self.missing();
            let mut fds: Vec<PollFd> = waiting
                .iter()
                .map(|&i| PollFd::new(self.sockets[i].as_fd(), PollFlags::POLLIN))
                .collect();
            let wait_ms = left.min(CHECK_EXITS).as_millis().max(1);
            let wait = PollTimeout::try_from(wait_ms).unwrap_or(PollTimeout::MAX);
            match poll(&mut fds, wait) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    return Err(HarnessError::io(
                        "poll the readiness sockets in",
                        &cluster.base_dir(),
                        "the process may be out of file descriptors (ulimit -n)",
                    )(std::io::Error::from(e)));
                }
            }
            let readable: Vec<usize> = waiting
                .iter()
                .zip(&fds)
                .filter(|(_, fd)| fd.revents().is_some_and(|r| !r.is_empty()))
                .map(|(&i, _)| i)
                .collect();
            for i in readable {
                // Everything queued on it: a daemon may say other lines first (READY=1 alone).
                while let Ok(n) = self.sockets[i].recv(&mut buf) {
                    let said = String::from_utf8_lossy(buf.get(..n).unwrap_or_default());
                    if said.lines().any(|l| l == self.want) {
                        self.said[i] = true;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClusterSpec;

    fn say(cluster: &Cluster, node: usize, what: &str) {
        let path = cluster.base_dir().join(format!("ready-{node}.sock"));
        let out = UnixDatagram::unbound().expect("socket");
        out.send_to(what.as_bytes(), &path).expect("send");
    }

    /// The wait ends when every daemon has said the all-connected line, whatever it said
    /// before it, and only then: a daemon that said only a partial count is named when the
    /// time runs out.
    #[test]
    fn the_wait_ends_on_each_daemons_all_connected_line_and_names_the_missing() {
        let cluster = Cluster::prepare(ClusterSpec::new(3, "/bin/true")).expect("prepare");
        let mut watch = cluster.ready_watch().expect("watch");
        say(&cluster, 0, "READY=1\nSTATUS=READY");
        say(&cluster, 0, "STATUS=READY, all 2 peers connected");
        say(&cluster, 1, "STATUS=READY, all 2 peers connected");
        say(&cluster, 2, "STATUS=READY, 1 of 2 peers connected");
        match watch.wait(&cluster, Duration::from_millis(300)) {
            Err(HarnessError::WaitTimeout { node, last, .. }) => {
                assert_eq!(node, 2);
                assert!(last.contains("[2]"), "{last}");
            }
            other => panic!("expected a timeout naming node 2, got {other:?}"),
        }
        say(&cluster, 2, "STATUS=READY, all 2 peers connected");
        watch
            .wait(&cluster, Duration::from_secs(10))
            .expect("every daemon said it");
    }
}
