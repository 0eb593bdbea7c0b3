//! Issue 9 item 1, the logging keys (docs/reference/imex-guide.md §1, §9) on real daemons: `LOG_LEVEL` decides
//! which of ERROR, WARNING and INFO reach the file; `LOG_FILE_MAX_SIZE` with
//! `LOG_MAX_ROTATE_COUNT` caps and rotates it (N rotated files, the oldest purged; 0 stops with
//! one notice); `LOG_USE_SYSLOG=1` sends every line to a syslog datagram socket instead, and
//! falls back to the file with one line saying why when the socket is missing.
//!
//! Each daemon is made to log one line of each level at start: an unknown config key is a
//! WARNING (a config notice), a malformed persist record read under the RECOVERY quorum is an
//! ERROR, and the start-up banner and config dump are INFO.

use std::io::Write as _;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openimex_harness::{Cluster, ClusterSpec, Signal};

use crate::common::{FORM, NOTICE, spec, wait_for};

/// The unknown key that makes every daemon here log a WARNING.
const UNKNOWN_KEY: &str = "IMEX_LOG_KEYS_TEST_UNKNOWN";
/// Words of the ERROR line a malformed persist record causes.
const PERSIST_ERROR: &str = "cannot read the persistence file";

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// One node that logs an ERROR, a WARNING and INFO at start; prepared, not started.
fn prepare(spec: ClusterSpec) -> Cluster {
    let cluster = Cluster::prepare(
        spec.config("IMEX_WAIT_FOR_QUORUM", "RECOVERY")
            .config(UNKNOWN_KEY, "1"),
    )
    .expect("prepare");
    std::fs::write(cluster.node(0).dir().join("persist.dat"), "node bogus\n")
        .expect("write a malformed persist record");
    cluster
}

fn start_ready(cluster: &mut Cluster) {
    cluster.start_node(0).expect("start");
    cluster.wait_state(0, "READY", FORM).expect("READY");
}

#[test]
fn log_level_decides_which_levels_reach_the_file() {
    let mut clusters: Vec<(u8, Cluster)> = [0u8, 2, 3, 4]
        .into_iter()
        .map(|level| {
            (
                level,
                prepare(spec(1).config("LOG_LEVEL", level.to_string())),
            )
        })
        .collect();
    for (_, c) in &mut clusters {
        c.start_node(0).expect("start");
    }
    for (level, c) in &clusters {
        c.wait_state(0, "READY", FORM).expect("READY");
        let log = read(&c.node(0).log_path());
        let has = |level: &str, words: &str| {
            log.lines()
                .any(|l| l.contains(&format!("] [{level}] [tid ")) && l.contains(words))
        };
        let error = has("ERROR", PERSIST_ERROR);
        let warning = has("WARNING", &format!("unknown key {UNKNOWN_KEY} ignored"));
        let info = has("INFO", "IMEX Log initializing at");
        let want = (*level >= 2, *level >= 3, *level >= 4);
        assert_eq!(
            (error, warning, info),
            want,
            "LOG_LEVEL={level}: (ERROR, WARNING, INFO) written:\n{log}"
        );
        match level {
            0 => assert!(log.is_empty(), "LOG_LEVEL=0 wrote:\n{log}"),
            2 => assert!(
                !log.contains("[WARNING]") && !log.contains("[INFO]"),
                "{log}"
            ),
            3 => assert!(!log.contains("[INFO]"), "{log}"),
            _ => {
                for dump in [
                    "Logging level = 4",
                    "Max Log file size = 1024 (MBs)",
                    "Use Syslog file = 0",
                    "LOG_MAX_ROTATE_COUNT = 0",
                ] {
                    assert!(has("INFO", dump), "config dump line {dump:?}:\n{log}");
                }
            }
        }
    }
}

/// Appends `count` unknown keys of 110 characters to node 0's config: the daemon logs one
/// WARNING line of some 250 bytes for each at start, a cheap way to write megabytes.
fn flood_keys(cluster: &Cluster, count: usize) {
    let mut text = String::new();
    for i in 0..count {
        text.push_str(&format!("IMEX_FLOOD_{i:06}_{}=1\n", "X".repeat(92)));
    }
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(cluster.node(0).config_path())
        .expect("open config");
    f.write_all(text.as_bytes()).expect("append keys");
}

/// The numbers of the flood keys named in `log`, in order.
fn flood_numbers(log: &str) -> Vec<usize> {
    log.lines()
        .filter_map(|l| l.split_once("unknown key IMEX_FLOOD_"))
        .filter_map(|(_, rest)| rest.get(..6)?.parse().ok())
        .collect()
}

fn rotated(log: &Path, i: u32) -> PathBuf {
    PathBuf::from(format!("{}.{i}", log.display()))
}

#[test]
fn one_mb_files_rotate_twice_and_the_oldest_is_purged() {
    const MB: usize = 1 << 20;
    const KEYS: usize = 18_000;
    let mut cluster = prepare(
        spec(1)
            .config("LOG_FILE_MAX_SIZE", "1")
            .config("LOG_MAX_ROTATE_COUNT", "2"),
    );
    flood_keys(&cluster, KEYS);
    start_ready(&mut cluster);
    let log = cluster.node(0).log_path();
    let files = [rotated(&log, 2), rotated(&log, 1), log.clone()];
    let texts: Vec<String> = files.iter().map(|p| read(p)).collect();
    assert!(!rotated(&log, 3).exists(), "only 2 rotated files are kept");
    for (path, text) in files.iter().zip(&texts) {
        assert!(
            text.len() <= MB,
            "{} holds {} bytes, over the 1 MB cap",
            path.display(),
            text.len()
        );
        assert!(
            text.ends_with('\n')
                && text
                    .lines()
                    .all(|l| l.starts_with("[") && l.contains("] [tid ")),
            "{} holds a split or foreign line",
            path.display()
        );
    }
    for text in &texts[..2] {
        assert!(
            text.len() > MB - 1024,
            "a rotated file is full: {}",
            text.len()
        );
    }
    // Oldest first across the three files, the flood's lines run on without a gap: nothing
    // lost or split at a rotation. More than 3 MB was written, so the first ones are purged.
    let numbers: Vec<usize> = texts.iter().flat_map(|t| flood_numbers(t)).collect();
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "a gap in the flood across rotations"
    );
    assert_eq!(numbers.last(), Some(&(KEYS - 1)));
    assert!(numbers[0] > 0, "the oldest lines are purged");
    assert!(
        texts.iter().all(|t| !t.contains("IMEX Log initializing")),
        "the first file was purged"
    );
    // The daemon keeps logging into the capped file: a SIGHUP dump lands in the current one.
    cluster.signal(0, Signal::SIGHUP).expect("SIGHUP");
    assert!(
        wait_for(NOTICE, || read(&log)
            .contains("SIGHUP received: verbose log buffer")),
        "{}",
        read(&log)
    );
}

#[test]
fn with_no_rotation_logging_stops_at_the_cap_with_one_notice() {
    let mut cluster = prepare(
        spec(1)
            .config("LOG_FILE_MAX_SIZE", "1")
            .config("LOG_MAX_ROTATE_COUNT", "0"),
    );
    flood_keys(&cluster, 6_000);
    start_ready(&mut cluster);
    let log = cluster.node(0).log_path();
    let text = read(&log);
    assert!(text.len() <= 1 << 20, "{} bytes", text.len());
    assert!(!rotated(&log, 1).exists(), "count 0 never rotates");
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.contains("[WARNING]") && last.contains("LOG_MAX_ROTATE_COUNT is 0: logging to"),
        "the last line says why logging stopped: {last}"
    );
    assert_eq!(text.matches("stops here").count(), 1, "said once");
    assert!(
        text.contains("IMEX Log initializing"),
        "the first lines are kept"
    );
    cluster.signal(0, Signal::SIGHUP).expect("SIGHUP");
    let q = cluster.ctl(0, &["-q"]).expect("ctl -q");
    assert_eq!(String::from_utf8_lossy(&q.stdout), "READY\n");
    assert_eq!(read(&log), text, "nothing is written past the notice");
}

/// A bound syslog socket and the messages it received.
struct SyslogServer {
    path: PathBuf,
    got: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl SyslogServer {
    fn bind(path: PathBuf) -> SyslogServer {
        let sock = UnixDatagram::bind(&path).expect("bind the syslog socket");
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("read timeout");
        let got: Arc<Mutex<Vec<String>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (into, stopping) = (Arc::clone(&got), Arc::clone(&stop));
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while !stopping.load(Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                    into.lock().unwrap_or_else(|e| e.into_inner()).push(msg);
                }
            }
        });
        SyslogServer {
            path,
            got,
            stop,
            reader: Some(reader),
        }
    }

    fn messages(&self) -> Vec<String> {
        self.got.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn wait_for(&self, words: &str) -> Option<String> {
        let mut found = None;
        wait_for(NOTICE, || {
            found = self.messages().into_iter().find(|m| m.contains(words));
            found.is_some()
        });
        found
    }
}

impl Drop for SyslogServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[test]
fn syslog_gets_every_line_with_its_priority_and_a_missing_socket_falls_back_to_the_file() {
    let mut cluster = prepare(spec(1).config("LOG_USE_SYSLOG", "1"));
    let socket = cluster.base_dir().join("syslog.sock");
    cluster
        .set_node_config(0, "OPENIMEX_SYSLOG_SOCKET", &socket.display().to_string())
        .expect("config");
    let server = SyslogServer::bind(socket.clone());
    start_ready(&mut cluster);
    let pid = cluster.node(0).pid().expect("running");
    let log = cluster.node(0).log_path();

    let dump = server
        .wait_for("Use Syslog file = 1")
        .expect("the config dump");
    let error = server.wait_for(PERSIST_ERROR).expect("the ERROR line");
    let warning = server
        .wait_for(&format!("unknown key {UNKNOWN_KEY}"))
        .expect("the WARNING line");
    for (msg, pri, level) in [
        (&dump, 30, "INFO"),
        (&error, 27, "ERROR"),
        (&warning, 28, "WARNING"),
    ] {
        // <PRI>Mmm dd hh:mm:ss nvidia-imex[PID]: [LEVEL] [tid N] text
        let head = format!("<{pri}>");
        assert!(msg.starts_with(&head), "facility daemon, {level}: {msg}");
        let stamp = &msg[head.len()..head.len() + 15];
        assert!(
            stamp.as_bytes()[3] == b' ' && stamp.as_bytes()[6] == b' ' && &stamp[9..10] == ":",
            "an RFC 3164 time stamp: {msg}"
        );
        assert!(
            msg[head.len() + 15..].starts_with(&format!(" nvidia-imex[{pid}]: [{level}] [tid ")),
            "tag, PID and level: {msg}"
        );
    }
    // SIGHUP's dump goes the same way.
    cluster.signal(0, Signal::SIGHUP).expect("SIGHUP");
    let hup = server
        .wait_for("SIGHUP received: verbose log buffer")
        .expect("the SIGHUP dump");
    assert!(hup.starts_with("<30>"), "{hup}");
    assert!(
        read(&log).is_empty(),
        "the log file got syslog's lines:\n{}",
        read(&log)
    );

    // No logger at the next start: the file takes the log, with one line saying why.
    let out = cluster.stop(0, Duration::from_secs(10)).expect("stop");
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    drop(server);
    start_ready(&mut cluster);
    let text = read(&log);
    let why: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("LOG_USE_SYSLOG=1 but the syslog socket"))
        .collect();
    assert_eq!(why.len(), 1, "one line says why:\n{text}");
    assert!(
        why[0].contains("[ERROR]")
            && why[0].contains(&socket.display().to_string())
            && why[0].contains("logging to the log file"),
        "{}",
        why[0]
    );
    assert!(text.contains("Use Syslog file = 1"), "{text}");
    assert!(text.contains(PERSIST_ERROR), "{text}");
}
