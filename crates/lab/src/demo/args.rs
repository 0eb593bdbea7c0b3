//! `openimex-lab demo`'s flags: the topology and its size, the mode (`--chaos`,
//! `--allreduce`, `--jobs`, or the all-to-all by default) and the options of each.

use std::path::PathBuf;

use clap::Args;

/// `openimex-lab demo` flags.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Compute trays (nodes) that run: the first N of the topology, in slot order [default:
    /// all of them; 4 with --chaos]. The Fabric Manager still serves the whole topology.
    #[arg(long)]
    pub(super) nodes: Option<usize>,
    /// GPUs per tray [default: the topology's; 2 with --chaos]. Every compute tray of the
    /// topology gets this many (the Fabric Manager serves the layout so changed).
    #[arg(long)]
    pub(super) gpus_per_node: Option<u32>,
    /// The NVLink domain: a preset, nvl72 (default; 1 rack, 18 trays), nvl36 (1 rack, 9
    /// trays), nvl36x2 (2 racks of 9 trays), nvl576 (8 racks, 144 trays).
    #[arg(long, value_name = "NAME", default_value = openimex_fabric_manager::topology::DEFAULT_PRESET,
          conflicts_with_all = ["topology_file", "chaos"])]
    pub(super) topology: String,
    /// A topology file instead of a preset (format in docs/lab/fabric.md, "NVLink topologies"; every
    /// compute tray must have the same GPU count).
    #[arg(long, value_name = "FILE", conflicts_with = "chaos")]
    pub(super) topology_file: Option<PathBuf>,
    /// Split the domain into K partitions (cliques) of whole trays, in slot order: imports
    /// across cliques must be refused at map, imports within a clique verify.
    #[arg(long, value_name = "K", default_value_t = 1, conflicts_with = "chaos")]
    pub(super) partitions: usize,
    /// Run the all-to-all workload as application processes while seeded random faults hit
    /// it (kill -9 of apps, daemons and GPU drivers, hung and flapping daemons), then check
    /// that nothing read freed memory, every byte read was the one written, no reference
    /// leaked and the domain recovered. Default cluster: 4 nodes x 2 GPUs. Exits non-zero
    /// when an invariant fails.
    #[arg(long)]
    pub(super) chaos: bool,
    /// Run an NVLS-style all-reduce instead: one multicast object over every GPU of the
    /// domain (the prime on tray 0, imported on every other tray), each GPU's buffer bound to
    /// it; each GPU load-reduces its slice over all members and stores the sum back to all;
    /// then every buffer must hold the sums. Reports bandwidth next to a local memcpy.
    #[arg(long, conflicts_with = "chaos")]
    pub(super) allreduce: bool,
    /// Run K concurrent jobs (issue 31) over overlapping windows of consecutive trays: job j
    /// takes trays b(j)..=b(j+1), b(j) = floor(j(N-1)/K) for N trays running, so neighbouring
    /// jobs share one tray (which runs both); job j owns channel j+1. Each job is defined by
    /// job files in its members' jobs directories (OPENIMEX_JOBS_DIR), runs the all-to-all
    /// among its GPUs, and every import across jobs must be refused. 1 to N-1 jobs.
    #[arg(long, value_name = "K")]
    pub(super) jobs: Option<usize>,
    /// With --chaos: how long faults are injected, seconds.
    #[arg(long, default_value_t = 60, requires = "chaos")]
    pub(super) seconds: u64,
    /// With --chaos: seed of every random choice (printed; default: random).
    #[arg(long, requires = "chaos")]
    pub(super) seed: Option<u64>,
    /// With --chaos: the fault kinds to draw from, comma-separated [default: the kills and
    /// restarts: kill-exporter-app, kill-importer-app, kill-exporter-daemon,
    /// kill-importer-daemon, kill-exporter-driver, flap, restart-node; also hang-below-grace,
    /// hang-past-grace, partition-below-grace, partition-past-grace, partition-heal-in-margin
    /// (partitions need root)].
    #[arg(long, value_delimiter = ',', requires = "chaos", value_parser = parse_fault)]
    pub(super) faults: Vec<openimex_harness::chaos::FaultKind>,
    /// Bytes each GPU exports (K/M/G suffixes; rounded up to 2 MiB by the driver).
    #[arg(long, default_value = "2M", value_parser = parse_size)]
    pub(super) buffer_size: u64,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub(super) json: bool,
    /// Keep the nodes' directories (configs, logs) after the demo.
    #[arg(long)]
    pub(super) keep: bool,
    /// Where to draw the domain (`ctl -N --svg`) while every import is held: trays, states,
    /// the link matrix and node 0's imports [default: openimex-domain.svg in the current
    /// directory; none with --json unless given].
    #[arg(long)]
    pub(super) svg: Option<PathBuf>,
}

fn parse_fault(s: &str) -> Result<openimex_harness::chaos::FaultKind, String> {
    use openimex_harness::chaos::FaultKind;
    FaultKind::from_name(s.trim()).ok_or_else(|| {
        let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown fault kind {s:?} (one of {})", names.join(", "))
    })
}

fn parse_size(s: &str) -> Result<u64, String> {
    openimex_client::cli::parse_size(s)
}
