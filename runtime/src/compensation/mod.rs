//! Compensation: calls whose outcome stays uncertain after their retries are marked `UNKNOWN` and queued
//! in the store ([`CompensationEntry`]), and a worker ([`Compensator`]) drives every queued call to an
//! end — its outcome recorded, its key given back, or a person asked — in bounded rounds, one worker per
//! entry at a time. No entry is retried forever or dropped.
//!
//! # Guarantees
//!
//! * **One worker per entry.** An entry is taken under a lease and a worker fence; a worker whose lease
//!   lapsed and whose entry another worker took is refused every write to that entry, so it cannot
//!   reschedule, finish or escalate it.
//! * **One owner per key.** Before acting on a call, the worker takes its key over (a new receipt
//!   fence, as a duplicate call would), so a stalled caller that comes back is fenced out, and two
//!   workers never record two outcomes.
//! * **Bounded.** Every round that settles nothing moves the entry to the next, later round; after the
//!   last one the entry becomes `MANUAL` and the escalation hook runs. Nothing is retried forever and
//!   nothing disappears: an entry ends recorded, released, failed, or `MANUAL`.
//! * **Once an attempt may have run, nothing releases its key** — the call path's rule, kept here:
//!   "not received" does not release or fail a call by default ([`NotReceivedPolicy`]): it is sent again
//!   under its callId, reversed, or kept `UNKNOWN` until a person decides. Releasing or failing is an
//!   opt-in that waits until the remote refuses the call's callId.
//! * **Whatever may act keeps the key.** While a reversal or a re-run runs, the worker's lease on the
//!   call's key is renewed, so no duplicate takes it over and acts beside it; a reversal begun and not
//!   finished stops every later take-over (see [`CompensationOperation::reversal`]).
//!
//! # Layout
//!
//! * `entry`: the queue's entries ([`CompensationEntry`], [`CompensationState`]), as the stores keep them.
//! * `operations`: what the worker can resolve, by scope ([`CompensationOperation`]), and what "not received" leads
//!   to ([`NotReceivedPolicy`]).
//! * `worker`: the [`Compensator`] and its passes ([`PassReport`]); in `worker/`, one entry's round, the
//!   reversal, the re-run, and what a person does ([`ManualResolution`]).

pub(crate) mod contradiction;
mod entry;
mod operations;
mod worker;

pub use entry::{CompensationEntry, CompensationState, MAX_REASON_CHARS};
pub use operations::{CompensationOperation, NotReceivedPolicy};
pub use worker::by_hand::ManualResolution;
pub use worker::{Compensator, PassReport, DEFAULT_COMPENSATION_ROUNDS};
