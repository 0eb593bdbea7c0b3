//! `openimex-lab demo --chaos`: the all-to-all workload as application processes (every GPU
//! exports generation after generation and imports every other node's GPUs), with seeded
//! random faults (kill -9 of apps, daemons and GPU drivers, hung and flapping daemons) for
//! `--seconds`, then the invariants: no stale read, no data error, no leaked reference, the
//! domain recovered. A progress line per second goes to stderr; the summary (or one JSON
//! object with `--json`) to stdout. The engine is the harness's [`openimex_harness::chaos`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail};
use openimex_harness::chaos::{self, ChaosSpec, FaultKind};

use super::args::DemoArgs;

/// Runs the chaos demo; an `Err` when an invariant failed (after the summary is printed).
pub(super) fn run(args: &DemoArgs) -> Result<()> {
    let nodes = args.nodes.unwrap_or(4);
    let gpus = args.gpus_per_node.unwrap_or(2);
    if nodes < 2 || gpus == 0 {
        bail!("--chaos needs at least 2 nodes and 1 GPU per node");
    }
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 % 1_000_000)
    });
    let binary = std::env::current_exe().context("cannot find this binary's path")?;
    let mut spec = ChaosSpec::all_to_all(binary, nodes, gpus);
    spec.seed = seed;
    spec.duration = Duration::from_secs(args.seconds);
    spec.keep_dir = args.keep;
    spec.kinds = if args.faults.is_empty() {
        FaultKind::KILLS.to_vec()
    } else {
        args.faults.clone()
    };
    // Partitions need a proxy on every link (names mode: root only).
    spec.partitions = spec.kinds.iter().any(|k| k.needs_proxies());
    eprintln!(
        "chaos: {nodes} nodes x {gpus} GPUs, faults for {} s, seed {seed} (replay with --seed {seed})",
        args.seconds
    );
    let report = chaos::run(&spec, |p| eprintln!("{}", p.line()))
        .context("cannot run the chaos workload")?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.text());
    }
    if !report.passed() {
        bail!(
            "chaos run failed (seed {seed}): {}",
            report.failures().join(", ")
        );
    }
    Ok(())
}
