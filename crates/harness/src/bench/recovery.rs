//! `recovery`: one node of a formed domain is killed with SIGKILL; `recovery_detect` is the
//! time until every surviving node's row of `ctl -N -j` (asked of node 0) shows the victim's
//! column as not CONNECTED. The victim is then started again; `recovery_restart` is the time
//! from its spawn to the domain UP again. A kill -9 closes the victim's sockets, so peers
//! may learn of it from the connection reset; `recovery_hang_detect` stops the victim with
//! SIGSTOP instead (a hung node, or one whose power went: no reset ever arrives), which only
//! the heartbeat and peer timeout can detect, and then resumes it.
//!
//! Baselines: both detections are compared with two heartbeat intervals of the cluster's config (the
//! goal: peers see a killed node within 2 heartbeats), so a ratio ≤ 1 meets it. Restart is
//! compared with a bare process started and accepting on one address in the same round
//! (formation's baseline for one node): what starting a process costs on this machine now.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::cluster::{Cluster, ClusterSpec, is_up};
use crate::domain::DomainView;
use crate::{HarnessError, Signal};

use super::formation::{DAEMON_POLL, ROUND_TIMEOUT, baseline_round};
use super::{BenchEntry, Unit, median, ms, short_error};

/// Limit for the survivors to notice the kill, and for the restarted node to rejoin.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// Forms a domain of `nodes` (at least 2), then `rounds` times kills and restarts its last
/// node. Returns the `recovery_detect` and `recovery_restart` entries (failed entries when the
/// domain never formed or a round timed out).
pub fn recovery(binary: &Path, nodes: usize, rounds: usize) -> Vec<BenchEntry> {
    let spec = ClusterSpec::new(nodes.max(2), binary);
    let (heartbeat_ms, peer_timeout_ms) = (spec.heartbeat_ms, spec.peer_timeout_ms);
    match measure(spec, rounds.max(1)) {
        Ok(Samples {
            detect,
            restart,
            bare,
            hang,
        }) => {
            let n = detect.len();
            vec![
                BenchEntry::measured(
                    "recovery_detect",
                    ms(median(&detect)),
                    Unit::Ms,
                    Some(2.0 * heartbeat_ms as f64),
                    format!(
                        "kill -9 of 1 node of {nodes} until every survivor reports it not \
                         CONNECTED, against 2 heartbeats of {heartbeat_ms} ms; median of {n} \
                         rounds (max {:.0} ms)",
                        ms(detect.iter().copied().max().unwrap_or_default())
                    ),
                ),
                BenchEntry::measured(
                    "recovery_restart",
                    ms(median(&restart)),
                    Unit::Ms,
                    Some(ms(median(&bare))),
                    format!(
                        "restart of the killed node until domain UP, against 1 bare process \
                         to port open; median of {n} rounds"
                    ),
                ),
                BenchEntry::measured(
                    "recovery_hang_detect",
                    ms(median(&hang)),
                    Unit::Ms,
                    Some(2.0 * heartbeat_ms as f64),
                    format!(
                        "SIGSTOP of 1 node of {nodes} until every survivor reports it not \
                         CONNECTED (no connection reset: heartbeats and the peer timeout of \
                         {peer_timeout_ms} ms), against 2 heartbeats; median of {n} rounds"
                    ),
                ),
            ]
        }
        Err(e) => {
            let why = short_error(&e);
            [
                "recovery_detect",
                "recovery_restart",
                "recovery_hang_detect",
            ]
            .into_iter()
            .map(|name| BenchEntry::failed(name, Unit::Ms, why.clone()))
            .collect()
        }
    }
}

/// Every round's times.
struct Samples {
    detect: Vec<Duration>,
    restart: Vec<Duration>,
    bare: Vec<Duration>,
    hang: Vec<Duration>,
}

fn measure(spec: ClusterSpec, rounds: usize) -> Result<Samples, HarnessError> {
    let nodes = spec.nodes;
    let binary = spec.binary.clone();
    let mut cluster = Cluster::start(spec)?;
    cluster.wait_domain_every(0, ROUND_TIMEOUT, DAEMON_POLL, "domain UP", |d| {
        is_up(d, nodes)
    })?;
    let victim = nodes - 1;
    let survivors: Vec<u32> = (0..victim).filter_map(|i| u32::try_from(i).ok()).collect();
    let victim_id = u32::try_from(victim).unwrap_or(u32::MAX);
    // A survivor's row must be there and say so: a missing row is no report.
    let reported = |d: &DomainView| {
        survivors.iter().all(|s| {
            d.connection(*s, victim_id)
                .is_some_and(|c| c != "CONNECTED")
        })
    };
    let up = |d: &DomainView| is_up(d, nodes);
    let mut s = Samples {
        detect: Vec::new(),
        restart: Vec::new(),
        bare: Vec::new(),
        hang: Vec::new(),
    };
    for _ in 0..rounds {
        let start = Instant::now();
        cluster.kill9(victim)?;
        let what = "every survivor to report the killed node";
        cluster.wait_domain_every(0, RECOVERY_TIMEOUT, DAEMON_POLL, what, reported)?;
        s.detect.push(start.elapsed());

        let start = Instant::now();
        cluster.start_node(victim)?;
        let what = "domain UP after the restart";
        cluster.wait_domain_every(0, RECOVERY_TIMEOUT, DAEMON_POLL, what, up)?;
        s.restart.push(start.elapsed());
        s.bare.push(baseline_round(&binary, 1)?);

        let start = Instant::now();
        cluster.signal(victim, Signal::SIGSTOP)?;
        let what = "every survivor to report the stopped node";
        let seen = cluster.wait_domain_every(0, RECOVERY_TIMEOUT, DAEMON_POLL, what, reported);
        let elapsed = start.elapsed();
        // Resumed whatever the wait found, so the domain can come back for the next round.
        cluster.signal(victim, Signal::SIGCONT)?;
        seen?;
        s.hang.push(elapsed);
        let what = "domain UP after the stopped node resumed";
        cluster.wait_domain_every(0, RECOVERY_TIMEOUT, DAEMON_POLL, what, up)?;
    }
    cluster.shutdown()?;
    Ok(s)
}
