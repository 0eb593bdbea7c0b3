//! Prometheus metrics (`OPENIMEX_METRICS_ADDR`; none unless set).
//!
//! Two kinds of values:
//! - gauges of the node's state, computed at each scrape from one snapshot the engine takes
//!   (`Input::Peers`, the same one `ctl --peers` shows): daemon state, domain status as seen
//!   from this node's links, per-peer link state, exports held, imports and unimports
//!   outstanding, clean-ups;
//! - counters and a histogram the engine updates where the events happen ([`Events`]):
//!   imports answered as exporter, imports completed as importer and their latency,
//!   unimports, reconnects. Clean-ups by reason are counted at scrape time from the node's
//!   bounded per-peer clean-up history and its running total;
//! - gauges of the node's GPUs on the fabric (health summary and mask, cliqueId, bandwidth
//!   mode), from the daemon's fabric view ([`fabric`]).
//! - the process's heap allocations since start (`heap_allocations`), when the binary counts
//!   them (`World::heap_allocations`: the lab binary does, the production binary does not).
//!
//! Rendering is prometheus-client's OpenMetrics text; [`http`] serves it.

mod fabric;
pub(crate) mod http;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use openimex_core::{ConnStatus, DaemonState, ImportAnswer, NodeId, PeerState};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::mailbox::PeersSnapshot;

/// Label sets: a list of name/value pairs.
type Labels = Vec<(&'static str, String)>;

/// Imports timed at once, at most; one more is not timed (it is still counted).
const MAX_TIMED_IMPORTS: usize = 65_536;
/// When the timed imports are full, those sent longer ago than this are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// The counters and histogram the engine updates as events happen. Cheap to clone (shared).
#[derive(Clone)]
pub(crate) struct Events {
    /// Peers' import requests this node answered as exporter, by result.
    imports_answered: Family<Labels, Counter>,
    /// This node's imports whose exporter answered (or that failed), by result.
    imports_completed: Family<Labels, Counter>,
    /// From sending an import request to its answer, as importer.
    import_duration: Histogram,
    /// Unimports this node sent as importer, by whether the exporter confirmed.
    unimports_sent: Family<Labels, Counter>,
    /// Unimports peers sent this node as exporter.
    unimports_received: Counter,
    /// Links connected again after their first connection, by peer.
    reconnects: Family<Labels, Counter>,
    /// Import requests in flight, by import event ID (bounded): when each was sent.
    started: Arc<Mutex<HashMap<u64, Instant>>>,
    /// Clean-ups by reason, and each peer's running total when last counted.
    cleanups: Family<Labels, Counter>,
    cleanups_seen: Arc<Mutex<HashMap<NodeId, u64>>>,
    /// The process's heap allocations so far, when its binary counts them.
    heap_allocations: Option<fn() -> u64>,
}

impl Default for Events {
    /// Every counter at zero, with the series of known labels present from the start.
    fn default() -> Self {
        let events = Self {
            imports_answered: Family::default(),
            imports_completed: Family::default(),
            // 0.5 ms to about 16 s.
            import_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            unimports_sent: Family::default(),
            unimports_received: Counter::default(),
            reconnects: Family::default(),
            started: Arc::default(),
            cleanups: Family::default(),
            cleanups_seen: Arc::default(),
            heap_allocations: None,
        };
        for ok in [true, false] {
            let _ = events.imports_answered.get_or_create(result_label(ok));
            let _ = events.imports_completed.get_or_create(result_label(ok));
        }
        for delivered in [true, false] {
            let _ = events
                .unimports_sent
                .get_or_create(delivery_label(delivered));
        }
        events
    }
}

impl Events {
    /// These counters, and `count` reported as the process's heap allocations.
    pub(crate) fn with_heap_counter(mut self, count: Option<fn() -> u64>) -> Self {
        self.heap_allocations = count;
        self
    }
}

/// The `result` label of the counters every import and unimport counts one in: each label set
/// is built once, not at every count.
fn result_label(ok: bool) -> &'static Labels {
    &RESULT_LABELS[usize::from(!ok)]
}

/// The `result` label of an unimport sent (see [`result_label`]).
fn delivery_label(delivered: bool) -> &'static Labels {
    &RESULT_LABELS[2 + usize::from(!delivered)]
}

static RESULT_LABELS: LazyLock<[Labels; 4]> = LazyLock::new(|| {
    ["ok", "error", "delivered", "undelivered"].map(|r| vec![("result", r.to_string())])
});

fn peer_labels(peer: NodeId, hosts: &[String]) -> Labels {
    vec![
        ("peer", peer.0.to_string()),
        ("host", hosts.get(peer.index()).cloned().unwrap_or_default()),
    ]
}

impl Events {
    /// This node (exporter) answered a peer's import request.
    pub(crate) fn import_answered(&self, answer: &ImportAnswer) {
        self.imports_answered
            .get_or_create(result_label(answer.is_ok()))
            .inc();
    }

    /// This node (importer) sent import request `import_event_id`.
    pub(crate) fn import_sent(&self, import_event_id: u64, at: Instant) {
        let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
        if started.len() >= MAX_TIMED_IMPORTS {
            // Requests whose session never ended nor answered: forget the oldest.
            started.retain(|_, sent| at.saturating_duration_since(*sent) < FORGET_AFTER);
        }
        if started.len() < MAX_TIMED_IMPORTS {
            started.insert(import_event_id, at);
        }
    }

    /// The exporter answered this node's import `import_event_id` (or the request failed).
    pub(crate) fn import_completed(&self, import_event_id: u64, ok: bool, at: Instant) {
        self.imports_completed.get_or_create(result_label(ok)).inc();
        let sent = self
            .started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&import_event_id);
        if let Some(sent) = sent {
            self.import_duration
                .observe(at.saturating_duration_since(sent).as_secs_f64());
        }
    }

    /// This node's unimport reached its exporter (`delivered`), or could not.
    pub(crate) fn unimport_sent(&self, delivered: bool) {
        self.unimports_sent
            .get_or_create(delivery_label(delivered))
            .inc();
    }

    /// A peer unimported from this node.
    pub(crate) fn unimport_received(&self) {
        self.unimports_received.inc();
    }

    /// A link changed to `to`; `times` is how often it has connected.
    pub(crate) fn link_changed(&self, peer: NodeId, to: ConnStatus, times: u32, hosts: &[String]) {
        if to == ConnStatus::Connected && times > 1 {
            self.reconnects
                .get_or_create(&peer_labels(peer, hosts))
                .inc();
        }
    }

    /// Counts the clean-ups each peer had since the last scrape, by reason, from its latest
    /// clean-ups; any beyond those kept are counted with reason `unrecorded`.
    fn count_cleanups(&self, peers: &[PeerState]) {
        let mut seen = self.cleanups_seen.lock().unwrap_or_else(|p| p.into_inner());
        for p in peers {
            let last = seen.insert(p.node, p.cleanups_total).unwrap_or(0);
            let new = p.cleanups_total.saturating_sub(last);
            let kept = usize::try_from(new)
                .unwrap_or(usize::MAX)
                .min(p.cleanups.len());
            for c in &p.cleanups[p.cleanups.len() - kept..] {
                self.cleanups
                    .get_or_create(&vec![("reason", c.reason.to_string())])
                    .inc();
            }
            let unrecorded = new.saturating_sub(kept as u64);
            if unrecorded > 0 {
                self.cleanups
                    .get_or_create(&vec![("reason", "unrecorded".to_string())])
                    .inc_by(unrecorded);
            }
        }
    }

    /// Renders every metric as OpenMetrics text, from the engine's snapshot `snap`, the
    /// heartbeat round trip of each connected peer whose heartbeats this node sends (`rtts`)
    /// the node map's entries `hosts` and the node's GPUs on the fabric `gpus`.
    pub(crate) fn render(
        &self,
        snap: &PeersSnapshot,
        rtts: &[(NodeId, Duration)],
        hosts: &[String],
        gpus: &[openimex_core::GpuFabric],
    ) -> String {
        self.count_cleanups(&snap.peers);
        let mut r = Registry::with_prefix("openimex");
        let state = Family::<Labels, Gauge>::default();
        for s in DaemonState::ALL {
            let v = i64::from(s == snap.state);
            state
                .get_or_create(&vec![("state", s.as_str().to_string())])
                .set(v);
        }
        r.register(
            "daemon_state",
            "The daemon's state: 1 for the current one",
            state,
        );
        let up = snap.state == DaemonState::Ready;
        let all = snap.peers.iter().all(|p| p.status == ConnStatus::Connected);
        let current = match (up, all) {
            (false, _) => "DOWN",
            (true, true) => "UP",
            (true, false) => "DEGRADED",
        };
        let domain = Family::<Labels, Gauge>::default();
        for s in ["UP", "DEGRADED", "DOWN"] {
            let v = i64::from(s == current);
            domain
                .get_or_create(&vec![("status", s.to_string())])
                .set(v);
        }
        r.register(
            "domain_status",
            "The domain's status as seen from this node's own links (ctl -q asks every node): 1 for the current one",
            domain,
        );
        let gauge = |f: fn(&PeerState) -> i64| {
            let family = Family::<Labels, Gauge>::default();
            for p in &snap.peers {
                family.get_or_create(&peer_labels(p.node, hosts)).set(f(p));
            }
            family
        };
        r.register(
            "peer_connected",
            "Whether the link to the peer is connected (1) or not (0)",
            gauge(|p| i64::from(p.status == ConnStatus::Connected)),
        );
        let link = Family::<Labels, Gauge>::default();
        for p in &snap.peers {
            let mut labels = peer_labels(p.node, hosts);
            labels.push(("state", p.status.as_str().to_string()));
            link.get_or_create(&labels).set(1);
        }
        r.register(
            "peer_link_state",
            "The link's state to the peer: 1 for the current one",
            link,
        );
        r.register(
            "peer_exports_held",
            "References held on this node's exports for the peer's imports",
            gauge(|p| i64::try_from(p.exports_held).unwrap_or(i64::MAX)),
        );
        r.register(
            "peer_imports",
            "This node's imports whose exporter is the peer (held, or waiting for its answer)",
            gauge(|p| i64::try_from(p.imports).unwrap_or(i64::MAX)),
        );
        r.register(
            "peer_unimports_pending",
            "Unimports the peer has yet to confirm or be told of",
            gauge(|p| i64::try_from(p.unimports_pending).unwrap_or(i64::MAX)),
        );
        let rtt = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        for (peer, d) in rtts {
            rtt.get_or_create(&peer_labels(*peer, hosts))
                .set(d.as_secs_f64());
        }
        r.register(
            "peer_heartbeat_rtt_seconds",
            "Round trip of the last heartbeat answered by the peer, on the pair's session; measured by the pair's lower node, which sends the heartbeats",
            rtt,
        );
        let cleaned = Family::<Labels, Counter>::default();
        for p in &snap.peers {
            cleaned
                .get_or_create(&peer_labels(p.node, hosts))
                .inc_by(p.cleanups_total);
        }
        r.register(
            "peer_cleanups",
            "Clean-ups of the peer since start",
            cleaned,
        );
        fabric::register(&mut r, gpus);
        if let Some(n) = self.heap_allocations.map(|count| count()) {
            let heap = Counter::<u64>::default();
            heap.inc_by(n);
            r.register(
                "heap_allocations",
                "Heap allocations the daemon made since it started (every thread)",
                heap,
            );
        }
        self.register_events(&mut r);
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &r);
        out
    }

    fn register_events(&self, r: &mut Registry) {
        r.register(
            "imports_answered",
            "Peers' import requests this node answered as exporter, by result",
            self.imports_answered.clone(),
        );
        r.register(
            "imports_completed",
            "This node's import requests answered by their exporter (or failed), by result",
            self.imports_completed.clone(),
        );
        r.register_with_unit(
            "import_duration",
            "From this node sending an import request to the exporter's answer",
            Unit::Seconds,
            self.import_duration.clone(),
        );
        r.register(
            "unimports_sent",
            "Unimports this node sent as importer, by whether the exporter confirmed",
            self.unimports_sent.clone(),
        );
        r.register(
            "unimports_received",
            "Unimports peers sent this node as exporter",
            self.unimports_received.clone(),
        );
        r.register(
            "reconnects",
            "Times a link connected again after its first connection, by peer",
            self.reconnects.clone(),
        );
        r.register(
            "cleanups",
            "Clean-ups of peers (their imports and exports ended here), by reason",
            self.cleanups.clone(),
        );
    }
}

#[cfg(test)]
mod tests;
