//! Scratch directories under the system temp dir (or a root the process chose once, see
//! [`set_root`]), removed on drop unless a panic is unwinding (then kept, and their path
//! printed, so the files can be inspected).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::HarnessError;

/// Distinguishes directories made by one process.
static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Where this process's scratch directories go when not the temp dir; set once.
static ROOT: OnceLock<PathBuf> = OnceLock::new();

/// Puts every scratch directory this process makes from now on under `root` rather than the
/// temp dir. The first call wins: it returns the root in force when another was set before.
pub fn set_root(root: PathBuf) -> Result<(), PathBuf> {
    ROOT.set(root)
        .map_err(|_| ROOT.get().cloned().unwrap_or_default())
}

/// The directory scratch directories are made in: [`set_root`]'s, else the temp dir.
pub fn root() -> PathBuf {
    ROOT.get().cloned().unwrap_or_else(std::env::temp_dir)
}

/// Free space [`memory_root`] asks of `/dev/shm`: the clusters' simulated HBM is sparse, but
/// what the bench writes into it (64 MiB copies, the storm's verified pages) lands there, and a
/// container's default `/dev/shm` (64 MiB) would run out.
const MEMORY_ROOT_MIN_FREE: u64 = 2 << 30;

/// `/dev/shm` when it is a tmpfs this process can write to with at least 2 GiB free. A
/// benchmark whose rounds make and remove whole clusters of files runs there so that it times
/// the daemons, not the disk: on ext4, creating a file soon after many were deleted scans past
/// each recently freed inode (0.4 ms a file measured on a build machine), and each round's
/// clean-up makes the next round's files that slow.
pub fn memory_root() -> Option<PathBuf> {
    let shm = Path::new("/dev/shm");
    let fs = nix::sys::statfs::statfs(shm).ok()?;
    if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        return None;
    }
    let vfs = nix::sys::statvfs::statvfs(shm).ok()?;
    let free = vfs.blocks_available().saturating_mul(vfs.fragment_size());
    if free < MEMORY_ROOT_MIN_FREE {
        return None;
    }
    nix::unistd::access(
        shm,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    )
    .ok()?;
    Some(shm.to_owned())
}

/// A fresh directory `<root>/openimex-<label>-<pid>-<n>-<random>` ([`root`]).
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
    keep: bool,
}

impl ScratchDir {
    /// Creates the directory. `label` says what it is for (e.g. `cluster`, `cfg`).
    pub fn new(label: &str) -> Result<Self, HarnessError> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let r: u32 = StdRng::from_os_rng().random();
        let path = root().join(format!(
            "openimex-{label}-{}-{n}-{r:08x}",
            std::process::id()
        ));
        fs::create_dir_all(&path).map_err(HarnessError::io(
            "create directory",
            &path,
            "check that the scratch root (the temp dir, TMPDIR, unless the program chose \
             another) is writable",
        ))?;
        Ok(Self { path, keep: false })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the directory in place when dropped.
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// Whether the directory will be left in place.
    pub fn is_kept(&self) -> bool {
        self.keep
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "openimex-harness: kept {} for inspection",
                self.path.display()
            );
        } else if self.keep {
            eprintln!("openimex-harness: kept {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_distinct_and_removed() {
        let a = ScratchDir::new("t").expect("scratch");
        let b = ScratchDir::new("t").expect("scratch");
        assert_ne!(a.path(), b.path());
        assert!(a.path().is_dir());
        let p = a.path().to_owned();
        fs::write(p.join("f"), "x").expect("write");
        drop(a);
        assert!(!p.exists());
    }
}
