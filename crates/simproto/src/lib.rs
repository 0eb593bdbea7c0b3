//! The wire protocol of the simulated GPU driver (`openimex-lab gpu`), shared by the driver itself
//! (`openimex-simgpu`), the daemon's `sim` backend (`openimex-driver`) and the application
//! library (`openimex-client`), so that none of them links another to speak to it.
//!
//! On a real node this is the kernel interface: the ioctl structures of `/dev/nvidiactl`, the
//! `NV_ERR_*` status codes, the opaque 64-byte `CUmemFabricHandle`, and the device files
//! under `/dev`. Here:
//! - [`proto`] — requests, responses, status codes ([`proto::NvStatus`]) and the framing,
//!   including the channel descriptors passed with SCM_RIGHTS.
//! - [`escape`] — the RM escapes (ioctls) of the daemon's backend over the socket, byte for
//!   byte, with the descriptors the kernel would resolve.
//! - [`frame`] — the socket's framing (length, body, descriptors) with per-thread buffers.
//! - [`handle`] — the 64-byte fabric handle, the 16-byte export UUID and the hex codec of the
//!   text forms.
//! - [`probe`] — the GPU fabric probe: states, the Fabric Manager's response, the
//!   GET_GPU_FABRIC_PROBE_INFO answer.
//! - [`inband`] — the NVLink in-band messages between a tray's driver and the Fabric Manager
//!   (probe answers and updates, multicast team set-up).
//! - [`multicast`] — multicast (NVLS) objects' requests and the multicast table in the fabric
//!   directory.
//! - [`status`] — the driver's status codes (`NV_ERR_*`), re-exported by [`proto`].
//! - [`node_dir`] — where a node's driver socket and IMEX channel files live, and the channel
//!   file names (`channelN`).

#![deny(missing_docs)]

pub mod escape;
pub mod frame;
pub mod handle;
pub mod inband;
pub mod multicast;
pub mod node_dir;
pub mod probe;
pub mod proto;
pub mod status;
