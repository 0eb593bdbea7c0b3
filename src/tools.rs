//! The binary's own tools: `install-links`, `demo`, `bench`, and the hidden `listen-probe`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Subcommand;

/// `openimex bench …`.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Time from starting N daemons to domain UP, against N bare processes opening their ports.
    Formation {
        /// Nodes in the domain.
        #[arg(long, default_value_t = 18)]
        nodes: usize,
        /// Rounds; medians are reported.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// All-to-all export/import (the demo's workload): import latency against a raw unary gRPC
    /// round trip, and fabric copy bandwidth against local memcpy, each baseline measured in
    /// the same run.
    Imports {
        /// Nodes in the domain.
        #[arg(long, default_value_t = 18)]
        nodes: usize,
        /// GPUs per node.
        #[arg(long, default_value_t = 4)]
        gpus_per_node: u32,
        /// Rounds; medians are reported.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
}

/// Creates `nvidia-imex` and `nvidia-imex-ctl` symlinks to this binary in `dir`, which must
/// exist.
pub(crate) fn install_links(dir: &Path, force: bool) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    let exe = exe.canonicalize().unwrap_or(exe);
    // Never create the directory: a typo (`/usr/lcoal/bin`) would leave links nobody finds on
    // PATH, and the command would still say it worked.
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => bail!(
            "cannot install links into {}: it is not a directory; pass a directory on PATH, \
             e.g. /usr/local/bin",
            dir.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "cannot install links into {}: the directory does not exist; check the path, or \
             create it first (mkdir -p {}) if it is meant to be new",
            dir.display(),
            dir.display()
        ),
        Err(e) => bail!(
            "cannot install links into {}: {e}; pass a directory this user can write, e.g. \
             /usr/local/bin as root",
            dir.display()
        ),
    }
    for name in ["nvidia-imex", "nvidia-imex-ctl"] {
        let link = dir.join(name);
        if let Ok(meta) = std::fs::symlink_metadata(&link) {
            if !meta.file_type().is_symlink() && !force {
                bail!(
                    "{} exists and is not a link (NVIDIA's binary?); pass --force to replace it",
                    link.display()
                );
            }
            std::fs::remove_file(&link)
                .with_context(|| format!("cannot replace {}", link.display()))?;
        }
        std::os::unix::fs::symlink(&exe, &link).with_context(|| {
            format!("cannot create link {} -> {}", link.display(), exe.display())
        })?;
        println!("{} -> {}", link.display(), exe.display());
    }
    Ok(())
}

fn this_binary() -> Result<std::path::PathBuf> {
    std::env::current_exe().context("cannot find this binary's path")
}

/// Runs a benchmark and prints figures with their same-run baseline.
pub(crate) fn bench(cmd: &BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Formation { nodes, rounds } => {
            let binary = this_binary()?;
            let r = openimex_harness::bench::formation(&binary, *nodes, *rounds)
                .context("formation benchmark failed")?;
            println!(
                "formation, {} nodes, {} rounds (medians):",
                r.nodes, r.rounds
            );
            println!(
                "  openimex daemons, spawn -> domain UP : {:>8.1} ms",
                ms(r.daemon_up)
            );
            println!(
                "  bare processes, spawn -> ports open  : {:>8.1} ms",
                ms(r.bare_listen)
            );
            println!(
                "  ratio (daemons / bare processes)     : {:>8.2}",
                r.ratio()
            );
            let samples = |v: &[Duration]| {
                v.iter()
                    .map(|d| format!("{:.1}", ms(*d)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            println!("  samples daemons ms: [{}]", samples(&r.daemon_samples));
            println!("  samples bare ms   : [{}]", samples(&r.baseline_samples));
            Ok(())
        }
        BenchCommand::Imports {
            nodes,
            gpus_per_node,
            rounds,
        } => bench_imports(*nodes, *gpus_per_node, *rounds),
    }
}

/// Runs `openimex demo --json` `rounds` times and reports medians as ratios to the baselines
/// each run measured itself.
fn bench_imports(nodes: usize, gpus_per_node: u32, rounds: usize) -> Result<()> {
    let binary = this_binary()?;
    let mut runs = Vec::new();
    for round in 0..rounds.max(1) {
        let out = std::process::Command::new(&binary)
            .args([
                "demo",
                "--json",
                "--nodes",
                &nodes.to_string(),
                "--gpus-per-node",
                &gpus_per_node.to_string(),
            ])
            .stderr(std::process::Stdio::inherit())
            .output()
            .context("cannot run the demo")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("round {round}: the demo failed: {text}");
        }
        let v: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or(""))
            .with_context(|| format!("round {round}: the demo printed no JSON summary: {text}"))?;
        runs.push(v);
    }
    let median = |key: &str| {
        let mut v: Vec<f64> = runs.iter().filter_map(|r| r[key].as_f64()).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let (p50, p99, rtt) = (
        median("import_p50_us"),
        median("import_p99_us"),
        median("grpc_rtt_p50_us"),
    );
    let (copy, memcpy) = (median("copy_gbps"), median("local_memcpy_gbps"));
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    println!(
        "imports, {nodes} nodes x {gpus_per_node} GPUs, {} rounds (medians):",
        runs.len()
    );
    println!(
        "  imports per run                         : {:>10.0}",
        median("imports")
    );
    println!(
        "  imports/s (all GPUs importing at once)  : {:>10.0}",
        median("imports_per_s")
    );
    println!("  import p50 / p99                        : {p50:>10.0} / {p99:.0} us");
    println!("  baseline: raw unary gRPC round trip p50 : {rtt:>10.0} us");
    println!(
        "  ratio import p50 / gRPC round trip      : {:>10.1}",
        ratio(p50, rtt)
    );
    println!("  fabric copy                             : {copy:>10.2} GB/s");
    println!("  baseline: local memcpy                  : {memcpy:>10.2} GB/s");
    println!(
        "  ratio fabric copy / memcpy              : {:>10.2}",
        ratio(copy, memcpy)
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Binds `addr`, says `ready`, accepts and drops connections until killed.
pub(crate) fn listen_probe(addr: SocketAddr) -> Result<()> {
    let listener =
        std::net::TcpListener::bind(addr).with_context(|| format!("cannot bind {addr}"))?;
    println!("ready");
    std::io::stdout().flush()?;
    for conn in listener.incoming() {
        drop(conn);
    }
    Ok(())
}
