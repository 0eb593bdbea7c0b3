//! `ctl -N --svg FILE`: the domain as a picture, one SVG document written by hand.
//!
//! A rack of trays, one per node in node order (node ID, nodes-file entry, the state word on a
//! badge coloured by what it means, version and host name, and why a node is not READY), a
//! link matrix beside it (row = from, column = to, one cell per link coloured by its status,
//! with the reason of its last change as a tooltip), and a legend. Counts of imports come from
//! the local daemon's `--peers` view, the only place the daemon reports them: the local tray
//! shows its totals and each peer's tray what the local node holds with that peer; the legend
//! says so. GPUs are not in the domain reply; the tray shows the version word (`NO_GPU` for a
//! node without GPUs). Every text is XML-escaped, so hostile host names cannot break the file.

use std::fmt::Write;
use std::path::Path;

use openimex_core::ConnStatus;
use openimex_proto::cmd::{DomainReply, NodeReport, PeerReport, PeersReply};

use crate::cells::row;
use crate::reason;
use crate::{Client, CtlError};

/// READY.
pub const GREEN: &str = "#2e7d32";
/// Starting or waiting (WAITING_FOR_PEERS, ...); links connecting or recovering.
pub const AMBER: &str = "#f0a000";
/// Down: UNAVAILABLE, SHUTTING_DOWN; links disconnected or refused for a mismatch.
pub const RED: &str = "#c62828";
/// Not configured, or a word this ctl does not know; links with no status (INVALID).
pub const GREY: &str = "#9e9e9e";

/// Above this many nodes the matrix is left out (a 1,000-node matrix is a million cells);
/// the trays are still drawn.
pub const MATRIX_MAX: usize = 128;

const MARGIN: usize = 20;
const TRAY_W: usize = 540;
const TRAY_H: usize = 60;
const TRAY_GAP: usize = 6;
const TOP: usize = 84;
const LEGEND_H: usize = 150;
/// Longest reason drawn in a tray; the whole one is in the tray's tooltip.
const REASON_CHARS: usize = 92;

/// `ctl -N --svg PATH`: asks the daemon and writes the picture to `path` (`-`: stdout).
pub async fn run(client: &mut Client, path: &Path) -> Result<(), CtlError> {
    // Without reasons first: one byte per cell. Reasons (the cells' tooltips, and a down
    // node's link reason) only where the matrix is drawn, so a large domain's picture never
    // asks for a reason per link; if that larger reply fails, the picture goes without.
    let mut reply = client.domain(false).await?;
    if reply.nodes.len() <= MATRIX_MAX
        && let Ok(with_reasons) = client.domain(true).await
    {
        reply = with_reasons;
    }
    // Counts of imports are only in the local daemon's peers view; a daemon without it still
    // gets a picture, whose legend says the counts are missing.
    let peers = client.peers().await.ok();
    let picture = render(&reply, peers.as_ref(), &crate::stamp());
    if path.as_os_str() == "-" {
        return crate::out(&picture);
    }
    std::fs::write(path, picture).map_err(|cause| CtlError::WriteFile {
        path: path.display().to_string(),
        cause,
    })
}

/// The colour of a daemon state word.
pub fn state_colour(state: &str) -> &'static str {
    match state {
        "READY" => GREEN,
        "INITIALIZING"
        | "STARTING_AUTH_SERVER"
        | "WAITING_FOR_PEERS"
        | "WAITING_FOR_RECOVERY"
        | "INIT_GPU" => AMBER,
        "UNAVAILABLE" | "SHUTTING_DOWN" => RED,
        _ => GREY,
    }
}

/// The colour of a link status.
pub fn link_colour(status: ConnStatus) -> &'static str {
    match status {
        ConnStatus::Connected => GREEN,
        ConnStatus::NeverConnected | ConnStatus::Recovering | ConnStatus::Authenticating => AMBER,
        ConnStatus::Disconnected | ConnStatus::Mismatch(_) => RED,
        ConnStatus::Invalid => GREY,
    }
}

/// A darker shade of a state colour, readable as text on the tray's light background.
fn text_colour(colour: &str) -> &'static str {
    match colour {
        GREEN => GREEN,
        AMBER => "#a05a00",
        RED => RED,
        _ => "#455a64",
    }
}

/// The colour of a domain status word.
fn domain_colour(status: &str) -> &'static str {
    match status {
        "UP" => GREEN,
        "DEGRADED" => AMBER,
        "DOWN" => RED,
        _ => GREY,
    }
}

/// `text` escaped for XML character data and attribute values. Characters XML 1.0 forbids
/// (controls other than tab, newline and carriage return) become U+FFFD.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// At most `n` characters of `text`, with `…` when cut.
fn clip(text: &str, n: usize) -> String {
    if text.chars().count() <= n {
        text.to_string()
    } else {
        let mut s: String = text.chars().take(n.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// The picture of `reply` as seen at `timestamp`, with import counts from `peers` (the local
/// daemon's `--peers` view) when it could be had.
pub fn render(reply: &DomainReply, peers: Option<&PeersReply>, timestamp: &str) -> String {
    let n = reply.nodes.len();
    let rack_h = n * (TRAY_H + TRAY_GAP);
    let matrix_x = MARGIN + TRAY_W + 50;
    let cell = match n {
        0..=16 => 22,
        17..=64 => 12,
        _ => 6,
    };
    let draw_matrix = n <= MATRIX_MAX;
    let matrix_w = if draw_matrix { 40 + n * cell } else { 360 };
    let matrix_h = if draw_matrix { 40 + n * cell } else { 20 };
    let width = (matrix_x + matrix_w + MARGIN).max(980);
    let body_h = rack_h.max(matrix_h) + 20;
    let height = TOP + body_h + LEGEND_H;

    let mut s = String::with_capacity(4096 + n * 900 + if draw_matrix { n * n * 120 } else { 0 });
    let _ = writeln!(s, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<title>IMEX domain {} as seen from node {} at {}</title>"#,
        escape(&reply.status),
        reply.local_node_id,
        escape(timestamp)
    );
    let _ = writeln!(
        s,
        r##"<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>"##
    );
    header(&mut s, reply, timestamp);
    let _ = writeln!(
        s,
        r##"<rect class="rack" x="{}" y="{}" width="{}" height="{}" rx="6" fill="#eceff1" stroke="#546e7a" stroke-width="2"/>"##,
        MARGIN - 8,
        TOP - 8,
        TRAY_W + 16,
        rack_h + 10
    );
    for (i, node) in reply.nodes.iter().enumerate() {
        tray(&mut s, reply, peers, node, TOP + i * (TRAY_H + TRAY_GAP));
    }
    if draw_matrix {
        matrix(&mut s, reply, matrix_x, TOP, cell);
    } else {
        let _ = writeln!(
            s,
            r#"<text x="{matrix_x}" y="{}">Link matrix left out: {n} nodes, more than {MATRIX_MAX}; see ctl -N or --links.</text>"#,
            TOP + 14
        );
    }
    legend(&mut s, reply, peers, TOP + body_h);
    s.push_str("</svg>\n");
    s
}

fn header(s: &mut String, reply: &DomainReply, timestamp: &str) {
    let _ = writeln!(
        s,
        r#"<text x="{MARGIN}" y="30" font-size="18" font-weight="bold">IMEX domain <tspan class="domain-status" fill="{}">{}</tspan> <tspan font-size="12" font-weight="normal">as seen from node {} at {}</tspan></text>"#,
        domain_colour(&reply.status),
        escape(&reply.status),
        reply.local_node_id,
        escape(timestamp)
    );
    if let Some(why) = reason::domain(reply) {
        let _ = writeln!(
            s,
            r#"<text class="domain-reason" x="{MARGIN}" y="52">Why: {}<title>{}</title></text>"#,
            escape(&clip(&why, 140)),
            escape(&why)
        );
    }
}

/// The counts the local daemon reports for `node`: its own totals for the local tray, what
/// it holds with the peer otherwise.
fn counts(reply: &DomainReply, peers: &PeersReply, node: &NodeReport) -> Option<String> {
    if node.node_id == peers.local_node_id {
        let sum = |f: fn(&PeerReport) -> u64| peers.peers.iter().map(f).sum::<u64>();
        return Some(format!(
            "imports {} · held for peers {} · unimports pending {}",
            sum(|p| p.imports),
            sum(|p| p.exports_held),
            sum(|p| p.unimports_pending)
        ));
    }
    let p = peers.peers.iter().find(|p| p.node_id == node.node_id)?;
    let local = reply.local_node_id;
    Some(format!(
        "node {local} imports {} from it, holds {}, owes {} unimports",
        p.imports, p.exports_held, p.unimports_pending
    ))
}

fn tray(
    s: &mut String,
    reply: &DomainReply,
    peers: Option<&PeersReply>,
    node: &NodeReport,
    y: usize,
) {
    let colour = state_colour(&node.state);
    let local = node.node_id == reply.local_node_id;
    let why = reason::node(reply, node);
    let tip = match &why {
        Some(w) => format!("node {} {}: {}", node.node_id, node.state, w),
        None => format!("node {} {}", node.node_id, node.state),
    };
    let _ = writeln!(
        s,
        r#"<g class="tray" data-node="{}" data-state="{}"><title>{}</title>"#,
        node.node_id,
        escape(&node.state),
        escape(&tip)
    );
    let (stroke, stroke_w) = if local {
        ("#263238", 2)
    } else {
        ("#90a4ae", 1)
    };
    let _ = writeln!(
        s,
        r##"<rect x="{MARGIN}" y="{y}" width="{TRAY_W}" height="{TRAY_H}" rx="3" fill="#fafafa" stroke="{stroke}" stroke-width="{stroke_w}"/>"##
    );
    let _ = writeln!(
        s,
        r#"<rect x="{MARGIN}" y="{y}" width="8" height="{TRAY_H}" fill="{colour}"/>"#
    );
    let mark = if local { " (this node)" } else { "" };
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-weight="bold">#{} <tspan font-weight="normal">{}{mark}</tspan></text>"#,
        MARGIN + 16,
        y + 19,
        node.node_id,
        escape(&clip(&node.host, 40))
    );
    let badge_x = MARGIN + TRAY_W - 176;
    let _ = writeln!(
        s,
        r##"<rect class="state" x="{badge_x}" y="{}" width="168" height="20" rx="4" fill="{colour}"/><text x="{}" y="{}" text-anchor="middle" fill="#ffffff" font-weight="bold" font-size="11">{}</text>"##,
        y + 5,
        badge_x + 84,
        y + 19,
        escape(&clip(&node.state, 24))
    );
    let mut line = Vec::new();
    if !node.version.is_empty() {
        line.push(format!("version {}", node.version));
    }
    if !node.host_name.is_empty() {
        line.push(node.host_name.clone());
    }
    if let Some(c) = peers.and_then(|p| counts(reply, p, node)) {
        line.push(c);
    }
    let _ = writeln!(
        s,
        r##"<text class="detail" x="{}" y="{}" font-size="10" fill="#37474f">{}</text>"##,
        MARGIN + 16,
        y + 36,
        escape(&clip(&line.join(" · "), REASON_CHARS))
    );
    if let Some(w) = &why {
        let _ = writeln!(
            s,
            r#"<text class="reason" x="{}" y="{}" font-size="10" fill="{}">{}</text>"#,
            MARGIN + 16,
            y + 51,
            text_colour(colour),
            escape(&clip(w, REASON_CHARS))
        );
    }
    s.push_str("</g>\n");
}

fn matrix(s: &mut String, reply: &DomainReply, x0: usize, y0: usize, cell: usize) {
    let n = reply.nodes.len();
    let (gx, gy) = (x0 + 40, y0 + 40);
    let _ = writeln!(
        s,
        r#"<g class="matrix"><text x="{x0}" y="{}" font-weight="bold">Links (row = from, column = to)</text>"#,
        y0 + 10
    );
    if cell >= 12 {
        let font = if cell >= 22 { 10 } else { 7 };
        for (i, node) in reply.nodes.iter().enumerate() {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle" font-size="{font}">{}</text><text x="{}" y="{}" text-anchor="end" font-size="{font}">{}</text>"#,
                gx + i * cell + cell / 2,
                gy - 6,
                node.node_id,
                gx - 6,
                gy + i * cell + cell / 2 + 4,
                node.node_id
            );
        }
    }
    for (i, from) in reply.nodes.iter().enumerate() {
        let cells = row(from, n);
        for (j, (status, _)) in cells.iter().enumerate() {
            let to = reply.nodes.get(j).map_or(j as u32, |t| t.node_id);
            let (_, why) = reason::link(reply, from, to);
            let tip = if why.is_empty() {
                format!("{} → {}: {}", from.node_id, to, status.as_str())
            } else {
                format!("{} → {}: {} ({why})", from.node_id, to, status.as_str())
            };
            let _ = writeln!(
                s,
                r##"<rect class="link" data-from="{}" data-to="{to}" data-status="{}" x="{}" y="{}" width="{}" height="{}" fill="{}" stroke="#ffffff"><title>{}</title></rect>"##,
                from.node_id,
                status.as_str(),
                gx + j * cell,
                gy + i * cell,
                cell,
                cell,
                link_colour(*status),
                escape(&tip)
            );
        }
    }
    s.push_str("</g>\n");
}

fn swatch(s: &mut String, x: usize, y: usize, colour: &str, label: &str) {
    let _ = writeln!(
        s,
        r#"<rect x="{x}" y="{}" width="12" height="12" fill="{colour}"/><text x="{}" y="{y}" font-size="11">{}</text>"#,
        y - 10,
        x + 16,
        escape(label)
    );
}

fn legend(s: &mut String, reply: &DomainReply, peers: Option<&PeersReply>, y: usize) {
    let _ = writeln!(s, r#"<g class="legend">"#);
    let _ = writeln!(
        s,
        r#"<text x="{MARGIN}" y="{}" font-weight="bold">Legend</text>"#,
        y + 4
    );
    let states = [
        (GREEN, "READY"),
        (AMBER, "starting or waiting (WAITING_FOR_PEERS, ...)"),
        (RED, "down (UNAVAILABLE, SHUTTING_DOWN)"),
        (GREY, "not configured, or unknown"),
    ];
    let links = [
        (GREEN, "link CONNECTED"),
        (AMBER, "NEVER_CONNECTED, RECOVERING, AUTHENTICATING"),
        (RED, "DISCONNECTED, or a mismatch"),
        (GREY, "INVALID (no status)"),
    ];
    for (k, (c, label)) in states.iter().enumerate() {
        swatch(s, MARGIN, y + 26 + k * 18, c, &format!("node: {label}"));
    }
    for (k, (c, label)) in links.iter().enumerate() {
        swatch(s, MARGIN + 420, y + 26 + k * 18, c, label);
    }
    let local = peers.map_or(reply.local_node_id, |p| p.local_node_id);
    let notes = match peers {
        Some(_) => [
            format!(
                "Counts are node {local}'s, from its --peers view: its own tray shows its totals,"
            ),
            format!(
                "each peer's tray what node {local} holds with that peer; other nodes' counts are \
                 not in the domain reply."
            ),
        ],
        None => [
            format!("Import counts not shown: node {local}'s daemon did not answer --peers."),
            String::new(),
        ],
    };
    let gpus =
        "GPUs are not in the domain reply: a tray shows the node's version word (NO_GPU: no GPUs).";
    let notes = notes.iter().map(String::as_str).chain([gpus]);
    for (k, note) in notes.filter(|n| !n.is_empty()).enumerate() {
        let _ = writeln!(
            s,
            r##"<text class="counts-note" x="{MARGIN}" y="{}" font-size="10" fill="#37474f">{}</text>"##,
            y + 106 + k * 14,
            escape(note)
        );
    }
    s.push_str("</g>\n");
}

#[cfg(test)]
#[path = "svg_tests.rs"]
mod tests;
