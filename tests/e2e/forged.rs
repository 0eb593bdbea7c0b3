//! Forged peer messages against a live cross-node import, sent through the real tonic client
//! by a process that can reach the peer port but holds no session: none may release a
//! reference, take one, disable an importer or change a link, and each refusal is counted in
//! `ctl --links -j`. Only a session carries requests (there is no unary RPC left to call
//! without one). The attacker is assumed to know everything `ctl` shows (node IDs,
//! instances) and to guess event IDs (they count up from 1) and export UUIDs (in the handle).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use openimex_proto::peer::peer_client::PeerClient;
use openimex_proto::peer::{
    GoodbyeRequest, HelloRequest, Identity, ImportRequest, Refusal, UnimportRequest,
};
use openimex_simproto::handle::FabricHandle;
use serde_json::Value;
use tonic::transport::{Channel, Endpoint};

use crate::apps::*;
use crate::common::{NOTICE, say_hello};

/// A live import: node 0 exports, an app on node 1 maps it; node 0's daemon holds one reference.
struct Live {
    cluster: openimex_harness::Cluster,
    exp: Held,
    imp: Held,
    handle: String,
    links_before: Value,
}

const SEED: u64 = 4242;

fn live_import() -> Live {
    let cluster = gpu_cluster(2);
    let (d0, d1) = (cluster.node(0).dir(), cluster.node(1).dir());
    let (exp, handle) = exporter(d0, &channel(&cluster, 0, 0), SEED, "exporter on node 0");
    let imp = held_importer(d1, &channel(&cluster, 1, 0), &handle, SEED, "importer on 1");
    wait_stats(d0, NOTICE, "node 0 holds one reference for node 1", |s| {
        num(s, "daemon_export_refs") == 1
    });
    let links_before = links(&cluster, 0);
    Live {
        cluster,
        exp,
        imp,
        handle,
        links_before,
    }
}

/// `ctl --links -j` on node `i`.
pub(crate) fn links(cluster: &openimex_harness::Cluster, i: usize) -> Value {
    let out = cluster.ctl(i, &["--links", "-j"]).expect("ctl --links -j");
    serde_json::from_slice(&out.stdout).expect("ctl --links -j prints JSON")
}

/// Each node's view of each link: (status, reason) and its instance.
fn link_states(v: &Value) -> Vec<(String, Vec<(String, String)>)> {
    v["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            let cells = n["connections"]
                .as_array()
                .expect("connections")
                .iter()
                .map(|c| (c["status"].to_string(), c["reason"].to_string()))
                .collect();
            (n["instance_id"].to_string(), cells)
        })
        .collect()
}

/// How many messages node `node` (as seen in `v`) refused for `reason`.
pub(crate) fn refused(v: &Value, node: usize, reason: &str) -> u64 {
    v["nodes"][node]["refused"][reason].as_u64().unwrap_or(0)
}

/// Node `i`'s instance as `ctl` shows it.
fn instance(v: &Value, i: usize) -> u64 {
    let hex = v["nodes"][i]["instance_id"].as_str().expect("instance_id");
    u64::from_str_radix(hex, 16).expect("hex instance")
}

/// A peer client to node `i`'s peer port, leaving from `source`.
fn client(live: &Live, i: usize, source: IpAddr) -> (tokio::runtime::Runtime, PeerClient<Channel>) {
    let (rt, channel) = connect(live, i, source);
    (rt, PeerClient::new(channel))
}

/// A channel to node `i`'s peer port leaving from `source`, and the runtime it runs on.
fn connect(live: &Live, i: usize, source: IpAddr) -> (tokio::runtime::Runtime, Channel) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let node = live.cluster.node(i);
    let target = SocketAddr::new(IpAddr::V4(node.ip()), node.server_port());
    let channel = rt
        .block_on(
            Endpoint::from_shared(format!("http://{target}"))
                .expect("endpoint")
                .local_address(Some(source))
                .connect_timeout(Duration::from_secs(5))
                .connect(),
        )
        .expect("the attacker reaches the peer port");
    (rt, channel)
}

/// An identity claiming to be node `node` with `instance`.
fn claim(node: u32, instance: u64) -> Identity {
    Identity {
        node_id: node,
        instance_id: instance,
        protocol_version: openimex_proto::PROTOCOL_VERSION,
        ..Default::default()
    }
}

/// An address on this machine that is no node's.
const ELSEWHERE: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Nothing the attack aimed at changed: the importer still reads its data, node 0 still holds
/// exactly its one reference, and no link changed state, reason or instance.
///
/// No wait before looking: every forged message was answered (or refused) by the engine, and
/// `ctl --links -j` is answered by the same engine after every input queued before it, so
/// what the forgeries could have changed has been decided by the time the links are read.
#[track_caller]
fn nothing_changed(live: &mut Live) {
    assert_eq!(
        live.imp.ask(&format!("verify {SEED}")),
        "ok",
        "the importer keeps its mapping and its data"
    );
    let s0 = stats(live.cluster.node(0).dir());
    assert_eq!(
        num(&s0, "daemon_export_refs"),
        1,
        "reference counts unchanged"
    );
    assert_eq!(
        link_states(&links(&live.cluster, 0)),
        link_states(&live.links_before),
        "no link changed"
    );
    assert_eq!(live.exp.ask(&format!("verify {SEED}")), "ok");
}

/// Calls `Peer/<method>` on node `i`'s peer port with `req`, as an old client that still has
/// the unary RPCs would: the answer's status.
fn call_removed<Req>(live: &Live, i: usize, method: &str, req: Req) -> tonic::Status
where
    Req: prost::Message + Send + Sync + 'static,
{
    let (rt, channel) = connect(live, i, ELSEWHERE);
    let mut grpc = tonic::client::Grpc::new(channel);
    let path = format!("/openimex.peer.v1.Peer/{method}");
    rt.block_on(async {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unknown(e.to_string()))?;
        grpc.unary::<Req, openimex_proto::peer::UnimportReply, _>(
            tonic::Request::new(req),
            path.parse().expect("a path"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .map(drop)
    })
    .expect_err("no such RPC")
}

/// Goodbyes, imports, unimports and status rows travel on sessions only, which a proven hello
/// opens: the unary RPCs a connection without a session could call (and guess event IDs and
/// export UUIDs through) are gone, and calling them changes nothing.
#[test]
fn there_is_no_unary_rpc_to_forge_an_import_an_unimport_or_a_goodbye_through() {
    let mut live = live_import();
    let inst1 = instance(&live.links_before, 1);
    let handle = FabricHandle::from_hex(&live.handle).expect("the exporter's handle");
    for ev in 1..=4 {
        let status = call_removed(
            &live,
            0,
            "Unimport",
            UnimportRequest {
                from: Some(Box::new(claim(1, inst1))),
                import_event_id: ev,
            },
        );
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
    }
    let status = call_removed(
        &live,
        0,
        "Import",
        ImportRequest {
            from: Some(Box::new(claim(1, inst1))),
            import_event_id: 999,
            export_uuid: handle.export_uuid.0.to_vec(),
            index: u32::from(handle.index),
            channel: 0,
        },
    );
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
    let status = call_removed(
        &live,
        1,
        "Goodbye",
        GoodbyeRequest {
            from: Some(claim(0, instance(&live.links_before, 0))),
            reason: "forged".into(),
        },
    );
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
    nothing_changed(&mut live);
}

#[test]
fn a_forged_restart_from_another_address_is_not_believed() {
    let mut live = live_import();
    // Claim to be node 0 restarted (new instance) to node 1, which holds node 0's memory:
    // believed, node 1 would disable (kill) its importer and drop its import.
    let (rt, mut c) = client(&live, 1, ELSEWHERE);
    let hello = HelloRequest {
        from: Some(claim(0, 0xdead_beef)),
        to_node_id: 1,
    };
    let reply = say_hello(&rt, &mut c, hello).expect("answered");
    assert_ne!(reply.refusal, i32::from(Refusal::None), "refused");
    assert!(reply.from.is_none(), "a refusal tells nothing: {reply:?}");
    assert!(
        reply.detail.is_empty(),
        "a refusal tells nothing: {reply:?}"
    );
    nothing_changed(&mut live);
    let l1 = links(&live.cluster, 1);
    assert!(refused(&l1, 1, "hello: wrong source address") >= 1, "{l1}");
}

#[test]
fn a_refused_hello_naming_a_real_peer_changes_no_link() {
    let mut live = live_import();
    // Even from node 0's own address (anyone on that host can bind it), a hello that does
    // not match (wrong node map) is refused without touching node 1's real link to node 0.
    let ip0 = IpAddr::V4(live.cluster.node(0).ip());
    let (rt, mut c) = client(&live, 1, ip0);
    let mut forged = claim(0, instance(&live.links_before, 0));
    forged.node_map_digest = "0".repeat(64);
    forged.node_map = vec!["10.9.9.9".into(); 3];
    let hello = HelloRequest {
        from: Some(forged),
        to_node_id: 1,
    };
    let reply = say_hello(&rt, &mut c, hello).expect("answered");
    assert_eq!(reply.refusal, i32::from(Refusal::NodeMapMismatch));
    assert!(reply.from.is_none() && reply.detail.is_empty(), "{reply:?}");
    nothing_changed(&mut live);
    let l1 = links(&live.cluster, 1);
    assert_eq!(
        l1["nodes"][1]["connections"][0]["status"], "CONNECTED",
        "{l1}"
    );
    assert!(refused(&l1, 1, "hello: node map mismatch") >= 1, "{l1}");
}

#[test]
fn a_session_that_does_not_open_with_a_hello_is_refused() {
    let mut live = live_import();
    // From node 0's own address, a session whose first frame is a heartbeat, not a hello.
    let ip0 = IpAddr::V4(live.cluster.node(0).ip());
    let (rt, mut c) = client(&live, 1, ip0);
    let heartbeat = openimex_proto::peer::SessionMsg {
        heartbeat_seq: 1,
        ..Default::default()
    };
    let answer = rt.block_on(async {
        let mut inbound = c.session(tokio_stream::once(heartbeat)).await?.into_inner();
        inbound.message().await
    });
    let status = answer.expect_err("a session without a hello is refused");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    nothing_changed(&mut live);
}
