//! What a call leaves for the people who watch it — one test binary.
//!
//! * [`metrics`]: every metric of `samekey::observe::metrics`, read back from a recorder (feature `metrics`).
//! * [`journal`]: the timeline every path leaves, read by callId and by key.
//!
//! [`metrics`] collects with `metrics::with_local_recorder` on a current-thread runtime, so the calls
//! of the tests beside it, on other threads, never reach its recorder. The `tracing` events are
//! checked by a binary of their own, `tracing_events`: a subscriber set for one thread while no other
//! is installed leaves `tracing`'s per-callsite cache to whichever thread reaches a callsite first, so
//! an event first reached by another test would be off for it.

#[path = "../support/mod.rs"]
mod support;

mod journal;
mod metrics;
