//! The persist record (`persist.dat`, docs/reference/imex-guide.md §4): which nodes hold references to this
//! node's memory. NVIDIA's byte format is not published; ours is text:
//!
//! ```text
//! # openimex persist record: nodes that hold references to this node's memory
//! key <node-map digest>
//! node <node ID> <nodes-file entry>
//! ```
//!
//! The key ties the record to the node map: a record written under another map is discarded
//! (no recovery wait), as NVIDIA's is. Writes replace the file atomically (a temporary file,
//! then a rename), so a crash of the daemon leaves the old record or the new one, never half of
//! one.
//!
//! Writes happen on a thread of their own ([`Writer`], started with the first record), off the
//! engine's loop: the record is written while the driver describes the export, and only the
//! import answers that depend on it wait for it — an answer hands the importer a reference the
//! record must already name, or a crash in between would let recovery forget that importer.
//!
//! No fsync: the record guards against an unclean exit of the *daemon* (the driver and its
//! memory live on), and what a process wrote is in the page cache for its successor whether or
//! not it reached the disk. A reboot resets the GPUs and their memory with it, and the record's
//! home, `/var/run/nvidia-imex`, is a tmpfs that does not survive one either. An fsync here
//! cost a disk flush (milliseconds) on the engine's loop before every import answer that adds an
//! importer node, and again when one leaves.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;

use openimex_core::{ImportAnswer, NodeId, NodeMap};
use tokio::sync::{mpsc, oneshot};

use crate::mailbox::Input;

/// What a record at start-up says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// No file: no previous importers.
    Missing,
    /// Written under another node map: discarded.
    OtherMap,
    /// The importers of the previous run (empty after a clean stop).
    Importers(Vec<NodeId>),
}

/// Reads the record at `path` for `map`.
pub(crate) fn read(path: &Path, map: &NodeMap) -> std::io::Result<Record> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Record::Missing),
        Err(e) => return Err(e),
    };
    let mut key_ok = false;
    let mut importers = Vec::new();
    for line in text.lines().map(str::trim) {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("key") => key_ok = words.next() == Some(map.digest()),
            Some("node") => {
                let id = words
                    .next()
                    .and_then(|w| w.parse::<u16>().ok())
                    .filter(|id| usize::from(*id) < map.len());
                match id {
                    Some(id) => importers.push(NodeId(id)),
                    None => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("malformed line {line:?}"),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    if !key_ok {
        return Ok(Record::OtherMap);
    }
    importers.sort_unstable();
    importers.dedup();
    Ok(Record::Importers(importers))
}

/// Writes the record: `importers` hold (or may hold) references to this node's memory.
pub(crate) fn write(path: &Path, map: &NodeMap, importers: &[NodeId]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut text = String::from(
        "# openimex persist record: nodes that hold references to this node's memory\n",
    );
    text.push_str(&format!("key {}\n", map.digest()));
    for id in importers {
        let host = map.hosts().get(id.index()).map_or("?", String::as_str);
        text.push_str(&format!("node {id} {host}\n"));
    }
    let tmp = path.with_extension("tmp");
    std::fs::File::create(&tmp)?.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, path)
}

/// One record to write: its sequence number, the map it is keyed to, the importers.
type Job = (u64, Arc<NodeMap>, Vec<NodeId>);

/// Starts the thread writing records to `path`, each reported to `engine` once written.
fn spawn(
    path: PathBuf,
    engine: mpsc::Sender<Input>,
) -> std::io::Result<(std_mpsc::Sender<Job>, std::thread::JoinHandle<()>)> {
    let (jobs, rx) = std_mpsc::channel::<Job>();
    let thread = std::thread::Builder::new()
        .name("persist".into())
        .spawn(move || {
            while let Ok(mut job) = rx.recv() {
                // Only the newest record matters.
                while let Ok(newer) = rx.try_recv() {
                    job = newer;
                }
                let (seq, map, importers) = job;
                write_logged(&path, &map, &importers);
                // Answers go out even when the write failed (said in the log): holding them
                // forever would stop every import, a worse failure than the one logged.
                if engine.blocking_send(Input::Persisted { seq }).is_err() {
                    return;
                }
            }
        })?;
    Ok((jobs, thread))
}

/// [`write`], a failure logged.
fn write_logged(path: &Path, map: &NodeMap, importers: &[NodeId]) {
    if let Err(e) = write(path, map, importers) {
        tracing::error!(
            "cannot write the persistence file {}: {e}; after a crash, recovery cannot know which nodes held this node's memory; make its directory writable or set OPENIMEX_PERSIST_FILE",
            path.display()
        );
    }
}

/// Writes records on its own thread, newest first (a record superseded before its turn is
/// skipped), and holds the import answers that must not leave before a record is written.
/// The thread starts with the first record: a node whose memory nobody imports never needs
/// it, and a domain's start (every daemon at once) does without one more thread per daemon.
pub(crate) struct Writer {
    path: PathBuf,
    /// Where the thread reports each record written.
    engine: mpsc::Sender<Input>,
    /// The thread's queue, once it runs.
    jobs: Option<std_mpsc::Sender<Job>>,
    /// The node map records are keyed to (it grows on SIGUSR1).
    map: Arc<NodeMap>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Records queued (or, without a thread, written on the engine's loop), and written, by
    /// sequence number.
    sent: u64,
    written: u64,
    /// Answers waiting for the record of their sequence number.
    held: VecDeque<(u64, oneshot::Sender<ImportAnswer>, ImportAnswer)>,
}

impl Writer {
    /// A writer to `path` for `map`; each record its thread writes is reported to the engine
    /// as [`Input::Persisted`] (one written on the engine's loop, when the thread cannot
    /// start, counts as written at once).
    pub(crate) fn new(path: PathBuf, map: NodeMap, engine: mpsc::Sender<Input>) -> Self {
        Self {
            path,
            engine,
            jobs: None,
            map: Arc::new(map),
            thread: None,
            sent: 0,
            written: 0,
            held: VecDeque::new(),
        }
    }

    /// Queues a record naming `importers`.
    pub(crate) fn write(&mut self, importers: Vec<NodeId>) {
        self.sent += 1;
        if self.thread.is_none() {
            match spawn(self.path.clone(), self.engine.clone()) {
                Ok((jobs, thread)) => {
                    self.jobs = Some(jobs);
                    self.thread = Some(thread);
                }
                Err(e) => {
                    // Written here, then, on the engine's loop: late answers are better than
                    // a record missing after a crash. The thread is tried again next time.
                    tracing::warn!(
                        "cannot start the thread that writes the persistence file ({e}): writing it on the daemon's main loop; check the limits on threads and memory (ulimit -u, ulimit -v)"
                    );
                    write_logged(&self.path, &self.map, &importers);
                    self.written(self.sent);
                    return;
                }
            }
        }
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send((self.sent, Arc::clone(&self.map), importers));
        }
    }

    /// Key later records to `map` (the nodes file grew).
    pub(crate) fn set_map(&mut self, map: NodeMap) {
        self.map = Arc::new(map);
    }

    /// Sends `answer` once every record queued so far is written (at once if none waits).
    pub(crate) fn answer(&mut self, reply: oneshot::Sender<ImportAnswer>, answer: ImportAnswer) {
        if self.written >= self.sent {
            let _ = reply.send(answer);
        } else {
            self.held.push_back((self.sent, reply, answer));
        }
    }

    /// The record of `seq` (and every one before it) is written: send the answers it held.
    pub(crate) fn written(&mut self, seq: u64) {
        self.written = self.written.max(seq);
        while self
            .held
            .front()
            .is_some_and(|(s, _, _)| *s <= self.written)
        {
            if let Some((_, reply, answer)) = self.held.pop_front() {
                let _ = reply.send(answer);
            }
        }
    }

    /// Writes what is queued and stops the thread (the answers it held are dropped: the
    /// daemon is stopping). `engine` is the engine's mailbox, read meanwhile: the thread may
    /// be waiting for room in it to report its last write.
    pub(crate) async fn finish(mut self, engine: &mut mpsc::Receiver<Input>) {
        self.jobs = None;
        let Some(thread) = self.thread.take() else {
            return;
        };
        while !thread.is_finished() {
            while engine.try_recv().is_ok() {}
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let _ = thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_a_changed_map_discards_it() {
        let dir = std::env::temp_dir().join(format!("openimex-persist-{}", std::process::id()));
        let path = dir.join("persist.dat");
        let map = NodeMap::new(vec![
            "10.0.0.1".into(),
            "10.0.0.2".into(),
            "10.0.0.3".into(),
        ]);
        assert_eq!(read(&path, &map).unwrap(), Record::Missing);
        write(&path, &map, &[NodeId(2), NodeId(1)]).unwrap();
        assert_eq!(
            read(&path, &map).unwrap(),
            Record::Importers(vec![NodeId(1), NodeId(2)])
        );
        write(&path, &map, &[]).unwrap();
        assert_eq!(read(&path, &map).unwrap(), Record::Importers(vec![]));
        let other = NodeMap::new(vec!["10.0.0.1".into(), "10.0.0.9".into()]);
        write(&path, &map, &[NodeId(1)]).unwrap();
        assert_eq!(read(&path, &other).unwrap(), Record::OtherMap);
        std::fs::write(&path, format!("key {}\nnode 99 x\n", map.digest())).unwrap();
        assert!(read(&path, &map).is_err(), "a node ID outside the map");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_waits_for_the_record_that_names_its_importer() {
        let dir = std::env::temp_dir().join(format!("openimex-writer-{}", std::process::id()));
        let path = dir.join("persist.dat");
        let map = NodeMap::new(vec!["10.0.0.1".into(), "10.0.0.2".into()]);
        let (engine, mut rx) = mpsc::channel(8);
        let mut writer = Writer::new(path.clone(), map.clone(), engine);
        assert!(writer.thread.is_none(), "no thread before the first record");

        // Nothing queued: an answer leaves at once.
        let (reply, mut got) = oneshot::channel();
        writer.answer(
            reply,
            Err(openimex_core::ImportError::new(
                openimex_core::Status::InvalidState,
                "x",
            )),
        );
        assert!(got.try_recv().is_ok());

        writer.write(vec![NodeId(1)]);
        let (reply, mut got) = oneshot::channel();
        writer.answer(
            reply,
            Err(openimex_core::ImportError::new(
                openimex_core::Status::InvalidState,
                "x",
            )),
        );
        assert!(got.try_recv().is_err(), "held until the record is written");
        assert!(
            writer.thread.is_some(),
            "the first record started the thread"
        );
        let Some(Input::Persisted { seq }) = rx.recv().await else {
            panic!("the writer reports its write");
        };
        assert_eq!(
            read(&path, &map).unwrap(),
            Record::Importers(vec![NodeId(1)])
        );
        writer.written(seq);
        assert!(got.try_recv().is_ok(), "sent once written");

        writer.write(vec![]);
        writer.finish(&mut rx).await;
        assert_eq!(
            read(&path, &map).unwrap(),
            Record::Importers(vec![]),
            "the last record is written before finish returns"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
