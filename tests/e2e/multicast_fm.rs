//! Multicast (NVLS) over four trays with the real Fabric Manager (`openimex-lab fabric serve`):
//! `docs/reference/driver-interface.md` §1.6 "Multicast (NVLS) across nodes" 3-5 and §6.10. The
//! prime on tray 0 needs four GPUs, one per tray; the attaches of trays 1-3 go through their
//! daemons to the prime's daemon (ATTACH_REMOTE_GPU). The team is set up only after the last
//! attach, by the FM, which answers every member's driver directly (no daemon round trip);
//! then a store through the team lands in every tray's bound memory and a load-reduce sums
//! them. The failure path: a tray moved to another partition (clique) attaches, the prime
//! refuses the remote GPU (its clique differs, `_memorymulticastfabricCtrlAttachRemoteGpu`),
//! fails, and the FM relays the failure to every member.

use std::time::{Duration, Instant};

use openimex_client::{Context, CuError, Multicast};
use openimex_harness::{Cluster, ClusterSpec, FabricManagerSpec};

use crate::apps::{gpu_cluster_from, wait_session};
use crate::common::{NOTICE, binary, lab_binary, text, wait_for};

const TRAYS: usize = 4;

/// `n` trays of an nvl36 rack against its FM, every GPU's probe answered.
pub(crate) fn fm_trays(n: usize) -> Cluster {
    let mut spec = ClusterSpec::from_topology(FabricManagerSpec::preset("nvl36"), binary())
        .expect("spec from the topology")
        .with_lab_binary(lab_binary());
    spec.nodes = n;
    let cluster = gpu_cluster_from(spec);
    for i in 0..n {
        wait_session(&cluster, i);
        let ctx = Context::open(cluster.node(i).dir()).expect("a context");
        let deadline = Instant::now() + NOTICE;
        while !ctx.gpu_fabric_info(0).is_ok_and(|f| f.mnnvl_ready()) {
            assert!(Instant::now() < deadline, "tray {i}: the FM never answered");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    cluster
}

/// Waits until `mc`'s team is set up (or fails): its result.
fn team_of(mc: &Multicast<'_>) -> Result<u64, CuError> {
    let deadline = Instant::now() + NOTICE;
    loop {
        match mc.info(Duration::from_millis(100)) {
            Ok(info) => match info.team {
                Some(t) => return Ok(t.address_base),
                None if Instant::now() < deadline => continue,
                None => panic!("no team and no error: {info:?}"),
            },
            Err(CuError::NotReady(_)) if Instant::now() < deadline => continue,
            Err(e) => return Err(e),
        }
    }
}

#[test]
fn a_team_over_four_trays_is_set_up_by_the_fm_after_the_last_attach_and_fails_everywhere() {
    let cluster = fm_trays(TRAYS);
    let ctxs: Vec<Context> = (0..TRAYS)
        .map(|i| Context::open(cluster.node(i).dir()).expect("a context"))
        .collect();
    let size = ctxs[0].multicast_granularity();
    let prime = ctxs[0]
        .multicast_create(TRAYS as u32, size)
        .expect("create");
    let handle = prime.export().expect("export");
    let members: Vec<Multicast<'_>> = std::iter::once(prime)
        .chain(
            ctxs[1..]
                .iter()
                .map(|c| c.multicast_import(&handle).expect("import")),
        )
        .collect();

    // Three of four attached: nobody has a team.
    for m in &members[..TRAYS - 1] {
        m.add_device(0).expect("attach");
    }
    // Once the prime's driver counts the three (the two remote attaches come through the
    // daemons), nothing more is on its way: no team may exist.
    let three = wait_for(NOTICE, || {
        ctxs[0]
            .stats()
            .is_ok_and(|s| s.multicast_attached == TRAYS - 1)
    });
    assert!(three, "the prime's driver never counted 3 attaches");
    for (i, m) in members.iter().enumerate() {
        let e = m.info(Duration::ZERO).unwrap_err();
        assert_eq!(
            e.name(),
            "CUDA_ERROR_NOT_READY",
            "tray {i} before the last attach"
        );
    }
    // The last attach: the FM sets the team up and every tray gets the same range.
    members[TRAYS - 1].add_device(0).expect("the last attach");
    let bases: Vec<u64> = members
        .iter()
        .map(|m| team_of(m).expect("the team"))
        .collect();
    assert!(bases.iter().all(|b| *b == bases[0]), "{bases:?}");
    let log = cluster
        .fabric_manager()
        .map(|f| f.log())
        .unwrap_or_default();
    assert!(log.contains("multicast team request"), "FM log:\n{log}");

    // Each tray binds memory of its GPU 0 holding i + 1; the sum through the team is 10, and
    // a store from tray 2 lands in every tray's memory.
    let mems: Vec<_> = ctxs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mem = c.mem_create(0, size).expect("memory");
            let mut map = c.map(&mem).expect("map own memory");
            map[..4].copy_from_slice(&(i as u32 + 1).to_le_bytes());
            drop(map);
            members[i]
                .bind_mem(0, 0, &mem, 0, size)
                .expect("bind the tray's memory");
            mem
        })
        .collect();
    let sums = members[0]
        .map()
        .expect("map the team")
        .load_reduce_u32(0, 1)
        .expect("load-reduce");
    assert_eq!(sums, vec![1 + 2 + 3 + 4]);
    let mut team_map = members[2].map().expect("map the team on tray 2");
    team_map
        .store(64, b"multicast")
        .expect("store through the team");
    for (i, (c, mem)) in ctxs.iter().zip(&mems).enumerate() {
        let map = c.map(mem).expect("map own memory");
        assert_eq!(&map[64..73], b"multicast", "tray {i} got the store");
    }
    drop(team_map);

    // The failure path: tray 3 in a partition of its own attaches to a new team.
    let out = cluster
        .fabric(&["partition", "create", "3"])
        .expect("run openimex-lab fabric");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let deadline = Instant::now() + NOTICE;
    while ctxs[3].gpu_fabric_info(0).map(|f| f.clique_id).unwrap_or(0) != 2 {
        assert!(Instant::now() < deadline, "tray 3 never moved");
        std::thread::sleep(Duration::from_millis(20));
    }
    let prime2 = ctxs[0].multicast_create(3, size).expect("create");
    let h2 = prime2.export().expect("export");
    let second: Vec<Multicast<'_>> = vec![
        ctxs[1].multicast_import(&h2).expect("import"),
        ctxs[3].multicast_import(&h2).expect("import"),
    ];
    prime2.add_device(0).expect("attach");
    second[0].add_device(0).expect("attach from tray 1");
    second[1]
        .add_device(0)
        .expect("tray 3's attach leaves its daemon");
    let refused = team_of(&prime2).expect_err("the prime fails");
    for (n, m) in second.iter().enumerate() {
        let e = team_of(m).expect_err("the failure reaches every member");
        assert_eq!(
            e.name(),
            refused.name(),
            "member {n}: {e} vs the prime's {refused}"
        );
    }

    for m in second.into_iter().chain([prime2]).chain(members) {
        m.release().expect("release");
    }
    for (i, (c, mem)) in ctxs.iter().zip(mems).enumerate() {
        c.release(mem).expect("release memory");
        let s = c.stats().expect("stats");
        assert_eq!(
            (s.multicast_objects, s.multicast_bindings, s.allocations),
            (0, 0, 0),
            "tray {i}: nothing left"
        );
    }
}
