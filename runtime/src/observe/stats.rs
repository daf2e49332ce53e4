//! Counters of what a [`Runtime`](crate::Runtime) did, for metrics and for tests: relaxed atomic
//! increments, shared by every clone of the runtime.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Clone, Copy)]
pub(crate) enum Counter {
    Calls,
    Claims,
    Replays,
    Attempts,
    Lookups,
    Retries,
    Waits,
    Unknown,
    Released,
    FailedClosed,
    BudgetSpent,
    Overloaded,
}

/// One slot per [`Counter`]: the last variant's index, plus one.
const COUNTERS: usize = Counter::Overloaded as usize + 1;

#[derive(Debug, Default)]
pub(crate) struct Counters([AtomicU64; COUNTERS]);

impl Counters {
    pub(crate) fn add(&self, counter: Counter) {
        self.0[counter as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> RuntimeStats {
        let get = |c: Counter| self.0[c as usize].load(Ordering::Relaxed);
        RuntimeStats {
            calls: get(Counter::Calls),
            claims: get(Counter::Claims),
            replays: get(Counter::Replays),
            attempts: get(Counter::Attempts),
            lookups: get(Counter::Lookups),
            retries: get(Counter::Retries),
            waits: get(Counter::Waits),
            unknown: get(Counter::Unknown),
            released: get(Counter::Released),
            failed_closed: get(Counter::FailedClosed),
            budget_spent: get(Counter::BudgetSpent),
            overloaded: get(Counter::Overloaded),
        }
    }
}

/// What a runtime did since it was made, from [`Runtime::stats`](crate::Runtime::stats). Each field
/// counts events, not calls in that state: a call that retried twice adds 3 `attempts` and 2 `retries`;
/// `calls - replays - failed_closed` is roughly the calls that ran or resolved something. The counters
/// are per process and only grow. New counters may be added (the struct is `#[non_exhaustive]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeStats {
    /// Calls started.
    pub calls: u64,
    /// Keys claimed or taken over (a call that may run its body).
    pub claims: u64,
    /// Calls answered with a stored outcome, without running.
    pub replays: u64,
    /// Attempts of a body.
    pub attempts: u64,
    /// Receipt lookups asked of the remote side.
    pub lookups: u64,
    /// Retries scheduled (after a backoff).
    pub retries: u64,
    /// Waits of a duplicate on a busy key.
    pub waits: u64,
    /// Calls left `UNKNOWN` and queued for compensation.
    pub unknown: u64,
    /// Claims released because nothing ran.
    pub released: u64,
    /// Calls that failed closed because the store failed.
    pub failed_closed: u64,
    /// Retries and lookups a budget refused ([retry budgets](crate::limits#retry-budgets)).
    pub budget_spent: u64,
    /// Calls a dependency's [concurrency limit](crate::limits#concurrency-limits) refused (nothing ran).
    pub overloaded: u64,
}
