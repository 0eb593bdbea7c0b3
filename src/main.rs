//! `openimex`: the open IMEX service in one binary.
//!
//! Subcommands: `daemon` (NVIDIA's `nvidia-imex`), `ctl` (`nvidia-imex-ctl`), `install-links`,
//! `demo`, `bench`, `channels`, `fabric`, `certs`, `init`, `driver-check`. Invoked through a link named `nvidia-imex` or
//! `nvidia-imex-ctl`, it behaves as that program, so systemd units, Slurm prologs, Kubernetes
//! probes and DCGM work unchanged.

mod daemon_cmd;
mod demo;
mod driver_check;
mod tools;

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Every process of the binary counts its allocations; the daemon reports the count in its
/// metrics (`openimex_heap_allocations_total`), and the bench's `import_allocs` reads it.
#[global_allocator]
static HEAP: openimex_imexd::heap::Counting = openimex_imexd::heap::Counting;

#[derive(Debug, Parser)]
#[command(
    name = "openimex",
    version,
    about = "Open IMEX service: share GPU memory across OS domains over NVLink"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create `nvidia-imex` and `nvidia-imex-ctl` links to this binary in DIR.
    InstallLinks {
        /// Directory for the links (e.g. /usr/local/bin).
        dir: std::path::PathBuf,
        /// Replace existing files of those names.
        #[arg(long)]
        force: bool,
    },
    /// A simulated GB200 NVL72 (18 trays x 4 GPUs): every GPU imports every other GPU's memory.
    Demo(demo::DemoArgs),
    /// Measure, as ratios to a baseline taken in the same run.
    #[command(subcommand)]
    Bench(tools::BenchCommand),
    /// Create IMEX channel files (channel devices), not world-writable by default.
    #[command(subcommand)]
    Channels(tools::ChannelsCommand),
    /// The NVLink fabric: topologies (presets and files), partitions, cliques.
    #[command(subcommand)]
    Fabric(tools::FabricCommand),
    /// Make a CA and per-node certificates for mutual TLS between daemons, and print the
    /// config.cfg lines that use them.
    Certs(tools::CertsArgs),
    /// Write a working, secure domain: per node a config.cfg (mutual TLS on, root-only command
    /// socket), the nodes file and its certificates, ready to copy to /etc/nvidia-imex.
    Init(tools::InitArgs),
    /// What the daemon would find on this host: driver version, /dev/nvidiactl, GPUs and their
    /// fabric probes, the IMEX capability and channels, whether a session could be opened.
    /// Exit status 0 only when a daemon could start.
    DriverCheck(driver_check::DriverCheckArgs),
    /// (internal) Listen on IP:PORT and accept connections: the baseline process of `bench formation`.
    #[command(hide = true)]
    ListenProbe {
        /// Address to bind.
        addr: std::net::SocketAddr,
    },
}

/// Subcommands that take their arguments verbatim, each with the program name its own parser
/// expects: NVIDIA's flags (-nogpu, -i IP PORT, --u=PATH) are not clap-shaped, and these
/// parsers print their own help. Invoked through a link named like the program, the binary
/// behaves as that program.
const PASSTHROUGH: &[Passthrough] = &[
    Passthrough {
        name: "daemon",
        program: "nvidia-imex",
        about: "Run the IMEX daemon (same flags as nvidia-imex: -c CONFIG, -p PORT, --nogpu)",
        run: daemon_cmd::main,
    },
    Passthrough {
        name: "ctl",
        program: "nvidia-imex-ctl",
        about: "Query the daemon (same flags as nvidia-imex-ctl: -q, -N, -j, -H, -c, -i, -u ...)",
        run: openimex_ctl::main,
    },
    Passthrough {
        name: "gpu",
        program: "openimex gpu",
        about: "Run a node's simulated GPU driver (--node-dir, --fabric-dir, --slot, --gpus, --hbm-mib, ...)",
        run: openimex_simgpu::cli::main,
    },
    Passthrough {
        name: "app",
        program: "openimex app",
        about: "Application tools over the client library: export, import, verify, stats",
        run: openimex_client::cli::main,
    },
];

/// A subcommand whose own parser takes its arguments.
struct Passthrough {
    /// `openimex NAME`.
    name: &'static str,
    /// The program name its parser expects (also a link name when it has no space).
    program: &'static str,
    /// One line for `openimex --help`.
    about: &'static str,
    /// Its entry point, given its program name and arguments.
    run: fn(Vec<OsString>) -> ExitCode,
}

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let argv0 = args
        .first()
        .map(|a| Path::new(a).file_name().unwrap_or_default().to_owned())
        .unwrap_or_default();
    if let Some(p) = PASSTHROUGH
        .iter()
        .find(|p| argv0 == p.program && !p.program.contains(' '))
    {
        return (p.run)(args);
    }
    let sub = args.get(1).and_then(|a| a.to_str()).unwrap_or_default();
    if let Some(p) = PASSTHROUGH.iter().find(|p| p.name == sub) {
        args.splice(0..2, [OsString::from(p.program)]);
        return (p.run)(args);
    }
    // The verbatim subcommands are listed in the help beside the clap-parsed ones.
    let command = PASSTHROUGH.iter().fold(Cli::command(), |c, p| {
        c.subcommand(clap::Command::new(p.name).about(p.about))
    });
    let cli = match Cli::from_arg_matches(&command.get_matches_from(args)) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::InstallLinks { dir, force } => tools::install_links(&dir, force),
        Command::Demo(a) => demo::run(&a),
        Command::Bench(b) => tools::bench(&b),
        Command::Channels(c) => tools::channels(&c),
        Command::Fabric(f) => tools::fabric(&f),
        Command::Certs(a) => tools::certs(&a),
        Command::Init(a) => tools::init(&a),
        Command::ListenProbe { addr } => tools::listen_probe(addr),
        Command::DriverCheck(a) => return driver_check::run(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            eprintln!("openimex: {}", error_text(&e));
            ExitCode::from(1)
        }
    }
}

/// The error and its causes on one line, skipping a cause whose text the message already holds
/// (several error types print their source themselves).
pub(crate) fn error_text(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
    }
    msg
}
