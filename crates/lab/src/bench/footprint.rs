//! `footprint`: each daemon's peak RSS, CPU% and peak open descriptors, against a bare
//! listen-probe process over the same window ([`openimex_harness::bench::watch_during`]):
//!
//! Every cluster here is started from a topology ([`topology_cluster`]): the simulated Fabric
//! Manager first, then one GPU driver (`--fabric-manager`) and one daemon per compute tray.
//!
//! - `idle_18`: the 18 trays x 4 GPUs of nvl72, domain UP, every fabric probe complete, nothing
//!   happening;
//! - `emfile_18`: the same domain, node 0's daemon out of descriptors (its soft NOFILE limit
//!   lowered to what it holds plus two, with 16 connections waiting in its listen backlog): the
//!   accept loop must wait between failed accepts, not spin (only node 0 is measured);
//! - `storm_18`: the same domain during a storm (every GPU imports every other GPU's export);
//! - `exports_18`: the same domain holding 10,000 exports: node 0's applications export 10,000
//!   allocations of 2 MiB (2,500 per GPU; simulated HBM is a sparse file, so this costs no
//!   disk) and node 1's applications import each of them once and keep them, so node 0's
//!   daemon holds 10,000 exporter references and node 1's 10,000 imports; measured idle while
//!   they are held (the daemons learn of an export only when it is imported);
//! - `idle_144`: the 144 trays of nvl576 (8 racks), domain UP or, if it does not come UP in
//!   time, as far as it got (the 144 drivers are idle once their probes completed, and only
//!   the daemons are measured); then, on that domain, `ctl_domain_144`: how long `ctl -N -j`
//!   takes on node 0 against `ctl -q`.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use openimex_client::{Allocation, Context, FabricHandleBytes, Imported};
use openimex_harness::bench::formation_topology;
use openimex_harness::bench::{
    BenchEntry, Unit, daemon_pids, failed_entries, median, ms, short_error, watch_idle,
};
use openimex_harness::{Cluster, ClusterSpec};

use super::apps::{STORM_NODES, storm_on};
use crate::demo::domain::{PROBE_TIMEOUT, wait_probes};

/// Exports held in `exports_18`.
const EXPORTS: usize = 10_000;
/// GPUs per node of the 18-node domain.
const GPUS: u32 = 4;
/// Applications importing the exports at once on node 1.
const IMPORTERS: usize = 8;
/// HBM per simulated GPU: room for node 0's share of the exports.
const HBM_MIB: u64 = (EXPORTS as u64 / GPUS as u64 + 16) * 2;
/// Limit for creating, exporting and importing all of the exports.
const EXPORTS_TIMEOUT: Duration = Duration::from_secs(300);
/// Limit for the 144-node domain to come UP.
const BIG_UP_TIMEOUT: Duration = Duration::from_secs(120);
/// Limit for the 18-node domain to come UP.
const UP_TIMEOUT: Duration = Duration::from_secs(120);

/// The first `trays` trays of the formation topology for that size (nvl72 up to 18, nvl576
/// up to 144), `hbm_mib` per GPU when given, started and UP, and every GPU's fabric probe
/// complete.
fn topology_cluster(
    binary: &Path,
    trays: usize,
    hbm_mib: Option<u64>,
    up: Duration,
) -> Result<Cluster> {
    let mut spec = ClusterSpec::first_trays(formation_topology(trays)?, trays, binary)?;
    if let (Some(g), Some(mib)) = (spec.gpus.as_mut(), hbm_mib) {
        g.hbm_mib = mib;
    }
    let gpus = spec.gpus.map_or(0, |g| g.gpus_per_node);
    let cluster = Cluster::start(spec).with_context(|| format!("start {trays} trays"))?;
    cluster
        .wait_up(0, up)
        .map_err(|e| anyhow::anyhow!(short_error(&e)))?;
    wait_probes(&cluster, trays, gpus, |_| 1, PROBE_TIMEOUT)?;
    Ok(cluster)
}

/// Every footprint entry; a part that fails becomes failed entries and the rest still runs.
pub(crate) fn footprint(binary: &Path, window: Duration) -> Vec<BenchEntry> {
    let mut out = Vec::new();
    match topology_cluster(binary, STORM_NODES, Some(HBM_MIB), UP_TIMEOUT) {
        Ok(cluster) => {
            let pids = daemon_pids(&cluster);
            eprintln!("bench: footprint: idle_18, storm_18, exports_18 ...");
            out.extend(match watch_idle(binary, &pids, window) {
                Ok(f) => f.entries("idle_18", "the 18 trays x 4 GPUs of nvl72, domain UP, idle"),
                Err(e) => failed_entries("idle_18", &short_error(&e)),
            });
            out.extend(match out_of_descriptors(&cluster, binary, window) {
                Ok(e) => e,
                Err(e) => failed_entries("emfile_18", &format!("{e:#}")),
            });
            out.extend(match storm_footprint(&cluster, binary) {
                Ok(e) => e,
                Err(e) => failed_entries("storm_18", &format!("{e:#}")),
            });
            out.extend(match exports(&cluster, binary, window) {
                Ok(e) => e,
                Err(e) => failed_entries("exports_18", &format!("{e:#}")),
            });
        }
        Err(e) => {
            for label in ["idle_18", "emfile_18", "storm_18", "exports_18"] {
                out.extend(failed_entries(label, &format!("{e:#}")));
            }
        }
    }
    eprintln!("bench: footprint: idle_144 ...");
    out.extend(match idle_144(binary, window) {
        Ok(e) => e,
        Err(e) => {
            let mut failed = failed_entries("idle_144", &format!("{e:#}"));
            failed.push(BenchEntry::failed(CTL_DOMAIN, Unit::Ms, format!("{e:#}")));
            failed
        }
    });
    out
}

/// Node 0's daemon out of descriptors over `window`, against a bare process; the limit is
/// put back after.
fn out_of_descriptors(
    cluster: &Cluster,
    binary: &Path,
    window: Duration,
) -> Result<Vec<BenchEntry>> {
    let node = cluster.node(0);
    let pid = node.pid().context("node 0's daemon is not running")?;
    let held = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .context("cannot count node 0's descriptors")?
        .count();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .context("cannot read node 0's limits")?;
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .context("no soft NOFILE limit in /proc/PID/limits")?
        .to_owned();
    let set = |n: &str| -> Result<()> {
        let out = std::process::Command::new("prlimit")
            .arg(format!("--pid={pid}"))
            .arg(format!("--nofile={n}:"))
            .output()
            .context("cannot run prlimit (util-linux)")?;
        if !out.status.success() {
            bail!("prlimit: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    };
    set(&(held + 2).to_string())?;
    let target = std::net::SocketAddr::from((node.ip(), node.server_port()));
    let waiting: Vec<std::net::TcpStream> = (0..16)
        .filter_map(|_| std::net::TcpStream::connect(target).ok())
        .collect();
    let watched = watch_idle(binary, &[pid], window);
    drop(waiting);
    set(&soft)?;
    Ok(watched.map_err(|e| anyhow::anyhow!(short_error(&e)))?.entries(
        "emfile_18",
        "node 0 of the idle 18-tray domain out of descriptors, 16 connections waiting to be accepted",
    ))
}

fn storm_footprint(cluster: &Cluster, binary: &Path) -> Result<Vec<BenchEntry>> {
    let s = storm_on(cluster, binary, GPUS, 1, true)?;
    if let Some(first) = s.failures.first() {
        bail!("{} storm failures; first: {first}", s.failures.len());
    }
    let f = s.footprint.context("the storm was not sampled")?;
    Ok(f.entries(
        "storm_18",
        &format!("during a storm of {} imports", s.imports),
    ))
}

/// Node 0's applications (one per GPU) and what they exported.
struct Exporters {
    _ctxs: Vec<Context>,
    _allocs: Vec<Allocation>,
    handles: Vec<FabricHandleBytes>,
}

fn export_all(dir: &Path, deadline: Instant) -> Result<Exporters> {
    let mut ctxs = Vec::new();
    let mut allocs = Vec::with_capacity(EXPORTS);
    let mut handles = Vec::with_capacity(EXPORTS);
    for gpu in 0..GPUS {
        let ctx = Context::open(dir).context("open node 0's driver")?;
        for i in 0..EXPORTS / GPUS as usize {
            if Instant::now() >= deadline {
                bail!("only {} exports within {EXPORTS_TIMEOUT:?}", handles.len());
            }
            let a = ctx
                .mem_create(gpu, 2 << 20)
                .with_context(|| format!("create {i} on GPU {gpu}"))?;
            handles.push(ctx.export(&a).with_context(|| format!("export {i}"))?);
            allocs.push(a);
        }
        ctxs.push(ctx);
    }
    Ok(Exporters {
        _ctxs: ctxs,
        _allocs: allocs,
        handles,
    })
}

/// `IMPORTERS` applications on `dir`, importing `handles` between them and keeping them.
fn import_all(
    dir: &Path,
    handles: &[FabricHandleBytes],
    deadline: Instant,
) -> Result<Vec<(Context, Vec<Imported>)>> {
    let first_error = Mutex::new(None);
    let held = std::thread::scope(|s| {
        let workers: Vec<_> = (0..IMPORTERS)
            .map(|w| {
                let first_error = &first_error;
                s.spawn(move || {
                    let ctx = Context::open(dir).ok()?;
                    let mut mine = Vec::new();
                    for h in handles.iter().skip(w).step_by(IMPORTERS) {
                        let left = deadline.saturating_duration_since(Instant::now());
                        match ctx.import_with_timeout(h, left) {
                            Ok(x) => mine.push(x),
                            Err(e) => {
                                let mut slot =
                                    first_error.lock().unwrap_or_else(|e| e.into_inner());
                                slot.get_or_insert(e.to_string());
                                break;
                            }
                        }
                    }
                    Some((ctx, mine))
                })
            })
            .collect();
        workers
            .into_iter()
            .filter_map(|w| w.join().ok().flatten())
            .collect::<Vec<_>>()
    });
    let imported: usize = held.iter().map(|(_, v)| v.len()).sum();
    if imported < handles.len() {
        let why = first_error
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(|| "an importer could not open the driver".into());
        bail!(
            "{imported} of {} imports done; first failure: {why}",
            handles.len()
        );
    }
    Ok(held)
}

fn exports(cluster: &Cluster, binary: &Path, window: Duration) -> Result<Vec<BenchEntry>> {
    let deadline = Instant::now() + EXPORTS_TIMEOUT;
    let start = Instant::now();
    let exporters = export_all(cluster.node(0).dir(), deadline)?;
    let held = import_all(cluster.node(1).dir(), &exporters.handles, deadline)?;
    let setup = start.elapsed();
    let pids = daemon_pids(cluster);
    let f = watch_idle(binary, &pids, window).map_err(|e| anyhow::anyhow!(short_error(&e)))?;
    // Node 0's daemon holds the exporter references, node 1's the imports: name both.
    let node = |i: usize| f.daemons.get(i).map_or(0.0, |u| u.rss_mib);
    let what = format!(
        "{EXPORTS} exports of node 0 each imported by node 1 and held (set up in {:.1} s), \
         idle; node 0 {:.1} MiB, node 1 {:.1} MiB",
        setup.as_secs_f64(),
        node(0),
        node(1)
    );
    // The daemons and drivers clean up on their own when the applications go.
    drop(held);
    drop(exporters);
    Ok(f.entries("exports_18", &what))
}

fn idle_144(binary: &Path, window: Duration) -> Result<Vec<BenchEntry>> {
    let nodes = 144;
    let spec = ClusterSpec::first_trays(formation_topology(nodes)?, nodes, binary)?;
    let cluster = Cluster::start(spec).context("start the 144 trays of nvl576")?;
    let up = cluster.wait_up(0, BIG_UP_TIMEOUT);
    let what = match &up {
        Ok(_) => "the 144 trays of nvl576, domain UP, idle".to_owned(),
        Err(e) => format!(
            "the 144 trays of nvl576, NOT UP ({}), measured anyway",
            short_error(e)
        ),
    };
    let pids = daemon_pids(&cluster);
    let f = watch_idle(binary, &pids, window).map_err(|e| anyhow::anyhow!(short_error(&e)))?;
    let mut entries = f.entries("idle_144", &what);
    entries.push(match up {
        Ok(_) => ctl_domain(&cluster, nodes),
        Err(e) => BenchEntry::failed(CTL_DOMAIN, Unit::Ms, short_error(&e)),
    });
    Ok(entries)
}

/// Name of the [`ctl_domain`] entry.
const CTL_DOMAIN: &str = "ctl_domain_144";
/// Calls of each kind [`ctl_domain`] times.
const CTL_SAMPLES: usize = 7;

/// `ctl_domain_144`: how long `ctl -N -j` takes on node 0 of the idle domain (node 0 asks
/// every peer for its row and assembles the 144 x 144 matrix), against `ctl -q` on the same
/// node (its own state, no peer asked): the same process start and connection, so the ratio is
/// the cost of the domain view. Medians of [`CTL_SAMPLES`] each, alternating.
fn ctl_domain(cluster: &Cluster, nodes: usize) -> BenchEntry {
    let time = |args: &[&str]| -> Result<Duration> {
        let t = Instant::now();
        let out = cluster
            .ctl(0, args)
            .map_err(|e| anyhow::anyhow!(short_error(&e)))?;
        let took = t.elapsed();
        if !out.status.success() {
            bail!(
                "ctl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(took)
    };
    let mut domain = Vec::with_capacity(CTL_SAMPLES);
    let mut state = Vec::with_capacity(CTL_SAMPLES);
    for _ in 0..CTL_SAMPLES {
        match (time(&["-N", "-j"]), time(&["-q"])) {
            (Ok(d), Ok(s)) => {
                domain.push(d);
                state.push(s);
            }
            (Err(e), _) | (_, Err(e)) => {
                return BenchEntry::failed(CTL_DOMAIN, Unit::Ms, format!("{e:#}"));
            }
        }
    }
    BenchEntry::measured(
        CTL_DOMAIN,
        ms(median(&domain)),
        Unit::Ms,
        Some(ms(median(&state))),
        format!(
            "`ctl -N -j` on node 0 of the idle {nodes}-node domain (every peer asked for its \
             row), against `ctl -q` on the same node; medians of {CTL_SAMPLES} each"
        ),
    )
}
