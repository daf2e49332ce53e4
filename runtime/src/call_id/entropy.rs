//! The entropy field of callIds and traceIds: a process-wide counter fed through a keyed 64-bit
//! bijection, its key and start drawn from the operating system's random source on first use. The
//! guarantees this gives (unique within a process, 64 random bits across processes) are listed in
//! [the module doc](super).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::clock::unix_ms_now;

/// The process-wide source of entropy fields: a counter fed through a keyed 64-bit bijection.
pub(super) struct Entropy {
    counter: AtomicU64,
    k0: u64,
    k1: u64,
    k2: u64,
    pub(super) trace_key: u64,
}

impl Entropy {
    fn seeded(seed: [u64; 5]) -> Entropy {
        Entropy {
            counter: AtomicU64::new(seed[0]),
            k0: seed[1],
            // Multipliers must be odd to be invertible modulo 2^64.
            k1: seed[2] | 1,
            k2: seed[3],
            trace_key: seed[4],
        }
    }

    /// The next value: distinct from every earlier one of this process (the counter is unique and
    /// [`Entropy::mix`] is a bijection).
    pub(super) fn next(&self) -> u64 {
        self.mix(self.counter.fetch_add(1, Ordering::Relaxed))
    }

    /// A keyed bijection of `u64`: additions, odd multiplications and xor-shifts are each invertible.
    pub(super) fn mix(&self, x: u64) -> u64 {
        let mut z = x.wrapping_add(self.k0);
        z ^= z >> 31;
        z = z.wrapping_mul(self.k1);
        z ^= z >> 29;
        z = z.wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 32;
        z ^ self.k2
    }
}

pub(super) fn entropy() -> &'static Entropy {
    static ENTROPY: OnceLock<Entropy> = OnceLock::new();
    ENTROPY.get_or_init(|| Entropy::seeded(random_seed()))
}

/// Five random words from the operating system; if it has none to give, a hash of time, process id and
/// stack address (still different per process, though no longer secret).
fn random_seed() -> [u64; 5] {
    let mut bytes = [0u8; 40];
    if getrandom::fill(&mut bytes).is_err() {
        use std::collections::hash_map::RandomState;
        use std::hash::BuildHasher;
        let state = RandomState::new();
        let marker = 0u8;
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            let word = state.hash_one((
                i,
                unix_ms_now(),
                std::process::id(),
                &marker as *const u8 as usize,
            ));
            chunk.copy_from_slice(&word.to_le_bytes());
        }
    }
    let mut seed = [0u64; 5];
    for (word, chunk) in seed.iter_mut().zip(bytes.chunks(8)) {
        let mut buf = [0u8; 8];
        buf.copy_from_slice(chunk);
        *word = u64::from_le_bytes(buf);
    }
    seed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_is_a_bijection_on_a_sample() {
        let source = Entropy::seeded([0, 7, 11, 13, 17]);
        let mut seen = std::collections::HashSet::new();
        for x in 0..100_000u64 {
            assert!(seen.insert(source.mix(x)));
        }
    }
}
