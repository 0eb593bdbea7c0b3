//! The demo's NVLink domain: its topology (a preset or a topology file), its partitions, and
//! the cluster started from it (the simulated Fabric Manager first, then one GPU driver with
//! `--fabric-manager` and one IMEX daemon per compute tray), ready for applications once every
//! GPU's fabric probe has completed with the clique its partition gives it. The bench starts
//! its topology clusters through [`wait_probes`] too.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use openimex::UsageError;
use openimex_client::Context;
use openimex_fabric_manager::partition::{Layout, split};
use openimex_fabric_manager::topology::{MAX_GPUS_PER_TRAY, preset};
use openimex_fabric_manager::{FabricError, Topology};
use openimex_harness::{Cluster, ClusterSpec, FabricManagerSpec, ScratchDir};
use openimex_simproto::probe::ProbeState;

/// How long every GPU's probe may take to complete once the trays are up.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// The layout the demo runs: the topology, its partitions, and how many of its trays run.
pub(crate) struct Domain {
    /// The whole topology (the FM serves all of it).
    pub(crate) topo: Topology,
    /// Its partitions (split into K of whole trays, in slot order).
    pub(crate) layout: Layout,
    /// The topology file, when not a preset.
    file: Option<PathBuf>,
    /// Holds the rewritten topology file of `--gpus-per-node` while the FM runs.
    _rewritten: Option<ScratchDir>,
    /// Compute trays that run (the first ones, in slot order).
    pub(crate) trays: usize,
}

impl Domain {
    /// The preset `name` or the file `file`, every compute tray with `gpus` GPUs when given,
    /// split into `partitions`, running its first `nodes` trays (all by default).
    pub(crate) fn load(
        name: &str,
        file: Option<&Path>,
        gpus: Option<u32>,
        partitions: usize,
        nodes: Option<usize>,
    ) -> Result<Self> {
        let mut topo = match file {
            Some(f) => openimex_fabric_manager::file::load(f).map_err(|e| match e {
                FabricError::Io { path, source } => anyhow!(
                    "--topology-file {}: cannot read it: {source}; give an existing, readable \
                     topology file (format in docs/lab/fabric.md, \"NVLink topologies\")",
                    path.display()
                ),
                e => e.into(),
            })?,
            None => preset(name).map_err(|e| match e {
                FabricError::UnknownPreset { name, known } => anyhow!(UsageError(format!(
                    "--topology {name}: no such preset; use one of {known}, or \
                     --topology-file FILE for a layout of your own (format in docs/lab/fabric.md, \
                     \"NVLink topologies\")"
                ))),
                e => e.into(),
            })?,
        };
        let mut file = file.map(Path::to_path_buf);
        let mut rewritten = None;
        if let Some(g) = gpus {
            if g == 0 || g > MAX_GPUS_PER_TRAY {
                bail!("--gpus-per-node {g}: a compute tray has 1 to {MAX_GPUS_PER_TRAY} GPUs");
            }
            // The FM serves the layout from a file: the same racks and trays, g GPUs each.
            for tray in topo
                .racks
                .iter_mut()
                .flat_map(|r| r.compute_trays.iter_mut())
            {
                tray.gpus = g;
            }
            let dir = ScratchDir::new("demo-topology")?;
            let path = dir.path().join(format!("{}.topo", topo.name));
            std::fs::write(&path, openimex_fabric_manager::file::print(&topo))
                .with_context(|| format!("cannot write {}", path.display()))?;
            // Parsing it back checks the count (1 to 64 GPUs per tray) with the file's errors.
            topo = openimex_fabric_manager::file::load(&path).context("--gpus-per-node")?;
            file = Some(path);
            rewritten = Some(dir);
        }
        let layout = split(&topo, partitions)?;
        let all = topo.compute_tray_count();
        let trays = nodes.unwrap_or(all);
        if trays == 0 || trays > all {
            return Err(UsageError(format!(
                "--nodes {trays}: topology {} has {all} compute trays; run 1 to {all} of them \
                 (--nodes runs the first N in slot order)",
                topo.name
            ))
            .into());
        }
        check_partitions_run(&topo, &layout, trays)?;
        Ok(Self {
            topo,
            layout,
            file,
            _rewritten: rewritten,
            trays,
        })
    }

    /// The cluster spec: the FM serving the whole topology with its partitions, the first
    /// [`Domain::trays`] trays as nodes. Refuses trays with different GPU counts.
    pub(crate) fn spec(&self, binary: PathBuf) -> Result<ClusterSpec> {
        let fm = FabricManagerSpec {
            topology: match &self.file {
                Some(f) => f.display().to_string(),
                None => self.topo.name.clone(),
            },
            file: self.file.clone(),
            partitions: self.layout.partitions.len(),
        };
        ClusterSpec::first_trays(fm, self.trays, binary).context("cannot run this topology's trays")
    }

    /// The cliqueId the FM gives the GPUs of node `node` (the tray at that slot).
    pub(crate) fn clique_of_node(&self, node: usize) -> u32 {
        self.layout
            .clique_of(u16::try_from(node).unwrap_or(u16::MAX))
    }

    /// One line for the text output: the topology's racks, trays, switch trays and GPUs, what
    /// runs of it, and its partitions.
    pub(crate) fn describe(&self, gpus_per_tray: u32) -> String {
        let t = &self.topo;
        let all = t.compute_tray_count();
        let running = if self.trays == all {
            String::new()
        } else {
            format!(" (the first {} running)", self.trays)
        };
        format!(
            "topology {}: {} rack{}, {all} compute trays x {gpus_per_tray} GPUs{running}, {} \
             switch trays, {} GPUs in all; {} partition{}",
            t.name,
            t.racks.len(),
            if t.racks.len() == 1 { "" } else { "s" },
            t.switch_tray_count(),
            t.gpu_count(),
            self.layout.partitions.len(),
            if self.layout.partitions.len() == 1 {
                ""
            } else {
                "s"
            },
        )
    }
}

/// Refuses partitions that no running tray is in: the partitions split the whole topology,
/// and `--nodes` runs only its first trays, so with too few of them some cliques have no GPU
/// running and the imports across cliques the demo counts would be missing (`--nodes 2
/// --partitions 3` would report "0 of 0" refused).
fn check_partitions_run(topo: &Topology, layout: &Layout, trays: usize) -> Result<()> {
    let k = layout.partitions.len();
    let idle = layout
        .partitions
        .iter()
        .filter(|p| p.trays.iter().all(|&slot| usize::from(slot) >= trays))
        .count();
    if k < 2 || idle == 0 {
        return Ok(());
    }
    let all = topo.compute_tray_count();
    // Trays are partitioned in slot order: the last partition starts last.
    let need = layout
        .partitions
        .iter()
        .filter_map(|p| p.trays.iter().min())
        .max()
        .map_or(all, |&slot| usize::from(slot) + 1);
    // The most partitions whose every one keeps a running tray (1: no split at all).
    let most = (1..k)
        .rev()
        .find(|&j| {
            split(topo, j).is_ok_and(|l| {
                l.partitions
                    .iter()
                    .all(|p| p.trays.iter().any(|&slot| usize::from(slot) < trays))
            })
        })
        .unwrap_or(1);
    let fewer = if most > 1 {
        format!("ask for --partitions {most} or fewer")
    } else {
        "drop --partitions".to_string()
    };
    Err(UsageError(format!(
        "--nodes {trays} --partitions {k}: the {k} partitions split all {all} compute trays of \
         {name} in slot order, and the first {trays} trays that run leave {idle} of them with no \
         GPU running, so the imports across cliques would not all be tried; run at least {need} \
         trays (--nodes {need}, or leave --nodes out to run all {all}), or {fewer}",
        name = topo.name
    ))
    .into())
}

/// Waits until every GPU of the cluster's first `nodes` nodes has its fabric probe COMPLETE
/// from the FM with the clique `want(node)` (fabric memory is refused until then, as on the
/// real driver).
pub(crate) fn wait_probes(
    cluster: &Cluster,
    nodes: usize,
    gpus_per_node: u32,
    want: impl Fn(usize) -> u32,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    for node in 0..nodes {
        let dir = cluster.node(node).dir();
        let ctx = Context::open(dir)
            .with_context(|| format!("cannot open node {node}'s driver to read its probes"))?;
        for gpu in 0..gpus_per_node {
            loop {
                let info = ctx
                    .gpu_fabric_info(gpu)
                    .with_context(|| format!("node {node} GPU {gpu}: fabric probe"))?;
                if info.state == ProbeState::Complete && info.clique_id == want(node) {
                    break;
                }
                if Instant::now() >= deadline {
                    bail!(
                        "node {node} GPU {gpu}: fabric probe not complete with clique {} after \
                         {timeout:?} (last: state {:?}, clique {}); is the Fabric Manager \
                         running? its log is fabric-manager.log in the cluster directory \
                         (--keep keeps it)",
                        want(node),
                        info.state,
                        info.clique_id
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    Ok(())
}

/// Ordered (importer, exporter) pairs of GPUs in different cliques.
pub(crate) fn cross_clique_pairs(cliques: &[u32]) -> usize {
    cliques
        .iter()
        .map(|a| cliques.iter().filter(|b| *b != a).count())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_give_whole_trays_their_cliques_and_nodes_runs_the_first_trays() {
        let d = Domain::load("nvl72", None, None, 2, Some(10)).expect("nvl72 in 2");
        assert_eq!(d.trays, 10);
        // 2 x 9 trays: slots 0..9 in clique 1, 9.. in clique 2.
        assert_eq!(d.clique_of_node(0), 1);
        assert_eq!(d.clique_of_node(8), 1);
        assert_eq!(d.clique_of_node(9), 2);
        let line = d.describe(4);
        assert!(
            line.contains("nvl72") && line.contains("first 10 running"),
            "{line}"
        );
        assert!(
            line.contains("2 partitions") && line.contains("72 GPUs"),
            "{line}"
        );
    }

    #[test]
    fn bad_sizes_are_refused_with_the_limits() {
        let e = Domain::load("nvl36", None, None, 1, Some(10))
            .err()
            .expect("nvl36 has 9 trays");
        assert!(e.to_string().contains("has 9 compute trays"), "{e}");
        let e = Domain::load("nvl36", None, None, 10, None)
            .err()
            .expect("10 partitions of 9 trays");
        assert!(e.to_string().contains("ask for 1 to 9"), "{e}");
        let e = Domain::load("nvl36", None, Some(17), 1, None)
            .err()
            .expect("17 GPUs per tray");
        assert!(e.to_string().contains("1 to 16"), "{e}");
    }

    #[test]
    fn gpus_per_node_rewrites_every_tray_and_serves_it_from_a_file() {
        let d = Domain::load("nvl36x2", None, Some(2), 1, None).expect("nvl36x2, 2 GPUs");
        assert_eq!(d.topo.name, "nvl36x2");
        assert_eq!(d.topo.gpu_count(), 36);
        let spec = d.spec(PathBuf::from("openimex")).expect("spec");
        assert_eq!(spec.nodes, 18);
        assert_eq!(spec.gpus.map(|g| g.gpus_per_node), Some(2));
        let fm = spec.fabric_manager.expect("an FM");
        let file = fm.file.expect("served from the rewritten file");
        assert!(
            file.exists(),
            "{} exists while the domain lives",
            file.display()
        );
    }

    #[test]
    fn partitions_without_a_running_tray_are_a_usage_error() {
        let e = Domain::load("nvl72", None, None, 3, Some(2))
            .err()
            .expect("3 partitions of 6 trays, 2 running");
        assert!(e.is::<UsageError>(), "exit status 2: {e}");
        let msg = e.to_string();
        for words in [
            "--nodes 2 --partitions 3",
            "--nodes 13",
            "drop --partitions",
        ] {
            assert!(msg.contains(words), "{words:?} in {msg}");
        }
        let e = Domain::load("nvl72", None, None, 3, Some(10))
            .err()
            .expect("3 partitions of 6 trays, 10 running");
        assert!(e.to_string().contains("--partitions 2 or fewer"), "{e}");
        // Every partition with a running tray: accepted.
        let d = Domain::load("nvl72", None, None, 3, Some(13)).expect("13 trays in 3");
        assert_eq!(d.clique_of_node(12), d.layout.partitions[2].clique_id);
        Domain::load("nvl72", None, None, 1, Some(2)).expect("one partition");
    }

    #[test]
    fn an_unknown_preset_names_the_demos_flags() {
        let e = Domain::load("nvl99", None, None, 1, None)
            .err()
            .expect("no such preset");
        assert!(e.is::<UsageError>(), "exit status 2: {e}");
        let msg = e.to_string();
        assert!(
            msg.contains("--topology nvl99")
                && msg.contains("nvl72")
                && msg.contains("--topology-file FILE")
                && !msg.contains(" --file"),
            "{msg}"
        );
    }

    #[test]
    fn cross_clique_pairs_count_ordered_pairs() {
        assert_eq!(cross_clique_pairs(&[1, 1, 2, 2]), 8);
        assert_eq!(cross_clique_pairs(&[1, 1, 1]), 0);
        assert_eq!(cross_clique_pairs(&[1, 2, 3]), 6);
    }
}
