//! The one error type of this crate.
//!
//! Every message is written for the person who edits the file: it names the file and the
//! 1-based line, quotes the key and the value as written, and says what is expected or how to
//! fix it. The daemon prints these messages as they are and exits.
//!
//! Values are quoted through [`Quoted`] / [`Clip`]: at most [`ECHO_MAX`] characters of a value
//! are echoed, then `…` and the full length, and control characters are escaped, so a 10 MB
//! line or a stray escape sequence in a file cannot flood or garble the terminal and the log.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The most characters of a value (a line, a key, a node entry, a path) echoed in a message.
pub(crate) const ECHO_MAX: usize = 120;

/// A value from a file, echoed in double quotes: `"value"`, or `"first 120 characters…" (N
/// characters)` when longer than [`ECHO_MAX`]. Control characters are escaped (`\u{1b}`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Quoted<'a>(pub(crate) &'a str);

/// Like [`Quoted`] without the quotes: `value`, or `first 120 characters… (N characters)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clip<'a>(pub(crate) &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        let total = write_clipped(f, self.0)?;
        f.write_str("\"")?;
        match total {
            Some(n) => write!(f, " ({n} characters)"),
            None => Ok(()),
        }
    }
}

impl fmt::Display for Clip<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match write_clipped(f, self.0)? {
            Some(n) => write!(f, " ({n} characters)"),
            None => Ok(()),
        }
    }
}

/// Writes at most [`ECHO_MAX`] characters of `s`, control characters escaped, then `…` if
/// there was more. Returns the full length in characters when `s` was cut.
fn write_clipped(f: &mut fmt::Formatter<'_>, s: &str) -> Result<Option<usize>, fmt::Error> {
    let mut chars = s.chars();
    for c in chars.by_ref().take(ECHO_MAX) {
        if c.is_control() {
            write!(f, "{}", c.escape_default())?;
        } else {
            fmt::Write::write_char(f, c)?;
        }
    }
    let rest = chars.count();
    if rest == 0 {
        return Ok(None);
    }
    f.write_str("…")?;
    Ok(Some(ECHO_MAX + rest))
}

/// `path:line`, or `path` alone for line 0 (the whole file).
fn at(path: &Path, line: usize) -> String {
    match line {
        0 => shown(path),
        n => format!("{}:{n}", shown(path)),
    }
}

/// A path for a message, cut like [`Clip`] (a path can come from a config value).
fn shown(p: &Path) -> String {
    Clip(&p.to_string_lossy()).to_string()
}

/// Everything that can go wrong while reading `config.cfg`, `nodes_config.cfg`, or while
/// picking this node's entry from the nodes file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file could not be read (missing, no permission, not UTF-8).
    #[error("failed to read config file {}: {source}; pass the right file with -c", shown(.path))]
    Io {
        /// The file that could not be read.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },

    /// A config line is neither blank, a `#` comment, nor `KEY=value`.
    #[error(
        "{}:{line}: line {} {problem}: write KEY=value or start the line with # for a comment",
        shown(.path), Quoted(.text)
    )]
    Syntax {
        /// The config file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The line as written (trimmed).
        text: String,
        /// What is wrong with it, e.g. "is not KEY=value".
        problem: &'static str,
    },

    /// A known key has a value it cannot take.
    #[error("{}:{line}: {key}={} is not a valid {what}: {expected}", shown(.path), Quoted(.value))]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// 1-based line number of the key.
        line: usize,
        /// The key as written.
        key: String,
        /// The value as written (trimmed).
        value: String,
        /// What kind of value the key takes, e.g. "port", "boolean", "value".
        what: &'static str,
        /// What is expected instead, starting with "expected ...", or how to fix it.
        expected: String,
    },

    /// A key starting with `OPENIMEX_` that openimex does not know. The prefix is ours, so
    /// this is a typo rather than a key of some other IMEX version.
    #[error(
        "{}:{line}: unknown key {}: keys starting with OPENIMEX_ belong to openimex, so this is \
         probably a typo; known ones are {known}",
        shown(.path), Clip(.key)
    )]
    UnknownOpenimexKey {
        /// The config file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The key as written.
        key: String,
        /// Comma-separated list of the `OPENIMEX_` keys that exist.
        known: String,
    },

    /// A key's value is valid on its own but needs another key that is missing or unusable.
    #[error("{}:{line}: {key}={} {needs}", shown(.path), Clip(.value))]
    Incomplete {
        /// The config file.
        path: PathBuf,
        /// 1-based line number of `key`.
        line: usize,
        /// The key whose value needs more settings.
        key: String,
        /// Its value as written.
        value: String,
        /// What is missing and how to fix it.
        needs: String,
    },

    /// The nodes file could not be read. The message keeps NVIDIA's phrase
    /// "Failed to read node configuration file", which DCGM searches for.
    #[error(
        "{set_at}Failed to read node configuration file {}: {source}; create it with one IP address \
         or DNS name per line, or point IMEX_NODE_CONFIG_FILE in config.cfg at the right file",
        shown(.path)
    )]
    NodesIo {
        /// Where the config names the file (`config.cfg:7: `), or empty when not known.
        set_at: String,
        /// The nodes file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },

    /// A line of the nodes file is neither an IP address nor a valid DNS name.
    #[error(
        "{}:{line}: node {} is not a valid IP address or DNS name: {reason}; write one \
         IPv4 or IPv6 address or DNS name per line",
        shown(.path), Quoted(.value)
    )]
    InvalidNode {
        /// The nodes file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The entry as written (trailing comment removed).
        value: String,
        /// Why it is not valid.
        reason: String,
    },

    /// The same node appears on two lines.
    #[error(
        "{}:{line}: node {} is listed twice (first at line {first_line}): every node must \
         appear once, because its line index is its node ID",
        shown(.path), Quoted(.value)
    )]
    DuplicateNode {
        /// The nodes file.
        path: PathBuf,
        /// 1-based line number of the second occurrence.
        line: usize,
        /// 1-based line number of the first occurrence.
        first_line: usize,
        /// The entry as written on `line`.
        value: String,
    },

    /// The nodes file lists no node at all.
    #[error(
        "{}: no nodes listed: write one IP address or DNS name per line (node 0 is the first \
         non-comment, non-blank line)",
        shown(.path)
    )]
    NoNodes {
        /// The nodes file.
        path: PathBuf,
    },

    /// The nodes file lists more nodes than a 16-bit node ID can number.
    #[error("{}:{line}: too many nodes: at most {max} entries are supported", shown(.path))]
    TooManyNodes {
        /// The nodes file.
        path: PathBuf,
        /// 1-based line number of the first entry over the limit.
        line: usize,
        /// The limit.
        max: usize,
    },

    /// `BIND_INTERFACE_IP` is set but no entry of the nodes file is (or resolves to) it.
    #[error(
        "BIND_INTERFACE_IP={bind} is not in nodes file {} ({count} entries): add this node's \
         address to the nodes file or fix BIND_INTERFACE_IP",
        shown(.path)
    )]
    BindNotInNodes {
        /// The nodes file.
        path: PathBuf,
        /// The configured bind address.
        bind: IpAddr,
        /// How many entries the nodes file has.
        count: usize,
    },

    /// `BIND_INTERFACE_IP` matches more than one entry (e.g. an IP and a name resolving to it).
    #[error(
        "BIND_INTERFACE_IP={bind} matches several entries of nodes file {} ({}): every node must \
         appear once; remove the extra entries",
        shown(.path), .matches.join(", ")
    )]
    BindMatchesSeveral {
        /// The nodes file.
        path: PathBuf,
        /// The configured bind address.
        bind: IpAddr,
        /// The matching entries, e.g. `line 2 node-b (10.0.0.2)`.
        matches: Vec<String>,
    },

    /// `BIND_INTERFACE_IP` is empty and no entry is an address of this host.
    #[error(
        "no entry of nodes file {} is an address of this host (tried {}): set BIND_INTERFACE_IP \
         in config.cfg to this node's address, or add this host's address to the nodes file",
        shown(.path), .tried.join(", ")
    )]
    NoLocalNode {
        /// The nodes file.
        path: PathBuf,
        /// What was tried, e.g. `line 1 10.0.0.1`, `line 2 node-b (does not resolve)`.
        tried: Vec<String>,
    },

    /// The config asks for something this build cannot do, and doing without it would be
    /// unsafe: GSSAPI peer authentication. The daemon refuses to start rather than run in
    /// plaintext.
    #[error(
        "{}:{line}: {key}={value} asks for authenticated, encrypted peer connections ({asked}), \
         but {missing} is not built into openimex yet, so the daemon refuses to start rather \
         than run the IMEX domain unauthenticated and in plaintext: use \
         IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS (mutual TLS; `openimex certs` makes the \
         certificates), or set {key}=0 to run without peer authentication on a network you \
         trust (anyone who can reach SERVER_PORT can then speak for a node)",
        shown(.path)
    )]
    NotBuilt {
        /// The config file.
        path: PathBuf,
        /// 1-based line number of `key`.
        line: usize,
        /// The key that asks for the feature.
        key: String,
        /// Its value.
        value: String,
        /// What the config asks for, e.g. `IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS, IMEX_SERVER_KEY file "/k"`.
        asked: String,
        /// What is not built, e.g. `TLS`.
        missing: &'static str,
    },

    /// A TLS key, certificate or CA named by `IMEX_{SERVER,CLIENT}_{KEY,CERT,CERT_AUTH}` cannot
    /// be used: missing or unreadable file, unset environment variable, not PEM, a key that
    /// does not belong to its certificate.
    #[error("{}:{line}: {key}={}: {problem}; {fix}", shown(.path), Quoted(.value))]
    TlsMaterial {
        /// The config file.
        path: PathBuf,
        /// 1-based line number of `key`.
        line: usize,
        /// The key.
        key: &'static str,
        /// Its value as written (a path or a variable name, never key material).
        value: String,
        /// What is wrong.
        problem: String,
        /// How to fix it.
        fix: String,
    },

    /// `NETWORK_INTERFACE` names no interface of this host, or the interface cannot give the
    /// link-local bind IP its scope; found when the bind address is placed on an interface.
    #[error("{key}: {problem}")]
    Interface {
        /// `config.cfg:12: NETWORK_INTERFACE="eth9"` where the key is set, or
        /// `config.cfg: NETWORK_INTERFACE is not set`.
        key: String,
        /// What is wrong and how to fix it.
        problem: String,
    },

    /// A job file (`OPENIMEX_JOBS_DIR`) is not a job: its name, a line, or what it lacks.
    #[error("{}: {problem}; {fix}", at(.path, *.line))]
    JobFile {
        /// The job file.
        path: PathBuf,
        /// 1-based line number; 0 when the problem is the whole file (its name, a missing key).
        line: usize,
        /// What is wrong, the value quoted.
        problem: String,
        /// How to fix it.
        fix: String,
    },

    /// A job file could not be read (it vanished between the listing and the read: the job
    /// ended; no permission; not UTF-8).
    #[error("cannot read job file {}: {source}", shown(.path))]
    JobFileIo {
        /// The job file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },

    /// `BIND_INTERFACE_IP` is empty and several entries are addresses of this host.
    #[error(
        "several entries of nodes file {} are addresses of this host ({}): set BIND_INTERFACE_IP \
         in config.cfg to the one this daemon should use (on one machine every 127.x address is \
         local)",
        shown(.path), .matches.join(", ")
    )]
    SeveralLocalNodes {
        /// The nodes file.
        path: PathBuf,
        /// The matching entries, e.g. `line 1 127.0.0.1`.
        matches: Vec<String>,
    },
}
