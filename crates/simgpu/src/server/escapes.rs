//! The escapes' socket glue: one escape frame of a connection (one open file of
//! `/dev/nvidiactl`) served by the escape layer ([`crate::rmapi`]) under the driver's locks,
//! the reply frame, the trace line, and what the kernel knows of the calling process that the
//! escape layer asks for (is it an administrator, does it hold a GPU's device file open).
//!
//! Lock order: the escape layer's lock, then the state machine's ([`Shared::rm`]); nothing
//! that holds the second takes the first.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::fcntl::AtFlags;
use nix::sys::socket::{MsgFlags, recv};
use nix::sys::stat::fstatat;
use openimex_rmabi::class::NV_IMEX_SESSION;
use openimex_rmabi::escape::{NV_ESC_RM_ALLOC, NVOS64_PARAMETERS};
use openimex_simproto::escape::{self, EscapeCall};
use openimex_simproto::node_dir::gpu_device_path;
use zerocopy::FromBytes;

use super::Shared;
use crate::rm::ClientId;
use crate::rmapi::{Caller, RmApi};

/// How long a new session's allocation waits for the teardown of a session whose file was
/// closed (its connection's thread does it as soon as it sees the hang-up; this bounds a
/// stuck one). On a real node the kernel closes a dead process's files before anyone can
/// observe it dead, so a successor never finds its predecessor's session.
const PREDECESSOR_TEARDOWN: Duration = Duration::from_secs(5);

impl Shared {
    pub(super) fn api(&self) -> MutexGuard<'_, RmApi> {
        self.api.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Signals the IMEX session's OS event if events were queued since it last was.
    pub(super) fn post_os_event(&self) {
        let mut api = self.api();
        let rm = self.rm();
        api.post_os_event(&rm);
    }

    /// Whether the file (connection) holding the node's IMEX session is closed at the other
    /// end and not yet torn down.
    fn session_holder_gone(&self) -> bool {
        let api = self.api();
        let rm = self.rm();
        let holder = api.session_file().or_else(|| rm.session_client());
        drop(rm);
        drop(api);
        holder.is_some_and(|c| self.hung_up(c))
    }
}

/// What `nv_is_gpu_accessible` looks among: the device and inode of every file the calling
/// process holds open (its `/proc/<pid>/fd` entries), read once for a batch of escapes and
/// again for the next. A batch is the calls a client sent before reading an answer: the
/// simulated transport pipelines consecutive ioctls of one thread (`openimex_driver`'s
/// `calls_each`: a daemon's start sends its four GPUs' Device allocations in one write), and
/// the process cannot open or close a file between them, so one read serves them all. Reading
/// at every allocation was a third of the driver's CPU at a daemon's start (the bench's
/// `formation_18` under `perf`), each lookup of `/proc/<pid>/fd/<n>` making an inode.
#[derive(Debug, Default)]
pub(super) struct HeldFiles {
    /// The last read, if it may still serve.
    read: RefCell<Option<Held>>,
    /// The call being served was sent before the last answer went out (same batch).
    batch: Cell<bool>,
}

/// One read of a process's descriptors.
#[derive(Debug)]
enum Held {
    /// The (device, inode) of each.
    Files(HashSet<(u64, u64)>),
    /// They could not be read (another user's process, with the driver not root): the
    /// simulation cannot tell, and refusing would stop a daemon the kernel would serve.
    Unknown,
}

impl HeldFiles {
    /// A frame arrived: unless the last answer found it queued already, the client may have
    /// read that answer and opened or closed files since, so the next check reads again.
    pub(super) fn next_call(&self) {
        if !self.batch.take() {
            self.read.borrow_mut().take();
        }
    }

    /// An answer goes out on `stream`: a call queued behind it is of the same batch. Looked
    /// at only while a read is kept: most calls (an import's) check no file, and pay no peek.
    fn answering(&self, stream: &UnixStream) {
        let kept = self.read.borrow().is_some();
        self.batch.set(kept && next_frame_queued(stream));
    }

    /// Whether process `pid` holds the file at `path` open. An unknown peer is let through,
    /// as is a process whose descriptors cannot be read ([`Held::Unknown`]).
    fn holds(&self, pid: Option<i32>, path: &Path) -> bool {
        let Some(pid) = pid else {
            return true;
        };
        let Ok(want) = fs::metadata(path) else {
            return false;
        };
        let mut held = self.read.borrow_mut();
        match held.get_or_insert_with(|| read_held(pid)) {
            Held::Files(files) => files.contains(&(want.dev(), want.ino())),
            Held::Unknown => true,
        }
    }
}

/// Whether the client already sent its next frame (a batch goes on).
fn next_frame_queued(stream: &UnixStream) -> bool {
    let mut byte = [0u8; 1];
    recv(
        stream.as_raw_fd(),
        &mut byte,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    )
    .is_ok_and(|n| n > 0)
}

/// Serves one escape `call` of connection `file` and answers it on `stream`. Returns false
/// when the answer could not be sent (the connection is gone).
pub(super) fn serve(
    shared: &Shared,
    file: ClientId,
    stream: &UnixStream,
    call: &EscapeCall,
    held: &HeldFiles,
) -> bool {
    if allocates_session(call) {
        let until = Instant::now() + PREDECESSOR_TEARDOWN;
        while Instant::now() < until && shared.session_holder_gone() {
            let rm = shared.rm();
            drop(shared.wait(rm, Some(until)));
        }
    }
    let peer = shared
        .peers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&file)
        .copied();
    let pid = peer.map(|p| p.pid);
    // `osIsAdministrator`: the peer's uid is 0 (the simulation's stand-in for CAP_SYS_ADMIN).
    let admin = peer.is_some_and(|p| p.uid == 0);
    let node_dir = shared.node_dir.clone();
    let gpu_accessible = move |gpu: u32| held.holds(pid, &gpu_device_path(&node_dir, gpu));
    let caller = Caller {
        file,
        admin,
        gpu_accessible: &gpu_accessible,
    };
    let served = {
        let mut api = shared.api();
        let mut rm = shared.rm();
        let served = api.serve(&mut rm, &caller, call);
        // Killed under the lock, as a session teardown's are (`super::disconnect`).
        shared.kill_revoked(rm.take_revoked());
        served
    };
    if let Some(trace) = &shared.trace {
        let mut f = trace.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = writeln!(f, "{}", served.trace) {
            tracing::warn!("cannot write the escape trace: {e}");
        }
    }
    tracing::debug!(file, "{}", served.trace);
    shared.after_change();
    if served.wakes {
        shared.answer_parked();
        shared.changed.notify_all();
    }
    held.answering(stream);
    let mut body = Vec::with_capacity(16 + served.reply.arg.len() + served.reply.params.len());
    escape::encode_reply(&mut body, call.nr, &served.reply);
    openimex_simproto::frame::send_frame(stream, &body, &[]).is_ok()
}

/// Whether `call` is RM_ALLOC of NV_IMEX_SESSION.
fn allocates_session(call: &EscapeCall) -> bool {
    call.nr == NV_ESC_RM_ALLOC
        && NVOS64_PARAMETERS::read_from_prefix(&call.arg)
            .is_ok_and(|(p, _)| p.hClass == NV_IMEX_SESSION)
}

/// The files process `pid` holds open (its `/proc/<pid>/fd` entries, by device and inode).
/// Each entry is looked up relative to the open directory, not by its whole path: walking
/// `/proc/<pid>/fd/<n>` from the root for every descriptor was a tenth of the driver's time at
/// a daemon's start.
fn read_held(pid: i32) -> Held {
    let fds = format!("/proc/{pid}/fd");
    let (dir, entries) = match fs::File::open(&fds).and_then(|d| Ok((d, fs::read_dir(&fds)?))) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!(pid, "cannot read the descriptors of the caller: {e}");
            return Held::Unknown;
        }
    };
    let files = entries.flatten().filter_map(|entry| {
        fstatat(&dir, entry.file_name().as_os_str(), AtFlags::empty())
            .ok()
            .map(|m| (m.st_dev, m.st_ino))
    });
    Held::Files(files.collect())
}
