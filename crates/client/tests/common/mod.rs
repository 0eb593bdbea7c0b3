//! Shared by the client's integration tests: two simulated nodes' drivers, serving in the
//! test process and sharing a fabric directory, with a loopback stand-in for their IMEX
//! daemons (`openimex_simgpu::testing`).

// Each test binary uses a part of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use openimex_client::node_dir::channels_dir;
use openimex_client::{CuError, DriverStats};
use openimex_harness::ScratchDir;
use openimex_simgpu::server::{DriverConfig, Server, ServerHandle};
use openimex_simgpu::testing::LoopbackDaemons;
use openimex_simproto::proto::DEFAULT_IMEX_CHANNEL_COUNT;

/// IMEX node ID of node A (the exporter in most tests) and node B (the importer).
pub(crate) const NODE_A: u16 = 3;
pub(crate) const NODE_B: u16 = 4;

/// One simulated node: its driver, serving in this process.
pub(crate) struct Node {
    pub(crate) server: ServerHandle,
    pub(crate) dir: PathBuf,
}

impl Node {
    /// A node's driver on `slot` (one GPU), with IMEX channel files `channel7` and `channel3`
    /// and a file `channelx` that is no channel, and `imex_channel_count` channels.
    pub(crate) fn start(
        base: &Path,
        fabric_dir: &Path,
        slot: u16,
        imex_channel_count: u32,
    ) -> Node {
        let node_dir = base.join(format!("node{slot}"));
        std::fs::create_dir_all(channels_dir(&node_dir)).expect("channel dir");
        for name in ["channel7", "channel3", "channelx"] {
            std::fs::write(channels_dir(&node_dir).join(name), b"").expect("channel file");
        }
        let config = DriverConfig {
            node_dir: node_dir.clone(),
            fabric_dir: fabric_dir.to_path_buf(),
            slot,
            gpus: 1,
            hbm_bytes: 64 << 20,
            cluster_uuid: [1; 16],
            clique_id: 1,
            probe: Default::default(),
            // The files above are the channels; the driver creates none of its own.
            channels: 0,
            imex_channel_count,
            ..DriverConfig::default()
        };
        let server = Server::bind(&config)
            .expect("bind the driver")
            .spawn()
            .expect("start the driver");
        Node {
            server,
            dir: node_dir,
        }
    }

    /// The driver's counters, read in-process (no client connection of its own).
    pub(crate) fn stats(&self) -> DriverStats {
        self.server.stats()
    }

    pub(crate) fn arg(&self) -> String {
        self.dir.display().to_string()
    }
}

/// Two nodes with their daemons. Fields drop in order: the daemons (closing their sessions),
/// then the drivers (closing every connection, removing the sockets), then the directory.
pub(crate) struct Domain {
    pub(crate) daemons: LoopbackDaemons,
    pub(crate) a: Node,
    pub(crate) b: Node,
    pub(crate) dir: ScratchDir,
}

impl Domain {
    /// Nodes A (slot 0) and B (slot 1), one GPU each, with IMEX channel files `channel7` and
    /// `channel3` and a file `channelx` that is no channel; both daemons' sessions are open.
    pub(crate) fn start(label: &str) -> Domain {
        let dir = ScratchDir::new(&format!("client-it-{label}")).expect("scratch dir");
        let fabric_dir = dir.path().join("fabric");
        let (a, b) = (
            Node::start(dir.path(), &fabric_dir, 0, DEFAULT_IMEX_CHANNEL_COUNT),
            Node::start(dir.path(), &fabric_dir, 1, DEFAULT_IMEX_CHANNEL_COUNT),
        );
        let daemons = LoopbackDaemons::start(&[
            (a.server.socket_path(), NODE_A),
            (b.server.socket_path(), NODE_B),
        ])
        .expect("open the IMEX sessions");
        Domain { daemons, a, b, dir }
    }

    /// Asserts that no driver answer surprised the daemons.
    pub(crate) fn check_daemons(&self) {
        assert_eq!(self.daemons.failures(), Vec::<String>::new());
    }
}

/// A command and the path it runs from, which must outlive its spawn (see [`rerun_as`]).
pub(crate) struct Rerun {
    cmd: std::process::Command,
    _exe: Option<openimex_harness::Runnable>,
}

impl std::ops::Deref for Rerun {
    type Target = std::process::Command;
    fn deref(&self) -> &Self::Target {
        &self.cmd
    }
}

impl std::ops::DerefMut for Rerun {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.cmd
    }
}

/// This test binary run again, as user `uid` if given, to run only the test `entry` (which
/// reads what to be from `env`), with piped stdin, stdout and stderr. Spawn it before the
/// result drops: another user may run this binary only through a link that goes with it.
pub(crate) fn rerun_as(entry: &str, env: (&str, String), uid: Option<u32>) -> Rerun {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let exe = std::env::current_exe().expect("this binary");
    let (mut cmd, exe) = match uid {
        // Another user must be able to reach this binary (a checkout may be private).
        Some(uid) => {
            let exe = openimex_harness::runnable_by_everyone(&exe).expect("a reachable binary");
            let mut cmd = std::process::Command::new(exe.path());
            cmd.uid(uid).gid(uid);
            (cmd, Some(exe))
        }
        None => (std::process::Command::new(&exe), None),
    };
    cmd.args([
        "--exact",
        entry,
        "--nocapture",
        "--quiet",
        "--test-threads=1",
    ])
    .env(env.0, env.1)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    Rerun { cmd, _exe: exe }
}

pub(crate) fn code<T: std::fmt::Debug>(r: Result<T, CuError>) -> u32 {
    r.expect_err("expected a CUDA error").code()
}

pub(crate) fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
