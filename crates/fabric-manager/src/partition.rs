//! Fabric partitions: sets of whole compute trays, each with its own cliqueId (driver-interface
//! §5: "cliqueId names the set of GPUs within a fabric partition that can do P2P").
//!
//! Layouts are values; every change returns a new layout, and [`clique_changes`] says which
//! GPUs' cliqueId differs between two of them: the GPUs the FM must post a CLIQUE_ID_CHANGE
//! for (§1.6).

use serde::Serialize;

use crate::{FabricError, GpuId, Topology};

/// The cliqueId of a GPU in no partition.
pub const NO_CLIQUE: u32 = 0;

/// One fabric partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partition {
    /// `fabricPartitionId`.
    pub id: u16,
    /// The cliqueId its GPUs report (never [`NO_CLIQUE`]).
    pub clique_id: u32,
    /// Slots of its compute trays, ascending.
    pub trays: Vec<u16>,
}

/// The partitions of a domain. A tray is in at most one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// Partitions by ascending id.
    pub partitions: Vec<Partition>,
}

/// The cliqueId given to partition `id`: `id + 1`, so no partition's clique is [`NO_CLIQUE`]
/// and the default partition's clique is 1, the simulated driver's default `--clique-id`.
pub fn clique_for(id: u16) -> u32 {
    u32::from(id) + 1
}

/// The default layout: every compute tray in partition 0.
pub fn default_layout(topo: &Topology) -> Layout {
    split(topo, 1).unwrap_or(Layout {
        partitions: Vec::new(),
    })
}

/// `k` partitions of whole compute trays, contiguous in slot order, sizes differing by at most
/// one (NVL72 with k = 2: 2 x 9 trays).
pub fn split(topo: &Topology, k: usize) -> Result<Layout, FabricError> {
    let trays: Vec<u16> = topo.compute_trays().map(|t| t.slot).collect();
    if k == 0 || k > trays.len() || k > usize::from(u16::MAX) {
        return Err(FabricError::BadSplit {
            k,
            trays: trays.len(),
        });
    }
    let (base, extra) = (trays.len() / k, trays.len() % k);
    let mut rest = trays.as_slice();
    let partitions = (0..k)
        .map(|i| {
            let (mine, tail) = rest.split_at(base + usize::from(i < extra));
            rest = tail;
            // k fits u16 (checked above).
            let id = u16::try_from(i).unwrap_or(u16::MAX);
            Partition {
                id,
                clique_id: clique_for(id),
                trays: mine.to_vec(),
            }
        })
        .collect();
    Ok(Layout { partitions })
}

impl Layout {
    /// The partition holding compute tray `slot`.
    pub fn partition_of(&self, slot: u16) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.trays.contains(&slot))
    }

    /// The cliqueId of the GPUs on tray `slot` ([`NO_CLIQUE`] outside every partition).
    pub fn clique_of(&self, slot: u16) -> u32 {
        self.partition_of(slot).map_or(NO_CLIQUE, |p| p.clique_id)
    }

    /// This layout with tray `slot` moved into partition `to` (out of the one it was in, if any).
    pub fn move_tray(&self, topo: &Topology, slot: u16, to: u16) -> Result<Layout, FabricError> {
        let trays = topo.compute_tray_count();
        if usize::from(slot) >= trays {
            return Err(FabricError::UnknownTray { slot, trays });
        }
        self.known(to)?;
        let mut out = self.clone();
        for p in &mut out.partitions {
            p.trays.retain(|s| *s != slot);
            if p.id == to {
                p.trays.push(slot);
                p.trays.sort_unstable();
            }
        }
        Ok(out)
    }
}

impl Layout {
    /// This layout with a new partition of the compute trays `slots` (taken out of the
    /// partitions they were in); its id is one above the highest, and its clique follows.
    /// Returns the layout and the new id.
    pub fn create(&self, topo: &Topology, slots: &[u16]) -> Result<(Layout, u16), FabricError> {
        let trays = topo.compute_tray_count();
        if let Some(&slot) = slots.iter().find(|s| usize::from(**s) >= trays) {
            return Err(FabricError::UnknownTray { slot, trays });
        }
        let id = match self.partitions.iter().map(|p| p.id).max() {
            None => 0,
            Some(max) => max
                .checked_add(1)
                .ok_or(FabricError::TooManyPartitions { max })?,
        };
        let mut out = self.clone();
        for p in &mut out.partitions {
            p.trays.retain(|s| !slots.contains(s));
        }
        let mut mine = slots.to_vec();
        mine.sort_unstable();
        mine.dedup();
        out.partitions.push(Partition {
            id,
            clique_id: clique_for(id),
            trays: mine,
        });
        Ok((out, id))
    }

    /// This layout without partition `id`; its trays are left in no partition (cliqueId
    /// [`NO_CLIQUE`], PARTITION_ASSIGNED false) until moved.
    pub fn delete(&self, id: u16) -> Result<Layout, FabricError> {
        self.known(id)?;
        let mut out = self.clone();
        out.partitions.retain(|p| p.id != id);
        Ok(out)
    }

    /// Ok if partition `id` exists, else the error listing those that do.
    fn known(&self, id: u16) -> Result<(), FabricError> {
        if self.partitions.iter().any(|p| p.id == id) {
            return Ok(());
        }
        Err(FabricError::UnknownPartition {
            id,
            known: self
                .partitions
                .iter()
                .map(|p| p.id.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

/// One GPU whose cliqueId differs between two layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CliqueChange {
    /// The GPU.
    pub gpu: GpuId,
    /// Its cliqueId before.
    pub from: u32,
    /// Its cliqueId after.
    pub to: u32,
}

/// The GPUs of `topo` whose cliqueId differs between `before` and `after`, in GPU order.
pub fn clique_changes(topo: &Topology, before: &Layout, after: &Layout) -> Vec<CliqueChange> {
    topo.gpus()
        .into_iter()
        .filter_map(|gpu| {
            let (from, to) = (before.clique_of(gpu.slot), after.clique_of(gpu.slot));
            (from != to).then_some(CliqueChange { gpu, from, to })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::preset;

    fn nvl72() -> Topology {
        preset("nvl72").expect("preset")
    }

    #[test]
    fn default_is_one_partition_of_every_tray() {
        let t = nvl72();
        let l = default_layout(&t);
        assert_eq!(l.partitions.len(), 1);
        assert_eq!(l.partitions[0].trays, (0..18).collect::<Vec<u16>>());
        assert!((0..18).all(|s| l.clique_of(s) == 1));
    }

    #[test]
    fn nvl72_splits_into_two_by_nine() {
        let t = nvl72();
        let l = split(&t, 2).expect("split");
        assert_eq!(l.partitions[0].trays, (0..9).collect::<Vec<u16>>());
        assert_eq!(l.partitions[1].trays, (9..18).collect::<Vec<u16>>());
        assert_ne!(l.clique_of(0), l.clique_of(9));
        // Uneven splits keep whole trays: 18 = 5 + 5 + 4 + 4.
        let l4 = split(&t, 4).expect("split");
        let sizes: Vec<usize> = l4.partitions.iter().map(|p| p.trays.len()).collect();
        assert_eq!(sizes, [5, 5, 4, 4]);
        assert!(matches!(split(&t, 0), Err(FabricError::BadSplit { .. })));
        assert!(matches!(
            split(&t, 19),
            Err(FabricError::BadSplit { k: 19, trays: 18 })
        ));
    }

    #[test]
    fn splitting_changes_the_cliques_of_the_second_half_only() {
        let t = nvl72();
        let changes = clique_changes(&t, &default_layout(&t), &split(&t, 2).expect("split"));
        assert_eq!(changes.len(), 36);
        assert!(
            changes
                .iter()
                .all(|c| c.gpu.slot >= 9 && c.from == 1 && c.to == 2)
        );
    }

    #[test]
    fn create_and_delete_partitions() {
        let t = nvl72();
        let one = default_layout(&t);
        let (two, id) = one.create(&t, &[17, 16, 16]).expect("create");
        assert_eq!(id, 1);
        assert_eq!(two.partitions[0].trays.len(), 16);
        assert_eq!(two.partitions[1].trays, [16, 17]);
        assert_eq!(clique_changes(&t, &one, &two).len(), 8);
        let gone = two.delete(1).expect("delete");
        assert_eq!(gone.clique_of(17), NO_CLIQUE);
        assert!(
            clique_changes(&t, &two, &gone)
                .iter()
                .all(|c| c.to == NO_CLIQUE)
        );
        assert!(matches!(
            two.delete(5),
            Err(FabricError::UnknownPartition { id: 5, .. })
        ));
        assert!(matches!(
            one.create(&t, &[18]),
            Err(FabricError::UnknownTray { slot: 18, .. })
        ));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]
        /// A split puts every tray in exactly one partition, sizes within one of each other,
        /// with distinct cliques; a change seen backwards is the same GPUs with from/to swapped.
        #[test]
        fn split_covers_every_tray_once(k in 1usize..=18, slot in 0u16..18, to in 0usize..18) {
            let t = nvl72();
            let l = split(&t, k).expect("split");
            let mut all: Vec<u16> = l.partitions.iter().flat_map(|p| p.trays.clone()).collect();
            all.sort_unstable();
            proptest::prop_assert_eq!(all, (0..18).collect::<Vec<u16>>());
            let sizes: Vec<usize> = l.partitions.iter().map(|p| p.trays.len()).collect();
            proptest::prop_assert!(sizes.iter().max().unwrap_or(&0) - sizes.iter().min().unwrap_or(&0) <= 1);
            let mut cliques: Vec<u32> = l.partitions.iter().map(|p| p.clique_id).collect();
            cliques.dedup();
            proptest::prop_assert_eq!(cliques.len(), k);
            let target = l.partitions[to % k].id;
            let moved = l.move_tray(&t, slot, target).expect("move");
            let fwd = clique_changes(&t, &l, &moved);
            let back = clique_changes(&t, &moved, &l);
            proptest::prop_assert_eq!(fwd.len(), back.len());
            proptest::prop_assert!(fwd.iter().zip(&back).all(|(a, b)| a.gpu == b.gpu && a.from == b.to && a.to == b.from));
            proptest::prop_assert!(fwd.iter().all(|c| c.gpu.slot == slot));
            proptest::prop_assert_eq!(fwd.is_empty(), l.partition_of(slot).map(|p| p.id) == Some(target));
        }
    }

    #[test]
    fn moving_a_tray_changes_its_four_gpus() {
        let t = nvl72();
        let two = split(&t, 2).expect("split");
        let moved = two.move_tray(&t, 3, 1).expect("move");
        assert_eq!(moved.partitions[0].trays.len(), 8);
        assert_eq!(moved.partitions[1].trays.len(), 10);
        assert_eq!(moved.partition_of(3).map(|p| p.id), Some(1));
        let changes = clique_changes(&t, &two, &moved);
        assert_eq!(changes.len(), 4);
        assert!(
            changes
                .iter()
                .all(|c| c.gpu.slot == 3 && c.from == 1 && c.to == 2)
        );
        // Moving it back undoes the change.
        let back = moved.move_tray(&t, 3, 0).expect("move back");
        assert_eq!(back, two);
        assert!(clique_changes(&t, &two, &back).is_empty());
        assert!(matches!(
            two.move_tray(&t, 18, 0),
            Err(FabricError::UnknownTray {
                slot: 18,
                trays: 18
            })
        ));
        let e = two
            .move_tray(&t, 0, 7)
            .expect_err("no partition 7")
            .to_string();
        assert!(e.contains("0, 1"), "{e}");
    }
}
