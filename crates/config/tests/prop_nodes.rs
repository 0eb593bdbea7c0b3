//! Property suite of the `nodes_config.cfg` parser (issue 10, item 6): arbitrary text never
//! panics and errors name a line of the input; node IDs are the indices of the entry lines
//! (comments and blank lines skipped); placeholders (`0.0.0.0`, `::`) may repeat, real entries
//! may not, and a duplicate names both lines.
//!
//! Each property runs [`CASES`] cases; `PROPTEST_CASES=N` runs `N` instead.

#[path = "../../core/tests/prop_budget/mod.rs"]
mod prop_budget;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

use openimex_config::{ConfigError, NodeConfig, is_placeholder};
use proptest::prelude::*;

/// Cases per property in CI.
const CASES: u32 = 15_000;

const PATH: &str = "nodes_config.cfg";

fn parse(text: &str) -> Result<NodeConfig, Box<ConfigError>> {
    NodeConfig::parse(text, Path::new(PATH)).map_err(Box::new)
}

/// What makes two entries the same node: the address, or the name in lower case.
fn identity(host: &str) -> String {
    match host.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => host.to_ascii_lowercase(),
    }
}

/// The parser's promises about any input.
fn check_any(text: &str) -> Result<(), TestCaseError> {
    let body = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<&str> = body.lines().collect();
    match parse(text) {
        Ok(nodes) => {
            prop_assert!(!nodes.is_empty());
            // IDs are entry-line indices: the entries are exactly the lines that are not blank
            // or comments, in order.
            let expect: Vec<(usize, String)> = lines
                .iter()
                .enumerate()
                .map(|(i, l)| (i + 1, l.split('#').next().unwrap_or_default().trim()))
                .filter(|(_, h)| !h.is_empty())
                .map(|(i, h)| (i, h.to_owned()))
                .collect();
            let got: Vec<(usize, String)> = nodes
                .entries
                .iter()
                .map(|e| (e.line, e.host.clone()))
                .collect();
            prop_assert_eq!(got, expect);
            // No real node twice.
            let mut seen = HashMap::new();
            for e in nodes.entries.iter().filter(|e| !e.is_placeholder()) {
                let first = seen.insert(identity(&e.host), e.line);
                prop_assert!(first.is_none(), "{} listed twice", e.host);
            }
        }
        Err(e) => {
            let msg = e.to_string();
            let line = match &*e {
                ConfigError::InvalidNode { line, .. }
                | ConfigError::DuplicateNode { line, .. }
                | ConfigError::TooManyNodes { line, .. } => Some(*line),
                ConfigError::NoNodes { .. } => None,
                other => {
                    return Err(TestCaseError::fail(format!("unexpected error {other:?}")));
                }
            };
            match line {
                Some(line) => {
                    prop_assert!((1..=lines.len()).contains(&line), "line {line}: {msg}");
                    prop_assert!(msg.starts_with(&format!("{PATH}:{line}: ")), "{msg}");
                }
                None => prop_assert!(
                    lines
                        .iter()
                        .all(|l| l.split('#').next().unwrap_or_default().trim().is_empty()),
                    "{msg}"
                ),
            }
            if let ConfigError::DuplicateNode {
                first_line,
                line,
                value,
                ..
            } = &*e
            {
                prop_assert!(first_line < line);
                let first = lines[first_line - 1]
                    .split('#')
                    .next()
                    .unwrap_or_default()
                    .trim();
                prop_assert_eq!(identity(first), identity(value));
                prop_assert!(!is_placeholder(value));
            }
            prop_assert!(msg.len() < 2000, "{} bytes", msg.len());
        }
    }
    Ok(())
}

/// Lines of a nodes file: real entries from a small pool (so duplicates happen), placeholders
/// in several spellings, comments, blanks, trailing comments and junk.
fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0u8..12).prop_map(|i| format!("10.0.0.{i}")),
        2 => (0u8..6).prop_map(|i| format!("Node-{i}.example")),
        1 => (0u8..6).prop_map(|i| format!("node-{i}.EXAMPLE.")),
        1 => (0u16..4).prop_map(|i| format!("fd00::{i:x}")),
        1 => (0u16..4).prop_map(|i| format!("fd00:0::{i:x}")),
        2 => proptest::sample::select(&["0.0.0.0", "::", "0:0::0", "::ffff:0.0.0.0"][..])
            .prop_map(str::to_owned),
        2 => "#[^\n]{0,10}",
        1 => "[ \t]{0,3}",
        1 => (0u8..12, "[ -~]{0,8}").prop_map(|(i, c)| format!("10.0.0.{i}  # {c}")),
        1 => "[^\n#]{0,20}",
    ]
}

proptest! {
    #![proptest_config(prop_budget::budget(CASES))]

    /// Arbitrary bytes (read lossily) never panic the parser.
    #[test]
    fn arbitrary_bytes_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        check_any(&String::from_utf8_lossy(&bytes))?;
    }

    /// Files of entries, placeholders, comments and junk: entries numbered by line index,
    /// placeholders repeat freely, a real duplicate is refused naming both lines.
    #[test]
    fn ids_are_entry_line_indices_and_duplicates_follow_the_rules(
        lines in proptest::collection::vec(line(), 0..24),
        crlf in any::<bool>(),
        bom in any::<bool>(),
    ) {
        let text = format!(
            "{}{}",
            if bom { "\u{feff}" } else { "" },
            lines.join(if crlf { "\r\n" } else { "\n" })
        );
        check_any(&text)?;
        // Valid lines only (no junk): refused only for a real duplicate.
        let valid = lines.iter().all(|l| {
            let h = l.split('#').next().unwrap_or_default().trim();
            h.is_empty() || h.parse::<IpAddr>().is_ok() || h.to_ascii_lowercase().contains(".example")
        });
        if valid {
            let mut seen = HashMap::new();
            let dup = lines
                .iter()
                .map(|l| l.split('#').next().unwrap_or_default().trim())
                .filter(|h| !h.is_empty() && !is_placeholder(h))
                .any(|h| seen.insert(identity(h), ()).is_some());
            let any = lines
                .iter()
                .any(|l| !l.split('#').next().unwrap_or_default().trim().is_empty());
            match parse(&text).map_err(|e| *e) {
                Ok(_) => prop_assert!(any && !dup),
                Err(ConfigError::DuplicateNode { .. }) => prop_assert!(dup),
                Err(ConfigError::NoNodes { .. }) => prop_assert!(!any),
                Err(e) => prop_assert!(false, "valid lines refused: {e}"),
            }
        }
    }
}
