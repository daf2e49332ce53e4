//! [`PgStore`] and what it needs; its documentation is on the type, where users read it.
//!
//! # Guarantees
//!
//! * **One statement claims.** A claim inserts the key's row, or reuses a released or expired one,
//!   or answers the live row that holds the key, in one statement; the key's digest is the primary key.
//! * **Fences come from one sequence** (`samekey_fence`): a key's fences never repeat, not even after
//!   its row was purged.
//! * **The server's clock judges** leases and expiries (`samekey_now`), never an instance's; the
//!   caller's time each statement takes is ignored.
//! * **No entry is taken by two workers**: due compensation entries are taken with
//!   `FOR UPDATE SKIP LOCKED`, each under a new worker fence.
//! * **A waiter hears the change it waits for** when it commits (`LISTEN`, and a trigger's
//!   `pg_notify` on a waited-for row), with no polling.
//! * **A receipt may commit with the business row**, in the caller's transaction
//!   ([`PgStore::complete_in`]).
//! * **Migrating is safe to run from every instance at once** (an advisory lock), does not stop
//!   writes while a later index builds (`CONCURRENTLY`), and keeps every value of an earlier release
//!   (see `migrate.rs`).
//!
//! # Layout
//!
//! `schema.sql` (the tables, functions and trigger, idempotent), `migrations/` (the indexes a later
//! release added, and the check that nothing is left to do), `statements/` (every statement the
//! store sends, one file each); this file gives them to [`SqlStore`], which does the rest.

mod migrate;

use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::{PgConnection, PgListener, PgPoolOptions};
use sqlx::Postgres;

use super::sql::rows::{driver, int, receipt};
use super::sql::{Dialect, SqlStore, Statements};
use super::{Claim, Claimed};
use crate::compensation::CompensationEntry;
use crate::context::Context;
use crate::error::StoreError;
use crate::journal::{self, Event, JOURNAL_LIMIT};
use crate::key::Key;
use crate::receipt::{Fence, Receipt, ReceiptState, Transition};
use crate::store::Store as _;

/// A [`Store`](crate::Store) in a PostgreSQL database.
///
/// The PostgreSQL store (feature `postgres`): one database shared by many instances, the key's digest as
/// primary key (the unique index is the last line of defence), fences from a sequence, compensation
/// entries taken with `FOR UPDATE SKIP LOCKED`. [`PgStore::connect`] makes its pool,
/// [`PgStore::from_pool`] takes yours; what it shares with [`SqliteStore`](super::SqliteStore) is
/// documented on [`SqlStore`].
///
/// # Round trips
///
/// A fresh call costs two statements (claim, complete) and a replay one: the claim is a single statement
/// that inserts the row (or reuses a released or expired one) and, when the key is held, returns the
/// existing record in the same answer.
///
/// # Time
///
/// Leases and expiries are judged by the database server's clock (`statement_timestamp()`, through the
/// `samekey_now` function of the schema), never by an instance's: instances whose clocks disagree by
/// seconds still agree on whose lease is alive and which record expired.
///
/// # Reading the tables
///
/// Every time in the tables is a `timestamptz` (`created`, `updated`, `lease_until`, `expires_at` of
/// `samekey_receipts`; `next_at`, `lease_until`, `enqueued` of `samekey_compensation`; `at`,
/// `keep_until` of `samekey_journal`), so `psql` shows dates in the session's time zone; the
/// [`Store`](crate::Store) still hands them over as Unix ms, to the millisecond. The scope is a column of
/// its own beside the key's digest. The `UNKNOWN` receipts, oldest first:
///
/// ```sql
/// SELECT scope, state, call_id, created, expires_at FROM samekey_receipts
/// WHERE state = 'UNKNOWN' ORDER BY created;
/// ```
///
/// Two functions of the schema convert between the columns and the Unix ms the [`Store`](crate::Store)
/// API uses: `samekey_ms(created)` is a receipt's `created_ms`, and `created < samekey_ts(1796029200123)`
/// compares a column with a time in ms (converting the time, not the column, keeps the indexes in use).
///
/// A database of an earlier release, whose times were `BIGINT` Unix ms, is converted by
/// [`PgStore::migrate`] (each table rewritten once, under a lock that holds its writers meanwhile; every
/// value kept). Instances of that release cannot use the converted tables: upgrade them all together.
///
/// # Waiting for a busy key
///
/// A duplicate that waits for a running call listens (`LISTEN`, on a pooled connection it holds while
/// it waits) on its key's channel and marks the record waited-for; the record's next change notifies
/// it (`pg_notify`, from a trigger, when the change commits), so the waiter hears the outcome a few
/// round trips after the owner's commit (the notification, then a read of the record on the listening
/// connection), with no polling.
///
/// # Receipts in your own transaction
///
/// [`PgStore::complete_in`] writes the call's outcome inside a transaction of yours, so the business row
/// and the receipt commit or roll back together (`docs/rules.md`, *Field lessons*). The runtime's own completion afterwards
/// finds the receipt written and changes nothing.
pub type PgStore = SqlStore<Postgres>;

impl PgStore {
    /// Connects to `url` (`postgres://user@host:port/db`) with a pool of up to 16 connections, and runs
    /// the migration.
    pub async fn connect(url: &str) -> Result<PgStore, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(driver)?;
        let store = PgStore::from_pool(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// The statement a claim sends: it takes the key (a new row, or a released or expired one), or
    /// returns the record that holds it, in one round trip.
    pub const CLAIM_SQL: &'static str = include_str!("statements/claim.sql");

    /// Marks the key's record waited-for and reads it (`$1` key, `$2` now).
    const MARK_WAITED_SQL: &'static str = include_str!("statements/mark_waited.sql");

    /// Appends a key's journal events and trims its journal, in one statement.
    const APPEND_JOURNAL_SQL: &'static str = include_str!("statements/append_journal.sql");

    /// Records the running call's success inside the caller's transaction (`&mut *tx`), so that the
    /// business rows written in it and the receipt commit or roll back together. Call it in the body of
    /// an `#[idempotent]` function, with `samekey::current()`, just before committing, and return the
    /// same value from the body.
    ///
    /// Refused with [`StoreError::Fenced`] when another owner took the key over: then roll back. A call
    /// that runs unprotected ([`Context::is_protected`] is `false`: a missing key part and
    /// `on_missing_key = "run"`) has no receipt: nothing is written, and the answer is
    /// [`Transition::AlreadyApplied`].
    pub async fn complete_in<T: Serialize>(
        conn: &mut PgConnection,
        call: &Context,
        value: &T,
    ) -> Result<Transition, StoreError> {
        PgStore::complete_call_on(conn, call, value).await
    }
}

impl Dialect for Postgres {
    const STORE: &'static str = "PgStore";
    const KIND: &'static str = "postgres";
    const SQL: Statements = Statements {
        take_over: include_str!("statements/take_over.sql"),
        reopen: include_str!("statements/reopen.sql"),
        extend_lease: include_str!("statements/extend_lease.sql"),
        complete: include_str!("statements/complete.sql"),
        mark_unknown: include_str!("statements/mark_unknown.sql"),
        release: include_str!("statements/release.sql"),
        forget: include_str!("statements/forget.sql"),
        key_row: include_str!("statements/key_row.sql"),
        // READ COMMITTED: every statement sees the latest commit.
        refused_row: include_str!("statements/key_row.sql"),
        live_row: include_str!("statements/live_row.sql"),
        by_call_id: include_str!("statements/by_call_id.sql"),
        by_call_ids: include_str!("statements/by_call_ids.sql"),
        holds_tables: include_str!("statements/holds_tables.sql"),
        now: Some(include_str!("statements/now.sql")),
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
        store: &PgStore,
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
        store: &PgStore,
        now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        store.take_due_returning(now_ms, limit, lease_ms).await
    }

    async fn claim(store: &PgStore, claim: Claim) -> Result<Claimed, StoreError> {
        let now = int(claim.now_ms)?;
        // One statement: take the key, or read the record that holds it. A row committed by another
        // instance after this statement's snapshot can make both halves empty: then ask again.
        for _ in 0..3 {
            let row = sqlx::query(PgStore::CLAIM_SQL)
                .bind(claim.key.digest().as_slice())
                .bind(claim.key.scope())
                .bind(claim.call_id.to_string())
                .bind(int(claim.lease_ms)?)
                .bind(claim.fingerprint.as_ref().map(|f| f.0.as_slice()))
                .bind(now)
                .fetch_optional(store.pool())
                .await
                .map_err(driver)?;
            let Some(row) = row else { continue };
            let acquired: bool = sqlx::Row::try_get(&row, "acquired").map_err(driver)?;
            let record = receipt(&row)?;
            match (acquired, record) {
                (true, Some(record)) => return Ok(Claimed::Acquired(record.fence)),
                // The statement's second half reads only rows alive by the server's clock.
                (false, Some(record)) => return Ok(Claimed::Existing(record)),
                // A released tombstone read in the race above: claim again.
                (_, None) => continue,
            }
        }
        Err(StoreError::Unavailable(
            "the key's row kept changing during the claim".into(),
        ))
    }

    /// Appends journal rows and trims the key's journal to its latest events, in one statement (the
    /// trim reads the rows as they were before the insert, so it keeps room for the new ones).
    async fn append_journal(
        store: &PgStore,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let events = &events[events.len().saturating_sub(JOURNAL_LIMIT)..];
        let mut call_ids = Vec::with_capacity(events.len());
        let mut times = Vec::with_capacity(events.len());
        let mut bodies = Vec::with_capacity(events.len());
        for event in events {
            call_ids.push(event.call_id.to_string());
            times.push(int(event.at_ms)?);
            bodies.push(journal::encode(event)?);
        }
        let room = JOURNAL_LIMIT - events.len();
        sqlx::query(PgStore::APPEND_JOURNAL_SQL)
            .bind(key.digest().as_slice())
            .bind(call_ids)
            .bind(times)
            .bind(bodies)
            .bind(int(now_ms)?)
            .bind(int(keep_ms)?)
            .bind(i64::try_from(room).unwrap_or(i64::MAX))
            .execute(store.pool())
            .await
            .map_err(driver)?;
        Ok(())
    }

    /// By `LISTEN`: subscribe first, then mark the record and look at it, so that no change falls
    /// between the look and the subscription.
    async fn wait_settled(
        store: &PgStore,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        let mut listener = PgListener::connect_with(store.pool())
            .await
            .map_err(driver)?;
        let channel = format!("samekey_{}", &key.to_hex()[..32]);
        listener.listen(&channel).await.map_err(driver)?;
        let row = sqlx::query(PgStore::MARK_WAITED_SQL)
            .bind(key.digest().as_slice())
            .bind(int(now_ms)?)
            .fetch_optional(store.pool())
            .await
            .map_err(driver)?;
        let record = match row {
            Some(row) => receipt(&row)?,
            None => None,
        };
        match &record {
            Some(r) if r.state == ReceiptState::Processing => {}
            _ => return Ok(record),
        }
        // A notification, a lost listening connection or the end of the wait: look again either way,
        // on the listening connection (no pool acquire between the notification and the answer).
        let _ = tokio::time::timeout(timeout, listener.recv()).await;
        let row = sqlx::query(Self::SQL.live_row)
            .bind(key.digest().as_slice())
            .bind(int(now_ms)?)
            .fetch_optional(&mut listener)
            .await;
        match row {
            Ok(Some(row)) => receipt(&row),
            Ok(None) => Ok(None),
            // The listening connection was lost: ask through the pool.
            Err(_) => store.get(key, now_ms).await,
        }
    }
}

/// `postgres://` (or `postgresql://`): a database that already holds samekey's tables.
impl super::Backend for PgStore {
    const SCHEMES: &'static [&'static str] = &["postgres://", "postgresql://"];

    async fn open_existing(
        url: &str,
        _options: &super::OpenOptions,
    ) -> Result<std::sync::Arc<dyn super::Store>, super::OpenError> {
        use super::OpenError;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(|e| OpenError::unreachable(url, e))?;
        let store = PgStore::from_pool(pool);
        store.refuse_unmigrated(url).await?;
        store
            .migrate()
            .await
            .map_err(|e| OpenError::unreachable(url, e))?;
        Ok(std::sync::Arc::new(store))
    }
}
