//! The RECOVERY quorum after an unclean exit (issue 7 item 1; docs/reference/imex-guide.md §4 "persist.dat";
//! docs/reference/driver-interface.md §4: a daemon that dies holding export references leaves fabric
//! allocation disabled, and a new session re-enables it). The exporter's daemon is killed with a
//! live remote import; restarted while the importer's daemon is unreachable, it reports
//! WAITING_FOR_RECOVERY, names the awaited node, and opens no driver session; once the importer
//! is back (and has revoked its importer of the old instance's memory), it opens the session,
//! becomes READY, and its persist record is cleared.

use openimex_harness::{Cluster, Signal};
use serde_json::Value;

use crate::apps::*;
use crate::common::{FORM, NOTICE, text};

fn record(cluster: &Cluster, i: usize) -> String {
    std::fs::read_to_string(cluster.node(i).dir().join("persist.dat")).unwrap_or_default()
}

#[test]
fn a_restart_after_a_crash_waits_for_the_recorded_importers() {
    let mut cluster = gpu_cluster_with(2, &[("IMEX_WAIT_FOR_QUORUM", "RECOVERY")]);
    let (d0, d1) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(1).dir().to_path_buf(),
    );
    let (exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 61, "exporter on node 0");
    let mut imp = held_importer(&d1, &channel(&cluster, 1, 0), &handle, 61, "importer on 1");
    wait_stats(&d0, NOTICE, "node 0 holds node 1's reference", |s| {
        num(s, "daemon_export_refs") == 1
    });
    assert!(
        record(&cluster, 0)
            .lines()
            .any(|l| l.starts_with("node 1 ")),
        "the record names node 1 before it got the pages:\n{}",
        record(&cluster, 0)
    );

    // Crash, with node 1 unreachable when node 0 comes back.
    cluster.kill9(0).expect("kill -9 node 0's daemon");
    cluster.signal(1, Signal::SIGSTOP).expect("SIGSTOP node 1");
    cluster.start_node(0).expect("restart node 0");
    cluster
        .wait_state(0, "WAITING_FOR_RECOVERY", NOTICE)
        .expect("node 0 waits for recovery");
    // No wait for something not to happen: the daemon decides on its driver session before it
    // reports its state (a restart with a persist record goes to WAITING_FOR_RECOVERY without
    // opening one, and opens it only when the recovery ends), so a session opened too early is
    // there by the time ctl reports this state.
    let s0 = stats(&d0);
    assert_eq!(
        s0["session"],
        Value::Bool(false),
        "no driver session (it would re-enable fabric allocation) while node 1 may map the old memory"
    );
    let links = cluster.ctl(0, &["--links", "-j"]).expect("ctl --links -j");
    assert!(
        text(&links.stdout).contains("awaited for recovery"),
        "ctl says who is awaited: {}",
        text(&links.stdout)
    );

    // Node 1 is back: it sees node 0's new instance, revokes its importer, and node 0 opens its
    // session and becomes READY.
    cluster.signal(1, Signal::SIGCONT).expect("SIGCONT node 1");
    let status = imp.wait(NOTICE);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{status:?}"
    );
    cluster
        .wait_state(0, "READY", NOTICE)
        .expect("READY after recovery");
    cluster.wait_up(0, FORM).expect("UP again");
    wait_session(&cluster, 0);
    assert!(
        !record(&cluster, 0).lines().any(|l| l.starts_with("node ")),
        "the record is cleared once recovered:\n{}",
        record(&cluster, 0)
    );
    drop(exp);
}
