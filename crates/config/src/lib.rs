//! Configuration of the openimex daemon: NVIDIA's `config.cfg` and `nodes_config.cfg`, and
//! which entry of the nodes file is this node.
//!
//! This crate owns the file formats: parsing, defaults, validation, and error messages that
//! name the file, the line, the key and the bad value and say how to fix it. It does not open
//! log files, bind sockets for the daemon, compute the node-map digest (core does) or watch
//! files for changes. Its only system calls are reading the two files (and job files), and, in
//! [`system_resolve`] / [`system_is_local`], DNS look-ups and a test bind, and in
//! [`iface::system_interfaces`], the list of network interfaces.
//!
//! # Layout
//!
//! - [`error`](ConfigError): the one error enum of the crate.
//! - `cfg`: `config.cfg` ([`Config`]) with NVIDIA's keys and openimex's `OPENIMEX_*` keys.
//! - `nodes`: `nodes_config.cfg` ([`NodeConfig`]): node ID = index among entry lines.
//! - `local`: [`identify_local`] picks this node's entry and bind address.
//! - [`iface`]: `NETWORK_INTERFACE`: the interface and IPv6 link-local scope of the listener.
//! - [`jobfile`]: job files (`OPENIMEX_JOBS_DIR`): one job per file, members as the nodes file
//!   names them.

mod cfg;
mod error;
pub mod iface;
pub mod jobfile;
mod local;
mod nodes;
pub mod reference;

pub use cfg::{
    AuthMode, AuthSource, Config, DEFAULT_STATS_INTERVAL_SEC, DEFAULT_SYSLOG_SOCKET,
    DEFAULT_VERBOSE_LOG_BUFFER_KB, DriverKind, EnvLookup, GraceTime, MAX_VERBOSE_LOG_BUFFER_KB,
    Notice, Quorum, TlsIdentity, TlsMaterial, dump,
};
pub use error::ConfigError;
pub use local::{
    LocalNode, identify_local, identify_local_preferring, system_is_local, system_resolve,
};
pub use nodes::{NodeConfig, NodeEntry, is_placeholder};

/// Where `nvidia-imex` and `nvidia-imex-ctl` look for the config file when `-c` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/nvidia-imex/config.cfg";
