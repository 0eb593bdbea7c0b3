//! The daemon's listeners, bound before anything else runs (and before DAEMONIZE forks) so a
//! busy port fails start-up with a clear message on the operator's terminal. They are plain std
//! listeners in non-blocking mode; [`crate::run`] hands them to tokio.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use std::net::TcpListener;
use std::os::unix::net::UnixListener;

use crate::error::DaemonError;
use crate::net::MemNet;

/// Everything the daemon listens on.
#[derive(Debug)]
pub struct World {
    /// Peer gRPC listener (`BIND_INTERFACE_IP:SERVER_PORT`).
    pub peer: PeerListener,
    /// The in-process network the daemon dials its peers on ([`World::in_memory`]); `None`:
    /// TCP.
    pub net: Option<MemNet>,
    /// Command service on TCP (`IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT`).
    pub cmd_tcp: Option<TcpListener>,
    /// Command service on a unix socket (`IMEX_CMD_UNIX_DOMAIN_PATH`).
    pub cmd_unix: Option<UnixListener>,
    /// Command service on an in-process network ([`crate::net`]): the in-process test layer.
    pub cmd_memory: Option<crate::net::MemListener>,
    /// `OPENIMEX_METRICS_ADDR`'s listener ([`World::with_metrics`]); `None` serves no metrics.
    pub metrics: Option<TcpListener>,
    /// The process's heap allocations so far, when its binary counts them (the lab binary's
    /// allocator, which the bench reads through `openimex_heap_allocations_total`); `None`,
    /// the production binary's case, reports no such metric.
    pub heap_allocations: Option<fn() -> u64>,
    /// The stats file's counts (`STATS_FILE_NAME`): the daemon adds to them, the file's writer
    /// ([`crate::stats::StatsFile`]) takes a record from them every interval.
    pub stats: crate::stats::Stats,
}

impl World {
    /// Binds every listener. `cmd_ip` `None` with a port means all interfaces, as NVIDIA's.
    pub fn bind(
        peer: SocketAddr,
        cmd_ip: Option<IpAddr>,
        cmd_port: Option<u16>,
        cmd_unix: Option<&Path>,
    ) -> Result<Self, DaemonError> {
        let peer_listener = bind_tcp(
            "peer",
            peer,
            "check SERVER_PORT / BIND_INTERFACE_IP, or stop the daemon that holds it",
        )?;
        let (cmd_tcp, cmd_unix) = Self::bind_commands(cmd_ip, cmd_port, cmd_unix)?;
        Ok(Self {
            peer: PeerListener::Tcp(peer_listener),
            net: None,
            cmd_tcp,
            cmd_unix,
            cmd_memory: None,
            metrics: None,
            heap_allocations: None,
            stats: crate::stats::Stats::default(),
        })
    }

    /// A daemon on the in-process network `net` ([`crate::net`]): its peer service on `peer`,
    /// its command service on `cmd`, and its dials to peers over `net` (the nodes file must
    /// list addresses, not names). For the in-process test layer, which runs whole daemons
    /// together under tokio's paused clock.
    pub fn in_memory(net: &MemNet, peer: SocketAddr, cmd: SocketAddr) -> std::io::Result<Self> {
        Ok(Self {
            peer: PeerListener::Memory(net.bind(peer)?),
            net: Some(net.clone()),
            cmd_tcp: None,
            cmd_unix: None,
            cmd_memory: Some(net.bind(cmd)?),
            metrics: None,
            heap_allocations: None,
            stats: crate::stats::Stats::default(),
        })
    }

    /// Reports `count` as the process's heap allocations in the metrics.
    pub fn with_heap_counter(mut self, count: Option<fn() -> u64>) -> Self {
        self.heap_allocations = count;
        self
    }

    /// Binds the metrics listener (`OPENIMEX_METRICS_ADDR`) too, if an address is given.
    pub fn with_metrics(mut self, addr: Option<SocketAddr>) -> Result<Self, DaemonError> {
        let fix = "check OPENIMEX_METRICS_ADDR: an address of this host and a free port";
        self.metrics = addr.map(|a| bind_tcp("metrics", a, fix)).transpose()?;
        Ok(self)
    }

    /// Binds the command service's listeners only (an unconfigured daemon has no peer
    /// listener: see [`crate::unconfigured`]).
    pub fn bind_commands(
        cmd_ip: Option<IpAddr>,
        cmd_port: Option<u16>,
        cmd_unix: Option<&Path>,
    ) -> Result<(Option<TcpListener>, Option<UnixListener>), DaemonError> {
        let cmd_tcp = cmd_port
            .map(|port| {
                let addr = SocketAddr::new(cmd_ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), port);
                bind_tcp("command service", addr, "check IMEX_CMD_PORT / IMEX_CMD_BIND_INTERFACE_IP, or stop the daemon that holds it")
            })
            .transpose()?;
        let cmd_unix = cmd_unix.map(bind_unix).transpose()?;
        Ok((cmd_tcp, cmd_unix))
    }

    /// How this daemon resolves the nodes file's names: on its in-process network, or the
    /// system's way.
    pub fn resolver(&self) -> crate::net::Resolver {
        match &self.net {
            Some(net) => crate::net::Resolver::Memory(net.clone()),
            None => crate::net::Resolver::System,
        }
    }

    /// The peer listener's address.
    pub fn peer_addr(&self) -> String {
        self.peer
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }
}

/// Where the peer service listens: TCP, or the in-process network of the test layer.
#[derive(Debug)]
pub enum PeerListener {
    /// `BIND_INTERFACE_IP:SERVER_PORT`.
    Tcp(TcpListener),
    /// An address of an in-process network ([`World::in_memory`]).
    Memory(crate::net::MemListener),
}

impl PeerListener {
    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            PeerListener::Tcp(l) => l.local_addr(),
            PeerListener::Memory(l) => Ok(l.local_addr()),
        }
    }
}

fn bind_tcp(
    what: &'static str,
    addr: SocketAddr,
    fix: &'static str,
) -> Result<TcpListener, DaemonError> {
    let err = |source| DaemonError::Bind {
        what,
        addr: addr.to_string(),
        source,
        fix,
    };
    let l = TcpListener::bind(addr).map_err(err)?;
    l.set_nonblocking(true).map_err(err)?;
    Ok(l)
}

/// Mode of the command service's unix socket, whatever the umask: owner and group read and
/// write (connecting to a unix socket needs write permission), others nothing.
///
/// Root-only by default: the daemon runs as root in every deployment we know, so the socket
/// is root:root and only root (and members of group root) can connect. Its clients (the
/// Kubernetes DRA driver's readiness probe `nvidia-imex-ctl -q --u=…`, Slurm prologs, systemd
/// checks) run as root too. 0660 rather than 0600 so a site can grant `ctl` to a monitoring
/// group by giving the socket (or the daemon) that group, without opening it to every local
/// user. Every command (`State`, `Domain`, `Peers`, `Config`) only reads, so this is about
/// what the domain discloses, not who may change it. NVIDIA documents no mode; before this,
/// the mode followed the daemon's umask (0755 under the usual 022, which let only root
/// connect; 0777 under 000).
pub const CMD_SOCKET_MODE: u32 = 0o660;

/// Binds the unix socket, replacing a stale socket file left by a crashed daemon, but never a
/// live one (a connect succeeds) or a file that is not a socket. The socket is created under
/// a umask of 0177 (mode 0600: no moment in which a permissive umask leaves it open), then set
/// to [`CMD_SOCKET_MODE`]. The umask is process-wide: this runs before any thread is started
/// (the daemon binds before DAEMONIZE's fork).
fn bind_unix(path: &Path) -> Result<UnixListener, DaemonError> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(DaemonError::SocketPath {
                path: path.to_path_buf(),
                reason: "it exists and is not a socket".into(),
            });
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(DaemonError::SocketPath {
                path: path.to_path_buf(),
                reason: "another daemon is listening on it".into(),
            });
        }
        let _ = std::fs::remove_file(path);
    }
    let err = |source| DaemonError::Bind {
        what: "command socket",
        addr: path.display().to_string(),
        source,
        fix: "check IMEX_CMD_UNIX_DOMAIN_PATH and that its directory exists and is writable",
    };
    use nix::sys::stat::{Mode, umask};
    use std::os::unix::fs::PermissionsExt;
    let previous = umask(Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    umask(previous);
    let l = bound.map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(CMD_SOCKET_MODE)).map_err(
        |e| DaemonError::SocketPath {
            path: path.to_path_buf(),
            reason: format!("cannot set its mode to {CMD_SOCKET_MODE:04o}: {e}"),
        },
    )?;
    l.set_nonblocking(true).map_err(err)?;
    Ok(l)
}
