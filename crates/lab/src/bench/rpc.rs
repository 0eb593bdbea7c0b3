//! The raw gRPC baseline of `import` and `storm`: a process (`openimex-lab bench rpc-server`)
//! serving the command service's unary `State` call with a constant answer, on the stack and
//! runtime shape the daemon's servers used when it was set (tonic over TCP with TCP_NODELAY, a
//! tokio runtime of 2 workers; the daemon now runs on one thread, and the baseline stays as it
//! was so figures compare across runs: a one-thread server measured slower, which would only
//! flatter the ratios), and the clients that time calls to it over loopback. What it costs is what any
//! unary RPC costs here; what an import costs above it is the daemons' and driver's own work.
//!
//! With `--config FILE` the server speaks mutual TLS with that node's keys ([`super::tls`]),
//! and [`RawServer::start_tls`] gives clients that dial it with another node's keys: the
//! baseline of `import_tls` and `storm_tls`, whose daemons speak TLS to each other.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use openimex_harness::bench::{ProbeTls, ReadyChild};
use openimex_imexd::tls::Sides;
use openimex_proto::cmd::command_client::CommandClient;
use openimex_proto::cmd::command_server::{Command, CommandServer};
use openimex_proto::cmd::{
    ConfigOption, ConfigReply, ConfigRequest, DomainReply, DomainRequest, PeersReply, PeersRequest,
    StateReply, StateRequest,
};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

/// Limit for connecting and for each call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Calls made before timing, so connection set-up and first-call allocations are not counted.
const WARM_UP: usize = 20;

/// The raw server's `Config` option that holds its allocation count.
const HEAP_ALLOCATIONS: &str = "heap_allocations";

/// Answers `State` with `READY`, and `Config` with its allocation count; nothing else.
pub(super) struct Constant;

#[tonic::async_trait]
impl Command for Constant {
    async fn state(&self, _: Request<StateRequest>) -> Result<Response<StateReply>, Status> {
        Ok(Response::new(StateReply {
            state: "READY".into(),
        }))
    }

    async fn domain(&self, _: Request<DomainRequest>) -> Result<Response<DomainReply>, Status> {
        Err(Status::unimplemented(
            "the raw RPC baseline answers State only",
        ))
    }

    async fn peers(&self, _: Request<PeersRequest>) -> Result<Response<PeersReply>, Status> {
        Err(Status::unimplemented(
            "the raw RPC baseline answers State only",
        ))
    }

    /// The server's own heap allocations so far, as the one option `heap_allocations`: the
    /// baseline of `import_allocs` (what a unary call costs the server in allocations).
    async fn config(&self, _: Request<ConfigRequest>) -> Result<Response<ConfigReply>, Status> {
        let count = crate::heap::allocations()
            .ok_or_else(|| Status::unavailable("this process does not count its allocations"))?;
        Ok(Response::new(ConfigReply {
            options: vec![ConfigOption {
                label: HEAP_ALLOCATIONS.into(),
                value: count.to_string(),
            }],
            ..ConfigReply::default()
        }))
    }

    async fn jobs(
        &self,
        _: Request<openimex_proto::cmd::JobsRequest>,
    ) -> Result<Response<openimex_proto::cmd::JobsReply>, Status> {
        Ok(Response::new(openimex_proto::cmd::JobsReply::default()))
    }

    async fn job_create(
        &self,
        _: Request<openimex_proto::cmd::JobCreateRequest>,
    ) -> Result<Response<openimex_proto::cmd::JobCreateReply>, Status> {
        Err(Status::unimplemented(
            "the raw RPC baseline answers State only",
        ))
    }

    async fn job_end(
        &self,
        _: Request<openimex_proto::cmd::JobEndRequest>,
    ) -> Result<Response<openimex_proto::cmd::JobEndReply>, Status> {
        Err(Status::unimplemented(
            "the raw RPC baseline answers State only",
        ))
    }

    async fn job_wait(
        &self,
        _: Request<openimex_proto::cmd::JobWaitRequest>,
    ) -> Result<Response<openimex_proto::cmd::JobWaitReply>, Status> {
        Err(Status::unimplemented(
            "the raw RPC baseline answers State only",
        ))
    }
    async fn job_channel_clear(
        &self,
        _: Request<openimex_proto::cmd::JobChannelClearRequest>,
    ) -> Result<Response<openimex_proto::cmd::JobChannelClearReply>, Status> {
        Err(Status::unimplemented(
            "the raw RPC baseline answers State only",
        ))
    }
}

/// `openimex-lab bench rpc-server [--config FILE] ADDR`: binds ADDR (port 0 picks one), prints
/// `ready IP:PORT`, serves until killed; over mutual TLS with FILE's keys when given.
pub(crate) fn serve(addr: SocketAddr, config: Option<&Path>) -> Result<()> {
    let sides = config.map(super::tls::load).transpose()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let (local, server) = match &sides {
            None => {
                let (local, server) = constant_server(addr)?;
                (local, tokio::spawn(server))
            }
            Some(sides) => {
                let (local, server) = constant_server_tls(addr, sides)?;
                (local, tokio::spawn(server))
            }
        };
        println!("ready {local}");
        std::io::stdout().flush()?;
        server
            .await
            .context("the server task failed")?
            .context("the raw RPC server failed")
    })
}

/// Binds `addr` (TCP_NODELAY) for [`Constant`]: the address bound, and the server to run (the
/// raw baseline's, and each mesh probe's). Call within a runtime.
pub(super) fn constant_server(
    addr: SocketAddr,
) -> Result<(
    SocketAddr,
    impl std::future::Future<Output = Result<(), tonic::transport::Error>>,
)> {
    let incoming = TcpIncoming::bind(addr)
        .with_context(|| format!("cannot bind {addr}"))?
        .with_nodelay(Some(true));
    let local = incoming
        .local_addr()
        .context("cannot read the bound address")?;
    let server = Server::builder()
        .add_service(CommandServer::new(Constant))
        .serve_with_incoming(incoming);
    Ok((local, server))
}

/// [`constant_server`] over mutual TLS with `sides` (the TLS floor's and baseline's server).
/// Call within a runtime.
pub(super) fn constant_server_tls(
    addr: SocketAddr,
    sides: &Sides,
) -> Result<(
    SocketAddr,
    // Nothing borrowed from `sides`: the server owns its acceptor and may be spawned.
    impl std::future::Future<Output = Result<(), tonic::transport::Error>> + use<>,
)> {
    let listener = super::tls::bind(addr)?;
    let local = listener
        .local_addr()
        .context("cannot read the bound address")?;
    let server = Server::builder()
        .add_service(CommandServer::new(Constant))
        .serve_with_incoming(super::tls::incoming(listener, sides.acceptor().clone()));
    Ok((local, server))
}

/// A connection to the raw server: the command client over plain TCP (as before TLS was
/// benched, so the plaintext baseline is unchanged), or the bare generated client over TLS
/// (the command client has no TLS), each call under the same limit.
enum Conn {
    Plain(openimex_ctl::Client),
    Tls(CommandClient<Channel>),
}

impl Conn {
    async fn state(&mut self) -> Result<()> {
        match self {
            Conn::Plain(c) => c.state().await.map(drop).context("raw RPC failed"),
            Conn::Tls(c) => tokio::time::timeout(CALL_TIMEOUT, c.state(StateRequest {}))
                .await
                .map_err(|_| anyhow!("raw RPC over TLS timed out after {CALL_TIMEOUT:?}"))?
                .map(drop)
                .context("raw RPC over TLS failed"),
        }
    }

    async fn config(&mut self) -> Result<ConfigReply> {
        match self {
            Conn::Plain(c) => c.config().await.map_err(anyhow::Error::new),
            Conn::Tls(c) => tokio::time::timeout(CALL_TIMEOUT, c.config(ConfigRequest {}))
                .await
                .map_err(|_| anyhow!("Config over TLS timed out after {CALL_TIMEOUT:?}"))?
                .map(tonic::Response::into_inner)
                .map_err(anyhow::Error::new),
        }
    }
}

/// A client of a [`RawServer`] with the runtime it runs on.
pub(crate) struct RawClient {
    rt: tokio::runtime::Runtime,
    client: Conn,
}

impl RawClient {
    /// One unary round trip, timed.
    pub(crate) fn round_trip(&mut self) -> Result<Duration> {
        let t = Instant::now();
        self.rt.block_on(self.client.state())?;
        Ok(t.elapsed())
    }

    /// The raw server's allocations so far (its `Config` answer).
    pub(crate) fn server_allocations(&mut self) -> Result<u64> {
        let reply = self
            .rt
            .block_on(self.client.config())
            .context("cannot ask the raw server for its allocations")?;
        reply
            .options
            .iter()
            .find(|o| o.label == HEAP_ALLOCATIONS)
            .and_then(|o| o.value.parse().ok())
            .with_context(|| format!("the raw server's Config answer has no {HEAP_ALLOCATIONS}"))
    }
}

/// A running raw RPC server, killed on drop.
pub(crate) struct RawServer {
    _child: ReadyChild,
    addr: SocketAddr,
    /// With TLS: the client's side (another node's keys than the server's), and the files,
    /// kept while the server runs.
    tls: Option<(Sides, ProbeTls)>,
}

/// The loopback address the raw server binds; also its certificate's name.
const LOOPBACK: &str = "127.0.0.1";

impl RawServer {
    /// Starts `binary bench rpc-server 127.0.0.1:0` and reads the address it bound.
    pub(crate) fn start(binary: &Path) -> Result<Self> {
        Self::spawn(binary, None)
    }

    /// [`RawServer::start`] over mutual TLS: certificates for two nodes at 127.0.0.1 (made
    /// here, before any timing), the server with the first's, clients with the second's.
    pub(crate) fn start_tls(binary: &Path) -> Result<Self> {
        let files = ProbeTls::make(&[LOOPBACK.to_owned(), LOOPBACK.to_owned()])
            .context("cannot make the raw server's certificates")?;
        let (Some(server), Some(client)) = (files.config(0), files.config(1)) else {
            bail!("the raw server's certificates lack a node's config");
        };
        let sides = super::tls::load(client)?;
        let server = server.to_owned();
        Self::spawn(binary, Some((sides, files, server.as_path())))
    }

    fn spawn(binary: &Path, tls: Option<(Sides, ProbeTls, &Path)>) -> Result<Self> {
        let mut args: Vec<&std::ffi::OsStr> = vec!["bench".as_ref(), "rpc-server".as_ref()];
        if let Some((_, _, config)) = &tls {
            args.extend(["--config".as_ref(), config.as_os_str()]);
        }
        let bind = format!("{LOOPBACK}:0");
        args.push(bind.as_ref());
        let child = ReadyChild::spawn(binary, args, Duration::from_secs(10))
            .context("cannot start the raw RPC server")?;
        let line = child.ready_line();
        let addr = line
            .strip_prefix("ready ")
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("the raw RPC server said {line:?}, not `ready IP:PORT`"))?;
        Ok(Self {
            _child: child,
            addr,
            tls: tls.map(|(sides, files, _)| (sides, files)),
        })
    }

    async fn connect(&self) -> Result<Conn> {
        if let Some((sides, _)) = &self.tls {
            let endpoint = Endpoint::from_shared(format!("http://{}", self.addr))
                .context("the raw server's address")?
                .connect_timeout(CALL_TIMEOUT)
                .tcp_nodelay(true);
            let channel = super::tls::connect(sides, endpoint, None, self.addr)
                .await
                .map_err(|f| f.error.context("cannot connect to the raw RPC server"))?;
            return Ok(Conn::Tls(CommandClient::new(channel)));
        }
        let target = openimex_ctl::Target::Tcp {
            host: self.addr.ip().to_string(),
            port: self.addr.port(),
        };
        openimex_ctl::Client::connect(target, CALL_TIMEOUT)
            .await
            .map(Conn::Plain)
            .context("cannot connect to the raw RPC server")
    }

    /// One client, connected and warmed up, for round trips timed one at a time
    /// ([`RawClient::round_trip`]), between the measured operation's own samples.
    pub(crate) fn client(&self) -> Result<RawClient> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let mut client = rt.block_on(self.connect())?;
        for _ in 0..WARM_UP {
            rt.block_on(client.state())?;
        }
        Ok(RawClient { rt, client })
    }

    /// Wall time of `clients` concurrent clients (each on its own connection, connected before
    /// the clock starts) making `calls_each` unary calls one after another.
    pub(crate) fn burst(&self, clients: usize, calls_each: usize) -> Result<Duration> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        rt.block_on(async {
            let mut conns = Vec::with_capacity(clients);
            for _ in 0..clients {
                let mut c = self.connect().await?;
                c.state().await?;
                conns.push(c);
            }
            let start = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for mut c in conns {
                tasks.spawn(async move {
                    for _ in 0..calls_each {
                        c.state().await?;
                    }
                    Ok::<_, anyhow::Error>(())
                });
            }
            while let Some(done) = tasks.join_next().await {
                match done {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => bail!("{e:#}"),
                    Err(e) => bail!("a raw RPC client task failed: {e}"),
                }
            }
            Ok(start.elapsed())
        })
    }
}
