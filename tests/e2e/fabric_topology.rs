//! `openimex-lab fabric topology`: the presets' counts as the command reports them, a custom
//! topology file, and a bad file refused with file:line, the value and the fix (issue 14).

use std::process::Command;

use openimex_harness::ScratchDir;
use serde_json::Value;

use crate::common::{assert_clean_failure, lab_binary, run, text};

/// `openimex-lab fabric topology ARGS --json`, parsed.
fn topology_json(args: &[&str]) -> Value {
    let out = run(Command::new(lab_binary())
        .args(["fabric", "topology", "--json"])
        .args(args));
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn presets_report_their_racks_trays_and_gpus() {
    for (args, racks, trays, gpus, switches) in [
        (&[][..], 1, 18, 72, 9),
        (&["nvl36"][..], 1, 9, 36, 9),
        (&["nvl36x2"][..], 2, 18, 72, 18),
        (&["nvl576"][..], 8, 144, 576, 72),
    ] {
        let doc = topology_json(args);
        let got = (
            &doc["racks"],
            &doc["compute_trays"],
            &doc["gpus"],
            &doc["switch_trays"],
        );
        assert_eq!(
            got,
            (&racks.into(), &trays.into(), &gpus.into(), &switches.into()),
            "{args:?}"
        );
        assert_eq!(doc["fabrics"], 1, "{args:?}");
        assert_eq!(
            doc["gpu_fabric"].as_array().map(Vec::len),
            Some(gpus),
            "{args:?}"
        );
    }
    // Two partitions of NVL72: 2 x 9 trays, each its own clique; FLA as the simulated driver.
    let doc = topology_json(&["nvl72", "--partitions", "2"]);
    let gpus = doc["gpu_fabric"].as_array().expect("gpu list");
    assert_eq!(gpus[0]["clique_id"], 1);
    assert_eq!(gpus[71]["clique_id"], 2);
    assert_eq!(
        gpus[71]["fla_base"],
        format!("{:#x}", (17u64 * 16 + 3 + 1) << 40)
    );
    let text_out = run(Command::new(lab_binary()).args(["fabric", "topology", "nvl36"]));
    let listing = text(&text_out.stdout);
    assert!(
        listing.contains("switch-tray r0-s8: 2 NVSwitch chips, 18 OSFP ports"),
        "{listing}"
    );
    assert!(
        listing.contains("compute-tray r0-c08 (slot 8): 2 Grace CPUs, 4 GPUs"),
        "{listing}"
    );
}

#[test]
fn topology_files_parse_and_bad_lines_name_file_line_and_fix() {
    let scratch = ScratchDir::new("fabric-topo").expect("scratch dir");
    let good = scratch.path().join("lab.topo");
    std::fs::write(
        &good,
        "topology lab\nrack a\nswitch-tray a-s osfp=4\ncompute-tray a-c gpus=2\n\
         rack b\nswitch-tray b-s osfp=4\ncompute-tray b-c gpus=8\nlink a-s b-s\n",
    )
    .expect("write");
    let doc = topology_json(&["--file", good.to_str().expect("utf-8 path")]);
    assert_eq!(
        (&doc["topology"], &doc["gpus"], &doc["fabrics"]),
        (&"lab".into(), &10.into(), &1.into())
    );

    let bad = scratch.path().join("bad.topo");
    std::fs::write(&bad, "rack a\nswitch-tray s\ncompute-tray c gpus=0\n").expect("write");
    let out = run(Command::new(lab_binary())
        .args(["fabric", "topology", "--file"])
        .arg(&bad));
    let stderr = assert_clean_failure(&out, "bad topology file");
    let want = format!(
        "{}:3: bad value: \"gpus=0\"; gpus takes a whole number from 1 to 16",
        bad.display()
    );
    assert!(stderr.contains(&want), "{stderr}");

    let out = run(Command::new(lab_binary()).args(["fabric", "topology", "nvl8"]));
    let stderr = assert_clean_failure(&out, "unknown preset");
    assert!(stderr.contains("nvl36x2"), "{stderr}");
}
