//! The transport floor of `formation_N` (`openimex-lab bench mesh-probe`): one of N processes
//! that together form the full mesh a domain needs, with nothing of ours on it. Process `i`
//! serves the raw baseline's constant unary call ([`super::rpc`]) on its address and dials every
//! lower-numbered process from its own address, as a daemon dials a peer (tonic over TCP,
//! TCP_NODELAY, a one-thread runtime), making one call on each connection and keeping it open.
//! When all its dials have answered it says `meshed I`; once every process has, each pair has
//! one live HTTP/2 connection that carried one exchange. No domain can be formed over gRPC
//! with less, so the time to there over the bare processes' time is the lowest ratio a
//! `formation_N` could reach on this machine.

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use openimex_proto::cmd::StateRequest;
use openimex_proto::cmd::command_client::CommandClient;
use tonic::transport::{Channel, Endpoint};

use super::rpc::constant_server;

/// How long a process keeps dialling a peer that is not listening yet (the harness's round
/// limit ends it sooner).
const GIVE_UP: Duration = Duration::from_secs(120);
/// Pause before dialling a peer again whose port refused (it has not bound yet).
const REDIAL: Duration = Duration::from_millis(1);
/// Limit for one connection attempt and one call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `openimex-lab bench mesh-probe --index I ADDR…`: serve on `ADDR[I]`, dial `ADDR[..I]`, say
/// `meshed I` on stdout when every dial has answered, then serve until killed.
pub(crate) fn mesh_probe(index: usize, addrs: &[SocketAddr]) -> Result<()> {
    let Some(&me) = addrs.get(index) else {
        bail!(
            "--index {index} names no address: {} given (indices start at 0)",
            addrs.len()
        );
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let (_, server) = constant_server(me)?;
        let server = tokio::spawn(server);
        let mut dials = tokio::task::JoinSet::new();
        for &peer in &addrs[..index] {
            dials.spawn(dial(me, peer));
        }
        // Held, not dropped: a daemon keeps its sessions, and closing would be extra work.
        let mut clients = Vec::with_capacity(index);
        while let Some(done) = dials.join_next().await {
            clients.push(done.context("a dial task failed")??);
        }
        println!("meshed {index}");
        std::io::stdout().flush()?;
        server
            .await
            .context("the server task failed")?
            .context("the mesh probe's server failed")
    })
}

/// Connects from `me`'s address to `peer`, redialling while it is not listening yet, and makes
/// one call.
async fn dial(me: SocketAddr, peer: SocketAddr) -> Result<CommandClient<Channel>> {
    let endpoint = Endpoint::from_shared(format!("http://{peer}"))
        .with_context(|| format!("bad peer address {peer}"))?
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .tcp_nodelay(true)
        .local_address(Some(me.ip()));
    let deadline = Instant::now() + GIVE_UP;
    let channel = loop {
        match endpoint.connect().await {
            Ok(channel) => break channel,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(REDIAL).await,
            Err(e) => {
                return Err(e).with_context(|| format!("cannot connect to {peer} from {me}"));
            }
        }
    };
    let mut client = CommandClient::new(channel);
    client
        .state(StateRequest {})
        .await
        .with_context(|| format!("the call to {peer} failed"))?;
    Ok(client)
}
