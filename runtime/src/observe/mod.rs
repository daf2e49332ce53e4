//! What samekey lets you see of its calls, and where each is documented. Nothing here changes a call:
//! reading a report, the stats, the metrics or the journal never claims, runs or records anything.
//!
//! | what | tells | read it with | documented at |
//! |---|---|---|---|
//! | call reports | how one call was answered (executed, replayed, refused), its callId, key and attempts | [`observed`] around the call | [`observed`], [`CallReport`], [`CallAnswer`] |
//! | stats | what a runtime did since it was made: counts of calls, claims, replays, attempts, lookups, retries, … | [`Runtime::stats`](crate::Runtime::stats) | [`RuntimeStats`] |
//! | metrics | the same events per scope, and call durations, through the `metrics` facade (feature `metrics`) | the recorder you install | [`metrics`]: every metric, its kind and labels |
//! | journal | a call's timeline, kept in the store, readable from any process, also while the call runs | [`Runtime::history`](crate::Runtime::history), [`Runtime::history_of_key`](crate::Runtime::history_of_key) | [`journal`](crate::journal) |
//! | tracing | every step as a `tracing` event, target `samekey`, fields `call_id`, `key`, `attempt` | any `tracing` subscriber | the `#[idempotent]` attribute's reference (`samekey::idempotent`), section *Tracing* |
//! | receipts | a call's outcome, by callId | [`Runtime::receipt`](crate::Runtime::receipt) | [`Receipt`](crate::Receipt) |
//!
//! The files: `report.rs` ([`observed`] and its report), `stats.rs` (the runtime's counters),
//! `metrics.rs` (the [`metrics`] module); the journal and the tracing events live with the code that
//! writes them.

pub mod metrics;
mod report;
mod stats;

pub(crate) use report::Slot;
pub use report::{observed, CallAnswer, CallReport};
pub use stats::RuntimeStats;
pub(crate) use stats::{Counter, Counters};
