//! How the `nvidia` backend's bytes reach the driver: the one seam between the daemon and
//! either the kernel module or the simulated driver, with nothing else between them.
//!
//! - [`Ctl::Kernel`]: `ioctl(2)` on a descriptor of `/dev/nvidiactl` (a character device);
//!   the OS event is a second descriptor of it, which `poll(2)` reports readable after the
//!   driver posts an event (`nvidia_poll` clears the pending flag as it reports it).
//! - [`Ctl::Sim`]: the simulated driver's unix socket, found at the same path under a node
//!   directory; each ioctl is one escape frame ([`openimex_simproto::escape`]) with the same
//!   escape number and argument and parameter bytes, and the descriptors the kernel would
//!   resolve by number passed with SCM_RIGHTS. The OS event is an `eventfd` handed to the
//!   driver with NV_ESC_ALLOC_OS_EVENT; reading it is what the kernel's poll does to the
//!   pending flag.
//!
//! Which one is decided by what the file at `<driver root>/dev/nvidiactl` is.

use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use openimex_simproto::escape;
use smallvec::SmallVec;

/// `_IOC_NR` of an escape, and `_IOWR('F', nr, size)` for the kernel.
pub use openimex_rmabi::escape::iowr;

thread_local! {
    /// The frame of this thread's calls to the simulated driver (kept: the largest the daemon
    /// sends, GET_FABRIC_EVENTS, is 11 KiB).
    static FRAME: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Errors of one call through the transport.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The ioctl itself failed (the kernel's -1 with errno, or the same from the simulated
    /// driver): a malformed call, not an RM status.
    #[error("ioctl {nr:#04x} failed: {errno}")]
    Errno {
        /// The escape number.
        nr: u8,
        /// Why.
        errno: nix::errno::Errno,
    },
    /// The driver went away mid-call (the socket closed, or a frame that does not decode).
    #[error("lost the GPU driver at {}: {detail}", path.display())]
    Lost {
        /// The control device.
        path: PathBuf,
        /// What happened.
        detail: String,
    },
}

/// The OS event of the daemon's client (NV_ESC_ALLOC_OS_EVENT, NV_IMEX_SESSION's `pOsEvent`).
#[derive(Debug)]
pub struct OsEvent {
    /// The number it is registered under (`fd` of ALLOC_OS_EVENT, `pOsEvent`).
    pub number: RawFd,
    /// The descriptor to wait on.
    pub poll: OwnedFd,
    /// The descriptor ALLOC_OS_EVENT registers, when it is not `poll` (the simulated driver's
    /// end of the pair): passed with the escape, then closed ([`OsEvent::registered`]).
    pub register: Option<OwnedFd>,
}

impl OsEvent {
    /// The descriptor ALLOC_OS_EVENT is issued on and passes.
    pub fn to_register(&self) -> BorrowedFd<'_> {
        self.register
            .as_ref()
            .map_or_else(|| self.poll.as_fd(), AsFd::as_fd)
    }

    /// ALLOC_OS_EVENT succeeded: the driver holds the registered end now.
    pub fn registered(&mut self) {
        self.register = None;
    }
}

/// Most bytes [`Ctl::ioctls`] sends and reads back in one go (requests and answers of a batch
/// of a dozen allocations or probes are a few KiB; a unix socket buffers about 200 KiB).
const BATCH_BYTES: usize = 64 << 10;

/// Calls of a batch kept without a heap allocation: an import's exporter makes 3, a start 2 +
/// 3 per GPU (a batch of more spills to the heap). The single calls allocate nothing once a
/// thread has made one, and a batch must not cost an import more.
pub(crate) const INLINE_CALLS: usize = 16;

/// Each escape's outcome in a batch ([`Ctl::ioctls`]), in order.
pub(crate) type Outcomes = SmallVec<[Result<(), TransportError>; INLINE_CALLS]>;

/// One escape of [`Ctl::ioctls`]: as [`Ctl::ioctl`] takes it, with no descriptors.
#[derive(Debug)]
pub(crate) struct Escape<'a> {
    /// The escape number.
    pub(crate) nr: u8,
    /// The argument (in and out); an RM call's pointer field set to `params`.
    pub(crate) arg: &'a mut [u8],
    /// The parameters (in and out).
    pub(crate) params: &'a mut [u8],
}

/// An open `/dev/nvidiactl`.
#[derive(Debug)]
pub enum Ctl {
    /// The kernel module's character device.
    Kernel {
        /// The descriptor.
        fd: OwnedFd,
        /// Its path, for errors.
        path: PathBuf,
    },
    /// The simulated driver's socket. One call at a time on it, as one frame answers one
    /// frame (a batch of calls is its frames sent together and answered in turn); the
    /// daemon's calls take microseconds, so they queue behind one another here where on the
    /// kernel's descriptor they would run side by side.
    Sim {
        /// The connection.
        sock: Mutex<UnixStream>,
        /// Its path, for errors.
        path: PathBuf,
    },
}

/// Why `/dev/nvidiactl` could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Nothing at the path: no driver loaded (or the wrong driver root).
    #[error("{} does not exist", .0.display())]
    Missing(PathBuf),
    /// Something else went wrong opening it.
    #[error("cannot open {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is neither a character device nor a socket.
    #[error("{} is neither the driver's character device nor the simulated driver's socket", .0.display())]
    NotADevice(PathBuf),
}

impl Ctl {
    /// Opens `<root>/dev/nvidiactl`: a character device is the kernel's, a socket the
    /// simulated driver's.
    pub fn open(path: &Path) -> Result<Self, OpenError> {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(OpenError::Missing(path.to_path_buf()));
            }
            Err(source) => {
                return Err(OpenError::Io {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let io = |source| OpenError::Io {
            path: path.to_path_buf(),
            source,
        };
        let ft = meta.file_type();
        if ft.is_char_device() {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(nix::libc::O_CLOEXEC)
                .open(path)
                .map_err(io)?;
            Ok(Self::Kernel {
                fd: file.into(),
                path: path.to_path_buf(),
            })
        } else if ft.is_socket() {
            let sock = UnixStream::connect(path).map_err(io)?;
            Ok(Self::Sim {
                sock: Mutex::new(sock),
                path: path.to_path_buf(),
            })
        } else {
            Err(OpenError::NotADevice(path.to_path_buf()))
        }
    }

    /// "kernel" or "sim".
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Kernel { .. } => "kernel",
            Self::Sim { .. } => "sim",
        }
    }

    /// The control device's path.
    pub fn path(&self) -> &Path {
        match self {
            Self::Kernel { path, .. } | Self::Sim { path, .. } => path,
        }
    }

    /// The OS event of NV_ESC_ALLOC_OS_EVENT. The kernel's is another open of the control
    /// device, registered under its own number and polled. The simulated driver's is one end
    /// of a socket pair registered with the driver (which posts by writing to it) and then
    /// closed here, while the other end is polled: it turns readable on a post, and reads
    /// end-of-file when the driver is gone (as the kernel's reports POLLHUP for a lost GPU).
    pub fn open_event(&self) -> Result<OsEvent, OpenError> {
        match self {
            Self::Kernel { path, .. } => {
                // Blocking: `nvidia_poll` puts a waiter on the file's wait queue only when
                // O_NONBLOCK is clear, so poll(2) and epoll would never be woken by a post on
                // a non-blocking descriptor. It is only polled, never read.
                let fd: OwnedFd = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(nix::libc::O_CLOEXEC)
                    .open(path)
                    .map(OwnedFd::from)
                    .map_err(|source| OpenError::Io {
                        path: path.clone(),
                        source,
                    })?;
                Ok(OsEvent {
                    number: fd.as_raw_fd(),
                    poll: fd,
                    register: None,
                })
            }
            Self::Sim { path, .. } => {
                use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
                let (posted, polled) = socketpair(
                    AddressFamily::Unix,
                    SockType::Stream,
                    None,
                    SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
                )
                .map_err(|e| OpenError::Io {
                    path: path.clone(),
                    source: e.into(),
                })?;
                Ok(OsEvent {
                    number: posted.as_raw_fd(),
                    poll: polled,
                    register: Some(posted),
                })
            }
        }
    }

    /// Takes the pending mark off the OS event after it was reported readable, before the
    /// events are drained (the kernel's `nvidia_poll` does it as it reports; the simulated
    /// driver's posts are read). End-of-file there is the simulated driver gone.
    pub fn consume_event(&self, event: &OsEvent) -> Result<(), TransportError> {
        if let Self::Sim { path, .. } = self {
            let mut buf = [0u8; 256];
            loop {
                match nix::unistd::read(event.poll.as_fd(), &mut buf) {
                    Ok(0) => {
                        return Err(TransportError::Lost {
                            path: path.clone(),
                            detail: "the simulated driver closed its OS event (it is gone)".into(),
                        });
                    }
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(_) => return Ok(()),
                }
            }
        }
        Ok(())
    }

    /// Waits up to `wait` for the OS event; true if it was reported readable (and is consumed).
    pub fn wait_event(&self, event: &OsEvent, wait: Duration) -> Result<bool, TransportError> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let timeout = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(
            event.poll.as_fd(),
            PollFlags::POLLIN | PollFlags::POLLPRI,
        )];
        let ready = match poll(&mut fds, timeout) {
            Ok(n) => n > 0,
            Err(nix::errno::Errno::EINTR) => false,
            Err(errno) => return Err(TransportError::Errno { nr: 0, errno }),
        };
        if ready {
            self.consume_event(event)?;
        }
        Ok(ready)
    }

    /// One escape: `_IOWR('F', nr, arg.len())` with `arg`, whose RM_ALLOC/RM_CONTROL pointer
    /// field the caller set to `params` (the kernel follows it; the simulated driver gets
    /// `params` in the frame). `pass` are the descriptors whose numbers `arg` or `params`
    /// hold, which the kernel resolves in this process's table and the simulated driver gets
    /// with the frame. On return `arg` and `params` hold what the driver copied back.
    pub(crate) fn ioctl(
        &self,
        nr: u8,
        arg: &mut [u8],
        params: &mut [u8],
        pass: &[BorrowedFd<'_>],
    ) -> Result<(), TransportError> {
        self.ioctl_on(None, nr, arg, params, pass)
    }

    /// Escapes whose arguments need nothing from one another's answers, made in order, none
    /// passing descriptors. On the kernel's descriptor they are one `ioctl(2)` after another.
    /// On the simulated driver's socket every frame goes out before the first answer is read:
    /// the driver serves a connection one frame at a time, in the order sent, so it makes them
    /// as it would one by one, and the caller waits for it once instead of once per escape
    /// (the kernel's ioctl has the caller wait for nobody; a round trip to another process
    /// waits to be scheduled twice). Every escape is made; each one's outcome is returned, in
    /// order, and a lost driver as the error of the whole.
    pub(crate) fn ioctls(&self, calls: &mut [Escape<'_>]) -> Result<Outcomes, TransportError> {
        // The answers must fit in the socket's buffer beside the requests, or the driver
        // would wait to write an answer while this thread still writes requests.
        let bytes: usize = calls
            .iter()
            .map(|c| 2 * (c.arg.len() + c.params.len()))
            .sum();
        let (Self::Sim { sock, path }, true) = (self, bytes <= BATCH_BYTES) else {
            let mut done = Outcomes::with_capacity(calls.len());
            for call in calls {
                match self.ioctl(call.nr, call.arg, call.params, &[]) {
                    Err(lost @ TransportError::Lost { .. }) => return Err(lost),
                    outcome => done.push(outcome),
                }
            }
            return Ok(done);
        };
        let lost = |detail: String| TransportError::Lost {
            path: path.clone(),
            detail,
        };
        let sock = sock
            .lock()
            .map_err(|_| lost("connection lock poisoned".into()))?;
        FRAME.with_borrow_mut(|frames| {
            frames.clear();
            for call in calls.iter() {
                openimex_simproto::frame::push_frame(frames, |body| {
                    escape::encode_call(body, call.nr, call.arg, call.params, &[]);
                })
                .map_err(|e| lost(e.to_string()))?;
            }
            openimex_simproto::frame::send_frames(&sock, frames)
                .map_err(|e| lost(e.to_string()))?;
            let mut done = Outcomes::with_capacity(calls.len());
            for call in calls.iter_mut() {
                let _fds = openimex_simproto::proto::recv_body(&sock, frames)
                    .map_err(|e| lost(e.to_string()))?;
                let errno = escape::decode_reply(frames, call.arg, call.params)
                    .map_err(|e| lost(e.to_string()))?;
                done.push(errno_outcome(call.nr, errno));
            }
            Ok(done)
        })
    }

    /// [`Ctl::ioctl`] issued on `on` instead of the control device, for the escapes the
    /// kernel takes on another descriptor (NV_ESC_ALLOC_OS_EVENT is issued on the event fd
    /// itself). The simulated driver gets it on its socket like any other, with `on` among
    /// the passed descriptors.
    pub(crate) fn ioctl_on(
        &self,
        on: Option<BorrowedFd<'_>>,
        nr: u8,
        arg: &mut [u8],
        params: &mut [u8],
        pass: &[BorrowedFd<'_>],
    ) -> Result<(), TransportError> {
        match self {
            Self::Kernel { fd, .. } => {
                let target = on.map_or_else(|| fd.as_raw_fd(), |b| b.as_raw_fd());
                let request = iowr(nr, arg.len());
                // SAFETY: `arg` is a live, exclusively borrowed buffer of exactly the size the
                // request encodes, so the kernel's copy in and out stays inside it; any user
                // pointer inside `arg` was set by the caller (module `rm`, the only one) to
                // `params`, which is exclusively borrowed for this call as well. The
                // descriptor is open for the call (owned by `self`, or borrowed as `on`).
                let ret = unsafe {
                    nix::libc::ioctl(target, request as _, arg.as_mut_ptr().cast::<u8>())
                };
                if ret < 0 {
                    return Err(TransportError::Errno {
                        nr,
                        errno: nix::errno::Errno::last(),
                    });
                }
                Ok(())
            }
            Self::Sim { sock, path } => {
                let lost = |detail: String| TransportError::Lost {
                    path: path.clone(),
                    detail,
                };
                let mut numbers = [0 as RawFd; escape::MAX_FDS];
                let numbers = match numbers.get_mut(..pass.len()) {
                    Some(n) => {
                        for (slot, fd) in n.iter_mut().zip(pass) {
                            *slot = fd.as_raw_fd();
                        }
                        &*n
                    }
                    None => return Err(lost(format!("{} descriptors to pass", pass.len()))),
                };
                let sock = sock
                    .lock()
                    .map_err(|_| lost("connection lock poisoned".into()))?;
                // The frame is built and read in this thread's buffer: a call allocates
                // nothing once the thread has made one.
                let errno = FRAME.with_borrow_mut(|body| {
                    body.clear();
                    escape::encode_call(body, nr, arg, params, numbers);
                    openimex_simproto::frame::send_frame(&sock, body, numbers)
                        .map_err(|e| lost(e.to_string()))?;
                    let _fds = openimex_simproto::proto::recv_body(&sock, body)
                        .map_err(|e| lost(e.to_string()))?;
                    escape::decode_reply(body, arg, params).map_err(|e| lost(e.to_string()))
                })?;
                errno_outcome(nr, errno)
            }
        }
    }
}

/// The simulated driver's answer to escape `nr`: 0, or the errno the kernel's ioctl would have
/// failed with.
fn errno_outcome(nr: u8, errno: i32) -> Result<(), TransportError> {
    match errno {
        0 => Ok(()),
        errno => Err(TransportError::Errno {
            nr,
            errno: nix::errno::Errno::from_raw(errno),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory for test `name` and the control device's path in it.
    fn socket_path(name: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("openimex-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nvidiactl");
        (dir, path)
    }

    /// A character device is the kernel's transport, and its OS event is a blocking open of
    /// it: `nvidia_poll` only queues a waiter on a blocking file (`/dev/null` stands in for
    /// `/dev/nvidiactl`, which this machine lacks).
    #[test]
    fn the_kernels_os_event_is_a_blocking_descriptor() {
        let ctl = Ctl::open(Path::new("/dev/null")).expect("a character device");
        assert_eq!(ctl.kind(), "kernel");
        let event = ctl.open_event().expect("the OS event");
        let flags =
            nix::fcntl::fcntl(event.poll.as_fd(), nix::fcntl::FcntlArg::F_GETFL).expect("F_GETFL");
        assert_eq!(flags & nix::libc::O_NONBLOCK, 0, "O_NONBLOCK set");
        assert_eq!(event.number, event.poll.as_raw_fd());
        assert!(event.register.is_none(), "registered on itself");
    }

    /// A batch reaches the simulated driver whole before its first answer is awaited, and each
    /// call gets its own answer, in order. The driver here reads every frame before it answers
    /// the first: calls made one by one would wait on it for ever (the test would time out).
    #[test]
    fn a_batch_goes_out_before_its_answers_are_read_and_each_call_gets_its_own() {
        use openimex_simproto::escape::{EscapeReply, decode_call, encode_reply};
        let (dir, path) = socket_path("batch");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let driver = std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            let mut calls = Vec::new();
            for _ in 0..3 {
                let mut body = Vec::new();
                let fds = openimex_simproto::proto::recv_body(&sock, &mut body).unwrap();
                calls.push(decode_call(&body, fds).unwrap());
            }
            for call in &calls {
                let reply = EscapeReply {
                    // The third fails as a malformed ioctl would.
                    errno: if call.nr == 0x2c {
                        nix::libc::EINVAL
                    } else {
                        0
                    },
                    arg: call.arg.iter().map(|b| b + 1).collect(),
                    params: call.params.iter().rev().copied().collect(),
                };
                let mut body = Vec::new();
                encode_reply(&mut body, call.nr, &reply);
                openimex_simproto::frame::send_frame(&sock, &body, &[]).unwrap();
            }
            calls.iter().map(|c| c.nr).collect::<Vec<_>>()
        });
        let ctl = Ctl::open(&path).expect("a socket");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut a, mut b, mut c) = ([1u8, 2], [3u8], [5u8]);
            let (mut pa, mut pc) = ([9u8, 8], [7u8, 6, 4]);
            let mut calls = [
                Escape {
                    nr: 0x2a,
                    arg: &mut a,
                    params: &mut pa,
                },
                Escape {
                    nr: 0x2b,
                    arg: &mut b,
                    params: &mut [],
                },
                Escape {
                    nr: 0x2c,
                    arg: &mut c,
                    params: &mut pc,
                },
            ];
            let done = ctl.ioctls(&mut calls).map(|done| {
                done.into_iter()
                    .map(|r| match r {
                        Ok(()) => 0,
                        Err(TransportError::Errno { nr, errno }) => (nr as i32) << 8 | errno as i32,
                        Err(e) => panic!("unexpected {e}"),
                    })
                    .collect::<Vec<_>>()
            });
            let _ = tx.send((done.map_err(|e| e.to_string()), a, b, c, pa, pc));
        });
        let (done, a, b, c, pa, pc) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the batch was answered (its frames all reached the driver)");
        assert_eq!(done, Ok(vec![0, 0, 0x2c << 8 | nix::libc::EINVAL]));
        assert_eq!(
            (a, b, c),
            ([2, 3], [4], [6]),
            "each argument copied back to its call"
        );
        assert_eq!((pa, pc), ([8, 9], [4, 6, 7]), "and each parameter block");
        assert_eq!(
            driver.join().unwrap(),
            vec![0x2a, 0x2b, 0x2c],
            "in the order sent"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The simulated driver's OS event: a post makes it readable, and the driver's end
    /// closing reads as the driver gone.
    #[test]
    fn the_simulated_os_event_reports_posts_and_the_drivers_exit() {
        let (dir, path) = socket_path("transport");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let ctl = Ctl::open(&path).expect("a socket");
        assert_eq!(ctl.kind(), "sim");
        let mut event = ctl.open_event().expect("the OS event");
        let driver_end = event.register.take().expect("the driver's end");
        assert!(
            !ctl.wait_event(&event, Duration::ZERO).unwrap(),
            "nothing posted"
        );
        nix::unistd::write(&driver_end, &1u64.to_ne_bytes()).unwrap();
        assert!(
            ctl.wait_event(&event, Duration::from_secs(5)).unwrap(),
            "a post"
        );
        assert!(!ctl.wait_event(&event, Duration::ZERO).unwrap(), "consumed");
        drop(driver_end);
        assert!(matches!(
            ctl.wait_event(&event, Duration::from_secs(5)),
            Err(TransportError::Lost { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
