//! A dialled connection's first writes, held until the first flush and sent as one.
//!
//! The HTTP/2 client writes its connection preface by itself, unflushed, and then its SETTINGS
//! frame with a flush: two segments (over TLS, two records and two segments) where the peer
//! needs one, on every connection a daemon dials. Held together, the dial costs one `sendmsg`
//! fewer on this side and one wake-up and read fewer on the peer's: 1 of the 8 segments a
//! session's set-up exchanges (traced with `strace` on two daemons, 2026-12-07). After the
//! first flush every write goes straight through, so nothing a session sends later waits.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most held before the first flush (the preface and SETTINGS are under 100 bytes): past
/// it, what is held goes out at once.
const HOLD_LIMIT: usize = 4096;

/// `T` whose writes wait for the first flush (see the module docs).
#[derive(Debug)]
pub(super) struct Corked<T> {
    inner: T,
    /// Writes held so far, while corked.
    held: Vec<u8>,
    /// How much of `held` the inner stream has taken (a drain that returned pending).
    sent: usize,
    corked: bool,
}

impl<T> Corked<T> {
    pub(super) fn new(inner: T) -> Self {
        Self {
            inner,
            held: Vec::new(),
            sent: 0,
            corked: true,
        }
    }
}

impl<T: AsyncWrite + Unpin> Corked<T> {
    /// Writes out what is held and goes through from then on.
    fn poll_uncork(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.held.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.held[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.held = Vec::new();
        self.sent = 0;
        self.corked = false;
        Poll::Ready(Ok(()))
    }

    /// Holds `len` more bytes, appended by `append`, when there is room.
    fn hold(&mut self, len: usize, append: impl FnOnce(&mut Vec<u8>)) -> bool {
        if self.corked && self.held.len() + len <= HOLD_LIMIT {
            append(&mut self.held);
            return true;
        }
        false
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Corked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Corked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.hold(buf.len(), |held| held.extend_from_slice(buf)) {
            return Poll::Ready(Ok(buf.len()));
        }
        if this.corked {
            ready!(this.poll_uncork(cx))?;
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let len = bufs.iter().map(|b| b.len()).sum();
        if this.hold(len, |held| {
            bufs.iter().for_each(|b| held.extend_from_slice(b))
        }) {
            return Poll::Ready(Ok(len));
        }
        if this.corked {
            ready!(this.poll_uncork(cx))?;
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.corked {
            ready!(this.poll_uncork(cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.corked {
            ready!(this.poll_uncork(cx))?;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    /// Everything the peer has to read now, without waiting.
    fn readable_now(peer: &UnixStream) -> Vec<u8> {
        let mut buf = [0u8; 8192];
        match peer.try_read(&mut buf) {
            Ok(n) => buf[..n].to_vec(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Vec::new(),
            Err(e) => panic!("read: {e}"),
        }
    }

    #[tokio::test]
    async fn the_writes_before_the_first_flush_leave_together_and_later_ones_at_once() {
        let (ours, peer) = UnixStream::pair().unwrap();
        let mut io = Corked::new(ours);
        io.write_all(b"PRI * HTTP/2.0").await.unwrap();
        assert!(readable_now(&peer).is_empty(), "held until the flush");
        io.write_all(b"|SETTINGS").await.unwrap();
        io.flush().await.unwrap();
        peer.readable().await.unwrap();
        assert_eq!(
            readable_now(&peer),
            b"PRI * HTTP/2.0|SETTINGS",
            "one write, one read"
        );
        io.write_all(b"HEADERS").await.unwrap();
        peer.readable().await.unwrap();
        assert_eq!(readable_now(&peer), b"HEADERS", "uncorked: no flush needed");
    }

    #[tokio::test]
    async fn more_than_the_limit_is_not_held() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mut io = Corked::new(ours);
        io.write_all(b"preface").await.unwrap();
        let big = vec![7u8; HOLD_LIMIT];
        io.write_all(&big).await.unwrap();
        let mut got = vec![0u8; 7 + HOLD_LIMIT];
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            peer.read_exact(&mut got),
        )
        .await
        .expect("sent without a flush")
        .unwrap();
        assert_eq!(&got[..7], b"preface", "what was held goes first");
        assert!(got[7..].iter().all(|&b| b == 7));
    }

    #[tokio::test]
    async fn a_shutdown_sends_what_is_held() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mut io = Corked::new(ours);
        io.write_all(b"bye").await.unwrap();
        io.shutdown().await.unwrap();
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"bye");
    }
}
