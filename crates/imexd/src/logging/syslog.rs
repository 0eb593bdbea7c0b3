//! `LOG_USE_SYSLOG=1`: every log line goes to the system logger instead of the file, as an
//! RFC 3164 datagram `<PRI>Mmm dd hh:mm:ss nvidia-imex[PID]: [LEVEL] [tid N] message` sent to
//! the unix datagram socket `OPENIMEX_SYSLOG_SOCKET` (default `/dev/log`, which
//! systemd-journald or rsyslog serves, so under systemd the lines land in the journal).
//!
//! The facility is daemon (3); the severity comes from the line's level: CRITICAL 2, ERROR 3,
//! WARNING 4, INFO 6, DEBUG and TRACE 7. The time stamp is UTC like the file's (journald keeps
//! its own receive time). The message keeps the level and thread words of the file's line, so
//! what greps a file greps `journalctl -u nvidia-imex` too; one message is cut to
//! [`super::MAX_RECORD`] bytes.
//!
//! A logger that cannot keep up must not stall the daemon: a send waits at most
//! [`SEND_TIMEOUT`]; after one times out, sends stop waiting and lines the socket cannot take
//! are dropped and counted, until one goes through, which is then preceded by a message
//! saying how many were dropped. A socket that refuses (the logger went away) is connected
//! again once; when that fails too, [`Syslog::send_lines`] reports where it stopped, and the
//! caller falls back to the log file.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long one send may wait for room in the logger's queue. Short: the line is written on
/// the thread that logged it, and the daemon's sessions and engine share one thread, so a
/// stuck logger must cost them well under a heartbeat.
pub(crate) const SEND_TIMEOUT: Duration = Duration::from_millis(200);

/// The tag NVIDIA's daemon logs under.
const TAG: &str = "nvidia-imex";
/// Facility daemon, shifted into place.
const DAEMON: u8 = 3 << 3;

/// A connected syslog socket.
#[derive(Debug)]
pub(crate) struct Syslog {
    sock: UnixDatagram,
    path: PathBuf,
    pid: u32,
    /// A send timed out: later sends do not wait until one succeeds.
    congested: bool,
    /// Lines dropped since the last one that went through.
    dropped: u64,
}

/// Why sending stopped: the error and the offset in the buffer of the first unsent line.
#[derive(Debug)]
pub(crate) struct Unsent {
    pub(crate) error: io::Error,
    pub(crate) at: usize,
}

impl Syslog {
    /// Connects to the datagram socket at `path`.
    pub(crate) fn connect(path: &Path) -> io::Result<Syslog> {
        Ok(Syslog {
            sock: connected(path)?,
            path: path.to_path_buf(),
            pid: std::process::id(),
            congested: false,
            dropped: 0,
        })
    }

    /// The socket's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Sends each line of `buf` (formatted log lines) as one message.
    pub(crate) fn send_lines(&mut self, buf: &[u8]) -> Result<(), Unsent> {
        let mut at = 0;
        for line in buf.split_inclusive(|&b| b == b'\n') {
            let text = String::from_utf8_lossy(line);
            let text = text.trim_end_matches('\n');
            if !text.is_empty() {
                let msg = datagram(text, self.pid, super::since_epoch());
                self.send(&msg).map_err(|error| Unsent { error, at })?;
            }
            at += line.len();
        }
        Ok(())
    }

    /// Sends one message: drops it when the logger is full, reconnects once when it refused.
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        match self.try_send(msg) {
            Ok(()) => Ok(()),
            Err(e) if is_full(&e) => {
                self.dropped += 1;
                if !self.congested {
                    self.congested = true;
                    // Until one gets through, a full queue drops the line at once.
                    let _ = self.sock.set_nonblocking(true);
                }
                Ok(())
            }
            // A message the socket can never take (too large): that line only.
            Err(e) if e.raw_os_error() == Some(nix::libc::EMSGSIZE) => {
                self.dropped += 1;
                Ok(())
            }
            Err(_) => {
                self.sock = connected(&self.path)?;
                self.congested = false;
                self.try_send(msg)
            }
        }
    }

    fn try_send(&mut self, msg: &[u8]) -> io::Result<()> {
        if self.dropped > 0 {
            let note = super::stamped_line(
                "WARNING",
                &format!(
                    "{} log message(s) dropped: the syslog socket {} was full",
                    self.dropped,
                    self.path.display()
                ),
            );
            let note = datagram(note.trim_end(), self.pid, super::since_epoch());
            self.sock.send(&note)?;
            self.dropped = 0;
            if self.congested {
                self.congested = false;
                let _ = self.sock.set_nonblocking(false);
            }
        }
        self.sock.send(msg).map(drop)
    }
}

fn connected(path: &Path) -> io::Result<UnixDatagram> {
    let sock = UnixDatagram::unbound()?;
    sock.connect(path)?;
    sock.set_write_timeout(Some(SEND_TIMEOUT))?;
    Ok(sock)
}

/// A send that found the logger's queue full (non-blocking, or past the timeout).
fn is_full(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) || e.raw_os_error() == Some(nix::libc::ENOBUFS)
}

/// The syslog severity of a level word.
fn severity(level: &str) -> u8 {
    match level {
        "CRITICAL" => 2,
        "ERROR" => 3,
        "WARNING" => 4,
        "DEBUG" | "TRACE" => 7,
        _ => 6,
    }
}

/// One RFC 3164 message for a formatted log line `[stamp] [LEVEL] [tid N] text` (a line of
/// another shape is sent whole, as INFO).
pub(crate) fn datagram(line: &str, pid: u32, now: Duration) -> Vec<u8> {
    // Past the file's own stamp: the message starts at the level.
    let msg = line
        .strip_prefix('[')
        .and_then(|l| l.split_once("] ["))
        .map_or(line, |(_, rest)| &line[line.len() - rest.len() - 1..]);
    let level = msg
        .strip_prefix('[')
        .and_then(|m| m.split_once(']'))
        .map_or("INFO", |(level, _)| level);
    let mut end = msg.len().min(super::MAX_RECORD);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "<{}>{} {TAG}[{pid}]: {}",
        DAEMON | severity(level),
        rfc3164_stamp(now),
        &msg[..end]
    )
    .into_bytes()
}

/// `Mmm dd hh:mm:ss` (day space-padded), UTC.
fn rfc3164_stamp(now: Duration) -> String {
    // `Mon DD YYYY HH:MM:SS.mmm`, cut and re-padded.
    let s = openimex_core::timefmt::log_timestamp(now);
    let month = s.get(..3).unwrap_or("Jan");
    let day: u32 = s.get(4..6).and_then(|d| d.parse().ok()).unwrap_or(1);
    let time = s.get(12..20).unwrap_or("00:00:00");
    format!("{month} {day:>2} {time}")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::logging::scratch::Dir;

    /// A logger's socket bound in `dir`, and a client connected to it.
    pub(crate) fn logger(dir: &Dir) -> (PathBuf, UnixDatagram, Syslog) {
        let path = dir.join("log.sock");
        let server = UnixDatagram::bind(&path).expect("bind");
        let log = Syslog::connect(&path).expect("connect");
        (path, server, log)
    }

    fn text(d: &[u8]) -> &str {
        std::str::from_utf8(d).expect("utf-8")
    }

    #[test]
    fn a_log_line_becomes_an_rfc3164_message() {
        // 2026-12-03 22:47:49 UTC.
        let now = Duration::from_secs(1_796_338_069);
        let d = datagram(
            "[Dec 03 2026 22:47:49.123] [ERROR] [tid 7] cannot read the persistence file",
            42,
            now,
        );
        assert_eq!(
            text(&d),
            "<27>Dec  3 22:47:49 nvidia-imex[42]: [ERROR] [tid 7] cannot read the persistence file"
        );
        for (level, pri) in [
            ("CRITICAL", 26),
            ("WARNING", 28),
            ("INFO", 30),
            ("DEBUG", 31),
        ] {
            let d = datagram(&format!("[x] [{level}] [tid 1] m"), 1, now);
            assert!(
                text(&d).starts_with(&format!("<{pri}>Dec  3 22:47:49 nvidia-imex[1]: [{level}]")),
                "{}",
                text(&d)
            );
        }
        let d = datagram("no stamp here", 1, now);
        assert_eq!(
            text(&d),
            "<30>Dec  3 22:47:49 nvidia-imex[1]: no stamp here"
        );
        let d = datagram(&format!("[x] [INFO] [tid 1] {}", "é".repeat(9000)), 1, now);
        assert!(d.len() < super::super::MAX_RECORD + 64);
    }

    #[test]
    fn lines_arrive_one_per_message_and_a_missing_socket_is_an_error() {
        let dir = Dir::new("syslog");
        let (path, server, mut log) = logger(&dir);
        log.send_lines(b"[s] [INFO] [tid 1] one\n[s] [WARNING] [tid 1] two\n")
            .expect("send");
        let mut buf = [0u8; 512];
        let mut got = Vec::new();
        for _ in 0..2 {
            let n = server.recv(&mut buf).expect("recv");
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        assert!(got[0].starts_with("<30>") && got[0].ends_with("[INFO] [tid 1] one"));
        assert!(got[1].starts_with("<28>") && got[1].ends_with("[WARNING] [tid 1] two"));

        // The logger goes away: the reconnect fails and the caller learns where it stopped.
        drop(server);
        std::fs::remove_file(&path).expect("rm");
        let lines = b"[s] [INFO] [tid 1] three\n[s] [INFO] [tid 1] four\n";
        let unsent = log.send_lines(lines).expect_err("no logger");
        assert_eq!(unsent.at, 0);
        assert!(Syslog::connect(&path).is_err());
    }

    #[test]
    fn a_full_logger_drops_and_counts_instead_of_stalling() {
        let dir = Dir::new("syslog-full");
        let (_, server, mut log) = logger(&dir);
        // Nobody reads: the queue fills, one send waits out the timeout, the rest are dropped.
        let flood: String = (0..2000)
            .map(|i| format!("[s] [INFO] [tid 1] flood {i}\n"))
            .collect();
        log.send_lines(flood.as_bytes())
            .expect("a full queue is no error");
        assert!(log.congested && log.dropped > 0, "{log:?}");
        let dropped = log.dropped;
        server.set_nonblocking(true).expect("nonblocking");
        let mut buf = [0u8; 512];
        let mut queued = 0;
        while server.recv(&mut buf).is_ok() {
            queued += 1;
        }
        assert_eq!(queued + dropped, 2000);
        log.send_lines(b"[s] [INFO] [tid 1] after\n").expect("send");
        server.set_nonblocking(false).expect("blocking");
        let n = server.recv(&mut buf).expect("note");
        let note = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(
            note.starts_with("<28>") && note.contains(&format!("{dropped} log message(s) dropped")),
            "{note}"
        );
        let n = server.recv(&mut buf).expect("line");
        assert!(String::from_utf8_lossy(&buf[..n]).ends_with("after"));
        assert!(!log.congested && log.dropped == 0);
    }
}
