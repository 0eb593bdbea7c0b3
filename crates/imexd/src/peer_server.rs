//! Inbound side of the peer protocol: handshakes (answered by the engine's verdict), session
//! heartbeats (answered here, one for one), goodbyes and status rows.

use std::pin::Pin;

use openimex_core::{NodeId, Verdict};
use openimex_proto::peer::{
    GoodbyeReply, GoodbyeRequest, HelloRequest, HelloResponse, ImportReply, ImportRequest,
    NodeStatus, NodeStatusRequest, Refusal, SessionMsg, UnimportReply, UnimportRequest,
    peer_server::Peer,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::convert;
use crate::engine::{Input, Snapshot};
use crate::fabric::{self, FabricInput};

/// The peer gRPC service.
pub(crate) struct PeerService {
    pub(crate) engine: mpsc::Sender<Input>,
    pub(crate) host_name: String,
}

pub(crate) async fn snapshot(engine: &mpsc::Sender<Input>) -> Result<Snapshot, Status> {
    let (reply, rx) = oneshot::channel();
    engine
        .send(Input::Snapshot { reply })
        .await
        .map_err(|_| Status::unavailable("daemon is stopping"))?;
    rx.await
        .map_err(|_| Status::unavailable("daemon is stopping"))
}

/// This node's row, as sent to peers and used by the command service.
pub(crate) fn node_status(local: NodeId, snap: &Snapshot, host_name: &str) -> NodeStatus {
    NodeStatus {
        node_id: u32::from(local.0),
        state: snap.state.as_str().to_string(),
        version: snap.driver_version.clone(),
        host_name: host_name.to_string(),
        instance_id: snap.instance.0,
        connections: snap.links.iter().map(convert::connection).collect(),
    }
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<SessionMsg, Status>> + Send>>;

#[tonic::async_trait]
impl Peer for PeerService {
    async fn hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloResponse>, Status> {
        let req = request.into_inner();
        let from = req
            .from
            .ok_or_else(|| Status::invalid_argument("hello without identity"))?;
        let hello = convert::hello(&from).map_err(Status::invalid_argument)?;
        let (reply, rx) = oneshot::channel();
        self.engine
            .send(Input::Hello { hello, reply })
            .await
            .map_err(|_| Status::unavailable("daemon is stopping"))?;
        let verdict = rx
            .await
            .map_err(|_| Status::unavailable("daemon is stopping"))?;
        let snap = snapshot(&self.engine).await?;
        let me = snapshot_identity(&snap);
        let (refusal, detail) = match verdict {
            Verdict::ShuttingDown => return Err(Status::unavailable("daemon is shutting down")),
            Verdict::Accept => (Refusal::None, String::new()),
            Verdict::Refuse { mismatch, detail } => (convert::refusal(mismatch), detail),
        };
        Ok(Response::new(HelloResponse {
            from: Some(me),
            refusal: refusal.into(),
            detail,
        }))
    }

    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: Request<Streaming<SessionMsg>>,
    ) -> Result<Response<SessionStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            while let Ok(Some(msg)) = inbound.message().await {
                if tx
                    .send(Ok(SessionMsg {
                        from: None,
                        heartbeat_seq: msg.heartbeat_seq,
                    }))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn goodbye(
        &self,
        request: Request<GoodbyeRequest>,
    ) -> Result<Response<GoodbyeReply>, Status> {
        let req = request.into_inner();
        let from = req
            .from
            .ok_or_else(|| Status::invalid_argument("goodbye without identity"))?;
        let hello = convert::hello(&from).map_err(Status::invalid_argument)?;
        let (reply, rx) = oneshot::channel();
        let input = Input::Goodbye {
            peer: hello.node,
            instance: hello.instance,
            reason: req.reason,
            reply,
        };
        self.engine
            .send(input)
            .await
            .map_err(|_| Status::unavailable("daemon is stopping"))?;
        rx.await
            .map_err(|_| Status::unavailable("daemon is stopping"))?;
        Ok(Response::new(GoodbyeReply {}))
    }

    async fn import(
        &self,
        request: Request<ImportRequest>,
    ) -> Result<Response<ImportReply>, Status> {
        let req = request.into_inner();
        let from = req
            .from
            .ok_or_else(|| Status::invalid_argument("import without identity"))?;
        let from = convert::hello(&from).map_err(Status::invalid_argument)?;
        let uuid: [u8; 16] = req
            .export_uuid
            .as_slice()
            .try_into()
            .map_err(|_| Status::invalid_argument("export UUID must be 16 bytes"))?;
        let index =
            u16::try_from(req.index).map_err(|_| Status::invalid_argument("index out of range"))?;
        let (reply, rx) = oneshot::channel();
        let input = FabricInput::PeerImport {
            from,
            import_event_id: req.import_event_id,
            uuid,
            index,
            channel: req.channel,
            reply,
        };
        self.engine
            .send(Input::Fabric(input))
            .await
            .map_err(|_| Status::unavailable("daemon is stopping"))?;
        let answer = rx
            .await
            .map_err(|_| Status::unavailable("daemon is stopping"))?;
        Ok(Response::new(fabric::reply_of(answer)))
    }

    async fn unimport(
        &self,
        request: Request<UnimportRequest>,
    ) -> Result<Response<UnimportReply>, Status> {
        let req = request.into_inner();
        let from = req
            .from
            .ok_or_else(|| Status::invalid_argument("unimport without identity"))?;
        let from = convert::hello(&from).map_err(Status::invalid_argument)?;
        let (reply, rx) = oneshot::channel();
        let input = FabricInput::PeerUnimport {
            from,
            import_event_id: req.import_event_id,
            reply,
        };
        self.engine
            .send(Input::Fabric(input))
            .await
            .map_err(|_| Status::unavailable("daemon is stopping"))?;
        let released = rx
            .await
            .map_err(|_| Status::unavailable("daemon is stopping"))?;
        Ok(Response::new(UnimportReply { released }))
    }

    async fn status(
        &self,
        _request: Request<NodeStatusRequest>,
    ) -> Result<Response<NodeStatus>, Status> {
        let snap = snapshot(&self.engine).await?;
        Ok(Response::new(node_status(
            snap.local,
            &snap,
            &self.host_name,
        )))
    }
}

fn snapshot_identity(snap: &Snapshot) -> openimex_proto::peer::Identity {
    convert::identity(&snap.hello, &snap.driver_version)
}
