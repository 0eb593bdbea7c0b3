//! A controllable TCP proxy between two daemons, for partitions: it listens on a loopback
//! address, forwards to the real daemon, and binds its outbound socket to a chosen address (the
//! one the target's hosts file maps to the source node's name, in names mode), so each side
//! sees the other under its usual name. [`Proxy::block`] stops forwarding bytes in both
//! directions and leaves every connection open and silent, like a pulled cable (new
//! connections are accepted and held); [`Proxy::heal`] lets the held bytes through again.
//!
//! Threads: one acceptor per proxy and two pumps per connection, all polling a stop flag with
//! short timeouts, so dropping the proxy ends them and closes every socket within ~100 ms.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use nix::sys::socket::{
    SockFlag, SockType, SockaddrIn, bind, connect, setsockopt, socket, sockopt,
};

use crate::HarnessError;

/// How often blocked or idle threads look at the flags.
const POLL: Duration = Duration::from_millis(20);
/// Bound on connecting to the target.
const CONNECT: Duration = Duration::from_secs(3);

/// The flags every thread of a proxy watches.
#[derive(Debug, Default)]
struct Flags {
    blocked: AtomicBool,
    stop: AtomicBool,
    /// Bytes forwarded (both directions), for tests.
    bytes: AtomicU64,
}

impl Flags {
    /// Waits while blocked; false once the proxy stops.
    fn wait_open(&self) -> bool {
        while self.blocked.load(Ordering::SeqCst) {
            if self.stop.load(Ordering::SeqCst) {
                return false;
            }
            thread::sleep(POLL);
        }
        !self.stop.load(Ordering::SeqCst)
    }
}

/// One direction of one link: `listen` → `target`, outbound from `source`.
#[derive(Debug)]
pub struct Proxy {
    listen: SocketAddr,
    flags: Arc<Flags>,
}

impl Proxy {
    /// Listens on `listen` (bound now, so a connection never finds it absent) and forwards
    /// each accepted connection to `target` from `source` (port chosen by the kernel).
    pub fn start(
        listen: SocketAddrV4,
        target: SocketAddrV4,
        source: Ipv4Addr,
    ) -> Result<Self, HarnessError> {
        let listener = TcpListener::bind(listen).map_err(|e| HarnessError::Io {
            action: "bind the proxy listener",
            path: listen.to_string().into(),
            source: e,
            hint: "pick a spare address of the cluster's block (Cluster::spare_ip)",
        })?;
        let io = |e| HarnessError::Io {
            action: "set up the proxy listener",
            path: listen.to_string().into(),
            source: e,
            hint: "nothing to do: retry",
        };
        listener.set_nonblocking(true).map_err(io)?;
        let flags = Arc::new(Flags::default());
        let f = flags.clone();
        thread::spawn(move || accept_loop(&listener, target, source, &f));
        Ok(Self {
            listen: SocketAddr::V4(listen),
            flags,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// Stops forwarding: connections stay open and silent; new ones are accepted and held.
    pub fn block(&self) {
        self.flags.blocked.store(true, Ordering::SeqCst);
    }

    /// Forwards again, held bytes and connections included.
    pub fn heal(&self) {
        self.flags.blocked.store(false, Ordering::SeqCst);
    }

    /// Whether it is blocked.
    pub fn is_blocked(&self) -> bool {
        self.flags.blocked.load(Ordering::SeqCst)
    }

    /// Bytes forwarded so far.
    pub fn bytes(&self) -> u64 {
        self.flags.bytes.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.flags.stop.store(true, Ordering::SeqCst);
    }
}

fn accept_loop(listener: &TcpListener, target: SocketAddrV4, source: Ipv4Addr, f: &Arc<Flags>) {
    while !f.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((inbound, _)) => {
                let f = f.clone();
                thread::spawn(move || {
                    // A connection made while blocked waits here, as a SYN would go unanswered
                    // behind a pulled cable (the kernel already completed the handshake).
                    if !f.wait_open() {
                        return;
                    }
                    if let Ok(outbound) = connect_from(source, target) {
                        link(inbound, outbound, &f);
                    }
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(POLL),
            Err(_) => thread::sleep(POLL),
        }
    }
}

/// Connects to `target` from `source` (any port).
fn connect_from(source: Ipv4Addr, target: SocketAddrV4) -> std::io::Result<TcpStream> {
    let fd = socket(
        nix::sys::socket::AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::from(SocketAddrV4::new(source, 0)),
    )?;
    // A blocking connect on loopback ends at once (accepted or refused).
    connect(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::from(target),
    )?;
    let stream = TcpStream::from(fd);
    stream.set_write_timeout(Some(CONNECT))?;
    Ok(stream)
}

/// Pumps both directions until either side closes or the proxy stops.
fn link(a: TcpStream, b: TcpStream, f: &Arc<Flags>) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let f2 = f.clone();
    let back = thread::spawn(move || pump(b2, a2, &f2));
    pump(a, b, f);
    let _ = back.join();
}

/// Copies `from` → `to`, holding bytes while blocked; on the end of either, shuts both down.
fn pump(mut from: TcpStream, mut to: TcpStream, f: &Flags) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if !f.wait_open() {
            break;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        // Bytes read just before a block are held too.
        if !f.wait_open() {
            break;
        }
        // Counted before the write: the receiver may read them before this thread runs again.
        f.bytes.fetch_add(n as u64, Ordering::SeqCst);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn forwards_holds_while_blocked_and_heals() {
        let block = crate::AddrBlock::allocate(3, &[0]).expect("addresses");
        let (server_ip, proxy_ip, source_ip) = (block.ip(0), block.ip(1), block.ip(2));
        let server = TcpListener::bind((server_ip, 0)).expect("server");
        let target = match server.local_addr().expect("addr") {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => unreachable!("bound on IPv4"),
        };
        let proxy = Proxy::start(
            SocketAddrV4::new(proxy_ip, target.port()),
            target,
            source_ip,
        )
        .expect("proxy");
        let mut client = TcpStream::connect(proxy.addr()).expect("connect");
        let (mut conn, peer) = server.accept().expect("accept");
        assert_eq!(
            peer.ip(),
            std::net::IpAddr::V4(source_ip),
            "seen from the source address"
        );
        client.write_all(b"ping").expect("write");
        let mut got = [0u8; 4];
        conn.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"ping");

        proxy.block();
        client.write_all(b"held").expect("write while blocked");
        conn.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        let start = Instant::now();
        assert!(conn.read(&mut got).is_err(), "nothing passes while blocked");
        assert!(start.elapsed() >= Duration::from_millis(250));

        proxy.heal();
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        conn.read_exact(&mut got).expect("the held bytes arrive");
        assert_eq!(&got, b"held");
        assert!(proxy.bytes() >= 8);
    }
}
