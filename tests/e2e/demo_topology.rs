//! `openimex-lab demo` on a domain started from a topology (issue 14, item 6): the simulated Fabric
//! Manager first, then one driver (`--fabric-manager`) and one daemon per compute tray; the
//! all-to-all over every GPU of the layout; a topology file's errors; and `--partitions K`,
//! where an import from another clique must be refused when the importing GPU maps it
//! (docs/reference/driver-interface.md §5 and §6.8: RM maps imported memory only on a GPU of the owner's
//! clique).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use openimex_harness::ScratchDir;
use serde_json::Value;

use crate::apps::num;
use crate::common::{assert_clean_failure, lab_binary, run, run_long, text};

/// Time allowed for a whole demo (36 GPUs in a debug build included).
const DEMO: Duration = Duration::from_secs(600);

/// `openimex-lab demo ARGS --json`, within [`DEMO`].
fn demo(args: &[&str]) -> Output {
    let mut cmd = Command::new(lab_binary());
    cmd.arg("demo").args(args).arg("--json");
    run_long(&mut cmd, DEMO)
}

/// The demo's summary: its last stdout line, one JSON object.
#[track_caller]
fn summary(out: &Output) -> Value {
    let stdout = text(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "the last line must be JSON ({e}): {last:?}\nstderr: {}",
            text(&out.stderr)
        )
    })
}

/// Asserts each numeric field of the summary.
#[track_caller]
fn expect(s: &Value, fields: &[(&str, u64)]) {
    for (key, want) in fields {
        assert_eq!(num(s, key), *want, "{key}: {s}");
    }
}

/// Writes `text` as `name` in `dir`; its path.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write the topology file");
    path
}

/// Writes `text` to `path` and runs the demo on it, which must fail cleanly; its stderr.
fn refused(path: &Path, text: &str, what: &str) -> String {
    std::fs::write(path, text).expect("write the topology file");
    let out = demo(&["--topology-file", path.to_str().expect("utf-8 path")]);
    assert_clean_failure(&out, what)
}

/// One rack, one switch tray, two compute trays of two GPUs.
const TWO_TRAYS: &str = "topology lab\nrack r0\nswitch-tray r0-s0\ncompute-tray r0-c0 gpus=2\n\
                         compute-tray r0-c1 gpus=2\n";

#[test]
fn demo_on_nvl36_runs_every_gpu_of_the_rack_through_the_fabric_manager() {
    let out = demo(&["--topology", "nvl36"]);
    assert!(
        out.status.success(),
        "demo --topology nvl36 failed: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    let s = summary(&out);
    assert_eq!(s["topology"], "nvl36", "{s}");
    expect(
        &s,
        &[
            ("racks", 1),
            ("compute_trays", 9),
            ("switch_trays", 9),
            ("partitions", 1),
            ("nodes", 9),
            ("gpus", 36),
            ("imports", 36 * 35),
            ("errors", 0),
            ("leaked_refs", 0),
            ("cross_clique_expected", 0),
            ("cross_clique_refused", 0),
        ],
    );
    // Every ordered pair checked its slot both ways (2 MiB buffers, 36 slots of 8-byte words).
    let slot = (2 << 20) / 36 / 8 * 8;
    assert_eq!(num(&s, "bytes_verified"), 2 * 36 * 35 * slot, "{s}");
}

#[test]
fn demo_topology_file_errors_name_file_and_line() {
    let dir = ScratchDir::new("demo-topo-bad").expect("scratch dir");
    let bad = dir.path().join("bad.topo");
    let stderr = refused(
        &bad,
        "rack r0\nswitch-tray r0-s0\ncompute-tray r0-c0 gpus=many\n",
        "demo with a bad topology file",
    );
    assert!(
        stderr.contains(&format!("{}:3", bad.display())) && stderr.contains("many"),
        "the error names file:line and the value: {stderr}"
    );

    // Trays of different GPU counts: refused before anything starts, naming both trays.
    let stderr = refused(
        &dir.path().join("mixed.topo"),
        "rack r0\nswitch-tray r0-s0\ncompute-tray r0-c0 gpus=4\ncompute-tray r0-c1 gpus=2\n",
        "demo with mixed GPU counts",
    );
    assert!(
        stderr.contains("different GPU counts") && stderr.contains("r0-c1"),
        "{stderr}"
    );

    // More trays than the topology has.
    let out =
        run(Command::new(lab_binary()).args(["demo", "--topology", "nvl36", "--nodes", "10"]));
    let stderr = assert_clean_failure(&out, "demo --nodes beyond the topology");
    assert!(stderr.contains("9 compute trays"), "{stderr}");
}

/// Two trays of two GPUs split into two cliques: 12 imports, 8 of them across cliques. Each
/// cross-clique import is refused at map with the driver's NV_ERR_INVALID_STATE, which the app
/// sees as CUDA_ERROR_ILLEGAL_STATE (401) (docs/reference/driver-interface.md §1.6 "Map", §6.8), while the
/// in-clique pairs verify and nothing leaks.
#[test]
fn demo_partitions_counts_imports_across_cliques() {
    let dir = ScratchDir::new("demo-topo-cliques").expect("scratch dir");
    let file = write(dir.path(), "lab.topo", TWO_TRAYS);
    let out = demo(&[
        "--topology-file",
        file.to_str().expect("utf-8 path"),
        "--partitions",
        "2",
    ]);
    let s = summary(&out);
    assert_eq!(s["topology"], "lab", "{s}");
    expect(
        &s,
        &[
            ("partitions", 2),
            ("gpus", 4),
            ("imports", 12),
            ("errors", 0),
            ("leaked_refs", 0),
            ("cross_clique_expected", 8),
        ],
    );
    // The in-clique pairs (GPU 0 <-> 1, 2 <-> 3) verified both ways.
    let slot = (2 << 20) / 4 / 8 * 8;
    assert_eq!(num(&s, "bytes_verified"), 2 * 4 * slot, "{s}");
    // §6.8: every cross-clique import is refused at map with the driver's status, none maps.
    assert_eq!(num(&s, "cross_clique_refused"), 8, "{s}");
    assert_eq!(num(&s, "cross_clique_mapped"), 0, "{s}");
    let refusal = s["refusal"].as_str().unwrap_or_default();
    assert!(
        refusal.contains("CUDA_ERROR_ILLEGAL_STATE (401)"),
        "the real error reaches the app: {s}"
    );
    assert!(
        out.status.success(),
        "demo --partitions 2: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--allreduce` on two trays of an nvl36 rack (8 GPUs): one multicast team over every GPU
/// (the prime on tray 0, imported once on tray 1; docs/reference/driver-interface.md §1.6 "Multicast (NVLS)
/// across nodes"), each GPU's slice load-reduced over all members and stored back to all;
/// every buffer holds the sums, nothing leaks (multicast objects and bindings included), and
/// the bandwidth is reported against a local memcpy.
#[test]
fn demo_allreduce_sums_every_gpus_buffer_over_one_multicast_team() {
    let out = demo(&["--allreduce", "--topology", "nvl36", "--nodes", "2"]);
    let s = summary(&out);
    assert_eq!(s["topology"], "nvl36", "{s}");
    expect(
        &s,
        &[
            ("gpus", 8),
            ("imports", 1),
            ("errors", 0),
            ("leaked_refs", 0),
            ("allreduce_errors", 0),
        ],
    );
    for key in [
        "allreduce_ratio",
        "allreduce_algbw_gbps",
        "allreduce_busbw_gbps",
        "local_memcpy_gbps",
    ] {
        assert!(
            s[key].as_f64().is_some_and(|x| x > 0.0),
            "{key} must be positive: {s}"
        );
    }
    assert!(
        out.status.success(),
        "demo --allreduce: {}",
        text(&out.stderr)
    );

    // One team over the whole domain needs one clique: refused before anything starts.
    let out = run(Command::new(lab_binary()).args([
        "demo",
        "--allreduce",
        "--topology",
        "nvl36",
        "--partitions",
        "2",
    ]));
    let stderr = assert_clean_failure(&out, "demo --allreduce --partitions 2");
    assert!(stderr.contains("--partitions"), "{stderr}");
}
