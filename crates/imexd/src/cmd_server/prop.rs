//! Property suite of the command service's pure parts (issue 10, item 6): the rows peers send
//! for `ctl -N` (any node count, any cells, any status words, old-style `connections` only)
//! are made exactly as wide as the node map, and the domain reply assembled from them has one
//! report per node, UNAVAILABLE for those that could not be asked, and a status that is UP only
//! when every node is READY with every link CONNECTED. `ctl -q` answers the state in effect.
//! Answering `ctl -N` needs the engine and live peers; the e2e tests cover that.
//!
//! Each property runs [`CASES`] cases; `PROPTEST_CASES=N` runs `N` instead.

use std::sync::Arc;

use openimex_core::{ConnStatus, DaemonState, DomainStatus, NodeId};
use openimex_proto::cmd::StateRequest;
use openimex_proto::cmd::command_server::Command as _;
use openimex_proto::peer::{ConnectionStatus, NodeStatus};
use proptest::prelude::*;
use tokio::sync::{mpsc, watch};

use super::{About, CommandService};
use crate::convert::row_cells;

/// Cases per property in CI.
const CASES: u32 = 8_000;

/// Status words as peers send them: known ones, other case, junk.
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => proptest::sample::select(ConnStatus::ALL.to_vec()).prop_map(|c| c.as_str().to_owned()),
        1 => Just("connected".to_owned()),
        1 => "[A-Z_]{0,12}",
    ]
}

fn state_word() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("READY".to_owned()),
        4 => proptest::sample::select(DaemonState::ALL.to_vec()).prop_map(|s| s.as_str().to_owned()),
        1 => "[A-Za-z_]{0,12}",
    ]
}

/// A peer's row: compact cells (of any width and any byte), or only `connections`.
fn row(node_id: u32) -> impl Strategy<Value = NodeStatus> {
    let connected = ConnStatus::Connected.cell(true);
    (
        state_word(),
        prop_oneof![
            3 => proptest::collection::vec(Just(connected), 0..9),
            2 => proptest::collection::vec(any::<u8>(), 0..9),
        ],
        proptest::collection::vec((0u32..10, word(), any::<bool>()), 0..9),
    )
        .prop_map(move |(state, cells, conns)| NodeStatus {
            node_id,
            state,
            cells,
            connections: conns
                .into_iter()
                .map(|(node_id, status, changed)| ConnectionStatus {
                    node_id,
                    status,
                    changed,
                    reason: String::new(),
                })
                .collect(),
            ..NodeStatus::default()
        })
}

fn service(n: usize, state: DaemonState) -> CommandService {
    let (engine, _) = mpsc::channel(1);
    let hosts: Vec<String> = (0..n).map(|i| format!("10.9.0.{}", i + 1)).collect();
    let (_, hosts) = watch::channel(Arc::new(hosts));
    let (_, state) = watch::channel(state);
    CommandService {
        engine,
        state,
        hosts,
        host_name: "host".to_owned(),
        about: Arc::new(About {
            config: (std::path::PathBuf::new(), Vec::new()),
            local: NodeId(0),
            bind: String::new(),
            network_interface: String::new(),
        }),
        resolver: crate::net::Resolver::System,
        jobs: None,
        listener: super::Listener::Unix,
    }
}

proptest! {
    #![proptest_config(crate::prop_budget::budget(CASES))]

    /// A peer's row, whatever its width and words, becomes exactly `n` cells: its own cells
    /// kept, missing ones INVALID; an old-style row's words land at their node IDs.
    #[test]
    fn rows_are_made_as_wide_as_the_map(n in 0usize..8, st in row(1)) {
        let mut got = st.clone();
        row_cells(&mut got, n);
        prop_assert_eq!(got.cells.len(), n);
        let invalid = ConnStatus::Invalid.cell(false);
        if !st.cells.is_empty() || st.connections.is_empty() {
            for (i, c) in got.cells.iter().enumerate() {
                prop_assert_eq!(*c, st.cells.get(i).copied().unwrap_or(invalid));
            }
        } else {
            for (i, c) in got.cells.iter().enumerate() {
                let last = st.connections.iter().rev().find(|c| {
                    c.node_id as usize == i && c.status.parse::<ConnStatus>().is_ok()
                });
                let want = last.map_or(invalid, |c| {
                    c.status.parse::<ConnStatus>().map_or(invalid, |s| s.cell(c.changed))
                });
                prop_assert_eq!(*c, want, "cell {}", i);
            }
        }
    }

    /// The domain reply from any rows: one report per node, the unasked ones UNAVAILABLE and
    /// unreachable, and UP only if every node is READY with only CONNECTED cells.
    #[test]
    fn the_domain_reply_reports_every_node(
        rows in (1usize..7).prop_flat_map(|n| {
            (0..n)
                .map(|i| proptest::option::weighted(0.8, row(i as u32)))
                .collect::<Vec<_>>()
        }),
    ) {
        let n = rows.len();
        let svc = service(n, DaemonState::Ready);
        let rows: Vec<Option<NodeStatus>> = rows
            .into_iter()
            .map(|r| r.map(|mut st| { row_cells(&mut st, n); st }))
            .collect();
        let reply = svc.assemble(NodeId(0), rows.clone());
        prop_assert_eq!(reply.nodes.len(), n);
        for (i, (r, rep)) in rows.iter().zip(&reply.nodes).enumerate() {
            prop_assert_eq!(rep.node_id as usize, i);
            prop_assert_eq!(&rep.host, &format!("10.9.0.{}", i + 1));
            match r {
                Some(st) => {
                    prop_assert!(rep.reachable);
                    prop_assert_eq!(&rep.state, &st.state);
                    prop_assert_eq!(rep.cells.len(), n);
                }
                None => {
                    prop_assert!(!rep.reachable);
                    prop_assert_eq!(rep.state.as_str(), "UNAVAILABLE");
                    prop_assert!(rep.cells.is_empty());
                }
            }
        }
        let all_up = rows.iter().all(|r| r.as_ref().is_some_and(|st| {
            st.state == "READY"
                && st.cells.iter().all(|c| ConnStatus::from_cell(*c).0 == ConnStatus::Connected)
        }));
        let local_ready = rows[0].as_ref().is_some_and(|st| st.state == "READY");
        let status = reply.status.as_str();
        prop_assert!(
            ["UP", "DEGRADED", "DOWN"].contains(&status),
            "status {status}"
        );
        prop_assert_eq!(status == DomainStatus::Up.as_str(), all_up && local_ready, "{:?}", reply);
        if !local_ready {
            prop_assert_eq!(status, DomainStatus::Down.as_str());
        }
    }
}

/// `ctl -q` answers the state in effect, whatever it is.
#[test]
fn the_state_request_answers_the_state_in_effect() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    for state in DaemonState::ALL {
        let svc = service(3, state);
        let reply = rt.block_on(svc.state(tonic::Request::new(StateRequest {})));
        let reply = reply.unwrap_or_else(|e| panic!("{state}: {e}"));
        assert_eq!(reply.into_inner().state, state.as_str());
    }
}
