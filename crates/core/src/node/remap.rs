//! The node map re-read while the daemon runs (SIGUSR1): the file is aligned with the running
//! map ([`NodeMap::reread`]: nobody is renumbered, a removed line is a hole), the mesh decides
//! what is dialled ([`Mesh::handle_node_map`](crate::Mesh::handle_node_map)), and the node
//! adds what the change means for its own state. Peers whose entry and address did not change
//! keep everything: their imports, exports and references are not touched. A removed node is
//! a lost peer: what it imported here and what we imported from it follow the lost-node rules
//! (`grace.rs`: after the grace time our memory is fenced for it, then released), because it
//! may still run and hold mappings the operator's edit cannot see.
//!
//! # Contract
//! The owner MUST report the start-up read ([`Node::handle_nodes_resolved`]) before the first
//! re-read, and MUST drain [`Node::poll_action`] after [`Node::handle_nodes_file`] as after any
//! input: the sessions it drops and the dials it starts are actions.
//!
//! # Who is dialled again
//! The owner reads the nodes file and resolves its names (I/O) and reports that with
//! [`Node::handle_nodes_file`], with the peer's address on each pair's live session (it holds
//! the sockets). The node decides which peers are readdressed, comparing with what the entries
//! resolved to at the last read (the start-up read, [`Node::handle_nodes_resolved`], or the
//! last accepted re-read):
//! - a peer whose live session goes to an address its entry no longer resolves to: that
//!   session is dropped and the peer dialled again;
//! - a peer not connected whose entry resolves elsewhere than at the last read: dialled at once
//!   rather than after its backoff;
//! - a peer whose entry does not resolve right now keeps what it has: a name missing for a
//!   moment must not cut a live session. So does a placeholder entry filled in (a node added,
//!   not a move), and everyone else is left exactly as it was.

use std::net::IpAddr;
use std::time::Instant;

use super::Node;
use crate::ids::NodeId;
use crate::nodemap::{MapRefusal, NodeMap, Reread};
use crate::state::ConnStatus;

/// The nodes file as the owner read and resolved it.
#[derive(Debug, Clone)]
pub struct ResolvedNodes {
    /// Its entries, in node-ID order.
    pub map: NodeMap,
    /// What each entry resolves to now, by node ID (empty: it does not resolve right now).
    pub addrs: Vec<Vec<IpAddr>>,
    /// The peer's address on each pair's live session, as the owner's socket has it.
    pub sessions: Vec<(NodeId, IpAddr)>,
}

/// What a re-read accepted changed (for the owner's log line).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Remapped {
    /// Nodes appended, or placeholder entries filled in (dialled now).
    pub added: Vec<NodeId>,
    /// Nodes whose line was removed (or turned into `0.0.0.0`): holes now, lost here.
    pub removed: Vec<NodeId>,
    /// Whether the file holds every hole as a placeholder line, so that a daemon started on
    /// it numbers the nodes as the running one does ([`crate::nodemap::Reread::file_in_step`]).
    pub file_in_step: bool,
    /// Peers whose entry resolves elsewhere than at the last read, with the new addresses.
    pub moved: Vec<(NodeId, Vec<IpAddr>)>,
    /// Peers dialled again at once (their live session, if any, dropped).
    pub redial: Vec<NodeId>,
}

impl Node {
    /// See [`crate::Mesh::handle_node_map`]. On success the persist record is written again
    /// (action [`super::Action::Persist`], same importers): it is keyed to the node map, and a
    /// daemon restarted with the new file must find it.
    pub fn handle_node_map(
        &mut self,
        now: Instant,
        map: NodeMap,
        readdressed: &[NodeId],
    ) -> Result<Reread, MapRefusal> {
        let config = self.mesh.config();
        let reread = config.map.reread(&map, config.local)?;
        self.apply_reread(now, &reread, readdressed);
        Ok(reread)
    }

    /// [`Node::handle_node_map`] for a file already aligned with the running map.
    fn apply_reread(&mut self, now: Instant, reread: &Reread, readdressed: &[NodeId]) {
        self.mesh.apply_reread(now, reread, readdressed);
        self.absorb_mesh(now);
        self.rewrite_persist();
    }

    /// What each entry of the nodes file resolved to at start-up (by node ID): what the first
    /// re-read compares with.
    pub fn handle_nodes_resolved(&mut self, addrs: Vec<Vec<IpAddr>>) {
        self.resolved = addrs;
    }

    /// The nodes file re-read (SIGUSR1) as `file` (entries and addresses in file order):
    /// aligns it with the running map, decides who is readdressed (module doc), then applies
    /// the map as [`Node::handle_node_map`] does. Refused, nothing changes, the addresses to
    /// compare with included.
    pub fn handle_nodes_file(
        &mut self,
        now: Instant,
        file: ResolvedNodes,
    ) -> Result<Remapped, MapRefusal> {
        let config = self.mesh.config();
        let aligned = config.map.reread(&file.map, config.local)?;
        // Addresses by node ID: a hole whose line went resolves to nothing.
        let addrs: Vec<Vec<IpAddr>> = (aligned.entry_of.iter())
            .map(|e| {
                e.and_then(|e| file.addrs.get(e).cloned())
                    .unwrap_or_default()
            })
            .collect();
        let (moved, redial) = self.readdressed(&aligned.map, &addrs, &file.sessions);
        self.apply_reread(now, &aligned, &redial);
        // We closed these pairs' sessions on our own. The peer, if it is the lower node with a
        // dial of us in flight, holds the pair as connected on the strength of that dial until
        // it fails (the mesh's handover, `pair.rs`): up to a dial timeout before it even starts
        // its grace time. What it holds here is released no earlier than after an answered
        // hello, which allows for exactly that (`grace.rs`).
        for &peer in aligned.removed.iter().chain(&redial) {
            self.answered_hello(now, peer);
        }
        self.resolved = addrs;
        Ok(Remapped {
            file_in_step: aligned.file_in_step(),
            added: aligned.added,
            removed: aligned.removed,
            moved,
            redial,
        })
    }

    /// The peers of the running map whose entry resolves elsewhere than at the last read
    /// (`moved`, with the new addresses), and those to dial again (the module doc): `new_map`
    /// is the file aligned with the running map, `addrs` what its entries resolve to by node
    /// ID, `sessions` the peer's address on each pair's live session.
    fn readdressed(
        &self,
        new_map: &NodeMap,
        addrs: &[Vec<IpAddr>],
        sessions: &[(NodeId, IpAddr)],
    ) -> (Vec<(NodeId, Vec<IpAddr>)>, Vec<NodeId>) {
        let map = &self.mesh.config().map;
        let local = self.mesh.config().local;
        let mut moved = Vec::new();
        let mut redial = Vec::new();
        let common = map.len().min(new_map.len());
        for (i, new) in addrs.iter().enumerate().take(common) {
            let Ok(id) = u16::try_from(i).map(NodeId) else {
                break;
            };
            // A placeholder filled in is no move: the mesh counts it as a node added. A node
            // removed (a hole now) is not dialled anywhere.
            if id == local || new.is_empty() || map.is_placeholder(id) || new_map.is_placeholder(id)
            {
                continue;
            }
            let changed = self.resolved.get(i).is_some_and(|old| old != new);
            let connected = self
                .mesh
                .peer(id)
                .is_some_and(|(status, _)| status == ConnStatus::Connected);
            let session = sessions.iter().find(|(p, _)| *p == id).map(|s| s.1);
            let stale = connected && session.is_some_and(|ip| !new.contains(&ip));
            if changed {
                moved.push((id, new.clone()));
            }
            if stale || (changed && !connected) {
                redial.push(id);
            }
        }
        (moved, redial)
    }
}
