//! The store conformance suite on each backend's own store: in memory, SQLite, PostgreSQL and MySQL —
//! one test binary.
//!
//! * [`memory`]: the in-memory store (was `tests/memory_conformance.rs`).
//! * [`sqlite`]: SQLite, each test on a fresh file, and a file of an earlier release migrated (was
//!   `tests/sqlite_conformance.rs`).
//! * [`mysql`]: MySQL or MariaDB (`SAMEKEY_MYSQL_URL`), and migrations run from several instances at
//!   once.
//! * [`postgres`]: PostgreSQL, and an index a later release added built by `migrate` (was
//!   `tests/postgres_conformance.rs`).
//!
//! The caches run the suite in binaries of their own, `local_cache_conformance` and
//! `redis_conformance`, because each also runs it over PostgreSQL: the suite's queue checks take every
//! due entry of the store they run on, so two runs of it on one PostgreSQL server at once would take
//! each other's entries. Cargo runs test binaries one after the other.

mod memory;
mod mysql;
mod postgres;
mod sqlite;
