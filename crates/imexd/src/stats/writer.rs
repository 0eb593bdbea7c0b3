//! The thread that writes the stats file: a record every interval, and a last one when the
//! daemon stops ([`StatsFile`] dropped).
//!
//! Where (docs/reference/imex-guide.md §1 `STATS_FILE_NAME`): the named file, appended or truncated as the log
//! is (`LOG_APPEND_TO_LOG`); standard error when the name is empty or the file cannot be
//! opened; the main log when the name is `LOG_FILE_NAME`'s, written through the log's own
//! writer ([`crate::logging::write_to_log`]) so the two never interleave within a line or
//! fight over one file with two handles (both names empty: both on stderr, so through the
//! log's writer too). A plain thread, not a task: the last record is
//! written after the async runtime is gone.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::warn;

/// What the stats file needs from the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsOptions {
    /// `STATS_FILE_NAME`; `None` (empty) is stderr.
    pub path: Option<PathBuf>,
    /// `LOG_FILE_NAME`: the same name puts the records into the main log.
    pub log_path: Option<PathBuf>,
    /// `LOG_APPEND_TO_LOG` (or a re-executed image, which appends to its own start's file).
    pub append: bool,
    /// `OPENIMEX_STATS_INTERVAL_SEC`; 0 writes no stats file.
    pub interval_sec: u64,
}

/// Where the records go.
enum Sink {
    File(File),
    MainLog,
    Stderr,
}

impl Sink {
    fn open(options: &StatsOptions) -> Sink {
        let Some(path) = options.path.as_deref() else {
            // Both empty (the Kubernetes DRA driver's setting): the log is on stderr too, and
            // its writer keeps a record and a log line from interleaving there.
            return match options.log_path {
                None => Sink::MainLog,
                Some(_) => Sink::Stderr,
            };
        };
        if options
            .log_path
            .as_deref()
            .is_some_and(|log| same_file(path, log))
        {
            return Sink::MainLog;
        }
        match OpenOptions::new()
            .create(true)
            .append(options.append)
            .write(true)
            .truncate(!options.append)
            .open(path)
        {
            Ok(f) => Sink::File(f),
            Err(e) => {
                warn!(
                    "cannot open the stats file {} (STATS_FILE_NAME): {e}; writing performance statistics to stderr instead (create its directory or make it writable, or set STATS_FILE_NAME to another path)",
                    path.display()
                );
                Sink::Stderr
            }
        }
    }

    fn write(&mut self, text: &str) {
        let written = match self {
            Sink::File(f) => f
                .write_all(text.as_bytes())
                .and_then(|()| f.flush())
                .is_ok(),
            Sink::MainLog => crate::logging::write_to_log(text.as_bytes()),
            Sink::Stderr => false,
        };
        if !written {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(text.as_bytes());
        }
    }
}

/// `a` and `b` name the same file: the same text, or the same file once resolved.
fn same_file(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// The running writer. Dropping it writes the last record (the interval since the previous
/// one) and waits for the thread.
pub struct StatsFile {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl StatsFile {
    /// Starts the writer, or returns `None` when the interval is 0 (no stats file) or the
    /// thread cannot be started (said in the log).
    pub fn start(options: StatsOptions, stats: super::Stats) -> Option<StatsFile> {
        if options.interval_sec == 0 {
            return None;
        }
        let interval = Duration::from_secs(options.interval_sec);
        let mut sink = Sink::open(&options);
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("imex-stats".into())
            .spawn(move || {
                let mut since = Instant::now();
                // Records keep to the interval's grid, however long a write takes.
                let mut next = since + interval;
                loop {
                    let wait = next.saturating_duration_since(Instant::now());
                    match stopped.recv_timeout(wait) {
                        Err(RecvTimeoutError::Timeout) => {
                            sink.write(&stats.take(options.interval_sec).render());
                            since = next;
                            next += interval;
                        }
                        // Stopped (or the handle is gone): the last, partial interval.
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                            let secs = since.elapsed().as_secs_f64().round() as u64;
                            sink.write(&stats.take(secs).render());
                            return;
                        }
                    }
                }
            });
        match thread {
            Ok(thread) => Some(StatsFile {
                stop: Some(stop),
                thread: Some(thread),
            }),
            Err(e) => {
                warn!(
                    "cannot start the stats file's thread: {e}; no performance statistics will be written (the system is out of threads or memory)"
                );
                None
            }
        }
    }
}

impl Drop for StatsFile {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
