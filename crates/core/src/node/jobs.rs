//! The node's jobs ([`crate::jobs`]) in its lifecycle: defined and ended by the owner (a ctl
//! command, a job file), told to the members over the pairs' sessions, and checked on every
//! import at both ends.
//!
//! - **Told.** A member is told which jobs it shares with this node ([`Action::SendJobs`]: the
//!   whole list, so a job it no longer hears of is one this node does not hold) when its link
//!   comes up, when a job of it is defined or ended here, and, like the cliques, again when
//!   the pair moves to its other session while its link stays up (the notification may have
//!   gone with the old one) and at the next fabric refresh when the session did not take it.
//!   Nothing is told while no job was ever defined here: a daemon without jobs sends nothing
//!   it did not send before.
//! - **Forgotten.** What a peer's instance said goes with that instance (a restart, a goodbye).
//! - **Checked.** With a job defined, the importer's node asks an exporter only under a job
//!   both hold ([`crate::jobs::Jobs::admit`] with the exporter), and the exporter's node serves
//!   it only under such a job (with the importer); a refusal is counted under its reason and
//!   the import fails with `INSUFFICIENT_PERMISSIONS`, the status of an import across
//!   channels (the application sees its import fail as one across channels does).

use std::collections::BTreeSet;
use std::time::Instant;

use super::{Action, Node, PeerRequest};
use crate::gpu::Status;
use crate::ids::NodeId;
use crate::jobs::{DefineError, ImportRefusal, JobSpec, JobState, Jobs};
use crate::mesh::Via;
use crate::state::ConnStatus;

/// What [`Node::handle_jobs_changed`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobsChanged {
    /// The jobs ended (a name that was no job here is left out).
    pub ended: Vec<JobSpec>,
    /// Each job to define, with `Ok(true)` defined, `Ok(false)` already defined the same, or
    /// why the node refused it.
    pub defined: Vec<(JobSpec, Result<bool, DefineError>)>,
}

/// What the node keeps of jobs beyond the table: whom to tell again.
#[derive(Debug)]
pub(super) struct JobsTold {
    /// Peers a notification could not be handed to: told again at the next fabric refresh.
    pub(super) untold: BTreeSet<NodeId>,
    /// The session each peer was last told on.
    pub(super) told_on: std::collections::BTreeMap<NodeId, Option<Via>>,
    /// Lists sent so far: each carries its number, so a peer keeps the newest it got.
    pub(super) sent: u64,
}

impl JobsTold {
    pub(super) fn new() -> Self {
        Self {
            untold: BTreeSet::new(),
            told_on: std::collections::BTreeMap::new(),
            sent: 0,
        }
    }
}

impl Node {
    /// The jobs defined here.
    pub fn jobs(&self) -> &Jobs {
        &self.jobs
    }

    /// The state of job `name` as this node sees it; `None`: no such job here.
    pub fn job_state(&mut self, name: &str) -> Option<JobState> {
        let mesh = &self.mesh;
        self.jobs.state(name, |p| {
            matches!(mesh.peer(p), Some((ConnStatus::Connected, Some(_))))
        })
    }

    /// Looks at the state of every job `peer` is a member of (every job without a peer), so
    /// one that is READY now is remembered as having been: a member lost later makes it
    /// DEGRADED, not FORMING, whether or not anyone asked in between. Run wherever a job can
    /// become READY: a definition, a member's word, a member's link up.
    fn jobs_note_ready(&mut self, peer: Option<NodeId>) {
        if !self.jobs.in_use() {
            return;
        }
        let names: Vec<String> = (self.jobs.names())
            .filter(|n| {
                let spec = self.jobs.spec(n);
                peer.is_none_or(|p| spec.is_some_and(|s| s.members.contains(&p)))
            })
            .map(str::to_string)
            .collect();
        for name in names {
            let _ = self.job_state(&name);
        }
    }

    /// Defines `spec` here (a ctl command, a job file). `Ok(false)`: it was defined already,
    /// the same. Its connected members are told.
    pub fn handle_job_define(&mut self, now: Instant, spec: JobSpec) -> Result<bool, DefineError> {
        let changed = self.handle_jobs_changed(now, &[], vec![spec]);
        (changed.defined.into_iter().next()).map_or(Ok(false), |(_, result)| result)
    }

    /// Ends job `name` here: no import under it from now on; its channel is quarantined until
    /// [`Node::handle_job_channel_clear`]. Its connected members are told. `None`: no such job.
    pub fn handle_job_end(&mut self, now: Instant, name: &str) -> Option<JobSpec> {
        let changed = self.handle_jobs_changed(now, &[name.to_string()], Vec::new());
        changed.ended.into_iter().next()
    }

    /// Several jobs at once (one read of a jobs directory): each of `end` ended as
    /// [`Node::handle_job_end`] ends it, then each of `define` defined as
    /// [`Node::handle_job_define`] defines it, and each member concerned told once, after all
    /// of them. Told per job instead, a directory of n jobs would send each member its list n
    /// times as it grew: quadratic in the jobs (10,000 files, 50 million entries sent).
    pub fn handle_jobs_changed(
        &mut self,
        _now: Instant,
        end: &[String],
        define: Vec<JobSpec>,
    ) -> JobsChanged {
        let mut tell = BTreeSet::new();
        let ended: Vec<JobSpec> = (end.iter())
            .filter_map(|name| self.jobs.end(name))
            .collect();
        for spec in &ended {
            tell.extend(spec.members.iter().copied());
        }
        let map = self.mesh.config().map.clone();
        let mut defined = Vec::with_capacity(define.len());
        let mut new_names = Vec::new();
        for spec in define {
            let result = self.jobs.define(spec.clone(), &map);
            if result == Ok(true) {
                tell.extend(spec.members.iter().copied());
                new_names.push(spec.name.clone());
            }
            defined.push((spec, result));
        }
        self.tell_jobs(tell);
        for name in new_names {
            let _ = self.job_state(&name);
        }
        JobsChanged { ended, defined }
    }

    /// The quarantine this node's owner recorded before this start (`Jobs::restore_quarantine`).
    pub fn handle_jobs_quarantined(&mut self, _now: Instant, ended: &[(u32, String)]) {
        self.jobs.restore_quarantine(ended);
    }

    /// The owner found no process left that may hold `channel` for the job that ended with it.
    pub fn handle_job_channel_clear(&mut self, _now: Instant, channel: u32) {
        self.jobs.channel_clear(channel);
    }

    /// A peer's list of the jobs it shares with this node, its `epoch`-th, on session `via`
    /// (taken from the peer the session proves; otherwise refused and counted).
    pub fn handle_session_jobs(
        &mut self,
        _now: Instant,
        via: Via,
        jobs: &[(String, String)],
        epoch: u64,
    ) {
        if let Some(from) = self.authenticate(via, None, PeerRequest::Jobs) {
            self.jobs.peer_said(from.node, jobs, epoch);
            self.jobs_note_ready(Some(from.node));
        }
    }

    /// The list [`Action::SendJobs`] to `peer` was handed to the pair's session (`sent`), or
    /// not: then it goes again at the next fabric refresh, or at the link-up.
    pub fn handle_jobs_sent(&mut self, _now: Instant, peer: NodeId, sent: bool) {
        if !sent {
            self.jobs_told.untold.insert(peer);
        }
    }

    /// `peer`'s link came up: told its jobs (once a job was defined here).
    pub(super) fn jobs_link_up(&mut self, peer: NodeId) {
        self.jobs_told.untold.remove(&peer);
        if self.jobs.in_use() {
            self.send_jobs(peer);
            self.jobs_note_ready(Some(peer));
        }
    }

    /// `peer`'s instance is gone: what it said goes with it.
    pub(super) fn jobs_peer_gone(&mut self, peer: NodeId) {
        self.jobs.peer_gone(peer);
    }

    /// After the mesh moved: a peer told on a session that no longer carries the pair while
    /// its link stays up is told again on the one that does.
    pub(super) fn jobs_carriers(&mut self) {
        if !self.jobs.in_use() {
            return;
        }
        for peer in self.moved_off(&self.jobs_told.told_on) {
            self.send_jobs(peer);
        }
    }

    /// The fabric refresh: peers a list did not reach are told again while connected.
    pub(super) fn jobs_refresh(&mut self) {
        let untold = std::mem::take(&mut self.jobs_told.untold);
        for peer in untold {
            if self.connected(peer).is_some() {
                self.send_jobs(peer);
            }
        }
    }

    /// Whether an import between this node and `other` on `channel` is allowed by the jobs
    /// here; when not, the refusal is counted and its reason returned.
    pub(super) fn job_admits(&mut self, channel: u32, other: NodeId, side: &str) -> Option<String> {
        match self.jobs.admit(channel, other) {
            Ok(_) => None,
            Err(why) => {
                let key = match why {
                    ImportRefusal::NoJob { .. } => "import: no job owns the channel",
                    ImportRefusal::NotAMember { .. } => "import: node outside the job",
                    ImportRefusal::NotAgreed { .. } => "import: job not held by the other node",
                };
                let detail = format!("{side}: {why}");
                self.refused(key, detail.clone());
                Some(detail)
            }
        }
    }

    /// The status an import refused by the jobs fails with: the driver's channel error.
    pub(super) const JOB_REFUSAL: Status = Status::InsufficientPermissions;

    fn tell_jobs(&mut self, members: BTreeSet<NodeId>) {
        let local = self.mesh.config().local;
        for peer in members.into_iter().filter(|p| *p != local) {
            if self.connected(peer).is_some() {
                self.send_jobs(peer);
            }
        }
    }

    fn send_jobs(&mut self, peer: NodeId) {
        self.jobs_told.sent += 1;
        self.actions.push_back(Action::SendJobs {
            peer,
            jobs: self.jobs.told(peer),
            epoch: self.jobs_told.sent,
        });
        let via = self.mesh.session_of(peer);
        self.jobs_told.told_on.insert(peer, via);
    }
}
