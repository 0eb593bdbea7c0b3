//! `-m` (the node map) and `-d` (the configuration dump): openimex's meanings for two flags of
//! NVIDIA's usage line whose meaning NVIDIA does not publish (docs/reference/imex-guide.md §2).
//!
//! Both come from the running daemon's command service (the `Config` call): the options as it
//! logged them at start, and the node map it uses (SIGUSR1 may have grown it) with what each
//! entry resolves to now. When the daemon cannot say (not running, unconfigured, a release
//! without the call) and a config file is at hand, ctl computes them from the file with the
//! daemon's own rules ([`openimex_config::iface::locate`], [`openimex_config::dump`]) and says
//! so on the first line, with the daemon's answer, so nobody takes the file for the daemon.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::Path;

use openimex_config::{Config, NodeConfig, iface};
use openimex_proto::cmd::ConfigReply;
use serde_json::json;

use crate::CtlError;

/// Which flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// `-m`.
    Map,
    /// `-d`.
    Dump,
}

/// One entry of the node map.
struct Entry {
    id: usize,
    host: String,
    /// The addresses it resolves to now; empty for a placeholder or a name that does not resolve.
    addrs: Vec<String>,
    placeholder: bool,
}

/// What is shown, wherever it came from.
struct Shown {
    /// Where it came from, for the first line and the JSON `source`.
    source: String,
    config: String,
    options: Vec<(String, String)>,
    local: Option<usize>,
    /// Why this node is not known (file only).
    local_error: Option<String>,
    entries: Vec<Entry>,
}

/// The view from the daemon's `Config` answer; `target` is where ctl asked.
pub fn from_daemon(view: View, reply: ConfigReply, target: &str, json: bool) -> String {
    let source = match view {
        View::Map => format!("the node map of the running daemon at {target}"),
        View::Dump => {
            format!("the running daemon at {target}, as it logged its configuration at start")
        }
    };
    let shown = Shown {
        source,
        config: reply.config_file,
        options: reply
            .options
            .into_iter()
            .map(|o| (o.label, o.value))
            .collect(),
        local: usize::try_from(reply.local_node_id).ok(),
        local_error: None,
        entries: reply
            .nodes
            .into_iter()
            .map(|n| Entry {
                id: usize::try_from(n.node_id).unwrap_or(usize::MAX),
                host: n.host,
                addrs: n.addresses,
                placeholder: n.placeholder,
            })
            .collect(),
    };
    render(view, &shown, json)
}

/// The view computed from the config file at `path`; `why` says why the daemon was not asked
/// or could not answer.
pub fn from_file(view: View, path: &Path, why: &str, json: bool) -> Result<String, CtlError> {
    let cfg = Config::load(path).map_err(|e| CtlError::Config(Box::new(e)))?;
    let source = format!(
        "computed by ctl from {} with the daemon's rules, not the running daemon's ({why})",
        path.display()
    );
    let mut shown = Shown {
        source,
        config: path.display().to_string(),
        options: openimex_config::dump(&cfg),
        local: None,
        local_error: None,
        entries: Vec::new(),
    };
    if view == View::Map {
        let nodes = cfg
            .load_nodes()
            .map_err(|e| CtlError::NodeFile(Box::new(e)))?;
        match iface::locate(&cfg, &nodes, &iface::system_interfaces()) {
            Ok((local, _)) => shown.local = Some(usize::from(local.node_id)),
            Err(e) => shown.local_error = Some(e.to_string()),
        }
        shown.entries = entries(&nodes);
    }
    Ok(render(view, &shown, json))
}

fn entries(nodes: &NodeConfig) -> Vec<Entry> {
    nodes
        .entries
        .iter()
        .enumerate()
        .map(|(id, entry)| {
            let placeholder = entry.is_placeholder();
            let addrs = match entry.ip() {
                _ if placeholder => Vec::new(),
                Some(ip) => vec![ip],
                None => openimex_config::system_resolve(&entry.host),
            };
            Entry {
                id,
                host: entry.host.clone(),
                addrs: addrs.iter().map(IpAddr::to_string).collect(),
                placeholder,
            }
        })
        .collect()
}

fn render(view: View, s: &Shown, json: bool) -> String {
    match (view, json) {
        (View::Map, true) => {
            let list: Vec<_> = s
                .entries
                .iter()
                .map(|e| {
                    json!({
                        "node_id": e.id,
                        "host": e.host,
                        "addresses": e.addrs,
                        "placeholder": e.placeholder,
                        "local": s.local == Some(e.id),
                    })
                })
                .collect();
            let doc = json!({
                "source": s.source,
                "config": s.config,
                "local_node_id": s.local,
                "local_error": s.local_error,
                "nodes": list,
            });
            doc.to_string() + "\n"
        }
        (View::Dump, true) => {
            let options: serde_json::Map<String, serde_json::Value> = s
                .options
                .iter()
                .map(|(label, value)| (label.clone(), serde_json::Value::String(value.clone())))
                .collect();
            let doc = json!({ "source": s.source, "config": s.config, "options": options });
            doc.to_string() + "\n"
        }
        (View::Map, false) => map_text(s),
        (View::Dump, false) => {
            let mut out = format!("Configuration (openimex's -d): {}\n", s.source);
            for (label, value) in &s.options {
                let _ = writeln!(out, "{label} = {value}");
            }
            out
        }
    }
}

fn map_text(s: &Shown) -> String {
    let mut out = format!("Node map (openimex's -m): {}\n", s.source);
    let width = s
        .entries
        .iter()
        .map(|e| e.host.len())
        .max()
        .unwrap_or(0)
        .max(5);
    let _ = writeln!(out, "{:>5}  {:<width$}  Address", "Node", "Entry");
    for e in &s.entries {
        let addrs = match (e.placeholder, e.addrs.as_slice()) {
            (true, _) => "(placeholder: no node yet)".to_owned(),
            (false, []) => "(does not resolve)".to_owned(),
            (false, a) => a.join(", "),
        };
        let marker = if s.local == Some(e.id) {
            "  <- this node"
        } else {
            ""
        };
        let _ = writeln!(out, "{:>5}  {:<width$}  {addrs}{marker}", e.id, e.host);
    }
    if let Some(e) = &s.local_error {
        let _ = writeln!(out, "This node: not found: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(nodes: &str, extra: &str) -> (tempdir::Dir, std::path::PathBuf) {
        let dir = tempdir::Dir::new();
        std::fs::write(dir.0.join("nodes.cfg"), nodes).unwrap();
        let cfg = dir.0.join("config.cfg");
        std::fs::write(
            &cfg,
            format!(
                "IMEX_NODE_CONFIG_FILE={}\n{extra}",
                dir.0.join("nodes.cfg").display()
            ),
        )
        .unwrap();
        (dir, cfg)
    }

    /// A directory removed on drop.
    mod tempdir {
        pub(super) struct Dir(pub(super) std::path::PathBuf);
        impl Dir {
            pub(super) fn new() -> Self {
                static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let p = std::env::temp_dir()
                    .join(format!("openimex-ctl-view-{}-{n}", std::process::id()));
                std::fs::create_dir_all(&p).unwrap();
                Self(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn the_daemons_answer_is_shown_as_the_daemons() {
        use openimex_proto::cmd::{ConfigOption, MapEntry};
        let reply = ConfigReply {
            config_file: "/etc/nvidia-imex/config.cfg".into(),
            options: vec![ConfigOption {
                label: "Logging level".into(),
                value: "3".into(),
            }],
            local_node_id: 1,
            nodes: vec![
                MapEntry {
                    node_id: 0,
                    host: "node-a".into(),
                    addresses: vec!["10.0.0.1".into()],
                    placeholder: false,
                },
                MapEntry {
                    node_id: 1,
                    host: "node-b".into(),
                    addresses: vec!["10.0.0.2".into(), "fe80::2".into()],
                    placeholder: false,
                },
            ],
            bind: "10.0.0.2:50000".into(),
            network_interface: "eth0".into(),
        };
        let map = from_daemon(View::Map, reply.clone(), "/run/imex.sock", false);
        assert_eq!(
            map,
            "Node map (openimex's -m): the node map of the running daemon at /run/imex.sock\n\
             \x20Node  Entry   Address\n\
             \x20   0  node-a  10.0.0.1\n\
             \x20   1  node-b  10.0.0.2, fe80::2  <- this node\n"
        );
        let dump = from_daemon(View::Dump, reply, "/run/imex.sock", false);
        assert!(dump.ends_with("\nLogging level = 3\n"), "{dump}");
        assert!(dump.starts_with("Configuration (openimex's -d): the running daemon at"));
    }

    #[test]
    fn node_map_marks_this_node_and_what_each_entry_is() {
        let (_d, cfg) = files("192.0.2.7\n127.0.0.1\n0.0.0.0\nno-such-host.invalid\n", "");
        let text = from_file(View::Map, &cfg, "test", false).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("not the running daemon's (test)"),
            "{text}"
        );
        assert!(lines[2].ends_with("192.0.2.7"), "{text}");
        assert!(lines[3].ends_with("127.0.0.1  <- this node"), "{text}");
        assert!(lines[4].contains("(placeholder: no node yet)"), "{text}");
        assert!(lines[5].contains("(does not resolve)"), "{text}");
        let doc: serde_json::Value =
            serde_json::from_str(&from_file(View::Map, &cfg, "test", true).unwrap()).unwrap();
        assert_eq!(doc["local_node_id"], 1);
        assert_eq!(doc["nodes"][1]["local"], true);
        assert_eq!(doc["nodes"][0]["addresses"][0], "192.0.2.7");
    }

    #[test]
    fn node_map_says_when_this_host_is_not_in_the_file() {
        let (_d, cfg) = files("192.0.2.7\n", "");
        let text = from_file(View::Map, &cfg, "test", false).unwrap();
        assert!(!text.contains("<- this node"), "{text}");
        assert!(
            text.contains("This node: not found: no entry of nodes file"),
            "{text}"
        );
    }

    #[test]
    fn config_dump_lists_the_values_in_effect() {
        let (_d, cfg) = files(
            "127.0.0.1\n",
            "SERVER_PORT=50123\nIMEX_CONN_WAIT_TIMEOUT=70\n",
        );
        let text = from_file(View::Dump, &cfg, "test", false).unwrap();
        assert!(
            text.contains("\nIMEX library communication bind port = 50123\n"),
            "{text}"
        );
        assert!(text.contains("\nIMEX_CONN_WAIT_TIMEOUT = 70\n"), "{text}");
        let doc: serde_json::Value =
            serde_json::from_str(&from_file(View::Dump, &cfg, "test", true).unwrap()).unwrap();
        assert_eq!(doc["options"]["Logging level"], "4");
    }
}
