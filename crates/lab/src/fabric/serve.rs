//! `openimex-lab fabric serve`: the flags of the Fabric Manager process; the process itself is
//! `openimex_fabric_manager::server`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use openimex_fabric_manager::partition::split;
use openimex_fabric_manager::server::{ServeConfig, run};

/// `openimex-lab fabric serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// A topology preset: nvl72 (default), nvl36, nvl36x2, nvl576.
    #[arg(long, value_name = "NAME", conflicts_with = "file")]
    topology: Option<String>,
    /// A topology file (format in docs/lab/fabric.md, "NVLink topologies").
    #[arg(long, value_name = "FILE")]
    file: Option<PathBuf>,
    /// The fabric directory the trays' drivers share (`openimex-lab gpu --fabric-dir`); the FM's
    /// in-band socket goes there.
    #[arg(long, value_name = "DIR")]
    fabric_dir: PathBuf,
    /// Start with K partitions of consecutive compute trays.
    #[arg(long, value_name = "K", default_value_t = 1)]
    partitions: usize,
    /// The operator's control socket [default: DIR/fabric-manager.ctl].
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// The NVLink domain's name, from which its clusterUuid derives [default: the topology's].
    #[arg(long, value_name = "NAME")]
    domain: Option<String>,
}

/// Runs the FM until SIGTERM, SIGINT or SIGQUIT.
pub(crate) fn serve(args: &ServeArgs) -> Result<()> {
    let topology = super::load_topology(args.topology.as_deref(), args.file.as_ref())?;
    let layout = split(&topology, args.partitions)?;
    let domain = args.domain.clone().unwrap_or_else(|| topology.name.clone());
    run(ServeConfig {
        topology,
        domain,
        layout,
        fabric_dir: args.fabric_dir.clone(),
        control: args.control.clone(),
    })?;
    Ok(())
}
