//! The GPU fabric probe (`docs/reference/driver-interface.md` §5, §6.9): no fabric memory before it
//! completes, the completed values in GET_GPU_FABRIC_PROBE_INFO and wherever the driver uses
//! them.

use super::*;
use openimex_simproto::probe::{
    CAP_MC_MULTINODE_SUPPORTED, CAP_MC_SUPPORTED, HealthSummary, ProbeInfo, ProbeState,
};

fn node_with_probe(dir: &TempDir, slot: u16, probe: ProbeStart) -> Rm {
    // The default node goes before the one asked for takes its slot.
    let config = node(dir, slot).config().clone();
    Rm::new(RmConfig { probe, ..config }).unwrap()
}

/// What a Fabric Manager would answer: its own clusterUuid, partition 5, clique 9.
fn fm_answer(rm: &Rm, gpu: u32) -> ProbeInfo {
    ProbeInfo {
        cluster_uuid: "AB".repeat(16),
        partition_id: 5,
        clique_id: 9,
        caps: CAP_MC_SUPPORTED,
        health_summary: HealthSummary::LimitedCapacity,
        health_mask: 0x1,
        ..rm.default_probe_info(gpu)
    }
}

/// §5: "Without [the FLA range from the probe], NV_MEMORY_FABRIC allocation fails: UC FLA
/// ranges should be initialized" — `memoryfabricConstruct` returns NV_ERR_INVALID_STATE there.
#[test]
fn fabric_memory_is_refused_until_the_probe_completes() {
    let dir = TempDir::new("probe-pending");
    let mut rm = node_with_probe(&dir, 0, ProbeStart::Pending);
    let c = app(&mut rm, 0);
    let before = rm.probe_info(0).unwrap();
    assert_eq!(
        (before.state, before.status, before.info),
        (ProbeState::InProgress, Some(NvStatus::NotReady), None)
    );
    assert_eq!(
        rm.create(c, 0, 2 * MIB).map(|x| x.mem),
        Err(NvStatus::InvalidState)
    );
    assert_eq!(rm.gpus()[0].fabric_state, "IN_PROGRESS");
    assert_eq!(rm.gpus()[0].cluster_uuid, "00".repeat(16));

    let answer = fm_answer(&rm, 0);
    rm.complete_probe(0, answer.clone()).unwrap();
    let done = rm.probe_info(0).unwrap();
    assert_eq!(done.state, ProbeState::Complete);
    assert_eq!(done.status, None, "NV_OK once the FM answered");
    let info = done.info.expect("the FM's response");
    assert_eq!(info.cluster_uuid, "ab".repeat(16), "one spelling");
    assert_eq!(
        (
            info.partition_id,
            info.clique_id,
            info.caps,
            info.health_mask
        ),
        (5, 9, CAP_MC_SUPPORTED, 1)
    );
    assert_eq!(info.health_summary, HealthSummary::LimitedCapacity);

    // GPU 0 allocates now; GPU 1's probe is still in progress.
    let mem = rm.create(c, 0, 2 * MIB).unwrap();
    assert_eq!(
        rm.create(c, 1, 2 * MIB).map(|x| x.mem),
        Err(NvStatus::InvalidState)
    );
    let g = &rm.gpus()[0];
    assert_eq!(
        (g.fabric_state.as_str(), g.clique_id, g.health.as_str()),
        ("COMPLETED", 9, "LIMITED_CAPACITY")
    );

    // The owner GPU's clique is the one the daemon's DESCRIBE reports (§6.4, §6.8).
    let d = rm.connect();
    let token = rm.open_session(d, 0).unwrap();
    let handle = rm.export(c, mem.mem).unwrap();
    let uuid = FabricHandle::from_hex(&handle).unwrap().export_uuid;
    let (_, pages) = rm.describe_export(token, &uuid.to_hex(), 0, 0).unwrap();
    assert_eq!(pages.clique_id, 9);
}

#[test]
fn a_probe_not_started_reports_so_and_a_default_driver_completes_at_start() {
    let dir = TempDir::new("probe-states");
    let rm = node_with_probe(&dir, 0, ProbeStart::NotStarted);
    assert_eq!(rm.probe_info(1).unwrap().state, ProbeState::NotStarted);
    assert_eq!(rm.gpus()[1].fabric_state, "NOT_STARTED");

    // Without `--probe`, the driver plays its own FM: the configured clusterUuid and clique.
    let rm = node(&dir, 1);
    let p = rm.probe_info(1).unwrap();
    let info = p.info.expect("complete at start");
    assert_eq!((p.state, p.status), (ProbeState::Complete, None));
    assert_eq!(
        (info.cluster_uuid.as_str(), info.clique_id),
        ("07".repeat(16).as_str(), 1)
    );
    assert_eq!(info.caps, CAP_MC_SUPPORTED | CAP_MC_MULTINODE_SUPPORTED);
    assert_eq!(
        (info.fla_base, info.fla_size),
        (
            crate::fla::GpuAddr { node: 1, gpu: 1 }.base(),
            crate::fla::WINDOW_BYTES
        )
    );
}

#[test]
fn a_malformed_probe_response_is_refused_and_changes_nothing() {
    let dir = TempDir::new("probe-bad");
    let mut rm = node_with_probe(&dir, 0, ProbeStart::Pending);
    let good = fm_answer(&rm, 0);
    let bad = [
        ProbeInfo {
            cluster_uuid: "xyz".into(),
            ..good.clone()
        },
        ProbeInfo {
            fla_size: 0,
            ..good.clone()
        },
    ];
    for b in bad {
        assert_eq!(rm.complete_probe(0, b), Err(NvStatus::InvalidArgument));
    }
    assert_eq!(rm.complete_probe(2, good), Err(NvStatus::InvalidArgument));
    assert_eq!(rm.probe_info(0).unwrap().state, ProbeState::InProgress);
    assert_eq!(
        rm.probe_info(2).map(|p| p.state),
        Err(NvStatus::InvalidArgument)
    );
}
