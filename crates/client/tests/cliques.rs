//! The map check across cliques, through the client library against the simulated driver's
//! server (two nodes, one GPU each, loopback daemons): memory imported from a GPU of another
//! clique, or of another bandwidth mode or epoch, imports but does not map
//! (`docs/reference/driver-interface.md` §1.6 "Map", §5, §6.8). The driver's NV_ERR_INVALID_STATE
//! (`memoryfabricimportv2IsGpuMapAllowed` via `dmaAllocMapping_GM107`) reaches the application
//! as CUDA_ERROR_ILLEGAL_STATE (401), the client's mapping of that status (§3: libcuda's own
//! code for this refusal is not public).

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use openimex_client::{Context, pattern};
use openimex_simproto::probe::{BW_MODE_MIN, ProbeInfo};
use openimex_simproto::proto::{self, Request, Response};

mod common;

use common::Domain;

/// The Fabric Manager's probe update for GPU 0 of the node in `node_dir`: its current answer
/// with `change` applied, through the root-only CompleteFabricProbe control.
fn probe_update(node_dir: &Path, change: impl FnOnce(&mut ProbeInfo)) {
    let socket = openimex_client::node_dir::socket_path(node_dir);
    let conn = UnixStream::connect(socket).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let req = Request::FabricProbeInfo { gpu: 0 };
    let Ok(Response::FabricProbeInfo(p)) = proto::call(&conn, &req, &[]) else {
        panic!("no probe info");
    };
    let mut info = p.info.expect("complete");
    change(&mut info);
    let req = Request::CompleteFabricProbe { gpu: 0, info };
    assert_eq!(proto::call(&conn, &req, &[]).expect("call"), Response::Ok);
}

#[test]
fn imported_memory_maps_only_on_a_gpu_of_the_owners_clique_and_bandwidth_mode() {
    let d = Domain::start("cliques");
    let a = Context::open(&d.a.dir).unwrap();
    let mem = a.mem_create(0, 2 << 20).unwrap();
    pattern::fill(&mut a.map(&mem).unwrap(), 9);
    let handle = a.export(&mem).unwrap();

    // Node B's GPU moves to clique 2: the import still completes, the map is refused.
    probe_update(&d.b.dir, |i| i.clique_id = 2);
    let b = Context::open(&d.b.dir).unwrap();
    assert_eq!(b.gpu_fabric_info(0).unwrap().clique_id, 2);
    let imported = b.import(&handle).unwrap();
    let e = b.map_on(&imported, 0).unwrap_err();
    assert_eq!((e.code(), e.name()), (401, "CUDA_ERROR_ILLEGAL_STATE"));
    assert!(e.to_string().contains("cliqueId does not match"), "{e}");
    // `map` is `map_on` GPU 0.
    assert_eq!(b.map(&imported).map(drop).map_err(|e| e.code()), Err(401));

    // Same clique, another bandwidth mode: refused; another epoch: refused.
    probe_update(&d.b.dir, |i| (i.clique_id, i.bw_mode) = (1, BW_MODE_MIN));
    let e = b.map_on(&imported, 0).unwrap_err();
    assert!(e.to_string().contains("bwMode does not match"), "{e}");
    probe_update(&d.b.dir, |i| (i.bw_mode, i.bw_mode_epoch) = (0, 1));
    let e = b.map_on(&imported, 0).unwrap_err();
    assert!(e.to_string().contains("bwModeEpoch does not match"), "{e}");

    // The owner's three values again: it maps and reads the exporter's bytes.
    probe_update(&d.b.dir, |i| i.bw_mode_epoch = 0);
    assert_eq!(pattern::verify(&b.map_on(&imported, 0).unwrap(), 9), Ok(()));
    // A GPU the node does not have is a bad value.
    assert_eq!(
        b.map_on(&imported, 1).map(drop).map_err(|e| e.code()),
        Err(1)
    );
    b.release(imported).unwrap();
    d.check_daemons();
}
