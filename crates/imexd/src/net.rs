//! An in-process network, so that whole daemons run together in one process under tokio's
//! paused clock (the in-process test layer, `crates/imexd/tests/inproc`).
//!
//! Why not loopback TCP: with the clock paused, tokio moves time forward to the next timer as
//! soon as no task can run, and a task waiting for the kernel to deliver bytes cannot run — so
//! a connect or a reply still in flight would see every deadline pass at once. Here a
//! connection is a pair of in-memory pipes ([`tokio::io::duplex`]): bytes written are readable
//! at once and wake the reading task inside the runtime, so time only moves when every daemon
//! really waits for a timer, and a test's 10 s deadline takes microseconds and fires exactly at
//! 10 s of virtual time.
//!
//! Addresses are ordinary socket addresses (the nodes file's entries, any port); a listener
//! is registered under its address until dropped, a connect to an address with no listener is
//! refused at once, as TCP's would be, and a link between two hosts can be cut and healed:
//! while cut, connects between them are refused and the bytes of connections already open
//! between them are held back (a partition, not a reset: neither side sees an error). One
//! direction of a link can be cut alone ([`MemNet::cut_from`]): the bytes one host sends the
//! other are held while the other way flows (a peer that receives but whose answers do not
//! arrive).
//!
//! One connection can be stalled too, while the others between the same hosts flow
//! ([`MemNet::connections`], [`MemNet::stall`], [`MemNet::release`]): what one end sends on it
//! is written, as into a socket's buffer, but not delivered until it is released (packets of
//! one connection held up in the network). So a pair of daemons can move to another
//! connection while the old one still owes them something, or get the answer to a dial late.
//! [`MemNet::stall_new`] stalls the connections opened from then on as they open, before
//! their first byte arrives.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::transport::{Channel, Endpoint};

/// Bytes one direction of a connection buffers before the writer waits (as a socket buffer).
const PIPE_BYTES: usize = 256 << 10;

/// An in-process network: listeners by address, and the links that are cut. Cheap to clone
/// (shared).
#[derive(Clone, Default)]
pub struct MemNet {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Names and their addresses, as a host's `/etc/hosts` would list them.
    names: Mutex<HashMap<String, Vec<IpAddr>>>,
    listeners: Mutex<HashMap<SocketAddr, mpsc::UnboundedSender<(MemStream, SocketAddr)>>>,
    links: Mutex<Links>,
    conns: Mutex<Conns>,
    next_port: AtomicU16,
}

/// The connections with an end still alive, and which new ones open stalled.
#[derive(Default)]
struct Conns {
    next: u64,
    live: BTreeMap<u64, Arc<Conn>>,
    /// Every connection made, by the port dialled ([`MemNet::connections_made`]).
    made: HashMap<u16, usize>,
    /// Directions (from, to) whose new connections open stalled ([`MemNet::stall_new`]).
    stall_new: HashSet<(IpAddr, IpAddr)>,
}

/// One connection of a [`MemNet`], as [`MemNet::connections`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemConn {
    /// Its number on the network (connections are numbered in the order they were made).
    pub id: u64,
    /// The dialling end: its host and source port.
    pub dialler: SocketAddr,
    /// The address it was dialled to (the listener's).
    pub listener: SocketAddr,
}

/// A connection's state shared by its two ends.
struct Conn {
    info: MemConn,
    state: Mutex<ConnState>,
}

#[derive(Default)]
struct ConnState {
    /// What the dialling end (`[0]`) or the listening end (`[1]`) sends is held undelivered.
    stalled: [bool; 2],
    /// Readers waiting for a release.
    waiting: Vec<Waker>,
    /// Ends not dropped yet.
    ends: u8,
}

impl Conn {
    /// Whether what end `from` (0: the dialler) sends is held; if so, `cx` is woken at the
    /// release.
    fn held(&self, from: usize, cx: &mut Context<'_>) -> bool {
        let mut state = lock(&self.state);
        if !state.stalled[from] {
            return false;
        }
        if !state.waiting.iter().any(|w| w.will_wake(cx.waker())) {
            state.waiting.push(cx.waker().clone());
        }
        true
    }
}

/// The cut links, and who waits for one to heal.
#[derive(Default)]
struct Links {
    cut: HashSet<(IpAddr, IpAddr)>,
    /// Directions cut alone: (from, to).
    one_way: HashSet<(IpAddr, IpAddr)>,
    waiting: Vec<Waker>,
}

/// The pair of hosts of a link, in a fixed order.
fn link(a: IpAddr, b: IpAddr) -> (IpAddr, IpAddr) {
    if a <= b { (a, b) } else { (b, a) }
}

/// A lock whose holder panicked still guards a consistent map: go on with it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl std::fmt::Debug for MemNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let listeners = lock(&self.inner.listeners).len();
        f.debug_struct("MemNet")
            .field("listeners", &listeners)
            .finish()
    }
}

impl MemNet {
    /// An empty network.
    pub fn new() -> Self {
        Self::default()
    }

    /// Listens on `addr`; fails with `AddrInUse` while another listener holds it.
    pub fn bind(&self, addr: SocketAddr) -> io::Result<MemListener> {
        let mut listeners = lock(&self.inner.listeners);
        if listeners.get(&addr).is_some_and(|tx| !tx.is_closed()) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{addr} is in use on this in-process network"),
            ));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        listeners.insert(addr, tx);
        Ok(MemListener {
            addr,
            rx,
            net: self.clone(),
        })
    }

    /// Connects from host `from` to `to`: refused when nothing listens there or the link is
    /// cut, else the dialling end of a new connection (the listener gets the other).
    pub fn connect(&self, from: IpAddr, to: SocketAddr) -> io::Result<MemStream> {
        let refused = |why: &str| {
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("connection from {from} to {to} refused: {why}"),
            )
        };
        if lock(&self.inner.links).cut.contains(&link(from, to.ip())) {
            return Err(refused("the link is cut"));
        }
        let port = 40_000 + self.inner.next_port.fetch_add(1, Ordering::Relaxed) % 20_000;
        let source = SocketAddr::new(from, port);
        let (near, far) = tokio::io::duplex(PIPE_BYTES);
        let listeners = lock(&self.inner.listeners);
        let Some(tx) = listeners.get(&to) else {
            return Err(refused("nothing listens there"));
        };
        let conn = {
            let mut conns = lock(&self.inner.conns);
            conns.next += 1;
            let id = conns.next;
            let stalled = [
                conns.stall_new.contains(&(from, to.ip())),
                conns.stall_new.contains(&(to.ip(), from)),
            ];
            let conn = Arc::new(Conn {
                info: MemConn {
                    id,
                    dialler: source,
                    listener: to,
                },
                state: Mutex::new(ConnState {
                    stalled,
                    waiting: Vec::new(),
                    ends: 2,
                }),
            });
            conns.live.insert(id, Arc::clone(&conn));
            *conns.made.entry(to.port()).or_default() += 1;
            conn
        };
        let end = |pipe, local, remote, dialling| MemStream {
            pipe,
            net: self.clone(),
            local,
            remote,
            conn: Arc::clone(&conn),
            dialling,
        };
        // Both ends made before the send: if it fails, dropping them forgets the connection.
        let (dialled, accepted) = (
            end(near, from, to.ip(), true),
            end(far, to.ip(), from, false),
        );
        tx.send((accepted, source))
            .map_err(|_| refused("the listener is closed"))?;
        Ok(dialled)
    }

    /// A gRPC channel from host `from` to the server at `to`, connected at once (refused
    /// connects fail it as TCP's would).
    pub async fn channel(
        &self,
        from: IpAddr,
        to: SocketAddr,
    ) -> Result<Channel, tonic::transport::Error> {
        let net = self.clone();
        // The URI only names the peer for HTTP/2; the connector decides where bytes go.
        let endpoint = Endpoint::from_shared(format!("http://{to}"))
            .unwrap_or_else(|_| Endpoint::from_static("http://in-process"));
        endpoint
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let connected = net.connect(from, to);
                async move { connected.map(hyper_util::rt::TokioIo::new) }
            }))
            .await
    }

    /// Makes `name` resolve to `addrs` on this network (none: it does not resolve).
    pub fn set_name(&self, name: &str, addrs: &[IpAddr]) {
        lock(&self.inner.names).insert(name.to_owned(), addrs.to_vec());
    }

    /// Cuts the link between hosts `a` and `b` (both directions) until [`MemNet::heal`].
    pub fn cut(&self, a: IpAddr, b: IpAddr) {
        lock(&self.inner.links).cut.insert(link(a, b));
    }

    /// Cuts one direction of the link: what `from` sends `to` on connections already open is
    /// held back (new connections between them are still made) until [`MemNet::heal`].
    pub fn cut_from(&self, from: IpAddr, to: IpAddr) {
        lock(&self.inner.links).one_way.insert((from, to));
    }

    /// Heals the link between `a` and `b` (both directions, however cut): held bytes flow
    /// again, and new connections between them no longer open stalled ([`MemNet::stall_new`]).
    /// A connection stalled on its own stays stalled until [`MemNet::release`] names it.
    pub fn heal(&self, a: IpAddr, b: IpAddr) {
        {
            let mut conns = lock(&self.inner.conns);
            conns.stall_new.remove(&(a, b));
            conns.stall_new.remove(&(b, a));
        }
        let waiting = {
            let mut links = lock(&self.inner.links);
            links.cut.remove(&link(a, b));
            links.one_way.remove(&(a, b));
            links.one_way.remove(&(b, a));
            std::mem::take(&mut links.waiting)
        };
        for w in waiting {
            w.wake();
        }
    }

    /// How many connections were made to `port` (on any host) since the network was made,
    /// closed ones too.
    pub fn connections_made(&self, port: u16) -> usize {
        lock(&self.inner.conns)
            .made
            .get(&port)
            .copied()
            .unwrap_or(0)
    }

    /// The connections open between hosts `a` and `b` (either one dialling), oldest first. A
    /// connection is open until one of its ends is dropped.
    pub fn connections(&self, a: IpAddr, b: IpAddr) -> Vec<MemConn> {
        let conns = lock(&self.inner.conns);
        (conns.live.values())
            .filter(|c| lock(&c.state).ends == 2)
            .map(|c| c.info)
            .filter(|c| link(c.dialler.ip(), c.listener.ip()) == link(a, b))
            .collect()
    }

    /// Stalls connection `conn` one way: what host `from` (one of its ends) sends on it is
    /// written, as into a socket's buffer, but not delivered (not even its end) until
    /// [`MemNet::release`]. The other connections between the same hosts are not touched.
    pub fn stall(&self, conn: MemConn, from: IpAddr) {
        if let Some(c) = lock(&self.inner.conns).live.get(&conn.id) {
            let mut state = lock(&c.state);
            state.stalled[0] |= conn.dialler.ip() == from;
            state.stalled[1] |= conn.listener.ip() == from;
        }
    }

    /// Every connection opened between `from` and `to` from now on (either one dialling)
    /// opens stalled, as [`MemNet::stall`] with `from` would leave it, so not one byte of what
    /// `from` sends on it arrives until it is released. Ended by [`MemNet::heal`].
    pub fn stall_new(&self, from: IpAddr, to: IpAddr) {
        lock(&self.inner.conns).stall_new.insert((from, to));
    }

    /// Releases connection `conn`, both ways: what was held on it is delivered, and what is
    /// sent after flows.
    pub fn release(&self, conn: MemConn) {
        let waiting = match lock(&self.inner.conns).live.get(&conn.id) {
            Some(c) => {
                let mut state = lock(&c.state);
                state.stalled = [false; 2];
                std::mem::take(&mut state.waiting)
            }
            None => Vec::new(),
        };
        for w in waiting {
            w.wake();
        }
    }

    /// Whether bytes from `from` to `to` are held; if so, `cx` is woken when a link heals.
    fn held(&self, from: IpAddr, to: IpAddr, cx: &mut Context<'_>) -> bool {
        let mut links = lock(&self.inner.links);
        if links.cut.contains(&link(from, to)) || links.one_way.contains(&(from, to)) {
            links.waiting.push(cx.waker().clone());
            true
        } else {
            false
        }
    }
}

/// How a daemon turns the nodes file's names into addresses: the system's resolver, or the
/// names of its in-process network ([`MemNet::set_name`]). An entry that is an address is its
/// own address either way.
#[derive(Clone, Debug, Default)]
pub enum Resolver {
    /// getaddrinfo(3), as every host resolves.
    #[default]
    System,
    /// The in-process network's names.
    Memory(MemNet),
}

impl Resolver {
    /// `host`'s addresses, canonical, sorted and without duplicates (empty if it does not
    /// resolve).
    pub(crate) async fn lookup(&self, host: &str) -> Vec<IpAddr> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return vec![ip.to_canonical()];
        }
        let found: std::collections::BTreeSet<IpAddr> = match self {
            Resolver::System => match tokio::net::lookup_host((host, 0)).await {
                Ok(found) => found.map(|a| a.ip().to_canonical()).collect(),
                Err(_) => return Vec::new(),
            },
            Resolver::Memory(net) => lock(&net.inner.names)
                .get(host)
                .into_iter()
                .flatten()
                .map(|ip| ip.to_canonical())
                .collect(),
        };
        found.into_iter().collect()
    }
}

/// A listener of a [`MemNet`]: its address stays taken until it is dropped.
pub struct MemListener {
    addr: SocketAddr,
    rx: mpsc::UnboundedReceiver<(MemStream, SocketAddr)>,
    net: MemNet,
}

impl std::fmt::Debug for MemListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemListener")
            .field("addr", &self.addr)
            .finish()
    }
}

impl MemListener {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next connection, and its source address.
    pub async fn accept(&mut self) -> io::Result<(MemStream, SocketAddr)> {
        self.rx.recv().await.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                "the in-process network is gone",
            )
        })
    }

    /// Its connections as a stream, for a gRPC server; the address stays taken while the
    /// stream lives.
    pub fn incoming(mut self) -> impl Stream<Item = io::Result<MemStream>> + Send + 'static {
        let (_, closed) = mpsc::unbounded_channel();
        let rx = std::mem::replace(&mut self.rx, closed);
        tokio_stream::StreamExt::map(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            |(stream, _)| Ok(stream),
        )
    }
}

impl Drop for MemListener {
    fn drop(&mut self) {
        // Closed, its sender is the registered one that is closed: a later bind replaces only
        // a closed sender, so no other listener's registration is removed here.
        self.rx.close();
        let mut listeners = lock(&self.net.inner.listeners);
        if listeners.get(&self.addr).is_some_and(|tx| tx.is_closed()) {
            listeners.remove(&self.addr);
        }
    }
}

/// One end of a connection of a [`MemNet`]: reads and writes wait while its link is cut, and
/// reads wait while the other end's sends are stalled ([`MemNet::stall`]).
pub struct MemStream {
    pipe: DuplexStream,
    net: MemNet,
    local: IpAddr,
    remote: IpAddr,
    conn: Arc<Conn>,
    /// The dialling end (else the listener's).
    dialling: bool,
}

impl Drop for MemStream {
    fn drop(&mut self) {
        let mut conns = lock(&self.net.inner.conns);
        let mut state = lock(&self.conn.state);
        state.ends = state.ends.saturating_sub(1);
        if state.ends == 0 {
            conns.live.remove(&self.conn.info.id);
        }
    }
}

impl tonic::transport::server::Connected for MemStream {
    type ConnectInfo = IpAddr;

    /// The host at the other end.
    fn connect_info(&self) -> IpAddr {
        self.remote
    }
}

impl std::fmt::Debug for MemStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemStream")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish()
    }
}

impl AsyncRead for MemStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.net.held(this.remote, this.local, cx) {
            return Poll::Pending;
        }
        // What the other end sent: the dialler's if this is the listener's end.
        if this.conn.held(usize::from(this.dialling), cx) {
            return Poll::Pending;
        }
        Pin::new(&mut this.pipe).poll_read(cx, buf)
    }
}

impl AsyncWrite for MemStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.net.held(this.local, this.remote, cx) {
            return Poll::Pending;
        }
        Pin::new(&mut this.pipe).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().pipe).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().pipe).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("an address")
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_carries_bytes_both_ways_and_a_cut_holds_them() {
        let net = MemNet::new();
        let mut listener = net.bind(addr("10.0.0.1:50000")).expect("bind");
        assert_eq!(
            net.bind(addr("10.0.0.1:50000")).expect_err("taken").kind(),
            io::ErrorKind::AddrInUse
        );
        let b = "10.0.0.2".parse().expect("ip");
        let mut dialled = net.connect(b, addr("10.0.0.1:50000")).expect("connect");
        let (mut accepted, from) = listener.accept().await.expect("accept");
        assert_eq!(from.ip(), b);
        dialled.write_all(b"hello").await.expect("write");
        let mut got = [0u8; 5];
        accepted.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"hello");

        net.cut(b, listener.local_addr().ip());
        let refused = net.connect(b, addr("10.0.0.1:50000")).expect_err("cut");
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        let t0 = tokio::time::Instant::now();
        let held = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            accepted.write_all(b"x").await.expect("write");
            dialled.read_exact(&mut got[..1]).await.expect("read")
        })
        .await;
        assert!(held.is_err(), "bytes crossed a cut link");
        assert_eq!(
            t0.elapsed(),
            std::time::Duration::from_secs(5),
            "virtual time"
        );
        net.heal(b, listener.local_addr().ip());
        accepted
            .write_all(b"y")
            .await
            .expect("write after the heal");
        dialled
            .read_exact(&mut got[..1])
            .await
            .expect("read after the heal");
    }

    #[tokio::test(start_paused = true)]
    async fn a_one_way_cut_holds_one_direction_and_lets_the_other_flow() {
        let net = MemNet::new();
        let mut listener = net.bind(addr("10.0.0.1:50000")).expect("bind");
        let (a, b) = (
            "10.0.0.1".parse().expect("ip"),
            "10.0.0.2".parse().expect("ip"),
        );
        let mut dialled = net.connect(b, addr("10.0.0.1:50000")).expect("connect");
        let (mut accepted, _) = listener.accept().await.expect("accept");
        net.cut_from(a, b);
        let mut got = [0u8; 1];
        // b to a flows.
        dialled.write_all(b"q").await.expect("write");
        accepted.read_exact(&mut got).await.expect("read");
        // a to b is held, in virtual time, until the heal.
        let held = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            accepted.write_all(b"r").await.expect("write");
            dialled.read_exact(&mut got).await.expect("read")
        })
        .await;
        assert!(held.is_err(), "bytes crossed the cut direction");
        net.heal(a, b);
        let healed = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            accepted
                .write_all(b"s")
                .await
                .expect("write after the heal");
            dialled
                .read_exact(&mut got)
                .await
                .expect("read after the heal")
        })
        .await;
        assert!(healed.is_ok(), "the heal let a's bytes through");
        assert_eq!(&got, b"s");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_connection_holds_what_one_end_sends_while_the_others_flow() {
        let net = MemNet::new();
        let mut listener = net.bind(addr("10.0.0.1:50000")).expect("bind");
        let (a, b) = (
            "10.0.0.1".parse().expect("ip"),
            "10.0.0.2".parse().expect("ip"),
        );
        let mut stalled = net.connect(b, addr("10.0.0.1:50000")).expect("connect");
        let (mut far, _) = listener.accept().await.expect("accept");
        let mut other = net.connect(b, addr("10.0.0.1:50000")).expect("connect");
        let (mut other_far, _) = listener.accept().await.expect("accept");
        let conns = net.connections(a, b);
        assert_eq!(conns.len(), 2, "{conns:?}");
        assert_eq!(
            (conns[0].dialler.ip(), conns[0].listener),
            (b, listener.local_addr())
        );
        net.stall(conns[0], b);
        let mut got = [0u8; 1];
        // Written, as into a socket's buffer, but not delivered.
        stalled.write_all(b"x").await.expect("write");
        let held = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            far.read_exact(&mut got).await.expect("read")
        })
        .await;
        assert!(held.is_err(), "bytes crossed the stalled connection");
        // The other way on it, and the other connection, flow.
        far.write_all(b"y").await.expect("write");
        stalled.read_exact(&mut got).await.expect("read");
        other.write_all(b"z").await.expect("write");
        other_far.read_exact(&mut got).await.expect("read");
        net.release(conns[0]);
        far.read_exact(&mut got)
            .await
            .expect("read after the release");
        assert_eq!(&got, b"x");
        // Closed when an end is dropped.
        drop(other);
        assert_eq!(net.connections(a, b), vec![conns[0]]);
    }

    #[tokio::test(start_paused = true)]
    async fn new_connections_open_stalled_until_released_and_a_heal_ends_that() {
        let net = MemNet::new();
        let mut listener = net.bind(addr("10.0.0.1:50000")).expect("bind");
        let (a, b) = (
            "10.0.0.1".parse().expect("ip"),
            "10.0.0.2".parse().expect("ip"),
        );
        net.stall_new(a, b);
        let mut dialled = net.connect(b, addr("10.0.0.1:50000")).expect("connect");
        let (mut accepted, _) = listener.accept().await.expect("accept");
        let mut got = [0u8; 1];
        // From its first byte, what a sends is held; b's flows.
        dialled.write_all(b"q").await.expect("write");
        accepted.read_exact(&mut got).await.expect("read");
        accepted.write_all(b"r").await.expect("write");
        net.heal(a, b);
        let held = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            dialled.read_exact(&mut got).await.expect("read")
        })
        .await;
        assert!(
            held.is_err(),
            "a heal released a connection stalled on its own"
        );
        let conn = net.connections(a, b)[0];
        net.release(conn);
        dialled
            .read_exact(&mut got)
            .await
            .expect("read after the release");
        assert_eq!(&got, b"r");
        // After the heal, new connections open flowing.
        let mut later = net.connect(b, addr("10.0.0.1:50000")).expect("connect");
        let (mut later_far, _) = listener.accept().await.expect("accept");
        later_far.write_all(b"s").await.expect("write");
        later.read_exact(&mut got).await.expect("read");
    }

    #[tokio::test]
    async fn nothing_listening_is_refused_and_a_dropped_listener_frees_its_address() {
        let net = MemNet::new();
        let a = addr("10.0.0.1:50000");
        let from = "10.0.0.2".parse().expect("ip");
        assert_eq!(
            net.connect(from, a).expect_err("nobody").kind(),
            io::ErrorKind::ConnectionRefused
        );
        let listener = net.bind(a).expect("bind");
        drop(listener);
        assert!(net.connect(from, a).is_err(), "refused once it is gone");
        net.bind(a).expect("the address is free again");
    }
}
