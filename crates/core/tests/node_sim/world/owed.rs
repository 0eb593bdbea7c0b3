//! The deadlines a node decides and its daemon performs (core's `node/deadlines.rs`), as the
//! world performs them, and judged:
//! - every inbound connection is reported accepted; one without an accepted hello (a stranger
//!   that never says one, or a dial whose hello was not accepted) is closed by its node exactly
//!   at its hello deadline, never before, never one that said an accepted hello, never one that
//!   hung up already, and none stays open past it;
//! - a session stream opened on a connection must bring its hello in time too: one that stays
//!   silent is ended exactly at the deadline, never one whose hello came;
//! - a session a node closes is retired, not cut: what is in flight on it (both ways) still
//!   completes, and the peer still sees it open until it ends: once idle, or when the node
//!   ends it ([`Action::EndSession`]), never earlier than the retire wait and never open past
//!   it;
//! - a daemon shutting down exits only once its node stopped waiting for the goodbyes, which
//!   is never later than the goodbye wait.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use openimex_core::node::{GOODBYE_WAIT, HELLO_DEADLINE, RETIRE_WAIT};
use openimex_core::*;

use super::World;
use super::events::Ev;
use super::sessions::{Sess, SessKey};

/// An accepted connection without an accepted hello: (node, its instance, connection).
pub(super) type ConnKey = (usize, u64, ConnId);

/// A session retired by one or both of its ends.
#[derive(Debug, Clone)]
pub(super) struct Retired {
    pub(super) sess: Sess,
    /// When it was retired first.
    pub(super) since: Instant,
    /// The ends that retired it.
    pub(super) by: BTreeSet<usize>,
}

impl World {
    /// A connection from `from` reaches node `b` as `conn`: its daemon reports it, with the
    /// node of the map whose address that is (`from_node`), as the daemon looks it up.
    pub(super) fn conn_accepted(
        &mut self,
        b: usize,
        conn: ConnId,
        (from, from_node): (IpAddr, Option<usize>),
        stranger: bool,
    ) {
        let (Some(inst), now) = (self.inst(b), self.now) else {
            return;
        };
        self.unheard.insert((b, inst.0, conn), (now, stranger));
        let port = 40_000 + u16::try_from(conn % 20_000).unwrap_or(0);
        let peer = from_node.map(|a| NodeId(u16::try_from(a).unwrap()));
        self.node_mut(b)
            .handle_conn_accepted(now, conn, SocketAddr::new(from, port), peer);
    }

    /// A stranger opens a session stream at node `i` on a connection a peer proved, and says
    /// nothing on it; its hello comes late, or never.
    fn silent_stream(&mut self, i: usize, inst: InstanceId) {
        let now = self.now;
        let stream = self.next_stream;
        self.next_stream += 1;
        self.silent.insert((i, inst.0, stream), now);
        self.node_mut(i).handle_stream_opened(now, stream);
        if self.rng.chance(500) {
            let late = self.rng.ms(0, 12_000);
            self.push(
                now + late,
                Ev::StreamHeard {
                    node: i,
                    inst,
                    stream,
                },
            );
        }
    }

    /// The first frame of silent `stream` at node `i` arrives at last.
    pub(super) fn stream_heard(&mut self, i: usize, inst: InstanceId, stream: u64) {
        if self.inst(i) == Some(inst) && self.silent.remove(&(i, inst.0, stream)).is_some() {
            self.node_mut(i).handle_stream_heard(stream);
        }
    }

    /// Node `i` ends `stream` (its hello deadline passed).
    pub(super) fn close_stream(&mut self, i: usize, stream: u64) {
        let (now, inst) = (self.now, self.inst(i).unwrap());
        match self.silent.remove(&(i, inst.0, stream)) {
            None => self.violate(format!(
                "node {i}: ended session stream {stream} for want of a hello, which it had"
            )),
            Some(at) if now != at + HELLO_DEADLINE => self.violate(format!(
                "node {i}: ended session stream {stream} {:?} after it opened, not at the hello \
                 deadline ({HELLO_DEADLINE:?})",
                now - at
            )),
            Some(_) => self.stats.silent_streams_ended += 1,
        }
    }

    /// Node `b` accepted the hello on `conn`.
    pub(super) fn conn_heard(&mut self, b: usize, conn: ConnId) {
        if let Some(inst) = self.inst(b) {
            self.unheard.remove(&(b, inst.0, conn));
        }
    }

    /// `conn` at node `b` closed from the other side (or under it): whether its daemon reports
    /// it (not when its node closed it first).
    pub(super) fn conn_end_reported(&mut self, b: usize, inst: InstanceId, conn: ConnId) -> bool {
        self.unheard.remove(&(b, inst.0, conn));
        !self.closed_conns.remove(&(b, inst.0, conn))
    }

    /// Node `b` closes `conn` (its hello deadline passed).
    pub(super) fn close_conn(&mut self, b: usize, conn: ConnId) {
        let (now, inst) = (self.now, self.inst(b).unwrap());
        let key = (b, inst.0, conn);
        match self.unheard.remove(&key) {
            None => self.violate(format!(
                "node {b}: closed connection {conn} for want of a hello, which said an accepted \
                 hello or is closed already"
            )),
            Some((at, _)) if now != at + HELLO_DEADLINE => self.violate(format!(
                "node {b}: closed connection {conn} {:?} after its accept, not at the hello \
                 deadline ({HELLO_DEADLINE:?})",
                now - at
            )),
            Some(_) => {}
        }
        self.stats.hello_deadlines += 1;
        self.closed_conns.insert(key);
        // The daemon reports the end of a connection it closed as any other's.
        self.push(
            now,
            Ev::ConnClosed {
                node: b,
                inst,
                conn,
            },
        );
    }

    /// Strangers open connections to node `i` and never say hello; some hang up before the
    /// deadline, some after. Most come from no node of the map; one in four from a peer's
    /// address (a peer's connection lost before its hello, or another process on that host),
    /// which makes the node put its own dial to that peer off (`core::mesh` first round).
    pub fn strangers(&mut self, i: usize) {
        if !self.alive(i) {
            return;
        }
        let inst = self.inst(i).unwrap();
        for k in 0..1 + self.rng.below(4) {
            let conn = self.next_conn;
            self.next_conn += 1;
            let n = self.slots.len();
            let from = match n > 1 && self.rng.chance(250) {
                true => {
                    let j = (i + 1 + self.rng.below(n - 1)) % n;
                    (self.addr(j), Some(j))
                }
                false => (
                    IpAddr::V4(Ipv4Addr::new(10, 66, 0, u8::try_from(k).unwrap())),
                    None,
                ),
            };
            self.conn_accepted(i, conn, from, true);
            if self.rng.chance(300) {
                self.silent_stream(i, inst);
            }
            if self.rng.chance(500) {
                let gone = self.rng.ms(0, 12_000);
                let at = self.now + gone;
                self.push(
                    at,
                    Ev::ConnClosed {
                        node: i,
                        inst,
                        conn,
                    },
                );
            }
        }
    }

    /// Node `by` closed session `key` (`sess`): retired until idle or ended.
    pub(super) fn retire(&mut self, key: SessKey, sess: Sess, by: usize) {
        let now = self.now;
        let r = self.retired.entry(key).or_insert_with(|| Retired {
            sess,
            since: now,
            by: BTreeSet::new(),
        });
        if r.sess != sess {
            *r = Retired {
                sess,
                since: now,
                by: BTreeSet::new(),
            };
        }
        r.by.insert(by);
        self.end_if_idle(key);
    }

    /// Whether node `at` retired session `key` (`sess`): it answers no heartbeat on it.
    pub(super) fn retired_by(&self, key: SessKey, sess: Sess, at: usize) -> bool {
        self.retired
            .get(&key)
            .is_some_and(|r| r.sess == sess && r.by.contains(&at))
    }

    /// Whether an end retired session `key` (`sess`): it is ending.
    pub(super) fn retiring(&self, key: SessKey, sess: Sess) -> bool {
        self.retired.get(&key).is_some_and(|r| r.sess == sess)
    }

    /// A retired session with nothing in flight on it ends.
    pub(super) fn end_if_idle(&mut self, key: SessKey) {
        let Some(r) = self.retired.get(&key) else {
            return;
        };
        let (sess, by) = (r.sess, r.by.first().copied());
        if self.sessions.get(&key) != Some(&sess) {
            self.retired.remove(&key);
            return;
        }
        let busy = self.rpcs.values().any(|c| c.sess == Some((key, sess)));
        if !busy {
            self.note(|| format!("retired session {key:?} idle: it ends"));
            self.remove_session(key.0, key.1, by);
        }
    }

    /// Node `a` ends session `via` with `peer` (its retire wait is over).
    pub(super) fn end_session(&mut self, a: usize, peer: NodeId, via: Via) {
        let now = self.now;
        let Some((key, sess)) = self.find(a, peer.index(), via) else {
            return;
        };
        match self.retired.get(&key) {
            Some(r) if r.sess == sess && r.by.contains(&a) => {
                if now < r.since + RETIRE_WAIT {
                    self.violate(format!(
                        "node {a}: ended its retired session {via:?} {:?} after retiring it, \
                         before the retire wait ({RETIRE_WAIT:?})",
                        now - r.since
                    ));
                }
                self.stats.retired_ended += 1;
                self.remove_session(key.0, key.1, Some(a));
            }
            _ => self.violate(format!(
                "node {a}: ended session {via:?}, which it never closed"
            )),
        }
    }

    /// Node `i`'s shutdown stops waiting for its goodbyes.
    pub(super) fn goodbyes_over(&mut self, i: usize, unanswered: &[NodeId]) {
        let now = self.now;
        let Some(d) = self.slots[i].daemon.as_mut() else {
            return;
        };
        let (since, again) = (d.stopped_at, d.goodbyes_over);
        d.goodbyes_over = true;
        let exit = std::mem::take(&mut d.exit_due);
        let inst = d.instance;
        match since {
            None => self.violate(format!("node {i}: goodbye wait over without a shutdown")),
            Some(_) if again => self.violate(format!("node {i}: goodbye wait over twice")),
            Some(at) if now > at + GOODBYE_WAIT => self.violate(format!(
                "node {i}: waited {:?} for goodbyes, past the goodbye wait ({GOODBYE_WAIT:?})",
                now - at
            )),
            Some(_) => {}
        }
        if !unanswered.is_empty() {
            self.stats.goodbyes_unanswered += unanswered.len() as u64;
        }
        if exit {
            self.push(now, Ev::Exit { node: i, inst });
        }
    }

    /// What is owed and overdue: a connection without a hello open past its deadline, a
    /// retired session open past its wait, a shutdown still waiting for goodbyes past its.
    pub(super) fn check_owed(&mut self) {
        let now = self.now;
        let mut late = Vec::new();
        for (&(b, inst, conn), &(at, _)) in &self.unheard {
            if self.inst(b).map(|i| i.0) == Some(inst) && now > at + HELLO_DEADLINE {
                late.push(format!(
                    "node {b}: connection {conn} without a hello still open {:?} after its \
                     accept (deadline {HELLO_DEADLINE:?})",
                    now - at
                ));
            }
        }
        for (&(i, inst, stream), &at) in &self.silent {
            if self.inst(i).map(|x| x.0) == Some(inst) && now > at + HELLO_DEADLINE {
                late.push(format!(
                    "node {i}: session stream {stream} without its hello still open {:?} after \
                     it opened (deadline {HELLO_DEADLINE:?})",
                    now - at
                ));
            }
        }
        for (key, r) in &self.retired {
            if self.sessions.get(key) == Some(&r.sess) && now > r.since + RETIRE_WAIT {
                late.push(format!(
                    "retired session {key:?} still open {:?} after its retirement (wait \
                     {RETIRE_WAIT:?})",
                    now - r.since
                ));
            }
        }
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(d) = &s.daemon
                && let Some(at) = d.stopped_at
                && !d.goodbyes_over
                && now > at + GOODBYE_WAIT
            {
                late.push(format!(
                    "node {i}: still waiting for goodbyes {:?} after its shutdown",
                    now - at
                ));
            }
        }
        for v in late {
            self.violate(v);
        }
        // Reported once each.
        self.unheard
            .retain(|_, (at, _)| now <= *at + HELLO_DEADLINE);
        self.silent.retain(|_, at| now <= *at + HELLO_DEADLINE);
        let sessions = &self.sessions;
        self.retired
            .retain(|key, r| sessions.get(key) == Some(&r.sess) && now <= r.since + RETIRE_WAIT);
    }
}
