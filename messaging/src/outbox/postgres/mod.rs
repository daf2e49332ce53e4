//! The outbox on PostgreSQL: `schema.sql` (the table, idempotent), and every statement the outbox
//! sends in a file of its own, ready to paste into `psql`.
//!
//! # Guarantees
//!
//! * **Migrating is safe from every instance at once**: the schema runs under a transaction-scoped
//!   advisory lock; an instance starting on a migrated database takes none.
//! * **Staging under one key is ordered by commit**: a stage holds its ordering key
//!   (`pg_advisory_xact_lock`) until its transaction ends.
//! * **A key's head is held by one relay**, in its batch's transaction (`FOR UPDATE SKIP LOCKED`):
//!   another relay skips the key; a relay that dies rolls back, and its heads are taken again.
//! * **The server's clock** dates and delays rows (`statement_timestamp()`).

use samekey_runtime::sqlx::postgres::PgConnection;
use samekey_runtime::sqlx::{self, Pool, Postgres, Transaction};

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
const TAKE: &str = include_str!("take.sql");
const MARK_SENT: &str = include_str!("mark_sent.sql");
const DELETE_SENT: &str = include_str!("delete_sent.sql");
const MARK_FAILED: &str = include_str!("mark_failed.sql");
const PURGE: &str = include_str!("purge.sql");

impl Backend for Postgres {}

impl Ops for Postgres {
    type Taking = Transaction<'static, Postgres>;

    async fn migrate(pool: &Pool<Postgres>) -> Result<(), sqlx::Error> {
        let migrated: bool = sqlx::query_scalar(MIGRATED).fetch_one(pool).await?;
        if migrated {
            return Ok(());
        }
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('samekey.outbox.migrate'))")
            .execute(&mut *tx)
            .await?;
        sqlx::raw_sql(SCHEMA).execute(&mut *tx).await?;
        tx.commit().await
    }

    async fn pending_up_to(conn: &mut PgConnection, limit: u64) -> Result<u64, sqlx::Error> {
        let n: i64 = sqlx::query_scalar(PENDING_UP_TO)
            .bind(bigint(limit))
            .fetch_one(&mut *conn)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn insert(
        conn: &mut PgConnection,
        ordering_key: &str,
        message: &Message,
        headers: &str,
    ) -> Result<bool, sqlx::Error> {
        sqlx::query(LOCK_KEY)
            .bind(ordering_key)
            .execute(&mut *conn)
            .await?;
        let done = sqlx::query(INSERT)
            .bind(ordering_key)
            .bind(&message.id)
            .bind(&message.destination)
            .bind(headers)
            .bind(&message.body)
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn pending(pool: &Pool<Postgres>) -> Result<u64, sqlx::Error> {
        let n: i64 = sqlx::query_scalar(PENDING).fetch_one(pool).await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn oldest_pending_age_ms(pool: &Pool<Postgres>) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(OLDEST_AGE).fetch_optional(pool).await
    }

    async fn take(
        pool: &Pool<Postgres>,
        limit: u32,
        _lease_ms: u64,
        destinations: &str,
    ) -> Result<(Self::Taking, Vec<Row>), sqlx::Error> {
        let mut tx = pool.begin().await?;
        let rows = sqlx::query(TAKE)
            .bind(i64::from(limit))
            .bind(destinations)
            .fetch_all(&mut *tx)
            .await?;
        let rows = rows.iter().map(row_of).collect::<Result<Vec<Row>, _>>()?;
        Ok((tx, rows))
    }

    async fn hold(
        _tx: &mut Self::Taking,
        _pool: &Pool<Postgres>,
        ids: &[i64],
        _lease_ms: u64,
    ) -> Result<Vec<i64>, sqlx::Error> {
        // Locked until the transaction ends.
        Ok(ids.to_vec())
    }

    async fn mark_sent(
        tx: &mut Self::Taking,
        _pool: &Pool<Postgres>,
        ids: &[i64],
        delete: bool,
    ) -> Result<(), sqlx::Error> {
        let statement = if delete { DELETE_SENT } else { MARK_SENT };
        sqlx::query(statement).bind(ids).execute(&mut **tx).await?;
        Ok(())
    }

    async fn mark_failed(
        tx: &mut Self::Taking,
        _pool: &Pool<Postgres>,
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

    async fn finish(tx: Self::Taking, _pool: &Pool<Postgres>) -> Result<(), sqlx::Error> {
        tx.commit().await
    }

    async fn purge(pool: &Pool<Postgres>, keep_ms: u64, limit: u32) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(PURGE)
            .bind(bigint(keep_ms))
            .bind(i64::from(limit))
            .execute(pool)
            .await?;
        Ok(done.rows_affected())
    }
}

/// A count or a duration in ms as a `BIGINT`, saturating.
fn bigint(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
