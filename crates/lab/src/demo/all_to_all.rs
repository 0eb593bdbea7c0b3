//! The demo's default mode: every GPU exports a buffer and imports every other GPU's buffer;
//! each pair checks a pattern the exporter wrote and writes one back that the exporter checks;
//! then everything is released and every driver's reference counts must be back to zero. With
//! `--partitions K`, imports across cliques must be refused at map ([`map_import`]).
//!
//! One thread per GPU plays that GPU's application, each with its own driver client (as each
//! process has its own CUDA context), so imports run concurrently as they would in a job.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use openimex_client::{Context, CuError, FabricHandleBytes, Imported, Mapping, pattern};
use openimex_harness::Cluster;

use super::args::DemoArgs;
use super::domain::cross_clique_pairs;
use super::setup::{Prepared, gbps, leak_check, local_memcpy_gbps, prepare, start_domain};

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
pub(super) fn run(args: &DemoArgs) -> Result<()> {
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
    let drawn = draw(&cluster, args);
    let mut reports = Vec::new();
    for t in threads {
        // A panicking GPU thread is a failed demo, not a crash of the tool.
        reports.push(t.join().unwrap_or_else(|_| GpuReport {
            errors: vec!["a GPU thread panicked".into()],
            ..Default::default()
        }));
    }

    let (leaked, leak_notes) = leak_check(&node_dirs)?;

    let mut lat: Vec<u64> = (reports.iter())
        .flat_map(|r| r.latencies_us.iter().copied())
        .collect();
    lat.sort_unstable();
    let pct = |p: f64| quantile(&lat, p);
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
        "svg": drawn.as_ref().map(|d| d.path.clone()),
        "svg_replaced": drawn.as_ref().is_some_and(|d| d.replaced),
    });
    if args.json {
        println!("{summary}");
    } else {
        print_summary(&domain.describe(gpus_per_node), &summary, stopped);
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
             clique (docs/reference/driver-interface.md §6.8), and {check}"
        );
    }
    Ok(())
}

/// Where the picture went: the path as given (or the default), and whether a file was there
/// before (the picture replaced it).
struct Drawn {
    path: String,
    replaced: bool,
}

/// Draws the domain (`ctl -N --svg`) where `--svg` says (by default `openimex-domain.svg`,
/// none with `--json`): where it went, or `None` (a failure to draw is a warning).
fn draw(cluster: &Cluster, args: &DemoArgs) -> Option<Drawn> {
    let svg = match (&args.svg, args.json) {
        (Some(path), _) => path.to_string_lossy().into_owned(),
        (None, false) => "openimex-domain.svg".to_string(),
        (None, true) => return None,
    };
    let replaced = std::path::Path::new(&svg).exists();
    match cluster.ctl(0, &["-N", "--svg", &svg]) {
        Ok(out) if out.status.success() => Some(Drawn {
            path: svg,
            replaced,
        }),
        Ok(out) => {
            eprintln!(
                "warning: no domain picture: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        Err(e) => {
            eprintln!("warning: no domain picture: {e}");
            None
        }
    }
}

/// The summary for a person, from the JSON one (`--json` prints that instead).
fn print_summary(domain: &str, s: &serde_json::Value, teardown: Duration) {
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
    println!("Summary ({domain}):");
    println!("  domain formation     : {} ms", n("formation_ms"));
    println!(
        "  imports              : {} of {} ({:.0}/s)",
        n("imports"),
        n("gpus") * n("gpus").saturating_sub(1),
        f("imports_per_s")
    );
    println!(
        "  import latency       : p50 {} us, p99 {} us",
        n("import_p50_us"),
        n("import_p99_us")
    );
    println!(
        "  fabric copy          : {:.2} GB/s (local memcpy in this run: {:.2} GB/s)",
        f("copy_gbps"),
        f("local_memcpy_gbps")
    );
    println!(
        "  raw gRPC round trip  : p50 {} us (unary call on loopback, this run)",
        n("grpc_rtt_p50_us")
    );
    println!("  bytes verified       : {}", n("bytes_verified"));
    if n("partitions") > 1 {
        println!(
            "  across cliques       : {} of {} refused at map, {} mapped",
            n("cross_clique_refused"),
            n("cross_clique_expected"),
            n("cross_clique_mapped")
        );
        if let Some(r) = s["refusal"].as_str() {
            println!("  first refusal        : {r}");
        }
    }
    println!("  errors               : {}", n("errors"));
    println!("  leaked references    : {}", n("leaked_refs"));
    println!("  teardown             : {} ms", teardown.as_millis());
    if let Some(path) = s["svg"].as_str() {
        println!(
            "  domain picture       : {}",
            picture_line(path, s["svg_replaced"] == true)
        );
    }
}

/// Where the picture is, as an absolute path (a relative one is under the current
/// directory), and that it replaced the file there if it did.
fn picture_line(path: &str, replaced: bool) -> String {
    let path = std::path::Path::new(path);
    let shown = match std::env::current_dir() {
        Ok(cwd) if path.is_relative() => cwd.join(path),
        _ => path.to_path_buf(),
    };
    let mut line = format!("written to {}", shown.display());
    if replaced {
        line.push_str(" (replaced the file that was there)");
    }
    line
}

/// Maps `imported` for local GPU `gpu`: the one place where the driver's map check across
/// cliques applies. Today's client maps for the process, without naming the GPU; once the
/// client has `Context::map_on`, this becomes `ctx.map_on(imported, gpu)`.
fn map_import(ctx: &Context, imported: &Imported, gpu: u32) -> Result<Mapping, CuError> {
    ctx.map_on(imported, gpu)
}

pub(super) fn bar(done: usize, total: usize) {
    let width = 40;
    let filled = done * width / total.max(1);
    eprint!(
        "\r  [{}{}] imports {done}/{total}",
        "#".repeat(filled),
        " ".repeat(width - filled)
    );
    let _ = std::io::stderr().flush();
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
        release_held(ctx, imports, own, |e| fail(&mut report, e));
    }
    report
}

/// Releases what one GPU's application holds: its imports first (each unimport goes through
/// both daemons), then its own allocation, unmapping each before; every failure told `fail`.
pub(super) fn release_held(
    ctx: &Context,
    imports: Vec<(Imported, Option<Mapping>)>,
    own: Option<(openimex_client::Allocation, Mapping)>,
    mut fail: impl FnMut(String),
) {
    for (imported, map) in imports {
        drop(map);
        if let Err(e) = ctx.release(imported) {
            fail(format!("release import: {e}"));
        }
    }
    if let Some((alloc, map)) = own {
        drop(map);
        if let Err(e) = ctx.release(alloc) {
            fail(format!("release allocation: {e}"));
        }
    }
}

/// The `p` quantile of `sorted` by nearest rank (0 for none).
pub(super) fn quantile(sorted: &[u64], p: f64) -> u64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(0)
}
