//! A node map that changes while the daemon runs: SIGUSR1 re-reads the nodes file and
//! re-resolves its names (NVIDIA's behaviour, which the Kubernetes DRA driver relies on).
//!
//! # Contract
//! [`Mesh::handle_node_map`] is an input like the others (module contract of [`Mesh`]): the
//! owner MUST drain [`Mesh::poll_action`] afterwards. The owner reads the file and resolves
//! names (I/O); the mesh decides. The file is aligned with the running map and never
//! renumbers a node ([`NodeMap::reread`]): appended entries and filled-in placeholder lines
//! (`0.0.0.0`) join, a removed line (or an entry turned into `0.0.0.0`) becomes a hole, and
//! anything else (an edit, a move, this node's own entry removed) is refused without changing
//! a thing. The owner names the peers whose address changed (it knows addresses; the mesh
//! does not): those and the nodes added are dialled, a removed node is lost (its session
//! closed, as a lost peer's: the node's grace, fence and release follow) and never dialled or
//! accepted again at that ID, and every other link is left exactly as it was, sessions and
//! backoff included, so live imports between unaffected nodes never notice.

use std::sync::Arc;
use std::time::Instant;

use super::{Dialer, DueClass, Link, Mesh};
use crate::ids::NodeId;
use crate::nodemap::{MapRefusal, NodeMap, Reread};
use crate::state::{ConnStatus, DaemonState};

impl Mesh {
    /// The nodes file was re-read as `map` (in file order), and the peers in `readdressed` now
    /// resolve to an address other than the one their session or last dial used. Returns the
    /// file aligned with the running map (the nodes added are dialled now, the nodes removed
    /// are holes); refuses, changing nothing, a file that would renumber a node.
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
    ) -> Result<Reread, MapRefusal> {
        let reread = self.cfg.map.reread(&map, self.cfg.local)?;
        self.apply_reread(now, &reread, readdressed);
        Ok(reread)
    }

    /// [`Mesh::handle_node_map`] for a file already aligned with this map
    /// ([`NodeMap::reread`] of this mesh's map, just now).
    pub(crate) fn apply_reread(&mut self, now: Instant, reread: &Reread, readdressed: &[NodeId]) {
        let (added, removed) = (&reread.added, &reread.removed);
        let started = !matches!(
            self.state,
            DaemonState::Initializing | DaemonState::ShuttingDown
        );
        // Before start every peer is dialled at start anyway; while stopping nobody is.
        for &peer in readdressed
            .iter()
            .filter(|&p| started && !removed.contains(p))
        {
            if self.link(peer).is_none() {
                continue;
            }
            // A dial in flight goes to the old address: superseded when the new one leaves.
            if self.let_go(peer) {
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
            self.set_dialer(
                peer,
                Dialer::Queued(self.due(DueClass::FirstRound, now, peer)),
            );
        }
        // A derived domain ID follows entry 0 filled in or made a hole, so that this daemon
        // agrees with those started on the file as it is, holes written as `0.0.0.0` (see
        // `NodeMap::derived_domain_id`): the aligned map's entry 0, not the file's first line.
        // A configured ID never equals the derivation by chance.
        let map = reread.map.clone();
        if self.cfg.domain_id == self.cfg.map.derived_domain_id() {
            self.cfg.domain_id = map.derived_domain_id();
        }
        for &peer in removed {
            self.remove_peer(now, peer);
        }
        self.hosts = Arc::from(map.hosts());
        self.cfg.map = map;
        // Appended entries (placeholders among them) get their links.
        for i in self.links.len()..self.cfg.map.len() {
            let Ok(id) = u16::try_from(i).map(NodeId) else {
                break;
            };
            self.links
                .push(Some(Link::for_entry(&self.cfg.map, id, now)));
        }
        for &id in added {
            // A placeholder filled in: a queued re-dial of it (as readdressed) is cleared. A
            // hole keeps what its link knew of the node (its instance, attempts, a session
            // still closing), so that the node coming back is the same instance or a restart,
            // as after any loss.
            self.set_dialer(id, Dialer::Idle);
            if let Some(link) = self.link_mut(id) {
                link.status = match link.times_connected > 0 {
                    true => ConnStatus::Recovering,
                    false => ConnStatus::NeverConnected,
                };
                link.reason = "not connected yet".into();
                link.since = now;
            }
            if started {
                self.set_dialer(id, Dialer::Queued(self.due(DueClass::FirstRound, now, id)));
            }
        }
        self.check_quorum();
        self.pump_dials(now);
    }

    /// Peer `peer`'s entry is gone from the nodes file: it is lost here for good (a connected
    /// link counted lost first, so that the owner's lost-node rules run), and shows INVALID.
    fn remove_peer(&mut self, now: Instant, peer: NodeId) {
        let Some(status) = self.link(peer).map(|l| l.status) else {
            return;
        };
        self.let_go(peer);
        if status == ConnStatus::Connected {
            self.set_status(
                now,
                peer,
                ConnStatus::Recovering,
                "removed from the nodes file (SIGUSR1)".into(),
            );
        }
        self.set_dialer(peer, Dialer::Idle);
        self.set_status(
            now,
            peer,
            ConnStatus::Invalid,
            "removed from the nodes file (SIGUSR1): a hole, its ID is not reused; not dialled"
                .into(),
        );
    }

    /// Closes the session that carries the pair with `peer`, if any, and supersedes a dial of
    /// it in flight (its result is ignored when it comes). Returns whether a session was
    /// closed. The link's status and dialer are the caller's to set.
    fn let_go(&mut self, peer: NodeId) -> bool {
        let Some(link) = self.link_mut(peer) else {
            return false;
        };
        if matches!(link.dialer, Dialer::InFlight) {
            link.attempt += 1;
        }
        let Some(c) = link.carrier else {
            return false;
        };
        self.actions
            .push_back(super::Action::CloseSession { peer, via: c.via });
        self.set_carrier(peer, None);
        true
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
