//! A node map that changes while the daemon runs: SIGUSR1 re-reads the nodes file and
//! re-resolves its names (NVIDIA's behaviour, which the Kubernetes DRA driver relies on).
//!
//! # Contract
//! [`Mesh::handle_node_map`] is an input like the others (module contract of [`Mesh`]): the
//! owner MUST drain [`Mesh::poll_action`] afterwards. The owner reads the file and resolves
//! names (I/O); the mesh decides. It accepts a map that only appends entries or fills in
//! placeholder lines (`0.0.0.0`: no node ran at that ID; the node joins like an appended one)
//! — a node's ID is its line, so anything else would renumber running nodes — and refuses
//! anything else without changing a thing. The owner names the peers whose address changed (it knows addresses; the
//! mesh does not): those and the appended nodes are dialled, every other link is left exactly
//! as it was, sessions and backoff included, so live imports between unaffected nodes never
//! notice.

use std::sync::Arc;
use std::time::Instant;

use super::{Dialer, DueClass, Link, Mesh};
use crate::ids::NodeId;
use crate::nodemap::{MapRefusal, NodeMap};
use crate::state::{ConnStatus, DaemonState};

impl Mesh {
    /// The nodes file was re-read as `map`, and the peers in `readdressed` now resolve to an
    /// address other than the one their session or last dial used. Returns the appended node
    /// IDs (dialled now); refuses, changing nothing, a map that does not extend the current one.
    ///
    /// A readdressed peer's session (to the old address) is closed and the peer dialled at once,
    /// as is one waiting out a backoff; a dial in flight is superseded (its result is ignored).
    /// Dials go through the first-round queue, so they are bounded by the dials in flight but
    /// wait for no retry budget. IDs that are not peers of the old map are ignored.
    pub fn handle_node_map(
        &mut self,
        now: Instant,
        map: NodeMap,
        readdressed: &[NodeId],
    ) -> Result<Vec<NodeId>, MapRefusal> {
        let added = self.cfg.map.growth_to(&map)?;
        let started = !matches!(
            self.state,
            DaemonState::Initializing | DaemonState::ShuttingDown
        );
        // Before start every peer is dialled at start anyway; while stopping nobody is.
        for &peer in readdressed.iter().filter(|_| started) {
            let Some(link) = self.link(peer) else {
                continue;
            };
            let (dialer, carrier) = (link.dialer, link.carrier);
            if let Some(c) = carrier {
                self.actions
                    .push_back(super::Action::CloseSession { peer, via: c.via });
                self.set_carrier(peer, None);
                self.set_status(
                    now,
                    peer,
                    ConnStatus::Recovering,
                    "nodes file re-read: it now resolves to another address; re-dialling".into(),
                );
            }
            if let Some(link) = self.link_mut(peer) {
                link.failures = 0;
            }
            // A dial in flight goes to the old address: superseded when the new one leaves.
            if matches!(dialer, Dialer::InFlight)
                && let Some(link) = self.link_mut(peer)
            {
                link.attempt += 1;
            }
            self.set_dialer(
                peer,
                Dialer::Queued(self.due(DueClass::FirstRound, now, peer)),
            );
        }
        // A derived domain ID follows a filled-in placeholder at entry 0, so that this daemon
        // agrees with those started on the filled-in file (see `NodeMap::derived_domain_id`).
        // A configured ID never equals the derivation by chance.
        if self.cfg.domain_id == self.cfg.map.derived_domain_id() {
            self.cfg.domain_id = map.derived_domain_id();
        }
        self.hosts = Arc::from(map.hosts());
        self.cfg.map = map;
        for &id in &added {
            let placeholder = self.cfg.map.is_placeholder(id);
            let link = Link::for_entry(&self.cfg.map, id, now);
            if id.index() < self.links.len() {
                // A placeholder filled in: it was never dialled, so nothing is superseded (a
                // queued re-dial of it, as readdressed, is cleared first).
                self.set_dialer(id, Dialer::Idle);
                if let Some(slot) = self.links.get_mut(id.index()) {
                    *slot = Some(link);
                }
            } else {
                self.links.push(Some(link));
            }
            if started && !placeholder {
                self.set_dialer(id, Dialer::Queued(self.due(DueClass::FirstRound, now, id)));
            }
        }
        self.check_quorum();
        self.pump_dials(now);
        Ok(added)
    }
}

impl Link {
    /// A placeholder entry's link (`0.0.0.0`): no node there, never dialled, INVALID.
    fn placeholder(now: Instant) -> Self {
        Self {
            status: ConnStatus::Invalid,
            reason: "placeholder entry (0.0.0.0): no node at this ID yet, not dialled".to_string(),
            ..Self::new(now)
        }
    }

    /// The link for entry `id` of `map`: a placeholder's, or a peer not dialled yet.
    pub(super) fn for_entry(map: &NodeMap, id: NodeId, now: Instant) -> Self {
        if map.is_placeholder(id) {
            Self::placeholder(now)
        } else {
            Self::new(now)
        }
    }
}
