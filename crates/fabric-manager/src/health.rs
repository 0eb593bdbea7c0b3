//! Fabric health as a pure function: which switch trays are down and which links are faulty
//! give every GPU's health mask and summary (docs/reference/driver-interface.md §5).
//!
//! The model: a GPU plugs into every switch tray of its own rack and reaches the rest of its
//! fabric through their OSFP links. It keeps working while one switch tray of its rack is
//! usable, at lower bandwidth (DEGRADED_BW, LIMITED_CAPACITY) whenever any switch tray or
//! link of its fabric it would use is lost; with none of its rack's switch trays usable it is
//! cut off (CONNECTION_UNHEALTHY, UNHEALTHY). Route updates and access-timeout recovery are
//! states the caller reports; they limit capacity while they last.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::probe::{Flag, HealthField, HealthMask, HealthSummary};
use crate::{GpuId, Topology};

/// What is broken in the fabric.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Switch trays down, by name.
    pub switch_trays_down: BTreeSet<String>,
    /// Failed NVLinks between one GPU and one switch tray (by name).
    pub gpu_links_down: BTreeSet<(GpuId, String)>,
    /// Failed OSFP links, by index in [`Topology::links`].
    pub osfp_links_down: BTreeSet<usize>,
    /// The FM is reprogramming routes (after a switch tray went down or came back): every
    /// GPU reports ROUTE_UPDATE and LIMITED_CAPACITY while it lasts.
    pub rerouting: bool,
    /// GPUs recovering from an NVLink access timeout (ACCESS_TIMEOUT_RECOVERY,
    /// LIMITED_CAPACITY).
    pub access_timeout_recovery: BTreeSet<GpuId>,
}

/// TRUE or FALSE.
fn flag(b: bool) -> Flag {
    if b { Flag::True } else { Flag::False }
}

/// One GPU's fabric health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GpuHealth {
    /// The health mask, PARTITION_ASSIGNED left NOT_SUPPORTED (the layout sets it).
    pub mask: HealthMask,
    /// The summary.
    pub summary: HealthSummary,
}

/// Every GPU's health under `faults`.
pub fn health(topo: &Topology, faults: &Faults) -> BTreeMap<GpuId, GpuHealth> {
    let fabric = topo.fabric_of_racks();
    // A fabric is degraded as a whole when one of its switch trays or OSFP links is down:
    // traffic between its racks is spread over every switch tray.
    let mut degraded_fabric = vec![false; topo.racks.len()];
    for name in &faults.switch_trays_down {
        if let Some(r) = topo.switch_tray_rack(name) {
            degraded_fabric[fabric[r]] = true;
        }
    }
    for &i in &faults.osfp_links_down {
        if let Some(r) = topo.links.get(i).and_then(|l| topo.switch_tray_rack(&l.a)) {
            degraded_fabric[fabric[r]] = true;
        }
    }
    let healthy =
        HealthMask::healthy(false).with(HealthField::PartitionAssigned, Flag::NotSupported);
    topo.compute_trays()
        .flat_map(|t| (0..t.tray.gpus).map(move |gpu| (GpuId { slot: t.slot, gpu }, t.rack)))
        .map(|(gpu, rack)| {
            let direct = &topo.racks[rack].switch_trays;
            let lost = |name: &String| {
                faults.switch_trays_down.contains(name)
                    || faults.gpu_links_down.contains(&(gpu, name.clone()))
            };
            let usable = direct.iter().filter(|s| !lost(&s.name)).count();
            let cut = usable == 0;
            let lost = cut || usable < direct.len() || degraded_fabric[fabric[rack]];
            let timeout = faults.access_timeout_recovery.contains(&gpu);
            let mask = healthy
                .with(HealthField::DegradedBw, flag(lost))
                .with(HealthField::ConnectionUnhealthy, flag(cut))
                .with(HealthField::RouteUpdate, flag(faults.rerouting))
                .with(HealthField::AccessTimeoutRecovery, flag(timeout));
            let summary = if cut {
                HealthSummary::Unhealthy
            } else if lost || faults.rerouting || timeout {
                HealthSummary::LimitedCapacity
            } else {
                HealthSummary::Healthy
            };
            let h = GpuHealth { mask, summary };
            (gpu, h)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::preset;

    fn down(names: &[&str]) -> Faults {
        Faults {
            switch_trays_down: names.iter().map(|s| (*s).to_owned()).collect(),
            ..Faults::default()
        }
    }

    /// Every switch tray of rack `r` down.
    fn rack_down(t: &Topology, r: usize) -> Faults {
        Faults {
            switch_trays_down: t.racks[r]
                .switch_trays
                .iter()
                .map(|s| s.name.clone())
                .collect(),
            ..Faults::default()
        }
    }

    #[test]
    fn no_faults_is_healthy() {
        let t = preset("nvl72").expect("preset");
        let h = health(&t, &Faults::default());
        assert_eq!(h.len(), 72);
        assert!(h.values().all(|g| g.summary == HealthSummary::Healthy
            && g.mask.raw(HealthField::DegradedBw) == Flag::False as u32));
    }

    #[test]
    fn one_switch_tray_down_degrades_every_gpu() {
        let t = preset("nvl72").expect("preset");
        let h = health(&t, &down(&["r0-s4"]));
        assert!(
            h.values()
                .all(|g| g.summary == HealthSummary::LimitedCapacity
                    && g.mask.is(HealthField::DegradedBw)
                    && !g.mask.is(HealthField::ConnectionUnhealthy))
        );
    }

    #[test]
    fn all_switch_trays_down_is_unhealthy() {
        let t = preset("nvl72").expect("preset");
        let h = health(&t, &rack_down(&t, 0));
        assert!(h.values().all(|g| g.summary == HealthSummary::Unhealthy
            && g.mask.is(HealthField::ConnectionUnhealthy)));
    }

    #[test]
    fn a_racks_switch_trays_down_cut_off_that_rack_only() {
        let t = preset("nvl36x2").expect("preset");
        let h = health(&t, &rack_down(&t, 1));
        for (gpu, g) in &h {
            let want = if gpu.slot < 9 {
                HealthSummary::LimitedCapacity
            } else {
                HealthSummary::Unhealthy
            };
            assert_eq!(g.summary, want, "{gpu:?}");
        }
    }

    #[test]
    fn rerouting_and_timeout_recovery_limit_capacity() {
        let t = preset("nvl36").expect("preset");
        let g = GpuId { slot: 4, gpu: 2 };
        let f = Faults {
            access_timeout_recovery: [g].into(),
            ..Faults::default()
        };
        let h = health(&t, &f);
        assert!(h[&g].mask.is(HealthField::AccessTimeoutRecovery));
        assert_eq!(h[&g].summary, HealthSummary::LimitedCapacity);
        assert_eq!(
            h[&GpuId { slot: 4, gpu: 1 }].summary,
            HealthSummary::Healthy
        );
        let mut f = rack_down(&t, 0);
        f.switch_trays_down.pop_first();
        f.rerouting = true;
        assert!(
            health(&t, &f)
                .values()
                .all(|v| v.mask.is(HealthField::RouteUpdate)
                    && v.mask.is(HealthField::DegradedBw)
                    && !v.mask.is(HealthField::ConnectionUnhealthy)
                    && v.summary == HealthSummary::LimitedCapacity)
        );
    }

    #[test]
    fn link_faults_degrade_where_they_are() {
        let t = preset("nvl36x2").expect("preset");
        // One GPU's NVLink to one switch tray: that GPU only.
        let g = GpuId { slot: 2, gpu: 1 };
        let f = Faults {
            gpu_links_down: [(g, "r0-s0".to_owned())].into(),
            ..Faults::default()
        };
        let h = health(&t, &f);
        let degraded: Vec<_> = h
            .iter()
            .filter(|(_, v)| v.summary != HealthSummary::Healthy)
            .collect();
        assert_eq!(degraded.len(), 1);
        assert_eq!(*degraded[0].0, g);
        // An OSFP link between the racks: every GPU of the fabric.
        let f = Faults {
            osfp_links_down: [0].into(),
            ..Faults::default()
        };
        assert!(
            health(&t, &f)
                .values()
                .all(|v| v.summary == HealthSummary::LimitedCapacity)
        );
    }
}
