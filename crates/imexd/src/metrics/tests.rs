//! Rendering and routing of the metrics.

use std::time::{Duration, Instant, SystemTime};

use openimex_core::{CleanUp, ConnStatus, DaemonState, NodeId, PeerState};

use super::Events;
use super::http::{Route, route};
use crate::mailbox::PeersSnapshot;

fn peer(node: u16, status: ConnStatus) -> PeerState {
    PeerState {
        node: NodeId(node),
        status,
        instance: None,
        exports_held: 3,
        imports: 2,
        unimports_pending: 1,
        cleanups_total: 0,
        cleanups: Vec::new(),
    }
}

fn snap(state: DaemonState, peers: Vec<PeerState>) -> PeersSnapshot {
    PeersSnapshot {
        local: NodeId(0),
        state,
        peers,
        now: Instant::now(),
        wall: SystemTime::now(),
    }
}

fn hosts() -> Vec<String> {
    ["n0", "n1", "n2"].map(String::from).to_vec()
}

#[test]
fn renders_state_domain_and_peer_gauges() {
    let events = Events::default();
    let peers = vec![
        peer(1, ConnStatus::Connected),
        peer(2, ConnStatus::Recovering),
    ];
    let text = events.render(
        &snap(DaemonState::Ready, peers),
        &[(NodeId(1), Duration::from_millis(2))],
        &hosts(),
        &[openimex_core::GpuFabric {
            gpu: 2,
            state: "COMPLETED".into(),
            clique_id: 7,
            health_mask: 0x1,
            health_summary: "LIMITED_CAPACITY".into(),
            ..Default::default()
        }],
    );
    for line in [
        // The GPUs' fabric health (issue 14: "per-GPU fabric health ... in the metrics").
        "openimex_gpu_fabric_health{gpu=\"2\",summary=\"LIMITED_CAPACITY\"} 1",
        "openimex_gpu_fabric_health{gpu=\"2\",summary=\"HEALTHY\"} 0",
        "openimex_gpu_fabric_clique_id{gpu=\"2\"} 7",
        "openimex_gpu_fabric_health_mask{gpu=\"2\"} 1",
        "openimex_daemon_state{state=\"READY\"} 1",
        "openimex_daemon_state{state=\"INIT_GPU\"} 0",
        "openimex_domain_status{status=\"DEGRADED\"} 1",
        "openimex_domain_status{status=\"UP\"} 0",
        "openimex_peer_connected{peer=\"1\",host=\"n1\"} 1",
        "openimex_peer_connected{peer=\"2\",host=\"n2\"} 0",
        "openimex_peer_link_state{peer=\"2\",host=\"n2\",state=\"RECOVERING\"} 1",
        "openimex_peer_exports_held{peer=\"1\",host=\"n1\"} 3",
        "openimex_peer_imports{peer=\"1\",host=\"n1\"} 2",
        "openimex_peer_unimports_pending{peer=\"2\",host=\"n2\"} 1",
        "openimex_peer_cleanups_total{peer=\"1\",host=\"n1\"} 0",
        "openimex_peer_heartbeat_rtt_seconds{peer=\"1\",host=\"n1\"} 0.002",
        "openimex_import_duration_seconds_count 0",
        "openimex_unimports_received_total 0",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
    let up = events.render(&snap(DaemonState::Ready, vec![]), &[], &hosts(), &[]);
    assert!(
        up.contains("openimex_domain_status{status=\"UP\"} 1"),
        "{up}"
    );
    let down = events.render(&snap(DaemonState::InitGpu, vec![]), &[], &hosts(), &[]);
    assert!(
        down.contains("openimex_domain_status{status=\"DOWN\"} 1"),
        "{down}"
    );
}

#[test]
fn events_move_counters_and_the_histogram() {
    let events = Events::default();
    let t0 = Instant::now();
    events.import_sent(7, t0);
    events.import_completed(7, true, t0 + Duration::from_millis(3));
    events.import_completed(8, false, t0);
    events.import_answered(&Err(openimex_core::ImportError::new(
        openimex_core::Status::InvalidState,
        "x",
    )));
    events.unimport_sent(true);
    events.unimport_received();
    let h = hosts();
    events.link_changed(NodeId(1), ConnStatus::Connected, 1, &h);
    events.link_changed(NodeId(1), ConnStatus::Connected, 2, &h);
    let text = events.render(&snap(DaemonState::Ready, vec![]), &[], &h, &[]);
    for line in [
        "openimex_imports_completed_total{result=\"ok\"} 1",
        "openimex_imports_completed_total{result=\"error\"} 1",
        "openimex_imports_answered_total{result=\"error\"} 1",
        "openimex_import_duration_seconds_count 1",
        "openimex_import_duration_seconds_bucket{le=\"0.004\"} 1",
        "openimex_import_duration_seconds_bucket{le=\"0.002\"} 0",
        "openimex_unimports_sent_total{result=\"delivered\"} 1",
        "openimex_unimports_received_total 1",
        "openimex_reconnects_total{peer=\"1\",host=\"n1\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
}

#[test]
fn cleanups_are_counted_once_by_reason() {
    let events = Events::default();
    let clean = |reason| CleanUp {
        peer: NodeId(1),
        at: Instant::now(),
        reason,
        cleaned: Default::default(),
    };
    let mut p = peer(1, ConnStatus::Disconnected);
    p.cleanups_total = 3;
    p.cleanups = vec![clean("left")];
    let h = hosts();
    let text = events.render(&snap(DaemonState::Ready, vec![p.clone()]), &[], &h, &[]);
    assert!(
        text.contains("openimex_cleanups_total{reason=\"left\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("openimex_cleanups_total{reason=\"unrecorded\"} 2"),
        "{text}"
    );
    p.cleanups_total = 4;
    p.cleanups.push(clean("restarted"));
    let text = events.render(&snap(DaemonState::Ready, vec![p]), &[], &h, &[]);
    assert!(
        text.contains("openimex_cleanups_total{reason=\"left\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("openimex_cleanups_total{reason=\"restarted\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("openimex_peer_cleanups_total{peer=\"1\",host=\"n1\"} 4"),
        "{text}"
    );
}

#[test]
fn routes() {
    assert_eq!(
        route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
        Route::Metrics
    );
    assert_eq!(route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Route::Metrics);
    assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
    assert_eq!(route(b"POST /metrics HTTP/1.1\r\n\r\n"), Route::NotAllowed);
    assert_eq!(route(b"hello\r\n\r\n"), Route::Bad);
    assert_eq!(route(b"GET /metrics SSH-2.0\r\n\r\n"), Route::Bad);
}
