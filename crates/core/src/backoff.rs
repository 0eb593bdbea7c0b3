//! Reconnect backoff: capped exponential with jitter, from a seeded generator so tests are
//! deterministic. A peer that is down for an hour costs one failed connect every few seconds.

use std::time::Duration;

/// A small deterministic generator (SplitMix64); the seed comes from the caller.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Backoff policy: the n-th consecutive failure waits a random time in
/// `[d/2, d]` where `d = min(max, min * 2^n)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First delay.
    pub min: Duration,
    /// Cap.
    pub max: Duration,
}

impl Backoff {
    /// Delay before attempt number `failures` (0 = after the first failure).
    pub fn delay(&self, failures: u32, rng: &mut Rng) -> Duration {
        let shift = failures.min(20);
        let ceiling = self
            .min
            .saturating_mul(1u32 << shift)
            .min(self.max)
            .max(self.min);
        let ceiling_us = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        let half = ceiling_us / 2;
        let span = ceiling_us - half;
        let jitter = if span == 0 {
            0
        } else {
            rng.next_u64() % (span + 1)
        };
        Duration::from_micros(half + jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::{Backoff, Duration, Rng};
    use proptest::prelude::{prop_assert, proptest};

    proptest! {
        #[test]
        fn delay_within_bounds(seed: u64, failures in 0u32..100, min_ms in 1u64..2000, extra in 0u64..10_000) {
            let b = Backoff { min: Duration::from_millis(min_ms), max: Duration::from_millis(min_ms + extra) };
            let mut rng = Rng::new(seed);
            let d = b.delay(failures, &mut rng);
            prop_assert!(d <= b.max);
            prop_assert!(d >= b.min / 2);
        }
    }

    #[test]
    fn grows_then_caps() {
        let b = Backoff {
            min: Duration::from_millis(250),
            max: Duration::from_secs(5),
        };
        let mut rng = Rng::new(7);
        let early = b.delay(0, &mut rng);
        let late = b.delay(30, &mut rng);
        assert!(early <= Duration::from_millis(250));
        assert!(late >= Duration::from_millis(2500) && late <= Duration::from_secs(5));
    }
}
