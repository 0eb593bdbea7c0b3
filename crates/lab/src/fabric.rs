//! `openimex-lab fabric …`: the NVLink domain's tools. Here `topology` (the layout of a domain:
//! racks, compute trays, GPUs, switch trays, OSFP links and, per GPU, the cliqueId and FLA base
//! the Fabric Manager would hand it); the FM process is in [`serve`], the operator's commands
//! on a running FM in [`ops`]. The data model lives in the `openimex-fabric-manager` crate.

mod ops;
mod serve;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};
use openimex_fabric_manager::answer::answers;
use openimex_fabric_manager::health::Faults;
use openimex_fabric_manager::partition::split;
use openimex_fabric_manager::probe::uuid_string;
use openimex_fabric_manager::topology::{
    CPUS_PER_COMPUTE_TRAY, DEFAULT_PRESET, PRESETS, SWITCH_CHIPS_PER_TRAY, preset,
};
use openimex_fabric_manager::{Topology, file};
use serde_json::json;

/// `openimex-lab fabric …`.
#[derive(Debug, Subcommand)]
pub(crate) enum FabricCommand {
    /// Print an NVLink domain's layout: racks, trays, GPUs, switch trays, and per GPU its
    /// cliqueId and FLA base.
    Topology(TopologyArgs),
    /// Run the domain's simulated Fabric Manager in the foreground (before the trays' drivers,
    /// which start with `openimex-lab gpu --fabric-manager`).
    Serve(serve::ServeArgs),
    /// A running Fabric Manager's view: trays, partitions, switch trays, per-GPU health.
    Status(ops::StatusArgs),
    /// Change the partitions of a running Fabric Manager.
    #[command(subcommand)]
    Partition(ops::PartitionCommand),
    /// Take a switch tray down or bring it back up.
    SwitchTray(ops::SwitchTrayArgs),
    /// Fail or repair a GPU's NVLink to a switch tray, or an OSFP link between racks.
    Link(ops::LinkArgs),
    /// Start or end a route update (ROUTE_UPDATE on every GPU while it lasts).
    RouteUpdate(ops::RouteUpdateArgs),
    /// Put a GPU into or out of NVLink access-timeout recovery.
    AccessTimeout(ops::AccessTimeoutArgs),
}

/// `openimex-lab fabric topology`.
#[derive(Debug, Args)]
pub(crate) struct TopologyArgs {
    /// A preset: nvl72 (default), nvl36, nvl36x2, nvl576.
    #[arg(value_name = "NAME", conflicts_with = "file")]
    name: Option<String>,
    /// A topology file (format in docs/lab/fabric.md, "NVLink topologies").
    #[arg(long, value_name = "FILE")]
    file: Option<PathBuf>,
    /// Split the domain into K partitions of whole compute trays (each its own clique).
    #[arg(long, value_name = "K", default_value_t = 1)]
    partitions: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// A preset by name (the default when `None`) or a topology file.
fn load_topology(name: Option<&str>, file: Option<&PathBuf>) -> Result<Topology> {
    Ok(match file {
        Some(path) => file::load(path)?,
        None => preset(name.unwrap_or(DEFAULT_PRESET))?,
    })
}

/// Runs `openimex-lab fabric …`.
pub(crate) fn fabric(cmd: &FabricCommand) -> Result<()> {
    match cmd {
        FabricCommand::Topology(a) => topology(a),
        FabricCommand::Serve(a) => serve::serve(a),
        FabricCommand::Status(a) => ops::status(a),
        FabricCommand::Partition(c) => ops::partition(c),
        FabricCommand::SwitchTray(a) => ops::switch_tray(a),
        FabricCommand::Link(a) => ops::link(a),
        FabricCommand::RouteUpdate(a) => ops::route_update(a),
        FabricCommand::AccessTimeout(a) => ops::access_timeout(a),
    }
}

fn topology(args: &TopologyArgs) -> Result<()> {
    let topo = load_topology(args.name.as_deref(), args.file.as_ref())?;
    let layout = split(&topo, args.partitions)?;
    let probes = answers(&topo, &layout, &Faults::default());
    if args.json {
        let gpus: Vec<_> = probes
            .iter()
            .map(|(g, p)| {
                json!({
                    "slot": g.slot, "gpu": g.gpu, "partition": p.partition_id,
                    "clique_id": p.clique_id, "fla_base": format!("{:#x}", p.fla_base),
                    "fla_range": format!("{:#x}", p.fla_range),
                })
            })
            .collect();
        let uuid = probes.values().next().map(|p| p.cluster_uuid);
        let doc = json!({
            "topology": topo.name,
            "cluster_uuid": uuid_string(&uuid.unwrap_or_default()),
            "racks": topo.racks.len(),
            "compute_trays": topo.compute_tray_count(),
            "gpus": topo.gpu_count(),
            "switch_trays": topo.switch_tray_count(),
            "fabrics": topo.fabric_count(),
            "layout": serde_json::to_value(&topo)?,
            "partitions": serde_json::to_value(&layout)?,
            "gpu_fabric": gpus,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    print!("{}", describe(&topo, &layout, &probes));
    Ok(())
}

/// The text listing.
fn describe(
    topo: &Topology,
    layout: &openimex_fabric_manager::partition::Layout,
    probes: &std::collections::BTreeMap<
        openimex_fabric_manager::GpuId,
        openimex_fabric_manager::probe::ProbeInfo,
    >,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "topology {}: {} racks, {} compute trays, {} GPUs, {} switch trays, {} fabric(s)",
        topo.name,
        topo.racks.len(),
        topo.compute_tray_count(),
        topo.gpu_count(),
        topo.switch_tray_count(),
        topo.fabric_count()
    );
    if let Some(p) = probes.values().next() {
        let _ = writeln!(out, "clusterUuid {}", uuid_string(&p.cluster_uuid));
    }
    for p in &layout.partitions {
        let _ = writeln!(
            out,
            "partition {}: cliqueId {}, {} compute trays",
            p.id,
            p.clique_id,
            p.trays.len()
        );
    }
    let mut trays = topo.compute_trays().peekable();
    for (r, rack) in topo.racks.iter().enumerate() {
        let _ = writeln!(
            out,
            "rack {}: {} switch trays, {} compute trays",
            rack.name,
            rack.switch_trays.len(),
            rack.compute_trays.len()
        );
        for s in &rack.switch_trays {
            let _ = writeln!(
                out,
                "  switch-tray {}: {SWITCH_CHIPS_PER_TRAY} NVSwitch chips, {} OSFP ports",
                s.name, s.osfp
            );
        }
        while let Some(t) = trays.next_if(|t| t.rack == r) {
            let _ = writeln!(
                out,
                "  compute-tray {} (slot {}): {CPUS_PER_COMPUTE_TRAY} Grace CPUs, {} GPUs",
                t.tray.name, t.slot, t.tray.gpus
            );
            for (g, p) in probes.range(
                openimex_fabric_manager::GpuId {
                    slot: t.slot,
                    gpu: 0,
                }..=openimex_fabric_manager::GpuId {
                    slot: t.slot,
                    gpu: u32::MAX,
                },
            ) {
                let _ = writeln!(
                    out,
                    "    gpu {}: cliqueId {}, FLA base {:#018x}",
                    g.gpu, p.clique_id, p.fla_base
                );
            }
        }
    }
    for l in &topo.links {
        let _ = writeln!(out, "link {} <-> {} (OSFP)", l.a, l.b);
    }
    let _ = writeln!(
        out,
        "presets: {}",
        PRESETS
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
            .join(", ")
    );
    out
}
