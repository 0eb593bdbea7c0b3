//! Bounds on what a peer connection may make a daemon hold: connections that never say hello
//! (per source address, and a deadline), HTTP/2 streams per connection, message sizes and
//! peer-supplied strings. Each is refused and counted, never a crash, and the real domain
//! stays UP meanwhile.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use openimex_harness::Cluster;
use openimex_proto::peer::peer_client::PeerClient;
use openimex_proto::peer::{HelloRequest, Identity};
use tonic::transport::Endpoint;

use crate::common::{FORM, NOTICE, log_marker, say_hello, spec};
use crate::forged::{links, refused};

fn two_nodes() -> Cluster {
    let cluster = Cluster::start(spec(2)).expect("start 2 nodes");
    cluster.wait_up(0, FORM).expect("domain UP");
    cluster
}

fn peer_addr(cluster: &Cluster, i: usize) -> SocketAddr {
    let n = cluster.node(i);
    SocketAddr::new(IpAddr::V4(n.ip()), n.server_port())
}

/// Whether the server closed `s` (EOF or reset) within `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).expect("read timeout");
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            // The server's HTTP/2 preface and settings: keep reading.
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[track_caller]
fn still_up(cluster: &Cluster) {
    for i in 0..2 {
        let d = cluster.domain(i).expect("ctl -N -j answers");
        assert_eq!(d.status, "UP", "node {i}: {}", d.compact());
    }
}

#[test]
fn connections_without_a_hello_are_limited_per_source_and_closed_at_the_deadline() {
    let cluster = two_nodes();
    let target = peer_addr(&cluster, 0);
    let started = Instant::now();
    let mut idle: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(target).expect("connect"))
        .collect();
    // The ninth from the same address is closed at once.
    let mut ninth = TcpStream::connect(target).expect("connect");
    assert!(
        closed_within(&mut ninth, Duration::from_secs(5)),
        "a ninth connection without a hello from one address is refused"
    );
    still_up(&cluster);
    // The eight are closed at the hello deadline (10 s), not kept forever.
    for (k, s) in idle.iter_mut().enumerate() {
        let left = Duration::from_secs(30).saturating_sub(started.elapsed());
        assert!(closed_within(s, left), "idle connection {k} closed");
    }
    let v = links(&cluster, 0);
    assert!(
        refused(
            &v,
            0,
            "connection: too many without a hello from one address"
        ) >= 1,
        "{v}"
    );
    assert!(refused(&v, 0, "connection: no hello in time") >= 8, "{v}");
    // Once they are gone, that address may connect again.
    let mut again = TcpStream::connect(target).expect("connect");
    assert!(!closed_within(&mut again, Duration::from_millis(500)));
    still_up(&cluster);
}

#[test]
fn the_peer_port_advertises_its_http2_limits() {
    let cluster = two_nodes();
    let mut s = TcpStream::connect(peer_addr(&cluster, 0)).expect("connect");
    // Client preface, then an empty SETTINGS frame.
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut header = [0u8; 9];
    s.read_exact(&mut header).expect("the server's first frame");
    assert_eq!(header[3], 4, "the server speaks first with SETTINGS");
    let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).expect("settings payload");
    let settings: Vec<(u16, u32)> = body
        .chunks_exact(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect();
    // SETTINGS_MAX_CONCURRENT_STREAMS (0x3) and SETTINGS_MAX_HEADER_LIST_SIZE (0x6).
    assert!(settings.contains(&(3, 256)), "{settings:?}");
    assert!(settings.contains(&(6, 16 << 10)), "{settings:?}");
}

#[test]
fn oversized_hellos_are_refused_without_a_crash_or_a_log_flood() {
    let cluster = two_nodes();
    let log = cluster.node(0).log_path();
    let log_before = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let channel = rt
        .block_on(
            Endpoint::from_shared(format!("http://{}", peer_addr(&cluster, 0)))
                .unwrap()
                .local_address(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)))
                .connect(),
        )
        .expect("connect");
    let mut c = PeerClient::new(channel).max_encoding_message_size(64 << 20);
    let hello = |node_map: Vec<String>| HelloRequest {
        from: Some(Identity {
            node_id: 1,
            instance_id: 1,
            protocol_version: openimex_proto::PROTOCOL_VERSION,
            node_map,
            ..Default::default()
        }),
        to_node_id: 0,
    };
    // 5 MB in one message: over the peer request limit.
    let big = say_hello(&rt, &mut c, hello(vec!["x".repeat(1000); 5000]));
    assert!(big.is_err(), "a 5 MB hello is refused");
    // A 300 KB node-map entry, ten times: refused as malformed, never copied into the log.
    for _ in 0..10 {
        let r = say_hello(&rt, &mut c, hello(vec!["y".repeat(300_000)]));
        let status = r.expect_err("a 300 KB entry is refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    }
    // Every line the refusals logged is in the file once a later one is.
    log_marker(&cluster, 0);
    let grown = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) - log_before;
    assert!(grown < 64 << 10, "the log grew by {grown} bytes");
    still_up(&cluster);
}

/// The time of day of a log line (`[Dec 06 2026 07:26:55.589] ...`), in ms since midnight.
fn log_ms(line: &str) -> Option<u64> {
    let stamp = line.strip_prefix('[')?.split(']').next()?;
    let time = stamp.rsplit(' ').next()?;
    let (hms, ms) = time.split_once('.')?;
    let mut parts = hms.split(':').map(|p| p.parse::<u64>().ok());
    let (h, m, s) = (parts.next()??, parts.next()??, parts.next()??);
    Some(((h * 60 + m) * 60 + s) * 1000 + ms.parse::<u64>().ok()?)
}

/// Sets the soft descriptor limit of `pid` (the hard one stays, so it can be raised back).
fn set_nofile(pid: u32, n: usize) {
    let out = std::process::Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={n}:"))
        .output()
        .expect("prlimit (util-linux) runs");
    assert!(out.status.success(), "prlimit: {:?}", out);
}

#[test]
fn out_of_descriptors_the_accept_loop_waits_instead_of_spinning() {
    let cluster = two_nodes();
    let pid = cluster.node(0).pid().expect("daemon 0 runs");
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft: usize = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .expect("soft NOFILE limit");
    set_nofile(pid, open + 2);
    let target = peer_addr(&cluster, 0);
    // More connections than it has descriptors for: the rest wait in the listen backlog and
    // every accept fails with EMFILE.
    let conns: Vec<TcpStream> = (0..16)
        .filter_map(|_| TcpStream::connect(target).ok())
        .collect();
    // The daemon's own log shows its failed accepts spaced by its wait: it logs the 1st, 2nd,
    // 4th, 8th and 16th, and the 16th comes at least 15 waits of 100 ms after the 1st. A loop
    // that retried at once would log both within a millisecond (and burn a core meanwhile; what
    // an idle daemon costs in CPU is the bench's `footprint`, not a ceiling here).
    let log = cluster.node(0).log_path();
    let logged_at = |n: u32| -> Option<u64> {
        let text = std::fs::read_to_string(&log).ok()?;
        let needle = format!("cannot accept a peer connection ({n} times so far)");
        text.lines().find(|l| l.contains(&needle)).and_then(log_ms)
    };
    assert!(
        crate::common::wait_for(NOTICE, || logged_at(16).is_some()),
        "no 16th failed accept logged:\n{}",
        cluster.logs_tail(20)
    );
    let (first, sixteenth) = (
        logged_at(1).expect("the 1st"),
        logged_at(16).expect("the 16th"),
    );
    assert!(
        sixteenth.saturating_sub(first) >= 1_450,
        "16 failed accepts within {} ms: the accept loop does not wait",
        sixteenth.saturating_sub(first)
    );
    drop(conns);
    set_nofile(pid, soft);
    assert!(cluster.node(0).pid().is_some());
    still_up(&cluster);
}

/// A connection from `ip` to `target` that says nothing.
fn idle_from(ip: IpAddr, target: SocketAddr) -> TcpStream {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, bind, connect, socket};
    let (IpAddr::V4(ip), SocketAddr::V4(target)) = (ip, target) else {
        panic!("IPv4 only here");
    };
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::from(std::net::SocketAddrV4::new(ip, 0)),
    )
    .expect("bind the source address");
    connect(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::from(target),
    )
    .expect("connect");
    TcpStream::from(fd)
}

/// Strangers holding every connection the daemon allows (8 addresses x 8 idle connections,
/// none saying hello) cannot keep a node of the map out: its connection makes the oldest
/// stranger's close, and the pair forms while the other strangers still hold theirs, long
/// before their hello deadline would have freed the room. Node 0 redials only after a minute,
/// so the pair can only re-form through node 1's connection to node 0.
#[test]
fn strangers_holding_every_connection_cannot_keep_a_node_of_the_map_out() {
    let mut cluster = Cluster::prepare(
        spec(2)
            .config("OPENIMEX_RECONNECT_MIN_MS", "60000")
            .config("OPENIMEX_RECONNECT_MAX_MS", "60000"),
    )
    .expect("prepare 2 nodes");
    for i in 0..2 {
        cluster.start_node(i).expect("start");
    }
    cluster.wait_up(0, FORM).expect("domain UP");
    cluster.kill9(1).expect("kill -9 node 1");
    cluster
        .wait_links(0, FORM, "0 lost 1", |l| {
            l.link(0, 1).is_some_and(|c| c.status != "CONNECTED")
        })
        .expect("node 0 notices");
    let target = peer_addr(&cluster, 0);
    let [a, b, c, _] = cluster.node(0).ip().octets();
    // 2 nodes: 64 connections in all (`ConnLimits::for_domain`), 8 per address without a hello.
    let mut strangers: Vec<TcpStream> = (0..8u8)
        .flat_map(|k| {
            let ip = IpAddr::V4(Ipv4Addr::new(a, b, c, 200 + k));
            (0..8).map(move |_| idle_from(ip, target))
        })
        .collect();
    // The room is full: one more stranger, from a fresh address, is closed at once.
    let mut one_more = idle_from(IpAddr::V4(Ipv4Addr::new(a, b, c, 250)), target);
    assert!(
        closed_within(&mut one_more, Duration::from_secs(5)),
        "the 65th connection must be refused"
    );
    cluster.start_node(1).expect("restart node 1");
    cluster
        .wait_links(0, FORM, "0-1 connected again", |l| {
            l.link(0, 1).is_some_and(|c| c.status == "CONNECTED")
        })
        .expect("the pair re-forms through node 1's connection");
    // It formed while the strangers held the room: all but the one (or few) that made way
    // are still open, so their hello deadline did not free it.
    let open = strangers
        .iter_mut()
        .map(|s| closed_within(s, Duration::from_millis(5)))
        .filter(|closed| !closed)
        .count();
    assert!(
        open >= 56,
        "{open} of 64 strangers still open when the pair formed"
    );
    let v = links(&cluster, 0);
    assert!(
        refused(&v, 0, "connection: a stranger made way for a node") >= 1,
        "{v}"
    );
}
