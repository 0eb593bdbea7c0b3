//! The deadlines of connections, sessions and the shutdown, decided here and performed by the
//! owner (issue 30): what it holds open, and for how long, while a peer owes it something.
//!
//! - An inbound connection MUST say an accepted hello within [`HELLO_DEADLINE`] of its
//!   accept ([`Node::handle_conn_accepted`]); otherwise it is refused (counted under
//!   "connection: no hello in time") and closed ([`Action::CloseConn`]), at the deadline and not
//!   before. A refused hello does not stop the clock: only an accepted one proves a peer, and
//!   strangers must not hold the daemon's connections open for ever.
//! - A session stream opened on a connection (which a peer may already have proved, so the
//!   connection's deadline no longer applies) MUST bring its first frame, the hello, within
//!   [`HELLO_DEADLINE`] of its opening ([`Node::handle_stream_opened`]); otherwise it is
//!   ended ([`Action::CloseStream`]).
//! - A session the mesh closes ([`mesh::Action::CloseSession`]) is only retired by the owner:
//!   what is in flight on it still gets its answer (the pair may just have moved to its other
//!   session). It ends by itself once idle, and at the latest [`RETIRE_WAIT`] later
//!   ([`Action::EndSession`]), so a peer that stopped answering cannot keep it open.
//! - On shutdown the node waits for its goodbyes ([`mesh::Action::SendGoodbye`]), at most
//!   [`GOODBYE_WAIT`]: each acknowledged one releases what the peer's importers held here, and
//!   a peer that does not answer in time is not waited for ([`Action::GoodbyesOver`]).
//!
//! # Contract
//! The owner keeps no timer of its own for these. It MUST report every inbound connection it
//! accepts ([`Node::handle_conn_accepted`]) before any hello on it, and every session stream
//! it opens ([`Node::handle_stream_opened`], then [`Node::handle_stream_heard`] once its first
//! frame came or it ended). It MUST close what [`Action::CloseConn`] and
//! [`Action::CloseStream`] name, and end what [`Action::EndSession`] names if it is still open.
//! Shutting down, it MUST keep feeding inputs and timeouts until [`Action::GoodbyesOver`], and
//! DO NOT stop before it: a goodbye acknowledged later releases nothing.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::{Action, Node, Timer};
use crate::ids::{ConnId, NodeId};
use crate::mesh::Via;

/// How long an inbound connection may take to say an accepted hello.
pub const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// How long a closed session may stay open for what is in flight on it.
pub const RETIRE_WAIT: Duration = Duration::from_secs(5);

/// How long shutdown waits for peers to acknowledge the goodbye.
pub const GOODBYE_WAIT: Duration = Duration::from_secs(2);

/// Where the shutdown's goodbyes stand.
#[derive(Debug, Default)]
enum Goodbyes {
    /// Not shutting down.
    #[default]
    Before,
    /// Sent; these peers have not been reported yet.
    Waiting(BTreeSet<NodeId>),
    /// [`Action::GoodbyesOver`] was emitted.
    Over,
}

/// Names a session stream the owner opened on an inbound connection (chosen by the owner).
pub type StreamId = u64;

/// Connections and streams waiting for their hello, and the goodbyes.
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    /// Inbound connections without an accepted hello yet, with their peer address (for the
    /// refusal's detail).
    unheard: HashMap<ConnId, SocketAddr>,
    /// Session streams without their first frame yet.
    silent: HashSet<StreamId>,
    goodbyes: Goodbyes,
}

impl Node {
    /// The owner accepted inbound connection `conn` from `from`: it must say an accepted hello
    /// within [`HELLO_DEADLINE`], or it is closed ([`Action::CloseConn`]). `peer`: the node of
    /// the map whose address `from` is, if any (the owner resolves the map's names): that
    /// peer's hello is on its way, so our own dial to it waits
    /// ([`crate::Mesh::handle_peer_connecting`]). May come before [`Node::handle_start`].
    pub fn handle_conn_accepted(
        &mut self,
        now: Instant,
        conn: ConnId,
        from: SocketAddr,
        peer: Option<NodeId>,
    ) {
        self.owed.unheard.insert(conn, from);
        self.arm(now + HELLO_DEADLINE, Timer::Hello(conn));
        if let Some(peer) = peer.filter(|p| *p != self.mesh.config().local) {
            self.mesh.handle_peer_connecting(now, peer);
            self.absorb_mesh(now);
        }
    }

    /// Inbound connections accepted and not yet proved by a hello.
    pub fn conns_unheard(&self) -> usize {
        self.owed.unheard.len()
    }

    /// The owner opened session stream `stream` on an inbound connection: its first frame
    /// must come within [`HELLO_DEADLINE`], or it is ended ([`Action::CloseStream`]).
    pub fn handle_stream_opened(&mut self, now: Instant, stream: StreamId) {
        self.owed.silent.insert(stream);
        self.arm(now + HELLO_DEADLINE, Timer::StreamHello(stream));
    }

    /// The first frame of `stream` arrived (or the stream ended before): nothing is owed.
    pub fn handle_stream_heard(&mut self, stream: StreamId) {
        if self.owed.silent.remove(&stream) {
            self.disarm(Timer::StreamHello(stream));
        }
    }

    /// [`HELLO_DEADLINE`] passed on `stream` without its first frame.
    pub(super) fn stream_overdue(&mut self, stream: StreamId) {
        if self.owed.silent.remove(&stream) {
            self.actions.push_back(Action::CloseStream { stream });
        }
    }

    /// `conn` said an accepted hello: its deadline no longer applies.
    pub(super) fn conn_heard(&mut self, conn: ConnId) {
        if self.owed.unheard.remove(&conn).is_some() {
            self.disarm(Timer::Hello(conn));
        }
    }

    /// `conn` closed: nothing to wait for on it.
    pub(super) fn conn_gone(&mut self, conn: ConnId) {
        self.conn_heard(conn);
    }

    /// [`HELLO_DEADLINE`] passed on `conn` without an accepted hello.
    pub(super) fn hello_overdue(&mut self, conn: ConnId) {
        let Some(from) = self.owed.unheard.remove(&conn) else {
            return;
        };
        self.refused(
            "connection: no hello in time",
            format!("closed {from}: no accepted hello in time"),
        );
        self.actions.push_back(Action::CloseConn { conn });
    }

    /// The mesh closed session `via` of the pair with `peer` (the owner retires it).
    pub(super) fn session_closing(&mut self, now: Instant, peer: NodeId, via: Via) {
        self.arm(now + RETIRE_WAIT, Timer::Retire(peer, via));
    }

    /// [`RETIRE_WAIT`] passed since session `via` was closed.
    pub(super) fn retire_over(&mut self, peer: NodeId, via: Via) {
        self.actions.push_back(Action::EndSession { peer, via });
    }

    /// Shutting down: from now on the goodbyes the mesh sends are waited for.
    pub(super) fn goodbyes_start(&mut self) -> bool {
        if !matches!(self.owed.goodbyes, Goodbyes::Before) {
            return false;
        }
        self.owed.goodbyes = Goodbyes::Waiting(BTreeSet::new());
        true
    }

    /// The mesh sends a goodbye to `peer`.
    pub(super) fn goodbye_sent(&mut self, peer: NodeId) {
        if let Goodbyes::Waiting(peers) = &mut self.owed.goodbyes {
            peers.insert(peer);
        }
    }

    /// Every goodbye of the shutdown is sent: wait for them, at most [`GOODBYE_WAIT`].
    pub(super) fn goodbyes_sent(&mut self, now: Instant) {
        self.arm(now + GOODBYE_WAIT, Timer::GoodbyeWait);
        self.goodbyes_check();
    }

    /// The goodbye to `peer` was reported (acknowledged or failed).
    pub(super) fn goodbye_reported(&mut self, peer: NodeId) {
        if let Goodbyes::Waiting(peers) = &mut self.owed.goodbyes {
            peers.remove(&peer);
            self.goodbyes_check();
        }
    }

    /// [`GOODBYE_WAIT`] passed: the goodbyes not reported by now are not waited for.
    pub(super) fn goodbye_wait_over(&mut self) {
        if let Goodbyes::Waiting(peers) = std::mem::replace(&mut self.owed.goodbyes, Goodbyes::Over)
        {
            self.actions.push_back(Action::GoodbyesOver {
                unanswered: peers.into_iter().collect(),
            });
        }
    }

    /// All reported: the wait is over.
    fn goodbyes_check(&mut self) {
        if matches!(&self.owed.goodbyes, Goodbyes::Waiting(p) if p.is_empty()) {
            self.disarm(Timer::GoodbyeWait);
            self.goodbye_wait_over();
        }
    }
}
