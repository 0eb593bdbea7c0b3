//! [`BenchEntry`]: one figure of `openimex-lab bench all`, next to the baseline it is judged by,
//! and how a list of them is printed (plain table, Markdown table, JSON).

use std::fmt::Write as _;

use serde_json::{Value, json};

/// Unit of a figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Milliseconds.
    Ms,
    /// Microseconds.
    Us,
    /// Gigabytes (10^9 bytes) per second.
    GBps,
    /// Mebibytes (resident memory).
    MiB,
    /// Percent of one CPU.
    Percent,
    /// Open file descriptors.
    Fds,
    /// Heap allocations.
    Allocs,
}

impl Unit {
    /// As printed and in the JSON `unit` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Ms => "ms",
            Unit::Us => "us",
            Unit::GBps => "GB/s",
            Unit::MiB => "MiB",
            Unit::Percent => "%",
            Unit::Fds => "fds",
            Unit::Allocs => "allocs",
        }
    }
}

/// One figure: `value` in `unit`, and `baseline` (same unit, same run) it is compared with.
/// A scenario that failed or timed out is an entry too, with no value and an `error`, so one
/// failure never hides the other figures.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchEntry {
    /// Scenario name, e.g. `formation_18`, `import_p50`.
    pub name: String,
    /// The measurement; `None` when it could not be taken.
    pub value: Option<f64>,
    /// Unit of `value` and `baseline`.
    pub unit: Unit,
    /// The same-run baseline; `None` when none was measured.
    pub baseline: Option<f64>,
    /// What was measured, against what, and anything a reader needs to weigh the figure.
    pub detail: String,
    /// Why there is no value.
    pub error: Option<String>,
}

impl BenchEntry {
    /// A measured figure.
    pub fn measured(
        name: impl Into<String>,
        value: f64,
        unit: Unit,
        baseline: Option<f64>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            value: Some(value),
            unit,
            baseline,
            detail: detail.into(),
            error: None,
        }
    }

    /// A figure that could not be measured, with the reason.
    pub fn failed(name: impl Into<String>, unit: Unit, error: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            value: None,
            unit,
            baseline: None,
            detail: String::new(),
            error: Some(error.into()),
        }
    }

    /// `value / baseline`: how many times the baseline the figure is (lower is better for
    /// times and footprint, higher for GB/s). `None` without both or with a zero baseline: a
    /// ratio to nothing would be a division artefact, not a finding.
    pub fn ratio(&self) -> Option<f64> {
        match (self.value, self.baseline) {
            (Some(v), Some(b)) if b > 0.0 && v.is_finite() && b.is_finite() => Some(v / b),
            _ => None,
        }
    }

    /// The entry as one JSON object: `name`, `value`, `unit`, `baseline`, `ratio`, `detail`,
    /// `error` (the numbers and `error` are `null` when absent).
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "value": self.value.map(round3),
            "unit": self.unit.as_str(),
            "baseline": self.baseline.map(round3),
            "ratio": self.ratio().map(round3),
            "detail": self.detail,
            "error": self.error,
        })
    }
}

/// Rounds to 3 decimals: the figures are noisier than that on a shared machine.
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A number for a table cell: 3 significant-ish digits, `-` for none.
fn cell(x: Option<f64>) -> String {
    match x {
        None => "-".to_owned(),
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.2}"),
    }
}

/// An entry's cells: name, value, unit, baseline, ratio.
fn cells(e: &BenchEntry) -> [String; 5] {
    [
        e.name.clone(),
        cell(e.value),
        e.unit.as_str().to_owned(),
        cell(e.baseline),
        cell(e.ratio()),
    ]
}

/// The entries as an aligned text table, one line each, errors after the numbers.
pub fn render_table(entries: &[BenchEntry]) -> String {
    let width = entries
        .iter()
        .map(|e| e.name.len())
        .max()
        .unwrap_or(0)
        .max(8);
    let line = |[name, value, unit, baseline, ratio]: [String; 5]| {
        format!("{name:<width$}  {value:>10}  {unit:<5}  {baseline:>10}  {ratio:>8}")
    };
    let head = ["scenario", "value", "unit", "baseline", "ratio"].map(str::to_owned);
    let mut out = line(head);
    out.push('\n');
    for e in entries {
        out.push_str(&line(cells(e)));
        if let Some(err) = &e.error {
            let _ = write!(out, "  error: {err}");
        }
        out.push('\n');
    }
    out
}

/// The entries as a Markdown table (docs/performance.md), with each entry's
/// detail or error in the last column.
pub fn render_markdown(entries: &[BenchEntry]) -> String {
    let mut out = String::from(
        "| scenario | value | unit | baseline | ratio | notes |\n|---|---:|---|---:|---:|---|\n",
    );
    for e in entries {
        let [name, value, unit, baseline, ratio] = cells(e);
        let note = e.error.as_deref().unwrap_or(&e.detail).replace('|', "/");
        let _ = writeln!(
            out,
            "| `{name}` | {value} | {unit} | {baseline} | {ratio} | {note} |"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_is_value_over_a_positive_baseline() {
        let e = BenchEntry::measured("x", 300.0, Unit::Ms, Some(100.0), "");
        assert_eq!(e.ratio(), Some(3.0));
        let e = BenchEntry::measured("x", 3.0, Unit::GBps, Some(4.0), "");
        assert_eq!(e.ratio(), Some(0.75));
        assert_eq!(
            BenchEntry::measured("x", 1.0, Unit::Percent, Some(0.0), "").ratio(),
            None
        );
        assert_eq!(
            BenchEntry::measured("x", 1.0, Unit::Ms, None, "").ratio(),
            None
        );
        assert_eq!(BenchEntry::failed("x", Unit::Ms, "no").ratio(), None);
    }

    #[test]
    fn json_has_every_field_null_when_absent() {
        let e = BenchEntry::failed("formation_144", Unit::Ms, "did not reach UP within 120 s");
        let v = e.to_json();
        assert_eq!(v["name"], "formation_144");
        assert!(v["value"].is_null() && v["baseline"].is_null() && v["ratio"].is_null());
        assert_eq!(v["unit"], "ms");
        assert_eq!(v["error"], "did not reach UP within 120 s");

        let v = BenchEntry::measured("import_p50", 123.4567, Unit::Us, Some(61.0), "d").to_json();
        assert_eq!(v["value"], 123.457);
        assert_eq!(v["baseline"], 61.0);
        assert_eq!(v["ratio"], 2.024);
        assert_eq!(v["unit"], "us");
        assert!(v["error"].is_null());
        let keys: Vec<&str> = v
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(
            keys,
            [
                "name", "value", "unit", "baseline", "ratio", "detail", "error"
            ]
        );
    }

    #[test]
    fn tables_show_errors_and_dashes() {
        let entries = [
            BenchEntry::measured("datapath_read", 9.5, Unit::GBps, Some(10.0), "a|b"),
            BenchEntry::failed("recovery_restart", Unit::Ms, "timed out"),
        ];
        let t = render_table(&entries);
        assert!(
            t.lines()
                .nth(1)
                .is_some_and(|l| l.contains("9.50") && l.contains("GB/s") && l.contains("0.95"))
        );
        assert!(
            t.lines()
                .nth(2)
                .is_some_and(|l| l.contains("error: timed out"))
        );
        let m = render_markdown(&entries);
        assert!(m.contains("| `datapath_read` | 9.50 | GB/s | 10.0 | 0.95 | a/b |"));
        assert!(m.contains("| `recovery_restart` | - | ms | - | - | timed out |"));
    }
}
