//! Footprint of a cluster's daemons (peak RSS, CPU%, peak open descriptors, each from
//! [`procfs`](super::procfs)) over a window, next to a bare `openimex listen-probe` process
//! sampled over the same window: the same binary doing nothing but holding a listening socket,
//! so the baseline is what any process of this binary costs on this machine.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::HarnessError;
use crate::cluster::Cluster;

use super::ReadyChild;
use super::procfs::{Usage, Watch};
use super::{BenchEntry, Unit, median_f64};

/// How often peaks are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// How long the baseline process may take to say ready.
const PROBE_READY: Duration = Duration::from_secs(10);

/// Every running daemon's process ID, node order.
pub fn daemon_pids(cluster: &Cluster) -> Vec<u32> {
    (0..cluster.len())
        .filter_map(|i| cluster.node(i).pid())
        .collect()
}

/// What [`watch_during`] saw.
#[derive(Debug, Clone)]
pub struct Footprint {
    /// Each watched daemon.
    pub daemons: Vec<Usage>,
    /// The listen-probe baseline over the same window.
    pub baseline: Usage,
}

/// Runs `during` on this thread while another samples `pids` and a fresh listen-probe every
/// 200 ms; returns what `during` returned and the footprint over its run.
pub fn watch_during<R>(
    binary: &Path,
    pids: &[u32],
    during: impl FnOnce() -> R,
) -> Result<(R, Footprint), HarnessError> {
    let probe = ReadyChild::spawn(binary, ["listen-probe", "127.0.0.1:0"], PROBE_READY)?;
    let mut all = pids.to_vec();
    all.push(probe.pid());
    let mut watch = Watch::start(&all)?;
    let stop = AtomicBool::new(false);
    let result = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(SAMPLE_EVERY);
                watch.poll();
            }
        });
        let r = during();
        stop.store(true, Ordering::Relaxed);
        let _ = sampler.join();
        r
    });
    let mut usage = watch.finish()?;
    drop(probe);
    let baseline = usage.pop().unwrap_or(Usage {
        rss_mib: 0.0,
        cpu_pct: 0.0,
        fds: 0,
    });
    Ok((
        result,
        Footprint {
            daemons: usage,
            baseline,
        },
    ))
}

/// [`watch_during`] of an idle window.
pub fn watch_idle(
    binary: &Path,
    pids: &[u32],
    window: Duration,
) -> Result<Footprint, HarnessError> {
    watch_during(binary, pids, || std::thread::sleep(window)).map(|(_, f)| f)
}

impl Footprint {
    /// Three entries, `footprint_<label>_rss`, `_cpu` and `_fds`: the worst daemon's figure
    /// (the goals are per daemon), its median across daemons in the detail. `what` says what
    /// the daemons were doing.
    pub fn entries(&self, label: &str, what: &str) -> Vec<BenchEntry> {
        let n = self.daemons.len();
        let figure = |name: &str, unit: Unit, get: &dyn Fn(&Usage) -> f64| {
            let all: Vec<f64> = self.daemons.iter().map(get).collect();
            let worst = all.iter().copied().fold(0.0, f64::max);
            BenchEntry::measured(
                format!("footprint_{label}_{name}"),
                worst,
                unit,
                Some(get(&self.baseline)),
                format!(
                    "worst of {n} daemons ({what}), median {:.2}; baseline: a bare listen-probe \
                     process over the same window",
                    median_f64(all)
                ),
            )
        };
        vec![
            figure("rss", Unit::MiB, &|u| u.rss_mib),
            figure("cpu", Unit::Percent, &|u| u.cpu_pct),
            figure("fds", Unit::Fds, &|u| u.fds as f64),
        ]
    }
}

/// The three entries of [`Footprint::entries`], failed with `why`.
pub fn failed_entries(label: &str, why: &str) -> Vec<BenchEntry> {
    [
        ("rss", Unit::MiB),
        ("cpu", Unit::Percent),
        ("fds", Unit::Fds),
    ]
    .into_iter()
    .map(|(name, unit)| BenchEntry::failed(format!("footprint_{label}_{name}"), unit, why))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_report_the_worst_daemon() {
        let u = |rss_mib, cpu_pct, fds| Usage {
            rss_mib,
            cpu_pct,
            fds,
        };
        let f = Footprint {
            daemons: vec![u(10.0, 0.5, 40), u(14.0, 0.2, 38), u(11.0, 0.1, 41)],
            baseline: u(2.0, 0.0, 4),
        };
        let e = f.entries("idle_18", "idle");
        let names: Vec<&str> = e.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "footprint_idle_18_rss",
                "footprint_idle_18_cpu",
                "footprint_idle_18_fds"
            ]
        );
        assert_eq!(e[0].value, Some(14.0));
        assert_eq!(e[0].ratio(), Some(7.0));
        assert_eq!(e[1].value, Some(0.5));
        assert_eq!(e[1].ratio(), None, "an idle baseline of 0% has no ratio");
        assert_eq!(e[2].value, Some(41.0));
        assert!(e[0].detail.contains("median 11.00"));
        let failed = failed_entries("idle_144", "no UP");
        assert!(
            failed
                .iter()
                .all(|e| e.value.is_none() && e.error.is_some())
        );
    }
}
