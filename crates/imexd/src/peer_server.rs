//! Inbound side of the peer protocol: handshakes (answered by the engine's verdict), session
//! heartbeats (answered here, one for one), goodbyes and status rows.

use std::pin::Pin;

use openimex_core::{Hello, NodeId, Verdict};
use openimex_proto::peer::{
    GoodbyeReply, GoodbyeRequest, HelloRequest, HelloResponse, Identity, ImportReply,
    ImportRequest, NodeStatus, NodeStatusRequest, Refusal, SessionMsg, UnimportReply,
    UnimportRequest, peer_server::Peer,
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

/// Sends the engine a request built around a reply channel and awaits the answer. The engine
/// only goes away when the daemon stops, so both failures mean "unavailable".
async fn ask<T>(
    engine: &mpsc::Sender<Input>,
    request: impl FnOnce(oneshot::Sender<T>) -> Input,
) -> Result<T, Status> {
    let stopping = || Status::unavailable("daemon is stopping");
    let (reply, rx) = oneshot::channel();
    engine.send(request(reply)).await.map_err(|_| stopping())?;
    rx.await.map_err(|_| stopping())
}

/// The engine's current view, for status rows.
pub(crate) async fn snapshot(engine: &mpsc::Sender<Input>) -> Result<Snapshot, Status> {
    ask(engine, |reply| Input::Snapshot { reply }).await
}

/// The sender of a peer request, which every request must name.
fn sender(from: Option<Identity>, what: &str) -> Result<Hello, Status> {
    let from = from.ok_or_else(|| Status::invalid_argument(format!("{what} without identity")))?;
    convert::hello(&from).map_err(Status::invalid_argument)
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
        let hello = sender(request.into_inner().from, "hello")?;
        let (verdict, me) = ask(&self.engine, |reply| Input::Hello { hello, reply }).await?;
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
        let hello = sender(req.from, "goodbye")?;
        ask(&self.engine, |reply| Input::Goodbye {
            peer: hello.node,
            instance: hello.instance,
            reason: req.reason,
            reply,
        })
        .await?;
        Ok(Response::new(GoodbyeReply {}))
    }

    async fn import(
        &self,
        request: Request<ImportRequest>,
    ) -> Result<Response<ImportReply>, Status> {
        let req = request.into_inner();
        let from = sender(req.from, "import")?;
        let uuid: [u8; 16] = req
            .export_uuid
            .as_slice()
            .try_into()
            .map_err(|_| Status::invalid_argument("export UUID must be 16 bytes"))?;
        let index =
            u16::try_from(req.index).map_err(|_| Status::invalid_argument("index out of range"))?;
        let answer = ask(&self.engine, |reply| {
            Input::Fabric(FabricInput::PeerImport {
                from,
                import_event_id: req.import_event_id,
                uuid,
                index,
                channel: req.channel,
                reply,
            })
        })
        .await?;
        Ok(Response::new(fabric::reply_of(answer)))
    }

    async fn unimport(
        &self,
        request: Request<UnimportRequest>,
    ) -> Result<Response<UnimportReply>, Status> {
        let req = request.into_inner();
        let from = sender(req.from, "unimport")?;
        let released = ask(&self.engine, |reply| {
            Input::Fabric(FabricInput::PeerUnimport {
                from,
                import_event_id: req.import_event_id,
                reply,
            })
        })
        .await?;
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
