//! Sessions between nodes: a dial reaching its peer (or finding it dead, or timing out behind
//! a partition), the verdict on its hello coming back, the dialler's session stream opening at
//! the acceptor, heartbeats on a pair's session, and sessions ending (closed by one end, reset,
//! or lost behind a partition, which the client notices only after the peer timeout).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use openimex_core::*;

use super::events::Ev;
use super::{PEER_TIMEOUT, RETRANSMIT, World};

/// A session: `client` dialled `server` (the key in `World::sessions` names the nodes). RPCs
/// go both ways on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sess {
    /// The dialler's attempt.
    pub attempt: u64,
    /// The dialler's instance.
    pub client: InstanceId,
    /// The acceptor's instance.
    pub server: InstanceId,
    /// The inbound connection the acceptor knows it by.
    pub conn: ConnId,
    /// The dialler's address (where the acceptor's socket says the session comes from).
    pub client_addr: IpAddr,
    /// The address the dialler resolved the acceptor's entry to and connected to.
    pub server_addr: IpAddr,
}

/// (dialler, acceptor) of a session.
pub(super) type SessKey = (usize, usize);

impl Sess {
    /// The instance of node `at`, one end of session `key`.
    pub(super) fn inst_at(&self, key: SessKey, at: usize) -> InstanceId {
        if at == key.0 {
            self.client
        } else {
            self.server
        }
    }

    /// The address of the end other than `at` of session `key`, as `at`'s socket has it.
    pub(super) fn peer_addr(&self, key: SessKey, at: usize) -> IpAddr {
        if at == key.0 {
            self.server_addr
        } else {
            self.client_addr
        }
    }

    /// How node `at`, one end of session `key`, names it.
    pub(super) fn via_at(&self, key: SessKey, at: usize) -> Via {
        if at == key.1 {
            Via::Accepted { conn: self.conn }
        } else {
            Via::Dialled {
                peer: World::id(key.1),
                attempt: self.attempt,
            }
        }
    }
}

#[derive(Debug, Clone)]
pub(super) enum DialResult {
    /// The server's hello (with the cliques its identity named), and the inbound connection
    /// it accepted it on.
    Accept(Box<(Hello, Vec<u32>, u64)>, ConnId),
    Refused(Mismatch, String),
    ShuttingDown,
    /// Nothing listens there: the peer's daemon is not running.
    NotListening,
    /// The connect timed out (a partition).
    TimedOut,
}

impl World {
    /// A connection reset between `a` and `b` (a middlebox, a NIC flap): both sessions drop,
    /// their RPCs fail, both daemons see the reset and redial.
    pub fn reset(&mut self, a: usize, b: usize) {
        self.note(|| format!("sessions between {a} and {b} reset"));
        self.remove_session(a, b, None);
        self.remove_session(b, a, None);
    }

    /// Session (dialler `a`, acceptor `b`) ends: closed by `closer` (it knows; the other end
    /// sees the stream end), or reset (`None`: both ends see it). RPCs on it fail.
    pub(super) fn remove_session(&mut self, a: usize, b: usize, closer: Option<usize>) {
        let Some(s) = self.sessions.remove(&(a, b)) else {
            return;
        };
        self.note(|| format!("session {a}->{b} (attempt {}) ends", s.attempt));
        self.opened.remove(&((a, b), s.attempt));
        self.channels
            .retain(|k, _| !(k.0 == a && k.1 == b && k.2 == s.attempt));
        // RPCs on it fail; behind a partition only once the client would notice.
        let when = if self.is_cut(a, b) {
            self.now + PEER_TIMEOUT
        } else {
            self.now
        };
        let failed: Vec<u64> = self
            .rpcs
            .iter()
            .filter(|(_, r)| r.sess == Some(((a, b), s)))
            .map(|(id, _)| *id)
            .collect();
        for rpc in failed {
            self.push(
                when,
                Ev::RpcFailed {
                    rpc,
                    why: "connection lost",
                },
            );
        }
        if self.inst(b) == Some(s.server) {
            self.push(
                when,
                Ev::ConnClosed {
                    node: b,
                    inst: s.server,
                    conn: s.conn,
                },
            );
        }
        if closer != Some(a) {
            self.push(
                when,
                Ev::SessionLost {
                    a,
                    b,
                    attempt: s.attempt,
                    a_inst: s.client,
                },
            );
        }
    }

    /// The session node `a` names `via` (its peer is `b`), if it is still up.
    pub(super) fn find(&self, a: usize, b: usize, via: Via) -> Option<(SessKey, Sess)> {
        let key = match via {
            Via::Dialled { .. } => (a, b),
            Via::Accepted { .. } => (b, a),
        };
        let sess = *self.sessions.get(&key)?;
        (sess.via_at(key, a) == via).then_some((key, sess))
    }

    pub(super) fn dial_arrive(
        &mut self,
        a: usize,
        b: usize,
        attempt: u64,
        a_inst: InstanceId,
        sent: Instant,
    ) {
        let now = self.now;
        if self.inst(a) != Some(a_inst) {
            return;
        }
        let d = self.delay();
        if !self.reachable(a, b) {
            // A dead peer refuses at once; a partition times the connect out.
            let (wait, result) = if self.alive(b) {
                (Duration::from_millis(1000), DialResult::TimedOut)
            } else {
                (d, DialResult::NotListening)
            };
            self.push(
                now + wait,
                Ev::DialDone {
                    a,
                    b,
                    attempt,
                    a_inst,
                    sent,
                    result,
                },
            );
            return;
        }
        let hello_a = self.node(a).unwrap().mesh().hello();
        let cliques_a = self.node(a).unwrap().cliques();
        let epoch_a = self.node(a).unwrap().cliques_epoch();
        let conn = self.next_conn;
        self.next_conn += 1;
        let from = self.addr(a);
        self.conn_accepted(b, conn, (from, Some(a)), false);
        // The daemon's dial leaves its node map's entries out of the hello, and sends it again
        // with them, on a second stream of the connection, when the peer asks.
        let lite = crate::sim::without_entries(&hello_a);
        let mut verdict = (self.node_mut(b)).handle_session_hello(now, conn, true, &lite);
        if verdict == Verdict::MapNeeded {
            self.stats.maps_asked += 1;
            verdict = (self.node_mut(b)).handle_session_hello(now, conn, true, &hello_a);
        }
        if verdict == Verdict::Accept {
            self.conn_heard(b, conn);
            // The daemon hands the node the cliques the accepted hello named.
            let from = PeerId {
                node: hello_a.node,
                instance: hello_a.instance,
            };
            (self.node_mut(b)).handle_peer_cliques(now, from, &cliques_a, epoch_a);
        }
        let hello_b = self.node(b).unwrap().mesh().hello();
        let cliques_b = self.node(b).unwrap().cliques();
        let epoch_b = self.node(b).unwrap().cliques_epoch();
        let result = match verdict {
            Verdict::Accept => DialResult::Accept(Box::new((hello_b, cliques_b, epoch_b)), conn),
            Verdict::Refuse { mismatch, detail } => DialResult::Refused(mismatch, detail),
            Verdict::ShuttingDown => DialResult::ShuttingDown,
            Verdict::MapNeeded => unreachable!("a hello with its entries is judged"),
        };
        self.push(
            now + d,
            Ev::DialDone {
                a,
                b,
                attempt,
                a_inst,
                sent,
                result,
            },
        );
    }

    pub(super) fn dial_done(
        &mut self,
        a: usize,
        b: usize,
        attempt: u64,
        a_inst: InstanceId,
        sent: Instant,
        result: DialResult,
    ) {
        let now = self.now;
        if self.inst(a) != Some(a_inst) {
            return;
        }
        let peer = Self::id(b);
        // The daemon gives a dial up after its dial timeout: an answer later than that
        // is never taken (its connection is closed).
        let late = self
            .node(a)
            .is_some_and(|n| now - sent > n.mesh().config().dial_timeout);
        // The daemon asks its node whether this is the dial it waits for (engine: DialOk).
        let superseded = self
            .node(a)
            .is_some_and(|n| !n.mesh().dial_in_flight(peer, attempt));
        match result {
            DialResult::Accept(answer, conn) if superseded => {
                let hello = answer.0;
                // A late answer to an attempt the node no longer waits for: the daemon
                // drops it without telling its node (engine: DialOk) and closes the
                // connection; it never replaces the session held.
                self.push(
                    now,
                    Ev::ConnClosed {
                        node: b,
                        inst: hello.instance,
                        conn,
                    },
                );
            }
            DialResult::Accept(answer, conn)
                if !late && self.reachable(a, b) && self.inst(b) == Some(answer.0.instance) =>
            {
                let (hello, cliques, epoch) = *answer;
                self.remove_session(a, b, Some(a));
                let sess = Sess {
                    attempt,
                    client: a_inst,
                    server: hello.instance,
                    conn,
                    client_addr: self.addr(a),
                    server_addr: self.addr(b),
                };
                self.sessions.insert((a, b), sess);
                self.node_mut(a).handle_dial_ok(now, peer, attempt, &hello);
                // The daemon hands the node the cliques the answer named.
                let from = PeerId {
                    node: hello.node,
                    instance: hello.instance,
                };
                (self.node_mut(a)).handle_peer_cliques(now, from, &cliques, epoch);
                // The dialler opens its session stream on the connection.
                let d = self.delay() + self.extra(&self.cond.open_extra, (a, b));
                self.push(now + d, Ev::SessionOpen { key: (a, b), sess });
            }
            DialResult::Refused(m, detail) => {
                self.node_mut(a)
                    .handle_dial_refused(now, peer, attempt, m, detail);
            }
            DialResult::Accept(answer, conn) => {
                let hello = answer.0;
                // Accepted there, but the answer never made it back (or too late).
                let when = if self.is_cut(a, b) {
                    now + PEER_TIMEOUT
                } else {
                    now
                };
                self.push(
                    when,
                    Ev::ConnClosed {
                        node: b,
                        inst: hello.instance,
                        conn,
                    },
                );
                self.node_mut(a).handle_dial_failed(
                    now,
                    peer,
                    attempt,
                    DialFailure::Other,
                    "connection reset".into(),
                );
            }
            DialResult::NotListening => {
                self.node_mut(a).handle_dial_failed(
                    now,
                    peer,
                    attempt,
                    DialFailure::NotListening,
                    "connection refused".into(),
                );
            }
            DialResult::ShuttingDown | DialResult::TimedOut => {
                self.node_mut(a).handle_dial_failed(
                    now,
                    peer,
                    attempt,
                    DialFailure::Other,
                    "no answer".into(),
                );
            }
        }
    }

    pub(super) fn session_open(&mut self, key: SessKey, sess: Sess) {
        let now = self.now;
        let (a, b) = key;
        if self.sessions.get(&key) != Some(&sess) || self.inst(b) != Some(sess.server) {
            return;
        }
        if self.is_cut(a, b) {
            // The stream's first message: TCP retransmits it like any other.
            self.push(now + RETRANSMIT, Ev::SessionOpen { key, sess });
            return;
        }
        // The acceptor's daemon waits for the stream's first frame, the hello, which it
        // carries (`owed.rs` drives the stream that stays silent).
        let stream = self.next_stream;
        self.next_stream += 1;
        self.node_mut(b).handle_stream_opened(now, stream);
        self.node_mut(b).handle_stream_heard(stream);
        if self.node_mut(b).handle_session_opened(now, sess.conn) {
            self.opened.insert((key, sess.attempt));
        } else {
            self.note(|| format!("node {b}: closes the session {a} opened"));
            self.remove_session(a, b, Some(b));
        }
    }

    pub(super) fn heartbeat_arrive(
        &mut self,
        a: usize,
        b: usize,
        key: SessKey,
        sess: Sess,
        answer_in: Option<Duration>,
    ) {
        let now = self.now;
        // A heartbeat travels on the session's stream, behind its opening: the acceptor
        // neither sees nor answers one before the session opened there (requests may
        // come first: `Conditions::open_extra`).
        let unopened = b == key.1 && !self.opened.contains(&(key, sess.attempt));
        if self.sessions.get(&key) == Some(&sess)
            && !self.is_cut(a, b)
            && self.inst(b) == Some(sess.inst_at(key, b))
            && !unopened
        {
            match sess.via_at(key, b) {
                Via::Accepted { conn } => {
                    self.node_mut(b).handle_session_heartbeat(now, conn);
                }
                via => self.node_mut(b).handle_heartbeat(now, via),
            }
            // A retired session's end answers no heartbeat (the daemon's `SessionTx::retire`).
            if let Some(back) = answer_in
                && !self.retired_by(key, sess, b)
            {
                self.push(now + back, Ev::HeartbeatAck { a, b, key, sess });
            }
        }
    }

    pub(super) fn heartbeat_ack(&mut self, a: usize, b: usize, key: SessKey, sess: Sess) {
        let now = self.now;
        if self.sessions.get(&key) == Some(&sess) && !self.is_cut(a, b) {
            let via = sess.via_at(key, a);
            self.node_mut(a).handle_heartbeat(now, via);
        }
    }

    pub(super) fn session_lost(&mut self, a: usize, b: usize, attempt: u64, a_inst: InstanceId) {
        let now = self.now;
        if self.inst(a) == Some(a_inst) {
            self.node_mut(a).handle_session_lost(
                now,
                Via::Dialled {
                    peer: Self::id(b),
                    attempt,
                },
                "connection reset".into(),
            );
        }
    }
}
