//! `openimex`: the open IMEX service in one binary.
//!
//! Subcommands: `daemon` (NVIDIA's `nvidia-imex`), `ctl` (`nvidia-imex-ctl`), `install-links`,
//! `demo`, `bench`. Invoked through a link named `nvidia-imex` or `nvidia-imex-ctl`, it behaves
//! as that program, so systemd units, Slurm prologs, Kubernetes probes and DCGM work unchanged.

mod daemon_cmd;
mod demo;
mod tools;

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Run the IMEX daemon (same flags as nvidia-imex: -c CONFIG, -p PORT, --nogpu).
    Daemon {
        /// Daemon arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Query the daemon (same flags as nvidia-imex-ctl: -q, -N, -j, -H, -c, -i, -u …).
    Ctl {
        /// ctl arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
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
    /// Run a node's simulated GPU driver (the "kernel module" of a simulated compute tray).
    Gpu {
        /// Driver arguments (--node-dir, --fabric-dir, --slot, --gpus, --hbm-mib, ...).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Application tools over the client library: export, import, verify, stats.
    App {
        /// App arguments (export | import | stats ...).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Measure, as ratios to a baseline taken in the same run.
    #[command(subcommand)]
    Bench(tools::BenchCommand),
    /// (internal) Listen on IP:PORT and accept connections: the baseline process of `bench formation`.
    #[command(hide = true)]
    ListenProbe {
        /// Address to bind.
        addr: std::net::SocketAddr,
    },
}

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let argv0 = args
        .first()
        .map(|a| Path::new(a).file_name().unwrap_or_default().to_owned())
        .unwrap_or_default();
    if argv0 == "nvidia-imex" {
        return daemon_cmd::main(args);
    }
    if argv0 == "nvidia-imex-ctl" {
        return openimex_ctl::main(args);
    }
    // `daemon` and `ctl` take their arguments verbatim: NVIDIA's flags (-nogpu, -i IP PORT,
    // --u=PATH) are not clap-shaped and their own parsers print their own help.
    match args.get(1).and_then(|a| a.to_str()) {
        Some("daemon") => {
            args.splice(0..2, [OsString::from("nvidia-imex")]);
            return daemon_cmd::main(args);
        }
        Some("ctl") => {
            args.splice(0..2, [OsString::from("nvidia-imex-ctl")]);
            return openimex_ctl::main(args);
        }
        Some("gpu") => {
            args.splice(0..2, [OsString::from("openimex gpu")]);
            return openimex_simgpu::cli::main(args);
        }
        Some("app") => {
            args.splice(0..2, [OsString::from("openimex app")]);
            return openimex_client::cli::main(args);
        }
        _ => {}
    }
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Command::Daemon { args } => {
            return daemon_cmd::main(
                [OsString::from("nvidia-imex")]
                    .into_iter()
                    .chain(args)
                    .collect(),
            );
        }
        Command::Ctl { args } => {
            return openimex_ctl::main(
                [OsString::from("nvidia-imex-ctl")]
                    .into_iter()
                    .chain(args)
                    .collect(),
            );
        }
        Command::InstallLinks { dir, force } => tools::install_links(&dir, force),
        Command::Demo(a) => demo::run(&a),
        Command::Gpu { args } => {
            return openimex_simgpu::cli::main(
                [OsString::from("openimex gpu")]
                    .into_iter()
                    .chain(args)
                    .collect(),
            );
        }
        Command::App { args } => {
            return openimex_client::cli::main(
                [OsString::from("openimex app")]
                    .into_iter()
                    .chain(args)
                    .collect(),
            );
        }
        Command::Bench(b) => tools::bench(&b),
        Command::ListenProbe { addr } => tools::listen_probe(addr),
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
