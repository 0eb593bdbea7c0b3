//! Golden tests of what `ctl` prints, against NVIDIA's published outputs
//! (`testdata/nvidia-*`, `testdata/ctl-N-j.*` copied from the reference samples) and against our
//! own recorded outputs (`testdata/golden-*`; rewrite with `UPDATE_GOLDEN=1`).

use std::path::PathBuf;

use openimex_core::ConnStatus;
use openimex_ctl::render;
use openimex_proto::cmd::{DomainReply, NodeReport, PeerCleanUp, PeerReport, PeersReply};
use openimex_proto::peer::{ConnectionStatus, LinkCode, RefusalCount};
use serde_json::Value;

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(testdata(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Compares with a recorded golden file, or records it when UPDATE_GOLDEN is set.
fn golden(name: &str, got: &str) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(testdata(name), got).unwrap();
        return;
    }
    let want = read(name);
    assert!(
        want == got,
        "{name} differs\n--- want\n{want}\n--- got\n{got}"
    );
}

fn node(id: u32, host: &str, state: &str, version: &str, cells: &[(&str, bool)]) -> NodeReport {
    let reachable = state != "UNAVAILABLE";
    NodeReport {
        node_id: id,
        host: host.into(),
        state: state.into(),
        version: version.into(),
        host_name: if reachable {
            format!("tray-{id}")
        } else {
            String::new()
        },
        reachable,
        instance_id: if reachable {
            0x1234_5678_9abc_def0 + u64::from(id)
        } else {
            0
        },
        connections: cells
            .iter()
            .enumerate()
            .map(|(j, (s, changed))| ConnectionStatus {
                node_id: u32::try_from(j).unwrap(),
                status: (*s).into(),
                changed: *changed,
                reason: format!("reason {id}->{j}"),
            })
            .collect(),
        refusals: Vec::new(),
        cells: Vec::new(),
        state_reason: String::new(),
        gpus: Vec::new(),
    }
}

/// The same reply as today's daemons send it for `-N`: one byte per cell, no reasons, and
/// no row at all for a node that could not be asked.
fn compact(reply: &DomainReply) -> DomainReply {
    let mut reply = reply.clone();
    for n in &mut reply.nodes {
        n.cells = if n.reachable {
            n.connections
                .iter()
                .map(|c| c.status.parse::<ConnStatus>().unwrap().cell(c.changed))
                .collect()
        } else {
            Vec::new()
        };
        n.connections.clear();
    }
    reply
}

fn two_healthy(hosts: [&str; 2], version: &str) -> DomainReply {
    DomainReply {
        local_node_id: 0,
        nodes: vec![
            node(
                0,
                hosts[0],
                "READY",
                version,
                &[("CONNECTED", true), ("CONNECTED", true)],
            ),
            node(
                1,
                hosts[1],
                "READY",
                version,
                &[("CONNECTED", true), ("CONNECTED", true)],
            ),
        ],
        status: "UP".into(),
    }
}

/// Sorts object keys so two documents compare regardless of key order.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let sorted: std::collections::BTreeMap<_, _> =
                m.iter().map(|(k, v)| (k.clone(), canonical(v))).collect();
            Value::Object(sorted.into_iter().collect())
        }
        other => other.clone(),
    }
}

fn strip_host_name(v: &mut Value) {
    if let Some(nodes) = v.get_mut("nodes").and_then(Value::as_object_mut) {
        for n in nodes.values_mut() {
            n.as_object_mut().unwrap().remove("hostName");
        }
    }
}

/// Removes our `reason` keys (the domain's and each node's), returning how many there were:
/// what is left must be NVIDIA's document.
fn strip_reasons(v: &mut Value) -> usize {
    let mut n = usize::from(v.as_object_mut().unwrap().remove("reason").is_some());
    if let Some(nodes) = v.get_mut("nodes").and_then(Value::as_object_mut) {
        for node in nodes.values_mut() {
            n += usize::from(node.as_object_mut().unwrap().remove("reason").is_some());
        }
    }
    n
}

#[test]
fn table_matches_nvidia_570_byte_for_byte() {
    let reply = two_healthy(["172.31.48.81", "172.31.48.98"], "570.172");
    let got = render::table(&reply, "5/12/2025 06:08:10.580", false);
    assert_eq!(
        render::table(&compact(&reply), "5/12/2025 06:08:10.580", false),
        got
    );
    let want = read("nvidia-N.570.172.txt");
    // 570 did not mark the local node; 580 wraps its address in `*`. Every other line is NVIDIA's.
    let local = "Node #0   * 172.31.48.81 *  - READY                - Version: 570.172";
    let got_570 = got.replace(
        local,
        "Node #0   - 172.31.48.81    - READY                - Version: 570.172",
    );
    assert!(got.contains(local), "{got}");
    assert_eq!(got_570, want);
}

#[test]
fn json_matches_nvidia_samples() {
    let reply = two_healthy(["192.168.103.159", "192.168.107.187"], "570.172.08");
    let got = render::json(&reply, "8/8/2025 17:38:02.641", false);
    assert_eq!(
        render::json(&compact(&reply), "8/8/2025 17:38:02.641", false),
        got
    );
    assert!(!got.contains('\n'), "one line, like live output");
    let mut ours: Value = serde_json::from_str(&got).unwrap();
    strip_host_name(&mut ours);
    assert_eq!(
        strip_reasons(&mut ours),
        0,
        "a healthy domain has no reasons"
    );
    let nvidia: Value = serde_json::from_str(&read("ctl-N-j.570.172.healthy.json")).unwrap();
    assert_eq!(canonical(&ours), canonical(&nvidia));

    let down = DomainReply {
        local_node_id: 0,
        nodes: vec![node(0, "0.0.0.0", "UNAVAILABLE", "", &[("INVALID", false)])],
        status: "DOWN".into(),
    };
    let mut ours: Value =
        serde_json::from_str(&render::json(&down, "8/11/2025 20:08:55.625", false)).unwrap();
    strip_host_name(&mut ours);
    // Ours on top of NVIDIA's: why the domain is DOWN and why node 0 is UNAVAILABLE.
    assert_eq!(strip_reasons(&mut ours), 2);
    let nvidia: Value = serde_json::from_str(&read("ctl-N-j.570.172.unconfigured.json")).unwrap();
    assert_eq!(canonical(&ours), canonical(&nvidia));
}

#[test]
fn json_key_order_is_the_compatibility_contract() {
    let reply = two_healthy(["10.0.0.1", "10.0.0.2"], "NO_GPU");
    let got = render::json(&reply, "1/2/2026 03:04:05.006", true);
    // Top level: nodes, then timestamp, then status; DCGM takes the last `"status":`.
    let nodes_at = got.find("\"nodes\":").unwrap();
    let ts_at = got.find("\"timestamp\":").unwrap();
    let status_at = got.rfind("\"status\":").unwrap();
    assert!(nodes_at < ts_at && ts_at < status_at);
    assert_eq!(&got[status_at..], "\"status\":\"UP\"}");
    // Per node: status, host, connections, changed, version, hostName.
    let v: Value = serde_json::from_str(&got).unwrap();
    let keys: Vec<_> = v["nodes"]["0"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        keys,
        [
            "status",
            "host",
            "connections",
            "changed",
            "version",
            "hostName"
        ]
    );
    assert_eq!(v["nodes"]["1"]["hostName"], "tray-1");
}

#[test]
fn degraded_domain_goldens() {
    let reply = DomainReply {
        local_node_id: 1,
        nodes: vec![
            node(
                0,
                "10.1.0.1",
                "READY",
                "NO_GPU",
                &[
                    ("CONNECTED", true),
                    ("CONNECTED", true),
                    ("RECOVERING", true),
                ],
            ),
            node(
                1,
                "10.1.0.2",
                "READY",
                "NO_GPU",
                &[
                    ("CONNECTED", true),
                    ("CONNECTED", true),
                    ("NODE_MAP_MISMATCH", true),
                ],
            ),
            node(
                2,
                "10.1.0.3",
                "UNAVAILABLE",
                "",
                &[("INVALID", false), ("INVALID", false), ("INVALID", false)],
            ),
        ],
        status: "DEGRADED".into(),
    };
    let ts = "12/2/2026 09:00:00.000";
    // Today's daemons answer `-N` with compact cells and no link reasons.
    let today = compact(&reply);
    golden("golden-N-degraded.txt", &render::table(&today, ts, false));
    golden("golden-N-H-degraded.txt", &render::table(&today, ts, true));
    golden(
        "golden-N-j-degraded.json",
        &(render::json(&today, ts, false) + "\n"),
    );
    // Replies with status words per link (daemons before compact rows) print the same table;
    // only our `Why` lines may say more (those replies carry each link's reason).
    let nvidia_part = |t: String| t[..t.find("Why:").unwrap_or(t.len())].to_string();
    for hostnames in [false, true] {
        assert_eq!(
            nvidia_part(render::table(&reply, ts, hostnames)),
            nvidia_part(render::table(&today, ts, hostnames))
        );
    }
    golden(
        "golden-links-degraded.json",
        &(render::links_json(&reply) + "\n"),
    );
    golden("golden-links-degraded.txt", &render::links_text(&reply));
}

#[test]
fn links_view_counts_refused_peer_messages() {
    let mut reply = two_healthy(["10.1.0.1", "10.1.0.2"], "sim");
    reply.nodes[1].refusals = vec![
        RefusalCount {
            reason: "hello: wrong source address".into(),
            count: 3,
        },
        RefusalCount {
            reason: "unimport: no session".into(),
            count: 1,
        },
    ];
    let v: Value = serde_json::from_str(&render::links_json(&reply)).unwrap();
    assert!(
        v["nodes"][0].get("refused").is_none(),
        "none refused: no key"
    );
    assert_eq!(v["nodes"][1]["refused"]["hello: wrong source address"], 3);
    assert_eq!(v["nodes"][1]["refused"]["unimport: no session"], 1);
    let text = render::links_text(&reply);
    assert!(
        text.contains("refused        3  hello: wrong source address"),
        "{text}"
    );
}

#[test]
fn cell_codes_are_the_wire_contract() {
    // peer.proto's LinkCode and core's ConnStatus::code must agree, word for word.
    for c in ConnStatus::ALL {
        let name = format!("LINK_{}", c.as_str());
        let wire = LinkCode::from_str_name(&name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(wire as i32, i32::from(c.code()), "{name}");
    }
    assert_eq!(
        LinkCode::LinkChangedBit as i32,
        i32::from(ConnStatus::CHANGED_BIT)
    );
}

#[test]
fn a_thousand_node_domain_renders_every_cell() {
    let n = 1000;
    let hosts: Vec<String> = (0..n)
        .map(|i| format!("10.0.{}.{}", i / 250, i % 250 + 1))
        .collect();
    let nodes = (0..n)
        .map(|i| {
            let reachable = i < 2;
            NodeReport {
                node_id: u32::try_from(i).unwrap(),
                host: hosts[i].clone(),
                state: if reachable { "READY" } else { "UNAVAILABLE" }.into(),
                version: if reachable { "NO_GPU" } else { "" }.into(),
                reachable,
                cells: if reachable {
                    (0..n)
                        .map(|j| {
                            let s = if j < 2 {
                                ConnStatus::Connected
                            } else {
                                ConnStatus::NeverConnected
                            };
                            s.cell(j < 2)
                        })
                        .collect()
                } else {
                    Vec::new()
                },
                ..Default::default()
            }
        })
        .collect();
    let reply = DomainReply {
        local_node_id: 1,
        nodes,
        status: "DEGRADED".into(),
    };
    let text = render::json(&reply, "1/2/2026 03:04:05.006", false);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["nodes"].as_object().unwrap().len(), n);
    assert_eq!(v["nodes"]["1"]["connections"]["0"]["status"], "CONNECTED");
    assert_eq!(v["nodes"]["1"]["connections"]["0"]["changed"], true);
    assert_eq!(
        v["nodes"]["1"]["connections"]["999"]["status"],
        "NEVER_CONNECTED"
    );
    assert_eq!(v["nodes"]["1"]["connections"]["999"]["host"], "10.0.3.250");
    assert_eq!(v["nodes"]["500"]["status"], "UNAVAILABLE");
    assert_eq!(v["nodes"]["500"]["connections"]["7"]["status"], "INVALID");
    assert_eq!(v["nodes"]["500"]["connections"]["7"]["changed"], false);
    assert_eq!(
        v["nodes"]["500"]["connections"].as_object().unwrap().len(),
        n
    );
    let table = render::table(&reply, "1/2/2026 03:04:05.006", false);
    let row_500 = table
        .lines()
        .find(|l| l.trim_start().starts_with("500 "))
        .unwrap();
    assert_eq!(row_500.split_whitespace().filter(|c| *c == "I").count(), n);
}

/// Node 0 holds a reference for node 1's importer and imports from it; node 2 was lost and
/// cleaned up twice, the last time after its grace time.
fn peers_reply() -> PeersReply {
    let cleanup = |reason: &str, at_unix_ms, released| PeerCleanUp {
        reason: reason.into(),
        at_unix_ms,
        exports_released: released,
        imports_dropped: 1,
        unimports_finished: 0,
    };
    PeersReply {
        local_node_id: 0,
        state: "READY".into(),
        peers: vec![
            PeerReport {
                node_id: 1,
                host: "10.1.0.2".into(),
                status: "CONNECTED".into(),
                instance_id: 0xbeef,
                exports_held: 1,
                imports: 2,
                unimports_pending: 0,
                cleanups_total: 0,
                cleanups: vec![],
            },
            PeerReport {
                node_id: 2,
                host: "10.1.0.3".into(),
                status: "DISCONNECTED".into(),
                instance_id: 0xcafe,
                exports_held: 0,
                imports: 0,
                unimports_pending: 1,
                cleanups_total: 2,
                cleanups: vec![
                    cleanup("restarted", 1_795_683_600_000, 0),
                    cleanup("lost for longer than the grace time", 1_795_687_201_250, 3),
                ],
            },
        ],
    }
}

#[test]
fn peers_view() {
    let reply = peers_reply();
    golden("golden-peers.txt", &render::peers_text(&reply));
    golden("golden-peers.json", &(render::peers_json(&reply) + "\n"));
    let v: Value = serde_json::from_str(&render::peers_json(&reply)).unwrap();
    let last = &v["peers"][1]["cleanups"][1];
    assert_eq!(
        last["time"], "11/26/2026 10:00:01.250",
        "the -N timestamp format"
    );
    assert_eq!(last["exports_released"], 3);
    assert_eq!(v["peers"][0]["instance_id"], "000000000000beef");
}

/// One GPU as a daemon reports it for `--fabric`: probe complete in clique `clique`, full
/// bandwidth, and the health the Fabric Manager gave it.
fn fabric_gpu(gpu: u32, clique: u32, summary: &str, mask: u32) -> openimex_proto::peer::GpuFabric {
    openimex_proto::peer::GpuFabric {
        gpu,
        state: "COMPLETED".into(),
        cluster_uuid: "5a".repeat(16),
        partition_id: clique - 1,
        clique_id: clique,
        bw_mode: 0,
        bw_mode_epoch: 0,
        health_mask: mask,
        health_summary: summary.into(),
    }
}

/// `--fabric` (ours; issue 14: "shows each node's clique in ctl (our flag and JSON), marks
/// peers outside its clique" and "the daemon reports per-GPU fabric health in ctl"): node 1 is
/// in this node's clique, node 2 in another (marked outside), node 3 could not be asked
/// (unknown, never outside). Health masks as the driver packs them (§5): 0x11a9 is DEGRADED_BW
/// TRUE, the other fields FALSE, configuration correct, in a partition.
#[test]
fn fabric_view_goldens() {
    let healthy = 0x1000 | 0x100 | 0xaa;
    let degraded = 0x1000 | 0x100 | 0xa9;
    let mut nodes = vec![
        node(0, "10.0.0.1", "READY", "sim", &[]),
        node(1, "10.0.0.2", "READY", "sim", &[]),
        node(2, "10.0.0.3", "READY", "sim", &[]),
        node(3, "10.0.0.4", "UNAVAILABLE", "", &[]),
    ];
    nodes[0].gpus = vec![
        fabric_gpu(0, 1, "LIMITED_CAPACITY", degraded),
        fabric_gpu(1, 1, "HEALTHY", healthy),
    ];
    nodes[1].gpus = vec![fabric_gpu(0, 1, "HEALTHY", healthy)];
    nodes[2].gpus = vec![fabric_gpu(0, 2, "HEALTHY", healthy)];
    let reply = DomainReply {
        local_node_id: 0,
        nodes,
        status: "DEGRADED".into(),
    };
    let text = openimex_ctl::fabric::fabric_text(&reply);
    golden("golden-fabric.txt", &text);
    let json = openimex_ctl::fabric::fabric_json(&reply);
    golden("golden-fabric.json", &(json.clone() + "\n"));
    let v: Value = serde_json::from_str(&json).unwrap();
    let outside: Vec<bool> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["outside_clique"].as_bool().unwrap())
        .collect();
    assert_eq!(outside, [false, false, true, false]);
    assert_eq!(v["gpus"][0]["health"]["DEGRADED_BW"], "TRUE");
    assert_eq!(v["gpus"][1]["health"]["DEGRADED_BW"], "FALSE");
}
