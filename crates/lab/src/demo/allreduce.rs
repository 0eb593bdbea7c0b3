//! `openimex-lab demo --allreduce`: an NVLS-style all-reduce, as NCCL's NVLS algorithm does it,
//! over ONE multicast object spanning every GPU of the domain (issue 14, item 6;
//! docs/reference/driver-interface.md §1.6). The prime is created on tray 0 for every GPU and exported; every
//! other tray imports it once; every GPU is added and binds its own buffer. GPU g's buffer
//! starts with u32 values derived from g and the index ([`value`]); each GPU takes its slice
//! of the buffer ([`slice()`]), load-reduces it over all members (`multimem.ld_reduce`) and
//! stores the sums back to all of them (`multimem.st`); then every buffer must hold the sums
//! ([`expected`]) everywhere.
//!
//! One thread per tray sets the tray up with its own driver client (as one process per tray
//! would), then one thread per GPU does that GPU's reduce with its own mapping of the team.
//! The all-reduce runs [`ROUNDS`] times on the same buffers (one warm-up, then the timed
//! ones, each ended by a barrier of every GPU as a collective call is): after k rounds every element is the first round's sum times n^(k-1), which is
//! what the check expects.
//!
//! What bounds the bandwidth: the simulated switch does the fan-out in software. For a
//! buffer of B bytes over n GPUs, each GPU's slice of B/n bytes is read from n memories
//! (B bytes read, summed 4 bytes at a time) and written to n memories (B bytes), so one round
//! moves n·B bytes in and n·B bytes out of memory where a local memcpy of the buffer moves B
//! and B, on as many CPU cores as the machine has rather than n GPUs' worth of NVLink. GPU 0
//! measures both rates alone after the timed rounds (two more all-reduces of every slice,
//! which the check counts), and the summary predicts the ratio from them:
//! cores / (n × (memcpy/reduce + memcpy/store)), an upper bound the measured ratio comes to
//! within the cost of the per-round barrier.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use openimex_client::{Allocation, Context, FabricHandleBytes, Mapping, McMapping, Multicast};

use super::args::DemoArgs;
use super::setup::{gbps, leak_check, local_memcpy_gbps, prepare, start_domain};

/// All-reduce rounds over the same buffers: one warm-up, then the timed ones.
const ROUNDS: u32 = 11;

/// All-reduces GPU 0 then runs alone (one to fault its pages in, one timed).
const SOLO_ROUNDS: u32 = 2;

/// The element range of GPU `g`'s slice of `elements` over `gpus` GPUs: consecutive, disjoint,
/// covering everything, sizes differing by at most one.
fn slice(elements: usize, gpus: usize, g: usize) -> Range<usize> {
    let at = |k: usize| (elements as u128 * k as u128 / gpus.max(1) as u128) as usize;
    at(g)..at(g + 1)
}

/// GPU `g`'s starting value at element `i`: depends on both, so a missing member, a member
/// counted twice or a shifted element all change the sum.
fn value(g: usize, i: usize) -> u32 {
    let (g, i) = (g as u32, i as u32);
    g.wrapping_add(1)
        .wrapping_mul(i.wrapping_add(1))
        .wrapping_add(g.wrapping_mul(g))
}

/// Element `i` of every buffer after `rounds` all-reduces over `gpus` GPUs: the sum of
/// [`value`] over the GPUs (closed form, wrapping as the u32 reduce does), times gpus^(rounds-1)
/// since every later round sums n equal buffers.
fn expected(gpus: usize, i: usize, rounds: u32) -> u32 {
    let n = gpus as u64;
    // Σ(g+1) = n(n+1)/2 and Σg² = (n-1)n(2n-1)/6 over g in 0..n, reduced mod 2^32.
    let firsts = (n * (n + 1) / 2) as u32;
    let squares = (n.saturating_sub(1) * n * (2 * n).saturating_sub(1) / 6) as u32;
    let once = firsts
        .wrapping_mul((i as u32).wrapping_add(1))
        .wrapping_add(squares);
    (1..rounds).fold(once, |acc, _| acc.wrapping_mul(gpus as u32))
}

/// NCCL's bus bandwidth for all-reduce: algorithm bandwidth × 2(n-1)/n.
fn bus_bandwidth(alg_gbps: f64, gpus: usize) -> f64 {
    alg_gbps * 2.0 * (gpus as f64 - 1.0) / gpus as f64
}

/// `x` to 4 significant digits (a debug build's figures are far below 0.01 GB/s).
fn significant(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(3 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// Shared between the tray and GPU threads.
struct Shared {
    gpus: usize,
    gpus_per_node: usize,
    buffer: u64,
    handle: Mutex<Option<FabricHandleBytes>>,
    /// Trays: the prime exported; every buffer bound (map after it, as NCCL's ranks do).
    exported: Barrier,
    bound: Barrier,
    /// Every GPU: the timed rounds start, and end.
    start: Barrier,
    end: Barrier,
    /// The first GPU's start and the last GPU's end of the timed rounds, each taken by a
    /// running GPU thread (a thread woken from a barrier may wait long for a core when 72
    /// GPU threads share two).
    timed: Mutex<Option<(Instant, Instant)>>,
    /// Every GPU: the end of each timed round.
    round: Barrier,
    /// Every GPU: GPU 0's lone round is over.
    solo: Barrier,
    /// Trays: every GPU checked its buffer (nobody releases while others still read).
    verified: Barrier,
    imports: AtomicU64,
    /// GPU 0's timed lone all-reduce of every slice: its load-reduces and its stores.
    solo_reduce_nanos: AtomicU64,
    solo_store_nanos: AtomicU64,
    errors: Mutex<Vec<String>>,
    mismatches: AtomicU64,
}

impl Shared {
    fn fail(&self, what: String) {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(what);
    }
}

/// Runs the all-reduce demo; prints the summary; fails when any check does.
pub(super) fn run(args: &DemoArgs) -> Result<()> {
    if args.partitions > 1 {
        bail!(
            "--allreduce runs one multicast team over the whole domain, which must be one \
             clique: drop --partitions"
        );
    }
    let prepared = prepare(args)?;
    let (nodes, gpus_per_node, buffer) = (prepared.nodes, prepared.gpus_per_node, prepared.buffer);
    let domain = &prepared.domain;
    let gpus = nodes * gpus_per_node as usize;
    if buffer / 4 < gpus as u64 {
        bail!("--buffer-size {buffer} is too small for {gpus} GPUs to each get a slice");
    }
    let say = |s: &str| {
        if !args.json {
            println!("{s}");
        }
    };
    let (mut cluster, formation, probed) = start_domain(domain, prepared.spec, &say)?;
    say(&format!(
        "Domain UP in {} ms, every GPU's fabric probe complete in {} ms. All-reduce of {} KiB \
         per GPU over one multicast object of {gpus} GPUs, {ROUNDS} rounds...",
        formation.as_millis(),
        probed.as_millis(),
        buffer >> 10,
    ));
    let node_dirs: Vec<PathBuf> = (0..nodes)
        .map(|i| cluster.node(i).dir().to_path_buf())
        .collect();
    let shared = Shared {
        gpus,
        gpus_per_node: gpus_per_node as usize,
        buffer,
        handle: Mutex::new(None),
        exported: Barrier::new(nodes),
        bound: Barrier::new(nodes),
        start: Barrier::new(gpus),
        end: Barrier::new(gpus),
        timed: Mutex::new(None),
        round: Barrier::new(gpus),
        solo: Barrier::new(gpus),
        verified: Barrier::new(nodes),
        imports: AtomicU64::new(0),
        solo_reduce_nanos: AtomicU64::new(0),
        solo_store_nanos: AtomicU64::new(0),
        errors: Mutex::new(Vec::new()),
        mismatches: AtomicU64::new(0),
    };
    std::thread::scope(|s| {
        for (tray, dir) in node_dirs.iter().enumerate() {
            let shared = &shared;
            s.spawn(move || tray_app(tray, dir, shared));
        }
    });
    let elapsed = shared
        .timed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .map_or(Duration::ZERO, |(a, b)| b.saturating_duration_since(a));
    let local = local_memcpy_gbps(buffer);
    let (leaked, leak_notes) = leak_check(&node_dirs)?;
    let shutdown = cluster.shutdown();

    let timed = u64::from(ROUNDS - 1);
    let alg = gbps(
        buffer * timed,
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
    );
    let bus = bus_bandwidth(alg, gpus);
    let ratio = if local > 0.0 { alg / local } else { 0.0 };
    // The bound: one round reads n x B bytes (each slice from n members) and writes n x B
    // (each sum to n members), on `cores` cores; GPU 0's lone round measured both rates.
    let solo_r = shared.solo_reduce_nanos.load(Ordering::Relaxed);
    let solo_s = shared.solo_store_nanos.load(Ordering::Relaxed);
    let fanout = gpus as u64 * buffer;
    let (reduce_gbps, store_gbps) = (gbps(fanout, solo_r), gbps(fanout, solo_s));
    let cores = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(gpus);
    let predicted = gbps(buffer * cores as u64, solo_r + solo_s);
    let predicted_ratio = if local > 0.0 { predicted / local } else { 0.0 };
    let errors = shared
        .errors
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    let mismatches = shared.mismatches.load(Ordering::Relaxed);
    let imports = shared.imports.load(Ordering::Relaxed);
    let summary = serde_json::json!({
        "topology": domain.topo.name,
        "nodes": nodes,
        "gpus": gpus,
        "imports": imports,
        "errors": errors.len(),
        "leaked_refs": leaked,
        "allreduce_errors": mismatches,
        "buffer_bytes": buffer,
        "rounds": timed,
        "allreduce_us": u64::try_from(elapsed.as_micros() / u128::from(timed)).unwrap_or(u64::MAX),
        "allreduce_algbw_gbps": significant(alg),
        "allreduce_busbw_gbps": significant(bus),
        "local_memcpy_gbps": significant(local),
        "allreduce_ratio": significant(ratio),
        "fanout_reduce_gbps": significant(reduce_gbps),
        "fanout_store_gbps": significant(store_gbps),
        "cores": cores,
        "predicted_ratio": significant(predicted_ratio),
        "formation_ms": formation.as_millis() as u64,
    });
    if args.json {
        println!("{summary}");
    } else {
        println!("Summary ({}):", domain.describe(gpus_per_node));
        println!("  GPUs in the team     : {gpus} (the prime on tray 0, {imports} imports of it)");
        println!(
            "  all-reduce           : {} KiB per GPU, {} us per round ({timed} timed rounds)",
            buffer >> 10,
            elapsed.as_micros() / u128::from(timed)
        );
        println!(
            "  algorithm bandwidth  : {} GB/s (bytes of one buffer / time)",
            significant(alg)
        );
        println!(
            "  bus bandwidth        : {} GB/s (x 2(n-1)/n, as NCCL reports)",
            significant(bus)
        );
        println!(
            "  local memcpy         : {} GB/s in this run; ratio {} (algorithm \
             bandwidth / memcpy)",
            significant(local),
            significant(ratio)
        );
        println!(
            "  software fan-out     : one core load-reduces {} GB/s and stores {} GB/s of \
             member memory; a round moves {gpus} x the buffer each way on {cores} core(s), \
             which predicts a ratio of {}",
            significant(reduce_gbps),
            significant(store_gbps),
            significant(predicted_ratio)
        );
        println!("  elements wrong       : {mismatches}");
        println!("  errors               : {}", errors.len());
        println!("  leaked references    : {leaked}");
    }
    for e in errors.iter().take(10) {
        eprintln!("error: {e}");
    }
    for n in &leak_notes {
        eprintln!("leak: {n}");
    }
    shutdown.context("stopping the nodes")?;
    if !errors.is_empty() || leaked > 0 || mismatches > 0 || imports != nodes as u64 - 1 {
        bail!(
            "all-reduce failed: {} errors, {mismatches} wrong elements, {leaked} leaked \
             references, {imports} of {} imports",
            errors.len(),
            nodes - 1
        );
    }
    Ok(())
}

/// What one tray set up: its client, the team object, and each local GPU's buffer with its
/// own mapping (to fill it and check it).
type Buffers = Vec<(Allocation, Mapping)>;

/// One tray: create or import the team, add and bind every local GPU, then run its GPUs'
/// threads, check their buffers and release everything. Every barrier is met even after a
/// failure, so the other trays finish (and report) too.
fn tray_app(tray: usize, dir: &std::path::Path, shared: &Shared) {
    let fail = |what: String| shared.fail(format!("tray {tray}: {what}"));
    let ctx = Context::open(dir)
        .map_err(|e| fail(format!("open driver: {e}")))
        .ok();
    let prime = match (&ctx, tray) {
        (Some(ctx), 0) => match ctx.multicast_create(shared.gpus as u32, shared.buffer) {
            Ok(mc) => {
                match mc.export() {
                    Ok(h) => *shared.handle.lock().unwrap_or_else(|e| e.into_inner()) = Some(h),
                    Err(e) => fail(format!("export the multicast object: {e}")),
                }
                Some(mc)
            }
            Err(e) => {
                fail(format!("create the multicast object: {e}"));
                None
            }
        },
        _ => None,
    };
    shared.exported.wait();
    let mc = match (&ctx, prime) {
        (_, Some(mc)) => Some(mc),
        (Some(ctx), None) if tray > 0 => import(ctx, shared).map_err(fail).ok(),
        _ => None,
    };
    let buffers = match (&ctx, &mc) {
        (Some(ctx), Some(mc)) => setup(tray, ctx, mc, shared).map_err(fail).ok(),
        _ => None,
    };
    shared.bound.wait();
    let first = tray * shared.gpus_per_node;
    std::thread::scope(|s| {
        for k in 0..shared.gpus_per_node {
            let map = mc
                .as_ref()
                .filter(|_| buffers.is_some())
                .map(|mc| {
                    mc.map()
                        .map_err(|e| fail(format!("GPU {k}: map the team: {e}")))
                })
                .and_then(Result::ok);
            s.spawn(move || gpu_app(first + k, map, shared));
        }
    });
    if let Some(buffers) = &buffers {
        for (k, (_, map)) in buffers.iter().enumerate() {
            check(first + k, map, shared);
        }
    }
    shared.verified.wait();
    let Some(ctx) = &ctx else { return };
    if let Some(mc) = mc
        && let Err(e) = mc.release()
    {
        fail(format!("release the multicast object: {e}"));
    }
    for (k, (alloc, map)) in buffers.into_iter().flatten().enumerate() {
        drop(map);
        if let Err(e) = ctx.release(alloc) {
            fail(format!("GPU {k}: release the buffer: {e}"));
        }
    }
}

/// Imports the prime's handle on this tray.
fn import<'a>(ctx: &'a Context, shared: &Shared) -> Result<Multicast<'a>, String> {
    let handle = *shared.handle.lock().unwrap_or_else(|e| e.into_inner());
    let handle = handle.ok_or("no handle from tray 0 (its create or export failed)")?;
    let mc = ctx
        .multicast_import(&handle)
        .map_err(|e| format!("import the multicast object: {e}"))?;
    shared.imports.fetch_add(1, Ordering::Relaxed);
    Ok(mc)
}

/// Adds every local GPU to the team, then gives each a buffer holding its [`value`]s, bound
/// at offset 0 of the object (binding waits for the team: every GPU of the domain added).
fn setup(
    tray: usize,
    ctx: &Context,
    mc: &Multicast<'_>,
    shared: &Shared,
) -> Result<Buffers, String> {
    let locals = 0..shared.gpus_per_node as u32;
    for gpu in locals.clone() {
        mc.add_device(gpu)
            .map_err(|e| format!("GPU {gpu}: add to the team: {e}"))?;
    }
    let mut buffers = Vec::new();
    for gpu in locals {
        let g = tray * shared.gpus_per_node + gpu as usize;
        let alloc = ctx
            .mem_create(gpu, shared.buffer)
            .map_err(|e| format!("GPU {gpu}: allocate the buffer: {e}"))?;
        let mut map = ctx
            .map(&alloc)
            .map_err(|e| format!("GPU {gpu}: map the buffer: {e}"))?;
        for (i, word) in map.as_mut_slice().chunks_exact_mut(4).enumerate() {
            word.copy_from_slice(&value(g, i).to_le_bytes());
        }
        let bound = mc.bind_mem(gpu, 0, &alloc, 0, shared.buffer);
        buffers.push((alloc, map));
        bound.map_err(|e| format!("GPU {gpu}: bind the buffer: {e}"))?;
    }
    Ok(buffers)
}

/// One all-reduce step of the elements `range` through `map`: the load-reduce over every
/// member, then the store of the sums to every member; the nanoseconds of each.
fn reduce_store(
    map: &mut McMapping,
    range: Range<usize>,
    bytes: &mut Vec<u8>,
) -> Result<(u64, u64), String> {
    let offset = range.start as u64 * 4;
    let t = Instant::now();
    let sums = map
        .load_reduce_u32(offset, range.len())
        .map_err(|e| format!("load-reduce: {e}"))?;
    let reduced = t.elapsed();
    bytes.clear();
    bytes.extend(sums.iter().flat_map(|v| v.to_le_bytes()));
    map.store(offset, bytes)
        .map_err(|e| format!("multicast store: {e}"))?;
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    Ok((nanos(reduced), nanos(t.elapsed() - reduced)))
}

/// GPU `g`: [`ROUNDS`] all-reduces of its slice (the first untimed). Then GPU 0 alone, while
/// the others wait, all-reduces every slice [`SOLO_ROUNDS`] more times: the cost of the software fan-out
/// on one quiet core.
fn gpu_app(g: usize, map: Option<McMapping>, shared: &Shared) {
    let elements = shared.buffer as usize / 4;
    let mine = slice(elements, shared.gpus, g);
    let mut map = map;
    let mut bytes = Vec::new();
    let mut step = |map: &mut Option<McMapping>, range: Range<usize>| {
        let m = map.as_mut()?;
        reduce_store(m, range, &mut bytes)
            .map_err(|e| {
                shared.fail(format!("GPU {g}: {e}"));
                *map = None;
            })
            .ok()
    };
    step(&mut map, mine.clone());
    shared.start.wait();
    let started = Instant::now();
    for _ in 1..ROUNDS {
        step(&mut map, mine.clone());
        // Each round a collective of its own, as NCCL's calls are: without it a GPU thread
        // would run its rounds back to back on its slice, still in the cache.
        shared.round.wait();
    }
    let ended = Instant::now();
    {
        let mut t = shared.timed.lock().unwrap_or_else(|e| e.into_inner());
        let (a, b) = t.get_or_insert((started, ended));
        *a = (*a).min(started);
        *b = (*b).max(ended);
    }
    shared.end.wait();
    if g == 0 {
        // Slice by slice, as the GPUs do it (a whole-buffer reduce would be less cache-kind);
        // twice, timing the second: the first faults in the pages of the other GPUs' slices.
        for timed in [false, true] {
            for k in 0..shared.gpus {
                let Some((r, s)) = step(&mut map, slice(elements, shared.gpus, k)) else {
                    continue;
                };
                if timed {
                    shared.solo_reduce_nanos.fetch_add(r, Ordering::Relaxed);
                    shared.solo_store_nanos.fetch_add(s, Ordering::Relaxed);
                }
            }
        }
    }
    shared.solo.wait();
}

/// GPU `g`'s buffer must hold the sums of every round in every element.
fn check(g: usize, map: &Mapping, shared: &Shared) {
    let mut wrong = 0u64;
    let mut first = None;
    for (i, word) in map.as_slice().chunks_exact(4).enumerate() {
        let got = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        let want = expected(shared.gpus, i, ROUNDS + SOLO_ROUNDS);
        if got != want {
            wrong += 1;
            first.get_or_insert((i, got, want));
        }
    }
    if let Some((i, got, want)) = first {
        shared.fail(format!(
            "GPU {g}: {wrong} elements wrong after the all-reduce, the first at {i}: {got} \
             instead of {want}"
        ));
        shared.mismatches.fetch_add(wrong, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_disjoint_cover_everything_and_differ_by_at_most_one() {
        for (elements, gpus) in [(524_288, 72), (10, 3), (7, 7), (1000, 36)] {
            let slices: Vec<_> = (0..gpus).map(|g| slice(elements, gpus, g)).collect();
            assert_eq!(slices[0].start, 0);
            assert_eq!(slices[gpus - 1].end, elements);
            for w in slices.windows(2) {
                assert_eq!(w[0].end, w[1].start, "{elements} over {gpus}");
            }
            let lens: Vec<usize> = slices.iter().map(|s| s.len()).collect();
            let (lo, hi) = (lens.iter().min(), lens.iter().max());
            assert!(hi.zip(lo).is_some_and(|(h, l)| h - l <= 1), "{lens:?}");
        }
    }

    #[test]
    fn expected_sums_match_summing_every_gpu_and_every_round() {
        for gpus in [2, 3, 8, 72] {
            for i in [0, 1, 17, 524_287] {
                let once = (0..gpus).fold(0u32, |a, g| a.wrapping_add(value(g, i)));
                assert_eq!(expected(gpus, i, 1), once, "{gpus} GPUs, element {i}");
                // Round 2 sums n buffers that each hold `once`.
                let twice = (0..gpus).fold(0u32, |a, _| a.wrapping_add(once));
                assert_eq!(expected(gpus, i, 2), twice, "{gpus} GPUs, element {i}");
            }
        }
    }

    #[test]
    fn values_tell_gpus_and_elements_apart() {
        assert_ne!(value(0, 1), value(1, 0));
        assert_ne!(value(2, 5), value(2, 6));
        // A member missing from the sum changes it.
        let all = expected(4, 9, 1);
        assert_ne!(all, expected(3, 9, 1));
    }

    #[test]
    fn figures_keep_four_significant_digits() {
        assert_eq!(significant(0.004_378_9), 0.004_379);
        assert_eq!(significant(12.894_4), 12.89);
        assert_eq!(significant(0.0), 0.0);
    }

    #[test]
    fn bus_bandwidth_is_nccls_all_reduce_factor() {
        assert!((bus_bandwidth(10.0, 2) - 10.0).abs() < 1e-9);
        assert!((bus_bandwidth(10.0, 72) - 10.0 * 142.0 / 72.0).abs() < 1e-9);
    }
}
