//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`): install any
//! recorder (a Prometheus exporter, StatsD, …) and samekey's counters and histograms reach it. Without
//! the feature, or with no recorder installed, nothing is recorded (the facade's no-op recorder).
//!
//! Labels have bounded cardinality: `scope` (one per annotated function, or its `scope = …`), a
//! closed set of values for the others, never a key or a callId.
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `samekey_calls_total` | counter | `scope` | calls begun |
//! | `samekey_claims_total` | counter | `scope` | keys claimed or taken over (calls that may run) |
//! | `samekey_replays_total` | counter | `scope` | calls answered from a stored outcome |
//! | `samekey_attempts_total` | counter | `scope` | attempts of a body |
//! | `samekey_retries_total` | counter | `scope` | retries sent after a backoff |
//! | `samekey_lookups_total` | counter | `scope`, `answer` | lookups asked, by answer: `succeeded`, `failed`, `not_received`, `processing`, `no_answer` |
//! | `samekey_waits_total` | counter | `scope` | duplicates that waited for a busy key |
//! | `samekey_unknown_total` | counter | `scope` | calls left `UNKNOWN` and queued for compensation |
//! | `samekey_released_total` | counter | `scope` | claims given back (nothing ran) |
//! | `samekey_failed_closed_total` | counter | `scope` | calls failed closed because the store failed |
//! | `samekey_budget_spent_total` | counter | `scope`, `budget` | retries (`budget`: the dependency's name, or `runtime`) and lookups (`lookups`) a [budget](crate::budget) refused |
//! | `samekey_store_errors_total` | counter | `backend` | store failures on the call path (`memory`, `sqlite`, `postgres`, `redis`, `cached`, `custom`) |
//! | `samekey_compensation_total` | counter | `outcome` | compensation entries worked, by outcome: `succeeded`, `failed`, `released`, `reversed`, `settled_elsewhere`, `rescheduled`, `escalated`, `lost`, `deferred` |
//! | `samekey_call_seconds` | histogram | `scope`, `outcome` | a call's duration, begin to answer (`outcome`: `ok`, `error`) |
//! | `samekey_call_attempts` | histogram | `scope` | attempts per call that ran its body |

use crate::stats::Counter;

/// The metric a [`Counter`] feeds.
#[cfg(feature = "metrics")]
fn name(counter: Counter) -> &'static str {
    match counter {
        Counter::Calls => "samekey_calls_total",
        Counter::Claims => "samekey_claims_total",
        Counter::Replays => "samekey_replays_total",
        Counter::Attempts => "samekey_attempts_total",
        Counter::Lookups => "samekey_lookups_total",
        Counter::Retries => "samekey_retries_total",
        Counter::Waits => "samekey_waits_total",
        Counter::Unknown => "samekey_unknown_total",
        Counter::Released => "samekey_released_total",
        Counter::FailedClosed => "samekey_failed_closed_total",
        Counter::BudgetSpent => "samekey_budget_spent_total",
    }
}

/// One more of `counter` for `scope` (lookups and budget refusals have their own, with a label more).
#[inline]
pub(crate) fn count(counter: Counter, scope: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(name(counter), "scope" => scope).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (counter, scope);
}

/// A lookup asked, and its answer.
#[inline]
pub(crate) fn lookup(scope: &'static str, answer: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("samekey_lookups_total", "scope" => scope, "answer" => answer).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (scope, answer);
}

/// A retry or a lookup a budget refused.
#[inline]
pub(crate) fn budget_spent(scope: &'static str, budget: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("samekey_budget_spent_total", "scope" => scope, "budget" => budget)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (scope, budget);
}

/// A store failure on the call path.
#[inline]
pub(crate) fn store_error(backend: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("samekey_store_errors_total", "backend" => backend).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = backend;
}

/// `n` compensation entries that ended a pass with `outcome`.
#[inline]
pub(crate) fn compensation(outcome: &'static str, n: usize) {
    #[cfg(feature = "metrics")]
    if n > 0 {
        ::metrics::counter!("samekey_compensation_total", "outcome" => outcome).increment(n as u64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (outcome, n);
}

/// A call answered after `ms`, with `attempts` attempts of its body.
#[inline]
pub(crate) fn call(scope: &'static str, ok: bool, ms: u64, attempts: u32) {
    #[cfg(feature = "metrics")]
    {
        let outcome = if ok { "ok" } else { "error" };
        ::metrics::histogram!("samekey_call_seconds", "scope" => scope, "outcome" => outcome)
            .record(ms as f64 / 1_000.0);
        if attempts > 0 {
            ::metrics::histogram!("samekey_call_attempts", "scope" => scope)
                .record(f64::from(attempts));
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (scope, ok, ms, attempts);
}
