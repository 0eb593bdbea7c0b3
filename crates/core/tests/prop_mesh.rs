//! Property suite of the mesh engine (issue 10, item 6): random sequences of inputs — dials
//! answered ok, failed or refused (with the current attempt or a stale or made-up one), hellos
//! from random nodes and instances (some of another domain, map or protocol version), sessions
//! opened, lost and heartbeating on real and made-up connections, goodbyes, timers, shutdown —
//! never panic and keep the mesh's contract (`mesh.rs`): the actions it emits describe every
//! change of link and daemon state it makes, it dials only real peers, one attempt number at a
//! time, within its budget and never while stopping, a placeholder stays INVALID, a refused
//! hello changes no link, and the counters it reports agree with its links.
//!
//! Each property runs [`CASES`] cases; `PROPTEST_CASES=N` runs `N` instead.

#[path = "prop_budget/mod.rs"]
mod prop_budget;

#[path = "sim/mod.rs"]
mod sim;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openimex_core::*;
use proptest::prelude::*;

/// Cases in CI (each a sequence of up to 60 inputs).
const CASES: u32 = 10_000;

/// How a hello differs from the honest one of its node.
#[derive(Debug, Clone, Copy)]
enum Lie {
    None,
    Domain,
    Version,
    Map,
    /// Leaves the node map's entries out, as a daemon's dial does: its digest decides.
    Entries,
    /// Another map's digest, its entries left out: an inbound one is asked for them.
    MapEntries,
    /// Claims another node ID than the one dialled.
    Node(u16),
}

#[derive(Debug, Clone)]
enum Input {
    Start,
    DriverReady,
    Shutdown,
    /// `attempt`: `None` answers the dial in flight, `Some(k)` a made-up attempt.
    DialOk(u16, Option<u64>, u64, Lie),
    DialFailed(u16, Option<u64>),
    DialRefused(u16, Option<u64>, Mismatch),
    /// Hello from node `.0`, instance `.1`, then its session on a new connection if `.3`.
    Hello(u16, u64, Lie, bool),
    /// A session on connection `.2` (maybe never greeted) claiming node `.0` instance `.1`.
    Opened(u16, u64, u64),
    /// Session `.0`-th of those seen (or a made-up one) lost / heartbeating.
    Lost(usize),
    Heartbeat(usize),
    Goodbye(u16, u64),
    Advance(u64),
}

fn input(n: u16) -> impl Strategy<Value = Input> {
    let peer = 0..n + 1;
    let attempt = proptest::option::weighted(0.2, 0u64..5);
    let inst = 0u64..3;
    let lie = prop_oneof![
        6 => Just(Lie::None),
        1 => Just(Lie::Domain),
        1 => Just(Lie::Version),
        1 => Just(Lie::Map),
        1 => Just(Lie::Entries),
        1 => Just(Lie::MapEntries),
        1 => (0..n + 1).prop_map(Lie::Node),
    ];
    let mismatch = proptest::sample::select(vec![
        Mismatch::NodeMap,
        Mismatch::Domain,
        Mismatch::Version,
        Mismatch::WrongNode,
    ]);
    prop_oneof![
        1 => Just(Input::Start),
        1 => Just(Input::DriverReady),
        1 => Just(Input::Shutdown),
        6 => (peer.clone(), attempt.clone(), inst.clone(), lie.clone())
            .prop_map(|(p, a, i, l)| Input::DialOk(p, a, i, l)),
        4 => (peer.clone(), attempt.clone()).prop_map(|(p, a)| Input::DialFailed(p, a)),
        1 => (peer.clone(), attempt, mismatch).prop_map(|(p, a, m)| Input::DialRefused(p, a, m)),
        5 => (peer.clone(), inst.clone(), lie, any::<bool>())
            .prop_map(|(p, i, l, s)| Input::Hello(p, i, l, s)),
        2 => (peer.clone(), inst.clone(), 0u64..4).prop_map(|(p, i, c)| Input::Opened(p, i, c)),
        3 => (0usize..8).prop_map(Input::Lost),
        3 => (0usize..8).prop_map(Input::Heartbeat),
        2 => (peer, inst).prop_map(|(p, i)| Input::Goodbye(p, i)),
        6 => (0u64..8000).prop_map(Input::Advance),
    ]
}

/// The driver of one mesh and the model of what its actions said.
struct Harness {
    mesh: Mesh,
    now: Instant,
    hellos: Vec<Hello>,
    local: NodeId,
    placeholders: HashSet<NodeId>,
    /// Link states as the `LinkChanged` actions told them.
    status: BTreeMap<NodeId, ConnStatus>,
    state: DaemonState,
    /// The last dial attempt per peer, and whether it is unanswered.
    dials: BTreeMap<NodeId, (u64, bool)>,
    vias: Vec<Via>,
    next_conn: ConnId,
}

impl Harness {
    fn new(n: u16, local: u16, holes: &[u16], quorum: QuorumPolicy, slots: usize) -> Self {
        let mut hosts = sim::hosts(usize::from(n));
        for &h in holes.iter().filter(|&&h| h != local) {
            hosts[usize::from(h)] = "0.0.0.0".to_owned();
        }
        let map = NodeMap::new(hosts);
        let now = sim::Net::new(1, quorum).now;
        let hellos = (0..n)
            .map(|i| Mesh::new(sim::config(usize::from(i), map.clone(), 100, quorum), now).hello())
            .collect();
        let mut mesh = Mesh::new(sim::config(usize::from(local), map.clone(), 7, quorum), now);
        if slots > 0 {
            mesh.set_dial_budget(DialBudget {
                burst: 2,
                interval: Duration::from_millis(300),
                max_in_flight: slots,
            });
        }
        let status = mesh.links().iter().map(|l| (l.node, l.status)).collect();
        Self {
            mesh,
            now,
            hellos,
            local: NodeId(local),
            placeholders: (0..n)
                .map(NodeId)
                .filter(|&id| map.is_placeholder(id))
                .collect(),
            status,
            state: DaemonState::Initializing,
            dials: BTreeMap::new(),
            vias: Vec::new(),
            next_conn: 1000,
        }
    }

    fn hello(&self, node: u16, instance: u64, lie: Lie) -> Hello {
        let n = self.hellos.len();
        let mut h = self.hellos[usize::from(node) % n].clone();
        h.node = NodeId(node);
        h.instance = InstanceId(instance);
        match lie {
            Lie::None => {}
            Lie::Domain => h.domain_id.push('x'),
            Lie::Version => h.protocol_version += 1,
            Lie::Map => {
                // Our own entry (never a placeholder) differs, consistently with the digest.
                let mut m = h.node_map.to_vec();
                m[self.local.index()] = "192.0.2.1".to_owned();
                h.digest = NodeMap::new(m.clone()).digest().to_owned();
                h.node_map = Arc::from(m);
            }
            Lie::Entries => h.node_map = Arc::from(Vec::new()),
            Lie::MapEntries => {
                h = self.hello(node, instance, Lie::Map);
                h.node_map = Arc::from(Vec::new());
            }
            Lie::Node(other) => h.node = NodeId(other),
        }
        h
    }

    /// The attempt an answer names: the one in flight, or a made-up one.
    fn attempt(&self, peer: NodeId, made_up: Option<u64>) -> u64 {
        made_up.unwrap_or_else(|| self.dials.get(&peer).map_or(1, |d| d.0))
    }

    fn answered(&mut self, peer: NodeId, attempt: u64) {
        if let Some(d) = self.dials.get_mut(&peer)
            && d.0 == attempt
        {
            d.1 = false;
        }
    }

    fn apply(&mut self, input: &Input) -> Result<(), TestCaseError> {
        let now = self.now;
        match *input {
            Input::Start => self.mesh.handle_start(now),
            Input::DriverReady => self.mesh.handle_driver_ready(now),
            Input::Shutdown => self.mesh.handle_shutdown(now),
            Input::DialOk(p, a, i, lie) => {
                let peer = NodeId(p);
                let attempt = self.attempt(peer, a);
                let hello = self.hello(p, i, lie);
                self.answered(peer, attempt);
                self.vias.push(Via::Dialled { peer, attempt });
                self.mesh.handle_dial_ok(now, peer, attempt, &hello);
            }
            Input::DialFailed(p, a) => {
                let peer = NodeId(p);
                let attempt = self.attempt(peer, a);
                self.answered(peer, attempt);
                sim::refused(&mut self.mesh, now, peer, attempt);
            }
            Input::DialRefused(p, a, m) => {
                let peer = NodeId(p);
                let attempt = self.attempt(peer, a);
                self.answered(peer, attempt);
                self.mesh
                    .handle_dial_refused(now, peer, attempt, m, "no".into());
            }
            Input::Hello(p, i, lie, open) => {
                let hello = self.hello(p, i, lie);
                let before = self.mesh.links();
                let verdict = self.mesh.handle_hello(now, &hello);
                // An inbound hello has no expected node: another ID is just another sender.
                let honest = matches!(lie, Lie::None | Lie::Entries | Lie::Node(_));
                let real = usize::from(hello.node.0) < self.hellos.len()
                    && hello.node != self.local
                    && !self.placeholders.contains(&hello.node);
                match verdict {
                    Verdict::Accept => prop_assert!(honest && real, "{hello:?} accepted"),
                    Verdict::ShuttingDown => {
                        prop_assert_eq!(self.mesh.state(), DaemonState::ShuttingDown)
                    }
                    // Only a hello whose entries decide and were left out, before anything
                    // else is judged of it but its protocol version.
                    Verdict::MapNeeded => {
                        prop_assert!(matches!(lie, Lie::MapEntries), "{hello:?}: {verdict:?}");
                        prop_assert_eq!(before, self.mesh.links());
                    }
                    Verdict::Refuse { .. } => {
                        prop_assert!(!(honest && real), "honest {hello:?} refused: {verdict:?}");
                        // Only our own dial may mark a link: a refused hello changes none.
                        prop_assert_eq!(before, self.mesh.links());
                    }
                }
                // The contract: a session is opened only on a connection whose hello was
                // accepted (the node's `sessions.rs` keeps it; `Opened` breaks it on purpose).
                if open && verdict == Verdict::Accept {
                    let conn = self.next_conn;
                    self.next_conn += 1;
                    if self
                        .mesh
                        .handle_session_opened(now, hello.node, hello.instance, conn)
                    {
                        self.vias.push(Via::Accepted { conn });
                    }
                }
            }
            Input::Opened(p, i, c) => {
                let conn = self.next_conn.saturating_sub(c);
                if self
                    .mesh
                    .handle_session_opened(now, NodeId(p), InstanceId(i), conn)
                {
                    self.vias.push(Via::Accepted { conn });
                }
            }
            Input::Lost(k) => {
                let via = self.via(k);
                self.mesh.handle_session_lost(now, via, "reset".into());
            }
            Input::Heartbeat(k) => {
                let via = self.via(k);
                self.mesh.handle_heartbeat(now, via);
            }
            Input::Goodbye(p, i) => self
                .mesh
                .handle_goodbye(now, NodeId(p), InstanceId(i), "bye"),
            Input::Advance(ms) => {
                let until = now + Duration::from_millis(ms);
                // The contract: handle_timeout once `now` reaches poll_timeout, actions drained.
                while let Some(at) = self.mesh.poll_timeout().filter(|&at| at <= until) {
                    self.now = at.max(self.now);
                    self.mesh.handle_timeout(self.now);
                    self.drain()?;
                }
                self.now = until;
            }
        }
        self.drain()?;
        self.check()
    }

    fn via(&self, k: usize) -> Via {
        self.vias
            .iter()
            .rev()
            .nth(k)
            .copied()
            .unwrap_or(Via::Accepted { conn: 1 })
    }

    /// Drains the actions, checking each against the model.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        while let Some(a) = self.mesh.poll_action() {
            match a {
                Action::Dial { peer, attempt } => {
                    prop_assert!(peer != self.local, "dialled itself");
                    prop_assert!(!self.placeholders.contains(&peer), "dialled a placeholder");
                    prop_assert!(usize::from(peer.0) < self.hellos.len(), "dialled {peer}");
                    prop_assert!(
                        self.state != DaemonState::ShuttingDown,
                        "dial while stopping"
                    );
                    let last = self.dials.get(&peer).map_or(0, |d| d.0);
                    prop_assert!(attempt > last, "attempt {attempt} after {last}");
                    self.dials.insert(peer, (attempt, true));
                }
                Action::LinkChanged { peer, from, to, .. } => {
                    let known = self.status.get(&peer).copied();
                    prop_assert_eq!(known, Some(from), "link {} changed from {:?}", peer, from);
                    prop_assert!(
                        !self.placeholders.contains(&peer),
                        "placeholder link changed"
                    );
                    self.status.insert(peer, to);
                }
                Action::StateChanged { from, to } => {
                    prop_assert_eq!(from, self.state);
                    prop_assert!(from != DaemonState::ShuttingDown, "left SHUTTING_DOWN");
                    self.state = to;
                }
                Action::SendHeartbeat { peer, via, .. } | Action::SendGoodbye { peer, via } => {
                    prop_assert_eq!(self.mesh.session_of(peer), Some(via));
                }
                Action::CloseSession { .. }
                | Action::PeerRestarted { .. }
                | Action::PeerLeft { .. }
                | Action::InitDriver => {}
            }
        }
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(self.mesh.state(), self.state);
        let links = self.mesh.links();
        let mut connected = 0;
        for l in &links {
            if l.node == self.local {
                prop_assert_eq!(l.status, ConnStatus::Connected);
                continue;
            }
            prop_assert_eq!(Some(&l.status), self.status.get(&l.node), "link {}", l.node);
            if self.placeholders.contains(&l.node) {
                prop_assert_eq!(l.status, ConnStatus::Invalid);
            }
            if l.status == ConnStatus::Connected {
                connected += 1;
            }
            if self.mesh.session_of(l.node).is_some() {
                prop_assert_eq!(l.status, ConnStatus::Connected, "session of {}", l.node);
            }
        }
        prop_assert_eq!(self.mesh.connected_peers(), connected);
        let unanswered = self.dials.values().filter(|d| d.1).count();
        let in_flight = self.mesh.dials_in_flight();
        prop_assert!(
            in_flight <= unanswered,
            "{in_flight} in flight, {unanswered} asked"
        );
        prop_assert!(in_flight <= self.mesh.dial_budget().max_in_flight);
        if let Some(at) = self.mesh.poll_timeout() {
            // A timer in the past would be a timer the contract can never satisfy late.
            prop_assert!(at + Duration::from_secs(3600) > self.now);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(prop_budget::budget(CASES))]

    #[test]
    fn random_inputs_keep_the_mesh_contract(
        n in 2u16..7,
        local in 0u16..7,
        holes in proptest::collection::vec(0u16..7, 0..2),
        quorum in proptest::sample::select(vec![
            QuorumPolicy::None, QuorumPolicy::Recovery, QuorumPolicy::Full,
        ]),
        slots in 0usize..3,
        inputs in proptest::collection::vec(input(6), 0..60),
    ) {
        let local = local % n;
        let holes: Vec<u16> = holes.into_iter().map(|h| h % n).collect();
        let mut h = Harness::new(n, local, &holes, quorum, slots);
        // Most runs start the daemon first, as the owner does.
        h.apply(&Input::Start)?;
        for input in &inputs {
            h.apply(input)?;
        }
        // Wind down: shutdown, then every timer; nothing is dialled any more.
        h.apply(&Input::Shutdown)?;
        h.apply(&Input::Advance(60_000))?;
    }
}

/// Found by the suite: a goodbye naming a placeholder entry marked its INVALID link
/// DISCONNECTED and scheduled dials to `0.0.0.0`.
#[test]
fn a_goodbye_naming_a_placeholder_changes_nothing() {
    let mut h = Harness::new(2, 1, &[0], QuorumPolicy::None, 0);
    let run = [Input::Start, Input::Goodbye(0, 0), Input::Advance(60_000)];
    for input in &run {
        if let Err(e) = h.apply(input) {
            panic!("{input:?}: {e}");
        }
    }
    assert_eq!(h.mesh.links()[0].status, ConnStatus::Invalid);
    assert!(h.dials.is_empty(), "{:?}", h.dials);
}
