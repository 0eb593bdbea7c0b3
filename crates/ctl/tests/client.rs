//! What ctl says when a call fails, against a real gRPC server in this process: a daemon that
//! answered but whose reply ctl rejected is not "cannot reach", a daemon's own error is shown
//! as the daemon's, and replies far beyond gRPC's 4 MiB default are accepted.

use std::time::Duration;

use openimex_ctl::{Client, CtlError, Target, client::classify};
use openimex_proto::cmd::command_server::{Command, CommandServer};
use openimex_proto::cmd::{
    ConfigReply, ConfigRequest, DomainReply, DomainRequest, JobsReply, JobsRequest, NodeReport,
    PeersReply, PeersRequest, StateReply, StateRequest,
};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// A command service whose domain reply carries `cells` bytes, or fails with `error`.
struct Fake {
    cells: usize,
    error: Option<(tonic::Code, &'static str)>,
}

#[tonic::async_trait]
impl Command for Fake {
    async fn state(&self, _: Request<StateRequest>) -> Result<Response<StateReply>, Status> {
        Ok(Response::new(StateReply {
            state: "READY".into(),
        }))
    }

    async fn domain(&self, _: Request<DomainRequest>) -> Result<Response<DomainReply>, Status> {
        if let Some((code, message)) = self.error {
            return Err(Status::new(code, message));
        }
        Ok(Response::new(DomainReply {
            local_node_id: 0,
            nodes: vec![NodeReport {
                host: "127.0.0.1".into(),
                state: "READY".into(),
                reachable: true,
                cells: vec![9; self.cells],
                ..Default::default()
            }],
            status: "UP".into(),
        }))
    }

    /// As a daemon from before `--peers` answers: tonic's default for an unknown method.
    async fn peers(&self, _: Request<PeersRequest>) -> Result<Response<PeersReply>, Status> {
        Err(Status::unimplemented(""))
    }

    async fn config(&self, _: Request<ConfigRequest>) -> Result<Response<ConfigReply>, Status> {
        Err(Status::unimplemented(""))
    }

    async fn jobs(&self, _: Request<JobsRequest>) -> Result<Response<JobsReply>, Status> {
        Err(Status::unimplemented(""))
    }

    async fn job_create(
        &self,
        _: Request<openimex_proto::cmd::JobCreateRequest>,
    ) -> Result<Response<openimex_proto::cmd::JobCreateReply>, Status> {
        Err(Status::unimplemented(""))
    }

    async fn job_end(
        &self,
        _: Request<openimex_proto::cmd::JobEndRequest>,
    ) -> Result<Response<openimex_proto::cmd::JobEndReply>, Status> {
        Err(Status::unimplemented(""))
    }

    async fn job_wait(
        &self,
        _: Request<openimex_proto::cmd::JobWaitRequest>,
    ) -> Result<Response<openimex_proto::cmd::JobWaitReply>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn job_channel_clear(
        &self,
        _: Request<openimex_proto::cmd::JobChannelClearRequest>,
    ) -> Result<Response<openimex_proto::cmd::JobChannelClearReply>, Status> {
        Err(Status::unimplemented(""))
    }
}

/// Serves `fake` on a loopback port; returns ctl's target for it.
async fn serve(fake: Fake) -> Target {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let port = listener.local_addr().expect("local address").port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CommandServer::new(fake))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    Target::Tcp {
        host: "127.0.0.1".into(),
        port,
    }
}

const TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_reply_too_large_is_rejected_not_unreachable() {
    let target = serve(Fake {
        cells: 2 << 20,
        error: None,
    })
    .await;
    let mut client = Client::connect(target, TIMEOUT)
        .await
        .expect("connect")
        .with_max_reply(1 << 20);
    let err = client.domain(false).await.expect_err("over the limit");
    let msg = err.to_string();
    assert!(matches!(err, CtlError::Rejected { .. }), "{msg}");
    assert!(
        msg.contains("answered, but ctl rejected its reply"),
        "{msg}"
    );
    assert!(msg.contains("the reply is 2097"), "names the size: {msg}");
    assert!(msg.contains("1048576 bytes"), "names the limit: {msg}");
    assert!(!msg.contains("cannot reach"), "{msg}");
}

#[tokio::test]
async fn replies_beyond_grpcs_default_limit_are_accepted() {
    // 6 MiB: the matrix of a 2,400-node domain; gRPC's default would refuse it at 4 MiB.
    let target = serve(Fake {
        cells: 6 << 20,
        error: None,
    })
    .await;
    let mut client = Client::connect(target, TIMEOUT).await.expect("connect");
    let reply = client.domain(false).await.expect("accepted");
    assert_eq!(reply.nodes[0].cells.len(), 6 << 20);
}

#[tokio::test]
async fn a_daemons_own_error_is_shown_as_its_answer() {
    let target = serve(Fake {
        cells: 0,
        error: Some((tonic::Code::Unavailable, "daemon is stopping")),
    })
    .await;
    let mut client = Client::connect(target, TIMEOUT).await.expect("connect");
    let msg = client.domain(false).await.expect_err("fails").to_string();
    assert!(msg.contains("answered with an error"), "{msg}");
    assert!(msg.contains("daemon is stopping"), "{msg}");
    assert!(!msg.contains("cannot reach"), "{msg}");
}

#[tokio::test]
async fn peers_asked_of_a_daemon_without_it_says_so() {
    let target = serve(Fake {
        cells: 0,
        error: None,
    })
    .await;
    let mut client = Client::connect(target, TIMEOUT).await.expect("connect");
    let err = client.peers().await.expect_err("not there");
    let msg = err.to_string();
    assert!(matches!(err, CtlError::Rejected { .. }), "{msg}");
    assert!(msg.contains("does not know `--peers`"), "{msg}");
    assert!(msg.contains("`--links`"), "names what still works: {msg}");
}

#[tokio::test]
async fn nothing_listening_is_cannot_reach() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("address").port()
    };
    let target = Target::Tcp {
        host: "127.0.0.1".into(),
        port,
    };
    let msg = Client::connect(target, TIMEOUT)
        .await
        .expect_err("nothing listens")
        .to_string();
    assert!(msg.contains("cannot reach"), "{msg}");
}

#[test]
fn an_undecodable_reply_is_rejected_and_says_why() {
    let target = Target::Unix("/run/imex.sock".into());
    // As tonic makes it when prost cannot decode the reply: no source, no headers.
    let s = Status::internal("failed to decode Protobuf message: invalid wire type");
    let msg = classify(&target, 1 << 30, &s).to_string();
    assert!(
        msg.contains("answered, but ctl rejected its reply"),
        "{msg}"
    );
    assert!(msg.contains("invalid wire type"), "{msg}");
    assert!(msg.contains("same openimex release"), "says the fix: {msg}");
}
