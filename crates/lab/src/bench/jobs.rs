//! `job_ready_N`: how long a job takes from its files written on its N members to READY on
//! every one, on a domain that is already up (issue 31: one permanent daemon per node, a job
//! defined at run time), next to `formation_N` of a fresh domain measured in the same run —
//! what a per-job daemon restart costs at best, since it must form the whole domain again.
//!
//! Each member has a jobs directory of its own (`OPENIMEX_JOBS_DIR`, as on real nodes, where
//! the prolog writes on each). Before the clock, every member is asked over its command socket
//! to answer when the job is READY there (`ctl jobs wait`'s call: the daemon answers at the
//! step that makes it so, no polling); the clock runs from the first file written until the
//! last member has answered. Then the job is ended (files deleted, every member seen to end
//! it) and the next round defines another job on another channel.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use openimex_ctl::{Client, Target};
use openimex_harness::bench::{BenchEntry, Unit, median, ms};
use openimex_harness::{Cluster, ClusterSpec};

/// Limit for the domain to form, and for one job to get READY or end.
const LIMIT: Duration = Duration::from_secs(60);

/// The `job_ready_N` entry of `bench all`.
pub(crate) fn job_ready_entry(binary: &Path, nodes: usize, rounds: usize) -> Vec<BenchEntry> {
    let name = format!("job_ready_{nodes}");
    match job_ready(binary, nodes, rounds) {
        Ok((job, first, formation)) => vec![BenchEntry::measured(
            name,
            ms(job),
            Unit::Ms,
            Some(ms(formation)),
            format!(
                "a job's files written on {nodes} members (one jobs directory each) of a \
                 domain already up to READY on every member, as each says at once to a \
                 waiting `ctl jobs wait` call, median of {j} jobs (the first member READY \
                 after {first:.2} ms); against formation_{nodes} (spawn of a fresh domain's \
                 daemons to UP, what restarting the daemons per job costs at best), median of \
                 {r} rounds in the same run",
                j = rounds.max(1) * JOBS_PER_ROUND,
                r = rounds.max(1),
                first = ms(first)
            ),
        )],
        Err(e) => vec![BenchEntry::failed(name, Unit::Ms, format!("{e:#}"))],
    }
}

/// Starts `spec`'s nodes, each with a jobs directory of its own (`<node dir>/jobs`, as real
/// nodes have), and waits for the domain UP: the cluster and those directories.
pub(super) fn start_with_jobs_dirs(spec: ClusterSpec) -> Result<(Cluster, Vec<PathBuf>)> {
    let mut dirs = Vec::with_capacity(spec.nodes);
    let cluster = super::apps::start_each(spec, |cluster, i| {
        let dir = cluster.node(i).dir().join("jobs");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let shown = dir.display().to_string();
        cluster
            .set_node_config(i, "OPENIMEX_JOBS_DIR", &shown)
            .context("cannot set a node's jobs directory")?;
        dirs.push(dir);
        Ok(())
    })?;
    Ok((cluster, dirs))
}

/// Jobs timed per round of `formation_N`: a job is far quicker than a formation, so more of
/// them steady the median at no real cost.
const JOBS_PER_ROUND: usize = 5;

/// (median job READY on every member, median READY on the first, median formation) over
/// `rounds`.
fn job_ready(binary: &Path, nodes: usize, rounds: usize) -> Result<(Duration, Duration, Duration)> {
    let rounds = rounds.max(1);
    let formation = openimex_harness::bench::formation(binary, nodes, rounds)
        .map_err(|e| anyhow!(openimex_harness::bench::short_error(&e)))?;
    let (mut cluster, dirs) = start_with_jobs_dirs(ClusterSpec::new(nodes, binary))?;
    let members: Vec<String> = (0..nodes)
        .map(|i| cluster.node(i).ip().to_string())
        .collect();
    let sockets: Vec<PathBuf> = (0..nodes).map(|i| cluster.node(i).socket_path()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let samples = rt.block_on(async {
        let mut clients = Vec::with_capacity(nodes);
        for s in &sockets {
            let client = Client::connect(Target::Unix(s.clone()), LIMIT)
                .await
                .with_context(|| format!("cannot reach the command socket {}", s.display()))?;
            clients.push(client);
        }
        let (mut samples, mut firsts) = (Vec::new(), Vec::new());
        for job in 0..rounds * JOBS_PER_ROUND {
            let name = format!("bench-{job}");
            // A channel per job: an ended job's channel stays its own while its processes may
            // remain, so the next job takes another.
            let text = format!("CHANNEL={}\nMEMBERS={}\n", job + 1, members.join(","));
            let (elapsed, first, back) = one_job(clients, &dirs, &name, &text).await?;
            clients = back;
            samples.push(elapsed);
            firsts.push(first);
        }
        anyhow::Ok((samples, firsts))
    })?;
    let (samples, firsts) = samples;
    cluster.shutdown().context("cannot stop the nodes")?;
    Ok((median(&samples), median(&firsts), formation.daemon_up))
}

/// One job: waits asked, files written (timed until every member said READY, and until the
/// first did), then ended.
async fn one_job(
    clients: Vec<Client>,
    dirs: &[PathBuf],
    name: &str,
    text: &str,
) -> Result<(Duration, Duration, Vec<Client>)> {
    let waits = tokio::spawn(wait_all(clients, name.to_string(), "READY"));
    // Time for the waits to reach the daemons, outside the clock: one that arrived after READY
    // would be answered at once, so the clock would still stop no earlier than the last member
    // is READY, but the call's own trip would count.
    tokio::time::sleep(SETTLE).await;
    if waits.is_finished() {
        bail!("job {name}: answered before its files were written");
    }
    let start = Instant::now();
    for dir in dirs {
        write_job(dir, name, text)?;
    }
    let (clients, reached, first) = waits.await.context("the waits failed")??;
    let elapsed = start.elapsed();
    let first = first.saturating_duration_since(start);
    if let Some(i) = reached.iter().position(|r| !r) {
        bail!(
            "job {name}: node {i} not READY within {} s",
            LIMIT.as_secs()
        );
    }
    for dir in dirs {
        let path = dir.join(format!("{name}.job"));
        std::fs::remove_file(&path).with_context(|| format!("cannot delete {}", path.display()))?;
    }
    let (clients, gone, _) = wait_all(clients, name.to_string(), "GONE").await?;
    if let Some(i) = gone.iter().position(|r| !r) {
        bail!(
            "job {name}: node {i} did not end it within {} s",
            LIMIT.as_secs()
        );
    }
    Ok((elapsed, first, clients))
}

/// See [`one_job`].
const SETTLE: Duration = Duration::from_millis(50);

/// Asks every member to answer when `name` is in `state`; each client comes back with whether
/// its member got there, and when the first answer came.
async fn wait_all(
    clients: Vec<Client>,
    name: String,
    state: &'static str,
) -> Result<(Vec<Client>, Vec<bool>, Instant)> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, mut client) in clients.into_iter().enumerate() {
        let name = name.clone();
        tasks.spawn(async move {
            let reply = client.job_wait(&name, state, LIMIT).await;
            (i, client, reply, Instant::now())
        });
    }
    let mut back: Vec<Option<(Client, bool)>> = (0..tasks.len()).map(|_| None).collect();
    let mut first: Option<Instant> = None;
    while let Some(done) = tasks.join_next().await {
        let (i, client, reply, at) = done.context("a wait task failed")?;
        let reply = reply.with_context(|| format!("node {i}: ctl jobs wait"))?;
        back[i] = Some((client, reply.reached));
        first = Some(first.map_or(at, |f| f.min(at)));
    }
    let (clients, reached) = back.into_iter().flatten().unzip();
    Ok((clients, reached, first.unwrap_or_else(Instant::now)))
}

/// Writes the job file whole: elsewhere in the directory (a dot file, not read), then renamed.
fn write_job(dir: &Path, name: &str, text: &str) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let path = dir.join(format!("{name}.job"));
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot move in {}", path.display()))
}
