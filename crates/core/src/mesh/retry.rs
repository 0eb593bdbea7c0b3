//! When a failed dial is tried again: the backoff's next delay, except after a dial that found
//! nothing listening at the peer's address ([`DialFailure::NotListening`]), whose retry waits
//! for the backoff's cap.
//!
//! A refused connection means the peer's daemon is not running. Every daemon dials every peer
//! it has no session with as it starts, and its session connects the link here at once, with
//! no dial of ours (`pair.rs`). So a retry of ours would find the peer either still down or
//! already connected by its own dial, and only a safety net is needed: for a peer whose dial
//! to us fails while ours would get through. At formation, retries at the backoff's first
//! delays are what crossed the starting peers' own dials: two handshakes and a session closed
//! for a pair that needs one, and a refused connection every few hundred milliseconds per
//! peer not yet started.

use std::time::Instant;

use super::{Dialer, Mesh};
use crate::ids::NodeId;
use crate::state::DaemonState;

/// How a dial failed, as far as its retry is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialFailure {
    /// Nothing listens at the peer's address (the connection was refused): its daemon is not
    /// running, and it dials us when it starts. Retried at the backoff's cap.
    NotListening,
    /// Anything else: no answer within the dial timeout, no route, a name that does not
    /// resolve, a failed TLS or HTTP/2 start. Retried with the backoff.
    Other,
}

/// The backoff's failure count whose delay is the cap whatever `min` and `max` are (the
/// backoff doubles from `min` and stops doubling at 20 failures).
const AT_CAP: u32 = 20;

impl Mesh {
    /// Schedules the next dial to `peer` after a failure of kind `failure` (or a lost session,
    /// [`DialFailure::Other`]).
    pub(super) fn schedule_retry(&mut self, now: Instant, peer: NodeId, failure: DialFailure) {
        if self.state == DaemonState::ShuttingDown {
            self.set_dialer(peer, Dialer::Idle);
            return;
        }
        let backoff = self.cfg.backoff;
        let Some(link) = self.links.get_mut(peer.index()).and_then(Option::as_mut) else {
            return;
        };
        let failures = match failure {
            DialFailure::NotListening => AT_CAP,
            DialFailure::Other => link.failures,
        };
        let delay = backoff.delay(failures, &mut self.rng);
        link.failures = link.failures.saturating_add(1);
        self.set_dialer(peer, Dialer::Waiting(now + delay));
    }
}
