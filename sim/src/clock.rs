//! Time in the simulation: one true clock (tokio's paused time from a fixed epoch), and each node's
//! reading of it, skewed by a drawn offset.

use std::sync::Arc;

use samekey::clock::Clock;
use tokio::time::Instant;

/// Unix milliseconds at the start of every run: a fixed epoch, so that callIds, windows and expiries
/// read the same in every run of a seed (2027-01-15T08:00:00Z).
pub const EPOCH_MS: u64 = 1_800_000_000_000;

/// The true time: the epoch plus tokio's (paused) time since the run began. The shared store and
/// the gateway judge by it, as a database server and a payment provider judge by their own clocks.
#[derive(Debug, Clone, Copy)]
pub struct TrueClock {
    start: Instant,
}

impl TrueClock {
    /// Starts now.
    pub fn new() -> TrueClock {
        TrueClock {
            start: Instant::now(),
        }
    }

    /// The true Unix milliseconds now.
    pub fn now_ms(&self) -> u64 {
        EPOCH_MS + u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX / 2)
    }
}

impl Default for TrueClock {
    fn default() -> TrueClock {
        TrueClock::new()
    }
}

/// A node's clock: the true time off by `skew_ms` (a node whose NTP drifted).
#[derive(Debug, Clone)]
pub struct NodeClock {
    pub(crate) truth: Arc<TrueClock>,
    pub(crate) skew_ms: i64,
}

impl Clock for NodeClock {
    fn now_ms(&self) -> u64 {
        self.truth.now_ms().saturating_add_signed(self.skew_ms)
    }
}
