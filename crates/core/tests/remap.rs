//! The node map re-read while daemons run (SIGUSR1): a grown map dials the new node and leaves
//! every other link alone, daemons with the old and the new map accept each other during a
//! rolling reload, a differing common entry is still refused, and a shrunk or reordered map is
//! refused without changing anything. A placeholder entry (`0.0.0.0`) is never dialled, shows
//! INVALID, and its node joins once the entry is filled in. Deterministic, in virtual time.

mod sim;

use std::time::{Duration, Instant};

use openimex_core::*;
use sim::Net;

const SEC: Duration = Duration::from_secs(1);

fn map(n: usize) -> NodeMap {
    NodeMap::new(sim::hosts(n))
}

/// Actions node `from` emitted since log index `since`.
fn actions_since(net: &Net, from: usize, since: usize) -> Vec<Action> {
    net.log[since..]
        .iter()
        .filter(|(a, _)| *a == from)
        .map(|(_, act)| act.clone())
        .collect()
}

/// Whether `act` concerns `peer` (a dial, a closed session, a link change).
fn touches(act: &Action, peer: usize) -> bool {
    let p = NodeId(peer as u16);
    match act {
        Action::Dial { peer, .. }
        | Action::CloseSession { peer, .. }
        | Action::LinkChanged { peer, .. }
        | Action::PeerRestarted { peer, .. }
        | Action::PeerLeft { peer, .. } => *peer == p,
        _ => false,
    }
}

/// Re-reads node `i`'s map as `new`, the peers in `readdressed` at new addresses, and
/// performs what follows.
fn reload(
    net: &mut Net,
    i: usize,
    new: NodeMap,
    readdressed: &[NodeId],
) -> Result<Vec<NodeId>, MapRefusal> {
    let now = net.now;
    let reread = net.nodes[i]
        .as_mut()
        .expect("running")
        .handle_node_map(now, new, readdressed);
    net.pump();
    reread.map(|r| r.added)
}

/// `n` nodes started together, once every link is up.
fn formed(n: usize) -> Net {
    let mut net = Net::new(n, QuorumPolicy::None);
    net.start_all();
    net.run_until(10 * SEC, Net::all_up).expect("domain up");
    net
}

#[test]
fn a_grown_map_dials_the_new_node_and_leaves_other_links_untouched() {
    let mut net = formed(3);
    let sessions_before = net.sessions.clone();

    // Node 3 appears with the 4-entry file; the others still run the 3-entry map.
    net.nodes.push(None);
    net.maps.insert(3, map(4));
    net.start(3);
    net.run_for(SEC);
    assert_eq!(
        net.cell(3, 0),
        ConnStatus::Mismatch(Mismatch::NodeMap),
        "a node started with more entries waits for the others to reload"
    );

    let mark = net.log.len();
    assert_eq!(reload(&mut net, 0, map(4), &[]), Ok(vec![NodeId(3)]));
    assert_eq!(
        net.cell(0, 3),
        ConnStatus::Connected,
        "node 3 dialled at once"
    );
    assert_eq!(net.mesh(0).links().len(), 4);
    let after = actions_since(&net, 0, mark);
    for peer in [1, 2] {
        assert!(
            !after.iter().any(|a| touches(a, peer)),
            "node 0's link to {peer} must be left alone: {after:?}"
        );
        assert_eq!(
            net.sessions.get(&(0, peer)),
            sessions_before.get(&(0, peer))
        );
        assert_eq!(net.cell(0, peer), ConnStatus::Connected);
    }
    // The old-map peers keep their sessions with the reloaded node 0.
    for peer in [1, 2] {
        assert_eq!(
            net.sessions.get(&(peer, 0)),
            sessions_before.get(&(peer, 0))
        );
    }

    // The rest of the rolling reload: every link comes up, through the normal re-dial.
    for i in [1, 2] {
        assert_eq!(reload(&mut net, i, map(4), &[]), Ok(vec![NodeId(3)]));
    }
    net.run_until(30 * SEC, Net::all_up).expect("4 nodes up");
    for (a, b) in [(0, 1), (1, 2), (2, 0)] {
        assert_eq!(
            net.sessions.get(&(a, b)),
            sessions_before.get(&(a, b)),
            "{a}->{b}"
        );
    }
}

#[test]
fn old_and_new_maps_accept_each_other_during_a_rolling_reload() {
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let mut reloaded = Mesh::new(sim::config(0, map(3), 1, QuorumPolicy::None), now);
    let mut old = Mesh::new(sim::config(1, map(3), 2, QuorumPolicy::None), now);
    reloaded.handle_start(now);
    old.handle_start(now);
    assert_eq!(
        reloaded.handle_node_map(now, map(4), &[]).map(|r| r.added),
        Ok(vec![NodeId(3)])
    );
    assert_eq!(reloaded.hello().map_base_len, 3);
    assert_eq!(reloaded.hello().node_map.len(), 4);
    assert_eq!(old.handle_hello(now, &reloaded.hello()), Verdict::Accept);
    assert_eq!(reloaded.handle_hello(now, &old.hello()), Verdict::Accept);
    // The derived domain ID did not change with the map.
    assert_eq!(reloaded.hello().domain_id, old.hello().domain_id);
}

#[test]
fn a_differing_common_entry_is_still_refused() {
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let mut reloaded = Mesh::new(sim::config(0, map(3), 1, QuorumPolicy::None), now);
    reloaded.handle_start(now);
    assert!(reloaded.handle_node_map(now, map(4), &[]).is_ok());
    let mut hosts = sim::hosts(3);
    hosts[2] = "10.9.9.9".into();
    let mut other = Mesh::new(
        sim::config(1, NodeMap::new(hosts), 2, QuorumPolicy::None),
        now,
    );
    other.handle_start(now);
    for verdict in [
        other.handle_hello(now, &reloaded.hello()),
        reloaded.handle_hello(now, &other.hello()),
    ] {
        match verdict {
            Verdict::Refuse {
                mismatch: Mismatch::NodeMap,
                detail,
            } => assert!(detail.contains("entry 2"), "{detail}"),
            v => panic!("must refuse a differing entry: {v:?}"),
        }
    }
}

#[test]
fn an_edited_reordered_or_own_removed_map_is_refused_and_changes_nothing() {
    let mut net = formed(3);
    let hello = net.mesh(0).hello();
    let links = net.mesh(0).links();
    let mark = net.log.len();

    let mut swapped = sim::hosts(3);
    swapped.swap(1, 2);
    let moved = reload(&mut net, 0, NodeMap::new(swapped), &[]);
    assert!(
        matches!(
            moved,
            Err(MapRefusal::Moved {
                node: NodeId(1),
                to: NodeId(3),
                ..
            })
        ),
        "{moved:?}"
    );
    let mut edited = sim::hosts(3);
    edited[1] = "10.9.9.9".into();
    let changed = reload(&mut net, 0, NodeMap::new(edited), &[]);
    assert!(
        matches!(
            changed,
            Err(MapRefusal::Changed {
                node: NodeId(1),
                entry: 1,
                ..
            })
        ),
        "{changed:?}"
    );
    let own = reload(&mut net, 0, NodeMap::new(sim::hosts(3)[1..].to_vec()), &[]);
    assert!(
        matches!(
            own,
            Err(MapRefusal::OwnRemoved {
                node: NodeId(0),
                ..
            })
        ),
        "{own:?}"
    );
    assert_eq!(net.mesh(0).hello(), hello);
    assert_eq!(net.mesh(0).links(), links);
    assert!(actions_since(&net, 0, mark).is_empty());
}

/// A line removed from the nodes file (issue 31: "a removed line becomes a hole and nobody is
/// renumbered"): on each node that re-reads the file the removed node's session closes, its
/// link shows INVALID and is never dialled again, the nodes after it keep their IDs and their
/// sessions, and the removed node, still running with the old file, is refused when it dials.
#[test]
fn a_removed_line_becomes_a_hole_and_nobody_is_renumbered() {
    let mut net = formed(4);
    let sessions_before = net.sessions.clone();
    let mut file = sim::hosts(4);
    file.remove(1);
    for i in [0, 2, 3] {
        let mark = net.log.len();
        let reread = net.nodes[i].as_mut().expect("running").handle_node_map(
            net.now,
            NodeMap::new(file.clone()),
            &[],
        );
        net.pump();
        let reread = reread.expect("a removed line is accepted");
        assert_eq!(reread.removed, vec![NodeId(1)]);
        assert!(reread.added.is_empty() && !reread.file_in_step());
        let hosts = net.mesh(i).config().map.hosts().to_vec();
        assert_eq!(hosts[1], "0.0.0.0", "node 1 is a hole");
        assert_eq!(&hosts[2..], &sim::hosts(4)[2..], "nobody renumbered");
        assert_eq!(net.mesh(i).config().local, NodeId(i as u16));
        let after = actions_since(&net, i, mark);
        assert!(
            after.iter().any(|a| matches!(
                a,
                Action::CloseSession {
                    peer: NodeId(1),
                    ..
                }
            )),
            "node {i} closes its session with the removed node: {after:?}"
        );
        for peer in [0, 2, 3].into_iter().filter(|p| *p != i) {
            assert!(
                !after.iter().any(|a| touches(a, peer)),
                "node {i}'s link to {peer} must be left alone: {after:?}"
            );
        }
    }
    let dials = net.dials_to(1);
    net.run_for(20 * SEC);
    for i in [0, 2, 3] {
        assert_eq!(net.cell(i, 1), ConnStatus::Invalid, "node {i}");
        assert!(net.mesh(i).links()[1].reason.contains("removed"));
        assert_eq!(net.mesh(i).state(), DaemonState::Ready);
        for peer in [0, 2, 3].into_iter().filter(|p| *p != i) {
            assert_eq!(net.cell(i, peer), ConnStatus::Connected);
            assert_eq!(
                net.sessions.get(&(i, peer)),
                sessions_before.get(&(i, peer)),
                "{i}->{peer} untouched"
            );
        }
    }
    assert_eq!(net.dials_to(1), dials, "a hole is never dialled");
    // Node 1 still runs with the old file: it keeps dialling, and everyone refuses it.
    for peer in [0, 2, 3] {
        assert_ne!(net.cell(1, peer), ConnStatus::Connected, "1->{peer}");
    }
    // Its line written back in place: it joins again at its old ID.
    for i in [0, 2, 3] {
        assert_eq!(reload(&mut net, i, map(4), &[]), Ok(vec![NodeId(1)]));
    }
    net.run_until(30 * SEC, Net::all_up)
        .expect("the node comes back at its ID");
}

#[test]
fn a_readdressed_peer_is_redialled_and_the_others_are_not() {
    let mut net = formed(3);
    let before = net.sessions.clone();
    let mark = net.log.len();
    assert_eq!(reload(&mut net, 0, map(3), &[NodeId(2)]), Ok(vec![]));
    let after = actions_since(&net, 0, mark);
    assert!(
        after.iter().any(|a| matches!(
            a,
            Action::CloseSession {
                peer: NodeId(2),
                ..
            }
        )),
        "the session to the old address is closed: {after:?}"
    );
    assert!(
        after.iter().any(|a| matches!(
            a,
            Action::Dial {
                peer: NodeId(2),
                ..
            }
        )),
        "and the peer dialled again at once: {after:?}"
    );
    assert!(!after.iter().any(|a| touches(a, 1)), "{after:?}");
    assert_eq!(net.sessions.get(&(0, 1)), before.get(&(0, 1)));
    assert_ne!(net.sessions.get(&(0, 2)), before.get(&(0, 2)));
    assert_eq!(net.cell(0, 2), ConnStatus::Connected);
}

#[test]
fn a_node_rewrites_its_persist_record_under_the_grown_map_and_nothing_else() {
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let mut node = Node::new(
        NodeConfig {
            mesh: sim::config(0, map(2), 1, QuorumPolicy::None),
            import_timeout: 10 * SEC,
            max_describes_per_peer: 16,
            grace: None,
            recover_from: Vec::new(),
            recovery_wait: openimex_core::node::DEFAULT_RECOVERY_WAIT,
            conn_wait_timeout: None,
        },
        now,
    );
    node.handle_start(now);
    node.handle_driver_ready(now);
    while node.poll_action().is_some() {}
    assert_eq!(
        node.handle_node_map(now, map(3), &[]).map(|r| r.added),
        Ok(vec![NodeId(2)])
    );
    let actions: Vec<_> = std::iter::from_fn(|| node.poll_action()).collect();
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, node::Action::Persist { importers } if importers.is_empty())),
        "the record is keyed to the map: written again: {actions:?}"
    );
    assert!(
        actions.iter().any(|a| matches!(
            a,
            node::Action::Mesh(Action::Dial {
                peer: NodeId(2),
                ..
            })
        )),
        "{actions:?}"
    );
    // A refused map changes nothing, the record included.
    let mut swapped = sim::hosts(3);
    swapped.swap(1, 2);
    assert!(
        node.handle_node_map(now, NodeMap::new(swapped), &[])
            .is_err()
    );
    assert!(node.poll_action().is_none());
}

/// `n` entries with entry `hole` a placeholder (`0.0.0.0`).
fn map_with_placeholder(n: usize, hole: usize) -> NodeMap {
    let mut hosts = sim::hosts(n);
    hosts[hole] = "0.0.0.0".to_string();
    NodeMap::new(hosts)
}

#[test]
fn a_placeholder_is_never_dialled_shows_invalid_and_joins_once_filled_in() {
    for quorum in [QuorumPolicy::None, QuorumPolicy::Full] {
        let mut net = Net::new(3, quorum);
        net.map = map_with_placeholder(3, 2);
        net.start(0);
        net.start(1);
        net.run_for(5 * SEC);
        for i in 0..2 {
            assert_eq!(net.mesh(i).state(), DaemonState::Ready, "{quorum:?}");
            assert_eq!(net.cell(i, 1 - i), ConnStatus::Connected);
            assert_eq!(net.cell(i, 2), ConnStatus::Invalid);
            assert!(net.mesh(i).links()[2].reason.contains("placeholder"));
        }
        assert_eq!(net.dials_to(2), 0, "a placeholder is never dialled");

        // The placeholder filled in: node 0 reloads first (a rolling fill-in), then node 1.
        let full = map(3);
        assert_eq!(reload(&mut net, 0, full.clone(), &[]), Ok(vec![Net::id(2)]));
        assert_eq!(net.cell(0, 2), ConnStatus::NeverConnected);
        net.run_for(2 * SEC);
        assert_eq!(net.cell(0, 1), ConnStatus::Connected, "peers still agree");
        assert_eq!(reload(&mut net, 1, full.clone(), &[]), Ok(vec![Net::id(2)]));
        net.maps.insert(2, full);
        net.start(2);
        net.run_until(10 * SEC, Net::all_up)
            .expect("the filled-in node joins");
    }
}

#[test]
fn a_peer_claiming_a_placeholder_id_is_refused() {
    let mut net = Net::new(3, QuorumPolicy::None);
    net.map = map_with_placeholder(3, 2);
    net.maps.insert(2, map(3));
    net.start_all();
    net.run_for(5 * SEC);
    // Node 2 runs the filled-in map and dials the others; they have no node at ID 2.
    assert_eq!(net.cell(0, 2), ConnStatus::Invalid);
    assert_ne!(net.cell(2, 0), ConnStatus::Connected);
    assert_eq!(net.cell(0, 1), ConnStatus::Connected);
}

/// Entry 0 is the one the derived domain ID comes from: filling it in re-derives the ID, so
/// the reloaded daemons and one started on the filled-in file agree.
#[test]
fn filling_in_entry_0_re_derives_the_domain_id() {
    let mut net = Net::new(3, QuorumPolicy::None);
    net.map = map_with_placeholder(3, 0);
    net.start(1);
    net.start(2);
    net.run_for(5 * SEC);
    assert_eq!(net.cell(1, 2), ConnStatus::Connected);
    assert_eq!(net.cell(1, 0), ConnStatus::Invalid);
    let full = map(3);
    for i in [1, 2] {
        assert_eq!(reload(&mut net, i, full.clone(), &[]), Ok(vec![Net::id(0)]));
        assert_eq!(net.mesh(i).config().domain_id, full.derived_domain_id());
    }
    net.maps.insert(0, full);
    net.start(0);
    net.run_until(10 * SEC, Net::all_up)
        .expect("node 0 joins with the re-derived domain ID");
}

/// Entry 0's line deleted: the derived domain ID follows the aligned map's hole at entry 0
/// (what a daemon started on the file with the hole written as `0.0.0.0` derives), not the
/// file's new first line.
#[test]
fn deleting_entry_0_derives_the_domain_id_from_the_hole() {
    let mut net = formed(3);
    let file = NodeMap::new(sim::hosts(3)[1..].to_vec());
    let in_step = map_with_placeholder(3, 0);
    for i in [1, 2] {
        let reread = net.nodes[i]
            .as_mut()
            .expect("running")
            .handle_node_map(net.now, file.clone(), &[])
            .expect("a hole at entry 0");
        assert_eq!(reread.removed, vec![NodeId(0)]);
        assert_eq!(net.mesh(i).config().domain_id, in_step.derived_domain_id());
        assert_ne!(net.mesh(i).config().domain_id, file.derived_domain_id());
    }
}

/// A file of 10,000 entries is aligned in one pass (the daemon does it on its runtime thread,
/// so a scan of the rest of the file per entry, 50 million comparisons, would stall it): lines
/// removed at the start and further on become holes, an entry appended joins, a line
/// written in a different case is the same entry, and a moved line is still refused.
#[test]
fn a_ten_thousand_entry_file_is_aligned_with_holes_and_a_move_refused() {
    let n = 10_000;
    let running = map(n);
    let hosts = sim::hosts(n + 1);
    let removed = [0, 5_000, 9_000];
    let mut file: Vec<String> = (0..n)
        .filter(|i| !removed.contains(i))
        .map(|i| hosts[i].clone())
        .collect();
    file[1] = file[1].to_ascii_uppercase();
    file.push(hosts[n].clone());
    let local = NodeId(1);
    let r = running
        .reread(&NodeMap::new(file.clone()), local)
        .expect("aligned");
    let ids: Vec<NodeId> = removed.iter().map(|i| NodeId(*i as u16)).collect();
    assert_eq!(r.removed, ids);
    assert_eq!(r.added, vec![NodeId(n as u16)]);
    assert_eq!(r.map.len(), n + 1);
    for i in removed {
        assert!(r.map.is_placeholder(NodeId(i as u16)), "entry {i} a hole");
        assert_eq!(r.entry_of[i], None);
    }
    assert_eq!(r.map.host(NodeId(4_999)), Some(hosts[4_999].as_str()));
    assert_eq!(r.map.host(NodeId(5_001)), Some(hosts[5_001].as_str()));
    assert_eq!(r.entry_of[5_001], Some(4_999));
    // The first and the last kept entries swapped: a reorder, refused.
    let (first, last) = (1, file.len() - 2);
    file.swap(first, last);
    assert!(running.reread(&NodeMap::new(file), local).is_err());
}
