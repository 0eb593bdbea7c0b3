//! `NETWORK_INTERFACE` (docs/reference/imex-guide.md §1): which network interface the peer listener is on.
//!
//! NVIDIA documents the key as "only needed when the bind IP is IPv6 link-local and present on
//! several interfaces". A link-local address (`fe80::/10`) means nothing without the interface
//! it is on (its *scope*): the kernel refuses to bind or dial one without it. So:
//! - An IPv6 link-local bind IP is bound with the scope of `NETWORK_INTERFACE`, or, when the
//!   key is empty, of the one interface that holds the address (on several: an error asking
//!   for the key). Link-local entries of the nodes file are dialled with the same scope.
//! - With any other bind IP the key only has to name an existing interface, and when the bind
//!   IP is picked from the nodes file, an address on that interface is preferred.
//! - An interface name that does not exist is a start-up error naming the key, its
//!   file:line, the value and the fix.
//!
//! The rules are pure functions of a list of [`Interface`]s; [`system_interfaces`] is the list
//! the daemon passes on a real machine (`getifaddrs`).

use std::net::{IpAddr, Ipv6Addr};

use crate::{Config, ConfigError};

/// One network interface of this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Its name (`eth0`).
    pub name: String,
    /// Its index: the scope ID of its link-local addresses.
    pub index: u32,
    /// Its IP addresses.
    pub addrs: Vec<IpAddr>,
}

/// Where the peer listener is: the interface it is on and the scope ID to bind and dial with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// The interface named by `NETWORK_INTERFACE`, else the one holding the bind IP (`None`
    /// when no interface holds it, e.g. `0.0.0.0`, or it is on several).
    pub interface: Option<String>,
    /// The scope ID for link-local IPv6 addresses (the interface's index), 0 when none.
    pub scope_id: u32,
}

/// Whether `ip` is an IPv6 link-local unicast address (`fe80::/10`), which needs a scope.
pub fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => is_link_local_v6(v6),
        IpAddr::V4(_) => false,
    }
}

fn is_link_local_v6(ip: Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// The interface `NETWORK_INTERFACE` names, `None` when the key is empty. A name no interface
/// of this host has is an error at the key's line, listing the names there are.
pub fn configured_interface<'a>(
    cfg: &Config,
    interfaces: &'a [Interface],
) -> Result<Option<&'a Interface>, ConfigError> {
    let Some(name) = cfg.network_interface.as_deref() else {
        return Ok(None);
    };
    if let Some(found) = interfaces.iter().find(|i| i.name == name) {
        return Ok(Some(found));
    }
    let names: Vec<&str> = interfaces.iter().map(|i| i.name.as_str()).collect();
    Err(ConfigError::Interface {
        key: key_at(cfg),
        problem: format!(
            "this host has no network interface of that name (it has {}): set NETWORK_INTERFACE \
             to the interface that holds this node's address, or leave it empty",
            names.join(", ")
        ),
    })
}

/// Where the peer listener bound to `bind` is, given the interface `NETWORK_INTERFACE` names.
///
/// For a link-local `bind` the scope comes from `chosen`, which must hold the address, or,
/// without it, from the only interface that holds it. For other addresses nothing is checked
/// here (binding will), and the interface reported is `chosen` or the one holding `bind`.
pub fn place(
    cfg: &Config,
    bind: IpAddr,
    chosen: Option<&Interface>,
    interfaces: &[Interface],
) -> Result<Placement, ConfigError> {
    let holders: Vec<&Interface> = interfaces
        .iter()
        .filter(|i| i.addrs.contains(&bind))
        .collect();
    let iface = match (chosen, holders.as_slice()) {
        (Some(c), _) => Some(c),
        (None, [one]) => Some(*one),
        (None, _) => None,
    };
    if !is_link_local(bind) {
        return Ok(Placement {
            interface: iface.map(|i| i.name.clone()),
            scope_id: iface.map_or(0, |i| i.index),
        });
    }
    let err = |problem: String| ConfigError::Interface {
        key: key_at(cfg),
        problem,
    };
    match (chosen, holders.as_slice()) {
        (Some(c), _) if c.addrs.contains(&bind) => Ok(Placement {
            interface: Some(c.name.clone()),
            scope_id: c.index,
        }),
        (Some(c), _) => Err(err(format!(
            "the bind IP {bind} is IPv6 link-local, but interface {} does not hold it ({}): set \
             NETWORK_INTERFACE to the interface that holds {bind}",
            c.name,
            holders_text(&holders)
        ))),
        (None, [one]) => Ok(Placement {
            interface: Some(one.name.clone()),
            scope_id: one.index,
        }),
        (None, []) => Err(err(format!(
            "the bind IP {bind} is IPv6 link-local, but no interface of this host holds it: \
             add it to an interface, or fix BIND_INTERFACE_IP / the nodes file"
        ))),
        (None, several) => Err(err(format!(
            "the bind IP {bind} is IPv6 link-local and {}: set NETWORK_INTERFACE to the one \
             the peers reach this node on",
            holders_text(several)
        ))),
    }
}

/// This node's entry of `nodes` and the peer listener's interface, as the daemon picks them:
/// `NETWORK_INTERFACE` must name one of `interfaces`; an IPv6 link-local entry counts as this
/// host's when an interface holds it (that interface, with the key set), since a test bind
/// needs a scope; with several entries of this host, the one on that interface is taken.
/// Other entries are tested with [`crate::system_is_local`] and names resolved with
/// [`crate::system_resolve`].
pub fn locate(
    cfg: &Config,
    nodes: &crate::NodeConfig,
    interfaces: &[Interface],
) -> Result<(crate::LocalNode, Placement), ConfigError> {
    let chosen = configured_interface(cfg, interfaces)?;
    let held = |ip: IpAddr| match chosen {
        Some(i) => i.addrs.contains(&ip),
        None => interfaces.iter().any(|i| i.addrs.contains(&ip)),
    };
    let is_local = |ip: IpAddr| match is_link_local(ip) {
        true => held(ip),
        false => crate::system_is_local(ip),
    };
    let preferred = |ip: IpAddr| chosen.is_some_and(|i| i.addrs.contains(&ip));
    let local = crate::identify_local_preferring(
        nodes,
        cfg.bind_interface_ip,
        &crate::system_resolve,
        &is_local,
        &preferred,
    )?;
    let placement = place(cfg, local.bind_ip, chosen, interfaces)?;
    Ok((local, placement))
}

/// `it is on eth0 and eth1`, or `no interface holds it`.
fn holders_text(holders: &[&Interface]) -> String {
    match holders {
        [] => "no interface holds it".to_owned(),
        _ => {
            let names: Vec<&str> = holders.iter().map(|i| i.name.as_str()).collect();
            format!("it is on {}", names.join(" and "))
        }
    }
}

/// `config.cfg:12: NETWORK_INTERFACE="eth9"` where the key is set, or `config.cfg:
/// NETWORK_INTERFACE is not set` when it is empty.
fn key_at(cfg: &Config) -> String {
    let file = cfg
        .node_config_file_origin
        .as_ref()
        .map(|(path, _)| format!("{}: ", path.display()))
        .unwrap_or_default();
    match (&cfg.network_interface_at, &cfg.network_interface) {
        (Some((path, line)), Some(name)) => format!(
            "{}:{line}: NETWORK_INTERFACE={}",
            path.display(),
            crate::error::Quoted(name)
        ),
        _ => format!("{file}NETWORK_INTERFACE is not set"),
    }
}

/// This host's interfaces and their addresses (`getifaddrs`); an interface without an IP
/// address is listed too. Empty when the system call fails.
pub fn system_interfaces() -> Vec<Interface> {
    let mut out: Vec<Interface> = Vec::new();
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return out;
    };
    for entry in addrs {
        let ip = entry.address.as_ref().and_then(|a| {
            a.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        });
        let at = match out.iter().position(|i| i.name == entry.interface_name) {
            Some(at) => at,
            None => {
                let index = nix::net::if_::if_nametoindex(entry.interface_name.as_str())
                    .unwrap_or_default();
                out.push(Interface {
                    name: entry.interface_name.clone(),
                    index,
                    addrs: Vec::new(),
                });
                out.len() - 1
            }
        };
        if let Some(ip) = ip
            && !out[at].addrs.contains(&ip)
        {
            out[at].addrs.push(ip);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn host() -> Vec<Interface> {
        vec![
            Interface {
                name: "lo".into(),
                index: 1,
                addrs: vec![ip("127.0.0.1"), ip("::1")],
            },
            Interface {
                name: "eth0".into(),
                index: 2,
                addrs: vec![ip("10.0.0.1"), ip("fe80::1")],
            },
            Interface {
                name: "eth1".into(),
                index: 3,
                addrs: vec![ip("10.0.1.1"), ip("fe80::1"), ip("fe80::9")],
            },
        ]
    }

    fn cfg(text: &str) -> Config {
        Config::parse(text, Path::new("/etc/nvidia-imex/config.cfg")).unwrap()
    }

    #[test]
    fn link_local_is_fe80_slash_10() {
        assert!(is_link_local(ip("fe80::1")));
        assert!(is_link_local(ip("febf::1")));
        assert!(!is_link_local(ip("fec0::1")));
        assert!(!is_link_local(ip("::1")));
        assert!(!is_link_local(ip("10.0.0.1")));
    }

    #[test]
    fn unknown_interface_names_key_line_value_and_fix() {
        let c = cfg("# c\nNETWORK_INTERFACE=eth9\n");
        let err = configured_interface(&c, &host()).unwrap_err().to_string();
        assert_eq!(
            err,
            "/etc/nvidia-imex/config.cfg:2: NETWORK_INTERFACE=\"eth9\": this host has no \
             network interface of that name (it has lo, eth0, eth1): set NETWORK_INTERFACE to \
             the interface that holds this node's address, or leave it empty"
        );
        let c = cfg("NETWORK_INTERFACE=eth1\n");
        let ifaces = host();
        assert_eq!(
            configured_interface(&c, &ifaces).unwrap().map(|i| i.index),
            Some(3)
        );
        assert_eq!(configured_interface(&cfg(""), &ifaces).unwrap(), None);
    }

    #[test]
    fn link_local_on_several_interfaces_needs_the_key() {
        let (c, ifaces) = (cfg(""), host());
        let msg = place(&c, ip("fe80::1"), None, &ifaces)
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("/etc/nvidia-imex/config.cfg: NETWORK_INTERFACE is not set: "),
            "{msg}"
        );
        assert!(msg.contains("it is on eth0 and eth1"), "{msg}");
        assert!(msg.contains("set NETWORK_INTERFACE"), "{msg}");
        // On one interface only, the key is not needed.
        let got = place(&c, ip("fe80::9"), None, &ifaces).unwrap();
        assert_eq!(got.scope_id, 3);
        assert_eq!(got.interface.as_deref(), Some("eth1"));
        // With the key, its interface gives the scope.
        let c = cfg("NETWORK_INTERFACE=eth0\n");
        let chosen = configured_interface(&c, &ifaces).unwrap();
        let got = place(&c, ip("fe80::1"), chosen, &ifaces).unwrap();
        assert_eq!((got.interface.as_deref(), got.scope_id), (Some("eth0"), 2));
    }

    #[test]
    fn link_local_not_on_the_named_interface_is_an_error() {
        let c = cfg("BIND_INTERFACE_IP=fe80::9\nNETWORK_INTERFACE=eth0\n");
        let ifaces = host();
        let chosen = configured_interface(&c, &ifaces).unwrap();
        let msg = place(&c, ip("fe80::9"), chosen, &ifaces)
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("/etc/nvidia-imex/config.cfg:2: NETWORK_INTERFACE=\"eth0\""),
            "{msg}"
        );
        assert!(msg.contains("does not hold it (it is on eth1)"), "{msg}");
        let msg = place(&cfg(""), ip("fe80::77"), None, &ifaces)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("no interface of this host holds it"), "{msg}");
    }

    #[test]
    fn other_addresses_report_the_interface_and_need_no_scope_check() {
        let ifaces = host();
        let got = place(&cfg(""), ip("10.0.1.1"), None, &ifaces).unwrap();
        assert_eq!(got.interface.as_deref(), Some("eth1"));
        let got = place(&cfg(""), ip("0.0.0.0"), None, &ifaces).unwrap();
        assert_eq!(got, Placement::default());
    }

    #[test]
    fn the_system_list_has_loopback() {
        let all = system_interfaces();
        let lo = all.iter().find(|i| i.addrs.contains(&ip("127.0.0.1")));
        assert!(lo.is_some_and(|l| l.index > 0), "{all:?}");
    }
}
