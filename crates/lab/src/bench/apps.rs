//! Scenarios with applications on simulated GPUs (the client library, in this process, one
//! driver client per simulated application as each process has its own CUDA context):
//!
//! - `import`: single unloaded imports between 2 nodes (import then release, one at a time),
//!   p50 and p99, against unary round trips to the raw RPC server; and the two daemons' heap
//!   allocations per import and release, against a raw round trip's at both its ends
//!   ([`super::allocs`]).
//! - `storm`: every GPU of 18 nodes x 4 imports every other GPU's export at once (5112
//!   imports), wall time, against as many raw unary RPCs from as many concurrent clients.
//! - `datapath`: reading and writing a remote export through its fabric mapping, against a
//!   local memcpy of the same size.
//!
//! `import_tls` and `storm_tls` are `import` and `storm` with mutual TLS between the daemons
//! (`ClusterSpec::with_tls`), against the same raw calls over mutual TLS
//! ([`RawServer::start_tls`]): what the daemons add above a TLS round trip.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use openimex_client::{Context, FabricHandleBytes};
use openimex_harness::bench::{
    BenchEntry, Footprint, Unit, median, median_f64, ms, percentile, watch_during,
};
use openimex_harness::{Cluster, ClusterSpec, GpuSpec};

use super::allocs::{METRICS_PORT, daemon_allocations, open_window};
use super::rpc::{RawClient, RawServer};

/// Limit for a domain to come UP before a scenario starts.
const UP_TIMEOUT: Duration = Duration::from_secs(120);
/// Limit for one import, and for one storm round as a whole.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes of each export of `import` and `storm` (the driver's granularity).
const SMALL: u64 = 2 << 20;
/// Imports (and raw round trips) per round of `import`.
const IMPORTS_PER_ROUND: usize = 200;
/// Nodes and GPUs per node of the storm (a GB200 NVL72 rack).
pub(crate) const STORM_NODES: usize = 18;
const STORM_GPUS: u32 = 4;
/// Bytes read and written per pass of `datapath`: larger than the caches, so the figure is
/// memory bandwidth, as on a GPU.
const DATAPATH_BYTES: u64 = 64 << 20;

/// Starts `nodes` nodes with `gpus` simulated GPUs of `hbm_mib` each and waits for UP.
pub(crate) fn gpu_cluster(binary: &Path, nodes: usize, gpus: u32, hbm_mib: u64) -> Result<Cluster> {
    gpu_cluster_with(binary, nodes, gpus, hbm_mib, false, false)
}

/// [`gpu_cluster`], each node serving its metrics on [`METRICS_PORT`] when `metrics`, the
/// daemons speaking mutual TLS to each other when `tls`.
fn gpu_cluster_with(
    binary: &Path,
    nodes: usize,
    gpus: u32,
    hbm_mib: u64,
    metrics: bool,
    tls: bool,
) -> Result<Cluster> {
    let mut spec = ClusterSpec::new(nodes, binary).with_gpus(GpuSpec {
        gpus_per_node: gpus,
        hbm_mib,
        ..GpuSpec::default()
    });
    if tls {
        spec = spec.with_tls();
    }
    start_each(spec, |cluster, i| {
        if metrics {
            let addr = metrics_addr(cluster, i).to_string();
            cluster
                .set_node_config(i, "OPENIMEX_METRICS_ADDR", &addr)
                .context("cannot set a node's metrics address")?;
        }
        Ok(())
    })
}

/// Prepares `spec`'s nodes, starts each after `configure` has set what that node needs, and
/// waits for the domain UP.
pub(super) fn start_each(
    spec: ClusterSpec,
    mut configure: impl FnMut(&mut Cluster, usize) -> Result<()>,
) -> Result<Cluster> {
    let nodes = spec.nodes;
    let mut cluster = Cluster::prepare(spec).context("cannot prepare the nodes")?;
    for i in 0..nodes {
        configure(&mut cluster, i)?;
        cluster.start_node(i).context("cannot start the nodes")?;
    }
    cluster
        .wait_up(0, UP_TIMEOUT)
        .map_err(|e| anyhow!(openimex_harness::bench::short_error(&e)))?;
    Ok(cluster)
}

fn metrics_addr(cluster: &Cluster, i: usize) -> std::net::SocketAddr {
    std::net::SocketAddr::from((cluster.node(i).ip(), METRICS_PORT))
}

/// Opens a driver client on `node_dir`.
fn open(node_dir: &Path) -> Result<Context> {
    Context::open(node_dir)
        .with_context(|| format!("cannot open the driver of {}", node_dir.display()))
}

/// Driver calls one import makes on the two nodes (`docs/reference/driver-interface.md` §1.6; the
/// golden trace test checks them): the importer's GET_FABRIC_EVENTS, IMPORTED_REF, VALIDATE
/// and the ref's RM_FREE; the exporter's dup by UUID, IMPORT_MEM and DESCRIBE.
const DRIVER_CALLS_PER_IMPORT: u32 = 7;

/// One simulated driver call, as the daemons make theirs: an escape round trip on the driver's
/// socket (NV_ESC_CHECK_VERSION_STR, QUERY), timed.
struct DriverCall(openimex_driver::nvidia::transport::Ctl);

impl DriverCall {
    fn open(node_dir: &Path) -> Result<Self> {
        let path = openimex_driver::nvidia::files::ctl_path(node_dir);
        Ok(Self(
            openimex_driver::nvidia::transport::Ctl::open(&path)
                .with_context(|| format!("open {}", path.display()))?,
        ))
    }

    fn time(&self) -> Result<Duration> {
        let t = Instant::now();
        openimex_driver::nvidia::rm::query_version(&self.0).context("driver call")?;
        Ok(t.elapsed())
    }
}

/// The names of `import`'s figures (`import_tls_…` with TLS), in order.
pub(crate) fn import_figures(tls: bool) -> [(String, Unit); 4] {
    let p = if tls { "import_tls" } else { "import" };
    [
        (format!("{p}_p50"), Unit::Us),
        (format!("{p}_p50_vs_calls"), Unit::Us),
        (format!("{p}_p99"), Unit::Us),
        (format!("{p}_allocs"), Unit::Allocs),
    ]
}

/// `import_p50`, `import_p50_vs_calls`, `import_p99` and `import_allocs`; with `tls` the same
/// figures as `import_tls_…`, daemons and raw round trips over mutual TLS.
pub(crate) fn import(binary: &Path, rounds: usize, tls: bool) -> Result<Vec<BenchEntry>> {
    let n = IMPORTS_PER_ROUND * rounds.max(1);
    let cluster = gpu_cluster_with(binary, 2, 1, 16, true, tls)?;
    let exporter = open(cluster.node(0).dir())?;
    let alloc = exporter.mem_create(0, SMALL).context("create")?;
    let handle = exporter.export(&alloc).context("export")?;
    let importer = open(cluster.node(1).dir())?;
    let server = match tls {
        true => RawServer::start_tls(binary)?,
        false => RawServer::start(binary)?,
    };
    let mut raw_client = server.client()?;
    let driver_call = DriverCall::open(cluster.node(0).dir())?;
    let mut samples = Vec::with_capacity(n);
    let mut raw = Vec::with_capacity(n);
    let mut calls = Vec::with_capacity(n);
    let daemons = || -> Result<u64> {
        Ok(daemon_allocations(metrics_addr(&cluster, 0))?
            + daemon_allocations(metrics_addr(&cluster, 1))?)
    };
    // One import and its release, timed, then one raw round trip: the import's time, the round
    // trip's, and the round trip's allocations in this process (the raw client's).
    let cycle = |raw_client: &mut RawClient, i: usize| -> Result<(Duration, Duration, u64)> {
        let t = Instant::now();
        let imported = importer
            .import_with_timeout(&handle, IMPORT_TIMEOUT)
            .with_context(|| format!("import {i}"))?;
        let took = t.elapsed();
        importer
            .release(imported)
            .with_context(|| format!("release {i}"))?;
        let before = crate::heap::allocations().unwrap_or(0);
        let round_trip = raw_client.round_trip()?;
        let after = crate::heap::allocations().unwrap_or(0);
        Ok((took, round_trip, after.saturating_sub(before)))
    };
    // The first imports open the driver's and daemons' paths; they are not counted. Each import
    // is followed by a raw round trip, so both see the machine in the same state: on this
    // shared 2-core machine a run of round trips alone came out anywhere from 65 to 120 us
    // (where the scheduler happened to keep the two threads), moving the ratio from 2.2 to 4.
    for i in 0..10 {
        cycle(&mut raw_client, i)?;
    }
    let daemon_window = open_window(daemons)?;
    let server_window = open_window(|| raw_client.server_allocations())?;
    let mut client_allocs = 0;
    for i in 10..n + 10 {
        let (took, round_trip, allocs) = cycle(&mut raw_client, i)?;
        samples.push(took);
        raw.push(round_trip);
        calls.push(driver_call.time()?);
        client_allocs += allocs;
    }
    let per = |total: u64| total as f64 / n as f64;
    let daemon_allocs = per(daemon_window.close(daemons()?));
    let raw_allocs = per(server_window.close(raw_client.server_allocations()?) + client_allocs);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (daemons, raw_rpc) = match tls {
        true => (
            "2 idle nodes whose daemons speak mutual TLS",
            "unary gRPC round trips over mutual TLS (the daemon's TLS code)",
        ),
        false => ("2 idle nodes", "unary gRPC round trips"),
    };
    let detail = |q: &str| {
        format!(
            "{q} of {n} imports between {daemons}, one at a time (release untimed), against \
             {q} of {n} {raw_rpc} to a raw server on loopback, one after each import"
        )
    };
    let tls_note = match tls {
        true => "; daemons and raw round trips over mutual TLS",
        false => "",
    };
    let [p50, vs_calls, p99, allocs] = import_figures(tls).map(|(name, _)| name);
    Ok(vec![
        BenchEntry::measured(
            p50,
            us(percentile(&samples, 0.5)),
            Unit::Us,
            Some(us(percentile(&raw, 0.5))),
            detail("p50"),
        ),
        BenchEntry::measured(
            vs_calls,
            us(percentile(&samples, 0.5)),
            Unit::Us,
            Some(
                us(percentile(&raw, 0.5))
                    + f64::from(DRIVER_CALLS_PER_IMPORT) * us(percentile(&calls, 0.5)),
            ),
            format!(
                "p50 of {n} imports against the p50 raw round trip plus {DRIVER_CALLS_PER_IMPORT} \
                 p50 simulated driver calls (an escape round trip on the driver's socket, one \
                 after each import: {:.1} us), the RM calls an import makes on the two nodes; \
                 a kernel ioctl costs microseconds{tls_note}",
                us(percentile(&calls, 0.5))
            ),
        ),
        BenchEntry::measured(
            p99,
            us(percentile(&samples, 0.99)),
            Unit::Us,
            Some(us(percentile(&raw, 0.99))),
            detail("p99"),
        ),
        BenchEntry::measured(
            allocs,
            daemon_allocs,
            Unit::Allocs,
            Some(raw_allocs),
            format!(
                "heap allocations of the importer's and the exporter's daemons per import and \
                 its release (mean of {n}), against one unary gRPC round trip's at the raw \
                 client and server together{tls_note}"
            ),
        ),
    ])
}

/// What the GPU applications of a storm share.
struct StormShared {
    handles: Mutex<Vec<Option<FabricHandleBytes>>>,
    /// Start of a round's imports (every GPU has exported).
    go: Barrier,
    /// Every GPU finished its imports.
    imported: Barrier,
    /// Every GPU released its imports.
    released: Barrier,
}

/// What [`storm_on`] measured.
pub(crate) struct Storm {
    /// Wall time of each round's imports.
    pub(crate) walls: Vec<Duration>,
    /// Imports per round.
    pub(crate) imports: usize,
    /// Applications importing at once.
    pub(crate) apps: usize,
    /// Failed imports or releases, with the first few reasons.
    pub(crate) failures: Vec<String>,
    /// The daemons' footprint during the first round, when asked for.
    pub(crate) footprint: Option<Footprint>,
}

/// Runs `rounds` storms on `cluster` (every node with `gpus` GPUs): each GPU's application
/// exports once, then each round imports every other GPU's export and releases them. With
/// `watch`, samples the daemons' footprint during the first round.
pub(crate) fn storm_on(
    cluster: &Cluster,
    binary: &Path,
    gpus: u32,
    rounds: usize,
    watch: bool,
) -> Result<Storm> {
    let apps = cluster.len() * gpus as usize;
    let shared = Arc::new(StormShared {
        handles: Mutex::new(vec![None; apps]),
        go: Barrier::new(apps + 1),
        imported: Barrier::new(apps + 1),
        released: Barrier::new(apps + 1),
    });
    let threads: Vec<_> = (0..apps)
        .map(|me| {
            let dir: PathBuf = cluster.node(me / gpus as usize).dir().to_owned();
            let shared = shared.clone();
            let gpu = (me % gpus as usize) as u32;
            std::thread::spawn(move || storm_app(me, &dir, gpu, rounds, &shared))
        })
        .collect();
    let pids = openimex_harness::bench::daemon_pids(cluster);
    let mut walls = Vec::with_capacity(rounds);
    let mut footprint = None;
    let mut watch_error = None;
    for round in 0..rounds {
        shared.go.wait();
        let start = Instant::now();
        // The sampler may fail before or after the barrier; this thread must reach it once.
        let mut waited = false;
        if watch && round == 0 {
            let sampled = watch_during(binary, &pids, || {
                shared.imported.wait();
                waited = true;
            });
            match sampled {
                Ok((_, f)) => footprint = Some(f),
                Err(e) => watch_error = Some(e),
            }
        }
        if !waited {
            shared.imported.wait();
        }
        walls.push(start.elapsed());
        shared.released.wait();
    }
    let mut failures = Vec::new();
    for t in threads {
        match t.join() {
            Ok(errors) => failures.extend(errors),
            Err(_) => failures.push("a GPU application thread panicked".into()),
        }
    }
    if let Some(e) = watch_error
        && watch
    {
        failures.push(format!("footprint sampling failed: {e}"));
    }
    Ok(Storm {
        walls,
        imports: apps * apps.saturating_sub(1),
        apps,
        failures,
        footprint,
    })
}

/// One GPU's application in a storm. Reaches every barrier of every round whatever fails, so
/// the others never wait forever; returns what failed.
fn storm_app(me: usize, dir: &Path, gpu: u32, rounds: usize, shared: &StormShared) -> Vec<String> {
    let mut errors = Vec::new();
    let ctx = open(dir);
    let alloc = ctx.as_ref().map_err(|e| e.to_string()).and_then(|ctx| {
        let a = ctx.mem_create(gpu, SMALL).map_err(|e| e.to_string())?;
        let h = ctx.export(&a).map_err(|e| e.to_string())?;
        shared.handles.lock().unwrap_or_else(|e| e.into_inner())[me] = Some(h);
        Ok(a)
    });
    if let Err(e) = &alloc {
        errors.push(format!("GPU {me}: export: {e}"));
    }
    for _ in 0..rounds {
        shared.go.wait();
        let deadline = Instant::now() + IMPORT_TIMEOUT;
        let handles = shared
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut held = Vec::new();
        if let Ok(ctx) = &ctx {
            for (i, h) in handles.iter().enumerate().filter(|(i, _)| *i != me) {
                let left = deadline.saturating_duration_since(Instant::now());
                match h {
                    None => errors.push(format!("GPU {me}: no handle from GPU {i}")),
                    Some(_) if left.is_zero() => {
                        errors.push(format!("GPU {me}: round over {IMPORT_TIMEOUT:?}"));
                    }
                    Some(h) => match ctx.import_with_timeout(h, left) {
                        Ok(x) => held.push(x),
                        Err(e) => errors.push(format!("GPU {me}: import from GPU {i}: {e}")),
                    },
                }
            }
        }
        shared.imported.wait();
        if let Ok(ctx) = &ctx {
            for x in held {
                if let Err(e) = ctx.release(x) {
                    errors.push(format!("GPU {me}: release: {e}"));
                }
            }
        }
        shared.released.wait();
    }
    if let (Ok(ctx), Ok(a)) = (&ctx, alloc) {
        let _ = ctx.release(a);
    }
    errors
}

/// The name of `storm`'s figure (`storm_tls` with TLS).
pub(crate) fn storm_figure(tls: bool) -> &'static str {
    if tls { "storm_tls" } else { "storm" }
}

/// `storm`: [`storm_on`] an 18 x 4 domain against the raw RPC burst; with `tls`, `storm_tls`:
/// the daemons and the raw burst over mutual TLS.
pub(crate) fn storm(binary: &Path, rounds: usize, tls: bool) -> Result<BenchEntry> {
    let rounds = rounds.max(1);
    let cluster = gpu_cluster_with(binary, STORM_NODES, STORM_GPUS, 16, false, tls)?;
    let s = storm_on(&cluster, binary, STORM_GPUS, rounds, false)?;
    drop(cluster);
    if let Some(first) = s.failures.first() {
        bail!(
            "{} failures in {rounds} rounds of {} imports; first: {first}",
            s.failures.len(),
            s.imports
        );
    }
    let server = match tls {
        true => RawServer::start_tls(binary)?,
        false => RawServer::start(binary)?,
    };
    let calls_each = s.apps.saturating_sub(1);
    let raw: Vec<Duration> = (0..rounds)
        .map(|_| server.burst(s.apps, calls_each))
        .collect::<Result<_>>()?;
    let (daemons, calls) = match tls {
        true => (
            ", daemons speaking mutual TLS",
            "unary gRPC calls over mutual TLS (the daemon's TLS code, connections made before \
             the clock)",
        ),
        false => ("", "unary gRPC calls"),
    };
    Ok(BenchEntry::measured(
        storm_figure(tls),
        ms(median(&s.walls)),
        Unit::Ms,
        Some(ms(median(&raw))),
        format!(
            "{STORM_NODES} nodes x {STORM_GPUS} GPUs all-to-all{daemons}: {} imports by {} \
             concurrent applications, against as many {calls} by {} concurrent clients to a \
             raw server; median of {rounds} rounds",
            s.imports, s.apps, s.apps
        ),
    ))
}

/// GB/s of one copy of `src` into `dst`.
fn copy_gbps(dst: &mut [u8], src: &[u8]) -> f64 {
    let t = Instant::now();
    dst.copy_from_slice(std::hint::black_box(src));
    std::hint::black_box(&mut *dst);
    src.len() as f64 / t.elapsed().as_nanos().max(1) as f64
}

/// `datapath_read` and `datapath_write`.
pub(crate) fn datapath(binary: &Path, rounds: usize) -> Result<Vec<BenchEntry>> {
    let passes = 8 * rounds.max(1);
    let cluster = gpu_cluster(binary, 2, 1, (DATAPATH_BYTES >> 20) + 16)?;
    let exporter = open(cluster.node(0).dir())?;
    let alloc = exporter.mem_create(0, DATAPATH_BYTES).context("create")?;
    let handle = exporter.export(&alloc).context("export")?;
    let importer = open(cluster.node(1).dir())?;
    let imported = importer
        .import_with_timeout(&handle, IMPORT_TIMEOUT)
        .context("import")?;
    let mut remote = importer.map(&imported).context("map the import")?;
    let len = remote.len();
    let src = vec![0x5au8; len];
    let mut dst = vec![0u8; len];
    // One warm-up copy of each kind, then the three kinds in turn, pass after pass, so the
    // baseline is sampled in the same state of the machine as the fabric copies (measured one
    // kind after the other, the memcpy baseline moved 7.3-9.1 GB/s between runs and the read
    // ratio 0.80-0.95 with it).
    let (mut read, mut write, mut local) = (Vec::new(), Vec::new(), Vec::new());
    for pass in 0..=passes {
        let r = copy_gbps(&mut dst, remote.as_slice());
        let w = copy_gbps(remote.as_mut_slice(), &src);
        let l = copy_gbps(&mut dst, &src);
        if pass > 0 {
            read.push(r);
            write.push(w);
            local.push(l);
        }
    }
    let (read, write, local) = (median_f64(read), median_f64(write), median_f64(local));
    drop(remote);
    importer.release(imported).context("release the import")?;
    let mib = len >> 20;
    let detail = |what: &str| {
        format!(
            "{what} {mib} MiB of another node's export through its fabric mapping, against a \
             memcpy between two local buffers of the same size; median of {passes} passes"
        )
    };
    Ok(vec![
        BenchEntry::measured(
            "datapath_read",
            read,
            Unit::GBps,
            Some(local),
            detail("reading"),
        ),
        BenchEntry::measured(
            "datapath_write",
            write,
            Unit::GBps,
            Some(local),
            detail("writing"),
        ),
    ])
}
