//! A faithful simulated GPU driver and NVLink fabric (`openimex-lab gpu`), one driver process per
//! node, independent of the daemon so it outlives a daemon crash as a kernel module does.
//!
//! HBM lives in files of a *fabric directory* shared by every node of the simulated NVLink
//! domain (sparse, 2 MiB granularity); an importer maps the exporter's file range, so loads and
//! stores are zero-copy across processes and "nodes". IMEX channels are files under the node's
//! `dev/nvidia-caps-imex-channels/`; a client proves it holds one by passing an open descriptor.
//! The semantics follow `docs/reference/driver-interface.md` §1.6, §4 and §6.
//!
//! The socket protocol (the simulated ioctl interface: messages, status codes, framing), the
//! 64-byte fabric handle and the node-directory layout are not here: they are the
//! `openimex-simproto` crate, shared with the daemon's `sim` backend and the client library,
//! which talk to this driver without linking it.
//!
//! # Layout
//! - [`fla`] — fabric linear addresses: which GPU's HBM file and offset a PFN names.
//! - [`rm`] — the driver's state (sessions, exports, import descriptors, events, HBM) as a
//!   synchronous state machine with no sockets and no threads.
//! - [`rmapi`] — NVIDIA's RM ioctl interface (the escapes of `/dev/nvidiactl`) served over
//!   the state machine, byte for byte, with no sockets.
//! - [`server`] — the socket server: one thread per connection around a shared [`rm::Rm`],
//!   channel checks on passed descriptors, the blocking calls.
//! - [`cli`] — `openimex-lab gpu`: flags, `ready <socket>` line, signals.
//! - [`fm_link`] — `openimex-lab gpu --fabric-manager`: the tray's in-band link to the simulated
//!   Fabric Manager, which completes and updates the GPUs' probes.
//! - `testing` (feature `testing`) — a loopback stand-in for the IMEX daemons of in-process
//!   nodes, for the tests of code that talks to the driver.

pub mod cli;
pub mod fla;
pub mod fm_link;
pub mod rm;
pub mod rmapi;
pub mod server;
#[cfg(feature = "testing")]
pub mod testing;
