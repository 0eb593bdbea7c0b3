//! Where `demo --jobs K` puts its jobs: which trays each job takes, its name and channel, and
//! every count the demo must reach (imports inside the jobs, cross-job attempts), computed from
//! the layout alone so that the run is checked against numbers it did not produce.
//!
//! With N trays running, job j takes the consecutive trays `b(j)..=b(j+1)`, where
//! `b(j) = ⌊j(N−1)/K⌋`: the windows cover every tray, and neighbouring jobs share exactly their
//! boundary tray, which runs both (e.g. 18 trays, 4 jobs: 0-4, 4-8, 8-12, 12-17). Each window
//! needs 2 trays or more (so that `b` strictly grows), hence 1 to N−1 jobs; and no tray is in
//! more than two jobs. Job j is named `jobJ` and owns channel j+1: channel 0 is the one every
//! simulated driver creates at start on every node, a job's own channel exists only where the
//! job is defined.

use std::ops::Range;

use anyhow::{Result, bail};

/// One job of the demo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Job {
    /// Its name (the job file's stem).
    pub(crate) name: String,
    /// Its IMEX channel.
    pub(crate) channel: u32,
    /// Its trays (node indices), consecutive.
    pub(crate) trays: Range<usize>,
}

/// The jobs over the running trays.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) jobs: Vec<Job>,
    /// Trays running.
    trays: usize,
    gpus_per_tray: usize,
}

impl Layout {
    /// `k` jobs over `trays` trays of `gpus_per_tray` GPUs each; refuses a `k` the trays
    /// cannot hold, naming the flag and the fix.
    pub(crate) fn new(trays: usize, k: usize, gpus_per_tray: usize) -> Result<Self> {
        if k == 0 {
            bail!(
                "--jobs 0: give 1 or more jobs (job j takes a window of consecutive trays \
                 overlapping its neighbours' by one tray)"
            );
        }
        if trays < 2 || k > trays - 1 {
            bail!(
                "--jobs {k}: {trays} tray{} running, and {k} jobs whose windows of 2 or more \
                 trays overlap by one tray need at least {} trays; ask for 1 to {} jobs, or run \
                 more trays (--nodes)",
                if trays == 1 { " is" } else { "s are" },
                k + 1,
                trays.saturating_sub(1).max(1)
            );
        }
        let b = |j: usize| j * (trays - 1) / k;
        let jobs = (0..k)
            .map(|j| Job {
                name: format!("job{j}"),
                channel: u32::try_from(j + 1).unwrap_or(u32::MAX),
                trays: b(j)..b(j + 1) + 1,
            })
            .collect();
        Ok(Self {
            jobs,
            trays,
            gpus_per_tray,
        })
    }

    /// Whether job `j` runs on tray `tray`.
    pub(crate) fn has(&self, j: usize, tray: usize) -> bool {
        self.jobs[j].trays.contains(&tray)
    }

    /// The GPUs of job `j` (one application each, exporting and importing).
    pub(crate) fn gpus(&self, j: usize) -> usize {
        self.jobs[j].trays.len() * self.gpus_per_tray
    }

    /// The applications of all jobs: a GPU of a tray shared by two jobs runs one per job.
    pub(crate) fn apps(&self) -> usize {
        (0..self.jobs.len()).map(|j| self.gpus(j)).sum()
    }

    /// The most GPUs one job has (each exporter keeps a slot per importer of its job).
    pub(crate) fn largest(&self) -> usize {
        (0..self.jobs.len())
            .map(|j| self.gpus(j))
            .max()
            .unwrap_or(0)
    }

    /// Imports inside the jobs: every GPU of a job imports every other GPU's export of it.
    pub(crate) fn imports(&self) -> usize {
        (0..self.jobs.len())
            .map(|j| self.gpus(j) * self.gpus(j).saturating_sub(1))
            .sum()
    }

    /// Cross-job attempts on the importer's own channel: every application of a job imports
    /// every export of every other job.
    pub(crate) fn own_channel_attempts(&self) -> usize {
        let all = self.apps();
        (0..self.jobs.len())
            .map(|j| self.gpus(j) * (all - self.gpus(j)))
            .sum()
    }

    /// Cross-job attempts holding the exporter's job's channel: every GPU of a tray outside
    /// job j opens channel j on its node and imports every export of job j.
    pub(crate) fn held_channel_attempts(&self) -> usize {
        (0..self.jobs.len())
            .map(|j| self.gpus(j) * (self.trays - self.jobs[j].trays.len()) * self.gpus_per_tray)
            .sum()
    }

    /// One line for the text output: each job's trays and channel.
    pub(crate) fn describe(&self) -> String {
        let jobs: Vec<String> = (self.jobs.iter())
            .map(|j| {
                format!(
                    "{} trays {}-{} channel {}",
                    j.name,
                    j.trays.start,
                    j.trays.end - 1,
                    j.channel
                )
            })
            .collect();
        jobs.join(", ")
    }

    /// The layout for `--json`.
    pub(crate) fn json(&self) -> serde_json::Value {
        (self.jobs.iter().enumerate())
            .map(|(j, job)| {
                serde_json::json!({
                    "name": job.name,
                    "channel": job.channel,
                    "trays": job.trays.clone().collect::<Vec<usize>>(),
                    "gpus": self.gpus(j),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(l: &Layout) -> Vec<(usize, usize)> {
        l.jobs
            .iter()
            .map(|j| (j.trays.start, j.trays.end - 1))
            .collect()
    }

    #[test]
    fn windows_cover_every_tray_and_neighbours_share_one() {
        let l = Layout::new(18, 4, 4).expect("18 trays, 4 jobs");
        assert_eq!(windows(&l), [(0, 4), (4, 8), (8, 12), (12, 17)]);
        assert_eq!(
            l.describe().split(", ").next(),
            Some("job0 trays 0-4 channel 1")
        );
        // 20, 20, 20 and 24 GPUs.
        assert_eq!(l.imports(), 3 * 20 * 19 + 24 * 23);
        assert_eq!(l.own_channel_attempts(), 84 * 84 - (3 * 400 + 576));
        assert_eq!(l.held_channel_attempts(), 3 * 20 * 13 * 4 + 24 * 12 * 4);
        let l = Layout::new(4, 3, 2).expect("the most jobs 4 trays hold");
        assert_eq!(windows(&l), [(0, 1), (1, 2), (2, 3)]);
        let l = Layout::new(5, 1, 2).expect("one job");
        assert_eq!(windows(&l), [(0, 4)]);
        assert_eq!(l.own_channel_attempts() + l.held_channel_attempts(), 0);
        for k in 1..18 {
            let l = Layout::new(18, k, 1).expect("1 to 17 jobs");
            for tray in 0..18 {
                let n = (0..k).filter(|j| l.has(*j, tray)).count();
                assert!((1..=2).contains(&n), "k {k}: tray {tray} in {n} jobs");
            }
            assert!(l.jobs.iter().all(|j| j.trays.len() >= 2), "k {k}");
        }
    }

    #[test]
    fn bad_counts_name_the_flag_and_the_fix() {
        let e = Layout::new(4, 0, 2).expect_err("no jobs");
        assert!(e.to_string().contains("--jobs 0: give 1 or more"), "{e}");
        let e = Layout::new(4, 4, 2).expect_err("4 jobs on 4 trays");
        assert!(
            e.to_string()
                .contains("ask for 1 to 3 jobs, or run more trays (--nodes)"),
            "{e}"
        );
        let e = Layout::new(1, 1, 2).expect_err("one tray");
        assert!(e.to_string().contains("1 tray is running"), "{e}");
    }
}
