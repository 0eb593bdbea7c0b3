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
    /// An operator command names a switch tray the topology does not have.
    #[error("no switch tray named {name:?}; the topology's switch trays are {known}")]
    UnknownSwitchTray {
        /// The name asked for.
        name: String,
        /// Some of the topology's switch tray names.
        known: String,
    },
    /// An operator command names a compute tray (by name or slot) the topology does not have.
    #[error(
        "no compute tray {name:?}; name one by its slot (0..{trays}) or its name (e.g. {example})"
    )]
    UnknownTrayName {
        /// The name asked for.
        name: String,
        /// How many compute trays the topology has.
        trays: usize,
        /// A valid name.
        example: String,
    },
    /// An operator command names a GPU the topology does not have.
    #[error("no GPU {gpu} on the compute tray at slot {slot}; that tray has {gpus} GPUs")]
    UnknownGpu {
        /// The tray.
        slot: u16,
        /// The GPU index asked for.
        gpu: u32,
        /// GPUs on the tray.
        gpus: u32,
    },
    /// An operator command names an OSFP link the topology does not have.
    #[error(
        "no OSFP link {index}: the topology has {links} (numbered from 0, see `openimex-lab fabric topology`)"
    )]
    UnknownLink {
        /// The index asked for.
        index: usize,
        /// How many links the topology has.
        links: usize,
    },
    /// The Fabric Manager process could not set up a file or socket.
    #[error("cannot {action} {}: {source}; {fix}", .path.display())]
    Serve {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
        /// How to fix it.
        fix: &'static str,
    },
    /// A live Fabric Manager already serves the fabric directory.
    #[error("a Fabric Manager is already serving {}; stop it first (one FM per NVLink domain)", .0.display())]
    AlreadyRunning(PathBuf),
    /// Talking to the Fabric Manager's control socket failed.
    #[error("Fabric Manager control socket {}: {detail}; {fix}", .path.display())]
    Control {
        /// The socket.
        path: PathBuf,
        /// What went wrong.
        detail: String,
        /// How to fix it.
        fix: &'static str,
    },
    /// The Fabric Manager process could not start a thread or block its stop signals.
    #[error("cannot {what}: {source}; check the process limits (threads, signals)")]
    Runtime {
        /// What was being done.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}
