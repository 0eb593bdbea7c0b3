//! `OPENIMEX_JOBS_DIR`: the job files ([`openimex_config::jobfile`]) as the daemon's record of
//! the jobs a prolog or a node agent defined on this node. The directory is read at start and
//! again at once whenever a file in it is written, moved or deleted (inotify), with a slow
//! rescan as a safety net (a directory replaced under us, a missed event). Each read hands the
//! engine the whole set ([`Input::JobFiles`]): the jobs of the valid files, and the problems of
//! the others (file:line, the fix); the engine defines what is new and ends what is gone, so a
//! deleted file ends its job and a restart finds the same jobs again.
//!
//! The daemon keeps one file of its own there, [`QUARANTINE_FILE`]: the channels of jobs that
//! ended on this node (`CHANNEL JOB` per line), so a restarted daemon does not hand one to
//! another job while the ended job's processes may still hold it. It is read once, at start.
//! Its first line names the boot it was written in (`boot <boot_id>`): after a reboot no
//! process of any earlier job can be alive, so a record of another boot is no quarantine.
//!
//! A prolog should write a job file whole (write elsewhere, then rename into the directory):
//! a file read while half written is a malformed job until its last write lands and is read
//! again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent};
use openimex_config::jobfile::{JOB_FILE_SUFFIX, JobFile};
use openimex_config::{NodeConfig, NodeEntry};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tracing::warn;

use crate::mailbox::{Hosts, Input, JobFiles};

/// The daemon's record of the quarantined channels, in the jobs directory (a dot file: no job).
pub(crate) const QUARANTINE_FILE: &str = ".quarantine";

/// Where the kernel says which boot this is.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This boot's ID (`None` if the kernel does not say).
pub(crate) fn boot_id() -> Option<String> {
    std::fs::read_to_string(BOOT_ID)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The safety net's period: the directory is read again this often even without an event.
const RESCAN: Duration = Duration::from_secs(30);
/// Most job files read: a node holds at most one job per channel, and a directory with more
/// files than any node could use is read this far (in name order), the rest reported.
const MAX_JOB_FILES: usize = 1 << 16;

/// Watches `dir` until the engine stops, sending it every read. The directory is created if
/// missing (root-only, 0700: job files decide who may reach whose memory).
pub(crate) async fn run(
    dir: PathBuf,
    nodes_file: Option<PathBuf>,
    hosts: Hosts,
    engine: mpsc::Sender<Input>,
) {
    let watch = match watch(&dir) {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(
                "cannot watch the jobs directory {} ({e}): job files are read every {} s \
                     only",
                dir.display(),
                RESCAN.as_secs()
            );
            None
        }
    };
    let nodes_file = Arc::new(nodes_file.unwrap_or_default());
    // The quarantine record matters once: the engine restores it from the first read only.
    let mut first = true;
    loop {
        let map = Arc::clone(&hosts.borrow());
        let (dir2, nodes2) = (dir.clone(), Arc::clone(&nodes_file));
        let with_record = std::mem::take(&mut first);
        let read =
            tokio::task::spawn_blocking(move || read(&dir2, &nodes2, &map, with_record)).await;
        let Ok(files) = read else { return };
        if engine.send(Input::JobFiles(files)).await.is_err() {
            return;
        }
        let rescan = tokio::time::Instant::now() + RESCAN;
        let Some(w) = &watch else {
            tokio::select! {
                () = tokio::time::sleep_until(rescan) => continue,
                () = engine.closed() => return,
            }
        };
        // Until an event that may change the jobs: a prolog's temporary file and the daemon's
        // own quarantine record are written here too, and reading the directory for them
        // would only find the jobs it holds.
        loop {
            tokio::select! {
                ready = w.readable() => match ready {
                    // Drained until the kernel says it would block (only then is the
                    // readiness cleared, so an event landing meanwhile is not lost): one read
                    // of the directory covers them all.
                    Ok(mut guard) => {
                        let mut changed = false;
                        while let Ok(Ok(events)) = guard.try_io(|fd| {
                            fd.get_ref().0.read_events().map_err(std::io::Error::from)
                        }) {
                            changed |= events.iter().any(may_change_jobs);
                        }
                        if changed {
                            break;
                        }
                    }
                    Err(_) => {
                        tokio::time::sleep_until(rescan).await;
                        break;
                    }
                },
                () = tokio::time::sleep_until(rescan) => break,
                () = engine.closed() => return,
            }
        }
    }
}

/// Whether an inotify event may change what the directory's job files say: one naming a job
/// file, the directory itself moved or deleted, or events lost (the queue overflowed).
fn may_change_jobs(event: &InotifyEvent) -> bool {
    let whole = AddWatchFlags::IN_Q_OVERFLOW
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_IGNORED;
    event.mask.intersects(whole)
        || (event.name.as_deref())
            .and_then(|n| n.to_str())
            .is_some_and(is_job_file)
}

/// The job a job file defines, as the node takes it.
pub(crate) fn spec_of(file: &JobFile) -> openimex_core::jobs::JobSpec {
    openimex_core::jobs::JobSpec {
        name: file.name.clone(),
        channel: file.channel,
        members: file
            .members
            .iter()
            .map(|m| openimex_core::NodeId(*m))
            .collect(),
        owner: file.owner,
    }
}

/// Whether a directory entry named `name` is a job file (a dot file, such as a prolog's
/// temporary file or the quarantine record, is not).
fn is_job_file(name: &str) -> bool {
    name.ends_with(JOB_FILE_SUFFIX) && !name.starts_with('.')
}

/// The node map `hosts` as the nodes file `nodes_file` it came from (line i+1 is node i), which
/// a job file's members are checked against.
pub(crate) fn node_config(nodes_file: &Path, hosts: &[String]) -> NodeConfig {
    NodeConfig {
        path: nodes_file.to_owned(),
        entries: (hosts.iter().enumerate())
            .map(|(i, host)| NodeEntry {
                line: i + 1,
                host: host.clone(),
            })
            .collect(),
    }
}

/// An inotify watch on `dir` for files written, moved in or out, and deleted.
fn watch(dir: &Path) -> std::io::Result<AsyncFd<Watch>> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let inotify = inotify_on(dir)?;
    // SAFETY: the `Inotify` owns its descriptor, which stays open and the same until the
    // `AsyncFd`, which owns the `Inotify`, is dropped.
    unsafe { AsyncFd::register_with_interest(Watch(inotify), tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// A non-blocking inotify instance watching `dir` for files written, moved in or out, and
/// deleted, and for the directory itself moved or deleted.
fn inotify_on(dir: &Path) -> std::io::Result<Inotify> {
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    inotify.add_watch(
        dir,
        AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF,
    )?;
    Ok(inotify)
}

/// The inotify instance, as the runtime polls it.
struct Watch(Inotify);

impl std::os::fd::AsRawFd for Watch {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd as _;
        self.0.as_fd().as_raw_fd()
    }
}

use std::os::unix::fs::DirBuilderExt as _;

/// Reads every `.job` file of `dir` against the nodes file's entries `hosts` (read from
/// `nodes_file`, named in messages), and the quarantine record when `with_record`.
pub(crate) fn read(dir: &Path, nodes_file: &Path, hosts: &[String], with_record: bool) -> JobFiles {
    let nodes = node_config(nodes_file, hosts);
    let mut found = JobFiles::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            found.problems.push(format!(
                "cannot read the jobs directory {}: {e}; create it (OPENIMEX_JOBS_DIR in \
                 config.cfg names it)",
                dir.display()
            ));
            return found;
        }
    };
    let record = dir.join(QUARANTINE_FILE);
    let text = with_record.then(|| std::fs::read_to_string(&record));
    if let Some(Ok(text)) = text {
        let written_in = text.lines().next().and_then(|l| l.strip_prefix("boot "));
        let this_boot = boot_id();
        let stale =
            matches!((written_in, this_boot.as_deref()), (Some(then), Some(now)) if then != now);
        for (i, line) in text.lines().enumerate().filter(|_| !stale) {
            if line.starts_with("boot ") {
                continue;
            }
            let parsed = line
                .split_once(' ')
                .and_then(|(c, job)| Some((c.parse::<u32>().ok()?, job.to_string())));
            match parsed {
                Some(entry) => found.quarantined.push(entry),
                None => found.problems.push(format!(
                    "{}:{}: {line:?} is not CHANNEL JOB; the daemon writes this file: remove \
                     the line",
                    record.display(),
                    i + 1
                )),
            }
        }
    }
    let mut paths: Vec<PathBuf> = (entries.filter_map(Result::ok))
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_job_file)
        })
        .collect();
    paths.sort();
    if paths.len() > MAX_JOB_FILES {
        found.problems.push(format!(
            "{}: {} job files, more than any node holds; the first {MAX_JOB_FILES} (by name) \
             are read",
            dir.display(),
            paths.len()
        ));
        paths.truncate(MAX_JOB_FILES);
    }
    for path in paths {
        match JobFile::load(&path, &nodes) {
            Ok(job) => found.jobs.push(job),
            // Deleted between the listing and the read: the job ended, not a problem.
            Err(openimex_config::ConfigError::JobFileIo { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => found.problems.push(e.to_string()),
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::{QUARANTINE_FILE, boot_id, inotify_on, may_change_jobs, read};

    /// A prolog writes its job file whole (a dot file renamed into place) and the daemon
    /// rewrites its quarantine record the same way: of all the events that makes, only those
    /// naming a job file (and the directory's own end) ask for a read.
    #[test]
    fn only_events_naming_a_job_file_ask_for_a_read() {
        let dir = std::env::temp_dir().join(format!("openimex-jobs-events-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let inotify = inotify_on(&dir).unwrap();
        std::fs::write(dir.join(".a.tmp"), "CHANNEL=1\n").unwrap();
        std::fs::rename(dir.join(".a.tmp"), dir.join("a.job")).unwrap();
        std::fs::write(dir.join(".quarantine.tmp"), "boot x\n").unwrap();
        std::fs::rename(dir.join(".quarantine.tmp"), dir.join(QUARANTINE_FILE)).unwrap();
        std::fs::write(dir.join("notes.txt"), "").unwrap();
        std::fs::remove_file(dir.join("a.job")).unwrap();
        let asked: Vec<(String, bool)> = (inotify.read_events().unwrap().iter())
            .map(|e| {
                let name = e.name.as_deref().and_then(|n| n.to_str()).unwrap_or("");
                (name.to_string(), may_change_jobs(e))
            })
            .collect();
        let want = [
            (".a.tmp", false),
            (".a.tmp", false),
            ("a.job", true),
            (".quarantine.tmp", false),
            (".quarantine.tmp", false),
            (".quarantine", false),
            ("notes.txt", false),
            ("a.job", true),
        ];
        let want: Vec<(String, bool)> = want.iter().map(|(n, b)| (n.to_string(), *b)).collect();
        assert_eq!(asked, want);
        std::fs::remove_dir_all(&dir).unwrap();
        let gone: Vec<bool> = (inotify.read_events().unwrap().iter())
            .map(may_change_jobs)
            .collect();
        assert!(gone.contains(&true), "the directory deleted: {gone:?}");
    }

    #[test]
    fn the_quarantine_of_this_boot_holds_and_one_of_another_boot_is_none() {
        let dir = std::env::temp_dir().join(format!("openimex-jobs-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let record = dir.join(QUARANTINE_FILE);
        let hosts = ["10.0.0.1".to_string()];
        let nodes = dir.join("nodes_config.cfg");
        let this = boot_id().expect("the kernel names this boot");
        std::fs::write(&record, format!("boot {this}\n3 old\n4 older\n")).unwrap();
        let found = read(&dir, &nodes, &hosts, true);
        assert_eq!(
            found.quarantined,
            vec![(3, "old".to_string()), (4, "older".to_string())]
        );
        // Rebooted since: no process of those jobs can be alive.
        std::fs::write(
            &record,
            "boot 00000000-0000-0000-0000-000000000000\n3 old\n",
        )
        .unwrap();
        assert!(read(&dir, &nodes, &hosts, true).quarantined.is_empty());
        std::fs::write(&record, format!("boot {this}\nthree old\n")).unwrap();
        let found = read(&dir, &nodes, &hosts, true);
        assert!(
            found.problems[0].ends_with(
                ":2: \"three old\" is not CHANNEL JOB; the daemon writes this file: remove the line"
            ),
            "{:?}",
            found.problems
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
