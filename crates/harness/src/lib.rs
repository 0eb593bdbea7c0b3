//! Starts N `openimex` nodes on one machine as real processes, for integration tests,
//! `openimex-lab bench` and `openimex-lab demo`.
//!
//! Each node is an `openimex daemon -c <node dir>/config.cfg` process in the foreground,
//! bound to its own loopback address (`127.A.B.1`, `127.A.B.2`, … with `A`, `B` random and
//! probed free), so clusters started by tests running in parallel never collide even though
//! every node uses the fixed ports 50000/50005. The harness is synchronous `std::process`
//! code: no async runtime, no threads of its own except short-lived pipe readers.
//!
//! # Layout
//! - [`cluster`]: [`Cluster`] and [`ClusterSpec`]: prepare/start/kill -9/SIGTERM/restart/
//!   signal nodes, run `ctl` against them, wait for domain states, collect logs on failure.
//! - [`node`]: a node's files (config.cfg, nodes_config.cfg, imex.log, stdout/stderr, socket).
//! - [`names`]: names mode ([`ClusterSpec::with_names`]): the nodes file lists names and each
//!   daemon gets a private `/etc/hosts` (its own mount namespace; needs root). The cluster's
//!   hosts, spare-address, move and add operations live in `cluster/membership.rs`.
//! - [`netns`]: network namespaces (`ip netns`) joined by a veth pair with IPv6 link-local
//!   addresses, removed on drop (needs root).
//! - [`certs`]: the production crate `openimex-certs` (a per-domain CA and per-node
//!   certificates for mutual TLS), re-exported for [`ClusterSpec::with_tls`] and its tests.
//! - [`fabric_manager`]: the domain's simulated Fabric Manager process and its operator
//!   commands ([`ClusterSpec::from_topology`] starts a cluster's trays against it).
//! - [`addr`]: allocation of free loopback address blocks.
//! - [`domain`]: parsed views of `ctl -N -j` ([`DomainView`]), `ctl --links -j`
//!   ([`LinksView`]) and `ctl --peers -j` ([`PeersView`]), and NVIDIA's timestamp format.
//! - [`process`]: running a command with a time limit; finding a process by argument.
//! - [`scratch`]: temporary directories kept for inspection when a test panics.
//! - [`chaos`]: a workload of application processes under seeded random faults (kill -9 of
//!   apps, daemons and drivers, hangs, flaps), each fault's time to recover, and the end
//!   invariants (no stale read, no data error, no leaked reference, domain UP).
//! - [`bench`](mod@bench): the scenarios of `openimex-lab bench` over real processes (formation,
//!   recovery, footprint) and the [`bench::BenchEntry`] every figure is reported as.
//!
//! # Clean-up
//! Dropping a [`Cluster`] SIGTERMs every daemon it started, SIGKILLs those still alive after
//! 2 s, reaps them, and removes the cluster directory, except while a panic is unwinding:
//! then the logs are printed to stderr and the directory is kept. Daemons are also spawned
//! with `PR_SET_PDEATHSIG=SIGKILL`, so a test process killed by a runner's timeout leaves
//! nothing behind; Linux ties that to the *thread* that spawned them, so keep a `Cluster` on
//! the thread that created it.
//!
//! ```no_run
//! use std::time::Duration;
//! use openimex_harness::{Cluster, ClusterSpec};
//!
//! let mut cluster = Cluster::start(ClusterSpec::new(3, "target/debug/openimex"))?;
//! cluster.wait_up(0, Duration::from_secs(30))?;
//! cluster.kill9(2)?;
//! cluster.wait_domain(0, Duration::from_secs(30), "node 2 gone", |d| {
//!     d.node_status(2) == Some("UNAVAILABLE")
//! })?;
//! # Ok::<(), openimex_harness::HarnessError>(())
//! ```

pub mod addr;
pub mod bench;
pub use openimex_certs as certs;
pub mod chaos;
pub mod cluster;
pub mod domain;
mod error;
mod everyone;
pub mod fabric_manager;
pub mod gpu;
pub mod names;
pub mod netns;
pub mod node;
pub mod process;
pub mod proxy;
pub mod scratch;

/// The `nix` the harness uses, so callers can name signals without depending on it.
pub use nix;
pub use nix::sys::signal::Signal;

pub use addr::AddrBlock;
pub use cluster::{Cluster, ClusterSpec, StopOutcome};
pub use domain::{
    CleanUpView, DomainView, LinkNodeView, LinkView, LinksView, NodeView, PeerView, PeersView,
    is_ctl_timestamp,
};
pub use error::HarnessError;
pub use everyone::{Runnable, runnable_by_everyone};
pub use fabric_manager::{FabricManager, FabricManagerSpec};
pub use gpu::{GpuSpec, trace_path};
pub use node::Node;
pub use scratch::ScratchDir;

#[cfg(test)]
mod tests;
