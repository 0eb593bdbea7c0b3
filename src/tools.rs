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
}

/// Creates `nvidia-imex` and `nvidia-imex-ctl` symlinks to this binary in `dir`.
pub(crate) fn install_links(dir: &Path, force: bool) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    let exe = exe.canonicalize().unwrap_or(exe);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
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
    }
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
