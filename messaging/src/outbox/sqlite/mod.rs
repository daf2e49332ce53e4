//! The outbox on SQLite: `schema.sql` (the table, idempotent), and every statement the outbox sends
//! in a file of its own, ready to paste into `sqlite3`.
//!
//! # Guarantees
//!
//! * **One writer at a time** (SQLite's own lock): ids are given in the order stagings commit.
//! * **A key's head is held by one batch**, under a lease judged by the database's clock and taken in
//!   one `UPDATE … RETURNING`; every mark names the batch's token, so a batch whose lease ended and
//!   whose head another took changes nothing.
//! * **No write lock is held while publishing**: the take, each mark and the release are statements
//!   of their own, so stagings go on during a batch.

use samekey_runtime::sqlx::sqlite::SqliteConnection;
use samekey_runtime::sqlx::{self, Pool, Sqlite};
use samekey_runtime::TraceId;

use super::backend::{row_of, Ops, Row};
use super::Backend;
use crate::message::Message;

const SCHEMA: &str = include_str!("schema.sql");
const INSERT: &str = include_str!("insert.sql");
const PENDING_UP_TO: &str = include_str!("pending_up_to.sql");
const PENDING: &str = include_str!("pending.sql");
const OLDEST_AGE: &str = include_str!("oldest_age.sql");
const TAKE: &str = include_str!("take.sql");
const MARK_SENT: &str = include_str!("mark_sent.sql");
const DELETE_SENT: &str = include_str!("delete_sent.sql");
const MARK_FAILED: &str = include_str!("mark_failed.sql");
const RELEASE: &str = include_str!("release.sql");
const RENEW: &str = include_str!("renew.sql");
const PURGE: &str = include_str!("purge.sql");

/// A batch on SQLite: its token, and the rows it took and has not marked.
#[derive(Debug)]
pub struct Taking {
    taker: i64,
    unmarked: Vec<i64>,
}

impl Taking {
    fn marked(&mut self, id: i64) {
        self.unmarked.retain(|&taken| taken != id);
    }
}

impl Backend for Sqlite {}

impl Ops for Sqlite {
    type Taking = Taking;

    async fn migrate(pool: &Pool<Sqlite>) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(SCHEMA).execute(pool).await?;
        Ok(())
    }

    async fn pending_up_to(conn: &mut SqliteConnection, limit: u64) -> Result<u64, sqlx::Error> {
        let n: i64 = sqlx::query_scalar(PENDING_UP_TO)
            .bind(bigint(limit))
            .fetch_one(&mut *conn)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn insert(
        conn: &mut SqliteConnection,
        ordering_key: &str,
        message: &Message,
        headers: &str,
    ) -> Result<bool, sqlx::Error> {
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

    async fn pending(pool: &Pool<Sqlite>) -> Result<u64, sqlx::Error> {
        let n: i64 = sqlx::query_scalar(PENDING).fetch_one(pool).await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn oldest_pending_age_ms(pool: &Pool<Sqlite>) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(OLDEST_AGE).fetch_optional(pool).await
    }

    async fn take(
        pool: &Pool<Sqlite>,
        limit: u32,
        lease_ms: u64,
        destinations: &str,
    ) -> Result<(Taking, Vec<Row>), sqlx::Error> {
        // A token of the batch's own: random bits, positive.
        let taker = (TraceId::new().as_u128() as i64) & i64::MAX;
        // `fetch_all`: the statement commits when it runs to its end, and only then is a failed
        // commit reported.
        let rows = sqlx::query(TAKE)
            .bind(i64::from(limit))
            .bind(bigint(lease_ms))
            .bind(taker)
            .bind(destinations)
            .fetch_all(pool)
            .await?;
        let rows = rows.iter().map(row_of).collect::<Result<Vec<Row>, _>>()?;
        let taking = Taking {
            taker,
            unmarked: rows.iter().map(|row| row.id).collect(),
        };
        Ok((taking, rows))
    }

    async fn hold(
        taking: &mut Taking,
        pool: &Pool<Sqlite>,
        ids: &[i64],
        lease_ms: u64,
    ) -> Result<Vec<i64>, sqlx::Error> {
        let list = serde_json::to_string(ids).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
        let held: Vec<i64> = sqlx::query_scalar(RENEW)
            .bind(taking.taker)
            .bind(list)
            .bind(bigint(lease_ms))
            .fetch_all(pool)
            .await?;
        // Those another batch took are no longer this one's to give back.
        taking
            .unmarked
            .retain(|id| !ids.contains(id) || held.contains(id));
        Ok(held)
    }

    async fn mark_sent(
        taking: &mut Taking,
        pool: &Pool<Sqlite>,
        ids: &[i64],
        delete: bool,
    ) -> Result<(), sqlx::Error> {
        let statement = if delete { DELETE_SENT } else { MARK_SENT };
        let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".to_owned());
        let done = sqlx::query(statement)
            .bind(list)
            .bind(taking.taker)
            .execute(pool)
            .await?;
        if done.rows_affected() < ids.len() as u64 {
            tracing::warn!(target: "samekey", marked = done.rows_affected(), sent = ids.len(),
                "samekey: outbox rows' lease ended before they were marked sent; another relay publishes them again, under the same ids");
        }
        for &id in ids {
            taking.marked(id);
        }
        Ok(())
    }

    async fn mark_failed(
        taking: &mut Taking,
        pool: &Pool<Sqlite>,
        id: i64,
        error: &str,
        retry_ms: u64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(MARK_FAILED)
            .bind(id)
            .bind(error)
            .bind(bigint(retry_ms))
            .bind(taking.taker)
            .execute(pool)
            .await?;
        taking.marked(id);
        Ok(())
    }

    async fn finish(taking: Taking, pool: &Pool<Sqlite>) -> Result<(), sqlx::Error> {
        if taking.unmarked.is_empty() {
            return Ok(());
        }
        let ids = serde_json::to_string(&taking.unmarked)
            .map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
        sqlx::query(RELEASE)
            .bind(taking.taker)
            .bind(ids)
            .execute(pool)
            .await?;
        Ok(())
    }

    async fn purge(pool: &Pool<Sqlite>, keep_ms: u64, limit: u32) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(PURGE)
            .bind(bigint(keep_ms))
            .bind(i64::from(limit))
            .execute(pool)
            .await?;
        Ok(done.rows_affected())
    }
}

/// A count or a duration in ms as an `INTEGER`, saturating.
fn bigint(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
