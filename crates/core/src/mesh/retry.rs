//! When a failed dial is tried again: the backoff's next delay, except after a dial that found
//! nothing listening at the peer's address ([`DialFailure::NotListening`]), whose retry waits
//! [`NOT_LISTENING_CAPS`] times the backoff's delay at its cap (10–20 s with the default 5 s
//! cap).
//!
//! A refused connection means the peer's daemon is not running. Every daemon dials every peer
//! it has no session with as it starts, and its session connects the link here at once, with
//! no dial of ours (`pair.rs`). So a retry of ours would find the peer either still down or
//! already connected by its own dial, and only a safety net is needed: for a peer whose dial
//! to us fails while ours would get through. At formation, retries at the backoff's first
//! delays are what crossed the starting peers' own dials: two handshakes and a session closed
//! for a pair that needs one, and a refused connection every few hundred milliseconds per
//! peer not yet started.
//!
//! Retries at the cap itself (2.5–5 s) still crossed them wherever daemons start over a few
//! seconds and a session takes a while to set up: the retry went out while the starting peer's
//! own dial to us was in its TLS handshake (hundreds of milliseconds on a loaded machine), and
//! both were carried through. In the bench's 144-node TLS domain, started in ID order over
//! 4–8 s, 3,855 of the 10,296 pairs (37 %) got a second connection that way (traced with the
//! kernel's `sock:inet_sock_set_state`): 14,151 TLS handshakes where 10,296 do, and formation
//! took 1.5–2.1× the TLS gRPC mesh floor. Retried at four times the cap's delay: 10,305
//! connections and 1.23–1.30× (a scratch cap of 10 s, retries at 5–10 s: 1.31–1.37×). The cost
//! is the safety net's: a pair that only one side can dial forms within 20 s of that side's
//! refusal instead of 5 s.

use std::time::Instant;

use super::{Dialer, Mesh};
use crate::ids::NodeId;
use crate::state::DaemonState;

/// How a dial failed, as far as its retry is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialFailure {
    /// Nothing listens at the peer's address (the connection was refused): its daemon is not
    /// running, and it dials us when it starts. Retried at [`NOT_LISTENING_CAPS`] times the
    /// backoff's delay at its cap.
    NotListening,
    /// Anything else: no answer within the dial timeout, no route, a name that does not
    /// resolve, a failed TLS or HTTP/2 start. Retried with the backoff.
    Other,
}

/// The backoff's failure count whose delay is the cap whatever `min` and `max` are (the
/// backoff doubles from `min` and stops doubling at 20 failures).
const AT_CAP: u32 = 20;

/// A refused dial's retry waits this many times the backoff's delay at its cap (module doc).
pub const NOT_LISTENING_CAPS: u32 = 4;

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
        let delay = match failure {
            DialFailure::NotListening => backoff
                .delay(AT_CAP, &mut self.rng)
                .saturating_mul(NOT_LISTENING_CAPS),
            DialFailure::Other => backoff.delay(link.failures, &mut self.rng),
        };
        link.failures = link.failures.saturating_add(1);
        self.set_dialer(peer, Dialer::Waiting(now + delay));
    }
}
