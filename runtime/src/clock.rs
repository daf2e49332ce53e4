//! [`Clock`]: where a runtime reads the time it stamps callIds with, buckets `window` keys by, and hands
//! to the stores that judge leases and expiries by the caller's time (memory, SQLite).
//!
//! # Guarantees
//!
//! * [`SystemClock`], the default, reads the system clock afresh on every call: a clock stepped by NTP
//!   or a VM resumed after a suspend is seen at once, never hidden behind an anchor taken at start-up.
//! * One reading may lag by a few milliseconds, never lead: a replay that the in-process store answers
//!   checks the receipt's expiry by the system's coarse clock (on Linux `CLOCK_REALTIME_COARSE`: the
//!   time as the kernel last updated it on its timer tick, a few milliseconds behind — 3.5 to 12 ms on
//!   the project's machine, at 250 ticks a second — and never ahead; elsewhere the same clock as every
//!   other reading). A late reading can only keep a finished receipt a few milliseconds longer, never
//!   drop one early, and it costs a few nanoseconds where a fresh reading costs 30 to 40. Everything
//!   else — callIds, windows, claims, leases, completions and the expiry a claim judges — reads the
//!   clock afresh.
//! * [`TokioClock`] follows `tokio::time` from one reading of the wall clock, so that a test with
//!   tokio's time paused drives leases and TTLs with `tokio::time::advance`, without sleeping.
//! * The stores shared by several processes (PostgreSQL, Redis) do not take this clock's word for
//!   anything two nodes must agree on: leases and expiries there are judged by the store's own clock.

use std::fmt;
use std::sync::Arc;

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

/// A duration in whole milliseconds, saturating at `u64::MAX`.
pub(crate) fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch by the system clock (`CLOCK_REALTIME`), 0 before 1970.
pub(crate) fn unix_ms_now() -> u64 {
    #[cfg(target_os = "linux")]
    {
        // The vDSO, called directly: std's `SystemTime::now` goes through libc and a checked
        // subtraction, a third more on this path that every call takes three times.
        timespec_ms(rustix::time::clock_gettime(rustix::time::ClockId::Realtime))
    }
    #[cfg(not(target_os = "linux"))]
    {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, ms)
    }
}

/// Milliseconds since the Unix epoch by the system's coarse clock: on Linux `CLOCK_REALTIME_COARSE`,
/// the time as the kernel last updated it on its timer tick, behind [`unix_ms_now`] by a few
/// milliseconds, never ahead; the same as [`unix_ms_now`] elsewhere.
fn unix_ms_recent() -> u64 {
    #[cfg(target_os = "linux")]
    {
        timespec_ms(rustix::time::clock_gettime(
            rustix::time::ClockId::RealtimeCoarse,
        ))
    }
    #[cfg(not(target_os = "linux"))]
    {
        unix_ms_now()
    }
}

#[cfg(target_os = "linux")]
fn timespec_ms(t: rustix::time::Timespec) -> u64 {
    let Ok(secs) = u64::try_from(t.tv_sec) else {
        return 0;
    };
    let millis = u64::try_from(t.tv_nsec / 1_000_000).unwrap_or(0);
    secs.saturating_mul(1_000).saturating_add(millis)
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

    /// Now, or a few milliseconds before (never after): the system's coarse clock, or a custom clock's
    /// `now_ms`. Only for a check that a late reading makes more lenient toward what is already
    /// stored (a finished receipt's expiry), never for a stamp or a lease.
    pub(crate) fn recent_ms(&self) -> u64 {
        match self {
            RuntimeClock::System(_) => unix_ms_recent(),
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
        let system = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, ms);
        let now = SystemClock.now_ms();
        assert!(now.abs_diff(system) < 1_000, "{now} vs {system}");
    }

    #[test]
    fn the_coarse_clock_lags_by_milliseconds_and_never_leads() {
        let clock = RuntimeClock::System(SystemClock);
        for _ in 0..10_000 {
            let recent = clock.recent_ms();
            let now = clock.now_ms();
            // Read after it: the coarse reading is never ahead, and behind by a few milliseconds
            // (3.5 to 12 here), with room for a descheduled thread.
            assert!(recent <= now, "coarse {recent} ahead of {now}");
            assert!(now - recent < 1_000, "coarse {recent}, {now} now");
        }
    }

    #[test]
    fn a_custom_clock_is_read_as_it_is_for_recent_readings() {
        #[derive(Debug)]
        struct Fixed;
        impl Clock for Fixed {
            fn now_ms(&self) -> u64 {
                42
            }
        }
        let clock = RuntimeClock::Custom(Arc::new(Fixed));
        assert_eq!((clock.now_ms(), clock.recent_ms()), (42, 42));
    }
}
