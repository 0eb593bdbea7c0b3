//! SIGUSR1 in the world: a node re-reads its nodes file and re-resolves every entry, and hands
//! the node what each entry resolves to now and the peer's address on each pair's live session
//! (as the daemon's sockets have it). Names move when a fault changes a node's address (a DNS
//! change, `chaos.rs`), and a resolver may fail for a moment. The node decides who is dialled
//! again; the world judges the outcome: afterwards no pair's live session goes to an address
//! its entry resolves elsewhere than (an entry that did not resolve keeps its session).
//!
//! The file is shared, and a node's line may be removed from it (issue 31: deleted, or written
//! as `0.0.0.0`) and later written back in place; every node re-reads it at a moment of its
//! own. The world judges that nobody is renumbered: after a re-read a node's map has every
//! present node at its ID and a hole (a placeholder) at each removed one, and a node whose own
//! line is gone refuses the file. A daemon started meanwhile reads the file with the holes
//! written as `0.0.0.0` (what the daemon's warning asks of the operator), or, when its own
//! line is gone, the file as it was (its copy not updated yet).

use std::net::{IpAddr, Ipv4Addr};

use openimex_core::node::ResolvedNodes;
use openimex_core::*;

use super::{Op, World};
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

    /// The nodes file as it stands: its entries, and the node of each (`None`: a `0.0.0.0`
    /// line).
    fn nodes_file(&self) -> (Vec<String>, Vec<Option<usize>>) {
        let hosts = sim::hosts(self.p.n);
        (0..self.p.n)
            .filter_map(|k| match self.line_out[k] {
                None => Some((hosts[k].clone(), Some(k))),
                Some(false) => Some(("0.0.0.0".to_string(), None)),
                Some(true) => None,
            })
            .unzip()
    }

    /// The map a daemon of node `i` starts with (module doc).
    pub fn start_map(&self, i: usize) -> NodeMap {
        let mut hosts = sim::hosts(self.p.n);
        if self.line_out[i].is_none() {
            for (k, h) in hosts.iter_mut().enumerate() {
                if self.line_out[k].is_some() {
                    *h = "0.0.0.0".to_string();
                }
            }
        }
        NodeMap::new(hosts)
    }

    /// Node `i`'s line is removed from the nodes file (deleted, or written as `0.0.0.0`), every
    /// node re-reads it at a moment of its own, and a while later the line is written back in
    /// its place and every node re-reads again (issue 31). One line at a time.
    pub fn line_removed(&mut self, i: usize) {
        if self.line_out.iter().any(Option::is_some) {
            return;
        }
        let deleted = self.rng.chance(500);
        self.note(|| {
            format!("FAULT node {i}'s line removed from the nodes file (deleted: {deleted})")
        });
        self.line_out[i] = Some(deleted);
        self.stats.lines_removed += 1;
        self.everyone_rereads();
        let back = self.rng.ms(1_000, 8_000);
        let now = self.now;
        self.schedule_op(now + back, Op::RestoreLines);
    }

    /// Every removed line written back in its place; every node re-reads the file at a moment
    /// of its own.
    pub fn restore_lines(&mut self) {
        if self.line_out.iter().all(Option::is_none) {
            return;
        }
        self.note(|| "removed lines written back in place".into());
        self.line_out.iter_mut().for_each(|l| *l = None);
        self.everyone_rereads();
    }

    pub fn everyone_rereads(&mut self) {
        let now = self.now;
        for k in 0..self.p.n {
            let at = self.rng.ms(0, 3_000);
            self.schedule_op(now + at, Op::Reread(k));
        }
    }

    /// SIGUSR1 on node `i` (a daemon that is up and not shutting down).
    pub fn reread(&mut self, i: usize) {
        if self.slots[i].daemon.as_ref().is_none_or(|d| d.exiting) {
            return;
        }
        let n = self.p.n;
        let (entries, of) = self.nodes_file();
        // Each entry resolves to the node's address now, or, for a moment, to nothing.
        let addrs: Vec<Vec<IpAddr>> = (of.iter())
            .map(|k| match (k, self.rng.chance(100)) {
                (Some(k), false) => vec![self.addr(*k)],
                _ => Vec::new(),
            })
            .collect();
        // By node: what the entry of each present node resolves to in this read.
        let by_node: Vec<Vec<IpAddr>> = (0..n)
            .map(|k| {
                (of.iter().position(|e| *e == Some(k)))
                    .map(|e| addrs[e].clone())
                    .unwrap_or_default()
            })
            .collect();
        let sessions = (0..n)
            .filter(|k| *k != i)
            .filter_map(|k| Some((Self::id(k), self.carrier_addr(i, k)?)))
            .collect();
        let file = ResolvedNodes {
            map: NodeMap::new(entries),
            addrs: addrs.clone(),
            sessions,
        };
        let now = self.now;
        let own_gone = self.line_out[i].is_some();
        match self.node_mut(i).handle_nodes_file(now, file) {
            Ok(r) if !own_gone => {
                self.stats.rereads += 1;
                self.stats.redialled += r.redial.len() as u64;
                self.stats.holes += r.removed.len() as u64;
                self.note(|| format!("node {i}: SIGUSR1 re-read {addrs:?}: {r:?}"));
            }
            Ok(r) => self.violate(format!(
                "node {i}: re-read a nodes file without its own line and took it: {r:?}"
            )),
            Err(MapRefusal::OwnRemoved { .. }) if own_gone => {
                self.note(|| format!("node {i}: SIGUSR1 re-read refused: its own line is gone"));
                return;
            }
            Err(e) => {
                self.violate(format!("node {i}: re-read refused: {e}"));
                return;
            }
        }
        // Nobody renumbered: every present node at its ID, a hole at each removed one.
        let map = self.node(i).map(|d| d.mesh().config().map.clone());
        for (k, host) in sim::hosts(n).iter().enumerate() {
            let Some(map) = &map else { break };
            let at = map.host(Self::id(k));
            let ok = match self.line_out[k] {
                None => at == Some(host.as_str()),
                Some(_) => map.is_placeholder(Self::id(k)),
            };
            if !ok {
                self.violate(format!(
                    "node {i}: after SIGUSR1 its map has {at:?} at node {k}, whose line is {:?}",
                    self.line_out[k]
                ));
            }
        }
        let addrs = by_node;
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

    /// Whether node `i`'s refusal is one a hole explains (issue 31): a hello naming a node
    /// whose entry is a placeholder in `i`'s map (its line was removed), a message such a node
    /// sent on a session that proved it before (it proves nothing more), or the two sides
    /// deriving the domain ID from entry 0 with and without its hole (a rolling reload of a
    /// removed line 0; the sim configures no domain ID).
    pub(super) fn hole_refusal(&self, i: usize, reason: &str, detail: &str) -> bool {
        let number = |after: &str| {
            let rest = &detail[detail.find(after)? + after.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u16>().ok()
        };
        let map = self.node(i).map(|d| &d.mesh().config().map);
        let hole =
            |k: Option<u16>| k.is_some_and(|k| map.is_some_and(|m| m.is_placeholder(NodeId(k))));
        match reason {
            "hello: wrong node" => hole(number("hello naming node ")),
            r if r.ends_with(": no session") => {
                detail.contains(" on our dial ") && hole(number(" from node "))
            }
            "hello: domain mismatch" => {
                let mut hosts = sim::hosts(self.p.n);
                let full = NodeMap::new(hosts.clone()).derived_domain_id();
                hosts[0] = "0.0.0.0".into();
                let holed = NodeMap::new(hosts).derived_domain_id();
                detail.contains(&full) && detail.contains(&holed)
            }
            _ => false,
        }
    }
}
