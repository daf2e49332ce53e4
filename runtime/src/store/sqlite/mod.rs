//! [`SqliteStore`] and what it needs; its documentation is on the type, where users read it.
//!
//! # Guarantees
//!
//! * **One statement claims**, and a read follows only when the key is held; the key's digest is the
//!   primary key.
//! * **A key's fences never repeat**: a new row's fence is `now_ms << 16`, larger than any the key had
//!   at an earlier millisecond, and every reclaim or take-over adds one (at most 65 535 per
//!   millisecond).
//! * **The caller's clock judges** leases and expiries: one machine owns the file, and tests drive time.
//! * **An acknowledged receipt survives a power loss** (WAL, `synchronous = FULL`), and a failed commit
//!   is reported, never taken for success.
//! * **Several processes may share the file**: a busy timeout, and every operation one atomic
//!   statement (the journal's append one transaction).
//! * **Waiting for a busy key polls** ([`poll_settled`]): SQLite has no notifications across
//!   processes.
//! * **A receipt may commit with the business row**, in the caller's transaction
//!   ([`SqliteStore::complete_in`]).
//!
//! # Layout
//!
//! `schema.sql` (the tables, idempotent), `migrations/` (the columns a later release added to the
//! compensation queue, and the check for each), `statements/` (every statement the store sends, one
//! file each); this file gives them to [`SqlStore`], which does the rest.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::Sqlite;

use super::sql::rows::{driver, fence_of, int};
use super::sql::{Dialect, SqlStore, Statements};
use super::{poll_settled, Claim, Claimed};
use crate::compensation::CompensationEntry;
use crate::context::Context;
use crate::error::StoreError;
use crate::journal::{self, Event, JOURNAL_LIMIT};
use crate::key::Key;
use crate::receipt::{Fence, Receipt, Transition};

/// The schema, idempotent (`schema.sql`): run by [`SqliteStore::open`] and [`SqliteStore::migrate`].
const SCHEMA: &str = include_str!("schema.sql");

/// A [`Store`](crate::Store) in an SQLite file.
///
/// The SQLite store (feature `sqlite`): embedded and durable across restarts, one file, the key's digest
/// as primary key (the unique index). The natural choice for one machine; several processes may share
/// the file (WAL mode, a busy timeout, and every operation one atomic statement).
/// [`SqliteStore::open`] and [`SqliteStore::connect`] make its pool, [`SqliteStore::from_pool`]
/// takes yours; what it shares with [`PgStore`](super::PgStore) is documented on [`SqlStore`].
///
/// A claim is one `INSERT … ON CONFLICT DO UPDATE … WHERE <free> RETURNING` statement: it creates the
/// row, or reuses a released or expired one, or changes nothing and the record is read back. Waiting for
/// a busy key polls (the trait's default), as SQLite has no notifications across processes.
///
/// # Receipts in your own transaction
///
/// [`SqliteStore::complete_in`] writes the call's outcome inside a transaction of yours, so the
/// business row and the receipt commit or roll back together (`docs/rules.md`, *Field lessons*), as
/// [`PgStore::complete_in`](super::PgStore::complete_in) does on PostgreSQL. The runtime's own
/// completion afterwards finds the receipt written and changes nothing.
pub type SqliteStore = SqlStore<Sqlite>;

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path`, in WAL mode with a 5 s busy timeout and
    /// `synchronous = FULL` (a receipt acknowledged survives a power loss), and creates the schema.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::with_options(SqliteConnectOptions::new().filename(path)).await
    }

    /// Opens a database from a URL (`sqlite:PATH` or `sqlite://PATH`), creating it if needed, and creates
    /// the schema.
    pub async fn connect(url: &str) -> Result<SqliteStore, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Unavailable(format!("invalid SQLite URL `{url}`: {e}")))?;
        SqliteStore::with_options(options).await
    }

    /// Opens the database `options` name with the settings [`SqliteStore::open`] describes.
    async fn with_options(options: SqliteConnectOptions) -> Result<SqliteStore, StoreError> {
        let options = options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(driver)?;
        let store = SqliteStore::from_pool(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// The statement a claim sends: it takes the key (a new row, or a released or expired one) and
    /// answers its fence, or changes nothing (the key is held: its row is read next).
    pub const CLAIM_SQL: &'static str = include_str!("statements/claim.sql");

    /// The statement that reads a key's row.
    pub const ROW_SQL: &'static str = <Sqlite as Dialect>::SQL.key_row;

    /// Appends one journal event (`trim_journal.sql` trims the key's journal after).
    const INSERT_JOURNAL_SQL: &'static str = include_str!("statements/insert_journal.sql");

    /// Keeps a key's latest journal events (`$1` key, `$2` how many).
    const TRIM_JOURNAL_SQL: &'static str = include_str!("statements/trim_journal.sql");

    /// Records the running call's success inside the caller's transaction (`&mut *tx`), so that the
    /// business rows written in it and the receipt commit or roll back together. Call it in the body of
    /// an `#[idempotent]` function, with `samekey::current()`, just before committing, and return the
    /// same value from the body. The receipt is dated by the write and lives the
    /// function's `ttl` from it ([`Context::expires_at_ms`]), in the runtime's clock (the clock this
    /// store judges by): a job that ran longer than its `ttl` still writes a live receipt.
    ///
    /// Refused with [`StoreError::Fenced`] when another owner took the key over: then roll back. A call
    /// that runs unprotected ([`Context::is_protected`] is `false`: a missing key part and
    /// `on_missing_key = "run"`) has no receipt: nothing is written, and the answer is
    /// [`Transition::AlreadyApplied`].
    pub async fn complete_in<T: Serialize>(
        conn: &mut SqliteConnection,
        call: &Context,
        value: &T,
    ) -> Result<Transition, StoreError> {
        SqliteStore::complete_call_on(conn, call, value).await
    }

    /// The columns of the compensation queue added since its first release, and how to add each.
    const ADDED_COLUMNS: [(&'static str, &'static str); 4] = [
        ("taker", include_str!("migrations/compensation_taker.sql")),
        (
            "attempts",
            include_str!("migrations/compensation_attempts.sql"),
        ),
        (
            "last_error",
            include_str!("migrations/compensation_last_error.sql"),
        ),
        ("inputs", include_str!("migrations/compensation_inputs.sql")),
    ];

    /// Whether the compensation queue has the column `$1` (1) or not (0).
    const HAS_COLUMN_SQL: &'static str = include_str!("migrations/compensation_has_column.sql");

    /// Creates the tables and indexes if they are missing. Idempotent.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::raw_sql(SCHEMA)
            .execute(self.pool())
            .await
            .map_err(driver)?;
        // A file made by an earlier release: its queue lacks the columns added since.
        for (column, add) in Self::ADDED_COLUMNS {
            let has: i64 = sqlx::query_scalar(Self::HAS_COLUMN_SQL)
                .bind(column)
                .fetch_one(self.pool())
                .await
                .map_err(driver)?;
            if has == 0 {
                match sqlx::query(add).execute(self.pool()).await {
                    // Another process migrating the same file added it first.
                    Err(e) if e.to_string().contains("duplicate column") => {}
                    other => {
                        other.map_err(driver)?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Dialect for Sqlite {
    const STORE: &'static str = "SqliteStore";
    const KIND: &'static str = "sqlite";
    const SQL: Statements = Statements {
        take_over: include_str!("statements/take_over.sql"),
        reopen: include_str!("statements/reopen.sql"),
        extend_lease: include_str!("statements/extend_lease.sql"),
        complete: include_str!("statements/complete.sql"),
        mark_unknown: include_str!("statements/mark_unknown.sql"),
        release: include_str!("statements/release.sql"),
        forget: include_str!("statements/forget.sql"),
        key_row: include_str!("statements/key_row.sql"),
        // One writer at a time: the transaction that writes sees the latest commit.
        refused_row: include_str!("statements/key_row.sql"),
        live_row: include_str!("statements/live_row.sql"),
        by_call_id: include_str!("statements/by_call_id.sql"),
        by_call_ids: include_str!("statements/by_call_ids.sql"),
        holds_tables: include_str!("statements/holds_tables.sql"),
        // The caller's time judges.
        now: None,
        fence_floor: None,
        purge_expired: include_str!("statements/purge_expired.sql"),
        count_expired: include_str!("statements/count_expired.sql"),
        list_receipts: include_str!("statements/list_receipts.sql"),
        list_receipts_of_scope: include_str!("statements/list_receipts_of_scope.sql"),
        orphans: include_str!("statements/orphans.sql"),
        enqueue: include_str!("statements/enqueue.sql"),
        take_due: include_str!("statements/take_due.sql"),
        reschedule: include_str!("statements/reschedule.sql"),
        escalate: include_str!("statements/escalate.sql"),
        finish: include_str!("statements/finish.sql"),
        taker: include_str!("statements/taker.sql"),
        list_compensations: include_str!("statements/list_compensations.sql"),
        journal_by_key: include_str!("statements/journal_by_key.sql"),
        journal_by_call: include_str!("statements/journal_by_call.sql"),
        journaled_keys: include_str!("statements/journaled_keys.sql"),
        purge_journal: include_str!("statements/purge_journal.sql"),
    };

    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }

    async fn take_over(
        store: &SqliteStore,
        sql: &'static str,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        store
            .take_over_returning(sql, key, expected, lease_ms, now_ms)
            .await
    }

    async fn take_due(
        store: &SqliteStore,
        now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        store.take_due_returning(now_ms, limit, lease_ms).await
    }

    async fn claim(store: &SqliteStore, claim: Claim) -> Result<Claimed, StoreError> {
        let now = int(claim.now_ms)?;
        let fence = fresh_fence(claim.now_ms)?;
        // A row that vanishes between the two statements (released, purged) is claimed again.
        for _ in 0..3 {
            // `fetch_all`, not `fetch_optional`: the statement commits when it runs to its end, and only
            // then is a failed commit (a full disk, an I/O error) reported.
            let acquired: Vec<i64> = sqlx::query_scalar(SqliteStore::CLAIM_SQL)
                .bind(claim.key.digest().as_slice())
                .bind(claim.key.scope())
                .bind(claim.call_id.to_string())
                .bind(fence)
                .bind(int(claim.lease_ms)?)
                .bind(claim.fingerprint.as_ref().map(|f| f.0.as_slice()))
                .bind(now)
                .fetch_all(store.pool())
                .await
                .map_err(driver)?;
            if let Some(&fence) = acquired.first() {
                return Ok(Claimed::Acquired(fence_of(fence)?));
            }
            if let Some(existing) = store.row(&claim.key).await? {
                return Ok(Claimed::Existing(existing));
            }
        }
        Err(StoreError::Unavailable(
            "the key's row kept changing during the claim".into(),
        ))
    }

    /// Appends journal rows and trims the key's journal to its latest events, in one transaction.
    async fn append_journal(
        store: &SqliteStore,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut tx = store.pool().begin().await.map_err(driver)?;
        for event in events {
            sqlx::query(SqliteStore::INSERT_JOURNAL_SQL)
                .bind(key.digest().as_slice())
                .bind(event.call_id.to_string())
                .bind(int(event.at_ms)?)
                .bind(int(now_ms)?)
                .bind(int(keep_ms)?)
                .bind(journal::encode(event)?)
                .execute(&mut *tx)
                .await
                .map_err(driver)?;
        }
        sqlx::query(SqliteStore::TRIM_JOURNAL_SQL)
            .bind(key.digest().as_slice())
            .bind(i64::try_from(JOURNAL_LIMIT).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await
            .map_err(driver)?;
        tx.commit().await.map_err(driver)
    }

    async fn wait_settled(
        store: &SqliteStore,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        poll_settled(store, key, timeout, now_ms).await
    }
}

/// The fence of a key's new row: `now_ms << 16`, larger than any fence the key had at an earlier
/// millisecond (at most 65 535 take-overs per millisecond).
fn fresh_fence(now_ms: u64) -> Result<i64, StoreError> {
    now_ms
        .checked_mul(1 << 16)
        .and_then(|f| i64::try_from(f).ok())
        .ok_or_else(|| StoreError::Corrupt(format!("time {now_ms} ms is out of range")))
}

/// `sqlite:PATH` (or `sqlite://PATH`): a file that already holds samekey's tables.
impl super::Backend for SqliteStore {
    const SCHEMES: &'static [&'static str] = &["sqlite://", "sqlite:"];

    async fn open_existing(
        url: &str,
        _options: &super::OpenOptions,
    ) -> Result<std::sync::Arc<dyn super::Store>, super::OpenError> {
        use super::OpenError;
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .unwrap_or(url);
        if !Path::new(path).exists() {
            return Err(OpenError::Missing {
                backend: "SQLite",
                location: path.to_owned(),
            });
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .map_err(|e| OpenError::unreachable(url, e))?;
        let store = SqliteStore::from_pool(pool);
        store.refuse_unmigrated(url).await?;
        store
            .migrate()
            .await
            .map_err(|e| OpenError::unreachable(url, e))?;
        Ok(std::sync::Arc::new(store))
    }
}
