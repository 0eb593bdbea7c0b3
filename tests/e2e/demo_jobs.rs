//! `openimex-lab demo --jobs K` (issue 31): K concurrent jobs over overlapping windows of trays,
//! each defined by job files in its members' jobs directories and waited for READY; the
//! all-to-all within each job, and every import across jobs refused. The counts the demo must
//! reach are computed here from the layout its flag documents, not read back from it.

use std::ops::Range;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use crate::apps::num;
use crate::common::{assert_clean_failure, lab_binary, run_long, text};

/// Time allowed for a whole demo.
const DEMO: Duration = Duration::from_secs(300);
/// GPUs per tray in the runs below.
const GPUS: usize = 2;

/// `openimex-lab demo ARGS --json`, within [`DEMO`].
fn demo(args: &[&str]) -> Output {
    let mut cmd = Command::new(lab_binary());
    cmd.arg("demo").args(args).arg("--json");
    run_long(&mut cmd, DEMO)
}

/// The jobs' trays as `--jobs` documents them: with N trays, job j takes trays
/// floor(j(N-1)/K) ..= floor((j+1)(N-1)/K).
fn windows(trays: usize, k: usize) -> Vec<Range<usize>> {
    (0..k)
        .map(|j| j * (trays - 1) / k..(j + 1) * (trays - 1) / k + 1)
        .collect()
}

#[test]
fn demo_jobs_runs_each_jobs_all_to_all_and_refuses_every_import_across_jobs() {
    let (trays, k) = (4, 2);
    let jobs = windows(trays, k);
    // Job 0 on trays 0-1, job 1 on trays 1-3: tray 1 runs both.
    assert_eq!(jobs, [0..2, 1..4]);
    let gpus: Vec<usize> = jobs.iter().map(|t| t.len() * GPUS).collect();
    let apps: usize = gpus.iter().sum();
    // Within a job, every GPU imports every other GPU's export.
    let imports: usize = gpus.iter().map(|g| g * (g - 1)).sum();
    // Across jobs, each application imports every other job's exports on its own channel, and
    // each GPU of a tray outside a job imports that job's exports holding its channel.
    let own: usize = gpus.iter().map(|g| g * (apps - g)).sum();
    let held: usize = (jobs.iter().zip(&gpus))
        .map(|(t, g)| g * (trays - t.len()) * GPUS)
        .sum();
    assert_eq!((imports, own, held), (42, 48, 28), "the layout by hand");

    let out = demo(&[
        "--nodes",
        &trays.to_string(),
        "--gpus-per-node",
        &GPUS.to_string(),
        "--jobs",
        &k.to_string(),
    ]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "demo --jobs failed: {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        text(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let s: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("JSON ({e}): {last:?}"));
    for (key, want) in [
        ("jobs", k),
        ("errors", 0),
        ("leaked_refs", 0),
        ("imports", imports),
        ("cross_job_expected", own + held),
        ("cross_job_refused", own + held),
        ("cross_job_served", 0),
    ] {
        assert_eq!(num(&s, key), want as u64, "{key}: {s}");
    }
    for (j, t) in jobs.iter().enumerate() {
        let want: Vec<usize> = t.clone().collect();
        assert_eq!(s["job_layout"][j]["trays"], serde_json::json!(want), "{s}");
    }
    // Every pair of a job checked its slot both ways (2 MiB buffers, a slot per GPU of the
    // largest job, in 8-byte words).
    let slot = (2 << 20) / 6 / 8 * 8;
    assert_eq!(
        num(&s, "bytes_verified"),
        (2 * imports * slot) as u64,
        "{s}"
    );
    // READY measured for each job on all its members.
    let ready = s["job_ready_ms"]
        .as_array()
        .expect("job_ready_ms is a list");
    assert_eq!(ready.len(), k, "{s}");
    assert!(
        ready.iter().all(|v| v.as_f64().is_some_and(|ms| ms > 0.0)),
        "{s}"
    );
}

#[test]
fn demo_jobs_refuses_counts_and_flags_it_cannot_run_naming_the_fix() {
    for (args, says) in [
        (&["--jobs", "0"][..], "--jobs 0: give 1 or more jobs"),
        (
            &["--nodes", "4", "--jobs", "4"],
            "ask for 1 to 3 jobs, or run more trays (--nodes)",
        ),
        (
            &["--jobs", "2", "--partitions", "2"],
            "--jobs cannot be combined with --partitions",
        ),
        (
            &["--jobs", "2", "--allreduce"],
            "--jobs cannot be combined with --allreduce",
        ),
    ] {
        let err = assert_clean_failure(&demo(args), &format!("demo {args:?}"));
        assert!(err.contains(says), "demo {args:?}: {err}");
    }
}
