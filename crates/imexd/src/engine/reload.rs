//! The engine's side of SIGUSR1: hand the nodes file, read again and resolved (by
//! `nodes_file`), to the core node with the peer's address on each pair's live session; the
//! node aligns it with the running map without renumbering anyone (appended lines and
//! filled-in placeholder lines, `0.0.0.0`, join; a removed line becomes a hole; an edit, a
//! move or this node's own line removed is refused: core's `NodeMap::reread`) and decides
//! which peers are readdressed and dialled again (core's `node/remap.rs`); then switch the
//! engine's own copies of the map (dial targets, the services' view, the persist record's
//! key, our identity) to the aligned map and log one line saying what changed.

use std::net::IpAddr;
use std::sync::Arc;

use openimex_core::node::{Remapped, ResolvedNodes};
use openimex_core::{MapRefusal, NodeId, NodeMap};
use tracing::{error, info, warn};

use super::Engine;
use crate::mailbox::Reread;

impl Engine {
    /// Publish the node map's entries here whenever they change.
    pub(crate) fn publish_hosts(
        mut self,
        tx: tokio::sync::watch::Sender<Arc<Vec<String>>>,
    ) -> Self {
        self.hosts_tx = Some(tx);
        self
    }

    /// An outcome of `nodes_file`: the start-up baseline, a re-read, or why none was possible.
    pub(super) fn handle_reread(&mut self, now: std::time::Instant, reread: Reread) {
        let nodes = self.settings.hosts.len();
        let file = match reread.result {
            Ok(file) => file,
            Err(e) => {
                error!(
                    "SIGUSR1: cannot re-read the nodes file: {e}; fix the file and send SIGUSR1 again. The daemon keeps running with the node map it has ({nodes} nodes)"
                );
                return;
            }
        };
        if reread.initial {
            self.node.handle_nodes_resolved(file.addrs);
            return;
        }
        // Read before the node decides: a readdressed peer's session is closed as it does.
        let sessions = self.sessions_remote();
        let resolved = ResolvedNodes {
            map: NodeMap::new(file.hosts.clone()),
            addrs: file.addrs.clone(),
            sessions: sessions.clone(),
        };
        let remapped = match self.node.handle_nodes_file(now, resolved) {
            Ok(remapped) => remapped,
            Err(refusal) => {
                let line = refusal.entry().and_then(|e| file.lines.get(e).copied());
                let at = line.map(|l| format!(":{l}")).unwrap_or_default();
                let fix = match refusal {
                    MapRefusal::OwnRemoved { .. } => {
                        "stop this daemon (systemctl stop, or SIGTERM) to take this node out of the domain"
                    }
                    MapRefusal::Changed { .. } | MapRefusal::Moved { .. } => {
                        "put the existing lines back in their order; a node leaves by removing its line (or writing 0.0.0.0 on it), which leaves a hole, and joins by a line appended at the end or written over a 0.0.0.0 line; to renumber, change the file on every node and restart every daemon"
                    }
                };
                error!(
                    "nodes file {}{at} re-read (SIGUSR1) refused: {refusal}. A node's ID is its position among the entries and is baked into every export, so a running node is never renumbered. Fix: {fix}. The daemon keeps running with the node map it has ({nodes} nodes)",
                    file.path.display()
                );
                return;
            }
        };
        let hosts = Arc::new(self.node.mesh().config().map.hosts().to_vec());
        let summary = summary(&self.settings.hosts, &hosts, &remapped, &sessions);
        self.settings.hosts = hosts.to_vec();
        if let Some(writer) = &mut self.persist {
            writer.set_map(NodeMap::new(hosts.to_vec()));
        }
        self.me_cache = None;
        if let Some(tx) = &self.hosts_tx {
            tx.send_replace(Arc::clone(&hosts));
        }
        info!(
            "nodes file {} re-read (SIGUSR1): {summary}",
            file.path.display()
        );
        if !remapped.file_in_step {
            warn!(
                "nodes file {}: a removed line left a hole the file does not show, so a daemon started on this file would number the nodes after it differently from the running domain (and the two would refuse each other). Fix: write 0.0.0.0 where the line was{}",
                file.path.display(),
                running_map_hint(&hosts)
            );
        }
    }

    /// The peer's address on each pair's live session.
    fn sessions_remote(&self) -> Vec<(NodeId, IpAddr)> {
        self.settings
            .hosts
            .iter()
            .enumerate()
            .filter_map(|(i, _)| {
                let id = NodeId(u16::try_from(i).ok()?);
                Some((id, self.carrier_remote(id)?))
            })
            .collect()
    }
}

/// " (the running map is: a, 0.0.0.0, c)" for a short map, "" for a long one.
fn running_map_hint(hosts: &[String]) -> String {
    match hosts.len() <= 16 {
        true => format!(" (the running map is: {})", hosts.join(", ")),
        false => String::new(),
    }
}

/// One line: "1 node added (node 3 oimx-n3); node 1 (oimx-n1) now resolves to 127.0.0.9", or
/// "nothing changed". `was` and `now` are the running map's entries before and after.
fn summary(
    was: &[String],
    now: &[String],
    remapped: &Remapped,
    sessions: &[(NodeId, IpAddr)],
) -> String {
    let Remapped {
        added,
        removed,
        moved,
        redial,
        file_in_step: _,
    } = remapped;
    let host = |id: &NodeId| now.get(id.index()).map_or("?", String::as_str);
    let ips = |a: &[IpAddr]| {
        a.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut parts = Vec::new();
    if !added.is_empty() {
        let names: Vec<String> = added
            .iter()
            .map(|id| format!("node {id} {}", host(id)))
            .collect();
        let s = if added.len() == 1 { "" } else { "s" };
        parts.push(format!(
            "{} node{s} added ({})",
            added.len(),
            names.join(", ")
        ));
    }
    if !removed.is_empty() {
        let names: Vec<String> = removed
            .iter()
            .map(|id| {
                format!(
                    "node {id} {}",
                    was.get(id.index()).map_or("?", String::as_str)
                )
            })
            .collect();
        let s = if removed.len() == 1 { "" } else { "s" };
        parts.push(format!(
            "{} node{s} removed, a hole now: its ID is not reused and nobody is renumbered; lost here, its imports follow the lost-node rules ({})",
            removed.len(),
            names.join(", ")
        ));
    }
    for (id, addrs) in moved {
        let what = match redial.contains(id) {
            true => "re-dialling",
            false => "its live session stays",
        };
        parts.push(format!(
            "node {id} ({}) now resolves to {} ({what})",
            host(id),
            ips(addrs)
        ));
    }
    for id in redial
        .iter()
        .filter(|id| !moved.iter().any(|(m, _)| m == *id))
    {
        let old = sessions
            .iter()
            .find(|(s, _)| s == id)
            .map_or_else(|| "?".to_string(), |(_, ip)| ip.to_string());
        parts.push(format!(
            "node {id} ({}): its session went to {old}, which its entry no longer resolves to; re-dialling",
            host(id)
        ));
    }
    if parts.is_empty() {
        return "nothing changed".to_string();
    }
    parts.join("; ")
}
