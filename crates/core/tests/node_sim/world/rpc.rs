//! RPCs on a session, both ways: each direction delivers in order (TCP), every message after a
//! random delay, lost or dropped as the conditions say and held back behind a partition. An RPC
//! whose session ends, or that a lost message leaves hanging, fails at its client.

use std::time::Instant;

use openimex_core::*;

use super::events::Ev;
use super::sessions::{Sess, SessKey};
use super::{RETRANSMIT, World};

/// How long the daemon waits for a session to take a notification (`engine/cliques.rs`).
const NOTIFY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcKind {
    Import(u64),
    Unimport(u64),
    Goodbye,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Rpc {
    pub(super) client: usize,
    pub(super) client_inst: InstanceId,
    pub(super) server: usize,
    /// The session it went out on.
    pub(super) sess: Option<(SessKey, Sess)>,
    pub(super) kind: RpcKind,
}

#[derive(Debug, Clone)]
pub enum Msg {
    ImportReq(ImportRequest),
    UnimportReq(u64),
    ImportResp(ImportAnswer),
    UnimportResp,
    /// The server refused the unimport (no session proves the sender there): not delivered.
    UnimportRefused,
    Goodbye,
    /// The goodbye was recorded (and the server's actions for it performed).
    GoodbyeResp,
    /// The goodbye was not believed (no session proves the sender there): not delivered.
    GoodbyeRefused,
    /// A notification of the sender's new cliques and their epoch (nothing answers it).
    Cliques(Vec<u32>, u64),
    /// The jobs the sender shares with the receiver, and the list's number (nothing answers
    /// it).
    Jobs(Vec<(String, String)>, u64),
}

/// One direction of a session: (dialler, acceptor, attempt, towards the acceptor).
pub(super) type ChannelKey = (usize, usize, u64, bool);

/// A message on the wire.
#[derive(Debug)]
pub(super) struct InFlight {
    ready: Instant,
    rpc: Option<u64>,
    msg: Msg,
}

impl World {
    /// Start an RPC from `client` to `server` on the pair's session `via` (as the client's
    /// node names it); it fails at once if there is none.
    pub(super) fn call(
        &mut self,
        client: usize,
        inst: InstanceId,
        server: usize,
        via: Option<Via>,
        kind: RpcKind,
        msg: Msg,
    ) {
        let rpc = self.next_rpc;
        self.next_rpc += 1;
        let sess = via.and_then(|via| self.find(client, server, via));
        self.rpcs.insert(
            rpc,
            Rpc {
                client,
                client_inst: inst,
                server,
                sess,
                kind,
            },
        );
        if sess.is_none() {
            self.push(
                self.now,
                Ev::RpcFailed {
                    rpc,
                    why: "not connected",
                },
            );
            return;
        }
        if let Some((key, _)) = sess {
            self.send(key, client, Some(rpc), msg);
        }
    }

    /// Send `from`'s cliques to `to` on the pair's session `via` (as `from`'s node names it),
    /// and report to `from` whether the session took it. A lost notification is the daemon's
    /// send that timed out (a session that stays up delivers what it took): reported as not
    /// sent after the daemon's notify timeout; with no session, at once.
    pub(super) fn notify(&mut self, from: usize, to: usize, via: Option<Via>, msg: Msg) {
        let inst = self.inst(from).unwrap();
        let jobs = matches!(msg, Msg::Jobs(..));
        let sent = match via.and_then(|via| self.find(from, to, via)) {
            Some((key, _)) => self.send(key, from, None, msg),
            None => false,
        };
        let at = match sent {
            true => self.now,
            false if via.is_none() => self.now,
            false => self.now + NOTIFY_TIMEOUT,
        };
        let peer = Self::id(to);
        let reported = Ev::NotifySent {
            node: from,
            inst,
            peer,
            sent,
            jobs,
        };
        self.push(at, reported);
    }

    /// Before `client` (instance `inst`) sends another import to `server`: the imports it has
    /// on the wire to `server` (sent, neither answered nor failed at the client yet) must be
    /// under its bound, counted here independently of the node's own count.
    pub(super) fn check_import_bound(&mut self, client: usize, inst: InstanceId, server: usize) {
        let on_wire = (self.rpcs.values())
            .filter(|r| r.client == client && r.client_inst == inst && r.server == server)
            .filter(|r| matches!(r.kind, RpcKind::Import(_)))
            .count();
        let max = self.p.max_imports_in_flight;
        if on_wire >= max {
            self.violate(format!(
                "node {client}: sends an import to node {server} with {on_wire} in flight there \
                 already (bound {max})"
            ));
        }
    }

    /// The server answers the request it knows as `request`.
    pub(super) fn respond(&mut self, server: usize, request: RequestId, msg: Msg) {
        let Some(rpc) = self.server_reqs.remove(&(server, request)) else {
            return;
        };
        let Some(r) = self.rpcs.get(&rpc).copied() else {
            return;
        };
        if let Some((key, sess)) = r.sess
            && self.sessions.get(&key) == Some(&sess)
        {
            self.send(key, server, Some(rpc), msg);
        }
    }

    /// Put a message from `from` (one end) on session `key`, in order behind earlier ones.
    /// Whether it went (not lost or dropped).
    fn send(&mut self, key: SessKey, from: usize, rpc: Option<u64>, msg: Msg) -> bool {
        let Some(&sess) = self.sessions.get(&key) else {
            return false;
        };
        let to = if from == key.0 { key.1 } else { key.0 };
        let (client, server, to_server) = (key.0, key.1, to == key.1);
        if self.cond.drop.contains(&(from, to)) {
            self.stats.lost += 1;
            self.note(|| format!("dropped {from}->{to} {msg:?}"));
            return false;
        }
        let loss = self.cond.loss;
        if loss > 0 && self.rng.chance(loss) {
            self.stats.lost += 1;
            self.note(|| format!("lost {client}->{server} (to_server={to_server}) {msg:?}"));
            // A lost message: the RPC hangs, or its deadline reports a transport error late.
            if let Some(rpc) = rpc
                && self.rng.chance(500)
            {
                let late = self
                    .p
                    .import_timeout
                    .mul_f64(0.5 + self.rng.below(300) as f64 / 100.0);
                self.push(
                    self.now + late,
                    Ev::RpcFailed {
                        rpc,
                        why: "deadline exceeded",
                    },
                );
            }
            return false;
        }
        let d = self.delay()
            + self.extra(&self.cond.extra, (from, to))
            + self.extra(&self.cond.session_extra, (from, to, key.0));
        let key = (client, server, sess.attempt, to_server);
        let q = self.channels.entry(key).or_default();
        let at = q
            .back()
            .map_or(self.now + d, |last| last.ready.max(self.now + d));
        q.push_back(InFlight {
            ready: at,
            rpc,
            msg,
        });
        self.push(at, Ev::Channel { key });
        true
    }

    /// Deliver what is due on one direction of a session, in order.
    pub(super) fn deliver_channel(&mut self, key: ChannelKey) {
        let now = self.now;
        let (client, server, attempt, to_server) = key;
        loop {
            let Some(sess) = self
                .sessions
                .get(&(client, server))
                .copied()
                .filter(|s| s.attempt == attempt)
            else {
                self.channels.remove(&key);
                return;
            };
            let Some(head) = self.channels.get(&key).and_then(|q| q.front()) else {
                return;
            };
            if head.ready > now {
                return;
            }
            if self.is_cut(client, server) {
                // TCP retransmits until the partition heals or the session dies.
                self.push(now + RETRANSMIT, Ev::Channel { key });
                return;
            }
            let m = self
                .channels
                .get_mut(&key)
                .and_then(|q| q.pop_front())
                .unwrap();
            let (from, to) = if to_server {
                (client, server)
            } else {
                (server, client)
            };
            match m.msg {
                Msg::ImportReq(_) | Msg::UnimportReq(_) | Msg::Goodbye => {
                    self.deliver_request(from, to, (client, server), sess, m.rpc, m.msg);
                }
                Msg::Cliques(cliques, epoch) => {
                    self.deliver_cliques(from, to, (client, server), sess, (&cliques, epoch));
                }
                Msg::Jobs(jobs, epoch) => {
                    self.deliver_jobs(from, to, (client, server), sess, (&jobs, epoch));
                }
                Msg::ImportResp(_)
                | Msg::UnimportResp
                | Msg::UnimportRefused
                | Msg::GoodbyeResp
                | Msg::GoodbyeRefused => {
                    self.deliver_response(from, m.rpc, m.msg);
                }
            }
            self.pump();
        }
    }

    pub(super) fn rpc_failed(&mut self, rpc: u64, why: &'static str) {
        let now = self.now;
        let Some(r) = self.rpcs.remove(&rpc) else {
            return;
        };
        if let Some((key, _)) = r.sess {
            self.end_if_idle(key);
        }
        if self.inst(r.client) != Some(r.client_inst) {
            return;
        }
        let exporter = Self::id(r.server);
        self.note(|| {
            format!(
                "node {}: rpc {:?} to {} failed: {why}",
                r.client, r.kind, r.server
            )
        });
        let n = self.node_mut(r.client);
        match r.kind {
            RpcKind::Import(e) => n.handle_import_answer(
                now,
                exporter,
                e,
                Err(ImportError::new(
                    Status::InvalidState,
                    format!("transport error: {why}"),
                )),
            ),
            RpcKind::Unimport(e) => n.handle_unimport_delivered(now, exporter, e, false),
            RpcKind::Goodbye => n.handle_goodbye_delivered(now, exporter, false),
        }
    }

    fn deliver_request(
        &mut self,
        client: usize,
        server: usize,
        key: SessKey,
        sess: Sess,
        rpc: Option<u64>,
        msg: Msg,
    ) {
        let now = self.now;
        let from = PeerId {
            node: Self::id(client),
            instance: sess.inst_at(key, client),
        };
        let request = self.next_request;
        self.next_request += 1;
        if let Some(rpc) = rpc {
            self.server_reqs.insert((server, request), rpc);
        }
        self.note(|| format!("node {server}: from {client} request {request}: {msg:?}"));
        // A session the server retired still carries what the client sends on it (the client
        // may not know yet), but no longer proves the pair there: refusals may follow.
        if self.retired_by(key, sess, server) {
            self.on_retired = Some(server);
        }
        let n = self.node_mut(server);
        let (via, claimed) = (sess.via_at(key, server), Some(from));
        match msg {
            Msg::ImportReq(req) => n.handle_session_import(now, request, via, claimed, req),
            Msg::UnimportReq(e) => n.handle_session_unimport(now, request, via, claimed, e),
            Msg::Goodbye => {
                let believed = n.handle_session_goodbye(now, via, claimed, "shutting down");
                // Answered once the server performed what the departure means (its importers
                // of the client's memory disabled), as the daemon's ack waits for its driver;
                // one not believed is refused, which the client takes as not delivered.
                self.pump();
                let answer = match believed {
                    true => Msg::GoodbyeResp,
                    false => Msg::GoodbyeRefused,
                };
                self.respond(server, request, answer);
            }
            Msg::ImportResp(_)
            | Msg::UnimportResp
            | Msg::UnimportRefused
            | Msg::GoodbyeResp
            | Msg::GoodbyeRefused
            | Msg::Cliques(..)
            | Msg::Jobs(..) => {
                unreachable!("response or notification sent as a request")
            }
        }
        self.pump();
        self.on_retired = None;
    }

    /// `from`'s notification of its cliques reaches `to` on session `key`.
    fn deliver_cliques(
        &mut self,
        from: usize,
        to: usize,
        key: SessKey,
        sess: Sess,
        (c, epoch): (&[u32], u64),
    ) {
        let now = self.now;
        self.note(|| format!("node {to}: from {from} cliques {c:?} (epoch {epoch})"));
        // As for requests: a session `to` retired no longer proves the pair there.
        if self.retired_by(key, sess, to) {
            self.on_retired = Some(to);
        }
        let via = sess.via_at(key, to);
        self.stats.cliques_told += 1;
        self.node_mut(to).handle_session_cliques(now, via, c, epoch);
        self.pump();
        self.on_retired = None;
    }

    /// `from`'s list of the jobs it shares with `to` reaches `to` on session `key`.
    fn deliver_jobs(
        &mut self,
        from: usize,
        to: usize,
        key: SessKey,
        sess: Sess,
        (jobs, epoch): (&[(String, String)], u64),
    ) {
        let now = self.now;
        self.note(|| format!("node {to}: from {from} jobs {jobs:?} (list {epoch})"));
        if self.retired_by(key, sess, to) {
            self.on_retired = Some(to);
        }
        let via = sess.via_at(key, to);
        self.node_mut(to).handle_session_jobs(now, via, jobs, epoch);
        self.pump();
        self.on_retired = None;
    }

    fn deliver_response(&mut self, server: usize, rpc: Option<u64>, msg: Msg) {
        let now = self.now;
        let Some(r) = rpc.and_then(|rpc| self.rpcs.remove(&rpc)) else {
            return;
        };
        if let Some((key, _)) = r.sess {
            self.end_if_idle(key);
        }
        self.note(|| {
            format!(
                "node {}: answer from {server} for {:?}: {msg:?}",
                r.client, r.kind
            )
        });
        let exporter = Self::id(server);
        if let (RpcKind::Import(e), Msg::ImportResp(Ok(_))) = (r.kind, &msg)
            && let Some((key, sess)) = r.sess
        {
            self.answered_by
                .insert((r.client, e), sess.inst_at(key, server));
        }
        let n = self.node_mut(r.client);
        match (r.kind, msg) {
            (RpcKind::Import(e), Msg::ImportResp(answer)) => {
                n.handle_import_answer(now, exporter, e, answer);
            }
            (RpcKind::Unimport(e), Msg::UnimportResp) => {
                n.handle_unimport_delivered(now, exporter, e, true);
            }
            (RpcKind::Unimport(e), Msg::UnimportRefused) => {
                n.handle_unimport_delivered(now, exporter, e, false);
            }
            (RpcKind::Goodbye, Msg::GoodbyeResp) => n.handle_goodbye_delivered(now, exporter, true),
            (RpcKind::Goodbye, Msg::GoodbyeRefused) => {
                n.handle_goodbye_delivered(now, exporter, false);
            }
            (kind, msg) => panic!("mismatched response {msg:?} for {kind:?}"),
        }
    }
}
