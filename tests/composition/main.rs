//! Features composed, not only alone, in memory with paused time — one test binary.
//!
//! * [`nested_calls`]: a call nested in another one's body, and a duplicate waiting on a full bounded
//!   store (was `tests/composition.rs`).
//! * [`crossings`]: two features whose paths cross on one call, one key or one queue entry — take-overs,
//!   reversals, callbacks, an inbox on the producer's runtime, a worker behind a `LocalCache` (was
//!   `tests/composition_attacks.rs`, the attacks of issue 24's review).

#[path = "../support/mod.rs"]
mod support;

mod crossings;
mod nested_calls;
