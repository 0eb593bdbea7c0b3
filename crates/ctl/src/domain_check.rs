//! `ctl domain-check HOST...`: are these hosts READY members of this daemon's domain?
//!
//! One Domain call to the local daemon (with link reasons) answers it for every host. A host
//! is matched to a node-file entry as written, or else by address: the host and the entries
//! that are names are resolved with the system resolver (`ToSocketAddrs`, so `/etc/hosts` and
//! DNS as the daemon itself resolves them) and an entry sharing an address with the host is
//! its node. A host passes when its node is READY and, unless it is the node asked, the link
//! from the node asked to it is CONNECTED. Exit 0 iff every host passes; otherwise one line
//! per host says why not: not a member, member but state X, or unreachable.

use std::collections::HashMap;
use std::net::{IpAddr, ToSocketAddrs};

use openimex_core::ConnStatus;
use openimex_proto::cmd::{DomainReply, NodeReport};
use serde_json::{Value, json};

use crate::{Client, CtlError, reason};

/// What was found for one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A READY member, its link from the node asked CONNECTED (or it is that node).
    Ready,
    /// No node-file entry is the host or shares an address with it.
    NotMember,
    /// A member whose daemon answered with a state other than READY.
    NotReady,
    /// A member that could not be asked, or whose link from the node asked is not CONNECTED.
    Unreachable,
}

impl Verdict {
    /// The JSON word.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::NotMember => "not_member",
            Self::NotReady => "not_ready",
            Self::Unreachable => "unreachable",
        }
    }
}

/// The answer for one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCheck {
    /// The host as given.
    pub host: String,
    /// Its node, when it is a member.
    pub node: Option<u32>,
    /// Its node-file entry, when it is a member.
    pub entry: Option<String>,
    /// Its node's state word, when it is a member.
    pub state: Option<String>,
    /// The link from the node asked to it (`None` for the node asked itself, or a non-member).
    pub link: Option<ConnStatus>,
    /// The reason of that link's last change, when the daemon gave one.
    pub link_reason: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Why it is not a READY member; `None` when it is.
    pub why: Option<String>,
}

/// `ctl domain-check [-j] HOST...`: prints the answer; `Err(NotAllReady)` (exit 1) unless
/// every host is a READY member.
pub async fn run(client: &mut Client, hosts: &[String], json_out: bool) -> Result<(), CtlError> {
    // Without reasons first (one byte per cell); only when a host fails is the domain asked
    // again with each link's reason, to say why. If that larger reply fails, the first stands.
    let mut reply = client.domain(false).await?;
    let mut checks = check(&reply, hosts, &resolve);
    if !all_ready(&checks)
        && let Ok(with_reasons) = client.domain(true).await
    {
        checks = check(&with_reasons, hosts, &resolve);
        reply = with_reasons;
    }
    if json_out {
        crate::out(&(json(&reply, &checks) + "\n"))?;
    } else {
        crate::out(&text(&reply, &checks))?;
    }
    let failed = checks
        .iter()
        .filter(|c| c.verdict != Verdict::Ready)
        .count();
    if failed == 0 {
        return Ok(());
    }
    Err(CtlError::NotAllReady {
        failed,
        total: checks.len(),
        local: reply.local_node_id,
    })
}

/// Resolves `host` (a name or an address) to its addresses with the system resolver.
pub fn resolve(host: &str) -> Result<Vec<IpAddr>, String> {
    if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    (host, 0)
        .to_socket_addrs()
        .map(|addrs| addrs.map(|a| a.ip()).collect())
        .map_err(|e| e.to_string())
}

/// The node of `host` in `reply`: an entry equal to it, else one sharing an address.
/// `Err` carries why it matched none, for the operator.
fn find<'a>(
    reply: &'a DomainReply,
    host: &str,
    resolver: &dyn Fn(&str) -> Result<Vec<IpAddr>, String>,
    cache: &mut HashMap<String, Vec<IpAddr>>,
) -> Result<&'a NodeReport, String> {
    let wanted = host.trim();
    if let Some(n) = reply
        .nodes
        .iter()
        .find(|n| n.host.trim().eq_ignore_ascii_case(wanted))
    {
        return Ok(n);
    }
    let ips = resolver(wanted).map_err(|e| {
        format!(
            "it is no node-file entry of node {}, and it does not resolve ({e})",
            reply.local_node_id
        )
    })?;
    for n in &reply.nodes {
        let entry = n.host.trim().to_string();
        let theirs = cache
            .entry(entry.clone())
            .or_insert_with(|| resolver(&entry).unwrap_or_default());
        if theirs.iter().any(|ip| ips.contains(ip)) {
            return Ok(n);
        }
    }
    let shown: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
    Err(format!(
        "neither it nor its address{} {} is among the {} entries of node {}'s node file",
        if shown.len() == 1 { "" } else { "es" },
        shown.join(", "),
        reply.nodes.len(),
        reply.local_node_id
    ))
}

/// Checks every host of `hosts` against `reply` (from the local daemon, with reasons),
/// resolving names with `resolver` ([`resolve`] outside tests).
pub fn check(
    reply: &DomainReply,
    hosts: &[String],
    resolver: &dyn Fn(&str) -> Result<Vec<IpAddr>, String>,
) -> Vec<HostCheck> {
    let mut cache = HashMap::new();
    let me = reason::local(reply);
    let asker = reply.local_node_id;
    hosts
        .iter()
        .map(|host| {
            let node = match find(reply, host, resolver, &mut cache) {
                Ok(n) => n,
                Err(why) => {
                    return HostCheck {
                        host: host.clone(),
                        node: None,
                        entry: None,
                        state: None,
                        link: None,
                        link_reason: String::new(),
                        verdict: Verdict::NotMember,
                        why: Some(format!("not a member: {why}")),
                    };
                }
            };
            let (link, link_reason) = match me {
                Some(me) if me.node_id != node.node_id => {
                    let (s, r) = reason::link(reply, me, node.node_id);
                    (Some(s), r)
                }
                _ => (None, String::new()),
            };
            let link_up = link.is_none_or(|s| s == ConnStatus::Connected);
            let node_why = reason::node(reply, node);
            let (verdict, why) = if !node.reachable {
                let why = node_why.unwrap_or_else(|| "could not be asked".to_string());
                (Verdict::Unreachable, Some(format!("unreachable: {why}")))
            } else if node.state != "READY" {
                let why = node_why.unwrap_or_default();
                let why = format!("member but state {}: {why}", node.state);
                (Verdict::NotReady, Some(why))
            } else if !link_up {
                let status = link.map_or("INVALID", ConnStatus::as_str);
                let why = if link_reason.is_empty() {
                    format!("unreachable: READY, but its link from node {asker} is {status}")
                } else {
                    format!(
                        "unreachable: READY, but its link from node {asker} is {status} ({link_reason})"
                    )
                };
                (Verdict::Unreachable, Some(why))
            } else {
                (Verdict::Ready, None)
            };
            HostCheck {
                host: host.clone(),
                node: Some(node.node_id),
                entry: Some(node.host.clone()),
                state: Some(node.state.clone()),
                link,
                link_reason,
                verdict,
                why,
            }
        })
        .collect()
}

/// Whether every host passed.
pub fn all_ready(checks: &[HostCheck]) -> bool {
    checks.iter().all(|c| c.verdict == Verdict::Ready)
}

/// One line per host, then a summary line.
pub fn text(reply: &DomainReply, checks: &[HostCheck]) -> String {
    let asker = reply.local_node_id;
    let mut out = String::new();
    for c in checks {
        let node = match (c.node, &c.entry) {
            (Some(id), Some(entry)) if *entry == c.host => format!("node {id}"),
            (Some(id), Some(entry)) => format!("node {id} ({entry})"),
            _ => String::new(),
        };
        let line = match (&c.why, c.link) {
            (Some(why), _) if node.is_empty() => format!("{}: {why}\n", c.host),
            (Some(why), _) => format!("{}: {node}: {why}\n", c.host),
            (None, Some(link)) => format!(
                "{}: READY member, {node}, link from node {asker} {}\n",
                c.host,
                link.as_str()
            ),
            (None, None) => format!("{}: READY member, {node}, the node asked\n", c.host),
        };
        out.push_str(&line);
    }
    let ok = checks
        .iter()
        .filter(|c| c.verdict == Verdict::Ready)
        .count();
    out.push_str(&format!(
        "{ok} of {} host(s) are READY members of node {asker}'s domain (Domain State: {})\n",
        checks.len(),
        reply.status
    ));
    out
}

/// The JSON document: the node asked, the domain status, `all_ready`, and per host its node,
/// state, link, verdict and reason.
pub fn json(reply: &DomainReply, checks: &[HostCheck]) -> String {
    let hosts: Vec<Value> = checks
        .iter()
        .map(|c| {
            json!({
                "host": c.host,
                "member": c.node.is_some(),
                "node": c.node,
                "entry": c.entry,
                "state": c.state,
                "link": c.link.map(ConnStatus::as_str),
                "link_reason": (!c.link_reason.is_empty()).then_some(&c.link_reason),
                "verdict": c.verdict.as_str(),
                "ready": c.verdict == Verdict::Ready,
                "reason": c.why,
            })
        })
        .collect();
    json!({
        "local_node": reply.local_node_id,
        "domain_status": reply.status,
        "all_ready": all_ready(checks),
        "hosts": hosts,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(id: u32, host: &str, state: &str, cells: &[ConnStatus]) -> NodeReport {
        NodeReport {
            node_id: id,
            host: host.into(),
            state: state.into(),
            reachable: state != "UNAVAILABLE",
            cells: cells.iter().map(|c| c.cell(true)).collect(),
            ..Default::default()
        }
    }

    fn reply() -> DomainReply {
        use ConnStatus::{Connected as C, Recovering as R};
        DomainReply {
            local_node_id: 0,
            nodes: vec![
                report(0, "10.0.0.1", "READY", &[C, C, R, C]),
                report(1, "gpu-b", "READY", &[C, C, C, C]),
                report(2, "10.0.0.3", "UNAVAILABLE", &[]),
                report(3, "10.0.0.4", "WAITING_FOR_PEERS", &[C, C, R, C]),
            ],
            status: "DEGRADED".into(),
        }
    }

    fn fake(host: &str) -> Result<Vec<IpAddr>, String> {
        match host {
            "gpu-b" | "gpu-b.example" => Ok(vec!["10.0.0.2".parse().map_err(|_| "ip")?]),
            "gpu-a" => Ok(vec!["10.0.0.1".parse().map_err(|_| "ip")?]),
            h => resolve(h).and_then(|v| {
                if v.is_empty() {
                    Err("no address".into())
                } else {
                    Ok(v)
                }
            }),
        }
    }

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn members_by_entry_and_by_address() {
        let r = reply();
        let got = check(
            &r,
            &hosts(&["10.0.0.1", "gpu-b", "gpu-b.example", "10.0.0.2", "gpu-a"]),
            &fake,
        );
        let nodes: Vec<_> = got.iter().map(|c| c.node).collect();
        assert_eq!(nodes, [Some(0), Some(1), Some(1), Some(1), Some(0)]);
        assert!(all_ready(&got), "{got:?}");
        let t = text(&r, &got);
        assert!(
            t.contains("10.0.0.1: READY member, node 0, the node asked"),
            "{t}"
        );
        assert!(
            t.contains("gpu-b.example: READY member, node 1 (gpu-b), link from node 0 CONNECTED"),
            "{t}"
        );
        assert!(t.contains("5 of 5 host(s)"), "{t}");
    }

    #[test]
    fn each_failure_names_its_reason() {
        let r = reply();
        let got = check(
            &r,
            &hosts(&["10.9.9.9", "10.0.0.3", "10.0.0.4", "no.such.host.invalid"]),
            &fake,
        );
        let verdicts: Vec<_> = got.iter().map(|c| c.verdict.clone()).collect();
        assert_eq!(
            verdicts,
            [
                Verdict::NotMember,
                Verdict::Unreachable,
                Verdict::NotReady,
                Verdict::NotMember
            ]
        );
        assert!(!all_ready(&got));
        let t = text(&r, &got);
        assert!(
            t.contains("10.9.9.9: not a member: neither it nor its address 10.9.9.9"),
            "{t}"
        );
        assert!(
            t.contains("10.0.0.3: node 2: unreachable: could not be asked"),
            "{t}"
        );
        assert!(
            t.contains("RECOVERING"),
            "the link from the node asked: {t}"
        );
        assert!(
            t.contains("10.0.0.4: node 3: member but state WAITING_FOR_PEERS"),
            "{t}"
        );
        assert!(t.contains("no.such.host.invalid: not a member: it is no node-file entry of node 0, and it does not resolve"), "{t}");
        assert!(t.contains("0 of 4 host(s)"), "{t}");
        let v: Value = serde_json::from_str(&json(&r, &got)).expect("JSON");
        assert_eq!(v["all_ready"], false);
        assert_eq!(v["hosts"][0]["verdict"], "not_member");
        assert_eq!(v["hosts"][0]["member"], false);
        assert_eq!(v["hosts"][2]["state"], "WAITING_FOR_PEERS");
        assert_eq!(v["hosts"][1]["link"], "RECOVERING");
        assert_eq!(v["hosts"][2]["link"], "CONNECTED");
    }

    #[test]
    fn a_ready_member_behind_a_broken_link_is_unreachable() {
        let mut r = reply();
        r.nodes[3].state = "READY".into();
        r.nodes[0].cells[3] = ConnStatus::Disconnected.cell(true);
        let got = check(&r, &hosts(&["10.0.0.4"]), &fake);
        assert_eq!(got[0].verdict, Verdict::Unreachable);
        let t = text(&r, &got);
        assert!(
            t.contains(
                "10.0.0.4: node 3: unreachable: READY, but its link from node 0 is DISCONNECTED"
            ),
            "{t}"
        );
    }
}
