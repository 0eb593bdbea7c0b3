//! Unit tests of the state machine: two nodes (slots 0 and 1, IMEX nodes 0 and 1) on one fabric
//! directory, the daemons played by the test. Where a test asserts what the real driver does, it
//! names the section of `docs/reference/driver-interface.md` it follows.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::*;
use openimex_simproto::proto::Validation;

mod cliques;
mod fidelity;
mod lifecycle;
mod multicast;
mod multicast_faults;
mod probe;

const MIB: u64 = 1 << 20;

/// A temporary directory (the harness's scratch dir: removed on drop, kept on a panic).
struct TempDir(PathBuf, #[allow(dead_code)] openimex_harness::ScratchDir);

impl TempDir {
    fn new(name: &str) -> Self {
        let s = openimex_harness::ScratchDir::new(&format!("simgpu-rm-{name}")).unwrap();
        Self(s.path().to_path_buf(), s)
    }
}

fn node(dir: &TempDir, slot: u16) -> Rm {
    node_with_channels(
        dir,
        slot,
        openimex_simproto::proto::DEFAULT_IMEX_CHANNEL_COUNT,
    )
}

fn node_with_channels(dir: &TempDir, slot: u16, imex_channel_count: u32) -> Rm {
    Rm::new(RmConfig {
        slot,
        gpus: 2,
        hbm_bytes: 16 * MIB,
        fabric_dir: dir.0.clone(),
        cluster_uuid: [7; 16],
        clique_id: 1,
        probe: Default::default(),
        imex_channel_count,
    })
    .unwrap()
}

/// A node with a daemon session as IMEX node `node_id`: (rm, daemon client, token).
fn node_with_session(dir: &TempDir, slot: u16, node_id: u16) -> (Rm, ClientId, u64) {
    let mut rm = node(dir, slot);
    let d = rm.connect();
    let token = rm.open_session(d, node_id).unwrap();
    (rm, d, token)
}

fn app(rm: &mut Rm, channel: u32) -> ClientId {
    let c = rm.connect();
    assert_eq!(rm.subscribe(c, channel), Ok(channel));
    c
}

fn events(rm: &mut Rm, token: u64) -> Vec<FabricEvent> {
    rm.get_events(token, 100).unwrap().0
}

/// The import event's ID, asserting it is the only event queued.
fn only_import_event(rm: &mut Rm, token: u64) -> (u64, String, u32) {
    match events(rm, token).as_slice() {
        [
            FabricEvent::Import {
                event_id,
                export_uuid,
                channel,
                ..
            },
        ] => (*event_id, export_uuid.clone(), *channel),
        other => panic!("expected one import event, got {other:?}"),
    }
}

/// Two nodes: A (slot 0, node 0) exports `size` bytes on GPU 1 (after a first allocation, so
/// the offset is not 0); B (slot 1, node 1) is ready to import.
struct Pair {
    _dir: TempDir,
    a: Rm,
    a_token: u64,
    a_daemon: ClientId,
    b: Rm,
    b_token: u64,
    b_daemon: ClientId,
    exporter: ClientId,
    mem: u64,
    location: MemLocation,
    handle: String,
}

fn pair(name: &str, size: u64) -> Pair {
    let dir = TempDir::new(name);
    let (mut a, a_daemon, a_token) = node_with_session(&dir, 0, 0);
    let (b, b_daemon, b_token) = node_with_session(&dir, 1, 1);
    let exporter = app(&mut a, 0);
    a.create(exporter, 1, 2 * MIB).unwrap();
    let created = a.create(exporter, 1, size).unwrap();
    let handle = a.export(exporter, created.mem).unwrap();
    Pair {
        _dir: dir,
        a,
        a_token,
        a_daemon,
        b,
        b_token,
        b_daemon,
        exporter,
        mem: created.mem,
        location: created.location,
        handle,
    }
}

impl Pair {
    /// B's daemon answers B's pending import event by asking A's daemon: returns A's export ref.
    fn serve_import(&mut self) -> u64 {
        let (event_id, uuid, channel) = only_import_event(&mut self.b, self.b_token);
        let (r, pages) = self
            .a
            .describe_export(self.a_token, &uuid, 0, channel)
            .unwrap();
        self.b
            .validate(self.b_token, event_id, Validation::Pages(pages))
            .unwrap();
        r
    }
}

#[test]
fn channel_is_required_once_and_for_life() {
    let dir = TempDir::new("chan");
    let (mut rm, _, _) = node_with_session(&dir, 0, 0);
    let c = rm.connect();
    assert_eq!(rm.create(c, 0, MIB), Err(NvStatus::InsufficientPermissions));
    assert_eq!(rm.export(c, 1), Err(NvStatus::InsufficientPermissions));
    let h = FabricHandle {
        export_uuid: ExportUuid::new(1, 3),
        index: 0,
        size: PAGE_SIZE,
        cluster_uuid: [7; 16],
    };
    assert_eq!(
        rm.import(c, &h.to_hex(), 0),
        Err(NvStatus::InsufficientPermissions)
    );
    assert_eq!(rm.subscribe(c, 2), Ok(2));
    assert_eq!(
        rm.subscribe(c, 2),
        Ok(2),
        "resubscribing to the same channel is fine"
    );
    assert_eq!(rm.subscribe(c, 3), Err(NvStatus::StateInUse));
    assert!(rm.create(c, 0, MIB).is_ok());
}

#[test]
fn channel_mismatch_is_refused_for_local_remote_and_dup() {
    let mut p = pair("chanmis", 4 * MIB);
    // Local import on another channel.
    let other = app(&mut p.a, 1);
    assert_eq!(
        p.a.import(other, &p.handle, 0),
        Err(NvStatus::InsufficientPermissions)
    );
    // A second remote importer on another channel than the cached descriptor's.
    let b0 = app(&mut p.b, 0);
    let b1 = app(&mut p.b, 1);
    p.b.import(b0, &p.handle, 0).unwrap();
    assert_eq!(
        p.b.import(b1, &p.handle, 0),
        Err(NvStatus::InsufficientPermissions)
    );
    // The exporter's daemon checks the channel the importer's event carries.
    let (_, uuid, _) = only_import_event(&mut p.b, p.b_token);
    assert_eq!(
        p.a.describe_export(p.a_token, &uuid, 0, 1),
        Err(NvStatus::InsufficientPermissions)
    );
    assert_eq!(p.a.stats().daemon_export_refs, 0);
}

#[test]
fn create_checks_session_arguments_and_room() {
    let dir = TempDir::new("create");
    let mut rm = node(&dir, 0);
    let c = app(&mut rm, 0);
    let d = rm.connect();
    assert_eq!(rm.open_session(d, NO_NODE), Err(NvStatus::InvalidArgument));
    rm.open_session(d, 4).unwrap();
    let second = rm.connect();
    assert_eq!(rm.open_session(second, 5), Err(NvStatus::InUse));
    assert_eq!(rm.create(c, 0, 0), Err(NvStatus::InvalidArgument));
    assert_eq!(rm.create(c, 2, MIB), Err(NvStatus::InvalidArgument));
    assert_eq!(rm.create(c, 0, u64::MAX), Err(NvStatus::InvalidArgument));
    let one = rm.create(c, 0, 1).unwrap();
    assert_eq!((one.location.size, one.location.offset), (PAGE_SIZE, 0));
    assert_eq!(
        one.location.file,
        crate::fla::GpuAddr { node: 0, gpu: 0 }.hbm_file(&dir.0)
    );
    assert_eq!(rm.create(c, 0, 16 * MIB), Err(NvStatus::NoMemory));
    let rest = rm.create(c, 0, 14 * MIB).unwrap();
    assert_eq!(rest.location.offset, PAGE_SIZE);
    assert_eq!(rm.stats().hbm_used, 16 * MIB);
}

#[test]
fn exporting_twice_returns_the_same_handle() {
    let mut p = pair("export", 3 * MIB);
    assert_eq!(p.a.export(p.exporter, p.mem).unwrap(), p.handle);
    let h = FabricHandle::from_hex(&p.handle).unwrap();
    assert_eq!(
        (h.export_uuid.node(), h.index, h.size, h.cluster_uuid),
        (0, 0, 4 * MIB, [7; 16])
    );
    assert_eq!(
        p.a.export(p.exporter, 999),
        Err(NvStatus::InvalidObjectHandle)
    );
    let stranger = app(&mut p.a, 0);
    assert_eq!(
        p.a.export(stranger, p.mem),
        Err(NvStatus::InvalidObjectHandle),
        "not its allocation"
    );
    assert_eq!(p.a.stats().exports, 1);
}

#[test]
fn import_needs_a_valid_handle() {
    let dir = TempDir::new("imp-garbage");
    let (mut c, _, _) = node_with_session(&dir, 2, 2);
    let cl = app(&mut c, 0);
    assert_eq!(c.import(cl, "00ff", 0), Err(NvStatus::InvalidArgument));
    assert_eq!(c.stats().import_descriptors, 0);
}

#[test]
fn many_importers_of_one_handle_share_one_descriptor_and_one_event() {
    let mut p = pair("oneevent", 4 * MIB);
    let clients: Vec<ClientId> = (0..3).map(|_| app(&mut p.b, 0)).collect();
    let imports: Vec<u64> = clients
        .iter()
        .map(|&c| p.b.import(c, &p.handle, 0).unwrap())
        .collect();
    let evs = events(&mut p.b, p.b_token);
    let h = FabricHandle::from_hex(&p.handle).unwrap();
    assert_eq!(
        evs,
        vec![FabricEvent::Import {
            event_id: 1,
            channel: 0,
            export_uuid: h.export_uuid.to_hex(),
            index: 0,
            import_id: 0,
            export_node: 0
        }]
    );
    for (c, i) in clients.iter().zip(&imports) {
        assert_eq!(p.b.wait_import(*c, *i), Ok(ImportState::Pending));
    }
    let s = p.b.stats();
    assert_eq!(
        (s.import_descriptors, s.import_refs, s.queued_events),
        (1, 3, 0)
    );
    assert_eq!(
        p.b.wait_import(clients[0], imports[1]),
        Err(NvStatus::InvalidObjectHandle),
        "not its import"
    );
}

#[test]
fn validate_makes_imports_ready_at_the_exporters_file_and_offset() {
    let mut p = pair("ready", 6 * MIB);
    let c1 = app(&mut p.b, 0);
    let c2 = app(&mut p.b, 0);
    let i1 = p.b.import(c1, &p.handle, 0).unwrap();
    let i2 = p.b.import(c2, &p.handle, 0).unwrap();
    p.serve_import();
    assert_eq!(p.location.offset, PAGE_SIZE);
    assert_eq!(
        p.b.wait_import(c1, i1),
        Ok(ImportState::Ready(p.location.clone()))
    );
    assert_eq!(
        p.b.wait_import(c2, i2),
        Ok(ImportState::Ready(p.location.clone()))
    );
    // The exporter's bytes are what the importer's range holds.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p.location.file)
        .unwrap();
    f.write_all_at(b"hello fabric", p.location.offset + 5)
        .unwrap();
    let mut buf = [0u8; 12];
    f.read_exact_at(&mut buf, p.location.offset + 5).unwrap();
    assert_eq!(&buf, b"hello fabric");
    assert_eq!(
        p.b.validate(p.b_token, 1, Validation::ImportFailed),
        Err(NvStatus::InvalidState)
    );
    assert_eq!(
        p.b.validate(p.b_token, 77, Validation::ImportFailed),
        Err(NvStatus::InvalidArgument)
    );
    assert_eq!(
        p.b.validate(p.b_token ^ 1, 1, Validation::ImportFailed),
        Err(NvStatus::InvalidState)
    );
}

#[test]
fn pages_that_are_not_contiguous_cannot_be_mapped() {
    let mut p = pair("badpages", 4 * MIB);
    let c = app(&mut p.b, 0);
    let i = p.b.import(c, &p.handle, 0).unwrap();
    let (event_id, uuid, ch) = only_import_event(&mut p.b, p.b_token);
    let (_, mut pages) = p.a.describe_export(p.a_token, &uuid, 0, ch).unwrap();
    pages.pfns.swap(0, 1);
    p.b.validate(p.b_token, event_id, Validation::Pages(pages))
        .unwrap();
    assert_eq!(p.b.wait_import(c, i), Err(NvStatus::InvalidArgument));
}

/// §4 "Failed import" and §1.6 "Unimport" 5: VALIDATE with IMPORT_FAILED makes every waiter's
/// object NV_ERR_INVALID_OBJECT, and its release posts no unimport.
#[test]
fn a_failed_import_fails_every_waiter_and_unimports_silently() {
    let mut p = pair("failed", 2 * MIB);
    let c1 = app(&mut p.b, 0);
    let c2 = app(&mut p.b, 0);
    let i1 = p.b.import(c1, &p.handle, 0).unwrap();
    let i2 = p.b.import(c2, &p.handle, 0).unwrap();
    let (event_id, _, _) = only_import_event(&mut p.b, p.b_token);
    p.b.validate(p.b_token, event_id, Validation::ImportFailed)
        .unwrap();
    assert_eq!(p.b.wait_import(c1, i1), Err(NvStatus::InvalidObject));
    assert_eq!(p.b.wait_import(c2, i2), Err(NvStatus::InvalidObject));
    assert_eq!(p.b.release(c1, i1), Ok(Released::Done));
    assert_eq!(p.b.release(c2, i2), Ok(Released::Done));
    assert!(
        events(&mut p.b, p.b_token).is_empty(),
        "no unimport after IMPORT_FAILED"
    );
    assert_eq!(p.b.stats().import_descriptors, 0);
    assert_eq!(p.b.release(c2, i2), Err(NvStatus::InvalidObjectHandle));
}

#[test]
fn releasing_the_last_reference_unimports_and_blocks_until_finished() {
    let mut p = pair("unimport", 2 * MIB);
    let c1 = app(&mut p.b, 0);
    let c2 = app(&mut p.b, 0);
    let i1 = p.b.import(c1, &p.handle, 0).unwrap();
    let i2 = p.b.import(c2, &p.handle, 0).unwrap();
    let export_ref = p.serve_import();
    assert_eq!(p.b.release(c1, i1), Ok(Released::Done));
    assert!(
        events(&mut p.b, p.b_token).is_empty(),
        "another reference remains"
    );
    let Ok(Released::Unimporting(id)) = p.b.release(c2, i2) else {
        panic!("expected an unimport")
    };
    assert_eq!(
        events(&mut p.b, p.b_token),
        vec![FabricEvent::Unimport {
            unimport_event_id: id,
            import_event_id: 1,
            export_node: 0
        }]
    );
    assert!(p.b.unimport_pending(id));
    assert_eq!(
        (
            p.b.stats().pending_unimports,
            p.b.stats().import_descriptors
        ),
        (1, 1)
    );
    // A new import while the old one is being unimported gets a fresh descriptor and event.
    let c3 = app(&mut p.b, 0);
    let i3 = p.b.import(c3, &p.handle, 0).unwrap();
    assert!(matches!(only_import_event(&mut p.b, p.b_token), (e, _, _) if e > id));
    // The daemon tells the exporter, then finishes: the releaser is unblocked.
    p.a.release_export_ref(p.a_token, export_ref).unwrap();
    p.b.finish_unimport(p.b_token, &[id, 12345]).unwrap();
    assert!(!p.b.unimport_pending(id));
    assert_eq!(
        (
            p.b.stats().pending_unimports,
            p.b.stats().import_descriptors
        ),
        (0, 1)
    );
    // A pending import still unimports (the daemon may already hold references for it).
    assert!(matches!(p.b.release(c3, i3), Ok(Released::Unimporting(_))));
}

#[test]
fn the_daemons_reference_keeps_memory_alive_after_the_creator_releases() {
    let mut p = pair("keepalive", 4 * MIB);
    let c = app(&mut p.b, 0);
    let i = p.b.import(c, &p.handle, 0).unwrap();
    let r1 = p.serve_import();
    let used = p.a.stats().hbm_used;
    assert_eq!(p.a.release(p.exporter, p.mem), Ok(Released::Done));
    let s = p.a.stats();
    assert_eq!(
        (s.allocations, s.exports, s.daemon_export_refs, s.hbm_used),
        (2, 1, 1, used)
    );
    // Still resolvable by UUID: a second importer node could dup it.
    let uuid = FabricHandle::from_hex(&p.handle)
        .unwrap()
        .export_uuid
        .to_hex();
    let (r2, _) = p.a.describe_export(p.a_token, &uuid, 0, 0).unwrap();
    assert_eq!(p.a.release_export_ref(p.a_token, r1), Ok(()));
    assert_eq!(
        p.a.release_export_ref(p.a_token, r1),
        Err(NvStatus::InvalidObjectHandle)
    );
    assert_eq!(p.a.stats().exports, 1);
    p.a.release_export_ref(p.a_token, r2).unwrap();
    let s = p.a.stats();
    assert_eq!(
        (s.allocations, s.exports, s.daemon_export_refs, s.hbm_used),
        (1, 0, 0, 2 * MIB)
    );
    assert_eq!(
        p.a.describe_export(p.a_token, &uuid, 0, 0),
        Err(NvStatus::ObjectNotFound)
    );
    assert_eq!(
        p.b.wait_import(c, i).map(|_| ()),
        Ok(()),
        "the importer's state is the daemon's business"
    );
}

#[test]
fn local_imports_need_no_daemon_and_hold_the_memory() {
    let mut p = pair("local", 2 * MIB);
    let c = app(&mut p.a, 0);
    let i = p.a.import(c, &p.handle, 0).unwrap();
    assert_eq!(
        p.a.wait_import(c, i),
        Ok(ImportState::Ready(p.location.clone()))
    );
    assert!(events(&mut p.a, p.a_token).is_empty());
    assert_eq!(p.a.stats().import_refs, 1);
    p.a.release(p.exporter, p.mem).unwrap();
    assert_eq!(p.a.stats().hbm_used, 4 * MIB, "the local import keeps it");
    assert_eq!(p.a.release(c, i), Ok(Released::Done));
    assert_eq!(
        (
            p.a.stats().hbm_used,
            p.a.stats().exports,
            p.a.stats().import_refs
        ),
        (2 * MIB, 0, 0)
    );
    assert_eq!(p.a.import(c, &p.handle, 0), Err(NvStatus::ObjectNotFound));
}
