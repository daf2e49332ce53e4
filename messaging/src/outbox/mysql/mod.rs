//! The outbox on MySQL 8 and MariaDB 10.6+: `schema.sql` (the tables, idempotent), and every
//! statement the outbox sends in a file of its own, ready to paste into `mysql`.
//!
//! # Guarantees
//!
//! * **Migrating is safe from every instance at once**: the schema runs under
//!   `GET_LOCK('samekey.outbox.migrate')`; an instance starting on a migrated database takes none.
//! * **Staging under one key is ordered by commit**: a stage holds a row lock on its ordering key's
//!   bucket (`samekey_outbox_lock`, `CRC32(key) % 1000`) until its transaction ends, so a second
//!   transaction staging under that key waits, and takes its id after the first committed. (Keys
//!   that share a bucket wait for each other too, never reorder; two transactions staging under
//!   several keys in different orders may deadlock, and InnoDB rolls one back with error 1213.)
//! * **A key's head is held by one relay**, in its batch's transaction: the heads are found by a
//!   plain read (each key's oldest unsent row), then locked `FOR UPDATE SKIP LOCKED` by primary
//!   key, so a head another relay holds is skipped and its key's later rows are never named; a
//!   relay that dies rolls back, and its heads are taken again. Every write of a relay names its
//!   rows by primary key (`id IN (?, …)`), never by a scan: a scan under `REPEATABLE READ` locks
//!   every row it passes, and two relays marking their rows would wait on each other's heads.
//! * **A duplicate stage leaves the caller's transaction intact** and takes no lock: a plain read
//!   finds the id staged; when two stage one id at once, the unique index answers the second error
//!   1062, which undoes that statement only.
//! * **A relay's batch is a `READ COMMITTED` transaction**, and its writes and the purge name their
//!   rows by primary key: no gap locks, no row locked that it does not change, so relays, stagings
//!   and purges do not deadlock (a batch rolled back after its publishes would publish them again).
//! * **Ids, keys and destinations are bytes**: `VARBINARY(1024)`, compared exactly (two ids that
//!   differ by a trailing space are two messages, as on PostgreSQL), never truncated (a longer one
//!   is refused before anything is written, whatever the server's `sql_mode`).
//! * **The server's clock** dates and delays rows (`UTC_TIMESTAMP(3)`).

use std::io;

use samekey_runtime::sqlx::mysql::{MySqlConnection, MySqlDatabaseError};
use samekey_runtime::sqlx::{self, MySql, Pool, Transaction};

use super::backend::{row_of, Ops, Row};
use super::Backend;
use crate::message::Message;

const SCHEMA: &str = include_str!("schema.sql");
const MIGRATED: &str = include_str!("migrated.sql");
const LOCK_KEY: &str = include_str!("lock_key.sql");
const INSERT: &str = include_str!("insert.sql");
const PENDING_UP_TO: &str = include_str!("pending_up_to.sql");
const PENDING: &str = include_str!("pending.sql");
const OLDEST_AGE: &str = include_str!("oldest_age.sql");
const HEADS: &str = include_str!("heads.sql");
const TAKE: &str = include_str!("take.sql");
const MARK_SENT: &str = include_str!("mark_sent.sql");
const DELETE_SENT: &str = include_str!("delete_sent.sql");
const MARK_FAILED: &str = include_str!("mark_failed.sql");
const PURGEABLE: &str = include_str!("purgeable.sql");
const PURGE: &str = include_str!("purge.sql");
const STAGED: &str = include_str!("staged.sql");

/// How a relay's batch begins: `READ COMMITTED`, for that transaction only. Every statement then
/// sees the latest commit, a locking read locks only the rows it answers (no gap locks), and a
/// relay's writes never wait on rows they do not change: under `REPEATABLE READ` relays and
/// stagings deadlocked, and a batch rolled back after its publishes was published again.
const BEGIN_BATCH: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

/// MySQL's duplicate-key error number (not its SQLSTATE, `23000`, which other integrity errors
/// share): a message with this id is staged.
const DUPLICATE_KEY: u16 = 1062;

/// How many heads a batch reads for each it takes: the heads other relays hold are skipped, and
/// the batch takes the next ones.
const HEADS_PER_TAKE: u32 = 4;

impl Backend for MySql {}

impl Ops for MySql {
    type Taking = Transaction<'static, MySql>;

    /// `VARBINARY(1024)`: indexed, compared byte for byte, never truncated (the stage refuses
    /// longer ones, whatever the server's `sql_mode`).
    const MAX_TEXT: Option<usize> = Some(1024);

    async fn migrate(pool: &Pool<MySql>) -> Result<(), sqlx::Error> {
        let migrated: i64 = sqlx::query_scalar(MIGRATED).fetch_one(pool).await?;
        if migrated == 1 {
            return Ok(());
        }
        let mut conn = pool.acquire().await?;
        let locked: Option<i64> =
            sqlx::query_scalar("SELECT GET_LOCK('samekey.outbox.migrate', 120)")
                .fetch_one(&mut *conn)
                .await?;
        if locked != Some(1) {
            return Err(sqlx::Error::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "another instance has been migrating the outbox for 2 minutes",
            )));
        }
        let migrated = sqlx::raw_sql(SCHEMA).execute(&mut *conn).await.map(drop);
        let unlocked = sqlx::query("SELECT RELEASE_LOCK('samekey.outbox.migrate')")
            .execute(&mut *conn)
            .await
            .map(drop);
        migrated.and(unlocked)
    }

    async fn pending_up_to(conn: &mut MySqlConnection, limit: u64) -> Result<u64, sqlx::Error> {
        let n: i64 = sqlx::query_scalar(PENDING_UP_TO)
            .bind(bigint(limit))
            .fetch_one(&mut *conn)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn insert(
        conn: &mut MySqlConnection,
        ordering_key: &str,
        message: &Message,
        headers: &str,
    ) -> Result<bool, sqlx::Error> {
        let staged: i64 = sqlx::query_scalar(STAGED)
            .bind(&message.id)
            .fetch_one(&mut *conn)
            .await?;
        if staged > 0 {
            return Ok(false);
        }
        sqlx::query(LOCK_KEY)
            .bind(ordering_key)
            .fetch_optional(&mut *conn)
            .await?;
        let inserted = sqlx::query(INSERT)
            .bind(ordering_key)
            .bind(&message.id)
            .bind(&message.destination)
            .bind(headers)
            .bind(&message.body)
            .execute(&mut *conn)
            .await;
        match inserted {
            Ok(done) => Ok(done.rows_affected() == 1),
            Err(sqlx::Error::Database(e))
                if e.try_downcast_ref::<MySqlDatabaseError>()
                    .is_some_and(|e| e.number() == DUPLICATE_KEY) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    async fn pending(pool: &Pool<MySql>) -> Result<u64, sqlx::Error> {
        let n: i64 = sqlx::query_scalar(PENDING).fetch_one(pool).await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn oldest_pending_age_ms(pool: &Pool<MySql>) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(OLDEST_AGE).fetch_optional(pool).await
    }

    async fn take(
        pool: &Pool<MySql>,
        limit: u32,
        _lease_ms: u64,
        destinations: &str,
    ) -> Result<(Self::Taking, Vec<Row>), sqlx::Error> {
        let mut tx = pool.begin_with(BEGIN_BATCH).await?;
        let heads: Vec<i64> = sqlx::query_scalar(HEADS)
            .bind(destinations)
            .bind(destinations)
            .bind(i64::from(limit.saturating_mul(HEADS_PER_TAKE)))
            .fetch_all(&mut *tx)
            .await?;
        if heads.is_empty() {
            return Ok((tx, Vec::new()));
        }
        let take = by_ids(TAKE, heads.len());
        let mut query = sqlx::query(sqlx::AssertSqlSafe(take));
        for id in &heads {
            query = query.bind(id);
        }
        let rows = query.bind(i64::from(limit)).fetch_all(&mut *tx).await?;
        let rows = rows.iter().map(row_of).collect::<Result<Vec<Row>, _>>()?;
        Ok((tx, rows))
    }

    async fn hold(
        _tx: &mut Self::Taking,
        _pool: &Pool<MySql>,
        ids: &[i64],
        _lease_ms: u64,
    ) -> Result<Vec<i64>, sqlx::Error> {
        // Locked until the transaction ends.
        Ok(ids.to_vec())
    }

    async fn mark_sent(
        tx: &mut Self::Taking,
        _pool: &Pool<MySql>,
        ids: &[i64],
        delete: bool,
    ) -> Result<(), sqlx::Error> {
        let statement = by_ids(if delete { DELETE_SENT } else { MARK_SENT }, ids.len());
        let mut query = sqlx::query(sqlx::AssertSqlSafe(statement));
        for id in ids {
            query = query.bind(id);
        }
        query.execute(&mut **tx).await?;
        Ok(())
    }

    async fn mark_failed(
        tx: &mut Self::Taking,
        _pool: &Pool<MySql>,
        id: i64,
        error: &str,
        retry_ms: u64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(MARK_FAILED)
            .bind(id)
            .bind(error)
            .bind(bigint(retry_ms))
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn finish(tx: Self::Taking, _pool: &Pool<MySql>) -> Result<(), sqlx::Error> {
        tx.commit().await
    }

    async fn purge(pool: &Pool<MySql>, keep_ms: u64, limit: u32) -> Result<u64, sqlx::Error> {
        let ids: Vec<i64> = sqlx::query_scalar(PURGEABLE)
            .bind(bigint(keep_ms))
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?;
        if ids.is_empty() {
            return Ok(0);
        }
        let purge = by_ids(PURGE, ids.len());
        let mut query = sqlx::query(sqlx::AssertSqlSafe(purge)).bind(bigint(keep_ms));
        for id in &ids {
            query = query.bind(id);
        }
        Ok(query.execute(pool).await?.rows_affected())
    }
}

/// `statement` with its `?ids` as `n` placeholders (`?, ?, …`): a list of primary keys, each found
/// by its index. One statement per list length, prepared and cached by the connection like the
/// others (a batch has at most `batch_size` rows).
fn by_ids(statement: &str, n: usize) -> String {
    let mut list = "?, ".repeat(n.max(1));
    list.truncate(list.len() - 2);
    statement.replace("?ids", &list)
}

/// A count or a duration in ms as a `BIGINT`, saturating.
fn bigint(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
