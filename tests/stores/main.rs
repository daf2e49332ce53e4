//! The stores under calls: each backend's durability, what a bounded or cached store keeps, stores
//! that fail, nodes whose clocks disagree, and a PostgreSQL schema migrated from an earlier release —
//! one test binary. (The store contract itself is the conformance suite, run on every backend by
//! `samekey-runtime`'s own tests.)
//!
//! * [`backends`]: which backends this build leaves out, and how to run them.
//! * [`memory_capacity`]: a bounded in-memory store under calls.
//! * [`memory_slots`]: the in-memory store's records in slots and outcomes kept inline.
//! * [`cache_forget`]: a key forgotten through a cache in front of the store goes at once.
//! * [`sqlite_durability`], [`postgres_durability`]: restarts, two OS processes racing on the same
//!   keys (this binary starts itself twice, running only the worker test named by its path here,
//!   `sqlite_durability::worker_process` or `postgres_durability::worker_process`), receipts in the
//!   caller's transaction, a server that cannot be reached.
//! * [`postgres_migration`]: times from `BIGINT` to `timestamptz`, each test in a PostgreSQL schema of
//!   its own (was `runtime/tests/postgres_migration.rs`).
//! * [`faults`]: corrupted records, a front cache or a Redis store going down, on Redis servers these
//!   tests start themselves (was `tests/store_faults.rs`).
//! * [`clock_skew`]: two nodes a few seconds apart on one shared store.
//!
//! Nothing here runs the compensation worker or its sweep (they act on every entry and orphan of the
//! shared PostgreSQL queue: the `compensation` binary), nor restarts the shared PostgreSQL server: that
//! test is a binary of its own (`postgres_restart`), so that nothing else talks to the server then.

#[path = "../support/mod.rs"]
mod support;

mod backends;
mod cache_forget;
mod clock_skew;
mod faults;
mod last_release;
mod memory_capacity;
mod memory_slots;
mod postgres_durability;
mod postgres_listen;
mod postgres_migration;
mod sqlite_durability;
