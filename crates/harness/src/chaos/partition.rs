//! Partitions for the chaos engine: in names mode every pair of daemons talks through a pair of
//! [`Proxy`]s, so a node can be cut off from all its peers (every connection left open and
//! silent, like pulled cables) and healed again.
//!
//! For nodes `i < j` two spare addresses are used: `a`, which `i`'s hosts file gives as `j`'s
//! address, and `b`, which `j`'s hosts file gives as `i`'s. The proxy on `a` forwards to `j`
//! from `b`, the one on `b` to `i` from `a`: each daemon sees its peer under the peer's name,
//! in both directions. A node's own name stays its real address.
//!
//! Public for the end-to-end tests that cut a pair of real daemons apart without the chaos
//! workload (a partition healed at a chosen moment, `tests/e2e/grace.rs`).

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::proxy::Proxy;
use crate::{Cluster, HarnessError};

/// The two proxies between nodes `i` and `j`.
#[derive(Debug)]
pub struct Link {
    i: usize,
    j: usize,
    proxies: [Proxy; 2],
}

/// Every link of a prepared (not yet started) names-mode cluster, with the hosts files
/// rewritten to go through them. Call it after [`Cluster::prepare`] of a names-mode spec and
/// before starting the nodes (a daemon resolves its peers' names when it dials).
pub fn links(cluster: &mut Cluster) -> Result<Vec<Link>, HarnessError> {
    let n = cluster.len();
    let port = cluster.spec().server_port;
    let real: Vec<Ipv4Addr> = (0..n).map(|i| cluster.node(i).ip()).collect();
    let names: Vec<String> = cluster.nodes_lines().to_vec();
    // hosts[i][k]: the address node i uses for node k.
    let mut hosts: Vec<Vec<Ipv4Addr>> = vec![real.clone(); n];
    let mut links = Vec::new();
    for i in 0..n {
        for j in i + 1..n {
            let (a, b) = (cluster.spare_ip()?, cluster.spare_ip()?);
            hosts[i][j] = a;
            hosts[j][i] = b;
            let to_j = Proxy::start(
                SocketAddrV4::new(a, port),
                SocketAddrV4::new(real[j], port),
                b,
            )?;
            let to_i = Proxy::start(
                SocketAddrV4::new(b, port),
                SocketAddrV4::new(real[i], port),
                a,
            )?;
            links.push(Link {
                i,
                j,
                proxies: [to_j, to_i],
            });
        }
    }
    for (i, row) in hosts.iter().enumerate() {
        let entries: Vec<(String, Ipv4Addr)> =
            names.iter().cloned().zip(row.iter().copied()).collect();
        cluster.set_hosts(i, &entries)?;
    }
    Ok(links)
}

/// Cuts node `n` off from every peer (`true`) or heals it (`false`).
pub fn cut(links: &[Link], n: usize, cut: bool) {
    for l in links.iter().filter(|l| l.i == n || l.j == n) {
        for p in &l.proxies {
            if cut {
                p.block();
            } else {
                p.heal();
            }
        }
    }
}
