//! `openimex demo`: an NVLink domain started from a topology (a preset, GB200 NVL72 by
//! default, or a topology file; [`domain`]): the simulated Fabric Manager first, then one GPU
//! driver and one IMEX daemon per compute tray, through the cluster harness. Every GPU exports
//! a buffer and imports every other GPU's buffer; each pair checks a pattern the exporter wrote
//! and writes one back that the exporter checks; then everything is released and every
//! driver's reference counts must be back to zero.
//!
//! With `--partitions K` the FM splits the domain into K cliques: an import from another
//! clique must be refused when the importing GPU maps it (driver-interface §6.8); the refusals
//! are counted against the pairs that cross cliques ([`map_import`]).
//!
//! One thread per GPU plays that GPU's application, each with its own driver client (as each
//! process has its own CUDA context), so imports run concurrently as they would in a job.
//!
//! `--chaos` runs the fault-injection workload instead ([`chaos`]), `--allreduce` an NVLS-style
//! all-reduce over one multicast object ([`allreduce`]).

mod allreduce;
mod chaos;
pub(crate) mod domain;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use openimex_client::{Context, CuError, FabricHandleBytes, Imported, Mapping, pattern};
use openimex_harness::Cluster;

use domain::{Domain, PROBE_TIMEOUT, cross_clique_pairs, wait_probes};

/// `openimex demo` flags.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Compute trays (nodes) that run: the first N of the topology, in slot order [default:
    /// all of them; 4 with --chaos]. The Fabric Manager still serves the whole topology.
    #[arg(long)]
    nodes: Option<usize>,
    /// GPUs per tray [default: the topology's; 2 with --chaos]. Every compute tray of the
    /// topology gets this many (the Fabric Manager serves the layout so changed).
    #[arg(long)]
    gpus_per_node: Option<u32>,
    /// The NVLink domain: a preset, nvl72 (default; 1 rack, 18 trays), nvl36 (1 rack, 9
    /// trays), nvl36x2 (2 racks of 9 trays), nvl576 (8 racks, 144 trays).
    #[arg(long, value_name = "NAME", default_value = openimex_fabric::topology::DEFAULT_PRESET,
          conflicts_with_all = ["topology_file", "chaos"])]
    topology: String,
    /// A topology file instead of a preset (format in the README, "NVLink topologies"; every
    /// compute tray must have the same GPU count).
    #[arg(long, value_name = "FILE", conflicts_with = "chaos")]
    topology_file: Option<PathBuf>,
    /// Split the domain into K partitions (cliques) of whole trays, in slot order: imports
    /// across cliques must be refused at map, imports within a clique verify.
    #[arg(long, value_name = "K", default_value_t = 1, conflicts_with = "chaos")]
    partitions: usize,
    /// Run the all-to-all workload as application processes while seeded random faults hit
    /// it (kill -9 of apps, daemons and GPU drivers, hung and flapping daemons), then check
    /// that nothing read freed memory, every byte read was the one written, no reference
    /// leaked and the domain recovered. Default cluster: 4 nodes x 2 GPUs. Exits non-zero
    /// when an invariant fails.
    #[arg(long)]
    chaos: bool,
    /// Run an NVLS-style all-reduce instead: one multicast object over every GPU of the
    /// domain (the prime on tray 0, imported on every other tray), each GPU's buffer bound to
    /// it; each GPU load-reduces its slice over all members and stores the sum back to all;
    /// then every buffer must hold the sums. Reports bandwidth next to a local memcpy.
    #[arg(long, conflicts_with = "chaos")]
    allreduce: bool,
    /// With --chaos: how long faults are injected, seconds.
    #[arg(long, default_value_t = 60, requires = "chaos")]
    seconds: u64,
    /// With --chaos: seed of every random choice (printed; default: random).
    #[arg(long, requires = "chaos")]
    seed: Option<u64>,
    /// With --chaos: the fault kinds to draw from, comma-separated [default: the kills and
    /// restarts: kill-exporter-app, kill-importer-app, kill-exporter-daemon,
    /// kill-importer-daemon, kill-exporter-driver, flap, restart-node; also hang-below-grace,
    /// hang-past-grace, partition-below-grace, partition-past-grace, partition-heal-in-margin
    /// (partitions need root)].
    #[arg(long, value_delimiter = ',', requires = "chaos", value_parser = parse_fault)]
    faults: Vec<openimex_harness::chaos::FaultKind>,
    /// Bytes each GPU exports (K/M/G suffixes; rounded up to 2 MiB by the driver).
    #[arg(long, default_value = "2M", value_parser = parse_size)]
    buffer_size: u64,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
    /// Keep the nodes' directories (configs, logs) after the demo.
    #[arg(long)]
    keep: bool,
    /// Where to draw the domain (`ctl -N --svg`) while every import is held: trays, states,
    /// the link matrix and node 0's imports [default: openimex-domain.svg in the current
    /// directory; none with --json unless given].
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn parse_fault(s: &str) -> Result<openimex_harness::chaos::FaultKind, String> {
    use openimex_harness::chaos::FaultKind;
    FaultKind::from_name(s.trim()).ok_or_else(|| {
        let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown fault kind {s:?} (one of {})", names.join(", "))
    })
}

fn parse_size(s: &str) -> Result<u64, String> {
    openimex_client::cli::parse_size(s)
}

/// What one GPU's application did.
#[derive(Default)]
struct GpuReport {
    latencies_us: Vec<u64>,
    errors: Vec<String>,
}

/// Shared between the GPU threads.
struct Shared {
    handles: Mutex<Vec<Option<FabricHandleBytes>>>,
    /// Every GPU exported (the main thread waits on it too, to start the import clock).
    exported: Barrier,
    /// Between the GPUs' later phases.
    barrier: Barrier,
    imports_done: AtomicUsize,
    /// Each GPU's cliqueId, by global GPU index.
    cliques: Vec<u32>,
    /// Imports from another clique refused at map, and mapped anyway (the map check missing).
    cross_refused: AtomicUsize,
    cross_mapped: AtomicUsize,
    /// The first refusal's error, as the application saw it.
    refusal: Mutex<Option<String>>,
    bytes_verified: AtomicU64,
    copy_bytes: AtomicU64,
    copy_nanos: AtomicU64,
}

fn seed(exporter: usize, importer: usize, phase: u64) -> u64 {
    ((exporter as u64) << 32) ^ ((importer as u64) << 8) ^ phase
}

/// Runs the demo; prints the summary; fails when any byte or count is wrong.
pub(crate) fn run(args: &DemoArgs) -> Result<()> {
    if args.chaos {
        return chaos::run(args);
    }
    if args.allreduce {
        return allreduce::run(args);
    }
    let Prepared {
        domain,
        spec,
        nodes,
        gpus_per_node,
        buffer,
    } = prepare(args)?;
    let gpus_total = nodes * gpus_per_node as usize;
    let slot = (buffer / gpus_total as u64) / 8 * 8;
    if slot == 0 {
        bail!("--buffer-size {buffer} is too small for {gpus_total} GPUs to each get a slot");
    }
    let cliques: Vec<u32> = (0..gpus_total)
        .map(|g| domain.clique_of_node(g / gpus_per_node as usize))
        .collect();
    let cross_expected = cross_clique_pairs(&cliques);
    let say = |s: &str| {
        if !args.json {
            println!("{s}");
        }
    };
    let (mut cluster, formation, probed) = start_domain(&domain, spec, &say)?;
    say(&format!(
        "Domain UP in {} ms, every GPU's fabric probe complete in {} ms. Every GPU exports {} \
         KiB; {} imports to go{}.",
        formation.as_millis(),
        probed.as_millis(),
        buffer >> 10,
        gpus_total * (gpus_total - 1),
        if cross_expected > 0 {
            format!(", {cross_expected} of them across cliques (to be refused at map)")
        } else {
            String::new()
        }
    ));

    let node_dirs: Vec<PathBuf> = (0..nodes)
        .map(|i| cluster.node(i).dir().to_path_buf())
        .collect();
    let shared = Arc::new(Shared {
        handles: Mutex::new(vec![None; gpus_total]),
        exported: Barrier::new(gpus_total + 1),
        barrier: Barrier::new(gpus_total),
        imports_done: AtomicUsize::new(0),
        cliques,
        cross_refused: AtomicUsize::new(0),
        cross_mapped: AtomicUsize::new(0),
        refusal: Mutex::new(None),
        bytes_verified: AtomicU64::new(0),
        copy_bytes: AtomicU64::new(0),
        copy_nanos: AtomicU64::new(0),
    });
    let mut threads = Vec::new();
    for g in 0..gpus_total {
        let dir = node_dirs[g / gpus_per_node as usize].clone();
        let local_gpu = (g % gpus_per_node as usize) as u32;
        let shared = shared.clone();
        threads.push(std::thread::spawn(move || {
            gpu_app(g, local_gpu, &dir, gpus_total, buffer, slot, &shared)
        }));
    }
    // Phases: exported, imported, written back, verified, released.
    let total_imports = gpus_total * (gpus_total - 1);
    shared.exported.wait();
    let import_start = Instant::now();
    let progress = !args.json;
    let mut last = Instant::now();
    while shared.imports_done.load(Ordering::Relaxed) < total_imports
        && threads.iter().any(|t| !t.is_finished())
    {
        if progress && last.elapsed() > Duration::from_millis(200) {
            bar(shared.imports_done.load(Ordering::Relaxed), total_imports);
            last = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let import_elapsed = import_start.elapsed();
    if progress {
        bar(shared.imports_done.load(Ordering::Relaxed), total_imports);
        eprintln!();
    }
    // The picture while the imports are held (a failure to draw fails no import).
    let svg = match (&args.svg, args.json) {
        (Some(path), _) => Some(path.to_string_lossy().into_owned()),
        (None, false) => Some("openimex-domain.svg".to_string()),
        (None, true) => None,
    };
    let drawn = match svg.map(|svg| (cluster.ctl(0, &["-N", "--svg", &svg]), svg)) {
        None => None,
        Some((Ok(out), svg)) if out.status.success() => Some(svg),
        Some((Ok(out), _)) => {
            eprintln!(
                "warning: no domain picture: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        Some((Err(e), _)) => {
            eprintln!("warning: no domain picture: {e}");
            None
        }
    };
    let mut reports = Vec::new();
    for t in threads {
        // A panicking GPU thread is a failed demo, not a crash of the tool.
        reports.push(t.join().unwrap_or_else(|_| GpuReport {
            errors: vec!["a GPU thread panicked".into()],
            ..Default::default()
        }));
    }

    let (leaked, leak_notes) = leak_check(&node_dirs)?;

    let mut lat: Vec<u64> = reports
        .iter()
        .flat_map(|r| r.latencies_us.iter().copied())
        .collect();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    let errors: Vec<&String> = reports.iter().flat_map(|r| r.errors.iter()).collect();
    let imports = lat.len();
    let copy_gbps = gbps(
        shared.copy_bytes.load(Ordering::Relaxed),
        shared.copy_nanos.load(Ordering::Relaxed),
    );
    let local_gbps = local_memcpy_gbps(buffer);
    let grpc_rtt_us = grpc_rtt_p50_us(&cluster);
    let bytes_verified = shared.bytes_verified.load(Ordering::Relaxed);
    let imports_per_s = imports as f64 / import_elapsed.as_secs_f64().max(1e-9);

    let stop = Instant::now();
    let shutdown = cluster.shutdown();
    let stopped = stop.elapsed();
    let cross_refused = shared.cross_refused.load(Ordering::Relaxed);
    let cross_mapped = shared.cross_mapped.load(Ordering::Relaxed);
    let refusal = shared
        .refusal
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let topo = &domain.topo;
    let summary = serde_json::json!({
        "topology": topo.name,
        "racks": topo.racks.len(),
        "compute_trays": topo.compute_tray_count(),
        "switch_trays": topo.switch_tray_count(),
        "partitions": domain.layout.partitions.len(),
        "nodes": nodes,
        "gpus": gpus_total,
        "cross_clique_expected": cross_expected,
        "cross_clique_refused": cross_refused,
        "cross_clique_mapped": cross_mapped,
        "refusal": refusal,
        "imports": imports,
        "bytes_verified": bytes_verified,
        "errors": errors.len(),
        "leaked_refs": leaked,
        "formation_ms": formation.as_millis() as u64,
        "import_p50_us": pct(0.5),
        "import_p99_us": pct(0.99),
        "imports_per_s": (imports_per_s * 10.0).round() / 10.0,
        "copy_gbps": (copy_gbps * 100.0).round() / 100.0,
        "local_memcpy_gbps": (local_gbps * 100.0).round() / 100.0,
        "grpc_rtt_p50_us": grpc_rtt_us,
        "buffer_bytes": buffer,
        "svg": drawn,
    });
    if args.json {
        println!("{summary}");
    } else {
        println!("Summary ({}):", domain.describe(gpus_per_node));
        println!("  domain formation     : {} ms", formation.as_millis());
        println!("  imports              : {imports} of {total_imports} ({imports_per_s:.0}/s)");
        println!(
            "  import latency       : p50 {} us, p99 {} us",
            pct(0.5),
            pct(0.99)
        );
        println!(
            "  fabric copy          : {copy_gbps:.2} GB/s (local memcpy in this run: {local_gbps:.2} GB/s)"
        );
        println!(
            "  raw gRPC round trip  : p50 {grpc_rtt_us} us (unary call on loopback, this run)"
        );
        println!("  bytes verified       : {bytes_verified}");
        if domain.layout.partitions.len() > 1 {
            println!(
                "  across cliques       : {cross_refused} of {cross_expected} refused at map, \
                 {cross_mapped} mapped"
            );
            if let Some(r) = &refusal {
                println!("  first refusal        : {r}");
            }
        }
        println!("  errors               : {}", errors.len());
        println!("  leaked references    : {leaked}");
        println!("  teardown             : {} ms", stopped.as_millis());
        if let Some(path) = &drawn {
            println!("  domain picture       : {path}");
        }
    }
    for e in errors.iter().take(10) {
        eprintln!("error: {e}");
    }
    for n in &leak_notes {
        eprintln!("leak: {n}");
    }
    shutdown.context("stopping the nodes")?;
    if !errors.is_empty() || leaked > 0 || imports != total_imports {
        bail!(
            "demo failed: {} errors, {leaked} leaked references, {imports} of {total_imports} imports",
            errors.len()
        );
    }
    if cross_refused != cross_expected {
        let check = if cross_refused == 0 {
            "the map check is missing"
        } else {
            "the map check is only partly applied"
        };
        bail!(
            "demo failed: {cross_refused} of {cross_expected} imports across cliques were \
             refused at map ({cross_mapped} mapped): a GPU must not map memory of another \
             clique (driver-interface §6.8), and {check}"
        );
    }
    Ok(())
}

/// The domain the flags ask for, its cluster spec (HBM sized for the buffers), and the buffer
/// size rounded up to the driver's 2 MiB.
struct Prepared {
    domain: Domain,
    spec: openimex_harness::ClusterSpec,
    nodes: usize,
    gpus_per_node: u32,
    buffer: u64,
}

fn prepare(args: &DemoArgs) -> Result<Prepared> {
    let domain = Domain::load(
        &args.topology,
        args.topology_file.as_deref(),
        args.gpus_per_node,
        args.partitions,
        args.nodes,
    )?;
    let binary = std::env::current_exe().context("cannot find this binary's path")?;
    let mut spec = domain.spec(binary)?;
    let nodes = spec.nodes;
    let gpus_per_node = spec.gpus.map_or(0, |g| g.gpus_per_node);
    if nodes * (gpus_per_node as usize) < 2 {
        bail!("the demo needs at least 2 GPUs; run more trays (--nodes)");
    }
    let buffer = args.buffer_size.max(1).div_ceil(2 << 20) * (2 << 20);
    if let Some(g) = spec.gpus.as_mut() {
        g.hbm_mib = (buffer >> 20).max(2) * 2 + 64;
    }
    spec.keep_dir = args.keep;
    Ok(Prepared {
        domain,
        spec,
        nodes,
        gpus_per_node,
        buffer,
    })
}

/// Starts the cluster (the FM first) and waits for the IMEX domain to be UP and every GPU's
/// probe to be complete with its clique: the cluster, the time to UP, the time to probed.
fn start_domain(
    domain: &Domain,
    spec: openimex_harness::ClusterSpec,
    say: &dyn Fn(&str),
) -> Result<(Cluster, Duration, Duration)> {
    let nodes = spec.nodes;
    let gpus_per_node = spec.gpus.map_or(0, |g| g.gpus_per_node);
    say(&format!(
        "Starting a simulated NVLink domain, {}: the Fabric Manager, then one GPU driver and one \
         IMEX daemon per tray...",
        domain.describe(gpus_per_node)
    ));
    let start = Instant::now();
    let cluster = Cluster::start(spec).context("cannot start the nodes")?;
    cluster
        .wait_up(0, Duration::from_secs(120))
        .context("the IMEX domain did not come UP")?;
    let formation = start.elapsed();
    wait_probes(
        &cluster,
        nodes,
        gpus_per_node,
        |n| domain.clique_of_node(n),
        PROBE_TIMEOUT,
    )?;
    Ok((cluster, formation, start.elapsed()))
}

/// Every driver's counts must be back to zero once the applications released everything
/// (allocations, exports, imports and multicast objects and bindings): the references left
/// after a grace of 10 s, and one note per node that kept some.
fn leak_check(node_dirs: &[PathBuf]) -> Result<(u64, Vec<String>)> {
    let mut leaked = 0u64;
    let mut leak_notes = Vec::new();
    for (i, dir) in node_dirs.iter().enumerate() {
        let ctx = Context::open(dir)
            .with_context(|| format!("cannot open node {i}'s driver for the leak check"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = ctx
                .stats()
                .with_context(|| format!("node {i} driver stats"))?;
            let refs = (s.allocations
                + s.exports
                + s.daemon_export_refs
                + s.import_descriptors
                + s.import_refs
                + s.pending_unimports
                + s.multicast_objects
                + s.multicast_bindings) as u64;
            if refs == 0 || Instant::now() >= deadline {
                if refs > 0 {
                    leak_notes.push(format!("node {i}: {s:?}"));
                }
                leaked += refs;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok((leaked, leak_notes))
}

/// Maps `imported` for local GPU `gpu`: the one place where the driver's map check across
/// cliques applies. Today's client maps for the process, without naming the GPU; once the
/// client has `Context::map_on`, this becomes `ctx.map_on(imported, gpu)`.
fn map_import(ctx: &Context, imported: &Imported, gpu: u32) -> Result<Mapping, CuError> {
    ctx.map_on(imported, gpu)
}

fn bar(done: usize, total: usize) {
    let width = 40;
    let filled = done * width / total.max(1);
    eprint!(
        "\r  [{}{}] imports {done}/{total}",
        "#".repeat(filled),
        " ".repeat(width - filled)
    );
    let _ = std::io::stderr().flush();
}

fn gbps(bytes: u64, nanos: u64) -> f64 {
    if nanos == 0 {
        0.0
    } else {
        bytes as f64 / nanos as f64
    }
}

/// The baseline for import latency: p50 of a unary gRPC call (the daemon's `State`) on
/// loopback, in this run. 0 when it cannot be measured.
fn grpc_rtt_p50_us(cluster: &Cluster) -> u64 {
    let node = cluster.node(0);
    let target = openimex_ctl::Target::Tcp {
        host: node.ip().to_string(),
        port: node.cmd_port(),
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return 0;
    };
    rt.block_on(async move {
        let Ok(mut client) = openimex_ctl::Client::connect(target, Duration::from_secs(3)).await
        else {
            return 0;
        };
        let mut samples = Vec::with_capacity(200);
        for i in 0..220 {
            let t = Instant::now();
            if client.state().await.is_err() {
                return 0;
            }
            if i >= 20 {
                samples.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
        }
        samples.sort_unstable();
        samples[samples.len() / 2]
    })
}

/// The baseline: plain memcpy between two private buffers of the same size, in this run.
fn local_memcpy_gbps(size: u64) -> f64 {
    let n = usize::try_from(size).unwrap_or(2 << 20);
    let src = vec![0x5au8; n];
    let mut dst = vec![0u8; n];
    let rounds = 64;
    let t = Instant::now();
    for _ in 0..rounds {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    gbps(
        size * rounds,
        u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX),
    )
}

/// One GPU's application. Follows the phases of [`run`] through the shared barrier.
fn gpu_app(
    me: usize,
    gpu: u32,
    node_dir: &std::path::Path,
    gpus: usize,
    buffer: u64,
    slot: u64,
    shared: &Shared,
) -> GpuReport {
    let mut report = GpuReport::default();
    let fail =
        |report: &mut GpuReport, what: String| report.errors.push(format!("GPU {me}: {what}"));
    let slot_range = |j: usize| {
        let start = j as u64 * slot;
        start as usize..(start + slot) as usize
    };
    // Phase 1: create, fill each importer's slot, export.
    let ctx = Context::open(node_dir);
    let mut own = None;
    match &ctx {
        Ok(ctx) => match ctx
            .mem_create(gpu, buffer)
            .and_then(|a| ctx.map(&a).map(|m| (a, m)))
        {
            Ok((alloc, mut map)) => {
                for j in 0..gpus {
                    pattern::fill(&mut map.as_mut_slice()[slot_range(j)], seed(me, j, 1));
                }
                match ctx.export(&alloc) {
                    Ok(h) => shared.handles.lock().unwrap_or_else(|e| e.into_inner())[me] = Some(h),
                    Err(e) => fail(&mut report, format!("export: {e}")),
                }
                own = Some((alloc, map));
            }
            Err(e) => fail(&mut report, format!("create: {e}")),
        },
        Err(e) => fail(&mut report, format!("open driver: {e}")),
    }
    shared.exported.wait();
    let handles = shared
        .handles
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();

    // Phase 2: import every other GPU's buffer, check my slot, write my answer into it.
    let mut imports = Vec::new();
    if let Ok(ctx) = &ctx {
        for (i, h) in handles.iter().enumerate() {
            if i == me {
                continue;
            }
            let Some(h) = h else {
                fail(&mut report, format!("no handle from GPU {i}"));
                continue;
            };
            let t = Instant::now();
            let imported = match ctx.import(h) {
                Ok(x) => x,
                Err(e) => {
                    fail(&mut report, format!("import from GPU {i}: {e}"));
                    continue;
                }
            };
            report
                .latencies_us
                .push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
            shared.imports_done.fetch_add(1, Ordering::Relaxed);
            if shared.cliques[i] != shared.cliques[me] {
                match map_import(ctx, &imported, gpu) {
                    Ok(_) => {
                        shared.cross_mapped.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        shared.cross_refused.fetch_add(1, Ordering::Relaxed);
                        let mut first = shared.refusal.lock().unwrap_or_else(|e| e.into_inner());
                        first.get_or_insert_with(|| e.to_string());
                    }
                }
                imports.push((imported, None));
                continue;
            }
            match map_import(ctx, &imported, gpu) {
                Ok(mut map) => {
                    let mine = &mut map.as_mut_slice()[slot_range(me)];
                    match pattern::verify(mine, seed(i, me, 1)) {
                        Ok(()) => {
                            shared.bytes_verified.fetch_add(slot, Ordering::Relaxed);
                        }
                        Err(off) => fail(
                            &mut report,
                            format!("GPU {i}'s buffer, slot {me}: mismatch at byte {off}"),
                        ),
                    }
                    pattern::fill(mine, seed(i, me, 2));
                    imports.push((imported, Some(map)));
                }
                Err(e) => {
                    fail(&mut report, format!("map GPU {i}'s buffer: {e}"));
                    imports.push((imported, None));
                }
            }
        }
    }
    shared.barrier.wait();

    // Phase 3: the exporter checks what every importer wrote into its slot.
    if let Some((_, map)) = &own {
        let peers = (0..gpus).filter(|j| *j != me && shared.cliques[*j] == shared.cliques[me]);
        for j in peers {
            match pattern::verify(&map.as_slice()[slot_range(j)], seed(me, j, 2)) {
                Ok(()) => {
                    shared.bytes_verified.fetch_add(slot, Ordering::Relaxed);
                }
                Err(off) => fail(
                    &mut report,
                    format!("slot written by GPU {j}: mismatch at byte {off}"),
                ),
            }
        }
    }
    shared.barrier.wait();

    // Fabric copy bandwidth, measured by one GPU while the others wait (a quiet machine):
    // read a whole remote buffer through its mapping, after one warm-up pass.
    if me == 0
        && let Some((_, Some(map))) = imports.iter().find(|(_, m)| m.is_some())
    {
        let mut copy = vec![0u8; map.len()];
        copy.copy_from_slice(map.as_slice());
        let rounds = 32u64;
        let t = Instant::now();
        for _ in 0..rounds {
            copy.copy_from_slice(std::hint::black_box(map.as_slice()));
            std::hint::black_box(&mut copy);
        }
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        shared.copy_nanos.fetch_add(ns, Ordering::Relaxed);
        shared
            .copy_bytes
            .fetch_add(rounds * map.len() as u64, Ordering::Relaxed);
    }
    shared.barrier.wait();

    // Phase 4: release everything (unimports go through both daemons).
    if let Ok(ctx) = &ctx {
        for (imported, map) in imports {
            drop(map);
            if let Err(e) = ctx.release(imported) {
                fail(&mut report, format!("release import: {e}"));
            }
        }
        if let Some((alloc, map)) = own {
            drop(map);
            if let Err(e) = ctx.release(alloc) {
                fail(&mut report, format!("release allocation: {e}"));
            }
        }
    }
    report
}
