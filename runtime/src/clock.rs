//! [`Clock`]: where a runtime reads the time it stamps callIds with, buckets `window` keys by, and hands
//! to the stores that judge leases and expiries by the caller's time (memory, SQLite).
//!
//! # Guarantees
//!
//! * [`SystemClock`], the default, reads the system clock afresh on every call: a clock stepped by NTP
//!   or a VM resumed after a suspend is seen at once, never hidden behind an anchor taken at start-up.
//! * [`TokioClock`] follows `tokio::time` from one reading of the wall clock, so that a test with
//!   tokio's time paused drives leases and TTLs with `tokio::time::advance`, without sleeping.
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

/// The system clock, read afresh on every call (one `clock_gettime`). The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        unix_ms_now()
    }
}

/// The wall clock read once, when made, then moved by `tokio::time`: for tests with tokio's time paused,
/// where `tokio::time::advance` should end leases and TTLs without waiting
/// (`Runtime::builder().clock(TokioClock::new())`). Not for production: it never sees the system clock
/// again (a step by NTP, a suspended VM).
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    anchor_ms: u64,
    anchor: tokio::time::Instant,
}

impl Default for TokioClock {
    fn default() -> TokioClock {
        TokioClock::new()
    }
}

impl TokioClock {
    /// Reads the wall clock and tokio's now.
    pub fn new() -> TokioClock {
        TokioClock {
            anchor_ms: unix_ms_now(),
            anchor: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.anchor_ms.saturating_add(ms(
            tokio::time::Instant::now().saturating_duration_since(self.anchor)
        ))
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
    async fn the_tokio_clock_follows_paused_time() {
        let clock = TokioClock::new();
        let before = clock.now_ms();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(clock.now_ms(), before + 5_000);
    }

    #[test]
    fn the_system_clock_is_read_fresh() {
        let system = unix_ms_now();
        let now = SystemClock.now_ms();
        assert!(now.abs_diff(system) < 1_000, "{now} vs {system}");
    }
}
