//! The engine's part in jobs (`openimex_core::node` jobs): the jobs of the job files
//! (`jobs_dir`) defined and ended in the node as files appear and go, telling a member the jobs
//! it shares with this node, and taking a member's list off the wire (bounded: a peer's words
//! cannot grow the table past what any real domain of jobs needs).

use std::collections::{BTreeMap, BTreeSet};

use openimex_core::jobs::{JobSpec, MAX_JOB_NAME};
use openimex_proto::peer::session_msg::Body;
use openimex_proto::peer::{JobDigest, JobsHeld};
use tracing::{debug, info, warn};

use super::{Engine, now};
use crate::mailbox::{Input, JobWant};

/// Most jobs a peer's list may name to be believed: as many as a node reads job files
/// (`jobs_dir`), far more than one node can run.
const MAX_PEER_JOBS: usize = 1 << 16;
/// A definition digest: SHA-256 in hex.
const DIGEST_LEN: usize = 64;

impl Engine {
    /// [`openimex_core::node::Action::SendJobs`]: the list on the pair's session; reported only
    /// when not taken (`Engine::notify`).
    pub(super) fn send_jobs(
        &mut self,
        peer: openimex_core::NodeId,
        jobs: Vec<(String, String)>,
        epoch: u64,
    ) {
        let jobs = (jobs.into_iter())
            .map(|(name, digest)| JobDigest { name, digest })
            .collect();
        let body = Body::JobsHeld(JobsHeld { jobs, epoch });
        let not_sent = |peer| Input::JobsSent { peer, sent: false };
        if !self.notify(peer, body, "the jobs it shares with this node", not_sent) {
            self.node.handle_jobs_sent(now(), peer, false);
        }
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
    /// The definitions the node refused at the last read, by job name ([`JobWant::Read`]).
    refused: BTreeMap<String, JobSpec>,
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
        let mut refused = BTreeMap::new();
        let wanted: BTreeMap<String, (std::path::PathBuf, JobSpec)> = (files.jobs.into_iter())
            .map(|f| {
                let spec = crate::jobs_dir::spec_of(&f);
                (f.name, (f.path, spec))
            })
            .collect();
        let gone: Vec<String> = (self.job_files.jobs.iter())
            .filter(|(name, spec)| wanted.get(*name).map(|(_, s)| s) != Some(*spec))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &gone {
            self.job_files.jobs.remove(name);
        }
        let mut paths = BTreeMap::new();
        let define: Vec<JobSpec> = (wanted.into_iter())
            .filter(|(name, _)| !self.job_files.jobs.contains_key(name))
            .map(|(name, (path, spec))| {
                paths.insert(name, path);
                spec
            })
            .collect();
        // One batch: each member told once, however many jobs the read changed.
        let changed = self.node.handle_jobs_changed(now, &gone, define);
        for spec in &changed.ended {
            info!(
                "job {} ended (its file is gone or changed): channel {} is kept from other jobs \
                 on this node while its processes may remain",
                spec.name, spec.channel
            );
            self.remove_channel(spec);
        }
        if !changed.ended.is_empty() {
            self.record_quarantine();
        }
        for (spec, result) in changed.defined {
            let path = paths.remove(&spec.name).unwrap_or_default();
            match result {
                Ok(new) => {
                    if new {
                        let members: Vec<String> =
                            spec.members.iter().map(ToString::to_string).collect();
                        info!(
                            "job {} defined from {}: channel {}, members {}",
                            spec.name,
                            path.display(),
                            spec.channel,
                            members.join(",")
                        );
                        self.create_channel(&spec);
                    }
                    self.job_files.jobs.insert(spec.name.clone(), spec);
                }
                Err(e) => {
                    problems.insert(format!("{}: {e}", path.display()));
                    refused.insert(spec.name.clone(), spec.clone());
                }
            }
        }
        for p in problems.difference(&self.job_files.problems) {
            warn!("job file ignored: {p}");
        }
        self.job_files.problems = problems;
        self.job_files.refused = refused;
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
        let names: Vec<String> = self.node.jobs().names().map(str::to_string).collect();
        let jobs = (names.iter()).filter_map(|n| self.job_report(n)).collect();
        let quarantined = self.node.jobs().quarantined().map(|(c, _)| c).collect();
        openimex_proto::cmd::JobsReply { jobs, quarantined }
    }

    /// One job as `ctl jobs` shows it (`None`: not held here, or its state cannot be given).
    fn job_report(&mut self, name: &str) -> Option<openimex_proto::cmd::JobReport> {
        use openimex_core::jobs::JobState;
        let state = self.node.job_state(name)?;
        let spec = self.node.jobs().spec(name)?;
        let nodes = match &state {
            JobState::Ready => &[][..],
            JobState::Forming(n) | JobState::Degraded(n) | JobState::Disagreed(n) => n,
        };
        Some(openimex_proto::cmd::JobReport {
            name: spec.name.clone(),
            channel: spec.channel,
            members: spec.members.iter().map(|m| u32::from(m.0)).collect(),
            state: state.word().to_string(),
            nodes: nodes.iter().map(|m| u32::from(m.0)).collect(),
            owner: spec
                .owner
                .map(|(u, g)| format!("{u}:{g}"))
                .unwrap_or_default(),
        })
    }

    /// [`Input::JobWait`]: answered now if the job already stands as wanted, else kept (at
    /// most [`MAX_JOB_WAITERS`]; one more is answered at once with the job as it stands, so
    /// the asker sees "not reached" rather than a daemon that keeps every asker forever).
    pub(super) fn job_wait(&mut self, waiter: JobWaiter) {
        let waiter = match self.try_answer(waiter) {
            Some(w) => w,
            None => return,
        };
        if self.job_waiters.len() >= MAX_JOB_WAITERS {
            // "Not read" has no answer to give: the asker sees no answer (its reply dropped).
            if !matches!(waiter.want, JobWant::Read(_)) {
                let job = self.job_report(&waiter.name);
                let _ = waiter.reply.send(job);
            }
            return;
        }
        self.job_waiters.push(waiter);
    }

    /// Answers every waiter whose job now stands as it wants; drops those whose asker left.
    /// Run after every input and timer, so a wait ends at the step that makes it true.
    pub(super) fn answer_job_waiters(&mut self) {
        if self.job_waiters.is_empty() {
            return;
        }
        let waiters = std::mem::take(&mut self.job_waiters);
        self.job_waiters = (waiters.into_iter())
            .filter(|w| !w.reply.is_closed())
            .filter_map(|w| self.try_answer(w))
            .collect();
    }

    /// Answers `waiter` if its job stands as it wants; else gives it back.
    fn try_answer(&mut self, waiter: JobWaiter) -> Option<JobWaiter> {
        let job = self.job_report(&waiter.name);
        let reached = match (&waiter.want, &job) {
            (JobWant::Gone, None) => true,
            (JobWant::State(word), Some(j)) => j.state == *word,
            (JobWant::Read(_), Some(_)) => true,
            // Refused at the last read: the file that read took defined the job as asked (the
            // file just written, whether that read came before the wait or after it), not
            // another definition under the name.
            (JobWant::Read(spec), None) => self.job_files.refused.get(&waiter.name) == Some(spec),
            _ => false,
        };
        if !reached {
            return Some(waiter);
        }
        let _ = waiter.reply.send(job);
        None
    }
}

/// Most `ctl jobs wait` (and create/end) callers kept waiting at once: one per job a node could
/// run, with room; each is a name and a channel end.
const MAX_JOB_WAITERS: usize = 4096;

/// One [`Input::JobWait`] waiting.
pub(super) struct JobWaiter {
    pub(super) name: String,
    pub(super) want: JobWant,
    pub(super) reply: tokio::sync::oneshot::Sender<Option<openimex_proto::cmd::JobReport>>,
}

impl Engine {
    /// `ctl jobs clear`: `channel` leaves quarantine on the owner's word, and the record says
    /// so. The job that ended holding it, if it was quarantined.
    pub(super) fn channel_clear(&mut self, channel: u32) -> Option<String> {
        let ended = (self.node.jobs().quarantined())
            .find(|(c, _)| *c == channel)
            .map(|(_, job)| job.to_string())?;
        self.node.handle_job_channel_clear(now(), channel);
        info!(
            "channel {channel} released by the owner: no process of job {ended}, which ended \
             holding it, remains on this node; another job may have it"
        );
        self.record_quarantine();
        Some(ended)
    }

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
