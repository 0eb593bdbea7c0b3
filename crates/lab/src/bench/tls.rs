//! Mutual TLS for the bench's bare gRPC probes (`bench mesh-probe --config`, `bench rpc-server
//! --config`) and the in-process raw client: the floor and the baselines of the `_tls`
//! figures. Everything TLS here is the daemon's own: a node's material is read from its config
//! file as the daemon reads it (`openimex_config::Config::tls_material`) and turned into
//! rustls configurations by `openimex_imexd::tls::Tls` (TLS 1.3, ring, a client certificate
//! required and checked against the CA, ALPN h2). A probe accepts as the daemon does (TCP, then
//! the handshake in a task of its own, then tonic over the TLS stream) and dials as it does
//! (TCP with TCP_NODELAY from its own address, the handshake checking the peer's certificate
//! under its address, then tonic over the TLS stream), so a `_tls` figure over its floor is
//! what the daemon adds, not a difference in how TLS is set up.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use openimex_imexd::tls::{Sides, Tls};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::{Channel, Endpoint, Uri};

/// Limit for one handshake on the accepting side (a stuck peer must not hold a task forever).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept (out of descriptors) before the next, instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// Both sides of the node whose TLS keys `config` holds (a config.cfg with at least the nine
/// keys `openimex certs` prints; every other key keeps its default).
pub(super) fn load(config: &Path) -> Result<Sides> {
    let shown = config.display();
    let cfg = openimex_config::Config::load(config)
        .with_context(|| format!("cannot read the TLS config {shown}"))?;
    let material = cfg
        .tls_material()
        .with_context(|| format!("cannot read the TLS material {shown} names"))?
        .with_context(|| {
            format!(
                "{shown} does not turn TLS on (IMEX_ENABLE_AUTH_ENCRYPTION=1, \
                 IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS)"
            )
        })?;
    let tls = Tls::new(material, None).with_context(|| format!("the material of {shown}"))?;
    Ok(tls.sides())
}

/// An accepted connection after its handshake, for tonic.
pub(super) struct TlsConn {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    /// What tonic's own TCP listener gives each request, so the TLS server does the same work
    /// per request as the plaintext one.
    info: TcpConnectInfo,
}

impl Connected for TlsConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Binds `addr` as tonic's `TcpIncoming::bind` does (the plaintext servers' listener). Call
/// within a runtime.
pub(super) fn bind(addr: SocketAddr) -> Result<TcpListener> {
    let listener =
        std::net::TcpListener::bind(addr).with_context(|| format!("cannot bind {addr}"))?;
    listener
        .set_nonblocking(true)
        .context("cannot make the listener non-blocking")?;
    TcpListener::from_std(listener).context("cannot register the listener with the runtime")
}

/// Connections accepted on `listener` (TCP_NODELAY), each handshaken in a task of its own as
/// the daemon does, so a slow handshake holds up no other. A failed handshake is said on
/// stderr and the connection dropped; the server goes on.
pub(super) fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
) -> ReceiverStream<io::Result<TlsConn>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let (tcp, remote) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    if tx.is_closed() {
                        return;
                    }
                    eprintln!("bench: accept failed: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let info = TcpConnectInfo {
                local_addr: tcp.local_addr().ok(),
                remote_addr: Some(remote),
            };
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(TlsConn { stream, info })).await;
                    }
                    Ok(Err(e)) => eprintln!("bench: TLS handshake with {remote} failed: {e}"),
                    Err(_) => eprintln!(
                        "bench: TLS handshake with {remote} took over {HANDSHAKE_TIMEOUT:?}"
                    ),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Why [`connect`] failed.
#[derive(Debug)]
pub(super) struct DialFailed {
    /// The TCP connection was made and the handshake failed (a certificate refused): trying
    /// again would fail the same way, unlike a port not listening yet.
    pub(super) handshake: bool,
    pub(super) error: anyhow::Error,
}

/// A channel to `to` over mutual TLS, on `endpoint` (its timeouts and HTTP/2 settings), from
/// `from`'s address when given, checking the peer's certificate under `to`'s address (its
/// nodes-file entry, as the daemon checks a peer).
pub(super) async fn connect(
    sides: &Sides,
    endpoint: Endpoint,
    from: Option<IpAddr>,
    to: SocketAddr,
) -> Result<Channel, DialFailed> {
    let name = sides
        .server_name(&to.ip().to_string())
        .map_err(|e| DialFailed {
            handshake: true,
            error: anyhow!(e),
        })?;
    // The handshake's own error, kept: tonic reports only "transport error".
    let refused: Arc<Mutex<Option<String>>> = Arc::default();
    let connector = {
        let (connector, refused) = (sides.connector().clone(), refused.clone());
        tower::service_fn(move |_: Uri| {
            let (connector, name, refused) = (connector.clone(), name.clone(), refused.clone());
            async move {
                let tcp = tcp_from(from, to).await?;
                match connector.connect(name, tcp).await {
                    Ok(stream) => Ok(hyper_util::rt::TokioIo::new(stream)),
                    Err(e) => {
                        if let Ok(mut slot) = refused.lock() {
                            *slot = Some(e.to_string());
                        }
                        Err(e)
                    }
                }
            }
        })
    };
    endpoint
        .connect_with_connector(connector)
        .await
        .map_err(|e| {
            let why = refused.lock().ok().and_then(|mut s| s.take());
            DialFailed {
                handshake: why.is_some(),
                error: match why {
                    Some(why) => anyhow!("TLS handshake with {to} failed: {why}"),
                    None => anyhow::Error::new(e).context(format!("cannot connect to {to}")),
                },
            }
        })
}

/// A TCP connection to `to` with TCP_NODELAY, leaving from `from` when given.
async fn tcp_from(from: Option<IpAddr>, to: SocketAddr) -> io::Result<TcpStream> {
    let socket = match to {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    if let Some(ip) = from {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let stream = socket.connect(to).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use openimex_harness::bench::ProbeTls;
    use openimex_proto::cmd::StateRequest;
    use openimex_proto::cmd::command_client::CommandClient;

    fn loopback(n: usize) -> Vec<String> {
        vec!["127.0.0.1".to_owned(); n]
    }

    /// The raw server over TLS answers a client with a certificate of the same CA, and a
    /// client of another CA refuses the server in its handshake (no redial could help).
    #[test]
    fn a_call_over_the_daemons_tls_and_a_stranger_refused() {
        let domain = ProbeTls::make(&loopback(2)).expect("certificates");
        let other = ProbeTls::make(&loopback(1)).expect("another CA's certificate");
        let side = |files: &ProbeTls, i| load(files.config(i).expect("a config")).expect("load");
        let (server, client, stranger) = (side(&domain, 0), side(&domain, 1), side(&other, 0));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let any = SocketAddr::from(([127, 0, 0, 1], 0));
            let (addr, serve) = super::super::rpc::constant_server_tls(any, &server).expect("bind");
            tokio::spawn(serve);
            let endpoint = Endpoint::from_shared(format!("http://{addr}"))
                .expect("endpoint")
                .connect_timeout(Duration::from_secs(5));
            let channel = connect(&client, endpoint.clone(), None, addr)
                .await
                .expect("a TLS connection");
            let reply = CommandClient::new(channel)
                .state(StateRequest {})
                .await
                .expect("a call over TLS");
            assert_eq!(reply.into_inner().state, "READY");
            let refused = connect(&stranger, endpoint, None, addr)
                .await
                .expect_err("another CA's server certificate was accepted");
            assert!(refused.handshake, "{:#}", refused.error);
            assert!(
                format!("{:#}", refused.error).contains("TLS handshake"),
                "{:#}",
                refused.error
            );
        });
    }

    #[test]
    fn a_config_without_tls_is_refused_with_the_keys_to_set() {
        let dir = openimex_harness::ScratchDir::new("bench-tls-off").expect("scratch");
        let path = dir.path().join("plain.cfg");
        std::fs::write(&path, "IMEX_ENABLE_AUTH_ENCRYPTION=0\n").expect("write");
        let Err(err) = load(&path) else {
            panic!("TLS is off in that file, yet it loaded");
        };
        assert!(
            format!("{err:#}").contains("does not turn TLS on"),
            "{err:#}"
        );
        let Err(err) = load(&dir.path().join("missing.cfg")) else {
            panic!("a missing file loaded");
        };
        assert!(
            format!("{err:#}").contains("cannot read the TLS config"),
            "{err:#}"
        );
    }
}
