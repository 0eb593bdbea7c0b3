//! Small pieces every request handler shares: the error answer, a call's deadline, whether the
//! caller hung up, and who may use the daemon's side of the driver. A leaf, so the handlers do not import each other.

use std::fs;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use openimex_simproto::proto::{NvStatus, Response};

/// May the peer of `stream` open the IMEX session? The real driver grants it only with a
/// descriptor of the fabric-imex-mgmt capability, a root-only file
/// (`docs/reference/driver-interface.md` §1.4, §1.5: NV_IMEX_SESSION's `capDescriptor`, validated
/// by osRmCapAcquire). The simulation has no capability file, so it asks the kernel who is
/// calling: root, or the user the driver itself runs as. Otherwise any local user could take
/// the session while no daemon holds it and answer imports with any node's memory.
pub(super) fn may_manage_fabric(stream: &UnixStream) -> bool {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    // /proc/self belongs to this process's effective user.
    let own = fs::metadata("/proc/self").map(|m| m.uid()).ok();
    getsockopt(stream, PeerCredentials).is_ok_and(|c| c.uid() == 0 || Some(c.uid()) == own)
}

pub(super) fn error(status: NvStatus, detail: impl Into<String>) -> Response {
    Response::Error {
        status,
        detail: detail.into(),
    }
}

pub(super) fn deadline(ms: u64) -> Option<Instant> {
    Instant::now().checked_add(Duration::from_millis(ms))
}

/// Whether the other end of `stream` hung up (without consuming anything).
pub(super) fn peer_gone(stream: &UnixStream) -> bool {
    use nix::sys::socket::{MsgFlags, recv};
    let mut b = [0u8; 1];
    match recv(
        stream.as_raw_fd(),
        &mut b,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    ) {
        Ok(0) => true,
        Ok(_) | Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => false,
        Err(_) => true,
    }
}

/// Whether the other end of `stream` is closed for good (its process closed the descriptor or
/// died), even if a request it sent is still unread there.
pub(super) fn hung_up(stream: &UnixStream) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    // A Unix stream socket whose peer closed reports POLLHUP (both directions shut), which
    // poll always reports: no event needs asking for.
    let closed = PollFlags::POLLHUP | PollFlags::POLLERR;
    let mut fds = [PollFd::new(stream.as_fd(), PollFlags::empty())];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) if n > 0 => fds[0].revents().is_some_and(|r| r.intersects(closed)),
        _ => false,
    }
}
