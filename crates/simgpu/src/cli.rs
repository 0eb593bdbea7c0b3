//! `openimex gpu`: run one node's simulated GPU driver in the foreground.
//!
//! Prints `ready <socket path>` on stdout once it listens; logs go to stderr. SIGTERM or SIGINT
//! stops it (exit 0, socket file removed); the HBM files stay, since the fabric directory is
//! shared by every node.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use nix::sys::signal::{SigSet, Signal};

use openimex_simproto::handle::decode_hex_array;

use crate::server::{DriverConfig, Server, default_cluster_uuid};

/// Command-line arguments of `openimex gpu`.
#[derive(Debug, Parser)]
#[command(
    name = "openimex gpu",
    bin_name = "openimex gpu",
    about = "Run one node's simulated GPU driver (NVLink fabric as files in a shared directory)"
)]
struct Args {
    /// The node's directory (dev/nvidiactl.sock and dev/nvidia-caps-imex-channels/ go here); created if missing.
    #[arg(long, value_name = "DIR")]
    node_dir: PathBuf,
    /// The fabric directory shared by every node of the NVLink domain (HBM files); created if missing.
    #[arg(long, value_name = "DIR")]
    fabric_dir: PathBuf,
    /// This node's physical position in the NVLink domain (names its fabric addresses and HBM files).
    #[arg(long, value_name = "N", default_value_t = 0)]
    slot: u16,
    /// GPUs on this node.
    #[arg(long, value_name = "N", default_value_t = 4)]
    gpus: u32,
    /// HBM per GPU, MiB (whole 2 MiB pages).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    hbm_mib: u64,
    /// NVLink domain clusterUuid, 32 hex digits (dashes allowed) [default: derived from the fabric dir path].
    #[arg(long, value_name = "HEX32", value_parser = parse_uuid)]
    cluster_uuid: Option<[u8; 16]>,
    /// The GPUs' clique ID.
    #[arg(long, value_name = "N", default_value_t = 1)]
    clique_id: u32,
    /// Channel files channel0..channel{N-1} to create (mode 0666) if missing.
    #[arg(long, value_name = "N", default_value_t = 1)]
    channels: u32,
}

fn parse_uuid(s: &str) -> Result<[u8; 16], String> {
    let digits: String = s.chars().filter(|c| *c != '-').collect();
    decode_hex_array(&digits).map_err(|e| {
        format!("`{s}` is not 32 hex digits (e.g. 0123456789abcdef0123456789abcdef): {e}")
    })
}

/// Entry point of `openimex gpu`; `args[0]` is the program name.
pub fn main(args: Vec<OsString>) -> ExitCode {
    let args = match Args::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .try_init();

    // Block the stop signals before any thread starts, so that every thread inherits the mask
    // and only the sigwait below sees them.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    if let Err(e) = signals.thread_block() {
        eprintln!("openimex gpu: error: cannot block SIGTERM/SIGINT: {e}");
        return ExitCode::FAILURE;
    }

    let Some(hbm_bytes) = args.hbm_mib.checked_mul(1 << 20) else {
        eprintln!(
            "openimex gpu: error: --hbm-mib {} is too large",
            args.hbm_mib
        );
        return ExitCode::FAILURE;
    };
    let cluster_uuid = args.cluster_uuid.unwrap_or_else(|| {
        let _ = std::fs::create_dir_all(&args.fabric_dir);
        default_cluster_uuid(&args.fabric_dir)
    });
    let config = DriverConfig {
        node_dir: args.node_dir,
        fabric_dir: args.fabric_dir,
        slot: args.slot,
        gpus: args.gpus,
        hbm_bytes,
        cluster_uuid,
        clique_id: args.clique_id,
        channels: args.channels,
    };
    let server = match Server::bind(&config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("openimex gpu: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sock = server.socket_path().to_path_buf();
    let handle = match server.spawn() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("openimex gpu: error: cannot start the server thread: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        slot = config.slot,
        gpus = config.gpus,
        hbm_mib = hbm_bytes >> 20,
        socket = %sock.display(),
        "simulated GPU driver listening"
    );
    let mut out = std::io::stdout().lock();
    if writeln!(out, "ready {}", sock.display())
        .and_then(|()| out.flush())
        .is_err()
    {
        // Nobody reads our stdout any more; keep serving, the socket is what matters.
        tracing::warn!("could not write the ready line to stdout");
    }
    drop(out);

    match signals.wait() {
        Ok(sig) => tracing::info!("{sig} received, stopping"),
        Err(e) => tracing::error!("sigwait failed: {e}; stopping"),
    }
    handle.stop();
    ExitCode::SUCCESS
}
