//! What `ctl` prints, from a [`DomainReply`]: NVIDIA's `-N` text table and `-N -j` JSON (byte
//! for byte where `imex-guide.md` §2 shows them), and our own `--links` view with instances
//! and reasons.

use openimex_core::ConnStatus;
use openimex_proto::cmd::{DomainReply, NodeReport};
use serde_json::{Map, Value, json};

/// The legend NVIDIA prints, typo ("triggreed") included, because people diff it.
pub const LEGEND: &str = "Connectivity Table Legend:
I - Invalid - Node wasn't reachable, no connection status available
N - Never Connected
R - Recovering - Connection was lost, but clean up has not yet been triggered.
D - Disconnected - Connection was lost, and clean up has been triggreed.
A - Authenticating - If GSSAPI enabled, client has initiated mutual authentication.
!V! - Version mismatch, communication disabled.
!M! - Node map mismatch, communication disabled.
C - Connected - Ready for operation
";

fn cell(node: &NodeReport, to: usize) -> ConnStatus {
    node.connections
        .iter()
        .find(|c| c.node_id as usize == to)
        .and_then(|c| c.status.parse().ok())
        .unwrap_or(ConnStatus::Invalid)
}

/// The `-N` text table. `hostnames` is `-H`.
pub fn table(reply: &DomainReply, timestamp: &str, hostnames: bool) -> String {
    let mut out = String::from(LEGEND);
    out.push('\n');
    out.push_str(timestamp);
    out.push_str("\nNodes:\n");
    for n in &reply.nodes {
        let id = n.node_id.to_string();
        // NVIDIA 570 pads the address to 15 between dashes; 580 wraps the local node's address
        // in `*` (tools match `* <ip> *`), keeping the state column where it was when it fits.
        let addr = if n.node_id == reply.local_node_id {
            format!("{:<18}", format!("* {} *", n.host))
        } else {
            format!("- {:<15} ", n.host)
        };
        let mut line = format!(
            "Node #{id:<3} {addr}- {:<20} - Version: {}",
            n.state, n.version
        );
        if hostnames {
            let name = if n.host_name.is_empty() {
                "N/A"
            } else {
                n.host_name.as_str()
            };
            line.push_str(&format!(" - Hostname: {name}"));
        }
        out.push_str(&line);
        out.push('\n');
    }
    out.push('\n');
    let mut header = String::from(" Nodes From\\To  ");
    for n in &reply.nodes {
        header.push_str(&format!("{:<4}", n.node_id));
    }
    out.push_str(header.trim_end());
    out.push('\n');
    for n in &reply.nodes {
        let mut row = format!("{:>8}{:8}", n.node_id, "");
        for to in 0..reply.nodes.len() {
            row.push_str(&format!("{:<4}", cell(n, to).letter()));
        }
        out.push_str(row.trim_end());
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&format!("Domain State: {}\n", reply.status));
    out
}

/// The `-N -j` JSON, compact, one line: `nodes` (every configured node keyed by index, with
/// its connections including itself), then `timestamp`, then `status` — DCGM takes the *last*
/// `"status":` in the text, so the order is part of the contract.
pub fn json(reply: &DomainReply, timestamp: &str, hostnames: bool) -> String {
    let mut nodes = Map::new();
    for n in &reply.nodes {
        let mut conns = Map::new();
        for (to, peer) in reply.nodes.iter().enumerate() {
            let c = n.connections.iter().find(|c| c.node_id as usize == to);
            conns.insert(
                to.to_string(),
                json!({
                    "host": peer.host,
                    "status": cell(n, to).as_str(),
                    "changed": c.is_some_and(|c| c.changed) && n.reachable,
                }),
            );
        }
        let host_name = match (hostnames, n.host_name.is_empty()) {
            (false, _) => "",
            (true, true) => "N/A",
            (true, false) => n.host_name.as_str(),
        };
        let mut node = Map::new();
        node.insert("status".into(), Value::from(n.state.clone()));
        node.insert("host".into(), Value::from(n.host.clone()));
        node.insert("connections".into(), Value::Object(conns));
        node.insert("changed".into(), Value::from(n.reachable));
        node.insert("version".into(), Value::from(n.version.clone()));
        node.insert("hostName".into(), Value::from(host_name));
        nodes.insert(n.node_id.to_string(), Value::Object(node));
    }
    let mut top = Map::new();
    top.insert("nodes".into(), Value::Object(nodes));
    top.insert("timestamp".into(), Value::from(timestamp));
    top.insert("status".into(), Value::from(reply.status.clone()));
    Value::Object(top).to_string()
}

fn instance(n: &NodeReport) -> String {
    if n.reachable {
        format!("{:016x}", n.instance_id)
    } else {
        String::new()
    }
}

/// Our `--links -j` view: per node its instance, and per link the state and why it changed.
pub fn links_json(reply: &DomainReply) -> String {
    let nodes: Vec<Value> = reply
        .nodes
        .iter()
        .map(|n| {
            let conns: Vec<Value> = n
                .connections
                .iter()
                .map(|c| json!({"node": c.node_id, "status": c.status, "reason": c.reason}))
                .collect();
            let mut node = json!({
                "node": n.node_id,
                "host": n.host,
                "state": n.state,
                "instance_id": instance(n),
                "reachable": n.reachable,
                "connections": conns,
            });
            if !n.refusals.is_empty() {
                let refused: serde_json::Map<String, Value> = n
                    .refusals
                    .iter()
                    .map(|r| (r.reason.clone(), json!(r.count)))
                    .collect();
                node["refused"] = Value::Object(refused);
            }
            node
        })
        .collect();
    json!({"local_node": reply.local_node_id, "status": reply.status, "nodes": nodes}).to_string()
}

/// Our `--links` text view.
pub fn links_text(reply: &DomainReply) -> String {
    let mut out = format!(
        "Domain State: {} (as seen from node {})\n",
        reply.status, reply.local_node_id
    );
    for n in &reply.nodes {
        let inst = if n.reachable {
            instance(n)
        } else {
            "-".to_string()
        };
        out.push_str(&format!(
            "\nNode #{} {} {} instance {}\n",
            n.node_id, n.host, n.state, inst
        ));
        for c in n.connections.iter().filter(|c| c.node_id != n.node_id) {
            out.push_str(&format!(
                "  -> {:<4} {:<18} {}\n",
                c.node_id, c.status, c.reason
            ));
        }
        for r in &n.refusals {
            out.push_str(&format!("  refused {:>8}  {}\n", r.count, r.reason));
        }
    }
    out
}
