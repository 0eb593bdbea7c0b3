//! A late answer to a superseded dial (`openimex_core::Mesh::dial_in_flight`, core's
//! `mesh/dial.rs`) through whole daemons in virtual time: the daemon takes a dial's session only
//! if the node still waits for that dial, so an answer that arrives after SIGUSR1 dialled the
//! peer again, and the new dial's session already carries the pair, is closed and never
//! replaces the session held.

use std::net::IpAddr;
use std::time::Duration;

use openimex_imexd::net::MemNet;
use tokio::time::{Instant, sleep};

use crate::domain::{
    AT_ONCE, Daemon, Options, PEER_TIMEOUT, dialled, ip, link, logged, only, open, start, up,
    within,
};

/// Node 0's first dial reaches node 1, which takes its session, but the answer is held up on
/// the way back. SIGUSR1 after node 1's name changed makes node 0 dial again at once (it is not
/// connected), which supersedes the first dial; the new dial's session carries the pair on both
/// sides (node 1 lets it replace the first one, from the same side). Then the first dial's
/// answer arrives, within its dial timeout: node 0 closes it and keeps its session, and the
/// pair stays UP.
#[tokio::test(start_paused = true)]
async fn a_late_answer_to_a_superseded_dial_does_not_replace_the_session_held() {
    let net = MemNet::new();
    let mut options = Options::named(2, &net);
    let dir = options.write_nodes_file("late-dial");
    // What node 1 sends on the connections opened at the start is held: its answer to node
    // 0's dial, and its own dial to node 0 (which must not connect node 0 either).
    net.stall_new(ip(1), ip(0));
    let t0 = Instant::now();
    let daemons: Vec<Daemon> = (0..2).map(|i| start(&net, i, ip(i), &options)).collect();
    let connected = |from, to| move |r: &_| link(r, from, to) == "CONNECTED";
    let why = "node 0's first dial taken by node 1";
    daemons[1]
        .wait_domain(&net, AT_ONCE, why, connected(1, 0))
        .await;
    let first = only(dialled(&net, 0, 1));
    let reply = daemons[0].domain(&net).await;
    assert_ne!(link(&reply, 0, 1), "CONNECTED", "{reply:?}");
    // Connections opened from now on flow; the two of the start stay stalled.
    net.heal(ip(0), ip(1));

    // Node 1's name gains an address (after its own, which is still the one dialled).
    let second: IpAddr = "10.0.0.20".parse().expect("an address");
    net.set_name("node-1", &[ip(1), second]);
    daemons[0].reload();
    let why = "node 0's new dial carries the pair";
    daemons[0].wait_domain(&net, AT_ONCE, why, up).await;
    let held = dialled(&net, 0, 1);
    let held = only(held.into_iter().filter(|c| *c != first).collect());

    // The first dial's answer arrives, before that dial's timeout.
    assert!(t0.elapsed() + AT_ONCE < PEER_TIMEOUT, "{:?}", t0.elapsed());
    net.release(first);
    within(AT_ONCE, "the late dial's connection closed", || {
        !open(&net, first)
    })
    .await;
    // The session held stays, and carries the pair for longer than a peer timeout: had the
    // late session replaced it here, node 1 would have seen it end, and node 0 would have
    // sent no heartbeat on it.
    sleep(PEER_TIMEOUT + Duration::from_secs(1)).await;
    assert!(open(&net, held), "the session held was closed");
    for d in &daemons {
        let reply = d.domain(&net).await;
        assert!(up(&reply), "node {}: {reply:?}", d.id);
    }
    assert!(!logged("Connection lost"), "the pair was lost");
    let _ = std::fs::remove_dir_all(&dir);
}
