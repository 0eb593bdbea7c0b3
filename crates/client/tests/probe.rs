//! The GPU fabric probe end to end: a real `openimex-lab gpu` process started with `--probe
//! pending`, the client library, the root-only control that completes the probe, and `openimex
//! app gpus`. This test binary is re-run as each of those processes (see `child`): as
//! `openimex-lab gpu`, as `openimex-lab app`, and as an unprivileged user sending the control.
//!
//! What the driver does follows `docs/reference/driver-interface.md` §5 (probe states, fields,
//! "UC FLA ranges should be initialized") and §6.9; the CUDA error is the client's mapping of
//! the driver's status (`openimex_client::error`).

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use openimex_client::node_dir::socket_path;
use openimex_client::{Context, HealthSummary, ProbeState};
use openimex_harness::ScratchDir;
use openimex_simproto::probe::{CAP_MC_SUPPORTED, ProbeInfo};
use openimex_simproto::proto::{self, NvStatus, Request, Response};

mod common;

/// `KIND\x1fARG\x1fARG…`: what the re-run binary is.
const CHILD: &str = "OPENIMEX_CLIENT_PROBE_TEST_CHILD";
/// The unprivileged user.
const NOBODY: u32 = 65534;
/// Bound on any child process (a hang guard, not a timing check).
const HANG: Duration = Duration::from_secs(60);

/// Not a test of its own: the entry point when this binary is re-run as a child.
#[test]
fn child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let mut parts = spec.split('\u{1f}');
    let kind = parts.next().unwrap_or_default();
    let args: Vec<OsString> = parts.map(OsString::from).collect();
    let code = match kind {
        "gpu" => openimex_simgpu::cli::main(prefixed("openimex-lab gpu", args)),
        "app" => openimex_client::cli::main(prefixed("openimex-lab app", args)),
        "control" => {
            let socket = PathBuf::from(args.first().cloned().unwrap_or_default());
            println!("answer: {:?}", complete(&socket, 0));
            ExitCode::SUCCESS
        }
        other => panic!("unknown child kind {other:?}"),
    };
    let code = [0, 1, 2]
        .into_iter()
        .find(|c| ExitCode::from(*c) == code)
        .unwrap_or(99);
    std::process::exit(i32::from(code));
}

fn prefixed(name: &str, args: Vec<OsString>) -> Vec<OsString> {
    std::iter::once(name.into()).chain(args).collect()
}

fn child_command(kind: &str, args: &[&str], uid: Option<u32>) -> common::Rerun {
    let spec: Vec<&str> = std::iter::once(kind).chain(args.iter().copied()).collect();
    let mut cmd = common::rerun_as("child", (CHILD, spec.join("\u{1f}")), uid);
    cmd.stdin(Stdio::null());
    cmd
}

/// Runs a child to its end (killed after [`HANG`]).
fn run_child(kind: &str, args: &[&str], uid: Option<u32>) -> Output {
    let mut child = child_command(kind, args, uid).spawn().expect("spawn");
    let deadline = Instant::now() + HANG;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// The program's own lines of a child's stdout (without libtest's).
fn lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with("running ") && !l.starts_with("test "))
        .map(str::to_owned)
        .collect()
}

/// A real `openimex-lab gpu` process; killed and reaped on drop.
struct Driver {
    child: Child,
    node_dir: PathBuf,
}

impl Driver {
    /// Two GPUs, their probes left IN_PROGRESS.
    fn start_pending(dir: &Path) -> Driver {
        let node_dir = dir.join("node0");
        let (n, f) = (
            node_dir.display().to_string(),
            dir.join("fabric").display().to_string(),
        );
        let args = [
            "--node-dir",
            &n,
            "--fabric-dir",
            &f,
            "--gpus",
            "2",
            "--hbm-mib",
            "64",
            "--probe",
            "pending",
        ];
        let mut child = child_command("gpu", &args, None).spawn().expect("spawn");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("ready ") {
                    let _ = tx.send(line);
                }
            }
        });
        let driver = Driver { child, node_dir };
        let ready = rx.recv_timeout(HANG).expect("the driver's ready line");
        assert_eq!(
            ready,
            format!("ready {}", socket_path(&driver.node_dir).display())
        );
        driver
    }

    fn socket(&self) -> PathBuf {
        socket_path(&self.node_dir)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Fabric Manager's answer the tests send: clusterUuid ab…ab, partition 5, clique 9.
fn answer() -> ProbeInfo {
    ProbeInfo {
        cluster_uuid: "ab".repeat(16),
        partition_id: 5,
        clique_id: 9,
        fla_base: 1 << 40,
        fla_size: 1 << 40,
        caps: CAP_MC_SUPPORTED,
        health_mask: 0,
        health_summary: HealthSummary::Healthy,
        bw_mode: 0,
        bw_mode_epoch: 0,
    }
}

/// Sends CompleteFabricProbe for `gpu` on `socket`.
fn complete(socket: &Path, gpu: u32) -> Response {
    let conn = UnixStream::connect(socket).expect("connect");
    conn.set_read_timeout(Some(HANG)).expect("timeout");
    let req = Request::CompleteFabricProbe {
        gpu,
        info: answer(),
    };
    proto::call(&conn, &req, &[]).expect("call")
}

/// §5: until the Fabric Manager answers a GPU's probe it has no unicast FLA range and
/// NV_MEMORY_FABRIC allocation fails ("UC FLA ranges should be initialized"), with
/// NV_ERR_INVALID_STATE in `memoryfabricConstruct`; the application sees
/// CUDA_ERROR_ILLEGAL_STATE (401), the client's mapping of that status. Once answered, the
/// probe query returns the FM's values, and NVML-level checks (§3: state COMPLETED, status
/// success, non-zero clusterUuid) pass.
#[test]
fn fabric_memory_waits_for_the_probe_and_the_query_returns_its_answer() {
    let dir = ScratchDir::new("client-probe").expect("scratch dir");
    let driver = Driver::start_pending(dir.path());
    let ctx = Context::open(&driver.node_dir).expect("open");

    let before = ctx.gpu_fabric_info(0).expect("fabric info");
    assert_eq!(before.state, ProbeState::InProgress);
    assert_eq!(before.status, Some(NvStatus::NotReady));
    assert_eq!((before.cluster_uuid, before.clique_id), ([0; 16], 0));
    assert!(!before.mnnvl_ready());
    let e = ctx.mem_create(0, 2 << 20).expect_err("no FLA range yet");
    assert_eq!((e.code(), e.name()), (401, "CUDA_ERROR_ILLEGAL_STATE"));
    assert!(
        e.to_string()
            .contains("UC FLA ranges should be initialized")
            && e.to_string().contains("IN_PROGRESS"),
        "{e}"
    );

    // The test runs as root: the control is accepted.
    assert_eq!(complete(&driver.socket(), 0), Response::Ok);
    let after = ctx.gpu_fabric_info(0).expect("fabric info");
    assert_eq!(after.state, ProbeState::Complete);
    assert_eq!(after.status, None);
    assert_eq!(after.cluster_uuid, [0xab; 16]);
    assert_eq!(
        (after.clique_id, after.partition_id, after.health_summary),
        (9, 5, Some(HealthSummary::Healthy))
    );
    assert!(after.mnnvl_ready());
    let mem = ctx
        .mem_create(0, 2 << 20)
        .expect("GPU 0's probe is complete");
    ctx.release(mem).expect("release");
    // GPU 1 is still waiting for its answer.
    assert_eq!(
        ctx.gpu_fabric_info(1).unwrap().state,
        ProbeState::InProgress
    );
    assert_eq!(
        ctx.mem_create(1, 2 << 20).map(|_| ()).unwrap_err().code(),
        401
    );
    // An unknown GPU is a bad argument.
    assert_eq!(ctx.gpu_fabric_info(2).unwrap_err().code(), 1);
}

/// Completing a probe is the Fabric Manager's, as opening the IMEX session is the daemon's
/// (`docs/reference/driver-interface.md` §1.4, §1.5: privileged controls need the fabric
/// capability): an unprivileged user gets NV_ERR_INSUFFICIENT_PERMISSIONS and nothing changes.
#[test]
fn only_root_completes_a_probe() {
    let dir = ScratchDir::new("client-probe-priv").expect("scratch dir");
    let driver = Driver::start_pending(dir.path());
    let socket = driver.socket().display().to_string();
    let out = run_child("control", &[&socket], Some(NOBODY));
    let answer = lines(&out)
        .into_iter()
        .find_map(|l| l.strip_prefix("answer: ").map(str::to_owned))
        .unwrap_or_else(|| panic!("no answer: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(
        answer.contains(&format!("{:?}", NvStatus::InsufficientPermissions))
            && answer.contains("Fabric Manager"),
        "{answer}"
    );
    let ctx = Context::open(&driver.node_dir).expect("open");
    assert_eq!(
        ctx.gpu_fabric_info(0).unwrap().state,
        ProbeState::InProgress
    );
}

/// `openimex-lab app gpus` prints what NVML would per GPU (§5): UUID, clusterUuid, cliqueId,
/// probe state, health summary; `-j` the same as JSON lines.
#[test]
fn app_gpus_shows_each_gpus_probe() {
    let dir = ScratchDir::new("client-probe-app").expect("scratch dir");
    let driver = Driver::start_pending(dir.path());
    assert_eq!(complete(&driver.socket(), 1), Response::Ok);
    let node = driver.node_dir.display().to_string();

    let out = run_child("app", &["gpus", "--node-dir", &node], None);
    assert!(out.status.success(), "{out:?}");
    let table = lines(&out);
    assert_eq!(table.len(), 3, "{table:?}");
    assert!(
        table[0].starts_with("GPU  UUID") && table[0].contains("CLIQUE"),
        "{table:?}"
    );
    assert!(
        table[1].starts_with("0 ") && table[1].contains("IN_PROGRESS"),
        "{table:?}"
    );
    assert!(
        table[2].starts_with("1 ")
            && table[2].contains(&"ab".repeat(16))
            && table[2].contains(" 9 ")
            && table[2].ends_with("COMPLETED     HEALTHY"),
        "{table:?}"
    );

    let out = run_child("app", &["gpus", "--node-dir", &node, "-j"], None);
    assert!(out.status.success(), "{out:?}");
    let json: Vec<serde_json::Value> = lines(&out)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(json.len(), 2);
    assert_eq!(json[0]["fabric_state"], "IN_PROGRESS");
    assert_eq!(json[0]["fabric_state_code"], 2);
    assert_eq!(json[0]["fabric_status"], "NV_ERR_NOT_READY");
    assert_eq!(json[1]["fabric_state"], "COMPLETED");
    assert_eq!(json[1]["fabric_state_code"], 3);
    assert_eq!(json[1]["cluster_uuid"], "ab".repeat(16));
    assert_eq!(
        (&json[1]["clique_id"], &json[1]["health"]),
        (&serde_json::json!(9), &serde_json::json!("HEALTHY"))
    );
    assert!(
        json.iter()
            .all(|g| g["uuid"].as_str().is_some_and(|u| u.starts_with("GPU-")))
    );
}
