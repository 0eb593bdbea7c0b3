//! The engine's part in jobs (`openimex_core::node` jobs): telling a member the jobs it shares
//! with this node, and taking a member's list off the wire (bounded: a peer's words cannot
//! grow the table past what any real domain of jobs needs).

use openimex_core::jobs::MAX_JOB_NAME;
use openimex_proto::peer::session_msg::Body;
use openimex_proto::peer::{JobDigest, JobsHeld};
use tracing::debug;

use super::{Engine, now};
use crate::mailbox::Input;

/// Most jobs a peer's list may name to be believed (more than one node could hold: a job has
/// one channel, and a node has at most 2^20 channels).
const MAX_PEER_JOBS: usize = 1 << 20;
/// A definition digest: SHA-256 in hex.
const DIGEST_LEN: usize = 64;

impl Engine {
    /// [`openimex_core::node::Action::SendJobs`]: the list on the pair's session, reported as
    /// taken or not.
    pub(super) fn send_jobs(&mut self, peer: openimex_core::NodeId, jobs: Vec<(String, String)>) {
        let Some(session) = self.session(peer) else {
            self.node.handle_jobs_sent(now(), peer, false);
            return;
        };
        let jobs = (jobs.into_iter())
            .map(|(name, digest)| JobDigest { name, digest })
            .collect();
        let body = Body::JobsHeld(JobsHeld { jobs });
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
        self.node.handle_session_jobs(now(), via, &jobs);
    }
}
