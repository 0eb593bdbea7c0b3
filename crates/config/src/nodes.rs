//! `nodes_config.cfg`: the list of IMEX nodes, one per line.
//!
//! # Format
//!
//! Each entry line holds one IPv4 address, IPv6 address or DNS name (RFC 1123). The node ID of
//! an entry is its 0-based index **among entry lines**: blank lines and `#` comment lines are
//! tolerated and do not count, so node 0 is the first non-comment, non-blank line. A trailing
//! comment after an entry (`10.0.0.1   # rack 3`) is stripped.
//!
//! NVIDIA documents only "one address per line, the line index is the node ID"; skipping
//! comments and blank lines is our decision, so that an annotated file still numbers its nodes
//! the way a reader counts them. Every daemon of a domain must read the same list.
//!
//! Each entry is validated (an address that parses, or a well-formed DNS name), and a node may
//! appear only once (names compare case-insensitively, addresses by value), because a
//! duplicate would give one node two IDs. Names are not resolved here; see
//! [`crate::identify_local`].
//!
//! # Placeholders
//!
//! The one exception to "once" is the *placeholder*: the unspecified address `0.0.0.0` (or
//! `::`, in any spelling). It names no node, so it may repeat, on any number of lines, mixed
//! with real entries. AWS ParallelCluster seeds the file with a `##` comment and nine `0.0.0.0`
//! lines so that the service starts before a job writes the real list; NVIDIA's daemon starts
//! on that file and reports itself UNAVAILABLE, its link INVALID, the domain DOWN.
//!
//! A placeholder line still takes its node ID (IDs stay line indices, as NVIDIA's), so filling
//! it in later renumbers nobody. The daemon never dials a placeholder and never takes one as
//! itself ([`crate::identify_local`] skips them); `ctl -N` shows it UNAVAILABLE with INVALID
//! links. Every other duplicate (a real address or name listed twice, placeholders around it
//! or not) is refused, naming both lines.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::ConfigError;

/// The most entries a nodes file may have: node IDs are 16-bit.
const MAX_NODES: usize = u16::MAX as usize;

/// One entry of the nodes file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    /// 1-based line number in the file, for messages.
    pub line: usize,
    /// The IP address or DNS name as written (trailing comment and whitespace removed).
    pub host: String,
}

impl NodeEntry {
    /// The entry's address if it is an IP address; `None` for a DNS name.
    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }

    /// Whether the entry is a placeholder (`0.0.0.0` or `::`): a line that holds a node ID for
    /// a node not known yet (see the module docs).
    pub fn is_placeholder(&self) -> bool {
        is_placeholder(&self.host)
    }
}

/// Whether a nodes-file entry is a placeholder: the unspecified address `0.0.0.0` or `::` (any
/// spelling), which names no node. See the module docs.
pub fn is_placeholder(host: &str) -> bool {
    host.trim()
        .parse::<IpAddr>()
        .is_ok_and(|ip| ip.to_canonical().is_unspecified())
}

/// The parsed nodes file. The node ID of `entries[i]` is `i`: node 0 is the first
/// non-comment, non-blank line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// The file the list was read from, for messages.
    pub path: PathBuf,
    /// The entries in file order; the index is the node ID. Never empty after
    /// [`NodeConfig::parse`].
    pub entries: Vec<NodeEntry>,
}

/// What makes two entries the same node.
#[derive(Debug, PartialEq, Eq, Hash)]
enum Identity {
    Ip(IpAddr),
    /// Lower-cased name.
    Name(String),
}

impl NodeConfig {
    /// Parse the text of a nodes file. `path` is only used in error messages. Fails on an
    /// invalid entry, a duplicate, more than 65535 entries, or no entries at all.
    pub fn parse(text: &str, path: &Path) -> Result<NodeConfig, ConfigError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut entries = Vec::new();
        let mut first_seen: HashMap<Identity, usize> = HashMap::new();

        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let host = raw
                .split_once('#')
                .map_or(raw, |(entry, _comment)| entry)
                .trim();
            if host.is_empty() {
                continue;
            }
            let identity = check_host(host).map_err(|reason| ConfigError::InvalidNode {
                path: path.to_path_buf(),
                line,
                value: host.to_owned(),
                reason,
            })?;
            let placeholder = is_placeholder(host);
            if !placeholder && let Some(&first_line) = first_seen.get(&identity) {
                return Err(ConfigError::DuplicateNode {
                    path: path.to_path_buf(),
                    line,
                    first_line,
                    value: host.to_owned(),
                });
            }
            if entries.len() == MAX_NODES {
                return Err(ConfigError::TooManyNodes {
                    path: path.to_path_buf(),
                    line,
                    max: MAX_NODES,
                });
            }
            first_seen.insert(identity, line);
            entries.push(NodeEntry {
                line,
                host: host.to_owned(),
            });
        }

        if entries.is_empty() {
            return Err(ConfigError::NoNodes {
                path: path.to_path_buf(),
            });
        }
        Ok(NodeConfig {
            path: path.to_path_buf(),
            entries,
        })
    }

    /// Read and parse a nodes file. An unreadable file is a [`ConfigError::NodesIo`], whose
    /// message contains NVIDIA's "Failed to read node configuration file" and names the path.
    pub fn load(path: &Path) -> Result<NodeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::NodesIo {
            set_at: String::new(),
            path: path.to_path_buf(),
            source,
        })?;
        NodeConfig::parse(&text, path)
    }

    /// The hosts as written, in node-ID order.
    pub fn hosts(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.host.clone()).collect()
    }

    /// Whether any entry is a placeholder (`0.0.0.0` / `::`).
    pub fn has_placeholder(&self) -> bool {
        self.entries.iter().any(NodeEntry::is_placeholder)
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if there are no nodes (never the case for a parsed file).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Validate one entry; on failure, say why (the caller adds what is expected).
fn check_host(host: &str) -> Result<Identity, String> {
    if host.contains(char::is_whitespace) {
        return Err(
            "it contains a space; write one address per line, and put comments after #".to_owned(),
        );
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(Identity::Ip(ip));
    }
    check_dns_name(host)?;
    Ok(Identity::Name(host.to_ascii_lowercase()))
}

/// RFC 1123 host name: labels of 1-63 characters from `[A-Za-z0-9-]`, not starting or ending
/// with `-`, at most 253 characters, optionally one trailing dot. Additionally a name made
/// only of digit labels (`10.0.0.256`, `1234`) is refused: it is a mistyped IPv4 address, and
/// resolvers would read it as a number rather than look it up.
fn check_dns_name(host: &str) -> Result<(), String> {
    let name = host.strip_suffix('.').unwrap_or(host);
    if let Some(c) = name
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || c == '-' || c == '.'))
    {
        return Err(if c == ':' || c == '[' || c == ']' {
            "it is not a valid IP address (write the address alone, without brackets or port)"
                .to_owned()
        } else {
            format!("character '{c}' is not allowed (a DNS name has letters, digits, '-' and '.')")
        });
    }
    if name.len() > 253 {
        return Err(format!(
            "it is {} characters long, a DNS name at most 253",
            name.len()
        ));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("it has an empty label (a leading dot or two dots in a row)".to_owned());
        }
        if label.len() > 63 {
            return Err(format!(
                "label \"{label}\" is {} characters long, at most 63 are allowed",
                label.len()
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("label \"{label}\" starts or ends with '-'"));
        }
    }
    if name
        .split('.')
        .all(|label| label.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("it looks like an IPv4 address but is not a valid one".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    fn parse(text: &str) -> Result<NodeConfig, ConfigError> {
        NodeConfig::parse(text, Path::new("nodes_config.cfg"))
    }

    fn parse_err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn comments_and_blank_lines_do_not_count() {
        let nodes =
            parse("# header\n\n10.0.0.1\n   \n# middle\nnode-b.example.com\n\tfe80::1\n").unwrap();
        assert_eq!(nodes.hosts(), ["10.0.0.1", "node-b.example.com", "fe80::1"]);
        let lines: Vec<usize> = nodes.entries.iter().map(|e| e.line).collect();
        assert_eq!(lines, [3, 6, 7]);
        assert_eq!(nodes.len(), 3);
        assert!(!nodes.is_empty());
        assert_eq!(nodes.path, Path::new("nodes_config.cfg"));
    }

    #[test]
    fn trailing_comment_is_stripped() {
        let nodes = parse("10.0.0.1   # rack 3\nnode-b# no space\r\n").unwrap();
        assert_eq!(nodes.hosts(), ["10.0.0.1", "node-b"]);
        assert_eq!(
            nodes.entries[0].ip(),
            Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)))
        );
        assert_eq!(nodes.entries[1].ip(), None);
    }

    #[test]
    fn dra_style_names_and_trailing_dot_are_accepted() {
        let text: String = (0..18)
            .map(|i| format!("compute-domain-daemon-8585d4965d-{i:04}\n"))
            .collect();
        assert_eq!(parse(&text).unwrap().len(), 18);
        assert_eq!(
            parse("host.example.com.\n").unwrap().hosts(),
            ["host.example.com."]
        );
    }

    #[test]
    fn duplicate_names_both_lines() {
        let msg = parse_err("10.0.0.1\n10.0.0.2\n\n# x\n10.0.0.2\n");
        assert_eq!(
            msg,
            "nodes_config.cfg:5: node \"10.0.0.2\" is listed twice (first at line 2): every node \
             must appear once, because its line index is its node ID"
        );
        let msg = parse_err("Node-A\nnode-a\n");
        assert!(
            msg.starts_with("nodes_config.cfg:2: node \"node-a\""),
            "{msg}"
        );
        assert!(msg.contains("first at line 1"), "{msg}");
        // Same address, different spelling.
        let msg = parse_err("::1\n0:0::1\n");
        assert!(
            msg.contains(":2: node \"0:0::1\" is listed twice (first at line 1)"),
            "{msg}"
        );
    }

    /// AWS ParallelCluster's seed file: a `##` comment and nine `0.0.0.0` lines.
    #[test]
    fn repeated_placeholders_are_accepted_and_keep_their_ids() {
        let text = format!("##\n{}", "0.0.0.0\n".repeat(9));
        let nodes = parse(&text).unwrap();
        assert_eq!(nodes.len(), 9);
        assert!(nodes.entries.iter().all(NodeEntry::is_placeholder));
        assert!(nodes.has_placeholder());
        let lines: Vec<usize> = nodes.entries.iter().map(|e| e.line).collect();
        assert_eq!(lines, (2..=10).collect::<Vec<_>>());
        // IPv6 spellings, mixed with real entries: each keeps its line's ID.
        let nodes = parse("10.0.0.1\n::\n0.0.0.0\n0:0::0\n10.0.0.2\n0.0.0.0\n").unwrap();
        let marks: Vec<bool> = nodes
            .entries
            .iter()
            .map(NodeEntry::is_placeholder)
            .collect();
        assert_eq!(marks, [false, true, true, true, false, true]);
        assert!(!parse("10.0.0.1\n").unwrap().has_placeholder());
        assert!(is_placeholder("::ffff:0.0.0.0"));
        assert!(!is_placeholder("0.0.0.1") && !is_placeholder("zero"));
    }

    #[test]
    fn a_real_duplicate_among_placeholders_is_still_refused() {
        let msg = parse_err("##\n0.0.0.0\n10.0.0.5\n0.0.0.0\n10.0.0.5\n");
        assert_eq!(
            msg,
            "nodes_config.cfg:5: node \"10.0.0.5\" is listed twice (first at line 3): every node \
             must appear once, because its line index is its node ID"
        );
        let msg = parse_err("0.0.0.0\nnode-a\n0.0.0.0\nNODE-A\n");
        assert!(
            msg.starts_with("nodes_config.cfg:4: node \"NODE-A\""),
            "{msg}"
        );
    }

    #[test]
    fn bad_entries_name_line_value_and_reason() {
        let cases = [
            ("10.0.0.1 10.0.0.2", "contains a space"),
            ("node_a", "character '_' is not allowed"),
            ("-node", "starts or ends with '-'"),
            ("a..b", "empty label"),
            ("10.0.0.256", "looks like an IPv4 address"),
            ("10.0.0.1:50000", "without brackets or port"),
            ("[::1]", "without brackets or port"),
        ];
        for (entry, reason) in cases {
            let msg = parse_err(&format!("# c\n{entry}\n"));
            let head = format!("nodes_config.cfg:2: node \"{entry}\" is not a valid IP address");
            assert!(msg.starts_with(&head), "{msg}");
            assert!(msg.contains(reason), "{msg}");
            assert!(
                msg.ends_with("write one IPv4 or IPv6 address or DNS name per line"),
                "{msg}"
            );
        }
        let long_label = "a".repeat(64);
        assert!(parse_err(&long_label).contains("at most 63"));
        let (a63, a62, a61) = ("a".repeat(63), "a".repeat(62), "a".repeat(61));
        let ok_name = format!("{a63}.{a63}.{a63}.{a61}");
        assert_eq!(ok_name.len(), 253);
        assert!(parse(&ok_name).is_ok());
        let long_name = format!("{a63}.{a63}.{a63}.{a62}");
        assert!(parse_err(&long_name).contains("254 characters long, a DNS name at most 253"));
    }

    /// A 100 KB entry is echoed cut, with its full length, keeping file:line and the fix.
    #[test]
    fn huge_entries_are_cut_in_errors() {
        const BIG: usize = 100 << 10;
        let entry = "n".repeat(BIG);
        let msg = parse_err(&format!("10.0.0.1\n{entry}\n"));
        let cut = &entry[..crate::error::ECHO_MAX];
        assert_eq!(
            msg,
            format!(
                "nodes_config.cfg:2: node \"{cut}…\" ({BIG} characters) is not a valid IP \
                 address or DNS name: it is {BIG} characters long, a DNS name at most 253; write \
                 one IPv4 or IPv6 address or DNS name per line"
            )
        );
        let msg = parse_err(&format!("{entry} {entry}\n"));
        assert!(msg.len() < 600, "{} bytes", msg.len());
        assert!(
            msg.contains(&format!("…\" ({} characters)", 2 * BIG + 1)),
            "{msg}"
        );
        assert!(msg.contains("contains a space"), "{msg}");
    }

    #[test]
    fn empty_file_is_an_error() {
        for text in ["", "\n\n", "# only a comment\n   # another\n"] {
            assert_eq!(
                parse_err(text),
                "nodes_config.cfg: no nodes listed: write one IP address or DNS name per line \
                 (node 0 is the first non-comment, non-blank line)"
            );
        }
    }

    #[test]
    fn missing_file_uses_nvidia_phrase() {
        let path = Path::new("/nonexistent/openimex/nodes_config.cfg");
        let msg = NodeConfig::load(path).unwrap_err().to_string();
        assert!(
            msg.starts_with(
                "Failed to read node configuration file /nonexistent/openimex/nodes_config.cfg: "
            ),
            "{msg}"
        );
        assert!(msg.contains("IMEX_NODE_CONFIG_FILE"), "{msg}");
    }

    #[test]
    fn load_reads_a_file() {
        let path =
            std::env::temp_dir().join(format!("openimex-config-nodes-{}.cfg", std::process::id()));
        std::fs::write(&path, "10.1.0.1\n10.1.0.2\n").unwrap();
        let nodes = NodeConfig::load(&path);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(nodes.unwrap().hosts(), ["10.1.0.1", "10.1.0.2"]);
    }

    #[test]
    fn too_many_nodes() {
        let text: String = (0..=MAX_NODES as u32)
            .map(|i| format!("{}\n", Ipv4Addr::from(i)))
            .collect();
        let msg = parse_err(&text);
        assert_eq!(
            msg,
            "nodes_config.cfg:65536: too many nodes: at most 65535 entries are supported"
        );
    }

    proptest! {
        #[test]
        fn distinct_ipv4s_round_trip(
            ips in prop::collection::hash_set(any::<u32>(), 1..40),
            filler in prop::collection::vec((0usize..4, 0usize..4, any::<bool>()), 40),
        ) {
            const JUNK: [&str; 4] = ["", "# comment", "   ", "\t# indented = comment"];
            let ips: Vec<Ipv4Addr> = ips.into_iter().map(Ipv4Addr::from).collect();
            let mut text = String::new();
            for (ip, &(before, junk, trailing)) in ips.iter().zip(&filler) {
                for _ in 0..before {
                    text.push_str(JUNK[junk]);
                    text.push('\n');
                }
                text.push_str(&ip.to_string());
                if trailing {
                    text.push_str("  # trailing");
                }
                text.push('\n');
            }
            let nodes = parse(&text).unwrap();
            let want: Vec<String> = ips.iter().map(Ipv4Addr::to_string).collect();
            prop_assert_eq!(nodes.hosts(), want);
        }
    }
}
