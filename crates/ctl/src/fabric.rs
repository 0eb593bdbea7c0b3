//! `--fabric` (ours): this node's GPUs on the NVLink fabric (probe state, clusterUuid,
//! partition, cliqueId, bandwidth mode, health summary and the named health fields) and every
//! node's cliques, marking the nodes outside this node's clique(s) — memory they export does
//! not map here (`docs/reference/driver-interface.md` §5, §6.8). Text or JSON (`-j`).
//!
//! A node's cliques are those of its GPUs whose probe completed. A node that could not be
//! asked, or whose daemon predates the field, has none known: it is shown as unknown, never as
//! outside.

use std::collections::BTreeSet;

use openimex_core::gpu::bw_mode_name;
use openimex_proto::cmd::{DomainReply, NodeReport};
use openimex_proto::peer::GpuFabric;
use openimex_rmabi::health::{HealthField, HealthMask};
use serde_json::{Value, json};

/// The fields' words: NOT_SUPPORTED 0, TRUE 1, FALSE 2 (NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_*).
fn flag_word(raw: u32) -> &'static str {
    match raw {
        0 => "NOT_SUPPORTED",
        1 => "TRUE",
        2 => "FALSE",
        _ => "UNDEFINED",
    }
}

/// The fields that are TRUE, as the text view lists them (PARTITION_ASSIGNED is the normal
/// state, so it is listed when FALSE instead).
fn health_bits(mask: u32) -> String {
    let m = HealthMask(mask);
    let mut bits: Vec<String> = HealthField::ALL
        .into_iter()
        .filter(|f| *f != HealthField::PartitionAssigned && m.is(*f))
        .map(|f| f.name().to_string())
        .collect();
    if m.raw(HealthField::PartitionAssigned) == 2 {
        bits.push("NO_PARTITION".into());
    }
    if m.config_raw() > 1 {
        bits.push(format!("INCORRECT_CONFIGURATION={}", m.config_raw()));
    }
    match bits.is_empty() {
        true => "-".into(),
        false => bits.join(","),
    }
}

/// The cliques of a node's GPUs whose probe completed.
fn cliques(gpus: &[GpuFabric]) -> BTreeSet<u32> {
    gpus.iter()
        .filter(|g| g.state == "COMPLETED")
        .map(|g| g.clique_id)
        .collect()
}

/// Whether `node` is outside `mine`: its cliques are known and share none with this node's.
fn outside(node: &NodeReport, mine: &BTreeSet<u32>) -> bool {
    let theirs = cliques(&node.gpus);
    !theirs.is_empty() && !mine.is_empty() && theirs.is_disjoint(mine)
}

fn local(reply: &DomainReply) -> Option<&NodeReport> {
    reply
        .nodes
        .iter()
        .find(|n| n.node_id == reply.local_node_id)
}

fn list(c: &BTreeSet<u32>) -> String {
    match c.is_empty() {
        true => "?".into(),
        false => c
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// The text view.
pub fn fabric_text(reply: &DomainReply) -> String {
    let gpus = local(reply).map_or(&[][..], |n| &n.gpus[..]);
    let mine = cliques(gpus);
    let mut out = format!(
        "Node {} GPUs on the NVLink fabric (clique {}):\n",
        reply.local_node_id,
        list(&mine)
    );
    let mut rows = vec![
        [
            "GPU",
            "PROBE",
            "CLUSTER UUID",
            "PARTITION",
            "CLIQUE",
            "BW MODE",
            "EPOCH",
            "HEALTH",
            "HEALTH BITS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for g in gpus {
        rows.push(vec![
            g.gpu.to_string(),
            g.state.clone(),
            or_dash(&g.cluster_uuid),
            g.partition_id.to_string(),
            g.clique_id.to_string(),
            bw_mode_name(u16::try_from(g.bw_mode).unwrap_or(u16::MAX)),
            g.bw_mode_epoch.to_string(),
            or_dash(&g.health_summary),
            health_bits(g.health_mask),
        ]);
    }
    if gpus.is_empty() {
        out.push_str("  (no GPU reported)\n");
    } else {
        out.push_str(&columns(&rows));
    }
    out.push_str("\nNodes and their cliques:\n");
    let mut rows = vec![
        ["NODE", "HOST", "STATE", "CLIQUES", ""]
            .map(String::from)
            .to_vec(),
    ];
    for n in &reply.nodes {
        let note = if n.node_id == reply.local_node_id {
            "this node"
        } else if outside(n, &mine) {
            "OUTSIDE this node's clique"
        } else if cliques(&n.gpus).is_empty() {
            "clique unknown"
        } else {
            ""
        };
        rows.push(vec![
            n.node_id.to_string(),
            n.host.clone(),
            n.state.clone(),
            list(&cliques(&n.gpus)),
            note.to_string(),
        ]);
    }
    out.push_str(&columns(&rows));
    out
}

fn or_dash(s: &str) -> String {
    match s.is_empty() {
        true => "-".into(),
        false => s.to_string(),
    }
}

/// Left-aligned columns two spaces apart, trailing blanks trimmed.
fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (cell, w) in r.iter().zip(&widths) {
            line.push_str(&format!("{cell:<w$}  "));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn gpu_json(g: &GpuFabric) -> Value {
    let m = HealthMask(g.health_mask);
    let fields: serde_json::Map<String, Value> = HealthField::ALL
        .into_iter()
        .map(|f| (f.name().to_string(), json!(flag_word(m.raw(f)))))
        .collect();
    json!({
        "gpu": g.gpu,
        "probe_state": g.state,
        "cluster_uuid": g.cluster_uuid,
        "partition_id": g.partition_id,
        "clique_id": g.clique_id,
        "bw_mode": g.bw_mode,
        "bw_mode_name": bw_mode_name(u16::try_from(g.bw_mode).unwrap_or(u16::MAX)),
        "bw_mode_epoch": g.bw_mode_epoch,
        "health_summary": g.health_summary,
        "health_mask": g.health_mask,
        "health": fields,
        "incorrect_configuration": m.config_raw(),
    })
}

/// The JSON view (one document).
pub fn fabric_json(reply: &DomainReply) -> String {
    let gpus = local(reply).map_or(&[][..], |n| &n.gpus[..]);
    let mine = cliques(gpus);
    let nodes: Vec<Value> = reply
        .nodes
        .iter()
        .map(|n| {
            json!({
                "node_id": n.node_id,
                "host": n.host,
                "state": n.state,
                "cliques": cliques(&n.gpus),
                "outside_clique": outside(n, &mine),
                "gpus": n.gpus.iter().map(gpu_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "local_node_id": reply.local_node_id,
        "cliques": mine,
        "gpus": gpus.iter().map(gpu_json).collect::<Vec<_>>(),
        "nodes": nodes,
    })
    .to_string()
}
