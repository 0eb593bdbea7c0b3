//! Connecting to the daemon's command service over TCP or a unix socket.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use openimex_proto::cmd::command_client::CommandClient;
use openimex_proto::cmd::{DomainReply, DomainRequest, StateRequest};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::CtlError;

/// Where the command service listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `IP:PORT` (or `name:PORT`).
    Tcp {
        /// Address or name.
        host: String,
        /// Port.
        port: u16,
    },
    /// A unix socket path.
    Unix(PathBuf),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Self::Tcp { host, port } => write!(f, "{host}:{port}"),
            Self::Unix(p) => write!(f, "unix socket {}", p.display()),
        }
    }
}

/// A connected command client.
#[derive(Debug, Clone)]
pub struct Client {
    inner: CommandClient<Channel>,
    target: Target,
    timeout: Duration,
}

impl Client {
    /// Connects, failing within `timeout`.
    pub async fn connect(target: Target, timeout: Duration) -> Result<Self, CtlError> {
        let fail = |cause: String| CtlError::Connect {
            target: target.to_string(),
            cause,
        };
        let channel = match &target {
            Target::Tcp { .. } => {
                let ep = Endpoint::from_shared(format!("http://{target}"))
                    .map_err(|e| fail(e.to_string()))?;
                ep.connect_timeout(timeout)
                    .connect()
                    .await
                    .map_err(|e| fail(openimex_proto::root_cause(&e)))?
            }
            Target::Unix(path) => {
                let path = path.clone();
                let ep = Endpoint::from_static("http://localhost").connect_timeout(timeout);
                ep.connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        tokio::net::UnixStream::connect(path)
                            .await
                            .map(TokioIo::new)
                    }
                }))
                .await
                .map_err(|e| fail(openimex_proto::root_cause(&e)))?
            }
        };
        Ok(Self {
            inner: CommandClient::new(channel),
            target,
            timeout,
        })
    }

    /// The daemon state word (`-q`).
    pub async fn state(&mut self) -> Result<String, CtlError> {
        let call = self.inner.state(StateRequest {});
        let reply = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| self.timed_out())?;
        Ok(reply.map_err(|s| self.rpc(s))?.into_inner().state)
    }

    /// The whole domain (`-N`).
    pub async fn domain(&mut self) -> Result<DomainReply, CtlError> {
        // Gathering asks every peer; give it a little more than one peer's timeout.
        let limit = self.timeout + Duration::from_secs(3);
        let call = self.inner.domain(DomainRequest {});
        let reply = tokio::time::timeout(limit, call)
            .await
            .map_err(|_| self.timed_out())?;
        Ok(reply.map_err(|s| self.rpc(s))?.into_inner())
    }

    fn timed_out(&self) -> CtlError {
        CtlError::Connect {
            target: self.target.to_string(),
            cause: "no answer in time".to_string(),
        }
    }

    fn rpc(&self, s: tonic::Status) -> CtlError {
        CtlError::Connect {
            target: self.target.to_string(),
            cause: s.message().to_string(),
        }
    }
}
