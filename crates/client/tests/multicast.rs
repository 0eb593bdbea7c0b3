//! Multicast (NVLS) objects through the client library against the real driver server
//! (`openimex_simgpu::server`, in-process): a single-tray team of 4 GPUs whose store lands in
//! every bound memory and whose load-reduce sums them (`docs/reference/driver-interface.md` §6.10,
//! §1.6 "Multicast (NVLS) across nodes" 5-6), a two-tray team with no Fabric Manager, whose
//! remote attach goes through the (loopback) daemons and which is refused
//! (CUDA_ERROR_NOT_SUPPORTED: no multicast across trays without an FM). Teams across trays
//! with the real Fabric Manager process are tested end to end (`tests/e2e/multicast_fm.rs`).

use std::time::Duration;

use openimex_client::node_dir::channels_dir;
use openimex_client::{Context, CuError};
use openimex_harness::ScratchDir;
use openimex_simgpu::server::{DriverConfig, Server, ServerHandle};
use openimex_simproto::proto::DEFAULT_IMEX_CHANNEL_COUNT;

mod common;

const MIB: u64 = 1 << 20;

/// A driver on `slot` with `gpus` GPUs and channel file `channel0`.
fn driver(dir: &ScratchDir, slot: u16, gpus: u32) -> (ServerHandle, std::path::PathBuf) {
    let node_dir = dir.path().join(format!("node{slot}"));
    let config = DriverConfig {
        node_dir: node_dir.clone(),
        fabric_dir: dir.path().join("fabric"),
        slot,
        gpus,
        hbm_bytes: 32 * MIB,
        cluster_uuid: [1; 16],
        clique_id: 1,
        probe: Default::default(),
        channels: 1,
        imex_channel_count: DEFAULT_IMEX_CHANNEL_COUNT,
        ..DriverConfig::default()
    };
    let server = Server::bind(&config).unwrap().spawn().unwrap();
    assert!(channels_dir(&node_dir).join("channel0").exists());
    (server, node_dir)
}

/// §6.10: the team completes only after the last of 4 GPUs joined; then a store through the
/// multicast mapping lands in all 4 bound memories, a load-reduce sums the 4, and releasing
/// everything leaves nothing in the driver or the fabric directory.
#[test]
fn a_store_lands_in_all_four_bound_memories_and_load_reduce_sums_them() {
    let dir = ScratchDir::new("client-mc-single-tray").unwrap();
    let (server, node_dir) = driver(&dir, 0, 4);
    let ctx = Context::open(&node_dir).unwrap();
    let size = 4 * MIB;
    assert_eq!(ctx.multicast_granularity(), 2 * MIB);
    let mc = ctx.multicast_create(4, size).unwrap();
    let mems: Vec<_> = (0..4).map(|g| ctx.mem_create(g, size).unwrap()).collect();
    for m in &mems[..3] {
        mc.add_device(m.gpu()).unwrap();
    }
    let early = mc.info(Duration::ZERO).unwrap_err();
    assert!(matches!(early, CuError::NotReady(_)), "{early}");
    mc.add_device(3).unwrap();
    let info = mc.info(Duration::ZERO).unwrap();
    assert_eq!((info.num_attached_gpus, info.members.len()), (4, 4));
    let dup = mc.add_device(3).unwrap_err();
    assert_eq!(dup.name(), "CUDA_ERROR_ILLEGAL_STATE", "{dup}");
    for m in &mems {
        mc.bind_mem(m.gpu(), 0, m, 0, size).unwrap();
    }

    let mut map = mc.map().unwrap();
    assert_eq!(map.bindings().len(), 4);
    let word = 0xabcd_0123u32.to_le_bytes();
    map.store(2 * MIB + 8, &word).unwrap();
    for m in &mems {
        let view = ctx.map(m).unwrap();
        let at = usize::try_from(2 * MIB + 8).unwrap();
        assert_eq!(view[at..at + 4], word, "GPU {}", m.gpu());
    }

    // Each GPU holds its own value; the load-reduce adds the four.
    for (i, m) in mems.iter().enumerate() {
        let mut view = ctx.map(m).unwrap();
        let v = u32::try_from(i + 1).unwrap();
        view[0..4].copy_from_slice(&v.to_le_bytes());
        view[4..8].copy_from_slice(&(v as f32 * 0.5).to_le_bytes());
    }
    assert_eq!(map.load_reduce_u32(0, 1).unwrap(), vec![10]);
    assert_eq!(map.load_reduce_f32(4, 1).unwrap(), vec![5.0]);
    let outside = map.store(size, &word).unwrap_err();
    assert_eq!(outside.name(), "CUDA_ERROR_INVALID_VALUE");

    drop(map);
    mc.release().unwrap();
    for m in mems {
        ctx.release(m).unwrap();
    }
    let s = server.stats();
    assert_eq!(
        (
            s.multicast_objects,
            s.multicast_bindings,
            s.allocations,
            s.hbm_used
        ),
        (0, 0, 0, 0)
    );
    let tables = dir.path().join("fabric").join("multicast");
    let left = std::fs::read_dir(&tables).map_or(0, |d| d.count());
    assert_eq!(left, 0, "no team table left in {}", tables.display());
}

/// §1.6 "Multicast" 3-4: the importer's add goes through the daemons to the prime's driver;
/// with no Fabric Manager the two-tray team is refused and the prime's objects report it.
#[test]
fn without_a_fabric_manager_a_two_tray_team_is_refused() {
    let dom = common::Domain::start("mc-two-trays");
    let a = Context::open(&dom.a.dir).unwrap();
    let b = Context::open(&dom.b.dir).unwrap();
    let mc = a.multicast_create(2, 2 * MIB).unwrap();
    let handle = mc.export().unwrap();
    mc.add_device(0).unwrap();
    let imported = b.multicast_import(&handle).unwrap();
    imported.add_device(0).unwrap();
    // The remote attach reaches A through the daemons; it is the last, and no FM is linked.
    common::eventually("the prime refuses the team", || {
        matches!(mc.info(Duration::ZERO), Err(CuError::NotSupported(_)))
    });
    let late = mc.bind_mem(0, 0, &a.mem_create(0, 2 * MIB).unwrap(), 0, 2 * MIB);
    assert_eq!(common::code(late), 801, "a use of the failed object");
    dom.check_daemons();
    imported.release().unwrap();
    mc.release().unwrap();
    assert_eq!(dom.a.stats().multicast_objects, 0);
    assert_eq!(dom.b.stats().multicast_objects, 0);
}

/// Set in the child run of [`a_process_killed_in_a_team_wait_is_cleaned_up_at_once`]: the
/// driver's node directory.
const WAITER_DIR: &str = "OPENIMEX_TEST_MC_WAITER_DIR";

/// The child: creates a 2-GPU object, adds one GPU, says so, then waits a minute for a team
/// that never completes.
#[test]
fn mc_team_waiter_child() {
    let Ok(dir) = std::env::var(WAITER_DIR) else {
        return;
    };
    let ctx = Context::open(std::path::Path::new(&dir)).unwrap();
    let mc = ctx.multicast_create(2, 2 * MIB).unwrap();
    mc.add_device(0).unwrap();
    println!("waiting");
    let _ = mc.info(Duration::from_secs(60));
}

/// A fatal signal ends a real ioctl at once and the process's exit frees its objects; a
/// process killed while blocked in the team wait (§6.10: every control but the attaches answers
/// NOT_READY until the team is set up) is cleaned up within the driver's wait slice, not at the
/// end of its minute-long wait.
#[test]
fn a_process_killed_in_a_team_wait_is_cleaned_up_at_once() {
    use std::io::{BufRead, BufReader};
    let dir = ScratchDir::new("client-mc-killed-waiter").unwrap();
    let (server, node_dir) = driver(&dir, 0, 2);
    let mut child = common::rerun_as(
        "mc_team_waiter_child",
        (WAITER_DIR, node_dir.display().to_string()),
        None,
    )
    .spawn()
    .unwrap();
    let out = child.stdout.take().unwrap();
    let said = BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .any(|l| l == "waiting");
    assert!(said, "the child reached the wait");
    assert_eq!(server.stats().multicast_objects, 1);
    // The child is blocked in the wait (its answer cannot come before the team does).
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(child.try_wait().unwrap(), None, "still waiting");
    child.kill().unwrap();
    child.wait().unwrap();
    common::eventually("the killed waiter's object is freed", || {
        let s = server.stats();
        s.multicast_objects == 0 && s.clients == 0
    });
}
