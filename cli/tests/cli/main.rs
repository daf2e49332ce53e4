//! The built `samekey` binary, run as an operator runs it — one test binary.
//!
//! * [`sqlite`]: against a real SQLite store, what it prints for people (pinned as `insta` snapshots
//!   in `snapshots/`, named after this module: `cli__sqlite__<name>.snap`) and machines, what it
//!   changes, and its exit codes (was `tests/cli.rs`).
//! * [`servers`]: against PostgreSQL, Redis and a Redis Cluster, each walked through audit, list,
//!   inspect, resolve, reconcile, forget and purge (features `postgres`, `redis`).
//! * [`support`]: a store planted with what an operator meets, and the command to run on it.

mod servers;
mod sqlite;
mod support;
