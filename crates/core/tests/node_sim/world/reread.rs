//! SIGUSR1 in the world: a node re-reads its nodes file and re-resolves every entry, and hands
//! the node what each entry resolves to now and the peer's address on each pair's live session
//! (as the daemon's sockets have it). Names move when a fault changes a node's address (a DNS
//! change, `chaos.rs`), and a resolver may fail for a moment. The node decides who is dialled
//! again; the world judges the outcome: afterwards no pair's live session goes to an address
//! its entry resolves elsewhere than (an entry that did not resolve keeps its session).

use std::net::{IpAddr, Ipv4Addr};

use openimex_core::node::ResolvedNodes;
use openimex_core::*;

use super::World;
use crate::sim;

impl World {
    /// Node `i`'s address now: 10.9.<i>.<generation>.
    pub fn addr(&self, i: usize) -> IpAddr {
        let i = u8::try_from(i).unwrap();
        IpAddr::V4(Ipv4Addr::new(10, 9, i, self.addr_gen[usize::from(i)]))
    }

    /// The peer's address on the session that carries the pair of `i` with `k`, as `i` has it.
    fn carrier_addr(&self, i: usize, k: usize) -> Option<IpAddr> {
        let via = self.node(i)?.session_of(Self::id(k))?;
        let (key, sess) = self.find(i, k, via)?;
        Some(sess.peer_addr(key, i))
    }

    /// SIGUSR1 on node `i` (a daemon that is up and not shutting down).
    pub fn reread(&mut self, i: usize) {
        if self.slots[i].daemon.as_ref().is_none_or(|d| d.exiting) {
            return;
        }
        let n = self.p.n;
        // Each entry resolves to the node's address now, or, for a moment, to nothing.
        let addrs: Vec<Vec<IpAddr>> = (0..n)
            .map(|k| match self.rng.chance(100) {
                true => Vec::new(),
                false => vec![self.addr(k)],
            })
            .collect();
        let sessions = (0..n)
            .filter(|k| *k != i)
            .filter_map(|k| Some((Self::id(k), self.carrier_addr(i, k)?)))
            .collect();
        let file = ResolvedNodes {
            map: NodeMap::new(sim::hosts(n)),
            addrs: addrs.clone(),
            sessions,
        };
        let now = self.now;
        match self.node_mut(i).handle_nodes_file(now, file) {
            Ok(r) => {
                self.stats.rereads += 1;
                self.stats.redialled += r.redial.len() as u64;
                self.note(|| format!("node {i}: SIGUSR1 re-read {addrs:?}: {r:?}"));
            }
            Err(e) => self.violate(format!("node {i}: re-read of the same map refused: {e}")),
        }
        for k in (0..n).filter(|k| *k != i && !addrs[*k].is_empty()) {
            if let Some(at) = self.carrier_addr(i, k)
                && !addrs[k].contains(&at)
            {
                self.violate(format!(
                    "node {i}: after SIGUSR1 its session with node {k} still goes to {at}, which \
                     node {k}'s entry no longer resolves to ({:?})",
                    addrs[k]
                ));
            }
        }
        self.pump();
    }
}
