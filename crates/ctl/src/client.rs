//! Connecting to the daemon's command service over TCP or a unix socket.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use openimex_proto::cmd::command_client::CommandClient;
use openimex_proto::cmd::{
    ConfigReply, ConfigRequest, DomainReply, DomainRequest, PeersReply, PeersRequest, StateRequest,
};
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

/// Largest reply ctl accepts (gRPC's default is 4 MiB). `-N` replies carry one byte per cell of
/// the N² matrix plus about 60 bytes per node: 1 GiB is a domain of some 30,000 nodes, far past
/// what the text table or JSON can usefully show, and within protobuf's 2 GiB message limit.
pub const MAX_REPLY: usize = 1 << 30;

/// A connected command client.
#[derive(Debug, Clone)]
pub struct Client {
    inner: CommandClient<Channel>,
    target: Target,
    timeout: Duration,
    max_reply: usize,
}

impl Client {
    /// Connects, failing within `timeout`.
    pub async fn connect(target: Target, timeout: Duration) -> Result<Self, CtlError> {
        Self::open(target, timeout, false).await
    }

    /// A client that connects at its first call, and again at the next after a failed one: a
    /// call made while the daemon is not listening fails like any call (`CtlError::Connect`),
    /// and the client stays usable. For `--watch`, which may start before the daemon.
    pub async fn connect_lazily(target: Target, timeout: Duration) -> Result<Self, CtlError> {
        Self::open(target, timeout, true).await
    }

    async fn open(target: Target, timeout: Duration, lazy: bool) -> Result<Self, CtlError> {
        let fail = |cause: String| CtlError::Connect {
            target: target.to_string(),
            cause,
        };
        let channel = match &target {
            Target::Tcp { .. } => {
                let ep = Endpoint::from_shared(format!("http://{target}"))
                    .map_err(|e| fail(e.to_string()))?
                    .connect_timeout(timeout);
                match lazy {
                    true => ep.connect_lazy(),
                    false => ep
                        .connect()
                        .await
                        .map_err(|e| fail(openimex_proto::root_cause(&e)))?,
                }
            }
            Target::Unix(path) => {
                let path = path.clone();
                let ep = Endpoint::from_static("http://localhost").connect_timeout(timeout);
                let connector = tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        tokio::net::UnixStream::connect(path)
                            .await
                            .map(TokioIo::new)
                    }
                });
                match lazy {
                    true => ep.connect_with_connector_lazy(connector),
                    false => ep
                        .connect_with_connector(connector)
                        .await
                        .map_err(|e| fail(openimex_proto::root_cause(&e)))?,
                }
            }
        };
        Ok(Self {
            inner: CommandClient::new(channel).max_decoding_message_size(MAX_REPLY),
            target,
            timeout,
            max_reply: MAX_REPLY,
        })
    }

    /// Accepts replies of at most `bytes` (default [`MAX_REPLY`]).
    pub fn with_max_reply(mut self, bytes: usize) -> Self {
        self.inner = self.inner.max_decoding_message_size(bytes);
        self.max_reply = bytes;
        self
    }

    /// The daemon state word (`-q`).
    pub async fn state(&mut self) -> Result<String, CtlError> {
        let call = self.inner.state(StateRequest {});
        let reply = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| self.timed_out())?;
        Ok(reply.map_err(|s| self.rpc(s))?.into_inner().state)
    }

    /// The whole domain (`-N`); with `reasons`, each link's reason too (`--links`).
    pub async fn domain(&mut self, reasons: bool) -> Result<DomainReply, CtlError> {
        self.ask_domain(DomainRequest {
            reasons,
            fabric: false,
        })
        .await
    }

    /// The whole domain with each node's GPUs on the fabric (`--fabric`).
    pub async fn fabric(&mut self) -> Result<DomainReply, CtlError> {
        self.ask_domain(DomainRequest {
            reasons: false,
            fabric: true,
        })
        .await
    }

    async fn ask_domain(&mut self, req: DomainRequest) -> Result<DomainReply, CtlError> {
        // Gathering asks every peer; give it a little more than one peer's timeout.
        let limit = self.timeout + Duration::from_secs(3);
        let call = self.inner.domain(req);
        let reply = tokio::time::timeout(limit, call)
            .await
            .map_err(|_| CtlError::NoAnswer {
                target: self.target.to_string(),
                secs: limit.as_secs(),
            })?;
        Ok(reply.map_err(|s| self.rpc(s))?.into_inner())
    }

    /// The daemon's configuration as logged at start and its node map (`-d`, `-m`).
    pub async fn config(&mut self) -> Result<ConfigReply, CtlError> {
        // Resolving the node map's names may take a DNS timeout.
        let limit = self.timeout + Duration::from_secs(5);
        let call = self.inner.config(ConfigRequest {});
        let reply = tokio::time::timeout(limit, call)
            .await
            .map_err(|_| self.timed_out())?;
        reply
            .map(tonic::Response::into_inner)
            .map_err(|s| self.rpc(s))
    }

    /// The jobs defined on the daemon (`jobs`).
    pub async fn jobs(&mut self) -> Result<openimex_proto::cmd::JobsReply, CtlError> {
        let call = self.inner.jobs(openimex_proto::cmd::JobsRequest {});
        let reply = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| self.timed_out())?;
        self.answer(
            reply,
            "the daemon knows no jobs (an older openimex release?)",
        )
    }

    /// `jobs create`: the daemon writes the job file and answers once it holds the job.
    pub async fn job_create(
        &mut self,
        req: openimex_proto::cmd::JobCreateRequest,
    ) -> Result<openimex_proto::cmd::JobCreateReply, CtlError> {
        // The daemon waits up to 5 s for its own read of the file.
        let limit = self.timeout + Duration::from_secs(5);
        let reply = tokio::time::timeout(limit, self.inner.job_create(req))
            .await
            .map_err(|_| self.timed_out())?;
        self.answer(
            reply,
            "the daemon cannot create jobs (an older openimex release?)",
        )
    }

    /// `jobs end`: the daemon deletes the job file and answers once the job ended.
    pub async fn job_end(
        &mut self,
        name: &str,
    ) -> Result<openimex_proto::cmd::JobEndReply, CtlError> {
        let limit = self.timeout + Duration::from_secs(5);
        let req = openimex_proto::cmd::JobEndRequest {
            name: name.to_string(),
        };
        let reply = tokio::time::timeout(limit, self.inner.job_end(req))
            .await
            .map_err(|_| self.timed_out())?;
        self.answer(
            reply,
            "the daemon cannot end jobs (an older openimex release?)",
        )
    }

    /// `jobs clear`: the channel leaves quarantine on this node.
    pub async fn job_channel_clear(
        &mut self,
        channel: u32,
    ) -> Result<openimex_proto::cmd::JobChannelClearReply, CtlError> {
        let req = openimex_proto::cmd::JobChannelClearRequest { channel };
        let reply = tokio::time::timeout(self.timeout, self.inner.job_channel_clear(req))
            .await
            .map_err(|_| self.timed_out())?;
        self.answer(
            reply,
            "the daemon cannot release channels (an older openimex release?)",
        )
    }

    /// `jobs wait`: answered by the daemon when the job stands in `state`, or after `limit`.
    pub async fn job_wait(
        &mut self,
        name: &str,
        state: &str,
        limit: Duration,
    ) -> Result<openimex_proto::cmd::JobWaitReply, CtlError> {
        let req = openimex_proto::cmd::JobWaitRequest {
            name: name.to_string(),
            state: state.to_string(),
            timeout_ms: u32::try_from(limit.as_millis()).unwrap_or(u32::MAX),
        };
        let bound = limit + self.timeout;
        let reply = tokio::time::timeout(bound, self.inner.job_wait(req))
            .await
            .map_err(|_| CtlError::NoAnswer {
                target: self.target.to_string(),
                secs: bound.as_secs(),
            })?;
        self.answer(
            reply,
            "the daemon cannot wait for a job (an older openimex release?): poll `ctl -q --job NAME`",
        )
    }

    /// This node's view of each peer (`--peers`).
    pub async fn peers(&mut self) -> Result<PeersReply, CtlError> {
        let call = self.inner.peers(PeersRequest {});
        let reply = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| self.timed_out())?;
        self.answer(
            reply,
            "the daemon does not know `--peers` (an older openimex release?); `--links` and \
             `-N` still work",
        )
    }

    /// The reply to a call a daemon from before it does not know: Unimplemented then is
    /// `missing`, what ctl cannot show and what still works.
    fn answer<T>(
        &self,
        reply: Result<tonic::Response<T>, tonic::Status>,
        missing: &str,
    ) -> Result<T, CtlError> {
        match reply {
            Ok(r) => Ok(r.into_inner()),
            Err(s) if s.code() == tonic::Code::Unimplemented => Err(CtlError::Rejected {
                target: self.target.to_string(),
                cause: missing.to_string(),
            }),
            Err(s) => Err(self.rpc(s)),
        }
    }

    fn timed_out(&self) -> CtlError {
        CtlError::NoAnswer {
            target: self.target.to_string(),
            secs: self.timeout.as_secs(),
        }
    }

    fn rpc(&self, s: tonic::Status) -> CtlError {
        classify(&self.target, self.max_reply, &s)
    }
}

/// What a failed call means to the operator. tonic makes a status itself when the transport
/// fails (it carries the transport error as its source) and when it cannot take the reply it
/// received (too large, undecodable), with texts of its own that the daemon never sends;
/// anything else is the daemon's answer.
pub fn classify(target: &Target, max_reply: usize, s: &tonic::Status) -> CtlError {
    let target = target.to_string();
    if std::error::Error::source(s).is_some() {
        return CtlError::Connect {
            target,
            cause: openimex_proto::root_cause(s),
        };
    }
    let text = s.message();
    let undecodable = [
        "failed to decode",
        "protocol error",
        "Unexpected EOF decoding",
    ]
    .iter()
    .any(|t| text.contains(t));
    match s.code() {
        tonic::Code::OutOfRange if text.contains("decoded message length too large") => {
            let found = s
                .message()
                .split("found ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .map_or_else(|| "larger".to_string(), |n| format!("{n} bytes"));
            CtlError::Rejected {
                target,
                cause: format!(
                    "the reply is {found}, more than ctl accepts ({max_reply} bytes). The domain \
                     is too large to show whole; `-q` still shows this node's state"
                ),
            }
        }
        tonic::Code::Internal if undecodable => CtlError::Rejected {
            target,
            cause: format!(
                "it cannot be decoded ({}). Is ctl from the same openimex release as the \
                     daemon (`openimex ctl --version`, `openimex --version`)?",
                s.message()
            ),
        },
        code => CtlError::Daemon {
            target,
            code: format!("{code:?}"),
            message: s.message().to_string(),
        },
    }
}
