//! The Fabric Manager's answer to every GPU's probe: topology, partition layout and faults
//! combined into the per-GPU [`ProbeInfo`] of docs/reference/driver-interface.md §5.

use std::collections::BTreeMap;

use crate::health::{Faults, health};
use crate::partition::Layout;
use crate::probe::{
    Flag, HealthField, HealthMask, HealthSummary, ProbeInfo, ProbeState, caps, cluster_uuid,
};
use crate::topology::FLA_WINDOW;
use crate::{GpuId, Topology};

/// Every GPU's completed probe answer. The clusterUuid derives from the topology's name; a GPU
/// outside every partition gets cliqueId 0 and PARTITION_ASSIGNED false. Every GPU can do
/// multi-node multicast: all of them sit behind NVSwitches.
pub fn answers(topo: &Topology, layout: &Layout, faults: &Faults) -> BTreeMap<GpuId, ProbeInfo> {
    let uuid = cluster_uuid(&topo.name);
    let health = health(topo, faults);
    topo.gpus()
        .into_iter()
        .map(|gpu| {
            let part = layout.partition_of(gpu.slot);
            let (mask, summary) = health
                .get(&gpu)
                .map_or((HealthMask::default(), HealthSummary::NotSupported), |h| {
                    (h.mask, h.summary)
                });
            let assigned = if part.is_some() {
                Flag::True
            } else {
                Flag::False
            };
            let info = ProbeInfo {
                state: ProbeState::Complete,
                cluster_uuid: uuid,
                partition_id: part.map(|p| p.id),
                clique_id: layout.clique_of(gpu.slot),
                fla_base: gpu.fla_base(),
                fla_range: FLA_WINDOW,
                caps: caps::MC_SUPPORTED | caps::MC_MULTINODE_SUPPORTED,
                health_mask: mask.with(HealthField::PartitionAssigned, assigned),
                health_summary: summary,
            };
            (gpu, info)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::{default_layout, split};
    use crate::topology::preset;

    #[test]
    fn every_gpu_of_the_domain_shares_the_cluster_uuid_and_owns_its_window() {
        let t = preset("nvl36x2").expect("preset");
        let a = answers(&t, &default_layout(&t), &Faults::default());
        assert_eq!(a.len(), 72);
        let uuid = cluster_uuid("nvl36x2");
        assert!(a.values().all(|p| p.cluster_uuid == uuid
            && p.clique_id == 1
            && p.state == ProbeState::Complete
            && p.health_mask.is(HealthField::PartitionAssigned)
            && p.health_summary == HealthSummary::Healthy
            && p.caps == 0b11));
        // Windows do not overlap.
        let mut bases: Vec<u64> = a.values().map(|p| p.fla_base).collect();
        bases.sort_unstable();
        assert!(bases.windows(2).all(|w| w[1] - w[0] >= FLA_WINDOW));
    }

    #[test]
    fn partitions_give_cliques_and_ids() {
        let t = preset("nvl72").expect("preset");
        let mut l = split(&t, 2).expect("split");
        l.partitions[1].trays.clear();
        let a = answers(&t, &l, &Faults::default());
        let first = &a[&GpuId { slot: 0, gpu: 0 }];
        assert_eq!((first.partition_id, first.clique_id), (Some(0), 1));
        let orphan = &a[&GpuId { slot: 17, gpu: 3 }];
        assert_eq!((orphan.partition_id, orphan.clique_id), (None, 0));
        assert_eq!(
            orphan.health_mask.raw(HealthField::PartitionAssigned),
            Flag::False as u32
        );
    }
}
