//! `openimex ctl`: a client of the daemon's command service, compatible with NVIDIA's
//! `nvidia-imex-ctl` (flags, output and exit codes as `docs/reference/imex-guide.md` §2 describes them), plus
//! our own views: `--links` (instances and the reason of each link's last change) and
//! `--peers` (what the local daemon holds for, imports from and owes each peer, and its
//! clean-ups of each with reason and time), `--fabric` (this node's GPUs on the NVLink fabric
//! and every node's cliques), `-N --watch` (redraw on change), `-N --svg FILE`
//! (the domain as a picture) and `domain-check HOST...` (are these hosts READY members?).
//! `-m` and `-d` are in NVIDIA's usage line without a published meaning; ours are the node map
//! and the configuration dump, asked of the daemon (see [`local_view`]).
//!
//! # Layout
//! - [`client`] — TCP / unix-socket connection and the calls.
//! - [`render`] — the `-N` table, `-N -j` JSON, `--links` and `--peers` views.
//! - [`reason`] — why a node is not READY or the domain not UP, in words.
//! - [`watch`] — `-N --watch`.
//! - [`svg`] — `-N --svg FILE`.
//! - [`domain_check`] — `domain-check HOST...`.
//! - [`fabric`] — `--fabric`.
//! - [`local_view`] — `-m` (node map) and `-d` (configuration dump).
//! - [`error`] — [`CtlError`] and exit codes.

pub mod cells;
pub mod client;
pub mod domain_check;
pub mod error;
pub mod fabric;
pub mod jobs;
pub mod local_view;
pub mod reason;
pub mod render;
pub mod svg;
pub mod watch;

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use openimex_config::{Config, DEFAULT_CONFIG_PATH};

pub use client::{Client, Target};
pub use error::CtlError;

/// The name this run of ctl goes by in its usage and messages: `nvidia-imex-ctl` when run
/// under that name (a link made by `install-links`), `openimex ctl` as a subcommand. Set once
/// by [`main`]; `nvidia-imex-ctl` before that.
static PROGRAM: OnceLock<String> = OnceLock::new();

/// NVIDIA's name for ctl: run under it, ctl keeps NVIDIA's answer to a bad command line.
pub const NVIDIA_PROGRAM: &str = "nvidia-imex-ctl";

/// The name ctl goes by in this run: `nvidia-imex-ctl` under that name (and before [`main`]
/// runs), `openimex ctl` as a subcommand of `openimex`.
pub fn program() -> &'static str {
    PROGRAM.get().map_or(NVIDIA_PROGRAM, String::as_str)
}

/// NVIDIA's short usage, printed on a bad command line, with the name `program`.
pub fn short_usage(program: &str) -> String {
    format!("Usage: {program} [-c <nvidia-imex config.cfg path>] <-n|-N|-q> [-j][-H]")
}

/// The usage lines of `--help` and the man page, with the name `program` (TARGET is spelled
/// out after the options: NVIDIA's `[-i <IP> <PORT> | -u <unix socket path> | -c <config.cfg
/// path>]` on each line would not fit 100 columns).
fn usage(program: &str) -> String {
    let forms = [
        "[TARGET] <-n|-N|-q|-s> [-j] [-H] [-t <ms>]",
        "[TARGET] -N [--watch [--interval <ms>]] [--links] [-j] [-H]",
        "[TARGET] -N --svg <FILE>",
        "[TARGET] <-d|-m> [-j]",
        "[TARGET] --fabric [-j]",
        "[TARGET] domain-check [-j] <HOST>...",
    ];
    forms
        .iter()
        .map(|form| format!("{program} {form}"))
        .collect::<Vec<_>>()
        .join("\n       ")
}

/// ctl's command line as clap describes it, named `program` (as [`program`] says): the one
/// definition behind its parser, its `--help`, `openimex help ctl` and its man page.
pub fn command(program: &str) -> clap::Command {
    Args::command()
        .bin_name(program)
        .override_usage(usage(program))
}

/// The command line as NVIDIA spells it.
#[derive(Debug, Parser)]
#[command(
    name = "nvidia-imex-ctl",
    about = "Query the IMEX daemon (same flags as nvidia-imex-ctl: -q, -N, -j, -H, -c, -i, -u ...)",
    after_help = "TARGET, the daemon's command service: -i <IP> <PORT> | -u <unix socket path> | \
                  -c <config.cfg path> (default: -c /etc/nvidia-imex/config.cfg).",
    disable_version_flag = true,
    disable_help_subcommand = true
)]
pub struct Args {
    /// Config file: the command endpoint and node file come from it (default /etc/nvidia-imex/config.cfg).
    #[arg(short = 'c', value_name = "CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// Command service address and port.
    #[arg(short = 'i', num_args = 2, value_names = ["IP", "PORT"], global = true)]
    pub ip: Option<Vec<String>>,
    /// Command service unix socket (IMEX_CMD_UNIX_DOMAIN_PATH of the daemon's config; NVIDIA's
    /// spelling --u=PATH works too).
    #[arg(
        short = 'u',
        long = "unix-socket",
        alias = "u",
        value_name = "PATH",
        global = true
    )]
    pub unix: Option<PathBuf>,
    /// Print the local daemon's state word once (READY, ...).
    #[arg(short = 'q')]
    pub query: bool,
    /// openimex: with -q, the state word of this job on the local daemon (FORMING, READY,
    /// DEGRADED, DISAGREED) instead of the daemon's: what a prolog waits for. With -N or -n
    /// (and -j), the domain restricted to the job's members, its status over them alone.
    #[arg(long, value_name = "NAME")]
    pub job: Option<String>,
    /// Print the whole domain's status once.
    #[arg(short = 'N')]
    pub domain_once: bool,
    /// Print the whole domain's status, refreshed every second.
    #[arg(short = 'n')]
    pub domain_loop: bool,
    /// Print the daemon state whenever it changes, until the daemon exits or -t elapses.
    #[arg(short = 's')]
    pub subscribe: bool,
    /// With -s, -n or --watch: stop after this many milliseconds.
    #[arg(short = 't', value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// JSON output (with -N/-n/--links/--peers/--watch/domain-check).
    #[arg(short = 'j', global = true)]
    pub json: bool,
    /// Show host names (with -N/-n/--watch).
    #[arg(short = 'H')]
    pub hostnames: bool,
    /// Meaning ours (NVIDIA publishes none): print the running daemon's configuration as it
    /// logged it at start; if the daemon cannot say, ctl computes it from the config file and
    /// says so.
    #[arg(short = 'd', conflicts_with_all = ["query", "domain_once", "domain_loop", "subscribe", "map"])]
    pub dump: bool,
    /// Meaning ours (NVIDIA publishes none): print the running daemon's node map (node ID,
    /// nodes-file entry, the addresses it resolves to now, which one is this node); if the
    /// daemon cannot say, ctl computes it from the config file with the daemon's rules and says
    /// so.
    #[arg(short = 'm', conflicts_with_all = ["query", "domain_once", "domain_loop", "subscribe"])]
    pub map: bool,
    /// Legacy flag of NVIDIA's Slurm prolog example (`-a -q`); accepted and ignored.
    #[arg(short = 'a', hide = true)]
    pub legacy_a: bool,
    /// openimex: every link with its state, the peer's instance and the reason of its last change.
    #[arg(long)]
    pub links: bool,
    /// openimex: per peer of the local daemon, the references held for it, imports from it,
    /// unimports owed to it, and its clean-ups here with reason and time.
    #[arg(long, conflicts_with = "links")]
    pub peers: bool,
    /// openimex: with -N (or --links), redraw whenever the domain changes, until Ctrl-C,
    /// SIGTERM, -t or a closed output; with -j one JSON document per change, one per line.
    /// Started before the daemon listens, it says so and waits for it.
    #[arg(long, conflicts_with_all = ["query", "subscribe", "peers", "domain_loop"])]
    pub watch: bool,
    /// openimex: with --watch, ask the daemon every MS milliseconds (default 1000, at least 10).
    #[arg(long, value_name = "MS", requires = "watch")]
    pub interval: Option<u64>,
    /// openimex: with -N, draw the domain into FILE as an SVG picture (`-`: standard output):
    /// a rack of trays with state colours and reasons, the link matrix, the local node's counts.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["watch", "links", "peers", "query", "subscribe", "domain_loop"])]
    pub svg: Option<PathBuf>,
    /// openimex: this node's GPUs on the NVLink fabric (probe state, clusterUuid, cliqueId,
    /// bandwidth mode, health summary and fields) and every node's cliques, marking the nodes
    /// outside this node's clique (their memory does not map here); -j for JSON.
    #[arg(long, conflicts_with_all = ["watch", "links", "peers", "query", "subscribe", "domain_loop", "svg"])]
    pub fabric: bool,
    /// Print the version.
    #[arg(long)]
    pub version: bool,
    /// openimex commands.
    #[command(subcommand)]
    pub command: Option<Sub>,
}

/// openimex's own commands.
#[derive(Debug, Subcommand)]
pub enum Sub {
    /// Are these hosts READY members of the local daemon's domain, connected from it? Each HOST
    /// is a node-file entry as written, or a name or address that resolves to one. Exit 0 iff
    /// every host is; otherwise a line per host says why not. -j for JSON.
    #[command(name = "domain-check")]
    DomainCheck {
        /// Hosts to check.
        #[arg(required = true, value_name = "HOST")]
        hosts: Vec<String>,
    },
    /// The jobs defined on the local daemon (OPENIMEX_JOBS_DIR): name, channel, members and
    /// state as this node sees it (FORMING, READY, DEGRADED, DISAGREED), with the members the
    /// state waits for; with NAME only that job's state word (exit 1 if this daemon has no such
    /// job). `jobs create`, `jobs end` and `jobs wait` define, end and wait for one job on this
    /// node. -j for JSON.
    #[command(args_conflicts_with_subcommands = true)]
    Jobs {
        /// create, end, wait or list (the default).
        #[command(subcommand)]
        action: Option<jobs::Action>,
        /// One job.
        #[arg(value_name = "NAME")]
        name: Option<String>,
    },
}

enum Mode {
    Query,
    Domain { repeat: bool },
    Subscribe,
    Links,
    Peers,
    Fabric,
    Watch,
    Svg(PathBuf),
    DomainCheck(Vec<String>),
    Jobs(Option<String>),
    JobAction(jobs::Action),
}

/// `--interval` below this is refused: it would keep the daemon busy asking every peer.
const MIN_INTERVAL_MS: u64 = 10;

/// Runs `ctl` with `args` (including the program name) and returns the exit code.
///
/// The name it goes by in its usage and messages is the file name of `args[0]`: a link named
/// `nvidia-imex-ctl`, or `openimex ctl` as the `openimex` binary passes it. A command line clap
/// cannot parse gets clap's message naming the argument; under NVIDIA's name, followed by
/// NVIDIA's short usage with exit status 1 (as nvidia-imex-ctl answers a bad flag), otherwise
/// with exit status 2 (clap's convention, as every other openimex command).
pub fn main(args: Vec<OsString>) -> ExitCode {
    let name = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| NVIDIA_PROGRAM.to_string());
    let program = PROGRAM.get_or_init(|| name).as_str();
    let domain_check = args.iter().any(|a| a == "domain-check");
    let parsed = command(program)
        .try_get_matches_from(args)
        .and_then(|m| Args::from_arg_matches(&m));
    let args = match parsed {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) if program != NVIDIA_PROGRAM => {
            let _ = e.print();
            return ExitCode::from(2);
        }
        Err(e) if domain_check => {
            // Ours: clap's full message says which argument is wrong.
            let _ = e.print();
            return ExitCode::from(1);
        }
        Err(e) => {
            // NVIDIA's answer to a bad flag (short usage, exit status 1), after clap's words
            // for what is wrong.
            let rendered = e.render().to_string();
            let what = rendered.lines().take_while(|l| !l.is_empty());
            let tips = rendered
                .lines()
                .filter(|l| l.trim_start().starts_with("tip:"));
            for line in what.chain(tips) {
                eprintln!("{line}");
            }
            eprintln!("{}", short_usage(program));
            return ExitCode::from(1);
        }
    };
    if args.version {
        println!(
            "openimex ctl {} (nvidia-imex-ctl compatible)",
            env!("CARGO_PKG_VERSION")
        );
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&CtlError::Runtime(e)),
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &CtlError) -> ExitCode {
    if let CtlError::Output(io) = e
        && io.kind() == std::io::ErrorKind::BrokenPipe
    {
        return ExitCode::SUCCESS;
    }
    eprintln!("{}: {e}", program());
    ExitCode::from(e.exit_code())
}

fn resolve(args: &Args, needs_nodes: bool) -> Result<Target, CtlError> {
    let given = [
        args.config.is_some(),
        args.ip.is_some(),
        args.unix.is_some(),
    ];
    if given.iter().filter(|b| **b).count() > 1 {
        let msg = format!(
            "give at most one of -c, -i and -u\n{}",
            short_usage(program())
        );
        return Err(CtlError::Usage(msg));
    }
    if let Some(ip) = &args.ip {
        let [host, port] = ip.as_slice() else {
            return Err(CtlError::Usage(format!(
                "-i takes an IP and a port\n{}",
                short_usage(program())
            )));
        };
        let port = port.parse().map_err(|_| {
            CtlError::Usage(format!(
                "-i {host} {port}: {port:?} is not a port (0-65535)"
            ))
        })?;
        return Ok(Target::Tcp {
            host: host.clone(),
            port,
        });
    }
    if let Some(path) = &args.unix {
        return Ok(Target::Unix(path.clone()));
    }
    let path = args
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH));
    let cfg = Config::load(&path).map_err(|e| CtlError::Config(Box::new(e)))?;
    if needs_nodes {
        // NVIDIA's ctl reads the node file for -N/-n; DCGM greps for this failure.
        cfg.load_nodes()
            .map_err(|e| CtlError::NodeFile(Box::new(e)))?;
    }
    let unix = cfg.imex_cmd_unix_domain_path.clone();
    match (unix, cfg.imex_cmd_port, cfg.imex_cmd_enabled) {
        (Some(p), _, true) => Ok(Target::Unix(p)),
        (None, Some(port), true) => {
            let host = cfg
                .imex_cmd_bind_interface_ip
                .map_or_else(|| "127.0.0.1".to_string(), |ip| ip.to_string());
            Ok(Target::Tcp { host, port })
        }
        (unix, port, enabled) => Err(CtlError::NoCommandService {
            path: path.display().to_string(),
            enabled: u8::from(enabled),
            ports: if unix.is_none() && port.is_none() {
                "unset"
            } else {
                "set"
            },
        }),
    }
}

async fn run(args: Args) -> Result<(), CtlError> {
    if args.dump || args.map {
        return local_views(&args).await;
    }
    let mode = if let Some(Sub::DomainCheck { hosts }) = &args.command {
        Mode::DomainCheck(hosts.clone())
    } else if let Some(Sub::Jobs { action, name }) = &args.command {
        match action {
            None => Mode::Jobs(name.clone()),
            Some(a) => Mode::JobAction(a.clone()),
        }
    } else if args.watch {
        Mode::Watch
    } else if let Some(path) = &args.svg {
        Mode::Svg(path.clone())
    } else if args.links {
        Mode::Links
    } else if args.peers {
        Mode::Peers
    } else if args.fabric {
        Mode::Fabric
    } else if args.query {
        Mode::Query
    } else if args.subscribe {
        Mode::Subscribe
    } else {
        // -N, -n, or nothing (bare `-H` prints the table on NVIDIA's too).
        Mode::Domain {
            repeat: args.domain_loop,
        }
    };
    if args.job.is_some() && !matches!(mode, Mode::Query | Mode::Domain { .. }) {
        return Err(CtlError::Usage(format!(
            "--job goes with -q (the job's state word) or -N / -n (the job's members)\n{}",
            short_usage(program())
        )));
    }
    let needs_nodes = match mode {
        Mode::Domain { .. } | Mode::Svg(_) => true,
        Mode::Watch => !args.links,
        _ => false,
    };
    let interval = args.interval.unwrap_or(1000);
    if interval < MIN_INTERVAL_MS {
        return Err(CtlError::Usage(format!(
            "--interval {interval}: give at least {MIN_INTERVAL_MS} ms between two looks at the domain"
        )));
    }
    let target = resolve(&args, needs_nodes)?;
    // A watch may start before the daemon (a job waiting for its domain): it reports the
    // failed calls and goes on asking, as it does when the daemon goes away later.
    let mut client = match mode {
        Mode::Watch => Client::connect_lazily(target, Duration::from_secs(3)).await?,
        _ => Client::connect(target, Duration::from_secs(3)).await?,
    };
    let deadline = args
        .timeout_ms
        .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
    let expired = || deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
    match mode {
        Mode::Query => match &args.job {
            Some(name) => {
                let reply = client.jobs().await?;
                out(&jobs::render(&reply, Some(name), args.json)?)
            }
            None => {
                let state = client.state().await?;
                out(&format!("{state}\n"))
            }
        },
        Mode::Links => {
            let reply = client.domain(true).await?;
            let text = if args.json {
                render::links_json(&reply) + "\n"
            } else {
                render::links_text(&reply)
            };
            out(&text)
        }
        Mode::Peers => {
            let reply = client.peers().await?;
            let text = if args.json {
                render::peers_json(&reply) + "\n"
            } else {
                render::peers_text(&reply)
            };
            out(&text)
        }
        Mode::Fabric => {
            let reply = client.fabric().await?;
            let text = if args.json {
                fabric::fabric_json(&reply) + "\n"
            } else {
                fabric::fabric_text(&reply)
            };
            out(&text)
        }
        Mode::Watch => {
            let opts = watch::Options {
                interval: Duration::from_millis(interval),
                json: args.json,
                hostnames: args.hostnames,
                links: args.links,
                deadline,
            };
            watch::run(&mut client, &opts).await
        }
        Mode::Svg(path) => svg::run(&mut client, &path).await,
        Mode::DomainCheck(hosts) => domain_check::run(&mut client, &hosts, args.json).await,
        Mode::Jobs(name) => {
            let reply = client.jobs().await?;
            out(&jobs::render(&reply, name.as_deref(), args.json)?)
        }
        Mode::JobAction(action) => out(&jobs::act(&mut client, action, args.json).await?),
        Mode::Domain { repeat } => loop {
            let members = match &args.job {
                Some(name) => Some(jobs::find(&client.jobs().await?, name)?.members.clone()),
                None => None,
            };
            let view = |reply| match &members {
                Some(m) => cells::restrict(reply, m),
                None => reply,
            };
            let mut reply = view(client.domain(false).await?);
            // Something is wrong: ask again with each link's reason, so the `Why` lines can say
            // what a refused or lost link said (one more round trip, only when not UP).
            if reply.status != "UP" {
                reply = view(client.domain(true).await?);
            }
            let stamp = stamp();
            // Streamed: a large domain's matrix is never held as text.
            write_out(|w| {
                if args.json {
                    render::write_json(w, &reply, &stamp, args.hostnames)?;
                    w.write_all(b"\n")
                } else {
                    render::write_table(w, &reply, &stamp, args.hostnames)
                }
            })?;
            if !repeat || expired() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        },
        Mode::Subscribe => {
            let mut last = String::new();
            loop {
                match client.state().await {
                    Ok(state) if state != last => {
                        out(&format!("{state}\n"))?;
                        last = state;
                    }
                    Ok(_) => {}
                    // The daemon exited: the subscription ends.
                    Err(_) => return Ok(()),
                }
                if expired() {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// `-d` / `-m`: asked of the daemon; computed from the config file when it cannot say and a
/// config file is at hand (-c, or the default without -i / -u).
async fn local_views(args: &Args) -> Result<(), CtlError> {
    let view = match args.map {
        true => local_view::View::Map,
        false => local_view::View::Dump,
    };
    let file = match (&args.config, args.ip.is_some() || args.unix.is_some()) {
        (Some(path), _) => Some(path.clone()),
        (None, false) => Some(PathBuf::from(DEFAULT_CONFIG_PATH)),
        (None, true) => None,
    };
    let asked = async {
        let target = resolve(args, false)?;
        let shown = target.to_string();
        let mut client = Client::connect(target, Duration::from_secs(3)).await?;
        client.config().await.map(|reply| (reply, shown))
    };
    let text = match (asked.await, file) {
        (Ok((reply, target)), _) => local_view::from_daemon(view, reply, &target, args.json),
        (Err(e), Some(path)) => {
            let why = format!("the daemon did not answer: {e}");
            local_view::from_file(view, &path, &why, args.json)?
        }
        (Err(e), None) => return Err(e),
    };
    out(&text)
}

fn stamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    openimex_core::timefmt::nv_timestamp(now)
}

/// Buffered standard output.
type Stdout = std::io::BufWriter<std::io::StdoutLock<'static>>;

fn write_out(render: impl FnOnce(&mut Stdout) -> std::io::Result<()>) -> Result<(), CtlError> {
    let mut w = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    render(&mut w)
        .and_then(|()| w.flush())
        .map_err(CtlError::Output)
}

fn out(text: &str) -> Result<(), CtlError> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(CtlError::Output)
}
