//! `openimex-lab local up|status|down`: a simulated domain on this machine, left running
//! between commands, for trying `ctl` on a live domain. `up` writes the domain's files with
//! `init`'s code ([`openimex::init_domain`]: one directory per node, mutual TLS on, each node
//! its own loopback address, log, persist record and command socket), starts per node a
//! simulated GPU driver (`gpu`) and an IMEX daemon (`daemon`) of this binary in the background,
//! waits until the domain is UP with every node READY, and prints the `ctl` commands to run
//! and the stop command. `down` stops what `up` started (the pids recorded in the directory)
//! and removes the sockets; `status` says what runs. Nothing needs root: every file, socket and
//! record is under the directory.
//!
//! Addresses: `127.1.B.1` … `127.1.B.N` (the test harness takes `127.16.0.0` and above), the
//! first block `B` whose addresses are all free on the peer port, unless `--first-ip` says.

mod procs;

use std::io::{BufRead, BufReader, Write as _};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use openimex_harness::DomainView;
use openimex_harness::process::run_with_timeout;

use procs::{Kind, Record, Spawn, Started};

/// The peer port of every node (NVIDIA's default; the nodes differ by address).
const SERVER_PORT: u16 = 50000;
/// The file that marks a directory as a local domain's (written by `up`, never removed but by
/// `down --purge`).
const MARKER: &str = "openimex-local";
/// The pids `up` started.
const RECORDS: &str = "local.pids";
/// The simulated NVLink fabric shared by the nodes' drivers.
const FABRIC: &str = "fabric";
/// Time for a driver to say `ready`.
const DRIVER_READY: Duration = Duration::from_secs(30);
/// Time for one `ctl` query.
const CTL_TIMEOUT: Duration = Duration::from_secs(10);
/// Addresses per block (`127.1.B.1` … `127.1.B.250`).
const MAX_NODES: usize = openimex_harness::addr::ADDRS_PER_BLOCK;

/// `openimex-lab local …`.
#[derive(Debug, Subcommand)]
pub(crate) enum LocalCommand {
    /// Start a simulated domain on this machine in the background (per node a simulated GPU
    /// driver and an IMEX daemon on its own 127.1.x.y address), wait until it is UP, and print
    /// the ctl commands to try and the stop command.
    Up(UpArgs),
    /// Say what runs of a local domain: each node's driver, daemon and state, and the domain's.
    Status(DirArg),
    /// Stop every process `local up` started in the directory and remove their sockets (logs
    /// and configs stay, unless --purge).
    Down(DownArgs),
}

/// The domain directory.
#[derive(Debug, Args)]
pub(crate) struct DirArg {
    /// The domain's directory [default: $XDG_RUNTIME_DIR/openimex-local, or without
    /// XDG_RUNTIME_DIR /tmp/openimex-local-$USER ($TMPDIR for /tmp if set; the uid without
    /// $USER)].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// `local up` flags.
#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// Nodes (compute trays) of the domain, 1-250.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Simulated GPUs per node.
    #[arg(long, default_value_t = 4)]
    gpus: u32,
    /// Node 0's address; node N takes the Nth next one [default: the first 127.1.B.1 whose
    /// block is free on port 50000].
    #[arg(long, value_name = "IP")]
    first_ip: Option<Ipv4Addr>,
    /// Seconds to wait for the domain to come UP before giving up (and stopping what started).
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    timeout: u64,
    #[command(flatten)]
    dir: DirArg,
}

/// `local down` flags.
#[derive(Debug, Args)]
pub(crate) struct DownArgs {
    /// Also remove the directory (configs, keys, logs) once everything has stopped.
    #[arg(long)]
    purge: bool,
    #[command(flatten)]
    dir: DirArg,
}

/// Runs a `local` subcommand.
pub(crate) fn run(command: &LocalCommand) -> Result<()> {
    match command {
        LocalCommand::Up(a) => up(a),
        LocalCommand::Status(a) => status(&Layout::new(a)?),
        LocalCommand::Down(a) => down(&Layout::new(&a.dir)?, a.purge),
    }
}

/// The directory's files.
struct Layout {
    dir: PathBuf,
}

impl Layout {
    fn new(arg: &DirArg) -> Result<Self> {
        let dir = match &arg.dir {
            Some(d) => d.clone(),
            None => default_dir(),
        };
        let dir = std::path::absolute(&dir)
            .with_context(|| format!("cannot resolve --dir {}", dir.display()))?;
        Ok(Self { dir })
    }
    fn marker(&self) -> PathBuf {
        self.dir.join(MARKER)
    }
    fn records(&self) -> PathBuf {
        self.dir.join(RECORDS)
    }
    fn fabric(&self) -> PathBuf {
        self.dir.join(FABRIC)
    }
    /// Node `i`'s directory: where `init` writes it (`--out DIR`, installed in place).
    fn node(&self, i: usize) -> PathBuf {
        self.dir.join(format!("node{i}"))
    }
    fn config(&self, i: usize) -> PathBuf {
        self.node(i).join("config.cfg")
    }
    /// The simulated driver's socket of node `i`.
    fn driver_socket(&self, i: usize) -> PathBuf {
        openimex_simproto::node_dir::socket_path(&self.node(i))
    }
    fn driver_out(&self, i: usize) -> PathBuf {
        self.node(i).join("gpu.out")
    }
    fn driver_log(&self, i: usize) -> PathBuf {
        self.node(i).join("gpu.log")
    }
    fn daemon_out(&self, i: usize) -> PathBuf {
        self.node(i).join("daemon.out")
    }
    /// The nodes with a config, from node 0 up.
    fn node_count(&self) -> usize {
        (0..).take_while(|&i| self.config(i).is_file()).count()
    }
}

/// `$XDG_RUNTIME_DIR/openimex-local` (a per-user directory only its user can enter), else
/// `<temp dir>/openimex-local-<$USER, $LOGNAME or the uid>`.
fn default_dir() -> PathBuf {
    if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from)
        && run.is_absolute()
        && run.is_dir()
    {
        return run.join("openimex-local");
    }
    let user = ["USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|u| {
            !u.is_empty()
                && u.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        })
        .unwrap_or_else(|| my_uid().map_or_else(|| "user".to_owned(), |u| u.to_string()));
    std::env::temp_dir().join(format!("openimex-local-{user}"))
}

/// This process's effective uid (the owner of `/proc/self`).
fn my_uid() -> Option<u32> {
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// `local up`.
fn up(args: &UpArgs) -> Result<()> {
    let layout = Layout::new(&args.dir)?;
    let n = args.nodes;
    if !(1..=MAX_NODES).contains(&n) {
        bail!("--nodes {n}: a local domain has 1 to {MAX_NODES} nodes; pass a count in that range");
    }
    if args.gpus == 0 {
        bail!("--gpus 0: every node needs at least one simulated GPU; pass --gpus 1 or more");
    }
    let exe = std::env::current_exe()
        .context("cannot find this binary's path, which starts the drivers and daemons")?;
    prepare_dir(&layout, &exe)?;
    // Nodes of an earlier, larger domain in this directory.
    for i in (n..).take_while(|&i| layout.node(i).is_dir()) {
        std::fs::remove_dir_all(layout.node(i)).with_context(|| {
            format!(
                "cannot remove {}, left by an earlier `local up` with more nodes; remove it by \
                 hand",
                layout.node(i).display()
            )
        })?;
    }
    let ips = pick_addresses(n, args.first_ip)?;
    let nodes = openimex::init_domain(&openimex::InitPlan {
        nodes: ips.iter().map(Ipv4Addr::to_string).collect(),
        out: layout.dir.clone(),
        install_dir: layout.dir.join("node{id}").display().to_string(),
        days: openimex_harness::certs::DEFAULT_DAYS,
        // The directory is this command's (checked above).
        force: true,
        extra: [
            // In the foreground: this command records the pid it started.
            ("DAEMONIZE", "0".to_owned()),
            ("SERVER_PORT", SERVER_PORT.to_string()),
            // The RM interface, with the simulated driver's node directory as the driver root.
            ("OPENIMEX_DRIVER", "nvidia".to_owned()),
            (
                "OPENIMEX_DRIVER_ROOT",
                layout.dir.join("node{id}").display().to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
    })
    .with_context(|| {
        format!(
            "cannot lay out the nodes in --dir {} (init's --install-dir below is that --dir)",
            layout.dir.display()
        )
    })?;
    // init refused a command socket path that is too long; the driver's is one byte shorter.
    let sockets: Vec<PathBuf> = nodes
        .iter()
        .flat_map(|node| [layout.driver_socket(node.id), node.cmd_socket()])
        .collect();
    let mut started = Started::new(layout.records(), sockets);
    for (i, node) in nodes.iter().enumerate() {
        let node_dir = layout.node(i);
        if node.install != node_dir {
            bail!(
                "init put node {i} in {}, not {}: a bug in local up",
                node.install.display(),
                node_dir.display()
            );
        }
        let node_arg = node_dir.display().to_string();
        // The `ready` line looked for must be this driver's, not an earlier run's.
        match std::fs::remove_file(layout.driver_out(i)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot remove {} (an earlier driver's output); check the directory's \
                         permissions",
                        layout.driver_out(i).display()
                    )
                });
            }
            _ => {}
        }
        let record = started.spawn(Spawn {
            kind: Kind::Driver,
            node: i,
            program: &exe,
            args: vec![
                "gpu".into(),
                "--node-dir".into(),
                node_arg.clone(),
                "--fabric-dir".into(),
                layout.fabric().display().to_string(),
                "--slot".into(),
                i.to_string(),
                "--gpus".into(),
                args.gpus.to_string(),
            ],
            arg: node_arg,
            stdout: layout.driver_out(i),
            stderr: layout.driver_log(i),
            cwd: &layout.dir,
        })?;
        let record = record.clone();
        wait_driver_ready(&layout, &mut started, &record)?;
    }
    for node in &nodes {
        let i = node.id;
        let config = layout.config(i).display().to_string();
        started.spawn(Spawn {
            kind: Kind::Daemon,
            node: i,
            program: &exe,
            args: vec!["daemon".into(), "-c".into(), config.clone()],
            arg: config,
            stdout: layout.daemon_out(i),
            stderr: layout.daemon_out(i),
            cwd: &layout.node(i),
        })?;
    }
    wait_up(
        &exe,
        &layout,
        &nodes,
        &mut started,
        Duration::from_secs(args.timeout),
    )?;
    let records = started.keep();
    print_up(&exe, &layout, &nodes, &records, args.gpus)?;
    Ok(())
}

/// Makes sure `DIR` is this command's to use: absent or empty (then created, mode 0700), or a
/// local domain's (its marker) with nothing of it running; owned by this user, not a link.
fn prepare_dir(layout: &Layout, exe: &Path) -> Result<()> {
    let dir = &layout.dir;
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| {
                    format!(
                        "cannot create the domain directory {}; pass a --dir this user can \
                         create",
                        dir.display()
                    )
                })?;
        }
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot look at {}; pass another --dir", dir.display()));
        }
        Ok(meta) => {
            if !meta.is_dir() {
                bail!(
                    "{} exists and is not a directory; pass another --dir",
                    dir.display()
                );
            }
            if my_uid().is_some_and(|me| me != meta.uid()) {
                bail!(
                    "{} belongs to another user (uid {}); pass a --dir of your own",
                    dir.display(),
                    meta.uid()
                );
            }
            let empty = std::fs::read_dir(dir)
                .with_context(|| format!("cannot list {}; pass another --dir", dir.display()))?
                .next()
                .is_none();
            if !empty && !layout.marker().exists() {
                bail!(
                    "{} holds files that `local up` did not write (no {MARKER} file in it); \
                     pass an empty or new --dir, so nothing of yours is overwritten",
                    dir.display()
                );
            }
            let running: Vec<Record> = procs::read_records(&layout.records())?
                .into_iter()
                .filter(Record::running)
                .collect();
            if let Some(r) = running.first() {
                bail!(
                    "a local domain already runs in {} (the {} and {} more processes); stop it \
                     first: {} local down --dir {}",
                    dir.display(),
                    r.describe(),
                    running.len() - 1,
                    exe.display(),
                    dir.display()
                );
            }
            // Records of processes that are gone (a reboot, a kill): start afresh.
            let _ = std::fs::remove_file(layout.records());
        }
    }
    std::fs::write(
        layout.marker(),
        "A local openimex domain (openimex-lab local up). Stop it with `openimex-lab local \
         down --dir` this directory.\n",
    )
    .with_context(|| format!("cannot write {}", layout.marker().display()))
}

/// `n` addresses, all free on [`SERVER_PORT`]: from `first` on, or the first free block
/// `127.1.B.1..=N`.
fn pick_addresses(n: usize, first: Option<Ipv4Addr>) -> Result<Vec<Ipv4Addr>> {
    let block = |start: Ipv4Addr| -> Option<Vec<Ipv4Addr>> {
        let base = u32::from(start);
        (0..n)
            .map(|k| {
                let ip = base.checked_add(u32::try_from(k).ok()?)?;
                // Stay out of a .0 or .255 host part.
                matches!(ip & 0xff, 1..=254).then_some(Ipv4Addr::from(ip))
            })
            .collect()
    };
    if let Some(first) = first {
        let ips = block(first).with_context(|| {
            format!(
                "--first-ip {first} with --nodes {n} runs past a .254 host part; pass a lower \
                 --first-ip, e.g. 127.1.0.1"
            )
        })?;
        probe(&ips).map_err(|e| {
            anyhow::anyhow!("{e}; pass another --first-ip, or stop what uses that address")
        })?;
        return Ok(ips);
    }
    let mut last = String::new();
    for b in 0..=255u8 {
        let ips = block(Ipv4Addr::new(127, 1, b, 1)).context("a block of 127.1.B.x")?;
        match probe(&ips) {
            Ok(()) => return Ok(ips),
            Err(e) => last = e,
        }
    }
    bail!(
        "no block 127.1.B.1-{n} is free on port {SERVER_PORT} (the last try: {last}); stop \
         other local domains (`local down`), or pass --first-ip"
    )
}

/// Binds every address on [`SERVER_PORT`] and lets go again.
fn probe(ips: &[Ipv4Addr]) -> Result<(), String> {
    for ip in ips {
        TcpListener::bind(SocketAddrV4::new(*ip, SERVER_PORT))
            .map_err(|e| format!("cannot bind {ip}:{SERVER_PORT}: {e}"))?;
    }
    Ok(())
}

/// Waits for the driver of `record` to print `ready` on its stdout file.
fn wait_driver_ready(layout: &Layout, started: &mut Started, record: &Record) -> Result<()> {
    let i = record.node;
    let start = Instant::now();
    loop {
        let ready = std::fs::File::open(layout.driver_out(i))
            .ok()
            .map(BufReader::new)
            .is_some_and(|f| {
                f.lines()
                    .map_while(Result::ok)
                    .any(|l| l.starts_with("ready"))
            });
        if ready {
            return Ok(());
        }
        if let Some((r, how)) = started.exited() {
            bail!(
                "the simulated GPU driver of node {} stopped during start-up ({how}); its log \
                 {} ends with:\n{}",
                r.node,
                layout.driver_log(r.node).display(),
                tail(&layout.driver_log(r.node), 15)
            );
        }
        if start.elapsed() > DRIVER_READY {
            bail!(
                "the simulated GPU driver of node {i} did not say `ready` within {}s; see its \
                 log {} (a loaded machine: try again, or fewer --nodes)",
                DRIVER_READY.as_secs(),
                layout.driver_log(i).display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until node 0 sees the domain UP with every node READY, failing at once when a
/// process exits and after `limit` otherwise, naming the node and its log.
fn wait_up(
    exe: &Path,
    layout: &Layout,
    nodes: &[openimex::InitNode],
    started: &mut Started,
    limit: Duration,
) -> Result<()> {
    let start = Instant::now();
    loop {
        if let Some((r, how)) = started.exited() {
            let (what, file) = match r.kind {
                Kind::Daemon => ("IMEX daemon", layout.daemon_out(r.node)),
                Kind::Driver => ("simulated GPU driver", layout.driver_log(r.node)),
            };
            bail!(
                "the {what} of node {} stopped during start-up ({how}); {} ends with:\n{}\n(its \
                 log: {}); everything started was stopped",
                r.node,
                file.display(),
                tail(&file, 15),
                nodes[r.node].log_file(true).display()
            );
        }
        let domain = ctl(exe, &layout.config(0), &["-N", "-j"])
            .ok()
            .and_then(|text| DomainView::parse(&text).ok());
        if domain
            .as_ref()
            .is_some_and(|d| d.status == "UP" && d.all_ready() && d.nodes.len() == nodes.len())
        {
            return Ok(());
        }
        if start.elapsed() > limit {
            // The first node that is not READY, in its own words.
            for node in nodes {
                let state = match ctl(exe, &layout.config(node.id), &["-q"]) {
                    Ok(s) => s.trim().to_owned(),
                    Err(e) => format!("no answer: {e}"),
                };
                if state != "READY" {
                    bail!(
                        "node {} ({}) is not READY after {}s (ctl -q: {state}); see its log {} \
                         and {}; everything started was stopped (pass a longer --timeout on a \
                         loaded machine)",
                        node.id,
                        node.entry,
                        limit.as_secs(),
                        node.log_file(true).display(),
                        layout.daemon_out(node.id).display()
                    );
                }
            }
            bail!(
                "the domain did not come UP within {}s although every node says READY (node 0 \
                 sees: {}); see the nodes' logs {}/node*/imex.log; everything started was \
                 stopped",
                limit.as_secs(),
                domain.map_or_else(|| "no answer".to_owned(), |d| d.status),
                layout.dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs `exe ctl -c config ARGS`; its stdout when it exits 0.
fn ctl(exe: &Path, config: &Path, args: &[&str]) -> Result<String> {
    let mut cmd = Command::new(exe);
    cmd.arg("ctl").arg("-c").arg(config).args(args);
    let out = run_with_timeout(&mut cmd, CTL_TIMEOUT)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let why = stderr.lines().chain(stdout.lines()).next().unwrap_or("");
        bail!("ctl {} failed ({}): {why}", args.join(" "), out.status);
    }
    Ok(stdout)
}

/// The last `n` lines of a file (what there is).
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What `up` prints once the domain is UP.
fn print_up(
    exe: &Path,
    layout: &Layout,
    nodes: &[openimex::InitNode],
    records: &[Record],
    gpus: u32,
) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    let exe = exe.display();
    let dir = layout.dir.display();
    writeln!(
        out,
        "A local openimex domain is UP in {dir}: {} nodes, each a simulated GPU driver ({gpus} \
         GPUs) and an IMEX daemon, mutual TLS between the daemons.",
        nodes.len()
    )?;
    for node in nodes {
        let pid = |kind| {
            records
                .iter()
                .find(|r| r.node == node.id && r.kind == kind)
                .map_or_else(|| "?".to_owned(), |r| r.pid.to_string())
        };
        writeln!(
            out,
            "  node {}  {:<12} daemon pid {:<7} driver pid {:<7} log {}",
            node.id,
            node.entry,
            pid(Kind::Daemon),
            pid(Kind::Driver),
            node.log_file(true).display()
        )?;
    }
    let config0 = layout.config(0);
    let config0 = config0.display();
    writeln!(out)?;
    writeln!(out, "Point ctl at it with any node's config.cfg:")?;
    writeln!(
        out,
        "  {exe} ctl -c {config0} -N       # every node and connection"
    )?;
    writeln!(out, "  {exe} ctl -c {config0} -q       # node 0's state")?;
    writeln!(out, "  {exe} ctl -c {config0} -N -j    # the same as JSON")?;
    writeln!(out, "Status and stop:")?;
    writeln!(out, "  {exe} local status --dir {dir}")?;
    writeln!(out, "  {exe} local down --dir {dir}")?;
    Ok(())
}

/// `local status`.
fn status(layout: &Layout) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let n = check_domain_dir(layout)?;
    let records = procs::read_records(&layout.records())?;
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    let mut problems = Vec::new();
    for i in 0..n {
        let running = |kind| {
            records
                .iter()
                .filter(|r| r.node == i && r.kind == kind)
                .find(|r| r.running())
        };
        let show = |r: Option<&Record>| {
            r.map_or_else(|| "stopped".to_owned(), |r| format!("pid {}", r.pid))
        };
        let (driver, daemon) = (running(Kind::Driver), running(Kind::Daemon));
        let state = match daemon {
            Some(_) => ctl(&exe, &layout.config(i), &["-q"])
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|e| format!("no answer ({e})")),
            None => "-".to_owned(),
        };
        writeln!(
            out,
            "node {i}  driver {:<10} daemon {:<10} {state}",
            show(driver),
            show(daemon)
        )?;
        if driver.is_none() || daemon.is_none() || state != "READY" {
            problems.push(i);
        }
    }
    let domain = ctl(&exe, &layout.config(0), &["-N", "-j"])
        .ok()
        .and_then(|t| DomainView::parse(&t).ok())
        .map_or_else(|| "no answer from node 0".to_owned(), |d| d.status);
    writeln!(out, "domain {domain}")?;
    if let Some(first) = problems.first() {
        bail!(
            "the local domain in {} is not fully up: node {first} is not running or not READY \
             (see {}/node{first}/imex.log); restart it with `local down --dir {0}` and `local \
             up --dir {0}`",
            layout.dir.display(),
            layout.dir.display()
        );
    }
    Ok(())
}

/// The node count of the local domain in `layout`, or why it is none.
fn check_domain_dir(layout: &Layout) -> Result<usize> {
    if !layout.marker().exists() {
        bail!(
            "no local domain in {}: it has no {MARKER} file; pass the --dir given to `local up`",
            layout.dir.display()
        );
    }
    Ok(layout.node_count())
}

/// `local down`.
fn down(layout: &Layout, purge: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let n = check_domain_dir(layout)?;
    let records = procs::read_records(&layout.records())?;
    let stopped = procs::stop(&records);
    // What the processes would have removed had they stopped cleanly.
    for i in 0..n {
        let mut sockets = vec![layout.driver_socket(i)];
        if let Ok(cfg) = openimex_config::Config::load(&layout.config(i))
            && let Some(path) = cfg.imex_cmd_unix_domain_path
        {
            sockets.push(path);
        }
        for socket in sockets {
            procs::remove_socket(&socket);
        }
    }
    if let Some(r) = stopped.remaining.first() {
        bail!(
            "the {} is still there after SIGKILL; nothing more this command can do (is it \
             stuck in the kernel? see /proc/{}/stack); its record stays in {}",
            r.describe(),
            r.pid,
            layout.records().display()
        );
    }
    std::fs::remove_file(layout.records())
        .or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Ok(()),
            _ => Err(e),
        })
        .with_context(|| format!("cannot remove {}", layout.records().display()))?;
    let count = stopped.terminated.len() + stopped.killed.len();
    if count == 0 {
        writeln!(out, "Nothing was running in {}.", layout.dir.display())?;
    } else {
        writeln!(
            out,
            "Stopped {count} processes of the local domain in {} ({} after SIGTERM{}); sockets \
             removed.",
            layout.dir.display(),
            stopped.terminated.len(),
            match stopped.killed.len() {
                0 => String::new(),
                k => format!(", {k} SIGKILLed: {}", describe_all(&stopped.killed)),
            }
        )?;
    }
    if purge {
        std::fs::remove_dir_all(&layout.dir).with_context(|| {
            format!(
                "cannot remove {}; remove it by hand (rm -r)",
                layout.dir.display()
            )
        })?;
        writeln!(out, "Removed {}.", layout.dir.display())?;
    } else {
        writeln!(
            out,
            "Configs, keys and logs stay in {} (`local down --purge` removes them; `local up` \
             reuses the directory).",
            layout.dir.display()
        )?;
    }
    Ok(())
}

fn describe_all(records: &[Record]) -> String {
    records
        .iter()
        .map(Record::describe)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_stay_inside_a_block() {
        let ips = pick_addresses(3, Some(Ipv4Addr::new(127, 1, 200, 252))).expect("3 fit");
        assert_eq!(ips.last(), Some(&Ipv4Addr::new(127, 1, 200, 254)));
        let e = pick_addresses(4, Some(Ipv4Addr::new(127, 1, 200, 252))).unwrap_err();
        assert!(e.to_string().contains("past a .254"), "{e}");
    }

    #[test]
    fn a_foreign_directory_is_refused() {
        let dir =
            std::env::temp_dir().join(format!("openimex-local-foreign-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("mine.txt"), "x").expect("write");
        let layout = Layout { dir: dir.clone() };
        let e = prepare_dir(&layout, Path::new("openimex-lab")).unwrap_err();
        let down_err = down(&layout, false).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(e.to_string().contains("did not write"), "{e}");
        assert!(
            down_err.to_string().contains("no local domain in"),
            "{down_err}"
        );
    }
}
