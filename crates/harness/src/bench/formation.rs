//! `formation`: how long N daemons take from spawn to every daemon READY with all its peers
//! connected, as each says itself the moment it is (its service-manager socket,
//! `Cluster::ready_watch`: no polling inside the clock, and a `ctl -N -j` after it checks that
//! the domain is UP), on the first N compute trays of a topology ([`formation_topology`]: nvl72 up to 18 trays,
//! nvl576 up to 144), its Fabric Manager and the trays' GPU drivers started before the clock,
//! against how long N trivial processes (`openimex listen-probe`) take from spawn to accepting
//! a TCP connection on the same kind of addresses. The ratio is the cost of forming the
//! domain (handshakes, the driver's session, state propagation) over the cost of starting
//! processes and binding sockets. Until 2026-12-06 the clock stopped when one
//! `ctl -N -j --watch --interval 10` saw UP: each of its looks made node 0 ask every peer for
//! its row while the domain formed (17 calls every 10 ms at 18 nodes, 143 at 144), a load and
//! a 0–10 ms lag the mesh floor, whose probes say themselves when they are done, never had.
//!
//! The same rounds time the transport's floor (`formation_N_grpc_mesh`): N processes
//! (`openimex-lab bench mesh-probe`) from spawn to every pair holding one gRPC connection that
//! carried one call, against the same bare processes. A domain is a full mesh (every node
//! connected to every other, docs/reference/imex-guide.md §4), so that ratio is the lowest a gRPC daemon's
//! `formation_N` could reach here: the quadratic part is the connections' own cost.
//!
//! With mutual TLS ([`formation_tls_entry`]: `formation_N_tls` and its floor
//! `formation_N_tls_grpc_mesh`) the daemons run with `ClusterSpec::with_tls` and the mesh
//! probes with a config file of their own certificate (`--config`, [`ProbeTls`]), both made
//! before the clock. The baseline is the same kind of bare processes as `formation_N`'s
//! (measured again in these rounds), so a TLS figure and its plaintext one are comparable
//! ratio to ratio.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::HarnessError;
use crate::addr::AddrBlock;
use crate::cluster::{Cluster, ClusterSpec, DEFAULT_SERVER_PORT, is_up};
use crate::fabric_manager::FabricManagerSpec;
use crate::process::{describe_status, die_with_parent};

use super::procfs::{tcp_passive_opens, tcp_passive_opens_since};
use super::tls::ProbeTls;
use super::{BenchEntry, Unit, median, median_f64, ms, short_error};

/// Limit for one round of either measurement.
pub(crate) const ROUND_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the recovery bench asks `ctl -N -j` (tests use 50 ms).
pub(crate) const DAEMON_POLL: Duration = Duration::from_millis(10);
/// How often the formation bench's `ctl -N -j --watch` asks node 0 (ctl's floor).
const WATCH_INTERVAL: Duration = Duration::from_millis(10);
/// Pause between connection sweeps of the baseline.
const PROBE_POLL: Duration = Duration::from_millis(2);

/// Result of [`formation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormationReport {
    /// Nodes per cluster.
    pub nodes: usize,
    /// Rounds measured.
    pub rounds: usize,
    /// Median time from spawning the daemons to node 0 seeing the domain UP.
    pub daemon_up: Duration,
    /// Median time from spawning `nodes` listen-probes to all of them accepting.
    pub bare_listen: Duration,
    /// Median time from spawning `nodes` mesh probes to every pair connected and called.
    pub grpc_mesh: Duration,
    /// Every daemon round, in order.
    pub daemon_samples: Vec<Duration>,
    /// Every baseline round, in order.
    pub baseline_samples: Vec<Duration>,
    /// Every mesh-floor round, in order.
    pub mesh_samples: Vec<Duration>,
    /// TCP connections accepted on this machine inside each daemon round's clock, in order
    /// (`None`: `/proc/net/snmp` unreadable). A full mesh needs one per pair; more are pairs
    /// whose dials crossed, and sessions lost and made again.
    pub daemon_connections: Vec<Option<u64>>,
    /// The same for each mesh-floor round (one per pair, and a probe's retries).
    pub mesh_connections: Vec<Option<u64>>,
    /// How long each daemon round's spawn loop took (inside its clock), in order: the
    /// harness's own share, which should match the mesh floor's.
    pub daemon_spawns: Vec<Duration>,
    /// The same for each mesh-floor round.
    pub mesh_spawns: Vec<Duration>,
}

/// One timed round of either side: spawn → done, the spawn loop's part of it, and the TCP
/// connections accepted on the machine meanwhile (`None`: unreadable).
struct Round {
    took: Duration,
    spawned: Duration,
    accepted: Option<u64>,
}

impl FormationReport {
    /// `daemon_up / bare_listen` (how many times slower than the baseline).
    pub fn ratio(&self) -> f64 {
        self.daemon_up.as_secs_f64() / self.bare_listen.as_secs_f64().max(1e-9)
    }

    /// `grpc_mesh / bare_listen`: the least [`ratio`](Self::ratio) a full gRPC mesh allows.
    pub fn floor_ratio(&self) -> f64 {
        self.grpc_mesh.as_secs_f64() / self.bare_listen.as_secs_f64().max(1e-9)
    }
}

/// Starts `nodes` daemons and times spawn → UP (seen by node 0), then shuts them down; then
/// times the listen-probe baseline, then the gRPC mesh floor. Each `rounds` times (at least
/// once); reports medians.
pub fn formation(
    binary: &Path,
    nodes: usize,
    rounds: usize,
) -> Result<FormationReport, HarnessError> {
    formation_over(binary, nodes, rounds, false)
}

/// [`formation`] with mutual TLS between the daemons and between the mesh probes (the same
/// bare processes as the baseline).
pub fn formation_tls(
    binary: &Path,
    nodes: usize,
    rounds: usize,
) -> Result<FormationReport, HarnessError> {
    formation_over(binary, nodes, rounds, true)
}

/// [`formation`], over mutual TLS when `tls`.
fn formation_over(
    binary: &Path,
    nodes: usize,
    rounds: usize,
    tls: bool,
) -> Result<FormationReport, HarnessError> {
    let rounds = rounds.max(1);
    let mut daemon_samples = Vec::with_capacity(rounds);
    let mut baseline_samples = Vec::with_capacity(rounds);
    let mut mesh_samples = Vec::with_capacity(rounds);
    let mut daemon_connections = Vec::with_capacity(rounds);
    let mut mesh_connections = Vec::with_capacity(rounds);
    let mut daemon_spawns = Vec::with_capacity(rounds);
    let mut mesh_spawns = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let d = daemon_round(binary, nodes, tls)?;
        daemon_samples.push(d.took);
        daemon_connections.push(d.accepted);
        daemon_spawns.push(d.spawned);
        baseline_samples.push(baseline_round(binary, nodes)?);
        let m = mesh_round(binary, nodes, tls)?;
        mesh_samples.push(m.took);
        mesh_connections.push(m.accepted);
        mesh_spawns.push(m.spawned);
    }
    Ok(FormationReport {
        nodes,
        rounds,
        daemon_up: median(&daemon_samples),
        bare_listen: median(&baseline_samples),
        grpc_mesh: median(&mesh_samples),
        daemon_samples,
        baseline_samples,
        mesh_samples,
        daemon_connections,
        mesh_connections,
        daemon_spawns,
        mesh_spawns,
    })
}

/// The median of the rounds' connection counts (`median_f64`'s upper middle), `?` when a
/// round could not count.
fn median_count(counts: &[Option<u64>]) -> String {
    match counts.iter().copied().collect::<Option<Vec<u64>>>() {
        Some(known) if !known.is_empty() => {
            format!(
                "{:.0}",
                median_f64(known.into_iter().map(|c| c as f64).collect())
            )
        }
        _ => "?".into(),
    }
}

/// [`formation`] as the `formation_N` entry of `bench all`, and its floor
/// `formation_N_grpc_mesh` (the mesh probes against the same bare processes). A round that
/// fails (144 nodes may not come UP within the limit) ends the scenario: further rounds would
/// only fail slower.
pub fn formation_entry(binary: &Path, nodes: usize, rounds: usize) -> Vec<BenchEntry> {
    entries(binary, nodes, rounds, false)
}

/// [`formation_tls`] as the `formation_N_tls` entry of `bench all`, and its floor
/// `formation_N_tls_grpc_mesh` (the mesh probes over mutual TLS), both against the bare
/// processes `formation_N` uses, measured in the same rounds.
pub fn formation_tls_entry(binary: &Path, nodes: usize, rounds: usize) -> Vec<BenchEntry> {
    entries(binary, nodes, rounds, true)
}

/// The two entries of [`formation_entry`] or, with `tls`, of [`formation_tls_entry`].
fn entries(binary: &Path, nodes: usize, rounds: usize, tls: bool) -> Vec<BenchEntry> {
    let suffix = if tls { "_tls" } else { "" };
    let name = format!("formation_{nodes}{suffix}");
    let floor = format!("formation_{nodes}{suffix}_grpc_mesh");
    let (daemons, connection) = match tls {
        true => (
            "daemons with mutual TLS (SSL_TLS, certificates made before the clock)",
            "gRPC connection over mutual TLS (the daemon's TLS code: TLS 1.3, both \
             certificates checked)",
        ),
        false => ("daemons", "gRPC connection"),
    };
    let pairs = nodes * nodes.saturating_sub(1) / 2;
    match formation_over(binary, nodes, rounds, tls) {
        Ok(r) => vec![
            BenchEntry::measured(
                name,
                ms(r.daemon_up),
                Unit::Ms,
                Some(ms(r.bare_listen)),
                format!(
                    "spawn of {nodes} {daemons} to every one READY with all its peers \
                     connected, as each says on its NOTIFY_SOCKET (the domain UP; checked with \
                     ctl -N after the clock) (the first {nodes} trays of {}, Fabric Manager and \
                     GPU drivers already up; the default liveness, a heartbeat every {} ms), \
                     against {nodes} bare processes to ports open; median of {} rounds; TCP \
                     connections accepted inside the clock, median: {} for {pairs} pairs; the \
                     harness's spawn loop inside the clock, median: {:.0} ms",
                    formation_topology(nodes).map_or_else(|_| "?".into(), |t| t.topology),
                    openimex_config::Config::default().heartbeat_interval_ms,
                    r.rounds,
                    median_count(&r.daemon_connections),
                    ms(median(&r.daemon_spawns)),
                ),
            ),
            BenchEntry::measured(
                floor,
                ms(r.grpc_mesh),
                Unit::Ms,
                Some(ms(r.bare_listen)),
                format!(
                    "spawn of {nodes} processes to every one of their {} pairs holding one \
                     {connection} that carried one call (the least any gRPC domain of \
                     {nodes} nodes{} does), against the same bare processes; median of {} \
                     rounds; TCP connections accepted inside the clock, median: {}; the \
                     harness's spawn loop inside the clock, median: {:.0} ms",
                    pairs,
                    if tls { " with TLS" } else { "" },
                    r.rounds,
                    median_count(&r.mesh_connections),
                    ms(median(&r.mesh_spawns)),
                ),
            ),
        ],
        Err(e) => {
            let why = short_error(&e);
            vec![
                BenchEntry::failed(name, Unit::Ms, why.clone()),
                BenchEntry::failed(floor, Unit::Ms, why),
            ]
        }
    }
}

/// The topology whose first `nodes` trays `formation_N` runs: nvl72 (one GB200 NVL72 rack)
/// up to 18 trays, nvl576 (8 such racks) up to 144.
pub fn formation_topology(nodes: usize) -> Result<FabricManagerSpec, HarnessError> {
    match nodes {
        0..=18 => Ok(FabricManagerSpec::preset("nvl72")),
        19..=144 => Ok(FabricManagerSpec::preset("nvl576")),
        _ => Err(HarnessError::parse(
            "formation size",
            format!(
                "formation_{nodes} runs the first {nodes} trays of a topology, and the largest \
                 preset (nvl576) has 144: ask for 144 trays or fewer"
            ),
            &nodes.to_string(),
        )),
    }
}

/// One daemon measurement: files, addresses, certificates (with `tls`), the Fabric Manager
/// and the trays' drivers are ready before the clock starts. Also returns the TCP connections
/// accepted on this machine inside the clock (nothing else of the bench connects then).
fn daemon_round(binary: &Path, nodes: usize, tls: bool) -> Result<Round, HarnessError> {
    let mut spec = ClusterSpec::first_trays(formation_topology(nodes)?, nodes, binary)?;
    // Liveness as an operator's daemon has it (the config's defaults), not the harness's
    // quicker test values: heartbeats flow while a domain forms, and they are part of its cost.
    let defaults = openimex_config::Config::default();
    spec.heartbeat_ms = defaults.heartbeat_interval_ms;
    spec.peer_timeout_ms = defaults.peer_timeout_ms;
    if tls {
        spec = spec.with_tls();
    }
    let mut cluster = Cluster::prepare(spec)?;
    cluster.start_fabric_manager()?;
    for i in 0..nodes {
        cluster.start_driver(i)?;
    }
    let mut ready = cluster.ready_watch()?;
    let opens = tcp_passive_opens();
    let start = Instant::now();
    for i in 0..nodes {
        cluster.start_node(i)?;
    }
    let spawned = start.elapsed();
    // Each daemon says when it is READY with every peer connected, as each mesh probe says
    // when it has called every peer: the same kind of observer on both sides, and nobody asks
    // the daemons anything while they form (`cluster/ready.rs`).
    ready.wait(&cluster, ROUND_TIMEOUT)?;
    let elapsed = start.elapsed();
    let accepted = tcp_passive_opens_since(opens);
    // What every node said of itself is the domain UP as `ctl -N` shows it (checked, not timed).
    cluster.wait_domain_watching(0, ROUND_TIMEOUT, WATCH_INTERVAL, "domain UP", |d| {
        is_up(d, nodes)
    })?;
    cluster.shutdown()?;
    Ok(Round {
        took: elapsed,
        spawned,
        accepted,
    })
}

/// Baseline processes (listen-probes, mesh probes), killed and reaped on drop.
struct Probes(Vec<Child>);

impl Probes {
    /// Spawns `cmd` (its stdout and stderr already chosen) as one more probe.
    fn spawn(&mut self, binary: &Path, mut cmd: Command) -> Result<(), HarnessError> {
        die_with_parent(&mut cmd);
        let child = cmd.spawn().map_err(|source| HarnessError::Spawn {
            program: binary.to_owned(),
            source,
            hint: "build the openimex binary first (cargo build) and pass its path",
        })?;
        self.0.push(child);
        Ok(())
    }

    /// Probe `i`'s failure, with its stderr, if it has exited (a probe only exits on error).
    fn exited(&mut self, i: usize, command: impl FnOnce() -> String) -> Option<HarnessError> {
        let child = self.0.get_mut(i)?;
        let status = child.try_wait().ok().flatten()?;
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        Some(HarnessError::CommandFailed {
            command: command(),
            status: describe_status(&status),
            stdout: String::new(),
            stderr,
        })
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `nodes` addresses of a fresh loopback block on the daemons' port.
fn probe_addrs(nodes: usize) -> Result<Vec<SocketAddr>, HarnessError> {
    let block = AddrBlock::allocate(nodes, &[DEFAULT_SERVER_PORT])?;
    Ok(block
        .ips()
        .iter()
        .map(|ip| SocketAddr::V4(SocketAddrV4::new(*ip, DEFAULT_SERVER_PORT)))
        .collect())
}

/// One baseline measurement: spawn `nodes` listen-probes, wait until each accepts.
pub(crate) fn baseline_round(binary: &Path, nodes: usize) -> Result<Duration, HarnessError> {
    let addrs = probe_addrs(nodes)?;
    let start = Instant::now();
    let mut probes = Probes(Vec::with_capacity(nodes));
    for addr in &addrs {
        let mut cmd = Command::new(binary);
        cmd.arg("listen-probe")
            .arg(addr.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        probes.spawn(binary, cmd)?;
    }
    let mut pending: Vec<usize> = (0..nodes).collect();
    while !pending.is_empty() {
        pending.retain(|&i| {
            TcpStream::connect_timeout(&addrs[i], Duration::from_millis(200)).is_err()
        });
        for &i in &pending {
            let command = || format!("{} listen-probe {}", binary.display(), addrs[i]);
            if let Some(e) = probes.exited(i, command) {
                return Err(e);
            }
        }
        if start.elapsed() >= ROUND_TIMEOUT {
            return Err(HarnessError::CommandTimeout {
                command: format!("{} listen-probe (×{nodes})", binary.display()),
                waited: ROUND_TIMEOUT,
                stdout: String::new(),
                stderr: format!("{} of {nodes} probes never accepted", pending.len()),
            });
        }
        if !pending.is_empty() {
            thread::sleep(PROBE_POLL);
        }
    }
    let elapsed = start.elapsed();
    drop(probes);
    Ok(elapsed)
}

/// One floor measurement: spawn `nodes` mesh probes (`bench mesh-probe`), all writing to one
/// pipe, and wait until each has said `meshed I`. With `tls`, each probe gets the config file
/// of its own certificate (made before the clock, as the daemons' are).
fn mesh_round(binary: &Path, nodes: usize, tls: bool) -> Result<Round, HarnessError> {
    let sockets = probe_addrs(nodes)?;
    let addrs: Vec<String> = sockets.iter().map(ToString::to_string).collect();
    let certs = match tls {
        true => {
            let ips: Vec<String> = sockets.iter().map(|a| a.ip().to_string()).collect();
            Some(ProbeTls::make(&ips)?)
        }
        false => None,
    };
    let pipe_error = |source| HarnessError::Io {
        action: "make the mesh probes' pipe",
        path: "(pipe)".into(),
        source,
        hint: "the process may be out of file descriptors (ulimit -n)",
    };
    let (reader, writer) = std::io::pipe().map_err(pipe_error)?;
    // Every probe's line is one write under PIPE_BUF, so lines never interleave.
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let opens = tcp_passive_opens();
    let start = Instant::now();
    let mut probes = Probes(Vec::with_capacity(nodes));
    for i in 0..nodes {
        let mut cmd = Command::new(binary);
        cmd.args(["bench", "mesh-probe", "--index", &i.to_string()]);
        if let Some(config) = certs.as_ref().and_then(|c| c.config(i)) {
            cmd.arg("--config").arg(config);
        }
        cmd.args(&addrs)
            .stdin(Stdio::null())
            .stdout(writer.try_clone().map_err(pipe_error)?)
            .stderr(Stdio::piped());
        probes.spawn(binary, cmd)?;
    }
    let spawned = start.elapsed();
    // Only the probes hold the pipe now: it ends when they all have.
    drop(writer);
    let command = |i: usize| move || format!("{} bench mesh-probe --index {i} …", binary.display());
    let mut meshed = BTreeSet::new();
    while meshed.len() < nodes {
        match rx.recv_timeout(PROBE_POLL * 25) {
            Ok(Ok(line)) => {
                match line
                    .strip_prefix("meshed ")
                    .and_then(|i| i.parse::<usize>().ok())
                {
                    Some(i) if i < nodes => meshed.insert(i),
                    _ => {
                        return Err(HarnessError::parse(
                            "mesh probe's line",
                            "expected `meshed I`",
                            &line,
                        ));
                    }
                };
            }
            Ok(Err(e)) => return Err(pipe_error(e)),
            Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {
                for i in (0..nodes).filter(|i| !meshed.contains(i)) {
                    if let Some(e) = probes.exited(i, command(i)) {
                        return Err(e);
                    }
                }
                if start.elapsed() >= ROUND_TIMEOUT {
                    return Err(HarnessError::CommandTimeout {
                        command: format!("{} bench mesh-probe (×{nodes})", binary.display()),
                        waited: ROUND_TIMEOUT,
                        stdout: String::new(),
                        stderr: format!(
                            "{} of {nodes} probes never finished their dials",
                            nodes - meshed.len()
                        ),
                    });
                }
            }
        }
    }
    let elapsed = start.elapsed();
    let accepted = tcp_passive_opens_since(opens);
    drop(probes);
    drop(certs);
    Ok(Round {
        took: elapsed,
        spawned,
        accepted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio() {
        let r = FormationReport {
            nodes: 2,
            rounds: 1,
            daemon_up: Duration::from_millis(300),
            bare_listen: Duration::from_millis(100),
            grpc_mesh: Duration::from_millis(250),
            daemon_samples: vec![],
            baseline_samples: vec![],
            mesh_samples: vec![],
            daemon_connections: vec![],
            mesh_connections: vec![],
            daemon_spawns: vec![],
            mesh_spawns: vec![],
        };
        assert!((r.ratio() - 3.0).abs() < 1e-9);
        assert!((r.floor_ratio() - 2.5).abs() < 1e-9);
    }

    #[test]
    fn connection_counts_median_or_unknown() {
        assert_eq!(
            median_count(&[Some(10_305), Some(14_151), Some(10_296)]),
            "10305"
        );
        assert_eq!(
            median_count(&[Some(7), None]),
            "?",
            "a round that could not count"
        );
        assert_eq!(median_count(&[]), "?");
    }

    #[test]
    fn formation_sizes_map_to_topologies() {
        let name = |n| formation_topology(n).map(|t| t.topology);
        assert_eq!(name(18).ok().as_deref(), Some("nvl72"));
        assert_eq!(name(2).ok().as_deref(), Some("nvl72"));
        assert_eq!(name(72).ok().as_deref(), Some("nvl576"));
        assert_eq!(name(144).ok().as_deref(), Some("nvl576"));
        let e = formation_topology(145).expect_err("145 trays is more than nvl576 has");
        assert!(e.to_string().contains("144 trays or fewer"), "{e}");
        // The spec of the largest runs the first 144 trays, 4 GPUs each, with the FM.
        let spec =
            ClusterSpec::first_trays(formation_topology(144).expect("nvl576"), 144, "openimex")
                .expect("144 trays of nvl576");
        assert_eq!(spec.nodes, 144);
        assert_eq!(spec.gpus.map(|g| g.gpus_per_node), Some(4));
        assert!(spec.fabric_manager.is_some());
    }
}
