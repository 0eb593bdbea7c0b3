//! Issue 7 item 4, SIGHUP (docs/reference/imex-guide.md §1 LOG_LEVEL, §5): messages that LOG_LEVEL keeps out of
//! the log go to a bounded in-memory buffer; SIGHUP writes it to the log behind a header that
//! says how many and since when, the daemon keeps running, and a clean stop writes what is left.

use std::path::Path;
use std::time::Duration;

use openimex_harness::{Cluster, Signal};

use crate::common::{FORM, NOTICE, spec, text, wait_for};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The lines of the first dump whose header contains `header`: the header itself, and the
/// lines up to (not including) its end line.
fn dump<'a>(log: &'a str, header: &str) -> Option<(&'a str, Vec<&'a str>)> {
    let mut lines = log.lines().skip_while(|l| !l.contains(header));
    let head = lines.next()?;
    let body = lines
        .take_while(|l| !l.contains("End of the verbose log buffer"))
        .collect();
    Some((head, body))
}

/// The number in "…: N message(s) below LOG_LEVEL…".
fn announced(header: &str) -> Option<usize> {
    let (before, _) = header.split_once(" message(s) below LOG_LEVEL")?;
    before.rsplit(' ').next()?.parse().ok()
}

#[test]
fn sighup_writes_the_held_info_lines_and_the_daemon_stays_ready() {
    let mut cluster = Cluster::start(spec(2).config("LOG_LEVEL", "3")).expect("start");
    cluster.wait_up(0, FORM).expect("UP");
    cluster.wait_up(1, FORM).expect("UP on node 1");
    let log = cluster.node(0).log_path();

    // LOG_LEVEL 3 keeps INFO out of the log: the link's INFO line is held, not written.
    let before = read(&log);
    assert!(
        !before.contains("Connection established"),
        "LOG_LEVEL=3 wrote an INFO line:\n{before}"
    );
    assert!(!before.contains("[INFO]"), "LOG_LEVEL=3:\n{before}");

    cluster.signal(0, Signal::SIGHUP).expect("SIGHUP");
    let dumped = wait_for(NOTICE, || {
        read(&log).contains("End of the verbose log buffer")
    });
    let after = read(&log);
    assert!(dumped, "no dump after SIGHUP:\n{after}");
    let (header, body) =
        dump(&after, "SIGHUP received: verbose log buffer:").expect("a SIGHUP header");
    assert!(
        header.contains("below LOG_LEVEL 3 since "),
        "the header says since when: {header}"
    );
    assert_eq!(
        announced(header),
        Some(body.len()),
        "the header counts the lines: {header}\n{}",
        body.join("\n")
    );
    assert!(
        body.iter()
            .any(|l| l.contains("Connection established to node 1")),
        "the held INFO line is written:\n{after}"
    );
    assert!(
        body.iter()
            .all(|l| l.starts_with('[') && l.contains("] [INFO] [tid ")),
        "held lines keep NVIDIA's format and their own level:\n{}",
        body.join("\n")
    );
    let established = after.matches("Connection established").count();

    // Still the same daemon, READY, in an UP domain.
    assert!(cluster.is_running(0), "SIGHUP ended the daemon");
    let q = cluster.ctl(0, &["-q"]).expect("ctl -q");
    assert_eq!(text(&q.stdout), "READY\n", "{}", text(&q.stderr));
    cluster.wait_up(0, FORM).expect("still UP after SIGHUP");

    // A clean stop writes what was held since (at least its own INFO line), and exits 0.
    let out = cluster.stop(0, Duration::from_secs(10)).expect("SIGTERM");
    assert_eq!(out.exit_code, Some(0), "{out:?}\n{}", cluster.logs_tail(40));
    assert!(
        !out.killed && out.elapsed < Duration::from_secs(5),
        "{out:?}"
    );
    let end = read(&log);
    let (header, body) = dump(&end, "Shutting down: verbose log buffer:").expect("a shutdown dump");
    assert!(header.contains("below LOG_LEVEL 3 since "), "{header}");
    assert!(
        body.iter()
            .any(|l| l.contains("SIGTERM received, shutting down")),
        "{end}"
    );
    assert_eq!(
        end.matches("Connection established").count(),
        established,
        "a line is written once: a dump empties the buffer"
    );
}

#[test]
fn a_small_buffer_keeps_the_newest_lines_and_counts_the_rest() {
    let mut cluster = Cluster::start(
        spec(2)
            .config("LOG_LEVEL", "3")
            .config("OPENIMEX_VERBOSE_LOG_BUFFER_KB", "1"),
    )
    .expect("start");
    cluster.wait_up(0, FORM).expect("UP");
    let log = cluster.node(0).log_path();
    cluster.signal(0, Signal::SIGHUP).expect("SIGHUP");
    let header = "SIGHUP received: verbose log buffer:";
    assert!(
        wait_for(NOTICE, || read(&log)
            .contains("End of the verbose log buffer")),
        "{}",
        read(&log)
    );
    let after = read(&log);
    let (head, body) = dump(&after, header).expect("header");
    let held: usize = body.iter().map(|l| l.len() + 1).sum();
    assert!(
        held <= 1024,
        "{held} bytes held in a 1 KiB buffer:\n{after}"
    );
    assert!(
        head.contains("older message(s) dropped to stay within 1 KiB"),
        "start-up alone logs more than 1 KiB of INFO: {head}"
    );
    assert!(cluster.is_running(0));
    let out = cluster.stop(0, Duration::from_secs(10)).expect("SIGTERM");
    assert_eq!(out.exit_code, Some(0), "{out:?}");
}
