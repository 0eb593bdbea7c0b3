//! Shared by the driver's integration tests: the configuration of a test node.

use std::path::Path;

pub(crate) mod node;

use openimex_simgpu::server::DriverConfig;
use openimex_simproto::proto::DEFAULT_IMEX_CHANNEL_COUNT;

/// Node `slot` under `dir`: 2 GPUs of 64 MiB, channel files channel0 and channel1, the fabric
/// directory `dir/fabric` shared with the other slots.
pub(crate) fn config(dir: &Path, slot: u16) -> DriverConfig {
    DriverConfig {
        node_dir: dir.join(format!("node{slot}")),
        fabric_dir: dir.join("fabric"),
        slot,
        gpus: 2,
        hbm_bytes: 64 << 20,
        cluster_uuid: [3; 16],
        clique_id: 1,
        probe: Default::default(),
        channels: 2,
        imex_channel_count: DEFAULT_IMEX_CHANNEL_COUNT,
        ..DriverConfig::default()
    }
}
