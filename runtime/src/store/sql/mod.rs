//! What the SQL stores share: [`SqlStore`], the one [`Store`](super::Store) over an sqlx pool that
//! [`PgStore`](super::PgStore), [`SqliteStore`](super::SqliteStore) and
//! [`MySqlStore`](super::MySqlStore) are, as sqlx's `PgPool` is a `Pool<Postgres>`. Each store is documented on its alias; what they share is said here.
//!
//! # Guarantees
//!
//! * **The unique index is the last line of defence.** Every SQL store keeps one row per key in
//!   `samekey_receipts`, the key's digest as its primary key, and one row per queued call in
//!   `samekey_compensation`, the callId as its primary key.
//! * **A key's fences never repeat.** A released claim stays as a `RELEASED` tombstone until it is
//!   purged, so that the key's next claim continues its fence sequence; a tombstone reads as "no
//!   record".
//! * **Every write of an owner is one conditional statement** on the key and its fence (and the
//!   states it may leave): it changes one row or none, and when none, the row as it is now says why
//!   ([`StoreError::Fenced`](crate::error::StoreError::Fenced),
//!   [`StoreError::InvalidTransition`](crate::error::StoreError::InvalidTransition),
//!   [`StoreError::NotFound`](crate::error::StoreError::NotFound), or the same write again:
//!   [`Transition::AlreadyApplied`](crate::receipt::Transition::AlreadyApplied)).
//! * **A statement's commit failure is reported.** A statement that writes and answers rows is read
//!   to its end: SQLite commits a statement when it runs to its end, and only then reports a failed
//!   commit.
//! * **Corrupt rows are errors, never panics**: a row that does not decode is
//!   [`StoreError::Corrupt`](crate::error::StoreError::Corrupt); any other driver error means the
//!   database did not answer as it should, and is
//!   [`StoreError::Unavailable`](crate::error::StoreError::Unavailable) (the call fails closed).
//! * **Indexes serve the comparisons.** A statement compares a time column with a converted bound,
//!   never a converted column with a bound; a statement that orders by a time column it also
//!   converts names it with its table (`ORDER BY samekey_receipts.created`), or PostgreSQL would
//!   order by the converted output column and not use the index.
//!
//! # Reading the statements
//!
//! Every statement a store sends is a file of its own in this crate's source, ready to paste into
//! `psql` or `sqlite3`: `src/store/postgres/statements/claim.sql`, `…/take_over.sql`, and so on,
//! each opening with a comment that says what it does and what its parameters are; the schema is
//! `schema.sql` beside them, the migrations are in `migrations/`. Where the dialects differ:
//! PostgreSQL keeps times as `timestamptz` and converts them to and from the Unix ms of the
//! [`Store`](super::Store) API with `samekey_ts(ms)` and `samekey_ms(column)`, and judges time by
//! its own clock (`samekey_now(caller_ms)`, which ignores the caller's time); SQLite keeps Unix ms
//! and judges by the caller's time. A taken-over row's new fence is `nextval('samekey_fence')` on
//! PostgreSQL, `fence + 1` on SQLite and MySQL. MySQL keeps times as `DATETIME(3)` in UTC and judges
//! by its own clock (`UTC_TIMESTAMP(3)`); its statements name their positional `?` parameters first,
//! in a derived table (see `mysql/statements/`), and a new row's fence is the fence floor + 1.

mod dialect;
pub(crate) mod rows;
mod store;

use std::fmt;

use sqlx::Pool;

pub(crate) use dialect::{Dialect, Statements};

/// A [`Store`](super::Store) in an SQL database: [`PgStore`](super::PgStore) (a
/// `SqlStore<sqlx::Postgres>`), [`SqliteStore`](super::SqliteStore) (a `SqlStore<sqlx::Sqlite>`) or
/// [`MySqlStore`](super::MySqlStore) (a `SqlStore<sqlx::MySql>`), each documented on its alias; see the [module documentation](self) for what they share.
pub struct SqlStore<D: Dialect> {
    pool: Pool<D>,
}

impl<D: Dialect> SqlStore<D> {
    /// The statement a completion sends (`$1` state, `$2` outcome, `$3` ttl, `$4` now, `$5` key,
    /// `$6` fence); it changes one row or none.
    pub const COMPLETE_SQL: &'static str = D::SQL.complete;

    /// A store on a pool the caller made; call its `migrate` once before use.
    pub fn from_pool(pool: Pool<D>) -> SqlStore<D> {
        SqlStore { pool }
    }

    /// The connection pool.
    pub fn pool(&self) -> &Pool<D> {
        &self.pool
    }
}

impl<D: Dialect> Clone for SqlStore<D> {
    fn clone(&self) -> Self {
        SqlStore {
            pool: self.pool.clone(),
        }
    }
}

impl<D: Dialect> fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(D::STORE).field("pool", &self.pool).finish()
    }
}
