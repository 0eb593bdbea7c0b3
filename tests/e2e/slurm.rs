//! Slurm (issue 9, item 6): `dist/slurm/prolog.sh` and `epilog.sh` against real daemons, with a
//! stub `scontrol` on PATH that expands the job's node list. The prolog writes the job's nodes
//! over a placeholder file, signals the daemon (SIGUSR1: same PID) and returns only once ctl
//! says READY and the domain UP, polling (no fixed sleep); with a peer missing it times out,
//! exit 1, naming the node. The epilog resets the file to placeholders and restarts the daemon,
//! which comes back unconfigured (ctl -q UNAVAILABLE). A file naming other nodes makes the
//! prolog restart the daemon instead of signalling it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use openimex_harness::Cluster;

use crate::common::{FORM, NOTICE, binary, run_long, spec, text};

/// Generous bound on a prolog run whose domain forms at once: a prolog with a fixed 30 s
/// "stabilise" sleep, as some in the wild have, does not fit in it.
const PROLOG_BOUND: Duration = Duration::from_secs(20);

pub(crate) fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("dist/slurm")
        .join(name)
}

/// ParallelCluster's seed, and what the epilog writes: `##` and nine `0.0.0.0` lines.
fn placeholders() -> Vec<String> {
    let mut lines = vec!["##".to_string()];
    lines.extend(std::iter::repeat_n("0.0.0.0".to_string(), 9));
    lines
}

/// A directory holding a stub `scontrol` that expands `nodelist` to `hosts` (and nothing else).
pub(crate) fn stub_scontrol(dir: &Path, nodelist: &str, hosts: &[String]) -> PathBuf {
    let bin = dir.join("stub-bin");
    std::fs::create_dir_all(&bin).expect("stub dir");
    let path = bin.join("scontrol");
    let body = format!(
        "#!/bin/sh\n\
         [ \"$1\" = show ] && [ \"$2\" = hostnames ] || {{ echo \"stub: $*\" >&2; exit 2; }}\n\
         [ \"$3\" = '{nodelist}' ] || {{ echo \"stub: unknown list $3\" >&2; exit 1; }}\n\
         printf '%s\\n' {}\n",
        hosts.join(" ")
    );
    std::fs::write(&path, body).expect("write the stub");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    bin
}

/// The prolog or epilog for node `i`: its nodes file, its config for ctl, its PID file; `extra`
/// on top.
fn command(
    cluster: &Cluster,
    i: usize,
    which: &str,
    stub: &Path,
    extra: &[(&str, String)],
) -> Command {
    let node = cluster.node(i);
    let path = format!(
        "{}:{}",
        stub.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("sh");
    cmd.arg(script(which))
        .env("PATH", path)
        .env("SLURM_JOB_ID", "4242")
        .env("OPENIMEX_NODES_FILE", node.nodes_path())
        .env("OPENIMEX_CTL", ctl_command(cluster, i))
        .env("OPENIMEX_PID_FILE", node.dir().join("daemon.pid"))
        .env(
            "OPENIMEX_RESTART_CMD",
            format!(
                "cp \"$OPENIMEX_NODES_FILE\" {}",
                restarted(cluster, i).display()
            ),
        );
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd
}

/// Node 0's prolog reaches ctl by its config (`-c`), the others by the unix socket (`-u`).
fn ctl_command(cluster: &Cluster, i: usize) -> String {
    let node = cluster.node(i);
    let target = if i == 0 {
        format!("-c {}", node.config_path().display())
    } else {
        format!("-u {}", node.socket_path().display())
    };
    format!("{} ctl {target}", binary().display())
}

/// Where the test's restart command copies the nodes file it restarted the daemon on.
fn restarted(cluster: &Cluster, i: usize) -> PathBuf {
    cluster.node(i).dir().join("restarted-with")
}

fn write_pid(cluster: &Cluster, i: usize) {
    let pid = cluster.node(i).pid().expect("daemon running");
    std::fs::write(cluster.node(i).dir().join("daemon.pid"), format!("{pid}\n")).expect("pid file");
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(String::from)
        .collect()
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    )
}

#[test]
fn the_scripts_poll_ctl_and_take_no_fixed_sleep() {
    for which in ["prolog.sh", "epilog.sh"] {
        let body = std::fs::read_to_string(script(which)).expect("script");
        assert!(body.starts_with("#!/bin/sh\n"), "{which}");
        assert!(body.lines().any(|l| l == "set -eu"), "{which}: set -eu");
        let sleeps: Vec<&str> = body
            .lines()
            .filter(|l| !l.trim_start().starts_with('#') && l.contains("sleep"))
            .collect();
        let allowed = ["    sleep \"$OPENIMEX_POLL_INTERVAL\""];
        assert!(
            sleeps.iter().all(|l| allowed.contains(l)),
            "{which}: the poll interval is the only sleep: {sleeps:?}"
        );
        let out = Command::new("sh")
            .arg("-n")
            .arg(script(which))
            .output()
            .expect("sh -n");
        assert!(out.status.success(), "{which}: sh -n: {}", show(&out));
    }
}

#[test]
fn prolog_brings_a_placeholder_domain_up_and_epilog_resets_it() {
    let mut cluster = Cluster::prepare(spec(2)).expect("prepare 2 nodes");
    let real = cluster.nodes_lines().to_vec();
    let stub = stub_scontrol(cluster.base_dir(), "gb[01-02]", &real);
    for i in 0..2 {
        cluster.write_nodes_file(i, &placeholders()).expect("seed");
        cluster.start_node(i).expect("start on placeholders");
    }
    for i in 0..2 {
        cluster
            .wait_state(i, "UNAVAILABLE", NOTICE)
            .expect("unconfigured before the job");
        write_pid(&cluster, i);
    }
    let pids: Vec<_> = (0..2).map(|i| cluster.node(i).pid()).collect();

    // Both nodes' prologs at once, as Slurm runs them: each returns once the domain is UP.
    let env = [
        ("SLURM_JOB_NODELIST", "gb[01-02]".to_string()),
        ("OPENIMEX_WAIT_TIMEOUT", FORM.as_secs().to_string()),
    ];
    let t = Instant::now();
    let prologs: Vec<_> = (0..2)
        .map(|i| {
            let mut cmd = command(&cluster, i, "prolog.sh", &stub, &env);
            std::thread::spawn(move || run_long(&mut cmd, FORM + NOTICE))
        })
        .collect();
    let outs: Vec<Output> = prologs
        .into_iter()
        .map(|h| h.join().expect("prolog"))
        .collect();
    let took = t.elapsed();
    for (i, out) in outs.iter().enumerate() {
        assert!(out.status.success(), "node {i}'s prolog: {}", show(out));
    }
    assert!(
        took < PROLOG_BOUND,
        "the prologs took {took:?}: a fixed sleep?"
    );
    // Returned after ctl said READY and the domain UP: it is so right now, without a wait.
    for i in 0..2 {
        let q = cluster.ctl(i, &["-q"]).expect("ctl -q");
        assert_eq!(text(&q.stdout).trim(), "READY", "node {i}");
        let d = cluster.domain(i).expect("ctl -N -j");
        assert!(
            openimex_harness::cluster::is_up(&d, 2),
            "node {i}: {}",
            d.compact()
        );
        assert_eq!(
            lines(&cluster.node(i).nodes_path()),
            real,
            "node {i}'s nodes file"
        );
        assert!(
            !restarted(&cluster, i).exists(),
            "node {i}: SIGUSR1, no restart"
        );
    }
    let now: Vec<_> = (0..2).map(|i| cluster.node(i).pid()).collect();
    assert_eq!(now, pids, "same daemons (SIGUSR1), no restart");

    // The epilog: placeholders back, then the restart command (the test plays systemd).
    for i in 0..2 {
        let out = run_long(&mut command(&cluster, i, "epilog.sh", &stub, &[]), NOTICE);
        assert!(out.status.success(), "node {i}'s epilog: {}", show(&out));
        assert_eq!(
            lines(&cluster.node(i).nodes_path()),
            placeholders(),
            "node {i}"
        );
        assert_eq!(
            lines(&restarted(&cluster, i)),
            placeholders(),
            "node {i}: restarted after the file was reset"
        );
        cluster.stop(i, NOTICE).expect("stop");
        cluster.start_node(i).expect("start again");
    }
    for i in 0..2 {
        cluster
            .wait_state(i, "UNAVAILABLE", NOTICE)
            .expect("unconfigured after the epilog");
        write_pid(&cluster, i);
        std::fs::remove_file(restarted(&cluster, i)).expect("marker");
    }

    // The next job on the same nodes: SIGUSR1 again, no restart.
    let prologs: Vec<_> = (0..2)
        .map(|i| {
            let mut cmd = command(&cluster, i, "prolog.sh", &stub, &env);
            std::thread::spawn(move || run_long(&mut cmd, FORM + NOTICE))
        })
        .collect();
    for (i, h) in prologs.into_iter().enumerate() {
        let out = h.join().expect("prolog");
        assert!(
            out.status.success(),
            "node {i}'s second prolog: {}",
            show(&out)
        );
        assert!(!restarted(&cluster, i).exists(), "node {i}: no restart");
    }
    cluster.wait_up(0, NOTICE).expect("UP for the second job");
}

#[test]
fn prolog_with_a_missing_peer_times_out_naming_it() {
    let mut cluster = Cluster::prepare(spec(2)).expect("prepare 2 nodes");
    let real = cluster.nodes_lines().to_vec();
    let stub = stub_scontrol(cluster.base_dir(), "gb[01-02]", &real);
    cluster.write_nodes_file(0, &placeholders()).expect("seed");
    cluster.start_node(0).expect("start node 0 only");
    cluster
        .wait_state(0, "UNAVAILABLE", NOTICE)
        .expect("unconfigured");
    write_pid(&cluster, 0);
    let env = [
        ("SLURM_JOB_NODELIST", "gb[01-02]".to_string()),
        ("OPENIMEX_WAIT_TIMEOUT", "3".to_string()),
    ];
    let t = Instant::now();
    let out = run_long(&mut command(&cluster, 0, "prolog.sh", &stub, &env), NOTICE);
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        took >= Duration::from_secs(2),
        "waited the timeout: {took:?}"
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains("is not ready after 3s"), "{stderr}");
    let named = format!("node #1 {} is ", real[1]);
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(&named) && l.ends_with(", not READY")),
        "names the missing node: {stderr}"
    );
    assert!(
        !stderr
            .lines()
            .any(|l| l.contains(&format!("node #0 {} is", real[0]))),
        "node 0 is READY: {stderr}"
    );
}

#[test]
fn prolog_restarts_a_daemon_whose_file_names_other_nodes() {
    let mut cluster = Cluster::prepare(spec(1)).expect("prepare");
    let real = cluster.nodes_lines().to_vec();
    let stub = stub_scontrol(cluster.base_dir(), "gb01", &real);
    // A previous job's list: this node and one that is not in this job.
    let previous = vec![real[0].clone(), "192.0.2.77".to_string()];
    cluster
        .write_nodes_file(0, &previous)
        .expect("previous list");
    cluster.start_node(0).expect("start");
    cluster.wait_state(0, "READY", NOTICE).expect("READY");
    write_pid(&cluster, 0);
    let env = [
        ("SLURM_JOB_NODELIST", "gb01".to_string()),
        ("OPENIMEX_WAIT_TIMEOUT", "30".to_string()),
        ("OPENIMEX_WAIT_FOR", "local".to_string()),
    ];
    let out = run_long(&mut command(&cluster, 0, "prolog.sh", &stub, &env), NOTICE);
    assert!(out.status.success(), "{}", show(&out));
    assert!(
        text(&out.stderr).contains("named other nodes: restarting the IMEX daemon"),
        "{}",
        show(&out)
    );
    assert_eq!(
        lines(&restarted(&cluster, 0)),
        real,
        "restarted on the job's list"
    );
}
