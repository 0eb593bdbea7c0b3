//! The NVLink domain as plain data: what a simulated Fabric Manager (FM) knows and answers.
//!
//! - [`topology`]: racks, compute trays (2 Grace CPUs + N GPUs), NVLink switch trays (2 NVSwitch
//!   chips, with or without OSFP ports), the OSFP links joining racks, and named presets
//!   (`nvl36`, `nvl36x2`, `nvl72`, `nvl576`).
//! - [`file`](mod@file): the topology file format for custom layouts, its parser and printer.
//! - [`probe`]: the numeric encodings of the GPU fabric probe (driver-interface §5) and the
//!   per-GPU probe answer.
//! - [`partition`]: fabric partitions of whole compute trays, each with its own cliqueId, and
//!   which GPUs' cliqueId a layout change moves.
//! - [`answer`]: the FM's probe answer for every GPU, all of the above combined.
//! - [`health`]: each GPU's health mask and summary given switch trays down and link faults.
//!
//! Everything here is a pure function of its inputs: no I/O except reading a topology file,
//! no runtime. The FM process that serves these answers to the trays' drivers builds on it.

pub mod answer;
mod error;
pub mod file;
pub mod health;
pub mod partition;
pub mod probe;
pub mod topology;

pub use error::FabricError;
pub use topology::{GpuId, Topology};
