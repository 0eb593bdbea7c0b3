//! `demo --jobs K` (issue 31): K concurrent jobs on one long-running domain, each an isolated
//! IMEX domain of its own. The daemons start with a jobs directory each (`OPENIMEX_JOBS_DIR`,
//! in the node's directory); the demo defines every job as a prolog would, by writing its job
//! file (whole, then renamed in) into the directory of each of its members, and waits for the
//! job to be READY on every member through the command service (the `JobWait` RPC `ctl jobs
//! wait` calls), which is `job_ready_ms`. Then the applications run ([`apps`]): the all-to-all
//! within each job, and every cross-job import they can attempt, which must all be refused.
//! At the end the files are deleted, each job must be gone from its members with its channel
//! removed (`job_end_ms`), and every driver's references must be back to zero.
//!
//! Where the jobs sit and what the run must count is [`layout`], computed from the flags
//! alone.

mod apps;
mod layout;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use openimex_config::jobfile::JOB_FILE_SUFFIX;
use openimex_harness::Cluster;

use super::all_to_all::bar;
use super::args::DemoArgs;
use super::setup::{Prepared, leak_check, prepare, start_domain_with};
use layout::Layout;

/// How long every member may take to hold a job READY, or to let an ended one go.
const JOB_TIMEOUT: Duration = Duration::from_secs(60);
/// Each node's jobs directory, in its node directory.
const JOBS_DIR: &str = "jobs";

/// Refuses flags `--jobs` cannot run with, naming the flag and the fix.
fn check_flags(args: &DemoArgs) -> Result<()> {
    let clash = |flag: &str, why: &str| {
        anyhow::anyhow!("--jobs cannot be combined with {flag}: {why}; drop one of the two")
    };
    if args.chaos {
        return Err(clash("--chaos", "the chaos run starts its own cluster"));
    }
    if args.allreduce {
        return Err(clash("--allreduce", "each mode runs its own workload"));
    }
    if args.partitions != 1 {
        return Err(clash(
            "--partitions",
            "partitions split the domain into cliques, jobs split it into channels; the jobs' \
             windows would cross the cliques",
        ));
    }
    if args.svg.is_some() {
        return Err(clash("--svg", "the jobs mode draws no picture"));
    }
    Ok(())
}

/// Runs the demo; prints the summary; fails when any byte or count is wrong.
pub(super) fn run(args: &DemoArgs) -> Result<()> {
    check_flags(args)?;
    let Prepared {
        domain,
        mut spec,
        nodes,
        gpus_per_node,
        buffer,
    } = prepare(args)?;
    let layout = Layout::new(nodes, args.jobs.unwrap_or(1), gpus_per_node as usize)?;
    let slot = (buffer / layout.largest() as u64) / 8 * 8;
    if slot == 0 {
        bail!(
            "--buffer-size {buffer} is too small for the {} GPUs of the largest job to each get \
             a slot",
            layout.largest()
        );
    }
    if let Some(g) = spec.gpus.as_mut() {
        // A GPU of a shared tray holds one buffer per job.
        g.hbm_mib = (buffer >> 20).max(2) * 3 + 64;
        // Channel 0 only at the drivers' start, as on a node with NVreg_CreateImexChannel0:
        // each job's channel is made where, and when, the job is defined.
        g.channels = 1;
    }
    let say = |s: &str| {
        if !args.json {
            println!("{s}");
        }
    };
    let configure = |cluster: &mut Cluster| -> Result<()> {
        for i in 0..cluster.len() {
            let dir = jobs_dir(cluster, i);
            // Root's only, as the daemon makes it: job files decide who reaches whose memory.
            std::os::unix::fs::DirBuilderExt::mode(
                std::fs::DirBuilder::new().recursive(true),
                0o700,
            )
            .create(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
            cluster
                .set_node_config(i, "OPENIMEX_JOBS_DIR", &dir.display().to_string())
                .with_context(|| format!("node {i}: OPENIMEX_JOBS_DIR"))?;
        }
        Ok(())
    };
    let (mut cluster, formation, probed) = start_domain_with(&domain, spec, &say, &configure)?;
    let node_dirs: Vec<PathBuf> = (0..nodes)
        .map(|i| cluster.node(i).dir().to_path_buf())
        .collect();
    say(&format!(
        "Domain UP in {} ms, every GPU's fabric probe complete in {} ms. Defining {} jobs by \
         their job files: {}.",
        formation.as_millis(),
        probed.as_millis(),
        layout.jobs.len(),
        layout.describe()
    ));

    let starts = define_jobs(&cluster, &layout)?;
    let ready = wait_jobs(&cluster, &layout, &starts, Want::Ready)?;
    let own = layout.own_channel_attempts();
    let held = layout.held_channel_attempts();
    let cross_expected = own + held;
    say(&format!(
        "Every job READY on every member in {:.1} ms at most. Every GPU of a job exports {} \
         KiB; {} imports within the jobs, {cross_expected} across jobs to be refused ({own} on \
         the importer's own channel, {held} holding the exporter's job's channel on a tray \
         outside it).",
        ms(ready.iter().max().copied().unwrap_or_default()),
        buffer >> 10,
        layout.imports()
    ));

    let apps::Channels { planted } = apps::prepare_channels(&layout, &node_dirs)?;
    let shared = Arc::new(apps::Shared::new(
        layout.clone(),
        gpus_per_node,
        node_dirs.clone(),
        buffer,
        slot,
    ));
    let threads: Vec<_> = (0..shared.apps.len())
        .map(|me| {
            let shared = shared.clone();
            std::thread::spawn(move || apps::run(me, &shared))
        })
        .collect();
    shared.exported.wait();
    let import_start = Instant::now();
    let total = layout.imports() + cross_expected;
    let done =
        || shared.imports_done.load(Ordering::Relaxed) + shared.cross_done.load(Ordering::Relaxed);
    let mut last = Instant::now();
    while done() < total && threads.iter().any(|t| !t.is_finished()) {
        if !args.json && last.elapsed() > Duration::from_millis(200) {
            bar(done(), total);
            last = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if !args.json {
        bar(done(), total);
        eprintln!();
    }
    let reports: Vec<apps::Report> = threads
        .into_iter()
        .map(|t| {
            // A panicking application thread is a failed demo, not a crash of the tool.
            t.join().unwrap_or_else(|_| apps::Report {
                errors: vec!["an application thread panicked".into()],
                ..Default::default()
            })
        })
        .collect();
    let phase_end = *shared.phase_end.lock().unwrap_or_else(|e| e.into_inner());
    let since = |from: Instant, to: Option<Instant>| to.map_or(Duration::ZERO, |t| t - from);
    let import_elapsed = since(import_start, phase_end[0]);
    let cross_elapsed = since(phase_end[0].unwrap_or(import_start), phase_end[2]);

    let ends = end_jobs(&cluster, &layout)?;
    let ended = wait_jobs(&cluster, &layout, &ends, Want::Gone)?;
    apps::remove_planted(&planted);
    let (leaked, leak_notes) = leak_check(&node_dirs)?;

    let mut lat: Vec<u64> = (reports.iter())
        .flat_map(|r| r.latencies_us.iter().copied())
        .collect();
    lat.sort_unstable();
    let pct = |p: f64| super::all_to_all::quantile(&lat, p);
    let errors: Vec<&String> = reports.iter().flat_map(|r| r.errors.iter()).collect();
    let imports = lat.len();
    let cross = &shared.cross;
    let by_daemons = cross.by_daemons.load(Ordering::Relaxed);
    let by_driver = cross.by_driver.load(Ordering::Relaxed);
    let served = cross.served.load(Ordering::Relaxed);
    let cross_refused = by_daemons + by_driver;
    let first = cross
        .first
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let stop = Instant::now();
    let shutdown = cluster.shutdown();
    let stopped = stop.elapsed();

    let mut ready_sorted = ready.clone();
    ready_sorted.sort_unstable();
    let ms_list = |v: &[Duration]| v.iter().map(|d| ms(*d)).collect::<Vec<f64>>();
    let topo = &domain.topo;
    let summary = serde_json::json!({
        "topology": topo.name,
        "racks": topo.racks.len(),
        "compute_trays": topo.compute_tray_count(),
        "switch_trays": topo.switch_tray_count(),
        "partitions": 1,
        "nodes": nodes,
        "gpus": nodes * gpus_per_node as usize,
        "jobs": layout.jobs.len(),
        "job_layout": layout.json(),
        "apps": layout.apps(),
        "job_ready_ms": ms_list(&ready),
        "job_ready_ms_median": ms(ready_sorted.get(ready_sorted.len() / 2).copied().unwrap_or_default()),
        "job_ready_ms_max": ms(ready_sorted.last().copied().unwrap_or_default()),
        "job_end_ms": ms_list(&ended),
        "imports": imports,
        "imports_expected": layout.imports(),
        "bytes_verified": shared.bytes_verified.load(Ordering::Relaxed),
        "cross_job_expected": cross_expected,
        "cross_job_own_channel": own,
        "cross_job_held_channel": held,
        "cross_job_refused": cross_refused,
        "cross_job_refused_by_daemons": by_daemons,
        "cross_job_refused_by_driver": by_driver,
        "cross_job_served": served,
        "cross_job_refusal": first[0],
        "cross_job_refusal_held_channel": first[1],
        "errors": errors.len(),
        "leaked_refs": leaked,
        "formation_ms": formation.as_millis() as u64,
        "import_p50_us": pct(0.5),
        "import_p99_us": pct(0.99),
        "imports_per_s": rate(imports, import_elapsed),
        "cross_job_per_s": rate(cross_expected, cross_elapsed),
        "buffer_bytes": buffer,
    });
    if args.json {
        println!("{summary}");
    } else {
        print_summary(&domain.describe(gpus_per_node), &layout, &summary, stopped);
    }
    for e in errors.iter().take(10) {
        eprintln!("error: {e}");
    }
    for n in &leak_notes {
        eprintln!("leak: {n}");
    }
    shutdown.context("stopping the nodes")?;
    if served > 0 || cross_refused != cross_expected {
        let first = cross
            .first_served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .map(|w| format!(" (the first: {w})"))
            .unwrap_or_default();
        bail!(
            "demo failed: {cross_refused} of {cross_expected} imports across jobs were refused, \
             {served} served{first}: a job's memory must be out of reach of every other job's \
             processes"
        );
    }
    if !errors.is_empty() || leaked > 0 || imports != layout.imports() {
        bail!(
            "demo failed: {} errors, {leaked} leaked references, {imports} of {} imports within \
             the jobs",
            errors.len(),
            layout.imports()
        );
    }
    Ok(())
}

/// Node `i`'s jobs directory.
fn jobs_dir(cluster: &Cluster, i: usize) -> PathBuf {
    cluster.node(i).dir().join(JOBS_DIR)
}

/// Milliseconds, to 0.1.
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// `n` per second over `d`, to 0.1.
fn rate(n: usize, d: Duration) -> f64 {
    (n as f64 / d.as_secs_f64().max(1e-9) * 10.0).round() / 10.0
}

/// Writes each job's file into each of its members' jobs directories, as each member's prolog
/// would (written beside, then renamed in: the daemon never reads half a file). Returns when
/// each job's first file was written, the start of its `job_ready_ms`.
fn define_jobs(cluster: &Cluster, layout: &Layout) -> Result<Vec<Instant>> {
    let lines = cluster.nodes_lines();
    let mut starts = Vec::with_capacity(layout.jobs.len());
    for job in &layout.jobs {
        // Entries exactly as the nodes file writes them.
        let members: Vec<&str> = job.trays.clone().map(|t| lines[t].as_str()).collect();
        let text = format!(
            "# openimex-lab demo --jobs\nCHANNEL={}\nMEMBERS={}\n",
            job.channel,
            members.join(",")
        );
        starts.push(Instant::now());
        for tray in job.trays.clone() {
            write_job_file(&jobs_dir(cluster, tray), &job.name, &text)?;
        }
    }
    Ok(starts)
}

fn write_job_file(dir: &Path, name: &str, text: &str) -> Result<()> {
    let path = dir.join(format!("{name}{JOB_FILE_SUFFIX}"));
    // A dot file that does not end in the suffix: no job, whenever the daemon reads the dir.
    let tmp = dir.join(format!(".{name}{JOB_FILE_SUFFIX}.tmp"));
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot move {} in", path.display()))
}

/// Deletes every job file, as each member's epilog would; returns when each job's first file
/// went, the start of its `job_end_ms`.
fn end_jobs(cluster: &Cluster, layout: &Layout) -> Result<Vec<Instant>> {
    let mut starts = Vec::with_capacity(layout.jobs.len());
    for job in &layout.jobs {
        starts.push(Instant::now());
        for tray in job.trays.clone() {
            let path = jobs_dir(cluster, tray).join(format!("{}{JOB_FILE_SUFFIX}", job.name));
            std::fs::remove_file(&path)
                .with_context(|| format!("cannot delete {}", path.display()))?;
        }
    }
    Ok(starts)
}

/// What [`wait_jobs`] waits for on each member.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// The job READY.
    Ready,
    /// The job no longer held, and its channel removed.
    Gone,
}

impl Want {
    /// The state word `JobWait` takes.
    fn word(self) -> &'static str {
        match self {
            Want::Ready => "READY",
            Want::Gone => "GONE",
        }
    }
}

/// Waits until every job stands as `want` on every member; per job, the time from `starts[j]`
/// until its last member got there. Each (member, job) is one `JobWait` call of the member's
/// command service (what `ctl jobs wait` calls), which the daemon answers at the step that
/// makes it true: no polling, nothing added to the daemons' load while they form the jobs.
fn wait_jobs(
    cluster: &Cluster,
    layout: &Layout,
    starts: &[Instant],
    want: Want,
) -> Result<Vec<Duration>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a runtime for the command clients")?;
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for node in 0..cluster.len() {
            let target = openimex_ctl::Target::Tcp {
                host: cluster.node(node).ip().to_string(),
                port: cluster.node(node).cmd_port(),
            };
            let client = openimex_ctl::Client::connect(target, Duration::from_secs(5))
                .await
                .with_context(|| format!("node {node}: cannot reach its command service"))?;
            for (j, job) in layout.jobs.iter().enumerate() {
                if !layout.has(j, node) {
                    continue;
                }
                let channel =
                    openimex_client::node_dir::channel_path(cluster.node(node).dir(), job.channel);
                let (name, start) = (job.name.clone(), starts[j]);
                let mut client = client.clone();
                set.spawn(async move {
                    let took = wait_member(node, &mut client, &name, &channel, want).await?;
                    anyhow::Ok((j, took.saturating_duration_since(start)))
                });
            }
        }
        let mut per_job = vec![Duration::ZERO; layout.jobs.len()];
        while let Some(joined) = set.join_next().await {
            let (j, took) = joined.context("a wait for the jobs failed")??;
            per_job[j] = per_job[j].max(took);
        }
        Ok(per_job)
    })
}

/// Job `name` on member `node` as `want` says: when it got there.
async fn wait_member(
    node: usize,
    client: &mut openimex_ctl::Client,
    name: &str,
    channel: &Path,
    want: Want,
) -> Result<Instant> {
    let reply = client
        .job_wait(name, want.word(), JOB_TIMEOUT)
        .await
        .with_context(|| format!("node {node}: job {name} (the command service's JobWait)"))?;
    if !reply.reached {
        let last = reply.job.map_or("not held".to_string(), |j| {
            format!("{} (nodes {:?})", j.state, j.nodes)
        });
        bail!(
            "node {node}: job {name} not {} within {JOB_TIMEOUT:?} of its files (last: {last}); \
             the daemon's log is in its node directory (--keep keeps it)",
            want.word()
        );
    }
    let mut at = Instant::now();
    if let Want::Gone = want {
        // The daemon removes the channel as it ends the job; a moment after the answer at most.
        let deadline = at + JOB_TIMEOUT;
        while channel.exists() {
            if Instant::now() >= deadline {
                bail!(
                    "node {node}: job {name} ended, but {} is still there after \
                     {JOB_TIMEOUT:?}",
                    channel.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        at = Instant::now();
    }
    Ok(at)
}

/// The summary for a person, from the JSON one (`--json` prints that instead).
fn print_summary(domain: &str, layout: &Layout, s: &serde_json::Value, teardown: Duration) {
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
    let list = |k: &str| {
        let v: Vec<String> = (s[k].as_array().into_iter().flatten())
            .map(|x| format!("{:.1}", x.as_f64().unwrap_or(0.0)))
            .collect();
        v.join(", ")
    };
    println!("Summary ({domain}):");
    println!("  domain formation     : {} ms", n("formation_ms"));
    println!(
        "  jobs                 : {} ({})",
        n("jobs"),
        layout.describe()
    );
    println!(
        "  job READY            : median {:.1} ms, max {:.1} ms (files written to READY on every \
         member; per job: {} ms)",
        f("job_ready_ms_median"),
        f("job_ready_ms_max"),
        list("job_ready_ms")
    );
    println!(
        "  imports within jobs  : {} of {} ({:.0}/s)",
        n("imports"),
        n("imports_expected"),
        f("imports_per_s")
    );
    println!(
        "  import latency       : p50 {} us, p99 {} us",
        n("import_p50_us"),
        n("import_p99_us")
    );
    println!("  bytes verified       : {}", n("bytes_verified"));
    println!(
        "  across jobs          : {} of {} refused ({} by the daemons, {} by the driver's channel \
         check), {} served; {:.0}/s",
        n("cross_job_refused"),
        n("cross_job_expected"),
        n("cross_job_refused_by_daemons"),
        n("cross_job_refused_by_driver"),
        n("cross_job_served"),
        f("cross_job_per_s")
    );
    println!(
        "                         {} on the importer's own channel, {} holding the exporter's \
         job's channel on a tray outside it",
        n("cross_job_own_channel"),
        n("cross_job_held_channel")
    );
    for (key, what) in [
        ("cross_job_refusal", "first refusal        "),
        ("cross_job_refusal_held_channel", "first held refusal   "),
    ] {
        if let Some(r) = s[key].as_str() {
            println!("  {what}: {r}");
        }
    }
    println!(
        "  jobs ended           : files deleted to gone on every member (channel removed): {} ms",
        list("job_end_ms")
    );
    println!("  errors               : {}", n("errors"));
    println!("  leaked references    : {}", n("leaked_refs"));
    println!("  teardown             : {} ms", teardown.as_millis());
}
