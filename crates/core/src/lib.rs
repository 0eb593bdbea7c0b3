//! The domain logic of openimex as plain state machines.
//!
//! This crate performs no I/O: no sockets, no threads, no tokio, and it never reads a clock.
//! Every input takes `now` from the caller and every output is an action the caller performs,
//! so the same code runs under the daemon, under a simulated network and in property tests.
//!
//! # Layout
//! - [`ids`]: node IDs and instance IDs.
//! - [`nodemap`]: the node map and the digest peers compare.
//! - [`state`]: NVIDIA's words for daemon, connection and domain states.
//! - [`backoff`]: reconnect backoff with seeded jitter.
//! - [`mesh`]: one daemon's links, handshake verdicts, liveness, quorum and daemon state.
//! - [`domain`]: the domain status rule over the connectivity matrix.
//! - [`fabric`]: exporter references and importer imports, which decide clean-up.
//! - [`gpu`]: the driver's events, page lists and statuses.
//! - [`jobs`]: jobs, isolated domains inside the nodes file's: definitions, agreement between
//!   members, readiness per job, which imports a job admits, channel quarantine.
//! - [`node`]: one node as a whole — the mesh, both tables and every lifecycle timer.
//! - [`timefmt`]: NVIDIA's timestamp formats.

#![deny(missing_docs)]

pub mod backoff;
pub mod domain;
pub mod fabric;
pub mod gpu;
pub mod ids;
pub mod jobs;
pub mod mesh;
pub mod node;
pub mod nodemap;
pub mod state;
pub mod timefmt;

pub use backoff::{Backoff, Rng};
pub use domain::{NodeRow, domain_status, domain_status_of};
pub use fabric::{Drained, ExportRefs, Imports, UnimportStep};
pub use gpu::{Event, GpuFabric, ImportAnswer, ImportError, Pages, RemoteGpuAttach, Status};
pub use ids::{ConnId, InstanceId, NodeId};
pub use mesh::{
    Action, DialBudget, DialFailure, Hello, LinkView, Mesh, MeshConfig, NOT_LISTENING_CAPS,
    QuorumPolicy, Verdict, Via,
};
pub use node::{
    CleanUp, Cleaned, ImportRequest, Node, NodeConfig, PERSIST_LINGER, PeerId, PeerState, RequestId,
};
pub use nodemap::{MapRefusal, NodeMap};
pub use state::{ConnStatus, DaemonState, DomainStatus, Mismatch, UnknownWord};
