//! What `ctl` prints, from a [`DomainReply`]: NVIDIA's `-N` text table and `-N -j` JSON (byte
//! for byte where `docs/reference/imex-guide.md` §2 shows them), our own `--links` view with instances
//! and reasons, and our own `--peers` view (from a [`PeersReply`]).

use std::io::{self, Write};
use std::time::Duration;

use openimex_proto::cmd::{DomainReply, NodeReport, PeerCleanUp, PeersReply};
use serde_json::{Value, json};

use crate::cells::row_for;
use crate::reason;

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

/// Renders into a string (the writers below go straight to stdout for large domains).
fn to_string(render: impl FnOnce(&mut Vec<u8>) -> io::Result<()>) -> String {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail, and every part is UTF-8.
    let _ = render(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The `-N` text table. `hostnames` is `-H`. Ours: when the domain is not UP, a `Why:` line
/// and one line per node that is not READY follow NVIDIA's last line (none when healthy).
pub fn table(reply: &DomainReply, timestamp: &str, hostnames: bool) -> String {
    to_string(|out| write_table(out, reply, timestamp, hostnames))
}

/// [`table`], written to `out` row by row.
pub fn write_table(
    out: &mut impl Write,
    reply: &DomainReply,
    timestamp: &str,
    hostnames: bool,
) -> io::Result<()> {
    out.write_all(LEGEND.as_bytes())?;
    writeln!(out)?;
    writeln!(out, "{timestamp}")?;
    writeln!(out, "Nodes:")?;
    for n in &reply.nodes {
        let id = n.node_id.to_string();
        // NVIDIA 570 pads the address to 15 between dashes; 580 wraps the local node's address
        // in `*` (tools match `* <ip> *`), keeping the state column where it was when it fits.
        let addr = if n.node_id == reply.local_node_id {
            format!("{:<18}", format!("* {} *", n.host))
        } else {
            format!("- {:<15} ", n.host)
        };
        write!(
            out,
            "Node #{id:<3} {addr}- {:<20} - Version: {}",
            n.state, n.version
        )?;
        if hostnames {
            let name = if n.host_name.is_empty() {
                "N/A"
            } else {
                n.host_name.as_str()
            };
            write!(out, " - Hostname: {name}")?;
        }
        writeln!(out)?;
    }
    writeln!(out)?;
    let mut header = String::from(" Nodes From\\To  ");
    for n in &reply.nodes {
        header.push_str(&format!("{:<4}", n.node_id));
    }
    writeln!(out, "{}", header.trim_end())?;
    let ids = crate::cells::ids(reply);
    let mut line = String::new();
    for n in &reply.nodes {
        line.clear();
        line.push_str(&format!("{:>8}{:8}", n.node_id, ""));
        for (status, _) in row_for(n, &ids) {
            line.push_str(&format!("{:<4}", status.letter()));
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    writeln!(out)?;
    writeln!(out, "Domain State: {}", reply.status)?;
    // Ours, after NVIDIA's last line and only when something is wrong: why.
    if let Some(why) = reason::domain(reply) {
        writeln!(out, "Why: {why}")?;
        for n in &reply.nodes {
            if let Some(why) = reason::node(reply, n) {
                writeln!(out, "  Node #{}: {why}", n.node_id)?;
            }
        }
    }
    Ok(())
}

/// The `-N -j` JSON, compact, one line: `nodes` (every configured node keyed by index, with
/// its connections including itself), then `timestamp`, then `status` — DCGM takes the *last*
/// `"status":` in the text, so the order is part of the contract. Ours: a `reason` key on each
/// node that is not READY and before `timestamp` when the domain is not UP (none when healthy).
pub fn json(reply: &DomainReply, timestamp: &str, hostnames: bool) -> String {
    to_string(|out| write_json(out, reply, timestamp, hostnames))
}

/// [`json()`], written to `out` cell by cell: a 1,000-node domain is a million cells (about
/// 60 MB of text), which is never held as a document.
pub fn write_json(
    out: &mut impl Write,
    reply: &DomainReply,
    timestamp: &str,
    hostnames: bool,
) -> io::Result<()> {
    let quoted = |s: &str| serde_json::to_string(s).map_err(io::Error::other);
    // Every cell names its peer's host: quote each once.
    let hosts = reply
        .nodes
        .iter()
        .map(|n| quoted(&n.host))
        .collect::<io::Result<Vec<_>>>()?;
    let ids = crate::cells::ids(reply);
    out.write_all(b"{\"nodes\":{")?;
    for (i, n) in reply.nodes.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        write!(
            out,
            "\"{}\":{{\"status\":{},\"host\":{},\"connections\":{{",
            n.node_id,
            quoted(&n.state)?,
            hosts[i]
        )?;
        for (k, (status, changed)) in row_for(n, &ids).into_iter().enumerate() {
            if k > 0 {
                out.write_all(b",")?;
            }
            write!(
                out,
                "\"{}\":{{\"host\":{},\"status\":\"{}\",\"changed\":{}}}",
                ids[k],
                hosts[k],
                status.as_str(),
                changed && n.reachable
            )?;
        }
        let host_name = match (hostnames, n.host_name.is_empty()) {
            (false, _) => "",
            (true, true) => "N/A",
            (true, false) => n.host_name.as_str(),
        };
        write!(
            out,
            "}},\"changed\":{},\"version\":{},\"hostName\":{}",
            n.reachable,
            quoted(&n.version)?,
            quoted(host_name)?
        )?;
        // Ours, last, only on a node that is not READY: why.
        if let Some(why) = reason::node(reply, n) {
            write!(out, ",\"reason\":{}", quoted(&why)?)?;
        }
        out.write_all(b"}")?;
    }
    out.write_all(b"}")?;
    // Ours, only when the domain is not UP, before `timestamp` and `status`, which stay last.
    if let Some(why) = reason::domain(reply) {
        write!(out, ",\"reason\":{}", quoted(&why)?)?;
    }
    write!(
        out,
        ",\"timestamp\":{},\"status\":{}}}",
        quoted(timestamp)?,
        quoted(&reply.status)?
    )
}

fn instance(n: &NodeReport) -> String {
    if n.reachable {
        format!("{:016x}", n.instance_id)
    } else {
        String::new()
    }
}

/// Our `--links -j` view: per node its instance, and per link the state and why it changed;
/// `reason` on every node that is not READY and on the domain when it is not UP.
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
            if let Some(why) = reason::node(reply, n) {
                node["reason"] = json!(why);
            }
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
    let mut doc = json!({"local_node": reply.local_node_id, "status": reply.status});
    if let Some(why) = reason::domain(reply) {
        doc["reason"] = json!(why);
    }
    doc["nodes"] = Value::Array(nodes);
    doc.to_string()
}

/// Our `--links` text view.
pub fn links_text(reply: &DomainReply) -> String {
    let mut out = format!(
        "Domain State: {} (as seen from node {})\n",
        reply.status, reply.local_node_id
    );
    if let Some(why) = reason::domain(reply) {
        out.push_str(&format!("Why: {why}\n"));
    }
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
        if let Some(why) = reason::node(reply, n) {
            out.push_str(&format!("  why: {why}\n"));
        }
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

/// A clean-up's time in the format `-N` stamps its output with (UTC).
fn cleanup_time(c: &PeerCleanUp) -> String {
    openimex_core::timefmt::nv_timestamp(Duration::from_millis(c.at_unix_ms))
}

/// Our `--peers -j` view: per peer the references held for it, imports from it, unimports owed
/// to it, and every clean-up kept (reason, time, counts).
pub fn peers_json(reply: &PeersReply) -> String {
    let peers: Vec<Value> = reply
        .peers
        .iter()
        .map(|p| {
            let cleanups: Vec<Value> = p
                .cleanups
                .iter()
                .map(|c| {
                    json!({
                        "reason": c.reason,
                        "time": cleanup_time(c),
                        "time_unix_ms": c.at_unix_ms,
                        "exports_released": c.exports_released,
                        "imports_dropped": c.imports_dropped,
                        "unimports_finished": c.unimports_finished,
                    })
                })
                .collect();
            let instance = (p.instance_id != 0).then(|| format!("{:016x}", p.instance_id));
            json!({
                "node": p.node_id,
                "host": p.host,
                "status": p.status,
                "instance_id": instance,
                "exports_held": p.exports_held,
                "imports": p.imports,
                "unimports_pending": p.unimports_pending,
                "cleanups_total": p.cleanups_total,
                "cleanups": cleanups,
            })
        })
        .collect();
    json!({"local_node": reply.local_node_id, "state": reply.state, "peers": peers}).to_string()
}

/// Our `--peers` text view: one row per peer, the last clean-up's reason and time at its end.
pub fn peers_text(reply: &PeersReply) -> String {
    let host_w = reply
        .peers
        .iter()
        .map(|p| p.host.len())
        .chain([4])
        .max()
        .unwrap_or(4);
    let mut out = format!(
        "Peers of node {} ({})\n\n",
        reply.local_node_id, reply.state
    );
    out.push_str(&format!(
        "{:<5} {:<host_w$} {:<17} {:>12} {:>7} {:>17} {:>9}  {}\n",
        "Node",
        "Host",
        "Status",
        "Exports held",
        "Imports",
        "Pending unimports",
        "Clean-ups",
        "Last clean-up"
    ));
    for p in &reply.peers {
        let last = p.cleanups.last().map_or_else(
            || "-".to_string(),
            |c| format!("{} ({})", c.reason, cleanup_time(c)),
        );
        out.push_str(&format!(
            "{:<5} {:<host_w$} {:<17} {:>12} {:>7} {:>17} {:>9}  {}\n",
            p.node_id,
            p.host,
            p.status,
            p.exports_held,
            p.imports,
            p.unimports_pending,
            p.cleanups_total,
            last
        ));
    }
    out
}
