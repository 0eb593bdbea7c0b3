//! Outbound side of the peer protocol: dial (resolve, connect, handshake, open the session and
//! report heartbeat answers and the session's end), and the import, unimport and goodbye calls
//! on an open session (`session`). One task per dial attempt or call; each reports its outcome to
//! the engine as an [`Input`], and the engine (its core node) decides what follows.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use openimex_core::{Hello, ImportError, ImportRequest, NodeId, Status, Via};
use openimex_proto::peer::session_msg::Body;
use openimex_proto::peer::{
    GoodbyeRequest, HelloRequest, Identity, Refusal, SessionMsg, UnimportRequest,
    peer_client::PeerClient,
};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

use crate::convert;
use crate::error::DialError;
use crate::mailbox::{Input, OutLink};
use crate::session;
use crate::session_tx::{CallError, SessionTx};

mod corked;
use corked::Corked;

/// Where and how to dial.
pub(crate) struct Target {
    pub(crate) peer: NodeId,
    pub(crate) attempt: u64,
    /// Leave from this address.
    pub(crate) local: Option<std::net::IpAddr>,
    /// Scope ID for IPv6 link-local addresses (the `NETWORK_INTERFACE`'s index); 0: none.
    pub(crate) scope: u32,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) timeout: Duration,
    pub(crate) keepalive: Duration,
    /// Mutual TLS (the configurations as they were when the dial began); `None`: plaintext.
    pub(crate) tls: Option<crate::tls::Sides>,
    /// The stats file's counts the session adds to.
    pub(crate) stats: crate::stats::Stats,
    /// The in-process network to dial over ([`crate::net`]); `None`: TCP.
    pub(crate) net: Option<crate::net::MemNet>,
}

/// Dials `target` and reports the outcome to the engine.
pub(crate) async fn dial(target: Target, me: OwnHello, engine: mpsc::Sender<Input>) {
    let (peer, attempt) = (target.peer, target.attempt);
    let outcome = tokio::time::timeout(target.timeout, handshake(&target, me, engine.clone()))
        .await
        .unwrap_or_else(|_| {
            Err(DialError::Timeout {
                host: target.host.clone(),
                port: target.port,
                ms: target.timeout.as_millis(),
            })
        });
    let input = outcome.unwrap_or_else(|error| Input::DialFailed {
        peer,
        attempt,
        error,
    });
    let _ = engine.send(input).await;
}

async fn connect(target: &Target) -> Result<(Channel, std::net::SocketAddr), DialError> {
    if let Some(net) = &target.net {
        return connect_in_process(target, net).await;
    }
    // Resolve on every attempt: DNS names in the node file may change or appear later.
    let addr = tokio::net::lookup_host((target.host.as_str(), target.port))
        .await
        .map_err(|source| DialError::Resolve {
            host: target.host.clone(),
            source,
        })?
        .next()
        .ok_or_else(|| DialError::NoAddress {
            host: target.host.clone(),
        })?;
    let addr = scoped(addr, target.scope);
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| DialError::BadAddress {
            addr: addr.to_string(),
            cause: e.to_string(),
        })?
        .connect_timeout(target.timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(target.keepalive)
        .keep_alive_timeout(target.timeout)
        .keep_alive_while_idle(true);
    if let Some(tls) = &target.tls {
        return connect_tls(target, tls, endpoint, addr).await;
    }
    // TCP first, HTTP/2 over it after: a refused connection (the peer's daemon not up yet,
    // about half of every first round at formation) then costs a socket and a connect, not a
    // tonic channel, its connector and their tasks built and dropped.
    let tcp = tcp_from(source(target), addr)
        .await
        .map_err(|e| DialError::Connect {
            addr: addr.to_string(),
            refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
            cause: e.to_string(),
        })?;
    let mut tcp = Some(tcp);
    let channel = endpoint
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            // One connection per channel: a session that loses it is over (a dial starts anew).
            let io = tcp
                .take()
                .map(|tcp| TokioIo::new(Corked::new(tcp)))
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::NotConnected,
                        "the session's connection ended",
                    )
                });
            std::future::ready(io)
        }))
        .await
        .map_err(|e| DialError::Connect {
            addr: addr.to_string(),
            cause: openimex_proto::root_cause(&e),
            refused: refused(&e),
        })?;
    Ok((channel, addr))
}

/// [`connect`] on the in-process network: its names resolve there, the source is this
/// daemon's own address.
async fn connect_in_process(
    target: &Target,
    net: &crate::net::MemNet,
) -> Result<(Channel, std::net::SocketAddr), DialError> {
    let resolver = crate::net::Resolver::Memory(net.clone());
    let ip = *resolver
        .lookup(&target.host)
        .await
        .first()
        .ok_or_else(|| DialError::NoAddress {
            host: target.host.clone(),
        })?;
    let addr = std::net::SocketAddr::new(ip, target.port);
    let from = target
        .local
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    match net.channel(from, addr).await {
        Ok(channel) => Ok((channel, addr)),
        Err(e) => Err(DialError::Connect {
            addr: addr.to_string(),
            cause: openimex_proto::root_cause(&e),
            refused: refused(&e),
        }),
    }
}

/// [`connect`] over TLS: TCP from the same source address as a plaintext dial, then the
/// handshake, checking the peer's certificate under its nodes-file entry. A failed handshake
/// is a [`DialError::Tls`] with its named reason.
async fn connect_tls(
    target: &Target,
    tls: &crate::tls::Sides,
    endpoint: Endpoint,
    addr: std::net::SocketAddr,
) -> Result<(Channel, std::net::SocketAddr), DialError> {
    let name = tls
        .server_name(&target.host)
        .map_err(|detail| DialError::Tls {
            reason: "tls: node entry is no certificate name",
            detail,
        })?;
    let from = source(target);
    // The connector's own error, kept: tonic reports only its text.
    let failed = std::sync::Arc::new(std::sync::Mutex::new(None));
    let connector = {
        let (connector, failed) = (tls.connector.clone(), failed.clone());
        tower::service_fn(move |_: tonic::transport::Uri| {
            let (connector, name, failed) = (connector.clone(), name.clone(), failed.clone());
            async move {
                let tcp = tcp_from(from, addr).await?;
                match connector.connect(name, tcp).await {
                    Ok(stream) => Ok(TokioIo::new(Corked::new(stream))),
                    Err(e) => {
                        let reason = crate::tls::refusal(
                            crate::tls::Side::Dialling,
                            crate::tls::find_rustls(&e),
                        );
                        if let Ok(mut slot) = failed.lock() {
                            *slot = Some((reason, e.to_string()));
                        }
                        Err(e)
                    }
                }
            }
        })
    };
    match endpoint.connect_with_connector(connector).await {
        Ok(channel) => Ok((channel, addr)),
        Err(e) => Err(match failed.lock().ok().and_then(|mut s| s.take()) {
            Some((reason, detail)) => DialError::Tls { reason, detail },
            None => DialError::Connect {
                addr: addr.to_string(),
                cause: openimex_proto::root_cause(&e),
                refused: refused(&e),
            },
        }),
    }
}

/// Whether `e`, or an error it wraps, is a refused connection (nothing listens there).
fn refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// A TCP connection to `to`, leaving from `from` when given.
async fn tcp_from(
    from: Option<std::net::SocketAddr>,
    to: std::net::SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = match to {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    if let Some(from) = from {
        socket.bind(from)?;
    }
    let stream = socket.connect(to).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// `addr` with `scope` as its scope ID when it is an IPv6 link-local address without one
/// (a nodes-file entry such as `fe80::2` means the peer on this node's interface).
fn scoped(addr: std::net::SocketAddr, scope: u32) -> std::net::SocketAddr {
    match addr {
        std::net::SocketAddr::V6(mut v6)
            if v6.scope_id() == 0 && openimex_config::iface::is_link_local((*v6.ip()).into()) =>
        {
            v6.set_scope_id(scope);
            std::net::SocketAddr::V6(v6)
        }
        other => other,
    }
}

/// The address a dial leaves from: `target.local` when set (a link-local one with the
/// interface's scope, which the kernel needs to bind it), any otherwise.
fn source(target: &Target) -> Option<std::net::SocketAddr> {
    match target.local {
        Some(std::net::IpAddr::V6(local))
            if openimex_config::iface::is_link_local(local.into()) =>
        {
            Some(std::net::SocketAddrV6::new(local, 0, 0, target.scope).into())
        }
        local => local.map(|ip| std::net::SocketAddr::new(ip, 0)),
    }
}

/// Our hello as a dial sends it: the identity without the node map's entries, which only a
/// peer whose map's digest differs needs (it asks, `REFUSAL_NODE_MAP_NEEDED`), and the entries,
/// for that peer and to put back into an answer that left them out. At 144 nodes the entries
/// were most of a hello's bytes, and a string allocated per entry on each side of each dial.
#[derive(Clone)]
pub(crate) struct OwnHello {
    /// Our identity, `node_map` empty.
    pub(crate) identity: Arc<Identity>,
    /// The entries the identity's digest is of (core's `Hello::node_map`).
    pub(crate) map: Arc<[String]>,
}

impl OwnHello {
    /// The identity with the entries, for a peer that asked for them.
    fn with_entries(&self) -> Identity {
        Identity {
            node_map: self.map.to_vec(),
            ..(*self.identity).clone()
        }
    }

    /// The peer leaves its node map's entries out of its hello answer when its digest is the
    /// one we sent (engine's Hello): they are the entries we sent, put back here. Without them
    /// an answer that crossed our own map's growth (SIGUSR1 while it was on its way) would
    /// fail the check against the grown map, whose digest is no longer the peer's, as a
    /// mismatch.
    fn restore_node_map(&self, answer: &mut Hello) {
        if answer.node_map.is_empty() && answer.digest == self.identity.node_map_digest {
            answer.node_map = Arc::clone(&self.map);
        }
    }
}

/// A session stream opened with our hello, and the peer's answer to it (its first frame).
struct Opened {
    session: SessionTx,
    inbound: tonic::Streaming<SessionMsg>,
    reply: Box<openimex_proto::peer::HelloResponse>,
}

/// Opens a session stream on `channel` with `me` as its hello and reads the answer.
async fn open_session(
    target: &Target,
    channel: &Channel,
    me: Identity,
) -> Result<Opened, DialError> {
    let failed = |s: tonic::Status| match (&target.tls, s.code()) {
        // The pair keeps the session the peer dialled (core's `mesh::pair`).
        (_, tonic::Code::AlreadyExists) => DialError::Session(s.message().to_string()),
        (Some(_), _) => crate::tls::hello_failed(&s),
        (None, _) => DialError::Handshake(s.message().to_string()),
    };
    let (session, outbound) = SessionTx::new(&target.stats);
    session.open_with(Body::Hello(Box::new(HelloRequest {
        from: Some(me),
        to_node_id: u32::from(target.peer.0),
    })));
    let mut inbound = PeerClient::new(channel.clone())
        .max_decoding_message_size(crate::limits::MAX_SESSION_FRAME)
        .session(outbound)
        .await
        .map_err(failed)?
        .into_inner();
    let reply = match inbound.message().await.map_err(failed)? {
        Some(SessionMsg {
            body: Some(Body::HelloReply(reply)),
            ..
        }) => reply,
        Some(_) => {
            return Err(DialError::Handshake(
                "the session's first frame is no answer to our hello".into(),
            ));
        }
        None => return Err(DialError::Handshake("the session ended unanswered".into())),
    };
    Ok(Opened {
        session,
        inbound,
        reply,
    })
}

/// The refusal an answer carries (an unknown code: the peer's node is not the one dialled).
fn refusal_of(reply: &openimex_proto::peer::HelloResponse) -> Refusal {
    Refusal::try_from(reply.refusal).unwrap_or(Refusal::WrongNode)
}

/// Dials `target` and opens the session with our hello as its first frame; the answer's first
/// frame is the peer's verdict. A peer that needs our node map's entries (its digest is not
/// ours) gets them on a second stream of the same connection.
async fn handshake(
    target: &Target,
    me: OwnHello,
    engine: mpsc::Sender<Input>,
) -> Result<Input, DialError> {
    let (peer, attempt) = (target.peer, target.attempt);
    let (channel, addr) = connect(target).await?;
    let mut opened = open_session(target, &channel, (*me.identity).clone()).await?;
    // An older daemon refuses a hello without entries whose digest is not its own as a
    // mismatch: it gets the entries too, and then judges what differs.
    if matches!(
        refusal_of(&opened.reply),
        Refusal::NodeMapNeeded | Refusal::NodeMapMismatch
    ) {
        opened = open_session(target, &channel, me.with_entries()).await?;
    }
    let Opened {
        session,
        inbound,
        reply,
    } = opened;
    let refusal = refusal_of(&reply);
    if refusal != Refusal::None {
        return Ok(Input::DialRefused {
            peer,
            attempt,
            mismatch: convert::mismatch(refusal),
        });
    }
    let identity = reply
        .from
        .ok_or_else(|| DialError::Identity("carries no identity".into()))?;
    let mut remote = convert::hello(&identity).map_err(DialError::Identity)?;
    me.restore_node_map(&mut remote);

    let via = Via::Dialled { peer, attempt };
    let reader = tokio::spawn({
        let session = session.clone();
        async move {
            let reason = session::run(inbound, session, via, engine.clone()).await;
            let _ = engine.send(Input::SessionLost { via, reason }).await;
        }
    });
    let link = OutLink {
        _connection: channel,
        session,
        reader: reader.abort_handle(),
        remote: addr,
    };
    Ok(Input::DialOk {
        peer,
        attempt,
        remote,
        cliques: (identity.cliques, identity.cliques_epoch),
        link,
    })
}

/// Asks `exporter` for an import on the session; the answer (or the session's end) goes to the
/// engine. No timer here: the core node fails the import when its timeout passes.
pub(crate) fn import(
    session: SessionTx,
    exporter: NodeId,
    request: ImportRequest,
    engine: mpsc::Sender<Input>,
) {
    tokio::spawn(async move {
        let import_event_id = request.import_event_id;
        let wire = convert::wire_import_request(&request);
        let answer = match session.call(Body::Import(wire)).await {
            Ok(Body::ImportReply(r)) => convert::answer(r),
            Ok(_) => Err(ImportError::new(
                Status::InvalidState,
                format!("exporter node {exporter}: {}", CallError::Unexpected),
            )),
            Err(e) => Err(ImportError::new(
                Status::InvalidState,
                format!("exporter node {exporter}: {e}"),
            )),
        };
        let _ = engine
            .send(Input::ImportAnswered {
                exporter,
                import_event_id,
                answer,
            })
            .await;
    });
}

/// Tells `exporter` an import is gone; whether it got there goes to the engine.
pub(crate) fn unimport(
    session: SessionTx,
    exporter: NodeId,
    import_event_id: u64,
    engine: mpsc::Sender<Input>,
) {
    tokio::spawn(async move {
        let req = UnimportRequest {
            from: None,
            import_event_id,
        };
        let delivered = match session.call(Body::Unimport(req)).await {
            Ok(Body::UnimportReply(_)) => true,
            Ok(_) => false,
            Err(e) => {
                tracing::warn!("unimport {import_event_id} on node {exporter} failed: {e}");
                false
            }
        };
        let _ = engine
            .send(Input::UnimportDelivered {
                exporter,
                import_event_id,
                delivered,
            })
            .await;
    });
}

/// Says goodbye to `peer` on the session; returns whether it acknowledged. No timer here:
/// the core node decides how long the shutdown waits for it (`GOODBYE_WAIT`).
pub(crate) async fn goodbye(peer: NodeId, session: SessionTx) -> bool {
    let req = GoodbyeRequest {
        from: None,
        reason: "daemon shutting down".to_string(),
    };
    match session.call(Body::Goodbye(Box::new(req))).await {
        Ok(Body::GoodbyeReply(_)) => {
            tracing::debug!("node {peer} acknowledged goodbye");
            true
        }
        Ok(_) => false,
        Err(e) => {
            tracing::warn!("goodbye to node {peer} failed: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests;
