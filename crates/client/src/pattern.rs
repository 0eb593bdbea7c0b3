//! Deterministic test patterns: a writer fills a buffer from a seed, a reader anywhere checks it.
//!
//! The buffer is a splitmix64 stream: 8-byte word `k` is `mix(seed + (k + 1) * GOLDEN)`, stored
//! little-endian, so byte `i` is byte `i % 8` of word `i / 8`. Any word can be computed on its
//! own, which keeps fill and verify cheap (one multiply-xorshift per 8 bytes) and lets a checker
//! name the first wrong offset.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Word `k` of the stream of `seed`.
fn word(seed: u64, k: u64) -> [u8; 8] {
    mix(seed.wrapping_add(k.wrapping_add(1).wrapping_mul(GOLDEN))).to_le_bytes()
}

/// Word `k` (bytes `8k..8k+8`, little-endian) of the pattern of `seed`: lets a checker sample
/// a buffer instead of reading all of it.
pub fn word_at(seed: u64, k: u64) -> u64 {
    u64::from_le_bytes(word(seed, k))
}

/// The pattern byte of `seed` at `offset`.
pub fn byte_at(seed: u64, offset: u64) -> u8 {
    word(seed, offset / 8)[(offset % 8) as usize]
}

/// Fills `buf` with the pattern of `seed` (offset 0 of the pattern at `buf[0]`).
pub fn fill(buf: &mut [u8], seed: u64) {
    let mut chunks = buf.chunks_exact_mut(8);
    let mut k = 0u64;
    for c in &mut chunks {
        c.copy_from_slice(&word(seed, k));
        k += 1;
    }
    let tail = chunks.into_remainder();
    let w = word(seed, k);
    tail.copy_from_slice(&w[..tail.len()]);
}

/// Checks that `buf` holds the pattern of `seed`; `Err` carries the first wrong offset.
pub fn verify(buf: &[u8], seed: u64) -> Result<(), u64> {
    let mut chunks = buf.chunks_exact(8);
    let mut k = 0u64;
    for c in &mut chunks {
        let w = word(seed, k);
        if c != w {
            let i = c.iter().zip(w).position(|(a, b)| *a != b).unwrap_or(0);
            return Err(k * 8 + i as u64);
        }
        k += 1;
    }
    let tail = chunks.remainder();
    let w = word(seed, k);
    match tail.iter().zip(w).position(|(a, b)| *a != b) {
        Some(i) => Err(k * 8 + i as u64),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_verify_and_find_a_flipped_byte() {
        for len in [0usize, 1, 7, 8, 9, 4096 + 5] {
            let mut buf = vec![0u8; len];
            fill(&mut buf, 42);
            assert_eq!(verify(&buf, 42), Ok(()), "len {len}");
            for (i, b) in buf.iter().enumerate() {
                assert_eq!(*b, byte_at(42, i as u64));
            }
            if len > 0 {
                assert!(
                    verify(&buf, 43).is_err(),
                    "another seed must not verify (len {len})"
                );
                for flip in [0, len / 2, len - 1] {
                    let mut bad = buf.clone();
                    bad[flip] ^= 0x10;
                    assert_eq!(verify(&bad, 42), Err(flip as u64), "len {len} flip {flip}");
                }
            }
        }
    }

    #[test]
    fn seeds_give_different_streams_and_zero_memory_is_not_a_pattern() {
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 64];
        fill(&mut a, 1);
        fill(&mut b, 2);
        assert_ne!(a, b);
        assert!(verify(&[0u8; 64], 0).is_err());
    }
}
