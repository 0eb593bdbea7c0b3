//! Jobs from job files (`OPENIMEX_JOBS_DIR`) through whole daemons in virtual time: a file
//! written on each member defines the job there (read at once, inotify), the members tell each
//! other, and from then on an import goes only inside a job both nodes hold; deleting a file
//! ends its job at once; a malformed file is named with its line and changes nothing else.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use openimex_core::NodeId;
use openimex_imexd::net::MemNet;
use tokio::time::sleep;

use crate::domain::{AT_ONCE, Daemon, Options, ip, logged, start_with, up, within};
use crate::gpus::{Gpus, gpu};

/// A scratch directory of this test's own (tests run at once in one process).
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("openimex-inproc-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// Writes a job file as a prolog should: elsewhere, then renamed into node `node`'s directory.
fn write_job(jobs: &Path, node: usize, name: &str, text: &str) {
    let dir = jobs.join(format!("node-{node}"));
    let tmp = jobs.join(format!(".{name}.{node}.tmp"));
    std::fs::write(&tmp, text).expect("write the job file");
    std::fs::rename(&tmp, dir.join(format!("{name}.job"))).expect("move it in");
}

/// Lets every daemon take in what just happened (virtual time passes only when all wait).
async fn settle() {
    sleep(AT_ONCE).await;
}

#[tokio::test(start_paused = true)]
async fn an_import_goes_only_inside_a_job_both_nodes_hold_and_ends_with_its_file() {
    let net = MemNet::new();
    let jobs = scratch("jobs");
    let gpus = [Gpus::new(vec![gpu(0, 1)]), Gpus::new(vec![gpu(0, 1)])];
    let mut options = Options::nodes(2);
    options.jobs_dir = Some(jobs.clone());
    let daemons: Vec<Daemon> = (gpus.iter().enumerate())
        .map(|(i, g)| start_with(&net, i, ip(i), &options, g.driver()))
        .collect();
    daemons[0]
        .wait_domain(&net, Duration::from_secs(10), "domain UP", up)
        .await;
    let uuid = [9u8; 16];
    gpus[0].export(uuid);
    // No job yet: the domain-wide daemon, any channel.
    gpus[1].import_on(3, 1, uuid, NodeId(0));
    within(AT_ONCE, "import 1 answered", || {
        gpus[1].validated_one(1).is_some()
    })
    .await;
    assert_eq!(gpus[1].validated_one(1), Some(true));

    // Job j on channel 3, defined on node 0 only: node 1 holds no job.
    let members = format!("CHANNEL=3\nMEMBERS={},{}\n", ip(0), ip(1));
    write_job(&jobs, 0, "j", &members);
    within(AT_ONCE, "node 0 read the file", || {
        logged("job j defined from")
    })
    .await;
    settle().await;
    // Its channel is created for its processes: root's only, as the job names no owner.
    let channel = jobs.join("channels-0").join("channel3");
    let mode = std::fs::metadata(&channel)
        .expect("channel3 created")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // As `ctl jobs` shows it on node 0: forming, waiting for node 1.
    let shown = daemons[0].jobs(&net).await;
    assert_eq!(shown.jobs.len(), 1);
    let j = &shown.jobs[0];
    assert_eq!(
        (
            j.name.as_str(),
            j.channel,
            j.members.clone(),
            j.state.as_str(),
            j.nodes.clone()
        ),
        ("j", 3, vec![0, 1], "FORMING", vec![1])
    );
    gpus[1].import_on(3, 2, uuid, NodeId(0));
    within(AT_ONCE, "import 2 answered", || {
        gpus[1].validated_one(2).is_some()
    })
    .await;
    assert_eq!(
        gpus[1].validated_one(2),
        Some(false),
        "node 0 serves channel 3 only to a node that holds job j"
    );
    assert!(logged("node 0 does not hold job j") || logged("node 1 does not hold job j"));

    // Node 1 defines it too: the members tell each other, and the import goes.
    write_job(&jobs, 1, "j", &members);
    within(AT_ONCE, "node 1 read the file", || {
        logged(&format!(
            "job j defined from {}",
            jobs.join("node-1").display()
        ))
    })
    .await;
    settle().await;
    for d in &daemons {
        assert_eq!(d.jobs(&net).await.jobs[0].state, "READY");
    }
    gpus[1].import_on(3, 3, uuid, NodeId(0));
    within(AT_ONCE, "import 3 answered", || {
        gpus[1].validated_one(3).is_some()
    })
    .await;
    assert_eq!(gpus[1].validated_one(3), Some(true));
    // Another channel is no job's: refused at the importer's node.
    gpus[1].import_on(4, 4, uuid, NodeId(0));
    within(AT_ONCE, "import 4 answered", || {
        gpus[1].validated_one(4).is_some()
    })
    .await;
    assert_eq!(gpus[1].validated_one(4), Some(false));
    assert!(logged("no job on this node owns channel 4"));

    // A malformed file is named with its line; job j stands.
    write_job(&jobs, 1, "bad", "CHANNEL=5\nMEMBERS=10.9.9.9\n");
    within(AT_ONCE, "the bad file named", || {
        logged("bad.job:2: member \"10.9.9.9\" is not an entry of the nodes file")
    })
    .await;
    gpus[1].import_on(3, 5, uuid, NodeId(0));
    within(AT_ONCE, "import 5 answered", || {
        gpus[1].validated_one(5).is_some()
    })
    .await;
    assert_eq!(gpus[1].validated_one(5), Some(true));

    // The file goes on node 0: the job ends there at once, and nothing more goes under it.
    std::fs::remove_file(jobs.join("node-0").join("j.job")).expect("delete the job file");
    within(AT_ONCE, "node 0 ended the job", || logged("job j ended")).await;
    settle().await;
    assert!(!channel.exists(), "the ended job's channel is removed");
    let shown = daemons[0].jobs(&net).await;
    assert!(shown.jobs.is_empty());
    assert_eq!(
        shown.quarantined,
        vec![3],
        "its channel is kept from other jobs here"
    );
    gpus[1].import_on(3, 6, uuid, NodeId(0));
    within(AT_ONCE, "import 6 answered", || {
        gpus[1].validated_one(6).is_some()
    })
    .await;
    assert_eq!(gpus[1].validated_one(6), Some(false));
    std::fs::remove_dir_all(&jobs).expect("remove the scratch directory");
}

#[tokio::test(start_paused = true)]
async fn a_restarted_daemon_keeps_an_ended_jobs_channel_from_the_next_job() {
    let net = MemNet::new();
    let jobs = scratch("jobs-restart");
    let mut options = Options::nodes(2);
    options.jobs_dir = Some(jobs.clone());
    let start = |options: &Options| {
        (0..2)
            .map(|i| {
                let driver = Box::new(openimex_driver::NoGpu::default());
                start_with(&net, i, ip(i), options, driver)
            })
            .collect::<Vec<Daemon>>()
    };
    let mut daemons = start(&options);
    daemons[0]
        .wait_domain(&net, Duration::from_secs(10), "domain UP", up)
        .await;
    let old = format!("CHANNEL=3\nMEMBERS={},{}\n", ip(0), ip(1));
    write_job(&jobs, 0, "old", &old);
    within(AT_ONCE, "job old defined", || {
        logged("job old defined from")
    })
    .await;
    std::fs::remove_file(jobs.join("node-0").join("old.job")).expect("the epilog");
    within(AT_ONCE, "job old ended", || logged("job old ended")).await;
    // The daemon restarts while a stray of job old may still hold channel 3 on node 0.
    for d in &mut daemons {
        d.stop().await;
    }
    // Their listeners go with their aborted servers' tasks, once those are dropped.
    drop(daemons);
    settle().await;
    let daemons = start(&options);
    daemons[0]
        .wait_domain(&net, Duration::from_secs(10), "domain UP again", up)
        .await;
    settle().await;
    assert_eq!(daemons[0].jobs(&net).await.quarantined, vec![3]);
    write_job(&jobs, 0, "next", &old);
    within(AT_ONCE, "job next refused", || {
        logged("job next: channel 3 belonged to job old")
    })
    .await;
    assert!(daemons[0].jobs(&net).await.jobs.is_empty());
    std::fs::remove_dir_all(&jobs).expect("remove the scratch directory");
}
