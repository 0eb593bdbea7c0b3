//! Changes to who is where in a running cluster: each node's private hosts file in names mode
//! (any name to any address, per node, so a test can also point a name at a proxy), spare
//! addresses, a node moving to a new address, and a node added at the end of the nodes file.
//!
//! None of these signals a daemon: a test decides whom to send SIGUSR1 (or whom to restart),
//! which is the point of the tests that use them.

use std::net::Ipv4Addr;
use std::time::Duration;

use super::Cluster;
use crate::HarnessError;
use crate::names;
use crate::node::Node;

/// How long a moving node's daemon gets to leave cleanly before it is killed.
const MOVE_STOP_TIMEOUT: Duration = Duration::from_secs(10);

impl Cluster {
    /// The nodes-file line of node `i`: its name in names mode, else its address.
    pub fn node_name(&self, i: usize) -> Result<&str, HarnessError> {
        self.get(i)?;
        Ok(&self.lines[i])
    }

    /// The lines the harness wrote into every nodes file, node 0 first.
    pub fn nodes_lines(&self) -> &[String] {
        &self.lines
    }

    /// Replaces node `i`'s whole hosts file (names mode). Rewritten in place, so a running
    /// daemon sees it at its next lookup.
    pub fn set_hosts(
        &mut self,
        i: usize,
        entries: &[(String, Ipv4Addr)],
    ) -> Result<(), HarnessError> {
        self.names_mode("set_hosts")?;
        let path = self.get(i)?.hosts_path();
        names::write_hosts(&path, entries)?;
        self.hosts[i] = entries.to_vec();
        Ok(())
    }

    /// Points `name` at `ip` in node `i`'s hosts file (names mode), adding the entry if absent.
    pub fn set_host(&mut self, i: usize, name: &str, ip: Ipv4Addr) -> Result<(), HarnessError> {
        self.names_mode("set_host")?;
        self.get(i)?;
        let mut entries = self.hosts[i].clone();
        match entries.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = ip,
            None => entries.push((name.to_owned(), ip)),
        }
        self.set_hosts(i, &entries)
    }

    /// What `name` resolves to in node `i`'s hosts file (`None` outside names mode).
    pub fn host_ip(&self, i: usize, name: &str) -> Option<Ipv4Addr> {
        let entries = self.hosts.get(i)?;
        entries.iter().find(|(n, _)| n == name).map(|&(_, ip)| ip)
    }

    /// A free address from the cluster's block that no node uses (see [`crate::AddrBlock::spare`]).
    pub fn spare_ip(&mut self) -> Result<Ipv4Addr, HarnessError> {
        self.block.spare()
    }

    /// Moves node `i` to `new_ip` (names mode), as a pod rescheduled with a new address: its
    /// daemon is stopped (SIGTERM), its config rewritten to bind `new_ip`, every node's hosts
    /// entry for its name rewritten in place, and its daemon started again. Its GPU driver,
    /// if any, keeps running. The other daemons are not signalled.
    pub fn move_node(&mut self, i: usize, new_ip: Ipv4Addr) -> Result<(), HarnessError> {
        self.names_mode("move_node")?;
        self.get(i)?;
        if self.is_running(i) {
            self.stop(i, MOVE_STOP_TIMEOUT)?;
        }
        self.nodes[i].set_ip(new_ip);
        self.write_config(i)?;
        let name = self.lines[i].clone();
        for j in 0..self.len() {
            self.set_host(j, &name, new_ip)?;
        }
        self.start_node(i)
    }

    /// Adds a node at the end of every nodes file, on a spare address (names mode: its name goes
    /// into every hosts file, and its own hosts file maps every name). Returns its index. Nothing
    /// is started or signalled: call [`Cluster::start_node`] and signal the others.
    pub fn add_node(&mut self) -> Result<usize, HarnessError> {
        let ip = self.spare_ip()?;
        let index = self.len();
        let node = Node::create(
            self.dir.path(),
            index,
            ip,
            self.spec.server_port,
            self.spec.cmd_port,
        )?;
        let line = match self.spec.names {
            true => names::node_name(index),
            false => ip.to_string(),
        };
        self.lines.push(line.clone());
        self.nodes.push(node);
        self.node_extra.push(Vec::new());
        self.hosts.push(Vec::new());
        for j in 0..self.len() {
            self.nodes[j].write_nodes(&self.lines)?;
        }
        if self.spec.names {
            let map: Vec<(String, Ipv4Addr)> = self
                .lines
                .iter()
                .cloned()
                .zip(self.nodes.iter().map(Node::ip))
                .collect();
            self.set_hosts(index, &map)?;
            for j in 0..index {
                self.set_host(j, &line, ip)?;
            }
        }
        self.write_config(index)?;
        Ok(index)
    }

    fn names_mode(&self, what: &'static str) -> Result<(), HarnessError> {
        match self.spec.names {
            true => Ok(()),
            false => Err(HarnessError::NotNamesMode { what }),
        }
    }
}
