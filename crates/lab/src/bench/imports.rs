//! `openimex-lab bench imports`: the demo's all-to-all workload (`openimex-lab demo --json`, run as a
//! child process so its cluster and threads are its own), reported as medians over rounds of
//! import latency against a raw gRPC round trip and fabric copy bandwidth against local
//! memcpy, each baseline measured by the same demo run.

use anyhow::{Context as _, Result, bail};

/// Runs `openimex-lab demo --json` `rounds` times and reports medians as ratios to the baselines
/// each run measured itself.
pub(crate) fn bench_imports(nodes: usize, gpus_per_node: u32, rounds: usize) -> Result<()> {
    let binary = super::this_binary()?;
    let mut runs = Vec::new();
    for round in 0..rounds.max(1) {
        let out = std::process::Command::new(&binary)
            .args([
                "demo",
                "--json",
                "--nodes",
                &nodes.to_string(),
                "--gpus-per-node",
                &gpus_per_node.to_string(),
            ])
            .stderr(std::process::Stdio::inherit())
            .output()
            .context("cannot run the demo")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("round {round}: the demo failed: {text}");
        }
        let v: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or(""))
            .with_context(|| format!("round {round}: the demo printed no JSON summary: {text}"))?;
        runs.push(v);
    }
    let median = |key: &str| {
        let mut v: Vec<f64> = runs.iter().filter_map(|r| r[key].as_f64()).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let (p50, p99, rtt) = (
        median("import_p50_us"),
        median("import_p99_us"),
        median("grpc_rtt_p50_us"),
    );
    let (copy, memcpy) = (median("copy_gbps"), median("local_memcpy_gbps"));
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    println!(
        "imports, {nodes} nodes x {gpus_per_node} GPUs, {} rounds (medians):",
        runs.len()
    );
    println!(
        "  imports per run                         : {:>10.0}",
        median("imports")
    );
    println!(
        "  imports/s (all GPUs importing at once)  : {:>10.0}",
        median("imports_per_s")
    );
    println!("  import p50 / p99                        : {p50:>10.0} / {p99:.0} us");
    println!("  baseline: raw unary gRPC round trip p50 : {rtt:>10.0} us");
    println!(
        "  ratio import p50 / gRPC round trip      : {:>10.1}",
        ratio(p50, rtt)
    );
    println!("  fabric copy                             : {copy:>10.2} GB/s");
    println!("  baseline: local memcpy                  : {memcpy:>10.2} GB/s");
    println!(
        "  ratio fabric copy / memcpy              : {:>10.2}",
        ratio(copy, memcpy)
    );
    Ok(())
}
