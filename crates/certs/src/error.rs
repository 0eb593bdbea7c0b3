//! The one error type of the certificates: each names the thing, the cause and what to do.

use std::io;
use std::path::PathBuf;

/// Why certificates could not be made or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertsError {
    /// A certificate or key could not be made.
    #[error("cannot make {what}: {cause}\n  hint: {hint}")]
    Make {
        /// What was being made, e.g. `the certificate of node 2 (10.0.0.3)`.
        what: String,
        /// What rcgen said.
        cause: String,
        /// What to check.
        hint: &'static str,
    },
    /// A file that would be written exists already.
    #[error("{} exists already; pass --force to overwrite it, or choose another --out directory", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// A file or directory operation failed.
    #[error("cannot {action} {}: {source}\n  hint: {hint}", path.display())]
    Io {
        /// What was being done, e.g. "write".
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
        /// What to check.
        hint: &'static str,
    },
}
