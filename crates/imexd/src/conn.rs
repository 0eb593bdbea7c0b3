//! Inbound peer connections. Each accepted TCP connection gets an ID that every request on it
//! carries (so a peer's identity belongs to the connection whose hello proved it), is reported
//! to the engine, whose core node closes it if no hello is accepted in time (`HELLO_DEADLINE`,
//! core's `node/deadlines.rs`), and meets limits before that: connections in all, and
//! not-yet-greeted connections per source address. When connections in all are at the limit, a
//! connection from an address of the node map makes the oldest not-yet-greeted connection from
//! any other address close ("a stranger made way"): strangers holding sockets open cannot keep
//! the domain's own nodes out. Its end is reported to the engine. The accept loop backs off on
//! errors such as running out of descriptors instead of spinning. With TLS on (`tls`), each
//! admitted connection's handshake runs in a task of its own, stopped by the same hello
//! deadline; a failed handshake is a refusal counted under its named reason, and the
//! connection never reaches the peer service.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use openimex_core::ConnId;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tracing::{debug, warn};

use tokio_rustls::TlsAcceptor;

use crate::mailbox::{Closer, Hosts, Input};
use crate::net::Resolver;
use crate::tls::{self, Tls};

/// Limits on inbound peer connections (defaults in [`ConnLimits::for_domain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnLimits {
    /// Open connections in all.
    pub(crate) total: usize,
    /// Connections from one source address that have not said an accepted hello yet.
    pub(crate) ungreeted_per_source: usize,
}

impl ConnLimits {
    /// Room for every peer to hold a few connections (a reconnect overlaps the old one).
    pub(crate) fn for_domain(nodes: usize) -> Self {
        Self {
            total: nodes.saturating_mul(4).max(64),
            ungreeted_per_source: 8,
        }
    }
}

/// What every request on a connection knows about it.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    /// Names the connection to the engine.
    pub(crate) id: ConnId,
    /// The peer's address.
    pub(crate) remote: SocketAddr,
    /// With TLS: the certificate the peer presented (verified against the CA), whose names
    /// the hello's node must match.
    pub(crate) peer_cert: Option<Arc<rustls::pki_types::CertificateDer<'static>>>,
    greeted: Arc<AtomicBool>,
}

impl ConnInfo {
    /// The connection said an accepted hello: its deadline no longer applies.
    pub(crate) fn greeted(&self) {
        self.greeted.store(true, Ordering::Release);
    }
}

/// Counts shared between the accept loop and the connections.
#[derive(Debug, Default)]
struct Counts {
    open: usize,
    ungreeted: HashMap<IpAddr, usize>,
    /// The connections without an accepted hello yet, oldest first: who makes way when a
    /// node of the map finds the connections in all at the limit.
    waiting: std::collections::VecDeque<Waiting>,
}

/// A connection without an accepted hello, as the accept loop may close it.
#[derive(Debug)]
struct Waiting {
    id: ConnId,
    ip: IpAddr,
    greeted: Arc<AtomicBool>,
    evict: Arc<Evict>,
}

/// The accept loop's hold on a connection it may close to make way: the flag, and the waker
/// of the connection's last read (which then fails and closes it).
#[derive(Debug, Default)]
struct Evict {
    /// Set under the counts' lock, which also took the connection off the counts.
    evicted: AtomicBool,
    waker: Mutex<Option<std::task::Waker>>,
}

impl Counts {
    /// Takes a connection off the counts (it said its hello, was evicted, or is gone).
    fn forget(&mut self, id: ConnId, ip: IpAddr) {
        if let Some(n) = self.ungreeted.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.ungreeted.remove(&ip);
            }
        }
        if let Some(at) = self.waiting.iter().position(|w| w.id == id) {
            self.waiting.remove(at);
        }
    }

    /// Closes the oldest connection without a hello whose address `known` does not claim, to
    /// make way for a node of the map; false if there is none.
    fn make_way(&mut self, known: impl Fn(IpAddr) -> bool) -> Option<IpAddr> {
        let at = self
            .waiting
            .iter()
            .position(|w| !w.greeted.load(Ordering::Acquire) && !known(w.ip))?;
        let w = self.waiting.remove(at)?;
        self.forget(w.id, w.ip);
        self.open = self.open.saturating_sub(1);
        w.evict.evicted.store(true, Ordering::Release);
        if let Some(waker) = w.evict.waker.lock().ok().and_then(|mut g| g.take()) {
            waker.wake();
        }
        Some(w.ip)
    }
}

/// The bytes of a connection: plain TCP (auth off, the default) or TLS over it.
enum PeerIo {
    Plain(TcpStream),
    /// A connection of the in-process network ([`crate::net`]).
    Memory(crate::net::MemStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// Between taking the TCP stream for the handshake and putting the TLS stream back.
    Handshaking,
}

fn handshaking() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "TLS handshake not finished")
}

/// Forwards a poll to the stream inside a [`PeerIo`].
macro_rules! on_io {
    ($io:expr, $s:ident => $call:expr) => {
        match $io {
            PeerIo::Plain($s) => $call,
            PeerIo::Memory($s) => $call,
            PeerIo::Tls($s) => $call,
            PeerIo::Handshaking => Poll::Ready(Err(handshaking())),
        }
    };
}

/// An accepted connection.
pub(crate) struct PeerConn {
    io: PeerIo,
    info: ConnInfo,
    /// The engine closes it through this when the node says so (no hello in time).
    closer: Closer,
    counts: Arc<Mutex<Counts>>,
    /// Still counted as ungreeted for its source.
    counted_ungreeted: bool,
    evict: Arc<Evict>,
    engine: mpsc::Sender<Input>,
}

impl Connected for PeerConn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl PeerConn {
    /// Fails reads once the node closed the connection (its hello deadline passed without an
    /// accepted hello), which ends it.
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.info.greeted.load(Ordering::Acquire) {
            self.uncount_ungreeted();
            return Ok(());
        }
        if self.evict.evicted.load(Ordering::Acquire) {
            // The accept loop took it off the counts when it chose it.
            self.counted_ungreeted = false;
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make way for a node of the map",
            ));
        }
        if let Ok(mut w) = self.evict.waker.lock() {
            match w.as_ref() {
                Some(old) if old.will_wake(cx.waker()) => {}
                _ => *w = Some(cx.waker().clone()),
            }
        }
        if self.closer.poll_closed(cx) {
            // The node counted the refusal when it decided.
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no accepted hello within the deadline",
            ));
        }
        Ok(())
    }

    fn uncount_ungreeted(&mut self) {
        if self.counted_ungreeted {
            self.counted_ungreeted = false;
            if let Ok(mut c) = self.counts.lock()
                && !self.evict.evicted.load(Ordering::Acquire)
            {
                c.forget(self.info.id, self.info.remote.ip());
            }
        }
    }
}

impl Drop for PeerConn {
    fn drop(&mut self) {
        self.uncount_ungreeted();
        if let Ok(mut c) = self.counts.lock()
            && !self.evict.evicted.load(Ordering::Acquire)
        {
            c.open = c.open.saturating_sub(1);
        }
        let input = Input::ConnClosed { conn: self.info.id };
        if let Err(mpsc::error::TrySendError::Full(input)) = self.engine.try_send(input)
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let engine = self.engine.clone();
            rt.spawn(async move {
                let _ = engine.send(input).await;
            });
        }
    }
}

impl AsyncRead for PeerConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Err(e) = self.check_deadline(cx) {
            return Poll::Ready(Err(e));
        }
        on_io!(&mut self.io, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for PeerConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        on_io!(&mut self.io, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_io!(&mut self.io, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_io!(&mut self.io, s => Pin::new(s).poll_shutdown(cx))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        on_io!(&mut self.io, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            PeerIo::Plain(s) => s.is_write_vectored(),
            PeerIo::Memory(s) => s.is_write_vectored(),
            PeerIo::Tls(s) => s.is_write_vectored(),
            PeerIo::Handshaking => false,
        }
    }
}

/// The peer listener, registered with the runtime.
pub(crate) enum Listening {
    Tcp(TcpListener),
    Memory(crate::net::MemListener),
}

impl Listening {
    /// The next connection, and where it comes from.
    async fn accept(&mut self) -> io::Result<(PeerIo, SocketAddr)> {
        match self {
            Listening::Tcp(l) => {
                let (io, remote) = l.accept().await?;
                let _ = io.set_nodelay(true);
                Ok((PeerIo::Plain(io), remote))
            }
            Listening::Memory(l) => {
                let (io, remote) = l.accept().await?;
                Ok((PeerIo::Memory(io), remote))
            }
        }
    }
}

/// Accepts connections on `listener` within `limits`, as a stream for tonic. Refused
/// connections are closed at once and counted in the log.
pub(crate) fn incoming(
    mut listener: Listening,
    limits: ConnLimits,
    engine: mpsc::Sender<Input>,
    tls: Option<Tls>,
    hosts: Hosts,
    resolver: Resolver,
) -> ReceiverStream<io::Result<PeerConn>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let counts = Arc::new(Mutex::new(Counts::default()));
        let next = AtomicU64::new(0);
        let mut errors: u64 = 0;
        loop {
            // The peer service gone (the daemon stopped): the listener goes too, so a daemon
            // started again in the same process can bind its address.
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            let (io, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and friends: the listener stays readable, so retrying at once
                    // would spin. Wait, and say so now and then.
                    errors += 1;
                    if errors.is_power_of_two() {
                        warn!("cannot accept a peer connection ({errors} times so far): {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Only at the limit: the node map's addresses (names resolved now, as they may
            // change), to tell the domain's nodes from strangers.
            let full = counts.lock().is_ok_and(|c| c.open >= limits.total);
            let known = if full {
                node_map_addresses(&hosts, &resolver).await
            } else {
                Vec::new()
            };
            let greeted = Arc::new(AtomicBool::new(false));
            let evict = Arc::new(Evict::default());
            let id = next.fetch_add(1, Ordering::Relaxed) + 1;
            let (admitted, made_way) = {
                let Ok(mut c) = counts.lock() else { return };
                let ungreeted = c.ungreeted.get(&remote.ip()).copied().unwrap_or(0);
                let mut made_way = None;
                if c.open >= limits.total && known.contains(&remote.ip().to_canonical()) {
                    made_way = c.make_way(|ip| known.contains(&ip.to_canonical()));
                }
                let admitted = if c.open >= limits.total {
                    Err("connection: too many in all")
                } else if ungreeted >= limits.ungreeted_per_source {
                    Err("connection: too many without a hello from one address")
                } else {
                    c.open += 1;
                    *c.ungreeted.entry(remote.ip()).or_default() += 1;
                    c.waiting.push_back(Waiting {
                        id,
                        ip: remote.ip(),
                        greeted: greeted.clone(),
                        evict: evict.clone(),
                    });
                    Ok(())
                };
                (admitted, made_way)
            };
            if let Some(ip) = made_way {
                debug!("closed a connection from {ip} without a hello to make way for {remote}");
                let _ = engine.try_send(Input::Refused {
                    reason: "connection: a stranger made way for a node",
                    detail: format!(
                        "closed a connection from {ip} that had said no hello, to admit {remote} of the node map"
                    ),
                });
            }
            if let Err(reason) = admitted {
                debug!("refused a peer connection from {remote}: {reason}");
                drop(io);
                let _ = engine.try_send(Input::Refused {
                    reason,
                    detail: format!("closed a new connection from {remote}"),
                });
                continue;
            }
            // Before anything else about it reaches the engine (its hello comes later, from
            // the peer service): the node's hello deadline starts now.
            let closer = Closer::default();
            let accepted = Input::ConnAccepted {
                conn: id,
                remote,
                closer: closer.clone(),
            };
            if engine.send(accepted).await.is_err() {
                return;
            }
            let conn = PeerConn {
                io,
                info: ConnInfo {
                    id,
                    remote,
                    peer_cert: None,
                    greeted,
                },
                closer,
                counts: counts.clone(),
                counted_ungreeted: true,
                evict,
                engine: engine.clone(),
            };
            if let Some(tls) = &tls {
                // Off the accept loop: a slow or silent client must not hold up the others.
                tokio::spawn(handshake(conn, tls.sides().acceptor, tx.clone()));
                continue;
            }
            if tx.send(Ok(conn)).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Runs the TLS handshake of `conn` until the node closes it (its hello deadline), then hands
/// it to the peer service; a failed handshake is counted under its named reason and the
/// connection closed.
async fn handshake(
    mut conn: PeerConn,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<io::Result<PeerConn>>,
) {
    let PeerIo::Plain(tcp) = std::mem::replace(&mut conn.io, PeerIo::Handshaking) else {
        return;
    };
    let remote = conn.info.remote;
    let closer = conn.closer.clone();
    let result = tokio::select! {
        r = acceptor.accept(tcp) => r,
        // No handshake in time: the node counted the refusal when it closed the connection.
        () = closer.closed() => return,
    };
    let (reason, detail) = match result {
        Ok(stream) => {
            conn.info.peer_cert = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first())
                .map(|c| Arc::new(c.clone().into_owned()));
            conn.io = PeerIo::Tls(Box::new(stream));
            let _ = tx.send(Ok(conn)).await;
            return;
        }
        Err(e) => (
            tls::refusal(tls::Side::Accepting, tls::find_rustls(&e)),
            format!("closed a connection from {remote}: TLS handshake failed: {e}"),
        ),
    };
    let _ = conn.engine.try_send(Input::Refused { reason, detail });
}

/// The node map's addresses, canonical: entries that are addresses as they are, names
/// resolved now (a name that does not resolve claims nothing).
async fn node_map_addresses(hosts: &Hosts, resolver: &Resolver) -> Vec<IpAddr> {
    let entries: Vec<String> = hosts.borrow().iter().cloned().collect();
    crate::nodes_file::resolve_all(&entries, resolver)
        .await
        .into_iter()
        .flatten()
        .collect()
}
