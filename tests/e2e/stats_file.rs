//! The performance statistics file (issue 9 item 1, docs/reference/imex-guide.md §6): real daemons with
//! simulated GPUs write NVIDIA's record format every `OPENIMEX_STATS_INTERVAL_SEC`, their
//! message counts cover the imports and unimports done, a last record is written at a clean
//! stop, `STATS_FILE_NAME` equal to `LOG_FILE_NAME` puts the records into the main log (both
//! empty: on stderr, between the log's lines), and an interval of 0 writes no stats file.

use std::path::Path;

use openimex_harness::{Cluster, ClusterSpec, GpuSpec};
use serde_json::Value;

use crate::apps::*;
use crate::common::{FORM, NOTICE, spec, wait_for};

const PREFIX: &str = "Performance statistics for last ";

/// One record found in a file: its interval, its JSON and the raw text of its JSON.
struct Found {
    seconds: u64,
    json: Value,
    raw: String,
}

/// Every record in `text` (a stats file, or a log with records among its lines), checked for
/// NVIDIA's separator: the interval, then two spaces before the colon.
#[track_caller]
fn records(text: &str, what: &str) -> Vec<Found> {
    text.match_indices(PREFIX)
        .map(|(at, _)| {
            let rest = &text[at + PREFIX.len()..];
            let (seconds, json) = rest
                .split_once(" seconds  : ")
                .unwrap_or_else(|| panic!("{what}: no \" seconds  : \" after the prefix:\n{rest}"));
            let mut values = serde_json::Deserializer::from_str(json).into_iter::<Value>();
            let value = values
                .next()
                .and_then(Result::ok)
                .unwrap_or_else(|| panic!("{what}: the record is not JSON:\n{json}"));
            Found {
                seconds: seconds
                    .parse()
                    .unwrap_or_else(|_| panic!("{what}: interval {seconds:?}")),
                raw: json[..values.byte_offset()].to_string(),
                json: value,
            }
        })
        .collect()
}

/// Checks NVIDIA's layout and types: one-space indent, one field per line, counts and depths
/// as strings, milliseconds as numbers.
#[track_caller]
fn check_format(r: &Found, what: &str) {
    let lines: Vec<&str> = r.raw.lines().collect();
    assert_eq!(lines.first(), Some(&"{"), "{what}:\n{}", r.raw);
    assert_eq!(
        lines.get(1),
        Some(&" \"QueueStats\": {"),
        "{what}:\n{}",
        r.raw
    );
    assert!(
        lines.iter().all(|l| l.matches("\":").count() <= 1),
        "{what}: one field per line:\n{}",
        r.raw
    );
    for q in ["ProcessorQueue", "PendingFreeQueue"] {
        let q = &r.json["QueueStats"][q];
        let depth = q["queueDepth"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: {q}"));
        assert!(depth.parse::<u64>().is_ok(), "{what}: {q}");
        assert!(q["oldestDurationMillis"].is_u64(), "{what}: {q}");
    }
    for group in ["IncomingMessages", "OutgoingMessages"] {
        let g = r.json[group]
            .as_object()
            .unwrap_or_else(|| panic!("{what}: no {group}:\n{}", r.raw));
        for (kind, m) in g {
            let count = m["msgCount"]
                .as_str()
                .unwrap_or_else(|| panic!("{what}: {kind} {m}"));
            assert!(
                count.parse::<u64>().is_ok_and(|n| n > 0),
                "{what}: {kind} {m}"
            );
            for field in [
                "avgQueueTimeMillis",
                "avgOperTimeMillis",
                "avgTotalTimeMillis",
            ] {
                assert!(m[field].is_number(), "{what}: {kind}.{field} {m}");
            }
        }
    }
}

/// The sum over `records` of `group.kind.msgCount`.
fn total(records: &[Found], group: &str, kind: &str) -> u64 {
    records
        .iter()
        .filter_map(|r| r.json[group][kind]["msgCount"].as_str())
        .map(|c| c.parse::<u64>().unwrap_or(0))
        .sum()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn records_every_second_count_the_imports_and_unimports_done() {
    const ROUNDS: u64 = 3;
    let spec = spec(3)
        .with_gpus(GpuSpec::default())
        .config("OPENIMEX_STATS_INTERVAL_SEC", "1");
    let mut cluster = gpu_cluster_from(spec);
    let dirs: Vec<_> = (0..3)
        .map(|i| cluster.node(i).dir().to_path_buf())
        .collect();
    for (i, d) in dirs.iter().enumerate() {
        assert_eq!(
            cluster.node(i).stats_path(),
            d.join("imex-stats.log"),
            "the harness keeps stats files in the node's directory"
        );
    }
    // Node 0 exports; nodes 1 and 2 import it and release it, ROUNDS times each.
    let (exp, handle) = exporter(&dirs[0], &channel(&cluster, 0, 0), 17, "exporter on node 0");
    for round in 0..ROUNDS {
        for i in [1, 2] {
            let what = format!("importer on node {i}, round {round}");
            held_importer(&dirs[i], &channel(&cluster, i, 0), &handle, 17, &what).exit();
        }
    }
    wait_stats(&dirs[0], NOTICE, "node 0 holds no reference", |s| {
        num(s, "daemon_export_refs") == 0
    });
    // Records of at least two whole intervals are written while the daemons run.
    let stats0 = cluster.node(0).stats_path();
    let mut periodic = Vec::new();
    assert!(
        wait_for(NOTICE, || {
            periodic = std::fs::read_to_string(&stats0)
                .map(|t| records(&t, "node 0"))
                .unwrap_or_default();
            periodic.len() >= 2
        }),
        "node 0: {} records in {}",
        periodic.len(),
        stats0.display()
    );
    assert!(
        periodic.iter().all(|r| r.seconds == 1),
        "every record covers 1 s"
    );
    cluster.shutdown().expect("clean stop");
    drop(exp);

    let done = 2 * ROUNDS;
    let all: Vec<Vec<Found>> = (0..3)
        .map(|i| {
            let what = format!("node {i}");
            let found = records(&read(&cluster.node(i).stats_path()), &what);
            found.iter().for_each(|r| check_format(r, &what));
            found
        })
        .collect();
    assert!(all[0].len() > periodic.len(), "a last record at the stop");
    // The exporter received every import and unimport and answered each.
    let exporter_counts = [
        ("IncomingMessages", "ImportRequest"),
        ("IncomingMessages", "UnimportRequest"),
        ("OutgoingMessages", "ImportResponse"),
        ("OutgoingMessages", "UnimportResponse"),
    ];
    for (group, kind) in exporter_counts {
        let n = total(&all[0], group, kind);
        assert!(n >= done, "node 0: {group}.{kind} = {n}, {done} done");
    }
    // Each importer sent its own and heard the answers.
    for i in [1, 2] {
        for (group, kind) in [
            ("OutgoingMessages", "ImportRequest"),
            ("OutgoingMessages", "UnimportRequest"),
            ("IncomingMessages", "ImportResponse"),
            ("IncomingMessages", "UnimportResponse"),
        ] {
            let n = total(&all[i], group, kind);
            assert!(n >= ROUNDS, "node {i}: {group}.{kind} = {n}, {ROUNDS} done");
        }
    }
    // The pair's lower node sends the heartbeats; the higher one answers them.
    assert!(total(&all[0], "OutgoingMessages", "Heartbeat") > 0);
    assert!(total(&all[2], "IncomingMessages", "Heartbeat") > 0);
    assert!(total(&all[2], "OutgoingMessages", "HeartbeatAck") > 0);
    // Clean stops say goodbye (whoever stops last has nobody left to tell): in the last records.
    let goodbyes: u64 = (all.iter())
        .map(|r| total(r, "OutgoingMessages", "Goodbye") + total(r, "IncomingMessages", "Goodbye"))
        .sum();
    assert!(goodbyes > 0, "no goodbye counted");
    // Nothing queued or owed once every import was released.
    let last = &all[0].last().expect("records").json["QueueStats"];
    assert_eq!(last["PendingFreeQueue"]["queueDepth"], "0", "{last}");
}

/// The one record in `log` (a log with its records among its lines), written at the stop,
/// standing between whole log lines.
#[track_caller]
fn lone_record(log: &str, what: &str) -> Found {
    let mut found = records(log, what);
    // The interval is an hour: the only record is the last one, written at the stop.
    assert_eq!(found.len(), 1, "{what}:\n{log}");
    let record = found.remove(0);
    check_format(&record, what);
    assert!(record.seconds < 3600, "{what}: the stop's partial interval");
    let at = log.find(PREFIX).expect("a record");
    assert!(at == 0 || log[..at].ends_with('\n'), "{what}:\n{log}");
    let after = &log[at..];
    let end = after.find("\n}\n").expect("the record's last line") + 3;
    assert!(
        after[end..].is_empty() || after[end..].starts_with('['),
        "{what}: a log line follows the record:\n{log}"
    );
    record
}

#[test]
fn same_name_as_the_log_puts_records_in_the_log_and_zero_writes_none() {
    let spec: ClusterSpec = spec(3).config("OPENIMEX_STATS_INTERVAL_SEC", "3600");
    let mut cluster = Cluster::prepare(spec).expect("prepare 3 nodes");
    let log0 = cluster.node(0).log_path().display().to_string();
    cluster
        .set_node_config(0, "STATS_FILE_NAME", &log0)
        .expect("stats into the log");
    cluster
        .set_node_config(1, "OPENIMEX_STATS_INTERVAL_SEC", "0")
        .expect("no stats file");
    // Both empty, as the Kubernetes DRA driver sets them: log and records on stderr.
    for key in ["LOG_FILE_NAME", "STATS_FILE_NAME"] {
        cluster.set_node_config(2, key, "").expect("empty name");
    }
    for i in 0..3 {
        cluster.start_node(i).expect("start a node");
    }
    cluster.wait_up(0, FORM).expect("domain UP");
    cluster.shutdown().expect("clean stop");

    for i in 0..3 {
        let stats = cluster.node(i).stats_path();
        assert!(!stats.exists(), "node {i} wrote {}", stats.display());
    }
    let log = read(&cluster.node(0).log_path());
    let found = [lone_record(&log, "node 0's log")];
    assert!(
        total(&found, "OutgoingMessages", "StatusRequest") > 0,
        "node 0 asked the other rows for ctl -N:\n{log}"
    );
    let stderr = read(&cluster.node(2).stderr_path());
    lone_record(&stderr, "node 2's stderr");
    let node1 = read(&cluster.node(1).log_path());
    assert!(
        !node1.contains(PREFIX),
        "interval 0 writes no record:\n{node1}"
    );
}
