//! [`Cluster`]: N `openimex daemon` processes on one machine, each on its own loopback
//! address, with the operations tests need (start, kill -9, SIGTERM, restart, signal, ctl,
//! wait for a domain state) and clean-up that never leaves a daemon behind.

mod fabric;
mod membership;
mod ready;
mod tls;
mod watch;

pub use ready::ReadyWatch;

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::HarnessError;
use crate::addr::AddrBlock;
use crate::domain::{DomainView, LinksView, PeersView};
use crate::fabric_manager::{FabricManager, FabricManagerSpec};
use crate::gpu::{GpuSpec, start_driver};
use crate::names;
use crate::node::Node;
use crate::process::{describe, describe_status, run_with_timeout, wait_timeout};
use crate::scratch::ScratchDir;

/// Default `SERVER_PORT`; unique per cluster through its addresses.
pub const DEFAULT_SERVER_PORT: u16 = 50000;
/// Default `IMEX_CMD_PORT`.
pub const DEFAULT_CMD_PORT: u16 = 50005;
/// Time limit of one `ctl` run.
pub const CTL_TIMEOUT: Duration = Duration::from_secs(10);
/// How often `wait_*` asks.
const WAIT_INTERVAL: Duration = Duration::from_millis(50);
/// Lines per log file in error messages.
const ERROR_LOG_TAIL: usize = 25;
/// Lines per log file printed when a test panics.
const PANIC_LOG_TAIL: usize = 200;

/// What to start. Build with [`ClusterSpec::new`] and adjust the public fields or chain
/// [`ClusterSpec::config`].
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Number of nodes.
    pub nodes: usize,
    /// The binary that runs the daemons and `ctl`: the production `openimex`, or the lab
    /// binary, which carries the same commands.
    pub binary: PathBuf,
    /// The lab binary (`openimex-lab`): the simulated GPU drivers, the Fabric Manager and the
    /// applications. [`ClusterSpec::new`] makes it `binary`; see [`ClusterSpec::with_lab_binary`].
    pub lab_binary: PathBuf,
    /// Extra config keys for every node; they override the standard ones.
    pub extra_config: Vec<(String, String)>,
    /// `OPENIMEX_HEARTBEAT_INTERVAL_MS` (default 500).
    pub heartbeat_ms: u64,
    /// `OPENIMEX_PEER_TIMEOUT_MS` (default 3000).
    pub peer_timeout_ms: u64,
    /// Keep the cluster directory after drop (it is always kept when a test panics).
    pub keep_dir: bool,
    /// `SERVER_PORT` of every node (default 50000).
    pub server_port: u16,
    /// `IMEX_CMD_PORT` of every node (default 50005).
    pub cmd_port: u16,
    /// Simulated GPUs: each node then runs `openimex-lab gpu` beside its daemon, which uses the
    /// `sim` driver. `None` (default): control plane only (`nogpu`).
    pub gpus: Option<GpuSpec>,
    /// Names mode: the nodes file lists names ([`crate::names::node_name`]) and each daemon
    /// resolves them through a private `/etc/hosts` (`<node dir>/hosts`). Needs root.
    pub names: bool,
    /// Mutual TLS between the daemons ([`ClusterSpec::with_tls`]).
    pub tls: bool,
    /// The domain's simulated Fabric Manager: started first by [`Cluster::start`], and the
    /// drivers take their probes from it ([`ClusterSpec::from_topology`]). `None` (default):
    /// each driver completes its own probes.
    pub fabric_manager: Option<FabricManagerSpec>,
}

impl ClusterSpec {
    /// `nodes` nodes of `binary` (the lab binary, which runs every process) with the defaults.
    pub fn new(nodes: usize, binary: impl Into<PathBuf>) -> Self {
        let binary = binary.into();
        Self {
            nodes,
            lab_binary: binary.clone(),
            binary,
            extra_config: Vec::new(),
            heartbeat_ms: 500,
            peer_timeout_ms: 3000,
            keep_dir: false,
            server_port: DEFAULT_SERVER_PORT,
            cmd_port: DEFAULT_CMD_PORT,
            gpus: None,
            names: false,
            tls: false,
            fabric_manager: None,
        }
    }

    /// Mutual TLS: a CA and a certificate per node are made in the cluster directory
    /// (`certs/`, see [`crate::certs`]) and every node's config turns TLS on with them
    /// (`IMEX_AUTH_SOURCE=FILE`); keys given with [`ClusterSpec::config`] override them.
    pub fn with_tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// The daemons run `binary` (e.g. the production `openimex`) and everything else of the
    /// simulation runs `lab` (`openimex-lab`).
    pub fn with_lab_binary(mut self, lab: impl Into<PathBuf>) -> Self {
        self.lab_binary = lab.into();
        self
    }

    /// Names mode (see [`ClusterSpec::names`]).
    pub fn with_names(mut self) -> Self {
        self.names = true;
        self
    }

    /// Gives every node simulated GPUs.
    pub fn with_gpus(mut self, gpus: GpuSpec) -> Self {
        self.gpus = Some(gpus);
        self
    }

    /// Adds (or overrides) a config key for every node.
    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_config.push((key.into(), value.into()));
        self
    }
}

/// How a [`Cluster::stop`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopOutcome {
    /// Exit code, if the daemon exited (rather than died of a signal).
    pub exit_code: Option<i32>,
    /// The signal that ended it, if any (9 after `killed`).
    pub signal: Option<i32>,
    /// From SIGTERM to reaped.
    pub elapsed: Duration,
    /// It ignored SIGTERM for the whole timeout and was SIGKILLed.
    pub killed: bool,
}

/// A running (or prepared) cluster. Dropping it kills every daemon it started.
#[derive(Debug)]
pub struct Cluster {
    spec: ClusterSpec,
    block: AddrBlock,
    nodes: Vec<Node>,
    /// Config keys set on one node only ([`Cluster::set_node_config`]).
    node_extra: Vec<Vec<(String, String)>>,
    /// The lines of the nodes file the harness writes (addresses, or names in names mode).
    lines: Vec<String>,
    /// Names mode: each node's hosts file entries (empty otherwise).
    hosts: Vec<Vec<(String, Ipv4Addr)>>,
    /// With TLS: the certificate files and the CA that signed them.
    tls: Option<(crate::certs::DomainFiles, crate::certs::Ca)>,
    /// The Fabric Manager, once started (killed on drop, before the directory goes).
    fm: Option<FabricManager>,
    /// Dropped after the processes (fields drop after `Drop::drop`).
    dir: ScratchDir,
}

impl Cluster {
    /// Writes every node's files, picks addresses, and spawns every daemon (without waiting
    /// for the domain to come UP).
    pub fn start(spec: ClusterSpec) -> Result<Self, HarnessError> {
        let mut cluster = Self::prepare(spec)?;
        if cluster.spec.fabric_manager.is_some() {
            cluster.start_fabric_manager()?;
        }
        for i in 0..cluster.len() {
            cluster.start_node(i)?;
        }
        Ok(cluster)
    }

    /// Like [`Cluster::start`] but spawns nothing: for tests that start nodes one by one or
    /// change a node's files first.
    pub fn prepare(spec: ClusterSpec) -> Result<Self, HarnessError> {
        let block = AddrBlock::allocate(spec.nodes, &[spec.server_port, spec.cmd_port])?;
        let mut dir = ScratchDir::new("cluster")?;
        if spec.keep_dir {
            dir.keep();
        }
        let lines: Vec<String> = match spec.names {
            true => (0..spec.nodes).map(names::node_name).collect(),
            false => block.ips().iter().map(ToString::to_string).collect(),
        };
        // Name i -> node i's address, the same on every node to begin with.
        let map: Vec<(String, Ipv4Addr)> = match spec.names {
            true => lines
                .iter()
                .cloned()
                .zip(block.ips().iter().copied())
                .collect(),
            false => Vec::new(),
        };
        let mut nodes = Vec::with_capacity(spec.nodes);
        for (i, ip) in block.ips().iter().enumerate() {
            let node = Node::create(dir.path(), i, *ip, spec.server_port, spec.cmd_port)?;
            node.write_nodes(&lines)?;
            if spec.names {
                names::write_hosts(&node.hosts_path(), &map)?;
            }
            nodes.push(node);
        }
        let tls = match spec.tls {
            true => Some(tls::make(&lines, dir.path())?),
            false => None,
        };
        let cluster = Self {
            tls,
            node_extra: vec![Vec::new(); nodes.len()],
            hosts: vec![map; nodes.len()],
            lines,
            spec,
            block,
            fm: None,
            nodes,
            dir,
        };
        for i in 0..cluster.len() {
            cluster.write_config(i)?;
        }
        Ok(cluster)
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True for a cluster of zero nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i`. Panics if `i >= len()`, like indexing.
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// The spec the cluster was made from.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The addresses, node 0 first.
    pub fn addrs(&self) -> &AddrBlock {
        &self.block
    }

    /// The directory holding `node-NN/`.
    pub fn base_dir(&self) -> &Path {
        self.dir.path()
    }

    fn get(&self, i: usize) -> Result<&Node, HarnessError> {
        self.nodes.get(i).ok_or(HarnessError::NoSuchNode {
            index: i,
            len: self.nodes.len(),
        })
    }

    /// Replaces node `i`'s nodes file (e.g. a different node map on one node).
    pub fn write_nodes_file(&self, i: usize, hosts: &[String]) -> Result<(), HarnessError> {
        self.get(i)?.write_nodes(hosts)
    }

    /// Adds or overrides `key=value` in node `i`'s config only (after the spec's keys) and
    /// rewrites its file; takes effect at that node's next start.
    pub fn set_node_config(
        &mut self,
        i: usize,
        key: &str,
        value: &str,
    ) -> Result<(), HarnessError> {
        self.get(i)?;
        self.node_extra[i].push((key.to_owned(), value.to_owned()));
        self.write_config(i)
    }

    /// Sets `key=value` in the environment of node `i`'s daemon (e.g. `NOTIFY_SOCKET`);
    /// takes effect at that node's next start.
    pub fn set_node_env(
        &self,
        i: usize,
        key: impl Into<std::ffi::OsString>,
        value: impl Into<std::ffi::OsString>,
    ) -> Result<(), HarnessError> {
        let node = self.get(i)?;
        let mut env = node.env.lock().unwrap_or_else(|e| e.into_inner());
        env.push((key.into(), value.into()));
        Ok(())
    }

    /// Writes node `i`'s config.cfg: standard keys, then the spec's, then the node's own.
    fn write_config(&self, i: usize) -> Result<(), HarnessError> {
        let node = self.get(i)?;
        let mut pairs = node.base_config(self.spec.heartbeat_ms, self.spec.peer_timeout_ms);
        if self.spec.gpus.is_some() {
            // The `nvidia` backend, with the simulated tray's node directory as its driver
            // root: the daemon speaks the RM interface to the simulated driver as to the
            // kernel module.
            pairs.push(("OPENIMEX_DRIVER".into(), "nvidia".into()));
            pairs.push((
                "OPENIMEX_DRIVER_ROOT".into(),
                node.dir().display().to_string(),
            ));
        }
        if let Some((files, _)) = &self.tls {
            pairs.extend(files.config_lines(i).unwrap_or_default());
        }
        pairs.extend(self.spec.extra_config.iter().cloned());
        pairs.extend(self.node_extra[i].iter().cloned());
        node.write_config(&pairs)
    }

    /// The fabric directory shared by the nodes' simulated GPUs.
    pub fn fabric_dir(&self) -> PathBuf {
        self.dir.path().join("fabric")
    }

    /// Starts node `i`'s simulated GPU driver if the cluster has GPUs and it is not running.
    pub fn start_driver(&self, i: usize) -> Result<(), HarnessError> {
        let Some(spec) = self.spec.gpus else {
            return Ok(());
        };
        let node = self.get(i)?;
        let mut gpu = node.gpu.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(child) = gpu.as_mut()
            && matches!(child.try_wait(), Ok(None))
        {
            return Ok(());
        }
        *gpu = Some(start_driver(
            &self.spec.lab_binary,
            node.dir(),
            &self.fabric_dir(),
            i,
            spec,
            self.spec.fabric_manager.is_some(),
        )?);
        Ok(())
    }

    /// SIGKILLs node `i`'s simulated GPU driver (the daemon loses its session).
    pub fn kill_driver(&self, i: usize) -> Result<(), HarnessError> {
        let node = self.get(i)?;
        let mut gpu = node.gpu.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut child) = gpu.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(())
    }

    /// Spawns node `i`'s daemon (after its GPU driver, when the cluster has GPUs). Fails if
    /// the daemon is already running.
    pub fn start_node(&mut self, i: usize) -> Result<(), HarnessError> {
        self.start_driver(i)?;
        let node = self.get(i)?;
        let mut proc = node.lock();
        proc.reap();
        if let Some(pid) = proc.pid() {
            return Err(HarnessError::AlreadyRunning { index: i, pid });
        }
        node.spawn(&mut proc, &self.spec.binary, self.spec.names)
    }

    /// SIGKILLs node `i`'s daemon and reaps it.
    pub fn kill9(&mut self, i: usize) -> Result<(), HarnessError> {
        let node = self.get(i)?;
        let mut proc = node.lock();
        proc.reap();
        proc.exit_expected = true;
        let Some(child) = proc.child.as_mut() else {
            return Err(HarnessError::NotRunning { index: i });
        };
        send(i, child.id(), Signal::SIGKILL)?;
        let status = child.wait().map_err(HarnessError::io(
            "reap the daemon of",
            node.dir(),
            "nothing to do: the process was killed",
        ))?;
        proc.child = None;
        proc.last_exit = Some(status);
        Ok(())
    }

    /// SIGTERMs node `i`'s daemon (SIGCONT too, in case it is stopped) and waits up to
    /// `timeout` for it to exit; SIGKILLs it after that.
    pub fn stop(&mut self, i: usize, timeout: Duration) -> Result<StopOutcome, HarnessError> {
        let node = self.get(i)?;
        let mut proc = node.lock();
        proc.reap();
        proc.exit_expected = true;
        let Some(child) = proc.child.as_mut() else {
            return Err(HarnessError::NotRunning { index: i });
        };
        let pid = child.id();
        let start = Instant::now();
        send(i, pid, Signal::SIGTERM)?;
        let _ = send(i, pid, Signal::SIGCONT);
        let (status, killed) = match wait_timeout(child, timeout) {
            Some(s) => (s, false),
            None => {
                let _ = child.kill();
                let s = child.wait().map_err(HarnessError::io(
                    "reap the daemon of",
                    node.dir(),
                    "nothing to do: the process was killed",
                ))?;
                (s, true)
            }
        };
        let elapsed = start.elapsed();
        proc.child = None;
        proc.last_exit = Some(status);
        Ok(StopOutcome {
            exit_code: status.code(),
            signal: status.signal(),
            elapsed,
            killed,
        })
    }

    /// Kills node `i` with SIGKILL if it is running, then starts it again with the same
    /// directory and config (its logs are appended to).
    pub fn restart(&mut self, i: usize) -> Result<(), HarnessError> {
        if self.is_running(i) {
            self.kill9(i)?;
        }
        self.start_node(i)
    }

    /// Sends `sig` to node `i`'s daemon (e.g. SIGSTOP / SIGCONT to freeze it). After
    /// TERM/INT/QUIT/KILL its exit is expected and `wait_*` will not report it as a crash.
    pub fn signal(&self, i: usize, sig: Signal) -> Result<(), HarnessError> {
        let node = self.get(i)?;
        let mut proc = node.lock();
        proc.reap();
        let Some(pid) = proc.pid() else {
            return Err(HarnessError::NotRunning { index: i });
        };
        if matches!(
            sig,
            Signal::SIGTERM | Signal::SIGINT | Signal::SIGQUIT | Signal::SIGKILL
        ) {
            proc.exit_expected = true;
        }
        send(i, pid, sig)
    }

    /// Whether node `i`'s daemon is running (reaps it if it has exited).
    pub fn is_running(&mut self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(|n| {
            let mut proc = n.lock();
            proc.reap();
            proc.child.is_some()
        })
    }

    /// Runs `binary ctl -c <node i's config> args…` with a 10 s limit. Any exit status is
    /// returned as is; only a failure to run or a timeout is an error.
    pub fn ctl(&self, i: usize, args: &[&str]) -> Result<Output, HarnessError> {
        run_with_timeout(&mut self.ctl_command(i, args)?, CTL_TIMEOUT)
    }

    /// `binary ctl -c <node i's config> args…`, not started.
    pub fn ctl_command(&self, i: usize, args: &[&str]) -> Result<Command, HarnessError> {
        let node = self.get(i)?;
        let mut cmd = Command::new(&self.spec.binary);
        cmd.arg("ctl").arg("-c").arg(node.config_path()).args(args);
        Ok(cmd)
    }

    /// Runs ctl and requires exit 0; returns stdout.
    fn ctl_ok(&self, i: usize, args: &[&str]) -> Result<String, HarnessError> {
        let out = self.ctl(i, args)?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        Err(HarnessError::CommandFailed {
            command: describe(&self.ctl_command(i, args)?),
            status: describe_status(&out.status),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// `ctl -N -j` on node `i`, parsed.
    pub fn domain(&self, i: usize) -> Result<DomainView, HarnessError> {
        DomainView::parse(&self.ctl_ok(i, &["-N", "-j"])?)
    }

    /// `ctl --links -j` on node `i`, parsed.
    pub fn links(&self, i: usize) -> Result<LinksView, HarnessError> {
        LinksView::parse(&self.ctl_ok(i, &["--links", "-j"])?)
    }

    /// `ctl --peers -j` on node `i`, parsed.
    pub fn peers(&self, i: usize) -> Result<PeersView, HarnessError> {
        PeersView::parse(&self.ctl_ok(i, &["--peers", "-j"])?)
    }

    /// Asks node `i` for `domain()` every 50 ms until `pred` holds. On timeout the error holds
    /// the last view (or error) and the tail of every node's log; a daemon that exits on its
    /// own meanwhile ends the wait at once.
    pub fn wait_domain(
        &self,
        i: usize,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&DomainView) -> bool,
    ) -> Result<DomainView, HarnessError> {
        self.wait_domain_every(i, timeout, WAIT_INTERVAL, what, pred)
    }

    /// [`Cluster::wait_domain`] with a chosen polling interval (the bench polls faster).
    pub fn wait_domain_every(
        &self,
        i: usize,
        timeout: Duration,
        interval: Duration,
        what: &str,
        pred: impl Fn(&DomainView) -> bool,
    ) -> Result<DomainView, HarnessError> {
        self.poll(
            i,
            timeout,
            interval,
            what,
            || self.domain(i),
            pred,
            DomainView::compact,
        )
    }

    /// Like [`Cluster::wait_domain`] for `links()`.
    pub fn wait_links(
        &self,
        i: usize,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&LinksView) -> bool,
    ) -> Result<LinksView, HarnessError> {
        self.poll(
            i,
            timeout,
            WAIT_INTERVAL,
            what,
            || self.links(i),
            pred,
            LinksView::compact,
        )
    }

    /// Like [`Cluster::wait_domain`] for `peers()`.
    pub fn wait_peers(
        &self,
        i: usize,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&PeersView) -> bool,
    ) -> Result<PeersView, HarnessError> {
        self.poll(
            i,
            timeout,
            WAIT_INTERVAL,
            what,
            || self.peers(i),
            pred,
            PeersView::compact,
        )
    }

    /// Waits until node `i` sees the domain UP: every node READY, every cell CONNECTED, one
    /// entry per cluster node.
    pub fn wait_up(&self, i: usize, timeout: Duration) -> Result<DomainView, HarnessError> {
        let n = self.len();
        self.wait_domain(i, timeout, "domain UP", move |d| is_up(d, n))
    }

    /// Waits until `ctl -q` on node `i` prints `state`.
    pub fn wait_state(&self, i: usize, state: &str, timeout: Duration) -> Result<(), HarnessError> {
        self.poll(
            i,
            timeout,
            WAIT_INTERVAL,
            &format!("state {state}"),
            || self.ctl_ok(i, &["-q"]),
            |out| out.trim() == state,
            |out| format!("ctl -q printed {out:?}"),
        )
        .map(drop)
    }

    #[allow(clippy::too_many_arguments)]
    fn poll<T>(
        &self,
        node: usize,
        timeout: Duration,
        interval: Duration,
        what: &str,
        fetch: impl Fn() -> Result<T, HarnessError>,
        pred: impl Fn(&T) -> bool,
        show: impl Fn(&T) -> String,
    ) -> Result<T, HarnessError> {
        self.get(node)?;
        let start = Instant::now();
        loop {
            self.check_unexpected_exits(what)?;
            let last = match fetch() {
                Ok(v) if pred(&v) => return Ok(v),
                Ok(v) => show(&v),
                Err(e) => crate::error::truncate(&e.to_string(), 4000),
            };
            if start.elapsed() >= timeout {
                return Err(HarnessError::WaitTimeout {
                    node,
                    what: what.to_owned(),
                    waited: timeout,
                    last,
                    logs: self.logs_tail(ERROR_LOG_TAIL),
                });
            }
            thread::sleep(interval);
        }
    }

    /// Fails if a daemon the harness did not ask to go has exited.
    fn check_unexpected_exits(&self, what: &str) -> Result<(), HarnessError> {
        for node in &self.nodes {
            let status = {
                let mut proc = node.lock();
                match proc.reap() {
                    Some(s) if !proc.exit_expected => s,
                    _ => continue,
                }
            };
            return Err(HarnessError::NodeExited {
                index: node.index(),
                status: describe_status(&status),
                what: what.to_owned(),
                logs: self.logs_tail(ERROR_LOG_TAIL),
            });
        }
        Ok(())
    }

    /// Every node's logs in full (imex.log, stdout, stderr), headed by node index.
    pub fn logs(&self) -> String {
        self.nodes.iter().fold(String::new(), |mut s, n| {
            let _ = write!(s, "{}", n.logs(None));
            s
        })
    }

    /// Like [`Cluster::logs`] with each file cut to its last `lines` lines.
    pub fn logs_tail(&self, lines: usize) -> String {
        self.nodes.iter().fold(String::new(), |mut s, n| {
            let _ = write!(s, "{}", n.logs(Some(lines)));
            s
        })
    }

    /// SIGTERMs every daemon, waits up to 10 s, SIGKILLs the rest. Stragglers are an error
    /// (after they were killed): the contract is an exit within 5 s.
    pub fn shutdown(&mut self) -> Result<(), HarnessError> {
        self.shutdown_within(Duration::from_secs(10))
    }

    /// [`Cluster::shutdown`] with a chosen grace period.
    pub fn shutdown_within(&mut self, timeout: Duration) -> Result<(), HarnessError> {
        let killed = self.terminate_all(timeout);
        if killed.is_empty() {
            Ok(())
        } else {
            Err(HarnessError::Stragglers {
                nodes: killed,
                timeout,
            })
        }
    }

    /// TERM (+CONT) to all, wait up to `grace`, KILL the rest; returns the killed indexes.
    fn terminate_all(&mut self, grace: Duration) -> Vec<usize> {
        for node in &self.nodes {
            let mut proc = node.lock();
            proc.reap();
            if let Some(pid) = proc.pid() {
                proc.exit_expected = true;
                let _ = send(node.index(), pid, Signal::SIGTERM);
                let _ = send(node.index(), pid, Signal::SIGCONT);
            }
        }
        let start = Instant::now();
        let mut killed = Vec::new();
        for node in &self.nodes {
            let mut proc = node.lock();
            let Some(child) = proc.child.as_mut() else {
                continue;
            };
            let left = grace.saturating_sub(start.elapsed());
            let status = match wait_timeout(child, left) {
                Some(s) => Some(s),
                None => {
                    killed.push(node.index());
                    let _ = child.kill();
                    child.wait().ok()
                }
            };
            proc.child = None;
            proc.last_exit = status;
        }
        // Drivers last: daemons close their sessions first, as on a real node.
        for node in &self.nodes {
            let mut gpu = node.gpu.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(mut child) = gpu.take() {
                let _ = send(node.index(), child.id(), Signal::SIGTERM);
                if wait_timeout(&mut child, Duration::from_secs(2)).is_none() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        killed
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.terminate_all(Duration::from_secs(2));
        if thread::panicking() {
            eprintln!(
                "openimex-harness: logs of the cluster in {} (last {PANIC_LOG_TAIL} lines per file):\n{}",
                self.base_dir().display(),
                self.logs_tail(PANIC_LOG_TAIL)
            );
        }
        // The ScratchDir field then removes the directory, or keeps it (and says so) when
        // keep_dir is set or a panic is unwinding.
    }
}

/// Every node READY, every cell CONNECTED, `n` nodes, status UP.
pub fn is_up(d: &DomainView, n: usize) -> bool {
    d.status == "UP"
        && d.nodes.len() == n
        && d.all_ready()
        && d.all_connected()
        && d.nodes.values().all(|v| v.connections.len() == n)
}

fn send(node: usize, pid: u32, sig: Signal) -> Result<(), HarnessError> {
    let raw = i32::try_from(pid).unwrap_or(i32::MAX);
    signal::kill(Pid::from_raw(raw), sig).map_err(|source| HarnessError::Signal {
        node,
        pid,
        signal: sig.as_str().to_owned(),
        source,
    })
}
