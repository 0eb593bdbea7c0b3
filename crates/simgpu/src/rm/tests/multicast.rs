//! Multicast (NVLS) objects (`docs/reference/driver-interface.md` §1.6 "Multicast (NVLS) across
//! nodes", §6.10; `mem_multicast_fabric.c`): the team completes only after the last attach,
//! the team request carries every member, a refused team or SET_FAILURE fails every member, the
//! attach refusals and their statuses, and frees that leak nothing. Node A (slot 0, IMEX node 0)
//! owns the prime; node B (slot 1, IMEX node 1) imports it; the test plays the daemons and the
//! Fabric Manager.

use super::*;
use openimex_simproto::inband::{FabricGpu, McTeam, ToFm};
use openimex_simproto::multicast::{McBind, McBinding, RemoteGpu, table_dir};
use openimex_simproto::probe::ProbeInfo;

pub(super) const TEAM: McTeam = McTeam {
    team_handle: 77,
    address_base: 1 << 50,
    address_size: 4 * MIB,
};

/// ATTACH_MEM's arguments, in their order.
pub(super) fn bind(gpu: u32, offset: u64, mem: u64, mem_offset: u64, size: u64) -> McBind {
    McBind {
        gpu,
        offset,
        mem,
        mem_offset,
        size,
    }
}

pub(super) fn gpu(slot: u16, gpu: u32) -> FabricGpu {
    FabricGpu { slot, gpu }
}

/// An ATTACH_REMOTE_GPU of `g` with clique `clique_id` and page size `page_size`.
fn remote(g: FabricGpu, clique_id: u32, page_size: u64) -> RemoteGpu {
    RemoteGpu {
        gpu_probe_handle: openimex_simproto::multicast::probe_handle(g),
        key: 1,
        clique_id,
        bw_mode: 0,
        bw_mode_epoch: 0,
        page_size,
    }
}

/// A prime on A for `num_gpus` GPUs, exported, and B's import of it, both with an FM linked.
pub(super) struct Pair {
    pub(super) a: Rm,
    pub(super) a_daemon: ClientId,
    pub(super) a_token: u64,
    pub(super) b: Rm,
    pub(super) b_daemon: ClientId,
    pub(super) b_token: u64,
    pub(super) a_app: ClientId,
    pub(super) b_app: ClientId,
    pub(super) prime: u64,
    pub(super) import: u64,
    pub(super) uuid: String,
}

pub(super) fn pair(dir: &TempDir, num_gpus: u32, fm_link: bool) -> Pair {
    let (mut a, a_daemon, a_token) = node_with_session(dir, 0, 0);
    let (mut b, b_daemon, b_token) = node_with_session(dir, 1, 1);
    a.set_fm_link(fm_link);
    b.set_fm_link(fm_link);
    let a_app = app(&mut a, 3);
    let b_app = app(&mut b, 3);
    let prime = a.mc_create(a_app, num_gpus, 4 * MIB, 0).unwrap();
    let handle = a.mc_export(a_app, prime).unwrap();
    let uuid = FabricHandle::from_hex(&handle)
        .unwrap()
        .export_uuid
        .to_hex();
    let import = b.mc_import(b_app, &handle).unwrap();
    Pair {
        a,
        a_daemon,
        a_token,
        b,
        b_daemon,
        b_token,
        a_app,
        b_app,
        prime,
        import,
        uuid,
    }
}

impl Pair {
    /// B attaches `g`: its REMOTE_GPU_ATTACH event, forwarded to A as B's daemon and A's would
    /// (§1.6 "Multicast" 3-4). Returns A's answer.
    pub(super) fn remote_attach(&mut self, g: u32) -> Result<(), NvStatus> {
        self.b.mc_attach_gpu(self.b_app, self.import, g).unwrap();
        let queued = events(&mut self.b, self.b_token);
        let [
            FabricEvent::RemoteGpuAttach {
                export_uuid,
                export_node: 0,
                channel: 3,
                index: 0,
                gpu,
                ..
            },
        ] = queued.as_slice()
        else {
            panic!("expected one remote attach event");
        };
        assert_eq!(export_uuid, &self.uuid);
        self.a
            .mc_attach_remote_gpu(self.a_token, export_uuid, 1, gpu.clone())
    }
}

/// §6.10: "Complete the team (an address base) only after the last attach"; §1.6 "Multicast"
/// 5: the prime's driver then sends one team request with every member, and the FM's answer
/// completes every node's object.
#[test]
fn the_team_request_goes_exactly_at_the_last_attach_with_every_member() {
    let dir = TempDir::new("mc-last-attach");
    let mut p = pair(&dir, 4, true);
    p.a.mc_attach_gpu(p.a_app, p.prime, 0).unwrap();
    p.remote_attach(0).unwrap();
    p.remote_attach(1).unwrap();
    assert_eq!(
        p.a.take_fm_messages(),
        vec![],
        "3 of 4 attached: no request"
    );
    for (rm, c, mc) in [(&p.a, p.a_app, p.prime), (&p.b, p.b_app, p.import)] {
        assert_eq!(rm.mc_info(c, mc), Err(NvStatus::NotReady));
    }
    let m = p.a.create(p.a_app, 0, 2 * MIB).unwrap().mem;
    assert_eq!(
        p.a.mc_attach_mem(p.a_app, p.prime, &bind(0, 0, m, 0, 2 * MIB)),
        Err(NvStatus::NotReady),
        "binding needs the team"
    );
    p.a.mc_attach_gpu(p.a_app, p.prime, 1).unwrap();
    let members = vec![gpu(0, 0), gpu(0, 1), gpu(1, 0), gpu(1, 1)];
    assert_eq!(
        p.a.take_fm_messages(),
        vec![ToFm::McTeamSetup {
            team_key: p.uuid.clone(),
            size: 4 * MIB,
            members: members.clone(),
        }]
    );
    assert_eq!(
        p.a.mc_attach_gpu(p.a_app, p.prime, 1),
        Err(NvStatus::InvalidOperation),
        "the team is full"
    );
    // Still not ready: only the FM's answer completes it.
    assert_eq!(p.a.mc_info(p.a_app, p.prime), Err(NvStatus::NotReady));
    for rm in [&mut p.a, &mut p.b] {
        assert_eq!(rm.apply_mc_team(&p.uuid, &members, Ok(TEAM)), 1);
    }
    for (rm, c, mc, attached) in [(&p.a, p.a_app, p.prime, 4), (&p.b, p.b_app, p.import, 2)] {
        let info = rm.mc_info(c, mc).unwrap();
        assert_eq!(info.team, Some(TEAM));
        assert_eq!(info.members, members);
        assert_eq!(info.size, 4 * MIB, "an import's size is the FM's");
        assert_eq!(info.num_attached_gpus, attached);
    }
    assert_eq!(
        p.b.mc_attach_gpu(p.b_app, p.import, 1),
        Err(NvStatus::StateInUse),
        "set up already (checked before the duplicate)"
    );
}

/// §6.10 "Allow a failure status"; `_memorymulticastfabricCtrlSetFailure`: the owner's daemon
/// fails the prime; every object of the team reports the status (B's through the FM).
#[test]
fn set_failure_reaches_every_member() {
    let dir = TempDir::new("mc-set-failure");
    let mut p = pair(&dir, 3, true);
    p.a.mc_attach_gpu(p.a_app, p.prime, 0).unwrap();
    p.remote_attach(1).unwrap();
    assert_eq!(
        p.a.mc_set_failure(p.a_token, &p.uuid, NvStatus::NotReady),
        Err(NvStatus::InvalidArgument),
        "NOT_READY is the initial state, not a failure"
    );
    assert_eq!(
        p.a.mc_set_failure(p.a_token + 1, &p.uuid, NvStatus::NoMemory),
        Err(NvStatus::InvalidState),
        "daemon only"
    );
    p.a.mc_set_failure(p.a_token, &p.uuid, NvStatus::NoMemory)
        .unwrap();
    assert_eq!(p.a.mc_info(p.a_app, p.prime), Err(NvStatus::NoMemory));
    let relay = p.a.take_fm_messages();
    let [
        ToFm::McTeamFailed {
            team_key,
            members,
            reason,
        },
    ] = relay.as_slice()
    else {
        panic!("expected the failure for the FM, got {relay:?}");
    };
    assert_eq!((team_key, members), (&p.uuid, &vec![gpu(1, 1)]));
    // The FM relays it as a refused team to each member's driver.
    assert_eq!(p.b.apply_mc_team(team_key, members, Err(reason.clone())), 1);
    assert_eq!(p.b.mc_info(p.b_app, p.import), Err(NvStatus::NoMemory));
    let m = p.b.create(p.b_app, 1, 2 * MIB).unwrap().mem;
    assert_eq!(
        p.b.mc_attach_mem(p.b_app, p.import, &bind(1, 0, m, 0, 2 * MIB)),
        Err(NvStatus::NoMemory),
        "a use of a failed object returns its status"
    );
}

/// §1.6 "Multicast" 5: a team the FM refuses fails every member's object.
#[test]
fn a_refused_team_fails_every_member() {
    let dir = TempDir::new("mc-refused");
    let mut p = pair(&dir, 2, true);
    p.remote_attach(0).unwrap();
    p.a.mc_attach_gpu(p.a_app, p.prime, 0).unwrap();
    let sent = p.a.take_fm_messages();
    let [ToFm::McTeamSetup { members, .. }] = sent.as_slice() else {
        panic!("expected the team request");
    };
    let members = members.clone();
    for rm in [&mut p.a, &mut p.b] {
        let why = Err("NV_ERR_INVALID_STATE: no multicast range left".to_string());
        assert_eq!(rm.apply_mc_team(&p.uuid, &members, why), 1);
    }
    assert_eq!(p.a.mc_info(p.a_app, p.prime), Err(NvStatus::InvalidState));
    assert_eq!(p.b.mc_info(p.b_app, p.import), Err(NvStatus::InvalidState));
    // A later answer changes nothing.
    assert_eq!(p.a.apply_mc_team(&p.uuid, &members, Ok(TEAM)), 0);
    assert_eq!(
        p.a.take_fm_messages(),
        vec![ToFm::McTeamRelease { team_handle: 77 }],
        "a failed prime releases a team the FM set up anyway"
    );
    // An unnamed status is GENERIC.
    let mut c = pair(&TempDir::new("mc-refused-generic"), 1, true);
    c.a.mc_attach_gpu(c.a_app, c.prime, 0).unwrap();
    c.a.apply_mc_team(&c.uuid, &[gpu(0, 0)], Err("no room".into()));
    assert_eq!(c.a.mc_info(c.a_app, c.prime), Err(NvStatus::Generic));
}

/// `_memorymulticastfabricCtrlAttachRemoteGpu`: a refused remote attach fails the prime (and
/// so every member) with its status.
#[test]
fn a_refused_remote_attach_fails_the_prime() {
    let dir = TempDir::new("mc-remote-refused");
    let mut p = pair(&dir, 3, true);
    p.a.mc_attach_gpu(p.a_app, p.prime, 0).unwrap();
    let bad_page = remote(gpu(1, 0), 1, 512 * MIB);
    assert_eq!(
        p.a.mc_attach_remote_gpu(p.a_token, &p.uuid, 1, bad_page.clone()),
        Err(NvStatus::InvalidArgument)
    );
    assert_eq!(
        p.a.mc_info(p.a_app, p.prime),
        Err(NvStatus::InvalidArgument)
    );
    assert_eq!(
        p.a.mc_attach_remote_gpu(p.a_token, &"00".repeat(16), 1, bad_page),
        Err(NvStatus::ObjectNotFound),
        "no such export: the daemon's dup fails"
    );

    let mut q = pair(&TempDir::new("mc-remote-clique"), 3, true);
    q.a.mc_attach_gpu(q.a_app, q.prime, 0).unwrap();
    let other_clique = remote(gpu(1, 0), 2, PAGE_SIZE);
    assert_eq!(
        q.a.mc_attach_remote_gpu(q.a_token, &q.uuid, 1, other_clique),
        Err(NvStatus::InvalidDevice)
    );
    let dup = remote(gpu(0, 0), 1, PAGE_SIZE);
    let mut r = pair(&TempDir::new("mc-remote-dup"), 3, true);
    r.a.mc_attach_gpu(r.a_app, r.prime, 0).unwrap();
    assert_eq!(
        r.a.mc_attach_remote_gpu(r.a_token, &r.uuid, 1, dup),
        Err(NvStatus::InsertDuplicateName)
    );
    assert_eq!(
        r.a.mc_info(r.a_app, r.prime),
        Err(NvStatus::InsertDuplicateName)
    );
}

/// With no Fabric Manager linked the driver sets up a team of its own GPUs itself, and refuses
/// one with GPUs of another tray (NV_ERR_NOT_SUPPORTED, as when the FM lacks the team caps).
#[test]
fn without_an_fm_only_single_tray_teams_complete() {
    let dir = TempDir::new("mc-no-fm");
    let mut p = pair(&dir, 2, false);
    p.remote_attach(0).unwrap();
    assert_eq!(
        p.a.mc_attach_gpu(p.a_app, p.prime, 0),
        Err(NvStatus::NotSupported)
    );
    assert_eq!(p.a.take_fm_messages(), vec![]);
    assert_eq!(
        p.a.mc_info(p.a_app, p.prime),
        Err(NvStatus::NotSupported),
        "the prime fails with it"
    );

    let (mut a, _, _) = node_with_session(&TempDir::new("mc-no-fm-local"), 0, 0);
    let c = app(&mut a, 0);
    let mc = a.mc_create(c, 2, 2 * MIB, 0).unwrap();
    a.mc_attach_gpu(c, mc, 1).unwrap();
    assert_eq!(a.mc_info(c, mc), Err(NvStatus::NotReady));
    a.mc_attach_gpu(c, mc, 0).unwrap();
    let info = a.mc_info(c, mc).unwrap();
    assert_eq!(info.members, vec![gpu(0, 1), gpu(0, 0)]);
    assert_eq!(info.num_attached_gpus, 2);
    assert_eq!(a.take_fm_messages(), vec![]);
}

/// `_memMulticastFabricValidateAllocParams` and `_memorymulticastfabricCtrlAttachGpu`: the
/// create's argument checks; no attach before the GPU's probe completed (NV_ERR_NOT_READY, no
/// probe handle) or on a GPU without multicast; an unknown GPU is NV_ERR_INVALID_DEVICE, a GPU
/// of another clique too.
#[test]
fn creates_and_attaches_are_refused_as_the_real_driver_refuses_them() {
    let dir = TempDir::new("mc-refusals");
    let config = node(&dir, 0).config().clone();
    let mut rm = Rm::new(RmConfig {
        probe: ProbeStart::Pending,
        ..config
    })
    .unwrap();
    let c = app(&mut rm, 0);
    for (n, size, page) in [
        (0, 2 * MIB, 0),
        (u32::MAX, 2 * MIB, 0),
        (1, MIB, 0),
        (1, 0, 0),
    ] {
        assert_eq!(
            rm.mc_create(c, n, size, page),
            Err(NvStatus::InvalidArgument)
        );
    }
    assert_eq!(
        rm.mc_create(c, 1, 512 * MIB, 512 * MIB),
        Err(NvStatus::InvalidArgument),
        "this fabric's page size only"
    );
    let mc = rm
        .mc_create(c, 2, 2 * MIB, 0)
        .expect("the prime has no GPU: no probe check");
    assert_eq!(rm.mc_attach_gpu(c, mc, 0), Err(NvStatus::NotReady));
    assert_eq!(rm.mc_attach_gpu(c, mc, 2), Err(NvStatus::InvalidDevice));
    let no_mc = ProbeInfo {
        caps: 0,
        ..rm.default_probe_info(0)
    };
    rm.complete_probe(0, no_mc).unwrap();
    assert_eq!(rm.mc_attach_gpu(c, mc, 0), Err(NvStatus::NotSupported));
    let info = rm.default_probe_info(0);
    rm.complete_probe(0, info).unwrap();
    let other_clique = ProbeInfo {
        clique_id: 4,
        ..rm.default_probe_info(1)
    };
    rm.complete_probe(1, other_clique).unwrap();
    rm.mc_attach_gpu(c, mc, 0).unwrap();
    assert_eq!(
        rm.mc_attach_gpu(c, mc, 0),
        Err(NvStatus::InsertDuplicateName)
    );
    assert_eq!(rm.mc_attach_gpu(c, mc, 1), Err(NvStatus::InvalidDevice));
    assert_eq!(
        rm.mc_attach_gpu(c, 999, 0),
        Err(NvStatus::InvalidObjectHandle)
    );
}

/// §6.10 and the multicast table: bound memory is listed in the team's table, holds its
/// allocation until the object goes, and freeing everything leaves no count, no table file.
#[test]
fn binds_are_listed_and_frees_leak_nothing() {
    let dir = TempDir::new("mc-frees");
    let (mut rm, _, _) = node_with_session(&dir, 2, 2);
    let c = app(&mut rm, 0);
    let mc = rm.mc_create(c, 2, 4 * MIB, 0).unwrap();
    rm.mc_attach_gpu(c, mc, 0).unwrap();
    rm.mc_attach_gpu(c, mc, 1).unwrap();
    let m0 = rm.create(c, 0, 4 * MIB).unwrap();
    let m1 = rm.create(c, 1, 2 * MIB).unwrap();
    assert_eq!(
        rm.mc_attach_mem(c, mc, &bind(0, 0, m1.mem, 0, 2 * MIB)),
        Err(NvStatus::InvalidDevice),
        "memory of another GPU"
    );
    assert_eq!(
        rm.mc_attach_mem(c, mc, &bind(1, 2 * MIB, m1.mem, 0, 4 * MIB)),
        Err(NvStatus::InvalidArgument),
        "past the object's end"
    );
    rm.mc_attach_mem(c, mc, &bind(0, 0, m0.mem, 2 * MIB, 2 * MIB))
        .unwrap();
    rm.mc_attach_mem(c, mc, &bind(1, 0, m1.mem, 0, 2 * MIB))
        .unwrap();
    let info = rm.mc_info(c, mc).unwrap();
    let table = table_dir(&dir.0, info.team.unwrap().address_base);
    let mut listed: Vec<McBinding> = std::fs::read_dir(&table)
        .unwrap()
        .map(|e| serde_json::from_slice(&std::fs::read(e.unwrap().path()).unwrap()).unwrap())
        .collect();
    listed.sort_by_key(|b| b.gpu);
    assert_eq!(listed.len(), 2);
    assert_eq!(
        (listed[0].gpu, listed[0].file_offset, listed[0].size),
        (gpu(2, 0), m0.location.offset + 2 * MIB, 2 * MIB)
    );
    assert_eq!(listed[1].file, m1.location.file.to_string_lossy());
    let s = rm.stats();
    assert_eq!((s.multicast_objects, s.multicast_bindings), (1, 2));

    // The allocations outlive their handles while bound.
    rm.release(c, m0.mem).unwrap();
    rm.release(c, m1.mem).unwrap();
    assert_eq!(rm.stats().allocations, 2);
    rm.release(c, mc).unwrap();
    let s = rm.stats();
    assert_eq!(
        s,
        DriverStats {
            node_id: 2,
            session: true,
            clients: 2,
            ..DriverStats::default()
        }
    );
    assert!(!table.exists(), "the table went with the team");

    // A client that goes frees its objects too.
    let c2 = app(&mut rm, 0);
    let mc = rm.mc_create(c2, 1, 2 * MIB, 0).unwrap();
    let imp = rm.mc_export(c2, mc).unwrap();
    rm.mc_import(c2, &imp).unwrap();
    assert_eq!(rm.stats().multicast_objects, 2);
    rm.disconnect(c2);
    assert_eq!(rm.stats().multicast_objects, 0);
}

/// The team over 4 trays (§1.6 "Multicast" 3-6, §6.10): the prime on tray 0 and an
/// import on each of trays 1-3, one GPU each; every remote attach goes through the daemons
/// (played here) to the prime; only the fourth attach sends the team request, with all 4
/// members; the FM's answer completes the object on every tray, each binds its memory, and the
/// multicast table lists the 4 trays' memory; freeing every object releases the team.
#[test]
fn a_team_over_four_trays_completes_only_after_the_last_attach() {
    let dir = TempDir::new("mc-four-trays");
    let mut trays: Vec<(Rm, u64, ClientId)> = (0..4u16)
        .map(|slot| {
            let (mut rm, _, token) = node_with_session(&dir, slot, slot);
            rm.set_fm_link(true);
            let c = app(&mut rm, 1);
            (rm, token, c)
        })
        .collect();
    let (prime_tray, rest) = trays.split_at_mut(1);
    let (a, a_token, a_app) = &mut prime_tray[0];
    let prime = a.mc_create(*a_app, 4, 2 * MIB, 0).unwrap();
    let handle = a.mc_export(*a_app, prime).unwrap();
    let uuid = FabricHandle::from_hex(&handle)
        .unwrap()
        .export_uuid
        .to_hex();
    let mut objects = vec![prime];
    for (i, (rm, token, c)) in rest.iter_mut().enumerate() {
        let mc = rm.mc_import(*c, &handle).unwrap();
        objects.push(mc);
        rm.mc_attach_gpu(*c, mc, 0).unwrap();
        let queued = events(rm, *token);
        let [FabricEvent::RemoteGpuAttach { gpu, .. }] = queued.as_slice() else {
            panic!("tray {}: expected the attach event, got {queued:?}", i + 1);
        };
        let node = u16::try_from(i + 1).unwrap();
        a.mc_attach_remote_gpu(*a_token, &uuid, node, gpu.clone())
            .unwrap();
        assert_eq!(a.take_fm_messages(), vec![], "{} of 4 attached", i + 1);
    }
    a.mc_attach_gpu(*a_app, prime, 0).unwrap();
    let sent = a.take_fm_messages();
    let [ToFm::McTeamSetup { members, .. }] = sent.as_slice() else {
        panic!("expected the team request at the 4th attach, got {sent:?}");
    };
    let mut sorted = members.clone();
    sorted.sort();
    assert_eq!(sorted, (0..4).map(|s| gpu(s, 0)).collect::<Vec<_>>());
    let members = members.clone();
    // The FM answers every member's driver.
    for (rm, _, _) in &mut trays {
        assert_eq!(rm.apply_mc_team(&uuid, &members, Ok(TEAM)), 1);
    }
    for ((rm, _, c), mc) in trays.iter_mut().zip(&objects) {
        let m = rm.create(*c, 0, 2 * MIB).unwrap().mem;
        rm.mc_attach_mem(*c, *mc, &bind(0, 0, m, 0, 2 * MIB))
            .unwrap();
    }
    let table = table_dir(&dir.0, TEAM.address_base);
    let mut slots: Vec<u16> = std::fs::read_dir(&table)
        .unwrap()
        .map(|e| {
            let b: McBinding =
                serde_json::from_slice(&std::fs::read(e.unwrap().path()).unwrap()).unwrap();
            b.gpu.slot
        })
        .collect();
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2, 3], "each tray's memory is in the team");

    // Freeing every object leaves nothing, here or in the table.
    for ((rm, _, c), mc) in trays.iter_mut().zip(&objects) {
        rm.release(*c, *mc).unwrap();
        assert_eq!(rm.stats().multicast_objects, 0);
    }
    let (a, _, _) = &mut trays[0];
    assert_eq!(
        a.take_fm_messages(),
        vec![ToFm::McTeamRelease { team_handle: 77 }],
        "the prime releases the team"
    );
    assert!(!table.exists());
}
