//! The openimex daemon: drives the core state machines with real sockets, timers, signals and
//! the GPU driver.
//!
//! [`run`] takes its world as arguments (bound listeners, the driver, a shutdown future) so the
//! same code runs behind `main`, in tests and under a simulated network. The binary resolves the
//! config, binds with [`World::bind`], optionally [`daemonize`]s, and calls [`run`].
//!
//! # Layout
//! - `mailbox`: the messages every task sends the engine (a leaf: it depends on no module here).
//! - `engine`: the single task owning the core `Node`: a loop that hands it inputs, performs
//!   its actions and posts their results back.
//! - `driver_io`: the threads that make the blocking GPU driver calls and pump its events.
//! - `peer_client` / `peer_server`: both sides of the daemon-to-daemon gRPC protocol.
//! - `nodes_file`: SIGUSR1 — the nodes file read again and its names resolved, for the engine.
//! - `cmd_server`: the command service `ctl` talks to.
//! - `metrics`: Prometheus metrics on `GET /metrics` (`OPENIMEX_METRICS_ADDR`).
//! - [`stats`]: NVIDIA's performance statistics file (`STATS_FILE_NAME`).
//! - [`settings`] — what the daemon needs, resolved from the config files.
//! - [`world`] — the listeners.
//! - [`net`] — an in-process network, for whole daemons run together under a paused clock.
//! - [`daemonize`], [`logging`] — process set-up as NVIDIA's daemon does it.
//! - [`notify`] — systemd's readiness protocol (`Type=notify`): states, READY, reload, stop.
//! - [`unconfigured`] — a daemon whose placeholder nodes file does not name this host yet: it
//!   answers `ctl` (UNAVAILABLE, domain DOWN) and waits for SIGUSR1.

mod cmd_server;
mod conn;
mod convert;
pub mod daemonize;
mod driver_io;
mod engine;
mod error;
mod jobs_dir;
pub mod limits;
pub mod logging;
mod mailbox;
mod metrics;
mod multicast;
pub mod net;
mod nodes_file;
pub mod notify;
mod peer_client;
mod peer_server;
mod persist;
// The case budget shared by every crate's property suites.
#[cfg(test)]
#[path = "../../core/tests/prop_budget/mod.rs"]
mod prop_budget;
#[cfg(test)]
mod prop_wire;
mod session;
mod session_tx;
pub mod settings;
pub mod stats;
pub mod tls;
pub mod unconfigured;
pub mod world;

use std::future::Future;

use openimex_core::{DaemonState, MeshConfig, Node, NodeConfig, NodeMap};
use openimex_driver::Driver;
use openimex_proto::peer::peer_server::PeerServer;
use tokio::sync::{mpsc, watch};
use tonic::transport::Server;
use tracing::info;

pub use error::DaemonError;
pub use notify::Notifier;
pub use settings::{Entropy, Settings};
pub use world::World;

/// Requests to re-read the nodes file (SIGUSR1). A capacity of 1 is enough: a request sent
/// while one is pending changes nothing (`try_send` may fail then; the pending one covers it).
pub type Reloads = mpsc::Receiver<()>;

/// Runs the daemon until `shutdown` resolves, then says goodbye to the peers and returns.
/// Returns an error, without a goodbye, if the GPU driver is lost. Each message on `reloads`
/// (SIGUSR1) re-reads the nodes file and re-resolves its names; see [`Reloads`]. States,
/// readiness, re-reads and the stop are reported to the service manager through `notify`.
pub async fn run(
    settings: Settings,
    world: World,
    driver: Box<dyn Driver>,
    entropy: Entropy,
    shutdown: impl Future<Output = ()>,
    reloads: Reloads,
    notify: Notifier,
) -> Result<(), DaemonError> {
    let notify = std::sync::Arc::new(notify);
    let shutdown = {
        let notify = notify.clone();
        async move {
            shutdown.await;
            notify.stopping();
        }
    };
    let now = tokio::time::Instant::now().into_std();
    let map = NodeMap::new(settings.hosts.clone());
    let instance = entropy.instance;
    let cfg = MeshConfig {
        local: settings.local,
        domain_id: settings
            .domain_id
            .clone()
            .unwrap_or_else(|| map.derived_domain_id()),
        map,
        instance,
        protocol_version: openimex_proto::PROTOCOL_VERSION,
        quorum: settings.quorum,
        heartbeat_interval: settings.heartbeat_interval,
        peer_timeout: settings.peer_timeout,
        dial_timeout: settings.dial_timeout(),
        backoff: settings.backoff,
        seed: entropy.seed,
    };
    let bind_ip = world
        .peer
        .local_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    // NVIDIA's words (docs/reference/imex-guide.md §9), then ours on a line of their own.
    info!(
        "Identified this node as ID {}, using bind IP of '{bind_ip}', and network interface of {}",
        settings.local,
        settings.network_interface.as_deref().unwrap_or("")
    );
    info!(
        "Peer listener on {}, instance {instance}, domain {}",
        world.peer_addr(),
        cfg.domain_id
    );
    let nodes = settings.hosts.len();
    let map_for_record = cfg.map.clone();
    let recover_from = recover_from(&settings, &map_for_record);
    if let Some(wait) = settings.conn_wait_timeout {
        quorum_wait_note(settings.quorum, wait, !recover_from.is_empty());
    }
    let mut node = Node::new(
        NodeConfig {
            mesh: cfg,
            import_timeout: settings.import_timeout,
            max_describes_per_peer: openimex_core::node::DEFAULT_MAX_DESCRIBES_PER_PEER,
            grace: settings.grace,
            recover_from,
            recovery_wait: openimex_core::node::DEFAULT_RECOVERY_WAIT,
            conn_wait_timeout: settings.conn_wait_timeout,
        },
        now,
    );
    node.set_heartbeat_phase(heartbeat_phase(now, settings.heartbeat_interval));
    let (tx, rx) = mpsc::channel(1024);
    world.stats.watch_mailbox(mailbox::depth_of(&tx));
    let (state_tx, state_rx) = watch::channel(DaemonState::Initializing);
    let (hosts_tx, hosts_rx) = watch::channel(std::sync::Arc::new(settings.hosts.clone()));

    let keepalive = transport_keepalive(settings.peer_timeout);
    let resolver = world.resolver();
    let peer_svc = peer_server::PeerService {
        engine: tx.clone(),
        hosts: hosts_rx.clone(),
        any_source: settings.peer_any_source,
        tls: settings.tls.clone(),
        stats: world.stats.clone(),
        streams: std::sync::Arc::default(),
        resolver: resolver.clone(),
    };
    let local_ip = world.peer.local_addr().ok().map(|a| a.ip());
    let peer_addr = world.peer_addr();
    let incoming = conn::incoming(
        match world.peer {
            world::PeerListener::Tcp(l) => conn::Listening::Tcp(tokio_tcp(l)?),
            world::PeerListener::Memory(_) if settings.tls.is_some() => {
                return Err(DaemonError::Tls {
                    cause: "the in-process network carries no TLS".into(),
                    fix: "run in-process daemons in plaintext",
                });
            }
            world::PeerListener::Memory(l) => conn::Listening::Memory(l),
        },
        conn::ConnLimits::for_domain(nodes),
        tx.clone(),
        settings.tls.clone(),
        hosts_rx.clone(),
        resolver.clone(),
    );
    let peer_server = Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(keepalive))
        .http2_keepalive_timeout(Some(settings.peer_timeout))
        .max_concurrent_streams(Some(limits::MAX_STREAMS_PER_CONNECTION))
        .http2_max_header_list_size(Some(limits::MAX_HEADER_LIST))
        .add_service(PeerServer::new(peer_svc).max_decoding_message_size(limits::MAX_PEER_REQUEST))
        .serve_with_incoming(incoming);
    let mut servers = vec![tokio::spawn(async move {
        peer_server.await.map_err(|source| ("peer", source))
    })];

    let about = std::sync::Arc::new(cmd_server::About {
        config: settings.config_dump.clone(),
        local: settings.local,
        bind: peer_addr,
        network_interface: settings.network_interface.clone().unwrap_or_default(),
    });
    let jobs_access = (settings.jobs_dir.clone()).map(|dir| {
        std::sync::Arc::new(cmd_server::JobsAccess {
            dir,
            nodes_file: settings.nodes_file.clone().unwrap_or_default(),
            lock: tokio::sync::Mutex::new(()),
        })
    });
    let cmd = |listener| cmd_server::CommandService {
        engine: tx.clone(),
        state: state_rx.clone(),
        hosts: hosts_rx.clone(),
        host_name: settings.host_name.clone(),
        about: about.clone(),
        resolver: resolver.clone(),
        jobs: jobs_access.clone(),
        listener,
    };
    servers.extend(cmd_server::serve(
        cmd,
        world.cmd_tcp,
        world.cmd_unix,
        settings.cmd_unix_path.as_deref(),
        world.cmd_memory,
    )?);
    info!(
        "Creating gRPC channels to all peers (nPeers = {}).",
        nodes.saturating_sub(1)
    );
    let (peers_tx, peers_rx) = watch::channel(notify::Peers {
        connected: 0,
        total: nodes.saturating_sub(1),
    });
    if notify.is_enabled() {
        let follow = notify::follow_state(notify.clone(), state_rx.clone(), peers_rx);
        servers.push(tokio::spawn(async move {
            follow.await;
            Ok(())
        }));
    }
    servers.push(tokio::spawn({
        let (path, hosts, tx, resolver) = (
            settings.nodes_file.clone(),
            settings.hosts.clone(),
            tx.clone(),
            resolver.clone(),
        );
        // With TLS on, SIGUSR1 reloads the key material first (`tls::reload`).
        let reloads = match &settings.tls {
            Some(tls) => tls::before_rereads(tls.clone(), reloads),
            None => reloads,
        };
        // With a service manager to tell, re-reads pass through `notify` on both sides.
        let (reloads, tx) = match notify.is_enabled() {
            true => notify::around_rereads(notify.clone(), reloads, tx),
            false => (reloads, tx),
        };
        async move {
            nodes_file::serve(path, hosts, reloads, tx, resolver).await;
            Ok(())
        }
    }));
    let events = metrics::Events::default().with_heap_counter(world.heap_allocations);
    if let Some(listener) = world.metrics {
        let listener = tokio_tcp(listener)?;
        if let Ok(addr) = listener.local_addr() {
            info!("Serving Prometheus metrics on http://{addr}/metrics");
        }
        let serve = metrics::http::serve(listener, tx.clone(), hosts_rx.clone(), events.clone());
        servers.push(tokio::spawn(async move {
            serve.await;
            Ok(())
        }));
    }
    // The first hello carries the node's cliques: the probes are read before the start (the
    // node asks for every later read, `openimex_core::node` cliques).
    match driver.gpu_fabric() {
        Ok(gpus) => node.handle_gpu_fabric(now, gpus),
        Err(e) => tracing::debug!("reading the GPUs' fabric probes at start: {e}"),
    }
    if let Some(dir) = settings.jobs_dir.clone() {
        let (nodes_file, hosts, tx) = (settings.nodes_file.clone(), hosts_rx.clone(), tx.clone());
        servers.push(tokio::spawn(async move {
            jobs_dir::run(dir, nodes_file, hosts, tx).await;
            Ok(())
        }));
    }
    let engine = engine::Engine::new(node, settings.clone(), driver, tx, state_tx)?
        .count_into(events, world.stats.clone())
        .report_peers(peers_tx)
        .dial_from(local_ip, world.net)
        .persist_to(settings.persist_path.clone(), map_for_record)
        .publish_hosts(hosts_tx);
    let result = engine.run(rx, shutdown).await;
    for s in &servers {
        s.abort();
    }
    if let Some(path) = &settings.cmd_unix_path {
        let _ = std::fs::remove_file(path);
    }
    info!("IMEX daemon stopped");
    result
}

pub(crate) fn tokio_tcp(l: std::net::TcpListener) -> Result<tokio::net::TcpListener, DaemonError> {
    let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
    tokio::net::TcpListener::from_std(l).map_err(|source| DaemonError::Bind {
        what: "TCP listener",
        addr,
        source,
        fix: "this is a bug: the listener could not be registered with the runtime",
    })
}

/// Says at start what `IMEX_CONN_WAIT_TIMEOUT` bounds here: the FULL wait for peers only.
fn quorum_wait_note(
    quorum: openimex_core::QuorumPolicy,
    wait: std::time::Duration,
    recovering: bool,
) {
    let secs = wait.as_secs();
    match quorum {
        openimex_core::QuorumPolicy::Full => info!(
            "IMEX_CONN_WAIT_TIMEOUT={secs}: waiting at most {secs} s for every peer to connect (IMEX_WAIT_FOR_QUORUM=FULL), then continuing without the missing ones"
        ),
        _ if recovering => tracing::warn!(
            "IMEX_CONN_WAIT_TIMEOUT={secs} does not shorten the recovery wait: nodes that held references to this node's memory may still map it, so the wait for them stays bounded by IMEX_NODE_DISCONNECTED_GRACE_TIME (or the default recovery wait)"
        ),
        _ => info!(
            "IMEX_CONN_WAIT_TIMEOUT={secs} has no effect: it bounds only the IMEX_WAIT_FOR_QUORUM=FULL wait for peers"
        ),
    }
}

/// The importers the previous run's persist record names, when the RECOVERY quorum applies.
fn recover_from(settings: &Settings, map: &NodeMap) -> Vec<openimex_core::NodeId> {
    let Some(path) = settings.persist_path.as_deref() else {
        return Vec::new();
    };
    if settings.quorum != openimex_core::QuorumPolicy::Recovery {
        return Vec::new();
    }
    match persist::read(path, map) {
        Ok(persist::Record::Missing) => {
            info!(
                "nvidia-imex persistence file {} does not exist.  Assuming no previous importers.",
                path.display()
            );
            Vec::new()
        }
        Ok(persist::Record::OtherMap) => {
            info!(
                "persistence file {} was written for another node map: discarded, no recovery wait",
                path.display()
            );
            Vec::new()
        }
        Ok(persist::Record::Importers(ids)) => {
            if !ids.is_empty() {
                tracing::warn!(
                    "persistence file {} says nodes {ids:?} held references to this node's memory when the previous daemon stopped: waiting for them before re-enabling fabric allocation",
                    path.display()
                );
            }
            ids
        }
        Err(e) => {
            tracing::error!(
                "cannot read the persistence file {}: {e}; assuming no previous importers (repair or remove it, or set OPENIMEX_PERSIST_FILE)",
                path.display()
            );
            Vec::new()
        }
    }
}

/// The instant heartbeat ticks are aligned on: a multiple of `interval` of the wall clock.
/// Daemons sharing a machine then send their heartbeats together, and each wake-up handles a
/// batch of messages rather than one (core's `mesh::liveness`). Only the phase is taken from
/// the wall clock; every deadline stays monotonic.
fn heartbeat_phase(now: std::time::Instant, interval: std::time::Duration) -> std::time::Instant {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let period = interval.as_nanos().max(1);
    let into = u64::try_from(wall.as_nanos() % period).unwrap_or(0);
    now.checked_sub(std::time::Duration::from_nanos(into))
        .unwrap_or(now)
}

/// HTTP/2 keepalive of peer connections. Heartbeats prove a pair alive on its one session
/// (core), so pings only catch a connection that dies silently while carrying no heartbeats: one
/// whose session was refused or closed, or a session the pair does not use (the higher-dialled
/// one the lower node keeps open until the higher node closes it). Pinging at the heartbeat rate
/// would add back the messages one heartbeat per pair saves; every two peer timeouts costs a
/// fraction of them.
pub(crate) fn transport_keepalive(peer_timeout: std::time::Duration) -> std::time::Duration {
    (peer_timeout * 2).max(std::time::Duration::from_secs(1))
}
