//! The daemon's listeners, bound before anything else runs (and before DAEMONIZE forks) so a
//! busy port fails start-up with a clear message on the operator's terminal. They are plain std
//! listeners in non-blocking mode; [`crate::run`] hands them to tokio.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use std::net::TcpListener;
use std::os::unix::net::UnixListener;

use crate::error::DaemonError;

/// Everything the daemon listens on.
#[derive(Debug)]
pub struct World {
    /// Peer gRPC listener (`BIND_INTERFACE_IP:SERVER_PORT`).
    pub peer: TcpListener,
    /// Command service on TCP (`IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT`).
    pub cmd_tcp: Option<TcpListener>,
    /// Command service on a unix socket (`IMEX_CMD_UNIX_DOMAIN_PATH`).
    pub cmd_unix: Option<UnixListener>,
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
        let cmd_tcp = cmd_port
            .map(|port| {
                let addr = SocketAddr::new(cmd_ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), port);
                bind_tcp("command service", addr, "check IMEX_CMD_PORT / IMEX_CMD_BIND_INTERFACE_IP, or stop the daemon that holds it")
            })
            .transpose()?;
        let cmd_unix = cmd_unix.map(bind_unix).transpose()?;
        Ok(Self {
            peer: peer_listener,
            cmd_tcp,
            cmd_unix,
        })
    }

    /// The peer listener's address.
    pub fn peer_addr(&self) -> String {
        self.peer
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
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

/// Binds the unix socket, replacing a stale socket file left by a crashed daemon, but never a
/// live one (a connect succeeds) or a file that is not a socket.
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
    let l = UnixListener::bind(path).map_err(err)?;
    l.set_nonblocking(true).map_err(err)?;
    Ok(l)
}
