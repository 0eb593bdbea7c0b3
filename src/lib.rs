//! The production commands of `openimex` as a library: the daemon (`daemon`, NVIDIA's
//! `nvidia-imex`), the control CLI (`ctl`, `nvidia-imex-ctl`), `init`, `certs`, `channels`,
//! `driver-check` and `install-links`, and the entry point that dispatches them ([`cli`]).
//!
//! The `openimex` binary (`src/main.rs`) is this and nothing more: it links no simulated
//! driver, Fabric Manager, cluster harness, chaos or bench code, and `.ci/run` checks its
//! dependency tree. The lab binary (`openimex-lab`, `crates/lab`) carries these same commands
//! beside the simulated GPU driver and Fabric Manager, the application tool, the demo and the
//! bench, so one `cargo run` starts a whole simulated domain.

pub mod cli;
mod daemon_cmd;
mod driver_check;
mod tools;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

pub use cli::{Passthrough, UsageError, entry, error_text};
pub use driver_check::DriverCheckArgs;
pub use tools::{CertsArgs, ChannelsCommand, InitArgs};
/// `init`'s files as a library call, with extra keys per node (`openimex-lab local up`).
pub use tools::{InitNode, InitPlan, init_domain, is_one_host};

/// `openimex`'s one-line description.
pub const ABOUT: &str = "Open IMEX service: share GPU memory across OS domains over NVLink";

/// The clap-parsed production subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Create `nvidia-imex` and `nvidia-imex-ctl` links to this binary in DIR.
    InstallLinks {
        /// Directory for the links (e.g. /usr/local/bin).
        dir: PathBuf,
        /// Replace existing files of those names.
        #[arg(long)]
        force: bool,
    },
    /// Create IMEX channel files (channel devices), not world-writable by default.
    #[command(subcommand)]
    Channels(ChannelsCommand),
    /// Make a CA and per-node certificates for mutual TLS between daemons, and print the
    /// config.cfg lines that use them.
    Certs(CertsArgs),
    /// Write a working, secure domain: per node a config.cfg (mutual TLS on, root-only command
    /// socket), the nodes file and its certificates, ready to copy to /etc/nvidia-imex.
    Init(InitArgs),
    /// What the daemon would find on this host: driver version, /dev/nvidiactl, GPUs and their
    /// fabric probes, the IMEX capability and channels, whether a session could be opened.
    /// Exit status 0 only when a daemon could start.
    DriverCheck(DriverCheckArgs),
}

/// Runs a production subcommand.
pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::InstallLinks { dir, force } => tools::install_links(&dir, force)?,
        Command::Channels(c) => tools::channels(&c)?,
        Command::Certs(a) => tools::certs(&a)?,
        Command::Init(a) => tools::init(&a)?,
        Command::DriverCheck(a) => return Ok(driver_check::run(&a)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The daemon, as `openimex daemon` or `nvidia-imex`.
pub const DAEMON: Passthrough = Passthrough {
    name: "daemon",
    program: "nvidia-imex",
    command: daemon_cmd::command,
    run: |args| daemon(args, None),
};

/// The control CLI, as `openimex ctl` or `nvidia-imex-ctl`.
pub const CTL: Passthrough = Passthrough {
    name: "ctl",
    program: openimex_ctl::NVIDIA_PROGRAM,
    command: openimex_ctl::command,
    run: openimex_ctl::main,
};

/// The production binary's verbatim subcommands.
pub const PASSTHROUGH: &[Passthrough] = &[DAEMON, CTL];

/// Runs the daemon's command line (`args[0]` is its program name). `heap_allocations`, when
/// the binary counts its allocations, is reported in the daemon's metrics.
pub fn daemon(args: Vec<OsString>, heap_allocations: Option<fn() -> u64>) -> ExitCode {
    daemon_cmd::main(args, heap_allocations)
}
