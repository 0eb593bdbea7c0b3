//! The simulated Fabric Manager (FM) as a synchronous state machine: no sockets, no threads.
//!
//! It owns the domain's topology, partition layout and faults, knows which trays' drivers are
//! attached, and turns each input into the in-band messages to send, as `(slot, FromFm)` pairs
//! (docs/reference/driver-interface.md §5, §1.6 step 5):
//! - a tray's driver attaches → one probe answer per GPU, or a refusal;
//! - an operator command (partitions, switch trays, links, route updates, access-timeout
//!   recovery) → a probe update for every attached GPU whose answer changed, and the list of
//!   changes for the operator; a tray attaching later gets the current answer;
//! - a multicast team request → one team answer per member tray (the `mcast` module).
//!
//! The process around it (`server`) only moves these messages between sockets.

mod mcast;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use openimex_simproto::handle::encode_hex;
use openimex_simproto::inband::FromFm;
use openimex_simproto::probe as wire;
use serde::{Deserialize, Serialize};

use crate::FabricError;
use crate::answer::answers;
use crate::health::Faults;
use crate::partition::Layout;
use crate::probe::{HealthField, HealthSummary, ProbeInfo};
use crate::{GpuId, Topology};

pub use mcast::{MC_BASE, MC_GRANULARITY};

/// The fabricPartitionId a GPU outside every partition reports (the in-band field is a u16
/// and partition ids count up from 0, so the top value is never a real one).
pub const NO_PARTITION: u16 = u16::MAX;

/// Messages to send: the tray's slot and the message for its driver.
pub type Outbox = Vec<(u16, FromFm)>;

/// An operator's command ([`Manager::apply`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// Replace the layout by `k` partitions of consecutive trays.
    Split {
        /// Partitions wanted.
        k: usize,
    },
    /// A new partition of these trays (names or slots), taken from their partitions.
    Create {
        /// Compute trays.
        trays: Vec<String>,
    },
    /// Delete a partition: its trays belong to none.
    Delete {
        /// Partition id.
        partition: u16,
    },
    /// Move a tray (name or slot) into a partition.
    Move {
        /// Compute tray.
        tray: String,
        /// Partition id.
        partition: u16,
    },
    /// A switch tray goes down or comes back.
    SwitchTray {
        /// Its name.
        name: String,
        /// Up (true) or down.
        up: bool,
    },
    /// One GPU's NVLink to one switch tray fails or is repaired.
    GpuLink {
        /// Compute tray (name or slot).
        tray: String,
        /// GPU index on it.
        gpu: u32,
        /// The switch tray at the other end.
        switch_tray: String,
        /// Repaired (true) or failed.
        up: bool,
    },
    /// An OSFP link between racks fails or is repaired.
    OsfpLink {
        /// Index in the topology's links.
        index: usize,
        /// Repaired (true) or failed.
        up: bool,
    },
    /// The FM starts or ends reprogramming routes (ROUTE_UPDATE on every GPU while it lasts).
    RouteUpdate {
        /// Started (true) or ended.
        on: bool,
    },
    /// One GPU enters or leaves NVLink access-timeout recovery.
    AccessTimeoutRecovery {
        /// Compute tray (name or slot).
        tray: String,
        /// GPU index on it.
        gpu: u32,
        /// Entered (true) or left.
        on: bool,
    },
}

/// One GPU whose answer a command changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuChange {
    /// Tray slot.
    pub slot: u16,
    /// GPU index.
    pub gpu: u32,
    /// cliqueId before and after.
    pub clique: (u32, u32),
    /// healthSummary before and after (its name).
    pub health: (String, String),
    /// Health fields TRUE after the change.
    pub flags: Vec<String>,
    /// Whether the tray's driver is attached (got the update now) or will get it on attach.
    pub attached: bool,
}

/// A tray in the status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrayStatus {
    /// Slot.
    pub slot: u16,
    /// Name.
    pub name: String,
    /// Rack name.
    pub rack: String,
    /// GPUs.
    pub gpus: u32,
    /// Whether its driver is attached.
    pub attached: bool,
}

/// A GPU in the status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// Tray slot.
    pub slot: u16,
    /// GPU index.
    pub gpu: u32,
    /// Partition, if any.
    pub partition: Option<u16>,
    /// cliqueId.
    pub clique_id: u32,
    /// healthSummary name.
    pub health: String,
    /// The raw health mask.
    pub health_mask: u32,
    /// Health fields that are TRUE.
    pub flags: Vec<String>,
}

/// A partition in the status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionStatus {
    /// Id.
    pub id: u16,
    /// cliqueId of its GPUs.
    pub clique_id: u32,
    /// Tray slots.
    pub trays: Vec<u16>,
}

/// A switch tray in the status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchStatus {
    /// Name.
    pub name: String,
    /// Rack name.
    pub rack: String,
    /// Up or down.
    pub up: bool,
}

/// What `openimex-lab fabric status` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The domain's name (its clusterUuid derives from it).
    pub domain: String,
    /// The clusterUuid, 32 hex digits.
    pub cluster_uuid: String,
    /// Compute trays.
    pub trays: Vec<TrayStatus>,
    /// Partitions.
    pub partitions: Vec<PartitionStatus>,
    /// Switch trays.
    pub switch_trays: Vec<SwitchStatus>,
    /// Failed OSFP links, by index.
    pub osfp_links_down: Vec<usize>,
    /// Failed GPU links: (slot, gpu, switch tray).
    pub gpu_links_down: Vec<(u16, u32, String)>,
    /// Routes being reprogrammed.
    pub route_update: bool,
    /// Every GPU.
    pub gpus: Vec<GpuStatus>,
    /// Live multicast teams.
    pub mc_teams: usize,
}

/// The Fabric Manager of one NVLink domain.
#[derive(Debug)]
pub struct Manager {
    topo: Topology,
    layout: Layout,
    faults: Faults,
    /// Every GPU's current answer, as the driver receives it.
    answers: BTreeMap<GpuId, wire::ProbeInfo>,
    /// Slots whose driver is attached.
    attached: BTreeSet<u16>,
    teams: mcast::Teams,
}

/// The driver's form of an answer: clusterUuid in hex, the partition's u16, the mask's bits.
fn to_wire(p: &ProbeInfo) -> wire::ProbeInfo {
    wire::ProbeInfo {
        cluster_uuid: encode_hex(&p.cluster_uuid),
        partition_id: p.partition_id.unwrap_or(NO_PARTITION),
        clique_id: p.clique_id,
        fla_base: p.fla_base,
        fla_size: p.fla_range,
        caps: p.caps,
        health_mask: p.health_mask.0,
        // The FM does not change a GPU's NVLink bandwidth mode; every GPU runs at full.
        bw_mode: wire::BW_MODE_FULL,
        bw_mode_epoch: 0,
        health_summary: match p.health_summary {
            // The model reports every GPU's health; NOT_SUPPORTED cannot come out of it.
            HealthSummary::NotSupported | HealthSummary::Healthy => wire::HealthSummary::Healthy,
            HealthSummary::Unhealthy => wire::HealthSummary::Unhealthy,
            HealthSummary::LimitedCapacity => wire::HealthSummary::LimitedCapacity,
        },
    }
}

/// The names of the health fields that are TRUE in `mask`.
pub fn true_flags(mask: u32) -> Vec<String> {
    let mask = crate::probe::HealthMask(mask);
    HealthField::ALL
        .into_iter()
        .filter(|f| mask.is(*f))
        .map(|f| f.name().to_owned())
        .collect()
}

impl Manager {
    /// The FM of `topo` with `layout`, naming the domain `domain` (its clusterUuid derives from
    /// it), no faults, no tray attached.
    pub fn new(topo: Topology, domain: &str, layout: Layout) -> Self {
        let mut topo = topo;
        topo.name = domain.to_owned();
        let mut m = Self {
            topo,
            layout,
            faults: Faults::default(),
            answers: BTreeMap::new(),
            attached: BTreeSet::new(),
            teams: mcast::Teams::default(),
        };
        m.answers = m.compute();
        m
    }

    fn compute(&self) -> BTreeMap<GpuId, wire::ProbeInfo> {
        answers(&self.topo, &self.layout, &self.faults)
            .iter()
            .map(|(g, p)| (*g, to_wire(p)))
            .collect()
    }

    /// The topology (named after the domain).
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// The current answer for `gpu`.
    pub fn answer(&self, gpu: GpuId) -> Option<&wire::ProbeInfo> {
        self.answers.get(&gpu)
    }

    /// Whether the driver of `slot` is attached.
    pub fn is_attached(&self, slot: u16) -> bool {
        self.attached.contains(&slot)
    }

    /// The driver of the tray at `slot`, with `gpus` GPUs, attached (GPU_PROBE_REQ of each):
    /// one probe answer per GPU, or the reason for refusing (no such tray, another GPU count,
    /// the slot already attached).
    pub fn attach(&mut self, slot: u16, gpus: u32) -> Result<Outbox, String> {
        let Some(tray) = self.topo.compute_trays().find(|t| t.slot == slot) else {
            return Err(format!(
                "the topology {} has no compute tray at slot {slot} (slots 0..{}); start the \
                 driver with a --slot the topology has",
                self.topo.name,
                self.topo.compute_tray_count()
            ));
        };
        if tray.tray.gpus != gpus {
            return Err(format!(
                "compute tray {} (slot {slot}) has {} GPUs in the topology, the driver has \
                 {gpus}; start the driver with --gpus {}",
                tray.tray.name, tray.tray.gpus, tray.tray.gpus
            ));
        }
        if !self.attached.insert(slot) {
            return Err(format!(
                "slot {slot} is already attached by another driver; one driver per compute tray"
            ));
        }
        Ok(self
            .answers
            .range(
                GpuId { slot, gpu: 0 }..=GpuId {
                    slot,
                    gpu: u32::MAX,
                },
            )
            .map(|(g, info)| {
                let probe = FromFm::Probe {
                    gpu: g.gpu,
                    info: info.clone(),
                };
                (slot, probe)
            })
            .collect())
    }

    /// The driver of `slot` went away. Its GPUs keep their answers; teams none of whose trays
    /// is attached any more are freed.
    pub fn detach(&mut self, slot: u16) {
        self.attached.remove(&slot);
        self.teams.forget_detached(&self.attached);
    }

    /// Resolves a compute tray named by slot number or name.
    fn tray(&self, name: &str) -> Result<u16, FabricError> {
        let trays = self.topo.compute_tray_count();
        if let Ok(slot) = name.parse::<u16>() {
            if usize::from(slot) < trays {
                return Ok(slot);
            }
            return Err(FabricError::UnknownTray { slot, trays });
        }
        self.topo
            .compute_trays()
            .find(|t| t.tray.name == name)
            .map(|t| t.slot)
            .ok_or_else(|| FabricError::UnknownTrayName {
                name: name.to_owned(),
                trays,
                example: self
                    .topo
                    .compute_trays()
                    .next()
                    .map(|t| t.tray.name.clone())
                    .unwrap_or_default(),
            })
    }

    fn gpu(&self, tray: &str, gpu: u32) -> Result<GpuId, FabricError> {
        let slot = self.tray(tray)?;
        let gpus = self
            .topo
            .compute_trays()
            .find(|t| t.slot == slot)
            .map_or(0, |t| t.tray.gpus);
        if gpu >= gpus {
            return Err(FabricError::UnknownGpu { slot, gpu, gpus });
        }
        Ok(GpuId { slot, gpu })
    }

    fn switch_tray(&self, name: &str) -> Result<String, FabricError> {
        if self.topo.switch_tray_rack(name).is_some() {
            return Ok(name.to_owned());
        }
        let names: Vec<&str> = self
            .topo
            .racks
            .iter()
            .flat_map(|r| r.switch_trays.iter().map(|s| s.name.as_str()))
            .collect();
        let mut known = names.iter().take(9).copied().collect::<Vec<_>>().join(", ");
        if names.len() > 9 {
            known.push_str(", …");
        }
        Err(FabricError::UnknownSwitchTray {
            name: name.to_owned(),
            known,
        })
    }

    /// Applies an operator command: the changed GPUs and the probe updates to send (to
    /// attached trays only). A refused command changes nothing.
    pub fn apply(&mut self, cmd: &Command) -> Result<(Vec<GpuChange>, Outbox), FabricError> {
        let mut layout = self.layout.clone();
        let mut faults = self.faults.clone();
        match cmd {
            Command::Split { k } => layout = crate::partition::split(&self.topo, *k)?,
            Command::Create { trays } => {
                let slots = trays
                    .iter()
                    .map(|t| self.tray(t))
                    .collect::<Result<Vec<_>, _>>()?;
                layout = layout.create(&self.topo, &slots)?.0;
            }
            Command::Delete { partition } => layout = layout.delete(*partition)?,
            Command::Move { tray, partition } => {
                layout = layout.move_tray(&self.topo, self.tray(tray)?, *partition)?;
            }
            Command::SwitchTray { name, up } => {
                let name = self.switch_tray(name)?;
                if *up {
                    faults.switch_trays_down.remove(&name);
                } else {
                    faults.switch_trays_down.insert(name);
                }
            }
            Command::GpuLink {
                tray,
                gpu,
                switch_tray,
                up,
            } => {
                let link = (self.gpu(tray, *gpu)?, self.switch_tray(switch_tray)?);
                if *up {
                    faults.gpu_links_down.remove(&link);
                } else {
                    faults.gpu_links_down.insert(link);
                }
            }
            Command::OsfpLink { index, up } => {
                let links = self.topo.links.len();
                if *index >= links {
                    return Err(FabricError::UnknownLink {
                        index: *index,
                        links,
                    });
                }
                if *up {
                    faults.osfp_links_down.remove(index);
                } else {
                    faults.osfp_links_down.insert(*index);
                }
            }
            Command::RouteUpdate { on } => faults.rerouting = *on,
            Command::AccessTimeoutRecovery { tray, gpu, on } => {
                let g = self.gpu(tray, *gpu)?;
                if *on {
                    faults.access_timeout_recovery.insert(g);
                } else {
                    faults.access_timeout_recovery.remove(&g);
                }
            }
        }
        self.layout = layout;
        self.faults = faults;
        Ok(self.update())
    }

    /// Recomputes every answer: what changed, and the updates for attached trays.
    fn update(&mut self) -> (Vec<GpuChange>, Outbox) {
        let new = self.compute();
        let mut changes = Vec::new();
        let mut out = Vec::new();
        for (g, info) in &new {
            let Some(old) = self.answers.get(g) else {
                continue;
            };
            if old == info {
                continue;
            }
            let attached = self.attached.contains(&g.slot);
            changes.push(GpuChange {
                slot: g.slot,
                gpu: g.gpu,
                clique: (old.clique_id, info.clique_id),
                health: (
                    old.health_summary.name().to_owned(),
                    info.health_summary.name().to_owned(),
                ),
                flags: true_flags(info.health_mask),
                attached,
            });
            if attached {
                let probe = FromFm::Probe {
                    gpu: g.gpu,
                    info: info.clone(),
                };
                out.push((g.slot, probe));
            }
        }
        self.answers = new;
        (changes, out)
    }

    /// The operator's view.
    pub fn status(&self) -> Status {
        let trays = self
            .topo
            .compute_trays()
            .map(|t| TrayStatus {
                slot: t.slot,
                name: t.tray.name.clone(),
                rack: self.topo.racks[t.rack].name.clone(),
                gpus: t.tray.gpus,
                attached: self.attached.contains(&t.slot),
            })
            .collect();
        let switch_trays = self
            .topo
            .racks
            .iter()
            .flat_map(|r| {
                r.switch_trays.iter().map(|s| SwitchStatus {
                    name: s.name.clone(),
                    rack: r.name.clone(),
                    up: !self.faults.switch_trays_down.contains(&s.name),
                })
            })
            .collect();
        let gpus = self
            .answers
            .iter()
            .map(|(g, p)| GpuStatus {
                slot: g.slot,
                gpu: g.gpu,
                partition: (p.partition_id != NO_PARTITION).then_some(p.partition_id),
                clique_id: p.clique_id,
                health: p.health_summary.name().to_owned(),
                health_mask: p.health_mask,
                flags: true_flags(p.health_mask),
            })
            .collect();
        Status {
            domain: self.topo.name.clone(),
            cluster_uuid: encode_hex(&crate::probe::cluster_uuid(&self.topo.name)),
            trays,
            partitions: self
                .layout
                .partitions
                .iter()
                .map(|p| PartitionStatus {
                    id: p.id,
                    clique_id: p.clique_id,
                    trays: p.trays.clone(),
                })
                .collect(),
            switch_trays,
            osfp_links_down: self.faults.osfp_links_down.iter().copied().collect(),
            gpu_links_down: self
                .faults
                .gpu_links_down
                .iter()
                .map(|(g, s)| (g.slot, g.gpu, s.clone()))
                .collect(),
            route_update: self.faults.rerouting,
            gpus,
            mc_teams: self.teams.len(),
        }
    }
}
