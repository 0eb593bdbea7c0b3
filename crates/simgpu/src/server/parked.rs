//! Calls that block in the real driver, parked instead of held by a sleeping thread: an
//! import's wait for the daemon (`WaitImport`, or an `Import` that waits), the last release of
//! a remote import waiting for FINISH_MEM_UNIMPORT (`Release`), and the daemon's event poll
//! (`GetEvents`).
//!
//! A parked call is answered by the thread whose request made it answerable (the daemon's
//! VALIDATE answers the application's import wait; an application's import answers the daemon's
//! event poll), writing straight to the waiting client's socket. The parked connection's own
//! thread only watches its socket for a hang-up and the call's deadline. A real ioctl that
//! blocks is woken by the interrupt or call that completes it and returns in the caller's own
//! thread; answering from the completing thread keeps the simulation to that one wake-up, where
//! waking the parked thread to answer cost a second one on every import, and a condvar shared
//! by every waiter woke all of them (every application's import wait on the node) for each
//! change.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::Instant;

use openimex_simproto::proto::{self, NvStatus, Response};

use super::Shared;
use super::calls::{error, peer_gone};
use crate::rm::{ClientId, ImportState, Rm};

/// What a parked call waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// `WaitImport`, or an `Import` that waits: the import is no longer pending.
    Import {
        /// The client's import handle.
        import: u64,
        /// An `Import`'s wait: the answer is `ImportWaited`, naming the handle.
        with_handle: bool,
    },
    /// `Release` of the last reference to a remote import: FINISH_MEM_UNIMPORT named it.
    Unimport {
        /// The unimport event.
        id: u64,
    },
    /// `GetEvents`: an event is queued.
    Events {
        /// Session token.
        token: u64,
        /// At most this many events in the answer.
        max: usize,
    },
}

/// One parked call: at most one per connection, as a client waits for each answer.
#[derive(Debug)]
pub(super) struct Parked {
    wait: Wait,
    /// When the call gives up (`None`: never, as the unimport wait).
    until: Option<Instant>,
    /// The client's socket, written by whichever thread answers.
    reply_to: Arc<UnixStream>,
}

/// Every parked call of the driver, by client. Locked after the driver's [`Rm`] lock, never
/// before, so a call parked under the `Rm` lock is seen by the next change.
pub(super) type ParkedCalls = HashMap<ClientId, Parked>;

/// How far a call's wait has come: still waiting, or over (answer with what there is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// It is still waiting: answer only if ready.
    NotYet,
    /// Its deadline passed, or the client asked something else before its answer: answer
    /// with what there is now.
    Expired,
    /// The driver is stopping.
    Stopping,
}

/// The answer to a call as it arrives, or `None`: it waits, parked, for its answer or `until`.
pub(super) fn answer_at_once(
    rm: &mut Rm,
    client: ClientId,
    wait: Wait,
    until: Option<Instant>,
    stopping: bool,
) -> Option<Response> {
    let end = if stopping {
        End::Stopping
    } else if until.is_some_and(|d| Instant::now() >= d) {
        End::Expired
    } else {
        End::NotYet
    };
    answer(rm, client, wait, end)
}

/// The answer to `wait` for `client` now, or `None` if it should go on waiting.
fn answer(rm: &mut Rm, client: ClientId, wait: Wait, end: End) -> Option<Response> {
    let result = match wait {
        Wait::Import {
            import,
            with_handle: true,
        } => {
            let outcome = answer(
                rm,
                client,
                Wait::Import {
                    import,
                    with_handle: false,
                },
                end,
            )?;
            return Some(Response::ImportWaited {
                import,
                outcome: Box::new(outcome),
            });
        }
        Wait::Import {
            import,
            with_handle: false,
        } => match rm.wait_import(client, import) {
            Ok(ImportState::Ready(l)) => Ok(Response::ImportReady {
                size: l.size,
                file: l.file.to_string_lossy().into_owned(),
                offset: l.offset,
            }),
            Ok(ImportState::Pending) => match end {
                End::NotYet => return None,
                End::Expired => Err(NvStatus::NotReady),
                End::Stopping => Err(NvStatus::InvalidState),
            },
            Err(s) => Err(s),
        },
        Wait::Unimport { id } => {
            if rm.unimport_pending(id) && end == End::NotYet {
                return None;
            }
            Ok(Response::Ok)
        }
        Wait::Events { token, max } => match rm.get_events(token, max) {
            Ok((events, _)) if events.is_empty() && end == End::NotYet => return None,
            Ok((events, more)) => Ok(Response::Events { events, more }),
            Err(s) => Err(s),
        },
    };
    Some(result.unwrap_or_else(|s| error(s, s.to_string())))
}

impl Shared {
    pub(super) fn parked(&self) -> MutexGuard<'_, ParkedCalls> {
        self.parked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Parks `client`'s call. The caller holds the `Rm` lock (`_rm`), under which it found the
    /// call not answerable yet: a change can only come after this, and it will see the call.
    pub(super) fn park(
        &self,
        _rm: &MutexGuard<'_, Rm>,
        client: ClientId,
        wait: Wait,
        until: Option<Instant>,
        reply_to: &Arc<UnixStream>,
    ) {
        self.parked().insert(
            client,
            Parked {
                wait,
                until,
                reply_to: Arc::clone(reply_to),
            },
        );
    }

    /// Answers every parked call that the last change made answerable, from this thread.
    /// Called after every request that can change what they wait for, every disconnect and
    /// every change of the Fabric Manager link.
    pub(super) fn answer_parked(&self) {
        let mut rm = self.rm();
        let mut parked = self.parked();
        if parked.is_empty() {
            return;
        }
        let end = if self.stopping() {
            End::Stopping
        } else {
            End::NotYet
        };
        let mut out = Vec::new();
        parked.retain(|&client, p| match answer(&mut rm, client, p.wait, end) {
            Some(resp) => {
                out.push((Arc::clone(&p.reply_to), resp));
                false
            }
            None => true,
        });
        drop(parked);
        drop(rm);
        // Outside the locks: a client slow to read holds up only this thread. The call is no
        // longer parked, so nothing else answers it, and its client sends nothing before this
        // answer arrives.
        for (to, resp) in out {
            let _ = proto::send(&to, &resp, &[]);
        }
    }

    /// Takes `client`'s parked call out, answering it as `end` says (`None`: it was answered
    /// already). With `gone`, the client hung up: the call is dropped unanswered.
    fn unpark(
        &self,
        client: ClientId,
        end: End,
        gone: bool,
    ) -> Option<(Arc<UnixStream>, Response)> {
        let mut rm = self.rm();
        let mut parked = self.parked();
        let p = parked.get(&client)?;
        if !gone && end == End::NotYet && p.until.is_none_or(|d| Instant::now() < d) {
            return None;
        }
        let p = parked.remove(&client)?;
        drop(parked);
        if gone {
            return None;
        }
        let end = if end == End::NotYet {
            End::Expired
        } else {
            end
        };
        answer(&mut rm, client, p.wait, end).map(|resp| (p.reply_to, resp))
    }

    fn is_parked(&self, client: ClientId) -> Option<Option<Instant>> {
        self.parked().get(&client).map(|p| p.until)
    }
}

/// What the connection does after its call was parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Then {
    /// Read the next request.
    Serve,
    /// The client hung up.
    Gone,
}

/// Watches a parked call's connection until the call is answered (by another thread, or here
/// when its deadline passes or the driver stops) or its client hangs up, which a fatal signal
/// in the real ioctl's wait is: the call is dropped, and the disconnect frees what the client
/// owned now.
pub(super) fn watch(shared: &Shared, client: ClientId, stream: &UnixStream) -> Then {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        let Some(until) = shared.is_parked(client) else {
            return Then::Serve;
        };
        // Until the deadline, with no slices: a stop shuts every connection down, which wakes
        // this poll, so an idle daemon's parked event poll costs its driver no wake-ups.
        let timeout = match until {
            None => PollTimeout::NONE,
            Some(d) => PollTimeout::try_from(d.saturating_duration_since(Instant::now()))
                .unwrap_or(PollTimeout::MAX),
        };
        let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLIN)];
        let readable = match poll(&mut fds, timeout) {
            Ok(n) => n > 0,
            Err(nix::errno::Errno::EINTR) => false,
            Err(_) => return Then::Gone,
        };
        let gone = readable && peer_gone(stream);
        let end = if shared.stopping() {
            End::Stopping
        } else if readable {
            // The client asked something before the answer came (ours never do): answer
            // with what there is, so the stream stays in step.
            End::Expired
        } else {
            End::NotYet
        };
        if let Some((to, resp)) = shared.unpark(client, end, gone)
            && proto::send(&to, &resp, &[]).is_err()
        {
            return Then::Gone;
        }
        if gone {
            return Then::Gone;
        }
        if readable {
            // Answered (here or by another thread), and the next request is there.
            return Then::Serve;
        }
    }
}
