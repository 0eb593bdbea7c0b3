//! The service manager's readiness protocol (systemd `sd_notify`, `Type=notify`), implemented
//! here without libsystemd: when `NOTIFY_SOCKET` names a unix datagram socket (a path, or
//! `@name` for an abstract one), the daemon sends it newline-separated `KEY=value` datagrams:
//!
//! - `STATUS=<state>` on every daemon state it goes through (`WAITING_FOR_PEERS`,
//!   `WAITING_FOR_RECOVERY`, …: the words `ctl -q` prints), so `systemctl status` shows why a
//!   daemon is not ready yet;
//! - `READY=1` (with `STATUS=READY`) the first time the state is READY: from that moment on
//!   `ctl -q` answers READY, so a unit ordered `After=` this one starts against a ready daemon;
//! - `STATUS=READY, all N peers connected` when, READY, the daemon holds a session with every
//!   peer (its row of `ctl -N` all connected), and `STATUS=READY, K of N peers connected` when
//!   that stops being so: `systemctl status` shows a daemon that is ready but not yet (or no
//!   longer) in touch with the whole domain, and a launcher can take the first one as the
//!   domain formed from this node's side ([`Peers`]);
//! - `RELOADING=1` with `MONOTONIC_USEC=<CLOCK_MONOTONIC in µs>` when SIGUSR1 starts a re-read
//!   of the nodes file, and `READY=1` once the engine has applied it (or refused it, keeping
//!   its map): see `around_rereads`. Before the first READY, a re-read sends neither, since
//!   the start is not over;
//! - `STOPPING=1` when a stop begins (SIGTERM, SIGINT, SIGQUIT).
//!
//! Without `NOTIFY_SOCKET` every call is a no-op. A failed send is logged once, at warn level,
//! and never stops the daemon: readiness reporting is a courtesy to the manager. The daemon
//! spawns no processes, so the variable is not removed from its environment; a child spawned
//! one day must get `Command::env_remove(ENV)`. An unconfigured daemon that re-executes itself
//! (see `unconfigured`) keeps it on purpose: the new image is the same process, and tells the
//! manager `READY=1` again after the `RELOADING=1` sent before the exec.
//!
//! A forked daemon is not the process the manager started, so `Type=notify` needs the
//! foreground: `openimex daemon` stays in the foreground when `NOTIFY_SOCKET` is set, whatever
//! `DAEMONIZE` says (see `dist/systemd/openimex.service`).

use std::ffi::OsStr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use openimex_core::DaemonState;
use tokio::sync::{mpsc, watch};
use tracing::warn;

use crate::error::DaemonError;
use crate::mailbox::{Input, ask};

/// The variable the service manager sets.
pub const ENV: &str = "NOTIFY_SOCKET";

/// How long one send may wait for room in the manager's queue.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// Where notifications go: the manager's socket, or nowhere.
#[derive(Debug, Default)]
pub struct Notifier {
    inner: Option<Inner>,
}

#[derive(Debug)]
struct Inner {
    socket: UnixDatagram,
    addr: SocketAddr,
    /// `NOTIFY_SOCKET` as given, for the log line.
    shown: String,
    /// `READY=1` was sent: later states and re-reads follow the start.
    ready: AtomicBool,
    /// A send failed and was logged; later failures are not.
    warned: AtomicBool,
}

impl Notifier {
    /// A notifier that sends nothing.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// From `NOTIFY_SOCKET`'s value: `None` (unset) or empty gives a disabled notifier; a value
    /// that is neither an absolute path nor an `@abstract` name, or that cannot be a socket
    /// address, is an error (the caller logs it and goes on without notifications).
    pub fn from_var(value: Option<&OsStr>) -> Result<Self, DaemonError> {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            return Ok(Self::disabled());
        };
        let shown = value.to_string_lossy().into_owned();
        let refuse = |reason: String| DaemonError::NotifySocket {
            value: shown.chars().take(120).collect(),
            reason,
        };
        let addr = parse_addr(value).map_err(refuse)?;
        let socket = UnixDatagram::unbound()
            .map_err(|e| refuse(format!("cannot create a datagram socket: {e}")))?;
        socket
            .set_write_timeout(Some(SEND_TIMEOUT))
            .map_err(|e| refuse(format!("cannot set a send timeout: {e}")))?;
        Ok(Self {
            inner: Some(Inner {
                socket,
                addr,
                shown,
                ready: AtomicBool::new(false),
                warned: AtomicBool::new(false),
            }),
        })
    }

    /// From the process environment (see [`Notifier::from_var`]).
    pub fn from_env() -> Result<Self, DaemonError> {
        Self::from_var(std::env::var_os(ENV).as_deref())
    }

    /// Whether notifications go anywhere.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// READY, the daemon's links to its `peers` changed whether all are connected.
    pub fn peers(&self, peers: Peers) {
        let Peers { connected, total } = peers;
        match connected == total {
            true => self.send(&format!("STATUS=READY, all {total} peers connected")),
            false => self.send(&format!(
                "STATUS=READY, {connected} of {total} peers connected"
            )),
        }
    }

    /// The daemon is in `state`: `STATUS=<state>`, and `READY=1` with it the first time the
    /// state is READY.
    pub fn state(&self, state: DaemonState) {
        let Some(inner) = &self.inner else { return };
        if state == DaemonState::Ready && !inner.ready.swap(true, Ordering::SeqCst) {
            self.send(&format!("READY=1\nSTATUS={state}"));
        } else {
            self.send(&format!("STATUS={state}"));
        }
    }

    /// A re-read of the nodes file begins (after the first READY only).
    pub fn reloading(&self) {
        if self.announced_ready() {
            self.send(&format!(
                "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading the nodes file (SIGUSR1)",
                monotonic_usec()
            ));
        }
    }

    /// The re-reads are over and the daemon is in `state` (after the first READY only).
    pub fn reloaded(&self, state: DaemonState) {
        if self.announced_ready() {
            self.send(&format!("READY=1\nSTATUS={state}"));
        }
    }

    /// The daemon runs unconfigured (placeholder nodes file, see `unconfigured`): the start is
    /// over, so `READY=1`, with a status saying why `ctl -q` answers UNAVAILABLE.
    pub fn unconfigured(&self) {
        self.send(&format!(
            "READY=1\nSTATUS={}: unconfigured, this host is not in the nodes file yet (write it and send SIGUSR1)",
            DaemonState::Unavailable
        ));
    }

    /// The daemon re-executes itself (same PID) to start configured: a reload to the manager.
    /// The new image sends `READY=1` again once it is READY.
    pub fn reexecuting(&self) {
        self.send(&format!(
            "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=re-executing: the nodes file now names this host",
            monotonic_usec()
        ));
    }

    /// A stop begins.
    pub fn stopping(&self) {
        self.send(&format!("STOPPING=1\nSTATUS={}", DaemonState::ShuttingDown));
    }

    fn announced_ready(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| i.ready.load(Ordering::SeqCst))
    }

    /// Sends one datagram; a failure is logged the first time only.
    fn send(&self, message: &str) {
        let Some(inner) = &self.inner else { return };
        if let Err(e) = inner.socket.send_to_addr(message.as_bytes(), &inner.addr)
            && !inner.warned.swap(true, Ordering::SeqCst)
        {
            warn!(
                "cannot notify the service manager at {}={}: {e}; the daemon runs on, but the manager may not see it ready, reloading or stopping (further failures are not logged)",
                ENV, inner.shown
            );
        }
    }
}

/// `/path` or `@abstract`. `vsock:` and other forms of newer managers are not supported.
fn parse_addr(value: &OsStr) -> Result<SocketAddr, String> {
    let bytes = value.as_bytes();
    match bytes.first() {
        Some(b'/') => {
            SocketAddr::from_pathname(value).map_err(|e| format!("not a usable socket path: {e}"))
        }
        Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..])
            .map_err(|e| format!("not a usable abstract socket name: {e}")),
        _ => Err("neither an absolute path nor an @abstract socket name".into()),
    }
}

/// CLOCK_MONOTONIC in microseconds, as `MONOTONIC_USEC` wants it.
fn monotonic_usec() -> u64 {
    let mut ts = nix::libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec owned by this frame; CLOCK_MONOTONIC always
    // exists on Linux, and on the impossible failure `ts` stays zero.
    unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000).saturating_add(nanos / 1_000)
}

/// How many of its peers a daemon holds a session with (the CONNECTED entries of its row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peers {
    /// Connected peers.
    pub connected: usize,
    /// Peers in the node map.
    pub total: usize,
}

/// Sends `STATUS=` for every state the daemon goes through, `READY=1` at the first READY,
/// and, READY, whether every peer is connected each time that changes. Runs until the state's
/// sender is gone.
pub(crate) async fn follow_state(
    notifier: Arc<Notifier>,
    mut state: watch::Receiver<DaemonState>,
    mut peers: watch::Receiver<Peers>,
) {
    let mut shown = None;
    let mut last = None;
    loop {
        let now = *state.borrow_and_update();
        if last != Some(now) {
            notifier.state(now);
            last = Some(now);
            shown = None;
        }
        let p = *peers.borrow_and_update();
        let all = p.connected == p.total;
        if now == DaemonState::Ready && shown != Some(all) {
            // Said once READY is: the first time only when all are connected (a daemon that
            // goes READY before its peers are all there says nothing more until they are).
            if all || shown.is_some() {
                notifier.peers(p);
            }
            shown = Some(all);
        }
        tokio::select! {
            changed = state.changed() => if changed.is_err() { return },
            changed = peers.changed() => if changed.is_err() { return },
        }
    }
}

/// Puts itself between SIGUSR1's requests (`signals`) and the nodes-file task, and between that
/// task and the engine: returns the request channel and the engine sender to give that task.
///
/// A request forwarded to the task is one re-read (a request that finds one pending is folded
/// into it, as before). When the first of a series starts, `RELOADING=1`; when the last one's
/// outcome has been handed to the engine and the engine has answered a snapshot — it handles
/// its mailbox in order, so the re-read is applied (or refused) by then — `READY=1` with the
/// state the snapshot gives.
pub(crate) fn around_rereads(
    notifier: Arc<Notifier>,
    mut signals: mpsc::Receiver<()>,
    engine: mpsc::Sender<Input>,
) -> (mpsc::Receiver<()>, mpsc::Sender<Input>) {
    let (requests_tx, requests_rx) = mpsc::channel(1);
    let (input_tx, mut input_rx) = mpsc::channel::<Input>(1);
    tokio::spawn(async move {
        let mut requests = Some(requests_tx);
        let mut outstanding = 0u32;
        loop {
            tokio::select! {
                request = signals.recv(), if requests.is_some() => {
                    let Some(tx) = &requests else { continue };
                    match request.map(|()| tx.try_send(())) {
                        Some(Ok(())) => {
                            if outstanding == 0 {
                                notifier.reloading();
                            }
                            outstanding += 1;
                        }
                        // A re-read is pending: it reads the file as it will be then.
                        Some(Err(mpsc::error::TrySendError::Full(()))) => {}
                        // The signals are gone (a stop) or so is the task: it ends too.
                        None | Some(Err(mpsc::error::TrySendError::Closed(()))) => {
                            requests = None;
                        }
                    }
                }
                input = input_rx.recv() => {
                    let Some(input) = input else { return };
                    let reread = matches!(&input, Input::NodesFile(r) if !r.initial);
                    if engine.send(input).await.is_err() {
                        return;
                    }
                    if reread {
                        outstanding = outstanding.saturating_sub(1);
                        if outstanding == 0 {
                            match ask(&engine, |reply| Input::Snapshot { reply }).await {
                                Ok(snapshot) => notifier.reloaded(snapshot.state),
                                Err(_) => return,
                            }
                        }
                    }
                }
            }
        }
    });
    (requests_rx, input_tx)
}

#[cfg(test)]
mod tests;
