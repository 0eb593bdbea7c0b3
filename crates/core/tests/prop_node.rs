//! Property suite of a node's exporter side under hostile and disordered peer requests (issue
//! 10, item 6): imports and unimports replayed, out of order, on connections without a hello or
//! claiming another identity, from peers that restart, leave or vanish, with driver describes
//! landing late, twice or for requests never made. Node 0 of the single-node harness
//! (`sim/node.rs`) is fed by hand, and every action it emits is checked against a model:
//!
//! - every import and unimport request is answered exactly once, and nothing is answered that
//!   was not asked (no answer for an unknown request ID);
//! - a reference the driver took is released at most once, never one it did not take, and at
//!   once unless its import was answered OK: the references the node holds are exactly the
//!   imports answered OK and not released since (so a replayed unimport releases nothing
//!   twice, and a refused one releases nothing);
//! - describes in flight stay within the per-peer bound;
//! - when every importer says goodbye, nothing is held any more.
//!
//! The whole-domain simulation (`node_sim/`) checks the honest protocol under faults; this suite
//! checks what a dishonest or confused peer can make one node do.
//!
//! Each property runs [`CASES`] cases; `PROPTEST_CASES=N` runs `N` instead.

#[path = "prop_budget/mod.rs"]
mod prop_budget;

mod sim;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use openimex_core::node::Action;
use openimex_core::*;
use proptest::prelude::*;
use sim::node::Setup;

/// Cases in CI (each a sequence of up to 50 requests and events).
const CASES: u32 = 8_000;

/// Most describes in flight per importer in these runs.
const MAX_DESCRIBES: usize = 3;

/// How a request is sent: honestly on its peer's connection, claiming another identity, or on
/// a connection without a hello.
#[derive(Debug, Clone, Copy)]
enum Way {
    Honest,
    Anonymous,
    Lie,
    NoHello,
}

#[derive(Debug, Clone)]
enum Input {
    /// Peer `.0` (1 or 2) connects and says hello (its current instance).
    Connect(u16),
    /// Peer `.0` restarts: a new instance connects.
    Restart(u16),
    CloseConn(u16),
    Import(u16, u64, Way),
    Unimport(u16, u64, Way),
    /// The driver answers the `.0`-th describe in flight (or a request never made), OK or not.
    Described(usize, bool),
    Goodbye(u16, Way),
    Advance(u64),
    Shutdown,
}

fn input() -> impl Strategy<Value = Input> {
    let peer = 1u16..3;
    let event = 0u64..5;
    let way = prop_oneof![
        5 => Just(Way::Honest),
        2 => Just(Way::Anonymous),
        1 => Just(Way::Lie),
        1 => Just(Way::NoHello),
    ];
    prop_oneof![
        3 => peer.clone().prop_map(Input::Connect),
        1 => peer.clone().prop_map(Input::Restart),
        1 => peer.clone().prop_map(Input::CloseConn),
        8 => (peer.clone(), event.clone(), way.clone()).prop_map(|(p, e, w)| Input::Import(p, e, w)),
        5 => (peer.clone(), event, way.clone()).prop_map(|(p, e, w)| Input::Unimport(p, e, w)),
        6 => (0usize..6, proptest::bool::weighted(0.8)).prop_map(|(k, ok)| Input::Described(k, ok)),
        1 => (peer, way).prop_map(|(p, w)| Input::Goodbye(p, w)),
        2 => (0u64..20_000).prop_map(Input::Advance),
        1 => Just(Input::Shutdown),
    ]
}

/// Node 0 and the model of what it was asked and what it answered.
struct Harness {
    node: Node,
    now: std::time::Instant,
    hellos: Vec<Hello>,
    /// Each peer's current instance and connection.
    instance: HashMap<u16, u64>,
    conn: HashMap<u16, ConnId>,
    next_conn: ConnId,
    next_request: RequestId,
    next_ref: u64,
    imports: HashSet<RequestId>,
    unimports: HashSet<RequestId>,
    /// Describes asked for and not answered by the driver yet, in order.
    describing: Vec<RequestId>,
    described: HashSet<RequestId>,
    /// References the driver took and the node did not release.
    taken: HashSet<u64>,
    /// Of those, the ones whose import was answered OK.
    answered_ok: HashSet<u64>,
    stopped: bool,
}

impl Harness {
    fn new(grace: Option<Duration>) -> Self {
        let (node, now, hellos) = sim::node::node(Setup {
            max_describes: MAX_DESCRIBES,
            grace,
            ..Setup::default()
        });
        Self {
            node,
            now,
            hellos,
            instance: (1..3).map(|p| (p, 100 + u64::from(p))).collect(),
            conn: HashMap::new(),
            next_conn: 1,
            next_request: 1,
            next_ref: 1,
            imports: HashSet::new(),
            unimports: HashSet::new(),
            describing: Vec::new(),
            described: HashSet::new(),
            taken: HashSet::new(),
            answered_ok: HashSet::new(),
            stopped: false,
        }
    }

    fn start(&mut self) -> Result<(), TestCaseError> {
        self.node.handle_start(self.now);
        self.node.handle_driver_ready(self.now);
        self.drain().map(|_| ())
    }

    fn hello(&self, p: u16) -> Hello {
        let mut h = self.hellos[usize::from(p)].clone();
        h.instance = InstanceId(self.instance[&p]);
        h
    }

    /// The connection and claimed identity a request of peer `p` goes with.
    fn way(&mut self, p: u16, way: Way) -> (Via, Option<PeerId>) {
        let me = PeerId {
            node: NodeId(p),
            instance: InstanceId(self.instance[&p]),
        };
        let conn = self.conn.get(&p).copied().unwrap_or(0);
        match way {
            Way::Honest => (Via::Accepted { conn }, Some(me)),
            Way::Anonymous => (Via::Accepted { conn }, None),
            Way::Lie => {
                let other = 3 - p;
                let claimed = PeerId {
                    node: NodeId(other),
                    instance: InstanceId(self.instance[&other]),
                };
                (Via::Accepted { conn }, Some(claimed))
            }
            Way::NoHello => {
                self.next_conn += 1;
                (
                    Via::Accepted {
                        conn: self.next_conn + 10_000,
                    },
                    Some(me),
                )
            }
        }
    }

    fn connect(&mut self, p: u16) -> Result<(), TestCaseError> {
        let conn = self.next_conn;
        self.next_conn += 1;
        let hello = self.hello(p);
        let verdict = self.node.handle_session_hello(self.now, conn, true, &hello);
        self.drain()?;
        if verdict == Verdict::Accept {
            self.node.handle_session_opened(self.now, conn);
            self.conn.insert(p, conn);
        } else {
            prop_assert!(self.stopped, "honest hello refused: {verdict:?}");
        }
        Ok(())
    }

    fn apply(&mut self, input: &Input) -> Result<(), TestCaseError> {
        let now = self.now;
        let mut releases_allowed = true;
        match *input {
            Input::Connect(p) => {
                return self.connect(p).and_then(|()| self.drain().map(|_| ()));
            }
            Input::Restart(p) => {
                *self.instance.entry(p).or_default() += 10;
                return self.connect(p).and_then(|()| self.drain().map(|_| ()));
            }
            Input::CloseConn(p) => {
                if let Some(conn) = self.conn.remove(&p) {
                    self.node.handle_conn_closed(now, conn);
                }
            }
            Input::Import(p, event, way) => {
                let (via, claimed) = self.way(p, way);
                let request = self.next_request;
                self.next_request += 1;
                self.imports.insert(request);
                let import = ImportRequest {
                    import_event_id: event,
                    export_uuid: [u8::try_from(event).unwrap_or(0); 16],
                    index: 0,
                    channel: 0,
                };
                self.node
                    .handle_session_import(now, request, via, claimed, import);
            }
            Input::Unimport(p, event, way) => {
                let (via, claimed) = self.way(p, way);
                let request = self.next_request;
                self.next_request += 1;
                self.unimports.insert(request);
                // A request no session proves (or claiming another peer) releases nothing.
                releases_allowed = matches!(way, Way::Honest | Way::Anonymous);
                self.node
                    .handle_session_unimport(now, request, via, claimed, event);
            }
            Input::Described(k, ok) => {
                let request = match self.describing.len() {
                    0 => self.next_request + 1000,
                    n => self.describing.remove(k % n),
                };
                let result = if ok {
                    let r = self.next_ref;
                    self.next_ref += 1;
                    self.taken.insert(r);
                    Ok((r, sim::node::pages(r)))
                } else {
                    Err(ImportError::new(Status::ObjectNotFound, "no such export"))
                };
                let took = result.as_ref().ok().map(|(r, _)| *r);
                self.node.handle_described(now, request, result);
                self.drain()?;
                // A reference taken is handed out with an OK answer or given back at once.
                if let Some(r) = took {
                    prop_assert!(
                        self.answered_ok.contains(&r) || !self.taken.contains(&r),
                        "reference {r} for request {request} neither answered nor released"
                    );
                }
                return self.check();
            }
            Input::Goodbye(p, way) => {
                let (via, claimed) = self.way(p, way);
                releases_allowed = matches!(way, Way::Honest | Way::Anonymous);
                self.node.handle_session_goodbye(now, via, claimed, "bye");
            }
            Input::Advance(ms) => {
                let until = now + Duration::from_millis(ms);
                while let Some(at) = self.node.poll_timeout().filter(|&at| at <= until) {
                    self.now = at.max(self.now);
                    self.node.handle_timeout(self.now);
                    self.drain()?;
                }
                self.now = until;
            }
            Input::Shutdown => {
                self.stopped = true;
                self.node.handle_shutdown(now);
            }
        }
        let released = self.drain()?;
        prop_assert!(
            releases_allowed || released == 0,
            "{input:?} released {released} references"
        );
        self.check()
    }

    /// Drains the actions, checking each against the model; returns the references released.
    fn drain(&mut self) -> Result<usize, TestCaseError> {
        let mut released = 0;
        let mut dials = Vec::new();
        while let Some(a) = self.node.poll_action() {
            match a {
                Action::AnswerImport { request, answer } => {
                    prop_assert!(
                        self.imports.remove(&request),
                        "import {request} answered again"
                    );
                    if let Ok(p) = answer {
                        let r = p.pfns[0];
                        prop_assert!(self.taken.contains(&r), "answered with reference {r}");
                        self.answered_ok.insert(r);
                    }
                }
                Action::DescribeExport { request, .. } => {
                    prop_assert!(self.imports.contains(&request), "describe for {request}");
                    prop_assert!(self.described.insert(request), "{request} described twice");
                    self.describing.push(request);
                }
                Action::ReleaseExportRefs { refs, ack } => {
                    for r in refs {
                        prop_assert!(self.taken.remove(&r), "reference {r} released twice");
                        self.answered_ok.remove(&r);
                        released += 1;
                    }
                    if let Some(request) = ack {
                        prop_assert!(self.unimports.remove(&request), "unimport {request} acked");
                    }
                }
                Action::AnswerUnimport { request, released } => {
                    prop_assert!(!released);
                    prop_assert!(self.unimports.remove(&request), "unimport {request} again");
                }
                Action::RefuseUnimport { request, .. } => {
                    prop_assert!(self.unimports.remove(&request), "unimport {request} again");
                }
                Action::Mesh(mesh::Action::Dial { peer, attempt }) => dials.push((peer, attempt)),
                _ => {}
            }
        }
        // Our dials never reach anyone: the peers' sessions to us carry the pairs.
        for (peer, attempt) in dials {
            self.node.handle_dial_failed(
                self.now,
                peer,
                attempt,
                DialFailure::Other,
                "unreachable".into(),
            );
            released += self.drain()?;
        }
        Ok(released)
    }

    fn check(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(self.node.export_refs_held(), self.answered_ok.len());
        prop_assert_eq!(&self.taken, &self.answered_ok);
        prop_assert!(self.node.describes_in_flight() <= 2 * MAX_DESCRIBES);
        Ok(())
    }

    /// Lets every describe land, then every peer reconnect and say goodbye.
    fn finish(&mut self) -> Result<(), TestCaseError> {
        while !self.describing.is_empty() {
            self.apply(&Input::Described(0, true))?;
        }
        prop_assert!(
            self.imports.is_empty(),
            "unanswered imports {:?}",
            self.imports
        );
        prop_assert!(
            self.unimports.is_empty(),
            "unanswered unimports {:?}",
            self.unimports
        );
        if self.stopped {
            return Ok(());
        }
        for p in 1..3 {
            self.apply(&Input::Connect(p))?;
            self.apply(&Input::Goodbye(p, Way::Honest))?;
        }
        prop_assert_eq!(self.node.export_refs_held(), 0);
        prop_assert!(self.taken.is_empty(), "still taken: {:?}", self.taken);
        Ok(())
    }
}

proptest! {
    #![proptest_config(prop_budget::budget(CASES))]

    #[test]
    fn hostile_requests_keep_the_reference_books(
        grace in proptest::option::of(0u64..5_000),
        connect_first in any::<bool>(),
        inputs in proptest::collection::vec(input(), 0..50),
    ) {
        let mut h = Harness::new(grace.map(Duration::from_millis));
        h.start()?;
        if connect_first {
            h.apply(&Input::Connect(1))?;
            h.apply(&Input::Connect(2))?;
        }
        for input in &inputs {
            h.apply(input)?;
        }
        h.finish()?;
    }
}
