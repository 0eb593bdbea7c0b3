//! `job_churn`: 1,000 jobs created and ended over a minute on the nodes of a running job whose
//! all-to-all goes on meanwhile (issue 31). The figure is that job's import p50 during the
//! churn against its p50 with no churn, measured first in the same run; the scenario fails
//! (an entry with the error) unless the running job saw no error, no import across jobs was
//! served and no reference was left.
//!
//! Each churned job spans two of the nodes on a channel of its own: its files are written on
//! both (a prolog's), it is waited READY on both (`ctl jobs wait`'s call), one member exports
//! and the other imports and checks the data (the job works), a process on a third node holding
//! the job's channel there tries to import that export (across jobs: it must be refused, and
//! only the daemons' job check can), and the job is
//! ended (files deleted, GONE waited on both). Jobs start every [`PACE`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use openimex_client::{Context, FabricHandleBytes, pattern};
use openimex_ctl::{Client, Target};
use openimex_harness::bench::{BenchEntry, Unit, percentile};
use openimex_harness::{ClusterSpec, GpuSpec};
use openimex_simproto::node_dir::channel_path;

/// Nodes (one GPU each): the running job spans all of them.
const NODES: usize = 4;
/// Jobs churned by `job_churn` (`job_churn_N` churns N).
pub(crate) const JOBS: usize = 1000;
/// One job starts this often: 1,000 over 60 s.
const PACE: Duration = Duration::from_millis(60);
/// The running job's channel; churned job `k` has channel `FIRST_CHURN + k`.
const STEADY_CHANNEL: u32 = 1;
const FIRST_CHURN: u32 = 100;
/// Buffer size of every export.
const SIZE: u64 = 2 << 20;
/// Limit for one import, one job READY or GONE.
const LIMIT: Duration = Duration::from_secs(30);
/// The all-to-all rounds timed with no churn, for the baseline.
const QUIET_ROUNDS: usize = 20;

/// The `job_churn` entry of `bench all` (`job_churn_N` for another number of jobs, at the
/// same pace: the tests run a short one).
pub(crate) fn job_churn_entry(binary: &Path, jobs: usize) -> Vec<BenchEntry> {
    let name = match jobs {
        JOBS => "job_churn".to_string(),
        n => format!("job_churn_{n}"),
    };
    match job_churn(binary, &name, jobs) {
        Ok(entry) => vec![entry],
        Err(e) => vec![BenchEntry::failed(name, Unit::Ms, format!("{e:#}"))],
    }
}

/// What the churn saw.
#[derive(Debug, Default)]
struct Churned {
    jobs: usize,
    /// Imports inside churned jobs that verified.
    inside: usize,
    /// Imports across jobs refused, and served (must stay 0).
    refused: usize,
    served: usize,
}

fn job_churn(binary: &Path, name: &str, jobs: usize) -> Result<BenchEntry> {
    let spec = ClusterSpec::new(NODES, binary).with_gpus(GpuSpec {
        gpus_per_node: 1,
        hbm_mib: 64,
        ..GpuSpec::default()
    });
    let (mut cluster, dirs) = super::jobs::start_with_jobs_dirs(spec)?;
    let nodes: Vec<PathBuf> = (0..NODES)
        .map(|i| cluster.node(i).dir().to_owned())
        .collect();
    let ips: Vec<String> = (0..NODES)
        .map(|i| cluster.node(i).ip().to_string())
        .collect();
    let sockets: Vec<PathBuf> = (0..NODES).map(|i| cluster.node(i).socket_path()).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut clients = rt.block_on(async {
        let mut clients = Vec::new();
        for s in &sockets {
            clients.push(Client::connect(Target::Unix(s.clone()), LIMIT).await?);
        }
        anyhow::Ok(clients)
    })?;

    // The running job, over every node.
    let everyone: Vec<usize> = (0..NODES).collect();
    define(
        &rt,
        &mut clients,
        &dirs,
        &ips,
        "steady",
        STEADY_CHANNEL,
        &everyone,
    )?;
    let steady = Steady::start(&nodes)?;
    let quiet = steady.rounds(QUIET_ROUNDS, &AtomicBool::new(false))?;

    let done = AtomicBool::new(false);
    let (during, churned) = std::thread::scope(|s| {
        let churn = s.spawn(|| {
            let r = churn(&rt, &mut clients, &dirs, &ips, &nodes, jobs);
            done.store(true, Ordering::SeqCst);
            r
        });
        let during = steady.rounds(usize::MAX, &done);
        done.store(true, Ordering::SeqCst);
        let churned = churn
            .join()
            .map_err(|_| anyhow!("the churn thread panicked"))?;
        anyhow::Ok((during?, churned?))
    })?;
    steady.release()?;
    let (leaked, notes) = crate::demo::leak_check(&nodes)?;
    cluster.shutdown().context("cannot stop the nodes")?;
    if leaked > 0 {
        bail!(
            "{leaked} references left after the churn: {}",
            notes.join("; ")
        );
    }
    if churned.served > 0 {
        bail!(
            "{} imports across jobs were served (of {} tried)",
            churned.served,
            churned.served + churned.refused
        );
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(BenchEntry::measured(
        name,
        ms(percentile(&during, 0.5)),
        Unit::Ms,
        Some(ms(percentile(&quiet, 0.5))),
        format!(
            "p50 import of a running job's all-to-all ({NODES} nodes, {} imports, 0 errors) \
             while {} jobs were created and ended around it on its nodes ({} s, each READY on \
             both members, an import inside it verified, one across jobs refused: {} refused, \
             0 served; 0 references left), against the same all-to-all's p50 with no churn \
             ({} imports) just before",
            during.len(),
            churned.jobs,
            (PACE * u32::try_from(jobs).unwrap_or(u32::MAX)).as_secs(),
            churned.refused,
            quiet.len()
        ),
    ))
}

/// Writes job `name` (channel, members by index) on each member and waits READY on each.
fn define(
    rt: &tokio::runtime::Runtime,
    clients: &mut [Client],
    dirs: &[PathBuf],
    ips: &[String],
    name: &str,
    channel: u32,
    members: &[usize],
) -> Result<()> {
    let list: Vec<&str> = members.iter().map(|m| ips[*m].as_str()).collect();
    let text = format!("CHANNEL={channel}\nMEMBERS={}\n", list.join(","));
    for &m in members {
        let tmp = dirs[m].join(format!(".{name}.tmp"));
        std::fs::write(&tmp, &text).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, dirs[m].join(format!("{name}.job")))
            .context("cannot move a job file in")?;
    }
    wait(rt, clients, members, name, "READY")
}

/// Deletes job `name`'s files on `members` and waits until none holds it.
fn end(
    rt: &tokio::runtime::Runtime,
    clients: &mut [Client],
    dirs: &[PathBuf],
    name: &str,
    members: &[usize],
) -> Result<()> {
    for &m in members {
        let path = dirs[m].join(format!("{name}.job"));
        std::fs::remove_file(&path).with_context(|| format!("cannot delete {}", path.display()))?;
    }
    wait(rt, clients, members, name, "GONE")
}

fn wait(
    rt: &tokio::runtime::Runtime,
    clients: &mut [Client],
    members: &[usize],
    name: &str,
    state: &str,
) -> Result<()> {
    for &m in members {
        let reply = rt.block_on(clients[m].job_wait(name, state, LIMIT))?;
        if !reply.reached {
            bail!(
                "job {name}: node {m} not {state} within {} s",
                LIMIT.as_secs()
            );
        }
    }
    Ok(())
}

/// The churn: `jobs` jobs, one every [`PACE`].
fn churn(
    rt: &tokio::runtime::Runtime,
    clients: &mut [Client],
    dirs: &[PathBuf],
    ips: &[String],
    nodes: &[PathBuf],
    jobs: usize,
) -> Result<Churned> {
    let mut seen = Churned::default();
    let start = Instant::now();
    for k in 0..jobs {
        let due = start + PACE * u32::try_from(k).unwrap_or(u32::MAX);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let (a, b, c) = (k % NODES, (k + 1) % NODES, (k + 2) % NODES);
        let name = format!("churn-{k}");
        let channel = FIRST_CHURN + u32::try_from(k).unwrap_or(u32::MAX);
        define(rt, clients, dirs, ips, &name, channel, &[a, b])?;
        let open = |n: usize| {
            Context::open_with_channel(&nodes[n], Some(&channel_path(&nodes[n], channel)))
                .with_context(|| format!("{name}: open node {n} on channel {channel}"))
        };
        let (exporter, importer) = (open(a)?, open(b)?);
        let alloc = exporter.mem_create(0, SIZE).context("create")?;
        let mut map = exporter.map_on(&alloc, 0).context("map the export")?;
        pattern::fill(&mut map, k as u64);
        drop(map);
        let handle = exporter.export(&alloc).context("export")?;
        check_import(&importer, &handle, k as u64)
            .with_context(|| format!("{name}: the import inside it"))?;
        seen.inside += 1;
        // Across jobs: a process on the third node (the running job's, not this one's) that
        // holds this job's channel there (root made the file, as a site making every channel
        // on every node would): only the daemons' job check stands in its way.
        let held = channel_path(&nodes[c], channel);
        let planted = openimex_driver::channels::create_channel_file(&held, 0o600, None, None)
            .with_context(|| format!("{name}: cannot make {}", held.display()))?;
        let across = Context::open_with_channel(&nodes[c], Some(&held))
            .with_context(|| format!("{name}: a process on node {c} with its channel"))?;
        match across.import_with_timeout(&handle, LIMIT) {
            Ok(imported) => {
                seen.served += 1;
                let _ = across.release(imported);
            }
            Err(_) => seen.refused += 1,
        }
        drop(across);
        if planted {
            std::fs::remove_file(&held)
                .with_context(|| format!("cannot remove {}", held.display()))?;
        }
        exporter.release(alloc).context("release the export")?;
        drop((exporter, importer));
        end(rt, clients, dirs, &name, &[a, b])?;
        seen.jobs += 1;
    }
    Ok(seen)
}

/// Imports `handle`, checks `seed`'s pattern through a mapping, releases it.
fn check_import(ctx: &Context, handle: &FabricHandleBytes, seed: u64) -> Result<Duration> {
    let t = Instant::now();
    let imported = ctx.import_with_timeout(handle, LIMIT).context("import")?;
    let took = t.elapsed();
    let map = ctx.map_on(&imported, 0).context("map")?;
    let checked = pattern::verify(&map, seed);
    drop(map);
    ctx.release(imported).context("release")?;
    checked.map_err(|off| anyhow!("data differs at byte {off}"))?;
    Ok(took)
}

/// The running job: one export per node on its channel, and the contexts that import.
struct Steady {
    contexts: Vec<Context>,
    exports: Vec<(openimex_client::Allocation, FabricHandleBytes)>,
}

impl Steady {
    fn start(nodes: &[PathBuf]) -> Result<Self> {
        let mut contexts = Vec::new();
        let mut exports = Vec::new();
        for (i, dir) in nodes.iter().enumerate() {
            let ctx = Context::open_with_channel(dir, Some(&channel_path(dir, STEADY_CHANNEL)))
                .with_context(|| format!("the running job on node {i}"))?;
            let alloc = ctx.mem_create(0, SIZE).context("create")?;
            let mut map = ctx.map_on(&alloc, 0).context("map")?;
            pattern::fill(&mut map, i as u64);
            drop(map);
            let handle = ctx.export(&alloc).context("export")?;
            exports.push((alloc, handle));
            contexts.push(ctx);
        }
        Ok(Self { contexts, exports })
    }

    /// All-to-all rounds (every node imports every other node's export and checks it) until
    /// `rounds` or `stop`; every import's time. The first error ends it.
    fn rounds(&self, rounds: usize, stop: &AtomicBool) -> Result<Vec<Duration>> {
        let mut took = Vec::new();
        for _ in 0..rounds {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            for (i, ctx) in self.contexts.iter().enumerate() {
                for (j, (_, handle)) in self.exports.iter().enumerate() {
                    if i != j {
                        let t = check_import(ctx, handle, j as u64)
                            .with_context(|| format!("the running job: node {i} from {j}"))?;
                        took.push(t);
                    }
                }
            }
        }
        Ok(took)
    }

    fn release(self) -> Result<()> {
        for ((alloc, _), ctx) in self.exports.into_iter().zip(&self.contexts) {
            ctx.release(alloc)
                .context("release the running job's export")?;
        }
        Ok(())
    }
}
