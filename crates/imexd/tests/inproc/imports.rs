//! The bound on imports in flight to one exporter (`openimex_core::node::MAX_IMPORTS_IN_FLIGHT`,
//! core's `node/outbox.rs`) through whole daemons in virtual time: an importer asks its exporter
//! for at most that many imports whose answers have not come; the rest wait their turn and go
//! as answers come, and every one of them completes.

use std::time::Duration;

use openimex_core::NodeId;
use openimex_core::node::MAX_IMPORTS_IN_FLIGHT;
use openimex_imexd::net::MemNet;
use tokio::time::sleep;

use crate::domain::{AT_ONCE, formed_with, ip, within};
use crate::gpus::{Gpus, gpu};

#[tokio::test(start_paused = true)]
async fn at_most_the_bound_of_imports_is_asked_of_one_exporter_and_the_rest_follow() {
    let net = MemNet::new();
    let gpus = [Gpus::new(vec![gpu(0, 1)]), Gpus::new(vec![gpu(0, 1)])];
    let _daemons = formed_with(&net, gpus.iter().map(Gpus::driver).collect()).await;
    let uuid = [7u8; 16];
    gpus[0].export(uuid);
    // Node 0's answers (and heartbeats) do not reach node 1; node 1's requests reach node 0.
    net.cut_from(ip(0), ip(1));
    let n = MAX_IMPORTS_IN_FLIGHT + 44;
    for event in 1..=n {
        gpus[1].import(event as u64, uuid, NodeId(0));
    }
    sleep(AT_ONCE).await;
    assert_eq!(
        gpus[0].describes(),
        MAX_IMPORTS_IN_FLIGHT as u64,
        "node 0 was asked for more than the bound"
    );
    // A second later (within the peer timeout) still the bound: the rest wait their turn.
    sleep(Duration::from_secs(1)).await;
    assert_eq!(gpus[0].describes(), MAX_IMPORTS_IN_FLIGHT as u64);
    assert_eq!(gpus[1].validated(), (0, 0), "no answer crossed the cut");
    // The answers come: the rest go, and every import completes with its pages.
    net.heal(ip(0), ip(1));
    within(AT_ONCE, "every import validated after the heal", || {
        gpus[1].validated().0 == n
    })
    .await;
    assert_eq!(gpus[1].validated(), (n, n));
    assert_eq!(gpus[0].describes(), n as u64);
}
