//! What the world does for each action a node asks for: requests and answers go on the pair's
//! session, driver calls reach the node's driver model (describe, validate, finish, release,
//! disable), and dials, heartbeats, closes and goodbyes become timed events. An action no
//! honest run may produce (refusing an honest peer, multicast with none posted) is a violation.

use std::time::Duration;

use openimex_core::node::Action;
use openimex_core::*;

use super::World;
use super::events::Ev;
use super::rpc::{Msg, RpcKind};

impl World {
    pub(super) fn perform(&mut self, i: usize, action: Action) {
        let now = self.now;
        let inst = self.inst(i).unwrap();
        if let Some(log) = self.log.as_mut() {
            log.push((i, action.clone()));
        }
        match &action {
            Action::Mesh(mesh::Action::SendHeartbeat { .. }) => {}
            a => self.note(|| format!("node {i}: {a:?}")),
        }
        match action {
            Action::Mesh(m) => {
                match m {
                    mesh::Action::PeerRestarted { peer, new, .. } => {
                        self.gone_checks.push((i, peer, Some(new)));
                    }
                    mesh::Action::PeerLeft { peer, .. } => self.gone_checks.push((i, peer, None)),
                    _ => {}
                }
                self.perform_mesh(i, inst, m);
            }
            // Grace-time clean-ups are off here (wait forever, NVIDIA's default); restarts and
            // departures are checked through the mesh actions above.
            Action::CleanedUp { .. } => {}
            // Log lines.
            Action::CliqueChanged { .. }
            | Action::GpuHealthChanged { .. }
            | Action::PeerCliques { .. } => {}
            // The read runs on the daemon's driver worker: it answers after what is queued.
            Action::ReadGpuFabric => self.push(now, Ev::FabricRead { node: i, inst }),
            Action::SendCliques {
                peer,
                cliques,
                epoch,
            } => {
                let via = self.node(i).and_then(|n| n.session_of(peer));
                self.notify(i, peer.index(), via, Msg::Cliques(cliques, epoch));
            }
            Action::SendJobs { peer, jobs, epoch } => {
                let via = self.node(i).and_then(|n| n.session_of(peer));
                self.notify(i, peer.index(), via, Msg::Jobs(jobs, epoch));
            }
            Action::Persist { importers } => self.slots[i].persist = importers,
            Action::RecoveryWait { .. }
            | Action::Recovered { .. }
            | Action::PeersWaitOver { .. } => {}
            // Every peer here is honest and says hello first: a refusal is a bookkeeping bug.
            // Refusals that are no bookkeeping bug: a connection without a hello in time
            // (judged in `owed.rs`), and a request the peer sent on a session this node had
            // retired (it no longer proves the pair; the sender fails or resends it).
            // A refusal under the jobs is the decision under test (`world/jobs.rs`).
            Action::Refused {
                reason:
                    "import: no job owns the channel"
                    | "import: node outside the job"
                    | "import: job not held by the other node",
                ..
            } => {}
            Action::Refused { reason, .. }
                if reason == "connection: no hello in time" || self.on_retired == Some(i) =>
            {
                self.stats.refused_on_retired += u64::from(self.on_retired == Some(i));
            }
            Action::Refused { reason, detail, .. } if self.hole_refusal(i, reason, &detail) => {}
            Action::Refused { reason, detail, .. } => {
                self.violate(format!(
                    "node {i}: refused an honest peer ({reason}): {detail}"
                ));
            }
            Action::SendImport { peer, request } => {
                let e = request.import_event_id;
                self.check_import_bound(i, inst, peer.index());
                let via = self.node(i).and_then(|n| n.session_of(peer));
                self.call(
                    i,
                    inst,
                    peer.index(),
                    via,
                    RpcKind::Import(e),
                    Msg::ImportReq(request),
                );
            }
            Action::SendUnimport {
                peer,
                import_event_id,
            } => {
                let via = self.node(i).and_then(|n| n.session_of(peer));
                self.call(
                    i,
                    inst,
                    peer.index(),
                    via,
                    RpcKind::Unimport(import_event_id),
                    Msg::UnimportReq(import_event_id),
                );
            }
            Action::CloseConn { conn } => self.close_conn(i, conn),
            Action::CloseStream { stream } => self.close_stream(i, stream),
            Action::EndSession { peer, via } => self.end_session(i, peer, via),
            Action::GoodbyesOver { unanswered } => self.goodbyes_over(i, &unanswered),
            Action::ImportNotSent { peer, .. } => {
                self.stats.not_sent += 1;
                if self.node(i).and_then(|n| n.session_of(peer)).is_some() {
                    self.violate(format!(
                        "node {i}: an import failed for want of a session to node {peer}, which \
                         has one"
                    ));
                }
            }
            Action::ValidateImport {
                import_event_id,
                result,
            } => self.validate(i, import_event_id, result),
            Action::FinishUnimports { ids } => {
                if let Err(id) = self.slots[i].driver.finish(&ids) {
                    self.violate(format!(
                        "node {i}: FINISH_MEM_UNIMPORT of unimport event {id}, which is not waiting \
                         (finished twice or never posted)"
                    ));
                }
            }
            Action::DisableImporters { node } => {
                let n = self.slots[i].driver.disable_importers(node);
                self.note(|| format!("node {i}: disabled {n} importers of node {node}"));
            }
            Action::DescribeExport {
                request,
                export_uuid,
                index,
                channel,
            } => {
                let asker = (self.server_reqs.get(&(i, request)))
                    .and_then(|rpc| self.rpcs.get(rpc))
                    .map(|rpc| (rpc.client, rpc.client_inst));
                if let Some((client, client_inst)) = asker {
                    self.check_job_serve(i, client, client_inst, channel);
                }
                let result = self.slots[i].driver.describe(&export_uuid, index, channel);
                if let Ok((r, _)) = &result
                    && let Some(rpc) = self
                        .server_reqs
                        .get(&(i, request))
                        .and_then(|rpc| self.rpcs.get(rpc))
                    && let RpcKind::Import(e) = rpc.kind
                {
                    self.ref_for.insert((i, *r), (rpc.client, e));
                }
                let max = self.cond.describe_max;
                let at = now
                    + self
                        .cond
                        .describe_fixed
                        .unwrap_or_else(|| self.rng.upto(max));
                self.push(
                    at,
                    Ev::Described {
                        node: i,
                        inst,
                        request,
                        result,
                    },
                );
            }
            Action::ReleaseExportRefs { refs, ack } => {
                for r in &refs {
                    let Some((b, e)) = self.ref_for.remove(&(i, *r)) else {
                        continue;
                    };
                    let exiting = self.slots[b].daemon.as_ref().is_some_and(|d| d.exiting);
                    if self.slots[b].driver.is_live(e) && !exiting {
                        self.violate(format!(
                            "node {i}: released the reference held for node {b}'s import {e}, \
                             which is still live there"
                        ));
                    }
                }
                match self.slots[i].driver.release_refs(&refs) {
                    Ok(freed) => {
                        for exp in freed {
                            self.on_freed(i, exp, false);
                        }
                    }
                    Err(r) => self.violate(format!(
                        "node {i}: release of daemon reference {r}, which is not held (double \
                         release)"
                    )),
                }
                if let Some(request) = ack {
                    self.respond(i, request, Msg::UnimportResp);
                }
            }
            Action::AnswerImport { request, answer } => {
                self.respond(i, request, Msg::ImportResp(answer));
            }
            Action::AnswerUnimport { request, .. } => {
                self.respond(i, request, Msg::UnimportResp);
            }
            Action::RefuseUnimport { request, .. } => {
                self.respond(i, request, Msg::UnimportRefused);
            }
            // This world's drivers post no multicast events (tests/multicast.rs covers them).
            a @ (Action::SendRemoteGpuAttach { .. }
            | Action::AttachRemoteGpu { .. }
            | Action::SetMulticastFailure { .. }
            | Action::AnswerRemoteGpuAttach { .. }) => {
                self.violate(format!(
                    "node {i}: a multicast action with no multicast: {a:?}"
                ));
            }
        }
    }

    fn perform_mesh(&mut self, a: usize, a_inst: InstanceId, m: mesh::Action) {
        let now = self.now;
        match m {
            mesh::Action::Dial { peer, attempt } => {
                let d = self.delay() + self.extra(&self.cond.dial_extra, (a, peer.index()));
                self.push(
                    now + d,
                    Ev::DialArrive {
                        a,
                        b: peer.index(),
                        attempt,
                        a_inst,
                        sent: now,
                    },
                );
            }
            mesh::Action::SendHeartbeat { peer, via, answer } => {
                let b = peer.index();
                if let Some((key, sess)) = self.find(a, b, via)
                    && !self.is_cut(a, b)
                {
                    let rtt = self.delay().min(Duration::from_millis(500)) * 2;
                    let answer_in = answer.then_some(rtt / 2);
                    self.push(
                        now + rtt / 2,
                        Ev::HeartbeatArrive {
                            a,
                            b,
                            key,
                            sess,
                            answer_in,
                        },
                    );
                }
            }
            mesh::Action::CloseSession { peer, via } => {
                // Retired, not cut (`owed.rs`).
                if let Some((key, sess)) = self.find(a, peer.index(), via) {
                    self.retire(key, sess, a);
                }
            }
            mesh::Action::SendGoodbye { peer, via } => {
                let b = peer.index();
                self.call(a, a_inst, b, Some(via), RpcKind::Goodbye, Msg::Goodbye);
            }
            mesh::Action::InitDriver => {
                let d = self.rng.ms(0, 20);
                self.push(
                    now + d,
                    Ev::DriverReady {
                        node: a,
                        inst: a_inst,
                    },
                );
            }
            mesh::Action::LinkChanged { .. }
            | mesh::Action::PeerRestarted { .. }
            | mesh::Action::PeerLeft { .. }
            | mesh::Action::StateChanged { .. } => {}
        }
    }
}
