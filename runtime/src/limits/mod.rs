//! Limits on what calls send to a dependency: retry budgets, so that an outage does not turn into a
//! retry storm, and adaptive concurrency limits, so that a rate-limited dependency gets fewer calls at
//! once. [`RetryBudget`] and [`ConcurrencyLimit`] are the policies a [`RuntimeBuilder`](crate::runtime::RuntimeBuilder) sets.
//! A runtime keeps a budget and a limit for its own calls and for each dependency a function names
//! (`#[idempotent(budget = "payments")]`), made on first use, and one lookup budget all calls share.
//!
//! # Retry budgets
//!
//! A retry budget is a brake on retries when a dependency is failing, so that an outage does not turn
//! into several times the traffic (`docs/rules.md`, *Field lessons*).
//!
//! A budget allows, over a sliding window, a share of the calls made plus a floor per second — tower's
//! `TpsBudget` and Finagle's retry budget, whose defaults samekey takes: a 10 s window, 10 retries per
//! second, and 20 % of the calls. Every call that sends its first attempt deposits one call; every retry
//! withdraws one. A call whose retry the budget refuses ends as if its retries were spent: its claim is
//! released when nothing can have run, and it is left `UNKNOWN` (queued for compensation) when
//! something may have. A `lookup` is a read, not a retry: it draws from a budget of its own, larger
//! by default (one lookup per call, and 20 per second).
//!
//! Against a healthy dependency the budget never refuses a retry: a few failures among many calls
//! leave it far from empty. Against one failing every call, retries stay within the share and the
//! floor; when it recovers, its successful calls refill the window and retries are allowed again.
//!
//! Budgets are per runtime ([`RuntimeBuilder::retry_budget`](crate::runtime::RuntimeBuilder::retry_budget)) and, where a
//! function names a dependency (`#[idempotent(budget = "payments")]`), per dependency: each named
//! budget is its own window, so one failing dependency does not spend the retries of another.
//! [`RuntimeBuilder::budget`](crate::runtime::RuntimeBuilder::budget) sets a named one's policy; a name never set gets the
//! runtime's retry policy, in a window of its own.
//!
//! The hot path pays one atomic addition per call (the deposit; a slot's turn-over, once a tenth of
//! the window, costs a compare-and-swap); the sum over the window is read only when a retry asks.
//!
//! # Concurrency limits
//!
//! When a dependency answers "rate limited", the problem is the rate, not the
//! content (`docs/rules.md`, *Field lessons*). Retrying the same calls as fast as before only keeps it overloaded; sending
//! fewer at once lets it recover.
//!
//! Each dependency (a function's `budget = "…"`, or the runtime's own) counts its calls in flight: a
//! call holds a place from before it claims its key until it answers. Until the dependency first
//! answers [`RateLimited`](crate::ErrorClass::RateLimited) nothing is limited. Then the limiter
//! follows additive increase, multiplicative decrease (AIMD, as TCP's congestion window and Netflix's
//! `concurrency-limits` do):
//!
//! * a `RateLimited` answer lowers the limit to `decrease` (default ½) times the smaller of the limit
//!   and the calls in flight, never below `min` (default 1). Once per round: the answers to attempts
//!   sent before that decrease say nothing about the new limit and lower it no further (TCP lowers
//!   its window once per round trip for the same reason);
//! * attempts that succeed while the limit is in use (at least half of it in flight) raise it by one
//!   per limit's worth of successes (about one per round trip); once it is back at `max` (default
//!   200) the dependency is unlimited again.
//!
//! A call over the limit waits for a place, at most `max_wait` (default 1 s), then is refused with
//! [`Error::Overloaded`](crate::Error::Overloaded) before it claims anything: nothing ran, no key is
//! held, and the caller may try again later. A call that found a place after a wait claims its key
//! with the time of the claim, so its lease counts from then, not from before the wait. A duplicate
//! waits for its place too, as any call does (while its dependency is unlimited, a duplicate the
//! in-memory store holds the answer to is answered at once, before any of this).
//!
//! On the hot path an unlimited dependency costs two atomic additions per call.
//!
//! # Where the code is
//!
//! `budget.rs` (the policy and the sliding window), `concurrency.rs` (the policy and the AIMD limiter),
//! `dependency.rs` (a runtime's dependencies, each with its budget and its limiter).

mod budget;
mod concurrency;
mod dependency;

pub(crate) use budget::Budget;
pub use budget::{RetryBudget, DEFAULT_LOOKUP_BUDGET, DEFAULT_RETRY_BUDGET};
pub use concurrency::{ConcurrencyLimit, DEFAULT_CONCURRENCY_LIMIT};
pub(crate) use dependency::{Dependencies, Dependency, Policies};
