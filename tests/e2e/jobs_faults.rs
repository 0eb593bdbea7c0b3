//! Issue 31's bad input and faults, through real processes: malformed job files (file:line,
//! ignored, the daemon unharmed); a member daemon killed (its jobs DEGRADED on the others, the
//! other jobs untouched) and restarted (its jobs back from their files); a job ended under a
//! mapped import (new imports refused, the mapping kept, nothing leaked); a stray exporter that
//! outlives its job (its channel kept from the next job until the owner's word); 10,000 job
//! files.

use std::path::{Path, PathBuf};

use openimex_harness::{Cluster, ScratchDir};

use crate::apps::*;
use crate::common::{FORM, NOTICE, assert_clean_failure, log, run, spec, text, wait_log_line};
use crate::jobs::ctl_ok;

/// Writes job `name` into `dir` whole (elsewhere, then renamed in), as a prolog should.
fn write_job(dir: &Path, name: &str, body: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, body).expect("write a job file");
    std::fs::rename(&tmp, dir.join(format!("{name}.job"))).expect("move the job file in");
}

/// `ctl jobs wait NAME --state STATE` on node `i` (bounded by `FORM`).
#[track_caller]
fn wait_job(cluster: &Cluster, i: usize, name: &str, state: &str) {
    let secs = FORM.as_secs().to_string();
    let args = ["jobs", "wait", name, "--state", state, "--timeout", &secs];
    assert_eq!(ctl_ok(cluster, i, &args), format!("{state}\n"), "node {i}");
}

/// The scratch directory holding the jobs directory `jobs`.
fn scratch_of(jobs: &Path) -> PathBuf {
    jobs.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// A scratch directory for jobs and a three-tray cluster (GPUs) sharing it.
fn cluster_with_jobs(what: &str) -> (ScratchDir, PathBuf, Cluster) {
    let scratch = ScratchDir::new(what).expect("scratch dir");
    let jobs = scratch.path().join("jobs");
    std::fs::create_dir_all(&jobs).expect("jobs dir");
    let dir = jobs.display().to_string();
    let cluster = gpu_cluster_with(3, &[("OPENIMEX_JOBS_DIR", dir.as_str())]);
    (scratch, jobs, cluster)
}

#[test]
fn a_malformed_file_is_named_and_a_killed_member_degrades_only_its_jobs() {
    let (_scratch, jobs, mut cluster) = cluster_with_jobs("e2e-jobs-faults");
    let ip = |i: usize| cluster.node(i).ip().to_string();
    write_job(&jobs, "bad", &format!("CHANNEL=seven\nMEMBERS={}\n", ip(0)));
    let a = format!("CHANNEL=1\nMEMBERS={},{}\n", ip(0), ip(1));
    write_job(&jobs, "a", &a);
    write_job(
        &jobs,
        "b",
        &format!("CHANNEL=2\nMEMBERS={},{}\n", ip(1), ip(2)),
    );
    for (i, job) in [(0, "a"), (1, "a"), (1, "b"), (2, "b")] {
        wait_job(&cluster, i, job, "READY");
    }
    for i in 0..3 {
        let log = log(&cluster, i);
        assert!(
            log.contains("bad.job:1: CHANNEL=\"seven\" is not a channel number"),
            "node {i} names the file, the line and the value"
        );
        assert_eq!(ctl_ok(&cluster, i, &["-q"]), "READY\n", "node {i} unharmed");
        assert!(
            !ctl_ok(&cluster, i, &["jobs"]).contains("bad"),
            "no job bad"
        );
    }

    // Node 0's daemon dies: job a is DEGRADED on node 1 (it was READY), job b untouched.
    cluster.kill9(0).expect("kill node 0's daemon");
    wait_job(&cluster, 1, "a", "DEGRADED");
    let jobs1 = ctl_ok(&cluster, 1, &["jobs", "-j"]);
    let doc: serde_json::Value = serde_json::from_str(&jobs1).expect("JSON");
    let a1 = (doc["jobs"].as_array().expect("jobs").iter())
        .find(|j| j["name"] == "a")
        .expect("job a on node 1");
    assert_eq!(
        a1["nodes"],
        serde_json::json!([0]),
        "it names the lost member"
    );
    for i in [1, 2] {
        assert_eq!(ctl_ok(&cluster, i, &["jobs", "b"]), "READY\n", "node {i}");
    }

    // Restarted, node 0 reads its job file again: job a is back, and works.
    cluster.start_node(0).expect("restart node 0's daemon");
    cluster
        .wait_state(0, "READY", FORM)
        .expect("node 0 READY again");
    for i in [0, 1] {
        wait_job(&cluster, i, "a", "READY");
    }
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let (exp, handle) = exporter(d0, &channel(&cluster, 0, 1), 7, "exporter in job a");
    let out = run(&mut importer(
        d1,
        &channel(&cluster, 1, 1),
        &handle,
        &["--verify", "7"],
    ));
    assert!(
        out.status.success(),
        "import in job a: {}",
        text(&out.stderr)
    );
    exp.exit();
    wait_all_released(&cluster, "after the import in job a");
}

#[test]
fn an_ended_job_keeps_its_mappings_refuses_new_imports_and_its_channel_waits_for_the_owner() {
    let (_scratch, jobs, cluster) = cluster_with_jobs("e2e-jobs-end");
    let ip = |i: usize| cluster.node(i).ip().to_string();
    let a = format!("CHANNEL=1\nMEMBERS={},{}\n", ip(0), ip(1));
    write_job(&jobs, "a", &a);
    for i in [0, 1] {
        wait_job(&cluster, i, "a", "READY");
    }
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    // The exporter will outlive its job: a stray process of job a.
    let (stray, handle) = exporter(d0, &channel(&cluster, 0, 1), 11, "exporter of job a");
    let mut held = held_importer(d1, &channel(&cluster, 1, 1), &handle, 11, "importer in a");
    // The channel as a process of job a that opened it before the end still has it (the
    // simulated driver knows a channel by its file, so the file is kept by another name).
    let kept = scratch_of(&jobs).join("channel1-kept");
    std::fs::hard_link(channel(&cluster, 1, 1), &kept).expect("keep channel1");
    std::fs::remove_file(jobs.join("a.job")).expect("end job a");
    for i in [0, 1] {
        wait_job(&cluster, i, "a", "GONE");
    }
    // What was mapped stays mapped (why: `openimex_core::jobs`, the end of a job).
    assert_eq!(held.ask("verify 11"), "ok", "the held mapping still reads");
    held.exit();
    wait_stats(d1, NOTICE, "node 1's import released", |s| {
        num(s, "import_descriptors") == 0 && num(s, "import_refs") == 0
    });
    assert!(
        !channel(&cluster, 1, 1).exists(),
        "the ended job's channel is removed"
    );
    // A new import under the ended job, on the channel a stray of it still holds, is refused at
    // once with the driver's channel error. (Had another process of the job still held the
    // import, the driver would hand it over from its cache on that channel without asking the
    // daemon: memory of the stray's own job, docs/reference/driver-interface.md §2.)
    std::fs::hard_link(&kept, channel(&cluster, 1, 1)).expect("the channel as still held");
    let out = run(&mut importer(
        d1,
        &channel(&cluster, 1, 1),
        &handle,
        &["--verify", "11"],
    ));
    let err = assert_clean_failure(&out, "an import under the ended job");
    assert!(err.contains("NV_ERR_INVALID_OBJECT"), "{err}");
    std::fs::remove_file(channel(&cluster, 1, 1)).expect("the channel gone again");

    // The next job asks for channel 1 while the stray may still export on it: refused.
    let c = format!("CHANNEL=1\nMEMBERS={},{}\n", ip(0), ip(1));
    write_job(&jobs, "c", &c);
    // Node 0 says why job c is refused.
    wait_log_line(
        &cluster,
        0,
        0,
        &["job c: channel 1 belonged to job a, which ended here"],
    );
    let listed: serde_json::Value =
        serde_json::from_str(&ctl_ok(&cluster, 0, &["jobs", "-j"])).expect("JSON");
    assert_eq!(listed["jobs"], serde_json::json!([]), "no job c: {listed}");
    assert_eq!(listed["quarantinedChannels"], serde_json::json!([1]));
    // Through ctl the same: refused, and no file of it kept.
    let create = ["jobs", "create", "d", "--channel", "1", "--members"];
    let members = format!("{},{}", ip(0), ip(1));
    let out = cluster
        .ctl(0, &[&create[..], &[members.as_str()]].concat())
        .expect("run ctl");
    let err = assert_clean_failure(&out, "ctl jobs create on a quarantined channel");
    assert!(err.contains("did not define it"), "{err}");
    assert!(!jobs.join("d.job").exists(), "nothing kept of job d");
    // Over TCP nobody gives the word.
    let port = cluster.node(0).cmd_port().to_string();
    let mut tcp = std::process::Command::new(crate::common::binary());
    tcp.args(["ctl", "-i", &ip(0), &port, "jobs", "clear", "1"]);
    let err = assert_clean_failure(&run(&mut tcp), "jobs clear over TCP");
    assert!(err.contains("only on the command unix socket"), "{err}");

    // The stray ends too (the epilog runs after the job's processes), nothing is left
    // referenced...
    stray.exit();
    wait_all_released(&cluster, "after job a's processes");
    // ...and the owner says so: channel 1 goes to job c, read at the next look at the files.
    for i in [0, 1] {
        let said = ctl_ok(&cluster, i, &["jobs", "clear", "1"]);
        assert!(said.contains("released (job a ended holding it)"), "{said}");
    }
    write_job(&jobs, "c", &format!("# again\n{c}"));
    for i in [0, 1] {
        wait_job(&cluster, i, "c", "READY");
    }
}

#[test]
fn ten_thousand_job_files_are_read_and_told_in_one_batch() {
    const JOBS: usize = 10_000;
    let scratch = ScratchDir::new("e2e-jobs-10k").expect("scratch dir");
    let jobs = scratch.path().join("jobs");
    std::fs::create_dir_all(&jobs).expect("jobs dir");
    let dir = jobs.display().to_string();
    let mut cluster = Cluster::prepare(spec(3).config("OPENIMEX_JOBS_DIR", dir.as_str()))
        .expect("prepare the nodes");
    let ips: Vec<String> = (0..3).map(|i| cluster.node(i).ip().to_string()).collect();
    let ip = |i: usize| ips[i].clone();
    // Every pair of the three nodes shares a third of the jobs: each node is in two thirds.
    let pairs = [(0, 1), (1, 2), (0, 2)];
    for j in 0..JOBS {
        let (x, y) = pairs[j % 3];
        let body = format!("CHANNEL={}\nMEMBERS={},{}\n", 10 + j, ip(x), ip(y));
        std::fs::write(jobs.join(format!("j{j}.job")), body).expect("write a job file");
    }
    // The daemons start with them there: a restart on a busy node.
    for i in 0..3 {
        cluster.start_node(i).expect("start a node");
    }
    cluster.wait_up(0, FORM).expect("domain UP");
    for i in 0..3 {
        let mine = (0..JOBS)
            .filter(|j| [pairs[j % 3].0, pairs[j % 3].1].contains(&i))
            .count();
        let t0 = std::time::Instant::now();
        loop {
            let listed = ctl_ok(&cluster, i, &["jobs", "-j"]);
            let doc: serde_json::Value = serde_json::from_str(&listed).expect("JSON");
            let all = doc["jobs"].as_array().expect("jobs");
            let ready = all.iter().filter(|j| j["state"] == "READY").count();
            if all.len() == mine && ready == mine {
                break;
            }
            assert!(
                t0.elapsed() < FORM,
                "node {i}: {ready} of {mine} jobs READY ({} held)",
                all.len()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        assert_eq!(ctl_ok(&cluster, i, &["-q"]), "READY\n", "node {i} unharmed");
    }
    // One more job still goes through at once, and deleting them all ends them all.
    let x = format!("CHANNEL=5\nMEMBERS={},{}\n", ip(0), ip(2));
    write_job(&jobs, "x", &x);
    wait_job(&cluster, 2, "x", "READY");
    for entry in std::fs::read_dir(&jobs).expect("list the jobs") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "job") {
            std::fs::remove_file(path).expect("delete a job file");
        }
    }
    wait_job(&cluster, 0, "x", "GONE");
    let t0 = std::time::Instant::now();
    while ctl_ok(&cluster, 1, &["jobs", "-j"]).contains("\"state\"") {
        assert!(t0.elapsed() < FORM, "node 1 ends every job");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
