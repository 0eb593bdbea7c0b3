//! The dialler's handshake against peers that listen here: refused and broken connections told
//! apart, and the node map's entries sent only to a peer that asks for them.

use super::*;
use openimex_core::NodeMap;

/// A peer's answer with `map`'s digest, its entries left out.
fn answer_of(map: &NodeMap) -> Hello {
    convert::hello(&Identity {
        node_map_digest: map.digest().to_string(),
        ..Identity::default()
    })
    .unwrap()
}

/// The node map of `hosts`, and our hello of it as a dial sends it.
fn own_hello(hosts: &[String]) -> (NodeMap, OwnHello) {
    let map = NodeMap::new(hosts.to_vec());
    let me = OwnHello {
        identity: Arc::new(Identity {
            node_map_digest: map.digest().to_string(),
            ..Identity::default()
        }),
        map: hosts.into(),
    };
    (map, me)
}

#[test]
fn an_answer_without_entries_still_proves_the_map_after_ours_grew() {
    let hosts: Vec<String> = vec!["10.0.0.1".into(), "10.0.0.2".into()];
    let (before, sent) = own_hello(&hosts);
    assert!(
        sent.identity.node_map.is_empty(),
        "a dial's hello has no entries"
    );
    assert_eq!(
        sent.with_entries().node_map,
        hosts,
        "asked for, it sends them"
    );
    // The peer had our digest and left its entries out; meanwhile SIGUSR1 appended a node.
    let mut answer = answer_of(&before);
    let grown = NodeMap::new([hosts, vec!["10.0.0.3".into()]].concat());
    let check = |a: &Hello| grown.accepts(2, &a.node_map, &a.digest, 2);
    assert!(check(&answer).is_err(), "without its entries: a mismatch");
    sent.restore_node_map(&mut answer);
    assert_eq!(check(&answer), Ok(()));
    // A peer with another digest must send its own entries: nothing is made up for it.
    let other = NodeMap::new(vec!["10.0.0.9".into(), "10.0.0.2".into()]);
    let mut foreign = answer_of(&other);
    sent.restore_node_map(&mut foreign);
    assert!(foreign.node_map.is_empty());
    assert!(check(&foreign).is_err());
}

fn target(port: u16, tls: Option<crate::tls::Sides>) -> Target {
    Target {
        peer: NodeId(1),
        attempt: 1,
        local: None,
        scope: 0,
        host: "127.0.0.1".into(),
        port,
        timeout: Duration::from_secs(10),
        keepalive: Duration::from_secs(10),
        tls,
        stats: crate::stats::Stats::default(),
        net: None,
    }
}

/// A port on 127.0.0.1 nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test(flavor = "current_thread")]
async fn a_refused_connection_is_told_apart_from_other_failures() {
    let tls = crate::tls::Tls::new(crate::tls::tests::material(&["127.0.0.1"], None), None)
        .unwrap()
        .sides();
    for tls in [None, Some(tls)] {
        let with_tls = tls.is_some();
        // Nothing listens: refused, the retry waits for the peer's own dial (core retry.rs).
        let err = connect(&target(closed_port(), tls.clone()))
            .await
            .unwrap_err();
        assert!(
            matches!(err, DialError::Connect { refused: true, .. }),
            "tls {with_tls}: {err:?}"
        );
        assert_eq!(err.failure(), openimex_core::DialFailure::NotListening);
        assert!(err.to_string().contains("refused"), "{err}");
        // Something listens and hangs up at once: a failure of another kind.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let hang_up = tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                drop(s);
            }
        });
        let (engine, _inputs) = mpsc::channel(1);
        let me = OwnHello {
            identity: Arc::new(Identity::default()),
            map: Vec::new().into(),
        };
        let Err(err) = handshake(&target(port, tls), me, engine).await else {
            panic!("tls {with_tls}: a peer that hangs up completed a handshake");
        };
        hang_up.abort();
        assert_eq!(
            err.failure(),
            openimex_core::DialFailure::Other,
            "tls {with_tls}: {err:?}"
        );
    }
}

/// A peer that keeps the identity of every hello it gets and answers a hello without entries
/// with `asks` (`REFUSAL_NODE_MAP_NEEDED` as a daemon whose map's digest is not the hello's,
/// `REFUSAL_NODE_MAP_MISMATCH` as an older one), or `None` (a daemon of the hello's map); a
/// hello it accepts is answered without its entries (the digest is the hello's).
struct AsksForEntries {
    hellos: Arc<std::sync::Mutex<Vec<Identity>>>,
    asks: Option<Refusal>,
}

#[tonic::async_trait]
impl openimex_proto::peer::peer_server::Peer for AsksForEntries {
    type SessionStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<SessionMsg, tonic::Status>> + Send>,
    >;

    async fn session(
        &self,
        request: tonic::Request<tonic::Streaming<SessionMsg>>,
    ) -> Result<tonic::Response<Self::SessionStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let Some(Body::Hello(hello)) = inbound.message().await?.and_then(|m| m.body) else {
            return Err(tonic::Status::failed_precondition("no hello"));
        };
        let from = hello.from.unwrap_or_default();
        let answer = {
            let mut hellos = self.hellos.lock().unwrap();
            hellos.push(from.clone());
            match self.asks.filter(|_| from.node_map.is_empty()) {
                Some(refusal) => openimex_proto::peer::HelloResponse {
                    refusal: refusal.into(),
                    ..Default::default()
                },
                None => openimex_proto::peer::HelloResponse {
                    from: Some(Identity {
                        node_id: 1,
                        node_map_digest: from.node_map_digest,
                        ..Identity::default()
                    }),
                    ..Default::default()
                },
            }
        };
        let frame = crate::session_tx::frame(0, Body::HelloReply(Box::new(answer)));
        Ok(tonic::Response::new(Box::pin(tokio_stream::once(Ok(
            frame,
        )))))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_dials_hello_leaves_the_entries_out_until_the_peer_asks_for_them() {
    for asks in [
        None,
        Some(Refusal::NodeMapNeeded),
        Some(Refusal::NodeMapMismatch),
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hellos = Arc::default();
        let peer = AsksForEntries {
            hellos: Arc::clone(&hellos),
            asks,
        };
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(openimex_proto::peer::peer_server::PeerServer::new(peer))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let hosts: Vec<String> = vec!["127.0.0.1".into(), "127.0.0.2".into()];
        let (map, me) = own_hello(&hosts);
        let (engine, _inputs) = mpsc::channel(4);
        let outcome = handshake(&target(port, None), me, engine).await.unwrap();
        let Input::DialOk { remote, .. } = outcome else {
            panic!("{asks:?}: accepted, got another outcome");
        };
        // The answer left its entries out (our digest): ours are put back for core's check.
        assert_eq!(&*remote.node_map, hosts.as_slice(), "{asks:?}");
        let hellos = hellos.lock().unwrap().clone();
        let entries: Vec<usize> = hellos.iter().map(|h| h.node_map.len()).collect();
        match asks {
            // A peer of our map judges the digest: one hello, no entries.
            None => assert_eq!(entries, [0]),
            // A peer that asks (or, older, refuses the map) gets them on a second stream of the
            // same connection.
            Some(_) => assert_eq!(entries, [0, 2], "{asks:?}"),
        }
        assert!(hellos.iter().all(|h| h.node_map_digest == map.digest()));
        server.abort();
    }
}
