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
        print!("{}", explained(&report.text()));
    }
    if !report.passed() {
        bail!(
            "chaos run failed (seed {seed}): {}",
            report.failures().join(", ")
        );
    }
    Ok(())
}

/// What the summary's `freed reads` count is, said right under its line.
const FREED_READS: &str = "(freed reads: zeros read through a mapping whose exporter had \
                           already freed the memory, before the revocation reached the \
                           importer; expected under faults, not an error)";

/// The chaos summary `text` with [`FREED_READS`] under the line that counts them.
fn explained(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + FREED_READS.len() + 8);
    for line in text.lines() {
        out.push_str(line);
        out.push('\n');
        if line.trim_start().starts_with("freed reads ") {
            out.push_str("    ");
            out.push_str(FREED_READS);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_says_what_freed_reads_are() {
        let report = chaos::ChaosReport {
            seed: 1,
            nodes: 4,
            gpus_per_node: 2,
            elapsed: Duration::from_secs(60),
            faults: Vec::new(),
            imports: 100,
            import_failures: 4,
            import_p50_us: 900,
            reads: 1000,
            stale_reads: 0,
            freed_reads: 3,
            data_errors: 0,
            revoked_apps: 2,
            app_restarts: 5,
            app_crashes: 0,
            daemon_crashes: 0,
            leaked_refs: 0,
            recovered: true,
            final_recover: Some(Duration::from_millis(800)),
            notes: Vec::new(),
        };
        let text = report.text();
        let out = explained(&text);
        let lines: Vec<&str> = out.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.contains("freed reads 3"))
            .expect("the count stays");
        assert!(
            lines[at + 1].contains("freed reads: zeros read")
                && lines[at + 1].contains("not an error"),
            "{out}"
        );
        assert_eq!(lines.len(), text.lines().count() + 1, "{out}");
    }
}
