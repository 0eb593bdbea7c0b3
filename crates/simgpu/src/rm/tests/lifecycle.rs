//! Teardown paths (DISABLE_IMPORTERS, session teardown, client exit), counters returning to
//! zero, and HBM reuse.

use std::os::unix::fs::FileExt;

use super::*;

#[test]
fn disable_importers_resets_the_clients_that_imported_from_the_node() {
    let mut p = pair("disable", 2 * MIB);
    let victim = app(&mut p.b, 0);
    let vi = p.b.import(victim, &p.handle, 0).unwrap();
    p.serve_import();
    // Another client imports from node 5: unaffected.
    let other = app(&mut p.b, 0);
    let h5 = FabricHandle {
        export_uuid: ExportUuid::new(9, 5),
        index: 0,
        size: PAGE_SIZE,
        cluster_uuid: [7; 16],
    };
    let oi = p.b.import(other, &h5.to_hex(), 0).unwrap();
    events(&mut p.b, p.b_token);
    assert_eq!(
        p.b.disable_importers(p.b_token ^ 1, 0),
        Err(NvStatus::InvalidState)
    );
    assert!(p.b.take_revoked().is_empty());
    p.b.disable_importers(p.b_token, 0).unwrap();
    assert!(p.b.is_disabled(victim) && !p.b.is_disabled(other));
    assert_eq!(
        p.b.take_revoked(),
        vec![victim],
        "the server kills exactly this client's process"
    );
    assert!(p.b.take_revoked().is_empty());
    assert_eq!(p.b.wait_import(victim, vi), Err(NvStatus::ResetRequired));
    assert_eq!(
        p.b.import(victim, &p.handle, 0),
        Err(NvStatus::ResetRequired)
    );
    assert_eq!(p.b.create(victim, 0, MIB), Err(NvStatus::ResetRequired));
    assert_eq!(p.b.subscribe(victim, 0), Err(NvStatus::ResetRequired));
    assert_eq!(p.b.wait_import(other, oi), Ok(ImportState::Pending));
    // No unimport event for the dropped descriptor; release of the dead handle completes.
    assert_eq!(p.b.stats().import_descriptors, 1);
    assert_eq!(p.b.release(victim, vi), Ok(Released::Done));
    assert!(events(&mut p.b, p.b_token).is_empty());
    // A re-import queries again.
    let fresh = app(&mut p.b, 0);
    p.b.import(fresh, &p.handle, 0).unwrap();
    assert_eq!(
        only_import_event(&mut p.b, p.b_token).1,
        FabricHandle::from_hex(&p.handle)
            .unwrap()
            .export_uuid
            .to_hex()
    );
}

#[test]
fn exporter_daemon_death_with_dangling_refs_disables_fabric_allocation() {
    let mut p = pair("teardown-a", 2 * MIB);
    let c = app(&mut p.b, 0);
    p.b.import(c, &p.handle, 0).unwrap();
    p.serve_import();
    p.a.release(p.exporter, p.mem).unwrap();
    assert!(p.a.disconnect(p.a_daemon).is_empty());
    let s = p.a.stats();
    assert_eq!(
        (
            s.node_id,
            s.session,
            s.daemon_export_refs,
            s.exports,
            s.hbm_used
        ),
        (NO_NODE, false, 0, 0, 2 * MIB)
    );
    assert!(!p.a.allow_fabric_alloc());
    assert_eq!(p.a.create(p.exporter, 0, MIB), Err(NvStatus::InvalidState));
    assert_eq!(p.a.get_events(p.a_token, 1), Err(NvStatus::InvalidState));
    // A new daemon re-enables allocations.
    let d = p.a.connect();
    p.a.open_session(d, 0).unwrap();
    assert!(p.a.create(p.exporter, 0, MIB).is_ok());
}

#[test]
fn a_clean_daemon_exit_keeps_fabric_allocation_but_forgets_exports() {
    let mut p = pair("teardown-clean", 2 * MIB);
    assert!(p.a.disconnect(p.a_daemon).is_empty());
    assert!(p.a.allow_fabric_alloc(), "no dangling export references");
    assert_eq!(
        p.a.stats().exports,
        0,
        "the export cache of the old node ID is cleared"
    );
    assert_eq!(p.a.export(p.exporter, p.mem).unwrap(), p.handle);
    let d = p.a.connect();
    let t = p.a.open_session(d, 0).unwrap();
    let uuid = FabricHandle::from_hex(&p.handle)
        .unwrap()
        .export_uuid
        .to_hex();
    assert_eq!(
        p.a.describe_export(t, &uuid, 0, 0),
        Err(NvStatus::ObjectNotFound)
    );
}

#[test]
fn importer_daemon_death_fails_pending_imports_disables_importers_and_wakes_unimports() {
    let mut p = pair("teardown-b", 2 * MIB);
    // `mapped` holds a ready import; `waiting` a pending one of another export; `leaving`
    // released its import and is blocked in the unimport.
    let mapped = app(&mut p.b, 0);
    let mi = p.b.import(mapped, &p.handle, 0).unwrap();
    p.serve_import();
    let second = p.a.create(p.exporter, 0, 2 * MIB).unwrap();
    let h2 = p.a.export(p.exporter, second.mem).unwrap();
    let leaving = app(&mut p.b, 0);
    let li = p.b.import(leaving, &h2, 0).unwrap();
    p.serve_import();
    let Ok(Released::Unimporting(uid)) = p.b.release(leaving, li) else {
        panic!("expected an unimport")
    };
    let waiting = app(&mut p.b, 0);
    let h5 = FabricHandle {
        export_uuid: ExportUuid::new(9, 5),
        index: 0,
        size: PAGE_SIZE,
        cluster_uuid: [7; 16],
    };
    let wi = p.b.import(waiting, &h5.to_hex(), 0).unwrap();
    let bystander = app(&mut p.b, 0);
    assert_eq!(p.b.stats().queued_events, 2);

    assert!(p.b.disconnect(p.b_daemon).is_empty());
    let s = p.b.stats();
    assert_eq!(
        (
            s.node_id,
            s.session,
            s.queued_events,
            s.pending_unimports,
            s.import_descriptors,
            s.import_refs
        ),
        (NO_NODE, false, 0, 0, 0, 0)
    );
    assert!(!p.b.unimport_pending(uid), "the blocked release completes");
    assert_eq!(p.b.wait_import(waiting, wi), Err(NvStatus::InvalidState));
    assert_eq!(p.b.wait_import(mapped, mi), Err(NvStatus::ResetRequired));
    assert!(p.b.is_disabled(mapped) && p.b.is_disabled(waiting) && !p.b.is_disabled(leaving));
    let mut revoked = p.b.take_revoked();
    revoked.sort_unstable();
    let mut want = vec![mapped, waiting];
    want.sort_unstable();
    assert_eq!(revoked, want);
    assert!(!p.b.is_disabled(bystander));
    assert!(
        p.b.allow_fabric_alloc(),
        "the importer's daemon held no export references"
    );
    // A new import finds no daemon to post its event to (§1.6 "Import request", §6.5).
    assert_eq!(p.b.import(bystander, &p.handle, 0), Err(NvStatus::NotReady));
    assert_eq!(p.b.release(mapped, mi), Ok(Released::Done));
}

#[test]
fn events_come_out_in_order_with_a_more_flag() {
    let mut p = pair("events", 2 * MIB);
    let c = app(&mut p.b, 0);
    for n in 10..13 {
        let h = FabricHandle {
            export_uuid: ExportUuid::new(n, 5),
            index: 0,
            size: PAGE_SIZE,
            cluster_uuid: [7; 16],
        };
        p.b.import(c, &h.to_hex(), 0).unwrap();
    }
    assert!(p.b.has_events());
    let (first, more) = p.b.get_events(p.b_token, 2).unwrap();
    assert!(more);
    let (rest, more) = p.b.get_events(p.b_token, 2).unwrap();
    assert!(!more);
    let ids: Vec<u64> = first
        .iter()
        .chain(&rest)
        .map(|e| match e {
            FabricEvent::Import { event_id, .. } => *event_id,
            _ => 0,
        })
        .collect();
    assert_eq!(ids, vec![1, 2, 3]);
    assert_eq!(
        p.b.get_events(p.b_token ^ 1, 2),
        Err(NvStatus::InvalidState)
    );
}

#[test]
fn disconnecting_clients_release_everything_and_counters_return_to_zero() {
    let mut p = pair("zero", 4 * MIB);
    let c1 = app(&mut p.b, 0);
    let c2 = app(&mut p.b, 0);
    p.b.import(c1, &p.handle, 0).unwrap();
    p.b.import(c2, &p.handle, 0).unwrap();
    let export_ref = p.serve_import();
    let local = app(&mut p.a, 0);
    p.a.import(local, &p.handle, 0).unwrap();
    // Importers exit without releasing: the last one's exit posts the unimport.
    assert!(p.b.disconnect(c1).is_empty());
    let ids = p.b.disconnect(c2);
    assert_eq!(ids.len(), 1);
    match events(&mut p.b, p.b_token).as_slice() {
        [
            FabricEvent::Unimport {
                unimport_event_id,
                import_event_id: 1,
                export_node: 0,
            },
        ] => {
            assert_eq!(*unimport_event_id, ids[0]);
        }
        other => panic!("expected one unimport, got {other:?}"),
    }
    p.a.release_export_ref(p.a_token, export_ref).unwrap();
    p.b.finish_unimport(p.b_token, &ids).unwrap();
    assert!(p.a.disconnect(p.exporter).is_empty());
    assert!(p.a.disconnect(local).is_empty());
    for (rm, clients) in [(&p.a, 1), (&p.b, 1)] {
        let s = rm.stats();
        assert_eq!(
            s,
            DriverStats {
                node_id: s.node_id,
                session: true,
                clients,
                ..DriverStats::default()
            },
            "everything released"
        );
    }
    let _ = (p.a_daemon, p.b_daemon);
}

#[test]
fn freed_memory_reads_as_zeros_when_reused() {
    let dir = TempDir::new("zeroed");
    let (mut rm, _, _) = node_with_session(&dir, 3, 3);
    let c = app(&mut rm, 0);
    let first = rm.create(c, 1, 4 * MIB).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&first.location.file)
        .unwrap();
    let secret = vec![0xA5u8; 4096];
    f.write_all_at(&secret, first.location.offset).unwrap();
    f.write_all_at(&secret, first.location.offset + 4 * MIB - 4096)
        .unwrap();
    rm.release(c, first.mem).unwrap();
    assert_eq!(rm.stats().hbm_used, 0);
    let again = rm.create(c, 1, 4 * MIB).unwrap();
    assert_eq!(again.location, first.location, "first fit reuses the range");
    let mut buf = vec![1u8; 4096];
    f.read_exact_at(&mut buf, again.location.offset).unwrap();
    assert!(buf.iter().all(|b| *b == 0));
    f.read_exact_at(&mut buf, again.location.offset + 4 * MIB - 4096)
        .unwrap();
    assert!(buf.iter().all(|b| *b == 0));
}

#[test]
fn freed_ranges_merge_back_into_contiguous_room() {
    let dir = TempDir::new("merge");
    let (mut rm, _, _) = node_with_session(&dir, 0, 0);
    let c = app(&mut rm, 0);
    let parts: Vec<Created> = (0..4).map(|_| rm.create(c, 0, 4 * MIB).unwrap()).collect();
    assert_eq!(rm.create(c, 0, PAGE_SIZE), Err(NvStatus::NoMemory));
    for i in [1, 3, 0, 2] {
        rm.release(c, parts[i].mem).unwrap();
    }
    assert_eq!(rm.create(c, 0, 16 * MIB).map(|x| x.location.offset), Ok(0));
}

#[test]
fn gpus_report_a_completed_fabric_probe_and_stable_uuids() {
    let dir = TempDir::new("gpus");
    let rm = node(&dir, 2);
    let gpus = rm.gpus();
    assert_eq!(gpus.len(), 2);
    assert_eq!(
        gpus[1].fabric_base,
        crate::fla::GpuAddr { node: 2, gpu: 1 }.base()
    );
    assert_eq!(
        (
            gpus[0].fabric_state.as_str(),
            gpus[0].hbm_bytes,
            gpus[0].clique_id
        ),
        ("COMPLETED", 16 * MIB, 1)
    );
    assert_eq!(gpus[0].uuid, gpu_uuid(&[7; 16], 2, 0));
    assert_ne!(gpus[0].uuid, gpus[1].uuid);
    assert!(gpus[0].uuid.starts_with("GPU-") && gpus[0].uuid.len() == 40);
    assert_eq!(gpus[0].cluster_uuid, "07".repeat(16));
    // A second driver on the same slot is refused (it would wipe live HBM).
    assert!(Rm::new(rm.config().clone()).is_err());
}
