//! `openimex`: the open IMEX service as an operator installs it.
//!
//! Subcommands: `daemon` (NVIDIA's `nvidia-imex`), `ctl` (`nvidia-imex-ctl`), `install-links`,
//! `channels`, `certs`, `init`, `driver-check`. Invoked through a link named `nvidia-imex` or
//! `nvidia-imex-ctl`, it behaves as that program, so systemd units, Slurm prologs, Kubernetes
//! probes and DCGM work unchanged. The simulator, demo and bench are the lab binary's
//! (`openimex-lab`).

use std::process::ExitCode;

/// The lab binary's subcommands: asked of this one, they get directions instead of clap's
/// "unrecognized subcommand".
const LAB_COMMANDS: &[&str] = &["demo", "bench", "gpu", "app", "fabric", "local"];

fn main() -> ExitCode {
    if let Some(sub) = std::env::args().nth(1)
        && LAB_COMMANDS.contains(&sub.as_str())
    {
        eprintln!(
            "openimex: `{sub}` is a command of the lab binary, not of this production one; \
             in a source tree run `cargo run --release -p openimex-lab -- {sub}`, or run the \
             installed `openimex-lab {sub}`"
        );
        return ExitCode::from(2);
    }
    openimex::entry::<openimex::Command>(
        "openimex",
        openimex::ABOUT,
        openimex::PASSTHROUGH,
        openimex::run,
    )
}
