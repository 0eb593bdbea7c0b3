//! The invariants the world judges as it runs: every import validated or failed within its
//! timeout, a releaser never blocked for long, a validation only with pages a current exporter
//! sent for memory it still holds, no memory freed while another node maps it, and importers
//! of a peer that restarted or left disabled as soon as that is learned. At the end, with
//! everything released: nobody blocked, nothing leaked, every node's tables empty.

use std::fmt::Write as _;
use std::time::Duration;

use openimex_core::*;

use super::World;
use crate::driver::{DescState, parse_pages};

/// Driver-event delivery slack on top of the import timeout.
const SLACK: Duration = Duration::from_millis(1);

impl World {
    /// Once a node that learned a peer restarted or left has drained its actions, nothing it
    /// asked of the peer may still wait, and nothing may still map the old instance's memory.
    pub(super) fn check_gone(&mut self) {
        for (node, peer, new) in std::mem::take(&mut self.gone_checks) {
            let unanswered = self.slots[node].driver.pending_from(peer.index());
            if !unanswered.is_empty() {
                self.violate(format!(
                    "node {node}: learned that node {peer} is gone, but imports {unanswered:?} \
                     asked of it are still waiting (not failed at once)"
                ));
            }
            let stale = self.slots[node].driver.maps_from(peer.index(), new);
            if !stale.is_empty() {
                let how = match new {
                    Some(new) => format!("restarted as {new}"),
                    None => "left".to_string(),
                };
                self.violate(format!(
                    "node {node}: learned that node {peer} {how}, but imports {stale:?} still map \
                     memory of its previous instance (importers not disabled)"
                ));
            }
        }
    }

    pub(super) fn validate(&mut self, i: usize, event: u64, result: Result<Pages, Status>) {
        let answered_by = self.answered_by.remove(&(i, event));
        if let Ok(p) = &result {
            // The success must be one an exporter sent, from the instance this node knows now.
            let exporter = parse_pages(p).map_or(usize::MAX, |(n, _)| n);
            let known = self
                .node(i)
                .and_then(|n| n.mesh().peer(Self::id(exporter)))
                .and_then(|(_, inst)| inst);
            match answered_by {
                None => self.violate(format!(
                    "node {i}: import event {event} validated with pages no exporter sent for it"
                )),
                Some(_)
                    if !self
                        .ref_for
                        .iter()
                        .any(|((n, _), held)| *n == exporter && *held == (i, event)) =>
                {
                    self.violate(format!(
                        "node {i}: import event {event} validated, but node {exporter} holds no \
                         reference for it"
                    ));
                }
                Some(by) if Some(by) != known => self.violate(format!(
                    "node {i}: import event {event} validated with an answer from node {exporter} \
                     instance {by}, but this node knows instance {known:?}"
                )),
                Some(_) => {}
            }
        }
        match self.slots[i].driver.validate(event, &result, answered_by) {
            Err(e) => self.violate(format!("node {i}: {e}")),
            Ok(desc) => {
                if result.is_ok() {
                    self.stats.validated_ok += 1;
                } else {
                    self.stats.validated_err += 1;
                }
                let Ok(pages) = &result else { return };
                let Some((node, exp_id)) = parse_pages(pages) else {
                    self.violate(format!(
                        "node {i}: import event {event} validated with no pages"
                    ));
                    return;
                };
                if let Some((_, key)) = desc
                    && (key.0, key.1) != (node, exp_id)
                {
                    self.violate(format!(
                        "node {i}: import event {event} of export {:?} validated with the pages of \
                         node {node} export {exp_id}",
                        (key.0, key.1)
                    ));
                }
                let freed = self
                    .slots
                    .get(node)
                    .and_then(|s| s.driver.exports.get(&exp_id))
                    .is_none_or(|e| e.freed);
                if freed {
                    self.violate(format!(
                        "node {i}: import event {event} validated against released memory (node \
                         {node} export {exp_id})"
                    ));
                }
            }
        }
    }

    /// Export `exp_id` of `node` was freed: nobody may still map it, unless the exporter's own
    /// session teardown dropped the daemon's references on it (the daemon died: the driver
    /// disables fabric allocation, and importers are revoked once the restarted exporter is
    /// seen), or the mapping node is itself shutting down (its session teardown revokes them).
    pub fn on_freed(&mut self, node: usize, exp_id: u64, by_teardown: bool) {
        let dangled = self.slots[node]
            .driver
            .exports
            .get(&exp_id)
            .is_some_and(|e| e.dangled);
        self.note(|| {
            format!(
                "node {node}: export {exp_id} freed (teardown={by_teardown}, dangled={dangled})"
            )
        });
        if by_teardown || dangled {
            return;
        }
        for j in 0..self.p.n {
            let exiting = self.slots[j].daemon.as_ref().is_some_and(|d| d.exiting);
            let maps = self.slots[j].driver.maps(node, exp_id);
            if maps > 0 && !exiting {
                self.violate(format!(
                    "node {node}: export {exp_id} freed while node {j} still maps it ({maps} live \
                     imports)"
                ));
            }
        }
    }

    pub(super) fn check_deadlines(&mut self) {
        self.check_owed();
        let now = self.now;
        let import_by = self.p.import_timeout + SLACK;
        let unimport_by = self.p.import_timeout * 2 + SLACK;
        let mut late = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            for (e, (posted, _)) in &s.driver.pending {
                if now > *posted + import_by {
                    late.push((i, *e, true, now - *posted));
                }
            }
            for (u, w) in &s.driver.waiters {
                if now > w.since + unimport_by {
                    late.push((i, *u, false, now - w.since));
                }
            }
        }
        for (i, e, import, age) in late {
            if import {
                self.slots[i].driver.pending.remove(&e);
                self.violate(format!(
                    "node {i}: import event {e} neither validated nor failed after {age:?} \
                     (timeout {:?})",
                    self.p.import_timeout
                ));
            } else {
                self.slots[i].driver.waiters.remove(&e);
                self.violate(format!(
                    "node {i}: releaser of unimport event {e} still blocked after {age:?}"
                ));
            }
        }
    }

    /// Where the cliques disagree, if anywhere: a node's view against its GPUs' probes, or what
    /// a node knows of a connected peer's cliques against that peer's own (`node/cliques.rs`).
    pub fn cliques_disagree(&self) -> Option<String> {
        let n = self.p.n;
        for a in 0..n {
            let Some(node) = self.node(a) else { continue };
            let probes = openimex_core::node::cliques_of(&self.slots[a].driver.gpus);
            if node.cliques() != probes {
                return Some(format!(
                    "node {a} counts cliques {:?}, its GPUs' probes say {probes:?}",
                    node.cliques()
                ));
            }
            for b in (0..n).filter(|b| *b != a) {
                let Some(peer) = self.node(b) else { continue };
                let knows = node.peer_cliques(Self::id(b));
                if knows != Some(&peer.cliques()[..]) {
                    return Some(format!(
                        "node {a} knows node {b}'s cliques as {knows:?}, node {b} has {:?}",
                        peer.cliques()
                    ));
                }
            }
        }
        None
    }

    /// The checks once everything is released and the domain is quiet.
    pub fn final_check(&mut self) {
        let mut problems = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            problems.extend(
                s.driver
                    .describe_leaks()
                    .into_iter()
                    .map(|l| format!("leak: {l}")),
            );
            for (u, w) in &s.driver.waiters {
                problems.push(format!(
                    "node {i}: releaser of unimport event {u} (import {}) still blocked",
                    w.import_event_id
                ));
            }
            for e in s.driver.pending.keys() {
                problems.push(format!("node {i}: import event {e} never validated"));
            }
            for d in s.driver.descs.values() {
                if d.state == DescState::Pending {
                    problems.push(format!("node {i}: descriptor {:?} still pending", d.key));
                }
            }
            match s.daemon.as_ref() {
                Some(d) => {
                    let n = &d.node;
                    let mut line = String::new();
                    if n.export_refs_held() != 0 {
                        let _ = write!(line, " export_refs_held={}", n.export_refs_held());
                    }
                    if n.imports_known() != 0 {
                        let _ = write!(line, " imports_known={}", n.imports_known());
                    }
                    if n.describes_in_flight() != 0 {
                        let _ = write!(line, " describes_in_flight={}", n.describes_in_flight());
                    }
                    if !line.is_empty() {
                        problems.push(format!("node {i}: Node not empty at the end:{line}"));
                    }
                }
                None => problems.push(format!("node {i}: daemon down at the end")),
            }
        }
        for p in problems {
            self.violate(p);
        }
    }
}
