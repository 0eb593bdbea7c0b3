//! The dial budget: how much dialling a mesh may do at once across all its peers (see the
//! module docs of [`super`]), and the token bucket that enforces it.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;

/// How much dialling a mesh may do at once, across all its peers. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DialBudget {
    /// Retries allowed back to back after a quiet period.
    pub burst: u32,
    /// Then one retry per this interval (zero: no rate bound).
    pub interval: Duration,
    /// Dials in flight at once, first round included.
    pub max_in_flight: usize,
}

impl DialBudget {
    /// Peers a domain may have at the backoff cap without its retries ever waiting for the
    /// budget: an 18-node rack (17 peers) never notices it, and a node file of any size
    /// retries no faster than a 24-node domain whose peers are all down.
    pub const PEERS_AT_CAP: u32 = 24;

    /// The default for `backoff`: a burst of 64 retries, then [`Self::PEERS_AT_CAP`] retries
    /// per `backoff.max` (4.8 per second with the 5 s default), 32 dials in flight. 10,000
    /// dead entries are each retried about every 35 minutes, and any of them that comes up is
    /// connected at once by the session it opens to us.
    ///
    /// Why 32 in flight: when a whole domain starts at once every daemon dials every peer, and
    /// a bound of 128 let 144 daemons on one machine start 20,000 handshakes together; most
    /// outlived the dial timeout and went back to the retry budget (formation measured 40 to
    /// 73 s, or never). With 32, fewer handshakes compete at once and most finish within the
    /// timeout (16 to 37 s on the same loaded machine). A peer that comes up opens its session to
    /// us, which needs no dial of ours, so live peers do not queue behind dead entries.
    pub fn for_backoff(backoff: &Backoff) -> Self {
        Self {
            burst: 64,
            interval: backoff.max / Self::PEERS_AT_CAP,
            max_in_flight: 32,
        }
    }

    /// No bound at all (for comparisons in tests).
    pub const UNLIMITED: Self = Self {
        burst: u32::MAX,
        interval: Duration::ZERO,
        max_in_flight: usize::MAX,
    };
}

/// The budget's tokens: `tokens` now, one more at `next` (while below the burst).
#[derive(Debug, Clone, Copy)]
pub(super) struct Tokens {
    pub(super) tokens: u32,
    pub(super) next: Instant,
}

impl Tokens {
    fn refill(&mut self, now: Instant, budget: &DialBudget) {
        if self.tokens >= budget.burst {
            return;
        }
        if budget.interval.is_zero() {
            self.tokens = budget.burst;
            return;
        }
        if now < self.next {
            return;
        }
        let step = budget.interval.as_nanos();
        let gained = (now - self.next).as_nanos() / step + 1;
        let room = u128::from(budget.burst - self.tokens);
        if gained >= room {
            self.tokens = budget.burst;
        } else {
            // gained < room <= u32::MAX
            self.tokens += u32::try_from(gained).unwrap_or(u32::MAX);
            let advance = budget
                .interval
                .saturating_mul(u32::try_from(gained).unwrap_or(u32::MAX));
            self.next += advance;
        }
    }

    /// Takes one token if there is one.
    pub(super) fn take(&mut self, now: Instant, budget: &DialBudget) -> bool {
        self.refill(now, budget);
        if self.tokens == 0 {
            return false;
        }
        if self.tokens >= budget.burst {
            self.next = now + budget.interval;
        }
        self.tokens -= 1;
        true
    }
}
