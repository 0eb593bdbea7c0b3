//! `openimex-lab bench all` through the binary: the JSON document's shape on a small selection of
//! scenarios, where the clusters keep their files, and refusal of unknown scenario names; the
//! secure path (`formation_N_tls`, `import_tls`) end to end; and the mesh probes behind
//! `formation_N_grpc_mesh` and `formation_N_tls_grpc_mesh`.
//! Figures are never asserted (they are machine-dependent ratios); only that each entry is
//! either a figure or an error.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use openimex_harness::bench::ProbeTls;
use openimex_harness::process::run_with_timeout;
use openimex_harness::scratch;
use openimex_harness::{AddrBlock, ScratchDir};
use serde_json::Value;

fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_openimex-lab")
}

/// `bench all --only SCENARIOS --rounds 1 --json` with `TMPDIR` set to `tmpdir` (or unset):
/// the JSON document, and stderr. Panics unless it succeeds with one document.
fn bench_json(scenarios: &str, tmpdir: Option<&std::path::Path>) -> (Value, String) {
    let mut cmd = Command::new(binary());
    match tmpdir {
        Some(dir) => cmd.env("TMPDIR", dir),
        None => cmd.env_remove("TMPDIR"),
    };
    cmd.args([
        "bench", "all", "--only", scenarios, "--rounds", "1", "--json",
    ]);
    let out =
        run_with_timeout(&mut cmd, Duration::from_secs(120)).unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "bench all failed: {stdout}\n{stderr}");
    let doc = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {stdout}"));
    (doc, stderr)
}

#[test]
fn bench_all_json_has_one_entry_per_figure() {
    // A TMPDIR of our own: the bench keeps its clusters there and leaves nothing behind.
    let tmp = ScratchDir::new("bench-tmpdir").expect("scratch");
    let (doc, _) = bench_json("formation_3,import", Some(tmp.path()));
    assert!(
        doc["started"].as_str().is_some_and(|s| s.ends_with('Z')),
        "{doc}"
    );
    assert!(
        doc["machine"]["cpus"].as_u64().is_some_and(|n| n >= 1),
        "{doc}"
    );
    assert_eq!(doc["rounds"], 1, "{doc}");
    assert_eq!(
        doc["machine"]["scratch"].as_str(),
        tmp.path().to_str(),
        "{doc}"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("read TMPDIR")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "the bench left {left:?} in its TMPDIR");
    let entries = doc["entries"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = entries.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "formation_3",
            "formation_3_grpc_mesh",
            "import_p50",
            "import_p50_vs_calls",
            "import_p99",
            "import_allocs"
        ],
        "{doc}"
    );
    for e in &entries {
        let unit = e["unit"].as_str().unwrap_or_default();
        assert!(["ms", "us", "allocs"].contains(&unit), "{e}");
        match (e["value"].as_f64(), e["error"].as_str()) {
            (Some(v), None) => {
                assert!(v >= 0.0, "{e}");
                if let (Some(b), Some(r)) = (e["baseline"].as_f64(), e["ratio"].as_f64()) {
                    assert!(b > 0.0 && (r - v / b).abs() <= 0.01 * r.max(1.0), "{e}");
                }
            }
            (None, Some(why)) => assert!(!why.is_empty() && e["ratio"].is_null(), "{e}"),
            _ => panic!("an entry is a figure or an error: {e}"),
        }
        assert!(e["detail"].is_string(), "{e}");
    }
}

/// The TLS figures run end to end: daemons with mutual TLS form a domain and import, the mesh
/// probes and the raw server speak TLS, and every figure has a value beside its baseline.
#[test]
fn bench_all_tls_selection_measures_every_figure() {
    // A short label: the Fabric Manager's socket path under it must fit in sun_path.
    let tmp = ScratchDir::new("bench-tls").expect("scratch");
    let (doc, stderr) = bench_json("formation_2_tls,import_tls", Some(tmp.path()));
    let entries = doc["entries"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = entries.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "formation_2_tls",
            "formation_2_tls_grpc_mesh",
            "import_tls_p50",
            "import_tls_p50_vs_calls",
            "import_tls_p99",
            "import_tls_allocs"
        ],
        "{doc}"
    );
    for e in &entries {
        assert!(e["error"].is_null(), "{e}\n{stderr}");
        let (value, baseline) = (e["value"].as_f64(), e["baseline"].as_f64());
        assert!(
            value.is_some_and(|v| v >= 0.0) && baseline.is_some_and(|b| b > 0.0),
            "{e}"
        );
        assert!(
            e["detail"].as_str().is_some_and(|d| d.contains("TLS")),
            "a TLS figure's detail says so: {e}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("read TMPDIR")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "the bench left {left:?} in its TMPDIR");
}

/// Without a TMPDIR the clusters live on the tmpfs at /dev/shm when the machine has one, so a
/// round times the daemons rather than the disk's inode allocator (`scratch::memory_root`).
#[test]
fn without_tmpdir_the_bench_keeps_its_files_in_memory() {
    let (doc, stderr) = bench_json("formation_2", None);
    let expected = scratch::memory_root().unwrap_or_else(|| std::path::PathBuf::from("/tmp"));
    assert_eq!(
        doc["machine"]["scratch"].as_str(),
        expected.to_str(),
        "{doc}"
    );
    assert!(
        stderr.contains(&format!("cluster files under {}", expected.display())),
        "{stderr}"
    );
    assert!(doc["entries"][0]["value"].as_f64().is_some(), "{doc}");
}

#[test]
fn bench_all_refuses_an_unknown_scenario() {
    let mut cmd = Command::new(binary());
    cmd.args(["bench", "all", "--only", "storm,warp"]);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown scenario \"warp\""), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A mesh probe, killed on drop, whose stdout lines arrive on `lines`.
struct MeshProbe {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl MeshProbe {
    fn spawn(index: usize, addrs: &[String]) -> Self {
        Self::spawn_with(index, addrs, None)
    }

    /// A probe over mutual TLS with the keys `config` names, when given.
    fn spawn_with(index: usize, addrs: &[String], config: Option<&std::path::Path>) -> Self {
        let mut cmd = Command::new(binary());
        cmd.args(["bench", "mesh-probe", "--index", &index.to_string()]);
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        let mut child = cmd
            .args(addrs)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn a mesh probe");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }
}

impl Drop for MeshProbe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The floor's meaning rests on this: a probe says `meshed` only once each lower peer has
/// accepted its connection and answered its call, however late that peer starts.
#[test]
fn a_mesh_probe_says_meshed_only_once_every_lower_peer_has_answered() {
    let block = AddrBlock::allocate(3, &[50000]).expect("three loopback addresses");
    let addrs: Vec<String> = block.ips().iter().map(|ip| format!("{ip}:50000")).collect();
    let top = MeshProbe::spawn(2, &addrs);
    let middle = MeshProbe::spawn(1, &addrs);
    // Neither has a lower peer listening yet (0 is not started; 1 waits on 0 as well).
    assert_eq!(
        top.lines.recv_timeout(Duration::from_millis(700)).ok(),
        None,
        "probe 2 said something before probe 0 existed"
    );
    assert_eq!(middle.lines.try_recv().ok(), None);
    let bottom = MeshProbe::spawn(0, &addrs);
    let wait = Duration::from_secs(20);
    assert_eq!(
        bottom.lines.recv_timeout(wait).ok().as_deref(),
        Some("meshed 0")
    );
    assert_eq!(
        middle.lines.recv_timeout(wait).ok().as_deref(),
        Some("meshed 1")
    );
    assert_eq!(
        top.lines.recv_timeout(wait).ok().as_deref(),
        Some("meshed 2")
    );
}

#[test]
fn a_mesh_probe_refuses_an_index_past_its_addresses() {
    let mut cmd = Command::new(binary());
    cmd.args([
        "bench",
        "mesh-probe",
        "--index",
        "2",
        "127.0.0.1:1",
        "127.0.0.1:2",
    ]);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--index 2 names no address: 2 given"),
        "{stderr}"
    );
}

/// A peer that accepts the connection but never answers the call does not count.
#[test]
fn a_mesh_probe_waits_for_the_call_not_only_the_connection() {
    let block = AddrBlock::allocate(2, &[50000]).expect("two loopback addresses");
    let addrs: Vec<String> = block.ips().iter().map(|ip| format!("{ip}:50000")).collect();
    let mute = std::net::TcpListener::bind(&addrs[0]).expect("bind the mute peer");
    let probe = MeshProbe::spawn(1, &addrs);
    let (conn, _) = mute.accept().expect("the probe connects");
    assert_eq!(
        probe.lines.recv_timeout(Duration::from_millis(1500)).ok(),
        None,
        "probe 1 said meshed with no answer to its call"
    );
    drop(conn);
}

/// Over mutual TLS the probes mesh as in plaintext; a probe whose certificate comes from
/// another CA is refused by its peer's handshake and says so, instead of redialling.
#[test]
fn mesh_probes_over_tls_mesh_and_refuse_a_stranger() {
    let block = AddrBlock::allocate(3, &[50000]).expect("three loopback addresses");
    let ips: Vec<String> = block.ips().iter().map(ToString::to_string).collect();
    let addrs: Vec<String> = ips.iter().map(|ip| format!("{ip}:50000")).collect();
    let domain = ProbeTls::make(&ips).expect("certificates");
    let config = |i: usize| domain.config(i);
    let bottom = MeshProbe::spawn_with(0, &addrs, config(0));
    let top = MeshProbe::spawn_with(1, &addrs, config(1));
    let wait = Duration::from_secs(20);
    assert_eq!(
        bottom.lines.recv_timeout(wait).ok().as_deref(),
        Some("meshed 0")
    );
    assert_eq!(
        top.lines.recv_timeout(wait).ok().as_deref(),
        Some("meshed 1")
    );
    // Node 2's certificate from another CA: its dials refuse the peers' certificates.
    let other = ProbeTls::make(&ips).expect("another CA");
    let mut cmd = Command::new(binary());
    cmd.args(["bench", "mesh-probe", "--index", "2", "--config"])
        .arg(other.config(2).expect("node 2's config"))
        .args(&addrs);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(20)).unwrap_or_else(|e| panic!("{e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("TLS handshake"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("meshed"));
}

#[test]
fn job_ready_and_a_short_job_churn_measure_without_error() {
    // job_churn fails its entry on any error in the running job, any import served across
    // jobs or any reference left, so a figure here is those three at zero.
    let (doc, stderr) = bench_json("job_ready_3,job_churn_20", None);
    let entries = doc["entries"].as_array().expect("entries");
    let names: Vec<&str> = entries.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(names, ["job_ready_3", "job_churn_20"], "{doc}");
    for e in entries {
        assert!(
            e["error"].is_null() && e["value"].as_f64().is_some_and(|v| v > 0.0),
            "{e}\n{stderr}"
        );
        assert!(e["baseline"].as_f64().is_some_and(|v| v > 0.0), "{e}");
    }
    let churn = &entries[1]["detail"];
    assert!(
        churn
            .as_str()
            .is_some_and(|d| d.contains("20 jobs") && d.contains("0 served")),
        "{churn}"
    );
}
