//! The command service (`IMEX_CMD_PORT` / `IMEX_CMD_UNIX_DOMAIN_PATH`): the daemon state for
//! `ctl -q`, and the whole domain's matrix for `ctl -N`, gathered by asking every connected
//! peer for its row. Peers that cannot be asked are reported UNAVAILABLE with no cells (every
//! cell INVALID, rebuilt by ctl from the node file, as NVIDIA's does).
//!
//! The matrix is N² cells, so it travels compact: one byte per cell, reasons only when asked
//! (`ctl --links`). Each peer's row is moved into the reply as it arrives, never copied, so a
//! `ctl -N` of 3,000 nodes holds about one 9 MB matrix at most, not several.
//!
//! `ctl --peers` is answered by this daemon alone: what it holds for, imports from and owes each
//! peer, and its clean-ups of each, straight from the engine's node. So are `ctl -d` and `-m`
//! ([`About`]): the options as logged at start, and the node map in use with what each entry
//! resolves to now.

use std::time::Duration;

use openimex_core::{ConnStatus, DaemonState, NodeId, domain_status_of};
use openimex_proto::cmd::{
    ConfigOption, ConfigReply, ConfigRequest, DomainReply, DomainRequest, JobCreateReply,
    JobCreateRequest, JobEndReply, JobEndRequest, JobWaitReply, JobWaitRequest, JobsReply,
    JobsRequest, MapEntry, NodeReport, PeersReply, PeersRequest, StateReply, StateRequest,
    command_server::{Command, CommandServer},
};
use openimex_proto::peer::session_msg::Body;
use openimex_proto::peer::{NodeStatus, NodeStatusRequest};
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status};

use crate::convert::{node_status, peers_reply, row_cells};
use crate::error::DaemonError;
use crate::mailbox::{Hosts, Input, ask};

mod jobs;
#[cfg(test)]
mod prop;

pub(crate) use jobs::{JobsAccess, Listener};

/// How long the command service waits for one peer's row.
const PEER_STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// The command gRPC service.
pub(crate) struct CommandService {
    pub(crate) engine: mpsc::Sender<Input>,
    pub(crate) state: watch::Receiver<DaemonState>,
    /// The node map's entries (they grow when SIGUSR1 appends nodes).
    pub(crate) hosts: Hosts,
    pub(crate) host_name: String,
    pub(crate) about: std::sync::Arc<About>,
    /// How the node map's names resolve (`ctl -m` shows their addresses).
    pub(crate) resolver: crate::net::Resolver,
    /// The jobs directory, when the daemon has one (`ctl jobs create` and `end` write it).
    pub(crate) jobs: Option<std::sync::Arc<JobsAccess>>,
    /// The listener this service answers on.
    pub(crate) listener: Listener,
}

/// What `ctl -d` and `ctl -m` are told that does not change while the daemon runs.
#[derive(Debug)]
pub(crate) struct About {
    /// The config file and its options as logged at start.
    pub(crate) config: (std::path::PathBuf, Vec<(String, String)>),
    pub(crate) local: NodeId,
    /// The peer listener's address.
    pub(crate) bind: String,
    /// Its interface (empty when not known).
    pub(crate) network_interface: String,
}

#[tonic::async_trait]
impl Command for CommandService {
    async fn state(&self, _request: Request<StateRequest>) -> Result<Response<StateReply>, Status> {
        let state = *self.state.borrow();
        Ok(Response::new(StateReply {
            state: state.as_str().to_string(),
        }))
    }

    async fn domain(
        &self,
        request: Request<DomainRequest>,
    ) -> Result<Response<DomainReply>, Status> {
        let DomainRequest { reasons, fabric } = request.into_inner();
        let snap = ask(&self.engine, |reply| Input::Snapshot { reply }).await?;
        let local = snap.local;
        let mine = node_status(&snap, &self.host_name, reasons, fabric);
        let asks: Vec<_> = snap
            .peers
            .into_iter()
            .map(|(peer, session)| {
                tokio::spawn(async move {
                    let ask = session.call(Body::Status(NodeStatusRequest { reasons, fabric }));
                    match tokio::time::timeout(PEER_STATUS_TIMEOUT, ask).await {
                        Ok(Ok(Body::StatusReply(status))) => Some((peer, status)),
                        _ => None,
                    }
                })
            })
            .collect();
        let n = self.hosts.borrow().len();
        let mut rows: Vec<Option<NodeStatus>> = (0..n).map(|_| None).collect();
        if let Some(slot) = rows.get_mut(local.index()) {
            *slot = Some(mine);
        }
        for ask in asks {
            if let Ok(Some((peer, mut status))) = ask.await
                && u32::from(peer.0) == status.node_id
                && let Some(slot) = rows.get_mut(peer.index())
            {
                row_cells(&mut status, n);
                *slot = Some(*status);
            }
        }
        Ok(Response::new(self.assemble(local, rows)))
    }

    async fn peers(&self, _request: Request<PeersRequest>) -> Result<Response<PeersReply>, Status> {
        let snap = ask(&self.engine, |reply| Input::Peers { reply }).await?;
        let hosts = std::sync::Arc::clone(&self.hosts.borrow());
        Ok(Response::new(peers_reply(snap, &hosts)))
    }

    async fn jobs(&self, _request: Request<JobsRequest>) -> Result<Response<JobsReply>, Status> {
        Ok(Response::new(
            ask(&self.engine, |reply| Input::Jobs { reply }).await?,
        ))
    }

    async fn job_create(
        &self,
        request: Request<JobCreateRequest>,
    ) -> Result<Response<JobCreateReply>, Status> {
        let (engine, jobs) = (&self.engine, self.jobs.as_deref());
        let reply = jobs::create(
            engine,
            jobs,
            &self.hosts,
            self.about.local,
            self.listener,
            request.into_inner(),
        );
        Ok(Response::new(reply.await?))
    }

    async fn job_end(
        &self,
        request: Request<JobEndRequest>,
    ) -> Result<Response<JobEndReply>, Status> {
        let (engine, jobs) = (&self.engine, self.jobs.as_deref());
        let reply = jobs::end(engine, jobs, self.listener, request.into_inner());
        Ok(Response::new(reply.await?))
    }

    async fn job_wait(
        &self,
        request: Request<JobWaitRequest>,
    ) -> Result<Response<JobWaitReply>, Status> {
        Ok(Response::new(
            jobs::wait(&self.engine, request.into_inner()).await?,
        ))
    }

    async fn job_channel_clear(
        &self,
        request: Request<openimex_proto::cmd::JobChannelClearRequest>,
    ) -> Result<Response<openimex_proto::cmd::JobChannelClearReply>, Status> {
        let reply = jobs::clear(&self.engine, self.listener, request.into_inner());
        Ok(Response::new(reply.await?))
    }

    async fn config(
        &self,
        _request: Request<ConfigRequest>,
    ) -> Result<Response<ConfigReply>, Status> {
        let hosts = std::sync::Arc::clone(&self.hosts.borrow());
        let addrs = crate::nodes_file::resolve_all(&hosts, &self.resolver).await;
        let nodes = hosts
            .iter()
            .zip(addrs)
            .enumerate()
            .map(|(id, (host, addrs))| {
                let placeholder = openimex_config::is_placeholder(host);
                MapEntry {
                    node_id: u32::try_from(id).unwrap_or(u32::MAX),
                    host: host.clone(),
                    addresses: match placeholder {
                        true => Vec::new(),
                        false => addrs.iter().map(ToString::to_string).collect(),
                    },
                    placeholder,
                }
            })
            .collect();
        let (file, options) = &self.about.config;
        Ok(Response::new(ConfigReply {
            config_file: file.display().to_string(),
            options: options
                .iter()
                .map(|(label, value)| ConfigOption {
                    label: label.clone(),
                    value: value.clone(),
                })
                .collect(),
            local_node_id: u32::from(self.about.local.0),
            nodes,
            bind: self.about.bind.clone(),
            network_interface: self.about.network_interface.clone(),
        }))
    }
}

/// The row of a node that could not be asked: UNAVAILABLE, every link INVALID (no cells).
pub(crate) fn unavailable_row(node_id: u32, host: String) -> NodeReport {
    NodeReport {
        node_id,
        host,
        state: DaemonState::Unavailable.as_str().to_string(),
        version: String::new(),
        host_name: String::new(),
        reachable: false,
        instance_id: 0,
        connections: Vec::new(),
        refusals: Vec::new(),
        cells: Vec::new(),
        state_reason: String::new(),
        gpus: Vec::new(),
    }
}

/// How a command server ended: which one, and why.
pub(crate) type Ended = Result<(), (&'static str, tonic::transport::Error)>;

/// Serves the command service `svc` (built once per listener) on the TCP listener, the unix
/// socket at `unix_path` and the in-process listener, whichever are given; the configured and
/// the unconfigured daemon both serve `ctl` this way.
pub(crate) fn serve<S: Command>(
    svc: impl Fn(Listener) -> S,
    tcp: Option<std::net::TcpListener>,
    unix: Option<std::os::unix::net::UnixListener>,
    unix_path: Option<&std::path::Path>,
    memory: Option<crate::net::MemListener>,
) -> Result<Vec<tokio::task::JoinHandle<Ended>>, DaemonError> {
    use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
    use tonic::transport::Server;
    let mut servers = Vec::new();
    if let Some(l) = tcp {
        let l = crate::tokio_tcp(l)?;
        let s = Server::builder()
            .add_service(CommandServer::new(svc(Listener::Tcp)))
            .serve_with_incoming(TcpListenerStream::new(l));
        servers.push(tokio::spawn(async move {
            s.await.map_err(|source| ("command (TCP)", source))
        }));
    }
    if let Some(l) = unix {
        let l = tokio::net::UnixListener::from_std(l).map_err(|source| DaemonError::Bind {
            what: "command socket",
            addr: unix_path
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            source,
            fix: "check IMEX_CMD_UNIX_DOMAIN_PATH",
        })?;
        let s = Server::builder()
            .add_service(CommandServer::new(svc(Listener::Unix)))
            .serve_with_incoming(UnixListenerStream::new(l));
        servers.push(tokio::spawn(async move {
            s.await.map_err(|source| ("command (unix)", source))
        }));
    }
    if let Some(l) = memory {
        let s = Server::builder()
            .add_service(CommandServer::new(svc(Listener::Memory)))
            .serve_with_incoming(l.incoming());
        servers.push(tokio::spawn(async move {
            s.await.map_err(|source| ("command (in-process)", source))
        }));
    }
    Ok(servers)
}

impl CommandService {
    /// The reply, from every node's row (`None`: could not be asked). Rows are moved in.
    fn assemble(&self, local: NodeId, rows: Vec<Option<NodeStatus>>) -> DomainReply {
        let hosts = std::sync::Arc::clone(&self.hosts.borrow());
        let nodes: Vec<NodeReport> = rows
            .into_iter()
            .enumerate()
            .map(|(i, row)| {
                let host = hosts.get(i).cloned().unwrap_or_default();
                match row {
                    Some(st) => NodeReport {
                        node_id: st.node_id,
                        host,
                        state: st.state,
                        version: st.version,
                        host_name: st.host_name,
                        reachable: true,
                        instance_id: st.instance_id,
                        connections: st.connections,
                        refusals: st.refusals,
                        cells: st.cells,
                        state_reason: String::new(),
                        gpus: st.gpus,
                    },
                    None => unavailable_row(u32::try_from(i).unwrap_or(u32::MAX), host),
                }
            })
            .collect();
        let status = domain_status_of(
            local,
            nodes.iter().map(|r| {
                let id = NodeId(u16::try_from(r.node_id).unwrap_or(u16::MAX));
                let state = r.state.parse().unwrap_or(DaemonState::Unavailable);
                let cells = r.cells.iter().map(|c| ConnStatus::from_cell(*c).0);
                (id, state, cells)
            }),
        );
        DomainReply {
            local_node_id: u32::from(local.0),
            nodes,
            status: status.as_str().to_string(),
        }
    }
}
