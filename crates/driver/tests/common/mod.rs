//! A simulated tray for the backend's tests: the simulated driver's server on a fresh node
//! directory under the system's temporary directory, removed when the tray is dropped.

// Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;

use openimex_simgpu::server::{DriverConfig, Server, ServerHandle};

/// The driver of one tray, serving until dropped.
pub(crate) struct Tray {
    dir: PathBuf,
    /// The node directory: the backend's driver root.
    pub(crate) node: PathBuf,
    server: Option<ServerHandle>,
}

impl Tray {
    /// The running server.
    pub(crate) fn server(&self) -> &ServerHandle {
        self.server.as_ref().expect("serving until dropped")
    }
}

/// Starts the driver of tray `slot` with `gpus` GPUs of 16 MiB in NVLink domain `cluster`, in
/// a directory named after `test` and this process.
pub(crate) fn tray(test: &str, slot: u16, gpus: u32, cluster: [u8; 16]) -> Tray {
    let dir = std::env::temp_dir().join(format!("openimex-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let node = dir.join(format!("node{slot}"));
    let server = Server::bind(&DriverConfig {
        node_dir: node.clone(),
        fabric_dir: dir.join("fabric"),
        slot,
        gpus,
        hbm_bytes: 16 << 20,
        cluster_uuid: cluster,
        ..DriverConfig::default()
    })
    .expect("bind the driver")
    .spawn()
    .expect("serve");
    Tray {
        dir,
        node,
        server: Some(server),
    }
}

impl Drop for Tray {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
