//! An in-memory network of meshes in virtual time (raft-rs harness style): nodes can be
//! killed (sessions reset at once, like a kill -9 with TCP RST), hung (links cut silently, like
//! SIGSTOP or a partition) and restarted with a new instance.

#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use openimex_core::*;

pub mod node;

pub struct Net {
    pub now: Instant,
    pub start: Instant,
    pub nodes: Vec<Option<Mesh>>,
    /// Indices of the nodes running (so a map of 10,000 entries with a few live nodes is cheap).
    pub running: BTreeSet<usize>,
    /// Every node's node map, unless `maps` has its own.
    pub map: NodeMap,
    /// Node maps that differ from `map`, by node.
    pub maps: HashMap<usize, NodeMap>,
    pub quorum: QuorumPolicy,
    /// The dial budget of every node started from now on (`None`: the mesh's default).
    pub budget: Option<DialBudget>,
    /// (from, to) pairs whose packets are dropped silently.
    pub cut: HashSet<(usize, usize)>,
    /// Live sessions: (dialler, acceptor) -> (the dialler's attempt, the acceptor's conn).
    /// A pair may have two for a moment, until the rule picks one.
    pub sessions: HashMap<(usize, usize), (u64, ConnId)>,
    pub next_conn: ConnId,
    pub next_instance: u64,
    /// Every action each node emitted, in order.
    pub log: Vec<(usize, Action)>,
}

pub fn config(local: usize, map: NodeMap, instance: u64, quorum: QuorumPolicy) -> MeshConfig {
    MeshConfig {
        local: NodeId(u16::try_from(local).unwrap()),
        domain_id: map.derived_domain_id(),
        map,
        instance: InstanceId(instance),
        protocol_version: 1,
        quorum,
        heartbeat_interval: Duration::from_millis(500),
        peer_timeout: Duration::from_millis(3000),
        // As the daemon's: the peer timeout (kept within 0.5..5 s).
        dial_timeout: Duration::from_millis(3000),
        backoff: Backoff {
            min: Duration::from_millis(250),
            max: Duration::from_secs(5),
        },
        seed: instance,
    }
}

/// Reports the dial `attempt` of `m` to `peer` as refused: nothing listens there (the peer's
/// daemon is not running).
pub fn refused(m: &mut Mesh, now: Instant, peer: NodeId, attempt: u64) {
    m.handle_dial_failed(
        now,
        peer,
        attempt,
        DialFailure::NotListening,
        "connection refused".into(),
    );
}

/// The dials among the actions `m` has queued (the rest are dropped).
pub fn dials(m: &mut Mesh) -> Vec<(NodeId, u64)> {
    std::iter::from_fn(|| m.poll_action())
        .filter_map(|a| match a {
            Action::Dial { peer, attempt } => Some((peer, attempt)),
            _ => None,
        })
        .collect()
}

pub fn hosts(n: usize) -> Vec<String> {
    (1..=n)
        .map(|i| format!("10.0.{}.{}", i / 250, i % 250 + 1))
        .collect()
}

impl Net {
    pub fn new(n: usize, quorum: QuorumPolicy) -> Self {
        // The virtual clock needs an origin; only offsets from it matter.
        #[allow(clippy::disallowed_methods)]
        let start = Instant::now();
        let map = NodeMap::new(hosts(n));
        Self {
            now: start,
            start,
            nodes: (0..n).map(|_| None).collect(),
            running: BTreeSet::new(),
            map,
            maps: HashMap::new(),
            quorum,
            budget: None,
            cut: HashSet::new(),
            sessions: HashMap::new(),
            next_conn: 1,
            next_instance: 1000,
            log: Vec::new(),
        }
    }

    pub fn id(i: usize) -> NodeId {
        NodeId(u16::try_from(i).unwrap())
    }

    pub fn start(&mut self, i: usize) {
        self.next_instance += 1;
        let map = self.maps.get(&i).unwrap_or(&self.map).clone();
        let cfg = config(i, map, self.next_instance, self.quorum);
        let mut m = Mesh::new(cfg, self.now);
        if let Some(b) = self.budget {
            m.set_dial_budget(b);
        }
        m.handle_start(self.now);
        self.nodes[i] = Some(m);
        self.running.insert(i);
        self.pump();
    }

    pub fn start_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.start(i);
        }
    }

    pub fn mesh(&self, i: usize) -> &Mesh {
        self.nodes[i].as_ref().expect("node is down")
    }

    /// kill -9: the process is gone; peers' sessions to it see a reset at once.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i] = None;
        self.running.remove(&i);
        let dead: Vec<_> = self
            .sessions
            .keys()
            .copied()
            .filter(|(a, b)| *a == i || *b == i)
            .collect();
        for (a, b) in dead {
            self.end_session(a, b, None, "connection reset");
        }
        self.pump();
    }

    /// Session (dialler `a`, acceptor `b`) ends; both ends but `closer` see it end.
    pub fn end_session(&mut self, a: usize, b: usize, closer: Option<usize>, why: &str) {
        let Some((attempt, conn)) = self.sessions.remove(&(a, b)) else {
            return;
        };
        let now = self.now;
        for (me, via) in [
            (
                a,
                Via::Dialled {
                    peer: Self::id(b),
                    attempt,
                },
            ),
            (b, Via::Accepted { conn }),
        ] {
            if closer != Some(me)
                && let Some(m) = self.nodes[me].as_mut()
            {
                m.handle_session_lost(now, via, why.into());
            }
        }
    }

    /// The session `via` names at node `a`: (dialler, acceptor) and its attempt and conn.
    pub fn find(&self, a: usize, via: Via) -> Option<((usize, usize), (u64, ConnId))> {
        match via {
            Via::Dialled { peer, attempt } => {
                let key = (a, peer.index());
                self.sessions
                    .get(&key)
                    .filter(|s| s.0 == attempt)
                    .map(|s| (key, *s))
            }
            Via::Accepted { conn } => self
                .sessions
                .iter()
                .find(|((_, to), s)| *to == a && s.1 == conn)
                .map(|(k, s)| (*k, *s)),
        }
    }

    /// The same session as node `b` (the other end) names it.
    pub fn other_end(key: (usize, usize), s: (u64, ConnId), at: usize) -> Via {
        if at == key.0 {
            Via::Accepted { conn: s.1 }
        } else {
            Via::Dialled {
                peer: Self::id(key.1),
                attempt: s.0,
            }
        }
    }

    /// How many sessions link `a` and `b`, either way.
    pub fn sessions_between(&self, a: usize, b: usize) -> usize {
        usize::from(self.sessions.contains_key(&(a, b)))
            + usize::from(self.sessions.contains_key(&(b, a)))
    }

    /// SIGSTOP / partition: nothing reaches `i` and nothing leaves it; no reset is seen.
    pub fn isolate(&mut self, i: usize) {
        for j in 0..self.nodes.len() {
            if j != i {
                self.cut.insert((i, j));
                self.cut.insert((j, i));
            }
        }
    }

    pub fn heal(&mut self) {
        self.cut.clear();
    }

    pub fn shutdown(&mut self, i: usize) {
        if let Some(m) = self.nodes[i].as_mut() {
            m.handle_shutdown(self.now);
        }
        self.pump();
        self.nodes[i] = None;
        self.running.remove(&i);
        let gone: Vec<_> = self
            .sessions
            .keys()
            .copied()
            .filter(|(a, b)| *a == i || *b == i)
            .collect();
        for k in gone {
            self.sessions.remove(&k);
        }
    }

    fn reachable(&self, a: usize, b: usize) -> bool {
        self.nodes.get(b).is_some_and(Option::is_some)
            && !self.cut.contains(&(a, b))
            && !self.cut.contains(&(b, a))
    }

    /// Perform every queued action until the network is quiet.
    pub fn pump(&mut self) {
        loop {
            let mut did = false;
            let running: Vec<usize> = self.running.iter().copied().collect();
            for a in running {
                while let Some(action) = self.nodes[a].as_mut().and_then(Mesh::poll_action) {
                    did = true;
                    self.log.push((a, action.clone()));
                    self.perform(a, action);
                }
            }
            if !did {
                return;
            }
        }
    }

    fn perform(&mut self, a: usize, action: Action) {
        let now = self.now;
        match action {
            Action::Dial { peer, attempt } => {
                let b = peer.index();
                if !self.reachable(a, b) {
                    // A stopped node refuses the connection; a cut one lets it time out.
                    let (failure, error) = match self.nodes.get(b).is_some_and(Option::is_some) {
                        true => (DialFailure::Other, "no answer within the dial timeout"),
                        false => (DialFailure::NotListening, "connection refused"),
                    };
                    self.nodes[a].as_mut().unwrap().handle_dial_failed(
                        now,
                        peer,
                        attempt,
                        failure,
                        error.into(),
                    );
                    return;
                }
                let hello_a = self.mesh(a).hello();
                let verdict = sim_hello(self.nodes[b].as_mut().unwrap(), now, &hello_a);
                let hello_b = self.mesh(b).hello();
                let ma = self.nodes[a].as_mut().unwrap();
                match verdict {
                    Verdict::Accept => {
                        let conn = self.next_conn;
                        self.next_conn += 1;
                        self.sessions.insert((a, b), (attempt, conn));
                        ma.handle_dial_ok(now, peer, attempt, &hello_b);
                        if self.sessions.contains_key(&(a, b)) {
                            // The dialler opens its session stream on the connection.
                            let mb = self.nodes[b].as_mut().unwrap();
                            if !mb.handle_session_opened(now, Self::id(a), hello_a.instance, conn) {
                                self.end_session(a, b, Some(b), "closed by the peer");
                            }
                        }
                    }
                    Verdict::Refuse { mismatch, detail } => {
                        ma.handle_dial_refused(now, peer, attempt, mismatch, detail)
                    }
                    Verdict::ShuttingDown => ma.handle_dial_failed(
                        now,
                        peer,
                        attempt,
                        DialFailure::Other,
                        "peer shutting down".into(),
                    ),
                    Verdict::MapNeeded => unreachable!("a hello with its entries is judged"),
                }
            }
            Action::SendHeartbeat { peer, via, answer } => {
                let b = peer.index();
                if let Some((key, s)) = self.find(a, via)
                    && self.reachable(a, b)
                {
                    // The pair's sign of life on both sides (one heartbeat per pair); the
                    // sender hears back only when it asked for an answer.
                    let there = Self::other_end(key, s, a);
                    self.nodes[b].as_mut().unwrap().handle_heartbeat(now, there);
                    if answer {
                        self.nodes[a].as_mut().unwrap().handle_heartbeat(now, via);
                    }
                }
            }
            Action::CloseSession { peer, via } => {
                if let Some((key, _)) = self.find(a, via) {
                    if self.reachable(a, peer.index()) {
                        self.end_session(key.0, key.1, Some(a), "closed by the peer");
                    } else {
                        // Behind a partition the other end never hears of it.
                        self.sessions.remove(&key);
                    }
                }
            }
            Action::SendGoodbye { peer, via } => {
                let b = peer.index();
                if self.reachable(a, b) && self.find(a, via).is_some() {
                    let inst = self.mesh(a).config().instance;
                    self.nodes[b].as_mut().unwrap().handle_goodbye(
                        now,
                        Self::id(a),
                        inst,
                        "shutting down",
                    );
                }
            }
            Action::InitDriver => self.nodes[a].as_mut().unwrap().handle_driver_ready(now),
            Action::LinkChanged { .. }
            | Action::PeerRestarted { .. }
            | Action::PeerLeft { .. }
            | Action::StateChanged { .. } => {}
        }
    }

    /// Advance virtual time to the next timer (at most `limit` ahead) and fire it.
    pub fn step(&mut self, limit: Instant) -> bool {
        let next = self
            .running
            .iter()
            .filter_map(|&i| self.nodes[i].as_ref().and_then(Mesh::poll_timeout))
            .min();
        let Some(next) = next.filter(|t| *t <= limit) else {
            self.now = self.now.max(limit);
            return false;
        };
        self.now = self.now.max(next);
        for &i in &self.running {
            let Some(m) = self.nodes[i].as_mut() else {
                continue;
            };
            if m.poll_timeout().is_some_and(|t| t <= self.now) {
                m.handle_timeout(self.now);
            }
        }
        self.pump();
        true
    }

    pub fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        let mut steps = 0;
        while self.step(until) {
            steps += 1;
            assert!(steps < 1_000_000, "runaway timers");
        }
    }

    /// Run until `pred` holds; returns the virtual time it took, or None after `max`.
    pub fn run_until(&mut self, max: Duration, pred: impl Fn(&Net) -> bool) -> Option<Duration> {
        let begin = self.now;
        let until = self.now + max;
        loop {
            if pred(self) {
                return Some(self.now - begin);
            }
            if !self.step(until) {
                return pred(self).then(|| self.now - begin);
            }
        }
    }

    pub fn cell(&self, from: usize, to: usize) -> ConnStatus {
        self.mesh(from).links()[to].status
    }

    pub fn all_up(&self) -> bool {
        let n = self.nodes.len();
        self.nodes.iter().all(|m| {
            m.as_ref().is_some_and(|m| {
                m.state() == DaemonState::Ready
                    && m.links().iter().all(|l| l.status == ConnStatus::Connected)
                    && m.links().len() == n
            })
        })
    }

    /// Dials node `from` made since the log began.
    pub fn dials_by(&self, from: usize) -> usize {
        self.log
            .iter()
            .filter(|(a, act)| *a == from && matches!(act, Action::Dial { .. }))
            .count()
    }

    pub fn dials_to(&self, target: usize) -> usize {
        self.log
            .iter()
            .filter(|(_, a)| matches!(a, Action::Dial { peer, .. } if peer.index() == target))
            .count()
    }
}

/// `hello` as a daemon's dial first sends it: the node map's entries left out (imexd's
/// `peer_client` sends them again, on a second stream of the connection, when the peer asks).
pub fn without_entries(hello: &Hello) -> Hello {
    Hello {
        node_map: Vec::new().into(),
        ..hello.clone()
    }
}

/// `hello`, as a daemon's dial sends it ([`without_entries`]), judged by `mesh`; then, if the
/// peer asks for the entries (its digest is not the hello's), the hello again with them.
fn sim_hello(mesh: &mut Mesh, now: Instant, hello: &Hello) -> Verdict {
    match mesh.handle_hello(now, &without_entries(hello)) {
        Verdict::MapNeeded => mesh.handle_hello(now, hello),
        verdict => verdict,
    }
}
