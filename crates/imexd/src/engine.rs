//! The engine task: the single owner of the core [`Mesh`]. Every other task talks to it through
//! [`Input`] messages; it feeds them to the mesh, performs the mesh's actions (dial, heartbeat,
//! goodbye, driver init) and arms the mesh's one timer. Time is tokio's clock, so tests can
//! pause it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use openimex_core::{
    Action, ConnStatus, DaemonState, ExportRefs, Hello, Imports, InstanceId, LinkView, Mesh,
    Mismatch, NodeId, Verdict,
};
use openimex_driver::Driver;
use openimex_proto::peer::{GoodbyeRequest, Identity, SessionMsg, peer_client::PeerClient};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tonic::transport::Channel;
use tracing::{debug, error, info, warn};

use crate::convert;
use crate::error::DaemonError;
use crate::fabric::{self, FabricInput};
use crate::peer_client;
use crate::settings::Settings;

/// How long shutdown waits for peers to acknowledge the goodbye.
const GOODBYE_TIMEOUT: Duration = Duration::from_secs(2);

/// Messages to the engine.
pub(crate) enum Input {
    /// An inbound handshake, answered with the verdict and this daemon's identity.
    Hello {
        hello: Hello,
        reply: oneshot::Sender<(Verdict, Identity)>,
    },
    /// A dial succeeded and its session is open.
    DialOk {
        peer: NodeId,
        attempt: u64,
        remote: Hello,
        link: OutLink,
    },
    /// A dial failed before a session.
    DialFailed {
        peer: NodeId,
        attempt: u64,
        error: String,
    },
    /// The peer refused our handshake.
    DialRefused {
        peer: NodeId,
        attempt: u64,
        mismatch: Mismatch,
        detail: String,
    },
    /// A heartbeat answer on an outbound session.
    Heartbeat { peer: NodeId, attempt: u64 },
    /// An outbound session ended.
    SessionLost {
        peer: NodeId,
        attempt: u64,
        reason: String,
    },
    /// A peer leaves cleanly.
    Goodbye {
        peer: NodeId,
        instance: InstanceId,
        reason: String,
        reply: oneshot::Sender<()>,
    },
    /// A snapshot for the command service or a peer's status query.
    Snapshot { reply: oneshot::Sender<Snapshot> },
    /// Export/import traffic (driver events, peer requests, driver results).
    Fabric(FabricInput),
}

/// An open outbound session.
pub(crate) struct OutLink {
    /// The gRPC channel (also used for status queries and goodbye).
    pub(crate) channel: Channel,
    /// Heartbeats go here.
    pub(crate) tx: mpsc::Sender<SessionMsg>,
    /// The task reading heartbeat answers.
    pub(crate) reader: AbortHandle,
}

/// What the command service needs from the engine at one instant.
pub(crate) struct Snapshot {
    pub(crate) local: NodeId,
    pub(crate) state: DaemonState,
    pub(crate) instance: InstanceId,
    pub(crate) links: Vec<LinkView>,
    pub(crate) driver_version: String,
    /// Channels of the peers connected right now, to ask for their rows.
    pub(crate) peers: Vec<(NodeId, Channel)>,
}

pub(crate) struct Engine {
    pub(crate) mesh: Mesh,
    pub(crate) settings: Settings,
    pub(crate) driver: Arc<dyn Driver>,
    pub(crate) driver_version: String,
    pub(crate) tx: mpsc::Sender<Input>,
    pub(crate) sessions: HashMap<NodeId, (u64, OutLink)>,
    /// Exporter side: references held for remote importers.
    pub(crate) export_refs: ExportRefs,
    /// Importer side: imports forwarded to exporters.
    pub(crate) imports: Imports,
    /// Stops the driver event thread.
    pump_stop: Arc<AtomicBool>,
    state_tx: watch::Sender<DaemonState>,
    goodbyes: Vec<(NodeId, Channel)>,
    heartbeat_seq: u64,
    dial_log: HashMap<NodeId, (u64, Option<Instant>)>,
}

impl Engine {
    pub(crate) fn new(
        mesh: Mesh,
        settings: Settings,
        driver: Box<dyn Driver>,
        tx: mpsc::Sender<Input>,
        state_tx: watch::Sender<DaemonState>,
    ) -> Self {
        Self {
            mesh,
            settings,
            driver: Arc::from(driver),
            driver_version: String::new(),
            tx,
            sessions: HashMap::new(),
            export_refs: ExportRefs::default(),
            imports: Imports::default(),
            pump_stop: Arc::new(AtomicBool::new(false)),
            state_tx,
            goodbyes: Vec::new(),
            heartbeat_seq: 0,
            dial_log: HashMap::new(),
        }
    }

    fn now() -> std::time::Instant {
        Instant::now().into_std()
    }

    /// Runs until `shutdown` resolves, then says goodbye to every peer (bounded in time).
    pub(crate) async fn run(
        mut self,
        mut rx: mpsc::Receiver<Input>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), DaemonError> {
        tokio::pin!(shutdown);
        self.mesh.handle_start(Self::now());
        self.drain()?;
        loop {
            let deadline = self.mesh.poll_timeout().map(Instant::from_std);
            let timer = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut shutdown => break,
                input = rx.recv() => {
                    let Some(input) = input else { return Err(DaemonError::EngineGone) };
                    self.handle(input)?;
                }
                () = timer => self.mesh.handle_timeout(Self::now()),
            }
            self.drain()?;
        }
        info!(
            "Shutting down: saying goodbye to {} connected peers",
            self.sessions.len()
        );
        self.pump_stop.store(true, Ordering::Relaxed);
        self.mesh.handle_shutdown(Self::now());
        self.drain()?;
        let me = convert::identity(&self.mesh.hello(), &self.driver_version);
        let calls = std::mem::take(&mut self.goodbyes)
            .into_iter()
            .map(|(peer, channel)| {
                let req = GoodbyeRequest {
                    from: Some(me.clone()),
                    reason: "daemon shutting down".to_string(),
                };
                async move {
                    let res = tokio::time::timeout(
                        GOODBYE_TIMEOUT,
                        PeerClient::new(channel).goodbye(req),
                    )
                    .await;
                    match res {
                        Ok(Ok(_)) => debug!("node {peer} acknowledged goodbye"),
                        Ok(Err(e)) => warn!("goodbye to node {peer} failed: {}", e.message()),
                        Err(_) => warn!("goodbye to node {peer} timed out"),
                    }
                }
            });
        let all = futures_join_all(calls);
        // Keep answering peers (their goodbyes, hellos refused) while ours are in flight.
        tokio::pin!(all);
        loop {
            tokio::select! {
                () = &mut all => break,
                input = rx.recv() => match input {
                    Some(input) => { self.handle(input)?; self.drain()?; }
                    None => break,
                },
            }
        }
        for (_, (_, link)) in self.sessions.drain() {
            link.reader.abort();
        }
        Ok(())
    }

    fn handle(&mut self, input: Input) -> Result<(), DaemonError> {
        let now = Self::now();
        match input {
            Input::Hello { hello, reply } => {
                let verdict = self.mesh.handle_hello(now, &hello);
                let me = convert::identity(&self.mesh.hello(), &self.driver_version);
                let _ = reply.send((verdict, me));
            }
            Input::DialOk {
                peer,
                attempt,
                remote,
                link,
            } => {
                if self.sessions.get(&peer).is_some_and(|(a, _)| *a > attempt) {
                    // A late answer to a superseded attempt: never replace a newer session.
                    link.reader.abort();
                    return Ok(());
                }
                // Hold the link before the mesh decides, so a CloseSession it emits finds it.
                if let Some((_, old)) = self.sessions.insert(peer, (attempt, link)) {
                    old.reader.abort();
                }
                self.mesh.handle_dial_ok(now, peer, attempt, &remote);
            }
            Input::DialFailed {
                peer,
                attempt,
                error,
            } => {
                self.log_dial_failure(peer, &error);
                self.mesh.handle_dial_failed(now, peer, attempt, error);
            }
            Input::DialRefused {
                peer,
                attempt,
                mismatch,
                detail,
            } => {
                self.mesh
                    .handle_dial_refused(now, peer, attempt, mismatch, detail);
            }
            Input::Heartbeat { peer, attempt } => self.mesh.handle_heartbeat(now, peer, attempt),
            Input::SessionLost {
                peer,
                attempt,
                reason,
            } => {
                self.mesh.handle_session_lost(now, peer, attempt, reason);
            }
            Input::Goodbye {
                peer,
                instance,
                reason,
                reply,
            } => {
                self.mesh.handle_goodbye(now, peer, instance, &reason);
                let _ = reply.send(());
            }
            Input::Snapshot { reply } => {
                let links = self.mesh.links();
                let peers = self
                    .sessions
                    .iter()
                    .filter(|(id, _)| {
                        links
                            .get(id.index())
                            .is_some_and(|l| l.status == ConnStatus::Connected)
                    })
                    .map(|(id, (_, l))| (*id, l.channel.clone()))
                    .collect();
                let _ = reply.send(Snapshot {
                    local: self.settings.local,
                    state: self.mesh.state(),
                    instance: self.mesh.config().instance,
                    links,
                    driver_version: self.driver_version.clone(),
                    peers,
                });
            }
            Input::Fabric(f) => {
                self.handle_fabric(f).map_err(DaemonError::DriverLost)?;
            }
        }
        Ok(())
    }

    /// Performs every pending action of the mesh.
    fn drain(&mut self) -> Result<(), DaemonError> {
        while let Some(action) = self.mesh.poll_action() {
            match action {
                Action::Dial { peer, attempt } => self.dial(peer, attempt),
                Action::SendHeartbeat { peer } => {
                    if let Some((_, link)) = self.sessions.get(&peer) {
                        self.heartbeat_seq += 1;
                        let msg = SessionMsg {
                            from: None,
                            heartbeat_seq: self.heartbeat_seq,
                        };
                        // A full queue means the peer is not reading; the timeout will tell.
                        let _ = link.tx.try_send(msg);
                    }
                }
                Action::CloseSession { peer, attempt } => {
                    if self.sessions.get(&peer).is_some_and(|(a, _)| *a == attempt)
                        && let Some((_, link)) = self.sessions.remove(&peer)
                    {
                        link.reader.abort();
                    }
                }
                Action::SendGoodbye { peer } => {
                    if let Some((_, link)) = self.sessions.get(&peer) {
                        self.goodbyes.push((peer, link.channel.clone()));
                    }
                }
                Action::LinkChanged {
                    peer,
                    from,
                    to,
                    reason,
                    times_connected,
                } => {
                    self.log_link(peer, from, to, &reason, times_connected);
                    if to == ConnStatus::Connected {
                        self.flush_pending_unimports(peer);
                    }
                }
                Action::PeerRestarted { peer, old, new } => {
                    warn!(
                        "Node {peer} restarted (instance {old} -> {new}): its previous imports and exports are gone"
                    );
                    self.peer_gone(peer, Some(new));
                }
                Action::PeerLeft { peer, instance } => {
                    info!(
                        "Node {peer} (instance {instance}) left: ending its imports and exports here"
                    );
                    self.peer_gone(peer, None);
                }
                Action::StateChanged { from, to } => {
                    info!("IMEX daemon state {from} -> {to}");
                    let _ = self.state_tx.send(to);
                }
                Action::InitDriver => {
                    let info = self.driver.open_session(self.settings.local)?;
                    info!(
                        "GPU driver {} session open as node {} (version {})",
                        self.driver.name(),
                        self.settings.local,
                        info.version
                    );
                    self.driver_version = info.version;
                    fabric::spawn_event_pump(
                        self.driver.clone(),
                        self.tx.clone(),
                        self.pump_stop.clone(),
                    );
                    self.mesh.handle_driver_ready(Self::now());
                }
            }
        }
        Ok(())
    }

    fn dial(&mut self, peer: NodeId, attempt: u64) {
        let Some(host) = self.settings.hosts.get(peer.index()).cloned() else {
            return;
        };
        let me = convert::identity(&self.mesh.hello(), &self.driver_version);
        let target = peer_client::Target {
            peer,
            attempt,
            host,
            port: self.settings.server_port,
            timeout: self.settings.dial_timeout(),
            keepalive: self.settings.heartbeat_interval,
        };
        tokio::spawn(peer_client::dial(target, me, self.tx.clone()));
    }

    fn host(&self, peer: NodeId) -> &str {
        self.settings
            .hosts
            .get(peer.index())
            .map_or("?", String::as_str)
    }

    fn log_link(&self, peer: NodeId, from: ConnStatus, to: ConnStatus, reason: &str, times: u32) {
        let host = self.host(peer);
        let port = self.settings.server_port;
        match to {
            ConnStatus::Connected => info!(
                "Connection established to node {peer} with ip address {host}. Number of times connected: {times}"
            ),
            ConnStatus::Recovering => {
                warn!("Connection lost to node {peer}: {host}:{port} ({reason})")
            }
            ConnStatus::Disconnected => info!("Node {peer} ({host}) left the domain: {reason}"),
            ConnStatus::Mismatch(_) => {
                error!("Node {peer} ({host}:{port}) {to}: {reason}; communication disabled")
            }
            _ => info!("Connection to node {peer} ({host}) {from} -> {to}: {reason}"),
        }
    }

    /// NVIDIA logs a failing target about once a minute; so do we, with the attempt count.
    fn log_dial_failure(&mut self, peer: NodeId, error: &str) {
        let now = Instant::now();
        let host = self
            .settings
            .hosts
            .get(peer.index())
            .cloned()
            .unwrap_or_default();
        let port = self.settings.server_port;
        let entry = self.dial_log.entry(peer).or_insert((0, None));
        entry.0 += 1;
        let due = entry
            .1
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60));
        if due {
            entry.1 = Some(now);
            info!(
                "Attempting connection for target node {peer} - {host}:{port}, attempt #{}: {error}",
                entry.0
            );
        } else {
            debug!(
                "connection attempt #{} to node {peer} failed: {error}",
                entry.0
            );
        }
    }
}

/// Awaits every future (a tiny join_all, to avoid a dependency for one call site).
async fn futures_join_all<F: Future<Output = ()> + Send + 'static>(futs: impl Iterator<Item = F>) {
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    for h in handles {
        let _ = h.await;
    }
}
