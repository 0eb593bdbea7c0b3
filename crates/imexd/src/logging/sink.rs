//! Where the log's lines go, for every line and for the verbose-buffer dumps alike: the capped,
//! rotating log file ([`LogFile`]), stderr (`LOG_FILE_NAME` empty, or a file that cannot be
//! opened), or syslog (`LOG_USE_SYSLOG=1`, [`Syslog`]) with the file as its fallback.
//!
//! The syslog fallback is taken at most once and for good: at start when the socket is missing
//! or refuses (`init` logs why), or later when the logger went away and connecting again
//! failed, in which case the first line in the file says why and the lines that were not sent
//! follow it. Going back to syslog takes a restart, so the log is never split between two
//! places more than once.

use std::io::{self, Write};
use std::path::PathBuf;

use super::LogTarget;
use super::log_file::LogFile;
use super::syslog::{Syslog, Unsent};

/// The file side of the log: `LOG_FILE_NAME` and how it is kept.
#[derive(Debug, Clone)]
pub(crate) struct FileSpec {
    /// `None`: stderr.
    pub(crate) path: Option<PathBuf>,
    pub(crate) append: bool,
    /// Bytes; 0: no cap.
    pub(crate) cap: u64,
    pub(crate) keep: u32,
}

impl FileSpec {
    /// The file, or stderr (with the reason when the file could not be opened).
    pub(crate) fn open(&self) -> (Sink, LogTarget) {
        let Some(p) = &self.path else {
            return (Sink::Stderr, LogTarget::Stderr(None));
        };
        match LogFile::open(p, self.append, self.cap, self.keep) {
            Ok(f) => (Sink::File(f), LogTarget::File(p.display().to_string())),
            Err(e) => (
                Sink::Stderr,
                LogTarget::Stderr(Some(format!("cannot open {}: {e}", p.display()))),
            ),
        }
    }
}

/// The log's destination.
#[derive(Debug)]
pub(crate) enum Sink {
    File(LogFile),
    Stderr,
    Syslog {
        syslog: Syslog,
        /// Where the lines go if the logger goes away.
        fallback: FileSpec,
    },
}

/// Where a target is, in words.
pub(crate) fn describe(target: &LogTarget) -> String {
    match target {
        LogTarget::File(p) => format!("the log file {p}"),
        LogTarget::Stderr(_) => "stderr".to_owned(),
        LogTarget::Syslog(p) => format!("syslog ({})", p.display()),
    }
}

impl Write for Sink {
    /// `buf` is one or more whole lines: one event, or one dump.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::File(f) => f.write_lines(buf)?,
            Sink::Stderr => io::stderr().write_all(buf)?,
            Sink::Syslog { syslog, fallback } => {
                if let Err(Unsent { error, at }) = syslog.send_lines(buf) {
                    let (mut next, target) = fallback.open();
                    let why = super::stamped_line(
                        "ERROR",
                        &format!(
                            "LOG_USE_SYSLOG=1: the syslog socket {} stopped taking messages and \
                             connecting to it again failed ({error}): logging to {} from now on. \
                             Fix: start the system logger (systemd-journald or rsyslog), then \
                             restart the daemon to log to syslog again",
                            syslog.path().display(),
                            describe(&target)
                        ),
                    );
                    next.write_all(why.as_bytes())?;
                    next.write_all(&buf[at..])?;
                    *self = next;
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Stderr => io::stderr().flush(),
            // Files are written unbuffered; datagrams are sent whole.
            Sink::File(_) | Sink::Syslog { .. } => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::scratch::Dir;

    #[test]
    fn a_logger_that_goes_away_hands_the_rest_to_the_file_behind_one_line() {
        let dir = Dir::new("sink");
        let log = dir.join("imex.log");
        let (socket, server, syslog) = crate::logging::syslog::tests::logger(&dir);
        let mut sink = Sink::Syslog {
            syslog,
            fallback: FileSpec {
                path: Some(log.clone()),
                append: true,
                cap: 0,
                keep: 0,
            },
        };
        sink.write_all(b"[s] [INFO] [tid 1] to syslog\n")
            .expect("write");
        let mut buf = [0u8; 256];
        let n = server.recv(&mut buf).expect("recv");
        assert!(String::from_utf8_lossy(&buf[..n]).ends_with("to syslog"));
        assert!(!log.exists(), "the file is not touched while syslog works");

        drop(server);
        std::fs::remove_file(&socket).expect("rm");
        sink.write_all(b"[s] [INFO] [tid 1] first\n[s] [INFO] [tid 1] second\n")
            .expect("write");
        sink.write_all(b"[s] [INFO] [tid 1] third\n")
            .expect("write");
        assert!(matches!(sink, Sink::File(_)));
        let text = std::fs::read_to_string(&log).expect("the fallback file");
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows.len(), 4, "{text}");
        assert!(
            rows[0].contains("[ERROR]")
                && rows[0].contains("stopped taking messages")
                && rows[0].contains(&log.display().to_string()),
            "{text}"
        );
        assert_eq!(
            &rows[1..],
            [
                "[s] [INFO] [tid 1] first",
                "[s] [INFO] [tid 1] second",
                "[s] [INFO] [tid 1] third"
            ]
        );
    }
}
