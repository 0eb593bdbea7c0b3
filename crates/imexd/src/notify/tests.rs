//! The notify protocol against real unix datagram sockets, as the service manager binds them.

use std::ffi::OsStr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use openimex_core::DaemonState;

use super::*;

/// A directory of its own under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "openimex-notify-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The manager's side: a bound socket that gives up on a read after 5 s.
fn manager(path: &std::path::Path) -> UnixDatagram {
    let sock = UnixDatagram::bind(path).expect("bind the manager's socket");
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    sock
}

fn recv(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).expect("a notification within 5 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Nothing is waiting on `sock` (checked without blocking).
fn nothing_more(sock: &UnixDatagram) {
    sock.set_nonblocking(true).expect("non-blocking");
    let mut buf = [0u8; 4096];
    match sock.recv(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!(
            "expected no notification, got {:?}",
            other.map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
        ),
    }
    sock.set_nonblocking(false).expect("blocking");
}

#[test]
fn states_readiness_reload_and_stop_reach_a_real_socket() {
    let dir = TempDir::new();
    let path = dir.0.join("notify.sock");
    let sock = manager(&path);
    let n = Notifier::from_var(Some(path.as_os_str())).expect("a socket path is usable");
    assert!(n.is_enabled());

    // Before READY a reload is part of the start: nothing is sent for it.
    n.reloading();
    n.reloaded(DaemonState::WaitingForPeers);
    n.state(DaemonState::Initializing);
    assert_eq!(recv(&sock), "STATUS=INITIALIZING");
    n.state(DaemonState::WaitingForPeers);
    assert_eq!(recv(&sock), "STATUS=WAITING_FOR_PEERS");
    nothing_more(&sock);

    n.state(DaemonState::Ready);
    assert_eq!(recv(&sock), "READY=1\nSTATUS=READY");
    // READY=1 once: a later READY (after a dip) is a status only.
    n.state(DaemonState::Ready);
    assert_eq!(recv(&sock), "STATUS=READY");

    let before = monotonic_usec();
    n.reloading();
    let reloading = recv(&sock);
    let after = monotonic_usec();
    let mut lines = reloading.lines();
    assert_eq!(lines.next(), Some("RELOADING=1"), "{reloading}");
    let usec: u64 = lines
        .next()
        .and_then(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("MONOTONIC_USEC=<µs> second: {reloading}"));
    assert!(
        (before..=after).contains(&usec),
        "{usec} not within {before}..={after}"
    );
    n.reloaded(DaemonState::Ready);
    assert_eq!(recv(&sock), "READY=1\nSTATUS=READY");

    n.stopping();
    assert_eq!(recv(&sock), "STOPPING=1\nSTATUS=SHUTTING_DOWN");
    nothing_more(&sock);
}

#[test]
fn an_abstract_name_is_parsed_and_reached() {
    let name = format!("openimex-notify-test-{}", std::process::id());
    let addr = parse_addr(OsStr::new(&format!("@{name}"))).expect("@name parses");
    assert_eq!(addr.as_abstract_name(), Some(name.as_bytes()));
    assert!(addr.as_pathname().is_none());

    let bound = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract address");
    let sock = UnixDatagram::bind_addr(&bound).expect("bind the abstract socket");
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let n = Notifier::from_var(Some(OsStr::new(&format!("@{name}")))).expect("usable");
    n.state(DaemonState::Ready);
    assert_eq!(recv(&sock), "READY=1\nSTATUS=READY");
}

#[test]
fn a_missing_variable_is_a_no_op() {
    for value in [None, Some(OsStr::new(""))] {
        let n = Notifier::from_var(value).expect("unset is not an error");
        assert!(!n.is_enabled());
        n.state(DaemonState::Ready);
        n.reloading();
        n.reloaded(DaemonState::Ready);
        n.stopping();
    }
    assert!(!Notifier::disabled().is_enabled());
}

#[test]
fn values_that_name_no_socket_are_refused_with_the_reason() {
    for value in ["run/notify", "vsock:2:1234", "x"] {
        let err = Notifier::from_var(Some(OsStr::new(value)))
            .expect_err(value)
            .to_string();
        assert!(
            err.contains(&format!("NOTIFY_SOCKET={value}")) && err.contains("absolute path"),
            "{err}"
        );
    }
    let long = format!("/{}", "a".repeat(200));
    let err = Notifier::from_var(Some(OsStr::new(&long)))
        .expect_err("longer than sun_path")
        .to_string();
    assert!(err.contains("not a usable socket path"), "{err}");
}

#[test]
fn a_send_that_fails_is_not_fatal() {
    let dir = TempDir::new();
    // Nobody listens there.
    let n = Notifier::from_var(Some(dir.0.join("gone.sock").as_os_str())).expect("usable");
    n.state(DaemonState::Ready);
    n.stopping();
    let inner = n.inner.as_ref().expect("enabled");
    assert!(
        inner.warned.load(Ordering::SeqCst),
        "the failure was logged"
    );
}

/// Lets the follower task run what was just sent to it.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn ready_says_when_every_peer_is_connected_and_when_that_stops() {
    let dir = TempDir::new();
    let path = dir.0.join("notify.sock");
    let sock = manager(&path);
    let n = Arc::new(Notifier::from_var(Some(path.as_os_str())).expect("usable"));
    let (state, state_rx) = watch::channel(DaemonState::Initializing);
    let peers = |connected| Peers {
        connected,
        total: 2,
    };
    let (links, links_rx) = watch::channel(peers(0));
    let follower = tokio::spawn(follow_state(n, state_rx, links_rx));
    settle().await;
    assert_eq!(recv(&sock), "STATUS=INITIALIZING");
    // Connections before READY say nothing: the state does.
    links.send(peers(1)).expect("follower");
    settle().await;
    nothing_more(&sock);
    // READY with one peer of two: ready, not yet in touch with the whole domain.
    state.send(DaemonState::Ready).expect("follower");
    settle().await;
    assert_eq!(recv(&sock), "READY=1\nSTATUS=READY");
    nothing_more(&sock);
    links.send(peers(2)).expect("follower");
    settle().await;
    assert_eq!(recv(&sock), "STATUS=READY, all 2 peers connected");
    // The same again (a peer lost and back between two looks) is not repeated.
    links.send(peers(2)).expect("follower");
    settle().await;
    nothing_more(&sock);
    links.send(peers(1)).expect("follower");
    settle().await;
    assert_eq!(recv(&sock), "STATUS=READY, 1 of 2 peers connected");
    drop((state, links));
    follower.await.expect("the follower ends with the engine");
}
