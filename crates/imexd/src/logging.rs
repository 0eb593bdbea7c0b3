//! Logging as NVIDIA's daemon does it: `LOG_LEVEL` 0 (off) … 4 (INFO), to `LOG_FILE_NAME`
//! (appended or truncated per `LOG_APPEND_TO_LOG`, capped and rotated per `LOG_FILE_MAX_SIZE`
//! and `LOG_MAX_ROTATE_COUNT`: `log_file`), or stderr when the name is empty or the file
//! cannot be opened, or syslog with `LOG_USE_SYSLOG=1` (`syslog`); `sink` picks and falls
//! back. Lines look like `[Dec 02 2026 15:40:01.123] [INFO] [tid 7] message`.
//!
//! # The verbose buffer (docs/reference/imex-guide.md §1 LOG_LEVEL, §5 SIGHUP)
//!
//! Messages that `LOG_LEVEL` keeps out of the log (below the level, down to INFO: at level 3
//! the INFO lines, at level 0 every line) are formatted as they happen — with their own time
//! stamp and thread — into a bounded in-memory ring, [`Ring`], instead of being lost. SIGHUP
//! writes the ring to the log ([`dump_verbose`]) behind a header line that says how many
//! messages, since when, and how many older ones were dropped; the daemon also writes it when
//! it stops. A dump empties the ring, so the next one holds only what came after.
//!
//! The ring holds at most `OPENIMEX_VERBOSE_LOG_BUFFER_KB` KiB (default
//! [`openimex_config::DEFAULT_VERBOSE_LOG_BUFFER_KB`]; 0 turns it off). NVIDIA documents no
//! key for the size of its buffer. The bytes counted are each line's text plus the
//! bookkeeping of its slot, so the bound is the memory actually held; one line is cut to
//! [`MAX_RECORD`] bytes, and the oldest lines are dropped (and counted) to make room.
//! DEBUG and TRACE are never buffered: NVIDIA's levels end at INFO, and the libraries' trace
//! events would only cost time.

mod batch;
mod log_file;
#[cfg(test)]
mod scratch;
mod sink;
mod syslog;

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Context, Filter, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use batch::SharedWriter;
pub use batch::batch;
use sink::{FileSpec, Sink};

/// Where the log went (to say so on stderr when a file could not be opened).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    /// The named file.
    File(String),
    /// Standard error (empty name, or the file could not be opened: the reason).
    Stderr(Option<String>),
    /// Syslog, through this socket.
    Syslog(PathBuf),
}

/// What [`init`] needs: the logging keys of `config.cfg`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogOptions {
    /// NVIDIA's `LOG_LEVEL` (0..=4).
    pub level: u8,
    /// `LOG_FILE_NAME`; `None`: stderr.
    pub file: Option<PathBuf>,
    /// `LOG_APPEND_TO_LOG`.
    pub append: bool,
    /// Size of the verbose buffer in bytes (0: none).
    pub buffer_bytes: usize,
    /// `LOG_FILE_MAX_SIZE` in bytes; 0: no cap.
    pub max_bytes: u64,
    /// `LOG_MAX_ROTATE_COUNT`.
    pub rotate_count: u32,
    /// The syslog socket when `LOG_USE_SYSLOG=1`.
    pub syslog: Option<PathBuf>,
}

impl LogOptions {
    /// The options `cfg` sets; `append` also when the image was re-executed (same PID, same
    /// log).
    pub fn from_config(cfg: &openimex_config::Config, reexecuted: bool) -> LogOptions {
        LogOptions {
            level: cfg.log_level,
            file: cfg.log_file_name.clone(),
            append: cfg.log_append_to_log || reexecuted,
            buffer_bytes: usize::try_from(cfg.verbose_log_buffer_kb)
                .unwrap_or(usize::MAX)
                .saturating_mul(1024),
            max_bytes: cfg.log_file_max_size_mb.saturating_mul(1 << 20),
            rotate_count: cfg.log_max_rotate_count,
            syslog: cfg.log_use_syslog.then(|| cfg.syslog_socket.clone()),
        }
    }
}

/// The longest line the verbose buffer keeps; a longer one is cut and ends with `…`.
pub const MAX_RECORD: usize = 8 * 1024;

/// At most one "the buffer is empty" dump this often: a flood of SIGHUPs cannot flood the log.
const EMPTY_DUMP_EVERY: Duration = Duration::from_secs(10);

/// The log's destination, shared by every line and by the dumps.
type Out = Arc<Mutex<Sink>>;

/// What [`dump_verbose`] needs, set once by [`init`].
struct Verbose {
    ring: Arc<Mutex<Ring>>,
    out: Out,
    level: u8,
    /// When the last dump that found the ring empty was written.
    last_empty: Mutex<Option<Duration>>,
}

static VERBOSE: OnceLock<Verbose> = OnceLock::new();

/// The highest level the log itself takes for NVIDIA's `LOG_LEVEL`.
fn file_filter(level: u8) -> LevelFilter {
    match level {
        0 => LevelFilter::OFF,
        // tracing has no CRITICAL: both are errors.
        1 | 2 => LevelFilter::ERROR,
        3 => LevelFilter::WARN,
        _ => LevelFilter::INFO,
    }
}

/// Installs the global subscriber.
pub fn init(opts: &LogOptions) -> LogTarget {
    let (level, buffer_bytes) = (opts.level, opts.buffer_bytes);
    let file = FileSpec {
        path: opts.file.clone(),
        append: opts.append,
        cap: opts.max_bytes,
        keep: opts.rotate_count,
    };
    let mut syslog_failed = None;
    let (writer, target) = match &opts.syslog {
        Some(socket) => match syslog::Syslog::connect(socket) {
            Ok(syslog) => (
                Sink::Syslog {
                    syslog,
                    fallback: file,
                },
                LogTarget::Syslog(socket.clone()),
            ),
            Err(e) => {
                syslog_failed = Some(format!("{} ({e})", socket.display()));
                file.open()
            }
        },
        None => file.open(),
    };
    let out: Out = Arc::new(Mutex::new(writer));
    let ring = Arc::new(Mutex::new(Ring::new(buffer_bytes, since_epoch())));
    let file_max = file_filter(level);
    let held = Held {
        file_max,
        on: buffer_bytes > 0,
    };
    let shared = out.clone();
    let to_log = tracing_subscriber::fmt::layer()
        .event_format(NvFormat)
        .with_ansi(false)
        .with_writer(move || SharedWriter(shared.clone()))
        .with_filter(file_max);
    let into_ring = ring.clone();
    let to_ring = tracing_subscriber::fmt::layer()
        .event_format(NvFormat)
        .with_ansi(false)
        .with_writer(move || RingWriter {
            ring: into_ring.clone(),
            line: Vec::new(),
        })
        .with_filter(held);
    let installed = tracing_subscriber::registry()
        .with(to_log)
        .with(to_ring)
        .try_init()
        .is_ok();
    if installed {
        let _ = VERBOSE.set(Verbose {
            ring,
            out,
            level,
            last_empty: Mutex::new(None),
        });
    }
    if !matches!(target, LogTarget::Stderr(_)) {
        tracing::info!("IMEX Log initializing at: {}", crate::logging::now_stamp());
        tracing::info!(
            "openimex {} writing log to {}",
            env!("CARGO_PKG_VERSION"),
            sink::describe(&target)
        );
    }
    if let Some(why) = syslog_failed {
        tracing::error!(
            "LOG_USE_SYSLOG=1 but the syslog socket {why} cannot be used: logging to {} \
             instead. Fix: start the system logger (systemd-journald or rsyslog), or set \
             OPENIMEX_SYSLOG_SOCKET to its socket",
            sink::describe(&target)
        );
    }
    target
}

/// One log line in the file's format, stamped now, for lines written outside `tracing` (the
/// stop notice of a capped file, the syslog fallback).
pub(crate) fn stamped_line(level: &str, msg: &str) -> String {
    format!("[{}] [{level}] [tid {}] {msg}\n", log_stamp(), thread_id())
}

/// This thread's ID for a line's `[tid N]`, asked of the kernel once per thread, not once per
/// line (a system call each). The daemon forks only before logging starts (`DAEMONIZE=1`), so
/// no thread carries a parent's cached ID.
fn thread_id() -> i32 {
    thread_local! {
        static TID: i32 = nix::unistd::gettid().as_raw();
    }
    TID.with(|tid| *tid)
}

/// Why the verbose buffer is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpReason {
    /// SIGHUP: always answered with a header, even when the buffer is empty (at most once per
    /// 10 s when it is).
    Sighup,
    /// The daemon is stopping: written only when something is held.
    Shutdown,
}

/// What one dump wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpReport {
    /// Lines written from the buffer.
    pub lines: usize,
    /// Older lines that had been dropped to stay within the buffer's size.
    pub dropped: u64,
}

/// Writes the verbose buffer to the log and empties it: a header line, the held lines in the
/// order they were logged, an end line, in one write so no other line comes between them.
/// Returns what was written, or `None` when nothing was (no logging installed, or nothing to
/// say). Blocks for one write of at most the buffer's size plus two lines: call it from a
/// blocking thread, not from an async task.
pub fn dump_verbose(reason: DumpReason) -> Option<DumpReport> {
    let v = VERBOSE.get()?;
    let now = since_epoch();
    let (dump, capacity) = {
        let mut ring = lock(&v.ring);
        (ring.take(now), ring.capacity())
    };
    if dump.records.is_empty() && dump.dropped == 0 {
        if reason == DumpReason::Shutdown {
            return None;
        }
        let mut last = lock(&v.last_empty);
        if last.is_some_and(|t| now.saturating_sub(t) < EMPTY_DUMP_EVERY) {
            return None;
        }
        *last = Some(now);
    }
    let text = render(&dump, reason, v.level, capacity, now);
    let mut out = lock(&v.out);
    let _ = out.write_all(&text);
    let _ = out.flush();
    Some(DumpReport {
        lines: dump.records.len(),
        dropped: dump.dropped,
    })
}

/// Writes `text` into the log as it is, in one write between two lines, through the log's own
/// writer: the stats file when `STATS_FILE_NAME` is the log's name. Returns false when no log
/// is installed or the write failed. Blocks for one write: not from an async task.
pub fn write_to_log(text: &[u8]) -> bool {
    let Some(v) = VERBOSE.get() else {
        return false;
    };
    let mut out = lock(&v.out);
    out.write_all(text).and_then(|()| out.flush()).is_ok()
}

/// The header, the lines and the end line of one dump.
fn render(dump: &Dump, reason: DumpReason, level: u8, capacity: usize, now: Duration) -> Vec<u8> {
    let bytes: usize = dump.records.iter().map(|r| r.line.len()).sum();
    let mut text = Vec::with_capacity(bytes + 512);
    let prefix = |text: &mut Vec<u8>| {
        let _ = write!(
            text,
            "[{}] [INFO] [tid {}] ",
            openimex_core::timefmt::log_timestamp(now),
            thread_id()
        );
    };
    let why = match reason {
        DumpReason::Sighup => "SIGHUP received: verbose log buffer",
        DumpReason::Shutdown => "Shutting down: verbose log buffer",
    };
    prefix(&mut text);
    let stamp = openimex_core::timefmt::log_timestamp;
    if capacity == 0 {
        let _ = writeln!(
            text,
            "{why} is off (OPENIMEX_VERBOSE_LOG_BUFFER_KB=0); nothing is held back"
        );
        return text;
    }
    if level >= 4 {
        let _ = writeln!(
            text,
            "{why} is empty: LOG_LEVEL {level} writes every message (up to INFO) to the log, \
             so nothing is held back"
        );
        return text;
    }
    let _ = write!(
        text,
        "{why}: {} message(s) below LOG_LEVEL {level} since {}",
        dump.records.len(),
        stamp(dump.since)
    );
    if dump.dropped > 0 {
        let first = dump
            .records
            .front()
            .map(|r| format!("; the first kept is from {}", stamp(r.at)))
            .unwrap_or_default();
        let _ = write!(
            text,
            " ({} older message(s) dropped to stay within {} KiB{first})",
            dump.dropped,
            capacity / 1024
        );
    }
    let _ = writeln!(text);
    for r in &dump.records {
        text.extend_from_slice(r.line.as_bytes());
        if !r.line.ends_with('\n') {
            text.push(b'\n');
        }
    }
    if !dump.records.is_empty() {
        prefix(&mut text);
        let _ = writeln!(
            text,
            "End of the verbose log buffer ({} message(s))",
            dump.records.len()
        );
    }
    text
}

/// One held line and when it was logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Since the Unix epoch.
    pub at: Duration,
    /// The formatted line, newline included.
    pub line: Box<str>,
}

/// The bytes a record holds: its text and its slot.
fn cost(line: &str) -> usize {
    line.len() + std::mem::size_of::<Record>()
}

/// The bounded ring of the most recent held lines: at most `capacity` bytes of text and slot
/// bookkeeping (`cost`); the oldest lines make room for new ones and are counted.
#[derive(Debug)]
pub struct Ring {
    records: VecDeque<Record>,
    bytes: usize,
    capacity: usize,
    dropped: u64,
    since: Duration,
}

/// What [`Ring::take`] hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dump {
    /// Oldest first.
    pub records: VecDeque<Record>,
    /// Lines dropped (oldest first) since `since` to stay within the capacity.
    pub dropped: u64,
    /// Start of the window: the ring's creation or the previous take.
    pub since: Duration,
}

impl Ring {
    /// An empty ring of `capacity` bytes (0: keeps nothing), its window starting at `since`.
    pub fn new(capacity: usize, since: Duration) -> Ring {
        Ring {
            records: VecDeque::new(),
            bytes: 0,
            capacity,
            dropped: 0,
            since,
        }
    }

    /// The size bound in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes held now (never more than the capacity).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Lines held now.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no line is held.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Keeps `line`, logged at `at`, as the newest, cut to [`MAX_RECORD`] bytes (and to what
    /// fits at all); drops the oldest lines until it fits. With a capacity too small for any
    /// line, the line itself is counted as dropped.
    pub fn push(&mut self, at: Duration, line: &str) {
        let room = self
            .capacity
            .saturating_sub(std::mem::size_of::<Record>())
            .min(MAX_RECORD);
        const CUT: &str = "…\n";
        if room <= CUT.len() {
            self.dropped += 1;
            return;
        }
        let line: Box<str> = if line.len() <= room {
            line.into()
        } else {
            let mut end = room - CUT.len();
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}{CUT}", &line[..end]).into_boxed_str()
        };
        let need = cost(&line);
        while self.bytes + need > self.capacity {
            let Some(old) = self.records.pop_front() else {
                break;
            };
            self.bytes -= cost(&old.line);
            self.dropped += 1;
        }
        self.bytes += need;
        self.records.push_back(Record { at, line });
    }

    /// Hands out every held line (oldest first) and the drop count, and starts a new window
    /// at `now`.
    pub fn take(&mut self, now: Duration) -> Dump {
        self.bytes = 0;
        Dump {
            records: std::mem::take(&mut self.records),
            dropped: std::mem::take(&mut self.dropped),
            since: std::mem::replace(&mut self.since, now),
        }
    }
}

/// The lines the ring takes: those the log's own filter turns away, down to INFO.
struct Held {
    file_max: LevelFilter,
    on: bool,
}

impl Held {
    fn takes(&self, level: &Level) -> bool {
        self.on && *level <= Level::INFO && self.file_max < *level
    }
}

impl<S> Filter<S> for Held {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        self.takes(meta.level())
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.takes(meta.level()) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(if self.on && self.file_max < LevelFilter::INFO {
            LevelFilter::INFO
        } else {
            LevelFilter::OFF
        })
    }
}

/// A poisoned lock still holds usable data (a line or a ring); logging never gives up on it.
fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Collects one formatted line and hands it to the ring when dropped (the formatter makes one
/// writer per event).
struct RingWriter {
    ring: Arc<Mutex<Ring>>,
    line: Vec<u8>,
}

impl Write for RingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Past the cap the rest would be cut anyway; keep a little more so the cut is seen.
        let keep = (MAX_RECORD + 8)
            .saturating_sub(self.line.len())
            .min(buf.len());
        self.line.extend_from_slice(&buf[..keep]);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for RingWriter {
    fn drop(&mut self) {
        if self.line.is_empty() {
            return;
        }
        let line = String::from_utf8_lossy(&self.line);
        lock(&self.ring).push(since_epoch(), &line);
    }
}

struct NvFormat;

impl<S, N> FormatEvent<S, N> for NvFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR => "ERROR",
            Level::WARN => "WARNING",
            Level::INFO => "INFO",
            Level::DEBUG => "DEBUG",
            Level::TRACE => "TRACE",
        };
        write!(w, "[{}] [{level}] [tid {}] ", log_stamp(), thread_id())?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

fn since_epoch() -> std::time::Duration {
    // The wall clock is read for log stamps only; nothing decides on it.
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// `M/D/YYYY HH:MM:SS.mmm` (UTC), the stamp NVIDIA's banner and `ctl` use.
pub fn now_stamp() -> String {
    openimex_core::timefmt::nv_timestamp(since_epoch())
}

fn log_stamp() -> String {
    openimex_core::timefmt::log_timestamp(since_epoch())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOT: usize = std::mem::size_of::<Record>();

    fn at(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn lines(d: &Dump) -> Vec<&str> {
        d.records.iter().map(|r| &*r.line).collect()
    }

    #[test]
    fn keeps_the_newest_in_order_within_the_bound() {
        // Room for exactly three 10-byte lines.
        let mut ring = Ring::new(3 * (10 + SLOT), at(100));
        for i in 0..10u64 {
            ring.push(at(100 + i), &format!("line {i:03}\n"));
            assert!(ring.bytes() <= ring.capacity(), "over the bound at {i}");
            assert!(ring.len() <= 3);
        }
        assert_eq!(ring.len(), 3);
        let d = ring.take(at(200));
        assert_eq!(lines(&d), ["line 007\n", "line 008\n", "line 009\n"]);
        assert_eq!(d.records.front().map(|r| r.at), Some(at(107)));
        assert_eq!(d.dropped, 7);
        assert_eq!(d.since, at(100));
    }

    #[test]
    fn take_empties_and_starts_a_new_window() {
        let mut ring = Ring::new(4096, at(1));
        ring.push(at(2), "a\n");
        ring.push(at(3), "b\n");
        let first = ring.take(at(10));
        assert_eq!(lines(&first), ["a\n", "b\n"]);
        assert!(ring.is_empty());
        assert_eq!(ring.bytes(), 0);
        ring.push(at(11), "c\n");
        let second = ring.take(at(20));
        assert_eq!(lines(&second), ["c\n"], "a dump never repeats a line");
        assert_eq!(second.since, at(10));
        assert_eq!(second.dropped, 0);
    }

    #[test]
    fn a_long_line_is_cut_and_a_huge_one_does_not_empty_a_small_ring() {
        let mut ring = Ring::new(1 << 20, at(0));
        let long = format!("{}\n", "é".repeat(MAX_RECORD));
        ring.push(at(1), &long);
        let d = ring.take(at(2));
        let kept = &d.records[0].line;
        assert!(kept.len() <= MAX_RECORD, "{}", kept.len());
        assert!(kept.ends_with("…\n"));

        // A ring smaller than one line keeps the cut line alone and stays within its bound.
        let mut small = Ring::new(SLOT + 64, at(0));
        small.push(at(1), "short\n");
        small.push(at(2), &long);
        assert!(small.bytes() <= small.capacity());
        assert_eq!(small.len(), 1);
        let d = small.take(at(3));
        assert_eq!(d.dropped, 1);
        assert!(d.records[0].line.ends_with("…\n"));
    }

    #[test]
    fn a_zero_ring_keeps_nothing_and_counts() {
        let mut ring = Ring::new(0, at(0));
        ring.push(at(1), "x\n");
        assert!(ring.is_empty());
        assert_eq!(ring.bytes(), 0);
        assert_eq!(ring.take(at(2)).dropped, 1);
    }

    #[test]
    fn memory_stays_bounded_under_a_flood() {
        let cap = 64 * 1024;
        let mut ring = Ring::new(cap, at(0));
        for i in 0..100_000u64 {
            ring.push(
                at(i),
                &format!("[stamp] [INFO] [tid 1] message number {i}\n"),
            );
        }
        assert!(ring.bytes() <= cap);
        let d = ring.take(at(1));
        let held = d.records.len() as u64;
        assert_eq!(held + d.dropped, 100_000);
        // The newest are kept, in order.
        let last = d.records.back().map(|r| r.line.to_string());
        assert_eq!(
            last.as_deref(),
            Some("[stamp] [INFO] [tid 1] message number 99999\n")
        );
        assert!(
            d.records
                .iter()
                .zip(d.records.iter().skip(1))
                .all(|(a, b)| a.at < b.at)
        );
    }

    #[test]
    fn held_takes_what_the_log_turns_away_down_to_info() {
        let warn = Held {
            file_max: file_filter(3),
            on: true,
        };
        assert!(warn.takes(&Level::INFO));
        assert!(!warn.takes(&Level::WARN));
        assert!(!warn.takes(&Level::ERROR));
        assert!(!warn.takes(&Level::DEBUG), "DEBUG is never buffered");
        let off = Held {
            file_max: file_filter(0),
            on: true,
        };
        assert!(off.takes(&Level::ERROR) && off.takes(&Level::INFO));
        let info = Held {
            file_max: file_filter(4),
            on: true,
        };
        assert!(!info.takes(&Level::INFO), "level 4 writes INFO itself");
        let none = Held {
            file_max: file_filter(3),
            on: false,
        };
        assert!(!none.takes(&Level::INFO));
    }

    #[test]
    fn a_dump_says_how_many_and_since_when() {
        let mut ring = Ring::new(2 * (8 + SLOT), at(0));
        for l in ["[a] one\n", "[b] two\n", "[c] 333\n"] {
            ring.push(at(60), l);
        }
        let d = ring.take(at(120));
        let text = String::from_utf8(render(&d, DumpReason::Sighup, 3, ring.capacity(), at(120)))
            .expect("utf-8");
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows.len(), 4, "{text}");
        assert!(
            rows[0].contains(
                "SIGHUP received: verbose log buffer: 2 message(s) below LOG_LEVEL 3 since Jan 01 1970 00:00:00.000"
            ),
            "{text}"
        );
        assert!(rows[0].contains("1 older message(s) dropped"), "{text}");
        assert_eq!(&rows[1..3], ["[b] two", "[c] 333"]);
        assert!(rows[3].contains("End of the verbose log buffer (2 message(s))"));

        let empty = Ring::new(1024, at(0)).take(at(1));
        let text =
            String::from_utf8(render(&empty, DumpReason::Sighup, 4, 1024, at(1))).expect("utf-8");
        assert_eq!(text.lines().count(), 1);
        assert!(text.contains("nothing is held back"), "{text}");
    }
}
