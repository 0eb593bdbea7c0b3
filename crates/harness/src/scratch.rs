//! Scratch directories under the system temp dir, removed on drop unless a panic is unwinding
//! (then kept, and their path printed, so the files can be inspected).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::HarnessError;

/// Distinguishes directories made by one process.
static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory `<temp>/openimex-<label>-<pid>-<n>-<random>`.
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
        let path = std::env::temp_dir().join(format!(
            "openimex-{label}-{}-{n}-{r:08x}",
            std::process::id()
        ));
        fs::create_dir_all(&path).map_err(HarnessError::io(
            "create directory",
            &path,
            "check that the temp dir (TMPDIR) is writable",
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
