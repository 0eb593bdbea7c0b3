//! Peer loss with a grace time, end to end (issue 7 item 3;
//! `IMEX_NODE_DISCONNECTED_GRACE_TIME` as imex-guide §1 and "Connections, Quorum, and Clean
//! up" define it): the exporter's daemon hangs (SIGSTOP: no reset, only heartbeats tell); after
//! the grace time the importer's node disables (kills) the importer of its memory and shows it
//! DISCONNECTED; once the exporter's node is back (the same instance), it is told to drop the
//! reference it held for that import, and the domain is UP again. driver-interface.md §4 "Peer node dies or disconnects".

use openimex_harness::Signal;

use crate::apps::*;
use crate::common::{FORM, NOTICE};

#[test]
fn a_peer_lost_longer_than_the_grace_time_is_cleaned_up_on_both_sides() {
    let cluster = gpu_cluster_with(2, &[("IMEX_NODE_DISCONNECTED_GRACE_TIME", "2")]);
    let (d0, d1) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(1).dir().to_path_buf(),
    );
    let (mut exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 91, "exporter on node 0");
    let mut imp = held_importer(&d1, &channel(&cluster, 1, 0), &handle, 91, "importer on 1");
    wait_stats(&d0, NOTICE, "node 0 holds node 1's reference", |s| {
        num(s, "daemon_export_refs") == 1
    });

    cluster
        .signal(0, Signal::SIGSTOP)
        .expect("SIGSTOP node 0's daemon");
    // Lost after the peer timeout, cleaned up 2 s later: node 1's importer of node 0's memory
    // is disabled (the simulated driver kills it, as the real one RCs its channels).
    let status = imp.wait(NOTICE);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the importer of a peer lost past the grace time is revoked: {status:?}"
    );
    let d = cluster
        .wait_domain(1, NOTICE, "node 1 shows node 0 DISCONNECTED", |d| {
            d.connection(1, 0) == Some("DISCONNECTED")
        })
        .expect("D after the clean-up");
    assert_eq!(d.connection(1, 0), Some("DISCONNECTED"));
    wait_stats(&d1, NOTICE, "node 1 holds nothing from node 0", |s| {
        num(s, "import_refs") == 0 && num(s, "import_descriptors") == 0
    });

    // Node 0 comes back as the same instance, still holding the reference for node 1's import
    // that node 1 has dropped: node 1 tells it (an unimport held for its return), node 0
    // releases it, and the domain forms again.
    cluster
        .signal(0, Signal::SIGCONT)
        .expect("SIGCONT node 0's daemon");
    wait_stats(&d0, NOTICE, "node 0 dropped node 1's reference", |s| {
        num(s, "daemon_export_refs") == 0
    });
    cluster.wait_up(0, FORM).expect("UP again");
    assert_eq!(
        exp.ask("verify 91"),
        "ok",
        "the exporter's memory is intact"
    );
    exp.exit();
    wait_all_released(&cluster, "after the exporter exit");
}
