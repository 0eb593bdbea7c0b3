//! The engine's part in jobs (`openimex_core::node` jobs): the jobs of the job files
//! (`jobs_dir`) defined and ended in the node as files appear and go, telling a member the jobs
//! it shares with this node, and taking a member's list off the wire (bounded: a peer's words
//! cannot grow the table past what any real domain of jobs needs).

use std::collections::{BTreeMap, BTreeSet};

use openimex_core::NodeId;
use openimex_core::jobs::{JobSpec, MAX_JOB_NAME};
use openimex_proto::peer::session_msg::Body;
use openimex_proto::peer::{JobDigest, JobsHeld};
use tracing::{debug, info, warn};

use super::{Engine, now};
use crate::mailbox::Input;

/// Most jobs a peer's list may name to be believed: as many as a node reads job files
/// (`jobs_dir`), far more than one node can run.
const MAX_PEER_JOBS: usize = 1 << 16;
/// A definition digest: SHA-256 in hex.
const DIGEST_LEN: usize = 64;

impl Engine {
    /// [`openimex_core::node::Action::SendJobs`]: the list on the pair's session, reported as
    /// taken or not.
    pub(super) fn send_jobs(
        &mut self,
        peer: openimex_core::NodeId,
        jobs: Vec<(String, String)>,
        epoch: u64,
    ) {
        let Some(session) = self.session(peer) else {
            self.node.handle_jobs_sent(now(), peer, false);
            return;
        };
        let jobs = (jobs.into_iter())
            .map(|(name, digest)| JobDigest { name, digest })
            .collect();
        let body = Body::JobsHeld(JobsHeld { jobs, epoch });
        let engine = self.tx.clone();
        tokio::spawn(async move {
            let sent =
                tokio::time::timeout(super::cliques::NOTIFY_TIMEOUT, session.notify(body)).await;
            let sent = matches!(sent, Ok(true));
            if !sent {
                debug!("could not tell node {peer} the jobs it shares with this node");
            }
            let _ = engine.send(Input::JobsSent { peer, sent }).await;
        });
    }

    /// A member's list: entries whose name or digest no job could have are dropped, and a
    /// list longer than any node could hold is not believed at all.
    pub(super) fn peer_jobs(&mut self, via: openimex_core::Via, held: JobsHeld) {
        if held.jobs.len() > MAX_PEER_JOBS {
            debug!("a peer's list of {} jobs is ignored", held.jobs.len());
            return;
        }
        let jobs: Vec<(String, String)> = (held.jobs.into_iter())
            .filter(|j| j.name.len() <= MAX_JOB_NAME && j.digest.len() == DIGEST_LEN)
            .map(|j| (j.name, j.digest))
            .collect();
        self.node.handle_session_jobs(now(), via, &jobs, held.epoch);
    }
}

/// The jobs the job files defined, and the problems logged (each once while it lasts).
#[derive(Debug, Default)]
pub(super) struct FromFiles {
    jobs: BTreeMap<String, JobSpec>,
    problems: BTreeSet<String>,
    /// The quarantine record was read (at the first read of the directory).
    restored: bool,
}

impl Engine {
    /// A read of the jobs directory: jobs whose file is gone (or now says something else) end,
    /// new ones are defined; a file that is no job, or a job the node refuses, is logged once
    /// and changes nothing else.
    pub(super) fn job_files(&mut self, files: crate::mailbox::JobFiles) {
        let now = now();
        if !self.job_files.restored {
            self.job_files.restored = true;
            self.node.handle_jobs_quarantined(now, &files.quarantined);
        }
        let mut problems = BTreeSet::new();
        problems.extend(files.problems);
        let wanted: BTreeMap<String, (std::path::PathBuf, JobSpec)> = (files.jobs.into_iter())
            .map(|f| {
                let spec = JobSpec {
                    name: f.name.clone(),
                    channel: f.channel,
                    members: f.members.iter().map(|m| NodeId(*m)).collect(),
                    owner: f.owner,
                };
                (f.name, (f.path, spec))
            })
            .collect();
        let gone: Vec<String> = (self.job_files.jobs.iter())
            .filter(|(name, spec)| wanted.get(*name).map(|(_, s)| s) != Some(*spec))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            self.job_files.jobs.remove(&name);
            if let Some(spec) = self.node.handle_job_end(now, &name) {
                info!(
                    "job {name} ended (its file is gone or changed): channel {} is kept from \
                     other jobs on this node while its processes may remain",
                    spec.channel
                );
                self.remove_channel(&spec);
                self.record_quarantine();
            }
        }
        for (name, (path, spec)) in wanted {
            if self.job_files.jobs.contains_key(&name) {
                continue;
            }
            match self.node.handle_job_define(now, spec.clone()) {
                Ok(new) => {
                    if new {
                        let members: Vec<String> =
                            spec.members.iter().map(ToString::to_string).collect();
                        info!(
                            "job {name} defined from {}: channel {}, members {}",
                            path.display(),
                            spec.channel,
                            members.join(",")
                        );
                        self.create_channel(&spec);
                    }
                    self.job_files.jobs.insert(name, spec);
                }
                Err(e) => {
                    problems.insert(format!("{}: {e}", path.display()));
                }
            }
        }
        for p in problems.difference(&self.job_files.problems) {
            warn!("job file ignored: {p}");
        }
        self.job_files.problems = problems;
    }
}

impl Engine {
    /// A job was defined: its channel is created (root's, or its owner's with group access),
    /// so its processes can open it; one there already is kept as it is.
    fn create_channel(&self, spec: &JobSpec) {
        let Some(channels) = &self.settings.channels else {
            return;
        };
        match channels.create(spec.channel, spec.owner) {
            Ok(true) => info!(
                "job {}: created channel{} in {}",
                spec.name,
                spec.channel,
                channels.dir.display()
            ),
            Ok(false) => {}
            Err(e) => warn!(
                "job {}: cannot create channel{} in {}: {e}; its processes cannot open it",
                spec.name,
                spec.channel,
                channels.dir.display()
            ),
        }
    }

    /// A job ended: its channel is removed, so no process opens it any more (one that holds
    /// it open keeps it: the quarantine is for those).
    fn remove_channel(&self, spec: &JobSpec) {
        let Some(channels) = &self.settings.channels else {
            return;
        };
        if let Err(e) = channels.remove(spec.channel) {
            warn!(
                "job {}: cannot remove channel{} from {}: {e}",
                spec.name,
                spec.channel,
                channels.dir.display()
            );
        }
    }
}

impl Engine {
    /// The jobs defined here with their states, for `ctl jobs`.
    pub(super) fn jobs_report(&mut self) -> openimex_proto::cmd::JobsReply {
        use openimex_core::jobs::JobState;
        let specs: Vec<JobSpec> = (self.node.jobs().names())
            .filter_map(|n| self.node.jobs().spec(n).cloned())
            .collect();
        let jobs = (specs.into_iter())
            .filter_map(|spec| {
                let state = self.node.job_state(&spec.name)?;
                let nodes = match &state {
                    JobState::Ready => Vec::new(),
                    JobState::Forming(n) | JobState::Degraded(n) | JobState::Disagreed(n) => {
                        n.clone()
                    }
                };
                Some(openimex_proto::cmd::JobReport {
                    name: spec.name,
                    channel: spec.channel,
                    members: spec.members.iter().map(|m| u32::from(m.0)).collect(),
                    state: state.word().to_string(),
                    nodes: nodes.iter().map(|m| u32::from(m.0)).collect(),
                    owner: spec
                        .owner
                        .map(|(u, g)| format!("{u}:{g}"))
                        .unwrap_or_default(),
                })
            })
            .collect();
        let quarantined = self.node.jobs().quarantined().map(|(c, _)| c).collect();
        openimex_proto::cmd::JobsReply { jobs, quarantined }
    }
}

impl Engine {
    /// Writes the quarantine to the jobs directory's record (whole, then renamed: a restart
    /// reads either the old record or the new one).
    fn record_quarantine(&self) {
        let Some(dir) = &self.settings.jobs_dir else {
            return;
        };
        let boot = crate::jobs_dir::boot_id().map(|b| format!("boot {b}\n"));
        let text: String = boot
            .into_iter()
            .chain(
                (self.node.jobs().quarantined()).map(|(channel, job)| format!("{channel} {job}\n")),
            )
            .collect();
        let path = dir.join(crate::jobs_dir::QUARANTINE_FILE);
        let tmp = dir.join(format!("{}.tmp", crate::jobs_dir::QUARANTINE_FILE));
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            warn!(
                "cannot record the quarantined channels in {}: {e}; a restart would not know \
                 them",
                path.display()
            );
        }
    }
}
