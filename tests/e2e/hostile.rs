//! Issue 10, item 5: a hostile peer does not stop a healthy domain from serving imports. While
//! node 1 and node 2 import node 0's memory again and again (every import counted and
//! verified), hostile tasks hammer node 0's peer port from one address: floods of connections
//! that never say hello, random bytes, HTTP/2 frames far over the frame size, and gRPC
//! messages over the peer request limit. Every import must succeed, the daemon must stay up,
//! the flood must be refused and counted, the log must not fill up with it, and nothing may
//! stay held afterwards.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use openimex_harness::Cluster;
use openimex_proto::peer::peer_client::PeerClient;
use openimex_proto::peer::{HelloRequest, Identity};
use tonic::transport::Endpoint;

use crate::apps::*;
use crate::common::{NOTICE, run, say_hello, text};
use crate::forged::{links, refused};

/// Imports each of node 1 and node 2 must complete under attack.
const IMPORTS_EACH: u64 = 8;
/// Hang guard for the whole attack.
const ATTACK_LIMIT: Duration = Duration::from_secs(180);
/// Connections the flood opens at once (the daemon keeps 8 without a hello per address).
const FLOOD: usize = 48;

/// What the hostile tasks did, by kind.
#[derive(Default)]
struct Rounds {
    flood: AtomicU64,
    garbage: AtomicU64,
    oversized_frames: AtomicU64,
    oversized_messages: AtomicU64,
}

/// xorshift64*: random bytes without a dependency.
fn noise(seed: &mut u64, buf: &mut [u8]) {
    for b in buf {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *b = (seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8;
    }
}

/// Connections of one attack, each attack from its own address (so that the per-address bound
/// on connections without a hello, which the flood hits, does not stop the others at the door).
struct Source {
    rt: tokio::runtime::Runtime,
    ip: IpAddr,
    target: SocketAddr,
}

impl Source {
    fn new(ip: IpAddr, target: SocketAddr) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        Self { rt, ip, target }
    }

    fn connect(&self) -> Option<TcpStream> {
        let s = self.rt.block_on(async {
            let socket = tokio::net::TcpSocket::new_v4().ok()?;
            socket.bind(SocketAddr::new(self.ip, 0)).ok()?;
            let connect = socket.connect(self.target);
            tokio::time::timeout(Duration::from_secs(2), connect)
                .await
                .ok()?
                .ok()?
                .into_std()
                .ok()
        })?;
        s.set_nonblocking(false).ok()?;
        Some(s)
    }
}

/// Reads until the server closes `s` or `limit` passes; what the server sent is ignored.
fn drain_until_closed(s: &mut TcpStream, limit: Duration) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let until = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return,
        }
    }
}

/// Opens [`FLOOD`] connections that never say hello, holds them a moment, drops them.
fn flood(from: &Source, stop: &AtomicBool, rounds: &Rounds) {
    while !stop.load(Ordering::Relaxed) {
        let held: Vec<TcpStream> = (0..FLOOD).filter_map(|_| from.connect()).collect();
        thread::sleep(Duration::from_millis(300));
        drop(held);
        rounds.flood.fetch_add(1, Ordering::Relaxed);
    }
}

/// Random bytes, with and without the HTTP/2 preface before them.
fn garbage(from: &Source, stop: &AtomicBool, rounds: &Rounds) {
    let mut seed = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
    while !stop.load(Ordering::Relaxed) {
        let Some(mut s) = from.connect() else {
            continue;
        };
        let mut buf = vec![0u8; 1 + (seed % (64 << 10)) as usize];
        noise(&mut seed, &mut buf);
        if seed % 2 == 0 {
            let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        }
        let _ = s.write_all(&buf);
        drain_until_closed(&mut s, Duration::from_secs(2));
        rounds.garbage.fetch_add(1, Ordering::Relaxed);
    }
}

/// HTTP/2 frames whose headers claim 16 MB (over the 16 KB frame size), then as much data as
/// the server takes before it hangs up.
fn oversized_frames(from: &Source, stop: &AtomicBool, rounds: &Rounds) {
    let mut kind = 0u8;
    while !stop.load(Ordering::Relaxed) {
        let Some(mut s) = from.connect() else {
            continue;
        };
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
        let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        // An empty SETTINGS frame, then DATA (0), HEADERS (1) or SETTINGS (4) of 0xFFFFFF bytes
        // on stream 1 (0 for SETTINGS).
        let _ = s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let (ty, stream) = [(0u8, 1u8), (1, 1), (4, 0)][usize::from(kind % 3)];
        kind = kind.wrapping_add(1);
        let _ = s.write_all(&[0xff, 0xff, 0xff, ty, 0x4, 0, 0, 0, stream]);
        let chunk = vec![0x41u8; 64 << 10];
        for _ in 0..16 {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
        drain_until_closed(&mut s, Duration::from_secs(2));
        rounds.oversized_frames.fetch_add(1, Ordering::Relaxed);
    }
}

/// Well-formed gRPC hellos of 5 MB, over the peer request limit (4 MB).
fn oversized_messages(from: &Source, stop: &AtomicBool, rounds: &Rounds) {
    let rt = &from.rt;
    let hello = HelloRequest {
        from: Some(Identity {
            node_id: 1,
            instance_id: 1,
            protocol_version: openimex_proto::PROTOCOL_VERSION,
            node_map: vec!["x".repeat(1000); 5000],
            ..Default::default()
        }),
        to_node_id: 0,
    };
    while !stop.load(Ordering::Relaxed) {
        let channel = rt.block_on(async {
            Endpoint::from_shared(format!("http://{}", from.target))
                .ok()?
                .local_address(Some(from.ip))
                .connect_timeout(Duration::from_secs(2))
                .timeout(Duration::from_secs(5))
                .connect()
                .await
                .ok()
        });
        if let Some(channel) = channel {
            let mut c = PeerClient::new(channel).max_encoding_message_size(64 << 20);
            let answer = say_hello(rt, &mut c, hello.clone());
            assert!(answer.is_err(), "a 5 MB hello must be refused");
            rounds.oversized_messages.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Imports `handle` on node `i` with the pattern of `seed` until `stop`; counts successes and
/// keeps the first failure.
fn import_loop(
    cluster: &Cluster,
    i: usize,
    handle: &str,
    seed: u64,
    stop: &AtomicBool,
) -> (u64, Option<String>) {
    let (dir, ch) = (cluster.node(i).dir(), channel(cluster, i, 0));
    let seed = seed.to_string();
    let mut ok = 0;
    while !stop.load(Ordering::Relaxed) {
        let out = run(&mut importer(dir, &ch, handle, &["--verify", &seed]));
        if !out.status.success() {
            return (
                ok,
                Some(format!("import {ok} on node {i}: {}", text(&out.stderr))),
            );
        }
        ok += 1;
    }
    (ok, None)
}

#[test]
fn a_hostile_peer_does_not_stop_the_domain_from_serving_imports() {
    let cluster = gpu_cluster(3);
    let (d0, node0) = (cluster.node(0).dir(), cluster.node(0));
    let target = SocketAddr::new(IpAddr::V4(node0.ip()), node0.server_port());
    let pid = node0.pid().expect("daemon 0 runs");
    let (exp, handle) = exporter(d0, &channel(&cluster, 0, 0), 41, "exporter on node 0");

    let log = node0.log_path();
    let log_size = || std::fs::metadata(&log).map_or(0, |m| m.len());
    let log_before = log_size();
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(Rounds::default());
    type Attack = fn(&Source, &AtomicBool, &Rounds);
    let attacks: [Attack; 4] = [flood, garbage, oversized_frames, oversized_messages];
    // Sources in the cluster's block, far from the nodes' addresses: not in any nodes file.
    let [a, b, c, _] = node0.ip().octets();
    let attackers: Vec<_> = attacks
        .into_iter()
        .zip(200u8..)
        .map(|(attack, d)| {
            let (stop, rounds) = (Arc::clone(&stop), Arc::clone(&rounds));
            let ip = IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d));
            thread::spawn(move || attack(&Source::new(ip, target), &stop, &rounds))
        })
        .collect();

    let importers_stop = AtomicBool::new(false);
    let started = Instant::now();
    let results = thread::scope(|s| {
        let loops: Vec<_> = [1, 2]
            .map(|i| {
                let (cluster, handle, stop) = (&cluster, &handle, &importers_stop);
                s.spawn(move || import_loop(cluster, i, handle, 41, stop))
            })
            .into_iter()
            .collect();
        // Until every attack ran a few rounds under the imports, and enough imports were done
        // (the importers run meanwhile; a failed import stops nothing, it is reported below).
        let enough = || {
            let r = &rounds;
            r.flood.load(Ordering::Relaxed) >= 3
                && r.garbage.load(Ordering::Relaxed) >= 10
                && r.oversized_frames.load(Ordering::Relaxed) >= 5
                && r.oversized_messages.load(Ordering::Relaxed) >= 3
        };
        while !(enough() && started.elapsed() > Duration::from_secs(10))
            && started.elapsed() < ATTACK_LIMIT
            && loops.iter().all(|l| !l.is_finished())
        {
            thread::sleep(Duration::from_millis(100));
        }
        importers_stop.store(true, Ordering::Relaxed);
        loops
            .into_iter()
            .map(|l| l.join().expect("import loop"))
            .collect::<Vec<_>>()
    });
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().expect("an attack task panicked");
    }
    let rounds = [
        ("floods", rounds.flood.load(Ordering::Relaxed)),
        ("garbage", rounds.garbage.load(Ordering::Relaxed)),
        (
            "oversized frames",
            rounds.oversized_frames.load(Ordering::Relaxed),
        ),
        (
            "oversized messages",
            rounds.oversized_messages.load(Ordering::Relaxed),
        ),
    ];
    let log_grown = log_size().saturating_sub(log_before);
    eprintln!(
        "under attack for {:?}: {rounds:?}, imports {results:?}, node 0's log grew by {log_grown} \
         bytes",
        started.elapsed()
    );

    for (i, (ok, failure)) in results.iter().enumerate() {
        assert_eq!(
            failure,
            &None,
            "node {}: {ok} imports, then a failure",
            i + 1
        );
        assert!(
            *ok >= IMPORTS_EACH,
            "node {}: only {ok} imports in {:?}",
            i + 1,
            ATTACK_LIMIT
        );
    }
    assert!(
        rounds.iter().all(|(_, n)| *n > 0),
        "every attack ran: {rounds:?}"
    );
    assert_eq!(
        node0.pid(),
        Some(pid),
        "daemon 0 still runs, the same process"
    );
    for i in 0..3 {
        let d = cluster.domain(i).expect("ctl -N -j answers");
        assert_eq!(d.status, "UP", "node {i}: {}", d.compact());
    }
    // Refusals are logged sparingly: thousands of hostile connections, not thousands of lines.
    assert!(
        log_grown < 256 << 10,
        "node 0's log grew by {log_grown} bytes"
    );
    let v = links(&cluster, 0);
    let flood_refused = refused(
        &v,
        0,
        "connection: too many without a hello from one address",
    );
    assert!(flood_refused >= 1, "the flood is refused and counted: {v}");
    // Every import released its reference; the exporter's memory goes with it.
    wait_stats(d0, NOTICE, "node 0 holds no reference for importers", |s| {
        num(s, "daemon_export_refs") == 0
    });
    exp.exit();
    wait_all_released(&cluster, "after the attack");
}
