//! The hardware of one NVLink domain: racks, compute trays, NVLink switch trays and the OSFP
//! links that join racks, with the named presets of the GB200 NVL72 reference configurations.
//!
//! A compute tray is one OS domain (one IMEX node); its position in the domain, counted across
//! racks in order, is its *slot* (`openimex-lab gpu --slot`), which names its GPUs' fabric
//! addresses. Every GPU reaches every switch tray of its *fabric* (its rack plus every rack
//! joined to it through OSFP links): losing a switch tray lowers bandwidth, it does not cut a
//! GPU off.

use serde::Serialize;

use crate::FabricError;

/// Grace CPUs on a compute tray.
pub const CPUS_PER_COMPUTE_TRAY: u32 = 2;
/// NVSwitch chips on a switch tray.
pub const SWITCH_CHIPS_PER_TRAY: u32 = 2;
/// Most GPUs on one compute tray: the fabric address plan of the simulated driver leaves room
/// for 16 per node (`MAX_GPUS_PER_NODE` in the simgpu crate), so that every fabric PFN of
/// trays up to slot 511 fits the RM's 32-bit PFNs (DESCRIBE's `pfnArray`, 2 MiB units).
pub const MAX_GPUS_PER_TRAY: u32 = 16;
/// Most OSFP ports on one switch tray a file may declare.
pub const MAX_OSFP_PER_TRAY: u32 = 64;
/// Bits of offset within one GPU's fabric (FLA) window: each GPU owns 1 TiB, as in the
/// simulated driver's `fabric` module.
pub const FLA_WINDOW_BITS: u32 = 40;
/// The size of one GPU's FLA window.
pub const FLA_WINDOW: u64 = 1 << FLA_WINDOW_BITS;
/// The preset used when none is named.
pub const DEFAULT_PRESET: &str = "nvl72";

/// One NVLink domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    /// The domain's name; its clusterUuid derives from it.
    pub name: String,
    /// Racks in slot order.
    pub racks: Vec<Rack>,
    /// OSFP cable bundles, each joining two switch trays (normally of different racks).
    pub links: Vec<Link>,
}

/// A rack: compute trays and the switch trays they plug into.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rack {
    /// Unique name.
    pub name: String,
    /// Compute trays, in slot order.
    pub compute_trays: Vec<ComputeTray>,
    /// NVLink switch trays.
    pub switch_trays: Vec<SwitchTray>,
}

/// A compute tray: 2 Grace CPUs and `gpus` GPUs (4 on GB200); one OS domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComputeTray {
    /// Unique name.
    pub name: String,
    /// GPUs on the tray.
    pub gpus: u32,
}

/// An NVLink switch tray: 2 NVSwitch chips, `osfp` front-panel OSFP ports (0 on NVL72).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SwitchTray {
    /// Unique name.
    pub name: String,
    /// OSFP front-panel ports (0: none).
    pub osfp: u32,
}

/// OSFP cables between two switch trays, joining their racks into one fabric.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Link {
    /// One switch tray's name.
    pub a: String,
    /// The other switch tray's name.
    pub b: String,
}

/// A GPU of the domain: its compute tray's slot and its index on the tray.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct GpuId {
    /// The compute tray's slot (its node position in the domain).
    pub slot: u16,
    /// GPU index on the tray.
    pub gpu: u32,
}

impl GpuId {
    /// First fabric (FLA) address of this GPU's window. The same plan as the simulated driver
    /// (simgpu `fabric::GpuAddr::base`): window number `slot * 16 + gpu + 1`, so address 0
    /// is never a GPU's.
    pub fn fla_base(self) -> u64 {
        (u64::from(self.slot) * u64::from(MAX_GPUS_PER_TRAY) + u64::from(self.gpu) + 1)
            << FLA_WINDOW_BITS
    }
}

/// A compute tray with where it sits.
#[derive(Debug, Clone, Copy)]
pub struct TrayRef<'a> {
    /// Its slot.
    pub slot: u16,
    /// Index of its rack in [`Topology::racks`].
    pub rack: usize,
    /// The tray.
    pub tray: &'a ComputeTray,
}

/// A named preset: name, one-line description, builder.
pub struct Preset {
    /// Its name (`nvl72`).
    pub name: &'static str,
    /// One line for listings.
    pub about: &'static str,
    build: fn() -> Topology,
}

/// The presets, default first.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "nvl72",
        about: "1 rack: 18 compute trays x 4 GPUs, 9 switch trays without OSFP ports (72 GPUs)",
        build: || uniform("nvl72", 1, 18, 0, false),
    },
    Preset {
        name: "nvl36",
        about: "1 rack: 9 compute trays x 4 GPUs, 9 switch trays with 18 OSFP ports (36 GPUs)",
        build: || uniform("nvl36", 1, 9, 18, false),
    },
    Preset {
        name: "nvl36x2",
        about: "2 nvl36 racks joined through their switch trays' OSFP ports (72 GPUs)",
        build: || uniform("nvl36x2", 2, 9, 18, true),
    },
    Preset {
        name: "nvl576",
        about: "8 racks x 18 compute trays x 4 GPUs, 9 switch trays each with 18 OSFP ports, \
                switch tray i of each rack joined to switch tray i of the next in a ring \
                (144 trays, 576 GPUs)",
        build: || uniform("nvl576", 8, 18, 18, true),
    },
];

/// The preset called `name`.
pub fn preset(name: &str) -> Result<Topology, FabricError> {
    PRESETS
        .iter()
        .find(|p| p.name == name)
        .map(|p| (p.build)())
        .ok_or_else(|| FabricError::UnknownPreset {
            name: name.to_owned(),
            known: PRESETS
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Switch trays per GB200 rack.
const SWITCH_TRAYS_PER_RACK: usize = 9;
/// GPUs per GB200 compute tray.
const GB200_GPUS_PER_TRAY: u32 = 4;

/// `racks` identical racks of `trays` compute trays; with `join`, switch tray i of each rack is
/// linked to switch tray i of the next (a ring for more than two racks, one bundle for two).
fn uniform(name: &str, racks: usize, trays: usize, osfp: u32, join: bool) -> Topology {
    let racks_v: Vec<Rack> = (0..racks)
        .map(|r| Rack {
            name: format!("r{r}"),
            compute_trays: (0..trays)
                .map(|c| ComputeTray {
                    name: format!("r{r}-c{c:02}"),
                    gpus: GB200_GPUS_PER_TRAY,
                })
                .collect(),
            switch_trays: (0..SWITCH_TRAYS_PER_RACK)
                .map(|s| SwitchTray {
                    name: format!("r{r}-s{s}"),
                    osfp,
                })
                .collect(),
        })
        .collect();
    let mut links = Vec::new();
    if join && racks > 1 {
        // Two racks need one bundle per switch tray; a ring closes back to rack 0 beyond that.
        let pairs = if racks == 2 { 1 } else { racks };
        for r in 0..pairs {
            let next = (r + 1) % racks;
            for s in 0..SWITCH_TRAYS_PER_RACK {
                links.push(Link {
                    a: format!("r{r}-s{s}"),
                    b: format!("r{next}-s{s}"),
                });
            }
        }
    }
    Topology {
        name: name.to_owned(),
        racks: racks_v,
        links,
    }
}

impl Topology {
    /// Compute trays in slot order.
    pub fn compute_trays(&self) -> impl Iterator<Item = TrayRef<'_>> {
        self.racks
            .iter()
            .enumerate()
            .flat_map(|(r, rack)| rack.compute_trays.iter().map(move |t| (r, t)))
            .enumerate()
            // Slots fit u16: the parser refuses more trays, and presets have at most 144.
            .map(|(slot, (rack, tray))| TrayRef {
                slot: u16::try_from(slot).unwrap_or(u16::MAX),
                rack,
                tray,
            })
    }

    /// Every GPU, in slot then index order.
    pub fn gpus(&self) -> Vec<GpuId> {
        self.compute_trays()
            .flat_map(|t| (0..t.tray.gpus).map(move |gpu| GpuId { slot: t.slot, gpu }))
            .collect()
    }

    /// Number of compute trays.
    pub fn compute_tray_count(&self) -> usize {
        self.racks.iter().map(|r| r.compute_trays.len()).sum()
    }

    /// Number of GPUs.
    pub fn gpu_count(&self) -> usize {
        self.compute_trays().map(|t| t.tray.gpus as usize).sum()
    }

    /// Number of switch trays.
    pub fn switch_tray_count(&self) -> usize {
        self.racks.iter().map(|r| r.switch_trays.len()).sum()
    }

    /// The rack index of a switch tray, by name.
    pub fn switch_tray_rack(&self, name: &str) -> Option<usize> {
        self.racks
            .iter()
            .position(|r| r.switch_trays.iter().any(|s| s.name == name))
    }

    /// The fabric of each rack: racks joined by OSFP links (directly or through others) share
    /// a fabric number; numbers are dense from 0 in rack order.
    pub fn fabric_of_racks(&self) -> Vec<usize> {
        let mut parent: Vec<usize> = (0..self.racks.len()).collect();
        fn root(p: &mut [usize], mut i: usize) -> usize {
            while p[i] != i {
                p[i] = p[p[i]];
                i = p[i];
            }
            i
        }
        for l in &self.links {
            if let (Some(a), Some(b)) = (self.switch_tray_rack(&l.a), self.switch_tray_rack(&l.b)) {
                let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
                parent[ra.max(rb)] = ra.min(rb);
            }
        }
        let mut dense = vec![usize::MAX; self.racks.len()];
        let mut next = 0;
        (0..self.racks.len())
            .map(|r| {
                let root = root(&mut parent, r);
                if dense[root] == usize::MAX {
                    dense[root] = next;
                    next += 1;
                }
                dense[root]
            })
            .collect()
    }

    /// Number of separate fabrics (1 for every preset).
    pub fn fabric_count(&self) -> usize {
        self.fabric_of_racks().iter().max().map_or(0, |m| m + 1)
    }

    /// The rack a GPU's tray sits in.
    pub fn rack_of(&self, slot: u16) -> Option<usize> {
        self.compute_trays()
            .find(|t| t.slot == slot)
            .map(|t| t.rack)
    }

    /// The switch trays a GPU of rack `rack` reaches: every switch tray of its fabric.
    pub fn switch_trays_reached(&self, rack: usize) -> Vec<&SwitchTray> {
        let fabric = self.fabric_of_racks();
        let Some(&mine) = fabric.get(rack) else {
            return Vec::new();
        };
        self.racks
            .iter()
            .zip(&fabric)
            .filter(|(_, f)| **f == mine)
            .flat_map(|(r, _)| &r.switch_trays)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(name: &str) -> (usize, usize, usize, usize, usize) {
        let t = preset(name).expect("preset");
        (
            t.racks.len(),
            t.compute_tray_count(),
            t.gpu_count(),
            t.switch_tray_count(),
            t.fabric_count(),
        )
    }

    #[test]
    fn preset_counts() {
        assert_eq!(counts("nvl36"), (1, 9, 36, 9, 1));
        assert_eq!(counts("nvl36x2"), (2, 18, 72, 18, 1));
        assert_eq!(counts("nvl72"), (1, 18, 72, 9, 1));
        assert_eq!(counts("nvl576"), (8, 144, 576, 72, 1));
        assert_eq!(PRESETS[0].name, DEFAULT_PRESET);
    }

    #[test]
    fn preset_ports_and_links() {
        let nvl36 = preset("nvl36").expect("preset");
        assert!(nvl36.racks[0].switch_trays.iter().all(|s| s.osfp == 18));
        assert!(nvl36.links.is_empty());
        let nvl72 = preset("nvl72").expect("preset");
        assert!(nvl72.racks[0].switch_trays.iter().all(|s| s.osfp == 0));
        let x2 = preset("nvl36x2").expect("preset");
        assert_eq!(x2.links.len(), 9);
        // Every GPU reaches every switch tray of its fabric, the other rack's included.
        assert_eq!(x2.switch_trays_reached(0).len(), 18);
        assert_eq!(x2.switch_trays_reached(1).len(), 18);
        assert_eq!(
            preset("nvl576")
                .expect("preset")
                .switch_trays_reached(7)
                .len(),
            72
        );
    }

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let e = preset("nvl8").expect_err("no such preset").to_string();
        assert!(e.contains("\"nvl8\"") && e.contains("nvl36x2"), "{e}");
    }

    #[test]
    fn slots_and_fla_follow_the_simulated_driver() {
        let t = preset("nvl36x2").expect("preset");
        let gpus = t.gpus();
        assert_eq!(gpus.len(), 72);
        let last = gpus[71];
        assert_eq!(last, GpuId { slot: 17, gpu: 3 });
        assert_eq!(t.rack_of(17), Some(1));
        // simgpu: (node * 16 + gpu + 1) << 40.
        assert_eq!(last.fla_base(), (17 * 16 + 3 + 1) << 40);
        assert_eq!(GpuId { slot: 0, gpu: 0 }.fla_base(), FLA_WINDOW);
    }
}
