//! The queue of timed inputs: everything due to happen to a node later (a message, a dial's
//! answer, a driver call completing, a scripted operation), and which input of the node each
//! becomes. Events due at the same instant keep the order they were queued in, so a seed
//! replays identically.

use std::cmp::Reverse;
use std::time::{Duration, Instant};

use openimex_core::*;

use super::rpc::ChannelKey;
use super::sessions::{DialResult, Sess, SessKey};
use super::{Op, World};

#[derive(Debug, Clone)]
pub(super) enum Ev {
    /// Deliver what is due on one direction of a session.
    Channel {
        key: ChannelKey,
    },
    RpcFailed {
        rpc: u64,
        why: &'static str,
    },
    /// A dial made at `sent` reaches its peer.
    DialArrive {
        a: usize,
        b: usize,
        attempt: u64,
        a_inst: InstanceId,
        sent: Instant,
    },
    /// The answer to a dial made at `sent` reaches the dialler.
    DialDone {
        a: usize,
        b: usize,
        attempt: u64,
        a_inst: InstanceId,
        sent: Instant,
        result: DialResult,
    },
    /// The dialler's session stream reaches the acceptor.
    SessionOpen {
        key: SessKey,
        sess: Sess,
    },
    /// A's heartbeat reaches B on the pair's session (the pair's sign of life on B's side);
    /// B's transport answers it, if asked, after `answer_in`.
    HeartbeatArrive {
        a: usize,
        b: usize,
        key: SessKey,
        sess: Sess,
        answer_in: Option<Duration>,
    },
    HeartbeatAck {
        a: usize,
        b: usize,
        key: SessKey,
        sess: Sess,
    },
    SessionLost {
        a: usize,
        b: usize,
        attempt: u64,
        a_inst: InstanceId,
    },
    Described {
        node: usize,
        inst: InstanceId,
        request: RequestId,
        result: Result<(u64, Pages), ImportError>,
    },
    DriverReady {
        node: usize,
        inst: InstanceId,
    },
    /// The server sees an inbound connection close.
    ConnClosed {
        node: usize,
        inst: InstanceId,
        conn: ConnId,
    },
    Exit {
        node: usize,
        inst: InstanceId,
    },
    /// The first frame of a session stream a stranger opened at `node` arrives, late.
    StreamHeard {
        node: usize,
        inst: InstanceId,
        stream: u64,
    },
    /// The daemon reports whether the session took its notification of cliques (`jobs`
    /// false) or its jobs list.
    NotifySent {
        node: usize,
        inst: InstanceId,
        peer: NodeId,
        sent: bool,
        jobs: bool,
    },
    /// The node's read of its GPUs' probes (asked by `Action::ReadGpuFabric`) answers.
    FabricRead {
        node: usize,
        inst: InstanceId,
    },
    Op(Op),
}

pub(super) struct Queued {
    pub(super) at: Instant,
    pub(super) seq: u64,
    pub(super) ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

impl World {
    pub fn schedule_op(&mut self, at: Instant, op: Op) {
        self.push(at, Ev::Op(op));
    }

    pub(super) fn push(&mut self, at: Instant, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Queued {
            at: at.max(self.now),
            seq: self.seq,
            ev,
        }));
    }

    /// Turn a due event into the node's input (unless the instance it was meant for is gone).
    pub(super) fn handle(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Channel { key } => self.deliver_channel(key),
            Ev::RpcFailed { rpc, why } => self.rpc_failed(rpc, why),
            Ev::DialArrive {
                a,
                b,
                attempt,
                a_inst,
                sent,
            } => self.dial_arrive(a, b, attempt, a_inst, sent),
            Ev::DialDone {
                a,
                b,
                attempt,
                a_inst,
                sent,
                result,
            } => self.dial_done(a, b, attempt, a_inst, sent, result),
            Ev::SessionOpen { key, sess } => self.session_open(key, sess),
            Ev::HeartbeatArrive {
                a,
                b,
                key,
                sess,
                answer_in,
            } => self.heartbeat_arrive(a, b, key, sess, answer_in),
            Ev::HeartbeatAck { a, b, key, sess } => self.heartbeat_ack(a, b, key, sess),
            Ev::SessionLost {
                a,
                b,
                attempt,
                a_inst,
            } => self.session_lost(a, b, attempt, a_inst),
            Ev::Described {
                node,
                inst,
                request,
                result,
            } => {
                if self.inst(node) == Some(inst) {
                    self.note(|| {
                        format!("node {node}: described for request {request}: {result:?}")
                    });
                    self.node_mut(node).handle_described(now, request, result);
                }
            }
            Ev::DriverReady { node, inst } => {
                if self.inst(node) != Some(inst) {
                    return;
                }
                if let Err(e) = self.slots[node].driver.open_session(inst) {
                    self.violate(e);
                    return;
                }
                self.node_mut(node).handle_driver_ready(now);
            }
            Ev::ConnClosed { node, inst, conn } => {
                if self.inst(node) == Some(inst) && self.conn_end_reported(node, inst, conn) {
                    self.node_mut(node).handle_conn_closed(now, conn);
                }
            }
            Ev::Exit { node, inst } => {
                if self.inst(node) == Some(inst) {
                    // The daemon stops only once its node stopped waiting for the goodbyes.
                    let d = self.slots[node].daemon.as_mut().unwrap();
                    if d.goodbyes_over {
                        self.take_down(node, "exited after shutdown");
                    } else {
                        d.exit_due = true;
                    }
                }
            }
            Ev::StreamHeard { node, inst, stream } => self.stream_heard(node, inst, stream),
            Ev::NotifySent {
                node,
                inst,
                peer,
                sent,
                jobs,
            } => {
                if self.inst(node) == Some(inst) {
                    let n = self.node_mut(node);
                    match jobs {
                        false => n.handle_cliques_sent(now, peer, sent),
                        true => n.handle_jobs_sent(now, peer, sent),
                    }
                }
            }
            Ev::FabricRead { node, inst } => {
                if self.inst(node) == Some(inst) {
                    let gpus = self.slots[node].driver.gpus.clone();
                    self.node_mut(node).handle_gpu_fabric(now, gpus);
                }
            }
            Ev::Op(op) => self.run_op(op),
        }
    }
}
