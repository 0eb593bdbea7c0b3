//! The operator's tools: `install-links`, `channels` (in [`channels`](mod@channels)), `certs`
//! (in [`certs`](mod@certs)) and `init` (in [`init`](mod@init)).

mod certs;
mod channels;
mod init;

use std::path::Path;

use anyhow::{Context, Result, bail};

pub use certs::CertsArgs;
pub(crate) use certs::run as certs;
pub use channels::ChannelsCommand;
pub(crate) use channels::channels;
pub use init::InitArgs;
pub(crate) use init::run as init;
pub use init::{InitNode, InitPlan, init_domain, is_one_host};

/// Creates `nvidia-imex` and `nvidia-imex-ctl` symlinks to this binary in `dir`, which must
/// exist.
pub(crate) fn install_links(dir: &Path, force: bool) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    let exe = exe.canonicalize().unwrap_or(exe);
    // Never create the directory: a typo (`/usr/lcoal/bin`) would leave links nobody finds on
    // PATH, and the command would still say it worked.
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => bail!(
            "cannot install links into {}: it is not a directory; pass a directory on PATH, \
             e.g. /usr/local/bin",
            dir.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "cannot install links into {}: the directory does not exist; check the path, or \
             create it first (mkdir -p {}) if it is meant to be new",
            dir.display(),
            dir.display()
        ),
        Err(e) => bail!(
            "cannot install links into {}: {e}; pass a directory this user can write, e.g. \
             /usr/local/bin as root",
            dir.display()
        ),
    }
    for name in ["nvidia-imex", "nvidia-imex-ctl"] {
        let link = dir.join(name);
        if let Ok(meta) = std::fs::symlink_metadata(&link) {
            if !meta.file_type().is_symlink() && !force {
                bail!(
                    "{} exists and is not a link (NVIDIA's binary?); pass --force to replace it",
                    link.display()
                );
            }
            std::fs::remove_file(&link)
                .with_context(|| format!("cannot replace {}", link.display()))?;
        }
        std::os::unix::fs::symlink(&exe, &link).with_context(|| {
            format!("cannot create link {} -> {}", link.display(), exe.display())
        })?;
        println!("{} -> {}", link.display(), exe.display());
    }
    Ok(())
}
