//! Issue 31 under a real Slurm: Debian's `slurmctld`, `slurmd` and `munged` run a three-node
//! Slurm cluster on this machine (three `slurmd -N nK`, each on its own port), and each Slurm
//! node is one simulated tray: its openimex daemon (with its own `OPENIMEX_JOBS_DIR`) and GPU
//! driver. `dist/slurm/prolog.sh` and `epilog.sh` run in job mode as Slurm's Prolog and Epilog
//! (`PrologFlags=Alloc`), through a wrapper that gives each node its settings by
//! `SLURMD_NODENAME`. Everything Slurm starts (the jobs' processes included) runs on the node
//! Slurm chose, found by the same name.
//!
//! It shows: an `srun -N3` job whose three tasks import each other's memory on their job's
//! channel; two jobs at once sharing a node whose processes cannot reach each other's memory;
//! a job cancelled mid-run (an import held) that leaves nothing behind: no job file, no channel
//! device, no driver reference, and the same daemons. The Slurm cluster is the test's own
//! (munge key and socket, state, spool, logs and ports in a scratch directory; config by `-f`
//! and `SLURM_CONF`, nothing under /etc) and everything it started is stopped at the end.
//! Without the Slurm programs (or not as root, which slurmd needs to run jobs) the test says
//! it is skipped, unless `OPENIMEX_REQUIRE_SLURM` is set (as `.ci/run` does): then it fails.
//!
//! A second test runs the scripts as slurmd runs them (no PATH, only the job's variables) with
//! a stub scontrol: the job file's keys, the prolog's timeout naming the job's state and the
//! member it waits on, a node missing from the node map, an epilog run twice.

use crate::apps::{Held, NO_NODE, all_released, num, wait_session, wait_stats};
use crate::common::{FORM, NOTICE, assert_clean_failure, binary, lab_binary, spec, text};
use crate::slurm_cluster::*;
use openimex_harness::process::run_with_timeout;
use openimex_harness::{Cluster, GpuSpec};
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The three trays, each daemon with its own jobs directory `<node dir>/jobs`, UP with every
/// driver's session open.
fn trays() -> Cluster {
    let mut cluster =
        Cluster::prepare(spec(NODES.len()).with_gpus(GpuSpec::default())).expect("prepare");
    for i in 0..NODES.len() {
        let jobs = cluster.node(i).dir().join("jobs").display().to_string();
        cluster
            .set_node_config(i, "OPENIMEX_JOBS_DIR", &jobs)
            .expect("config");
    }
    for i in 0..NODES.len() {
        cluster.start_node(i).expect("start");
    }
    cluster.wait_up(0, FORM).expect("domain UP");
    for i in 0..NODES.len() {
        wait_session(&cluster, i);
    }
    cluster
}

fn job_file(cluster: &Cluster, i: usize, job: u32) -> PathBuf {
    cluster
        .node(i)
        .dir()
        .join("jobs")
        .join(format!("slurm-{job}.job"))
}

/// The channel the prolog gives job `job` (no switch/nvidia_imex here, 2048 channels).
fn channel_of(job: u32) -> u32 {
    1 + job % 2047
}

fn channel_file(cluster: &Cluster, i: usize, job: u32) -> PathBuf {
    crate::apps::channel(cluster, i, channel_of(job))
}

/// Waits until node `i` holds no job file, no channel device, no `ctl jobs` entry of `job` and
/// no quarantine of its channel (the epilog released it: Slurm ended the job's processes).
#[track_caller]
fn wait_job_gone(cluster: &Cluster, i: usize, job: u32) {
    let (file, dev) = (job_file(cluster, i, job), channel_file(cluster, i, job));
    let name = format!("slurm-{job}");
    let t0 = Instant::now();
    loop {
        let listed = cluster.ctl(i, &["jobs", "-j"]).expect("ctl jobs");
        let doc: serde_json::Value =
            serde_json::from_str(&text(&listed.stdout)).unwrap_or_default();
        let listed = text(&listed.stdout).contains(&format!("\"{name}\""));
        let kept = (doc["quarantinedChannels"].as_array())
            .is_some_and(|q| q.contains(&serde_json::json!(channel_of(job))));
        if !file.exists() && !dev.exists() && !listed && !kept {
            return;
        }
        assert!(
            t0.elapsed() < NOTICE,
            "node {i} after job {job}: job file there {}, channel device there {}, listed by \
             ctl jobs {listed}, channel quarantined {kept}",
            file.exists(),
            dev.exists()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An exporter step's handle (its first line of output).
#[track_caller]
fn handle_of(held: &Held) -> String {
    let handle = held.line(STEP);
    assert!(
        handle.len() == 128 && handle.bytes().all(|b| b.is_ascii_hexdigit()),
        "{}: the first line must be the handle, got {handle:?}; stderr: {}",
        held.what,
        held.stderr()
    );
    handle
}

#[test]
fn slurm_jobs_import_inside_their_job_only_and_leave_nothing_behind() {
    let programs = match Programs::find() {
        Ok(p) => p,
        Err(why) => {
            // .ci/run installs Slurm and sets this: there, a missing Slurm is a failure.
            assert!(
                std::env::var_os("OPENIMEX_REQUIRE_SLURM").is_none(),
                "Slurm is required (OPENIMEX_REQUIRE_SLURM is set): {why}: apt-get install \
                 slurmctld slurmd munge slurm-client"
            );
            eprintln!("SKIPPED: Slurm jobs: {why} (packages slurmctld slurmd munge slurm-client)");
            return;
        }
    };
    let t_start = Instant::now();
    let mark = |what: &str| eprintln!("slurm_jobs: {what} at {:?}", t_start.elapsed());
    lab_binary();
    mark("lab binary built");
    let cluster = trays();
    let pids: Vec<_> = (0..NODES.len()).map(|i| cluster.node(i).pid()).collect();
    mark("trays UP");
    let slurm = Slurm::start(programs, &cluster);
    mark("Slurm nodes idle");
    let entries: Vec<String> = (0..NODES.len())
        .map(|i| cluster.node(i).ip().to_string())
        .collect();

    // 1. `srun -N3`: Slurm's prologs define the job on all three trays and return once it is
    // READY; each task (on its own node) exports, and imports the other two's memory.
    let out = run_with_timeout(
        &mut slurm.command(
            "srun",
            &[
                "-N3",
                "-n3",
                &format!("{}/all-to-all.sh", slurm.dir.path().display()),
            ],
        ),
        STEP,
    )
    .unwrap_or_else(|e| panic!("srun -N3: {e}"));
    assert!(out.status.success(), "srun -N3: {}", show(&out));
    let stdout = text(&out.stdout);
    let verified = format!("verified {}", 4 << 20);
    // "rank 0 on n1: job slurm-ID channel C READY"
    let said = |rank: usize| {
        let head = format!("rank {rank} on {}: job ", NODES[rank]);
        let Some(rest) = stdout.lines().find_map(|l| l.strip_prefix(&head)) else {
            panic!("no {head:?} line (the task's job as its node sees it) in:\n{stdout}");
        };
        rest.to_string()
    };
    let job1: u32 = (said(0).strip_prefix("slurm-"))
        .and_then(|r| r.split(' ').next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("a job ID in {:?}", said(0)));
    let expected = format!("slurm-{job1} channel {} READY", channel_of(job1));
    for (rank, node) in NODES.iter().enumerate() {
        assert_eq!(said(rank), expected, "rank {rank} on {node}");
        for other in (0..NODES.len()).filter(|r| *r != rank) {
            let line = format!("rank {rank} on {node} imported rank {other}: {verified}");
            assert!(stdout.lines().any(|l| l == line), "{line:?} in:\n{stdout}");
        }
    }
    // The epilogs deleted the job file on every node: the job is gone, its channel removed.
    slurm.wait_gone(&[job1]);
    for i in 0..NODES.len() {
        wait_job_gone(&cluster, i, job1);
    }

    mark("srun -N3 done, its job gone");

    // 2. Two jobs at once sharing n2: A on n1,n2 and B on n2,n3, each with its exporter.
    let (a, b) = (slurm.hold("n1,n2"), slurm.hold("n2,n3"));
    let export = |seed: &'static str| {
        [
            "export",
            "--gpu",
            "0",
            "--size",
            SIZE,
            "--pattern",
            seed,
            "--hold",
        ]
    };
    let exp_a = Held::spawn(
        "job A's exporter on n2",
        &mut slurm.step(a, "n2", &export("41")),
    );
    let handle_a = handle_of(&exp_a);
    let exp_b = Held::spawn(
        "job B's exporter on n3",
        &mut slurm.step(b, "n3", &export("42")),
    );
    let handle_b = handle_of(&exp_b);
    // Both are defined on the shared node, READY, each on its own channel, as the prologs
    // wrote them: the members are the trays' nodes-file entries, the owner the job's user.
    let listed = cluster.ctl(1, &["jobs", "-j"]).expect("ctl jobs");
    let doc: Value = serde_json::from_slice(&listed.stdout).expect("ctl jobs -j is JSON");
    for (job, members) in [(a, [0, 1]), (b, [1, 2])] {
        let name = format!("slurm-{job}");
        let Some(j) = doc["jobs"]
            .as_array()
            .and_then(|js| js.iter().find(|j| j["name"] == name.as_str()))
        else {
            panic!("n2 does not list {name}: {doc}");
        };
        assert_eq!(j["state"], "READY", "{name} on n2: {j}");
        assert_eq!(j["channel"], channel_of(job), "{name} on n2: {j}");
        assert_eq!(
            j["members"],
            serde_json::json!(members),
            "{name} on n2: {j}"
        );
        let (uid, gid) = ids();
        for i in members {
            let body = std::fs::read_to_string(job_file(&cluster, i, job)).expect("job file");
            let keys: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
            let want = format!(
                "CHANNEL={}\nMEMBERS={},{}\nOWNER={uid}:{gid}",
                channel_of(job),
                entries[members[0]],
                entries[members[1]]
            );
            assert_eq!(keys.join("\n"), want, "{name}'s job file on {}", NODES[i]);
        }
    }
    assert!(!job_file(&cluster, 2, a).exists() && !job_file(&cluster, 0, b).exists());
    // Inside each job, an import goes (A: n1 from n2; B: the shared n2 from n3).
    for (job, node, handle, seed) in [(a, "n1", &handle_a, "41"), (b, "n2", &handle_b, "42")] {
        let out =
            run_step(&mut slurm.step(job, node, &["import", "--handle", handle, "--verify", seed]));
        assert!(
            out.status.success(),
            "job {job} on {node}, inside: {}",
            show(&out)
        );
        assert_eq!(text(&out.stdout).trim(), verified, "job {job} on {node}");
    }
    // Across jobs, each is refused with the driver's error: from another node, the exporter's
    // daemon serves the import to no member of the exporting job on that channel
    // (INVALID_OBJECT); on the shared node, the driver finds the export on another channel
    // than the importer's (INSUFFICIENT_PERMISSIONS). B's processes cannot import A's memory,
    // nor A's B's.
    let (remote, local) = ("NV_ERR_INVALID_OBJECT", "NV_ERR_INSUFFICIENT_PERMISSIONS");
    for (job, node, handle, seed, error) in [
        (b, "n3", &handle_a, "41", remote),
        (b, "n2", &handle_a, "41", local),
        (a, "n1", &handle_b, "42", remote),
        (a, "n2", &handle_b, "42", remote),
    ] {
        let out =
            run_step(&mut slurm.step(job, node, &["import", "--handle", handle, "--verify", seed]));
        let what = format!("job {job}'s process on {node} importing the other job's memory");
        let err = assert_clean_failure(&out, &what);
        assert!(err.contains(error), "{what}: {error} expected: {err}");
        assert!(
            !text(&out.stdout).contains("verified"),
            "{what}: {}",
            show(&out)
        );
    }
    slurm.cancel(&[a, b]);
    slurm.wait_gone(&[a, b]);
    for (job, nodes) in [(a, [0, 1]), (b, [1, 2])] {
        for i in nodes {
            wait_job_gone(&cluster, i, job);
        }
    }
    drop((exp_a, exp_b));

    mark("two jobs done");

    // 3. A job cancelled mid-run: an export on n1 imported and held on n3, then scancel.
    let c = slurm.hold("n1,n3");
    let mut exp_c = Held::spawn(
        "job C's exporter on n1",
        &mut slurm.step(c, "n1", &export("43")),
    );
    let handle_c = handle_of(&exp_c);
    let mut imp_c = Held::spawn(
        "job C's importer on n3",
        &mut slurm.step(
            c,
            "n3",
            &["import", "--handle", &handle_c, "--hold", "--verify", "43"],
        ),
    );
    imp_c.expect_holding();
    wait_stats(
        cluster.node(0).dir(),
        NOTICE,
        "n1 holds n3's reference",
        |s| num(s, "daemon_export_refs") == 1,
    );
    for i in [0, 2] {
        assert!(
            job_file(&cluster, i, c).exists(),
            "job C's file on {}",
            NODES[i]
        );
        assert!(
            channel_file(&cluster, i, c).exists(),
            "job C's channel on {}",
            NODES[i]
        );
    }
    assert!(!job_file(&cluster, 1, c).exists(), "n2 is not in job C");
    slurm.cancel(&[c]);
    // Slurm ends the job's processes (signalled, the steps end: each srun returns), then runs
    // the epilogs. Whether a signalled app exits 0 is its own business; that it released
    // everything is checked in the drivers below.
    for held in [&mut exp_c, &mut imp_c] {
        held.wait(NOTICE);
    }
    slurm.wait_gone(&[c]);
    for i in [0, 2] {
        wait_job_gone(&cluster, i, c);
    }
    // Nothing of any job is left in a driver: no reference, no memory, the session kept.
    for (i, name) in NODES.iter().enumerate() {
        wait_stats(
            cluster.node(i).dir(),
            NOTICE,
            &format!("{name}: all released"),
            |s| all_released(s) && num(s, "node_id") != NO_NODE,
        );
    }
    // And no daemon was restarted: the same processes served every job.
    let now: Vec<_> = (0..NODES.len()).map(|i| cluster.node(i).pid()).collect();
    assert_eq!(now, pids, "the same daemons throughout (no restart)");
    drop(slurm);
    mark("cancelled job gone, Slurm stopped");
}

/// Runs `cmd` (a step) with the bound `STEP`.
fn run_step(cmd: &mut Command) -> Output {
    crate::common::run_long(cmd, STEP)
}

/// Job mode without Slurm, as slurmd runs a prolog (no PATH, only the job's variables, the
/// node list in SLURM_NODELIST as Slurm 22.05 gives it; a stub scontrol): the job file it
/// writes (the channel from the job ID, or the one given; the members through the node map;
/// the job's user as owner), its timeout naming the state and the member it waits on, a node
/// missing from the map refused before any file is written, and an epilog that may run twice.
#[test]
fn job_mode_prolog_names_what_it_waits_on_and_its_epilog_may_run_twice() {
    let mut cluster = Cluster::prepare(spec(2)).expect("prepare");
    let jobs = cluster.node(0).dir().join("jobs");
    cluster
        .set_node_config(0, "OPENIMEX_JOBS_DIR", &jobs.display().to_string())
        .expect("config");
    // Node 1's daemon never starts: a job with it stays FORMING on node 0.
    cluster.start_node(0).expect("start node 0");
    cluster
        .wait_state(0, "READY", NOTICE)
        .expect("node 0 READY");
    let ips: Vec<String> = (0..2).map(|i| cluster.node(i).ip().to_string()).collect();
    let stub = crate::slurm::stub_scontrol(
        cluster.base_dir(),
        "gb[01-02]",
        &["gb01".to_string(), "gb02".to_string()],
    );
    let map = cluster.base_dir().join("node-map");
    let map_one = cluster.base_dir().join("node-map-one");
    std::fs::write(
        &map,
        format!("gb01 {}  # tray 0\ngb02 {}\n", ips[0], ips[1]),
    )
    .expect("map");
    std::fs::write(&map_one, format!("gb01 {}\n", ips[0])).expect("map");
    let ctl = format!(
        "{} ctl -c {}",
        binary().display(),
        cluster.node(0).config_path().display()
    );
    let run = |which: &str, job: u32, extra: &[(&str, &str)]| -> Output {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg(crate::slurm::script(which))
            .env_clear()
            .env("SLURM_JOB_ID", job.to_string())
            .env("SLURM_NODELIST", "gb[01-02]")
            .env("SLURM_JOB_UID", "1000")
            .env("SLURM_JOB_GID", "1001")
            .env("SLURMD_NODENAME", "gb01")
            .env("SCONTROL", stub.join("scontrol"))
            .env("OPENIMEX_JOBS_DIR", &jobs)
            .env("OPENIMEX_CTL", &ctl)
            .env("OPENIMEX_NODE_MAP", &map)
            .env("OPENIMEX_POLL_INTERVAL", "0.05");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        crate::common::run_long(&mut cmd, NOTICE)
    };
    let keys = |job: u32| -> String {
        let path = jobs.join(format!("slurm-{job}.job"));
        let body =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let keys: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
        keys.join("\n")
    };

    // Job 77: channel 1 + 77 mod 2047; the prolog gives up after 2 s naming node 1.
    let t0 = Instant::now();
    let out = run("prolog.sh", 77, &[("OPENIMEX_WAIT_TIMEOUT", "2")]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    // The prolog's clock is `date +%s`: two whole-second ticks are more than one second.
    assert!(t0.elapsed() >= Duration::from_secs(1), "waited the timeout");
    let members = format!("{},{}", ips[0], ips[1]);
    assert_eq!(
        keys(77),
        format!("CHANNEL=78\nMEMBERS={members}\nOWNER=1000:1001")
    );
    let err = text(&out.stderr);
    let said =
        format!("IMEX job slurm-77 (channel 78, members {members}) is not READY after 2s: FORMING");
    assert!(err.contains(&said), "{said:?} in: {err}");
    let named = format!("FORMING: waiting on member node #1 {} (", ips[1]);
    assert!(err.contains(&named), "{named:?} in: {err}");
    let doc = cluster
        .ctl(0, &["jobs", "slurm-77", "-j"])
        .expect("ctl jobs");
    let doc: Value = serde_json::from_slice(&doc.stdout).expect("ctl jobs NAME -j is JSON");
    assert_eq!(doc["channel"], 78, "{doc}");
    assert_eq!(doc["state"], "FORMING", "{doc}");
    assert_eq!(doc["owner"], "1000:1001", "{doc}");

    // A channel given (OPENIMEX_JOB_CHANNEL) is the job's.
    let out = run(
        "prolog.sh",
        78,
        &[
            ("OPENIMEX_WAIT_TIMEOUT", "0"),
            ("OPENIMEX_JOB_CHANNEL", "9"),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(keys(78).starts_with("CHANNEL=9\n"), "{}", keys(78));

    // A job node the map does not name: refused, no file.
    let map_one = map_one.display().to_string();
    let out = run("prolog.sh", 79, &[("OPENIMEX_NODE_MAP", &map_one)]);
    let err = assert_clean_failure(&out, "a job node missing from the map");
    assert!(err.contains("node gb02 of job 79 has no line in"), "{err}");
    assert!(!jobs.join("slurm-79.job").exists());

    // The epilog deletes the file and the job ends; a second run finds nothing and is fine.
    for round in 0..2 {
        let out = run("epilog.sh", 77, &[]);
        assert!(out.status.success(), "epilog run {round}: {}", show(&out));
        assert!(!jobs.join("slurm-77.job").exists());
    }
    let t0 = Instant::now();
    loop {
        let out = cluster.ctl(0, &["jobs", "slurm-77"]).expect("ctl jobs");
        if text(&out.stderr).contains("no job slurm-77 on this daemon") {
            break;
        }
        assert!(
            t0.elapsed() < NOTICE,
            "job slurm-77 still held: {}",
            show(&out)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
