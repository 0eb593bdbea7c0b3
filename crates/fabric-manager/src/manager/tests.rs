//! The manager's rules, one test each (docs/reference/driver-interface.md §5 for probes and health, §1.6 step 5
//! for multicast teams).

use openimex_simproto::inband::{FabricGpu, FromFm};
use openimex_simproto::probe::HealthSummary;

use super::*;
use crate::partition::{default_layout, split};
use crate::topology::{FLA_WINDOW, preset};

fn nvl72() -> Manager {
    let t = preset("nvl72").expect("preset");
    let l = default_layout(&t);
    Manager::new(t, "test-domain", l)
}

fn probes(out: &Outbox) -> Vec<(u16, u32, &wire::ProbeInfo)> {
    out.iter()
        .filter_map(|(s, m)| match m {
            FromFm::Probe { gpu, info } => Some((*s, *gpu, info)),
            _ => None,
        })
        .collect()
}

#[test]
fn attach_answers_every_gpu_of_the_tray_with_the_domains_uuid() {
    let mut m = nvl72();
    let out = m.attach(3, 4).expect("attach");
    let p = probes(&out);
    assert_eq!(p.len(), 4);
    let uuid = encode_hex(&crate::probe::cluster_uuid("test-domain"));
    for (i, (slot, gpu, info)) in p.iter().enumerate() {
        assert_eq!((*slot, *gpu as usize), (3, i));
        assert_eq!(info.cluster_uuid, uuid);
        assert_eq!((info.partition_id, info.clique_id), (0, 1));
        assert_eq!(info.fla_size, FLA_WINDOW);
        assert_eq!(info.health_summary, HealthSummary::Healthy);
    }
    assert!(m.is_attached(3));
}

#[test]
fn attach_refuses_an_unknown_slot_a_wrong_gpu_count_and_a_second_driver() {
    let mut m = nvl72();
    let e = m.attach(18, 4).expect_err("slot 18");
    assert!(e.contains("no compute tray at slot 18"), "{e}");
    let e = m.attach(0, 8).expect_err("8 GPUs");
    assert!(e.contains("--gpus 4"), "{e}");
    m.attach(0, 4).expect("attach");
    let e = m.attach(0, 4).expect_err("twice");
    assert!(e.contains("already attached"), "{e}");
    m.detach(0);
    m.attach(0, 4).expect("again after detach");
}

#[test]
fn a_split_updates_only_attached_gpus_whose_clique_changed() {
    let mut m = nvl72();
    m.attach(0, 4).expect("attach");
    m.attach(10, 4).expect("attach");
    let (changes, out) = m.apply(&Command::Split { k: 2 }).expect("split");
    // Trays 9..18 moved to partition 1 (cliqueId 2): 36 GPUs changed, 4 of them attached.
    assert_eq!(changes.len(), 36);
    assert!(changes.iter().all(|c| c.clique == (1, 2) && c.slot >= 9));
    assert_eq!(changes.iter().filter(|c| c.attached).count(), 4);
    let p = probes(&out);
    assert_eq!(p.len(), 4);
    assert!(
        p.iter()
            .all(|(s, _, i)| *s == 10 && i.clique_id == 2 && i.partition_id == 1)
    );
    // Nothing changes twice.
    let (changes, out) = m.apply(&Command::Split { k: 2 }).expect("split");
    assert!(changes.is_empty() && out.is_empty());
}

#[test]
fn a_tray_attaching_later_gets_the_current_answer() {
    let mut m = nvl72();
    m.apply(&Command::Split { k: 2 }).expect("split");
    m.apply(&Command::SwitchTray {
        name: "r0-s0".into(),
        up: false,
    })
    .expect("down");
    let out = m.attach(17, 4).expect("attach");
    assert!(probes(&out).iter().all(|(_, _, i)| i.clique_id == 2
        && i.health_summary == HealthSummary::LimitedCapacity));
}

#[test]
fn move_create_delete_take_names_or_slots() {
    let mut m = nvl72();
    m.attach(5, 4).expect("attach");
    let (c, _) = m
        .apply(&Command::Create {
            trays: vec!["5".into(), "6".into()],
        })
        .expect("create");
    assert_eq!(c.len(), 8);
    assert!(c.iter().all(|c| c.clique == (1, 2)));
    let name = m.status().trays[7].name.clone();
    let (c, _) = m
        .apply(&Command::Move {
            tray: name,
            partition: 1,
        })
        .expect("move");
    assert_eq!(c.len(), 4);
    let (c, out) = m.apply(&Command::Delete { partition: 1 }).expect("delete");
    assert_eq!(c.len(), 12);
    // The deleted partition's GPUs have no partition and no clique.
    let p = probes(&out);
    assert!(
        p.iter()
            .all(|(_, _, i)| i.clique_id == 0 && i.partition_id == NO_PARTITION)
    );
    assert!(m.apply(&Command::Delete { partition: 9 }).is_err());
    assert!(matches!(
        m.apply(&Command::Move {
            tray: "nope".into(),
            partition: 0
        }),
        Err(FabricError::UnknownTrayName { .. })
    ));
    assert!(matches!(
        m.apply(&Command::Move {
            tray: "99".into(),
            partition: 0
        }),
        Err(FabricError::UnknownTray { slot: 99, .. })
    ));
}

#[test]
fn switch_tray_down_degrades_every_gpu_and_up_heals() {
    let mut m = nvl72();
    m.attach(0, 4).expect("attach");
    let (c, out) = m
        .apply(&Command::SwitchTray {
            name: "r0-s4".into(),
            up: false,
        })
        .expect("down");
    assert_eq!(c.len(), 72);
    assert!(c.iter().all(|c| c.health.1 == "LIMITED_CAPACITY"
        && c.flags.iter().any(|f| f == "DEGRADED_BW")));
    assert_eq!(probes(&out).len(), 4);
    assert!(
        !m.status()
            .switch_trays
            .iter()
            .find(|s| s.name == "r0-s4")
            .expect("s4")
            .up
    );
    let (c, _) = m
        .apply(&Command::SwitchTray {
            name: "r0-s4".into(),
            up: true,
        })
        .expect("up");
    assert!(c.iter().all(|c| c.health.1 == "HEALTHY"));
    assert!(matches!(
        m.apply(&Command::SwitchTray {
            name: "x".into(),
            up: false
        }),
        Err(FabricError::UnknownSwitchTray { .. })
    ));
}

#[test]
fn link_faults_route_updates_and_timeouts_reach_the_right_gpus() {
    let mut m = nvl72();
    let (c, _) = m
        .apply(&Command::GpuLink {
            tray: "2".into(),
            gpu: 1,
            switch_tray: "r0-s0".into(),
            up: false,
        })
        .expect("fault");
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].slot, c[0].gpu), (2, 1));
    assert!(matches!(
        m.apply(&Command::GpuLink {
            tray: "2".into(),
            gpu: 4,
            switch_tray: "r0-s0".into(),
            up: false
        }),
        Err(FabricError::UnknownGpu { gpu: 4, .. })
    ));
    assert!(matches!(
        m.apply(&Command::OsfpLink {
            index: 0,
            up: false
        }),
        Err(FabricError::UnknownLink { .. })
    ));
    let (c, _) = m
        .apply(&Command::RouteUpdate { on: true })
        .expect("reroute");
    // GPU 2:1 was already LIMITED_CAPACITY; its mask changes, so it counts too.
    assert_eq!(c.len(), 72);
    assert!(
        c.iter()
            .all(|c| c.flags.iter().any(|f| f == "ROUTE_UPDATE"))
    );
    let (c, _) = m
        .apply(&Command::AccessTimeoutRecovery {
            tray: "7".into(),
            gpu: 0,
            on: true,
        })
        .expect("timeout");
    assert_eq!(c.len(), 1);
    assert!(c[0].flags.iter().any(|f| f == "ACCESS_TIMEOUT_RECOVERY"));
}

#[test]
fn osfp_link_faults_degrade_both_racks_of_nvl36x2() {
    let t = preset("nvl36x2").expect("preset");
    let mut m = Manager::new(t.clone(), "x2", split(&t, 1).expect("split"));
    let (c, _) = m
        .apply(&Command::OsfpLink {
            index: 0,
            up: false,
        })
        .expect("fault");
    assert_eq!(c.len(), 72);
    assert_eq!(m.status().osfp_links_down, vec![0]);
}

fn gpu(slot: u16, gpu: u32) -> FabricGpu {
    FabricGpu { slot, gpu }
}

fn team_results(out: &Outbox) -> Vec<(u16, Result<openimex_simproto::inband::McTeam, String>)> {
    out.iter()
        .filter_map(|(s, m)| match m {
            FromFm::McTeam { result, .. } => Some((*s, result.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_team_is_answered_once_per_member_tray_with_disjoint_ranges() {
    let mut m = nvl72();
    for s in 0..4 {
        m.attach(s, 4).expect("attach");
    }
    let members: Vec<_> = (0..4).flat_map(|s| [gpu(s, 0), gpu(s, 1)]).collect();
    let out = m.mc_team_setup(0, "k1", 3 << 20, &members);
    let r = team_results(&out);
    assert_eq!(r.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [0, 1, 2, 3]);
    let t1 = r[0].1.clone().expect("team");
    assert!(r.iter().all(|(_, x)| x.as_ref() == Ok(&t1)));
    assert_eq!(t1.address_size, 4 << 20);
    // Above every unicast window of the domain.
    let top = m
        .topology()
        .gpus()
        .iter()
        .map(|g| g.fla_base() + FLA_WINDOW)
        .max();
    assert!(t1.address_base >= top.expect("gpus"));
    let out = m.mc_team_setup(1, "k2", 1, &[gpu(1, 0), gpu(2, 0)]);
    let t2 = team_results(&out)[0].1.clone().expect("team");
    assert!(t2.address_base >= t1.address_base + t1.address_size);
    assert_ne!(t1.team_handle, t2.team_handle);
    assert_eq!(m.status().mc_teams, 2);
    // A range is freed once every member tray released it, then reused.
    for slot in 0..3 {
        assert!(m.mc_team_release(slot, t1.team_handle));
    }
    assert!(
        !m.mc_team_release(0, t1.team_handle),
        "tray 0 released already"
    );
    let out = m.mc_team_setup(0, "k2b", 2 << 20, &[gpu(0, 0)]);
    let held = team_results(&out)[0].1.clone().expect("team");
    assert_ne!(
        held.address_base, MC_BASE,
        "tray 3 still holds the first range"
    );
    assert!(m.mc_team_release(0, held.team_handle));
    assert!(m.mc_team_release(3, t1.team_handle));
    assert!(!m.mc_team_release(3, t1.team_handle), "gone");
    let out = m.mc_team_setup(0, "k3", 2 << 20, &[gpu(0, 0)]);
    let t3 = team_results(&out)[0].1.clone().expect("team");
    assert_eq!(t3.address_base, MC_BASE);
}

#[test]
fn a_team_is_refused_with_a_reason_to_every_attached_member() {
    let mut m = nvl72();
    m.attach(0, 4).expect("attach");
    m.attach(1, 4).expect("attach");
    let refused = |m: &mut Manager, size, members: &[FabricGpu]| {
        let out = m.mc_team_setup(0, "k", size, members);
        let r = team_results(&out);
        assert!(!r.is_empty());
        let e = r[0].1.clone().expect_err("refused");
        assert!(r.iter().all(|(_, x)| x.as_ref() == Err(&e)));
        (r.len(), e)
    };
    let (_, e) = refused(&mut m, 0, &[gpu(0, 0)]);
    assert!(e.contains("0 bytes"), "{e}");
    let (_, e) = refused(&mut m, 1, &[]);
    assert!(e.contains("without members"), "{e}");
    // A member whose tray is not attached: the attached ones still hear of it.
    let (n, e) = refused(&mut m, 1, &[gpu(0, 0), gpu(1, 0), gpu(5, 0)]);
    assert!(e.contains("slot 5") && e.contains("not attached"), "{e}");
    assert_eq!(n, 2);
    let (_, e) = refused(&mut m, 1, &[gpu(0, 9)]);
    assert!(e.contains("not in the topology"), "{e}");
    m.apply(&Command::Move {
        tray: "1".into(),
        partition: 0,
    })
    .expect("noop");
    m.apply(&Command::Create {
        trays: vec!["1".into()],
    })
    .expect("create");
    let (_, e) = refused(&mut m, 1, &[gpu(0, 0), gpu(1, 0)]);
    assert!(e.contains("different cliques"), "{e}");
    m.apply(&Command::Delete { partition: 1 }).expect("delete");
    let (_, e) = refused(&mut m, 1, &[gpu(1, 0)]);
    assert!(e.contains("no fabric partition"), "{e}");
    assert_eq!(m.status().mc_teams, 0);
}

#[test]
fn a_team_whose_trays_all_detached_is_freed() {
    let mut m = nvl72();
    m.attach(0, 4).expect("attach");
    m.attach(1, 4).expect("attach");
    m.mc_team_setup(0, "k", 1, &[gpu(0, 0), gpu(1, 0)]);
    m.detach(0);
    assert_eq!(m.status().mc_teams, 1);
    m.detach(1);
    assert_eq!(m.status().mc_teams, 0);
}

#[test]
fn status_lists_trays_partitions_switches_and_gpus() {
    let mut m = nvl72();
    m.attach(2, 4).expect("attach");
    let s = m.status();
    assert_eq!(s.trays.len(), 18);
    assert!(s.trays[2].attached && !s.trays[3].attached);
    assert_eq!(s.partitions.len(), 1);
    assert_eq!(s.switch_trays.len(), 9);
    assert_eq!(s.gpus.len(), 72);
    assert!(s.gpus.iter().all(|g| g.health == "HEALTHY"
        && g.flags == ["PARTITION_ASSIGNED"]
        && g.partition == Some(0)));
    assert_eq!(s.cluster_uuid.len(), 32);
}
