//! Outbound side of a peer link: resolve, connect, handshake, open the session and report
//! heartbeat answers and the session's end to the engine. One task per dial attempt; the
//! engine decides when to retry.

use std::time::Duration;

use openimex_core::NodeId;
use openimex_proto::peer::{HelloRequest, Identity, Refusal, SessionMsg, peer_client::PeerClient};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::convert;
use crate::engine::{Input, OutLink};

/// Where and how to dial.
pub(crate) struct Target {
    pub(crate) peer: NodeId,
    pub(crate) attempt: u64,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) timeout: Duration,
    pub(crate) keepalive: Duration,
}

/// Dials `target` and reports the outcome to the engine.
pub(crate) async fn dial(target: Target, me: Identity, engine: mpsc::Sender<Input>) {
    let (peer, attempt) = (target.peer, target.attempt);
    let input =
        match tokio::time::timeout(target.timeout, handshake(&target, me, engine.clone())).await {
            Ok(Ok(input)) => input,
            Ok(Err(error)) => Input::DialFailed {
                peer,
                attempt,
                error,
            },
            Err(_) => Input::DialFailed {
                peer,
                attempt,
                error: format!(
                    "no answer from {}:{} within {} ms",
                    target.host,
                    target.port,
                    target.timeout.as_millis()
                ),
            },
        };
    let _ = engine.send(input).await;
}

async fn connect(target: &Target) -> Result<Channel, String> {
    // Resolve on every attempt: DNS names in the node file may change or appear later.
    let addr = tokio::net::lookup_host((target.host.as_str(), target.port))
        .await
        .map_err(|e| format!("cannot resolve {}: {e}", target.host))?
        .next()
        .ok_or_else(|| format!("{} resolves to no address", target.host))?;
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("bad peer address {addr}: {e}"))?
        .connect_timeout(target.timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(target.keepalive.max(Duration::from_secs(1)))
        .keep_alive_timeout(target.timeout)
        .keep_alive_while_idle(true);
    endpoint.connect().await.map_err(|e| {
        format!(
            "cannot connect to {addr}: {}",
            openimex_proto::root_cause(&e)
        )
    })
}

async fn handshake(
    target: &Target,
    me: Identity,
    engine: mpsc::Sender<Input>,
) -> Result<Input, String> {
    let (peer, attempt) = (target.peer, target.attempt);
    let channel = connect(target).await?;
    let mut client = PeerClient::new(channel.clone());
    let reply = client
        .hello(HelloRequest {
            from: Some(me.clone()),
            to_node_id: u32::from(peer.0),
        })
        .await
        .map_err(|s| format!("handshake failed: {}", s.message()))?
        .into_inner();
    let refusal = Refusal::try_from(reply.refusal).unwrap_or(Refusal::WrongNode);
    if refusal != Refusal::None {
        return Ok(Input::DialRefused {
            peer,
            attempt,
            mismatch: convert::mismatch(refusal),
            detail: reply.detail,
        });
    }
    let identity = reply.from.ok_or("handshake reply carries no identity")?;
    let remote = convert::hello(&identity)?;

    let (tx, rx) = mpsc::channel::<SessionMsg>(8);
    let mut inbound = client
        .session(ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("session refused: {}", s.message()))?
        .into_inner();
    let reader = tokio::spawn(async move {
        let reason = loop {
            match inbound.message().await {
                Ok(Some(_)) => {
                    if engine
                        .send(Input::Heartbeat { peer, attempt })
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(None) => break "peer closed the session".to_string(),
                Err(status) => break status.message().to_string(),
            }
        };
        let _ = engine
            .send(Input::SessionLost {
                peer,
                attempt,
                reason,
            })
            .await;
    });
    let link = OutLink {
        channel,
        tx,
        reader: reader.abort_handle(),
    };
    Ok(Input::DialOk {
        peer,
        attempt,
        remote,
        link,
    })
}
