//! The NVLink domain as plain data: what a simulated Fabric Manager (FM) knows and answers.
//!
//! - [`topology`]: racks, compute trays (2 Grace CPUs + N GPUs), NVLink switch trays (2 NVSwitch
//!   chips, with or without OSFP ports), the OSFP links joining racks, and named presets
//!   (`nvl36`, `nvl36x2`, `nvl72`, `nvl576`).
//! - [`file`](mod@file): the topology file format for custom layouts, its parser and printer.
//! - [`probe`]: the numeric encodings of the GPU fabric probe (docs/reference/driver-interface.md §5) and the
//!   per-GPU probe answer.
//! - [`partition`]: fabric partitions of whole compute trays, each with its own cliqueId, and
//!   which GPUs' cliqueId a layout change moves.
//! - [`answer`]: the FM's probe answer for every GPU, all of the above combined.
//! - [`health`]: each GPU's health mask and summary given switch trays down and link faults.
//! - [`manager`]: the simulated Fabric Manager as a synchronous state machine (attach, probe
//!   answers and updates, operator commands, multicast teams).
//! - [`control`]: the operator's protocol on the FM's control socket, and its client.
//! - [`server`]: `openimex-lab fabric serve`, the FM process: the manager behind sockets.
//!
//! Everything but [`server`] and [`control`]'s client is a pure function of its inputs or a
//! synchronous state machine: no I/O except reading a topology file.

pub mod answer;
pub mod control;
mod error;
pub mod file;
pub mod health;
pub mod manager;
pub mod partition;
pub mod probe;
pub mod server;
pub mod topology;

pub use error::FabricError;
pub use topology::{GpuId, Topology};
