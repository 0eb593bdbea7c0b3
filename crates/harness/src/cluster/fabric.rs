//! A cluster whose trays take their fabric probes from the domain's simulated Fabric Manager:
//! the spec built from a topology, and the FM's start, kill -9 and operator commands.

use std::process::Output;

use openimex_fabric_manager::Topology;
use openimex_fabric_manager::topology::preset;

use super::{Cluster, ClusterSpec};
use crate::HarnessError;
use crate::fabric_manager::{FabricManager, FabricManagerSpec};
use crate::gpu::GpuSpec;

impl ClusterSpec {
    /// One node per compute tray of the FM's topology (node `i` = the tray at slot `i`), each
    /// with that tray's GPUs, drivers started with `--fabric-manager`, and the FM started
    /// first. Lower `nodes` afterwards to run the first trays only (or use
    /// [`ClusterSpec::first_trays`]); the FM still serves the whole domain. Every node of a
    /// cluster runs the same GPU count, so a topology whose compute trays differ in GPUs is
    /// refused.
    pub fn from_topology(
        fm: FabricManagerSpec,
        binary: impl Into<std::path::PathBuf>,
    ) -> Result<Self, HarnessError> {
        let topo = match &fm.file {
            Some(f) => openimex_fabric_manager::file::load(f),
            None => preset(&fm.topology),
        }
        .map_err(|e| HarnessError::parse("topology", e.to_string(), &fm.topology))?;
        let gpus = uniform_gpus(&topo)
            .map_err(|why| HarnessError::parse("topology", why, &fm.topology))?;
        let mut spec = Self::new(topo.compute_tray_count(), binary).with_gpus(GpuSpec {
            gpus_per_node: gpus,
            ..GpuSpec::default()
        });
        spec.fabric_manager = Some(fm);
        Ok(spec)
    }

    /// [`ClusterSpec::from_topology`] running only the first `trays` compute trays; refused
    /// when the topology has fewer.
    pub fn first_trays(
        fm: FabricManagerSpec,
        trays: usize,
        binary: impl Into<std::path::PathBuf>,
    ) -> Result<Self, HarnessError> {
        let name = fm.topology.clone();
        let mut spec = Self::from_topology(fm, binary)?;
        if trays == 0 || trays > spec.nodes {
            return Err(HarnessError::parse(
                "topology",
                format!(
                    "{trays} trays asked of a topology of {} compute trays: ask for 1 to {}, or \
                     pick a larger topology",
                    spec.nodes, spec.nodes
                ),
                &name,
            ));
        }
        spec.nodes = trays;
        Ok(spec)
    }
}

/// The GPUs per compute tray of `topo`, the same on every tray; else which trays differ and
/// what to do.
fn uniform_gpus(topo: &Topology) -> Result<u32, String> {
    let mut trays = topo.compute_trays();
    let Some(first) = trays.next() else {
        return Err("the topology has no compute tray: declare at least one".into());
    };
    match trays.find(|t| t.tray.gpus != first.tray.gpus) {
        None => Ok(first.tray.gpus),
        Some(other) => Err(format!(
            "compute trays with different GPU counts ({} has {}, {} has {}): every node of a \
             test cluster runs the same GPU count; give every compute tray the same gpus=",
            first.tray.name, first.tray.gpus, other.tray.name, other.tray.gpus
        )),
    }
}

impl Cluster {
    /// Starts the Fabric Manager of the spec (or restarts it after
    /// [`Cluster::kill_fabric_manager`]), logging to `<cluster dir>/fabric-manager.log`.
    pub fn start_fabric_manager(&mut self) -> Result<(), HarnessError> {
        if let Some(fm) = self.fm.as_mut() {
            return fm.restart();
        }
        let spec = self.spec.fabric_manager.clone().unwrap_or_else(|| {
            FabricManagerSpec::preset(openimex_fabric_manager::topology::DEFAULT_PRESET)
        });
        let log = self.base_dir().join("fabric-manager.log");
        self.fm = Some(FabricManager::start(
            &self.spec.lab_binary,
            &self.fabric_dir(),
            &log,
            &spec,
        )?);
        Ok(())
    }

    /// SIGKILLs the Fabric Manager; the drivers keep their probes and reconnect once it is
    /// started again.
    pub fn kill_fabric_manager(&mut self) {
        if let Some(fm) = self.fm.as_mut() {
            fm.kill9();
        }
    }

    /// The Fabric Manager, once started.
    pub fn fabric_manager(&self) -> Option<&FabricManager> {
        self.fm.as_ref()
    }

    /// The Fabric Manager, to stop or kill it.
    pub fn fabric_manager_mut(&mut self) -> Option<&mut FabricManager> {
        self.fm.as_mut()
    }

    /// Runs `openimex-lab fabric ARGS` against this cluster's Fabric Manager's control socket.
    pub fn fabric(&self, args: &[&str]) -> Result<Output, HarnessError> {
        match &self.fm {
            Some(fm) => fm.command(args),
            None => FabricManager::command_at(&self.spec.lab_binary, &self.fabric_dir(), args),
        }
    }
}
