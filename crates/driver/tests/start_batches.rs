//! The backend's start on a tray of four GPUs (`docs/reference/driver-interface.md` §1.6 step
//! 2), its calls made in batches (`RmClient::calls`): every GPU gets its own Device and
//! Subdevice, on its own instance, and each Subdevice answers its GPU's fabric probe. The simulated driver's server and the daemon's backend in one process.

mod common;

use openimex_core::NodeId;
use openimex_driver::Driver;
use openimex_driver::nvidia::Nvidia;

#[test]
fn four_gpus_each_get_their_device_and_subdevice_and_answer_their_probe() {
    let tray = common::tray("start-batches", 2, 4, [5u8; 16]);
    let nv = Nvidia::open(&tray.node).expect("the backend starts");
    let gpus = nv.gpus();
    assert_eq!(gpus.len(), 4, "every probed GPU attached");
    let mut handles: Vec<u32> = gpus.iter().flat_map(|g| [g.device, g.subdevice]).collect();
    handles.sort_unstable();
    handles.dedup();
    assert_eq!(
        handles.len(),
        8,
        "a Device and a Subdevice of its own per GPU"
    );
    let mut instances: Vec<u32> = gpus.iter().map(|g| g.device_instance).collect();
    instances.sort_unstable();
    instances.dedup();
    assert_eq!(
        instances.len(),
        4,
        "each GPU's Device on its own instance: {gpus:?}"
    );
    nv.open_session(NodeId(2)).expect("session as node 2");
    // The probe goes to each GPU's Subdevice: a missing one would fail it
    // (NV_ERR_INVALID_OBJECT_HANDLE). The first read is the start's own (its last batch),
    // the next one asks the driver again; both find every GPU's probe.
    for read in ["the start's", "a later"] {
        let probes = nv.gpu_fabric().expect("every GPU's probe");
        assert_eq!(
            probes.iter().map(|p| p.gpu).collect::<Vec<_>>(),
            gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            "{read} read: one probe per GPU, in order"
        );
        assert!(
            probes.iter().all(|p| p.state == "COMPLETED"),
            "{read} read: {probes:?}"
        );
    }
    drop(nv);
}
