//! `openimex-lab app gpus`: each GPU of the node as NVML shows it to NCCL, NVSHMEM and UCX: UUID,
//! clusterUuid, cliqueId, fabric probe state and health summary, read fresh from the driver's
//! GET_GPU_FABRIC_PROBE_INFO (`docs/reference/driver-interface.md` §5), as a table or, with
//! `-j`, one JSON object per line.

use serde_json::{Value, json};

use super::{Failure, NodeArgs, cuda, open, say};
use crate::{GpuFabricInfo, GpuInfo};

/// Arguments of `app gpus`.
#[derive(Debug, clap::Args)]
pub(super) struct GpusArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// One JSON object per GPU and line instead of the table.
    #[arg(short = 'j', long)]
    json: bool,
}

pub(super) fn gpus(a: &GpusArgs) -> Result<(), Failure> {
    let ctx = open(&a.node)?;
    let mut rows = Vec::new();
    for g in ctx.gpus() {
        let f = ctx.gpu_fabric_info(g.index).map_err(cuda("fabric info"))?;
        rows.push(row(g, &f));
    }
    if a.json {
        for r in &rows {
            say(&r.to_string());
        }
    } else {
        say(&table(&rows));
    }
    Ok(())
}

/// One GPU: the driver's GPU record with its fabric fields replaced by the probe's current
/// answer, plus the NVML numbers.
fn row(g: &GpuInfo, f: &GpuFabricInfo) -> Value {
    json!({
        "index": g.index,
        "uuid": g.uuid,
        "hbm_bytes": g.hbm_bytes,
        "fabric_state": f.state.nvml_name(),
        "fabric_state_code": f.state.code(),
        "fabric_status": f.status.map_or_else(|| "SUCCESS".to_string(), |s| s.to_string()),
        "cluster_uuid": openimex_simproto::handle::encode_hex(&f.cluster_uuid),
        "clique_id": f.clique_id,
        "partition_id": f.partition_id,
        "health": f.health_summary.map_or("", |h| h.name()),
        "health_mask": f.health_mask,
        "fabric_base": g.fabric_base,
    })
}

const COLUMNS: [(&str, &str); 6] = [
    ("GPU", "index"),
    ("UUID", "uuid"),
    ("CLUSTER UUID", "cluster_uuid"),
    ("CLIQUE", "clique_id"),
    ("FABRIC STATE", "fabric_state"),
    ("HEALTH", "health"),
];

fn cell(v: &Value) -> String {
    match v {
        Value::String(s) if s.is_empty() => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Left-aligned columns, two spaces apart.
fn table(rows: &[Value]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| COLUMNS.iter().map(|(_, k)| cell(&r[*k])).collect())
        .collect();
    let widths: Vec<usize> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, (h, _))| cells.iter().map(|c| c[i].len()).fold(h.len(), usize::max))
        .collect();
    let line = |fields: Vec<&str>| {
        let padded: Vec<String> = fields
            .iter()
            .zip(&widths)
            .map(|(f, w)| format!("{f:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let mut out = vec![line(COLUMNS.iter().map(|(h, _)| *h).collect())];
    out.extend(
        cells
            .iter()
            .map(|c| line(c.iter().map(String::as_str).collect())),
    );
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HealthSummary, ProbeState};
    use openimex_simproto::proto::NvStatus;

    fn gpu(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            hbm_bytes: 1,
            fabric_state: String::new(),
            cluster_uuid: String::new(),
            clique_id: 0,
            health: String::new(),
            fabric_base: 2,
        }
    }

    #[test]
    fn a_pending_gpu_shows_zeros_and_no_health_next_to_a_complete_one() {
        let done = GpuFabricInfo {
            cluster_uuid: [0xab; 16],
            status: None,
            clique_id: 7,
            state: ProbeState::Complete,
            health_mask: 0,
            health_summary: Some(HealthSummary::Healthy),
            partition_id: 2,
        };
        let pending = GpuFabricInfo {
            cluster_uuid: [0; 16],
            status: Some(NvStatus::NotReady),
            clique_id: 0,
            state: ProbeState::InProgress,
            health_mask: 0,
            health_summary: None,
            partition_id: 0,
        };
        let rows = [row(&gpu(0), &done), row(&gpu(1), &pending)];
        assert_eq!(rows[0]["fabric_state_code"], 3);
        assert_eq!(rows[1]["fabric_status"], "NV_ERR_NOT_READY");
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[0].starts_with("GPU  UUID"), "{t}");
        assert!(
            lines[1].contains(&"ab".repeat(16))
                && lines[1].contains(" 7 ")
                && lines[1].ends_with("COMPLETED     HEALTHY"),
            "{t}"
        );
        assert!(lines[2].ends_with("IN_PROGRESS   -"), "{t}");
    }
}
