//! The node's fabric view in virtual time (`openimex_core::node` cliques, issue 30 item 2):
//! the daemon reads its GPUs' probes every `FABRIC_REFRESH` on core's timer and at once on
//! CLIQUE_ID_CHANGE, shows what it read in `ctl --fabric`, and tells its peers its new
//! cliques — at once after the event, at the next read when only the probe changed.

use openimex_core::node::FABRIC_REFRESH;
use openimex_imexd::net::MemNet;
use openimex_proto::cmd::DomainReply;
use tokio::time::{Instant, sleep_until};

use crate::domain::{AT_ONCE, Daemon, formed_with, logged, within};
use crate::gpus::{Gpus, gpu};

/// Two daemons, each node's GPUs in clique 1, started together and UP; when they started.
async fn formed(net: &MemNet) -> (Vec<Daemon>, Vec<Gpus>, Instant) {
    let gpus = vec![
        Gpus::new(vec![gpu(0, 1), gpu(1, 1)]),
        Gpus::new(vec![gpu(0, 1)]),
    ];
    let started = Instant::now();
    let daemons = formed_with(net, gpus.iter().map(Gpus::driver).collect()).await;
    (daemons, gpus, started)
}

/// GPU `g` of node `node` in a `ctl -N --fabric` reply: (clique, health summary).
fn shown(reply: &DomainReply, node: u32, g: u32) -> Option<(u32, String)> {
    let row = reply.nodes.iter().find(|n| n.node_id == node)?;
    let g = row.gpus.iter().find(|x| x.gpu == g)?;
    Some((g.clique_id, g.health_summary.clone()))
}

/// Health comes with no event: the change shows at the refresh after it, read on core's
/// timer (a refresh after the start), and not a moment before.
#[tokio::test(start_paused = true)]
async fn a_health_change_shows_at_the_next_refresh_and_not_before() {
    let net = MemNet::new();
    let (daemons, gpus, started) = formed(&net).await;
    let reads = gpus[0].reads();
    gpus[0].set_health(1, "UNHEALTHY", 0x4);
    let node0 = &daemons[0];
    sleep_until(started + FABRIC_REFRESH - AT_ONCE).await;
    let before = node0.fabric(&net).await;
    assert_eq!(
        shown(&before, 0, 1),
        Some((1, "HEALTHY".into())),
        "{before:?}"
    );
    assert_eq!(gpus[0].reads(), reads, "no read between refreshes");
    sleep_until(started + FABRIC_REFRESH + AT_ONCE).await;
    let after = node0.fabric(&net).await;
    assert_eq!(
        shown(&after, 0, 1),
        Some((1, "UNHEALTHY".into())),
        "{after:?}"
    );
    assert_eq!(gpus[0].reads(), reads + 1, "one read at the refresh");
    assert!(logged(
        "GPU 1 fabric health HEALTHY (mask 0x0) -> UNHEALTHY (mask 0x4)"
    ));
}

/// CLIQUE_ID_CHANGE: node 0 shows the new clique at once (not at its next read), reads its
/// probes again at once, and its peer hears of the change at once.
#[tokio::test(start_paused = true)]
async fn a_clique_change_is_shown_and_told_to_the_peer_at_once() {
    let net = MemNet::new();
    let (daemons, gpus, _) = formed(&net).await;
    let reads = gpus[0].reads();
    gpus[0].move_gpu(1, 2, true);
    let took = within(AT_ONCE, "node 1 hears of node 0's new cliques", || {
        logged("peer node 0 reports new clique(s) [1, 2]")
    })
    .await;
    assert!(took < AT_ONCE, "{took:?}");
    assert!(logged(
        "CLIQUE_ID_CHANGE: GPU 1 moved from clique 1 to clique 2"
    ));
    let reply = daemons[0].fabric(&net).await;
    assert_eq!(
        shown(&reply, 0, 1),
        Some((2, "HEALTHY".into())),
        "{reply:?}"
    );
    assert_eq!(gpus[0].reads(), reads + 1, "read again at once");
}

/// A probe that changed with no event is seen at the next read, and the peer is told then:
/// not before that refresh, and at it.
#[tokio::test(start_paused = true)]
async fn a_silent_clique_change_reaches_the_peer_at_the_next_refresh() {
    let net = MemNet::new();
    let (_daemons, gpus, started) = formed(&net).await;
    // Node 0's GPUs both move out of node 1's clique: its memory no longer maps there.
    gpus[0].move_gpu(0, 5, false);
    gpus[0].move_gpu(1, 5, false);
    sleep_until(started + FABRIC_REFRESH - AT_ONCE).await;
    assert!(!logged("peer node 0 reports new clique(s) [5]"));
    sleep_until(started + FABRIC_REFRESH + AT_ONCE).await;
    assert!(logged("peer node 0 reports new clique(s) [5]"));
    assert!(logged(
        "peer node 0 is in clique(s) [5], outside this node's clique(s) [1]"
    ));
}
