//! A minimal HTTP/1.1 server for `GET /metrics`: one request per connection, then close.
//! Requests are bounded in size ([`MAX_REQUEST`]) and time ([`REQUEST_TIMEOUT`]), and
//! connections in number ([`MAX_CONNECTIONS`]; more wait in the kernel's backlog).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tracing::debug;

use super::Events;
use crate::mailbox::{Hosts, Input, PeersSnapshot, Stopping, ask};
use openimex_core::NodeId;

/// The largest request head read; a longer one is answered 431 and closed.
pub(crate) const MAX_REQUEST: usize = 8 * 1024;
/// How long a connection has to send its request and take the answer.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once.
pub(crate) const MAX_CONNECTIONS: usize = 16;

/// OpenMetrics' content type.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `GET /metrics` on `listener` until the task is aborted.
pub(crate) async fn serve(
    listener: TcpListener,
    engine: mpsc::Sender<Input>,
    hosts: Hosts,
    events: Events,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                debug!("metrics listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (engine, hosts, events) = (engine.clone(), hosts.clone(), events.clone());
        tokio::spawn(async move {
            let serve = one(stream, &engine, &hosts, &events);
            if tokio::time::timeout(REQUEST_TIMEOUT, serve).await.is_err() {
                debug!("metrics request timed out after {REQUEST_TIMEOUT:?}");
            }
            drop(permit);
        });
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `GET /metrics`.
    Metrics,
    /// Another path.
    NotFound,
    /// Another method.
    NotAllowed,
    /// Not an HTTP request line.
    Bad,
}

/// Routes a request by its head (the bytes up to the blank line).
pub(crate) fn route(head: &[u8]) -> Route {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (Some(method), Some(target), Some(version)) = (words.next(), words.next(), words.next())
    else {
        return Route::Bad;
    };
    if !version.starts_with("HTTP/1.") {
        return Route::Bad;
    }
    if method != "GET" {
        return Route::NotAllowed;
    }
    let path = target.split('?').next().unwrap_or_default();
    match path {
        "/metrics" => Route::Metrics,
        _ => Route::NotFound,
    }
}

/// The engine's view of the peers, the heartbeat round trip of each connected peer whose
/// heartbeats this node sends, and the node's GPUs on the fabric.
async fn gather(engine: &mpsc::Sender<Input>) -> Result<Gathered, Stopping> {
    let snap = ask(engine, |reply| Input::Peers { reply }).await?;
    let mine = ask(engine, |reply| Input::Snapshot { reply }).await?;
    let rtts = mine
        .peers
        .iter()
        .filter_map(|(peer, session)| Some((*peer, session.heartbeat_rtt()?)))
        .collect();
    Ok((snap, rtts, mine.fabric))
}

type Gathered = (
    PeersSnapshot,
    Vec<(NodeId, Duration)>,
    Vec<openimex_core::GpuFabric>,
);

async fn one(
    mut stream: TcpStream,
    engine: &mpsc::Sender<Input>,
    hosts: &Hosts,
    events: &Events,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let complete = loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            break true;
        }
        if head.len() >= MAX_REQUEST {
            break false;
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    };
    let (status, kind, body) = if !complete {
        let body = format!("request head over {MAX_REQUEST} bytes\n");
        ("431 Request Header Fields Too Large", "text/plain", body)
    } else {
        match route(&head) {
            Route::Metrics => match gather(engine).await {
                Ok((snap, rtts, gpus)) => {
                    let hosts = Arc::clone(&hosts.borrow());
                    let text = events.render(&snap, &rtts, &hosts, &gpus);
                    ("200 OK", CONTENT_TYPE, text)
                }
                Err(_) => (
                    "503 Service Unavailable",
                    "text/plain",
                    "the daemon is stopping\n".to_string(),
                ),
            },
            Route::NotFound => (
                "404 Not Found",
                "text/plain",
                "not found: metrics are at /metrics\n".to_string(),
            ),
            Route::NotAllowed => (
                "405 Method Not Allowed",
                "text/plain",
                "only GET is served\n".to_string(),
            ),
            Route::Bad => (
                "400 Bad Request",
                "text/plain",
                "expected an HTTP/1.x request line\n".to_string(),
            ),
        }
    };
    let allow = if status.starts_with("405") {
        "Allow: GET\r\n"
    } else {
        ""
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
