//! Tests of the stats file's record text and of the counting behind it.

use std::time::Duration;

use tokio::sync::mpsc;

use super::*;
use crate::mailbox::Input;

/// Splits a record into its interval and its JSON, checking the prefix on the way.
fn parse(text: &str) -> (u64, serde_json::Value) {
    let rest = text
        .strip_prefix("Performance statistics for last ")
        .expect("NVIDIA's prefix");
    let (seconds, json) = rest
        .split_once(" seconds  : ")
        .expect("two spaces before the colon");
    let value = serde_json::from_str(json).expect("the rest is JSON");
    (seconds.parse().expect("a whole number of seconds"), value)
}

fn sample() -> Record {
    Record {
        seconds: 30,
        processor: QueueStat::new(3, Duration::from_micros(2_700)),
        pending_free: QueueStat::new(0, Duration::ZERO),
        incoming: vec![(
            Kind::UnimportResponse,
            MessageStat::average(
                7,
                Duration::from_micros(70),
                Duration::from_micros(700),
                Duration::from_micros(770),
            ),
        )],
        outgoing: vec![
            (
                Kind::ImportRequest,
                MessageStat::average(
                    2,
                    Duration::ZERO,
                    Duration::from_millis(3),
                    Duration::from_millis(3),
                ),
            ),
            (
                Kind::Heartbeat,
                MessageStat::average(30, Duration::ZERO, Duration::ZERO, Duration::ZERO),
            ),
        ],
    }
}

#[test]
fn record_parses_back_with_nvidia_types() {
    let text = sample().render();
    assert!(text.ends_with("}\n"), "{text}");
    let (seconds, v) = parse(&text);
    assert_eq!(seconds, 30);
    let keys: Vec<&str> = v
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["QueueStats", "IncomingMessages", "OutgoingMessages"]);
    let q = &v["QueueStats"]["ProcessorQueue"];
    assert_eq!(q["queueDepth"], serde_json::json!("3"), "depth is a string");
    assert_eq!(
        q["oldestDurationMillis"],
        serde_json::json!(2),
        "age is a number of ms"
    );
    assert_eq!(v["QueueStats"]["PendingFreeQueue"]["queueDepth"], "0");
    let u = &v["IncomingMessages"]["UnimportResponse"];
    assert_eq!(u["msgCount"], serde_json::json!("7"), "count is a string");
    assert_eq!(u["avgQueueTimeMillis"].as_f64(), Some(0.01));
    assert_eq!(u["avgOperTimeMillis"].as_f64(), Some(0.1));
    assert_eq!(u["avgTotalTimeMillis"].as_f64(), Some(0.11));
    assert!(
        u["avgTotalTimeMillis"].is_f64(),
        "averages are fractional numbers"
    );
    let out = v["OutgoingMessages"].as_object().expect("an object");
    assert_eq!(
        out.keys().map(String::as_str).collect::<Vec<_>>(),
        ["ImportRequest", "Heartbeat"]
    );
    assert_eq!(
        out["ImportRequest"]["avgOperTimeMillis"].as_f64(),
        Some(1.5)
    );
    assert_eq!(out["Heartbeat"]["msgCount"], "30");
}

#[test]
fn record_is_pretty_printed_with_one_space_one_field_per_line() {
    let text = sample().render();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "Performance statistics for last 30 seconds  : {");
    assert_eq!(lines[1], " \"QueueStats\": {");
    assert_eq!(lines[2], "  \"ProcessorQueue\": {");
    assert_eq!(lines[3], "   \"queueDepth\": \"3\",");
    assert_eq!(lines[4], "   \"oldestDurationMillis\": 2");
    assert_eq!(*lines.last().expect("lines"), "}");
    for line in &lines[1..lines.len() - 1] {
        let indent = line.len() - line.trim_start_matches(' ').len();
        assert!((1..=4).contains(&indent), "one space per level: {line:?}");
        assert!(!line.starts_with('\t'), "{line:?}");
        assert!(
            line.matches("\":").count() <= 1,
            "one field per line: {line:?}"
        );
    }
}

#[test]
fn an_idle_interval_has_empty_message_groups() {
    let record = Record {
        seconds: 1,
        processor: QueueStat::new(0, Duration::ZERO),
        pending_free: QueueStat::new(0, Duration::ZERO),
        incoming: Vec::new(),
        outgoing: Vec::new(),
    };
    let (seconds, v) = parse(&record.render());
    assert_eq!(seconds, 1);
    assert_eq!(v["IncomingMessages"], serde_json::json!({}));
    assert_eq!(v["OutgoingMessages"], serde_json::json!({}));
}

#[test]
fn take_averages_the_interval_and_resets_it() {
    let stats = Counts::default();
    stats.add(
        Dir::In,
        Kind::ImportRequest,
        Duration::from_millis(1),
        Duration::from_millis(3),
    );
    stats.add(
        Dir::In,
        Kind::ImportRequest,
        Duration::from_millis(3),
        Duration::from_millis(5),
    );
    stats.add(Dir::Out, Kind::Heartbeat, Duration::ZERO, Duration::ZERO);
    let r = stats.take(30);
    assert_eq!(r.seconds, 30);
    assert_eq!(r.incoming.len(), 1);
    let (kind, s) = r.incoming[0];
    assert_eq!(kind, Kind::ImportRequest);
    assert_eq!(s.count, 2);
    assert_eq!(
        (s.avg_queue_ms, s.avg_oper_ms, s.avg_total_ms),
        (2.0, 4.0, 6.0)
    );
    assert_eq!(r.outgoing[0].0, Kind::Heartbeat);
    let again = stats.take(30);
    assert!(
        again.incoming.is_empty() && again.outgoing.is_empty(),
        "counts reset per record"
    );
}

#[test]
fn queues_report_depth_and_oldest_age() {
    let stats = Counts::default();
    let old = Instant::now() - Duration::from_millis(250);
    stats.unimports.lock().expect("lock").insert(1, old);
    stats
        .unimports
        .lock()
        .expect("lock")
        .insert(2, Instant::now());
    stats.waiting.lock().expect("lock")[Kind::ImportRequest.index()]
        .queue
        .push_back(Noted {
            seq: 1,
            received: old,
        });
    let r = stats.take(1);
    assert_eq!(r.pending_free.depth, 2);
    assert!(r.pending_free.oldest_ms >= 250, "{:?}", r.pending_free);
    assert_eq!(
        r.processor.depth, 1,
        "no mailbox watched: the waiting requests"
    );
    assert!(r.processor.oldest_ms >= 250, "{:?}", r.processor);
}

#[tokio::test]
async fn mailbox_depth_is_read_without_keeping_it_open() {
    let stats = Stats::default();
    let (tx, mut rx) = mpsc::channel::<Input>(8);
    stats.watch_mailbox(crate::mailbox::depth_of(&tx));
    for _ in 0..3 {
        tx.send(Input::ConnClosed { conn: 1 }).await.expect("send");
    }
    assert_eq!(stats.take(1).processor.depth, 3);
    drop(tx);
    assert!(rx.recv().await.is_some());
    assert_eq!(
        stats.take(1).processor.depth,
        0,
        "the weak handle is gone with the mailbox"
    );
}

/// A fresh directory for one test (removed at the end of it).
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("openimex-stats-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn options(path: &std::path::Path, append: bool) -> StatsOptions {
    StatsOptions {
        path: Some(path.to_path_buf()),
        log_path: Some(path.with_file_name("imex.log")),
        append,
        interval_sec: 3600,
    }
}

#[test]
fn the_stop_writes_a_last_record_appended_or_over_the_old_file() {
    let dir = scratch("stop");
    let path = dir.join("imex-stats.log");
    std::fs::write(&path, "old\n").expect("write");
    drop(StatsFile::start(options(&path, true), Stats::default()).expect("a writer"));
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(
        text.starts_with("old\nPerformance statistics for last 0 seconds  : {"),
        "{text}"
    );
    assert_eq!(text.matches("Performance statistics").count(), 1, "{text}");

    drop(StatsFile::start(options(&path, false), Stats::default()).expect("a writer"));
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(
        text.starts_with("Performance statistics for last 0 seconds  : {"),
        "truncated: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn interval_zero_writes_nothing_and_unopenable_is_not_fatal() {
    let dir = scratch("off");
    let path = dir.join("imex-stats.log");
    let off = StatsOptions {
        interval_sec: 0,
        ..options(&path, true)
    };
    assert!(StatsFile::start(off, Stats::default()).is_none());
    assert!(!path.exists(), "no file for interval 0");
    // A directory that does not exist: the records go to stderr instead; the daemon goes on.
    let missing = dir.join("missing").join("imex-stats.log");
    drop(StatsFile::start(options(&missing, true), Stats::default()).expect("a writer on stderr"));
    assert!(!missing.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// What `stats` hold for `kind` now: noted and not taken, taken and not answered.
fn held(stats: &Stats, kind: Kind) -> (usize, usize) {
    let w = lock(&stats.0.waiting);
    (w[kind.index()].queue.len(), w[kind.index()].started.len())
}

#[tokio::test]
async fn a_request_taken_then_answered_leaves_nothing_behind() {
    let stats = Stats::default();
    let kind = Kind::ImportRequest;
    let answer = stats
        .request_arrived(kind)
        .served(async { Body::Refused("no".into()) });
    assert_eq!(held(&stats, kind), (1, 0), "noted on arrival");
    stats.taken(Some(kind));
    assert_eq!(held(&stats, kind), (0, 1), "the engine took it");
    assert!(matches!(answer.await, Body::Refused(_)));
    assert_eq!(held(&stats, kind), (0, 0), "answered: forgotten");
}

#[tokio::test]
async fn a_request_whose_answer_never_comes_leaves_nothing_behind() {
    let stats = Stats::default();
    let kind = Kind::UnimportRequest;
    // Dropped before the engine took it, its answer not yet made.
    drop(stats.request_arrived(kind));
    assert_eq!(held(&stats, kind), (0, 0));
    // Dropped before the engine took it, and before its first poll.
    drop(stats.request_arrived(kind).served(std::future::pending()));
    assert_eq!(held(&stats, kind), (0, 0));
    // Dropped after the engine took it, while its answer was awaited.
    let mut answer = Box::pin(stats.request_arrived(kind).served(std::future::pending()));
    stats.taken(Some(kind));
    assert!(poll_once(answer.as_mut()).await.is_none(), "no answer yet");
    assert_eq!(held(&stats, kind), (0, 1));
    drop(answer);
    assert_eq!(held(&stats, kind), (0, 0), "its session closed: forgotten");
}

/// Polls `f` once: its output if ready.
async fn poll_once<F: Future>(mut f: std::pin::Pin<&mut F>) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match f.as_mut().poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}
