//! Jobs: isolated IMEX domains inside the domain of the nodes file, created and ended while the
//! daemon runs. A job is a name, one IMEX channel and a set of member nodes (optionally the uid
//! and gid that may open the channel). This module is one node's table of jobs and every
//! decision about them; it performs nothing (the owner writes channel devices, reads job files,
//! carries what peers said).
//!
//! - **Defined locally.** Each member defines the job itself (a prolog runs on every node of a
//!   job): [`Jobs::define`] refuses, with the reason, a job this node is not a member of, one
//!   naming a node outside the nodes file, a channel another job holds here, a channel still in
//!   quarantine, and another definition under a name already defined. Defining the same job
//!   again is a no-op, so a job file read twice (a restart, a rescan) changes nothing.
//! - **Compared over sessions.** Members tell each other the digest of each job they share
//!   ([`Jobs::told`]); a member that holds another definition under the name is a
//!   [`JobState::Disagreed`] state naming the member, never a silent half-job.
//! - **Ready per job.** [`Jobs::state`] is READY when this node holds a session with every other
//!   member and each said the same definition; a member lost after READY makes the job
//!   DEGRADED, other jobs untouched.
//! - **Isolation.** Once a job was defined here, an import is served only if a job here owns
//!   the import's channel, has both nodes as members, and the other node said the same
//!   definition ([`Jobs::admit`]); otherwise it is refused with the reason, also after the last
//!   job ended (its channel's strays must stay out). Until the first job this module admits
//!   everything: the daemon is exactly the domain-wide daemon it was.
//! - **Ended.** Ending a job refuses every new import under it at once, on this node and (once
//!   told) on its members. Imports already mapped are left mapped: an epilog runs once the
//!   job's processes are gone, and their imports went with them (the driver unimports what an
//!   exiting process held); a stray process that outlives its job keeps what it mapped before
//!   the end, memory of its own job, and maps nothing new from another node: the one thing it
//!   still gets is memory its node has imported already for a process of the job still
//!   holding it, which the driver hands out from its cache on the same channel without asking
//!   the daemon (`docs/reference/driver-interface.md` §2, IMPORT_V2) — memory of its own job again,
//!   and the channel it holds goes to no other job (below). Revoking them is not
//!   in the daemon's power per job: DISABLE_IMPORTERS (`docs/reference/driver-interface.md` §1.6)
//!   acts on every importer of one exporting node, whatever the channel, so using it at a job's
//!   end would break the other jobs on that node (the lost-node rules use it because there the
//!   whole node is gone).
//! - **Channel reuse.** An ended job's channel goes into quarantine on this node
//!   ([`Jobs::end`]) and is handed to no job until the owner reports it clear
//!   ([`Jobs::channel_clear`]). A process of the ended job may still hold an RM client
//!   subscribed to the channel (the subscription outlives the channel's file descriptor, and
//!   exports record the channel they were made on: `docs/reference/driver-interface.md` §1.4, §2), and
//!   such a process could export on it at any time; nothing in an export tells which job made
//!   it. So the guarantee that a later job never reaches memory of an earlier one rests on the
//!   channel not being given to the later job on this node while such a process may live, and
//!   the owner decides when none may. The daemon cannot see which RM clients are subscribed
//!   to a channel, so it never decides that on its own while the node runs: the quarantine is
//!   kept across restarts, and only a reboot (no process of an earlier boot survives) or the
//!   owner's word ([`Jobs::channel_clear`]) ends it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sha2::{Digest, Sha256};

use crate::ids::NodeId;
use crate::nodemap::NodeMap;

/// Longest job name (bytes): names travel in hellos and notifications and show in `ctl`.
pub const MAX_JOB_NAME: usize = 64;

/// One job as defined on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// The job's name (a Slurm job ID, a ComputeDomain's name): letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// The IMEX channel the job's processes open.
    pub channel: u32,
    /// The member nodes.
    pub members: BTreeSet<NodeId>,
    /// The uid and gid that may open the channel (`None`: root only).
    pub owner: Option<(u32, u32)>,
}

impl JobSpec {
    /// SHA-256 over the definition (name, channel, members in order, owner), hex: members
    /// compare it to know they hold the same job.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.name.as_bytes());
        h.update([0]);
        h.update(self.channel.to_be_bytes());
        for m in &self.members {
            h.update(m.0.to_be_bytes());
        }
        match self.owner {
            Some((uid, gid)) => {
                h.update([1]);
                h.update(uid.to_be_bytes());
                h.update(gid.to_be_bytes());
            }
            None => h.update([0]),
        }
        hex(&h.finalize())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why a definition was refused. Each names the job, the thing and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefineError {
    /// The name is empty, too long or holds other characters than letters, digits, `-`, `_`, `.`.
    BadName(String),
    /// This node is not among the members: each member defines the job itself.
    NotAMember {
        /// The job.
        job: String,
        /// This node.
        node: NodeId,
    },
    /// A member is not a node of the nodes file (or is a placeholder line).
    UnknownNode {
        /// The job.
        job: String,
        /// The member.
        node: NodeId,
    },
    /// Another job holds the channel on this node.
    ChannelTaken {
        /// The job.
        job: String,
        /// The channel.
        channel: u32,
        /// The job holding it.
        by: String,
    },
    /// The channel belonged to a job that ended here, and processes of that job may still hold
    /// it.
    ChannelQuarantined {
        /// The job.
        job: String,
        /// The channel.
        channel: u32,
        /// The job that ended.
        ended: String,
    },
    /// A job of this name is defined with another channel, members or owner.
    Redefined {
        /// The job.
        job: String,
    },
}

impl fmt::Display for DefineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadName(name) => write!(
                f,
                "job name {name:?} is not valid: use 1 to {MAX_JOB_NAME} letters, digits, '-', \
                 '_' or '.'"
            ),
            Self::NotAMember { job, node } => write!(
                f,
                "job {job}: this node ({node}) is not one of its members; define a job on its \
                 members only"
            ),
            Self::UnknownNode { job, node } => write!(
                f,
                "job {job}: member {node} is not a node of the nodes file; add it there (and \
                 send SIGUSR1) or leave it out of the job"
            ),
            Self::ChannelTaken { job, channel, by } => write!(
                f,
                "job {job}: channel {channel} belongs to job {by} on this node; give the job \
                 another channel or end {by} first"
            ),
            Self::ChannelQuarantined {
                job,
                channel,
                ended,
            } => write!(
                f,
                "job {job}: channel {channel} belonged to job {ended}, which ended here while \
                 processes of it may still use the channel; give the job another channel, or \
                 wait until they are gone"
            ),
            Self::Redefined { job } => write!(
                f,
                "job {job} is already defined here with another channel, members or owner; end \
                 it first or use another name"
            ),
        }
    }
}

/// Why an import was refused under the jobs of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportRefusal {
    /// No job here owns the channel.
    NoJob {
        /// The import's channel.
        channel: u32,
    },
    /// The job owning the channel does not have the other node as a member.
    NotAMember {
        /// The job.
        job: String,
        /// The other node.
        node: NodeId,
    },
    /// The other node has not said it holds the same definition of the job.
    NotAgreed {
        /// The job.
        job: String,
        /// The other node.
        node: NodeId,
    },
}

impl fmt::Display for ImportRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoJob { channel } => write!(f, "no job on this node owns channel {channel}"),
            Self::NotAMember { job, node } => {
                write!(f, "node {node} is not a member of job {job}")
            }
            Self::NotAgreed { job, node } => {
                write!(
                    f,
                    "node {node} does not hold job {job} as this node defines it"
                )
            }
        }
    }
}

/// A job's state as this node sees it (`ctl -q` for the job prints its word).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for these members: no session with them yet, or they have not said the job.
    Forming(Vec<NodeId>),
    /// Every other member holds a session with this node and said the same definition.
    Ready,
    /// Was READY; these members are lost (no session) now.
    Degraded(Vec<NodeId>),
    /// These members hold another definition under the job's name.
    Disagreed(Vec<NodeId>),
}

impl JobState {
    /// The word `ctl -q` prints for the job.
    pub fn word(&self) -> &'static str {
        match self {
            Self::Forming(_) => "FORMING",
            Self::Ready => "READY",
            Self::Degraded(_) => "DEGRADED",
            Self::Disagreed(_) => "DISAGREED",
        }
    }
}

#[derive(Debug, Clone)]
struct Job {
    spec: JobSpec,
    digest: String,
    was_ready: bool,
}

/// One node's jobs.
#[derive(Debug, Clone)]
pub struct Jobs {
    local: NodeId,
    jobs: BTreeMap<String, Job>,
    /// Channel → the job holding it here.
    held: BTreeMap<u32, String>,
    /// Channel → the job that ended holding it, until the owner reports it clear.
    quarantine: BTreeMap<u32, String>,
    /// A job was defined here once: job rules hold from then on.
    used: bool,
    /// What each peer last said it holds with this node as a member: job name → digest. Kept
    /// whole, also for jobs not (yet) defined here: a member that defines a job after its
    /// peers told it theirs must find what they said.
    /// With the epoch of the list it came in: lists of one instance are numbered as it sent
    /// them, and one overtaken by an older one (sent on the same session, by tasks that raced)
    /// must not bring the older one back.
    heard: BTreeMap<NodeId, (u64, BTreeMap<String, String>)>,
}

impl Jobs {
    /// No jobs, on node `local`.
    pub fn new(local: NodeId) -> Self {
        Self {
            local,
            jobs: BTreeMap::new(),
            held: BTreeMap::new(),
            quarantine: BTreeMap::new(),
            used: false,
            heard: BTreeMap::new(),
        }
    }

    /// The node this table belongs to.
    pub fn local(&self) -> NodeId {
        self.local
    }

    /// Whether any job is defined now.
    pub fn any(&self) -> bool {
        !self.jobs.is_empty()
    }

    /// Whether a job was ever defined here: until then every import is admitted, as before jobs.
    pub fn in_use(&self) -> bool {
        self.used
    }

    /// The job named `name`.
    pub fn spec(&self, name: &str) -> Option<&JobSpec> {
        self.jobs.get(name).map(|j| &j.spec)
    }

    /// The names of the jobs, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.jobs.keys().map(String::as_str)
    }

    /// Defines `spec` on this node against `map` (the nodes file). The same definition again
    /// is a no-op (`Ok(false)`); a new one is `Ok(true)`.
    pub fn define(&mut self, spec: JobSpec, map: &NodeMap) -> Result<bool, DefineError> {
        let job = spec.name.clone();
        if job.is_empty()
            || job.len() > MAX_JOB_NAME
            || !job
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(DefineError::BadName(job));
        }
        if let Some(known) = self.jobs.get(&job) {
            return match known.spec == spec {
                true => Ok(false),
                false => Err(DefineError::Redefined { job }),
            };
        }
        if !spec.members.contains(&self.local) {
            return Err(DefineError::NotAMember {
                job,
                node: self.local,
            });
        }
        if let Some(&node) =
            (spec.members.iter()).find(|n| n.index() >= map.len() || map.is_placeholder(**n))
        {
            return Err(DefineError::UnknownNode { job, node });
        }
        if let Some(by) = self.held.get(&spec.channel) {
            return Err(DefineError::ChannelTaken {
                job,
                channel: spec.channel,
                by: by.clone(),
            });
        }
        // The same job back (its file rewritten): its own processes are no strays to it.
        if let Some(ended) = self.quarantine.get(&spec.channel).filter(|e| **e != job) {
            return Err(DefineError::ChannelQuarantined {
                job,
                channel: spec.channel,
                ended: ended.clone(),
            });
        }
        self.quarantine.remove(&spec.channel);
        self.held.insert(spec.channel, job.clone());
        self.used = true;
        let digest = spec.digest();
        self.jobs.insert(
            job,
            Job {
                spec,
                digest,
                was_ready: false,
            },
        );
        Ok(true)
    }

    /// Ends the job named `name` here: no import is admitted under it from now on, and its
    /// channel is quarantined until [`Jobs::channel_clear`]. Returns its definition, or
    /// `None` if no such job is defined.
    pub fn end(&mut self, name: &str) -> Option<JobSpec> {
        let job = self.jobs.remove(name)?;
        self.held.remove(&job.spec.channel);
        self.quarantine
            .insert(job.spec.channel, job.spec.name.clone());
        Some(job.spec)
    }

    /// The channels in quarantine, with the job that ended holding each.
    pub fn quarantined(&self) -> impl Iterator<Item = (u32, &str)> {
        self.quarantine.iter().map(|(c, j)| (*c, j.as_str()))
    }

    /// The quarantine as recorded before this daemon started (the owner keeps it beside the
    /// job files): a restart must not hand an ended job's channel to another job while that
    /// job's processes may still hold it. A channel a job here holds now is left to it.
    pub fn restore_quarantine(&mut self, ended: &[(u32, String)]) {
        for (channel, job) in ended {
            if !self.held.contains_key(channel) {
                self.quarantine.insert(*channel, job.clone());
            }
        }
    }

    /// The owner found that no process of the job that ended holding `channel` remains: the
    /// channel may go to another job.
    pub fn channel_clear(&mut self, channel: u32) {
        self.quarantine.remove(&channel);
    }

    /// What this node tells `peer` of the jobs they share: (name, digest) of each job here
    /// that has `peer` as a member.
    pub fn told(&self, peer: NodeId) -> Vec<(String, String)> {
        (self.jobs.values())
            .filter(|j| j.spec.members.contains(&peer))
            .map(|j| (j.spec.name.clone(), j.digest.clone()))
            .collect()
    }

    /// `peer` said which jobs it holds with this node as a member (all of them: a job it does
    /// not name, it does not hold), in its list numbered `epoch`; a list older than one taken
    /// from it already changes nothing.
    pub fn peer_said(&mut self, peer: NodeId, jobs: &[(String, String)], epoch: u64) {
        if self.heard.get(&peer).is_some_and(|(seen, _)| epoch < *seen) {
            return;
        }
        self.heard
            .insert(peer, (epoch, jobs.iter().cloned().collect()));
    }

    /// `peer` is gone (its instance left or was replaced): what it said no longer holds.
    pub fn peer_gone(&mut self, peer: NodeId) {
        self.heard.remove(&peer);
    }

    /// What `peer` said of job `name`: `None` if it said nothing yet, `Some(None)` if it holds
    /// no job of that name, else the digest of its definition.
    fn said(&self, peer: NodeId, name: &str) -> Option<Option<&String>> {
        self.heard.get(&peer).map(|(_, jobs)| jobs.get(name))
    }

    /// The state of job `name`, given which peers this node holds a session with.
    pub fn state(&mut self, name: &str, connected: impl Fn(NodeId) -> bool) -> Option<JobState> {
        let local = self.local;
        let job = self.jobs.get(name)?;
        let others: Vec<NodeId> = (job.spec.members.iter().copied())
            .filter(|m| *m != local)
            .collect();
        let disagreed: Vec<NodeId> = (others.iter().copied())
            .filter(|m| matches!(self.said(*m, name), Some(Some(d)) if *d != job.digest))
            .collect();
        if !disagreed.is_empty() {
            return Some(JobState::Disagreed(disagreed));
        }
        let lost: Vec<NodeId> = others.iter().copied().filter(|m| !connected(*m)).collect();
        let unsaid: Vec<NodeId> = (others.iter().copied())
            .filter(|m| connected(*m))
            .filter(|m| self.said(*m, name) != Some(Some(&job.digest)))
            .collect();
        let state = match (lost.is_empty(), unsaid.is_empty()) {
            (true, true) => JobState::Ready,
            (false, _) if job.was_ready => JobState::Degraded(lost),
            _ => JobState::Forming(lost.into_iter().chain(unsaid).collect()),
        };
        if let Some(job) = self.jobs.get_mut(name) {
            job.was_ready |= state == JobState::Ready;
        }
        Some(state)
    }

    /// Whether an import between this node and `other` on `channel` is admitted: always until
    /// the first job is defined here; from then on only under a job here that owns the channel, has `other` as a
    /// member, and that `other` said it holds as this node does. Returns the job's name.
    pub fn admit(&self, channel: u32, other: NodeId) -> Result<Option<&str>, ImportRefusal> {
        if !self.used {
            return Ok(None);
        }
        let Some(name) = self.held.get(&channel) else {
            return Err(ImportRefusal::NoJob { channel });
        };
        let Some(job) = self.jobs.get(name) else {
            return Err(ImportRefusal::NoJob { channel });
        };
        if other == self.local {
            return Ok(Some(name));
        }
        if !job.spec.members.contains(&other) {
            return Err(ImportRefusal::NotAMember {
                job: name.clone(),
                node: other,
            });
        }
        match self.said(other, name) {
            Some(Some(d)) if *d == job.digest => Ok(Some(name)),
            _ => Err(ImportRefusal::NotAgreed {
                job: name.clone(),
                node: other,
            }),
        }
    }
}
