//! Re-executing the daemon in place: an unconfigured daemon (placeholder nodes file, see
//! `openimex_imexd::unconfigured`) whose nodes file now names this host, after SIGUSR1.
//!
//! Why exec rather than switching over inside the running process: a configured daemon's node
//! ID, its peer listener (bound to its entry's address) and its node map are fixed at start-up
//! — every peer, the persist record and the core's state machines are keyed to them — and the
//! ordinary start-up path is the one that validates all of it. `execve` of `/proc/self/exe`
//! with the same argv and environment runs exactly that path again, in the *same process*: the
//! PID does not change, so systemd (which sees a reload, `RELOADING=1`) and the Kubernetes DRA
//! driver (which watches the process) see no restart. File descriptors are close-on-exec (Rust
//! opens every one so), so the command listeners are released and bound again by the new image;
//! a stale unix socket file is replaced as at any start.
//!
//! One variable is added for the new image, [`MARKER`], and removed by it at once: it says the
//! process is already in the background (DAEMONIZE must not fork again, which would change the
//! PID) and that the log file must be appended to, not truncated.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use anyhow::anyhow;

/// Set for the re-executed image only (see the module docs).
pub(super) const MARKER: &str = "OPENIMEX_REEXECUTED";

/// Whether this image was started by [`exec`]; removes the marker so that nothing the daemon
/// might spawn inherits it. Call before any thread is started.
pub(super) fn take_marker() -> bool {
    let set = std::env::var_os(MARKER).is_some();
    if set {
        // SAFETY: called from `start`, before the runtime or any other thread exists.
        unsafe { std::env::remove_var(MARKER) };
    }
    set
}

/// Replaces this process's image with `/proc/self/exe`, same argv (`args`, program name first)
/// and environment plus [`MARKER`]. Returns only on failure.
pub(super) fn exec(args: &[OsString]) -> anyhow::Error {
    let Some((arg0, rest)) = args.split_first() else {
        return anyhow!("cannot re-execute the daemon: its argument list is empty");
    };
    let err = std::process::Command::new("/proc/self/exe")
        .arg0(arg0)
        .args(rest)
        .env(MARKER, "1")
        .exec();
    anyhow!(
        "cannot re-execute the daemon (/proc/self/exe) after the nodes file named this host: \
         {err}; restart the service to start it configured"
    )
}
