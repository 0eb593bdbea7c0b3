//! The one error type of the harness: every variant names the thing that failed, the cause,
//! and (where there is one) what to do about it.
//!
//! `Debug` prints the same text as `Display`, so a test that calls `.expect()` on a harness
//! result shows a readable message (with log tails) instead of an escaped struct dump.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while preparing, driving or observing a cluster.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// A file or directory operation failed.
    #[error("cannot {action} {}: {source}\n  hint: {hint}", path.display())]
    Io {
        /// What was being done, e.g. "write config file".
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
        /// What to check.
        hint: &'static str,
    },
    /// A program could not be started at all.
    #[error("cannot start {}: {source}\n  hint: {hint}", program.display())]
    Spawn {
        /// The executable.
        program: PathBuf,
        /// The OS error.
        source: io::Error,
        /// What to check.
        hint: &'static str,
    },
    /// Certificates for a TLS cluster could not be made or written.
    #[error(transparent)]
    Certs(#[from] openimex_certs::CertsError),
    /// Sending a signal to a node's process failed.
    #[error("cannot send {signal} to node {node} (pid {pid}): {source}")]
    Signal {
        /// Node index.
        node: usize,
        /// Process id.
        pid: u32,
        /// Signal name.
        signal: String,
        /// The errno.
        source: nix::Error,
    },
    /// Setting up or tearing down a network namespace failed (`ip netns ...`).
    #[error(
        "cannot {what}: {detail}\n  hint: network namespaces need root (CAP_SYS_ADMIN, \
         CAP_NET_ADMIN) and the `ip` tool (iproute2)"
    )]
    Netns {
        /// What was being done, e.g. `ip netns add openimex-ll-1`.
        what: String,
        /// Its exit status and error output.
        detail: String,
    },
    /// No loopback address block could be bound on every address and port.
    #[error(
        "no free loopback address block for {nodes} nodes on ports {ports:?} after {attempts} \
         attempts; last failure: {last}\n  hint: check that 127.0.0.0/8 is routed to `lo` \
         and that stray daemons from earlier runs are gone (`ss -ltnp | grep 127.`)"
    )]
    NoAddresses {
        /// How many addresses were wanted.
        nodes: usize,
        /// Ports that had to be free on each address.
        ports: Vec<u16>,
        /// Blocks tried.
        attempts: usize,
        /// The last bind failure.
        last: String,
    },
    /// A node index outside the cluster.
    #[error("node {index} does not exist: the cluster has {len} nodes")]
    NoSuchNode {
        /// The index asked for.
        index: usize,
        /// Number of nodes.
        len: usize,
    },
    /// The operation needs a running daemon and this node has none.
    #[error(
        "node {index} is not running\n  hint: start it with start_node({index}) or restart({index})"
    )]
    NotRunning {
        /// Node index.
        index: usize,
    },
    /// `start_node` on a node whose daemon is still running.
    #[error(
        "node {index} is already running (pid {pid})\n  hint: stop or kill9 it first, or use restart"
    )]
    AlreadyRunning {
        /// Node index.
        index: usize,
        /// Its process id.
        pid: u32,
    },
    /// A daemon the harness believed running has exited on its own.
    #[error("node {index} exited on its own ({status}) while waiting for {what}\n{logs}")]
    NodeExited {
        /// Node index.
        index: usize,
        /// Exit status as text.
        status: String,
        /// What the harness was waiting for.
        what: String,
        /// Tails of every node's logs.
        logs: String,
    },
    /// A command did not finish within its time limit and was killed.
    #[error(
        "`{command}` did not finish within {waited:?} and was killed\n  stdout: {stdout}\n  \
         stderr: {stderr}\n  hint: the daemon may be hung (see its log) or the machine overloaded"
    )]
    CommandTimeout {
        /// The command line.
        command: String,
        /// The time limit.
        waited: Duration,
        /// What it printed on stdout, if it could be collected.
        stdout: String,
        /// What it printed on stderr, if it could be collected.
        stderr: String,
    },
    /// A command exited unsuccessfully where success was needed.
    #[error("`{command}` failed ({status})\n  stdout: {stdout}\n  stderr: {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Exit status as text.
        status: String,
        /// Its stdout.
        stdout: String,
        /// Its stderr.
        stderr: String,
    },
    /// Output of `ctl` (or a sample) did not have the expected shape.
    #[error("cannot parse {what}: {reason}\n  text: {text}")]
    Parse {
        /// What was being parsed, e.g. "ctl -N -j output".
        what: &'static str,
        /// What was wrong with it.
        reason: String,
        /// The text (truncated).
        text: String,
    },
    /// A `wait_*` call ran out of time.
    #[error(
        "timed out after {waited:?} waiting for {what} (asking node {node})\n  last seen: {last}\n{logs}"
    )]
    WaitTimeout {
        /// The node that was asked.
        node: usize,
        /// What was awaited.
        what: String,
        /// The time limit.
        waited: Duration,
        /// The last view, or the last error, as text.
        last: String,
        /// Tails of every node's logs.
        logs: String,
    },
    /// Names mode could not give a daemon its private `/etc/hosts`.
    #[error(
        "cannot start node {index}'s daemon with a private /etc/hosts ({source}): names mode \
         needs root (CAP_SYS_ADMIN) to unshare a mount namespace and bind-mount {} over \
         /etc/hosts\n  hint: run the tests as root (or with CAP_SYS_ADMIN), or use a cluster \
         without with_names()",
        hosts.display()
    )]
    NamesModeNeedsRoot {
        /// Node index.
        index: usize,
        /// The node's hosts file.
        hosts: PathBuf,
        /// The error of unshare or mount.
        source: io::Error,
    },
    /// An operation only meaningful in names mode on a cluster without it.
    #[error("{what} needs names mode\n  hint: build the cluster with ClusterSpec::with_names()")]
    NotNamesMode {
        /// The operation.
        what: &'static str,
    },
    /// Daemons that ignored SIGTERM for the whole grace period and had to be SIGKILLed.
    #[error(
        "nodes {nodes:?} did not exit within {timeout:?} of SIGTERM and were killed\n  hint: the \
         daemon must exit within 5 s of TERM/INT/QUIT; see the end of their logs"
    )]
    Stragglers {
        /// Indexes of the nodes that had to be killed.
        nodes: Vec<usize>,
        /// The grace period.
        timeout: Duration,
    },
}

impl fmt::Debug for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl HarnessError {
    /// Shorthand for [`HarnessError::Io`].
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        hint: &'static str,
    ) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io {
            action,
            path,
            source,
            hint,
        }
    }

    /// Shorthand for [`HarnessError::Parse`], truncating long text.
    pub(crate) fn parse(what: &'static str, reason: impl Into<String>, text: &str) -> Self {
        Self::Parse {
            what,
            reason: reason.into(),
            text: truncate(text, 2000),
        }
    }
}

/// Cuts `text` to at most `max` bytes (on a char boundary), marking the cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} more bytes]", &text[..end], text.len() - end)
}
