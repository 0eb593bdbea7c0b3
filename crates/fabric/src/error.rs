//! The one error type of this crate. Messages about a topology file name the file and 1-based
//! line, quote the value as written, and say how to fix it (the style of the config crate).

use std::path::PathBuf;

/// Everything that can go wrong reading a topology or changing a partition layout.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// The topology file could not be read.
    #[error("cannot read topology file {}: {source}; pass an existing, readable file with --file", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line of a topology file is wrong.
    #[error("{}:{line}: {problem}: {value:?}; {fix}", .path.display())]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The offending value as written (clipped to 120 characters).
        value: String,
        /// What is wrong.
        problem: String,
        /// How to fix it.
        fix: String,
    },
    /// The topology file declares no rack with a compute tray.
    #[error("{}: no compute trays; a topology needs at least `rack NAME`, one `switch-tray NAME` and one `compute-tray NAME gpus=4` line", .path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// No preset has this name.
    #[error(
        "no topology preset named {name:?}; use one of {known}, or --file FILE for a custom layout"
    )]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// The preset names, comma-separated.
        known: String,
    },
    /// A partition change names a compute tray the topology does not have.
    #[error(
        "no compute tray at slot {slot}: the topology has {trays} compute trays (slots 0..{trays})"
    )]
    UnknownTray {
        /// The slot asked for.
        slot: u16,
        /// How many compute trays the topology has.
        trays: usize,
    },
    /// A partition change names a partition the layout does not have.
    #[error("no partition with id {id}; the layout has partitions {known}")]
    UnknownPartition {
        /// The id asked for.
        id: u16,
        /// The layout's partition ids, comma-separated.
        known: String,
    },
    /// A split asks for a partition count the domain cannot give.
    #[error(
        "cannot split {trays} compute trays into {k} partitions of whole trays; ask for 1 to {trays}"
    )]
    BadSplit {
        /// Partitions asked for.
        k: usize,
        /// Compute trays in the domain.
        trays: usize,
    },
    /// Partition ids are u16 and the highest is taken.
    #[error("no partition id left: partition {max} exists; delete partitions before creating more")]
    TooManyPartitions {
        /// The highest id in use.
        max: u16,
    },
}
