//! Inbound side of the peer protocol: sessions, each opened by its hello (judged by the
//! engine's verdict and answered before anything else on the stream). Goodbyes, imports,
//! unimports and status rows travel on sessions only: there is no unary RPC a connection
//! without a proven hello could call.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

use openimex_core::{Hello, NodeId, Verdict, Via};
use openimex_proto::peer::session_msg::Body;
use openimex_proto::peer::{
    HelloRequest, HelloResponse, Identity, Refusal, SessionMsg, peer_server::Peer,
};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::conn::ConnInfo;
use crate::convert;
use crate::mailbox::{Closer, Hosts, Input, Stopping, ask};
use crate::session;
use crate::session_tx::SessionTx;

/// The peer gRPC service.
pub(crate) struct PeerService {
    pub(crate) engine: mpsc::Sender<Input>,
    /// The node file's entries: a hello naming node N must come from entry N's address.
    pub(crate) hosts: Hosts,
    /// `OPENIMEX_PEER_ANY_SOURCE`: accept hellos from any address (multi-homed hosts).
    pub(crate) any_source: bool,
    /// With TLS: a hello naming node N must come with a certificate for N's entry.
    pub(crate) tls: Option<crate::tls::Tls>,
    /// The stats file's counts the sessions add to.
    pub(crate) stats: crate::stats::Stats,
    /// The last session stream's number (numbers are per daemon: the engine's deadlines are
    /// keyed by them).
    pub(crate) streams: std::sync::Arc<AtomicU64>,
    /// How the nodes file's names resolve (the system's way, or on the in-process network).
    pub(crate) resolver: crate::net::Resolver,
}

/// The sender of a peer request, which every request must name.
fn sender(from: Option<Identity>, what: &str) -> Result<Hello, Status> {
    let from = from.ok_or_else(|| Status::invalid_argument(format!("{what} without identity")))?;
    convert::hello(&from).map_err(Status::invalid_argument)
}

/// The connection a request arrived on.
fn conn<T>(request: &Request<T>) -> Result<ConnInfo, Status> {
    request
        .extensions()
        .get::<ConnInfo>()
        .cloned()
        .ok_or_else(|| Status::internal("request without connection info"))
}

impl PeerService {
    /// Whether `source` is the node file's address for `node` (names are resolved now: they
    /// may change).
    async fn is_node_address(&self, node: NodeId, source: IpAddr) -> bool {
        if self.any_source {
            return true;
        }
        // Cloned out: the borrow must not be held across the look-up below.
        let Some(host) = self.hosts.borrow().get(node.index()).cloned() else {
            return false;
        };
        let source = source.to_canonical();
        self.resolver.lookup(&host).await.contains(&source)
    }
}

impl PeerService {
    /// With TLS, refuses (and counts) a hello whose certificate does not name the node the
    /// hello claims to be: any certificate of the domain's CA would otherwise speak for any
    /// node.
    async fn check_certificate(&self, info: &ConnInfo, node: NodeId) -> Result<(), Status> {
        let (Some(tls), Some(cert)) = (&self.tls, &info.peer_cert) else {
            return Ok(());
        };
        let host = self.hosts.borrow().get(node.index()).cloned();
        let checked = match &host {
            Some(host) => crate::tls::names_entry(&tls.sides(), cert, host),
            None => Err(format!("there is no node {node} in the nodes file")),
        };
        let Err(why) = checked else {
            return Ok(());
        };
        let reason = "tls: client certificate does not name the node's entry";
        let _ = self
            .engine
            .send(Input::Refused {
                reason,
                detail: format!(
                    "a hello from {} as node {node} ({}): its certificate {why}",
                    info.remote,
                    host.as_deref().unwrap_or("?")
                ),
            })
            .await;
        Err(Status::permission_denied(format!(
            "{reason}: the certificate this connection presented does not name node {node}'s entry"
        )))
    }
}

/// What a hello earned.
enum Greeting {
    /// Accepted: our identity, for the answer.
    Accepted(Identity),
    /// Refused with this answer (a reason code only: a refusal tells nothing about us).
    Refused(HelloResponse),
}

impl PeerService {
    /// Judges the hello that opens a session on connection `info`: its identity, its source
    /// address, its certificate (with TLS), then the engine's verdict. An accepted hello marks
    /// the connection greeted.
    async fn greet(&self, info: &ConnInfo, request: HelloRequest) -> Result<Greeting, Status> {
        let cliques = request
            .from
            .as_ref()
            .map(|f| (f.cliques.clone(), f.cliques_epoch))
            .unwrap_or_default();
        let hello = sender(request.from, "hello")?;
        self.check_certificate(info, hello.node).await?;
        let from_node_address = self.is_node_address(hello.node, info.remote.ip()).await;
        let (verdict, me) = ask(&self.engine, |reply| Input::Hello {
            hello,
            cliques,
            conn: info.id,
            from_node_address,
            reply,
        })
        .await?;
        Ok(match verdict {
            Verdict::ShuttingDown => return Err(Status::unavailable("daemon is shutting down")),
            Verdict::Accept => {
                info.greeted();
                Greeting::Accepted(me)
            }
            // Our entries' digest is not the hello's, which left its own out: the caller sends
            // them on a new stream.
            Verdict::MapNeeded => Greeting::Refused(HelloResponse {
                from: None,
                refusal: Refusal::NodeMapNeeded.into(),
                detail: String::new(),
            }),
            Verdict::Refuse { mismatch, .. } => Greeting::Refused(HelloResponse {
                from: None,
                refusal: convert::refusal(mismatch).into(),
                detail: String::new(),
            }),
        })
    }
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<SessionMsg, Status>> + Send>>;

#[tonic::async_trait]
impl Peer for PeerService {
    type SessionStream = SessionStream;

    /// A session: its first frame is the caller's hello, answered by ours before anything
    /// else on the stream. A refused hello's answer ends the stream; a hello accepted on a
    /// pair that keeps another session (core's `mesh::pair`) is answered with an error.
    async fn session(
        &self,
        request: Request<Streaming<SessionMsg>>,
    ) -> Result<Response<SessionStream>, Status> {
        let info = conn(&request)?;
        let mut inbound = request.into_inner();
        // Bounded by the node's hello deadline (core's `node/deadlines.rs`), on a connection
        // already greeted too: the connection's own deadline no longer applies there.
        let stream = self.streams.fetch_add(1, Ordering::Relaxed) + 1;
        let closer = Closer::default();
        let opened = Input::StreamOpened {
            stream,
            closer: closer.clone(),
        };
        self.engine.send(opened).await.map_err(|_| Stopping)?;
        let late = || Status::deadline_exceeded("no hello within the hello deadline");
        let first = tokio::select! {
            first = inbound.message() => first,
            () = closer.closed() => Err(late()),
        };
        self.engine
            .send(Input::StreamHeard { stream })
            .await
            .map_err(|_| Stopping)?;
        let hello = match first? {
            Some(SessionMsg {
                body: Some(Body::Hello(hello)),
                ..
            }) => hello,
            _ => {
                return Err(Status::failed_precondition(
                    "a session opens with the caller's hello",
                ));
            }
        };
        let me = match self.greet(&info, *hello).await? {
            Greeting::Accepted(me) => me,
            Greeting::Refused(answer) => {
                let answer = crate::session_tx::frame(0, Body::HelloReply(Box::new(answer)));
                return Ok(Response::new(Box::pin(tokio_stream::once(Ok(answer)))));
            }
        };
        let (session, outbound) = SessionTx::new(&self.stats);
        session.open_with(Body::HelloReply(Box::new(HelloResponse {
            from: Some(me),
            refusal: Refusal::None.into(),
            detail: String::new(),
        })));
        let conn = info.id;
        let carries = ask(&self.engine, |reply| Input::SessionOpened {
            conn,
            remote: info.remote,
            session: session.clone(),
            reply,
        })
        .await?;
        if !carries {
            // The pair keeps the session our node dialled: the caller uses that one.
            return Err(Status::already_exists(
                "no session here: the pair has one already",
            ));
        }
        let engine = self.engine.clone();
        let via = Via::Accepted { conn };
        tokio::spawn(async move {
            let reason = session::run(inbound, session, via, engine.clone()).await;
            let _ = engine.send(Input::SessionLost { via, reason }).await;
        });
        Ok(Response::new(Box::pin(outbound.map(Ok))))
    }
}
