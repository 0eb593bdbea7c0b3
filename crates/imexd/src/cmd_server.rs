//! The command service (`IMEX_CMD_PORT` / `IMEX_CMD_UNIX_DOMAIN_PATH`): the daemon state for
//! `ctl -q`, and the whole domain's matrix for `ctl -N`, gathered by asking every connected
//! peer for its row. Peers that cannot be asked are reported UNAVAILABLE with INVALID cells,
//! rebuilt from the node file, as NVIDIA's does.

use std::time::Duration;

use openimex_core::{ConnStatus, DaemonState, NodeId, NodeRow, domain_status};
use openimex_proto::cmd::{
    DomainReply, DomainRequest, NodeReport, StateReply, StateRequest, command_server::Command,
};
use openimex_proto::peer::{
    ConnectionStatus, NodeStatus, NodeStatusRequest, peer_client::PeerClient,
};
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status};

use crate::convert::node_status;
use crate::mailbox::Input;
use crate::peer_server::snapshot;

/// How long the command service waits for one peer's row.
const PEER_STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// The command gRPC service.
pub(crate) struct CommandService {
    pub(crate) engine: mpsc::Sender<Input>,
    pub(crate) state: watch::Receiver<DaemonState>,
    pub(crate) hosts: Vec<String>,
    pub(crate) host_name: String,
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
        _request: Request<DomainRequest>,
    ) -> Result<Response<DomainReply>, Status> {
        let snap = snapshot(&self.engine).await?;
        let local = snap.local;
        let mine = node_status(&snap, &self.host_name);
        let asks = snap.peers.into_iter().map(|(peer, channel)| {
            tokio::spawn(async move {
                let mut client = PeerClient::new(channel);
                match tokio::time::timeout(PEER_STATUS_TIMEOUT, client.status(NodeStatusRequest {}))
                    .await
                {
                    Ok(Ok(resp)) => Some((peer, resp.into_inner())),
                    _ => None,
                }
            })
        });
        let asks: Vec<_> = asks.collect();
        let mut rows: Vec<Option<NodeStatus>> = vec![None; self.hosts.len()];
        if let Some(slot) = rows.get_mut(local.index()) {
            *slot = Some(mine);
        }
        for ask in asks {
            if let Ok(Some((peer, status))) = ask.await
                && u32::from(peer.0) == status.node_id
                && let Some(slot) = rows.get_mut(peer.index())
            {
                *slot = Some(status);
            }
        }
        Ok(Response::new(self.assemble(local, rows)))
    }
}

impl CommandService {
    fn assemble(&self, local: NodeId, rows: Vec<Option<NodeStatus>>) -> DomainReply {
        let n = self.hosts.len();
        let mut core_rows = Vec::with_capacity(n);
        let mut nodes = Vec::with_capacity(n);
        for (i, row) in rows.into_iter().enumerate() {
            let id = NodeId(u16::try_from(i).unwrap_or(u16::MAX));
            let host = self.hosts.get(i).cloned().unwrap_or_default();
            let report = match row {
                Some(st) => {
                    let state = st.state.parse().unwrap_or(DaemonState::Unavailable);
                    let cells = (0..n)
                        .map(|j| {
                            st.connections
                                .iter()
                                .find(|c| c.node_id as usize == j)
                                .and_then(|c| c.status.parse().ok())
                                .unwrap_or(ConnStatus::Invalid)
                        })
                        .collect();
                    core_rows.push(NodeRow {
                        node: id,
                        state,
                        cells,
                    });
                    NodeReport {
                        node_id: st.node_id,
                        host,
                        state: st.state,
                        version: st.version,
                        host_name: st.host_name,
                        reachable: true,
                        instance_id: st.instance_id,
                        connections: st.connections,
                        refusals: st.refusals,
                    }
                }
                None => {
                    core_rows.push(NodeRow::unreachable(id, n));
                    NodeReport {
                        node_id: u32::from(id.0),
                        host,
                        state: DaemonState::Unavailable.as_str().to_string(),
                        version: String::new(),
                        host_name: String::new(),
                        reachable: false,
                        instance_id: 0,
                        connections: (0..n)
                            .map(|j| ConnectionStatus {
                                node_id: u32::try_from(j).unwrap_or(u32::MAX),
                                status: ConnStatus::Invalid.as_str().to_string(),
                                changed: false,
                                reason: "node could not be asked".to_string(),
                            })
                            .collect(),
                        refusals: Vec::new(),
                    }
                }
            };
            nodes.push(report);
        }
        let status = domain_status(local, &core_rows);
        DomainReply {
            local_node_id: u32::from(local.0),
            nodes,
            status: status.as_str().to_string(),
        }
    }
}
