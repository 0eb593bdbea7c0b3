//! The set-up every mode of the demo shares: the domain the flags ask for and its cluster spec
//! ([`prepare`]), started and waited for until UP with every GPU's probe complete
//! ([`start_domain`]); and what every mode checks or reports at the end: the drivers' counts
//! back to zero ([`leak_check`]), rates ([`gbps`]) and the local memcpy baseline
//! ([`local_memcpy_gbps`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use openimex_client::Context;
use openimex_harness::Cluster;

use super::args::DemoArgs;
use super::domain::{Domain, PROBE_TIMEOUT, wait_probes};

/// The domain the flags ask for, its cluster spec (HBM sized for the buffers), and the buffer
/// size rounded up to the driver's 2 MiB.
pub(super) struct Prepared {
    pub(super) domain: Domain,
    pub(super) spec: openimex_harness::ClusterSpec,
    pub(super) nodes: usize,
    pub(super) gpus_per_node: u32,
    pub(super) buffer: u64,
}

pub(super) fn prepare(args: &DemoArgs) -> Result<Prepared> {
    let domain = Domain::load(
        &args.topology,
        args.topology_file.as_deref(),
        args.gpus_per_node,
        args.partitions,
        args.nodes,
    )?;
    let binary = std::env::current_exe().context("cannot find this binary's path")?;
    let mut spec = domain.spec(binary)?;
    let nodes = spec.nodes;
    let gpus_per_node = spec.gpus.map_or(0, |g| g.gpus_per_node);
    if nodes * (gpus_per_node as usize) < 2 {
        bail!("the demo needs at least 2 GPUs; run more trays (--nodes)");
    }
    let buffer = args.buffer_size.max(1).div_ceil(2 << 20) * (2 << 20);
    if let Some(g) = spec.gpus.as_mut() {
        g.hbm_mib = (buffer >> 20).max(2) * 2 + 64;
    }
    spec.keep_dir = args.keep;
    Ok(Prepared {
        domain,
        spec,
        nodes,
        gpus_per_node,
        buffer,
    })
}

/// Starts the cluster (the FM first) and waits for the IMEX domain to be UP and every GPU's
/// probe to be complete with its clique: the cluster, the time to UP, the time to probed.
pub(super) fn start_domain(
    domain: &Domain,
    spec: openimex_harness::ClusterSpec,
    say: &dyn Fn(&str),
) -> Result<(Cluster, Duration, Duration)> {
    start_domain_with(domain, spec, say, &|_| Ok(()))
}

/// As [`start_domain`], with `configure` given the cluster's files before anything starts
/// (e.g. a config key of each node's own, as `--jobs` gives each daemon its jobs directory).
pub(super) fn start_domain_with(
    domain: &Domain,
    spec: openimex_harness::ClusterSpec,
    say: &dyn Fn(&str),
    configure: &dyn Fn(&mut Cluster) -> Result<()>,
) -> Result<(Cluster, Duration, Duration)> {
    let nodes = spec.nodes;
    let gpus_per_node = spec.gpus.map_or(0, |g| g.gpus_per_node);
    say(&format!(
        "Starting a simulated NVLink domain, {}: the Fabric Manager, then one GPU driver and one \
         IMEX daemon per tray...",
        domain.describe(gpus_per_node)
    ));
    let start = Instant::now();
    // What `Cluster::start` does, with the node files configured in between.
    let mut cluster = Cluster::prepare(spec).context("cannot prepare the nodes")?;
    configure(&mut cluster)?;
    if cluster.spec().fabric_manager.is_some() {
        cluster
            .start_fabric_manager()
            .context("cannot start the Fabric Manager")?;
    }
    for i in 0..cluster.len() {
        cluster
            .start_node(i)
            .with_context(|| format!("cannot start node {i}"))?;
    }
    cluster
        .wait_up(0, Duration::from_secs(120))
        .context("the IMEX domain did not come UP")?;
    let formation = start.elapsed();
    wait_probes(
        &cluster,
        nodes,
        gpus_per_node,
        |n| domain.clique_of_node(n),
        PROBE_TIMEOUT,
    )?;
    Ok((cluster, formation, start.elapsed()))
}

/// Every driver's counts must be back to zero once the applications released everything
/// (allocations, exports, imports and multicast objects and bindings): the references left
/// after a grace of 10 s, and one note per node that kept some.
pub(crate) fn leak_check(node_dirs: &[PathBuf]) -> Result<(u64, Vec<String>)> {
    let mut leaked = 0u64;
    let mut leak_notes = Vec::new();
    for (i, dir) in node_dirs.iter().enumerate() {
        let ctx = Context::open(dir)
            .with_context(|| format!("cannot open node {i}'s driver for the leak check"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = ctx
                .stats()
                .with_context(|| format!("node {i} driver stats"))?;
            let refs = (s.allocations
                + s.exports
                + s.daemon_export_refs
                + s.import_descriptors
                + s.import_refs
                + s.pending_unimports
                + s.multicast_objects
                + s.multicast_bindings) as u64;
            if refs == 0 || Instant::now() >= deadline {
                if refs > 0 {
                    leak_notes.push(format!("node {i}: {s:?}"));
                }
                leaked += refs;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok((leaked, leak_notes))
}

/// `bytes` per `nanos`, in GB/s (0 for no time).
pub(super) fn gbps(bytes: u64, nanos: u64) -> f64 {
    if nanos == 0 {
        0.0
    } else {
        bytes as f64 / nanos as f64
    }
}

/// The baseline: plain memcpy between two private buffers of the same size, in this run.
pub(super) fn local_memcpy_gbps(size: u64) -> f64 {
    let n = usize::try_from(size).unwrap_or(2 << 20);
    let src = vec![0x5au8; n];
    let mut dst = vec![0u8; n];
    let rounds = 64;
    let t = Instant::now();
    for _ in 0..rounds {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    gbps(
        size * rounds,
        u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX),
    )
}
