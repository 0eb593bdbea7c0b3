//! The nodes file re-read while the daemon runs (SIGUSR1), set against the running map: which
//! entries stay, which lines were removed (holes), which were added, and what is refused.
//!
//! A node's ID is its entry's position, and node IDs are baked into every export's UUID, so a
//! running daemon's ID never changes. The file is aligned with the running map, never
//! renumbered:
//! - an entry the running map has, in the same order: it keeps its ID, wherever its line now
//!   is (lines removed above it do not move it);
//! - a line removed, or a real entry turned into a placeholder (`0.0.0.0`): a **hole**. The ID
//!   stays in the map as a placeholder, names no node, is never dialled, and is never given to
//!   another node by this daemon. Its node is lost to this daemon (the lost-node rules:
//!   grace, fence, release), and refused if it connects again;
//! - a placeholder filled in with an entry the running map does not have: the node joins at
//!   that ID (nobody ran there);
//! - entries after the last of the running map: appended, they join at the next IDs.
//!
//! Refused, changing nothing: an entry edited in place (or lines swapped), an entry moved to
//! the end (it would take another ID), and this node's own entry removed (a daemon cannot
//! stop being its node; it is stopped instead).
//!
//! A daemon started later numbers the file as it is: with a removed line, the entries after it
//! take other IDs there than in the running domain, and the two refuse each other (the node
//! maps differ, `NodeMap::accepts`). Writing the hole as a `0.0.0.0` line keeps the file and the
//! running domain in step; the daemon's log says so.

use std::collections::HashMap;
use std::fmt;

use super::{NodeMap, id_of, is_placeholder, same_entry};
use crate::ids::NodeId;

/// The entry a hole gets in the running map.
const HOLE: &str = "0.0.0.0";

/// What the file does with one entry of the running map.
#[derive(Clone, Copy)]
enum Step {
    /// The same entry: kept at its ID.
    Keep,
    /// A real entry written as a placeholder: a hole, its line kept.
    HoleInPlace,
    /// The line is gone: a hole (or a placeholder whose line went).
    HoleGone,
    /// A placeholder given an entry the running map does not have.
    Fill,
}

/// A re-read nodes file aligned with the running map (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reread {
    /// The new running map: the running map's IDs kept, holes as placeholders, additions.
    pub map: NodeMap,
    /// For each ID of `map`, the position of its entry in the file (`None`: a hole whose line
    /// was removed).
    pub entry_of: Vec<Option<usize>>,
    /// IDs that now name a node they did not: placeholders filled in, then appended entries.
    pub added: Vec<NodeId>,
    /// IDs whose node was removed (a line removed or turned into a placeholder): holes now.
    pub removed: Vec<NodeId>,
}

impl Reread {
    /// Whether the file itself holds the holes as placeholder lines: a daemon started on it
    /// numbers the nodes as the running domain does.
    pub fn file_in_step(&self) -> bool {
        self.entry_of
            .iter()
            .enumerate()
            .all(|(id, e)| *e == Some(id))
    }
}

impl NodeMap {
    /// Aligns `file` (the nodes file re-read, in file order) with this running map, for the
    /// daemon of node `local` (see the module doc). Unchanged entries give an unchanged map.
    pub fn reread(&self, file: &NodeMap, local: NodeId) -> Result<Reread, MapRefusal> {
        let (old, new) = (self.hosts(), file.hosts());
        let mut out = Reread {
            map: NodeMap::new(Vec::new()),
            entry_of: Vec::with_capacity(old.len().max(new.len())),
            added: Vec::new(),
            removed: Vec::new(),
        };
        let mut hosts: Vec<String> = Vec::with_capacity(old.len().max(new.len()));
        // Where each entry stands in both lists, so the alignment is one pass, not a scan of
        // the rest of a list per entry (10,000 entries are 50 million comparisons).
        let (last_in_new, last_in_old) = (last_index(new), last_index(old));
        let first_in_old = first_index(old);
        let last_placeholder_old = old.iter().rposition(|o| is_placeholder(o));
        let mut j = 0;
        for (i, was) in old.iter().enumerate() {
            let id = id_of(i);
            let next = new.get(j);
            // A running node's entry the file no longer has anywhere from here on.
            let absent =
                !is_placeholder(was) && (last_in_new.get(&entry_key(was))).is_none_or(|k| *k < j);
            let step = match next {
                Some(now)
                    if same_entry(was, now) || (is_placeholder(was) && is_placeholder(now)) =>
                {
                    Step::Keep
                }
                // Written as `0.0.0.0`: a hole the file shows.
                Some(now) if absent && is_placeholder(now) => Step::HoleInPlace,
                None => Step::HoleGone,
                // The line removed: the file's next entry is one further down the running map,
                // or a new one a placeholder further down takes. A running node's entry
                // replaced by a new one where no placeholder follows is an edit (below).
                Some(now)
                    if !is_placeholder(now)
                        && ((last_in_old.get(&entry_key(now))).is_some_and(|k| *k > i)
                            || (absent && last_placeholder_old.is_some_and(|k| k > i))) =>
                {
                    Step::HoleGone
                }
                Some(now) if is_placeholder(was) && !is_placeholder(now) => Step::Fill,
                Some(now) => {
                    // Edited in place, or a new entry inserted before one the file still has.
                    return Err(MapRefusal::Changed {
                        node: id,
                        was: was.clone(),
                        now: now.clone(),
                        entry: j,
                    });
                }
            };
            let removed =
                matches!(step, Step::HoleInPlace | Step::HoleGone) && !is_placeholder(was);
            if removed {
                if id == local {
                    return Err(MapRefusal::OwnRemoved {
                        node: id,
                        was: was.clone(),
                    });
                }
                out.removed.push(id);
            }
            if matches!(step, Step::Fill) {
                out.added.push(id);
            }
            match (step, next) {
                (Step::HoleGone, _) | (_, None) => {
                    let hole = if is_placeholder(was) {
                        was.as_str()
                    } else {
                        HOLE
                    };
                    hosts.push(hole.to_string());
                    out.entry_of.push(None);
                }
                (_, Some(now)) => {
                    hosts.push(now.clone());
                    out.entry_of.push(Some(j));
                    j += 1;
                }
            }
        }
        for (k, now) in new.iter().enumerate().skip(j) {
            let id = id_of(hosts.len());
            if !is_placeholder(now)
                && let Some(&from) = first_in_old.get(&entry_key(now))
            {
                return Err(MapRefusal::Moved {
                    node: id_of(from),
                    host: now.clone(),
                    entry: k,
                    to: id,
                });
            }
            if !is_placeholder(now) {
                out.added.push(id);
            }
            hosts.push(now.clone());
            out.entry_of.push(Some(k));
        }
        out.map = NodeMap::new(hosts);
        Ok(out)
    }
}

/// An entry as [`same_entry`] compares it: trimmed, case-insensitive.
fn entry_key(host: &str) -> String {
    host.trim().to_ascii_lowercase()
}

/// Each entry's last index in `hosts`.
fn last_index(hosts: &[String]) -> HashMap<String, usize> {
    (hosts.iter().enumerate())
        .map(|(i, h)| (entry_key(h), i))
        .collect()
}

/// Each entry's first index in `hosts`.
fn first_index(hosts: &[String]) -> HashMap<String, usize> {
    let mut first = HashMap::with_capacity(hosts.len());
    for (i, h) in hosts.iter().enumerate().rev() {
        first.insert(entry_key(h), i);
    }
    first
}

/// Why a re-read nodes file cannot replace the running map (nothing changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapRefusal {
    /// An entry edited in place, or lines swapped: node `node`'s entry `was` is `now` at
    /// position `entry` of the file.
    Changed {
        /// The first node whose entry changed.
        node: NodeId,
        /// Its entry in the running map.
        was: String,
        /// What the file has in its place.
        now: String,
        /// That entry's position in the file (0-based, among the entries).
        entry: usize,
    },
    /// Node `node`'s entry `host` is now after the running map's last entry, at position
    /// `entry` of the file: it would become node `to`.
    Moved {
        /// The node it is in the running map.
        node: NodeId,
        /// The entry.
        host: String,
        /// Its position in the file (0-based, among the entries).
        entry: usize,
        /// The ID it would get.
        to: NodeId,
    },
    /// This node's own entry was removed, or turned into a placeholder.
    OwnRemoved {
        /// This node.
        node: NodeId,
        /// Its entry.
        was: String,
    },
}

impl MapRefusal {
    /// The position, among the file's entries, of the entry at fault (for file:line).
    pub fn entry(&self) -> Option<usize> {
        match self {
            Self::Changed { entry, .. } | Self::Moved { entry, .. } => Some(*entry),
            Self::OwnRemoved { .. } => None,
        }
    }
}

impl fmt::Display for MapRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Changed { node, was, now, .. } => write!(
                f,
                "node {node}'s entry changed from {was:?} to {now:?} (edited or lines reordered)"
            ),
            Self::Moved { node, host, to, .. } => write!(
                f,
                "node {node} ({host:?}) moved after the last entry, where it would become node \
                 {to} (lines reordered)"
            ),
            Self::OwnRemoved { node, was } => write!(
                f,
                "this node's own entry (node {node}, {was:?}) is gone from the file; a running \
                 daemon keeps its node ID, so stop this daemon to take its node out of the domain"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(hosts: &[&str]) -> NodeMap {
        NodeMap::new(hosts.iter().map(ToString::to_string).collect())
    }

    fn hosts(r: &Reread) -> Vec<&str> {
        r.map.hosts().iter().map(String::as_str).collect()
    }

    const ME: NodeId = NodeId(0);

    #[test]
    fn the_same_entries_change_nothing_and_appended_ones_join() {
        let a = map(&["n0", "n1", "n2"]);
        let same = a.reread(&map(&["n0", "N1", "n2"]), ME).unwrap();
        assert_eq!((same.added.len(), same.removed.len()), (0, 0));
        assert_eq!(same.map.digest(), map(&["n0", "N1", "n2"]).digest());
        assert!(same.file_in_step());
        let grown = a.reread(&map(&["n0", "n1", "n2", "n3", "n4"]), ME).unwrap();
        assert_eq!(grown.added, vec![NodeId(3), NodeId(4)]);
        assert!(grown.removed.is_empty() && grown.file_in_step());
    }

    #[test]
    fn a_removed_line_becomes_a_hole_and_nobody_is_renumbered() {
        let a = map(&["n0", "n1", "n2", "n3"]);
        let r = a.reread(&map(&["n0", "n2", "n3"]), ME).unwrap();
        assert_eq!(hosts(&r), ["n0", "0.0.0.0", "n2", "n3"]);
        assert_eq!(r.removed, vec![NodeId(1)]);
        assert_eq!(r.entry_of, vec![Some(0), None, Some(1), Some(2)]);
        assert!(!r.file_in_step(), "the file numbers n2 and n3 differently");
        // The last line, and two lines at once, with a node appended.
        let r = a.reread(&map(&["n0", "n1", "n2"]), ME).unwrap();
        assert_eq!(hosts(&r), ["n0", "n1", "n2", "0.0.0.0"]);
        assert_eq!(r.removed, vec![NodeId(3)]);
        let r = a.reread(&map(&["n0", "n3", "n9"]), ME).unwrap();
        assert_eq!(hosts(&r), ["n0", "0.0.0.0", "0.0.0.0", "n3", "n9"]);
        assert_eq!(
            (r.removed.clone(), r.added.clone()),
            (vec![NodeId(1), NodeId(2)], vec![NodeId(4)])
        );
        // Entry 0 too (this daemon is node 2 here).
        let r = a.reread(&map(&["n1", "n2", "n3"]), NodeId(2)).unwrap();
        assert_eq!(hosts(&r), ["0.0.0.0", "n1", "n2", "n3"]);
        assert_eq!(r.removed, vec![NodeId(0)]);
    }

    #[test]
    fn a_line_turned_into_a_placeholder_is_a_hole_the_file_keeps() {
        let a = map(&["n0", "n1", "n2"]);
        let r = a.reread(&map(&["n0", "0.0.0.0", "n2"]), ME).unwrap();
        assert_eq!(hosts(&r), ["n0", "0.0.0.0", "n2"]);
        assert_eq!(r.removed, vec![NodeId(1)]);
        assert!(r.file_in_step());
        // A hole stays a hole when its line goes too, and is filled in like any placeholder.
        let holed = r.map;
        let r = holed.reread(&map(&["n0", "n2"]), ME).unwrap();
        assert_eq!(hosts(&r), ["n0", "0.0.0.0", "n2"]);
        assert!(r.removed.is_empty() && r.added.is_empty());
        let r = holed.reread(&map(&["n0", "n5", "n2"]), ME).unwrap();
        assert_eq!(hosts(&r), ["n0", "n5", "n2"]);
        assert_eq!(r.added, vec![NodeId(1)]);
    }

    #[test]
    fn a_line_removed_while_a_hole_is_filled_in_is_both() {
        // Node 2's hole filled in again while node 1's line goes (seed 791 of the chaos sim).
        let holed = map(&["n0", "n1", "0.0.0.0", "n3"]);
        let r = holed.reread(&map(&["n0", "n2", "n3"]), ME).unwrap();
        assert_eq!(hosts(&r), ["n0", "0.0.0.0", "n2", "n3"]);
        assert_eq!((r.removed, r.added), (vec![NodeId(1)], vec![NodeId(2)]));
        // An edit, in the middle or of the last line, is refused (not a removal and an
        // append: the file puts the new entry at the old one's position).
        let a = map(&["n0", "n1", "n2"]);
        assert!(matches!(
            a.reread(&map(&["n0", "n1", "x2"]), ME),
            Err(MapRefusal::Changed {
                node: NodeId(2),
                ..
            })
        ));
    }

    #[test]
    fn placeholders_are_filled_in_in_place() {
        let a = map(&["n0", "0.0.0.0", "n2", "0.0.0.0"]);
        assert_eq!(a.placeholders(), 2);
        assert!(a.is_placeholder(NodeId(1)) && !a.is_placeholder(NodeId(2)));
        assert!(!a.is_placeholder(NodeId(9)));
        let r = a.reread(&map(&["n0", "::", "n2", "0.0.0.0"]), ME).unwrap();
        assert!(r.added.is_empty() && r.removed.is_empty());
        let r = a
            .reread(&map(&["n0", "0.0.0.0", "n2", "n3", "n4"]), ME)
            .unwrap();
        assert_eq!(r.added, vec![NodeId(3), NodeId(4)]);
        let r = a.reread(&map(&["n0", "n1", "n2", "0.0.0.0"]), ME).unwrap();
        assert_eq!(r.added, vec![NodeId(1)]);
    }

    #[test]
    fn edits_moves_and_this_nodes_own_removal_are_refused() {
        let a = map(&["n0", "n1", "n2"]);
        let edited = a.reread(&map(&["n0", "x1", "n2"]), ME);
        let changed = MapRefusal::Changed {
            node: NodeId(1),
            was: "n1".into(),
            now: "x1".into(),
            entry: 1,
        };
        assert_eq!(edited, Err(changed.clone()));
        assert!(changed.to_string().contains("reordered"), "{changed}");
        // Swapped lines: n1 looks removed, then comes back after the end.
        let swapped = a.reread(&map(&["n0", "n2", "n1"]), ME);
        assert_eq!(
            swapped,
            Err(MapRefusal::Moved {
                node: NodeId(1),
                host: "n1".into(),
                entry: 2,
                to: NodeId(3),
            })
        );
        assert!(
            a.reread(&map(&["n0", "n2", "n1", "n3"]), ME).is_err(),
            "a swap with a node appended"
        );
        assert_eq!(swapped.unwrap_err().entry(), Some(2));
        let own = a.reread(&map(&["n1", "n2"]), ME).unwrap_err();
        assert!(
            matches!(
                own,
                MapRefusal::OwnRemoved {
                    node: NodeId(0),
                    ..
                }
            ),
            "{own}"
        );
        let own = a
            .reread(&map(&["n0", "0.0.0.0", "n2"]), NodeId(1))
            .unwrap_err();
        assert!(own.to_string().contains("stop this daemon"), "{own}");
        // A real entry the placeholder's position is given does not take another's place.
        let b = map(&["n0", "0.0.0.0", "n2"]);
        assert_eq!(
            hosts(&b.reread(&map(&["n0", "n2"]), ME).unwrap()),
            ["n0", "0.0.0.0", "n2"]
        );
    }
}
