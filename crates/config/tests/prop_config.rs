//! Property suite of the `config.cfg` parser (issue 10, item 6): arbitrary bytes and mutated
//! valid files never panic, every error names `file:line` of a line the input has, and a parsed
//! config printed back as `KEY=value` lines parses to the same values.
//!
//! Each property runs [`CASES`] cases; `PROPTEST_CASES=N` runs `N` instead (the longer run the
//! testing guide describes, docs/testing.md).

#[path = "../../core/tests/prop_budget/mod.rs"]
mod prop_budget;

use std::path::Path;

use openimex_config::{Config, ConfigError, dump};
use proptest::prelude::*;

/// Cases per property in CI.
const CASES: u32 = 12_000;

const PATH: &str = "/etc/nvidia-imex/config.cfg";

/// A valid file in the shape NVIDIA ships, with some of openimex's keys.
const BASE: &str = "\
# IMEX daemon configuration
LOG_LEVEL=4
LOG_FILE_NAME=/var/log/nvidia-imex.log
LOG_APPEND_TO_LOG=1
LOG_FILE_MAX_SIZE=1024
LOG_USE_SYSLOG=0
DAEMONIZE=1
BIND_INTERFACE_IP=
SERVER_PORT=50000
IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg
IMEX_WAIT_FOR_QUORUM=RECOVERY
IMEX_ENABLE_AUTH_ENCRYPTION=0
IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS
IMEX_CMD_ENABLED=1
IMEX_CMD_PORT=50005
IMEX_CMD_UNIX_DOMAIN_PATH=
IMEX_NODE_DISCONNECTED_GRACE_TIME=-1

OPENIMEX_HEARTBEAT_INTERVAL_MS=1000
OPENIMEX_PEER_TIMEOUT_MS=5000
";

/// Values that are valid for some keys and not for others, and hostile ones.
const TOKENS: &[&str] = &[
    "",
    "0",
    "1",
    "-1",
    "-2",
    "65535",
    "65536",
    "4294967296",
    "18446744073709551616",
    "NONE",
    "FULL",
    "recovery",
    "SSL_TLS",
    "FILE",
    "ENV_VAL",
    "10.0.0.1",
    "::1",
    "[::1]:9",
    "1.2.3.4:80",
    "/tmp/x",
    "relative/path",
    "sim",
    "nogpu",
    "=",
    "#",
    " = ",
    "\u{feff}",
    "\u{1b}[2J",
    "\0",
    "\r",
    "é",
    "OPENIMEX_X=1",
    "LOG_LEVEL",
    "log_level=1",
];

/// The line number a config error names, for the errors that name one.
fn line_of(e: &ConfigError) -> Option<usize> {
    match e {
        ConfigError::Syntax { line, .. }
        | ConfigError::Invalid { line, .. }
        | ConfigError::UnknownOpenimexKey { line, .. }
        | ConfigError::Incomplete { line, .. }
        | ConfigError::NotBuilt { line, .. } => Some(*line),
        _ => None,
    }
}

/// What `Config::parse` promises about any input: no panic; an error names a line the input has
/// and starts with `file:line: `; every notice names such a line too.
fn check_any(text: &str) -> Result<(), TestCaseError> {
    let lines = text
        .strip_prefix('\u{feff}')
        .unwrap_or(text)
        .lines()
        .count();
    match Config::parse(text, Path::new(PATH)) {
        Ok(cfg) => {
            for n in cfg.notices() {
                prop_assert!(
                    (1..=lines).contains(&n.line),
                    "notice at line {} of {lines}: {n}",
                    n.line
                );
            }
        }
        Err(e) => {
            let line = line_of(&e);
            prop_assert!(line.is_some(), "parse error without a line: {e}");
            let line = line.unwrap_or_default();
            prop_assert!(
                (1..=lines).contains(&line),
                "error at line {line} of {lines}: {e}"
            );
            let msg = e.to_string();
            let head = format!("{PATH}:{line}: ");
            prop_assert!(msg.starts_with(&head), "{msg}");
            // Echoes are bounded: a 100 KB line does not come back whole.
            prop_assert!(msg.len() < 2000, "{} bytes: {msg:.300}", msg.len());
        }
    }
    Ok(())
}

/// One edit of a valid file.
#[derive(Debug, Clone)]
enum Edit {
    Delete(usize),
    Duplicate(usize),
    /// Replace the value of line `.0` with a token.
    Value(usize, usize),
    /// Replace line `.0` with arbitrary text.
    Replace(usize, String),
    Insert(usize, String),
    /// Lower-case line `.0`'s key.
    LowerKey(usize),
    /// Repeat line `.0` until it is this long (huge values).
    Grow(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let at = 0usize..40;
    prop_oneof![
        at.clone().prop_map(Edit::Delete),
        at.clone().prop_map(Edit::Duplicate),
        (at.clone(), 0..TOKENS.len()).prop_map(|(a, t)| Edit::Value(a, t)),
        (at.clone(), ".{0,40}").prop_map(|(a, s)| Edit::Replace(a, s)),
        (at.clone(), "[A-Z_]{1,12}=[ -~]{0,12}").prop_map(|(a, s)| Edit::Insert(a, s)),
        at.clone().prop_map(Edit::LowerKey),
        (at, 1usize..20_000).prop_map(|(a, n)| Edit::Grow(a, n)),
    ]
}

fn apply(lines: &mut Vec<String>, e: &Edit) {
    let len = lines.len().max(1);
    match e {
        Edit::Delete(at) if !lines.is_empty() => {
            lines.remove(at % len);
        }
        Edit::Duplicate(at) if !lines.is_empty() => {
            let l = lines[at % len].clone();
            lines.insert(at % len, l);
        }
        Edit::Value(at, t) if !lines.is_empty() => {
            let l = &mut lines[at % len];
            let key = l.split_once('=').map_or(l.as_str(), |(k, _)| k).to_owned();
            *l = format!("{key}={}", TOKENS[*t]);
        }
        Edit::Replace(at, s) if !lines.is_empty() => lines[at % len] = s.clone(),
        Edit::Insert(at, s) => lines.insert(at % (lines.len() + 1), s.clone()),
        Edit::LowerKey(at) if !lines.is_empty() => {
            let l = &mut lines[at % len];
            if let Some((k, v)) = l.split_once('=') {
                *l = format!("{}={v}", k.to_ascii_lowercase());
            }
        }
        Edit::Grow(at, n) if !lines.is_empty() => {
            let l = &mut lines[at % len];
            let mut grown = l.clone();
            while grown.len() < *n {
                grown.push_str(&l.replace('=', ""));
                grown.push('x');
            }
            *l = grown;
        }
        _ => {}
    }
}

/// The label `dump` shows for each key whose dump label is not the key itself.
const LABELS: &[(&str, &str)] = &[
    ("Logging level", "LOG_LEVEL"),
    ("Logging file name/path", "LOG_FILE_NAME"),
    ("Append to log file", "LOG_APPEND_TO_LOG"),
    ("Max Log file size", "LOG_FILE_MAX_SIZE"),
    ("Use Syslog file", "LOG_USE_SYSLOG"),
    (
        "IMEX Library communication bind interface",
        "BIND_INTERFACE_IP",
    ),
    ("IMEX library communication bind port", "SERVER_PORT"),
];

/// `cfg` printed back as a config file, from its dump.
fn print(cfg: &Config) -> String {
    dump(cfg)
        .into_iter()
        .map(|(label, value)| {
            let key = LABELS
                .iter()
                .find(|(l, _)| *l == label)
                .map_or(label.as_str(), |(_, k)| k);
            let value = value.strip_suffix(" (MBs)").unwrap_or(&value);
            format!("{key}={value}\n")
        })
        .collect()
}

/// A set of valid `KEY=value` lines (no combination the parser refuses).
fn valid_set() -> impl Strategy<Value = Vec<String>> {
    let path = "/[a-z0-9_.-]{1,12}(/[a-z0-9_.-]{1,12}){0,2}";
    let ip = prop_oneof![
        any::<u32>().prop_map(|i| std::net::Ipv4Addr::from(i).to_string()),
        any::<u128>().prop_map(|i| std::net::Ipv6Addr::from(i).to_string()),
    ];
    let kv = |k: &'static str, v: BoxedStrategy<String>| v.prop_map(move |v| format!("{k}={v}"));
    let num = |lo: u64, hi: u64| (lo..=hi).prop_map(|n| n.to_string()).boxed();
    let bit = || num(0, 1);
    let pick =
        |vs: &'static [&'static str]| proptest::sample::select(vs).prop_map(str::to_owned).boxed();
    let fields = vec![
        kv("LOG_LEVEL", num(0, 4)),
        kv("LOG_FILE_NAME", path.boxed()),
        kv("STATS_FILE_NAME", path.boxed()),
        kv("LOG_APPEND_TO_LOG", bit()),
        kv("LOG_FILE_MAX_SIZE", num(0, u64::MAX)),
        kv("LOG_MAX_ROTATE_COUNT", num(0, u64::from(u32::MAX))),
        kv("LOG_USE_SYSLOG", bit()),
        kv("DAEMONIZE", bit()),
        kv("BIND_INTERFACE_IP", ip.clone().boxed()),
        kv("SERVER_PORT", num(1, 65535)),
        kv("IMEX_NODE_CONFIG_FILE", path.boxed()),
        kv("NETWORK_INTERFACE", "[a-z][a-z0-9]{0,14}".boxed()),
        kv("IMEX_WAIT_FOR_QUORUM", pick(&["NONE", "RECOVERY", "FULL"])),
        kv("IMEX_CMD_BIND_INTERFACE_IP", ip.boxed()),
        kv("IMEX_CMD_PORT", num(0, 65535)),
        kv("IMEX_CMD_UNIX_DOMAIN_PATH", path.boxed()),
        kv("IMEX_NODE_DISCONNECTED_GRACE_TIME", num(0, 1 << 40)),
        kv("OPENIMEX_DRIVER", pick(&["auto", "nogpu", "nvidia"])),
        kv("OPENIMEX_DOMAIN_ID", "[a-zA-Z0-9-]{1,20}".boxed()),
        kv("OPENIMEX_PEER_ANY_SOURCE", bit()),
        kv("OPENIMEX_PERSIST_FILE", path.boxed()),
        kv("OPENIMEX_VERBOSE_LOG_BUFFER_KB", num(0, 65536)),
    ];
    // Each key in or out, in a shuffled order.
    let chosen: Vec<_> = fields.into_iter().map(proptest::option::of).collect();
    chosen
        .prop_map(|v| v.into_iter().flatten().collect::<Vec<_>>())
        .prop_shuffle()
}

proptest! {
    #![proptest_config(prop_budget::budget(CASES))]

    /// Arbitrary bytes (as the daemon would read them, lossily) never panic the parser.
    #[test]
    fn arbitrary_bytes_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_any(&String::from_utf8_lossy(&bytes))?;
    }

    /// Arbitrary lines made of config-ish pieces never panic; errors name a line of the input.
    #[test]
    fn configish_text_fails_cleanly(
        lines in proptest::collection::vec(
            prop_oneof![
                "[A-Z_]{0,30}=[^\n]{0,20}",
                "(OPENIMEX|IMEX|LOG)_[A-Z_]{0,20}=[0-9a-z:./-]{0,10}",
                (0..TOKENS.len(), "[A-Z_]{1,10}").prop_map(|(t, k)| format!("{k}={}", TOKENS[t])),
                "[^\n]{0,30}",
            ],
            0..20,
        ),
        ending in prop_oneof![Just("\n"), Just("\r\n"), Just("")],
    ) {
        check_any(&lines.join(ending))?;
    }

    /// A valid file with random edits: parsed or refused cleanly, never a panic, and a file
    /// the edits left untouched parses to the base.
    #[test]
    fn mutated_valid_files_fail_cleanly(edits in proptest::collection::vec(edit(), 0..6)) {
        let mut lines: Vec<String> = BASE.lines().map(str::to_owned).collect();
        for e in &edits {
            apply(&mut lines, e);
        }
        let text = lines.join("\n");
        check_any(&text)?;
        if text == BASE.trim_end() {
            prop_assert!(Config::parse(&text, Path::new(PATH)).is_ok());
        }
    }

    /// Generated valid `KEY=value` sets parse; printed back from the dump, they parse to the
    /// same config, and the value of each key as given is the one in effect.
    #[test]
    fn valid_sets_round_trip(set in valid_set()) {
        let text: String = set.iter().map(|l| format!("{l}\n")).collect();
        let cfg = Config::parse(&text, Path::new(PATH));
        prop_assert!(cfg.is_ok(), "{text}\n{}", cfg.unwrap_err());
        let cfg = cfg.unwrap_or_default();
        let printed = print(&cfg);
        let again = Config::parse(&printed, Path::new(PATH));
        prop_assert!(again.is_ok(), "{printed}\n{}", again.unwrap_err());
        let again = again.unwrap_or_default();
        prop_assert_eq!(dump(&cfg), dump(&again), "{}", printed);
        // Each value given is shown in the dump as given (numbers and paths verbatim).
        let shown: std::collections::HashMap<String, String> = printed
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        for line in &set {
            let (k, v) = line.split_once('=').unwrap_or_default();
            let Some(got) = shown.get(k) else { continue };
            let expect = match k {
                "OPENIMEX_DRIVER" | "BIND_INTERFACE_IP" | "IMEX_CMD_BIND_INTERFACE_IP" => continue,
                _ => v,
            };
            prop_assert_eq!(got.as_str(), expect, "{}", k);
        }
    }
}
