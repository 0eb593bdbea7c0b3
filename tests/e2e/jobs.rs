//! Issue 31, through real processes: job files in `OPENIMEX_JOBS_DIR` define a job on its
//! members without a restart, `ctl jobs` shows it READY on each, an import inside it goes and
//! one from a node outside it is refused, and deleting the file ends it (its channel removed).
//! The decisions themselves are tested in core and in virtual time (`crates/imexd/tests/inproc`).

use std::time::{Duration, Instant};

use openimex_harness::ScratchDir;

use crate::apps::*;
use crate::common::{FORM, assert_clean_failure, run, text};

/// `ctl jobs ARGS` on node `i`: its stdout, once it succeeds and `ok` holds for it (at most
/// `FORM`).
#[track_caller]
fn jobs_until(
    cluster: &openimex_harness::Cluster,
    i: usize,
    args: &[&str],
    what: &str,
    ok: impl Fn(&str) -> bool,
) -> String {
    let t0 = Instant::now();
    loop {
        let mut all = vec!["jobs"];
        all.extend_from_slice(args);
        let out = cluster.ctl(i, &all).expect("run ctl");
        let stdout = text(&out.stdout);
        if out.status.success() && ok(&stdout) {
            return stdout;
        }
        assert!(
            t0.elapsed() < FORM,
            "node {i}: {what}: not within {FORM:?}; last: {stdout}{}",
            text(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_job_file_defines_a_job_that_admits_only_its_members_and_ends_with_the_file() {
    let scratch = ScratchDir::new("e2e-jobs").expect("scratch dir");
    let jobs = scratch.path().join("jobs");
    std::fs::create_dir_all(&jobs).expect("jobs dir");
    // One directory for all three daemons (a shared file system): each defines the jobs it is
    // a member of and says why it ignores the others.
    let dir = jobs.display().to_string();
    let cluster = gpu_cluster_with(3, &[("OPENIMEX_JOBS_DIR", dir.as_str())]);
    let members = format!("{},{}", cluster.node(0).ip(), cluster.node(1).ip());
    let tmp = scratch.path().join("a.job");
    std::fs::write(&tmp, format!("# job a\nCHANNEL=0\nMEMBERS={members}\n")).expect("write");
    std::fs::rename(&tmp, jobs.join("a.job")).expect("move the job file in");
    for i in 0..2 {
        jobs_until(&cluster, i, &["a"], "job a READY", |s| s == "READY\n");
        // The same word as a prolog asks it, NVIDIA's way plus the job.
        let q = cluster.ctl(i, &["-q", "--job", "a"]).expect("run ctl");
        assert_eq!(text(&q.stdout), "READY\n", "{}", text(&q.stderr));
    }
    let listed = jobs_until(&cluster, 0, &["-j"], "the list", |_| true);
    let doc: serde_json::Value = serde_json::from_str(&listed).expect("ctl jobs -j is JSON");
    assert_eq!(doc["jobs"][0]["name"], "a");
    assert_eq!(doc["jobs"][0]["members"], serde_json::json!([0, 1]));
    let none = cluster.ctl(2, &["jobs", "a"]).expect("run ctl");
    let err = assert_clean_failure(&none, "ctl jobs a on a node outside it");
    assert!(err.contains("no job a on this daemon"), "{err}");

    let (d0, d1, d2) = (
        cluster.node(0).dir(),
        cluster.node(1).dir(),
        cluster.node(2).dir(),
    );
    let (exp, handle) = exporter(d0, &channel(&cluster, 0, 0), 31, "exporter of job a");
    let out = run(&mut importer(
        d1,
        &channel(&cluster, 1, 0),
        &handle,
        &["--verify", "31"],
    ));
    assert!(
        out.status.success(),
        "a member imports inside the job: {}",
        text(&out.stderr)
    );
    // Node 2 holds no job (its daemon is the domain-wide one), but node 0 serves channel 0
    // only to the members of job a.
    let out = run(&mut importer(
        d2,
        &channel(&cluster, 2, 0),
        &handle,
        &["--verify", "31"],
    ));
    let err = assert_clean_failure(&out, "an import from outside job a");
    // As for an import on another channel, the driver fails the import (INVALID_OBJECT).
    assert!(err.contains("NV_ERR_INVALID_OBJECT"), "{err}");
    let log0 = std::fs::read_to_string(cluster.node(0).log_path()).unwrap_or_default();
    assert!(
        log0.contains("node 2 is not a member of job a"),
        "node 0 says why it refused"
    );

    // The epilog deletes the file: the job ends on both members, and its channel is removed.
    std::fs::remove_file(jobs.join("a.job")).expect("delete the job file");
    for i in 0..2 {
        jobs_until(&cluster, i, &[], "job a gone", |s| !s.contains("READY"));
        let t0 = Instant::now();
        while channel(&cluster, i, 0).exists() {
            assert!(
                t0.elapsed() < FORM,
                "node {i}: channel0 of the ended job removed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    exp.exit();
}
