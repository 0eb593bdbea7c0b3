//! Which entry of the nodes file is this node, and which address the peer listener binds.
//!
//! [`identify_local`] is pure: DNS and "is this address mine?" come in as functions, so tests
//! (and the simulator) can describe any host. [`system_resolve`] and [`system_is_local`] are
//! the versions the daemon passes on a real machine.
//!
//! Rules:
//! - With `BIND_INTERFACE_IP` set, this node is the entry that is that address or whose name
//!   resolves to it.
//! - Without it, this node is the entry that has an address of this host (an IP entry
//!   directly, a name through DNS). Exactly one must match. If several match but exactly one
//!   of them is not a loopback address, that one is taken: the DRA driver points the names of
//!   unused slots at the sentinel `127.0.0.2`, which is bindable on Linux, while this pod's own
//!   name resolves to its real address.
//! - A name that does not resolve (yet) is skipped, not an error: peers may appear in DNS or
//!   `/etc/hosts` later.
//! - A placeholder entry (`0.0.0.0` / `::`, see [`crate::nodes`]) is never this node, even
//!   though the unspecified address is bindable: it names no node. When nothing else matches
//!   and the file holds a placeholder, the daemon runs *unconfigured* rather than exiting
//!   (the caller decides that: see [`NodeConfig::has_placeholder`]).

use std::net::{IpAddr, TcpListener, ToSocketAddrs};

use crate::{ConfigError, NodeConfig, NodeEntry};

/// This node's place in the nodes file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalNode {
    /// 0-based index of this node's entry among the entries of the nodes file.
    pub node_id: u16,
    /// The address the peer listener binds (`BIND_INTERFACE_IP`, or the entry's local address).
    pub bind_ip: IpAddr,
}

/// Most entries listed in an error message before "... and N more".
const LIST_LIMIT: usize = 16;

/// Find this node in `nodes`.
///
/// `bind` is `BIND_INTERFACE_IP` (`None` when empty). `resolve` maps a DNS name to its
/// addresses (empty if it does not resolve); it is not called for IP entries. `is_local` says
/// whether an address belongs to this host. The errors name the nodes file, list what was
/// tried, and say to set `BIND_INTERFACE_IP` or fix the nodes file.
pub fn identify_local(
    nodes: &NodeConfig,
    bind: Option<IpAddr>,
    resolve: &dyn Fn(&str) -> Vec<IpAddr>,
    is_local: &dyn Fn(IpAddr) -> bool,
) -> Result<LocalNode, ConfigError> {
    identify_local_preferring(nodes, bind, resolve, is_local, &|_| false)
}

/// [`identify_local`], where, when several entries are addresses of this host, the only one
/// that `preferred` accepts is taken (`NETWORK_INTERFACE`: an address on that interface) before
/// the loopback rule applies.
pub fn identify_local_preferring(
    nodes: &NodeConfig,
    bind: Option<IpAddr>,
    resolve: &dyn Fn(&str) -> Vec<IpAddr>,
    is_local: &dyn Fn(IpAddr) -> bool,
    preferred: &dyn Fn(IpAddr) -> bool,
) -> Result<LocalNode, ConfigError> {
    let resolved: Vec<(usize, &NodeEntry, Vec<IpAddr>)> = nodes
        .entries
        .iter()
        .enumerate()
        .map(|(id, entry)| {
            let addrs = match entry.ip() {
                _ if entry.is_placeholder() => Vec::new(),
                Some(ip) => vec![ip],
                None => resolve(&entry.host),
            };
            (id, entry, addrs)
        })
        .collect();

    // (node id, entry, the matching address)
    let matches: Vec<(usize, &NodeEntry, IpAddr)> = match bind {
        Some(bind) => resolved
            .iter()
            .filter(|(_, _, addrs)| addrs.contains(&bind))
            .map(|&(id, entry, _)| (id, entry, bind))
            .collect(),
        None => resolved
            .iter()
            .filter_map(|(id, entry, addrs)| {
                let ip = addrs.iter().copied().find(|&ip| is_local(ip))?;
                Some((*id, *entry, ip))
            })
            .collect(),
    };

    let chosen = match (bind, matches.as_slice()) {
        (_, [one]) => *one,
        (Some(bind), []) => {
            return Err(ConfigError::BindNotInNodes {
                path: nodes.path.clone(),
                bind,
                count: nodes.len(),
            });
        }
        (Some(bind), several) => {
            return Err(ConfigError::BindMatchesSeveral {
                path: nodes.path.clone(),
                bind,
                matches: several.iter().map(describe_match).collect(),
            });
        }
        (None, []) => {
            return Err(ConfigError::NoLocalNode {
                path: nodes.path.clone(),
                tried: limit(
                    resolved
                        .iter()
                        .map(|(_, entry, addrs)| describe_tried(entry, addrs)),
                ),
            });
        }
        (None, several) => {
            let mut on_interface = several.iter().filter(|(_, _, ip)| preferred(*ip));
            let mut not_loopback = several.iter().filter(|(_, _, ip)| !ip.is_loopback());
            match (on_interface.next(), on_interface.next()) {
                (Some(only), None) => *only,
                _ => match (not_loopback.next(), not_loopback.next()) {
                    (Some(only), None) => *only,
                    _ => {
                        return Err(ConfigError::SeveralLocalNodes {
                            path: nodes.path.clone(),
                            matches: limit(several.iter().map(describe_match)),
                        });
                    }
                },
            }
        }
    };

    let (id, entry, bind_ip) = chosen;
    let node_id = u16::try_from(id).map_err(|_| ConfigError::TooManyNodes {
        path: nodes.path.clone(),
        line: entry.line,
        max: usize::from(u16::MAX),
    })?;
    Ok(LocalNode { node_id, bind_ip })
}

/// `line 2 node-b (10.0.0.2)` or `line 1 10.0.0.1`.
fn describe_match(&(_, entry, ip): &(usize, &NodeEntry, IpAddr)) -> String {
    if entry.ip().is_some() {
        format!("line {} {}", entry.line, entry.host)
    } else {
        format!("line {} {} ({ip})", entry.line, entry.host)
    }
}

/// `line 1 10.0.0.1`, `line 2 node-b (10.0.0.2, 10.0.0.3)`, `line 3 node-c (does not resolve)`.
fn describe_tried(entry: &NodeEntry, addrs: &[IpAddr]) -> String {
    if entry.ip().is_some() {
        return format!("line {} {}", entry.line, entry.host);
    }
    let addrs = match addrs {
        [] => "does not resolve".to_owned(),
        _ => addrs
            .iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!("line {} {} ({addrs})", entry.line, entry.host)
}

/// At most [`LIST_LIMIT`] items, then "... and N more".
fn limit(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = items.collect();
    if out.len() > LIST_LIMIT {
        let more = out.len() - LIST_LIMIT;
        out.truncate(LIST_LIMIT);
        out.push(format!("... and {more} more"));
    }
    out
}

/// Resolve `host` with the system resolver (`getaddrinfo` through
/// [`ToSocketAddrs`] on `(host, 0)`). Returns the distinct addresses in resolver order, or
/// nothing if the name does not resolve.
pub fn system_resolve(host: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    if let Ok(addrs) = (host, 0).to_socket_addrs() {
        for addr in addrs {
            if !out.contains(&addr.ip()) {
                out.push(addr.ip());
            }
        }
    }
    out
}

/// Whether `ip` is an address of this host, tested by binding a TCP listener on `(ip, 0)`
/// and dropping it at once: the kernel lets a process bind only addresses assigned to the
/// host, which is the exact question, and it needs no interface enumeration (and no
/// dependency). Port 0 asks for any free port, so the test cannot collide with a listener.
///
/// Caveats: the unspecified (`0.0.0.0`, `::`) and multicast addresses are bindable but belong
/// to no host, so they return false. On Linux every `127.x.y.z` is bindable, so all loopback
/// entries count as local. An IPv6 link-local address needs a scope to bind, so it returns
/// false; set `BIND_INTERFACE_IP` (and `NETWORK_INTERFACE`) for those. With
/// `net.ipv4.ip_nonlocal_bind=1` any address binds, so set `BIND_INTERFACE_IP` there too.
pub fn system_is_local(ip: IpAddr) -> bool {
    if ip.is_unspecified() || ip.is_multicast() {
        return false;
    }
    TcpListener::bind((ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn nodes(text: &str) -> NodeConfig {
        NodeConfig::parse(text, Path::new("/etc/nvidia-imex/nodes_config.cfg")).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A resolver knowing `node-a` -> 10.0.0.1, `node-b` -> 10.0.0.2 and 10.0.0.12,
    /// `slot-*` -> 127.0.0.2 (DRA's sentinel); everything else does not resolve.
    fn dns(host: &str) -> Vec<IpAddr> {
        match host {
            "node-a" => vec![ip("10.0.0.1")],
            "node-b" => vec![ip("10.0.0.2"), ip("10.0.0.12")],
            h if h.starts_with("slot-") => vec![ip("127.0.0.2")],
            _ => Vec::new(),
        }
    }

    fn no_dns(host: &str) -> Vec<IpAddr> {
        panic!("IP entries must not be resolved, got {host}")
    }

    fn never(_: IpAddr) -> bool {
        panic!("is_local must not be called when BIND_INTERFACE_IP is set")
    }

    /// `0.0.0.0` is bindable everywhere, yet a placeholder is never this node.
    #[test]
    fn placeholders_are_never_this_node() {
        let n = nodes("##\n0.0.0.0\n0.0.0.0\n10.0.0.2\n");
        let got = identify_local(&n, None, &no_dns, &|_| true).unwrap();
        assert_eq!(got.node_id, 2);
        let only = nodes("##\n0.0.0.0\n::\n");
        assert!(only.has_placeholder());
        assert!(matches!(
            identify_local(&only, None, &no_dns, &|_| true),
            Err(ConfigError::NoLocalNode { .. })
        ));
        assert!(matches!(
            identify_local(&only, Some(ip("0.0.0.0")), &no_dns, &never),
            Err(ConfigError::BindNotInNodes { .. })
        ));
    }

    #[test]
    fn bind_set_matches_ip_entry() {
        let n = nodes("# c\n10.0.0.1\n10.0.0.2\n10.0.0.3\n");
        let got = identify_local(&n, Some(ip("10.0.0.2")), &no_dns, &never).unwrap();
        assert_eq!(
            got,
            LocalNode {
                node_id: 1,
                bind_ip: ip("10.0.0.2")
            }
        );
    }

    #[test]
    fn bind_set_matches_resolved_name() {
        let n = nodes("node-a\nnode-b\nnode-zzz\n");
        let got = identify_local(&n, Some(ip("10.0.0.12")), &dns, &never).unwrap();
        assert_eq!(
            got,
            LocalNode {
                node_id: 1,
                bind_ip: ip("10.0.0.12")
            }
        );
    }

    #[test]
    fn bind_set_not_found() {
        let n = nodes("10.0.0.1\n10.0.0.2\n");
        let err = identify_local(&n, Some(ip("10.0.0.9")), &no_dns, &never).unwrap_err();
        assert_eq!(
            err.to_string(),
            "BIND_INTERFACE_IP=10.0.0.9 is not in nodes file /etc/nvidia-imex/nodes_config.cfg \
             (2 entries): add this node's address to the nodes file or fix BIND_INTERFACE_IP"
        );
    }

    #[test]
    fn bind_set_matching_two_entries() {
        let n = nodes("node-a\n10.0.0.1\n");
        let msg = identify_local(&n, Some(ip("10.0.0.1")), &dns, &never)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("(line 1 node-a (10.0.0.1), line 2 10.0.0.1)"),
            "{msg}"
        );
    }

    #[test]
    fn auto_one_match() {
        let n = nodes("10.0.0.1\nnode-b\n10.0.0.3\n");
        let local = |a: IpAddr| a == ip("10.0.0.12");
        let got = identify_local(&n, None, &dns, &local).unwrap();
        assert_eq!(
            got,
            LocalNode {
                node_id: 1,
                bind_ip: ip("10.0.0.12")
            }
        );
    }

    #[test]
    fn auto_no_match_lists_what_was_tried() {
        let n = nodes("10.0.0.1\nnode-b\nnode-c\n");
        let msg = identify_local(&n, None, &dns, &|_| false)
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            "no entry of nodes file /etc/nvidia-imex/nodes_config.cfg is an address of this host \
             (tried line 1 10.0.0.1, line 2 node-b (10.0.0.2, 10.0.0.12), line 3 node-c (does not \
             resolve)): set BIND_INTERFACE_IP in config.cfg to this node's address, or add this \
             host's address to the nodes file"
        );
    }

    #[test]
    fn auto_several_matches() {
        let n = nodes("127.0.0.1\n127.0.0.2\n127.0.0.3\n");
        let msg = identify_local(&n, None, &no_dns, &|a| a.is_loopback())
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with("several entries of nodes file /etc/nvidia-imex/nodes_config.cfg"));
        assert!(
            msg.contains("(line 1 127.0.0.1, line 2 127.0.0.2, line 3 127.0.0.3)"),
            "{msg}"
        );
        assert!(msg.contains("set BIND_INTERFACE_IP"), "{msg}");

        let n = nodes("10.0.0.1\n10.0.0.2\n");
        let msg = identify_local(&n, None, &no_dns, &|_| true)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("(line 1 10.0.0.1, line 2 10.0.0.2)"), "{msg}");
    }

    #[test]
    fn auto_prefers_the_only_non_loopback_match() {
        // DRA DNS-name mode: unused slots resolve to the sentinel 127.0.0.2, which binds.
        let n = nodes("slot-0\nnode-a\nslot-2\n");
        let local = |a: IpAddr| a.is_loopback() || a == ip("10.0.0.1");
        let got = identify_local(&n, None, &dns, &local).unwrap();
        assert_eq!(
            got,
            LocalNode {
                node_id: 1,
                bind_ip: ip("10.0.0.1")
            }
        );
    }

    #[test]
    fn auto_prefers_the_only_match_on_the_network_interface() {
        let n = nodes("10.0.0.1\n10.0.1.1\n10.0.2.1\n");
        let local = |a: IpAddr| a != ip("10.0.2.1");
        let on_eth1 = |a: IpAddr| a == ip("10.0.1.1");
        let got = identify_local_preferring(&n, None, &no_dns, &local, &on_eth1).unwrap();
        assert_eq!(got.node_id, 1);
        // Without the preference the same host is ambiguous.
        assert!(matches!(
            identify_local(&n, None, &no_dns, &local),
            Err(ConfigError::SeveralLocalNodes { .. })
        ));
    }

    #[test]
    fn unresolvable_names_are_skipped() {
        let n = nodes("not-yet-1\n10.0.0.1\nnot-yet-2\n");
        let got = identify_local(&n, None, &dns, &|a| a == ip("10.0.0.1")).unwrap();
        assert_eq!(
            got,
            LocalNode {
                node_id: 1,
                bind_ip: ip("10.0.0.1")
            }
        );
        let got = identify_local(&n, Some(ip("10.0.0.1")), &dns, &never).unwrap();
        assert_eq!(got.node_id, 1);
    }

    #[test]
    fn long_lists_are_cut() {
        let text: String = (1..=40).map(|i| format!("10.1.0.{i}\n")).collect();
        let msg = identify_local(&nodes(&text), None, &no_dns, &|_| false)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("line 16 10.1.0.16, ... and 24 more)"), "{msg}");
    }

    #[test]
    fn system_helpers() {
        assert!(system_is_local(ip("127.0.0.1")));
        assert!(!system_is_local(ip("0.0.0.0")));
        assert!(
            !system_is_local(ip("192.0.2.123")),
            "TEST-NET-1 is nobody's address"
        );
        assert!(system_resolve("localhost").iter().any(IpAddr::is_loopback));
        assert_eq!(system_resolve("10.2.3.4"), [ip("10.2.3.4")]);
    }
}
