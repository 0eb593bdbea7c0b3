//! `openimex-lab fabric serve`: the Fabric Manager process of one NVLink domain.
//!
//! Two unix sockets, both mode 0600 and both checked with SO_PEERCRED (root or the FM's user):
//! the in-band socket in the fabric directory
//! ([`openimex_simproto::inband::fm_socket_path`]) where every tray's driver keeps one
//! connection, and the operator's control socket ([`crate::control`]). One std thread per
//! connection; the [`Manager`] and the attached drivers' streams sit behind one mutex, so an
//! operator command's probe updates go out in the order the commands were applied.
//!
//! A stale socket file (a killed FM) is replaced; a live FM on the same directory makes the
//! second one fail. [`run`] prints `ready <in-band socket>` once both listen and stops on
//! SIGTERM, SIGINT or SIGQUIT, removing both socket files.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};
use openimex_simproto::inband::{FromFm, ToFm, fm_socket_path};
use openimex_simproto::proto::{recv, send};

use crate::FabricError;
use crate::control::{self, Request, Response, may_operate};
use crate::manager::{Manager, Outbox};
use crate::partition::Layout;
use crate::topology::Topology;

/// A driver that does not read its messages for this long is dropped (its tray detaches).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the FM is started with.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The domain's hardware.
    pub topology: Topology,
    /// The domain's name (its clusterUuid derives from it).
    pub domain: String,
    /// The partition layout at start.
    pub layout: Layout,
    /// The fabric directory every tray's driver shares.
    pub fabric_dir: PathBuf,
    /// The control socket ([`control::control_path`] of the fabric directory if `None`).
    pub control: Option<PathBuf>,
}

/// The manager and the attached drivers' streams.
#[derive(Debug)]
struct State {
    manager: Manager,
    drivers: HashMap<u16, UnixStream>,
}

impl State {
    /// Sends each message to its tray's driver; a driver that cannot take it is dropped (its
    /// connection thread then detaches the tray).
    fn deliver(&mut self, out: Outbox) {
        for (slot, msg) in out {
            let Some(s) = self.drivers.get(&slot) else {
                continue;
            };
            if let Err(e) = send(s, &msg, &[]) {
                tracing::warn!(slot, "cannot send to the tray's driver, dropping it: {e}");
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    stopping: AtomicBool,
    /// A clone of every live connection by number, to shut them down on stop; each
    /// connection's thread removes its own when it ends.
    conns: Mutex<HashMap<u64, UnixStream>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A bound, not yet serving, FM.
#[derive(Debug)]
pub struct Fm {
    shared: Arc<Shared>,
    inband: (UnixListener, PathBuf),
    control: (UnixListener, PathBuf),
}

/// Binds `path` mode 0600, replacing a stale socket file and refusing a live one.
fn listen(path: &Path) -> Result<UnixListener, FabricError> {
    if UnixStream::connect(path).is_ok() {
        return Err(FabricError::AlreadyRunning(path.to_path_buf()));
    }
    let serve = |action, fix| {
        move |source| FabricError::Serve {
            action,
            path: path.to_path_buf(),
            source,
            fix,
        }
    };
    match fs::remove_file(path) {
        Ok(()) => tracing::info!(socket = %path.display(), "removed a stale socket"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(serve("remove the stale socket", "remove it by hand")(e)),
    }
    let l = UnixListener::bind(path).map_err(serve(
        "listen on",
        "check that the directory exists and is writable",
    ))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(serve(
        "set mode 0600 on",
        "check the directory's file system",
    ))?;
    Ok(l)
}

impl Fm {
    /// Creates the fabric directory if missing and binds both sockets.
    pub fn bind(config: ServeConfig) -> Result<Self, FabricError> {
        fs::create_dir_all(&config.fabric_dir).map_err(|source| FabricError::Serve {
            action: "create the fabric directory",
            path: config.fabric_dir.clone(),
            source,
            fix: "pass a writable --fabric-dir",
        })?;
        let inband_path = fm_socket_path(&config.fabric_dir);
        let control_path = config
            .control
            .clone()
            .unwrap_or_else(|| control::control_path(&config.fabric_dir));
        let inband = listen(&inband_path)?;
        let control = match listen(&control_path) {
            Ok(l) => l,
            Err(e) => {
                let _ = fs::remove_file(&inband_path);
                return Err(e);
            }
        };
        let manager = Manager::new(config.topology, &config.domain, config.layout);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                manager,
                drivers: HashMap::new(),
            }),
            stopping: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
        });
        Ok(Self {
            shared,
            inband: (inband, inband_path),
            control: (control, control_path),
        })
    }

    /// The in-band socket drivers connect to.
    pub fn inband_path(&self) -> &Path {
        &self.inband.1
    }

    /// Serves on background threads until [`FmHandle::stop`].
    pub fn spawn(self) -> io::Result<FmHandle> {
        let mut accepts = Vec::new();
        let mut listeners = Vec::new();
        for ((l, path), driver) in [(self.inband, true), (self.control, false)] {
            let sh = Arc::clone(&self.shared);
            let clone = l.try_clone()?;
            accepts.push(
                std::thread::Builder::new()
                    .name(if driver { "fm-inband" } else { "fm-control" }.into())
                    .spawn(move || accept_loop(&sh, &clone, driver))?,
            );
            listeners.push((l, path));
        }
        Ok(FmHandle {
            shared: self.shared,
            listeners,
            accepts,
        })
    }
}

/// A serving FM.
#[derive(Debug)]
pub struct FmHandle {
    shared: Arc<Shared>,
    listeners: Vec<(UnixListener, PathBuf)>,
    accepts: Vec<JoinHandle<()>>,
}

impl FmHandle {
    /// Stops accepting, closes every connection and removes both socket files.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.accepts.is_empty() {
            return;
        }
        self.shared.stopping.store(true, Ordering::SeqCst);
        for (l, path) in &self.listeners {
            // Shutting a listening socket down wakes its accept() on Linux; a connection
            // attempt is the fallback.
            let _ = nix::sys::socket::shutdown(l.as_raw_fd(), nix::sys::socket::Shutdown::Both);
            let _ = UnixStream::connect(path);
        }
        for t in self.accepts.drain(..) {
            let _ = t.join();
        }
        for s in self
            .shared
            .conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for (_, path) in &self.listeners {
            let _ = fs::remove_file(path);
        }
    }
}

impl Drop for FmHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &UnixListener, driver: bool) {
    let mut next: u64 = 0;
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        // Numbers are per listener; the top bit tells the two listeners' apart.
        next += 1;
        let id = next | if driver { 1 << 63 } else { 0 };
        if let Ok(c) = stream.try_clone() {
            shared
                .conns
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(id, c);
        }
        let sh = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(if driver { "fm-driver" } else { "fm-operator" }.into())
            .spawn(move || {
                if driver {
                    serve_driver(&sh, &stream);
                } else {
                    serve_operator(&sh, &stream);
                }
                sh.conns
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&id);
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start a connection thread: {e}");
            shared
                .conns
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
        }
    }
}

/// Sends `refusal` and says so when the peer is neither root nor the FM's user.
fn refuse_stranger<T: serde::Serialize>(stream: &UnixStream, socket: &str, refusal: &T) -> bool {
    if may_operate(stream) {
        return false;
    }
    tracing::warn!("refused a {socket} connection from a user that is neither root nor ours");
    let _ = send(stream, refusal, &[]);
    true
}

/// One tray's driver: its attach, then its multicast requests until it hangs up.
fn serve_driver(shared: &Shared, stream: &UnixStream) {
    let refused = FromFm::Refused {
        reason: "only root or the Fabric Manager's user may attach a tray".into(),
    };
    if refuse_stranger(stream, "in-band", &refused) {
        return;
    }
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let slot = match recv::<ToFm>(stream) {
        Ok((ToFm::Attach { slot, gpus }, _)) => {
            let mut st = shared.state();
            match st.manager.attach(slot, gpus) {
                Ok(out) => {
                    let Ok(clone) = stream.try_clone() else {
                        st.manager.detach(slot);
                        return;
                    };
                    st.drivers.insert(slot, clone);
                    tracing::info!(slot, gpus, "tray attached; probe answers sent");
                    st.deliver(out);
                    slot
                }
                Err(reason) => {
                    tracing::warn!(slot, gpus, "attach refused: {reason}");
                    let _ = send(stream, &FromFm::Refused { reason }, &[]);
                    return;
                }
            }
        }
        Ok((other, _)) => {
            let reason = format!("the first message must be Attach, not {other:?}");
            let _ = send(stream, &FromFm::Refused { reason }, &[]);
            return;
        }
        Err(e) => {
            tracing::debug!("in-band connection closed before attaching: {e}");
            return;
        }
    };
    loop {
        let msg = match recv::<ToFm>(stream) {
            Ok((m, _)) => m,
            Err(e) => {
                tracing::info!(slot, "tray detached: {e}");
                break;
            }
        };
        let mut st = shared.state();
        match msg {
            ToFm::McTeamSetup {
                team_key,
                size,
                members,
            } => {
                let out = st.manager.mc_team_setup(slot, &team_key, size, &members);
                tracing::info!(
                    slot,
                    team_key,
                    size,
                    members = members.len(),
                    "multicast team request"
                );
                st.deliver(out);
            }
            ToFm::McTeamRelease { team_handle } => {
                if !st.manager.mc_team_release(slot, team_handle) {
                    tracing::warn!(slot, team_handle, "release of an unknown multicast team");
                }
            }
            ToFm::McTeamFailed {
                team_key,
                members,
                reason,
            } => {
                tracing::info!(slot, team_key, reason, "multicast team failed at its prime");
                let out = st
                    .manager
                    .mc_team_failed(slot, &team_key, &members, &reason);
                st.deliver(out);
            }
            ToFm::Attach { .. } => tracing::warn!(slot, "a second Attach ignored"),
        }
    }
    let mut st = shared.state();
    st.drivers.remove(&slot);
    st.manager.detach(slot);
}

/// One operator connection: requests until it hangs up.
fn serve_operator(shared: &Shared, stream: &UnixStream) {
    let refused = Response::Refused {
        reason: "operating the fabric needs root or the Fabric Manager's user".into(),
    };
    if refuse_stranger(stream, "control", &refused) {
        return;
    }
    while let Ok((req, _)) = recv::<Request>(stream) {
        let answer = {
            let mut st = shared.state();
            let (answer, out) = control::handle(&mut st.manager, &req);
            if let (Request::Apply(cmd), Response::Changed { changes }) = (&req, &answer) {
                tracing::info!(
                    ?cmd,
                    gpus_changed = changes.len(),
                    "operator command applied"
                );
            }
            st.deliver(out);
            answer
        };
        if send(stream, &answer, &[]).is_err() {
            return;
        }
    }
}

/// Runs the FM in the foreground until SIGTERM, SIGINT or SIGQUIT (`openimex-lab fabric serve`):
/// logs to stderr, `ready <in-band socket>` on stdout once both sockets listen.
pub fn run(config: ServeConfig) -> Result<(), FabricError> {
    let _ = tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_ansi(false)
        .with_target(false)
        .try_init();
    // Blocked before any thread starts, so that every thread inherits the mask and only the
    // wait below takes them.
    let mut stop = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGQUIT] {
        stop.add(s);
    }
    stop.thread_block().map_err(|e| FabricError::Runtime {
        what: "block the stop signals",
        source: e.into(),
    })?;
    let domain = config.domain.clone();
    let fm = Fm::bind(config)?;
    let sock = fm.inband_path().to_path_buf();
    let handle = fm.spawn().map_err(|source| FabricError::Runtime {
        what: "start the server threads",
        source,
    })?;
    tracing::info!(domain, socket = %sock.display(), "Fabric Manager listening");
    let mut out = io::stdout().lock();
    if writeln!(out, "ready {}", sock.display())
        .and_then(|()| out.flush())
        .is_err()
    {
        tracing::warn!("could not write the ready line to stdout");
    }
    drop(out);
    match stop.wait() {
        Ok(sig) => tracing::info!("{} received, stopping", sig.as_str()),
        Err(e) => tracing::error!("waiting for a stop signal failed: {e}; stopping"),
    }
    handle.stop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use openimex_simproto::inband::FabricGpu;

    use super::*;
    use crate::manager::Command;
    use crate::partition::default_layout;
    use crate::topology::preset;

    fn config(dir: &Path) -> ServeConfig {
        let topology = preset("nvl36").expect("preset");
        ServeConfig {
            layout: default_layout(&topology),
            topology,
            domain: "unit".into(),
            fabric_dir: dir.to_path_buf(),
            control: None,
        }
    }

    fn scratch(label: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("openimex-fm-{label}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("dir");
        d
    }

    fn attach(dir: &Path, slot: u16) -> UnixStream {
        let s = UnixStream::connect(fm_socket_path(dir)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        send(&s, &ToFm::Attach { slot, gpus: 4 }, &[]).expect("attach");
        s
    }

    /// A driver's attach gets one answer per GPU; an operator's command reaches it as an
    /// update; a multicast request is answered on the same connection; a refused attach gets
    /// its reason.
    #[test]
    fn drivers_and_operators_over_the_sockets() {
        let dir = scratch("serve");
        let fm = Fm::bind(config(&dir))
            .expect("bind")
            .spawn()
            .expect("spawn");
        let d = attach(&dir, 1);
        for gpu in 0..4 {
            let (m, _) = recv::<FromFm>(&d).expect("probe");
            assert!(
                matches!(m, FromFm::Probe { gpu: g, ref info } if g == gpu && info.clique_id == 1)
            );
        }
        let ctl = control::control_path(&dir);
        let r = control::request(
            &ctl,
            &Request::Apply(Command::Create {
                trays: vec!["1".into()],
            }),
        )
        .expect("request");
        assert!(matches!(r, Response::Changed { ref changes } if changes.len() == 4));
        for _ in 0..4 {
            let (m, _) = recv::<FromFm>(&d).expect("update");
            assert!(matches!(m, FromFm::Probe { ref info, .. } if info.clique_id == 2));
        }
        let setup = ToFm::McTeamSetup {
            team_key: "k".into(),
            size: 1,
            members: vec![FabricGpu { slot: 1, gpu: 0 }],
        };
        send(&d, &setup, &[]).expect("send");
        let (m, _) = recv::<FromFm>(&d).expect("team");
        assert!(matches!(m, FromFm::McTeam { result: Ok(_), .. }));
        let bad = attach(&dir, 40);
        let (m, _) = recv::<FromFm>(&bad).expect("refusal");
        assert!(matches!(m, FromFm::Refused { ref reason } if reason.contains("slot 40")));
        fm.stop();
        assert!(!fm_socket_path(&dir).exists() && !ctl.exists());
        let _ = fs::remove_dir_all(&dir);
    }

    /// One FM per fabric directory; a killed FM's socket files are replaced.
    #[test]
    fn a_live_fm_is_refused_and_a_stale_socket_replaced() {
        let dir = scratch("twice");
        let fm = Fm::bind(config(&dir))
            .expect("bind")
            .spawn()
            .expect("spawn");
        let e = Fm::bind(config(&dir)).expect_err("second FM");
        assert!(matches!(e, FabricError::AlreadyRunning(_)), "{e}");
        assert!(e.to_string().contains("already serving"), "{e}");
        fm.stop();
        // What a killed FM leaves: socket files nobody listens on.
        drop(UnixListener::bind(fm_socket_path(&dir)).expect("stale"));
        drop(UnixListener::bind(control::control_path(&dir)).expect("stale"));
        let fm = Fm::bind(config(&dir))
            .expect("over stale sockets")
            .spawn()
            .expect("spawn");
        let mode = fs::metadata(control::control_path(&dir))
            .expect("ctl")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        fm.stop();
        let _ = fs::remove_dir_all(&dir);
    }
}
