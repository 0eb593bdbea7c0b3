//! Multicast (NVLS) across trays as the daemon sees it (`docs/reference/driver-interface.md` §1.6
//! "Multicast (NVLS) across nodes" 3-4): the REMOTE_GPU_ATTACH event an importer's driver
//! posts when a local GPU joins an imported multicast object ([`crate::Event::RemoteGpuAttach`]),
//! which the importer's daemon forwards to the owner's daemon, and what the owner's daemon
//! does with it: ATTACH_REMOTE_GPU on the prime object ([`crate::Driver::attach_remote_gpu`]),
//! or SET_FAILURE on any error ([`crate::Driver::set_multicast_failure`]).

pub use openimex_core::gpu::RemoteGpuAttach;
