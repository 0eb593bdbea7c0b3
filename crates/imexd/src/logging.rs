//! Logging as NVIDIA's daemon does it: `LOG_LEVEL` 0 (off) … 4 (INFO), to `LOG_FILE_NAME`
//! (appended or truncated per `LOG_APPEND_TO_LOG`), or stderr when the name is empty or the file
//! cannot be opened. Lines look like `[Dec 02 2026 15:40:01.123] [INFO] [tid 7] message`.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Where the log went (to say so on stderr when a file could not be opened).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    /// The named file.
    File(String),
    /// Standard error (empty name, or the file could not be opened: the reason).
    Stderr(Option<String>),
}

/// Installs the global subscriber. `level` is NVIDIA's LOG_LEVEL (0..=4).
pub fn init(level: u8, file: Option<&Path>, append: bool) -> LogTarget {
    let max = match level {
        0 => None,
        1 | 2 => Some(Level::ERROR),
        3 => Some(Level::WARN),
        _ => Some(Level::INFO),
    };
    let (writer, target): (Box<dyn Write + Send>, LogTarget) = match file {
        None => (Box::new(std::io::stderr()), LogTarget::Stderr(None)),
        Some(p) => match OpenOptions::new()
            .create(true)
            .append(append)
            .write(true)
            .truncate(!append)
            .open(p)
        {
            Ok(f) => (Box::new(f), LogTarget::File(p.display().to_string())),
            Err(e) => (
                Box::new(std::io::stderr()),
                LogTarget::Stderr(Some(format!("cannot open {}: {e}", p.display()))),
            ),
        },
    };
    let shared = Arc::new(Mutex::new(writer));
    let make = move || SharedWriter(shared.clone());
    let builder = tracing_subscriber::fmt()
        .event_format(NvFormat)
        .with_writer(make)
        .with_max_level(max.unwrap_or(Level::ERROR));
    if max.is_some() {
        let _ = builder.try_init();
    }
    if let Some(f) = file.filter(|_| matches!(target, LogTarget::File(_))) {
        tracing::info!("IMEX Log initializing at: {}", crate::logging::now_stamp());
        tracing::info!(
            "openimex {} writing log to {}",
            env!("CARGO_PKG_VERSION"),
            f.display()
        );
    }
    target
}

struct SharedWriter(Arc<Mutex<Box<dyn Write + Send>>>);

impl Write for SharedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.0.lock() {
            Ok(mut w) => w.write(buf),
            Err(p) => p.into_inner().write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self.0.lock() {
            Ok(mut w) => w.flush(),
            Err(p) => p.into_inner().flush(),
        }
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
        let tid = nix::unistd::gettid();
        write!(w, "[{}] [{level}] [tid {tid}] ", log_stamp())?;
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
