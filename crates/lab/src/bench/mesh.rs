//! The transport floor of `formation_N` (`openimex-lab bench mesh-probe`): one of N processes
//! that together form the full mesh a domain needs, with nothing of ours on it. Process `i`
//! serves the raw baseline's constant unary call ([`super::rpc`]) on its address and dials every
//! lower-numbered process from its own address, as a daemon dials a peer (tonic over TCP,
//! TCP_NODELAY, a one-thread runtime), making one call on each connection and keeping it open.
//! When all its dials have answered it says `meshed I`; once every process has, each pair has
//! one live HTTP/2 connection that carried one exchange. No domain can be formed over gRPC
//! with less, so the time to there over the bare processes' time is the lowest ratio a
//! `formation_N` could reach on this machine.
//!
//! With `--config FILE` (the floor of `formation_N_tls`) every connection is mutual TLS with
//! the keys FILE names, accepted and dialled as the daemon does ([`super::tls`]); a dial whose
//! handshake fails ends the probe at once, since trying again would fail the same way.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use openimex_imexd::tls::Sides;
use openimex_proto::cmd::StateRequest;
use openimex_proto::cmd::command_client::CommandClient;
use tonic::transport::{Channel, Endpoint};

use super::rpc::{constant_server, constant_server_tls};

/// How long a process keeps dialling a peer that is not listening yet (the harness's round
/// limit ends it sooner).
const GIVE_UP: Duration = Duration::from_secs(120);
/// Pause before dialling a peer again whose port refused (it has not bound yet).
const REDIAL: Duration = Duration::from_millis(1);
/// Limit for one connection attempt and one call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `openimex-lab bench mesh-probe --index I [--config FILE] ADDR…`: serve on `ADDR[I]`, dial
/// `ADDR[..I]`, say `meshed I` on stdout when every dial has answered, then serve until
/// killed; over mutual TLS with FILE's keys when given.
pub(crate) fn mesh_probe(index: usize, addrs: &[SocketAddr], config: Option<&Path>) -> Result<()> {
    let Some(&me) = addrs.get(index) else {
        bail!(
            "--index {index} names no address: {} given (indices start at 0)",
            addrs.len()
        );
    };
    // Read before the runtime, as the daemon reads its material before serving.
    let sides = config.map(super::tls::load).transpose()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let server = match &sides {
            None => tokio::spawn(constant_server(me)?.1),
            Some(sides) => tokio::spawn(constant_server_tls(me, sides)?.1),
        };
        let mut dials = tokio::task::JoinSet::new();
        for &peer in &addrs[..index] {
            dials.spawn(dial(me, peer, sides.clone()));
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

/// Connects from `me`'s address to `peer` (over TLS with `tls`), redialling while it is not
/// listening yet, and makes one call.
async fn dial(
    me: SocketAddr,
    peer: SocketAddr,
    tls: Option<Sides>,
) -> Result<CommandClient<Channel>> {
    let endpoint = Endpoint::from_shared(format!("http://{peer}"))
        .with_context(|| format!("bad peer address {peer}"))?
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .tcp_nodelay(true)
        .local_address(Some(me.ip()));
    let deadline = Instant::now() + GIVE_UP;
    let channel = loop {
        let attempt = match &tls {
            None => endpoint
                .connect()
                .await
                .map_err(|e| (false, anyhow::Error::new(e))),
            Some(sides) => super::tls::connect(sides, endpoint.clone(), Some(me.ip()), peer)
                .await
                .map_err(|f| (f.handshake, f.error)),
        };
        match attempt {
            Ok(channel) => break channel,
            Err((false, _)) if Instant::now() < deadline => tokio::time::sleep(REDIAL).await,
            Err((_, e)) => {
                return Err(e.context(format!("cannot connect to {peer} from {me}")));
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
