//! The framing of the simulated driver's socket: a 4-byte big-endian length and a body, with
//! descriptors (SCM_RIGHTS) on the frame's first byte; the JSON messages of the `proto` module
//! and the escape frames of [`crate::escape`] share it. Generic over the messages, so that
//! `proto` builds on it and not the other way round. Each thread keeps its framing buffers, so
//! a call allocates nothing for its bytes once the thread has made one.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};

/// Largest accepted message.
pub const MAX_MESSAGE: usize = 64 << 20;

/// Errors of the transport (not of the driver's semantics, which are `NvStatus`).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Socket I/O.
    #[error("driver socket: {0}")]
    Io(#[from] std::io::Error),
    /// sendmsg/recvmsg.
    #[error("driver socket: {0}")]
    Sys(#[from] nix::Error),
    /// Bad JSON.
    #[error("driver protocol: {0}")]
    Json(#[from] serde_json::Error),
    /// Oversized frame.
    #[error("driver protocol: message of {0} bytes is larger than allowed")]
    TooLarge(usize),
    /// The peer closed the connection.
    #[error("driver socket closed")]
    Closed,
    /// An escape frame that does not decode.
    #[error("malformed escape frame: {0}")]
    Escape(crate::escape::FrameError),
}

/// Writes one message, attaching `fds` (may be empty).
///
/// The whole frame goes in one `sendmsg` (the descriptors ride on its first byte), so the
/// reader is woken once per message, not once for a lone first byte and again for the rest.
pub fn send<T: Serialize>(sock: &UnixStream, msg: &T, fds: &[RawFd]) -> Result<(), WireError> {
    with_scratch(|scratch| send_in(&mut scratch.frame, sock, msg, fds))
}

fn send_in<T: Serialize>(
    frame: &mut Vec<u8>,
    sock: &UnixStream,
    msg: &T,
    fds: &[RawFd],
) -> Result<(), WireError> {
    frame.clear();
    serde_json::to_writer(&mut *frame, msg)?;
    send_frame(sock, frame, fds)
}

/// Writes one frame (`body` behind its length) in one `sendmsg`, with `fds` on its first byte:
/// JSON messages ([`send`]) and escape frames alike.
pub fn send_frame(sock: &UnixStream, body: &[u8], fds: &[RawFd]) -> Result<(), WireError> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    if body.len() > MAX_MESSAGE {
        return Err(WireError::TooLarge(body.len()));
    }
    let len = u32::try_from(body.len())
        .map_err(|_| WireError::TooLarge(body.len()))?
        .to_be_bytes();
    let iov = [IoSlice::new(&len), IoSlice::new(body)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
    let sent = sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None)?;
    if sent == 0 {
        return Err(WireError::Closed);
    }
    // A large frame may go in part; the rest carries no descriptors.
    if sent < 4 {
        (&*sock).write_all(&len[sent..])?;
        (&*sock).write_all(body)?;
    } else {
        (&*sock).write_all(&body[sent - 4..])?;
    }
    Ok(())
}

/// Appends one frame to `out`, its body written by `body` behind its length, for several
/// frames without descriptors written at once ([`send_frames`]): the frame [`send_frame`]
/// would send, built in place.
pub fn push_frame(out: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) -> Result<(), WireError> {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    body(out);
    let len = out.len() - at - 4;
    if len > MAX_MESSAGE {
        out.truncate(at);
        return Err(WireError::TooLarge(len));
    }
    let header = u32::try_from(len).map_err(|_| WireError::TooLarge(len))?;
    out[at..at + 4].copy_from_slice(&header.to_be_bytes());
    Ok(())
}

/// Writes frames laid out by [`push_frame`] in one call: the reader is woken once for all
/// of them, and reads them one by one as if each had come alone.
pub fn send_frames(sock: &UnixStream, frames: &[u8]) -> Result<(), WireError> {
    (&*sock).write_all(frames)?;
    Ok(())
}

/// A thread's buffers for framing: a message is encoded into and read into memory the thread
/// keeps, so a call costs no allocation for its bytes or its control-message space. Every
/// import crosses this protocol several times on each node (the event, the describe, the
/// validate, the answer to the application), and this is the driver's hot path.
struct Scratch {
    /// A frame being written, or the body of one being read.
    frame: Vec<u8>,
    /// Room for the descriptors of one message ([`SCM_MAX_FD`]).
    cmsg: Vec<u8>,
}

impl Scratch {
    fn new() -> Self {
        Self {
            frame: Vec::with_capacity(512),
            cmsg: nix::cmsg_space!([RawFd; SCM_MAX_FD]),
        }
    }
}

/// A frame buffer larger than this after a message is let go rather than kept: one large
/// message (a long page list) must not pin its size in every thread that saw one.
const KEEP_FRAME: usize = 64 << 10;

thread_local! {
    static SCRATCH: std::cell::Cell<Option<Scratch>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` on this thread's [`Scratch`], taken out for the call (a nested call, or one made
/// while the thread exits, gets a fresh one) and put back after unless it grew too large.
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut scratch = SCRATCH
        .try_with(std::cell::Cell::take)
        .ok()
        .flatten()
        .unwrap_or_else(Scratch::new);
    let out = f(&mut scratch);
    if scratch.frame.capacity() <= KEEP_FRAME {
        let _ = SCRATCH.try_with(|cell| cell.set(Some(scratch)));
    }
    out
}

/// Linux's SCM_MAX_FD: the most descriptors one SCM_RIGHTS message carries.
pub(crate) const SCM_MAX_FD: usize = 253;

/// Reads one message and the descriptors that came with it, waiting at most the socket's read
/// timeout for it.
pub fn recv<T: for<'de> Deserialize<'de>>(
    sock: &UnixStream,
) -> Result<(T, Vec<OwnedFd>), WireError> {
    recv_within(sock, sock.read_timeout()?)
}

/// [`recv`] for a caller that knows how long it waits (`None`: for as long as it takes), which
/// spares asking the kernel for the socket's read timeout on every message of a connection that
/// has none.
pub fn recv_within<T: for<'de> Deserialize<'de>>(
    sock: &UnixStream,
    timeout: Option<std::time::Duration>,
) -> Result<(T, Vec<OwnedFd>), WireError> {
    wait_readable(sock, timeout)?;
    recv_arrived(sock)
}

/// Reads a message whose first byte the caller saw readable (a frame is written in one piece,
/// so the rest is there): no wait before the read.
pub fn recv_arrived<T: for<'de> Deserialize<'de>>(
    sock: &UnixStream,
) -> Result<(T, Vec<OwnedFd>), WireError> {
    with_scratch(|scratch| recv_in(scratch, sock))
}

fn recv_in<T: for<'de> Deserialize<'de>>(
    scratch: &mut Scratch,
    sock: &UnixStream,
) -> Result<(T, Vec<OwnedFd>), WireError> {
    let fds = read_frame(scratch, sock)?;
    Ok((serde_json::from_slice(&scratch.frame)?, fds))
}

/// A frame of either kind, as the driver reads it from a connection that carries both the
/// application library's JSON requests (`R`) and escapes ([`crate::escape`]).
#[derive(Debug)]
pub enum Incoming<R> {
    /// A JSON request.
    Json(R),
    /// An escape, with the descriptors that came with it.
    Escape(crate::escape::EscapeCall),
}

/// Reads one frame of either kind, waiting for it as long as it takes.
///
/// A JSON frame that does not parse is [`WireError::Json`] and an escape frame that does not
/// decode is [`WireError::Escape`]: both were read whole, so the stream stays in step.
pub fn recv_incoming<R: for<'de> Deserialize<'de>>(
    sock: &UnixStream,
) -> Result<Incoming<R>, WireError> {
    wait_readable(sock, None)?;
    with_scratch(|scratch| {
        let fds = read_frame(scratch, sock)?;
        match crate::escape::classify(&scratch.frame) {
            crate::escape::Body::Escape(body) => Ok(Incoming::Escape(
                crate::escape::decode_call(body, fds).map_err(WireError::Escape)?,
            )),
            crate::escape::Body::Json(body) => Ok(Incoming::Json(serde_json::from_slice(body)?)),
        }
    })
}

/// Reads one frame's body into `out` (its length behind the 4-byte header), waiting as long as
/// it takes, and returns the descriptors that came with it.
pub fn recv_body(sock: &UnixStream, out: &mut Vec<u8>) -> Result<Vec<OwnedFd>, WireError> {
    wait_readable(sock, None)?;
    with_scratch(|scratch| {
        let fds = read_frame(scratch, sock)?;
        out.clear();
        out.extend_from_slice(&scratch.frame);
        Ok(fds)
    })
}

/// Reads one frame: its body into `scratch.frame`, its descriptors returned.
fn read_frame(scratch: &mut Scratch, sock: &UnixStream) -> Result<Vec<OwnedFd>, WireError> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut header = [0u8; 4];
    let mut fds = Vec::new();
    let got = {
        // The length in one call when it is all there (it is, as `send` writes a frame at
        // once); the descriptors come with its first byte.
        let mut iov = [IoSliceMut::new(&mut header)];
        // Room for the most descriptors one message can carry (the kernel's SCM_MAX_FD):
        // with less, a peer sending more gets the message truncated (MSG_CTRUNC), nix then
        // refuses to list the descriptors the kernel did install in this process, and they
        // would leak, one connection after another, until the table is full.
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut scratch.cmsg[..]),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        if msg.bytes == 0 {
            return Err(WireError::Closed);
        }
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // SAFETY: the kernel just installed this descriptor in our table for us;
                    // nothing else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        msg.bytes
    };
    (&*sock).read_exact(&mut header[got..])?;
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_MESSAGE {
        return Err(WireError::TooLarge(len));
    }
    let body = &mut scratch.frame;
    body.clear();
    body.resize(len, 0);
    (&*sock).read_exact(body)?;
    Ok(fds)
}

/// Waits until `sock` has input (or its peer hung up). A thread blocked in `recvmsg` itself is
/// woken each time the other end reads what this end wrote (the kernel wakes every waiter on a
/// unix socket when write space frees up): one needless context switch per call of this
/// request/response protocol, on both ends, which an ioctl of the real driver does not cost.
/// `poll` for input is woken for input only. `timeout` bounds the wait as a read timeout set
/// on the socket bounds a read.
fn wait_readable(sock: &UnixStream, timeout: Option<std::time::Duration>) -> Result<(), WireError> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let timeout = match timeout {
        None => PollTimeout::NONE,
        Some(t) => PollTimeout::try_from(t).unwrap_or(PollTimeout::MAX),
    };
    loop {
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Err(nix::errno::Errno::EINTR) => {}
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::WouldBlock).into()),
            done => return done.map(drop).map_err(WireError::from),
        }
    }
}
