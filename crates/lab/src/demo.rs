//! `openimex-lab demo`: an NVLink domain started from a topology (a preset, GB200 NVL72 by
//! default, or a topology file; [`domain`]): the simulated Fabric Manager first, then one GPU
//! driver and one IMEX daemon per compute tray, through the cluster harness; then one of four
//! workloads on it. The modes sit side by side on one set-up ([`setup`]: prepare, start, check
//! for leaks), flags in [`args`]; none calls back into this module.
//!
//! - [`all_to_all`] (the default): every GPU imports every other GPU's buffer and both sides
//!   check patterns through the shared mappings; with `--partitions K`, imports across cliques
//!   must be refused at map.
//! - [`allreduce`] (`--allreduce`): an NVLS-style all-reduce over one multicast object.
//! - [`jobs`] (`--jobs K`): K concurrent jobs (issue 31) over overlapping trays, defined by job
//!   files; the all-to-all within each job, and every import across jobs must be refused.
//! - [`chaos`] (`--chaos`): the all-to-all as application processes under seeded faults (the
//!   harness's chaos engine starts its own cluster).

mod all_to_all;
mod allreduce;
mod args;
mod chaos;
pub(crate) mod domain;
mod jobs;
mod setup;

pub(crate) use args::DemoArgs;
pub(crate) use setup::leak_check;

/// Runs the mode the flags ask for; each prints its summary and fails when any byte or count
/// is wrong.
pub(crate) fn run(args: &DemoArgs) -> anyhow::Result<()> {
    if args.jobs.is_some() {
        jobs::run(args)
    } else if args.chaos {
        chaos::run(args)
    } else if args.allreduce {
        allreduce::run(args)
    } else {
        all_to_all::run(args)
    }
}
