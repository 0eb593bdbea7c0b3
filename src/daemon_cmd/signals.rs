//! Signals the daemon does not act on but whose default action would end it: blocked from the
//! first instruction of the daemon (so no thread ever takes their default action, and one sent
//! during start-up waits instead of killing), then taken one by one from a signalfd on the
//! runtime and logged, at most one line per signal every [`LOG_EVERY`], so a flood of signals
//! cannot flood the log.
//!
//! Which signals (Linux, `man 7 signal`), and why the others are left alone:
//! - Taken here: SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO (= SIGPOLL), SIGPWR, SIGSTKFLT,
//!   SIGXCPU, SIGXFSZ and every real-time signal SIGRTMIN..=SIGRTMAX. A blocked SIGXFSZ also
//!   turns a write past RLIMIT_FSIZE into an EFBIG error instead of a crash; a blocked SIGXCPU
//!   leaves the hard CPU limit (SIGKILL) in force.
//! - Handled by [`super::shutdown_signal`]: SIGTERM, SIGINT, SIGQUIT (a clean stop), SIGHUP
//!   (the verbose log buffer is written to the log) and SIGUSR1 (the nodes file is read again
//!   and its names re-resolved, without a restart).
//! - SIGPIPE: the Rust runtime sets it to ignored before `main`; a write to a closed socket
//!   returns EPIPE.
//! - SIGKILL and SIGSTOP cannot be caught, blocked or ignored.
//! - The synchronous fault signals SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS and SIGABRT
//!   stay at their default action (end the process with a core dump): the kernel raises them
//!   on the faulting instruction (a SIGBUS on a truncated mapped file, a seccomp SIGSYS) or
//!   `abort()` raises SIGABRT itself. A handler that returns re-runs the faulting instruction
//!   forever, and a blocked or ignored synchronous fault kills the process anyway, so the only
//!   honest outcome is the core dump that shows where it happened. Sent with `kill`, they
//!   are the sender asking for exactly that.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::libc;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tracing::warn;

/// At most one log line per signal this often; the ones in between are counted into the next.
pub(super) const LOG_EVERY: Duration = Duration::from_secs(10);

/// The asynchronous signals whose default action ends the process and that the daemon does
/// not act on (see the module documentation for the others).
pub(super) fn ignored() -> Vec<libc::c_int> {
    let mut v = vec![
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGIO,
        libc::SIGPWR,
        libc::SIGSTKFLT,
        libc::SIGXCPU,
        libc::SIGXFSZ,
    ];
    v.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
    v
}

/// `SIGUSR2`, `SIGRTMIN+3`, `SIGRTMAX`.
pub(super) fn name(sig: libc::c_int) -> String {
    let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    match sig {
        s if s == min => "SIGRTMIN".to_owned(),
        s if s == max => "SIGRTMAX".to_owned(),
        s if (min..max).contains(&s) => format!("SIGRTMIN+{}", s - min),
        s => nix::sys::signal::Signal::try_from(s)
            .map(|n| n.as_str().to_owned())
            .unwrap_or_else(|_| format!("signal {s}")),
    }
}

/// The ignored signals, blocked in the thread that called [`block`] and every thread it starts
/// afterwards.
pub(super) struct Blocked {
    set: libc::sigset_t,
}

/// Blocks [`ignored`]. Call while the process has one thread (before the runtime and any
/// driver thread), so that every later thread inherits the mask: a signal is then delivered to
/// no thread but stays pending until [`Blocked::log_on_runtime`] takes it.
pub(super) fn block() -> Result<Blocked> {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set behind the pointer, which is valid for writes;
    // it cannot fail for a valid pointer.
    let mut set = unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        set.assume_init()
    };
    for sig in ignored() {
        // SAFETY: `set` is an initialised sigset_t owned by this frame; sigaddset only checks
        // the number and sets one bit.
        if unsafe { libc::sigaddset(&mut set, sig) } != 0 {
            bail!(
                "cannot add {} to a signal set: {}",
                name(sig),
                std::io::Error::last_os_error()
            );
        }
    }
    // SAFETY: both pointers are valid (the old mask is not asked for); this changes only the
    // calling thread's mask.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        bail!(
            "cannot block the signals the daemon ignores (SIGUSR2, SIGALRM, ...): {}",
            std::io::Error::from_raw_os_error(rc)
        );
    }
    Ok(Blocked { set })
}

/// Ignores SIGHUP until [`super::shutdown_signal`] takes it: its default action ends the
/// process, so a SIGHUP sent while the daemon starts (a log rotation's, say) would otherwise
/// kill it before the handler exists. Blocking is no answer here, since the runtime's handler
/// must receive it later; registering that handler replaces this disposition. A SIGHUP that
/// arrives meanwhile is discarded: the verbose buffer holds next to nothing yet.
pub(super) fn ignore_hup_until_handled() -> Result<()> {
    // SAFETY: SIG_IGN is a valid disposition for SIGHUP; no handler code runs.
    if unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) } == libc::SIG_ERR {
        bail!(
            "cannot ignore SIGHUP during start-up: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

impl Blocked {
    /// Takes the blocked signals on the runtime, from a signalfd (no thread of their own), and
    /// logs each, rate-limited. Call on the runtime, after DAEMONIZE's fork and after logging
    /// is set up; signals that arrived before wait, pending, and are logged then.
    pub(super) fn log_on_runtime(self) -> Result<()> {
        // SAFETY: `self.set` is an initialised sigset_t that outlives the call; -1 asks for a
        // new descriptor.
        let raw = unsafe { libc::signalfd(-1, &self.set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if raw < 0 {
            bail!(
                "cannot open a signalfd for the signals the daemon ignores: {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: `raw` is the descriptor signalfd just opened; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the `OwnedFd` keeps its descriptor open and the same until the `AsyncFd`,
        // which owns it, is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)
            .context("cannot watch the signalfd of the signals the daemon ignores")?;
        tokio::spawn(log_signals(fd));
        Ok(())
    }
}

/// Logs the signals `fd` (a signalfd) delivers, rate-limited, for as long as the runtime runs.
async fn log_signals(fd: AsyncFd<OwnedFd>) {
    let mut limit = RateLimit::new(LOG_EVERY);
    loop {
        let due = limit.next_due();
        let summary = async {
            match due {
                Some(due) => tokio::time::sleep_until(due.into()).await,
                // Nothing counted and unlogged: wait for a signal, however long.
                None => std::future::pending().await,
            }
        };
        let ready = tokio::select! {
            ready = fd.readable() => Some(ready),
            () = summary => None,
        };
        let now = Instant::now();
        for line in limit.flush(now) {
            warn!("{line}");
        }
        let Some(ready) = ready else { continue };
        let mut guard = match ready {
            Ok(guard) => guard,
            Err(e) => {
                warn!("cannot wait for the ignored signals ({e}): they are no longer logged");
                return;
            }
        };
        // At most a batch per wake-up: real-time signals queue (up to RLIMIT_SIGPENDING), and
        // this task shares the daemon's one runtime thread with the engine and every session,
        // so a flood must not keep it here. Readiness is left set: the rest comes next turn.
        for _ in 0..SIGNALS_PER_TURN {
            match take_signal(guard.get_inner()) {
                Ok(Some(sig)) => {
                    if sig > 0
                        && let Some(line) = limit.on_signal(sig, now)
                    {
                        warn!("{line}");
                    }
                }
                Ok(None) => {
                    guard.clear_ready();
                    break;
                }
                Err(e) => {
                    warn!("cannot read the ignored signals ({e}): they are no longer logged");
                    return;
                }
            }
        }
        drop(guard);
        tokio::task::yield_now().await;
    }
}

/// Signals read from the signalfd before the task lets the runtime's other tasks run.
const SIGNALS_PER_TURN: usize = 32;

/// The next signal a non-blocking signalfd holds, if any (0: interrupted, nothing read).
fn take_signal(fd: &OwnedFd) -> nix::Result<Option<libc::c_int>> {
    let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
    match nix::unistd::read(fd, &mut info) {
        // `ssi_signo`, a u32, comes first.
        Ok(n) if n == info.len() => {
            let signo = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]);
            Ok(Some(libc::c_int::try_from(signo).unwrap_or(0)))
        }
        Ok(_) | Err(nix::errno::Errno::EAGAIN) => Ok(None),
        Err(nix::errno::Errno::EINTR) => Ok(Some(0)),
        Err(e) => Err(e),
    }
}

/// One line per signal per period; the signals in between are counted and summed up in one
/// line once the period is over.
#[derive(Debug)]
pub(super) struct RateLimit {
    every: Duration,
    seen: HashMap<libc::c_int, Seen>,
}

#[derive(Debug)]
struct Seen {
    logged_at: Instant,
    unlogged: u64,
}

impl RateLimit {
    pub(super) fn new(every: Duration) -> Self {
        Self {
            every,
            seen: HashMap::new(),
        }
    }

    /// A signal arrived: the line to log, or `None` when one was logged less than a period
    /// ago (it is counted for [`RateLimit::flush`]).
    pub(super) fn on_signal(&mut self, sig: libc::c_int, now: Instant) -> Option<String> {
        match self.seen.get_mut(&sig) {
            Some(s) if now.saturating_duration_since(s.logged_at) < self.every => {
                s.unlogged += 1;
                None
            }
            _ => {
                self.seen.insert(
                    sig,
                    Seen {
                        logged_at: now,
                        unlogged: 0,
                    },
                );
                Some(format!(
                    "{} received: ignored (openimex does not act on this signal; its default \
                     action would have ended the daemon without a goodbye to its peers)",
                    name(sig)
                ))
            }
        }
    }

    /// Lines for the signals counted but not logged whose period is over.
    pub(super) fn flush(&mut self, now: Instant) -> Vec<String> {
        let mut lines = Vec::new();
        let mut due: Vec<(&libc::c_int, &mut Seen)> = self
            .seen
            .iter_mut()
            .filter(|(_, s)| {
                s.unlogged > 0 && now.saturating_duration_since(s.logged_at) >= self.every
            })
            .collect();
        due.sort_by_key(|(sig, _)| **sig);
        for (sig, s) in due {
            lines.push(format!(
                "{} received {} more time{} in the last {} s: ignored",
                name(*sig),
                s.unlogged,
                if s.unlogged == 1 { "" } else { "s" },
                now.saturating_duration_since(s.logged_at).as_secs()
            ));
            s.logged_at = now;
            s.unlogged = 0;
        }
        lines
    }

    /// When the next summary line is due, if any signal is counted and not logged.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.seen
            .values()
            .filter(|s| s.unlogged > 0)
            .map(|s| s.logged_at + self.every)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sighup_is_ignored_until_the_runtime_takes_it() {
        ignore_hup_until_handled().expect("ignore SIGHUP");
        let mut old = MaybeUninit::<libc::sigaction>::zeroed();
        // SAFETY: a null new action only reads the current one into `old`, valid for writes.
        let rc = unsafe { libc::sigaction(libc::SIGHUP, std::ptr::null(), old.as_mut_ptr()) };
        assert_eq!(rc, 0);
        // SAFETY: sigaction succeeded and filled `old`.
        let old = unsafe { old.assume_init() };
        assert_eq!(old.sa_sigaction, libc::SIG_IGN);
        // SAFETY: back to the default disposition; no handler code runs.
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_DFL) };
    }

    #[test]
    fn every_async_terminating_signal_is_covered_and_no_fault_signal() {
        let set = ignored();
        for sig in [
            libc::SIGUSR2,
            libc::SIGALRM,
            libc::SIGVTALRM,
            libc::SIGPROF,
            libc::SIGIO,
            libc::SIGPOLL,
            libc::SIGPWR,
            libc::SIGSTKFLT,
            libc::SIGXCPU,
            libc::SIGXFSZ,
            libc::SIGRTMIN(),
            libc::SIGRTMIN() + 1,
            libc::SIGRTMAX(),
        ] {
            assert!(set.contains(&sig), "{} is not taken", name(sig));
        }
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
            libc::SIGABRT,
            libc::SIGSYS,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGHUP,
            libc::SIGUSR1,
            libc::SIGPIPE,
        ] {
            assert!(!set.contains(&sig), "{} must not be taken here", name(sig));
        }
    }

    #[test]
    fn names() {
        assert_eq!(name(libc::SIGUSR2), "SIGUSR2");
        assert_eq!(name(libc::SIGIO), "SIGIO");
        assert_eq!(name(libc::SIGRTMIN()), "SIGRTMIN");
        assert_eq!(name(libc::SIGRTMIN() + 2), "SIGRTMIN+2");
        assert_eq!(name(libc::SIGRTMAX()), "SIGRTMAX");
    }

    #[test]
    fn a_flood_logs_one_line_per_signal_per_period() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(LOG_EVERY);
        let first = limit
            .on_signal(libc::SIGUSR2, t0)
            .expect("first one logged");
        assert!(first.starts_with("SIGUSR2 received: ignored"), "{first}");
        assert!(limit.on_signal(libc::SIGALRM, t0).is_some(), "per signal");
        assert_eq!(limit.next_due(), None);
        let mut lines = 0;
        for i in 1..=1000u32 {
            let now = t0 + Duration::from_millis(u64::from(i));
            lines += limit.flush(now).len();
            lines += usize::from(limit.on_signal(libc::SIGUSR2, now).is_some());
        }
        assert_eq!(lines, 0, "within the period, counted only");
        assert_eq!(limit.next_due(), Some(t0 + LOG_EVERY));
        assert!(limit.flush(t0 + LOG_EVERY / 2).is_empty());
        let summary = limit.flush(t0 + LOG_EVERY);
        assert_eq!(
            summary,
            ["SIGUSR2 received 1000 more times in the last 10 s: ignored"]
        );
        assert_eq!(limit.next_due(), None);
        // Counting restarts from the summary line.
        let t1 = t0 + LOG_EVERY;
        assert!(
            limit
                .on_signal(libc::SIGUSR2, t1 + Duration::from_secs(1))
                .is_none()
        );
        assert_eq!(
            limit.flush(t1 + LOG_EVERY),
            ["SIGUSR2 received 1 more time in the last 10 s: ignored"]
        );
        // After a quiet period, the next one is logged at once.
        let later = t1 + 3 * LOG_EVERY;
        assert!(limit.on_signal(libc::SIGUSR2, later).is_some());
    }
}
