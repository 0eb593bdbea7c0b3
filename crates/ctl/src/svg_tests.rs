//! The picture is well-formed XML, has one tray per node and the right colours.

use super::*;
use openimex_proto::peer::ConnectionStatus;

fn report(id: u32, host: &str, state: &str, cells: &[ConnStatus]) -> NodeReport {
    NodeReport {
        node_id: id,
        host: host.into(),
        state: state.into(),
        version: if state == "UNAVAILABLE" { "" } else { "NO_GPU" }.into(),
        host_name: format!("tray-{id}"),
        reachable: state != "UNAVAILABLE",
        cells: cells.iter().map(|c| c.cell(true)).collect(),
        ..Default::default()
    }
}

/// A degraded four-node domain: READY, UNAVAILABLE, WAITING_FOR_PEERS, and a state word the
/// daemon may add (NOT_CONFIGURED), with a host name that needs escaping.
fn degraded() -> DomainReply {
    use ConnStatus::{Connected as C, Disconnected as D, Invalid as I, Recovering as R};
    let mut me = report(0, "10.0.0.1", "READY", &[C, R, C, C]);
    me.connections = vec![ConnectionStatus {
        node_id: 1,
        status: "RECOVERING".into(),
        changed: true,
        reason: "peer <lost> & \"gone\"".into(),
    }];
    DomainReply {
        local_node_id: 0,
        nodes: vec![
            me,
            report(1, "a<b>&'\"\u{1}.example", "UNAVAILABLE", &[]),
            report(2, "10.0.0.3", "WAITING_FOR_PEERS", &[C, I, C, D]),
            report(3, "10.0.0.4", "NOT_CONFIGURED", &[C, I, D, C]),
        ],
        status: "DEGRADED".into(),
    }
}

fn peers() -> PeersReply {
    PeersReply {
        local_node_id: 0,
        state: "READY".into(),
        peers: vec![
            PeerReport {
                node_id: 2,
                host: "10.0.0.3".into(),
                status: "CONNECTED".into(),
                imports: 3,
                exports_held: 2,
                unimports_pending: 1,
                ..Default::default()
            },
            PeerReport {
                node_id: 3,
                host: "10.0.0.4".into(),
                status: "CONNECTED".into(),
                imports: 4,
                ..Default::default()
            },
        ],
    }
}

fn parse(svg: &str) -> roxmltree::Document<'_> {
    roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("not well-formed: {e}\n{svg}"))
}

fn class<'a, 'i>(
    doc: &'a roxmltree::Document<'i>,
    class: &'a str,
) -> impl Iterator<Item = roxmltree::Node<'a, 'i>> + 'a {
    doc.descendants()
        .filter(move |n| n.attribute("class") == Some(class))
}

#[test]
fn the_picture_is_well_formed_with_one_tray_per_node_in_order() {
    let svg = render(&degraded(), Some(&peers()), "12/3/2026 10:00:00.000");
    let doc = parse(&svg);
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let trays: Vec<_> = class(&doc, "tray")
        .map(|t| t.attribute("data-node").unwrap_or_default().to_string())
        .collect();
    assert_eq!(trays, ["0", "1", "2", "3"], "one tray per node, rack order");
    assert_eq!(class(&doc, "link").count(), 16, "a 4×4 matrix");
    let text: String = doc
        .descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect();
    // Escaped on the way out, so the parsed text is the host as configured (the control
    // character replaced).
    assert!(text.contains("a<b>&'\"\u{fffd}.example"), "{text}");
    assert!(
        text.contains("peer <lost> & \"gone\""),
        "link reason as tooltip"
    );
    assert!(
        text.contains("imports 7"),
        "local totals from --peers: {text}"
    );
    assert!(
        text.contains("node 0 imports 3 from it, holds 2, owes 1 unimports"),
        "{text}"
    );
    assert!(
        text.contains("--peers view"),
        "the legend says what counts are"
    );
    assert!(text.contains("Why: node 1 UNAVAILABLE"), "{text}");
}

#[test]
fn states_and_links_have_their_colours() {
    let svg = render(&degraded(), None, "t");
    let doc = parse(&svg);
    let badge = |node: &str| {
        class(&doc, "tray")
            .find(|t| t.attribute("data-node") == Some(node))
            .and_then(|t| {
                t.descendants()
                    .find(|n| n.attribute("class") == Some("state"))
            })
            .and_then(|b| b.attribute("fill"))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(badge("0"), GREEN, "READY");
    assert_eq!(badge("1"), RED, "UNAVAILABLE");
    assert_eq!(badge("2"), AMBER, "waiting");
    assert_eq!(badge("3"), GREY, "not configured");
    let cell = |from: &str, to: &str| {
        class(&doc, "link")
            .find(|c| c.attribute("data-from") == Some(from) && c.attribute("data-to") == Some(to))
            .and_then(|c| c.attribute("fill"))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(cell("0", "2"), GREEN, "CONNECTED");
    assert_eq!(cell("0", "1"), AMBER, "RECOVERING");
    assert_eq!(cell("2", "3"), RED, "DISCONNECTED");
    assert_eq!(cell("1", "0"), GREY, "an unasked node's row is INVALID");
    let text: String = doc.descendants().filter_map(|n| n.text()).collect();
    assert!(text.contains("did not answer --peers"), "{text}");
}

#[test]
fn a_large_domain_leaves_the_matrix_out_but_draws_every_tray() {
    let nodes = (0..200)
        .map(|i| {
            report(
                i,
                &format!("10.1.{}.{}", i / 250, i % 250 + 1),
                "READY",
                &[],
            )
        })
        .collect();
    let reply = DomainReply {
        local_node_id: 0,
        nodes,
        status: "UP".into(),
    };
    let svg = render(&reply, None, "t");
    let doc = parse(&svg);
    assert_eq!(class(&doc, "tray").count(), 200);
    assert_eq!(class(&doc, "link").count(), 0);
    assert!(svg.contains("Link matrix left out: 200 nodes"));
}

#[test]
fn escape_covers_markup_and_forbidden_characters() {
    assert_eq!(escape("a&b<c>\"'"), "a&amp;b&lt;c&gt;&quot;&apos;");
    assert_eq!(escape("x\u{0}y\u{1b}z"), "x\u{fffd}y\u{fffd}z");
    assert_eq!(escape("tab\tok"), "tab\tok");
}
