//! Compensation: the worker that settles what a call left `UNKNOWN`, and reconciliation with the
//! counterparty's records — one test binary.
//!
//! * [`worker`]: the compensation worker with paused time, in memory: every `UNKNOWN` call ends
//!   recorded, released, failed or `MANUAL` (was `tests/compensator.rs`).
//! * [`on_every_store`]: the worker on every backend, in real time, with a caller on the same key
//!   (was `tests/compensation_stores.rs`).
//! * [`reconcile`]: a constructed day reconciled on every backend.
//!
//! On the shared PostgreSQL server, [`on_every_store`]'s workers take every due entry of the queue and
//! its sweep queues every orphan, whoever made them: a test that reads its own entries, its journal or
//! its orphans there must not run beside it, so the tests that do (`call::promise`, `call::callbacks`,
//! the conformance suites) are in other binaries, which cargo runs one after the other. What runs
//! beside it here is unaffected: [`worker`] is in memory, and [`reconcile`] reads receipts, which a
//! worker without an operation for their scope never changes.

#[path = "../support/mod.rs"]
mod support;

mod on_every_store;
mod reconcile;
mod worker;
