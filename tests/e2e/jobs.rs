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

/// `ctl ARGS` on node `i`, which must succeed: its stdout.
#[track_caller]
pub(crate) fn ctl_ok(cluster: &openimex_harness::Cluster, i: usize, args: &[&str]) -> String {
    let out = cluster.ctl(i, args).expect("run ctl");
    assert!(
        out.status.success(),
        "ctl {args:?} on node {i}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[test]
fn ctl_creates_a_job_as_its_file_waits_for_it_without_polling_and_ends_it() {
    let scratch = ScratchDir::new("e2e-jobs-ctl").expect("scratch dir");
    let jobs = scratch.path().join("jobs");
    std::fs::create_dir_all(&jobs).expect("jobs dir");
    let dir = jobs.display().to_string();
    let cluster = gpu_cluster_with(3, &[("OPENIMEX_JOBS_DIR", dir.as_str())]);
    let (a, b) = (cluster.node(0).ip(), cluster.node(1).ip());
    let members = format!("{a},{b}");
    let create = [
        "jobs",
        "create",
        "w",
        "--channel",
        "3",
        "--members",
        &members,
    ];

    // A waiter started before the job exists is answered when it is READY.
    let mut waiter = cluster
        .ctl_command(1, &["jobs", "wait", "w", "--timeout", "60"])
        .expect("ctl command");
    let waiter = waiter
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start ctl jobs wait");

    // The daemon writes the job file a prolog would write, and holds the job when it answers.
    let said = ctl_ok(&cluster, 0, &create);
    assert!(said.starts_with("job w created ("), "{said}");
    let file = std::fs::read_to_string(jobs.join("w.job")).expect("the job file is the record");
    assert!(
        file.contains("CHANNEL=3\n") && file.contains(&format!("MEMBERS={members}\n")),
        "{file}"
    );
    assert!(channel(&cluster, 0, 3).exists(), "channel3 created");
    // ...and usable: the job's processes open it (a device no driver answers would not open).
    let (exp, _) = exporter(
        cluster.node(0).dir(),
        &channel(&cluster, 0, 3),
        5,
        "an exporter on the job's new channel",
    );
    exp.exit();
    // The same job again (the other member's prolog, here on one shared directory) is no change.
    let again = ctl_ok(&cluster, 1, &create);
    assert!(again.contains("was defined so already"), "{again}");
    let out = waiter.wait_with_output().expect("ctl jobs wait ends");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "READY\n");
    assert_eq!(ctl_ok(&cluster, 0, &["jobs", "wait", "w"]), "READY\n");
    // NVIDIA's table and JSON, restricted to the job's members (what DRA's probe and DCGM read).
    let doc: serde_json::Value =
        serde_json::from_str(&ctl_ok(&cluster, 0, &["-N", "-j", "--job", "w"])).expect("JSON");
    let nodes = doc["nodes"].as_object().expect("nodes");
    assert_eq!(nodes.keys().collect::<Vec<_>>(), ["0", "1"], "{doc}");
    assert_eq!(doc["nodes"]["1"]["connections"]["0"]["status"], "CONNECTED");
    assert_eq!(doc["status"], "UP");
    let table = ctl_ok(&cluster, 1, &["-N", "--job", "w"]);
    assert!(
        table.contains("Domain State: UP") && !table.contains("Node #2"),
        "{table}"
    );

    // Another definition under the name is refused, not written over the record.
    let other = [
        "jobs",
        "create",
        "w",
        "--channel",
        "4",
        "--members",
        &members,
    ];
    let out = cluster.ctl(0, &other).expect("run ctl");
    let err = assert_clean_failure(&out, "a second definition of w");
    assert!(err.contains("defines this job otherwise"), "{err}");
    // A member outside the nodes file, named with the fix.
    let bad = [
        "jobs",
        "create",
        "x",
        "--channel",
        "5",
        "--members",
        "10.9.9.9",
    ];
    let out = cluster.ctl(0, &bad).expect("run ctl");
    let err = assert_clean_failure(&out, "a member not in the nodes file");
    assert!(err.contains("10.9.9.9") && err.contains("job x"), "{err}");
    assert!(!jobs.join("x.job").exists(), "a refused job leaves no file");
    // A job is created on its members: node 2 is not one of w's.
    let out = cluster.ctl(2, &other).expect("run ctl");
    let err = assert_clean_failure(&out, "a job created on a node outside it");
    assert!(err.contains("is not among its members"), "{err}");
    // Over TCP, where any local user reaches the port, nobody creates a job.
    let port = cluster.node(0).cmd_port().to_string();
    let ip = a.to_string();
    let mut tcp = std::process::Command::new(crate::common::binary());
    tcp.args(["ctl", "-i", &ip, &port]).args(create);
    let err = assert_clean_failure(&run(&mut tcp), "jobs create over TCP");
    assert!(err.contains("only on the command unix socket"), "{err}");
    // A wait that runs out says where the job stands.
    let out = cluster
        .ctl(2, &["jobs", "wait", "w", "--timeout", "1"])
        .expect("run ctl");
    let err = assert_clean_failure(&out, "wait for a job node 2 is not in");
    assert!(
        err.contains("job w is not held on this daemon, not READY, after 1 s"),
        "{err}"
    );

    // End: the file goes, both members end the job, and its channel is removed.
    let ended = ctl_ok(&cluster, 0, &["jobs", "end", "w"]);
    assert!(ended.starts_with("job w ended ("), "{ended}");
    assert!(!jobs.join("w.job").exists());
    assert_eq!(
        ctl_ok(&cluster, 1, &["jobs", "wait", "w", "--state", "gone"]),
        "GONE\n"
    );
    assert!(!channel(&cluster, 0, 3).exists(), "channel3 removed");
    let out = cluster.ctl(0, &["jobs", "end", "w"]).expect("run ctl");
    let err = assert_clean_failure(&out, "ending a job twice");
    assert!(err.contains("no job file"), "{err}");
}
