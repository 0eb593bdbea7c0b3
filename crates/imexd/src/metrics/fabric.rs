//! The node's GPUs on the NVLink fabric as gauges: each GPU's health summary, health mask,
//! cliqueId and bandwidth mode, from the core node's fabric view (`openimex_core::Node::gpus`),
//! labelled by the GPU's index on the node.

use openimex_core::GpuFabric;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Labels;

/// Every healthSummary the probe reports (NV2080_CTRL_GPU_FABRIC_HEALTH_SUMMARY_*), so that a
/// series for each is present and the current one is 1.
const SUMMARIES: [&str; 3] = ["HEALTHY", "UNHEALTHY", "LIMITED_CAPACITY"];

fn gpu_label(g: &GpuFabric) -> Labels {
    vec![("gpu", g.gpu.to_string())]
}

/// Registers the GPUs' gauges in `r`.
pub(super) fn register(r: &mut Registry, gpus: &[GpuFabric]) {
    let health = Family::<Labels, Gauge>::default();
    for g in gpus {
        for s in SUMMARIES {
            let mut labels = gpu_label(g);
            labels.push(("summary", s.to_string()));
            health
                .get_or_create(&labels)
                .set(i64::from(g.health_summary == s));
        }
    }
    r.register(
        "gpu_fabric_health",
        "The GPU's fabric health summary from its fabric probe: 1 for the current one (none before the probe completes)",
        health,
    );
    let gauge = |f: fn(&GpuFabric) -> i64| {
        let family = Family::<Labels, Gauge>::default();
        for g in gpus {
            family.get_or_create(&gpu_label(g)).set(f(g));
        }
        family
    };
    r.register(
        "gpu_fabric_health_mask",
        "The GPU's packed fabric health fields (NV2080_CTRL_GPU_FABRIC_HEALTH_MASK_*)",
        gauge(|g| i64::from(g.health_mask)),
    );
    r.register(
        "gpu_fabric_clique_id",
        "The GPU's cliqueId (0 before its fabric probe completes)",
        gauge(|g| i64::from(g.clique_id)),
    );
    r.register(
        "gpu_fabric_bw_mode",
        "The GPU's NVLink bandwidth mode (NVLINK_INBAND_BW_MODE_*, 0 = FULL)",
        gauge(|g| i64::from(g.bw_mode)),
    );
}
