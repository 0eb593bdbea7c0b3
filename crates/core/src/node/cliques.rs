//! The node's GPUs on the NVLink fabric and the cliques they put it in, and what the peers are
//! told of them (`docs/reference/driver-interface.md` §1.6 "Other events", §5; the guide's §6.8).
//!
//! - The GPUs' fabric probes are read when the owner starts the node, every
//!   [`FABRIC_REFRESH`] after ([`Action::ReadGpuFabric`]: health changes come with no event),
//!   and at once when the driver posts CLIQUE_ID_CHANGE. The event's new clique is recorded
//!   before the read answers, so a report right after the event shows it.
//! - The node's cliques (those of its GPUs whose probe completed) go in its hello. When they
//!   change, every peer whose link is CONNECTED is told ([`Action::SendCliques`]), and so is
//!   every peer whose link comes up later in this daemon's life: a hello built before the change
//!   may be the one that peer took, and the notification is idempotent, so a link that comes up
//!   after a change always gets it (one message per link-up, only once the cliques changed).
//! - A notification the owner could not hand to the session (it reports each,
//!   [`Node::handle_cliques_sent`]) is sent again at the next refresh while the link stays up;
//!   one handed over is delivered unless the session ends: then the next link-up tells, or, if
//!   the pair goes on over its other session (a handover, no link change), the peer is told
//!   again on that one as soon as it carries the pair.
//! - Each change counts an epoch, carried with the cliques in hellos and notifications. What
//!   each peer said of its cliques (its hello, [`Node::handle_peer_cliques`], then its
//!   notifications, [`Node::handle_session_cliques`]) is kept for the instance that said it,
//!   the highest epoch winning: a dial's answer built before a change can arrive after the
//!   notification of that change (they travel on different connections). A peer outside every
//!   clique of this node is worth a line: its memory imports here but does
//!   not map on this node's GPUs ([`Action::PeerCliques`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::{Action, Node, PeerId, PeerRequest, Timer};
use crate::gpu::GpuFabric;
use crate::ids::{InstanceId, NodeId};
use crate::mesh::Via;

/// How often the GPUs' probes are read again (health changes come with no event).
pub const FABRIC_REFRESH: Duration = Duration::from_secs(3);

/// Most cliques a peer may name to be believed: one per GPU, and a node has at most 64 GPUs.
pub const MAX_PEER_CLIQUES: usize = 64;

/// The view and what was told.
#[derive(Debug, Default)]
pub(super) struct Cliques {
    /// The GPUs as last read (with CLIQUE_ID_CHANGEs applied since).
    gpus: Vec<GpuFabric>,
    /// The cliques the peers were last told (the first read's go in every hello).
    told: Vec<u32>,
    /// How many times the cliques changed since the start (the first read is epoch 0): a
    /// link that comes up after a change is told.
    epoch: u64,
    /// Whether the probes were read once.
    read: bool,
    /// The node started: its hellos may have gone out with the cliques of [`Cliques::told`].
    started: bool,
    /// What each peer's instance last said of its cliques, with its epoch.
    peers: HashMap<NodeId, (InstanceId, u64, Vec<u32>)>,
    /// Peers a notification could not be handed to: told again at the next refresh.
    untold: BTreeSet<NodeId>,
    /// The session each peer was last told on (`None`: none carried the pair then). Ordered,
    /// so the peers told again after a handover are told in the same order every run.
    told_on: BTreeMap<NodeId, Option<Via>>,
}

/// The cliques of `gpus`: those whose probe completed, sorted, once each.
pub fn cliques_of(gpus: &[GpuFabric]) -> Vec<u32> {
    let set: BTreeSet<u32> = gpus
        .iter()
        .filter(|g| g.state == "COMPLETED")
        .map(|g| g.clique_id)
        .collect();
    set.into_iter().collect()
}

impl Node {
    /// The node's GPUs on the fabric as last read.
    pub fn gpus(&self) -> &[GpuFabric] {
        &self.cliques.gpus
    }

    /// The node's cliques: what its hello carries.
    pub fn cliques(&self) -> Vec<u32> {
        cliques_of(&self.cliques.gpus)
    }

    /// How many times the node's cliques changed since its start: its hello carries it with
    /// [`Node::cliques`].
    pub fn cliques_epoch(&self) -> u64 {
        self.cliques.epoch
    }

    /// What `peer`'s instance known here last said of its cliques (`None`: nothing yet, or
    /// from an instance the mesh no longer knows).
    pub fn peer_cliques(&self, peer: NodeId) -> Option<&[u32]> {
        let (instance, _, cliques) = self.cliques.peers.get(&peer)?;
        let known = self.mesh.peer(peer).and_then(|(_, known)| known);
        (known == Some(*instance)).then_some(cliques.as_slice())
    }

    /// A read of the GPUs' fabric probes ([`Action::ReadGpuFabric`], or the owner's own read
    /// at start, before [`Node::handle_start`], so the first hello carries the cliques). A
    /// read that failed is not reported: the next one comes [`FABRIC_REFRESH`] after the last
    /// ask.
    pub fn handle_gpu_fabric(&mut self, _now: Instant, gpus: Vec<GpuFabric>) {
        for g in &gpus {
            let Some(before) = self.cliques.gpus.iter().find(|o| o.gpu == g.gpu) else {
                continue;
            };
            if before.health_summary != g.health_summary || before.health_mask != g.health_mask {
                self.actions.push_back(Action::GpuHealthChanged {
                    gpu: g.gpu,
                    from: (before.health_summary.clone(), before.health_mask),
                    to: (g.health_summary.clone(), g.health_mask),
                });
            }
        }
        self.cliques.gpus = gpus;
        self.cliques.read = true;
        if !self.cliques.started {
            // Read before the start: no hello went out yet, the first ones carry these.
            self.cliques.told = self.cliques();
            return;
        }
        self.tell_if_changed();
    }

    /// The node starts: the periodic reads begin (at once if the owner read nothing before).
    pub(super) fn cliques_start(&mut self, now: Instant) {
        self.cliques.started = true;
        match self.cliques.read {
            true => self.arm(now + FABRIC_REFRESH, Timer::FabricRefresh),
            false => self.ask_fabric(now),
        }
    }

    /// CLIQUE_ID_CHANGE for `gpu`: recorded at once, and a full read asked for.
    pub(super) fn clique_id_changed(&mut self, now: Instant, gpu: u32, clique_id: u32) {
        let from = (self.cliques.gpus.iter_mut())
            .find(|g| g.gpu == gpu)
            .map(|g| std::mem::replace(&mut g.clique_id, clique_id));
        self.actions.push_back(Action::CliqueChanged {
            gpu,
            from,
            to: clique_id,
        });
        self.tell_if_changed();
        self.ask_fabric(now);
    }

    /// `from`'s hello (one this node accepted, or the answer to its own dial) said its
    /// cliques, at its clique `epoch`. Taken only from the instance the mesh knows.
    pub fn handle_peer_cliques(
        &mut self,
        _now: Instant,
        from: PeerId,
        cliques: &[u32],
        epoch: u64,
    ) {
        if self.knows(from) {
            self.peer_said(from, cliques, epoch, false);
        }
    }

    /// A peer's notification on session `via` that its cliques changed (at its clique
    /// `epoch`): taken from the peer the session proves (otherwise refused and counted, as any
    /// request there).
    pub fn handle_session_cliques(&mut self, _now: Instant, via: Via, cliques: &[u32], epoch: u64) {
        if let Some(from) = self.authenticate(via, None, PeerRequest::Cliques) {
            self.peer_said(from, cliques, epoch, true);
        }
    }

    fn peer_said(&mut self, from: PeerId, cliques: &[u32], epoch: u64, notified: bool) {
        if cliques.len() > MAX_PEER_CLIQUES {
            return;
        }
        let before = self.cliques.peers.get(&from.node);
        let before = before.filter(|(instance, ..)| *instance == from.instance);
        if let Some((_, seen, known)) = before {
            // Older than what that instance said already: a hello built before its change.
            if epoch < *seen || (epoch == *seen && known == cliques) {
                return;
            }
        }
        let theirs = cliques.to_vec();
        (self.cliques.peers).insert(from.node, (from.instance, epoch, theirs.clone()));
        let mine = self.cliques();
        // Unknown cliques (a node without GPUs, or an older daemon) say nothing.
        let shared =
            mine.is_empty() || theirs.is_empty() || theirs.iter().any(|c| mine.contains(c));
        self.actions.push_back(Action::PeerCliques {
            peer: from.node,
            cliques: theirs,
            shared,
            notified,
        });
    }

    /// Every peer with a CONNECTED link is told the new cliques, if they changed.
    fn tell_if_changed(&mut self) {
        let now_cliques = self.cliques();
        if now_cliques == self.cliques.told {
            return;
        }
        self.cliques.told = now_cliques;
        self.cliques.epoch += 1;
        let peers: Vec<NodeId> = self.mesh.config().map.ids().collect();
        for peer in peers {
            if self.connected(peer).is_some() {
                self.send_cliques(peer);
            }
        }
    }

    /// The notification [`Action::SendCliques`] to `peer` was handed to the pair's session
    /// (`sent`), or not (no session, or the session did not take it in time): then it goes
    /// again at the next refresh, or at the link-up if the link is down by then.
    pub fn handle_cliques_sent(&mut self, _now: Instant, peer: NodeId, sent: bool) {
        if !sent {
            self.cliques.untold.insert(peer);
        }
    }

    /// `peer`'s link came up: told the cliques if they changed since the first read.
    pub(super) fn cliques_link_up(&mut self, peer: NodeId) {
        self.cliques.untold.remove(&peer);
        if self.cliques.epoch > 0 {
            self.send_cliques(peer);
        }
    }

    /// After the mesh moved: a peer told on a session that no longer carries the pair while
    /// its link stays up (a handover to the pair's other session) may have lost the
    /// notification with that session, so it is told again on the one that carries it now.
    pub(super) fn cliques_carriers(&mut self) {
        if self.cliques.epoch == 0 || self.cliques.told_on.is_empty() {
            return;
        }
        for peer in self.moved_off(&self.cliques.told_on) {
            self.send_cliques(peer);
        }
    }

    /// The peers of `told_on` (each with the session it was last told on) whose pair another
    /// session carries now while their link stays up: what they were told may have gone with
    /// the old session.
    pub(super) fn moved_off(&self, told_on: &BTreeMap<NodeId, Option<Via>>) -> Vec<NodeId> {
        (told_on.iter())
            .filter(|(peer, via)| {
                let now = self.mesh.session_of(**peer);
                now.is_some() && now != **via && self.connected(**peer).is_some()
            })
            .map(|(peer, _)| *peer)
            .collect()
    }

    fn send_cliques(&mut self, peer: NodeId) {
        self.actions.push_back(Action::SendCliques {
            peer,
            cliques: self.cliques.told.clone(),
            epoch: self.cliques.epoch,
        });
        let via = self.mesh.session_of(peer);
        self.cliques.told_on.insert(peer, via);
    }

    /// Asks for a read now; the next periodic one comes [`FABRIC_REFRESH`] after.
    pub(super) fn ask_fabric(&mut self, now: Instant) {
        self.actions.push_back(Action::ReadGpuFabric);
        self.arm(now + FABRIC_REFRESH, Timer::FabricRefresh);
    }

    /// The refresh is due: read the probes, and tell again the connected peers a notification
    /// did not reach (those not connected are told at their link-up).
    pub(super) fn fabric_refresh(&mut self, now: Instant) {
        let untold = std::mem::take(&mut self.cliques.untold);
        for peer in untold {
            match self.connected(peer) {
                Some(_) => self.send_cliques(peer),
                None => {
                    self.cliques.untold.insert(peer);
                }
            }
        }
        self.ask_fabric(now);
    }
}
