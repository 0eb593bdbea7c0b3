//! The driver's socket server: `<node-dir>/dev/nvidiactl` ([`socket_path`]), one std
//! thread per connection (one RM client each) and a shared [`Rm`] behind a mutex. The calls
//! that block in the real driver are parked (module `parked`) and answered by the request that
//! makes them answerable:
//! - `WaitImport` (and an `Import` that waits): until the import is no longer pending, or
//!   `timeout_ms` (→ NotReady);
//! - `Release` of the last reference to a remote import: until FINISH_MEM_UNIMPORT names the
//!   unimport or the session is torn down;
//! - `GetEvents`: until an event is queued, `wait_ms` passes, or the daemon hung up.
//!
//! The waits that stay on a thread (a disconnect's unimports, a multicast object's wait for its
//! team) sleep on one condvar that every such change signals.
//!
//! A connection carries the application library's JSON requests and NVIDIA's RM escapes
//! (`openimex_simproto::escape`), served by [`crate::rmapi`] (module `escapes`): each
//! connection is one open file of `/dev/nvidiactl`, whose RM clients are freed when it closes.
//! At bind the driver lays out its node directory as a driver root (module `node_files`:
//! GPU device files, the fabric-imex-mgmt capability, procfs files).
//!
//! When a connection closes, everything its client owned is released (imports through the
//! unimport handshake, which that connection's thread waits for), and if it held the IMEX
//! session the session is torn down.

mod calls;
mod escapes;
mod multicast;
pub mod node_files;
mod parked;
mod requests;

use calls::error;
use parked::ParkedCalls;
use requests::{Answer, handle};

use std::collections::HashMap;
use std::fs;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openimex_simproto::inband::ToFm;
use openimex_simproto::node_dir::{channel_path, channels_dir, socket_path};
use openimex_simproto::proto::{self, DriverStats, NvStatus, Request, WireError};
use sha2::{Digest, Sha256};

use crate::rm::{ClientId, ProbeStart, Rm, RmConfig};
use crate::rmapi::{RmApi, RmApiConfig};
use openimex_driver::channels::{DEFAULT_CHANNEL_MODE, create_channel_file, warn_open_to_all};

/// The driver version `openimex-lab gpu` reports unless told otherwise (the newest release the
/// RM ABI crate knows).
pub const DEFAULT_DRIVER_VERSION: &str = "595.45.04";

/// Longest a blocked call sleeps before re-checking for shutdown or a hung-up peer.
const SLICE: Duration = Duration::from_millis(100);

/// Everything one node's driver is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverConfig {
    /// The node's directory: the socket and the channel files live here
    /// ([`openimex_simproto::node_dir`]).
    pub node_dir: PathBuf,
    /// The fabric directory shared by every node (HBM files).
    pub fabric_dir: PathBuf,
    /// Physical position in the NVLink domain (names fabric addresses and HBM files).
    pub slot: u16,
    /// GPUs.
    pub gpus: u32,
    /// HBM bytes per GPU.
    pub hbm_bytes: u64,
    /// NVLink domain.
    pub cluster_uuid: [u8; 16],
    /// Clique ID of the GPUs.
    pub clique_id: u32,
    /// Where the GPUs' fabric probes stand at start.
    pub probe: ProbeStart,
    /// Channel files `channel0..channel{N-1}` to create (mode 0600) if missing. Channel files
    /// already in the directory are kept and count as well, if numbered below
    /// `imex_channel_count`.
    pub channels: u32,
    /// `NVreg_ImexChannelCount` (default
    /// [`openimex_simproto::proto::DEFAULT_IMEX_CHANNEL_COUNT`]): the channel numbers
    /// the driver serves; 0 disables IMEX channels (`docs/reference/driver-interface.md` §2).
    pub imex_channel_count: u32,
    /// The driver version it reports (NV_ESC_CHECK_VERSION_STR, the procfs banner) and whose
    /// RM struct layouts it serves (`openimex_rmabi::layout_for`); one the ABI crate does not
    /// know is refused at bind ([`DEFAULT_DRIVER_VERSION`] by default).
    pub driver_version: String,
    /// Where to append one line per escape served (`<escape> <class or control>
    /// params=<size> status=<NV_STATUS>`), if anywhere.
    pub trace: Option<PathBuf>,
}

impl Default for DriverConfig {
    /// A node of 4 GPUs of 1 GiB in `./node` and `./fabric`, as `openimex-lab gpu` defaults.
    fn default() -> Self {
        Self {
            node_dir: PathBuf::from("node"),
            fabric_dir: PathBuf::from("fabric"),
            slot: 0,
            gpus: 4,
            hbm_bytes: 1 << 30,
            cluster_uuid: [0; 16],
            clique_id: 1,
            probe: ProbeStart::default(),
            channels: 1,
            imex_channel_count: proto::DEFAULT_IMEX_CHANNEL_COUNT,
            driver_version: DEFAULT_DRIVER_VERSION.to_owned(),
            trace: None,
        }
    }
}

/// The default clusterUuid: derived from the (absolute) fabric directory, so every node sharing
/// a fabric is in the same NVLink domain.
pub fn default_cluster_uuid(fabric_dir: &Path) -> [u8; 16] {
    let abs = fs::canonicalize(fabric_dir).unwrap_or_else(|_| fabric_dir.to_path_buf());
    let mut h = Sha256::new();
    h.update(b"openimex-cluster");
    h.update(abs.as_os_str().as_encoded_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize()[..16]);
    out
}

/// Errors starting the driver.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A file or directory could not be prepared.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
    /// A live driver already answers on the socket.
    #[error("another simulated GPU driver is already serving {}; stop it first", .0.display())]
    AlreadyRunning(PathBuf),
    /// `--driver-version` names a release whose RM structs the ABI crate does not know.
    #[error("--driver-version: {0}")]
    UnsupportedVersion(openimex_rmabi::AbiError),
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ServerError + 'a {
    move |source| ServerError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Creates the node directory layout and the channel files `channel0..channel{channels-1}`
/// (mode [`DEFAULT_CHANNEL_MODE`], owned by this process's user; existing files are kept as
/// they are), then warns about every channel file in the directory that others may open.
pub fn prepare_node_dir(node_dir: &Path, channels: u32) -> Result<(), ServerError> {
    let dir = channels_dir(node_dir);
    fs::create_dir_all(&dir).map_err(io_err("cannot create", &dir))?;
    for n in 0..channels {
        let path = channel_path(node_dir, n);
        create_channel_file(&path, DEFAULT_CHANNEL_MODE, None, None)
            .map_err(io_err("cannot create channel file", &path))?;
    }
    warn_open_to_all(&dir);
    Ok(())
}

/// State shared by the accept loop and the connection threads.
#[derive(Debug)]
struct Shared {
    /// The RM escape layer (locked before `rm`, never after).
    api: Mutex<RmApi>,
    rm: Mutex<Rm>,
    /// The calls waiting for a change, by client (locked after `rm`).
    parked: Mutex<ParkedCalls>,
    /// Signalled after every request that can change what a blocked call waits for
    /// ([`wakes_waiters`]) and every disconnect: the blocked calls re-check.
    changed: Condvar,
    /// The (canonical) node directory: its channel files are the channels.
    node_dir: PathBuf,
    socket_path: PathBuf,
    stopping: AtomicBool,
    /// A clone of every live connection, to shut them down on stop.
    conns: Mutex<HashMap<ClientId, UnixStream>>,
    /// Connection threads, joined on stop.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Who is behind each connection (SO_PEERCRED, taken once at accept: the kernel fixes a
    /// unix socket's peer credentials when it connects, as it fixes an open file's): the
    /// process to kill when its client is revoked, and the user an escape is judged by.
    peers: Mutex<HashMap<ClientId, Peer>>,
    /// Where the in-band messages the driver queues for the Fabric Manager go (the FM link,
    /// [`ServerHandle::set_fm_outbox`]); with none they are dropped with a warning.
    fm_out: Mutex<FmOut>,
    /// The escape trace file, if one was asked for.
    trace: Option<Mutex<File>>,
}

/// Sends one in-band message to the Fabric Manager (the FM link's sender).
pub type FmOutbox = Box<dyn Fn(ToFm) + Send + Sync>;

/// The FM link's sender, if any.
struct FmOut(Option<FmOutbox>);

/// The process at the other end of a connection, as SO_PEERCRED gave it at accept.
#[derive(Clone, Copy, Debug)]
struct Peer {
    pid: i32,
    uid: u32,
}

impl std::fmt::Debug for FmOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "FmOut(linked)"
        } else {
            "FmOut(none)"
        })
    }
}

impl Shared {
    fn rm(&self) -> MutexGuard<'_, Rm> {
        self.rm.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Hands what the driver queued for the Fabric Manager (multicast team set-up, failure
    /// and release, §1.6 "Multicast" 5) to the FM link. Called after every request, every
    /// disconnect and every change the link itself applies, so a message leaves as soon as the
    /// driver queued it.
    /// After every request, every disconnect and every change the FM link applies: signal
    /// the IMEX session's OS event if events were queued (from whichever thread queued them),
    /// and hand the Fabric Manager what the driver queued for it.
    fn after_change(&self) {
        self.post_os_event();
        self.flush_fm();
    }

    fn flush_fm(&self) {
        let msgs = self.rm().take_fm_messages();
        if msgs.is_empty() {
            return;
        }
        let out = self.fm_out.lock().unwrap_or_else(PoisonError::into_inner);
        match out.0.as_ref() {
            Some(send) => msgs.into_iter().for_each(send),
            None => tracing::warn!(
                dropped = msgs.len(),
                "in-band messages for the Fabric Manager dropped: no Fabric Manager link"
            ),
        }
    }

    /// Kills the processes of clients the driver disabled (DISABLE_IMPORTERS or session
    /// teardown). On a real node their GPU channels are RC'd and the job dies; a simulated
    /// importer maps the exporter's HBM file directly, so killing the process is the only way
    /// to make sure it never touches memory that may be freed and reused.
    fn kill_revoked(&self, revoked: Vec<ClientId>) {
        if revoked.is_empty() {
            return;
        }
        let peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        for client in revoked {
            let Some(Peer { pid, .. }) = peers.get(&client).copied() else {
                continue;
            };
            if pid == me || pid <= 1 {
                continue;
            }
            tracing::warn!(
                client,
                pid,
                "importer revoked: killing its process (its GPU channels are RC'd)"
            );
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// Whether `client`'s connection is closed at the other end: its process closed it or
    /// died (see [`calls::hung_up`]).
    fn hung_up(&self, client: ClientId) -> bool {
        let conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        conns.get(&client).is_some_and(calls::hung_up)
    }

    /// Sleeps on the condvar for at most one slice (and not past `deadline`).
    fn wait<'a>(&self, guard: MutexGuard<'a, Rm>, deadline: Option<Instant>) -> MutexGuard<'a, Rm> {
        let slice = deadline.map_or(SLICE, |d| {
            d.saturating_duration_since(Instant::now()).min(SLICE)
        });
        self.changed
            .wait_timeout(guard, slice)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }
}

/// Connections (RM clients) served at once by default: each is a thread, as each real client
/// is a process holding `/dev/nvidiactl` open. More are closed at once, with a log line.
pub const DEFAULT_MAX_CLIENTS: usize = 1024;

/// A bound, not yet serving, driver.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    listener: UnixListener,
    max_clients: usize,
}

impl Server {
    /// Prepares the node and fabric directories, creates the HBM files and binds the socket
    /// (replacing a stale socket file; refusing if a live driver answers on it).
    pub fn bind(config: &DriverConfig) -> Result<Self, ServerError> {
        let layout = openimex_rmabi::layout_for(&config.driver_version)
            .map_err(ServerError::UnsupportedVersion)?;
        prepare_node_dir(&config.node_dir, config.channels)?;
        fs::create_dir_all(&config.fabric_dir)
            .map_err(io_err("cannot create", &config.fabric_dir))?;
        let node_dir = fs::canonicalize(&config.node_dir)
            .map_err(io_err("cannot resolve", &config.node_dir))?;
        let fabric_dir = fs::canonicalize(&config.fabric_dir)
            .map_err(io_err("cannot resolve", &config.fabric_dir))?;
        let sock = socket_path(&node_dir);
        if UnixStream::connect(&sock).is_ok() {
            return Err(ServerError::AlreadyRunning(sock));
        }
        let rm = Rm::new(RmConfig {
            slot: config.slot,
            gpus: config.gpus,
            hbm_bytes: config.hbm_bytes,
            fabric_dir: fabric_dir.clone(),
            cluster_uuid: config.cluster_uuid,
            clique_id: config.clique_id,
            probe: config.probe,
            imex_channel_count: config.imex_channel_count,
        })
        .map_err(io_err("cannot create the HBM files in", &fabric_dir))?;
        match fs::remove_file(&sock) {
            Ok(()) => tracing::info!(socket = %sock.display(), "removed a stale driver socket"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("cannot remove stale socket", &sock)(e)),
        }
        let cap_path = node_files::create(&node_dir, config.gpus, &config.driver_version)
            .map_err(io_err("cannot create the driver's files in", &node_dir))?;
        let trace = match &config.trace {
            Some(path) => Some(Mutex::new(
                fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(io_err("cannot open the escape trace", path))?,
            )),
            None => None,
        };
        let listener = UnixListener::bind(&sock).map_err(io_err("cannot listen on", &sock))?;
        // World-connectable, as /dev/nvidiactl is: the channel files are the access policy.
        fs::set_permissions(&sock, fs::Permissions::from_mode(0o666))
            .map_err(io_err("cannot set mode 0666 on", &sock))?;
        let shared = Arc::new(Shared {
            api: Mutex::new(RmApi::new(RmApiConfig {
                version: config.driver_version.clone(),
                layout,
                cap_path,
            })),
            rm: Mutex::new(rm),
            parked: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            node_dir,
            socket_path: sock,
            stopping: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            peers: Mutex::new(HashMap::new()),
            fm_out: Mutex::new(FmOut(None)),
            trace,
        });
        Ok(Self {
            shared,
            listener,
            max_clients: DEFAULT_MAX_CLIENTS,
        })
    }

    /// Serves at most `n` connections at once ([`DEFAULT_MAX_CLIENTS`] unless set).
    pub fn max_clients(mut self, n: usize) -> Self {
        self.max_clients = n.max(1);
        self
    }

    /// The socket clients connect to.
    pub fn socket_path(&self) -> &Path {
        &self.shared.socket_path
    }

    /// Serves on a background thread until [`ServerHandle::stop`].
    pub fn spawn(self) -> io::Result<ServerHandle> {
        let shared = Arc::clone(&self.shared);
        let listener = self.listener.try_clone()?;
        let accept = std::thread::Builder::new()
            .name("simgpu-accept".into())
            .spawn(move || accept_loop(&self.shared, &self.listener, self.max_clients))?;
        Ok(ServerHandle {
            shared,
            listener,
            accept: Some(accept),
        })
    }
}

/// The driver's state for a companion thread of the same process (the Fabric Manager link,
/// module `fm_link`, which depends on this one and not the other way round): what it changes,
/// blocked calls re-check.
#[derive(Debug, Clone)]
pub struct RmAccess(Arc<Shared>);

impl RmAccess {
    /// Runs `f` under the driver's lock, then answers or wakes every call it unblocked.
    pub fn with<R>(&self, f: impl FnOnce(&mut Rm) -> R) -> R {
        let r = f(&mut self.0.rm());
        self.0.after_change();
        self.0.answer_parked();
        self.0.changed.notify_all();
        r
    }
}

/// A serving driver.
#[derive(Debug)]
pub struct ServerHandle {
    shared: Arc<Shared>,
    listener: UnixListener,
    accept: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// The socket clients connect to.
    pub fn socket_path(&self) -> &Path {
        &self.shared.socket_path
    }

    /// The driver's state, for the Fabric Manager link.
    pub fn rm_access(&self) -> RmAccess {
        RmAccess(Arc::clone(&self.shared))
    }

    /// Sends what the driver queues for the Fabric Manager through `out` from now on.
    pub fn set_fm_outbox(&self, out: FmOutbox) {
        *self
            .shared
            .fm_out
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = FmOut(Some(out));
    }

    /// The driver's counters.
    pub fn stats(&self) -> DriverStats {
        self.shared.rm().stats()
    }

    /// Stops accepting, closes every connection (releasing what their clients owned), waits for
    /// the connection threads and removes the socket file. The HBM files stay.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the blocked accept(): shutting a listening socket down makes it fail on Linux;
        // a connection attempt is the fallback.
        let _ =
            nix::sys::socket::shutdown(self.listener.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        let _ = UnixStream::connect(&self.shared.socket_path);
        let _ = accept.join();
        for s in self
            .shared
            .conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.shared.changed.notify_all();
        let threads = std::mem::take(
            &mut *self
                .shared
                .threads
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for t in threads {
            let _ = t.join();
        }
        let _ = fs::remove_file(&self.shared.socket_path);
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &UnixListener, max_clients: usize) {
    let mut refused: u64 = 0;
    loop {
        let accepted = listener.accept();
        if shared.stopping() {
            return;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("driver socket accept failed: {e}");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let live = shared
            .conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        if live >= max_clients {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    "{live} clients connected (the limit): closed a new connection ({refused} so far)"
                );
            }
            drop(stream);
            continue;
        }
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        let client = shared.rm().connect();
        if let Ok(cred) =
            nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        {
            shared
                .peers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(
                    client,
                    Peer {
                        pid: cred.pid(),
                        uid: cred.uid(),
                    },
                );
        }
        shared
            .conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(client, clone);
        let sh = Arc::clone(shared);
        let stream = Arc::new(stream);
        let spawned = std::thread::Builder::new()
            .name(format!("simgpu-client-{client}"))
            .spawn(move || serve(&sh, &stream, client));
        let mut threads = shared
            .threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        threads.retain(|t| !t.is_finished());
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                tracing::error!("cannot start a connection thread: {e}");
                drop(threads);
                disconnect(shared, client);
            }
        }
    }
}

/// One connection: one request (a JSON request or an RM escape), one response, until it
/// closes.
fn serve(shared: &Shared, stream: &Arc<UnixStream>, client: ClientId) {
    let held = escapes::HeldFiles::default();
    loop {
        // The driver sets no read timeout on its connections: a client may wait as long as it
        // likes between two calls.
        let (req, fds) = match recv(stream) {
            Ok(Frame::Json(req, fds)) => {
                // Its answer ends any batch of escapes (`escapes::HeldFiles`).
                held.next_call();
                (req, fds)
            }
            Ok(Frame::Escape(call)) => {
                held.next_call();
                if escapes::serve(shared, client, stream, &call, &held) {
                    continue;
                }
                break;
            }
            Err(WireError::Json(e)) => {
                // The frame was read whole, so the stream is still in step: answer and go on.
                let resp = error(NvStatus::InvalidArgument, format!("malformed request: {e}"));
                if proto::send(stream, &resp, &[]).is_err() {
                    break;
                }
                continue;
            }
            Err(WireError::Escape(e)) => {
                // An escape frame that does not decode has no escape number to answer with:
                // the transport is broken, as an ioctl with a bad pointer would fault.
                tracing::warn!(
                    client,
                    "malformed escape frame: {e}; closing the connection"
                );
                break;
            }
            Err(_) => break,
        };
        let wakes = wakes_waiters(&req);
        let answer = handle(shared, client, stream, req, &fds);
        drop(fds);
        shared.after_change();
        if wakes {
            let revoked = shared.rm().take_revoked();
            shared.kill_revoked(revoked);
            shared.answer_parked();
            shared.changed.notify_all();
        }
        let sent = match answer {
            Answer::Now(resp) => proto::send(stream, &resp, &[]).is_ok(),
            Answer::Parked => parked::watch(shared, client, stream) == parked::Then::Serve,
        };
        if !sent {
            break;
        }
    }
    disconnect(shared, client);
}

/// One frame of a connection, with the descriptors that came with it.
enum Frame {
    /// A JSON request of the application library (or the protocol's daemon requests).
    Json(Request, Vec<std::os::fd::OwnedFd>),
    /// An RM escape.
    Escape(openimex_simproto::escape::EscapeCall),
}

/// Reads one frame of either kind, waiting as long as it takes (`proto::recv_incoming`,
/// keeping a JSON request's descriptors: SubscribeChannel passes the channel's).
fn recv(stream: &UnixStream) -> Result<Frame, WireError> {
    use openimex_simproto::escape::{Body, classify, decode_call};
    let mut body = Vec::new();
    let fds = proto::recv_body(stream, &mut body)?;
    match classify(&body) {
        Body::Escape(b) => Ok(Frame::Escape(
            decode_call(b, fds).map_err(WireError::Escape)?,
        )),
        Body::Json(b) => Ok(Frame::Json(serde_json::from_slice(b)?, fds)),
    }
}

/// Whether `req` can change what a blocked call waits for (an import's state, a pending
/// unimport, the daemon's event queue, a revocation). The others only read, or take what no one
/// waits for: waking every blocked call after each of them (the import waits of every
/// application on the node, the daemon's event poll) cost a context switch per waiter per
/// request, for nothing.
///
/// `Hello` does wake them: it starts every new connection, and a restarted daemon's makes a
/// blocked event poll of its dead predecessor notice the hang-up (and tear the session down)
/// now, not a wait slice later (the new daemon's OpenSession waits for that teardown:
/// [`requests`]).
fn wakes_waiters(req: &Request) -> bool {
    !matches!(
        req,
        Request::Stats
            | Request::SubscribeChannel
            | Request::Create { .. }
            | Request::Export { .. }
            | Request::WaitImport { .. }
            | Request::GetEvents { .. }
            | Request::DescribeExport { .. }
            | Request::FabricProbeInfo { .. }
            | Request::MapOnGpu { .. }
    )
}

/// The client is gone: release what it owned and wait for its unimports, as the exiting
/// thread of a real process does.
fn disconnect(shared: &Shared, client: ClientId) {
    let mut api = shared.api();
    let mut rm = shared.rm();
    shared.parked().remove(&client);
    // The file closes: the RM clients allocated on it go first, then the protocol's client.
    let mut unimports = api.close_file(&mut rm, client);
    unimports.extend(rm.disconnect(client));
    // Killed before the driver's lock is let go: once it is, another connection's thread may
    // answer a revoked client's call with the torn-down state (a multicast bind waiting for
    // its team gets NV_ERR_RESET_REQUIRED), and the client could exit on that error before
    // the kill lands. A real client's channels are RC'd in the teardown itself.
    shared.kill_revoked(rm.take_revoked());
    drop(rm);
    drop(api);
    shared.after_change();
    shared.answer_parked();
    let mut rm = shared.rm();
    shared.changed.notify_all();
    while !shared.stopping() && unimports.iter().any(|&id| rm.unimport_pending(id)) {
        rm = shared.wait(rm, None);
    }
    drop(rm);
    shared
        .conns
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&client);
    shared
        .peers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&client);
}
