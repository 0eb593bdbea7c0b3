//! Multicast objects under faults (`docs/reference/driver-interface.md` §1.6 "Multicast" 7, §4;
//! `mem_multicast_fabric.c`, `imex_session_api.c`): an imported object's free unbinds its
//! memory and posts MEM_UNIMPORT per attach without blocking; DISABLE_IMPORTERS and a session
//! teardown disable the holders of imported multicast objects (never the prime's) and empty
//! the import cache. Node A (IMEX node 0) owns the prime, node B (IMEX node 1) imports it.

use super::multicast::{Pair, TEAM, bind, gpu, pair};
use super::*;
use openimex_simproto::inband::ToFm;
use openimex_simproto::multicast::table_dir;

/// A 2-GPU team: A's GPU 0 and B's GPU 0 (B's attach through the daemons, played here), set up
/// by the FM on both; B binds 2 MiB of its GPU 0. Returns B's attach event ID and B's memory.
fn team_with_b_bound(p: &mut Pair) -> (u64, u64) {
    p.a.mc_attach_gpu(p.a_app, p.prime, 0).unwrap();
    p.b.mc_attach_gpu(p.b_app, p.import, 0).unwrap();
    let queued = events(&mut p.b, p.b_token);
    let [
        FabricEvent::RemoteGpuAttach {
            event_id, gpu: g, ..
        },
    ] = queued.as_slice()
    else {
        panic!("expected one remote attach event, got {queued:?}");
    };
    p.a.mc_attach_remote_gpu(p.a_token, &p.uuid, 1, g.clone())
        .unwrap();
    let members = [gpu(0, 0), gpu(1, 0)];
    for rm in [&mut p.a, &mut p.b] {
        assert_eq!(rm.apply_mc_team(&p.uuid, &members, Ok(TEAM)), 1);
    }
    let mem = p.b.create(p.b_app, 0, 2 * MIB).unwrap().mem;
    p.b.mc_attach_mem(p.b_app, p.import, &bind(0, 0, mem, 0, 2 * MIB))
        .unwrap();
    (*event_id, mem)
}

/// `_memMulticastFabricDescriptorFree` → `_memorymulticastfabricDetachMem` and
/// `_memMulticastFabricGpuInfoRemove`: the imported object's free removes its binding from the
/// team's table (no store reaches that memory any more), drops its reference on the memory,
/// and posts one MEM_UNIMPORT naming the attach event; nothing waits for FINISH_MEM_UNIMPORT.
#[test]
fn an_imported_objects_free_unbinds_and_posts_mem_unimport_per_attach() {
    let dir = TempDir::new("mcf-unimport");
    let mut p = pair(&dir, 2, true);
    let (attach_event, mem) = team_with_b_bound(&mut p);
    let table = table_dir(&dir.0, TEAM.address_base);
    assert_eq!(std::fs::read_dir(&table).unwrap().count(), 1);

    p.b.release(p.b_app, p.import).unwrap();
    assert!(
        std::fs::read_dir(&table).map_or(true, |mut d| d.next().is_none()),
        "B's binding left the team's table"
    );
    let queued = events(&mut p.b, p.b_token);
    let [
        FabricEvent::Unimport {
            unimport_event_id,
            import_event_id,
            export_node: 0,
        },
    ] = queued.as_slice()
    else {
        panic!("expected one MEM_UNIMPORT for node 0, got {queued:?}");
    };
    assert_eq!(*import_event_id, attach_event);
    assert!(!p.b.unimport_pending(*unimport_event_id), "no blocked free");
    p.b.finish_unimport(p.b_token, &[*unimport_event_id])
        .unwrap();
    assert_eq!(
        p.b.take_fm_messages(),
        vec![ToFm::McTeamRelease {
            team_handle: TEAM.team_handle
        }],
        "every member tray releases the team at the FM, not only the prime's"
    );
    let s = p.b.stats();
    assert_eq!(
        (
            s.multicast_objects,
            s.multicast_bindings,
            s.pending_unimports
        ),
        (0, 0, 0)
    );
    assert_eq!(s.allocations, 1, "the memory's own handle still holds it");
    p.b.release(p.b_app, mem).unwrap();
    assert_eq!(p.b.stats().allocations, 0);
    // The prime keeps its remote member (no control detaches one) and its team.
    assert_eq!(p.a.stats().multicast_objects, 1);
    assert!(p.a.mc_info(p.a_app, p.prime).is_ok());
}

/// `imexsessionapiCtrlCmdDisableImporters` → `_checkClientDesiredImporterAndClearCache`: a
/// client holding an imported multicast object of the lost node is disabled (and killed), the
/// descriptor leaves the import cache (a re-import builds a new one); another node's loss
/// touches nobody, and the prime's holder is never matched.
#[test]
fn disable_importers_revokes_holders_of_the_nodes_multicast_imports() {
    let dir = TempDir::new("mcf-disable");
    let mut p = pair(&dir, 2, true);
    let (_, _) = team_with_b_bound(&mut p);
    let handle = p.a.mc_export(p.a_app, p.prime).unwrap();

    p.b.disable_importers(p.b_token, 5).unwrap();
    assert_eq!(
        p.b.take_revoked(),
        Vec::<ClientId>::new(),
        "node 5 exported nothing here"
    );
    p.a.disable_importers(p.a_token, 1).unwrap();
    assert_eq!(
        p.a.take_revoked(),
        Vec::<ClientId>::new(),
        "the prime's holder imported nothing"
    );

    p.b.disable_importers(p.b_token, 0).unwrap();
    assert_eq!(p.b.take_revoked(), vec![p.b_app]);
    assert!(p.b.is_disabled(p.b_app));
    let other = app(&mut p.b, 3);
    let again = p.b.mc_import(other, &handle).unwrap();
    assert_eq!(
        p.b.stats().multicast_objects,
        2,
        "the revoked descriptor left the cache: a new one"
    );
    // The killed process's handles are freed: its binding goes, the new import stays cached.
    p.b.disconnect(p.b_app);
    let s = p.b.stats();
    assert_eq!(
        (s.multicast_objects, s.multicast_bindings, s.allocations),
        (1, 0, 0)
    );
    let third = app(&mut p.b, 3);
    p.b.mc_import(third, &handle).unwrap();
    assert_eq!(
        p.b.stats().multicast_objects,
        1,
        "shares the new descriptor"
    );
    p.b.disconnect(third);
    p.b.release(other, again).unwrap();
    assert_eq!(p.b.stats().multicast_objects, 0);
}

/// `imexsessionapiDestruct` → `rcAndDisableOutstandingClientsWithImportedMemory` with
/// NV_FABRIC_INVALID_NODE_ID: the importer tray's daemon dies, every holder of an imported
/// multicast object is disabled; its later free posts no event (no daemon to read it) and
/// leaks nothing. The prime's tray losing its daemon disables nobody: the prime's holder keeps
/// its object and team.
#[test]
fn a_session_teardown_revokes_multicast_importers_but_not_the_prime() {
    let dir = TempDir::new("mcf-teardown");
    let mut p = pair(&dir, 2, true);
    let (_, mem) = team_with_b_bound(&mut p);

    p.a.disconnect(p.a_daemon);
    assert_eq!(p.a.take_revoked(), Vec::<ClientId>::new());
    assert!(p.a.mc_info(p.a_app, p.prime).is_ok(), "the prime is kept");

    p.b.disconnect(p.b_daemon);
    assert_eq!(p.b.take_revoked(), vec![p.b_app]);
    p.b.release(p.b_app, p.import).unwrap();
    p.b.release(p.b_app, mem).unwrap();
    let s = p.b.stats();
    assert_eq!(
        (
            s.multicast_objects,
            s.multicast_bindings,
            s.allocations,
            s.queued_events
        ),
        (0, 0, 0, 0)
    );
}

/// The FM's answer reaches a tray whose imported object went while it waited (the process was
/// killed before the last attach): the tray releases the team at once, as the real response
/// callback does for a descriptor freed meanwhile, so the FM can free the range.
#[test]
fn a_team_set_up_after_the_importer_went_is_released_by_its_tray() {
    let dir = TempDir::new("mcf-late-answer");
    let mut p = pair(&dir, 2, true);
    p.b.mc_attach_gpu(p.b_app, p.import, 0).unwrap();
    p.b.disconnect(p.b_app);
    let members = [gpu(0, 0), gpu(1, 0)];
    assert_eq!(p.b.apply_mc_team(&p.uuid, &members, Ok(TEAM)), 0);
    assert_eq!(
        p.b.take_fm_messages(),
        vec![ToFm::McTeamRelease {
            team_handle: TEAM.team_handle
        }]
    );
    assert_eq!(
        p.b.apply_mc_team(&p.uuid, &members, Err("NV_ERR_NO_MEMORY: x".into())),
        0
    );
    assert_eq!(p.b.take_fm_messages(), vec![], "a refusal holds nothing");
}
