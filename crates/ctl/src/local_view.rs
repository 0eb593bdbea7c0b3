//! `-m` (the node map) and `-d` (the configuration dump): openimex's meanings for two flags of
//! NVIDIA's usage line whose meaning NVIDIA does not publish (imex-guide §2).
//!
//! The command service offers neither the resolved node map nor the configuration, so both
//! are computed here from the config file (`-c`, default `/etc/nvidia-imex/config.cfg`) with
//! the daemon's own rules: [`openimex_config::iface::locate`] picks this node as the daemon
//! does at start, and [`openimex_config::dump`] is the list the daemon logs at start. The
//! first line of each says so, so nobody takes it for the running daemon's memory: a file
//! edited since the daemon started shows the new values.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::Path;

use openimex_config::{Config, NodeConfig, iface};
use serde_json::json;

use crate::CtlError;

/// One entry of the node map.
struct Entry {
    id: usize,
    host: String,
    /// The addresses it resolves to now; empty for a placeholder or a name that does not resolve.
    addrs: Vec<IpAddr>,
    placeholder: bool,
    local: bool,
}

fn load(path: &Path) -> Result<Config, CtlError> {
    Config::load(path).map_err(|e| CtlError::Config(Box::new(e)))
}

/// `-m`: every entry of the nodes file with its node ID, what it resolves to now, and which one
/// is this node (as the daemon picks it); `json` for `-j`.
pub fn node_map(path: &Path, json: bool) -> Result<String, CtlError> {
    let cfg = load(path)?;
    let nodes = cfg
        .load_nodes()
        .map_err(|e| CtlError::NodeFile(Box::new(e)))?;
    let located = iface::locate(&cfg, &nodes, &iface::system_interfaces());
    let local = located.as_ref().ok().map(|(l, _)| usize::from(l.node_id));
    let entries = entries(&nodes, local);
    let nodes_file = cfg.imex_node_config_file.display().to_string();
    if json {
        let list: Vec<_> = entries
            .iter()
            .map(|e| {
                json!({
                    "node_id": e.id,
                    "host": e.host,
                    "addresses": e.addrs.iter().map(IpAddr::to_string).collect::<Vec<_>>(),
                    "placeholder": e.placeholder,
                    "local": e.local,
                })
            })
            .collect();
        let doc = json!({
            "source": "computed by ctl from the config file (openimex -m)",
            "config": path.display().to_string(),
            "nodes_file": nodes_file,
            "local_node_id": local,
            "local_error": located.as_ref().err().map(ToString::to_string),
            "nodes": list,
        });
        return Ok(doc.to_string() + "\n");
    }
    let mut out = format!(
        "Node map (openimex's -m: computed by ctl from {} and {nodes_file}, with the daemon's \
         rules; not read from the running daemon)\n",
        path.display()
    );
    let width = entries
        .iter()
        .map(|e| e.host.len())
        .max()
        .unwrap_or(0)
        .max(5);
    let _ = writeln!(out, "{:>5}  {:<width$}  Address", "Node", "Entry");
    for e in &entries {
        let addrs = match (e.placeholder, e.addrs.as_slice()) {
            (true, _) => "(placeholder: no node yet)".to_owned(),
            (false, []) => "(does not resolve)".to_owned(),
            (false, a) => a
                .iter()
                .map(IpAddr::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        };
        let marker = if e.local { "  <- this node" } else { "" };
        let _ = writeln!(out, "{:>5}  {:<width$}  {addrs}{marker}", e.id, e.host);
    }
    if let Err(e) = &located {
        let _ = writeln!(out, "This node: not found: {e}");
    }
    Ok(out)
}

fn entries(nodes: &NodeConfig, local: Option<usize>) -> Vec<Entry> {
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
                addrs,
                placeholder,
                local: local == Some(id),
            }
        })
        .collect()
}

/// `-d`: the configuration as the daemon logs it at start (`label = value`); `json` for `-j`.
pub fn config_dump(path: &Path, json: bool) -> Result<String, CtlError> {
    let cfg = load(path)?;
    let entries = openimex_config::dump(&cfg);
    if json {
        let options: serde_json::Map<String, serde_json::Value> = entries
            .into_iter()
            .map(|(label, value)| (label, serde_json::Value::String(value)))
            .collect();
        let doc = json!({
            "source": "computed by ctl from the config file (openimex -d)",
            "config": path.display().to_string(),
            "options": options,
        });
        return Ok(doc.to_string() + "\n");
    }
    let mut out = format!(
        "Configuration (openimex's -d: {} read by ctl now, listed as the daemon logs it at \
         start; not read from the running daemon)\n",
        path.display()
    );
    for (label, value) in entries {
        let _ = writeln!(out, "{label} = {value}");
    }
    Ok(out)
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
    fn node_map_marks_this_node_and_what_each_entry_is() {
        let (_d, cfg) = files("192.0.2.7\n127.0.0.1\n0.0.0.0\nno-such-host.invalid\n", "");
        let text = node_map(&cfg, false).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("not read from the running daemon"),
            "{text}"
        );
        assert!(lines[2].ends_with("192.0.2.7"), "{text}");
        assert!(lines[3].ends_with("127.0.0.1  <- this node"), "{text}");
        assert!(lines[4].contains("(placeholder: no node yet)"), "{text}");
        assert!(lines[5].contains("(does not resolve)"), "{text}");
        let doc: serde_json::Value = serde_json::from_str(&node_map(&cfg, true).unwrap()).unwrap();
        assert_eq!(doc["local_node_id"], 1);
        assert_eq!(doc["nodes"][1]["local"], true);
        assert_eq!(doc["nodes"][0]["addresses"][0], "192.0.2.7");
    }

    #[test]
    fn node_map_says_when_this_host_is_not_in_the_file() {
        let (_d, cfg) = files("192.0.2.7\n", "");
        let text = node_map(&cfg, false).unwrap();
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
        let text = config_dump(&cfg, false).unwrap();
        assert!(
            text.contains("\nIMEX library communication bind port = 50123\n"),
            "{text}"
        );
        assert!(text.contains("\nIMEX_CONN_WAIT_TIMEOUT = 70\n"), "{text}");
        let doc: serde_json::Value =
            serde_json::from_str(&config_dump(&cfg, true).unwrap()).unwrap();
        assert_eq!(doc["options"]["Logging level"], "4");
    }
}
