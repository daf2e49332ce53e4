//! [`MySqlStore`] and what it needs; its documentation is on the type, where users read it.
//!
//! # Guarantees
//!
//! * **One round trip claims.** A claim inserts the key's row, or takes a released or expired one,
//!   in one `INSERT … ON DUPLICATE KEY UPDATE`, and reads the live row that holds the key in the same
//!   batch; the key's digest is the primary key. The batch's values are literals of hexadecimal and
//!   decimal digits only (`inline.rs`).
//! * **A key's fences never repeat**, not even after its row was purged: a new row takes the fence
//!   floor + 1 (`samekey_fence`), a take-over its fence + 1, and a purge raises the floor to the
//!   fences of the rows it deletes before deleting them.
//! * **The server's clock judges** leases and expiries (`UTC_TIMESTAMP(3)`), never an instance's;
//!   the caller's time each statement takes is ignored.
//! * **No entry is taken by two workers**: due compensation entries are locked with
//!   `FOR UPDATE SKIP LOCKED` and taken in the same transaction, each under a new worker fence.
//! * **A receipt may commit with the business row**, in the caller's transaction
//!   ([`MySqlStore::complete_in`]).
//! * **Migrating is safe to run from every instance at once** (`GET_LOCK`), and idempotent.
//!
//! # Layout
//!
//! `schema.sql` (the tables, idempotent), `statements/` (every statement the store sends, one file
//! each, in the dialect MySQL 8 and MariaDB 10.6+ share); this file gives them to [`SqlStore`],
//! which does the rest.

mod inline;

use std::time::Duration;

use serde::Serialize;
use sqlx::mysql::{MySqlConnection, MySqlPoolOptions};
use sqlx::MySql;

use futures_util::StreamExt as _;
use sqlx::Either;

use self::inline::{inline, Literal};
use super::sql::rows::{compensation, driver, fence_of, int, receipt};
use super::sql::{Dialect, SqlStore, Statements};
use super::{poll_settled, Claim, Claimed};
use crate::compensation::CompensationEntry;
use crate::context::Context;
use crate::error::StoreError;
use crate::journal::{self, Event, JOURNAL_LIMIT};
use crate::key::Key;
use crate::receipt::{Fence, Receipt, Transition};

/// A [`Store`](crate::Store) in a MySQL 8 or MariaDB 10.6+ database.
///
/// The MySQL store (feature `mysql`): one database shared by many instances, the key's digest as
/// primary key (the unique index is the last line of defence), fences that never repeat, compensation
/// entries taken with `FOR UPDATE SKIP LOCKED`. [`MySqlStore::connect`] makes its pool,
/// [`MySqlStore::from_pool`] takes yours (call [`MySqlStore::migrate`] once); what it shares with
/// [`PgStore`](super::PgStore) and [`SqliteStore`](super::SqliteStore) is documented on
/// [`SqlStore`]. Every statement is in the dialect both MySQL 8 and MariaDB 10.6+ read: no
/// `RETURNING` (MySQL lacks it), no sequences or other MariaDB-only syntax.
///
/// # Round trips
///
/// A fresh call costs two round trips (claim, complete) and a replay one, counted on the wire
/// (`tests/mysql_round_trips.rs`). The claim is one text batch of two statements: an `INSERT … ON
/// DUPLICATE KEY UPDATE` whose assignments take the row only when it is free, and whose OK packet
/// answers the new fence (`LAST_INSERT_ID(expr)`), then a read of the key's live row, which answers a
/// replay. MySQL's `INSERT` cannot return rows and its prepared statements run one statement each:
/// the batch is a text query, its values written as hexadecimal and decimal literals only, so that
/// nothing a caller gives is ever read as SQL. Every other statement is prepared (and cached per
/// connection). A take-over is one round trip; taking due compensation entries is a transaction of
/// three statements.
///
/// # Time
///
/// Leases and expiries are judged by the database server's clock (`UTC_TIMESTAMP(3)`, read once per
/// statement), never by an instance's: instances whose clocks disagree by seconds still agree on whose
/// lease is alive and which record expired.
///
/// # Reading the tables
///
/// Every time in the tables is a `DATETIME(3)` in UTC (`created`, `updated`, `lease_until`,
/// `expires_at` of `samekey_receipts`; `next_at`, `lease_until`, `enqueued` of
/// `samekey_compensation`; `at`, `keep_until` of `samekey_journal`). `DATETIME`, not `TIMESTAMP`: a
/// `mysql` client shows a `DATETIME` as it is stored, whatever the session's `time_zone`, so what you
/// read is UTC on every client; a `TIMESTAMP` is shown in the session's zone and ends in January
/// 2038. The [`Store`](crate::Store) still hands times over as Unix ms, to the millisecond. The
/// `UNKNOWN` receipts, oldest first:
///
/// ```sql
/// SELECT scope, state, call_id, created, expires_at FROM samekey_receipts
/// WHERE state = 'UNKNOWN' ORDER BY created;
/// ```
///
/// A receipt's `created_ms` is `TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00',
/// created) DIV 1000`; a column is compared with a time in ms as `created < TIMESTAMP '1970-01-01
/// 00:00:00' + INTERVAL 1796029200123000 MICROSECOND` (converting the time, not the column, keeps the
/// indexes in use). Text columns are `utf8mb4_bin`, which ignores trailing spaces when it compares
/// (a `PAD SPACE` collation): nothing the store looks up depends on it — keys are digests, callIds
/// hold no spaces, and a scope (a `MEDIUMTEXT`: up to 16 MiB) is found by its SHA-256 (`scope_digest`)
/// and compared as bytes.
///
/// # Outcome size
///
/// An outcome is written in one statement, which must fit the server's `max_allowed_packet` (16 MiB
/// by default on MariaDB 10.6+, 64 MiB on MySQL 8). A larger result cannot be recorded: its first
/// caller still gets it (the body ran, once), but the record stays `UNKNOWN` and is queued for
/// compensation, and a duplicate is answered [`Error::Unknown`](crate::Error::Unknown), never run
/// again. Raise `max_allowed_packet`, or return a reference (an id, a URL) rather than the bytes.
///
/// # Waiting for a busy key
///
/// MySQL has no `LISTEN`. A duplicate that waits for a running call polls
/// ([`poll_settled`](crate::store::poll_settled)): a read of the key's row by primary key, at
/// intervals that double from 20 ms to 1 s, each on a pooled connection it gives back between reads,
/// so that a thousand waiters hold no thousand connections. A waiter hears the outcome within the
/// current interval of the owner's commit: about as long again as the wait has lasted, at most 1 s
/// (measured on MariaDB: a completion 150 ms into the wait is heard 155 ms after it,
/// `tests/mysql_durability.rs`). The choice: a blocking primitive (the owner holding `GET_LOCK` on
/// the key, waiters blocking on it) would hold a connection per waiter, the thing to avoid; a
/// shared poller per store (one read for all the keys waited on) would hear sooner at the same cost
/// only where many waiters wait at once, and Redis pub/sub needs a Redis. The polling needs nothing
/// of the server but the reads; a `CachedStore` in front answers the replays that follow from Redis.
///
/// # Receipts in your own transaction
///
/// [`MySqlStore::complete_in`] writes the call's outcome inside a transaction of yours, so the
/// business row and the receipt commit or roll back together (`docs/rules.md`, *Field lessons*). The runtime's own
/// completion afterwards finds the receipt written and changes nothing.
///
/// # What the deployment must guarantee
///
/// * **Durability**: `innodb_flush_log_at_trx_commit = 1` (a committed claim or receipt survives a
///   crash of the server) and, with a binary log, `sync_binlog = 1` (a replica or a recovered primary
///   does not lose a transaction the primary acknowledged). With other values, a claim acknowledged
///   just before a crash may be lost, and the call run twice.
/// * **Isolation**: `REPEATABLE READ` (the default) or `READ COMMITTED`; either works, because every
///   write is one statement on a row found by its primary key, and an InnoDB `UPDATE` or `INSERT … ON
///   DUPLICATE KEY UPDATE` reads the latest committed row (a locking read), whatever the isolation
///   level; the reads that follow a refused write are fresh statements in autocommit. `SERIALIZABLE`
///   works too, with more locking.
/// * **Replication**: every instance reads and writes the primary. A replica lags: a claim read there
///   may miss the row that holds the key. Point the URL at the primary (or a proxy that sends
///   everything to it), never at a read pool.
/// * **Privileges**: the user creates its tables once (`CREATE`, `INDEX`), then needs `SELECT`,
///   `INSERT`, `UPDATE`, `DELETE` on the `samekey_` tables. No stored functions, triggers or
///   procedures are created.
///
/// # TiDB, Vitess, PlanetScale, Aurora
///
/// Aurora MySQL 3 is MySQL 8: the store should run as on MySQL (not tested here). The others have
/// not been tested; what they would need is written down from their documentation, to check before
/// relying on it:
///
/// * **TiDB** speaks this dialect, with differences that matter here. `FOR UPDATE SKIP LOCKED` is not
///   supported (TiDB's issue 18207 is open): the take of due compensation entries would need a
///   `FOR UPDATE` that waits, or `NOWAIT` and a retry. `GET_LOCK` is supported by recent releases
///   (timeouts between 1 s and 1 h; the lock holds across every TiDB server of the cluster; older
///   releases lacked it). `AUTO_INCREMENT` values are allocated in batches per TiDB server, unique
///   but increasing on each server only: the journal's `seq`, which orders a key's events and says
///   which ones its trim keeps, would need an order of its own (the event's time and a tie-break).
///   `JSON_TABLE`, which the callId lookups use, must be checked in the release at hand. Transactions
///   are pessimistic by default since TiDB 3.0, as InnoDB's.
/// * **Vitess / PlanetScale**: single-shard transactions are `REPEATABLE READ`, multi-shard ones
///   `READ COMMITTED` (both do, see above). Every statement of a call names the key's digest, so
///   `samekey_receipts` and `samekey_journal` shard by `key` and `samekey_compensation` by `call_id`;
///   `samekey_fence` and `samekey_schema` are one row each (an unsharded or reference table). What
///   scans (purge, listings, orphans, the take of due entries) scatters across shards, which Vitess
///   runs but does not make atomic; the fence floor's raise and the purge that follows it must then
///   run on every shard in that order. The claim's two-statement batch, `LAST_INSERT_ID(expr)` in the
///   OK packet and `GET_LOCK` go through VTGate's own handling (reserved connections for the lock),
///   to check against its list of unsupported queries.
pub type MySqlStore = SqlStore<MySql>;

/// The schema, idempotent (`schema.sql`): run by [`MySqlStore::migrate`] under `GET_LOCK`.
const SCHEMA: &str = include_str!("schema.sql");

/// How long a pooled connection may have been idle before [`MySqlStore::connect`]'s pool pings it
/// as it is taken out.
const IDLE_BEFORE_PING: Duration = Duration::from_secs(10);

/// How a transaction of the store's own begins where `REPEATABLE READ`'s gap locks would make
/// concurrent writers of one key deadlock: `READ COMMITTED`, for that transaction only.
const READ_COMMITTED: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

/// The MySQL error numbers of a lock conflict that a claim retries: a deadlock (1213) and a lock
/// wait timeout (1205). Concurrent inserts of one new key can deadlock on its unique index. (The
/// number, not `DatabaseError::code`, which is the SQLSTATE: `40001` and `HY000`.)
const RETRIED: [u16; 2] = [1213, 1205];

/// Whether `e` is a lock conflict that a retry of the statement resolves.
fn lock_conflict(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| RETRIED.contains(&e.number())),
        _ => false,
    }
}

impl MySqlStore {
    /// Connects to `url` (`mysql://user:password@host:port/db`) with a pool of up to 16 connections,
    /// and runs the migration. A connection is pinged as it goes back to the pool (sqlx does) and, if
    /// it was idle for 10 s or more, as it is taken out; a connection the server closed meanwhile makes
    /// the statement fail ([`StoreError::Unavailable`]: the call fails closed) and is replaced.
    pub async fn connect(url: &str) -> Result<MySqlStore, StoreError> {
        let pool = MySqlPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(5))
            // sqlx pings a connection as it goes back to the pool; a second ping as it is taken out
            // would be a round trip on every call's path. Only a connection idle for a while (the
            // server may have closed it) is pinged first.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for < IDLE_BEFORE_PING {
                        return Ok(true);
                    }
                    Ok(sqlx::Connection::ping(conn).await.is_ok())
                })
            })
            .connect(url)
            .await
            .map_err(driver)?;
        let store = MySqlStore::from_pool(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// The statement a claim sends, first in its batch: it takes the key (a new row, or a released or
    /// expired one) and answers its fence as the last insert id, or changes nothing (`0`); the batch's
    /// second statement reads the key's live row.
    pub const CLAIM_SQL: &'static str = include_str!("statements/claim.sql");

    /// The statement a claim sends second in its batch (`?` the key, `?` the caller's time, unused):
    /// the key's row, unless it expired.
    pub const LIVE_ROW_SQL: &'static str = <MySql as Dialect>::SQL.live_row;

    const DUE_SQL: &'static str = include_str!("statements/due.sql");
    const ENTRIES_SQL: &'static str = include_str!("statements/entries.sql");
    const INSERT_JOURNAL_SQL: &'static str = include_str!("statements/insert_journal.sql");
    const TRIM_JOURNAL_SQL: &'static str = include_str!("statements/trim_journal.sql");

    /// Creates the tables if they are missing. Idempotent, and safe to run from several instances at
    /// once: `GET_LOCK('samekey.migrate')` serializes them (waiting up to two minutes), and every
    /// statement of the schema is `CREATE TABLE IF NOT EXISTS` or an insert that changes nothing the
    /// second time. The schema's version is kept in `samekey_schema`, for a later release's upgrade.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.pool().acquire().await.map_err(driver)?;
        let locked: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK('samekey.migrate', 120)")
            .fetch_one(&mut *conn)
            .await
            .map_err(driver)?;
        if locked != Some(1) {
            return Err(StoreError::Unavailable(
                "another instance has been migrating the schema for 2 minutes".into(),
            ));
        }
        let migrated = sqlx::raw_sql(SCHEMA)
            .execute(&mut *conn)
            .await
            .map(drop)
            .map_err(driver);
        let unlocked = sqlx::query("SELECT RELEASE_LOCK('samekey.migrate')")
            .execute(&mut *conn)
            .await
            .map(drop)
            .map_err(driver);
        migrated.and(unlocked)
    }

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
        conn: &mut MySqlConnection,
        call: &Context,
        value: &T,
    ) -> Result<Transition, StoreError> {
        MySqlStore::complete_call_on(conn, call, value).await
    }

    /// The due entries locked and taken in one transaction on `tx`: their callIds, as a JSON array.
    async fn take_due_in(
        tx: &mut MySqlConnection,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, TakeError> {
        let due: Vec<String> = sqlx::query_scalar(Self::DUE_SQL)
            .bind(int(lease_ms).map_err(TakeError::Store)?)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await
            .map_err(TakeError::of)?;
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let ids = serde_json::to_string(&due)
            .map_err(|e| TakeError::Store(StoreError::Corrupt(e.to_string())))?;
        let taking = MySql::SQL
            .take_due
            .replace("?ids", &placeholders(due.len()));
        let mut take =
            sqlx::query(sqlx::AssertSqlSafe(taking)).bind(int(lease_ms).map_err(TakeError::Store)?);
        for call_id in &due {
            take = take.bind(call_id.as_str());
        }
        take.execute(&mut *tx).await.map_err(TakeError::of)?;
        let rows = sqlx::query(Self::ENTRIES_SQL)
            .bind(ids.as_str())
            .fetch_all(&mut *tx)
            .await
            .map_err(TakeError::of)?;
        rows.iter()
            .map(compensation)
            .collect::<Result<_, _>>()
            .map_err(TakeError::Store)
    }
}

/// `?, ?, …`, `n` of them (at least one): a list of primary keys for `IN (…)`, each found by its
/// index. One statement per length, prepared and cached by the connection like the others.
fn placeholders(n: usize) -> String {
    let mut list = "?, ".repeat(n.max(1));
    list.truncate(list.len() - 2);
    list
}

/// Why a take of due entries failed: a lock conflict (taken again), or anything else.
enum TakeError {
    Conflict(sqlx::Error),
    Store(StoreError),
}

impl TakeError {
    fn of(e: sqlx::Error) -> TakeError {
        if lock_conflict(&e) {
            TakeError::Conflict(e)
        } else {
            TakeError::Store(driver(e))
        }
    }
}

impl Dialect for MySql {
    const STORE: &'static str = "MySqlStore";
    const KIND: &'static str = "mysql";
    const SQL: Statements = Statements {
        take_over: include_str!("statements/take_over.sql"),
        reopen: include_str!("statements/reopen.sql"),
        extend_lease: include_str!("statements/extend_lease.sql"),
        complete: include_str!("statements/complete.sql"),
        mark_unknown: include_str!("statements/mark_unknown.sql"),
        release: include_str!("statements/release.sql"),
        forget: include_str!("statements/forget.sql"),
        key_row: include_str!("statements/key_row.sql"),
        // key_row.sql as a locking read, which sees the latest commit inside the caller's
        // transaction too (its REPEATABLE READ snapshot may predate the take-over that refused the
        // completion). In a transaction the refused UPDATE already holds the row's lock; in
        // autocommit the read waits at most for a transaction that is writing the row.
        refused_row: concat!(
            include_str!("statements/key_row.sql"),
            "LOCK IN SHARE MODE\n"
        ),
        live_row: include_str!("statements/live_row.sql"),
        by_call_id: include_str!("statements/by_call_id.sql"),
        by_call_ids: include_str!("statements/by_call_ids.sql"),
        holds_tables: include_str!("statements/holds_tables.sql"),
        now: Some(include_str!("statements/now.sql")),
        fence_floor: Some(include_str!("statements/fence_floor.sql")),
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

    /// Rows matched, not only changed: the driver asks the server for found rows (`CLIENT_FOUND_ROWS`),
    /// so that the same write again counts its row, as on the other databases.
    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }

    /// A deadlock (1213) or a lock wait timeout (1205).
    fn lock_conflict(e: &sqlx::Error) -> bool {
        lock_conflict(e)
    }

    /// One round trip: the claim statement and a read of the key's live row, as one text batch
    /// (values as hexadecimal and decimal literals only, see `inline.rs`). The statement's OK packet
    /// says whether it took the key; the row answers when it did not.
    async fn claim(store: &MySqlStore, claim: Claim) -> Result<Claimed, StoreError> {
        let call_id = claim.call_id.to_string();
        let digest = claim.key.digest();
        let taking = inline(
            MySqlStore::CLAIM_SQL,
            &[
                Literal::Bytes(digest.as_slice()),
                Literal::Text(claim.key.scope()),
                Literal::Text(&call_id),
                Literal::Int(int(claim.lease_ms)?),
                claim
                    .fingerprint
                    .as_ref()
                    .map_or(Literal::Null, |f| Literal::Bytes(f.0.as_slice())),
            ],
        )?;
        let reading = inline(
            MySqlStore::LIVE_ROW_SQL,
            &[Literal::Bytes(digest.as_slice()), Literal::Int(0)],
        )?;
        let batch = format!("{taking};\n{reading}");
        // A row that vanishes between the statement and the read (released, purged), or a lock
        // conflict of two first claims of one key, is claimed again.
        for _ in 0..5 {
            let mut answers =
                sqlx::raw_sql(sqlx::AssertSqlSafe(batch.as_str())).fetch_many(store.pool());
            let mut taken = None;
            let mut row = None;
            let mut failed = None;
            while let Some(answer) = answers.next().await {
                match answer {
                    // The claim's OK packet comes first (the read's own comes after its row).
                    Ok(Either::Left(done)) if taken.is_none() => {
                        taken = Some((done.rows_affected(), done.last_insert_id()));
                    }
                    Ok(Either::Left(_)) => {}
                    Ok(Either::Right(r)) => row = Some(r),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            drop(answers);
            match failed {
                Some(e) if lock_conflict(&e) => continue,
                Some(e) => return Err(driver(e)),
                None => {}
            }
            // 1 inserted, 2 taken; 1 also for a held row (found rows), whose last insert id is 0.
            match taken {
                Some((1 | 2, fence)) if fence > 0 => return Ok(Claimed::Acquired(Fence(fence))),
                Some(_) => {}
                None => {
                    return Err(StoreError::Unavailable(
                        "the claim's batch answered no result".into(),
                    ))
                }
            }
            if let Some(existing) = row.as_ref().map(receipt).transpose()?.flatten() {
                return Ok(Claimed::Existing(existing));
            }
        }
        Err(StoreError::Unavailable(
            "the key's row kept changing during the claim".into(),
        ))
    }

    /// One statement; its OK packet answers the new fence (`LAST_INSERT_ID(fence + 1)`).
    async fn take_over(
        store: &MySqlStore,
        sql: &'static str,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        _now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        let done = sqlx::query(sql)
            .bind(int(lease_ms)?)
            .bind(key.digest().as_slice())
            .bind(int(expected.0)?)
            .execute(store.pool())
            .await
            .map_err(driver)?;
        if done.rows_affected() == 1 {
            return Ok(Claimed::Acquired(fence_of(int(done.last_insert_id())?)?));
        }
        match store.row(key).await? {
            Some(record) => Ok(Claimed::Existing(record)),
            None => Err(StoreError::NotFound),
        }
    }

    /// Locks the due entries (`FOR UPDATE SKIP LOCKED`), takes them and reads them, in one
    /// transaction.
    async fn take_due(
        store: &MySqlStore,
        _now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        // A deadlock rolls the transaction back, and nothing was taken: take again.
        let mut conflicts = 0;
        loop {
            let mut tx = store.pool().begin().await.map_err(driver)?;
            match MySqlStore::take_due_in(&mut tx, limit, lease_ms).await {
                Ok(taken) => {
                    tx.commit().await.map_err(driver)?;
                    return Ok(taken);
                }
                Err(TakeError::Conflict(_)) if conflicts < 3 => conflicts += 1,
                Err(TakeError::Conflict(e)) => return Err(driver(e)),
                Err(TakeError::Store(e)) => return Err(e),
            }
        }
    }

    /// Appends journal rows and trims the key's journal to its latest events, in one `READ
    /// COMMITTED` transaction (no gap locks: two appends to one key under `REPEATABLE READ`
    /// deadlocked in the trim, and an event was lost), run again on a lock conflict.
    async fn append_journal(
        store: &MySqlStore,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        let events = &events[events.len().saturating_sub(JOURNAL_LIMIT)..];
        let mut rows = Vec::with_capacity(events.len());
        for event in events {
            rows.push((
                event.call_id.to_string(),
                int(event.at_ms)?,
                journal::encode(event)?,
            ));
        }
        let keep = int(keep_ms)?;
        let mut conflicts = 0;
        loop {
            let appended = async {
                let mut tx = store.pool().begin_with(READ_COMMITTED).await?;
                for (call_id, at_ms, event) in &rows {
                    sqlx::query(MySqlStore::INSERT_JOURNAL_SQL)
                        .bind(key.digest().as_slice())
                        .bind(call_id.as_str())
                        .bind(*at_ms)
                        .bind(keep)
                        .bind(event.as_str())
                        .execute(&mut *tx)
                        .await?;
                }
                sqlx::query(MySqlStore::TRIM_JOURNAL_SQL)
                    .bind(key.digest().as_slice())
                    .bind(key.digest().as_slice())
                    .bind(i64::try_from(JOURNAL_LIMIT).unwrap_or(i64::MAX))
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await
            };
            match appended.await {
                Ok(()) => return Ok(()),
                Err(e) if lock_conflict(&e) && conflicts < 3 => conflicts += 1,
                Err(e) => return Err(driver(e)),
            }
        }
    }

    /// By polling: MySQL has no `LISTEN` (see [`MySqlStore`]'s documentation).
    async fn wait_settled(
        store: &MySqlStore,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        poll_settled(store, key, timeout, now_ms).await
    }
}

/// `mysql://` (or `mariadb://`, the same protocol): a database that already holds samekey's tables.
impl super::Backend for MySqlStore {
    const SCHEMES: &'static [&'static str] = &["mysql://", "mariadb://"];

    async fn open_existing(
        url: &str,
        _options: &super::OpenOptions,
    ) -> Result<std::sync::Arc<dyn super::Store>, super::OpenError> {
        use super::OpenError;
        // sqlx reads `mysql://`; `mariadb://` names the same protocol.
        let mysql_url = match url.strip_prefix("mariadb://") {
            Some(rest) => format!("mysql://{rest}"),
            None => url.to_owned(),
        };
        let pool = MySqlPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&mysql_url)
            .await
            .map_err(|e| OpenError::unreachable(url, e))?;
        let store = MySqlStore::from_pool(pool);
        store.refuse_unmigrated(url).await?;
        store
            .migrate()
            .await
            .map_err(|e| OpenError::unreachable(url, e))?;
        Ok(std::sync::Arc::new(store))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::mysql::MySqlPoolOptions;

    use super::lock_conflict;

    /// A real deadlock and a real lock wait timeout, as the server reports them, are lock conflicts
    /// (the claim and the take of due entries retry them); another error is not. Needs
    /// `SAMEKEY_MYSQL_URL`.
    #[tokio::test]
    async fn a_deadlock_and_a_lock_wait_timeout_are_lock_conflicts() {
        let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
            // Past the harness's capture, as `conformance::skipped` writes.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: set SAMEKEY_MYSQL_URL to run the MySQL tests"
            );
            return;
        };
        let pool = MySqlPoolOptions::new()
            .max_connections(3)
            .connect(&url)
            .await
            .unwrap();
        let table = format!(
            "samekey_test_conflict_{:x}",
            crate::TraceId::new().as_u128() >> 64
        );
        let run = |sql: String| {
            let pool = pool.clone();
            async move { sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&pool).await }
        };
        run(format!(
            "CREATE TABLE {table} (id INT PRIMARY KEY, v INT) ENGINE = InnoDB; \
             INSERT INTO {table} VALUES (1, 0), (2, 0)"
        ))
        .await
        .unwrap();
        let update = |id: u8| format!("UPDATE {table} SET v = v + 1 WHERE id = {id}");

        // Two transactions each holding the row the other one wants next.
        let mut a = pool.begin().await.unwrap();
        let mut b = pool.begin().await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(update(1)))
            .execute(&mut *a)
            .await
            .unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(update(2)))
            .execute(&mut *b)
            .await
            .unwrap();
        let a_waits = sqlx::raw_sql(sqlx::AssertSqlSafe(update(2))).execute(&mut *a);
        let b_closes = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            sqlx::raw_sql(sqlx::AssertSqlSafe(update(1)))
                .execute(&mut *b)
                .await
        };
        let (first, second) = tokio::join!(a_waits, b_closes);
        let deadlock = first.err().or(second.err()).expect("one of them deadlocks");
        assert!(lock_conflict(&deadlock), "{deadlock:?}");
        drop((a, b));

        // A lock held past the waiter's innodb_lock_wait_timeout.
        let mut holder = pool.begin().await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(update(1)))
            .execute(&mut *holder)
            .await
            .unwrap();
        let mut waiter = pool.acquire().await.unwrap();
        let timed_out = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SET SESSION innodb_lock_wait_timeout = 1; {}",
            update(1)
        )))
        .execute(&mut *waiter)
        .await
        .expect_err("the lock is held");
        assert!(lock_conflict(&timed_out), "{timed_out:?}");
        drop((holder, waiter));

        let other = run(format!("INSERT INTO {table} VALUES (1, 0)"))
            .await
            .expect_err("a duplicate key");
        assert!(!lock_conflict(&other), "{other:?}");
        run(format!("DROP TABLE {table}")).await.unwrap();
    }
}
