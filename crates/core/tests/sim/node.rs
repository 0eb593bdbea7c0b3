//! One [`Node`] fed by hand: node 0 of a small domain and the hellos its peers would send, as
//! the node-level tests (grace, sessions, recovery, peer state) build it.

use std::time::{Duration, Instant};

use openimex_core::node::{Action, DEFAULT_RECOVERY_WAIT};
use openimex_core::*;

/// What differs between the node-level tests; [`Default`] is the common case.
pub struct Setup {
    /// Nodes in the map.
    pub nodes: usize,
    pub quorum: QuorumPolicy,
    pub grace: Option<Duration>,
    pub max_describes: usize,
    pub recover_from: Vec<NodeId>,
    pub recovery_wait: Duration,
    pub conn_wait_timeout: Option<Duration>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            nodes: 3,
            quorum: QuorumPolicy::None,
            grace: None,
            max_describes: 16,
            recover_from: Vec::new(),
            recovery_wait: DEFAULT_RECOVERY_WAIT,
            conn_wait_timeout: None,
        }
    }
}

/// Node 0 (instance 100), not started, and every node's hello (node `i` is instance 100 + i).
pub fn node(setup: Setup) -> (Node, Instant, Vec<Hello>) {
    // The virtual clock needs an origin; only offsets from it matter.
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let map = NodeMap::new(super::hosts(setup.nodes));
    let hellos = (0..setup.nodes)
        .map(|i| {
            let cfg = super::config(i, map.clone(), 100 + i as u64, setup.quorum);
            Mesh::new(cfg, now).hello()
        })
        .collect();
    let cfg = NodeConfig {
        mesh: super::config(0, map, 100, setup.quorum),
        import_timeout: Duration::from_secs(10),
        max_describes_per_peer: setup.max_describes,
        grace: setup.grace,
        recover_from: setup.recover_from,
        recovery_wait: setup.recovery_wait,
        conn_wait_timeout: setup.conn_wait_timeout,
    };
    (Node::new(cfg, now), now, hellos)
}

/// Node 0 of [`Setup::default`], started, its dial to node 2 refused and node 1's session up
/// (accepted on connection 1); what it did meanwhile.
pub fn with_node_1(mut n: Node, now: Instant, hellos: &[Hello]) -> (Node, Vec<Action>) {
    let started = start(&mut n, now);
    let to_2 = dial_attempt(&started, 2).expect("node 2 dialled at start");
    refused(&mut n, now, NodeId(2), to_2);
    assert_eq!(
        n.handle_session_hello(now, 1, true, &hellos[1]),
        Verdict::Accept
    );
    assert!(n.handle_session_opened(now, 1));
    let actions = drain(&mut n);
    (n, actions)
}

/// A job named `name` on `channel` with these member node IDs, owned by root.
pub fn job(name: &str, channel: u32, members: &[u16]) -> openimex_core::jobs::JobSpec {
    openimex_core::jobs::JobSpec {
        name: name.into(),
        channel,
        members: members.iter().map(|m| NodeId(*m)).collect(),
        owner: None,
    }
}

/// Starts `n` with its driver open; returns what it asked for (its dials among them).
pub fn start(n: &mut Node, now: Instant) -> Vec<Action> {
    n.handle_start(now);
    n.handle_driver_ready(now);
    drain(n)
}

/// Every pending action.
pub fn drain(n: &mut Node) -> Vec<Action> {
    std::iter::from_fn(|| n.poll_action()).collect()
}

/// The attempt of the dial to `peer` among `actions`.
pub fn dial_attempt(actions: &[Action], peer: u16) -> Option<u64> {
    actions.iter().find_map(|a| match a {
        Action::Mesh(mesh::Action::Dial { peer: p, attempt }) if p.0 == peer => Some(*attempt),
        _ => None,
    })
}

/// Who `h` says it is.
pub fn peer(h: &Hello) -> PeerId {
    PeerId {
        node: h.node,
        instance: h.instance,
    }
}

/// A one-page export's description.
pub fn pages(pfn: u64) -> Pages {
    Pages {
        size: 2 << 20,
        page_size: 2 << 20,
        pfns: vec![pfn],
        clique_id: 0,
        bw_mode: 0,
        bw_mode_epoch: 0,
        kind: 0,
        phys_addr_space: 0,
        compression_coverage: 0,
        mem_flags: 0,
    }
}

/// [`super::refused`] for a [`Node`]: the dial of `attempt` found nothing listening.
pub fn refused(n: &mut Node, now: Instant, peer: NodeId, attempt: u64) {
    n.handle_dial_failed(
        now,
        peer,
        attempt,
        DialFailure::NotListening,
        "connection refused".into(),
    );
}
