//! The call: what one `#[idempotent]` call, or the public at-most-once core without the attribute,
//! decides, keeps and promises — one test binary.
//!
//! * [`decision_table`]: one test per step of the decision table (`docs/rules.md`), with paused time.
//! * [`promise`]: the promise at the edges (a caller gone mid-write, an owner back after its lease, a
//!   lookup or a release that fails), on every backend.
//! * [`at_most_once`]: the same decisions through the public core (`AtMostOnce`) and a closure.
//! * [`cancelled`]: a caller gone while a known outcome that nothing could write is journaled.
//! * [`panics`]: user code that panics while samekey records the outcome never frees the key.
//! * [`callbacks`]: receipts moved forward by the counterparty's callbacks, once, on every backend.
//! * [`concurrent_duplicates`]: many duplicates of one key at once (was `tests/concurrency.rs`).
//! * [`kept_replays`]: what a replay hands back, decoded once and kept.
//! * [`keys`], [`call_ids`], [`scopes`]: the key's encoding, callIds, and which operation a default
//!   scope belongs to.
//! * [`round_trips`], [`footprint`]: what a call costs — its store round trips on every backend, its
//!   future's size.
//! * [`readme_promises`]: a payments service written from the README alone (was
//!   `tests/first_hour.rs`).
//!
//! On the shared PostgreSQL server, every test here looks at its own keys, receipts and queue entries
//! only, and none of them runs the compensation worker or its sweep: those act on every due entry and
//! every orphan of the server's queue, and would touch these tests' calls mid-test (they are in the
//! `compensation` binary). Default scopes are `module_path!()` + the function's name, so a test that
//! names one writes this binary's module path (`call::decision_table::…`).

#[path = "../support/mod.rs"]
mod support;

mod at_most_once;
mod call_ids;
mod callbacks;
mod cancelled;
mod concurrent_duplicates;
mod decision_table;
mod footprint;
mod kept_replays;
mod keys;
mod panics;
mod promise;
mod readme_promises;
mod round_trips;
mod scopes;
