//! `openimex daemon` (and `nvidia-imex`): NVIDIA's daemon command line, config resolution, and
//! the process set-up around [`openimex_imexd::run`]: everything is validated and every
//! listener bound before the daemon forks or serves, so a bad config exits non-zero at once.

mod env_keys;
mod reexec;
mod signals;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser};
use openimex_config::{
    Config, ConfigError, DEFAULT_CONFIG_PATH, DriverKind, NodeConfig, Quorum, iface,
};
use openimex_core::{Backoff, NodeId, QuorumPolicy};
use openimex_driver::Backend;
use openimex_imexd::unconfigured::{self, CmdListeners, Outcome};
use openimex_imexd::{Settings, World, daemonize, logging};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

/// The name the daemon goes by in its usage and messages: the file name it was run under
/// (`nvidia-imex` through a link), or `openimex daemon` as a subcommand. Set once by [`main`].
static PROGRAM: OnceLock<String> = OnceLock::new();

/// The daemon's command line as clap describes it, named `program`: the one definition behind
/// its parser, its `--help`, `openimex help daemon` and its man page.
pub(crate) fn command(program: &str) -> clap::Command {
    Args::command().bin_name(program)
}

/// The daemon's command line, as NVIDIA's `nvidia-imex`.
#[derive(Debug, Parser)]
#[command(
    name = "nvidia-imex",
    about = "Run the IMEX daemon (same flags as nvidia-imex: -c CONFIG, -p PORT, --nogpu)",
    disable_version_flag = true
)]
struct Args {
    /// Config file.
    #[arg(short = 'c', value_name = "CONFIG", default_value = DEFAULT_CONFIG_PATH)]
    config: PathBuf,
    /// Peer port (1-65535, the same on every node); overrides SERVER_PORT.
    #[arg(short = 'p', long = "port", value_name = "PORT", value_parser = peer_port)]
    port: Option<u16>,
    /// Control plane only, no GPU (same as OPENIMEX_DRIVER=nogpu; also -nogpu).
    #[arg(long = "nogpu")]
    nogpu: bool,
    /// Print the version.
    #[arg(long)]
    version: bool,
}

/// `-p PORT`: 1-65535. Port 0 would let the OS pick a port that no peer can know.
fn peer_port(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!(
            "`{s}` is not a peer port: give an integer 1-65535 (every daemon dials its peers on \
             this port, so it must be a fixed port, the same on every node; NVIDIA's default is \
             50000)"
        )),
        Ok(port) => Ok(port),
    }
}

/// The name this daemon runs under (`openimex daemon`, `nvidia-imex` through a link), for
/// messages on the terminal.
fn program() -> &'static str {
    PROGRAM.get().map_or("nvidia-imex", String::as_str)
}

/// Runs the daemon command line; `heap_allocations` as [`crate::daemon`] says.
pub(crate) fn main(args: Vec<OsString>, heap_allocations: Option<fn() -> u64>) -> ExitCode {
    let name = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "nvidia-imex".to_string());
    let program = PROGRAM.get_or_init(|| name).as_str();
    // NVIDIA's spelling `-nogpu` is a single-dash long flag.
    let args = args.into_iter().map(|a| {
        if a == "-nogpu" {
            OsString::from("--nogpu")
        } else {
            a
        }
    });
    let parsed = command(program)
        .try_get_matches_from(args)
        .and_then(|m| Args::from_arg_matches(&m));
    let args = match parsed {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if args.version {
        println!(
            "openimex daemon {} (nvidia-imex compatible)",
            env!("CARGO_PKG_VERSION")
        );
        return ExitCode::SUCCESS;
    }
    match start(args, heap_allocations) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = crate::cli::error_text(&e);
            eprintln!("{program}: {msg}");
            tracing::error!("{msg}");
            ExitCode::from(1)
        }
    }
}

struct Prepared {
    cfg: Config,
    mode: Mode,
}

/// What the daemon runs as.
enum Mode {
    /// This host is an entry of the nodes file.
    Configured {
        settings: Box<Settings>,
        world: World,
        driver: Box<dyn openimex_driver::Driver>,
    },
    /// The nodes file holds placeholders but no entry for this host (see
    /// `openimex_imexd::unconfigured`): `why` says what was tried.
    Unconfigured {
        listeners: CmdListeners,
        why: String,
    },
}

/// Everything that can fail because of the config happens here, before anything is bound.
fn prepare(args: &Args, heap_allocations: Option<fn() -> u64>) -> Result<Prepared> {
    let mut cfg = Config::load(&args.config)?;
    // Fail closed: a daemon asked for peer authentication must not come up in plaintext.
    cfg.refuse_unbuilt_features()?;
    let tls = tls_from(&cfg)?;
    if let Some(port) = args.port {
        cfg.server_port = port;
    }
    let nodes = cfg.load_nodes()?;
    let (local, placement) = match iface::locate(&cfg, &nodes, &iface::system_interfaces()) {
        Ok(found) => found,
        Err(e @ (ConfigError::NoLocalNode { .. } | ConfigError::BindNotInNodes { .. }))
            if nodes.has_placeholder() =>
        {
            return prepare_unconfigured(cfg, e.to_string());
        }
        Err(e) => return Err(e.into()),
    };
    let backend = if args.nogpu {
        Backend::NoGpu
    } else {
        match cfg.driver {
            DriverKind::NoGpu => Backend::NoGpu,
            // `sim` is the `nvidia` backend on the simulated tray's node directory.
            DriverKind::Sim => Backend::Nvidia(cfg.sim_node_dir.clone().unwrap_or_default()),
            DriverKind::Auto | DriverKind::Nvidia => Backend::Nvidia(
                openimex_driver::nvidia::files::driver_root(cfg.driver_root.as_deref()),
            ),
        }
    };
    // Fail on an unusable driver before binding anything.
    let driver = openimex_driver::open(&backend)?;
    let host_name = cfg.host_name.clone().unwrap_or_else(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default()
    });
    let cmd_unix = cmd_unix_path(&cfg);
    let settings = Settings {
        local: NodeId(local.node_id),
        hosts: nodes.hosts(),
        server_port: cfg.server_port,
        domain_id: cfg.domain_id.clone(),
        quorum: match cfg.imex_wait_for_quorum {
            Quorum::None => QuorumPolicy::None,
            Quorum::Recovery => QuorumPolicy::Recovery,
            Quorum::Full => QuorumPolicy::Full,
        },
        heartbeat_interval: Duration::from_millis(cfg.heartbeat_interval_ms),
        peer_timeout: Duration::from_millis(cfg.peer_timeout_ms),
        backoff: Backoff {
            min: Duration::from_millis(cfg.reconnect_min_ms),
            max: Duration::from_millis(cfg.reconnect_max_ms),
        },
        host_name,
        cmd_unix_path: cmd_unix.clone(),
        import_timeout: openimex_imexd::settings::DEFAULT_IMPORT_TIMEOUT,
        peer_any_source: cfg.peer_any_source,
        grace: match cfg.imex_node_disconnected_grace_time {
            openimex_config::GraceTime::Forever => None,
            openimex_config::GraceTime::Seconds(s) => Some(Duration::from_secs(s)),
        },
        persist_path: Some(cfg.persist_file.clone()),
        nodes_file: Some(cfg.imex_node_config_file.clone()),
        jobs_dir: cfg.jobs_dir.clone(),
        channels: match &backend {
            Backend::NoGpu | Backend::Auto => None,
            // The simulated driver's channels are regular files, whatever its /proc says (also
            // behind the RM interface, where its control node is a socket).
            Backend::Nvidia(root) => Some(openimex_driver::channels::ChannelDir {
                dir: openimex_driver::channels::channels_dir(root),
                major: match cfg.driver {
                    DriverKind::Sim => None,
                    _ if openimex_driver::nvidia::files::is_simulated(root) => None,
                    _ => openimex_driver::nvidia::files::channels_major(root),
                },
            }),
        },
        network_interface: placement.interface.clone(),
        link_scope: placement.scope_id,
        conn_wait_timeout: cfg.imex_conn_wait_timeout.map(Duration::from_secs),
        tls,
        config_dump: (args.config.clone(), openimex_config::dump(&cfg)),
    };
    let bind = match local.bind_ip {
        std::net::IpAddr::V6(ip) => std::net::SocketAddr::V6(std::net::SocketAddrV6::new(
            ip,
            cfg.server_port,
            0,
            // Only a link-local address takes the scope; others bind on every interface.
            if openimex_config::iface::is_link_local(local.bind_ip) {
                placement.scope_id
            } else {
                0
            },
        )),
        ip => std::net::SocketAddr::new(ip, cfg.server_port),
    };
    let world = World::bind(
        bind,
        cfg.imex_cmd_bind_interface_ip,
        cfg.imex_cmd_port.filter(|_| cfg.imex_cmd_enabled),
        cmd_unix.as_deref(),
    )?
    .with_metrics(cfg.metrics_addr)?
    .with_heap_counter(heap_allocations);
    Ok(Prepared {
        cfg,
        mode: Mode::Configured {
            settings: Box::new(settings),
            world,
            driver,
        },
    })
}

/// Mutual TLS between daemons when the config turns it on: the six files read and checked now
/// (an error stops the start, naming the file, line and key), and read again from the same
/// config on SIGUSR1 unless they come from the environment (`ENV_VAL`).
fn tls_from(cfg: &Config) -> Result<Option<openimex_imexd::tls::Tls>> {
    let Some(material) = cfg.tls_material()? else {
        return Ok(None);
    };
    let loader = cfg.tls_reloadable().then(|| {
        let cfg = cfg.clone();
        let loader: openimex_imexd::tls::Loader = std::sync::Arc::new(move || {
            cfg.tls_material()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "TLS is off in the config".to_owned())
        });
        loader
    });
    Ok(Some(openimex_imexd::tls::Tls::new(material, loader)?))
}

/// `IMEX_CMD_UNIX_DOMAIN_PATH`, when the command service is enabled.
fn cmd_unix_path(cfg: &Config) -> Option<PathBuf> {
    cfg.imex_cmd_unix_domain_path
        .clone()
        .filter(|_| cfg.imex_cmd_enabled)
}

/// The nodes file holds placeholders but not this host: bind the command service only. The
/// GPU driver is not opened (the configured image, after SIGUSR1, opens it).
fn prepare_unconfigured(cfg: Config, why: String) -> Result<Prepared> {
    let unix_path = cmd_unix_path(&cfg);
    let (tcp, unix) = World::bind_commands(
        cfg.imex_cmd_bind_interface_ip,
        cfg.imex_cmd_port.filter(|_| cfg.imex_cmd_enabled),
        unix_path.as_deref(),
    )?;
    Ok(Prepared {
        cfg,
        mode: Mode::Unconfigured {
            listeners: CmdListeners {
                tcp,
                unix,
                unix_path,
            },
            why,
        },
    })
}

/// SIGUSR1 in an unconfigured daemon: does the nodes file name this host now?
fn names_this_host(cfg: &Config) -> unconfigured::Check {
    let cfg = cfg.clone();
    std::sync::Arc::new(move || {
        let nodes = NodeConfig::load(&cfg.imex_node_config_file).map_err(|e| e.to_string())?;
        iface::locate(&cfg, &nodes, &iface::system_interfaces())
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

fn start(args: Args, heap_allocations: Option<fn() -> u64>) -> Result<()> {
    // First, while this is the only thread: every thread started later inherits the mask.
    let ignored_signals = signals::block()?;
    signals::ignore_hup_until_handled()?;
    let reexecuted = reexec::take_marker();
    let Prepared { cfg, mode } = prepare(&args, heap_allocations)?;
    // OPENIMEX_* config keys set in the environment, where the daemon ignores them.
    let env_warnings = env_keys::warnings(&cfg, &args.config);
    // A service manager waiting for READY=1 (systemd Type=notify) tracks the process it
    // started: a forked child would be a stranger to it, so DAEMONIZE=1 is not honoured then.
    let notify_socket = std::env::var_os(openimex_imexd::notify::ENV);
    let manager_waits = notify_socket.as_deref().is_some_and(|v| !v.is_empty());
    // A re-executed image (same PID) is already where the first one put itself.
    let daemonizing = cfg.daemonize && !manager_waits && !reexecuted;
    if daemonizing {
        // The terminal's last chance to see them: the child's stderr is /dev/null.
        for w in &env_warnings {
            eprintln!("{}: warning: {w}", program());
        }
    }
    let mut ready = if daemonizing {
        daemonize::daemonize().context("cannot fork into the background")?
    } else {
        daemonize::ReadyPipe::none()
    };
    let target = logging::init(&logging::LogOptions::from_config(&cfg, reexecuted));
    if let logging::LogTarget::Stderr(Some(why)) = &target {
        warn!("{why}; logging to stderr");
    }
    // NVIDIA's performance statistics (docs/reference/imex-guide.md §6); dropped at the stop: the last record.
    // The counts are the configured daemon's; an unconfigured one has no peers to count.
    let counts = match &mode {
        Mode::Configured { world, .. } => world.stats.clone(),
        Mode::Unconfigured { .. } => openimex_imexd::stats::Stats::default(),
    };
    let stats = openimex_imexd::stats::StatsFile::start(
        openimex_imexd::stats::StatsOptions {
            path: cfg.stats_file_name.clone(),
            log_path: cfg.log_file_name.clone(),
            append: cfg.log_append_to_log || reexecuted,
            interval_sec: cfg.stats_interval_sec,
        },
        counts,
    );
    // The configuration dump of NVIDIA's daemon (docs/reference/imex-guide.md §9), which `ctl -d`
    // prints too: over 30 lines, written to the log in one call.
    logging::batch(|| {
        info!(
            "IMEX version {} (openimex) is running with the following configuration options",
            env!("CARGO_PKG_VERSION")
        );
        info!("Config file = {}", args.config.display());
        // The daemon's command service answers `ctl -d` with this same list (Settings).
        for (label, value) in openimex_config::dump(&cfg) {
            info!("{label} = {value}");
        }
        for notice in cfg.notices() {
            warn!("{notice}");
        }
    });
    for w in &env_warnings {
        warn!("{w}");
        if !daemonizing && !matches!(target, logging::LogTarget::Stderr(_)) {
            eprintln!("{}: warning: {w}", program());
        }
    }
    if cfg.daemonize && manager_waits {
        info!(
            "DAEMONIZE=1 not applied: NOTIFY_SOCKET is set, so a service manager (systemd Type=notify) started this daemon and waits for its readiness; staying in the foreground"
        );
    }
    let notifier =
        openimex_imexd::Notifier::from_var(notify_socket.as_deref()).unwrap_or_else(|e| {
            warn!("{e}");
            openimex_imexd::Notifier::disabled()
        });
    // One thread runs the engine, every session, the command service and the ignored signals'
    // log: a message crosses from a session's reader to the engine to a session's writer
    // without waking another thread (the driver's blocking calls and the persist record have
    // threads of their own).
    // Two workers measured slower, not faster: import p50 about 10% and the storm about 15%.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let check = names_this_host(&cfg);
    let result = runtime.block_on(async move {
        let (shutdown, reloads) = shutdown_signal()?;
        ignored_signals.log_on_runtime()?;
        ready.ready();
        match mode {
            Mode::Configured {
                settings,
                world,
                driver,
            } => {
                // A task, not this block's own future: a task woken from this thread is queued
                // on the spot, where waking the future `block_on` polls writes to the runtime's
                // wake-up descriptor, once for every message a session hands the engine.
                let daemon = tokio::spawn(openimex_imexd::run(
                    *settings,
                    world,
                    driver,
                    openimex_imexd::Entropy::random(),
                    shutdown,
                    reloads,
                    notifier,
                ));
                match daemon.await {
                    Ok(ran) => ran.map(|()| Outcome::Stopped).map_err(anyhow::Error::from),
                    // A panic goes on as it did before the task: it ends the process.
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    Err(e) => Err(anyhow::anyhow!("the daemon's task was cancelled: {e}")),
                }
            }
            Mode::Unconfigured { listeners, why } => {
                unconfigured::run(listeners, why, check, shutdown, reloads, notifier)
                    .await
                    .map_err(anyhow::Error::from)
            }
        }
    });
    // Tasks still blocked on a hung peer must not hold the exit past the 5 s promise.
    runtime.shutdown_timeout(Duration::from_millis(500));
    drop(stats);
    // NVIDIA flushes the verbose buffer at shutdown (docs/reference/imex-guide.md §5); the runtime is gone, so
    // this write blocks nothing.
    if matches!(result, Ok(Outcome::Configured)) {
        return Err(reexec::exec(&std::env::args_os().collect::<Vec<_>>()));
    }
    logging::dump_verbose(logging::DumpReason::Shutdown);
    result.map(|_| ())
}

/// Resolves on SIGTERM, SIGINT or SIGQUIT. SIGHUP writes the verbose log buffer to the log
/// (docs/reference/imex-guide.md §5; see [`logging`]). SIGUSR1 re-reads the nodes file and re-resolves its DNS
/// names without a restart (NVIDIA's behaviour without TLS, which the Kubernetes DRA driver's
/// DNS-name mode relies on): each one is a request on the returned channel, which the daemon
/// serves one at a time (see `openimex_imexd::Reloads`). With TLS on, the daemon reloads its keys
/// and certificates first (at most once every 5 s; see `openimex_imexd::tls`). Every other signal whose default
/// action would end the daemon is blocked from the start and logged by [`signals`], which also
/// says why the synchronous fault signals are left alone. Called on the runtime (it spawns
/// the signals' task).
fn shutdown_signal() -> Result<(
    impl std::future::Future<Output = ()>,
    openimex_imexd::Reloads,
)> {
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut quit = signal(SignalKind::quit()).context("cannot handle SIGQUIT")?;
    let mut hup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    let mut usr1 = signal(SignalKind::user_defined1()).context("cannot handle SIGUSR1")?;
    let (reload, reloads) = tokio::sync::mpsc::channel(1);
    let signals = async move {
        loop {
            tokio::select! {
                _ = term.recv() => { info!("SIGTERM received, shutting down"); return; }
                _ = int.recv() => { info!("SIGINT received, shutting down"); return; }
                _ = quit.recv() => { info!("SIGQUIT received, shutting down"); return; }
                // One write of at most the buffer's size (64 MiB at most, 1 MiB by default),
                // on a blocking thread so no runtime worker waits for the disk.
                _ = hup.recv() => {
                    tokio::task::spawn_blocking(|| {
                        logging::dump_verbose(logging::DumpReason::Sighup)
                    });
                }
                _ = usr1.recv() => {
                    info!("SIGUSR1 received: re-reading the nodes file and re-resolving its names");
                    // Full: a re-read is already pending, and it will read the file as it is now.
                    let _ = reload.try_send(());
                }
            }
        }
    };
    // A task of its own: the engine waits on its end, one cheap poll, where polling the five
    // signal streams themselves ran each time anything woke the engine.
    let signals = tokio::spawn(signals);
    Ok((
        async move {
            // A panicked signal task stops the daemon as a signal would.
            let _ = signals.await;
        },
        reloads,
    ))
}
