//! The daemon's error type.

use std::io;
use std::path::PathBuf;

/// Why the daemon could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A listener could not be bound.
    #[error("cannot listen on {what} {addr}: {source}; {fix}")]
    Bind {
        /// Which listener (peer, command).
        what: &'static str,
        /// Address or path.
        addr: String,
        /// OS error.
        source: io::Error,
        /// What to do.
        fix: &'static str,
    },
    /// The unix socket path is taken by something that is not a stale socket.
    #[error(
        "cannot use {path} as the command socket: {reason}; remove it or change IMEX_CMD_UNIX_DOMAIN_PATH"
    )]
    SocketPath {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The GPU driver refused the session.
    #[error(transparent)]
    Driver(#[from] openimex_driver::DriverError),
    /// A server task failed.
    #[error("{what} server failed: {source}")]
    Serve {
        /// Which server.
        what: &'static str,
        /// The transport error.
        source: tonic::transport::Error,
    },
    /// The GPU driver went away (its session is gone; a new daemon start opens a new one).
    #[error("lost the GPU driver during {call}: {why}; restart the daemon once the driver is back")]
    DriverLost {
        /// The driver call that found it gone.
        call: &'static str,
        /// What the driver connection reported.
        why: String,
    },
    /// The threads that make driver calls could not start.
    #[error(
        "cannot start the GPU driver threads: {0}; check the limits on threads and memory (ulimit -u, ulimit -v)"
    )]
    DriverThread(io::Error),
    /// `NOTIFY_SOCKET` is set but names no socket this daemon can send to (see `notify`).
    #[error(
        "cannot use NOTIFY_SOCKET={value}: {reason}; the daemon runs without telling the service manager it is ready (give a unix socket path or @abstract name, or use Type=simple)"
    )]
    NotifySocket {
        /// The value, cut to 120 characters.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The TLS material cannot make a TLS configuration.
    #[error("cannot set up TLS between daemons: {cause}; {fix}")]
    Tls {
        /// What rustls said.
        cause: String,
        /// What to do.
        fix: &'static str,
    },
    /// The engine stopped unexpectedly.
    #[error(
        "the daemon engine stopped unexpectedly; this is a bug: report it with the log, and restart the daemon"
    )]
    EngineGone,
}

/// Why a dial failed before a session.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    /// The node file's name does not resolve.
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    /// It resolves to nothing.
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    /// The address cannot form an endpoint.
    #[error("bad peer address {addr}: {cause}")]
    BadAddress { addr: String, cause: String },
    /// TCP/HTTP2 connection failed.
    #[error("cannot connect to {addr}: {cause}")]
    Connect {
        addr: String,
        cause: String,
        /// The connection was refused: nothing listens at `addr`.
        refused: bool,
    },
    /// The session carrying our hello failed, or its first frame answered nothing.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// The peer accepted but sent no usable identity.
    #[error("handshake reply {0}")]
    Identity(String),
    /// The peer accepted our hello but keeps the pair on the session it dialled.
    #[error("session refused: {0}")]
    Session(String),
    /// The TLS handshake failed, or the peer closed the connection over our certificate.
    #[error("{reason} ({detail})")]
    Tls {
        /// The named reason it is counted under (`tls::refusal`).
        reason: &'static str,
        /// What rustls said.
        detail: String,
    },
    /// Nothing within the dial timeout.
    #[error("no answer from {host}:{port} within {ms} ms")]
    Timeout { host: String, port: u16, ms: u128 },
}

impl DialError {
    /// The failure as core's retry sees it.
    pub(crate) fn failure(&self) -> openimex_core::DialFailure {
        match self {
            Self::Connect { refused: true, .. } => openimex_core::DialFailure::NotListening,
            _ => openimex_core::DialFailure::Other,
        }
    }
}
