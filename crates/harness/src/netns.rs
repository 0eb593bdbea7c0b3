//! Network namespaces for tests that need real interfaces rather than loopback aliases: IPv6
//! link-local addresses, which only mean something on an interface (`NETWORK_INTERFACE`).
//!
//! A [`NetNs`] is a named namespace (`ip netns add`), deleted when dropped, so a failing test
//! leaves none behind; a daemon runs in it through [`NetNs::command`] (`ip netns exec`, which
//! `exec`s the program: the child's PID is the daemon's). [`LinkLocalPair`] joins two of them
//! by a veth pair whose ends carry chosen link-local addresses, with duplicate address
//! detection off (an address in DAD is not bindable yet) and no automatic link-local address
//! (so the chosen one is the only one on the link).
//!
//! Needs root and iproute2's `ip`.

use std::net::Ipv6Addr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::HarnessError;

/// Distinguishes namespaces made by one process.
static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A named network namespace, deleted on drop (with every interface in it).
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates `openimex-<label>-<pid>-<n>`: unique per process and call, so parallel tests
    /// never share one. Its loopback interface is brought up.
    pub fn create(label: &str) -> Result<Self, HarnessError> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("oi-{label}-{}-{n}", std::process::id());
        ip(&["netns", "add", &name])?;
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <name> <args>`.
    pub fn ip(&self, args: &[&str]) -> Result<(), HarnessError> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "delete", &self.name]) {
            eprintln!("openimex-harness: {e}");
        }
    }
}

/// Two namespaces joined by a veth pair: interface [`LinkLocalPair::IFNAME`] in each, with
/// `addrs.0` on the first and `addrs.1` on the second (prefix /64).
#[derive(Debug)]
pub struct LinkLocalPair {
    /// The two ends.
    pub ns: [NetNs; 2],
}

impl LinkLocalPair {
    /// The interface name in both namespaces.
    pub const IFNAME: &'static str = "imex0";

    /// Creates the namespaces and the link, and waits until each address is usable.
    pub fn create(label: &str, addrs: [Ipv6Addr; 2]) -> Result<Self, HarnessError> {
        let ns = [NetNs::create(label)?, NetNs::create(label)?];
        let [a, b] = &ns;
        ip(&[
            "link",
            "add",
            Self::IFNAME,
            "netns",
            a.name(),
            "type",
            "veth",
            "peer",
            "name",
            Self::IFNAME,
            "netns",
            b.name(),
        ])?;
        for (end, addr) in ns.iter().zip(addrs) {
            end.ip(&["link", "set", Self::IFNAME, "addrgenmode", "none"])?;
            let cidr = format!("{addr}/64");
            end.ip(&["addr", "add", &cidr, "dev", Self::IFNAME, "nodad"])?;
            end.ip(&["link", "set", Self::IFNAME, "up"])?;
        }
        Ok(Self { ns })
    }
}

/// Runs `ip <args>`, failing with its error output.
fn ip(args: &[&str]) -> Result<(), HarnessError> {
    let what = format!("ip {}", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| HarnessError::Netns {
            what: what.clone(),
            detail: e.to_string(),
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(HarnessError::Netns {
        what,
        detail: format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}
