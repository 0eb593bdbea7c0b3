//! Property suite of the peer protocol as this daemon decodes and checks it (issue 10, item 6):
//! arbitrary bytes decoded as every peer message never panic; the checks of decoded fields
//! (`convert::hello`, `convert::import_request`, `convert::bounded`) accept exactly the values
//! the daemon can use and refuse the rest with a reason; and a session reader fed random
//! frames answers every request frame exactly once — with the engine's answer, or `refused`
//! and why — sends nothing for answers nobody asked for, and never passes a bad field on.
//!
//! Each property runs [`CASES`] cases (the session one fewer: each starts a runtime);
//! `PROPTEST_CASES=N` runs `N` instead.

use std::collections::HashMap;

use openimex_core::{Pages, Via};
use openimex_proto::peer::session_msg::Body;
use openimex_proto::peer::{
    GoodbyeRequest, HelloRequest, HelloResponse, Identity, ImportReply, ImportRequest, NodeStatus,
    SessionMsg, UnimportRequest,
};
use proptest::prelude::*;
use prost::Message as _;
use tokio::sync::mpsc;

use crate::convert::{self, MAX_NODE_MAP, MAX_PEER_STRING};

use crate::mailbox::Input;
use crate::session_tx::SessionTx;

/// Cases per property in CI.
const CASES: u32 = 10_000;
/// Cases of the session property.
const SESSION_CASES: u32 = 5_000;

/// A string of `0..=max` characters, sometimes just over the daemon's bound.
fn text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::string::string_regex(&format!("[ -~é\u{1b}\n]{{0,{max}}}"))
            .unwrap_or_else(|e| panic!("{e}")),
        1 => (MAX_PEER_STRING - 1..MAX_PEER_STRING + 3).prop_map(|n| "a".repeat(n)),
    ]
}

fn identity() -> impl Strategy<Value = Identity> {
    (
        text(12),
        prop_oneof![0u32..8, Just(65_535), Just(65_536), any::<u32>()],
        any::<u64>(),
        text(12),
        text(8),
        any::<u32>(),
        // A map over the bound is costly to build: `a_node_map_over_the_bound_is_refused`.
        proptest::collection::vec(text(12), 0..6),
        text(8),
        any::<u32>(),
    )
        .prop_map(|(d, node, inst, dig, sw, pv, map, drv, base)| Identity {
            domain_id: d,
            node_id: node,
            instance_id: inst,
            node_map_digest: dig,
            software_version: sw,
            protocol_version: pv,
            node_map: map,
            driver_version: drv,
            node_map_base_len: base,
            cliques: Vec::new(),
            cliques_epoch: 0,
        })
}

fn import_request() -> impl Strategy<Value = ImportRequest> {
    (
        any::<u64>(),
        proptest::collection::vec(any::<u8>(), 0..20),
        prop_oneof![0u32..4, Just(65_535), Just(65_536), any::<u32>()],
        any::<u32>(),
    )
        .prop_map(|(e, uuid, index, channel)| ImportRequest {
            from: None,
            import_event_id: e,
            export_uuid: uuid,
            index,
            channel,
        })
}

/// What `convert::hello` must decide about `id`.
fn usable(id: &Identity) -> bool {
    id.node_id <= u32::from(u16::MAX)
        && id.node_map.len() <= MAX_NODE_MAP
        && [&id.domain_id, &id.node_map_digest, &id.driver_version]
            .into_iter()
            .chain(id.node_map.iter())
            .all(|s| s.len() <= MAX_PEER_STRING)
}

/// Decodes `bytes` as every peer message; returns the identities and import requests found.
fn decode_all(bytes: &[u8]) -> (Vec<Identity>, Vec<ImportRequest>) {
    let mut ids = Vec::new();
    let mut imports = Vec::new();
    if let Ok(m) = HelloRequest::decode(bytes) {
        ids.extend(m.from);
    }
    if let Ok(m) = HelloResponse::decode(bytes) {
        ids.extend(m.from);
    }
    if let Ok(m) = Identity::decode(bytes) {
        ids.push(m);
    }
    if let Ok(m) = GoodbyeRequest::decode(bytes) {
        ids.extend(m.from);
    }
    if let Ok(m) = UnimportRequest::decode(bytes) {
        ids.extend(m.from.map(|from| *from));
    }
    if let Ok(m) = ImportRequest::decode(bytes) {
        ids.extend(m.from.clone().map(|from| *from));
        imports.push(m);
    }
    let _ = NodeStatus::decode(bytes);
    let _ = ImportReply::decode(bytes).map(convert::answer);
    if let Ok(m) = SessionMsg::decode(bytes) {
        match m.body {
            Some(Body::Import(r)) => imports.push(r),
            Some(Body::ImportReply(r)) => drop(convert::answer(r)),
            Some(Body::Refused(why)) => drop(convert::bounded(&why)),
            _ => {}
        }
    }
    let _ = SessionMsg::decode_length_delimited(bytes);
    (ids, imports)
}

fn check_identity(id: &Identity) -> Result<(), TestCaseError> {
    match convert::hello(id) {
        Ok(h) => {
            prop_assert!(usable(id), "unusable identity accepted: {id:?}");
            prop_assert_eq!(u32::from(h.node.0), id.node_id);
            prop_assert_eq!(h.instance.0, id.instance_id);
            prop_assert_eq!(&h.domain_id, &id.domain_id);
            prop_assert_eq!(&h.digest, &id.node_map_digest);
            prop_assert_eq!(h.node_map.len(), id.node_map.len());
        }
        Err(why) => {
            prop_assert!(!usable(id), "usable identity refused: {why}");
            prop_assert!(!why.is_empty() && why.len() < 200, "{why}");
        }
    }
    Ok(())
}

fn check_import(r: &ImportRequest) -> Result<(), TestCaseError> {
    let ok = r.export_uuid.len() == 16 && r.index <= u32::from(u16::MAX);
    match convert::import_request(r) {
        Ok(c) => {
            prop_assert!(ok, "bad import accepted: {r:?}");
            prop_assert_eq!(&c.export_uuid[..], &r.export_uuid[..]);
            prop_assert_eq!(u32::from(c.index), r.index);
            prop_assert_eq!(c.channel, r.channel);
            prop_assert_eq!(c.import_event_id, r.import_event_id);
        }
        Err(why) => {
            prop_assert!(!ok, "good import refused: {why}");
            prop_assert!(!why.is_empty());
        }
    }
    Ok(())
}

/// A frame a peer might send on a session: requests with good and bad fields, answers to
/// requests never made, refusals, heartbeats.
fn frame() -> impl Strategy<Value = SessionMsg> {
    let body = prop_oneof![
        4 => import_request().prop_map(Body::Import),
        2 => any::<u64>().prop_map(|e| Body::Unimport(UnimportRequest {
            from: None,
            import_event_id: e,
        })),
        1 => text(20).prop_map(|reason| Body::Goodbye(Box::new(GoodbyeRequest { from: None, reason }))),
        1 => any::<bool>().prop_map(|reasons| Body::Status(
            openimex_proto::peer::NodeStatusRequest {
                reasons,
                fabric: false,
            },
        )),
        1 => Just(Body::ImportReply(ImportReply::default())),
        1 => Just(Body::UnimportReply(Default::default())),
        1 => text(300).prop_map(Body::Refused),
        // Handshake frames after the session's first: a stray hello is refused, an answer to
        // a hello never sent gets nothing.
        1 => Just(Body::Hello(Box::default())),
        1 => Just(Body::HelloReply(Box::default())),
    ];
    (
        0u64..6,
        proptest::option::weighted(0.85, body),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(|(id, body, seq, ack)| SessionMsg {
            id,
            body,
            heartbeat_seq: seq,
            heartbeat_ack: ack,
            ..SessionMsg::default()
        })
}

/// Answers the engine's side of a session: imports OK with their event ID as the one page,
/// unimports released, goodbyes believed; anything else is dropped (the caller sees the
/// engine gone). Returns the import requests it was given.
async fn fake_engine(mut rx: mpsc::Receiver<Input>) -> Vec<openimex_core::ImportRequest> {
    let mut seen = Vec::new();
    while let Some(input) = rx.recv().await {
        match input {
            Input::PeerImport { request, reply, .. } => {
                let _ = reply.send(Ok(Pages {
                    size: 1,
                    page_size: 1,
                    pfns: vec![request.import_event_id],
                    clique_id: 0,
                    bw_mode: 0,
                    bw_mode_epoch: 0,
                    kind: 0,
                    phys_addr_space: 0,
                    compression_coverage: 0,
                    mem_flags: 0,
                }));
                seen.push(request);
            }
            Input::PeerUnimport { reply, .. } => {
                let _ = reply.send(Ok(true));
            }
            Input::Goodbye { reply, .. } => {
                let _ = reply.send(true);
            }
            _ => {}
        }
    }
    seen
}

/// Feeds `frames` to a session reader with the fake engine and keeps the session open until
/// `expect` frames went out (or a generous hang guard passed); returns what went out and what
/// the engine was asked.
fn run_session(
    frames: Vec<SessionMsg>,
    expect: usize,
) -> (Vec<SessionMsg>, Vec<openimex_core::ImportRequest>) {
    use tokio_stream::StreamExt as _;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    rt.block_on(async move {
        let (tx, mut out) = SessionTx::new(&crate::stats::Stats::default());
        let (engine_tx, engine_rx) = mpsc::channel(64);
        let engine = tokio::spawn(fake_engine(engine_rx));
        // The peer sends its frames, then keeps its session open until it hangs up below.
        let (peer, inbound) = mpsc::channel(frames.len() + 1);
        for f in frames {
            let _ = peer.try_send(Ok::<_, tonic::Status>(f));
        }
        let inbound = tokio_stream::wrappers::ReceiverStream::new(inbound);
        let reader = tokio::spawn(crate::session::run(
            inbound,
            tx.clone(),
            Via::Accepted { conn: 1 },
            engine_tx,
        ));
        let mut sent = Vec::new();
        let guard = tokio::time::sleep(std::time::Duration::from_secs(30));
        tokio::pin!(guard);
        while sent.len() < expect {
            tokio::select! {
                m = out.next() => match m {
                    Some(m) => sent.push(m),
                    None => break,
                },
                () = &mut guard => break,
            }
        }
        // Anything more would be an answer too many.
        tokio::task::yield_now().await;
        while let Some(m) = out.try_next() {
            sent.push(m);
        }
        drop(peer);
        let reason = reader.await.unwrap_or_default();
        assert_eq!(reason, "peer closed the session");
        drop(tx);
        let asked = engine.await.unwrap_or_default();
        (sent, asked)
    })
}

proptest! {
    #![proptest_config(crate::prop_budget::budget(CASES))]

    /// Arbitrary bytes decoded as any peer message never panic, and whatever decodes is
    /// checked as the daemon checks it.
    #[test]
    fn arbitrary_bytes_decode_and_check_cleanly(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let (ids, imports) = decode_all(&bytes);
        for id in &ids {
            check_identity(id)?;
        }
        for r in &imports {
            check_import(r)?;
        }
    }

    /// Identities with fields of every size: accepted exactly when the daemon can use them,
    /// field for field; the reason otherwise. Encoded and decoded back, the same.
    #[test]
    fn identities_are_checked_field_by_field(id in identity()) {
        check_identity(&id)?;
        let back = Identity::decode(id.encode_to_vec().as_slice());
        prop_assert_eq!(back.ok(), Some(id));
    }

    /// Import requests with wrong UUID lengths and indices out of range are refused.
    #[test]
    fn import_requests_are_checked(r in import_request()) {
        check_import(&r)?;
    }

    /// A peer's free text is made safe to log: bounded, no control characters.
    #[test]
    fn peer_text_is_bounded(s in prop_oneof![text(300), ".{0,600}"]) {
        let b = convert::bounded(&s);
        prop_assert!(!b.chars().any(char::is_control), "{b:?}");
        let head = b.split("… (").next().unwrap_or_default();
        // Each kept character escapes to at most 10 (`\u{10ffff}`).
        prop_assert!(head.chars().count() <= 10 * MAX_PEER_STRING);
        prop_assert_eq!(b.contains("… ("), s.chars().count() > MAX_PEER_STRING);
    }
}

/// Whether `ans` is a right answer to `req` from the reader and the fake engine.
fn answers_request(req: &Body, ans: &Body) -> bool {
    match (req, ans) {
        (Body::Import(r), Body::ImportReply(a)) => {
            convert::import_request(r).is_ok() && a.pfns == vec![r.import_event_id]
        }
        (Body::Import(r), Body::Refused(why)) => {
            convert::import_request(r).is_err() && !why.is_empty()
        }
        (Body::Unimport(_), Body::UnimportReply(a)) => a.released,
        (Body::Goodbye(_), Body::GoodbyeReply(_)) => true,
        // The fake engine has no status: the request fails with a reason.
        (Body::Status(_), Body::Refused(why)) => !why.is_empty(),
        (Body::Hello(_), Body::Refused(why)) => !why.is_empty(),
        _ => false,
    }
}

proptest! {
    #![proptest_config(crate::prop_budget::budget(SESSION_CASES))]

    /// Random frames on a session: each request frame is answered once, under its ID, with
    /// the engine's answer or a refusal that says why; a bad import never reaches the engine;
    /// answers and refusals for calls never made send nothing back; heartbeats are answered.
    #[test]
    fn session_frames_are_answered_once(frames in proptest::collection::vec(frame(), 0..12)) {
        let expect = frames
            .iter()
            .filter(|f| match &f.body {
                None => !f.heartbeat_ack,
                Some(b) => matches!(
                    b,
                    Body::Import(_)
                        | Body::Unimport(_)
                        | Body::Goodbye(_)
                        | Body::Status(_)
                        | Body::Hello(_)
                ),
            })
            .count();
        let (sent, asked) = run_session(frames.clone(), expect);
        let mut want: HashMap<u64, Vec<&Body>> = HashMap::new();
        let mut heartbeats = 0;
        for f in &frames {
            match &f.body {
                None if !f.heartbeat_ack => heartbeats += 1,
                None => {}
                Some(b @ (Body::Import(_) | Body::Unimport(_) | Body::Goodbye(_) | Body::Status(_) | Body::Hello(_))) => {
                    want.entry(f.id).or_default().push(b);
                }
                Some(_) => {}
            }
        }
        let mut answers: HashMap<u64, Vec<&Body>> = HashMap::new();
        let mut acks = 0;
        for m in &sent {
            match &m.body {
                None => {
                    prop_assert!(m.heartbeat_ack, "unasked heartbeat {m:?}");
                    acks += 1;
                }
                Some(b) => answers.entry(m.id).or_default().push(b),
            }
        }
        prop_assert_eq!(acks, heartbeats);
        let count = |m: &HashMap<u64, Vec<&Body>>| m.values().map(Vec::len).sum::<usize>();
        prop_assert_eq!(count(&answers), count(&want), "{:?} -> {:?}", frames, sent);
        // A peer may reuse an ID: its answers then come in any order, each matching one request.
        for (id, reqs) in &want {
            let got = answers.get(id).map_or(&[][..], Vec::as_slice);
            prop_assert_eq!(got.len(), reqs.len(), "answers to {}", id);
            let mut open: Vec<&Body> = reqs.clone();
            for ans in got {
                let at = open.iter().position(|req| answers_request(req, ans));
                prop_assert!(at.is_some(), "{ans:?} answers none of {open:?}");
                open.remove(at.unwrap_or_default());
            }
        }
        let bad = frames.iter().filter_map(|f| match &f.body {
            Some(Body::Import(r)) => convert::import_request(r).err(),
            _ => None,
        }).count();
        let imports = frames.iter().filter(|f| matches!(f.body, Some(Body::Import(_)))).count();
        prop_assert_eq!(asked.len(), imports - bad, "the engine saw a bad import");
    }
}

#[test]
fn a_node_map_over_the_bound_is_refused() {
    for n in [MAX_NODE_MAP, MAX_NODE_MAP + 1] {
        let id = Identity {
            node_map: vec![String::new(); n],
            ..Identity::default()
        };
        let checked = check_identity(&id);
        assert!(checked.is_ok(), "{n} entries: {checked:?}");
        assert_eq!(convert::hello(&id).is_ok(), n == MAX_NODE_MAP);
    }
}
