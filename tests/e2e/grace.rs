//! Peer loss with a grace time, end to end (`IMEX_NODE_DISCONNECTED_GRACE_TIME` as imex-guide
//! §1 and "Connections, Quorum, and Clean up" define it; docs/reference/driver-interface.md §4 "Peer node dies
//! or disconnects").
//!
//! - Issue 7 item 3: the exporter's daemon hangs (SIGSTOP: no reset, only heartbeats tell);
//!   after the grace time the importer's node disables (kills) the importer of its memory and
//!   shows it DISCONNECTED; once the exporter's node is back (the same instance), it is told to
//!   drop the reference it held for that import, and the domain is UP again.
//! - Issue 28: the pair is partitioned (a network cut through the harness's TCP proxies, not a
//!   frozen daemon) past the grace time, so both sides clean up, and healed inside the fence
//!   margin that follows, before the exporter's release step: the imports made after the heal
//!   are live, and that step must not release their references.

use std::thread;
use std::time::{Duration, Instant};

use openimex_harness::chaos::partition;
use openimex_harness::{Cluster, GpuSpec, PeerView, PeersView, Signal};

use crate::apps::*;
use crate::common::{FORM, NOTICE, log, spec, unix_ms};

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

/// Node 0's row for node 1 in `ctl --peers -j`.
#[track_caller]
fn peer_1(v: &PeersView) -> &PeerView {
    v.peer(1)
        .unwrap_or_else(|| panic!("node 0 has no row for node 1: {}", v.compact()))
}

/// When node 0 last cleaned node 1 up (`time_unix_ms` of the latest clean-up in `ctl --peers
/// -j`).
#[track_caller]
fn last_cleanup_unix_ms(v: &PeersView) -> u64 {
    let row = v.raw["peers"]
        .as_array()
        .and_then(|peers| peers.iter().find(|p| p["node"] == 1));
    let at = row
        .and_then(|p| p["cleanups"].as_array())
        .and_then(|c| c.last())
        .and_then(|c| c["time_unix_ms"].as_u64());
    at.unwrap_or_else(|| panic!("no clean-up time for node 1: {}", v.compact()))
}

/// The lines of node 0's log since byte `from` that tell of references released or peers
/// cleaned up, for failure messages.
fn releases_logged(cluster: &Cluster, from: usize) -> String {
    // The daemon writes its log a moment after its state changes.
    thread::sleep(Duration::from_millis(500));
    let text = log(cluster, 0);
    let fresh = text.get(from..).unwrap_or_default();
    let lines: Vec<&str> = fresh
        .lines()
        .filter(|l| l.contains("releasing") || l.contains("cleaned up"))
        .collect();
    lines.join("\n")
}

/// Issue 28 (found by the deterministic simulation), with real processes: node 0 exports,
/// node 1 imports; the pair is cut apart (TCP proxies between the daemons stop forwarding and
/// leave the connections open, a pulled cable) for longer than the peer timeout plus the grace
/// time, so both sides clean up: node 1 disables its importer of node 0's memory and shows node
/// 0 DISCONNECTED, node 0 fences node 1 and, a fence margin later (peer timeout + two
/// heartbeats), would release the references it holds for node 1's importers. The cable is
/// back inside that margin; once the domain is UP, node 1 imports node 0's memory again. Those
/// imports are new and live: they write and read node 0's memory, checked against the
/// exporter's view, until seconds after the release step would have come, and node 0 holds
/// their references all along (its release step, cancelled by the reconnection, released
/// nothing). Everything is released once they and the exporter exit. docs/reference/driver-interface.md §4
/// "Peer node dies or disconnects"; IMEX guide "Connections, Quorum, and Clean up".
#[test]
fn imports_made_after_a_partition_healed_inside_the_fence_margin_keep_their_references() {
    // The grace time below, in ms.
    const GRACE_MS: u64 = 2000;
    let mut s = spec(2)
        .with_gpus(GpuSpec::default())
        .with_names()
        .config("IMEX_NODE_DISCONNECTED_GRACE_TIME", "2");
    // The harness's defaults, named here because the margin is computed from them.
    s.heartbeat_ms = 500;
    s.peer_timeout_ms = 3000;
    let (peer_timeout, margin) = (s.peer_timeout_ms, s.peer_timeout_ms + 2 * s.heartbeat_ms);
    let mut cluster = Cluster::prepare(s).expect("prepare the nodes");
    // Each daemon reaches the other through these.
    let links = partition::links(&mut cluster).expect("a proxy pair between the two daemons");
    for i in 0..2 {
        cluster.start_node(i).expect("start node");
    }
    cluster.wait_up(0, FORM).expect("domain UP");
    for i in 0..2 {
        wait_session(&cluster, i);
    }
    let (d0, d1) = (
        cluster.node(0).dir().to_path_buf(),
        cluster.node(1).dir().to_path_buf(),
    );
    let (mut exp, handle) = exporter(&d0, &channel(&cluster, 0, 0), 93, "exporter on node 0");
    let mut old = held_importer(&d1, &channel(&cluster, 1, 0), &handle, 93, "importer on 1");
    wait_stats(&d0, NOTICE, "node 0 holds node 1's reference", |s| {
        num(s, "daemon_export_refs") == 1
    });

    // The cut. Node 1 disables its importer of node 0's memory after the peer timeout plus the
    // grace time, and node 0 fences node 1 at about the same time.
    let cut = Instant::now();
    partition::cut(&links, 0, true);
    let status = old.wait(NOTICE);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the importer of a peer lost past the grace time is revoked: {status:?}"
    );
    let v0 = cluster
        .wait_peers(0, NOTICE, "node 0 cleaned node 1 up", |v| {
            v.peer(1).is_some_and(|p| p.cleanups_total >= 1)
        })
        .expect("node 0's clean-up of node 1");
    let fenced = last_cleanup_unix_ms(&v0);
    let release_step = fenced + margin;
    let p = peer_1(&v0);
    assert_eq!(p.status, "DISCONNECTED", "{}", v0.compact());
    assert!(
        p.cleanups
            .last()
            .is_some_and(|c| c.reason.contains("grace")),
        "node 0 cleaned node 1 up for the grace time: {}",
        v0.compact()
    );
    assert_eq!(
        p.exports_held,
        1,
        "node 0 still holds the reference of node 1's first import inside the fence margin: {}",
        v0.compact()
    );
    let d = cluster
        .wait_domain(1, NOTICE, "node 1 shows node 0 DISCONNECTED", |d| {
            d.connection(1, 0) == Some("DISCONNECTED")
        })
        .expect("node 1's view after its clean-up");
    assert_eq!(d.connection(1, 0), Some("DISCONNECTED"));

    // The heal, inside the margin: node 0's release step is still ahead.
    let log_at_heal = log(&cluster, 0).len();
    partition::cut(&links, 0, false);
    let healed = unix_ms();
    assert!(
        healed < release_step,
        "the links came back {} ms after node 0's release step ({} ms after the cut): the test \
         never healed inside the fence margin",
        healed.saturating_sub(release_step),
        cut.elapsed().as_millis()
    );
    cluster
        .wait_up(1, NOTICE)
        .expect("UP again as node 1 sees it");
    cluster
        .wait_up(0, NOTICE)
        .expect("UP again as node 0 sees it");

    // When a release step that the reconnection failed to cancel would come: a fence margin
    // after node 0's fence, or, as the core puts it off for a peer whose hello it answered
    // while that peer was still lost here (node 1's, at the heal), up to a grace time, a margin
    // and two peer timeouts after that answer (openimex-core `node/grace.rs`).
    let latest_release = release_step.max(healed + GRACE_MS + margin + 2 * peer_timeout);

    // New imports of the same memory, made after the heal: import IDs 1 and 2 (the first
    // import had 0), so each is its own descriptor, trip through the daemons and reference on
    // node 0 (imports of one handle with one ID share them).
    let mut new: Vec<Held> = (1..=2)
        .map(|id| {
            let id = id.to_string();
            let args = ["--hold", "--verify", "93", "--import-id", &id];
            let mut cmd = importer(&d1, &channel(&cluster, 1, 0), &handle, &args);
            let held = Held::spawn(
                &format!("new importer (import ID {id}) on node 1"),
                &mut cmd,
            );
            held.expect_holding();
            held
        })
        .collect();
    let imported = unix_ms();
    eprintln!(
        "cut {} ms ago; node 0 fenced node 1 {} ms before the heal; UP again and imported {} ms \
         after the heal, {} ms before node 0's release step (fence + {margin} ms)",
        cut.elapsed().as_millis(),
        healed.saturating_sub(fenced),
        imported.saturating_sub(healed),
        release_step.saturating_sub(imported),
    );
    assert!(
        imported < release_step,
        "the new imports came {} ms after node 0's release step: the reconnection took longer \
         than the fence margin left, and the test exercised nothing",
        imported.saturating_sub(release_step)
    );
    // Node 1's first import was dropped there: node 1 told node 0 on its return, and node 0
    // holds exactly the two new references.
    wait_stats(&d0, NOTICE, "node 0 holds the two new references", |s| {
        num(s, "daemon_export_refs") == 2
    });

    // The new importers write and read node 0's memory, and node 0 holds their references,
    // until 2 s past the latest release step.
    let mut seed = 1000u64;
    let mut rounds = 0;
    while unix_ms() < latest_release + 2000 || rounds < 3 {
        rounds += 1;
        let when = format!(
            "round {rounds}, {} ms after node 0's release step",
            unix_ms() as i64 - release_step as i64
        );
        for w in 0..2 {
            seed += 1;
            let written = new[w].ask(&format!("write {seed}"));
            assert_eq!(
                written,
                format!("written {SIZE_BYTES}"),
                "{when}: {}",
                new[w].what
            );
            for (k, reader) in new.iter_mut().enumerate().filter(|(k, _)| *k != w) {
                let got = reader.ask(&format!("verify {seed}"));
                assert_eq!(
                    got, "ok",
                    "{when}: importer {k} reads what importer {w} wrote"
                );
            }
            let got = exp.ask(&format!("verify {seed}"));
            assert_eq!(
                got, "ok",
                "{when}: the exporter reads what importer {w} wrote"
            );
        }
        seed += 1;
        let written = exp.ask(&format!("write {seed}"));
        assert_eq!(written, format!("written {SIZE_BYTES}"), "{when}: exporter");
        for (k, reader) in new.iter_mut().enumerate() {
            let got = reader.ask(&format!("verify {seed}"));
            assert_eq!(
                got, "ok",
                "{when}: importer {k} reads what the exporter wrote"
            );
        }
        let refs = num(&stats(&d0), "daemon_export_refs");
        let v0 = cluster.peers(0).expect("ctl --peers -j on node 0");
        if refs != 2 || peer_1(&v0).exports_held != 2 {
            panic!(
                "{when}: node 0 must still hold the two live imports' references (driver: \
                 {refs}); {}; node 0's log since the heal:\n{}",
                v0.compact(),
                releases_logged(&cluster, log_at_heal)
            );
        }
        thread::sleep(Duration::from_millis(200));
    }
    let v0 = cluster.peers(0).expect("ctl --peers -j on node 0");
    let p = peer_1(&v0);
    assert_eq!(p.status, "CONNECTED", "{}", v0.compact());
    assert_eq!(
        p.cleanups_total,
        1,
        "one loss, one clean-up: {}",
        v0.compact()
    );
    if p.cleanups.last().map(|c| c.exports_released) != Some(0) {
        panic!(
            "the release step must release nothing (the first import's reference goes back \
             through node 1's unimport): {}; node 0's log since the heal:\n{}",
            v0.compact(),
            releases_logged(&cluster, log_at_heal)
        );
    }
    eprintln!(
        "{rounds} rounds of writes and reads, the last {} ms after node 0's release step, {} ms \
         after the latest one",
        unix_ms().saturating_sub(release_step),
        unix_ms().saturating_sub(latest_release)
    );

    for imp in new {
        imp.exit();
    }
    exp.exit();
    wait_all_released(&cluster, "after the new importers and the exporter exit");
    cluster
        .wait_peers(0, NOTICE, "node 0 holds nothing for node 1", |v| {
            v.peer(1).is_some_and(|p| p.exports_held == 0)
        })
        .expect("node 0's view at the end");
}
