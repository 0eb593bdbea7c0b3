//! `openimex-lab app multicast`: a multicast (NVLS) team of this node's GPUs through the client
//! library, end to end: create, add every GPU, bind each GPU's memory, store through the
//! team (checked in every GPU's memory) and load-reduce (`docs/reference/driver-interface.md`
//! §6.10). For scripts and the tests of the driver's multicast lifecycle (`--hold`, then kill
//! the process: the driver frees the team with it). `--import HANDLE` joins another tray's
//! team instead (import, add the GPUs, bind their memory).

use serde_json::json;

use super::{
    Failure, NodeArgs, catch_termination, cuda, next_line, open, parse_size, say, stdin_lines,
};
use crate::Context;

/// Arguments of `app multicast`.
#[derive(Debug, clap::Args)]
pub(super) struct MulticastArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// The GPUs of the team, by index (default: every GPU of the node).
    #[arg(long, value_name = "N,…", value_delimiter = ',')]
    gpus: Vec<u32>,
    /// Bytes bound on each GPU (a multiple of 2 MiB), or with a binary suffix.
    #[arg(long, value_name = "SIZE", default_value = "2M", value_parser = parse_size)]
    size: u64,
    /// Keep the team until stdin ends, `exit` or SIGTERM.
    #[arg(long)]
    hold: bool,
    /// Join another tray's team instead: import this multicast handle (128 hex digits), add
    /// the GPUs, wait for the team, bind SIZE bytes of each GPU's memory and say so (one JSON
    /// line), then release (or, with `--hold`, keep it all: kill the process to test what the
    /// driver frees).
    #[arg(long, value_name = "HEX")]
    import: Option<String>,
}

/// The word stored through the team.
const WORD: u32 = 0x5eed_f00d;

pub(super) fn multicast(a: &MulticastArgs) -> Result<(), Failure> {
    if a.hold {
        catch_termination();
    }
    let ctx = open(&a.node)?;
    let gpus: Vec<u32> = if a.gpus.is_empty() {
        ctx.gpus().iter().map(|g| g.index).collect()
    } else {
        a.gpus.clone()
    };
    let n = u32::try_from(gpus.len()).map_err(|_| Failure::Io("too many GPUs".into()))?;
    if let Some(hex) = &a.import {
        return join(a, &ctx, &gpus, hex);
    }
    let mc = ctx
        .multicast_create(n, a.size)
        .map_err(cuda("multicast create"))?;
    let mut mems = Vec::new();
    for &g in &gpus {
        mems.push(ctx.mem_create(g, a.size).map_err(cuda("create"))?);
    }
    for &g in &gpus {
        mc.add_device(g).map_err(cuda("multicast add device"))?;
    }
    for m in &mems {
        mc.bind_mem(m.gpu(), 0, m, 0, a.size)
            .map_err(cuda("multicast bind"))?;
    }
    let mut map = mc.map().map_err(cuda("multicast map"))?;
    map.store(4, &WORD.to_le_bytes())
        .map_err(cuda("multicast store"))?;
    let stored = every_gpu_holds(&ctx, &mems)?;
    for (i, m) in mems.iter().enumerate() {
        let mut view = ctx.map(m).map_err(cuda("map"))?;
        let v = u32::try_from(i + 1).unwrap_or(u32::MAX);
        view[..4].copy_from_slice(&v.to_le_bytes());
    }
    let sum = map.load_reduce_u32(0, 1).map_err(cuda("load-reduce"))?;
    let info = mc
        .info(std::time::Duration::ZERO)
        .map_err(cuda("multicast info"))?;
    say(&json!({
        "gpus": n,
        "size": a.size,
        "stored": stored,
        "load_reduce_u32": sum.first(),
        "address_base": info.team.map(|t| t.address_base),
    })
    .to_string());
    if a.hold {
        hold();
    }
    drop(map);
    release(&ctx, mc, mems)
}

/// `--import`: this tray's members of another tray's team, bound and (with `--hold`) held.
fn join(a: &MulticastArgs, ctx: &Context, gpus: &[u32], hex: &str) -> Result<(), Failure> {
    let handle = crate::FabricHandleBytes::from_hex(hex.trim()).map_err(cuda("import"))?;
    let mc = ctx
        .multicast_import(&handle)
        .map_err(cuda("multicast import"))?;
    let mut mems = Vec::new();
    for &g in gpus {
        mems.push(ctx.mem_create(g, a.size).map_err(cuda("create"))?);
        mc.add_device(g).map_err(cuda("multicast add device"))?;
    }
    // Binding waits for the team: the prime's tray counts this tray's attaches first.
    for m in &mems {
        mc.bind_mem(m.gpu(), 0, m, 0, a.size)
            .map_err(cuda("multicast bind"))?;
    }
    let info = mc
        .info(std::time::Duration::ZERO)
        .map_err(cuda("multicast info"))?;
    say(&json!({
        "imported": true,
        "gpus": gpus,
        "size": a.size,
        "address_base": info.team.map(|t| t.address_base),
    })
    .to_string());
    if a.hold {
        hold();
    }
    release(ctx, mc, mems)
}

/// Until stdin ends, says `exit`, or SIGTERM.
fn hold() {
    let rx = stdin_lines();
    while let Some(line) = next_line(&rx) {
        if line.trim() == "exit" {
            break;
        }
    }
}

fn release(
    ctx: &Context,
    mc: crate::Multicast<'_>,
    mems: Vec<crate::Allocation>,
) -> Result<(), Failure> {
    mc.release().map_err(cuda("multicast release"))?;
    for m in mems {
        ctx.release(m).map_err(cuda("release"))?;
    }
    Ok(())
}

/// Whether the word stored through the team is in every GPU's memory.
fn every_gpu_holds(ctx: &Context, mems: &[crate::Allocation]) -> Result<bool, Failure> {
    for m in mems {
        let view = ctx.map(m).map_err(cuda("map"))?;
        if view[4..8] != WORD.to_le_bytes() {
            return Ok(false);
        }
    }
    Ok(true)
}
