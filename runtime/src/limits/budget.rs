//! The retry budget at work: [`Budget`], a sliding window cut into ten slots of atomic counters, and
//! its policy [`RetryBudget`]. What a budget allows and refuses is in
//! [the module doc](super#retry-budgets).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// A retry budget's policy: over a sliding `window`, `floor_per_sec` retries per second plus
/// `percent` of the calls made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudget {
    window: Duration,
    floor_per_sec: u32,
    percent: f64,
    unlimited: bool,
}

/// The default retry budget: a 10 s window, 10 retries per second, plus 20 % of the calls (tower's
/// `TpsBudget` and Finagle's defaults).
pub const DEFAULT_RETRY_BUDGET: RetryBudget = RetryBudget::new(Duration::from_secs(10), 10, 0.2);

/// The default lookup budget: a 10 s window, 20 lookups per second, plus one per call.
pub const DEFAULT_LOOKUP_BUDGET: RetryBudget = RetryBudget::new(Duration::from_secs(10), 20, 1.0);

impl RetryBudget {
    /// Over a sliding `window` (1 s to 60 s), `floor_per_sec` retries per second plus `percent` of the
    /// calls made (`0.2`: one retry for every five calls).
    pub const fn new(window: Duration, floor_per_sec: u32, percent: f64) -> RetryBudget {
        RetryBudget {
            window,
            floor_per_sec,
            percent,
            unlimited: false,
        }
    }

    /// No budget: every retry the function's own `retries` allow is made.
    pub const fn unlimited() -> RetryBudget {
        RetryBudget {
            window: Duration::from_secs(10),
            floor_per_sec: 0,
            percent: 0.0,
            unlimited: true,
        }
    }

    /// The window, clamped to 1 s..=60 s.
    fn window_ms(&self) -> u64 {
        let ms = u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX);
        ms.clamp(1_000, 60_000)
    }
}

impl Default for RetryBudget {
    fn default() -> RetryBudget {
        DEFAULT_RETRY_BUDGET
    }
}

/// The number of slots a window is cut into: deposits and withdrawals older than the window leave it
/// a slot (a tenth of the window) at a time.
const SLOTS: usize = 10;

/// One tenth of the window: the deposits and withdrawals made in it, and which tenth it is.
#[derive(Debug, Default)]
struct Slot {
    /// The slot's period (time / slot length), plus one (0: never used).
    period: AtomicU64,
    /// Calls deposited, as fixed-point hundredths of a retry (`percent` × 100 per call).
    deposits: AtomicI64,
    /// Retries withdrawn, in hundredths.
    withdrawals: AtomicI64,
}

/// A budget at work: its policy and its window.
#[derive(Debug)]
pub(crate) struct Budget {
    policy: RetryBudget,
    slot_ms: u64,
    slots: [Slot; SLOTS],
}

impl Budget {
    pub(crate) fn new(policy: RetryBudget) -> Budget {
        Budget {
            policy,
            slot_ms: (policy.window_ms() / SLOTS as u64).max(1),
            slots: Default::default(),
        }
    }

    /// The slot for `now_ms`, emptied first if it last served an earlier period.
    fn slot(&self, now_ms: u64) -> &Slot {
        let period = now_ms / self.slot_ms + 1;
        let slot = &self.slots[(period % SLOTS as u64) as usize];
        let seen = slot.period.load(Ordering::Acquire);
        if seen != period
            && slot
                .period
                .compare_exchange(seen, period, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // This caller turned the slot over: what it held belongs to a window gone by. A deposit
            // racing the turn-over may land before the reset and be lost: a call's worth, once a
            // tenth of the window, on the safe side (fewer retries).
            slot.deposits.store(0, Ordering::Release);
            slot.withdrawals.store(0, Ordering::Release);
        }
        slot
    }

    /// Counts a call toward the retries it allows.
    pub(crate) fn deposit(&self, now_ms: u64) {
        if self.policy.unlimited {
            return;
        }
        let share = (self.policy.percent * 100.0).round() as i64;
        self.slot(now_ms)
            .deposits
            .fetch_add(share, Ordering::AcqRel);
    }

    /// Takes one retry if the window allows it.
    pub(crate) fn withdraw(&self, now_ms: u64) -> bool {
        if self.policy.unlimited {
            return true;
        }
        let period = now_ms / self.slot_ms + 1;
        let current = self.slot(now_ms);
        let window_secs = self.policy.window_ms() as i64 / 1_000;
        let mut balance = i64::from(self.policy.floor_per_sec) * window_secs * 100;
        for slot in &self.slots {
            let age = period.saturating_sub(slot.period.load(Ordering::Acquire));
            if age < SLOTS as u64 {
                balance += slot.deposits.load(Ordering::Acquire);
                balance -= slot.withdrawals.load(Ordering::Acquire);
            }
        }
        if balance < 100 {
            return false;
        }
        current.withdrawals.fetch_add(100, Ordering::AcqRel);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_and_the_share_bound_the_retries_of_a_window() {
        let budget = Budget::new(RetryBudget::new(Duration::from_secs(10), 1, 0.2));
        // No calls: the floor alone, 1/s over 10 s.
        let allowed = (0..100).filter(|_| budget.withdraw(0)).count();
        assert_eq!(allowed, 10);
        // 100 calls add 20 retries.
        for _ in 0..100 {
            budget.deposit(500);
        }
        let allowed = (0..100).filter(|_| budget.withdraw(500)).count();
        assert_eq!(allowed, 20);
        // A window later, what was spent and deposited has left it: the floor again.
        let allowed = (0..100).filter(|_| budget.withdraw(20_000)).count();
        assert_eq!(allowed, 10);
    }

    #[test]
    fn an_unlimited_budget_never_refuses() {
        let budget = Budget::new(RetryBudget::unlimited());
        assert!((0..10_000).all(|_| budget.withdraw(0)));
    }
}
