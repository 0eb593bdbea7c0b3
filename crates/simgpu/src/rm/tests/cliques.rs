//! Cliques and bandwidth modes (`docs/reference/driver-interface.md` §1.6 "Map" and "Other
//! events", §5, §6.8): the owner GPU's cliqueId, bwMode and bwModeEpoch travel with the memory,
//! a GPU whose values differ may import it but not map it, and a probe update that changes a
//! GPU's clique posts CLIQUE_ID_CHANGE on channel 0.

use super::*;
use openimex_simproto::probe::{BW_MODE_HALF, ProbeInfo};

/// B's GPU `gpu` gets the probe update `change` on top of its current answer.
fn update(rm: &mut Rm, gpu: u32, change: impl FnOnce(&mut ProbeInfo)) {
    let mut info = rm.probe_info(gpu).unwrap().info.unwrap();
    change(&mut info);
    rm.complete_probe(gpu, info).unwrap();
}

/// B imports A's export (exported on A's GPU 1) and its daemon validates it: the import handle.
fn imported(p: &mut Pair) -> (ClientId, u64) {
    let b_app = app(&mut p.b, 0);
    let import = p.b.import(b_app, &p.handle, 0).unwrap();
    p.serve_import();
    (b_app, import)
}

/// A probe update's change to the answer.
type Change = fn(&mut ProbeInfo);

const REFUSED: &str = "Mapping Gpu is not attached to the given memory object";

/// §6.8: the mapping GPU's cliqueId, bwMode and bwModeEpoch must equal the owner's; each
/// mismatch alone refuses the map with NV_ERR_INVALID_STATE (`memoryfabricimportv2IsGpuMapAllowed`
/// via `dmaAllocMapping_GM107`), and equal values map.
#[test]
fn a_map_is_refused_on_a_gpu_whose_clique_bw_mode_or_epoch_differs_from_the_owners() {
    let mut p = pair("map-check", 2 * MIB);
    let (b_app, import) = imported(&mut p);
    assert_eq!(
        p.b.map_on_gpu(b_app, import, 0),
        Ok(()),
        "same clique, FULL, epoch 0"
    );
    assert_eq!(p.b.map_on_gpu(b_app, import, 1), Ok(()));

    let changes: [(&str, Change); 3] = [
        ("cliqueId", |i| i.clique_id = 2),
        ("bwMode", |i| i.bw_mode = BW_MODE_HALF),
        ("bwModeEpoch", |i| i.bw_mode_epoch = 1),
    ];
    for (field, change) in changes {
        update(&mut p.b, 1, change);
        let (status, detail) = p.b.map_on_gpu(b_app, import, 1).unwrap_err();
        assert_eq!(status, NvStatus::InvalidState, "{field}");
        assert!(detail.contains(REFUSED), "{detail}");
        assert!(
            detail.contains(&format!("{field} does not match")),
            "{detail}"
        );
        // GPU 0 still has the owner's values, and the import itself is untouched.
        assert_eq!(p.b.map_on_gpu(b_app, import, 0), Ok(()));
        // Back to the owner's values: allowed again.
        let owner = p.a.probe_info(1).unwrap().info.unwrap();
        update(&mut p.b, 1, |i| {
            (i.clique_id, i.bw_mode, i.bw_mode_epoch) =
                (owner.clique_id, owner.bw_mode, owner.bw_mode_epoch);
        });
        assert_eq!(p.b.map_on_gpu(b_app, import, 1), Ok(()), "{field}");
    }
    assert_eq!(
        p.b.map_on_gpu(b_app, import, 2).map_err(|e| e.0),
        Err(NvStatus::InvalidArgument),
        "no GPU 2"
    );
}

/// The owner's values are the ones at DESCRIBE time (§6.4: they travel with the memory): an
/// owner that moves to another clique after the import leaves the import carrying the old one.
#[test]
fn the_owner_attributes_travel_with_the_memory() {
    let mut p = pair("map-owner", 2 * MIB);
    update(&mut p.a, 1, |i| {
        (i.clique_id, i.bw_mode, i.bw_mode_epoch) = (4, BW_MODE_HALF, 3)
    });
    let (_, uuid, channel) = {
        let b_app = app(&mut p.b, 0);
        p.b.import(b_app, &p.handle, 0).unwrap();
        only_import_event(&mut p.b, p.b_token)
    };
    let (_, pages) = p.a.describe_export(p.a_token, &uuid, 0, channel).unwrap();
    assert_eq!(
        (pages.clique_id, pages.bw_mode, pages.bw_mode_epoch),
        (4, BW_MODE_HALF, 3)
    );
    // Memory of the node itself maps on any of its GPUs.
    let a_app = app(&mut p.a, 0);
    let own = p.a.create(a_app, 0, 2 * MIB).unwrap();
    assert_eq!(p.a.map_on_gpu(a_app, own.mem, 1), Ok(()));
}

/// §1.6 "Other events": CLIQUE_ID_CHANGE {gpuId, cliqueId} on channel 0, posted by a probe
/// update that changes the clique (`gpuFabricProbeReceiveUpdateKernelCallback`), not by the
/// first response, an update that keeps it, nor without a daemon session to signal.
#[test]
fn a_clique_change_posts_one_event_on_channel_0_and_nothing_else_does() {
    let dir = TempDir::new("clique-event");
    let mut rm = node(&dir, 0);
    // No session: the update applies, the event is dropped (`_fabricNotifyEvent` fails).
    update(&mut rm, 0, |i| i.clique_id = 5);
    assert_eq!(rm.probe_info(0).unwrap().info.unwrap().clique_id, 5);
    let d = rm.connect();
    let token = rm.open_session(d, 0).unwrap();
    assert!(events(&mut rm, token).is_empty());

    // Health and bandwidth updates with the same clique post nothing.
    update(&mut rm, 0, |i| i.health_mask = 0x1);
    assert!(events(&mut rm, token).is_empty());

    update(&mut rm, 1, |i| i.clique_id = 3);
    match events(&mut rm, token).as_slice() {
        [
            FabricEvent::CliqueIdChange {
                channel,
                gpu_id,
                clique_id,
                ..
            },
        ] => assert_eq!((*channel, *gpu_id, *clique_id), (0, 1, 3)),
        other => panic!("expected one CLIQUE_ID_CHANGE, got {other:?}"),
    }
}

/// The first probe response (NOT_STARTED / IN_PROGRESS → COMPLETE) is not a change.
#[test]
fn the_first_probe_response_is_not_a_clique_change() {
    let dir = TempDir::new("clique-first");
    let config = node(&dir, 0).config().clone();
    let mut rm = Rm::new(RmConfig {
        probe: ProbeStart::Pending,
        ..config
    })
    .unwrap();
    let d = rm.connect();
    let token = rm.open_session(d, 0).unwrap();
    let info = ProbeInfo {
        clique_id: 8,
        ..rm.default_probe_info(0)
    };
    rm.complete_probe(0, info).unwrap();
    assert!(events(&mut rm, token).is_empty());
}
