//! Inbound side of the peer protocol: handshakes (answered by the engine's verdict), session
//! heartbeats (answered here, one for one), goodbyes and status rows.

use std::pin::Pin;

use openimex_core::{Hello, PeerId, Verdict};
use openimex_proto::peer::{
    GoodbyeReply, GoodbyeRequest, HelloRequest, HelloResponse, Identity, ImportReply,
    ImportRequest, NodeStatus, NodeStatusRequest, Refusal, SessionMsg, UnimportReply,
    UnimportRequest, peer_server::Peer,
};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::convert;
use crate::mailbox::{Input, Snapshot, ask};

/// The peer gRPC service.
pub(crate) struct PeerService {
    pub(crate) engine: mpsc::Sender<Input>,
    pub(crate) host_name: String,
}

/// The engine's current view, for status rows.
pub(crate) async fn snapshot(engine: &mpsc::Sender<Input>) -> Result<Snapshot, Status> {
    Ok(ask(engine, |reply| Input::Snapshot { reply }).await?)
}

/// The sender of a peer request, which every request must name.
fn sender(from: Option<Identity>, what: &str) -> Result<Hello, Status> {
    let from = from.ok_or_else(|| Status::invalid_argument(format!("{what} without identity")))?;
    convert::hello(&from).map_err(Status::invalid_argument)
}

/// Who a request says it comes from.
fn peer_id(from: Option<Identity>, what: &str) -> Result<PeerId, Status> {
    sender(from, what).map(|h| PeerId {
        node: h.node,
        instance: h.instance,
    })
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
        let from = peer_id(req.from, "goodbye")?;
        ask(&self.engine, |reply| Input::Goodbye {
            from,
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
        let request = convert::import_request(&req).map_err(Status::invalid_argument)?;
        let from = peer_id(req.from, "import")?;
        let answer = ask(&self.engine, |reply| Input::PeerImport {
            from,
            request,
            reply,
        })
        .await?;
        Ok(Response::new(convert::reply(answer)))
    }

    async fn unimport(
        &self,
        request: Request<UnimportRequest>,
    ) -> Result<Response<UnimportReply>, Status> {
        let req = request.into_inner();
        let from = peer_id(req.from, "unimport")?;
        let released = ask(&self.engine, |reply| Input::PeerUnimport {
            from,
            import_event_id: req.import_event_id,
            reply,
        })
        .await?;
        Ok(Response::new(UnimportReply { released }))
    }

    async fn status(
        &self,
        _request: Request<NodeStatusRequest>,
    ) -> Result<Response<NodeStatus>, Status> {
        let snap = snapshot(&self.engine).await?;
        Ok(Response::new(convert::node_status(&snap, &self.host_name)))
    }
}
