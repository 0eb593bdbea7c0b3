//! The retire wait (`openimex_core::node::RETIRE_WAIT`, core's `node/deadlines.rs`) through
//! whole daemons in virtual time: when a pair moves to its other session (a handover, core's
//! `mesh/pair.rs`), the session it leaves is not cut while it still owes an answer; it stays
//! open for it, and is closed at the retire wait if the answer does not come: not a moment
//! before, and not later.

use std::time::Duration;

use openimex_core::NodeId;
use openimex_core::node::RETIRE_WAIT;
use openimex_imexd::net::MemNet;
use tokio::time::{Instant, sleep_until};

use crate::domain::{
    AT_ONCE, Daemon, Options, dialled, ip, link, logged, only, open, start_with, up, within,
};
use crate::gpus::{Gpus, gpu};

/// The pair starts on node 1's dial, then node 0's arrives (the session the pair prefers, as
/// the lower node dialled it): node 1 retires its own while an import it asked on it is
/// unanswered. The retired session carries nothing any more (the pair stays UP on the new
/// one) and stays open for that answer until the retire wait, when node 1 closes it and the
/// import fails as a lost session fails it.
#[tokio::test(start_paused = true)]
async fn a_session_replaced_while_it_owes_an_answer_is_closed_at_the_retire_wait() {
    let net = MemNet::new();
    let gpus = [Gpus::new(vec![gpu(0, 1)]), Gpus::new(vec![gpu(0, 1)])];
    let uuid = [7u8; 16];
    gpus[0].export(uuid);
    // What node 0 sends on the connections opened at the start is held: node 1 sees nothing
    // of node 0's dial, and node 0 takes node 1's dial without node 1 hearing the answer.
    net.stall_new(ip(0), ip(1));
    let options = Options::nodes(2);
    let daemons: Vec<Daemon> = (gpus.iter().enumerate())
        .map(|(i, g)| start_with(&net, i, ip(i), &options, g.driver()))
        .collect();
    let connected = |from, to| move |r: &_| link(r, from, to) == "CONNECTED";
    let why = "node 1's session reached node 0";
    daemons[0]
        .wait_domain(&net, AT_ONCE, why, connected(0, 1))
        .await;
    let (ours, theirs) = (only(dialled(&net, 0, 1)), only(dialled(&net, 1, 0)));
    // Node 1's dial is answered: its session carries the pair on both sides, while node 0's
    // dial (a dial in flight is let finish) still hangs.
    net.heal(ip(0), ip(1));
    net.release(theirs);
    let why = "node 1's dial answered";
    daemons[1]
        .wait_domain(&net, AT_ONCE, why, connected(1, 0))
        .await;

    // Node 1 asks node 0 for an import on that session; node 0's answer is held on it.
    net.stall(theirs, ip(0));
    gpus[1].import(1, uuid, NodeId(0));
    within(AT_ONCE, "node 0 describes the export", || {
        gpus[0].describes() == 1
    })
    .await;
    // Node 0's dial gets through: the pair moves to it, and node 1 retires its own session.
    net.release(ours);
    let moved = Instant::now();

    // Open for the answer a second later (a peer slow to answer gets it through), and up to
    // the retire wait.
    for after in [Duration::from_secs(1), RETIRE_WAIT.saturating_sub(AT_ONCE)] {
        sleep_until(moved + after).await;
        assert!(
            open(&net, theirs),
            "the retired session, an answer owed on it, was closed by {after:?} after the \
             handover; the retire wait is {RETIRE_WAIT:?}"
        );
        assert_eq!(gpus[1].validated(), (0, 0), "the import still waits");
    }
    within(
        AT_ONCE * 2,
        "the retired session closed at the retire wait",
        || !open(&net, theirs),
    )
    .await;
    let closed = moved.elapsed();
    assert!(
        closed >= RETIRE_WAIT && closed < RETIRE_WAIT + AT_ONCE,
        "closed {closed:?} after the handover; the retire wait is {RETIRE_WAIT:?}"
    );
    // Closed by node 1's retire wait: the import it owed fails as on a lost session.
    assert_eq!(
        gpus[1].validated(),
        (1, 0),
        "the import failed at the close"
    );
    assert!(logged(
        "import 1 from node 0 failed: INVALID_STATE (exporter node 0: the session ended before the answer)"
    ));
    // The pair carried on on the new session (node 0's heartbeats on the old one were held
    // all along): UP on both sides, nobody lost it, and that session open.
    assert!(open(&net, ours));
    for d in &daemons {
        let reply = d.domain(&net).await;
        assert!(up(&reply), "node {}: {reply:?}", d.id);
    }
    assert!(!logged("Connection lost"));
}
