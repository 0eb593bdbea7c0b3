//! Jobs in the simulation (issue 31): each member's prolog defines its job (a job file, which
//! outlives the daemon: a restarted daemon defines it again), its epilog ends it, and now and
//! then one member's prolog writes another definition (a disagreement). The invariant, kept
//! from the owner's side of the world, not from the node's tables: once jobs are in use on an
//! exporter, it describes an export for a peer only under a job it holds (as the world defined
//! it) that owns the import's channel, has the importer as a member, and that the importer's
//! asking instance defined the same way; and never on a channel a job that ended there held,
//! for another job (a stray of the ended job may still export on it).

use std::collections::{BTreeMap, BTreeSet};

use openimex_core::NodeId;
use openimex_core::jobs::JobSpec;

use super::{Op, World};

/// A scheduled prolog or epilog.
#[derive(Debug, Clone)]
pub enum JobOp {
    /// Member `usize`'s prolog writes this job's file.
    Define(usize, JobSpec),
    /// Member `usize`'s epilog deletes the file of the job of this name.
    End(usize, String),
}

/// What the world did with one daemon's jobs.
#[derive(Debug, Default)]
pub struct DaemonJobs {
    /// Defined and accepted by the node, not ended.
    pub held: BTreeMap<String, JobSpec>,
    /// The digests of every job this instance accepted.
    pub ever: BTreeSet<String>,
    /// Channel → the job that ended holding it on this instance.
    pub ended: BTreeMap<u32, String>,
}

impl World {
    /// A job starts on a random set of nodes around `i`: each member's prolog at a moment of
    /// its own, one in a hundred with another channel, and each epilog some seconds later.
    pub(crate) fn job_starts(&mut self, i: usize) {
        let (n, now) = (self.p.n, self.now);
        self.stats.jobs_started += 1;
        let name = format!("j{}", self.stats.jobs_started);
        let channel = u32::from(self.rng.chance(300));
        let mut members: BTreeSet<NodeId> = (0..n)
            .filter(|_| self.rng.chance(600))
            .map(Self::id)
            .collect();
        members.insert(Self::id(i));
        members.insert(Self::id((i + 1 + self.rng.below(n - 1)) % n));
        let spec = JobSpec {
            name: name.clone(),
            channel,
            members: members.clone(),
            owner: None,
        };
        self.note(|| format!("JOB {name} on channel {channel}, members {members:?}"));
        for m in members {
            let mut mine = spec.clone();
            if self.rng.chance(10) {
                mine.channel ^= 1;
            }
            let at = self.rng.ms(0, 1_500);
            let end = at + self.rng.ms(1_000, 12_000);
            self.job_ops.push(JobOp::Define(m.index(), mine));
            self.schedule_op(now + at, Op::Job(self.job_ops.len() - 1));
            self.job_ops.push(JobOp::End(m.index(), name.clone()));
            self.schedule_op(now + end, Op::Job(self.job_ops.len() - 1));
        }
    }

    /// Performs job operation `k`.
    pub(crate) fn job_op(&mut self, k: usize) {
        match self.job_ops[k].clone() {
            JobOp::Define(i, spec) => {
                self.slots[i]
                    .job_files
                    .insert(spec.name.clone(), spec.clone());
                self.define_in_daemon(i, spec);
            }
            JobOp::End(i, name) => {
                self.slots[i].job_files.remove(&name);
                let now = self.now;
                let Some(d) = self.slots[i].daemon.as_mut() else {
                    return;
                };
                if d.exiting {
                    return;
                }
                if let Some(spec) = d.jobs.held.remove(&name) {
                    d.jobs.ended.insert(spec.channel, name.clone());
                }
                let ended = d.node.handle_job_end(now, &name);
                self.note(|| format!("node {i}: job {name} ended ({})", ended.is_some()));
                self.pump();
            }
        }
    }

    /// The daemon of node `i` (running) reads job `spec`'s file: the world records what the
    /// node accepted.
    pub(crate) fn define_in_daemon(&mut self, i: usize, spec: JobSpec) {
        let now = self.now;
        let Some(d) = self.slots[i].daemon.as_mut() else {
            return;
        };
        if d.exiting {
            return;
        }
        let name = spec.name.clone();
        match d.node.handle_job_define(now, spec.clone()) {
            Ok(_) => {
                d.jobs.ever.insert(spec.digest());
                d.jobs.held.insert(name.clone(), spec);
                self.stats.jobs_defined += 1;
                self.note(|| format!("node {i}: job {name} defined"));
            }
            Err(e) => {
                self.stats.jobs_refused += 1;
                self.note(|| format!("node {i}: job {name} refused: {e}"));
            }
        }
        self.pump();
    }

    /// A restarted daemon reads its job files again.
    pub(crate) fn define_from_files(&mut self, i: usize) {
        let files: Vec<JobSpec> = self.slots[i].job_files.values().cloned().collect();
        for spec in files {
            self.define_in_daemon(i, spec);
        }
    }

    /// Exporter `i` describes an export on `channel` for `client`'s instance `client_inst`:
    /// allowed by the jobs as the world defined them?
    pub(crate) fn check_job_serve(
        &mut self,
        i: usize,
        client: usize,
        client_inst: openimex_core::InstanceId,
        channel: u32,
    ) {
        let Some(d) = self.slots[i].daemon.as_ref() else {
            return;
        };
        if !d.node.jobs().in_use() {
            return;
        }
        let client_node = Self::id(client);
        let client_ever = (self.slots[client].daemon.as_ref())
            .filter(|c| c.instance == client_inst)
            .map(|c| &c.jobs.ever);
        let under = (d.jobs.held.values()).find(|s| {
            s.channel == channel
                && s.members.contains(&client_node)
                && client_ever.is_none_or(|ever| ever.contains(&s.digest()))
        });
        match under {
            None => self.violate(format!(
                "node {i}: served channel {channel} to node {client} outside every job both \
                 hold: {:?}",
                d.jobs.held
            )),
            Some(s) => {
                if let Some(ended) = d.jobs.ended.get(&channel).filter(|e| **e != s.name) {
                    let what = format!(
                        "node {i}: served channel {channel} under job {} while job {ended}, \
                         which ended holding it, may have strays there",
                        s.name
                    );
                    self.violate(what);
                }
            }
        }
    }
}
