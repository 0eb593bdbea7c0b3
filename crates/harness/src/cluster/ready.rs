//! Waiting for every daemon to say itself that it is READY with all its peers connected,
//! through the service manager's protocol (`openimex_imexd::notify`): each daemon gets a
//! `NOTIFY_SOCKET` of its own and sends `STATUS=READY, all N peers connected` there the moment
//! its own row of `ctl -N` is complete. Nobody asks: the waiter learns of each daemon when
//! it is done, as the formation bench's gRPC mesh floor learns of each probe from the line it
//! prints, and the daemons are not asked anything while they form (a `ctl -N` look makes node
//! 0 ask every peer for its row).

use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::{Cluster, ERROR_LOG_TAIL};
use crate::HarnessError;

/// How often the waiter looks for daemons that exited.
const CHECK_EXITS: Duration = Duration::from_millis(50);

/// How long the reader's `poll` may block before it looks whether the watch was dropped.
const READER_TICK: Duration = Duration::from_millis(100);

/// The sockets of [`Cluster::ready_watch`] and their one reader thread; the sockets are
/// removed and the reader ends on drop.
///
/// One thread reads them all (`poll`), as one thread reads the mesh floor's pipe: a thread
/// per socket made the harness a process of N + 1 threads, and each daemon's spawn (a fork of
/// it) copied every thread's mappings. At 144 nodes that made the spawn loop, which runs on
/// the clock, 2.5–2.95 s against the probes' 1.7–2.2 s (2026-12-08). The reader drains the
/// sockets while the daemons are still being spawned, so no daemon's notification waits for
/// room in a full queue (10 datagrams).
pub struct ReadyWatch {
    ready: mpsc::Receiver<usize>,
    /// Which daemons have said the line (kept from one wait to the next).
    said: Vec<bool>,
    stop: Arc<AtomicBool>,
    paths: Vec<PathBuf>,
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Cluster {
    /// Gives every daemon a `NOTIFY_SOCKET` (at their next start) and starts the thread that
    /// reads them all for the line that says a daemon is READY with all its peers connected
    /// ([`ReadyWatch::wait`]).
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
        let (tx, ready) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let reader_stop = Arc::clone(&stop);
        thread::Builder::new()
            .name("ready-watch".into())
            .spawn(move || read_all(&sockets, &want, &tx, &reader_stop))
            .map_err(HarnessError::io(
                "start the thread that reads the readiness sockets in",
                self.base_dir(),
                "the process may be out of threads (ulimit -u)",
            ))?;
        Ok(ReadyWatch {
            ready,
            said: vec![false; nodes],
            stop,
            paths,
        })
    }
}

/// Sends the index of each socket on which `want` arrives, once, until every socket has
/// said it, `stop` is set or the waiter is gone.
fn read_all(sockets: &[UnixDatagram], want: &str, tx: &mpsc::Sender<usize>, stop: &AtomicBool) {
    let mut said = vec![false; sockets.len()];
    let mut buf = [0u8; 4096];
    let tick = PollTimeout::try_from(READER_TICK.as_millis()).unwrap_or(PollTimeout::MAX);
    while said.contains(&false) && !stop.load(Ordering::Relaxed) {
        let waiting: Vec<usize> = (0..said.len()).filter(|&i| !said[i]).collect();
        let mut fds: Vec<PollFd> = (waiting.iter())
            .map(|&i| PollFd::new(sockets[i].as_fd(), PollFlags::POLLIN))
            .collect();
        match poll(&mut fds, tick) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            // The waiter's timeout reports what is missing.
            Err(_) => return,
        }
        let readable: Vec<usize> = (waiting.iter().zip(&fds))
            .filter(|(_, fd)| fd.revents().is_some_and(|r| !r.is_empty()))
            .map(|(&i, _)| i)
            .collect();
        for i in readable {
            // Everything queued on it: a daemon says other lines first (its states).
            while let Ok(n) = sockets[i].recv(&mut buf) {
                let line = String::from_utf8_lossy(buf.get(..n).unwrap_or_default());
                if !said[i] && line.lines().any(|l| l == want) {
                    said[i] = true;
                    if tx.send(i).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

impl ReadyWatch {
    /// Waits until every daemon said it is READY with all its peers connected, at most
    /// `timeout`; a daemon that exits meanwhile ends the wait within 50 ms.
    pub fn wait(&mut self, cluster: &Cluster, timeout: Duration) -> Result<(), HarnessError> {
        let what = "every daemon READY with all its peers connected";
        let start = Instant::now();
        let mut checked = start;
        cluster.check_unexpected_exits(what)?;
        while self.said.contains(&false) {
            // Exits are looked for every CHECK_EXITS, not at every line, as the mesh floor
            // looks at its probes.
            if checked.elapsed() >= CHECK_EXITS {
                cluster.check_unexpected_exits(what)?;
                checked = Instant::now();
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                let missing: Vec<usize> = (0..self.said.len()).filter(|&i| !self.said[i]).collect();
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
                    if let Some(s) = self.said.get_mut(i) {
                        *s = true;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(HarnessError::WaitTimeout {
                        node: 0,
                        what: what.to_owned(),
                        waited: start.elapsed(),
                        last: "the readiness sockets' reader stopped".into(),
                        logs: cluster.logs_tail(ERROR_LOG_TAIL),
                    });
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
        // Short waits until the reader has handed over nodes 0 and 1 (a loaded machine may
        // take a while); every one must time out, and the last must name node 2 alone.
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            match watch.wait(&cluster, Duration::from_millis(100)) {
                Err(HarnessError::WaitTimeout { node, last, .. }) => {
                    if last.ends_with("[2]") {
                        assert_eq!(node, 2, "{last}");
                        break;
                    }
                    assert!(Instant::now() < give_up, "nodes 0 and 1 never seen: {last}");
                }
                other => panic!("expected a timeout naming node 2, got {other:?}"),
            }
        }
        say(&cluster, 2, "STATUS=READY, all 2 peers connected");
        watch
            .wait(&cluster, Duration::from_secs(10))
            .expect("every daemon said it");
    }
}
