//! [`Dialect`]: what each database adds to [`SqlStore`] — its statements, each whole in a `.sql` file,
//! and the few steps its Rust differs in — and the [`Statements`] it gives the shared code. Named
//! from this crate only (sealed): the dialects are this crate's, and a store is named by its alias
//! ([`PgStore`](crate::store::PgStore), [`SqliteStore`](crate::store::SqliteStore)).
//!
//! # A dialect
//!
//! A dialect is a folder beside `sql/`: `postgres/`, `sqlite/`, `mysql/`. It holds `schema.sql` (the tables,
//! idempotent), `migrations/` (what an earlier release's database needs and the schema cannot do),
//! `statements/` (every statement the store sends, one file each, named after what it does, opening
//! with a comment that says what its parameters are), and a `mod.rs` that implements [`Dialect`] for
//! the sqlx database type — the [`Statements`] of its folder, the claim, the journal's append, the
//! wait for a busy key — beside the store's alias (`pub type PgStore = SqlStore<Postgres>`), its
//! inherent `connect`/`migrate`, and its part in [`open_existing`](crate::store::open_existing): the
//! URL schemes that name the database and how to open a store that already exists
//! (`statements/holds_tables.sql` says whether it does). A new database is such a folder and one line
//! in `open_existing`'s list.
//!
//! Every statement the shared code sends uses numbered placeholders (`$n`), which PostgreSQL and
//! SQLite both read, and some use one parameter twice (the time). MySQL's `?` are positional only:
//! its statements name their parameters first, in a derived table (`JOIN (SELECT ? AS k, ? AS
//! caller_ms) AS p`), in the order the shared code binds them, and refer to `p.k` as often as they
//! need; a `LIMIT ?` comes last, so the shared code binds the limit last.

use std::future::Future;
use std::time::Duration;

use super::SqlStore;
use crate::compensation::CompensationEntry;
use crate::error::StoreError;
use crate::journal::Event;
use crate::key::Key;
use crate::receipt::{Fence, Receipt};
use crate::store::{Claim, Claimed};

/// What a database adds to [`SqlStore`]: its statements and the steps where its Rust differs. Sealed:
/// implemented in this crate, for the sqlx database types of the backends it has.
pub trait Dialect: sqlx::Database {
    /// The name users write the store by (`PgStore`), for `Debug`.
    const STORE: &'static str;

    /// What [`Store::kind`](crate::store::Store::kind) answers (`postgres`, `sqlite`).
    const KIND: &'static str;

    /// The statements of the dialect's folder that the shared code sends.
    const SQL: Statements;

    /// How many rows a statement changed.
    fn rows_affected(done: &Self::QueryResult) -> u64;

    /// Whether `e` is a lock conflict (a deadlock, a lock wait timeout) that running the statement
    /// again resolves: the purge runs again, up to three times. None on a database whose writers
    /// never deadlock on these statements.
    fn lock_conflict(_e: &sqlx::Error) -> bool {
        false
    }

    /// [`Store::claim`](crate::store::Store::claim): where the dialects differ most (one statement that
    /// answers either way on PostgreSQL; a statement and, when the key is held, a read on SQLite).
    fn claim(
        store: &SqlStore<Self>,
        claim: Claim,
    ) -> impl Future<Output = Result<Claimed, StoreError>> + Send;

    /// [`Store::take_over`](crate::store::Store::take_over) and
    /// [`Store::reopen`](crate::store::Store::reopen): the statement `sql` (the dialect's `take_over`
    /// or `reopen`), which answers the new fence ([`SqlStore::take_over_returning`] where the
    /// database has `RETURNING`).
    fn take_over(
        store: &SqlStore<Self>,
        sql: &'static str,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Claimed, StoreError>> + Send;

    /// [`Store::take_due_compensations`](crate::store::Store::take_due_compensations), answered in
    /// any order ([`SqlStore::take_due_returning`] where the database has `RETURNING`).
    fn take_due(
        store: &SqlStore<Self>,
        now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> impl Future<Output = Result<Vec<CompensationEntry>, StoreError>> + Send;

    /// [`Store::append_journal`](crate::store::Store::append_journal) of at least one event.
    fn append_journal(
        store: &SqlStore<Self>,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// [`Store::wait_settled`](crate::store::Store::wait_settled): by notification where the database has
    /// them, else by [`poll_settled`](crate::store::poll_settled).
    fn wait_settled(
        store: &SqlStore<Self>,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> impl Future<Output = Result<Option<Receipt>, StoreError>> + Send;
}

/// The statements a [`Dialect`] gives the shared code, each whole: field `complete` is the file
/// `statements/complete.sql` of the dialect's folder, whose opening comment says what its
/// parameters are.
pub struct Statements {
    /// A take-over of a key `UNKNOWN` or past its lease, under a new fence; answers the fence.
    pub take_over: &'static str,
    /// Takes a finished record back (`SUCCESS`, `FAILED`) under a new fence, for a correction.
    pub reopen: &'static str,
    /// A lease extension by the owner holding the fence.
    pub extend_lease: &'static str,
    /// A completion: the outcome, by the owner holding the fence.
    pub complete: &'static str,
    /// `UNKNOWN`, by the owner holding the fence.
    pub mark_unknown: &'static str,
    /// A claim given back: the row becomes a tombstone.
    pub release: &'static str,
    /// A finished record forgotten: the row becomes a tombstone.
    pub forget: &'static str,
    /// A key's row, whatever its expiry.
    pub key_row: &'static str,
    /// A key's row as last committed, read after a completion was refused, to say why: on the
    /// caller's transaction too (`complete_in`), whose snapshot may be older than the take-over that
    /// refused it (MySQL's `REPEATABLE READ`: a locking read); elsewhere `key_row`.
    pub refused_row: &'static str,
    /// A key's row unless it expired.
    pub live_row: &'static str,
    /// The record of a callId.
    pub by_call_id: &'static str,
    /// The records of the callIds of a JSON array.
    pub by_call_ids: &'static str,
    /// How many of samekey's tables the database holds (0: it was never a samekey store).
    pub holds_tables: &'static str,
    /// The store's time, for a dialect that judges by its own clock; `None`: the caller's time
    /// judges, and is answered without asking the database.
    pub now: Option<&'static str>,
    /// Run just before `purge_expired`, for a dialect whose new rows take their fence from a floor
    /// that a purge raises first (MySQL); `None`: nothing to run.
    pub fence_floor: Option<&'static str>,
    /// Evicts expired rows.
    pub purge_expired: &'static str,
    /// How many rows `purge_expired` would evict.
    pub count_expired: &'static str,
    /// A page of receipts, by creation time and key.
    pub list_receipts: &'static str,
    /// A page of one scope's receipts, by creation time and key.
    pub list_receipts_of_scope: &'static str,
    /// Records `PROCESSING` past their lease that nothing queued.
    pub orphans: &'static str,
    /// Queues a compensation entry.
    pub enqueue: &'static str,
    /// Takes the due entries, each under a new worker fence.
    pub take_due: &'static str,
    /// Puts a held entry back for its next round.
    pub reschedule: &'static str,
    /// Marks a held entry `MANUAL`.
    pub escalate: &'static str,
    /// Removes an entry.
    pub finish: &'static str,
    /// The worker fence of an entry.
    pub taker: &'static str,
    /// Every entry, in the order they were queued.
    pub list_compensations: &'static str,
    /// A key's journal.
    pub journal_by_key: &'static str,
    /// A call's journal.
    pub journal_by_call: &'static str,
    /// A page of the keys that have a journal.
    pub journaled_keys: &'static str,
    /// Evicts journal events no longer kept.
    pub purge_journal: &'static str,
}
