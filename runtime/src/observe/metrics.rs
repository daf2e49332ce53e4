//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`): install any
//! recorder (a Prometheus exporter, StatsD, …) and samekey's counters and histograms reach it. Without
//! the feature, or with no recorder installed, nothing is recorded (the facade's no-op recorder).
//!
//! Each annotated function registers its handles once, on its first call, and reuses them: with no
//! recorder installed, a call costs a few no-op method calls. Install the recorder before the first
//! call (as every recorder's documentation asks): a function called before keeps no-op handles.
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
//! | `samekey_retries_total` | counter | `scope`, `class` | retries sent after a backoff, by the class of what came before: `retryable`, `rate_limited`, `unknown` (a lookup said "not received", or `on_unknown = "rerun"`) |
//! | `samekey_lookups_total` | counter | `scope`, `answer` | lookups asked, by answer: `succeeded`, `failed`, `not_received`, `processing`, `no_answer` |
//! | `samekey_waits_total` | counter | `scope` | duplicates that waited for a busy key |
//! | `samekey_unknown_total` | counter | `scope` | calls left `UNKNOWN` and queued for compensation |
//! | `samekey_released_total` | counter | `scope` | claims given back (nothing ran) |
//! | `samekey_failed_closed_total` | counter | `scope` | calls failed closed because the store failed |
//! | `samekey_overloaded_total` | counter | `scope` | calls a [concurrency limit](crate::limits#concurrency-limits) refused before claiming (nothing ran) |
//! | `samekey_concurrency_limit` | gauge | `budget` | a dependency's concurrency limit, set when it changes (`+Inf`: unlimited again) |
//! | `samekey_budget_spent_total` | counter | `scope`, `budget` | retries (`budget`: the dependency's name, or `runtime`) and lookups (`lookups`) a [budget](crate::limits#retry-budgets) refused |
//! | `samekey_store_errors_total` | counter | `backend` | store failures on the call path (`memory`, `sqlite`, `postgres`, `redis`, `cached`, `custom`) |
//! | `samekey_compensation_total` | counter | `outcome` | compensation entries worked, by outcome: `succeeded`, `failed`, `released`, `reversed`, `settled_elsewhere`, `rescheduled`, `escalated`, `lost`, `deferred` |
//! | `samekey_call_seconds` | histogram | `scope`, `outcome` | a call's duration, begin to answer, by the monotonic clock (`outcome`: `ok`, `error`) |
//! | `samekey_call_attempts` | histogram | `scope` | attempts per call that ran its body |

#[cfg(feature = "metrics")]
use std::sync::OnceLock;

use super::stats::Counter;

#[cfg(feature = "metrics")]
use ::metrics::{Counter as Handle, Histogram};

/// The metric a [`Counter`] feeds with the `scope` label alone (`None`: one with more labels, fed
/// through its own method).
#[cfg(feature = "metrics")]
fn name(counter: Counter) -> Option<&'static str> {
    Some(match counter {
        Counter::Calls => "samekey_calls_total",
        Counter::Claims => "samekey_claims_total",
        Counter::Replays => "samekey_replays_total",
        Counter::Attempts => "samekey_attempts_total",
        Counter::Waits => "samekey_waits_total",
        Counter::Unknown => "samekey_unknown_total",
        Counter::Released => "samekey_released_total",
        Counter::FailedClosed => "samekey_failed_closed_total",
        Counter::Overloaded => "samekey_overloaded_total",
        Counter::Lookups | Counter::Retries | Counter::BudgetSpent => return None,
    })
}

/// What a retry follows: the `class` label of `samekey_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryClass {
    /// An attempt answered `Retryable`.
    Retryable,
    /// An attempt answered `RateLimited`.
    RateLimited,
    /// An attempt's outcome was unknown, and the call sends again (the lookup said "not received",
    /// or `on_unknown = "rerun"`).
    Unknown,
}

/// The classes a retry's label takes, in [`RetryClass`]' order.
#[cfg(feature = "metrics")]
const RETRY_CLASSES: [&str; 3] = ["retryable", "rate_limited", "unknown"];

/// The answers a lookup's label takes, in [`Handles::lookups`]' order.
#[cfg(feature = "metrics")]
const ANSWERS: [&str; 5] = [
    "succeeded",
    "failed",
    "not_received",
    "processing",
    "no_answer",
];

/// One function's metric handles, registered on its first call.
#[cfg(feature = "metrics")]
struct Handles {
    counters: Vec<Option<Handle>>,
    lookups: [Handle; 5],
    retries: [Handle; 3],
    budget_retries: Handle,
    budget_lookups: Handle,
    seconds_ok: Histogram,
    seconds_error: Histogram,
    attempts: Histogram,
}

/// Where an `#[idempotent]` item keeps its metric handles. Made by the macro in the item's `Spec`;
/// empty without the `metrics` feature.
#[derive(Debug)]
pub struct MetricsCell {
    #[cfg(feature = "metrics")]
    handles: OnceLock<Handles>,
}

#[cfg(feature = "metrics")]
impl std::fmt::Debug for Handles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handles")
    }
}

impl MetricsCell {
    /// An empty cell, for a `static`.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> MetricsCell {
        MetricsCell {
            #[cfg(feature = "metrics")]
            handles: OnceLock::new(),
        }
    }

    #[cfg(feature = "metrics")]
    fn handles(&self, scope: &'static str, budget: &'static str) -> &Handles {
        self.handles.get_or_init(|| {
            let all = [
                Counter::Calls,
                Counter::Claims,
                Counter::Replays,
                Counter::Attempts,
                Counter::Lookups,
                Counter::Retries,
                Counter::Waits,
                Counter::Unknown,
                Counter::Released,
                Counter::FailedClosed,
                Counter::BudgetSpent,
                Counter::Overloaded,
            ];
            Handles {
                counters: all
                    .iter()
                    .map(|c| name(*c).map(|name| ::metrics::counter!(name, "scope" => scope)))
                    .collect(),
                lookups: ANSWERS.map(|answer| {
                    ::metrics::counter!("samekey_lookups_total", "scope" => scope, "answer" => answer)
                }),
                retries: RETRY_CLASSES.map(|class| {
                    ::metrics::counter!("samekey_retries_total", "scope" => scope, "class" => class)
                }),
                budget_retries: ::metrics::counter!("samekey_budget_spent_total", "scope" => scope, "budget" => budget),
                budget_lookups: ::metrics::counter!("samekey_budget_spent_total", "scope" => scope, "budget" => "lookups"),
                seconds_ok: ::metrics::histogram!("samekey_call_seconds", "scope" => scope, "outcome" => "ok"),
                seconds_error: ::metrics::histogram!("samekey_call_seconds", "scope" => scope, "outcome" => "error"),
                attempts: ::metrics::histogram!("samekey_call_attempts", "scope" => scope),
            }
        })
    }

    /// One more of `counter` for the function of `scope`.
    #[inline]
    pub(crate) fn count(&self, counter: Counter, scope: &'static str, budget: &'static str) {
        #[cfg(feature = "metrics")]
        if let Some(Some(handle)) = self.handles(scope, budget).counters.get(counter as usize) {
            handle.increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (counter, scope, budget);
    }

    /// A lookup asked, and its answer (one of the closed set of answers).
    #[inline]
    pub(crate) fn lookup(&self, scope: &'static str, budget: &'static str, answer: &'static str) {
        #[cfg(feature = "metrics")]
        if let Some(i) = ANSWERS.iter().position(|a| *a == answer) {
            self.handles(scope, budget).lookups[i].increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (scope, budget, answer);
    }

    /// A retry sent after `class`.
    #[inline]
    pub(crate) fn retry(&self, scope: &'static str, budget: &'static str, class: RetryClass) {
        #[cfg(feature = "metrics")]
        self.handles(scope, budget).retries[class as usize].increment(1);
        #[cfg(not(feature = "metrics"))]
        let _ = (scope, budget, class);
    }

    /// A retry (`lookups: false`) or a lookup a budget refused.
    #[inline]
    pub(crate) fn budget_spent(&self, scope: &'static str, budget: &'static str, lookups: bool) {
        #[cfg(feature = "metrics")]
        {
            let handles = self.handles(scope, budget);
            if lookups {
                handles.budget_lookups.increment(1);
            } else {
                handles.budget_retries.increment(1);
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (scope, budget, lookups);
    }

    /// A call begun when `took` started answered, with `attempts` attempts of its body.
    #[inline]
    pub(crate) fn call(
        &self,
        scope: &'static str,
        budget: &'static str,
        ok: bool,
        took: &Stopwatch,
        attempts: u32,
    ) {
        #[cfg(feature = "metrics")]
        {
            let handles = self.handles(scope, budget);
            let seconds = if ok {
                &handles.seconds_ok
            } else {
                &handles.seconds_error
            };
            seconds.record(took.0.elapsed().as_secs_f64());
            if attempts > 0 {
                handles.attempts.record(f64::from(attempts));
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (scope, budget, ok, took, attempts);
    }
}

/// When a call began, by the monotonic clock, for its duration in `samekey_call_seconds` (to the
/// nanosecond: a replay takes well under a millisecond). Without the feature it reads nothing and
/// holds nothing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch(#[cfg(feature = "metrics")] std::time::Instant);

impl Stopwatch {
    #[inline]
    pub(crate) fn start() -> Stopwatch {
        Stopwatch(
            #[cfg(feature = "metrics")]
            std::time::Instant::now(),
        )
    }
}

/// A store failure on the call path.
#[inline]
pub(crate) fn store_error(backend: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("samekey_store_errors_total", "backend" => backend).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = backend;
}

/// The concurrency limit of the dependency `budget` changed to `limit` (`None`: unlimited).
#[inline]
pub(crate) fn concurrency_limit(budget: &str, limit: Option<u32>) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!("samekey_concurrency_limit", "budget" => budget.to_owned())
        .set(limit.map_or(f64::INFINITY, f64::from));
    #[cfg(not(feature = "metrics"))]
    let _ = (budget, limit);
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
