//! One record of the stats file, and its text exactly as NVIDIA's (docs/reference/imex-guide.md §6): the prefix
//! `Performance statistics for last N seconds  : ` (two spaces before the colon), then the
//! figures as JSON pretty-printed with a one-space indent, one field per line. Counts and
//! depths are JSON strings, durations in milliseconds are numbers (averages fractional).

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::Kind;

/// One queue's figures at the moment of the record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueStat {
    /// Elements queued.
    pub depth: usize,
    /// Age of the oldest, in whole milliseconds.
    pub oldest_ms: u64,
}

impl QueueStat {
    /// `depth` elements, the oldest `oldest` old.
    pub fn new(depth: usize, oldest: Duration) -> QueueStat {
        QueueStat {
            depth,
            oldest_ms: u64::try_from(oldest.as_millis()).unwrap_or(u64::MAX),
        }
    }

    fn json(&self) -> Value {
        json!({
            "queueDepth": self.depth.to_string(),
            "oldestDurationMillis": self.oldest_ms,
        })
    }
}

/// One message type's figures over the interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MessageStat {
    /// Messages of the type in the interval.
    pub count: u64,
    /// Average time queued before processing, ms.
    pub avg_queue_ms: f64,
    /// Average processing time, ms.
    pub avg_oper_ms: f64,
    /// Average time from arrival (or creation) to completion, ms.
    pub avg_total_ms: f64,
}

impl MessageStat {
    /// The averages of `count` messages whose times add up to the sums given.
    pub fn average(count: u64, queue: Duration, oper: Duration, total: Duration) -> MessageStat {
        let avg = |sum: Duration| match count {
            0 => 0.0,
            // Microsecond precision: the clock's finer digits are noise in a 30 s summary.
            n => (sum.as_secs_f64() * 1e6 / n as f64).round() / 1e3,
        };
        MessageStat {
            count,
            avg_queue_ms: avg(queue),
            avg_oper_ms: avg(oper),
            avg_total_ms: avg(total),
        }
    }

    fn json(&self) -> Value {
        json!({
            "msgCount": self.count.to_string(),
            "avgQueueTimeMillis": self.avg_queue_ms,
            "avgOperTimeMillis": self.avg_oper_ms,
            "avgTotalTimeMillis": self.avg_total_ms,
        })
    }
}

/// The message types seen in one direction, in [`super::KINDS`] order.
pub type Group = Vec<(Kind, MessageStat)>;

/// The figures of one interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The interval's length in seconds.
    pub seconds: u64,
    /// `QueueStats.ProcessorQueue`.
    pub processor: QueueStat,
    /// `QueueStats.PendingFreeQueue`.
    pub pending_free: QueueStat,
    /// `IncomingMessages`.
    pub incoming: Group,
    /// `OutgoingMessages`.
    pub outgoing: Group,
}

/// The text before the JSON of a record over `seconds` seconds.
pub fn prefix(seconds: u64) -> String {
    format!("Performance statistics for last {seconds} seconds  : ")
}

impl Record {
    /// The record's text, ending with a newline.
    pub fn render(&self) -> String {
        let group = |g: &Group| -> Value {
            Value::Object(
                g.iter()
                    .map(|(kind, stat)| (kind.name().to_owned(), stat.json()))
                    .collect::<Map<_, _>>(),
            )
        };
        // serde_json keeps insertion order here (its `preserve_order` feature): the groups
        // come in NVIDIA's order, not sorted.
        let value = json!({
            "QueueStats": {
                "ProcessorQueue": self.processor.json(),
                "PendingFreeQueue": self.pending_free.json(),
            },
            "IncomingMessages": group(&self.incoming),
            "OutgoingMessages": group(&self.outgoing),
        });
        let mut text = prefix(self.seconds).into_bytes();
        let mut ser = serde_json::Serializer::with_formatter(
            &mut text,
            serde_json::ser::PrettyFormatter::with_indent(b" "),
        );
        // Writing a `Value` into a Vec cannot fail: no I/O, and every key is a string.
        let _ = serde::Serialize::serialize(&value, &mut ser);
        text.push(b'\n');
        String::from_utf8_lossy(&text).into_owned()
    }
}
