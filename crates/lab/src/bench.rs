//! `openimex-lab bench …`: figures as ratios to a baseline measured in the same run (docs/DESIGN.md §6).
//!
//! `bench all` runs every scenario, or those `--only` names, each bounded in time, and prints
//! one table (or one JSON object with `--json`, a Markdown table with `--markdown`). A scenario
//! that fails is reported as entries with an `error` and the run goes on. The scenarios:
//! `formation_N` (in the harness, daemons timed on the trays of a topology) and `recovery` (in
//! the harness, daemons only), `import`, `storm` and
//! `datapath` ([`apps`], with applications on simulated GPUs), `footprint` ([`footprint`]).
//! The secure path (`openimex init` turns mutual TLS on) has its own: `formation_N_tls`,
//! `import_tls` and `storm_tls`, the daemons with TLS against the same bare processes, a gRPC
//! mesh over TLS, and raw calls over TLS ([`tls`] holds the probes' TLS, the daemon's own).
//! `bench formation` and `bench imports` are the older single-scenario reports.

mod allocs;
mod apps;
mod churn;
mod footprint;
mod imports;
mod jobs;
mod mesh;
mod rpc;
mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};
use openimex_harness::bench::{self as hb, BenchEntry, Unit};
use openimex_harness::scratch;
use serde_json::{Value, json};

/// `openimex-lab bench …`.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Time from starting N daemons to domain UP, against N bare processes opening their ports.
    Formation {
        /// Nodes in the domain: the first N trays of nvl72 (up to 18) or nvl576 (up to 144).
        #[arg(long, default_value_t = 18)]
        nodes: usize,
        /// Rounds; medians are reported.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Mutual TLS between the daemons and between the mesh floor's processes.
        #[arg(long)]
        tls: bool,
    },
    /// All-to-all export/import (the demo's workload): import latency against a raw unary gRPC
    /// round trip, and fabric copy bandwidth against local memcpy, each baseline measured in
    /// the same run.
    Imports {
        /// Nodes in the domain.
        #[arg(long, default_value_t = 18)]
        nodes: usize,
        /// GPUs per node.
        #[arg(long, default_value_t = 4)]
        gpus_per_node: u32,
        /// Rounds; medians are reported.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// Every scenario (formation_18/72/144 and their _tls, import, import_tls, storm,
    /// storm_tls, datapath, recovery, footprint, job_ready_18, job_churn), each as value, unit,
    /// same-run baseline and ratio.
    All(AllArgs),
    /// (internal) Serve a constant unary gRPC call on ADDR: the raw RPC baseline.
    #[command(hide = true)]
    RpcServer {
        /// Mutual TLS with the keys this config file names (the nine TLS keys of config.cfg).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Address to bind (port 0: any free port; the bound address is printed).
        addr: SocketAddr,
    },
    /// (internal) One process of the gRPC full-mesh floor of `formation_N`: serve on
    /// `ADDRS[INDEX]`, dial every lower address, say `meshed INDEX`.
    #[command(hide = true)]
    MeshProbe {
        /// This process's position in ADDRS.
        #[arg(long)]
        index: usize,
        /// Mutual TLS with the keys this config file names (the nine TLS keys of config.cfg):
        /// the floor of `formation_N_tls`.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Every process's address, in order.
        #[arg(required = true)]
        addrs: Vec<SocketAddr>,
    },
}

/// `openimex-lab bench all` flags.
#[derive(Debug, Args)]
pub(crate) struct AllArgs {
    /// Comma-separated scenarios to run, e.g. `storm,import`: formation (= formation_18,
    /// formation_72, formation_144), formation_N for N from 2 to 144 (the first N trays of
    /// nvl72 up to 18, of nvl576 beyond), formation_tls (= formation_18_tls, formation_72_tls,
    /// formation_144_tls), formation_N_tls, import, import_tls, storm, storm_tls, datapath,
    /// recovery, footprint, job_ready (= job_ready_18), job_churn (the _tls ones with mutual TLS between
    /// the daemons, against the same probes over TLS). Default: all.
    #[arg(long, value_name = "LIST", value_parser = parse_only)]
    only: Option<Selection>,
    /// Rounds of each repeated measurement (medians are reported); import takes 200 samples
    /// per round, datapath 8 passes per round.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    /// Seconds of each idle footprint window.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    window: u64,
    /// Print one JSON object: `started`, `machine`, `entries` (name, value, unit, baseline,
    /// ratio, detail, error).
    #[arg(long, conflicts_with = "markdown")]
    json: bool,
    /// Print a Markdown table (as docs/performance.md has it).
    #[arg(long)]
    markdown: bool,
}

/// A scenario of `bench all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Formation(usize),
    /// `formation_N_tls`: mutual TLS between the daemons and between the floor's probes.
    FormationTls(usize),
    Import,
    /// `import_tls`: the daemons and the raw round trips over mutual TLS.
    ImportTls,
    Storm,
    /// `storm_tls`: the daemons and the raw burst over mutual TLS.
    StormTls,
    Datapath,
    Recovery,
    Footprint,
    /// `job_ready_N`: a job READY on N members of a domain already up, against formation_N.
    JobReady(usize),
    /// `job_churn`: 1,000 jobs created and ended around a running job's all-to-all
    /// (`job_churn_N`: N jobs).
    JobChurn(usize),
}

/// The formation sizes `formation` and `formation_tls` stand for.
const FORMATION_SIZES: [usize; 3] = [18, 72, 144];

/// Every scenario, in the order `bench all` runs them: each TLS one after its plaintext one,
/// so the two are measured in about the same state of the machine.
const ALL: [Scenario; 15] = [
    Scenario::Formation(18),
    Scenario::Formation(72),
    Scenario::Formation(144),
    Scenario::FormationTls(18),
    Scenario::FormationTls(72),
    Scenario::FormationTls(144),
    Scenario::Import,
    Scenario::ImportTls,
    Scenario::Storm,
    Scenario::StormTls,
    Scenario::Datapath,
    Scenario::Recovery,
    Scenario::Footprint,
    Scenario::JobReady(18),
    Scenario::JobChurn(churn::JOBS),
];

/// The scenarios `--only` picked, in the order given, without repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Selection(Vec<Scenario>);

fn parse_only(s: &str) -> Result<Selection, String> {
    let mut picked = Vec::new();
    for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let more: Vec<Scenario> = match word {
            "formation" => FORMATION_SIZES.map(Scenario::Formation).to_vec(),
            "formation_tls" => FORMATION_SIZES.map(Scenario::FormationTls).to_vec(),
            "import" => vec![Scenario::Import],
            "import_tls" => vec![Scenario::ImportTls],
            "storm" => vec![Scenario::Storm],
            "storm_tls" => vec![Scenario::StormTls],
            "datapath" => vec![Scenario::Datapath],
            "recovery" => vec![Scenario::Recovery],
            "footprint" => vec![Scenario::Footprint],
            "job_ready" => vec![Scenario::JobReady(18)],
            "job_churn" => vec![Scenario::JobChurn(churn::JOBS)],
            _ if let Some(n) = job_ready_size(word) => vec![Scenario::JobReady(n)],
            _ if let Some(n) = job_churn_size(word) => vec![Scenario::JobChurn(n)],
            _ => match formation_size(word) {
                Some((n, false)) => vec![Scenario::Formation(n)],
                Some((n, true)) => vec![Scenario::FormationTls(n)],
                None => {
                    return Err(format!(
                        "unknown scenario {word:?}: expected formation, formation_N (2 <= N <= 144), \
                         formation_tls, formation_N_tls, import, import_tls, storm, storm_tls, \
                         datapath, recovery, footprint, job_ready, job_ready_N, job_churn or job_churn_N"
                    ));
                }
            },
        };
        for sc in more {
            if !picked.contains(&sc) {
                picked.push(sc);
            }
        }
    }
    if picked.is_empty() {
        return Err("no scenario named".into());
    }
    Ok(Selection(picked))
}

/// `job_ready_N` as N, for N from 2 to 144.
fn job_ready_size(word: &str) -> Option<usize> {
    let n: usize = word.strip_prefix("job_ready_")?.parse().ok()?;
    (2..=144).contains(&n).then_some(n)
}

/// `job_churn_N` as N, for N from 1 to 100,000.
fn job_churn_size(word: &str) -> Option<usize> {
    let n: usize = word.strip_prefix("job_churn_")?.parse().ok()?;
    (1..=100_000).contains(&n).then_some(n)
}

/// `formation_N` as `(N, false)` and `formation_N_tls` as `(N, true)`, for N from 2 to 144.
fn formation_size(word: &str) -> Option<(usize, bool)> {
    let rest = word.strip_prefix("formation_")?;
    let (n, tls) = match rest.strip_suffix("_tls") {
        Some(n) => (n, true),
        None => (rest, false),
    };
    // Digits only: `parse` would also take a leading `+`.
    if !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = n.parse().ok().filter(|n| (2..=144).contains(n))?;
    Some((n, tls))
}

impl Scenario {
    fn label(self) -> String {
        match self {
            Scenario::Formation(n) => format!("formation_{n}"),
            Scenario::FormationTls(n) => format!("formation_{n}_tls"),
            Scenario::Import => "import".into(),
            Scenario::ImportTls => "import_tls".into(),
            Scenario::Storm => "storm".into(),
            Scenario::StormTls => "storm_tls".into(),
            Scenario::Datapath => "datapath".into(),
            Scenario::Recovery => "recovery".into(),
            Scenario::Footprint => "footprint".into(),
            Scenario::JobReady(n) => format!("job_ready_{n}"),
            Scenario::JobChurn(churn::JOBS) => "job_churn".into(),
            Scenario::JobChurn(n) => format!("job_churn_{n}"),
        }
    }

    /// Runs it; every failure comes back as entries with an error.
    fn run(self, binary: &Path, rounds: usize, window: Duration) -> Vec<BenchEntry> {
        // A failed scenario still names each of its figures, with its unit and the error.
        let or_failed = |r: Result<Vec<BenchEntry>>, figures: &[(String, Unit)]| {
            r.unwrap_or_else(|e| {
                let why = format!("{e:#}");
                figures
                    .iter()
                    .map(|(n, unit)| BenchEntry::failed(n.as_str(), *unit, why.clone()))
                    .collect()
            })
        };
        let import = |tls| {
            or_failed(
                apps::import(binary, rounds, tls),
                &apps::import_figures(tls),
            )
        };
        let storm = |tls| {
            or_failed(
                apps::storm(binary, rounds, tls).map(|e| vec![e]),
                &[(apps::storm_figure(tls).to_owned(), Unit::Ms)],
            )
        };
        match self {
            Scenario::Formation(n) => hb::formation_entry(binary, n, rounds),
            Scenario::FormationTls(n) => hb::formation_tls_entry(binary, n, rounds),
            Scenario::Import => import(false),
            Scenario::ImportTls => import(true),
            Scenario::Storm => storm(false),
            Scenario::StormTls => storm(true),
            Scenario::Datapath => or_failed(
                apps::datapath(binary, rounds),
                &[
                    ("datapath_read".to_owned(), Unit::GBps),
                    ("datapath_write".to_owned(), Unit::GBps),
                ],
            ),
            Scenario::Recovery => hb::recovery(binary, 18, rounds),
            Scenario::Footprint => footprint::footprint(binary, window),
            Scenario::JobReady(n) => jobs::job_ready_entry(binary, n, rounds),
            Scenario::JobChurn(n) => churn::job_churn_entry(binary, n),
        }
    }
}

pub(super) fn this_binary() -> Result<PathBuf> {
    std::env::current_exe().context("cannot find this binary's path")
}

/// Where the bench's clusters keep their files: `TMPDIR` when the caller set one, else a tmpfs
/// at `/dev/shm` when there is one ([`scratch::memory_root`] says why), else the temp dir.
fn choose_scratch() -> PathBuf {
    if std::env::var_os("TMPDIR").is_none()
        && let Some(shm) = scratch::memory_root()
    {
        // Nothing has made a scratch directory yet, so this root is the one in force.
        let _ = scratch::set_root(shm);
    }
    scratch::root()
}

/// Runs a benchmark and prints figures with their same-run baseline.
pub(crate) fn bench(cmd: &BenchCommand) -> Result<()> {
    if !matches!(
        cmd,
        BenchCommand::RpcServer { .. } | BenchCommand::MeshProbe { .. }
    ) {
        eprintln!(
            "bench: cluster files under {} (set TMPDIR to choose)",
            choose_scratch().display()
        );
    }
    match cmd {
        BenchCommand::Formation { nodes, rounds, tls } => {
            let binary = this_binary()?;
            let r = match tls {
                true => hb::formation_tls(&binary, *nodes, *rounds),
                false => hb::formation(&binary, *nodes, *rounds),
            }
            .context("formation benchmark failed")?;
            println!(
                "formation{}, {} nodes, {} rounds (medians):",
                if *tls { " with mutual TLS" } else { "" },
                r.nodes,
                r.rounds
            );
            let ms = |d: Duration| hb::ms(d);
            println!(
                "  openimex daemons, spawn -> domain UP : {:>8.1} ms",
                ms(r.daemon_up)
            );
            println!(
                "  bare processes, spawn -> ports open  : {:>8.1} ms",
                ms(r.bare_listen)
            );
            println!(
                "  ratio (daemons / bare processes)     : {:>8.2}",
                r.ratio()
            );
            println!(
                "  gRPC full mesh (floor), spawn -> all pairs called: {:>8.1} ms, ratio {:.2}",
                ms(r.grpc_mesh),
                r.floor_ratio()
            );
            let samples = |v: &[Duration]| {
                v.iter()
                    .map(|d| format!("{:.1}", ms(*d)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            println!("  samples daemons ms: [{}]", samples(&r.daemon_samples));
            println!("  samples bare ms   : [{}]", samples(&r.baseline_samples));
            println!("  samples mesh ms   : [{}]", samples(&r.mesh_samples));
            Ok(())
        }
        BenchCommand::Imports {
            nodes,
            gpus_per_node,
            rounds,
        } => imports::bench_imports(*nodes, *gpus_per_node, *rounds),
        BenchCommand::All(args) => all(args),
        BenchCommand::RpcServer { addr, config } => rpc::serve(*addr, config.as_deref()),
        BenchCommand::MeshProbe {
            index,
            addrs,
            config,
        } => mesh::mesh_probe(*index, addrs, config.as_deref()),
    }
}

fn all(args: &AllArgs) -> Result<()> {
    let binary = this_binary()?;
    let scenarios = args.only.as_ref().map_or(ALL.to_vec(), |s| s.0.clone());
    let rounds = args.rounds as usize;
    let window = Duration::from_secs(args.window);
    let started = SystemTime::now();
    let machine_before = machine();
    let clock = Instant::now();
    let mut entries = Vec::new();
    for sc in scenarios {
        eprintln!("bench: {} ...", sc.label());
        let t = Instant::now();
        let got = sc.run(&binary, rounds, window);
        eprintln!(
            "bench: {} done in {:.1} s",
            sc.label(),
            t.elapsed().as_secs_f64()
        );
        entries.extend(got);
    }
    if args.json {
        let doc = report_json(&entries, started, clock.elapsed(), rounds, machine_before);
        println!("{doc}");
    } else if args.markdown {
        print!("{}", hb::render_markdown(&entries));
    } else {
        print!("{}", hb::render_table(&entries));
    }
    Ok(())
}

/// The `--json` document.
fn report_json(
    entries: &[BenchEntry],
    started: SystemTime,
    elapsed: Duration,
    rounds: usize,
    mut machine: Value,
) -> Value {
    // The load before and after: on a shared machine it says how much to trust the figures.
    machine["loadavg_end"] = json!(first_line("/proc/loadavg"));
    json!({
        "started": rfc3339(started),
        "elapsed_s": (elapsed.as_secs_f64() * 10.0).round() / 10.0,
        "rounds": rounds,
        "machine": machine,
        "entries": entries.iter().map(BenchEntry::to_json).collect::<Vec<_>>(),
    })
}

/// What the figures were measured on.
fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_mib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib / 1024);
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "cpu_model": model,
        "mem_total_mib": mem_mib,
        "kernel": first_line("/proc/sys/kernel/osrelease"),
        "loadavg_start": first_line("/proc/loadavg"),
        "scratch": scratch::root(),
    })
}

fn first_line(path: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().next().map(|l| l.trim().to_owned())
}

/// `YYYY-MM-DDTHH:MM:SSZ`.
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let (y, m, d) = openimex_core::timefmt::civil(days);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_expands_dedupes_and_keeps_order() {
        assert_eq!(
            parse_only("storm,import"),
            Ok(Selection(vec![Scenario::Storm, Scenario::Import]))
        );
        assert_eq!(
            parse_only("formation_72, formation ,storm,storm"),
            Ok(Selection(vec![
                Scenario::Formation(72),
                Scenario::Formation(18),
                Scenario::Formation(144),
                Scenario::Storm
            ]))
        );
        assert_eq!(
            parse_only("formation_3"),
            Ok(Selection(vec![Scenario::Formation(3)]))
        );
        for bad in [
            "",
            ",",
            "formation_1",
            "formation_145",
            "formation_x",
            "storms",
        ] {
            assert!(parse_only(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn only_knows_the_tls_scenarios() {
        assert_eq!(
            parse_only("formation_tls"),
            Ok(Selection(vec![
                Scenario::FormationTls(18),
                Scenario::FormationTls(72),
                Scenario::FormationTls(144)
            ]))
        );
        assert_eq!(
            parse_only("formation_2_tls,formation_2,import_tls,storm_tls,import_tls"),
            Ok(Selection(vec![
                Scenario::FormationTls(2),
                Scenario::Formation(2),
                Scenario::ImportTls,
                Scenario::StormTls
            ]))
        );
        // `formation` and `formation_tls` stand for different scenarios: both run.
        assert_eq!(
            parse_only("formation,formation_tls").map(|s| s.0.len()),
            Ok(6)
        );
        for bad in [
            "formation_1_tls",
            "formation_145_tls",
            "formation__tls",
            "formation_+18",
            "formation_18_tls_tls",
            "formation_tls_18",
            "tls",
            "import_tls2",
            "datapath_tls",
        ] {
            assert!(parse_only(bad).is_err(), "{bad:?} was accepted");
        }
        let e = parse_only("storm_tsl").expect_err("a typo");
        assert!(
            e.contains("formation_N_tls") && e.contains("storm_tls"),
            "{e}"
        );
    }

    #[test]
    fn every_plaintext_scenario_with_a_tls_twin_runs_just_before_it() {
        for (i, sc) in ALL.iter().enumerate() {
            let twin = match sc {
                Scenario::FormationTls(n) => Scenario::Formation(*n),
                Scenario::ImportTls => Scenario::Import,
                Scenario::StormTls => Scenario::Storm,
                _ => continue,
            };
            let at = ALL.iter().position(|s| *s == twin);
            assert!(at.is_some_and(|at| at < i), "{sc:?} runs before {twin:?}");
        }
    }

    #[test]
    fn labels_parse_back() {
        for sc in ALL {
            assert_eq!(parse_only(&sc.label()), Ok(Selection(vec![sc])));
        }
    }

    #[test]
    fn json_report_shape() {
        let entries = [
            BenchEntry::measured("storm", 2000.0, Unit::Ms, Some(1000.0), "d"),
            BenchEntry::failed("formation_144", Unit::Ms, "did not reach UP within 120 s"),
        ];
        let v = report_json(
            &entries,
            UNIX_EPOCH + Duration::from_secs(1_796_300_000),
            Duration::from_secs(75),
            3,
            machine(),
        );
        assert_eq!(v["started"], "2026-12-03T12:13:20Z");
        assert_eq!(v["rounds"], 3);
        assert!(v["machine"]["cpus"].as_u64().is_some_and(|n| n >= 1));
        assert!(v["machine"].get("loadavg_end").is_some());
        let e = &v["entries"];
        assert_eq!(e[0]["ratio"], 2.0);
        assert!(e[1]["value"].is_null());
        assert_eq!(e[1]["error"], "did not reach UP within 120 s");
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400 + 3661)),
            "2000-02-29T01:01:01Z"
        );
    }
}
