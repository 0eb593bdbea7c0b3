//! What a node shows about each peer (`ctl --peers`): the references it holds on its exports
//! for that peer's importers, its own imports from that peer, the unimports it still owes that
//! peer, and the clean-ups of that peer here, each with its reason, time and counts.
//!
//! The clean-up history is bounded per peer ([`CLEANUPS_KEPT_PER_PEER`]) with a running total,
//! so a peer that flaps for weeks costs the same memory as one that flapped twice.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::{Action, Node};
use crate::ids::{InstanceId, NodeId};
use crate::state::ConnStatus;

/// How many clean-ups are kept per peer; older ones only count in [`PeerState::cleanups_total`].
pub const CLEANUPS_KEPT_PER_PEER: usize = 16;

/// What one clean-up of a peer released or ended here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cleaned {
    /// References held on local exports for the peer's importers, released.
    pub exports_released: usize,
    /// Imports from the peer (held, or still waiting for its answer) dropped here.
    pub imports_dropped: usize,
    /// Local unimports that waited on the peer, finished without it.
    pub unimports_finished: usize,
}

/// A clean-up of a peer's imports and exports here, for the record `ctl` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanUp {
    /// The peer.
    pub peer: NodeId,
    /// When (the `now` of the input that caused it).
    pub at: Instant,
    /// Why: it restarted, it left, or it was lost longer than the grace time.
    pub reason: &'static str,
    /// What it released.
    pub cleaned: Cleaned,
}

/// One peer as this node sees it. See [`Node::peer_state`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerState {
    /// The peer.
    pub node: NodeId,
    /// Its link, as in [`Node::links`] (a peer cleaned up after its grace time is DISCONNECTED).
    pub status: ConnStatus,
    /// Its instance, once known.
    pub instance: Option<InstanceId>,
    /// References held on this node's exports for the peer's importers.
    pub exports_held: usize,
    /// This node's imports whose exporter is the peer (held, or waiting for its answer).
    pub imports: usize,
    /// Unimports the peer has yet to confirm or be told of (it is told when it is back).
    pub unimports_pending: usize,
    /// Clean-ups of the peer since start.
    pub cleanups_total: u64,
    /// The latest of them (at most [`CLEANUPS_KEPT_PER_PEER`]), oldest first.
    pub cleanups: Vec<CleanUp>,
}

/// One peer's clean-ups: the total and the latest few.
#[derive(Debug, Default)]
struct PeerCleanups {
    total: u64,
    latest: VecDeque<CleanUp>,
}

/// The clean-ups of every peer, bounded per peer. Peers come from the node map, so the whole
/// log is bounded too.
#[derive(Debug, Default)]
pub(super) struct CleanupLog {
    peers: HashMap<NodeId, PeerCleanups>,
}

impl CleanupLog {
    /// Adds references released after the fence margin to `peer`'s latest clean-up.
    pub(super) fn add_released(&mut self, peer: NodeId, released: usize) {
        if let Some(last) = self.peers.get_mut(&peer).and_then(|p| p.latest.back_mut()) {
            last.cleaned.exports_released += released;
        }
    }

    fn push(&mut self, c: CleanUp) {
        let p = self.peers.entry(c.peer).or_default();
        p.total += 1;
        if p.latest.len() == CLEANUPS_KEPT_PER_PEER {
            p.latest.pop_front();
        }
        p.latest.push_back(c);
    }
}

impl Node {
    /// Every peer in the node map (not this node), in ID order: what is held for it, imported
    /// from it and owed to it, and its clean-ups here.
    pub fn peer_state(&self) -> Vec<PeerState> {
        let local = self.mesh.config().local;
        let imports = self.imports.per_exporter();
        let mut awaiting: HashMap<NodeId, usize> = HashMap::new();
        for (exporter, _) in self.unimports.keys() {
            *awaiting.entry(*exporter).or_default() += 1;
        }
        self.links()
            .into_iter()
            .filter(|l| l.node != local)
            .map(|l| {
                let node = l.node;
                let log = self.cleanups.peers.get(&node);
                PeerState {
                    node,
                    status: l.status,
                    instance: l.instance,
                    exports_held: self.exports.held_for(node),
                    imports: imports.get(&node).copied().unwrap_or(0),
                    unimports_pending: awaiting.get(&node).copied().unwrap_or(0)
                        + self.imports.undelivered_to(node),
                    cleanups_total: log.map_or(0, |p| p.total),
                    cleanups: log.map_or_else(Vec::new, |p| p.latest.iter().cloned().collect()),
                }
            })
            .collect()
    }

    /// The clean-ups kept (the latest [`CLEANUPS_KEPT_PER_PEER`] of each peer), by peer and
    /// oldest first within a peer.
    pub fn cleanups(&self) -> impl Iterator<Item = &CleanUp> {
        let mut peers: Vec<_> = self.cleanups.peers.iter().collect();
        peers.sort_unstable_by_key(|(id, _)| **id);
        peers.into_iter().flat_map(|(_, p)| p.latest.iter())
    }

    pub(super) fn record_cleanup(
        &mut self,
        now: Instant,
        peer: NodeId,
        reason: &'static str,
        cleaned: Cleaned,
    ) {
        self.cleanups.push(CleanUp {
            peer,
            at: now,
            reason,
            cleaned,
        });
        self.actions.push_back(Action::CleanedUp { peer, reason });
    }
}
