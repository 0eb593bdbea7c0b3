//! `openimex-lab`: the lab around the open IMEX service — a simulated NVLink domain on one
//! machine and the tools that exercise it.
//!
//! Its own subcommands: `demo`, `bench`, `local` (a simulated domain left running on this
//! machine for `ctl`), `fabric` (the simulated Fabric Manager and topologies), `gpu` (a node's
//! simulated GPU driver), `app` (application tools over the client library) and the hidden
//! `listen-probe`. It also carries every production command
//! (`daemon`, `ctl`, `init`, …; the `openimex` library), so a simulated domain starts from this
//! one binary; and it counts its heap allocations ([`heap`]), which its daemons report for the
//! bench. None of this is in the production `openimex` binary.

mod bench;
mod demo;
mod fabric;
mod heap;
mod local;

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use openimex::Passthrough;

/// Every process of the lab binary counts its allocations; its daemons report the count in
/// their metrics (`openimex_heap_allocations_total`), and the bench's `import_allocs` reads it.
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

/// The lab's clap-parsed subcommands, and the production ones beside them.
#[derive(Debug, Subcommand)]
enum Command {
    /// A simulated GB200 NVL72 (18 trays x 4 GPUs): every GPU imports every other GPU's memory.
    Demo(demo::DemoArgs),
    /// Measure, as ratios to a baseline taken in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// The NVLink fabric: topologies (presets and files), partitions, cliques.
    #[command(subcommand)]
    Fabric(fabric::FabricCommand),
    /// A simulated domain on this machine left running to try ctl on: `local up` starts it
    /// and prints the ctl commands, `local status`, `local down` stops it.
    #[command(subcommand)]
    Local(local::LocalCommand),
    /// (internal) Listen on IP:PORT and accept connections: the baseline process of `bench formation`.
    #[command(hide = true)]
    ListenProbe {
        /// Address to bind.
        addr: SocketAddr,
    },
    #[command(flatten)]
    Production(openimex::Command),
}

/// The daemon, counting this binary's allocations in its metrics.
const DAEMON: Passthrough = Passthrough {
    run: |args| openimex::daemon(args, Some(heap_allocations)),
    ..openimex::DAEMON
};

/// The verbatim subcommands: the production ones, the simulated driver and the application tool.
const PASSTHROUGH: &[Passthrough] = &[
    DAEMON,
    openimex::CTL,
    Passthrough {
        name: "gpu",
        program: "openimex-lab gpu",
        command: openimex_simgpu::cli::command,
        run: openimex_simgpu::cli::main,
    },
    Passthrough {
        name: "app",
        program: "openimex-lab app",
        command: openimex_client::cli::command,
        run: openimex_client::cli::main,
    },
];

fn heap_allocations() -> u64 {
    heap::allocations().unwrap_or(0)
}

fn main() -> ExitCode {
    openimex::entry::<Command>(
        "openimex-lab",
        "The openimex lab: a simulated NVLink domain, its demo and bench, and the production commands",
        PASSTHROUGH,
        run,
    )
}

fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Demo(a) => demo::run(&a)?,
        Command::Bench(b) => bench::bench(&b)?,
        Command::Fabric(f) => fabric::fabric(&f)?,
        Command::Local(l) => local::run(&l)?,
        Command::ListenProbe { addr } => listen_probe(addr)?,
        Command::Production(c) => return openimex::run(c),
    }
    Ok(ExitCode::SUCCESS)
}

/// Binds `addr`, says `ready`, accepts and drops connections until killed.
fn listen_probe(addr: SocketAddr) -> Result<()> {
    let listener =
        std::net::TcpListener::bind(addr).with_context(|| format!("cannot bind {addr}"))?;
    println!("ready");
    std::io::stdout().flush()?;
    for conn in listener.incoming() {
        drop(conn);
    }
    Ok(())
}
