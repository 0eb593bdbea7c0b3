//! Conversions between the wire types (`openimex-proto`) and the core's types.

use openimex_core::{
    ConnStatus, Hello, ImportAnswer, ImportError, ImportRequest, InstanceId, LinkView, Mismatch,
    NodeId, Pages, Status,
};
use std::time::UNIX_EPOCH;

use openimex_proto::cmd::{PeerCleanUp, PeerReport, PeersReply};
use openimex_proto::peer::{
    ConnectionStatus, Identity, ImportReply, ImportRequest as WireImportRequest, NodeStatus,
    Refusal, RefusalCount,
};

use crate::mailbox::{PeersSnapshot, Snapshot};

/// Our identity as sent on the wire, with the node's `cliques` and their epoch; without the
/// node map's entries unless `with_map` (core's `Mesh::shares_map` says when a peer needs
/// none).
pub(crate) fn identity(
    hello: &Hello,
    driver_version: &str,
    (cliques, cliques_epoch): (Vec<u32>, u64),
    with_map: bool,
) -> Identity {
    Identity {
        domain_id: hello.domain_id.clone(),
        node_id: u32::from(hello.node.0),
        instance_id: hello.instance.0,
        node_map_digest: hello.digest.clone(),
        software_version: env!("CARGO_PKG_VERSION").to_string(),
        protocol_version: hello.protocol_version,
        node_map: if with_map {
            hello.node_map.to_vec()
        } else {
            Vec::new()
        },
        driver_version: driver_version.to_string(),
        node_map_base_len: u32::try_from(hello.map_base_len).unwrap_or(u32::MAX),
        cliques,
        cliques_epoch,
    }
}

/// Longest domain ID, digest or node-map entry accepted from a peer (a DNS name is at most
/// 253 characters); peer strings end up in link reasons and logs, so they are bounded here.
pub(crate) const MAX_PEER_STRING: usize = 256;
/// Most node-map entries accepted from a peer.
pub(crate) const MAX_NODE_MAP: usize = 65_536;

/// A peer's identity, or why it cannot be one (node ID out of range, a field too long).
pub(crate) fn hello(id: &Identity) -> Result<Hello, String> {
    let node =
        u16::try_from(id.node_id).map_err(|_| format!("node ID {} out of range", id.node_id))?;
    let long = [&id.domain_id, &id.node_map_digest, &id.driver_version]
        .into_iter()
        .chain(id.node_map.iter())
        .any(|s| s.len() > MAX_PEER_STRING);
    if long {
        return Err(format!(
            "identity has a field longer than {MAX_PEER_STRING} bytes"
        ));
    }
    if id.node_map.len() > MAX_NODE_MAP {
        return Err(format!(
            "identity lists {} node-map entries (at most {MAX_NODE_MAP})",
            id.node_map.len()
        ));
    }
    Ok(Hello {
        domain_id: id.domain_id.clone(),
        node: NodeId(node),
        instance: InstanceId(id.instance_id),
        digest: id.node_map_digest.clone(),
        node_map: id.node_map.as_slice().into(),
        map_base_len: usize::try_from(id.node_map_base_len).unwrap_or(usize::MAX),
        protocol_version: id.protocol_version,
    })
}

pub(crate) fn refusal(m: Mismatch) -> Refusal {
    match m {
        Mismatch::NodeMap => Refusal::NodeMapMismatch,
        Mismatch::Domain => Refusal::DomainMismatch,
        Mismatch::Version => Refusal::ProtocolVersion,
        Mismatch::WrongNode => Refusal::WrongNode,
    }
}

pub(crate) fn mismatch(r: Refusal) -> Mismatch {
    match r {
        // Asked for entries it was sent: a peer that cannot judge our map is one whose map
        // is not ours.
        Refusal::NodeMapMismatch | Refusal::NodeMapNeeded => Mismatch::NodeMap,
        Refusal::DomainMismatch => Mismatch::Domain,
        Refusal::ProtocolVersion => Mismatch::Version,
        Refusal::WrongNode | Refusal::ShuttingDown | Refusal::None => Mismatch::WrongNode,
    }
}

pub(crate) fn connection(l: &LinkView) -> ConnectionStatus {
    let reason = match &l.last_error {
        Some(e) if e != &l.reason => format!("{}; last attempt: {e}", l.reason),
        _ => l.reason.clone(),
    };
    ConnectionStatus {
        node_id: u32::from(l.node.0),
        status: l.status.as_str().to_string(),
        changed: l.changed,
        reason,
    }
}

/// An exporter's wire answer as the core's.
pub(crate) fn answer(r: ImportReply) -> ImportAnswer {
    if r.error.is_empty() {
        Ok(Pages {
            size: r.size,
            page_size: r.page_size,
            pfns: r.pfns,
            clique_id: r.clique_id,
            // A wider value than a u16 is no mode the driver knows: it never matches a GPU's.
            bw_mode: u16::try_from(r.bw_mode).unwrap_or(u16::MAX),
            bw_mode_epoch: r.bw_mode_epoch,
            kind: r.kind,
            phys_addr_space: r.phys_addr_space,
            compression_coverage: r.compression_coverage,
            mem_flags: r.mem_flags,
        })
    } else {
        Err(ImportError::new(Status::parse(&r.error), r.detail))
    }
}

/// The wire form of an answer.
pub(crate) fn reply(a: ImportAnswer) -> ImportReply {
    match a {
        Ok(p) => ImportReply {
            error: String::new(),
            detail: String::new(),
            size: p.size,
            page_size: p.page_size,
            pfns: p.pfns,
            clique_id: p.clique_id,
            bw_mode: u32::from(p.bw_mode),
            bw_mode_epoch: p.bw_mode_epoch,
            kind: p.kind,
            phys_addr_space: p.phys_addr_space,
            compression_coverage: p.compression_coverage,
            mem_flags: p.mem_flags,
        },
        Err(e) => ImportReply {
            error: e.status.as_str().to_string(),
            detail: e.detail,
            ..Default::default()
        },
    }
}

/// A peer's import request as the core's, or what is wrong with it.
pub(crate) fn import_request(r: &WireImportRequest) -> Result<ImportRequest, String> {
    let (export_uuid, index) = export_uuid_and_index(&r.export_uuid, r.index)?;
    Ok(ImportRequest {
        import_event_id: r.import_event_id,
        export_uuid,
        index,
        channel: r.channel,
    })
}

/// A peer's export UUID (16 bytes) and handle index (16 bits), or what is wrong with them.
pub(crate) fn export_uuid_and_index(uuid: &[u8], index: u32) -> Result<([u8; 16], u16), String> {
    let export_uuid: [u8; 16] = uuid
        .try_into()
        .map_err(|_| "export UUID must be 16 bytes".to_string())?;
    let index = u16::try_from(index).map_err(|_| format!("index {index} out of range"))?;
    Ok((export_uuid, index))
}

/// The wire form of an import request.
pub(crate) fn wire_import_request(r: &ImportRequest) -> WireImportRequest {
    WireImportRequest {
        // On the session its hello proved the sender; a request names it no more.
        from: None,
        import_event_id: r.import_event_id,
        export_uuid: r.export_uuid.to_vec(),
        index: u32::from(r.index),
        channel: r.channel,
    }
}

/// This node's row, as sent to peers and used by the command service: the compact cells
/// always, each link's reason only when `reasons` is asked for (`ctl --links`).
///
/// With `fabric`, the row also carries the node's GPUs' fabric probes (`ctl --fabric`).
pub(crate) fn node_status(
    snap: &Snapshot,
    host_name: &str,
    reasons: bool,
    fabric: bool,
) -> NodeStatus {
    NodeStatus {
        gpus: match fabric {
            true => snap.fabric.iter().map(gpu_to_wire).collect(),
            false => Vec::new(),
        },
        refusals: snap
            .refusals
            .iter()
            .map(|(reason, count)| RefusalCount {
                reason: (*reason).to_string(),
                count: *count,
            })
            .collect(),
        node_id: u32::from(snap.local.0),
        state: snap.state.as_str().to_string(),
        version: snap.driver_version.clone(),
        host_name: host_name.to_string(),
        instance_id: snap.instance.0,
        connections: if reasons {
            snap.links.iter().map(connection).collect()
        } else {
            Vec::new()
        },
        cells: snap
            .links
            .iter()
            .map(|l| l.status.cell(l.changed))
            .collect(),
    }
}

/// The `ctl --peers` reply. Each clean-up's time is the snapshot's wall clock less the
/// clean-up's age on the engine's clock, which is monotonic (a wall-clock step between a
/// clean-up and the query shifts the times shown, never their order).
pub(crate) fn peers_reply(snap: PeersSnapshot, hosts: &[String]) -> PeersReply {
    let wall = snap.wall;
    let unix_ms = |at: std::time::Instant| {
        let when = wall
            .checked_sub(snap.now.saturating_duration_since(at))
            .unwrap_or(UNIX_EPOCH);
        let ms = when
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        u64::try_from(ms).unwrap_or(u64::MAX)
    };
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    let peers = snap
        .peers
        .into_iter()
        .map(|p| PeerReport {
            node_id: u32::from(p.node.0),
            host: hosts.get(p.node.index()).cloned().unwrap_or_default(),
            status: p.status.as_str().to_string(),
            instance_id: p.instance.map_or(0, |i| i.0),
            exports_held: count(p.exports_held),
            imports: count(p.imports),
            unimports_pending: count(p.unimports_pending),
            cleanups_total: p.cleanups_total,
            cleanups: p
                .cleanups
                .iter()
                .map(|c| PeerCleanUp {
                    reason: c.reason.to_string(),
                    at_unix_ms: unix_ms(c.at),
                    exports_released: count(c.cleaned.exports_released),
                    imports_dropped: count(c.cleaned.imports_dropped),
                    unimports_finished: count(c.cleaned.unimports_finished),
                })
                .collect(),
        })
        .collect();
    PeersReply {
        local_node_id: u32::from(snap.local.0),
        state: snap.state.as_str().to_string(),
        peers,
    }
}

/// A peer's row made `nodes` cells wide. A daemon from before compact rows sends only
/// `connections` (status words), which are turned into cells; cells missing or beyond the map
/// read as INVALID / are dropped.
pub(crate) fn row_cells(st: &mut NodeStatus, nodes: usize) {
    if st.cells.is_empty() && !st.connections.is_empty() {
        let mut cells = vec![ConnStatus::Invalid.cell(false); nodes];
        for c in &st.connections {
            if let (Some(slot), Ok(status)) = (
                cells.get_mut(c.node_id as usize),
                c.status.parse::<ConnStatus>(),
            ) {
                *slot = status.cell(c.changed);
            }
        }
        st.cells = cells;
    }
    st.cells.resize(nodes, ConnStatus::Invalid.cell(false));
}

/// A peer-supplied free-text string made safe to log: at most [`MAX_PEER_STRING`] characters,
/// control characters escaped.
pub(crate) fn bounded(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(MAX_PEER_STRING)
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect();
    if s.chars().count() > MAX_PEER_STRING {
        out.push_str(&format!("… ({} bytes)", s.len()));
    }
    out
}

/// One GPU on the wire (`NodeStatus.gpus`, `NodeReport.gpus`).
pub(crate) fn gpu_to_wire(g: &openimex_core::GpuFabric) -> openimex_proto::peer::GpuFabric {
    openimex_proto::peer::GpuFabric {
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
    use std::time::{Duration, Instant};

    use openimex_core::{CleanUp, Cleaned, DaemonState, PeerState};

    use super::*;

    #[test]
    fn a_clean_up_is_dated_by_its_age_on_the_engine_clock() {
        #[allow(clippy::disallowed_methods)]
        let now = Instant::now();
        let at = now.checked_sub(Duration::from_secs(5)).unwrap_or(now);
        let age = now.duration_since(at);
        let snap = PeersSnapshot {
            local: NodeId(0),
            state: DaemonState::Ready,
            peers: vec![PeerState {
                node: NodeId(1),
                status: ConnStatus::Disconnected,
                instance: None,
                exports_held: 0,
                imports: 0,
                unimports_pending: 2,
                cleanups_total: 1,
                cleanups: vec![CleanUp {
                    peer: NodeId(1),
                    at,
                    reason: "left",
                    cleaned: Cleaned {
                        exports_released: 3,
                        ..Cleaned::default()
                    },
                }],
            }],
            now,
            wall: UNIX_EPOCH + Duration::from_secs(100),
        };
        let hosts = ["10.0.0.1".to_string(), "10.0.0.2".to_string()];
        let reply = peers_reply(snap, &hosts);
        let p = &reply.peers[0];
        assert_eq!(
            (p.host.as_str(), p.status.as_str()),
            ("10.0.0.2", "DISCONNECTED")
        );
        assert_eq!((p.instance_id, p.unimports_pending), (0, 2));
        let c = &p.cleanups[0];
        let want = (Duration::from_secs(100) - age).as_millis();
        assert_eq!(u128::from(c.at_unix_ms), want);
        assert_eq!((c.reason.as_str(), c.exports_released), ("left", 3));
    }
}
