//! `openimex-lab gpu`: run one node's simulated GPU driver in the foreground.
//!
//! Prints `ready <socket path>` on stdout once it listens; logs go to stderr. SIGTERM, SIGINT
//! or SIGQUIT stops it (exit 0, socket file removed); the HBM files stay, since the fabric
//! directory is shared by every node. Every other signal whose default action would end it
//! without removing its socket (SIGHUP, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO,
//! SIGPWR, SIGSTKFLT, SIGXCPU, SIGXFSZ, the real-time signals) is ignored with a log line, at
//! most one per signal every 10 s: like the kernel module it stands for, the driver outlives
//! terminals and daemons. The synchronous fault signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
//! SIGTRAP, SIGSYS, SIGABRT) keep their default action: a handler would re-run the faulting
//! instruction, and a core dump is the useful outcome.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use nix::libc;

use openimex_simproto::handle::decode_hex_array;
use openimex_simproto::proto::{DEFAULT_IMEX_CHANNEL_COUNT, MAX_IMEX_CHANNEL_COUNT};

use crate::fm_link::FmLink;
use crate::rm::ProbeStart;
use crate::server::{DEFAULT_DRIVER_VERSION, DriverConfig, Server, default_cluster_uuid};

/// Command-line arguments of `openimex-lab gpu`.
#[derive(Debug, Parser)]
#[command(
    name = "openimex-lab gpu",
    bin_name = "openimex-lab gpu",
    about = "Run one node's simulated GPU driver (NVLink fabric as files in a shared directory)"
)]
struct Args {
    /// The node's directory (dev/nvidiactl and dev/nvidia-caps-imex-channels/ go here); created if missing.
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
    /// The GPUs' fabric probe at start: `complete` (with --cluster-uuid and --clique-id, as if
    /// a Fabric Manager answered at once), `pending` (IN_PROGRESS until a CompleteFabricProbe
    /// control from root answers it) or `not-started`. Fabric memory cannot be allocated on a
    /// GPU before its probe completes.
    #[arg(long, value_name = "STATE", value_enum, default_value_t = ProbeArg::Complete)]
    probe: ProbeArg,
    /// Take the GPUs' probe answers from the domain's Fabric Manager (`openimex-lab fabric serve`
    /// on the same --fabric-dir): probes start IN_PROGRESS and the driver attaches as tray
    /// --slot, retrying until the FM listens.
    #[arg(long, conflicts_with_all = ["cluster_uuid", "clique_id", "probe"])]
    fabric_manager: bool,
    /// Channel files channel0..channel{N-1} to create (mode 0600, this user's) if missing; a
    /// channel file others may read or write is warned about at start.
    #[arg(long, value_name = "N", default_value_t = 1)]
    channels: u32,
    /// The kernel module's NVreg_ImexChannelCount: channel numbers below N are IMEX channels;
    /// 0 disables them (every subscription fails with NV_ERR_NOT_SUPPORTED).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_IMEX_CHANNEL_COUNT,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_IMEX_CHANNEL_COUNT)))]
    imex_channel_count: u32,
    /// The NVIDIA driver release the simulated driver is: the version NV_ESC_CHECK_VERSION_STR
    /// and /proc/driver/nvidia/version report, and whose RM struct layouts it serves. A
    /// release the RM ABI tables do not cover is refused.
    #[arg(long, value_name = "VERSION", default_value = DEFAULT_DRIVER_VERSION)]
    driver_version: String,
    /// Append one line per RM escape served to FILE
    /// (`<escape> <class or control> params=<size> status=<NV_STATUS>`).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// `--probe`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ProbeArg {
    Complete,
    Pending,
    NotStarted,
}

impl From<ProbeArg> for ProbeStart {
    fn from(a: ProbeArg) -> Self {
        match a {
            ProbeArg::Complete => ProbeStart::Complete,
            ProbeArg::Pending => ProbeStart::Pending,
            ProbeArg::NotStarted => ProbeStart::NotStarted,
        }
    }
}

fn parse_uuid(s: &str) -> Result<[u8; 16], String> {
    let digits: String = s.chars().filter(|c| *c != '-').collect();
    decode_hex_array(&digits).map_err(|e| {
        format!("`{s}` is not 32 hex digits (e.g. 0123456789abcdef0123456789abcdef): {e}")
    })
}

/// The command line `openimex-lab gpu` parses, named `program` (for `help gpu` and the man
/// page: one definition).
pub fn command(program: &str) -> clap::Command {
    <Args as clap::CommandFactory>::command().bin_name(program)
}

/// Entry point of `openimex-lab gpu`; `args[0]` is the program name.
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

    // Block the stop and ignored signals before any thread starts, so that every thread
    // inherits the mask and only the wait below sees them.
    let signals = match Signals::block() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("openimex-lab gpu: error: {e}");
            return ExitCode::FAILURE;
        }
    };

    let Some(hbm_bytes) = args.hbm_mib.checked_mul(1 << 20) else {
        eprintln!(
            "openimex-lab gpu: error: --hbm-mib {} is too large",
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
        probe: if args.fabric_manager {
            ProbeStart::Pending
        } else {
            args.probe.into()
        },
        channels: args.channels,
        imex_channel_count: args.imex_channel_count,
        driver_version: args.driver_version,
        trace: args.trace,
    };
    let server = match Server::bind(&config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("openimex-lab gpu: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sock = server.socket_path().to_path_buf();
    let handle = match server.spawn() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("openimex-lab gpu: error: cannot start the server thread: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        slot = config.slot,
        gpus = config.gpus,
        hbm_mib = hbm_bytes >> 20,
        imex_channel_count = config.imex_channel_count,
        driver_version = %config.driver_version,
        probe = ?config.probe,
        socket = %sock.display(),
        "simulated GPU driver listening"
    );
    let link = if args.fabric_manager {
        match FmLink::spawn(
            handle.rm_access(),
            &config.fabric_dir,
            config.slot,
            config.gpus,
        ) {
            Ok(l) => {
                let sender = l.sender();
                handle.set_fm_outbox(Box::new(move |msg| {
                    if let Err(e) = sender.send(&msg) {
                        tracing::warn!("cannot send to the Fabric Manager: {e}");
                    }
                }));
                Some(l)
            }
            Err(e) => {
                eprintln!("openimex-lab gpu: error: cannot start the Fabric Manager link: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "ready {}", sock.display())
        .and_then(|()| out.flush())
        .is_err()
    {
        // Nobody reads our stdout any more; keep serving, the socket is what matters.
        tracing::warn!("could not write the ready line to stdout");
    }
    drop(out);

    signals.wait_for_stop();
    if let Some(l) = link {
        l.stop();
    }
    handle.stop();
    ExitCode::SUCCESS
}

/// Signals that stop the driver cleanly.
const STOP: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGQUIT];

/// At most one log line per ignored signal this often.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Signals whose default action would end the driver without removing its socket, and that it
/// ignores (see the module documentation).
fn ignored() -> Vec<libc::c_int> {
    let mut v = vec![
        libc::SIGHUP,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGIO,
        libc::SIGPWR,
        libc::SIGSTKFLT,
        libc::SIGXCPU,
        libc::SIGXFSZ,
    ];
    v.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
    v
}

/// `SIGUSR2`, `SIGRTMIN+3`, `SIGRTMAX` (the daemon's names).
fn signal_name(sig: libc::c_int) -> String {
    let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    match sig {
        s if s == min => "SIGRTMIN".to_owned(),
        s if s == max => "SIGRTMAX".to_owned(),
        s if (min..max).contains(&s) => format!("SIGRTMIN+{}", s - min),
        s => nix::sys::signal::Signal::try_from(s)
            .map(|n| n.as_str().to_owned())
            .unwrap_or_else(|_| format!("signal {s}")),
    }
}

/// The stop and ignored signals, blocked in every thread.
struct Signals {
    set: libc::sigset_t,
}

impl Signals {
    /// Blocks [`STOP`] and [`ignored`] in the calling thread; call before any thread starts.
    fn block() -> Result<Self, String> {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set behind the pointer, which is valid for writes.
        let mut set = unsafe {
            libc::sigemptyset(set.as_mut_ptr());
            set.assume_init()
        };
        for sig in STOP.into_iter().chain(ignored()) {
            // SAFETY: `set` is an initialised sigset_t; sigaddset checks the number and sets a bit.
            if unsafe { libc::sigaddset(&mut set, sig) } != 0 {
                return Err(format!(
                    "cannot add {} to a signal set: {}",
                    signal_name(sig),
                    std::io::Error::last_os_error()
                ));
            }
        }
        // SAFETY: both pointers are valid (the old mask is not asked for); this changes only
        // the calling thread's mask.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(format!(
                "cannot block SIGTERM/SIGINT/SIGQUIT and the ignored signals: {}",
                std::io::Error::from_raw_os_error(rc)
            ));
        }
        Ok(Self { set })
    }

    /// Waits for a stop signal, logging the ignored ones (rate-limited) meanwhile.
    fn wait_for_stop(&self) {
        let mut logged: HashMap<libc::c_int, (Instant, u64)> = HashMap::new();
        loop {
            // SAFETY: `self.set` is initialised; a null siginfo pointer is allowed.
            let sig = unsafe { libc::sigwaitinfo(&self.set, std::ptr::null_mut()) };
            if sig < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!("sigwaitinfo failed: {e}; stopping");
                return;
            }
            if STOP.contains(&sig) {
                tracing::info!("{} received, stopping", signal_name(sig));
                return;
            }
            let now = Instant::now();
            match logged.get_mut(&sig) {
                Some((at, unlogged)) if now.saturating_duration_since(*at) < LOG_EVERY => {
                    *unlogged += 1;
                }
                entry => {
                    let more = match entry {
                        Some((_, n)) if *n > 0 => format!(" ({n} more since the last line)"),
                        _ => String::new(),
                    };
                    tracing::warn!(
                        "{} received{more}: ignored (the simulated GPU driver stops on SIGTERM, \
                         SIGINT or SIGQUIT only)",
                        signal_name(sig)
                    );
                    logged.insert(sig, (now, 0));
                }
            }
        }
    }
}
