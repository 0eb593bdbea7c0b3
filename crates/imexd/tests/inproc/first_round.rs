//! The first round of dials through whole daemons (core's `mesh/first_round.rs`): a daemon that
//! starts after its lower peers have dialled it (their connections waiting on its listener, as
//! in a backlog, while its process starts) does not dial them back. The engine hands the
//! connections already accepted to core before the first round
//! (`openimex_core::Mesh::handle_peer_connecting`), which puts those dials off; their sessions
//! follow their hellos.

use std::time::Duration;

use openimex_imexd::net::MemNet;
use tokio::time::sleep;

use crate::domain::{
    AT_ONCE, Daemon, Options, PEER_PORT, bind, dialled, ip, start, start_bound, up, within,
};

#[tokio::test(start_paused = true)]
async fn a_daemon_started_after_its_peers_dialled_it_does_not_dial_them_back() {
    let nodes = 4;
    let last = nodes - 1;
    let net = MemNet::new();
    let options = Options::nodes(nodes);
    // The last node's listeners are bound (its process is starting); its daemon is not running.
    let world = bind(&net, ip(last));
    let mut daemons: Vec<Daemon> = (0..last).map(|i| start(&net, i, ip(i), &options)).collect();
    within(
        AT_ONCE,
        "every lower node's dial waits on the last node",
        || (0..last).all(|i| !dialled(&net, i, last).is_empty()),
    )
    .await;
    let before = net.connections_made(PEER_PORT);
    daemons.push(start_bound(
        last,
        world,
        &options,
        Box::new(openimex_driver::NoGpu::default()),
    ));
    for d in &daemons {
        d.wait_domain(&net, Duration::from_secs(10), "domain UP", up)
            .await;
    }
    assert_eq!(
        net.connections_made(PEER_PORT),
        before,
        "the last node dialled a peer whose connection was waiting"
    );
    // Past every put-off: nobody dials again.
    sleep(options.backoff.min * 2).await;
    assert_eq!(net.connections_made(PEER_PORT), before, "dialled later");
    let pairs = nodes * (nodes - 1) / 2;
    assert!(
        before <= pairs + 2,
        "{before} connections for {pairs} pairs"
    );
    for d in &daemons {
        let reply = d.domain(&net).await;
        assert!(up(&reply), "node {}: {reply:?}", d.id);
    }
}
