//! Backoff: `min(cap, base·2ⁿ)`, every delay multiplied by a uniform factor in `[1-jitter, 1+jitter]`
//! so that clients that failed together do not retry together.

use std::time::Duration;

/// An exponential backoff schedule with jitter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    jitter: f64,
}

impl Backoff {
    /// A schedule from `base` doubling up to `cap`, with `jitter` clamped to `0.0..=1.0`.
    pub fn new(base: Duration, cap: Duration, jitter: f64) -> Backoff {
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        Backoff {
            base,
            cap: cap.max(base),
            jitter,
        }
    }

    /// The delay before retry `n` (from 0) without jitter.
    pub fn nominal(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The delay before retry `n` (from 0), jittered with the random state `rng`.
    pub fn delay(&self, n: u32, rng: &mut u64) -> Duration {
        let unit = (next_u64(rng) >> 11) as f64 / (1u64 << 53) as f64;
        let factor = 1.0 - self.jitter + 2.0 * self.jitter * unit;
        self.nominal(n).mul_f64(factor)
    }
}

/// SplitMix64: a small, fast generator; jitter needs spread, not secrecy.
fn next_u64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), 0.0);
        let delays: Vec<u128> = (0..6).map(|n| b.nominal(n).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.nominal(200), Duration::from_secs(1));
    }

    proptest! {
        #[test]
        fn jitter_stays_in_bounds(seed: u64, n in 0u32..40, jitter in 0.0f64..1.0) {
            let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(10), jitter);
            let mut rng = seed;
            let d = b.delay(n, &mut rng).as_secs_f64();
            let nominal = b.nominal(n).as_secs_f64();
            prop_assert!(d >= nominal * (1.0 - jitter) - 1e-9);
            prop_assert!(d <= nominal * (1.0 + jitter) + 1e-9);
        }
    }

    #[test]
    fn jitter_spreads_delays() {
        let b = Backoff::new(Duration::from_millis(1000), Duration::from_secs(10), 0.2);
        let mut rng = 7;
        let delays: Vec<Duration> = (0..100).map(|_| b.delay(0, &mut rng)).collect();
        let min = delays.iter().min().unwrap().as_millis();
        let max = delays.iter().max().unwrap().as_millis();
        assert!(min < 850 && max > 1150, "{min}..{max}");
    }
}
