//! A cluster whose trays take their fabric probes from the domain's simulated Fabric Manager:
//! the spec built from a topology, and the FM's start, kill -9 and operator commands.

use std::process::Output;

use openimex_fabric::topology::preset;

use super::{Cluster, ClusterSpec};
use crate::HarnessError;
use crate::fabric_manager::{FabricManager, FabricManagerSpec};
use crate::gpu::GpuSpec;

impl ClusterSpec {
    /// One node per compute tray of the FM's topology (node `i` = the tray at slot `i`), each
    /// with that tray's GPUs (the first tray's count: the presets' trays are alike), drivers
    /// started with `--fabric-manager`, and the FM started first. Lower `nodes` afterwards to
    /// run the first trays only; the FM still serves the whole domain.
    pub fn from_topology(
        fm: FabricManagerSpec,
        binary: impl Into<std::path::PathBuf>,
    ) -> Result<Self, HarnessError> {
        let topo = match &fm.file {
            Some(f) => openimex_fabric::file::load(f),
            None => preset(&fm.topology),
        }
        .map_err(|e| HarnessError::parse("topology", e.to_string(), &fm.topology))?;
        let gpus = topo.compute_trays().next().map_or(4, |t| t.tray.gpus);
        let mut spec = Self::new(topo.compute_tray_count(), binary).with_gpus(GpuSpec {
            gpus_per_node: gpus,
            ..GpuSpec::default()
        });
        spec.fabric_manager = Some(fm);
        Ok(spec)
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
            FabricManagerSpec::preset(openimex_fabric::topology::DEFAULT_PRESET)
        });
        let log = self.base_dir().join("fabric-manager.log");
        self.fm = Some(FabricManager::start(
            &self.spec.binary,
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

    /// Runs `openimex fabric ARGS` against this cluster's Fabric Manager's control socket.
    pub fn fabric(&self, args: &[&str]) -> Result<Output, HarnessError> {
        match &self.fm {
            Some(fm) => fm.command(args),
            None => FabricManager::command_at(&self.spec.binary, &self.fabric_dir(), args),
        }
    }
}
