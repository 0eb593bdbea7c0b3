//! The log file under NVIDIA's size cap and rotation: `LOG_FILE_MAX_SIZE` (the cap, in MB of
//! 2^20 bytes at the key; in bytes here) and `LOG_MAX_ROTATE_COUNT` (docs/reference/imex-guide.md §1).
//!
//! - Count 0: no rotation. Lines are written while they fit under the cap less a small reserve
//!   ([`STOP_RESERVE`]); the first line that does not fit is replaced by one notice line that
//!   says logging stopped and why, and nothing more is written to the file.
//! - Count N > 0: when a line does not fit, the files shift (`name.N-1` → `name.N`, …,
//!   `name` → `name.1`, so `name.1` is the newest and the oldest `name.N` is overwritten, i.e.
//!   purged), a new empty `name` is opened, and the line goes there. The total stays near
//!   cap × (N + 1).
//! - Cap 0 (`LOG_FILE_MAX_SIZE=0`): no cap, no rotation.
//!
//! A write is whole lines (the formatter hands one event, a dump hands many): the cap is judged
//! line by line and a line is never split across two files. A single line longer than the cap
//! gets a fresh file of its own (rotation) or stops the log (count 0).
//!
//! `LOG_APPEND_TO_LOG=1` with a file already over the cap: the size counted is the file's size,
//! so the first line of the new run (the start-up banner) rotates it away at once (count N), or
//! finds it full and writes only the stop notice (count 0: one notice line per start, so the
//! operator sees why the log is silent; nothing else is added). Rotated files past a smaller N
//! left by an earlier run are not touched.
//!
//! When a rotation fails (e.g. the directory is not writable), the file is treated as count 0:
//! a notice naming the error, then nothing more, rather than growing past the cap.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Room kept under the cap, with count 0, for the stop notice (its text and a path of up to
/// 256 characters).
pub(crate) const STOP_RESERVE: u64 = 1024;

/// The capped, rotating log file.
#[derive(Debug)]
pub(crate) struct LogFile {
    path: PathBuf,
    /// `None` once logging stopped at the cap.
    file: Option<File>,
    /// Bytes in the current file.
    size: u64,
    /// The cap in bytes; 0: none.
    cap: u64,
    /// Rotated files kept (`LOG_MAX_ROTATE_COUNT`).
    keep: u32,
}

impl LogFile {
    /// Opens `path`, appended to or truncated, under a cap of `cap` bytes (0: none) keeping
    /// `keep` rotated files.
    pub(crate) fn open(path: &Path, append: bool, cap: u64, keep: u32) -> io::Result<LogFile> {
        let file = OpenOptions::new()
            .create(true)
            .append(append)
            .write(true)
            .truncate(!append)
            .open(path)?;
        let size = file.metadata()?.len();
        Ok(LogFile {
            path: path.to_path_buf(),
            file: Some(file),
            size,
            cap,
            keep,
        })
    }

    /// Whether logging stopped at the cap (count 0, or a failed rotation).
    pub(crate) fn stopped(&self) -> bool {
        self.file.is_none()
    }

    /// Writes `buf`, one or more whole lines, rotating between lines as the cap requires.
    pub(crate) fn write_lines(&mut self, buf: &[u8]) -> io::Result<()> {
        if buf.is_empty() || self.stopped() {
            return Ok(());
        }
        // Most writes are one line far from the cap: one write call.
        if self.fits(buf.len()) {
            return self.append(buf);
        }
        for line in buf.split_inclusive(|&b| b == b'\n') {
            self.write_line(line)?;
        }
        Ok(())
    }

    /// The most bytes the current file may hold before a rotation or the stop.
    fn limit(&self) -> u64 {
        match self.keep {
            0 => self.cap.saturating_sub(STOP_RESERVE),
            _ => self.cap,
        }
    }

    fn fits(&self, len: usize) -> bool {
        self.cap == 0 || self.size.saturating_add(len as u64) <= self.limit()
    }

    fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.stopped() {
            return Ok(());
        }
        if !self.fits(line.len()) {
            if self.keep == 0 {
                let why = format!(
                    "The log file reached its size cap (LOG_FILE_MAX_SIZE: {}) and \
                     LOG_MAX_ROTATE_COUNT is 0: logging to {} stops here. To keep logging, set \
                     LOG_MAX_ROTATE_COUNT to the number of rotated files to keep (or raise \
                     LOG_FILE_MAX_SIZE), move this file away and restart the daemon",
                    cap_text(self.cap),
                    self.path.display()
                );
                return self.stop(&why);
            }
            // An empty file takes the long line: rotating would only make an empty file.
            if self.size > 0
                && let Err(e) = self.rotate()
            {
                let why = format!(
                    "Cannot rotate the log file {} (LOG_FILE_MAX_SIZE {}, LOG_MAX_ROTATE_COUNT \
                     {}): {e}. Logging to it stops here rather than grow past the cap; make its \
                     directory writable and restart the daemon",
                    self.path.display(),
                    cap_text(self.cap),
                    self.keep
                );
                return self.stop(&why);
            }
        }
        self.append(line)
    }

    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        file.write_all(buf)?;
        self.size = self.size.saturating_add(buf.len() as u64);
        Ok(())
    }

    /// Writes the one notice line and closes the file.
    fn stop(&mut self, why: &str) -> io::Result<()> {
        let line = super::stamped_line("WARNING", why);
        let written = self.append(line.as_bytes());
        self.file = None;
        written
    }

    /// `name.i` → `name.i+1` for the rotated files that exist (the oldest, `name.N`, is
    /// overwritten), `name` → `name.1`, and a new empty `name`.
    fn rotate(&mut self) -> io::Result<()> {
        let mut present = 0;
        while present < self.keep && rotated(&self.path, present + 1).exists() {
            present += 1;
        }
        for i in (1..=present.min(self.keep - 1)).rev() {
            std::fs::rename(rotated(&self.path, i), rotated(&self.path, i + 1))?;
        }
        std::fs::rename(&self.path, rotated(&self.path, 1))?;
        self.file = Some(
            OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(&self.path)?,
        );
        self.size = 0;
        Ok(())
    }
}

/// `name.i`.
pub(crate) fn rotated(path: &Path, i: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{i}"));
    PathBuf::from(name)
}

/// The cap as the key gives it (`1 MB`), or in bytes when it is no whole number of MB.
fn cap_text(cap: u64) -> String {
    const MB: u64 = 1 << 20;
    if cap.is_multiple_of(MB) {
        format!("{} MB", cap / MB)
    } else {
        format!("{cap} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::logging::scratch::Dir;

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap_or_default()
    }

    /// `line NNNN` padded to 20 bytes with its newline.
    fn line(i: usize) -> String {
        format!("line {i:04} .........\n")
    }

    /// Writes `line i` for each `i`, one write each.
    fn write_range(f: &mut LogFile, range: std::ops::Range<usize>) {
        for i in range {
            f.write_lines(line(i).as_bytes()).expect("write");
        }
    }

    /// The numbers of the `line NNNN` lines of `text`, in order.
    fn numbers(text: &str) -> Vec<usize> {
        text.lines()
            .filter_map(|l| l.strip_prefix("line "))
            .filter_map(|l| l.get(..4)?.parse().ok())
            .collect()
    }

    #[test]
    fn rotation_keeps_n_files_newest_first_and_purges_the_oldest() {
        let dir = Dir::new("rotate");
        let log = dir.join("imex.log");
        // Five 20-byte lines per file.
        let mut f = LogFile::open(&log, false, 100, 2).expect("open");
        write_range(&mut f, 0..23);
        let (cur, one, two) = (read(&log), read(&rotated(&log, 1)), read(&rotated(&log, 2)));
        assert_eq!(
            numbers(&two),
            [10, 11, 12, 13, 14],
            "name.2 is the oldest kept"
        );
        assert_eq!(
            numbers(&one),
            [15, 16, 17, 18, 19],
            "name.1 is the newest rotated"
        );
        assert_eq!(numbers(&cur), [20, 21, 22]);
        assert!(!rotated(&log, 3).exists(), "only N rotated files");
        for text in [&cur, &one, &two] {
            assert!(text.len() <= 100, "over the cap: {}", text.len());
        }
    }

    #[test]
    fn a_multi_line_write_rotates_between_lines_never_inside_one() {
        let dir = Dir::new("multi");
        let log = dir.join("imex.log");
        let mut f = LogFile::open(&log, false, 50, 1).expect("open");
        // 30 bytes, then a 3-line write of 20 + 25 + 20 bytes.
        f.write_lines(b"first line is 30 bytes long..\n")
            .expect("w");
        f.write_lines(b"second: 20 bytes...\nthird: 25 bytes.........\nfourth: 20 bytes...\n")
            .expect("w");
        assert_eq!(
            read(&rotated(&log, 1)),
            "first line is 30 bytes long..\nsecond: 20 bytes...\n"
        );
        assert_eq!(
            read(&log),
            "third: 25 bytes.........\nfourth: 20 bytes...\n"
        );
    }

    #[test]
    fn count_zero_stops_at_the_cap_with_one_notice() {
        let dir = Dir::new("stop");
        let log = dir.join("imex.log");
        let cap = STOP_RESERVE + 100;
        let mut f = LogFile::open(&log, false, cap, 0).expect("open");
        write_range(&mut f, 0..50);
        assert!(f.stopped());
        let text = read(&log);
        assert_eq!(
            numbers(&text),
            [0, 1, 2, 3, 4],
            "five lines fit under the reserve"
        );
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(rows.len(), 6, "{text}");
        assert!(
            rows[5].contains("[WARNING]")
                && rows[5].contains("LOG_MAX_ROTATE_COUNT is 0: logging to")
                && rows[5].contains("stops here"),
            "{text}"
        );
        assert_eq!(text.matches("stops here").count(), 1, "said once");
        assert!(text.len() as u64 <= cap, "{} > {cap}", text.len());
        assert!(!rotated(&log, 1).exists());
    }

    #[test]
    fn append_to_a_file_over_the_cap_rotates_it_at_the_first_line() {
        let dir = Dir::new("append");
        let log = dir.join("imex.log");
        std::fs::write(&log, "old\n".repeat(100)).expect("seed");
        let mut f = LogFile::open(&log, true, 100, 3).expect("open");
        f.write_lines(b"banner of the new run\n").expect("w");
        assert_eq!(read(&log), "banner of the new run\n");
        assert_eq!(read(&rotated(&log, 1)), "old\n".repeat(100));

        // Count 0: the full file gets only the notice.
        std::fs::write(&log, "old\n".repeat(200)).expect("seed");
        let mut f = LogFile::open(&log, true, 600, 0).expect("open");
        f.write_lines(b"banner\n").expect("w");
        let text = read(&log);
        assert!(text.starts_with(&"old\n".repeat(200)));
        assert!(!text.contains("banner"));
        assert!(text.ends_with("stops here. To keep logging, set LOG_MAX_ROTATE_COUNT to the number of rotated files to keep (or raise LOG_FILE_MAX_SIZE), move this file away and restart the daemon\n"), "{text}");
    }

    #[test]
    fn no_cap_never_rotates_and_a_huge_line_gets_a_file_of_its_own() {
        let dir = Dir::new("huge");
        let log = dir.join("imex.log");
        let mut f = LogFile::open(&log, false, 0, 2).expect("open");
        write_range(&mut f, 0..100);
        assert_eq!(read(&log).len(), 2000);
        assert!(!rotated(&log, 1).exists());

        let mut f = LogFile::open(&log, false, 50, 2).expect("open");
        f.write_lines(b"short\n").expect("w");
        let huge = format!("{}\n", "x".repeat(200));
        f.write_lines(huge.as_bytes()).expect("w");
        f.write_lines(b"after\n").expect("w");
        assert_eq!(read(&rotated(&log, 2)), "short\n");
        assert_eq!(read(&rotated(&log, 1)), huge, "whole, not split");
        assert_eq!(read(&log), "after\n");
    }

    #[test]
    fn a_failed_rotation_stops_the_log_instead_of_passing_the_cap() {
        let dir = Dir::new("fail");
        let log = dir.join("imex.log");
        let mut f = LogFile::open(&log, false, 40, 1).expect("open");
        // A directory where name.1 must go: the rename fails.
        std::fs::create_dir_all(rotated(&log, 1).join("x")).expect("blocker");
        write_range(&mut f, 0..4);
        assert!(f.stopped());
        let text = read(&log);
        assert_eq!(numbers(&text), [0, 1], "two lines fill the cap");
        assert!(text.contains("Cannot rotate the log file"), "{text}");
    }
}
