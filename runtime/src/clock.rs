//! [`Clock`]: where a runtime reads the time it stamps callIds with, buckets `window` keys by, and hands
//! to the stores that judge leases and expiries by the caller's time (memory, SQLite).
//!
//! # Guarantees
//!
//! * [`SystemClock`] reads the system clock afresh on every call: a clock stepped by NTP or a VM
//!   resumed after a suspend is seen at once, never hidden behind an anchor taken at start-up.
//! * In a test with tokio's time paused, [`SystemClock`] moves with `tokio::time::advance` too, so
//!   leases and TTLs can be driven without sleeping.
//! * The stores shared by several processes (PostgreSQL, Redis) do not take this clock's word for
//!   anything two nodes must agree on: leases and expiries there are judged by the store's own clock.

use std::fmt;
use std::sync::Arc;

use crate::call_id::unix_ms_now;

/// A source of wall-clock time, in Unix milliseconds. Implement it to run a runtime on a simulated or
/// skewed clock (a test of what two nodes that disagree about time do); [`SystemClock`] is the default.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch, now.
    fn now_ms(&self) -> u64;
}

/// The system clock, read on every call, and moved by tokio's paused time in tests.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    tokio_anchor: tokio::time::Instant,
    std_anchor: std::time::Instant,
}

impl Default for SystemClock {
    fn default() -> SystemClock {
        SystemClock::new()
    }
}

impl SystemClock {
    /// The system clock. Made inside a test whose tokio time is paused, it follows that time's
    /// advances as well.
    pub fn new() -> SystemClock {
        SystemClock {
            tokio_anchor: tokio::time::Instant::now(),
            std_anchor: std::time::Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // Outside a paused test, tokio's instants are the standard ones and the two elapsed times are
        // the same: what remains is the system clock, read now. With tokio's time paused (or advanced),
        // the difference is how far the test moved time beyond what really passed.
        let virtual_ms =
            ms(tokio::time::Instant::now().saturating_duration_since(self.tokio_anchor));
        let real_ms = ms(self.std_anchor.elapsed());
        unix_ms_now()
            .saturating_add(virtual_ms)
            .saturating_sub(real_ms)
    }
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The clock a runtime holds: the system clock inline, or one the user gave.
#[derive(Clone)]
pub(crate) enum RuntimeClock {
    System(SystemClock),
    Custom(Arc<dyn Clock>),
}

impl RuntimeClock {
    pub(crate) fn now_ms(&self) -> u64 {
        match self {
            RuntimeClock::System(clock) => clock.now_ms(),
            RuntimeClock::Custom(clock) => clock.now_ms(),
        }
    }
}

impl fmt::Debug for RuntimeClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeClock::System(_) => f.write_str("SystemClock"),
            RuntimeClock::Custom(_) => f.write_str("custom clock"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn follows_paused_time() {
        let clock = SystemClock::new();
        let before = clock.now_ms();
        tokio::time::advance(Duration::from_secs(5)).await;
        let after = clock.now_ms();
        assert!(after >= before + 5_000, "{before} → {after}");
        assert!(after < before + 6_000, "{before} → {after}");
    }

    #[test]
    fn reads_the_system_clock_fresh() {
        let clock = SystemClock::new();
        let system = unix_ms_now();
        let now = clock.now_ms();
        assert!(now.abs_diff(system) < 1_000, "{now} vs {system}");
    }
}
