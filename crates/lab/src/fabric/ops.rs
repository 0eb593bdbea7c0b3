//! The operator's commands on a running Fabric Manager: `openimex-lab fabric status`,
//! `partition …`, `switch-tray …`, `link …`, `route-update …`, `access-timeout …`. Each sends
//! one request to the FM's control socket and prints what changed (which GPUs got a new
//! cliqueId or health); a refusal exits non-zero with the FM's reason.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use openimex_fabric_manager::control::{Request, Response, control_path, request};
use openimex_fabric_manager::manager::{Command, GpuChange, Status};

/// Which FM to talk to.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct Target {
    /// The fabric directory the FM serves (its control socket is DIR/fabric-manager.ctl).
    #[arg(long, value_name = "DIR")]
    fabric_dir: Option<PathBuf>,
    /// The FM's control socket.
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
}

/// Where to connect and how to print.
#[derive(Debug, Args)]
pub(crate) struct Common {
    #[command(flatten)]
    target: Target,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

impl Common {
    fn socket(&self) -> PathBuf {
        match (&self.target.control, &self.target.fabric_dir) {
            (Some(c), _) => c.clone(),
            (None, Some(d)) => control_path(d),
            // clap's group makes one of them required.
            (None, None) => control_path(std::path::Path::new(".")),
        }
    }
}

/// `openimex-lab fabric status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    common: Common,
}

/// `openimex-lab fabric partition …`.
#[derive(Debug, Subcommand)]
pub(crate) enum PartitionCommand {
    /// Replace the layout by K partitions of consecutive compute trays.
    Split {
        /// Partitions.
        #[arg(value_name = "K")]
        k: usize,
        #[command(flatten)]
        common: Common,
    },
    /// A new partition of these compute trays (slots or names), taken from their partitions.
    Create {
        /// Compute trays.
        #[arg(value_name = "TRAY", required = true)]
        trays: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Delete partition P: its trays belong to none (cliqueId 0).
    Delete {
        /// Partition id.
        #[arg(value_name = "P")]
        partition: u16,
        #[command(flatten)]
        common: Common,
    },
    /// Move a compute tray (slot or name) into partition P.
    Move {
        /// Compute tray.
        #[arg(value_name = "TRAY")]
        tray: String,
        /// Partition id.
        #[arg(value_name = "P")]
        partition: u16,
        #[command(flatten)]
        common: Common,
    },
}

/// Down or up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum UpDown {
    Down,
    Up,
}

/// `openimex-lab fabric switch-tray down|up NAME`.
#[derive(Debug, Args)]
pub(crate) struct SwitchTrayArgs {
    /// Down or up.
    state: UpDown,
    /// The switch tray's name (see `openimex-lab fabric status`).
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    common: Common,
}

/// Fault or repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum FaultRepair {
    Fault,
    Repair,
}

/// `openimex-lab fabric link fault|repair (--gpu TRAY:GPU --switch-tray NAME | --osfp N)`.
#[derive(Debug, Args)]
pub(crate) struct LinkArgs {
    /// Fail or repair.
    action: FaultRepair,
    /// The GPU end of an NVLink: compute tray (slot or name), colon, GPU index.
    #[arg(
        long,
        value_name = "TRAY:GPU",
        requires = "switch_tray",
        conflicts_with = "osfp"
    )]
    gpu: Option<String>,
    /// The switch tray end of that NVLink.
    #[arg(long, value_name = "NAME")]
    switch_tray: Option<String>,
    /// An OSFP link between racks, by index (`openimex-lab fabric topology` lists them).
    #[arg(long, value_name = "N", required_unless_present = "gpu")]
    osfp: Option<usize>,
    #[command(flatten)]
    common: Common,
}

/// On or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnOff {
    On,
    Off,
}

/// `openimex-lab fabric route-update on|off`.
#[derive(Debug, Args)]
pub(crate) struct RouteUpdateArgs {
    /// Started or ended.
    state: OnOff,
    #[command(flatten)]
    common: Common,
}

/// `openimex-lab fabric access-timeout on|off TRAY:GPU`.
#[derive(Debug, Args)]
pub(crate) struct AccessTimeoutArgs {
    /// Entered or left.
    state: OnOff,
    /// Compute tray (slot or name), colon, GPU index.
    #[arg(value_name = "TRAY:GPU")]
    gpu: String,
    #[command(flatten)]
    common: Common,
}

/// `TRAY:GPU`.
fn tray_gpu(s: &str) -> Result<(String, u32)> {
    let Some((tray, gpu)) = s.rsplit_once(':') else {
        bail!("{s:?} is not TRAY:GPU (e.g. 3:0 or r0-c3:0)");
    };
    let Ok(gpu) = gpu.parse::<u32>() else {
        bail!("{s:?}: the GPU index after the colon must be a number (e.g. 3:0)");
    };
    Ok((tray.to_owned(), gpu))
}

/// `openimex-lab fabric status`.
pub(crate) fn status(args: &StatusArgs) -> Result<()> {
    match request(&args.common.socket(), &Request::Status)? {
        Response::Status(s) if args.common.json => {
            println!("{}", serde_json::to_string_pretty(&s)?);
        }
        Response::Status(s) => print!("{}", describe_status(&s)),
        other => refused(other)?,
    }
    Ok(())
}

pub(crate) fn partition(cmd: &PartitionCommand) -> Result<()> {
    let (c, common) = match cmd {
        PartitionCommand::Split { k, common } => (Command::Split { k: *k }, common),
        PartitionCommand::Create { trays, common } => (
            Command::Create {
                trays: trays.clone(),
            },
            common,
        ),
        PartitionCommand::Delete { partition, common } => (
            Command::Delete {
                partition: *partition,
            },
            common,
        ),
        PartitionCommand::Move {
            tray,
            partition,
            common,
        } => (
            Command::Move {
                tray: tray.clone(),
                partition: *partition,
            },
            common,
        ),
    };
    apply(common, c)
}

pub(crate) fn switch_tray(a: &SwitchTrayArgs) -> Result<()> {
    let c = Command::SwitchTray {
        name: a.name.clone(),
        up: a.state == UpDown::Up,
    };
    apply(&a.common, c)
}

pub(crate) fn link(a: &LinkArgs) -> Result<()> {
    let up = a.action == FaultRepair::Repair;
    let c = match (&a.gpu, &a.switch_tray, a.osfp) {
        (Some(g), Some(s), _) => {
            let (tray, gpu) = tray_gpu(g)?;
            Command::GpuLink {
                tray,
                gpu,
                switch_tray: s.clone(),
                up,
            }
        }
        (_, _, Some(index)) => Command::OsfpLink { index, up },
        _ => bail!("name the link: --gpu TRAY:GPU --switch-tray NAME, or --osfp N"),
    };
    apply(&a.common, c)
}

pub(crate) fn route_update(a: &RouteUpdateArgs) -> Result<()> {
    let c = Command::RouteUpdate {
        on: a.state == OnOff::On,
    };
    apply(&a.common, c)
}

pub(crate) fn access_timeout(a: &AccessTimeoutArgs) -> Result<()> {
    let (tray, gpu) = tray_gpu(&a.gpu)?;
    let c = Command::AccessTimeoutRecovery {
        tray,
        gpu,
        on: a.state == OnOff::On,
    };
    apply(&a.common, c)
}

/// Sends one command and prints the GPUs it changed.
fn apply(common: &Common, c: Command) -> Result<()> {
    match request(&common.socket(), &Request::Apply(c))? {
        Response::Changed { changes } if common.json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({ "changes": changes }))?
            );
        }
        Response::Changed { changes } => print!("{}", describe_changes(&changes)),
        other => refused(other)?,
    }
    Ok(())
}

fn refused(r: Response) -> Result<()> {
    match r {
        Response::Refused { reason } => bail!("the Fabric Manager refused: {reason}"),
        other => bail!("the Fabric Manager answered out of turn: {other:?}"),
    }
}

/// One line per changed GPU.
fn describe_changes(changes: &[GpuChange]) -> String {
    let mut out = String::new();
    if changes.is_empty() {
        out.push_str("no GPU's answer changed\n");
        return out;
    }
    // Writing to a String cannot fail.
    let n = changes.len();
    let _ = writeln!(out, "{n} GPU{} changed:", if n == 1 { "" } else { "s" });
    for c in changes {
        let mut line = format!("  slot {} gpu {}:", c.slot, c.gpu);
        if c.clique.0 != c.clique.1 {
            let _ = write!(line, " cliqueId {} -> {}", c.clique.0, c.clique.1);
        }
        if c.health.0 != c.health.1 {
            let _ = write!(line, " health {} -> {}", c.health.0, c.health.1);
        }
        if !c.flags.is_empty() {
            let _ = write!(line, " [{}]", c.flags.join(" "));
        }
        if !c.attached {
            line.push_str(" (tray not attached: on attach)");
        }
        let _ = writeln!(out, "{line}");
    }
    out
}

/// The text of `openimex-lab fabric status`.
fn describe_status(s: &Status) -> String {
    let mut out = String::new();
    let attached = s.trays.iter().filter(|t| t.attached).count();
    let _ = writeln!(
        out,
        "domain {}: clusterUuid {}, {} compute trays ({attached} attached), {} GPUs, {} multicast teams",
        s.domain,
        s.cluster_uuid,
        s.trays.len(),
        s.gpus.len(),
        s.mc_teams
    );
    for p in &s.partitions {
        let trays: Vec<String> = p.trays.iter().map(u16::to_string).collect();
        let _ = writeln!(
            out,
            "partition {}: cliqueId {}, trays [{}]",
            p.id,
            p.clique_id,
            trays.join(" ")
        );
    }
    let down: Vec<&str> = s
        .switch_trays
        .iter()
        .filter(|t| !t.up)
        .map(|t| t.name.as_str())
        .collect();
    let _ = writeln!(
        out,
        "switch trays: {} up, {} down{}",
        s.switch_trays.len() - down.len(),
        down.len(),
        if down.is_empty() {
            String::new()
        } else {
            format!(" ({})", down.join(" "))
        }
    );
    for (slot, gpu, sw) in &s.gpu_links_down {
        let _ = writeln!(out, "link down: slot {slot} gpu {gpu} <-> {sw}");
    }
    for i in &s.osfp_links_down {
        let _ = writeln!(out, "OSFP link {i} down");
    }
    if s.route_update {
        out.push_str("route update in progress\n");
    }
    for t in &s.trays {
        let gpus: Vec<String> = s
            .gpus
            .iter()
            .filter(|g| g.slot == t.slot)
            .map(|g| {
                let mut h = format!("{}:{}/{}", g.gpu, g.clique_id, g.health);
                let extra: Vec<&str> = g
                    .flags
                    .iter()
                    .map(String::as_str)
                    .filter(|f| *f != "PARTITION_ASSIGNED")
                    .collect();
                if !extra.is_empty() {
                    let _ = write!(h, "[{}]", extra.join(","));
                }
                h
            })
            .collect();
        let _ = writeln!(
            out,
            "tray {} {} (rack {}): {}; gpu:clique/health {}",
            t.slot,
            t.name,
            t.rack,
            if t.attached {
                "attached"
            } else {
                "not attached"
            },
            gpus.join(" ")
        );
    }
    out
}
