//! What an application links to share GPU memory across nodes: a small cuMem-shaped API over
//! the simulated GPU driver (`openimex-lab gpu`), with the FABRIC handle type and CUDA's error
//! codes.
//!
//! A [`Context`] is one connection to the node's driver (one RM client), opened on the node's
//! directory. Like libcuda it subscribes to the first IMEX channel it can open; without one,
//! fabric calls fail with `CUDA_ERROR_NOT_PERMITTED`. Memory is created on a GPU
//! ([`Context::mem_create`]), exported to a 64-byte [`FabricHandleBytes`]
//! ([`Context::export`]) that travels to peers out of band, imported there
//! ([`Context::import`], which waits for the IMEX daemons to complete it) and mapped
//! ([`Context::map`]): the mapping is the exporter's memory itself, not a copy.
//!
//! ```no_run
//! use std::path::Path;
//! use openimex_client::{Context, FabricHandleBytes};
//! // Node A: allocate 4 MiB on GPU 0, write it, export it.
//! let a = Context::open(Path::new("/run/openimex/node0"))?;
//! let mem = a.mem_create(0, 4 << 20)?;
//! a.map(&mem)?.as_mut_slice().fill(7);
//! let text = a.export(&mem)?.to_hex(); // ship to B (MPI, a file, …)
//! // Node B: import, map, read A's bytes in place.
//! let b = Context::open(Path::new("/run/openimex/node1"))?;
//! let imported = b.import(&FabricHandleBytes::from_hex(&text)?)?;
//! assert_eq!(b.map(&imported)?[0], 7);
//! # Ok::<(), openimex_client::CuError>(())
//! ```
//!
//! Where libcuda issues several RM ioctls (a fabric allocation under a Subdevice, an export
//! object, EXPORT_MEM, the IMPORT_V2 object and its wait), this library makes one higher-level
//! call of the simulated driver's own protocol: libcuda is closed, so the sequence it runs is
//! not known ioctl by ioctl. The IMEX daemon's side, which is public, is spoken byte for byte
//! (the daemon's `nvidia` backend, `docs/reference/driver-interface.md` §1.6).
//!
//! [`multicast`] adds NVLS multicast objects (cuMulticast*): a store through their mapping
//! lands in every member GPU's memory.
//!
//! [`Context::gpu_fabric_info`] reads a GPU's fabric probe as NVML presents it; fabric memory
//! cannot be created on a GPU whose probe has not completed.
//!
//! Memory lives until [`Context::release`] or until its context closes (the driver frees a
//! client's objects when its connection goes, as at process exit). [`pattern`] fills and
//! checks deterministic test data; [`cli`] is `openimex-lab app`; [`node_dir`] says where a node's
//! driver socket and channel files are.
//!
//! The library speaks the driver's protocol crate (`openimex-simproto`) and does not link the
//! simulated driver; its tests run against the real one (`openimex-simgpu`), in-process.

pub mod cli;
mod context;
pub mod error;
mod fabric_info;
pub mod multicast;
pub mod pattern;

pub use context::{
    Allocation, Context, DEFAULT_IMPORT_TIMEOUT, FabricHandleBytes, Imported, Mappable, Mapping,
};
pub use error::CuError;
pub use fabric_info::GpuFabricInfo;
pub use multicast::{McMapping, Multicast};
/// Where a node's driver socket and IMEX channel files are (the simulated driver's `/dev`).
pub use openimex_simproto::node_dir;
pub use openimex_simproto::probe::{HealthSummary, ProbeState};
pub use openimex_simproto::proto::{DriverStats, GpuInfo};
