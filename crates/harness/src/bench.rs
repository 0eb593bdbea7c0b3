//! Benchmarks over real processes. Figures are reported next to a baseline measured in the
//! same run on the same machine (docs/DESIGN.md §6), never as absolute limits; a scenario that
//! fails or runs out of time is a [`BenchEntry`] with an error, never a crash of the run.
//!
//! - [`entry`](BenchEntry): the figure type and its table / Markdown / JSON forms.
//! - `formation`: spawn → domain UP against bare processes opening their ports ([`formation`]).
//! - `recovery`: kill -9 of a node until every peer reports it, and its restart ([`recovery`]).
//! - [`procfs`] and `footprint`: RSS, CPU% and descriptors of daemons against a bare process.
//! - `probe`: helper processes that say `ready` ([`ReadyChild`]).
//! - `window`: a counter read over a window, its readings' own cost taken off ([`CountWindow`]).
//! - `tls`: certificates and config files for probes over mutual TLS ([`ProbeTls`]).
//!
//! Scenarios that need applications (imports, storm, data path) live in the `openimex` binary,
//! which links the client library; they use these pieces.

mod entry;
mod footprint;
mod formation;
mod probe;
pub mod procfs;
mod recovery;
mod tls;
mod window;

use std::time::Duration;

pub use entry::{BenchEntry, Unit, render_markdown, render_table};
pub use footprint::{Footprint, daemon_pids, failed_entries, watch_during, watch_idle};
pub use formation::{
    FormationReport, formation, formation_entry, formation_tls, formation_tls_entry,
    formation_topology,
};
pub use probe::ReadyChild;
pub use recovery::recovery;
pub use tls::ProbeTls;
pub use window::CountWindow;

use crate::HarnessError;
use crate::error::truncate;

/// Median of `samples` (mean of the middle two for an even count; zero for none).
pub fn median(samples: &[Duration]) -> Duration {
    let mut s = samples.to_vec();
    s.sort_unstable();
    match s.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2,
    }
}

/// Median of `values` (the upper middle one for an even count; zero for none).
pub fn median_f64(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// The `p` quantile (0.0 ..= 1.0) of `samples` by nearest rank; zero for none.
pub fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut s = samples.to_vec();
    s.sort_unstable();
    let last = s.len().saturating_sub(1);
    let rank = ((last as f64) * p.clamp(0.0, 1.0)).round() as usize;
    s.get(rank.min(last)).copied().unwrap_or_default()
}

/// Milliseconds as a float, the unit of most entries.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One line for an entry's `error`: a wait that ran out says what it waited for and for how
/// long (the node logs the full error carries would drown the table).
pub fn short_error(e: &HarnessError) -> String {
    match e {
        HarnessError::WaitTimeout {
            what, waited, last, ..
        } => format!(
            "did not reach {what} within {} s (last seen: {})",
            waited.as_secs(),
            summarize_view(last)
        ),
        other => {
            let text = other.to_string();
            truncate(text.lines().next().unwrap_or_default(), 300)
        }
    }
}

/// The last view of a wait in a few words: a `ctl -N -j` document of 144 nodes is over a
/// megabyte, so it becomes its status and how many nodes are READY and links CONNECTED.
/// Anything else is cut short.
fn summarize_view(last: &str) -> String {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(last) else {
        return truncate(last, 200);
    };
    let Some(nodes) = v["nodes"].as_object() else {
        return truncate(last, 200);
    };
    let status = |x: &serde_json::Value| {
        x.get("status")
            .and_then(|s| s.as_str())
            .or(x.as_str())
            .map(str::to_owned)
    };
    let ready = nodes
        .values()
        .filter(|n| status(n).as_deref() == Some("READY"))
        .count();
    let cells: Vec<Option<String>> = nodes
        .values()
        .filter_map(|n| n["connections"].as_object())
        .flat_map(|c| c.values().map(status))
        .collect();
    let connected = cells
        .iter()
        .filter(|c| c.as_deref() == Some("CONNECTED"))
        .count();
    format!(
        "domain {}, {ready} of {} nodes READY, {connected} of {} links CONNECTED",
        status(&v).unwrap_or_else(|| "status unknown".into()),
        nodes.len(),
        cells.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_percentiles() {
        let ms = Duration::from_millis;
        assert_eq!(median(&[]), Duration::ZERO);
        assert_eq!(median(&[ms(5)]), ms(5));
        assert_eq!(median(&[ms(9), ms(1), ms(5)]), ms(5));
        assert_eq!(median(&[ms(4), ms(1), ms(2), ms(100)]), ms(3));
        let hundred: Vec<Duration> = (1..=100).rev().map(ms).collect();
        assert_eq!(percentile(&hundred, 0.5), ms(51));
        assert_eq!(percentile(&hundred, 0.99), ms(99));
        assert_eq!(percentile(&hundred, 1.0), ms(100));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn wait_timeouts_become_one_line() {
        let e = HarnessError::WaitTimeout {
            node: 0,
            what: "domain UP".into(),
            waited: Duration::from_secs(120),
            last: "DEGRADED".into(),
            logs: "a\nlot\nof\nlogs".into(),
        };
        assert_eq!(
            short_error(&e),
            "did not reach domain UP within 120 s (last seen: DEGRADED)"
        );
        let view = r#"{"status":"DEGRADED","nodes":{"0":{"status":"READY","connections":
            {"0":{"status":"CONNECTED"},"1":{"status":"RECOVERING"}}},"1":{"status":
            "WAITING_FOR_PEERS","connections":{"0":"CONNECTED","1":"CONNECTED"}}}}"#;
        assert_eq!(
            summarize_view(view),
            "domain DEGRADED, 1 of 2 nodes READY, 3 of 4 links CONNECTED"
        );
    }
}
