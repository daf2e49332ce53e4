//! The adaptive concurrency limit at work: [`Limiter`], one per dependency, and its policy
//! [`ConcurrencyLimit`]. How the limit falls and rises, and what a call over it does, is in
//! [the module doc](super#concurrency-limits).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// An adaptive concurrency limit's policy. See [the module](crate::limits#concurrency-limits).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConcurrencyLimit {
    min: u32,
    max: u32,
    decrease: f64,
    max_wait: Duration,
    off: bool,
}

/// The default: unlimited until a `RateLimited` answer; then at least 1 call in flight, halved per
/// round of `RateLimited` answers, + 1 per limit's worth of successes, unlimited again at 200; a call
/// waits at most 1 s for a place.
pub const DEFAULT_CONCURRENCY_LIMIT: ConcurrencyLimit = ConcurrencyLimit {
    min: 1,
    max: 200,
    decrease: 0.5,
    max_wait: Duration::from_secs(1),
    off: false,
};

impl ConcurrencyLimit {
    /// The default policy ([`DEFAULT_CONCURRENCY_LIMIT`]).
    pub const fn adaptive() -> ConcurrencyLimit {
        DEFAULT_CONCURRENCY_LIMIT
    }

    /// No limit: `RateLimited` answers are retried after their wait, and nothing else changes.
    pub const fn off() -> ConcurrencyLimit {
        ConcurrencyLimit {
            off: true,
            ..DEFAULT_CONCURRENCY_LIMIT
        }
    }

    /// The lowest the limit goes (at least 1: a dependency is never shut off).
    pub const fn min(mut self, min: u32) -> ConcurrencyLimit {
        self.min = if min == 0 { 1 } else { min };
        self
    }

    /// The limit at which the dependency is unlimited again.
    pub const fn max(mut self, max: u32) -> ConcurrencyLimit {
        self.max = max;
        self
    }

    /// The factor a round of `RateLimited` answers multiplies the limit by, in `0.1..=0.99` (clamped).
    pub fn decrease(mut self, factor: f64) -> ConcurrencyLimit {
        self.decrease = factor.clamp(0.1, 0.99);
        self
    }

    /// How long a call over the limit waits for a place before [`Error::Overloaded`]
    /// (`Duration::ZERO`: refused at once).
    ///
    /// [`Error::Overloaded`]: crate::Error::Overloaded
    pub const fn max_wait(mut self, wait: Duration) -> ConcurrencyLimit {
        self.max_wait = wait;
        self
    }
}

impl Default for ConcurrencyLimit {
    fn default() -> ConcurrencyLimit {
        DEFAULT_CONCURRENCY_LIMIT
    }
}

/// The limit's value while the dependency is unlimited.
const OPEN: u32 = u32::MAX;

/// A dependency's limiter at work.
#[derive(Debug)]
pub(crate) struct Limiter {
    policy: ConcurrencyLimit,
    in_flight: AtomicU32,
    limit: AtomicU32,
    /// Counts the decreases: an attempt notes it when it starts, and its `RateLimited` answer lowers
    /// the limit only if no decrease came after.
    round: AtomicU32,
    /// Successes toward the next increase.
    credit: AtomicU32,
    waiting: AtomicU32,
    places: Notify,
}

/// A call over the limit that waited `max_wait` in vain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused {
    /// The limit when the call gave up.
    pub(crate) limit: u32,
}

impl Limiter {
    pub(crate) fn new(policy: ConcurrencyLimit) -> Limiter {
        Limiter {
            policy,
            in_flight: AtomicU32::new(0),
            limit: AtomicU32::new(OPEN),
            round: AtomicU32::new(0),
            credit: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            places: Notify::new(),
        }
    }

    /// The current limit (`None`: unlimited).
    pub(crate) fn limit(&self) -> Option<u32> {
        match self.limit.load(Ordering::Acquire) {
            OPEN => None,
            n => Some(n),
        }
    }

    /// Takes a place if one is free now.
    fn try_enter(&self) -> bool {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if before < self.limit.load(Ordering::Acquire) {
            return true;
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        false
    }

    /// Takes a place if one is free now (always, with the limit off), without a future to make. Every
    /// `true` must be followed by one [`leave`](Limiter::leave); on `false`, wait with
    /// [`wait_for_place`](Limiter::wait_for_place).
    pub(crate) fn enter_now(&self) -> bool {
        self.policy.off || self.try_enter()
    }

    /// Waits for a place, at most the policy's `max_wait`, after [`enter_now`](Limiter::enter_now)
    /// found none. Every `Ok` must be followed by one [`leave`](Limiter::leave).
    pub(crate) async fn wait_for_place(&self) -> Result<(), Refused> {
        let deadline = tokio::time::Instant::now() + self.policy.max_wait;
        let _waiting = Waiting::count(&self.waiting);
        let entered = loop {
            let notified = self.places.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check: a place freed between the check and the wait still wakes
            // this call.
            notified.as_mut().enable();
            if self.try_enter() {
                break true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break self.try_enter();
            }
        };
        if entered {
            Ok(())
        } else {
            Err(Refused {
                limit: self.limit.load(Ordering::Acquire),
            })
        }
    }

    /// Gives a place back.
    pub(crate) fn leave(&self) {
        if self.policy.off {
            return;
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.wake_one();
    }

    fn wake_one(&self) {
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.places.notify_one();
        }
    }

    /// The round an attempt starting now belongs to (pass it to
    /// [`rate_limited`](Limiter::rate_limited)).
    pub(crate) fn round(&self) -> u32 {
        self.round.load(Ordering::Acquire)
    }

    /// The dependency answered "rate limited" to an attempt sent in `round`: fewer calls at once,
    /// unless the limit was lowered since that attempt was sent. Returns the new limit if it changed.
    pub(crate) fn rate_limited(&self, round: u32) -> Option<u32> {
        if self.policy.off
            || self
                .round
                .compare_exchange(
                    round,
                    round.wrapping_add(1),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
        {
            return None;
        }
        self.credit.store(0, Ordering::Release);
        let in_flight = self.in_flight.load(Ordering::Acquire).max(1);
        let update = |limit: u32| {
            let base = f64::from(limit.min(in_flight));
            let lowered = (base * self.policy.decrease).floor() as u32;
            let next = lowered.max(self.policy.min).min(limit);
            (next != limit).then_some(next)
        };
        self.limit
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, update)
            .ok()
            .and_then(update)
    }

    /// An attempt succeeded: while the limit is in use, a limit's worth of successes allows one more
    /// call at once. Returns the new limit (`None` inside: unlimited again) if it changed.
    pub(crate) fn succeeded(&self) -> Option<Option<u32>> {
        if self.policy.off {
            return None;
        }
        let limit = self.limit.load(Ordering::Acquire);
        let in_flight = self.in_flight.load(Ordering::Acquire);
        if limit == OPEN || in_flight.saturating_mul(2) < limit {
            return None;
        }
        if self.credit.fetch_add(1, Ordering::AcqRel) + 1 < limit {
            return None;
        }
        self.credit.store(0, Ordering::Release);
        let max = self.policy.max;
        let update = |limit: u32| {
            if limit == OPEN {
                return None;
            }
            let next = limit + 1;
            Some(if next >= max { OPEN } else { next })
        };
        let changed = self
            .limit
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, update)
            .ok()
            .and_then(update)?;
        if changed == OPEN {
            // Unlimited again: every waiting call may go.
            self.places.notify_waiters();
        } else {
            self.wake_one();
        }
        Some((changed != OPEN).then_some(changed))
    }
}

/// Counts a waiting call for as long as it waits, including a call whose future is dropped while it
/// waits.
struct Waiting<'a>(&'a AtomicU32);

impl<'a> Waiting<'a> {
    fn count(waiting: &'a AtomicU32) -> Waiting<'a> {
        waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
impl Limiter {
    /// Takes a place, at once or after a wait: what a call does, in two steps.
    pub(crate) async fn enter(&self) -> Result<(), Refused> {
        if self.enter_now() {
            return Ok(());
        }
        self.wait_for_place().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unlimited_until_rate_limited() {
        let limiter = Limiter::new(DEFAULT_CONCURRENCY_LIMIT);
        for _ in 0..5_000 {
            limiter.enter().await.expect("no limit yet");
        }
        assert_eq!(limiter.limit(), None);
        for _ in 0..5_000 {
            limiter.leave();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_of_rate_limited_answers_halves_the_limit_once() {
        let limiter = Limiter::new(DEFAULT_CONCURRENCY_LIMIT.max(12));
        for _ in 0..10 {
            limiter.enter().await.expect("open");
        }
        let sent = limiter.round();
        // 10 in flight: halved to 5, once for all the answers to attempts of that round.
        assert_eq!(limiter.rate_limited(sent), Some(5));
        assert_eq!(limiter.rate_limited(sent), None);
        assert_eq!(limiter.limit(), Some(5));
        // An attempt sent after the decrease lowers it again (from the limit, not the 10 in flight).
        assert_eq!(limiter.rate_limited(limiter.round()), Some(2));
        // Over the limit: waits max_wait, then refused.
        let refused = limiter.enter().await.expect_err("over the limit");
        assert_eq!(refused, Refused { limit: 2 });
        for _ in 0..9 {
            limiter.leave();
        }
        // One in flight, limit 2: in use. Two successes (a limit's worth) allow one more.
        assert_eq!(limiter.succeeded(), None);
        assert_eq!(limiter.succeeded(), Some(Some(3)));
        for _ in 0..2 {
            limiter.enter().await.expect("a place");
        }
        assert!(!limiter.try_enter(), "3 in flight, limit 3");
        // With 3 in flight, the limit stops at 7 (3 × 2 < 7): successes with half the places idle say nothing
        // about a higher one.
        for _ in 0..100 {
            limiter.succeeded();
        }
        assert_eq!(limiter.limit(), Some(7));
        // Calls filling every place climb back to max, where the limit opens.
        for _ in 0..200 {
            while limiter.limit().is_some() && limiter.try_enter() {}
            limiter.succeeded();
        }
        assert_eq!(limiter.limit(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_call_takes_the_place_that_frees_up() {
        let limiter = std::sync::Arc::new(Limiter::new(DEFAULT_CONCURRENCY_LIMIT));
        limiter.enter().await.expect("open");
        limiter.rate_limited(limiter.round());
        assert_eq!(limiter.limit(), Some(1), "never below min");
        let waiter = tokio::spawn({
            let limiter = limiter.clone();
            async move {
                assert!(!limiter.enter_now(), "no place free at once");
                limiter.wait_for_place().await
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        limiter.leave();
        assert_eq!(waiter.await.expect("task"), Ok(()), "a place after waiting");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_dropped_while_waiting_holds_nothing() {
        let limiter = Limiter::new(DEFAULT_CONCURRENCY_LIMIT);
        limiter.enter().await.expect("open");
        limiter.rate_limited(limiter.round());
        let gave_up = tokio::time::timeout(Duration::from_millis(100), limiter.enter()).await;
        assert!(gave_up.is_err(), "still waiting when dropped");
        assert_eq!(limiter.waiting.load(Ordering::Acquire), 0);
        assert_eq!(limiter.in_flight.load(Ordering::Acquire), 1);
        limiter.leave();
        assert!(limiter.enter_now(), "the place is free at once");
    }

    #[tokio::test]
    async fn an_idle_limit_does_not_grow() {
        let limiter = Limiter::new(DEFAULT_CONCURRENCY_LIMIT);
        for _ in 0..10 {
            limiter.enter().await.expect("open");
        }
        limiter.rate_limited(limiter.round());
        let limit = limiter.limit().expect("limited");
        for _ in 0..10 {
            limiter.leave();
        }
        // Nothing in flight: successes say nothing about a higher limit.
        for _ in 0..100 {
            assert_eq!(limiter.succeeded(), None);
        }
        assert_eq!(limiter.limit(), Some(limit));
    }

    #[tokio::test]
    async fn off_never_limits() {
        let limiter = Limiter::new(ConcurrencyLimit::off());
        limiter.enter().await.expect("off");
        assert_eq!(limiter.rate_limited(limiter.round()), None);
        assert_eq!(limiter.limit(), None);
    }
}
