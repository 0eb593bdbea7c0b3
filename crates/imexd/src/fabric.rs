//! The daemon's view of its node's GPUs on the NVLink fabric: each GPU's fabric probe (state,
//! clusterUuid, partition, cliqueId, bandwidth mode, health), read from the driver at start,
//! every [`REFRESH`], and at once when the driver posts CLIQUE_ID_CHANGE
//! (`reference/driver-interface.md` §1.6 "Other events", §5).
//!
//! It sits between the daemon and its driver ([`watch`] wraps the driver): CLIQUE_ID_CHANGE
//! events are taken out of the event stream here, logged (the GPU, old → new clique) and
//! answered by a refresh, so the import engine never sees them. The view is shared
//! ([`Shared`]) with whatever reports it: the engine's snapshots carry it to `ctl --fabric`
//! (this node's row and every peer's, through the peers' status rows) and to the metrics.
//!
//! Peers learn the node's cliques from its hello and, when they change, from a
//! `CliquesChanged` notification on each session ([`push`]); a peer outside this node's
//! cliques is logged ([`note_peer`]).

use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use openimex_core::{Event, GpuFabric, NodeId, Pages, Status};
use openimex_driver::{Driver, DriverError, SessionInfo};
use openimex_proto::peer::session_msg::Body;
use openimex_proto::peer::{CliquesChanged, GpuFabric as WireGpu};
use tokio::sync::mpsc;

use crate::mailbox::{Input, ask};
use crate::session_tx::SessionTx;

/// How often the GPUs' probes are read again (health changes come with no event).
pub(crate) const REFRESH: Duration = Duration::from_secs(3);

/// Most cliques a peer's hello may name to be believed (one per GPU, 64 GPUs a node at most).
const MAX_PEER_CLIQUES: usize = 64;

/// The node's GPUs as last read, shared with the reporters.
pub(crate) type Shared = Arc<RwLock<Vec<GpuFabric>>>;

/// A copy of the view (empty if a writer panicked).
pub(crate) fn read(view: &Shared) -> Vec<GpuFabric> {
    view.read().map(|v| v.clone()).unwrap_or_default()
}

/// The node's cliques: those of its GPUs whose probe completed, sorted, once each (what the
/// hello carries).
pub(crate) fn cliques(view: &SharedView) -> Vec<u32> {
    cliques_of(&read(&view.0))
}

fn cliques_of(gpus: &[GpuFabric]) -> Vec<u32> {
    let set: std::collections::BTreeSet<u32> = gpus
        .iter()
        .filter(|g| g.state == "COMPLETED")
        .map(|g| g.clique_id)
        .collect();
    set.into_iter().collect()
}

/// A peer's hello told its cliques: a peer outside every clique of this node is worth a line
/// (its memory imports here but does not map, §6.8). Unknown cliques (an older daemon, a node
/// without GPUs) say nothing.
pub(crate) fn note_peer(mine: &[u32], peer: NodeId, theirs: &[u32]) {
    // A node has at most 64 GPUs, so no more cliques: a longer list is no node's (and is not
    // copied into the log).
    if mine.is_empty() || theirs.is_empty() || theirs.len() > MAX_PEER_CLIQUES {
        return;
    }
    if theirs.iter().any(|c| mine.contains(c)) {
        tracing::debug!("peer node {peer} is in clique(s) {theirs:?}, as this node");
    } else {
        tracing::info!(
            "peer node {peer} is in clique(s) {theirs:?}, outside this node's clique(s) {mine:?}: its memory does not map on this node's GPUs"
        );
    }
}

/// Wraps `driver` so that the daemon's view of the GPUs follows the fabric: reads the probes
/// now, then starts the thread that refreshes them. Returns the driver to hand to the engine
/// and the view.
///
/// With `peers` (the engine's mailbox and the runtime it runs on), a change of the node's
/// cliques is pushed to every connected peer.
pub(crate) fn watch(
    driver: Box<dyn Driver>,
    peers: Option<(mpsc::Sender<Input>, tokio::runtime::Handle)>,
) -> (Box<dyn Driver>, SharedView) {
    let inner: Arc<dyn Driver> = Arc::from(driver);
    let view: Shared = Arc::default();
    refresh(inner.as_ref(), &view);
    let (poke, pokes) = std_mpsc::channel();
    let weak = Arc::downgrade(&inner);
    let shared = Arc::clone(&view);
    let started = std::thread::Builder::new()
        .name("fabric-watch".into())
        .spawn(move || refresher(weak, shared, pokes, peers));
    if let Err(e) = started {
        tracing::warn!(
            "cannot start the fabric watch thread ({e}); GPU fabric health is read once, at start"
        );
    }
    let watched = Watched {
        inner,
        view: Arc::clone(&view),
        poke,
    };
    (Box::new(watched), SharedView(view))
}

/// The view [`watch`] keeps, for the engine's snapshots.
#[derive(Clone, Default)]
pub(crate) struct SharedView(pub(crate) Shared);

/// Reads every GPU's probe into `view`; logs a health change. A failed read keeps the old view
/// (the daemon notices a lost driver on its own calls).
fn refresh(driver: &dyn Driver, view: &Shared) {
    let gpus = match driver.gpu_fabric() {
        Ok(g) => g,
        Err(e) => {
            tracing::debug!("reading the GPUs' fabric probes: {e}");
            return;
        }
    };
    let Ok(mut v) = view.write() else {
        return;
    };
    for g in &gpus {
        let before = v.iter().find(|o| o.gpu == g.gpu);
        if let Some(o) = before
            && (o.health_summary != g.health_summary || o.health_mask != g.health_mask)
        {
            tracing::info!(
                "GPU {} fabric health {} (mask {:#x}) -> {} (mask {:#x})",
                g.gpu,
                o.health_summary,
                o.health_mask,
                g.health_summary,
                g.health_mask
            );
        }
    }
    *v = gpus;
}

/// Refreshes every [`REFRESH`] and on each poke, until the daemon drops its driver; pushes
/// each change of the node's cliques to the peers.
fn refresher(
    driver: Weak<dyn Driver>,
    view: Shared,
    pokes: std_mpsc::Receiver<()>,
    peers: Option<(mpsc::Sender<Input>, tokio::runtime::Handle)>,
) {
    let shared = SharedView(Arc::clone(&view));
    // What the peers were told last (the hello carries the cliques of its time).
    let mut told = cliques(&shared);
    loop {
        match pokes.recv_timeout(REFRESH) {
            Ok(()) | Err(std_mpsc::RecvTimeoutError::Timeout) => {}
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let Some(d) = driver.upgrade() else {
            return;
        };
        refresh(d.as_ref(), &view);
        let now = cliques(&shared);
        if now != told {
            if let Some((engine, rt)) = &peers {
                rt.spawn(push(engine.clone(), now.clone()));
            }
            told = now;
        }
    }
}

/// How long one peer may take to take the notification.
const PUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Tells every connected peer the node's new cliques (a notification: nothing answers it).
async fn push(engine: mpsc::Sender<Input>, cliques: Vec<u32>) {
    let Ok(snap) = ask(&engine, |reply| Input::Snapshot { reply }).await else {
        return;
    };
    for (peer, session) in snap.peers {
        let body = Body::CliquesChanged(CliquesChanged {
            cliques: cliques.clone(),
        });
        let sent = tokio::time::timeout(PUSH_TIMEOUT, session.notify(body)).await;
        if !matches!(sent, Ok(true)) {
            tracing::debug!("could not tell peer node {peer} this node's new cliques");
        }
    }
}

/// A peer's notification that its cliques changed, on `session`: logged against this node's
/// cliques if the session is a connected peer's (the engine's snapshot names it).
pub(crate) async fn peer_cliques_changed(
    engine: mpsc::Sender<Input>,
    session: SessionTx,
    theirs: Vec<u32>,
) {
    if theirs.len() > MAX_PEER_CLIQUES {
        return;
    }
    let Ok(snap) = ask(&engine, |reply| Input::Snapshot { reply }).await else {
        return;
    };
    let Some(peer) = snap
        .peers
        .iter()
        .find_map(|(peer, s)| s.same(&session).then_some(*peer))
    else {
        return;
    };
    let mine = cliques_of(&snap.fabric);
    tracing::info!("peer node {peer} reports new clique(s) {theirs:?}");
    note_peer(&mine, peer, &theirs);
}

/// The daemon's driver with CLIQUE_ID_CHANGE taken out of its events.
struct Watched {
    inner: Arc<dyn Driver>,
    view: Shared,
    poke: std_mpsc::Sender<()>,
}

impl Watched {
    /// The events without the CLIQUE_ID_CHANGEs, which it acts on: the import engine never
    /// sees them.
    fn take_clique_changes(&self, mut events: Vec<Event>) -> Vec<Event> {
        events.retain(|e| match *e {
            Event::CliqueIdChange { gpu, clique_id } => {
                self.clique_changed(gpu, clique_id);
                false
            }
            _ => true,
        });
        events
    }

    /// Logs the change in NVIDIA's event name, records the new clique at once (so a
    /// `ctl --fabric` right after the event shows it) and asks for a full read.
    fn clique_changed(&self, gpu: u32, clique_id: u32) {
        let old = self.view.write().ok().and_then(|mut v| {
            let g = v.iter_mut().find(|g| g.gpu == gpu)?;
            Some(std::mem::replace(&mut g.clique_id, clique_id))
        });
        let old = old.map_or_else(|| "?".to_string(), |c| c.to_string());
        tracing::info!("CLIQUE_ID_CHANGE: GPU {gpu} moved from clique {old} to clique {clique_id}");
        let _ = self.poke.send(());
    }
}

impl Driver for Watched {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn open_session(&self, node: NodeId) -> Result<SessionInfo, DriverError> {
        self.inner.open_session(node)
    }

    fn next_events(&self, wait: Duration) -> Result<Vec<Event>, DriverError> {
        let events = self.inner.next_events(wait)?;
        Ok(self.take_clique_changes(events))
    }

    fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.event_fd()
    }

    fn answers_at_once(&self) -> bool {
        self.inner.answers_at_once()
    }

    fn request_events(&self, wait: Duration) -> Result<(), DriverError> {
        self.inner.request_events(wait)
    }

    fn take_events(&self) -> Result<Option<Vec<Event>>, DriverError> {
        Ok(self
            .inner
            .take_events()?
            .map(|events| self.take_clique_changes(events)))
    }

    fn describe_export(
        &self,
        uuid: [u8; 16],
        index: u16,
        channel: u32,
    ) -> Result<(u64, Pages), DriverError> {
        self.inner.describe_export(uuid, index, channel)
    }

    fn release_export_ref(&self, export_ref: u64) -> Result<(), DriverError> {
        self.inner.release_export_ref(export_ref)
    }

    fn validate_import(
        &self,
        event_id: u64,
        result: Result<Pages, Status>,
    ) -> Result<(), DriverError> {
        self.inner.validate_import(event_id, result)
    }

    fn finish_unimport(&self, ids: &[u64]) -> Result<(), DriverError> {
        self.inner.finish_unimport(ids)
    }

    fn disable_importers(&self, node: NodeId) -> Result<(), DriverError> {
        self.inner.disable_importers(node)
    }

    fn gpu_fabric(&self) -> Result<Vec<GpuFabric>, DriverError> {
        self.inner.gpu_fabric()
    }

    // Every call is forwarded, the ones with default bodies too: a default here would answer
    // for the real driver (multicast attaches were refused that way).
    fn attach_remote_gpu(
        &self,
        from: NodeId,
        attach: &openimex_driver::multicast::RemoteGpuAttach,
    ) -> Result<(), DriverError> {
        self.inner.attach_remote_gpu(from, attach)
    }

    fn set_multicast_failure(
        &self,
        export_uuid: [u8; 16],
        index: u16,
        channel: u32,
        status: Status,
    ) -> Result<(), DriverError> {
        self.inner
            .set_multicast_failure(export_uuid, index, channel, status)
    }
}

/// One GPU on the wire (`NodeStatus.gpus`, `NodeReport.gpus`).
pub(crate) fn to_wire(g: &GpuFabric) -> WireGpu {
    WireGpu {
        gpu: g.gpu,
        state: g.state.clone(),
        cluster_uuid: g.cluster_uuid.clone(),
        partition_id: u32::from(g.partition_id),
        clique_id: g.clique_id,
        bw_mode: u32::from(g.bw_mode),
        bw_mode_epoch: g.bw_mode_epoch,
        health_mask: g.health_mask,
        health_summary: g.health_summary.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A driver whose GPUs and events the test sets.
    #[derive(Default)]
    struct Fake {
        gpus: Mutex<Vec<GpuFabric>>,
        events: Mutex<Vec<Event>>,
    }

    impl Driver for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn open_session(&self, _: NodeId) -> Result<SessionInfo, DriverError> {
            Ok(SessionInfo {
                version: "fake".into(),
            })
        }
        /// As the real driver: by the time CLIQUE_ID_CHANGE is read, the probe has the new
        /// clique.
        fn next_events(&self, _: Duration) -> Result<Vec<Event>, DriverError> {
            let events = std::mem::take(&mut *self.events.lock().unwrap());
            let mut gpus = self.gpus.lock().unwrap();
            for e in &events {
                if let Event::CliqueIdChange { gpu, clique_id } = *e
                    && let Some(g) = gpus.iter_mut().find(|g| g.gpu == gpu)
                {
                    g.clique_id = clique_id;
                }
            }
            Ok(events)
        }
        fn describe_export(
            &self,
            _: [u8; 16],
            _: u16,
            _: u32,
        ) -> Result<(u64, Pages), DriverError> {
            Err(DriverError::Lost("fake".into()))
        }
        fn release_export_ref(&self, _: u64) -> Result<(), DriverError> {
            Ok(())
        }
        fn validate_import(&self, _: u64, _: Result<Pages, Status>) -> Result<(), DriverError> {
            Ok(())
        }
        fn finish_unimport(&self, _: &[u64]) -> Result<(), DriverError> {
            Ok(())
        }
        fn disable_importers(&self, _: NodeId) -> Result<(), DriverError> {
            Ok(())
        }
        fn gpu_fabric(&self) -> Result<Vec<GpuFabric>, DriverError> {
            Ok(self.gpus.lock().unwrap().clone())
        }
    }

    fn gpu(gpu: u32, clique_id: u32) -> GpuFabric {
        GpuFabric {
            gpu,
            state: "COMPLETED".into(),
            clique_id,
            health_summary: "HEALTHY".into(),
            ..GpuFabric::default()
        }
    }

    /// CLIQUE_ID_CHANGE (§1.6 "Other events") is the daemon's own business: it updates the
    /// view at once and never reaches the import engine; the other events pass untouched.
    #[test]
    fn clique_changes_are_taken_out_of_the_events_and_update_the_view() {
        let fake = Fake::default();
        fake.gpus.lock().unwrap().extend([gpu(0, 1), gpu(1, 1)]);
        let unimport = Event::Unimport {
            unimport_event_id: 2,
            import_event_id: 1,
            export_node: NodeId(1),
        };
        fake.events.lock().unwrap().extend([
            Event::CliqueIdChange {
                gpu: 1,
                clique_id: 2,
            },
            unimport.clone(),
        ]);
        let (driver, view) = watch(Box::new(fake), None);
        assert_eq!(read(&view.0).len(), 2);
        let events = driver.next_events(Duration::ZERO).unwrap();
        assert_eq!(events, vec![unimport]);
        let per_gpu: Vec<u32> = read(&view.0).iter().map(|g| g.clique_id).collect();
        assert_eq!(per_gpu, [1, 2]);
        // What the hello carries: each clique once.
        assert_eq!(cliques(&view), [1, 2]);
    }
}
