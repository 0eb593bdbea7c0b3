//! The peers' lifecycle in virtual time: formation, and each deadline core keeps for the daemon
//! (`openimex_core::node::{HELLO_DEADLINE, GOODBYE_WAIT}`) and SIGUSR1's readdressing, checked
//! at the instant they act.

use std::time::Duration;

use openimex_core::Backoff;
use openimex_core::node::{GOODBYE_WAIT, HELLO_DEADLINE};
use openimex_imexd::net::MemNet;
use openimex_proto::cmd::DomainReply;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use crate::domain::{AT_ONCE, Daemon, Options, PEER_PORT, formed_with, ip, link, start, up};

/// `n` daemons of one domain (the `nogpu` driver), started together and UP.
async fn formed(net: &MemNet, n: usize) -> Vec<Daemon> {
    let drivers = (0..n)
        .map(|_| Box::new(openimex_driver::NoGpu::default()) as Box<dyn openimex_driver::Driver>)
        .collect();
    formed_with(net, drivers).await
}

#[tokio::test(start_paused = true)]
async fn three_daemons_form_a_domain_without_waiting_for_any_timer() {
    let net = MemNet::new();
    let t0 = Instant::now();
    let daemons = formed(&net, 3).await;
    // Nothing in a formation waits for a timer: the dials go out at start and the hellos are
    // answered as they come. (In real time this is `bench`'s `formation_N`.)
    assert!(t0.elapsed() < AT_ONCE, "formed after {:?}", t0.elapsed());
    for d in &daemons {
        let reply = d.domain(&net).await;
        assert!(up(&reply), "node {}: {reply:?}", d.id);
    }
}

/// A connection that never says hello is closed by its daemon at the hello deadline: not a
/// moment before (a slow peer has the whole deadline) and not later (a stranger cannot hold
/// a connection longer).
#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed_at_the_hello_deadline_and_not_before() {
    let net = MemNet::new();
    let daemons = formed(&net, 2).await;
    let stranger = "10.0.9.9".parse().expect("an address");
    let mut silent = net
        .connect(stranger, std::net::SocketAddr::new(ip(0), PEER_PORT))
        .expect("node 0 accepts");
    let t0 = Instant::now();
    // Whatever the server says first (its HTTP/2 settings), read until it hangs up.
    let mut buf = [0u8; 1024];
    loop {
        match silent.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let closed = t0.elapsed();
    assert!(
        closed >= HELLO_DEADLINE && closed < HELLO_DEADLINE + AT_ONCE,
        "closed after {closed:?}, the deadline is {HELLO_DEADLINE:?}"
    );
    let reply = daemons[0].domain(&net).await;
    assert_eq!(
        refused(&reply, 0, "hello in time"),
        1,
        "counted once, under its reason: {reply:?}"
    );
    assert!(up(&reply), "the domain is untouched: {reply:?}");
}

/// A daemon told to stop says goodbye to its peers and waits for their answers: once every
/// goodbye is answered it stops at once; with a peer cut off, it waits the goodbye wait and no
/// longer.
#[tokio::test(start_paused = true)]
async fn the_stop_waits_for_goodbyes_at_most_the_goodbye_wait() {
    let net = MemNet::new();
    let mut daemons = formed(&net, 3).await;
    let took = daemons[2].stop().await;
    assert!(
        took < AT_ONCE,
        "every goodbye answered, yet the stop took {took:?}"
    );

    net.cut(ip(0), ip(1));
    let took = daemons[0].stop().await;
    assert!(
        took >= GOODBYE_WAIT && took < GOODBYE_WAIT + AT_ONCE,
        "a peer cut off held the stop {took:?}; the goodbye wait is {GOODBYE_WAIT:?}"
    );
    net.heal(ip(0), ip(1));
    daemons[1].stop().await;
}

/// SIGUSR1 after a node's name moved to another address: the others dial it there at once,
/// not after their backoff (30 s here, so waiting for it could not pass). The moved node's own
/// dials were refused before (its new address was not its entry's yet), so only the re-read
/// can bring the pair together this soon.
#[tokio::test(start_paused = true)]
async fn sigusr1_dials_a_moved_node_at_its_new_address_at_once() {
    let net = MemNet::new();
    let mut options = Options::named(3, &net);
    let dir = options.write_nodes_file("sigusr1");
    options.backoff = Backoff {
        min: Duration::from_secs(30),
        max: Duration::from_secs(30),
    };
    let mut daemons: Vec<Daemon> = (0..3).map(|i| start(&net, i, ip(i), &options)).collect();
    daemons[0]
        .wait_domain(&net, Duration::from_secs(10), "domain UP", up)
        .await;

    // Node 2 stops and starts again at 10.0.0.9 while its name still says 10.0.0.3: its
    // hellos come from the wrong address and are refused, and everyone backs off.
    daemons[2].stop().await;
    let moved: std::net::IpAddr = "10.0.0.9".parse().expect("an address");
    daemons[2] = start(&net, 2, moved, &options);
    for (i, d) in daemons.iter().enumerate().take(2) {
        let refused_once = |r: &DomainReply| refused(r, i, "wrong source address") >= 1;
        d.wait_domain(
            &net,
            Duration::from_secs(5),
            "node 2's hello refused",
            refused_once,
        )
        .await;
    }
    // The name moves; SIGUSR1.
    net.set_name("node-2", &[moved]);
    let t0 = Instant::now();
    daemons[0].reload();
    daemons[1].reload();
    for (i, d) in daemons.iter().enumerate().take(2) {
        d.wait_domain(&net, Duration::from_secs(5), "node 2 connected", |r| {
            link(r, i, 2) == "CONNECTED"
        })
        .await;
    }
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "node 2 reached at its new address {:?} after SIGUSR1; the backoff is 30 s",
        t0.elapsed()
    );
    for d in &mut daemons {
        d.stop().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// How many messages node `i` refused for a reason containing `why`.
fn refused(reply: &DomainReply, i: usize, why: &str) -> u64 {
    reply
        .nodes
        .iter()
        .filter(|n| n.node_id as usize == i)
        .flat_map(|n| &n.refusals)
        .filter(|r| r.reason.contains(why))
        .map(|r| r.count)
        .sum()
}
