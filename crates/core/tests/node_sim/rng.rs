//! The seeded generator every choice of a run comes from.

use std::time::Duration;

pub struct Rng(openimex_core::Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // Spread small seeds apart.
        Self(openimex_core::Rng::new(
            seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5EED,
        ))
    }

    pub fn u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.u64() % (n as u64)).unwrap()
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        self.u64() % 1000 < u64::from(per_mille)
    }

    /// Uniform in `[lo, hi]` milliseconds.
    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.u64() % (hi - lo + 1))
    }

    /// Uniform in `[0, max]` with microsecond resolution.
    pub fn upto(&mut self, max: Duration) -> Duration {
        let us = u64::try_from(max.as_micros()).unwrap();
        Duration::from_micros(self.u64() % (us + 1))
    }

    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        (!v.is_empty()).then(|| &v[self.below(v.len())])
    }
}
