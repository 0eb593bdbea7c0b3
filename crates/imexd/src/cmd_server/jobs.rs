//! `ctl jobs create | end | wait`: the command service's side of jobs. Create and end do what a
//! prolog does — write the job file into `OPENIMEX_JOBS_DIR`, or delete it — so a job made by
//! ctl and one made by a file are the same thing, and the files stay the only record (a restart
//! finds both). They then wait, bounded, for the engine to have read the change, so the job is
//! in `ctl jobs` once `create` returns and gone once `end` does. Wait is a push: the engine
//! answers at the step that makes the job stand as asked (`engine/jobs.rs`).
//!
//! `clear` is the owner's word that a channel's ended job left no process on this node, which
//! ends the channel's quarantine (`openimex_core::jobs`: the daemon cannot see that itself).
//!
//! Create, end and clear change who may reach whose memory, so they are taken only where the
//! caller is root: on the command unix socket (root's, 0600), never over TCP, where any local user
//! could reach the port.

use std::path::{Path, PathBuf};
use std::time::Duration;

use openimex_config::jobfile::{JOB_FILE_SUFFIX, JobFile, valid_name};
use openimex_proto::cmd::{
    JobCreateReply, JobCreateRequest, JobEndReply, JobEndRequest, JobReport, JobWaitReply,
    JobWaitRequest,
};
use tokio::sync::mpsc;
use tonic::Status;

use crate::mailbox::{Hosts, Input, JobWant, ask};

/// How long end waits for the engine to have read the deletion it made. The watch of the
/// directory reads it at once; this bounds a daemon too busy to.
const READ_BACK: Duration = Duration::from_secs(5);
/// How long create waits for the engine to read the file it wrote. Past it the file stays (it
/// is the record): create never takes back a file the daemon has not read yet.
const CREATE_READ: Duration = Duration::from_secs(60);
/// Longest `ctl jobs wait` (and its default).
const MAX_WAIT: Duration = Duration::from_secs(3600);
/// The state words a wait may ask for (`JobState::word`), and GONE.
const STATES: [&str; 5] = ["FORMING", "READY", "DEGRADED", "DISAGREED", "GONE"];

/// The jobs directory as the command service writes it.
#[derive(Debug)]
pub(crate) struct JobsAccess {
    /// `OPENIMEX_JOBS_DIR`.
    pub(crate) dir: PathBuf,
    /// The nodes file, named in a member's error.
    pub(crate) nodes_file: PathBuf,
    /// One create or end at a time: a create checks what is there, then writes.
    pub(crate) lock: tokio::sync::Mutex<()>,
}

/// Where a command call came in: job changes are taken only where the caller is root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listener {
    Tcp,
    Unix,
    /// The in-process network of the tests (`world`): no other user there.
    Memory,
}

impl Listener {
    fn may_change_jobs(self) -> bool {
        self != Listener::Tcp
    }
}

/// Why a job change is refused over `listener`, if it is.
fn refuse_over(listener: Listener) -> Result<(), Status> {
    match listener.may_change_jobs() {
        true => Ok(()),
        false => Err(Status::permission_denied(
            "jobs are created and ended only on the command unix socket \
             (IMEX_CMD_UNIX_DOMAIN_PATH), which only root opens: over TCP any local user could \
             ask; use `ctl -u SOCKET` or `-c CONFIG` naming the socket, or write the job file \
             into OPENIMEX_JOBS_DIR",
        )),
    }
}

fn dir_of(jobs: Option<&JobsAccess>) -> Result<&JobsAccess, Status> {
    jobs.ok_or_else(|| {
        Status::failed_precondition(
            "this daemon has no jobs directory: set OPENIMEX_JOBS_DIR in its config.cfg (a \
             directory only root writes) and restart it",
        )
    })
}

fn checked_name(name: &str) -> Result<(), Status> {
    match valid_name(name) {
        true => Ok(()),
        false => Err(Status::invalid_argument(format!(
            "{name:?} is no job name: give 1 to 64 letters, digits, '-', '_' or '.'"
        ))),
    }
}

/// The job file's text for `req`.
fn file_text(req: &JobCreateRequest) -> String {
    let mut text = format!(
        "# written by `openimex ctl jobs create`\nCHANNEL={}\nMEMBERS={}\n",
        req.channel,
        req.members.join(",")
    );
    if !req.owner.is_empty() {
        text += &format!("OWNER={}\n", req.owner);
    }
    text
}

/// `ctl jobs create`: the job file written (checked first as the daemon will read it), then
/// the job as the engine holds it once read.
pub(crate) async fn create(
    engine: &mpsc::Sender<Input>,
    jobs: Option<&JobsAccess>,
    hosts: &Hosts,
    local: openimex_core::NodeId,
    listener: Listener,
    req: JobCreateRequest,
) -> Result<JobCreateReply, Status> {
    refuse_over(listener)?;
    let access = dir_of(jobs)?;
    checked_name(&req.name)?;
    if req.members.iter().any(|m| m.contains([',', '\n', '#'])) {
        return Err(Status::invalid_argument(
            "a member is one nodes-file entry: no ',', '#' or line break in it",
        ));
    }
    if req.owner.contains(['\n', '#']) {
        return Err(Status::invalid_argument("OWNER is uid:gid"));
    }
    let path = access.dir.join(format!("{}{JOB_FILE_SUFFIX}", req.name));
    let text = file_text(&req);
    let nodes = crate::jobs_dir::node_config(&access.nodes_file, &hosts.borrow());
    // The daemon's own reading, so a bad job is refused here rather than written and then
    // ignored with a warning in the log.
    let parsed = JobFile::parse(&text, &path, &nodes).map_err(|e| {
        Status::invalid_argument(match e {
            openimex_config::ConfigError::JobFile { problem, fix, .. } => {
                format!("job {}: {problem}; {fix}", req.name)
            }
            e => e.to_string(),
        })
    })?;
    if !parsed.members.contains(&local.0) {
        return Err(Status::invalid_argument(format!(
            "job {}: this node (node {local}, {}) is not among its members: run `ctl jobs \
             create` on each member (every member holds the job), not here",
            req.name,
            nodes
                .entries
                .get(local.index())
                .map_or("?", |e| e.host.as_str())
        )));
    }
    let written = {
        let _one = access.lock.lock().await;
        let (path, text) = (path.clone(), text.clone());
        tokio::task::spawn_blocking(move || write_new(&path, &text))
            .await
            .map_err(|e| Status::internal(format!("writing the job file: {e}")))??
    };
    let want = JobWant::Read(crate::jobs_dir::spec_of(&parsed));
    let (read, job) = wait_for(engine, &req.name, want, CREATE_READ).await?;
    if !read {
        return Err(Status::deadline_exceeded(format!(
            "job {}: the daemon has not read {} within {} s; the file stays, as the record \
             (`ctl jobs wait {}` follows the job, `ctl jobs end {}` takes the file back)",
            req.name,
            path.display(),
            CREATE_READ.as_secs(),
            req.name,
            req.name
        )));
    }
    if job.is_none() && written {
        // Refused by the node (a channel another job holds here, or one still quarantined):
        // the file is taken back, so no record stays of a job that never was.
        let _one = access.lock.lock().await;
        let _ = std::fs::remove_file(&path);
        return Err(Status::failed_precondition(format!(
            "job {}: the daemon did not define it (its log says why: a channel another job \
             holds on this node, or one still quarantined, `ctl jobs` lists them); nothing was \
             kept",
            req.name
        )));
    }
    Ok(JobCreateReply {
        file: path.display().to_string(),
        written,
        job,
    })
}

/// Writes `text` to `path` whole (a temporary file renamed in, so the watch never reads half
/// of it). `Ok(false)`: the same definition was there already.
fn write_new(path: &Path, text: &str) -> Result<bool, Status> {
    match std::fs::read_to_string(path) {
        Ok(there) if definition(&there) == definition(text) => return Ok(false),
        Ok(_) => {
            return Err(Status::already_exists(format!(
                "{} defines this job otherwise: end it first (`ctl jobs end`), or give the new \
                 job another name",
                path.display()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Status::internal(format!(
                "cannot read {}: {e}",
                path.display()
            )));
        }
    }
    let file = path.file_name().and_then(|n| n.to_str()).unwrap_or("job");
    // A dot file: the directory's reader skips it.
    let tmp = path.with_file_name(format!(".{file}.{}.tmp", std::process::id()));
    let io = |e: std::io::Error| {
        Status::internal(format!(
            "cannot write {}: {e}; check that OPENIMEX_JOBS_DIR is a directory root may write",
            path.display()
        ))
    };
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })?;
    Ok(true)
}

/// A job file's lines that say something (no comments or blanks), to compare two definitions.
fn definition(text: &str) -> Vec<&str> {
    (text.lines())
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect()
}

/// `ctl jobs end`: the job file deleted, then the engine seen to have ended the job.
pub(crate) async fn end(
    engine: &mpsc::Sender<Input>,
    jobs: Option<&JobsAccess>,
    listener: Listener,
    req: JobEndRequest,
) -> Result<JobEndReply, Status> {
    refuse_over(listener)?;
    let access = dir_of(jobs)?;
    checked_name(&req.name)?;
    let path = access.dir.join(format!("{}{JOB_FILE_SUFFIX}", req.name));
    {
        let _one = access.lock.lock().await;
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Status::not_found(format!(
                    "no job file {} (`ctl jobs` lists the jobs this daemon holds)",
                    path.display()
                )));
            }
            Err(e) => {
                return Err(Status::internal(format!(
                    "cannot delete {}: {e}",
                    path.display()
                )));
            }
        }
    }
    let ended = held(engine, &req.name, JobWant::Gone).await?.is_none();
    Ok(JobEndReply {
        file: path.display().to_string(),
        ended,
    })
}

/// The job once it stands as `want` says, or as it stands after [`READ_BACK`].
async fn held(
    engine: &mpsc::Sender<Input>,
    name: &str,
    want: JobWant,
) -> Result<Option<JobReport>, Status> {
    Ok(wait_for(engine, name, want, READ_BACK).await?.1)
}

/// Waits up to `limit` for `name` to stand as `want` says: (reached, the job as it stands).
async fn wait_for(
    engine: &mpsc::Sender<Input>,
    name: &str,
    want: JobWant,
    limit: Duration,
) -> Result<(bool, Option<JobReport>), Status> {
    let (reply, rx) = tokio::sync::oneshot::channel();
    let input = Input::JobWait {
        name: name.to_string(),
        want,
        reply,
    };
    engine
        .send(input)
        .await
        .map_err(|_| Status::unavailable("daemon is stopping"))?;
    match tokio::time::timeout(limit, rx).await {
        Ok(Ok(job)) => Ok((true, job)),
        Ok(Err(_)) => Err(Status::unavailable(format!(
            "the daemon did not answer about job {name}: it is stopping, or keeps as many \
             callers waiting as it will"
        ))),
        // Dropping the receiver tells the engine to forget the waiter.
        Err(_) => {
            let all = ask(engine, |reply| Input::Jobs { reply }).await?;
            Ok((false, all.jobs.into_iter().find(|j| j.name == name)))
        }
    }
}

/// `ctl jobs clear`: the owner's word that `channel`'s ended job left no process here.
pub(crate) async fn clear(
    engine: &mpsc::Sender<Input>,
    listener: Listener,
    req: openimex_proto::cmd::JobChannelClearRequest,
) -> Result<openimex_proto::cmd::JobChannelClearReply, Status> {
    refuse_over(listener)?;
    let channel = req.channel;
    let ended = ask(engine, |reply| Input::JobChannelClear { channel, reply }).await?;
    Ok(openimex_proto::cmd::JobChannelClearReply {
        ended: ended.unwrap_or_default(),
    })
}

/// `ctl jobs wait`: answered when the job stands in the asked state, or at the timeout.
pub(crate) async fn wait(
    engine: &mpsc::Sender<Input>,
    req: JobWaitRequest,
) -> Result<JobWaitReply, Status> {
    checked_name(&req.name)?;
    let word = match req.state.as_str() {
        "" => "READY",
        w => w,
    };
    let want = match word {
        "GONE" => JobWant::Gone,
        w if STATES.contains(&w) => JobWant::State(w.to_string()),
        w => {
            return Err(Status::invalid_argument(format!(
                "{w:?} is no job state: give one of {}",
                STATES.join(", ")
            )));
        }
    };
    let limit = match req.timeout_ms {
        0 => MAX_WAIT,
        ms => Duration::from_millis(u64::from(ms)).min(MAX_WAIT),
    };
    let (reached, job) = wait_for(engine, &req.name, want, limit).await?;
    Ok(JobWaitReply { reached, job })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_definition_is_recognised_whatever_its_comments() {
        let a = "# written by ctl\nCHANNEL=3\nMEMBERS=a,b\n";
        let b = "CHANNEL=3   # the job's\n\nMEMBERS=a,b";
        assert_eq!(definition(a), definition(b));
        assert_ne!(definition(a), definition("CHANNEL=4\nMEMBERS=a,b\n"));
    }

    #[test]
    fn job_changes_are_refused_over_tcp_only() {
        let e = refuse_over(Listener::Tcp).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("IMEX_CMD_UNIX_DOMAIN_PATH"));
        assert!(refuse_over(Listener::Unix).is_ok());
    }
}
