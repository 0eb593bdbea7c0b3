//! A scratch directory for the logging tests: one per test and process (parallel-safe),
//! removed when dropped.

use std::path::{Path, PathBuf};

pub(crate) struct Dir(PathBuf);

impl Dir {
    /// A new, empty `openimex-log-NAME-PID` under the temp dir.
    pub(crate) fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("openimex-log-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Dir(dir)
    }

    /// A path inside.
    pub(crate) fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
