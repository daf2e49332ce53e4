//! The limits a runtime puts on its calls, simulated with paused time — one test binary.
//!
//! * [`retry_budget`]: retries drawn from a budget, so that an outage does not become a retry storm
//!   (was `tests/budget.rs`).
//! * [`concurrency_limit`]: the adaptive concurrency limit of a dependency that answers "rate limited"
//!   (was `tests/rate_limits.rs`).

#[path = "../support/mod.rs"]
mod support;

mod concurrency_limit;
mod retry_budget;
