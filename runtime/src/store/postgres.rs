//! [`PgStore`] and what it needs; its documentation is on the type, where users read it.

use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions};

use super::sql::{self, driver, int};
use super::{Claim, Claimed, Completion};
use crate::context::Context;
use crate::error::StoreError;
use crate::journal::{self, Event, JOURNAL_LIMIT};
use crate::key::Key;
use crate::receipt::{Receipt, ReceiptState, Transition};
use crate::store::Store as _;

/// The time columns of the three tables, as the rows of a `VALUES` list (table, column): every one is
/// a `timestamptz`. The schema converts those an earlier release made `BIGINT` (Unix ms), and
/// [`PgStore::migrate`] looks for any left.
macro_rules! time_columns {
    () => {
        "('samekey_receipts', 'lease_until'), ('samekey_receipts', 'expires_at'),
        ('samekey_receipts', 'created'), ('samekey_receipts', 'updated'),
        ('samekey_compensation', 'next_at'), ('samekey_compensation', 'lease_until'),
        ('samekey_compensation', 'enqueued'),
        ('samekey_journal', 'at'), ('samekey_journal', 'keep_until')"
    };
}

/// The schema, idempotent: run by [`PgStore::migrate`] under an advisory lock, so that instances starting
/// together do not race. It also brings the tables of an earlier release, whose times were `BIGINT`
/// Unix ms, to `timestamptz` (each column rewritten once, every value kept to the millisecond).
pub const SCHEMA: &str = concat!(
    "
CREATE SEQUENCE IF NOT EXISTS samekey_fence;
-- The time every instance's leases and expiries are judged by: the server's clock, never a caller's
-- (nodes disagree about time), read once per statement (a lease and the time it was granted agree),
-- in Unix ms. The caller's time is taken, and ignored, so that the statements are the same as on
-- SQLite, where the caller's time is the judge.
CREATE OR REPLACE FUNCTION samekey_now(caller BIGINT) RETURNS BIGINT
    LANGUAGE sql STABLE AS 'SELECT (extract(epoch FROM statement_timestamp()) * 1000)::BIGINT';
-- Times are stored as timestamptz, and handed to samekey as Unix ms: samekey_ts turns a time in ms
-- into one to store or to compare a column with, samekey_ms reads a column back as ms. A stored time is
-- a whole millisecond, which a timestamptz (microseconds) holds exactly: what goes in as ms comes back
-- the same. Both are immutable (the session's TimeZone changes nothing), so the planner inlines them
-- and an index on a column serves a comparison with a converted parameter.
CREATE OR REPLACE FUNCTION samekey_ts(ms BIGINT) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$SELECT (TIMESTAMP 'epoch' + ms * INTERVAL '1 millisecond') AT TIME ZONE 'UTC'$$;
CREATE OR REPLACE FUNCTION samekey_ms(t timestamptz) RETURNS BIGINT
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$SELECT (extract(epoch FROM t - TIMESTAMPTZ 'epoch') * 1000)::BIGINT$$;
-- One row per key: the receipt of its call.
CREATE TABLE IF NOT EXISTS samekey_receipts (
    key         BYTEA PRIMARY KEY,          -- SHA-256 of scope and key parts: the unique index
    scope       TEXT NOT NULL,              -- the function's scope, as its key was built in
    call_id     TEXT NOT NULL,              -- the call that holds (or held) the key
    state       TEXT NOT NULL,              -- RECEIVED PROCESSING UNKNOWN SUCCESS FAILED, or RELEASED
    fence       BIGINT NOT NULL,            -- the holder's fence: every claim or take-over raises it
    lease_until TIMESTAMPTZ,                -- PROCESSING: the holder's lease ends then (server clock)
    expires_at  TIMESTAMPTZ,                -- may be purged after then; NULL: kept (claims, UNKNOWN)
    fingerprint BYTEA,                      -- SHA-256 of the verify parts of the first call
    outcome     BYTEA,                      -- the encoded result (SUCCESS) or error (FAILED)
    created     TIMESTAMPTZ NOT NULL,       -- when the key was claimed (server clock)
    updated     TIMESTAMPTZ NOT NULL,       -- the record's latest change (server clock)
    waited      BOOLEAN NOT NULL DEFAULT false  -- a duplicate listens for the record's next change
);
ALTER TABLE samekey_receipts ADD COLUMN IF NOT EXISTS waited BOOLEAN NOT NULL DEFAULT false;
-- A waited-for record's change (an outcome, UNKNOWN, a release, a take-over) notifies its waiters, on
-- the channel samekey_ + the first 32 hex digits of its key, when the change commits. Records nobody
-- waits for notify nobody: the trigger's condition is all they cost.
CREATE OR REPLACE FUNCTION samekey_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('samekey_' || substr(encode(NEW.key, 'hex'), 1, 32), NEW.state);
    RETURN NULL;
END $$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'samekey_settled'
            AND tgrelid = to_regclass('samekey_receipts')) THEN
        CREATE TRIGGER samekey_settled AFTER UPDATE ON samekey_receipts FOR EACH ROW
            WHEN (OLD.waited AND (OLD.state IS DISTINCT FROM NEW.state OR OLD.fence <> NEW.fence))
            EXECUTE FUNCTION samekey_settled();
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS samekey_receipts_call_id ON samekey_receipts (call_id);
CREATE INDEX IF NOT EXISTS samekey_receipts_expires_at ON samekey_receipts (expires_at)
    WHERE expires_at IS NOT NULL;
-- One row per queued call: the compensation queue.
CREATE TABLE IF NOT EXISTS samekey_compensation (
    call_id     TEXT PRIMARY KEY,
    key         BYTEA NOT NULL,             -- the call's key (samekey_receipts.key)
    scope       TEXT NOT NULL,
    reason      TEXT NOT NULL,              -- why it was queued, for people
    round       BIGINT NOT NULL,            -- rounds done so far
    next_at     TIMESTAMPTZ NOT NULL,       -- the next round is due then
    state       TEXT NOT NULL,              -- PENDING TAKEN MANUAL
    lease_until TIMESTAMPTZ,                -- TAKEN: the worker's lease ends then (server clock)
    enqueued    TIMESTAMPTZ NOT NULL,       -- when it was queued (the queuing node's clock)
    taker       BIGINT NOT NULL DEFAULT 0,  -- the worker fence of the latest take
    attempts    BIGINT NOT NULL DEFAULT 0,  -- attempts the call made before it was queued
    last_error  TEXT,                       -- how its last attempt ended: timed_out, unknown, …
    inputs      BYTEA                       -- its inputs (JSON), when its function keeps them
);
ALTER TABLE samekey_compensation ADD COLUMN IF NOT EXISTS taker BIGINT NOT NULL DEFAULT 0;
ALTER TABLE samekey_compensation ADD COLUMN IF NOT EXISTS attempts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE samekey_compensation ADD COLUMN IF NOT EXISTS last_error TEXT;
ALTER TABLE samekey_compensation ADD COLUMN IF NOT EXISTS inputs BYTEA;
CREATE INDEX IF NOT EXISTS samekey_compensation_due ON samekey_compensation (next_at)
    WHERE state <> 'MANUAL';
-- The calls' events, a few dozen per key at most.
CREATE TABLE IF NOT EXISTS samekey_journal (
    seq         BIGSERIAL PRIMARY KEY,
    key         BYTEA NOT NULL,             -- the key's digest (samekey_receipts.key)
    call_id     TEXT NOT NULL,
    at          TIMESTAMPTZ NOT NULL,       -- when it happened, by the writing node's clock
    keep_until  TIMESTAMPTZ NOT NULL,       -- kept until then at least, and while the key's record lives
    event       JSONB NOT NULL              -- call_id, at_ms, node, event and its fields
);
CREATE INDEX IF NOT EXISTS samekey_journal_key ON samekey_journal (key, seq);
CREATE INDEX IF NOT EXISTS samekey_journal_call_id ON samekey_journal (call_id, seq);
CREATE INDEX IF NOT EXISTS samekey_journal_keep ON samekey_journal (keep_until);
-- Tables of an earlier release keep their times as BIGINT Unix ms: each such column becomes a
-- timestamptz, one ALTER TABLE (one rewrite, its indexes rebuilt) per table, every value exact.
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT a.attrelid::regclass AS tbl, string_agg(format(
                'ALTER COLUMN %I TYPE timestamptz USING samekey_ts(%I)', a.attname, a.attname),
            ', ' ORDER BY a.attnum) AS alters
        FROM (VALUES ",
    time_columns!(),
    ") AS c (tbl, col)
        JOIN pg_attribute a ON a.attrelid = to_regclass(c.tbl) AND a.attname = c.col
        WHERE a.atttypid = 'bigint'::regtype AND NOT a.attisdropped
        GROUP BY a.attrelid
    LOOP
        EXECUTE format('ALTER TABLE %s %s', t.tbl, t.alters);
    END LOOP;
END $$;
"
);

/// A [`Store`](crate::Store) in a PostgreSQL database.
///
/// The PostgreSQL store (feature `postgres`): one database shared by many instances, the key's digest as
/// primary key (the unique index is the last line of defence), fences from a sequence, compensation
/// entries taken with `FOR UPDATE SKIP LOCKED`.
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
/// and the receipt commit or roll back together (seed 000 §5.3). The runtime's own completion afterwards
/// finds the receipt written and changes nothing.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

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
        let store = PgStore { pool };
        store.migrate().await?;
        Ok(store)
    }

    /// A store on a pool the caller made; call [`PgStore::migrate`] once before use.
    pub fn from_pool(pool: PgPool) -> PgStore {
        PgStore { pool }
    }

    /// The statement a claim sends: it takes the key (a new row, or a released or expired one), or
    /// returns the record that holds it, in one round trip.
    pub const CLAIM_SQL: &'static str = "WITH taken AS (
    INSERT INTO samekey_receipts AS r
        (key, scope, call_id, state, fence, lease_until, expires_at, fingerprint, outcome, created,
         updated)
    VALUES ($1, $2, $3, 'PROCESSING', nextval('samekey_fence'), samekey_ts(samekey_now($6) + $4),
        NULL, $5, NULL, samekey_ts(samekey_now($6)), samekey_ts(samekey_now($6)))
    ON CONFLICT (key) DO UPDATE SET
        scope = EXCLUDED.scope, call_id = EXCLUDED.call_id, state = 'PROCESSING',
        fence = nextval('samekey_fence'), lease_until = EXCLUDED.lease_until, expires_at = NULL,
        fingerprint = EXCLUDED.fingerprint, outcome = NULL, created = EXCLUDED.created,
        updated = EXCLUDED.updated, waited = false
    WHERE r.state = 'RELEASED' OR r.expires_at <= samekey_ts(samekey_now($6))
    RETURNING true AS acquired, key, scope, call_id, state, fence,
        samekey_ms(lease_until) AS lease_until, samekey_ms(expires_at) AS expires_at, fingerprint,
        outcome, samekey_ms(created) AS created, samekey_ms(updated) AS updated)
SELECT * FROM taken
UNION ALL
SELECT false AS acquired, key, scope, call_id, state, fence, samekey_ms(lease_until) AS lease_until,
    samekey_ms(expires_at) AS expires_at, fingerprint, outcome, samekey_ms(created) AS created,
    samekey_ms(updated) AS updated
FROM samekey_receipts
WHERE key = $1 AND (expires_at IS NULL OR expires_at > samekey_ts(samekey_now($6)))
    AND NOT EXISTS (SELECT 1 FROM taken)";

    /// The indexes added to an existing table by a later release: built `CONCURRENTLY`, outside the
    /// schema's transaction, so that building them on a large `samekey_receipts` does not stop claims
    /// and completions meanwhile. (Name, how to build it, how to drop a failed build.)
    const LATER_INDEXES: [(&'static str, &'static str, &'static str); 3] = [
        (
            "samekey_receipts_orphans",
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS samekey_receipts_orphans
    ON samekey_receipts (lease_until) WHERE state = 'PROCESSING'",
            "DROP INDEX CONCURRENTLY IF EXISTS samekey_receipts_orphans",
        ),
        (
            "samekey_receipts_created",
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS samekey_receipts_created
    ON samekey_receipts (created, key)",
            "DROP INDEX CONCURRENTLY IF EXISTS samekey_receipts_created",
        ),
        (
            "samekey_receipts_scope_created",
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS samekey_receipts_scope_created
    ON samekey_receipts (scope, created, key)",
            "DROP INDEX CONCURRENTLY IF EXISTS samekey_receipts_scope_created",
        ),
    ];

    /// Creates the sequence, tables and indexes if they are missing. Idempotent, and safe to run from
    /// several instances at once (an advisory lock serializes them). The indexes a later release added
    /// are built `CONCURRENTLY`: an upgrade on a large table does not block writes while they build,
    /// and an index whose build failed half-way is dropped and built again. Times an earlier release
    /// kept as `BIGINT` Unix ms become `timestamptz`, every value kept: that rewrites each table once,
    /// in the schema's transaction, and holds the table's readers and writers while it runs.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // The usual case, an instance starting on a migrated database, takes no lock at all:
        // `CREATE INDEX IF NOT EXISTS` would lock the table against writers before finding the index.
        if self.migrated().await? {
            return Ok(());
        }
        // One instance migrates at a time. The lock is a session's, and waited for by asking (not
        // by blocking in a statement): an index built `CONCURRENTLY` waits for every statement
        // older than it, and a statement blocked on this lock would wait for the build.
        let mut conn = self.pool.acquire().await.map_err(driver)?;
        let mut waited = 0u32;
        loop {
            let locked: bool =
                sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext('samekey.migrate'))")
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(driver)?;
            if locked {
                break;
            }
            if self.migrated().await? {
                return Ok(());
            }
            waited += 1;
            if waited > 1_200 {
                return Err(StoreError::Unavailable(
                    "another instance has been migrating the schema for 2 minutes".into(),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let migrated = self.migrate_locked(&mut conn).await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock(hashtext('samekey.migrate'))")
            .execute(&mut *conn)
            .await
            .map_err(driver);
        migrated.and(unlocked.map(drop))
    }

    /// Whether the schema is in place: see [`PgStore::migrated`].
    const MIGRATED_SQL: &'static str = concat!(
            "SELECT to_regclass('samekey_compensation_due') IS NOT NULL
                AND to_regclass('samekey_receipts_expires_at') IS NOT NULL
                AND to_regclass('samekey_receipts_orphans') IS NOT NULL
                AND to_regclass('samekey_receipts_created') IS NOT NULL
                AND to_regclass('samekey_receipts_scope_created') IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM pg_index WHERE NOT indisvalid AND indexrelid IN (
                    to_regclass('samekey_receipts_orphans'), to_regclass('samekey_receipts_created'),
                    to_regclass('samekey_receipts_scope_created')))
                AND to_regclass('samekey_journal_keep') IS NOT NULL
                AND to_regclass('samekey_fence') IS NOT NULL
                AND to_regprocedure('samekey_now(bigint)') IS NOT NULL
                AND to_regprocedure('samekey_ts(bigint)') IS NOT NULL
                AND to_regprocedure('samekey_ms(timestamptz)') IS NOT NULL
                AND EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'samekey_settled'
                    AND tgrelid = to_regclass('samekey_receipts'))
                AND EXISTS (SELECT 1 FROM information_schema.columns
                    WHERE table_schema = current_schema() AND table_name = 'samekey_compensation'
                        AND column_name = 'inputs')
                AND (SELECT count(*) FROM (VALUES ",
            time_columns!(),
            ") AS c (tbl, col)
                    JOIN pg_attribute a ON a.attrelid = to_regclass(c.tbl) AND a.attname = c.col
                    WHERE a.atttypid = 'timestamptz'::regtype AND NOT a.attisdropped) = 9"
    );

    /// Whether the schema, every index of it and its functions are in place (and the indexes valid),
    /// and every time column is a `timestamptz` (an earlier release's `BIGINT` ms are not).
    async fn migrated(&self) -> Result<bool, StoreError> {
        sqlx::query_scalar(Self::MIGRATED_SQL)
            .fetch_one(&self.pool)
            .await
            .map_err(driver)
    }

    /// The schema in one transaction, then the later indexes, on `conn`, which holds the migration lock.
    async fn migrate_locked(&self, conn: &mut sqlx::PgConnection) -> Result<(), StoreError> {
        let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(driver)?;
        sqlx::query("SET LOCAL lock_timeout = '10s'")
            .execute(&mut *tx)
            .await
            .map_err(driver)?;
        sqlx::raw_sql(SCHEMA)
            .execute(&mut *tx)
            .await
            .map_err(driver)?;
        tx.commit().await.map_err(driver)?;
        Self::build_later_indexes(conn).await
    }

    /// Builds [`PgStore::LATER_INDEXES`] one by one, `CONCURRENTLY` (outside any transaction), on
    /// `conn`, which holds the migration lock.
    async fn build_later_indexes(conn: &mut sqlx::PgConnection) -> Result<(), StoreError> {
        {
            for (name, create, drop) in Self::LATER_INDEXES {
                let valid: Option<bool> = sqlx::query_scalar(
                    "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)",
                )
                .bind(name)
                .fetch_optional(&mut *conn)
                .await
                .map_err(driver)?;
                match valid {
                    Some(true) => continue,
                    // A build that failed half-way leaves an invalid index: drop it, build again.
                    Some(false) => {
                        sqlx::raw_sql(drop)
                            .execute(&mut *conn)
                            .await
                            .map_err(driver)?;
                    }
                    None => {}
                }
                sqlx::raw_sql(create)
                    .execute(&mut *conn)
                    .await
                    .map_err(driver)?;
            }
            Ok(())
        }
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
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
        conn: &mut PgConnection,
        call: &Context,
        value: &T,
    ) -> Result<Transition, StoreError> {
        if !call.is_protected() {
            return Ok(Transition::AlreadyApplied);
        }
        let outcome = serde_json::to_vec(value)
            .map_err(|e| StoreError::Corrupt(format!("the outcome cannot be encoded: {e}")))?;
        let now = call.started_ms();
        let completion = Completion {
            state: ReceiptState::Success,
            outcome: Some(outcome.into()),
            ttl_ms: call.expires_at_ms().saturating_sub(now),
        };
        PgStore::complete_on(conn, call.key(), call.fence(), completion, now).await
    }
}

impl PgStore {
    /// Marks the key's record waited-for and reads it (`$1` key, `$2` now).
    const WAITED_SQL: &'static str = concat!(
        "UPDATE samekey_receipts SET waited = true
WHERE key = $1 AND (expires_at IS NULL OR expires_at > samekey_ts(samekey_now($2)))
RETURNING ",
        sql::receipt_columns!("samekey_ms(", ")")
    );

    /// [`Store::wait_settled`](super::Store::wait_settled) by `LISTEN`: subscribe first, then mark the
    /// record and look at it, so that no change falls between the look and the subscription.
    async fn wait_notified(
        &self,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        let mut listener = PgListener::connect_with(&self.pool).await.map_err(driver)?;
        let channel = format!("samekey_{}", &key.to_hex()[..32]);
        listener.listen(&channel).await.map_err(driver)?;
        let row = sqlx::query(Self::WAITED_SQL)
            .bind(key.digest().as_slice())
            .bind(int(now_ms)?)
            .fetch_optional(&self.pool)
            .await
            .map_err(driver)?;
        let record = match row {
            Some(row) => sql::receipt(&row)?,
            None => None,
        };
        match &record {
            Some(r) if r.state == ReceiptState::Processing => {}
            _ => return Ok(record),
        }
        // A notification, a lost listening connection or the end of the wait: look again either way,
        // on the listening connection (no pool acquire between the notification and the answer).
        let _ = tokio::time::timeout(timeout, listener.recv()).await;
        let row = sqlx::query(Self::LIVE_ROW_SQL)
            .bind(key.digest().as_slice())
            .bind(int(now_ms)?)
            .fetch_optional(&mut listener)
            .await;
        match row {
            Ok(Some(row)) => sql::receipt(&row),
            Ok(None) => Ok(None),
            // The listening connection was lost: ask through the pool.
            Err(_) => self.get(key, now_ms).await,
        }
    }

    async fn claim_row(&self, claim: Claim) -> Result<Claimed, StoreError> {
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
                .fetch_optional(&self.pool)
                .await
                .map_err(driver)?;
            let Some(row) = row else { continue };
            let acquired: bool = sqlx::Row::try_get(&row, "acquired").map_err(driver)?;
            let record = sql::receipt(&row)?;
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
}

impl PgStore {
    /// Appends journal rows (`$1` key, `$2` callIds, `$3` times, `$4` events, `$5` now, `$6` keep) and
    /// trims the key's journal to leave room for them (`$7`).
    const APPEND_JOURNAL_SQL: &'static str = "WITH trimmed AS (
    DELETE FROM samekey_journal WHERE key = $1 AND seq <= (
        SELECT seq FROM samekey_journal WHERE key = $1 ORDER BY seq DESC LIMIT 1 OFFSET $7))
INSERT INTO samekey_journal (key, call_id, at, keep_until, event)
SELECT $1, t.c, samekey_ts(t.a), samekey_ts(samekey_now($5) + $6), t.e::jsonb
FROM unnest($2::text[], $3::bigint[], $4::text[]) WITH ORDINALITY AS t(c, a, e, n)
ORDER BY t.n";

    /// Appends journal rows and trims the key's journal to its latest events, in one statement (the
    /// trim reads the rows as they were before the insert, so it keeps room for the new ones).
    async fn append_rows(
        &self,
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
        sqlx::query(Self::APPEND_JOURNAL_SQL)
            .bind(key.digest().as_slice())
            .bind(call_ids)
            .bind(times)
            .bind(bodies)
            .bind(int(now_ms)?)
            .bind(int(keep_ms)?)
            .bind(i64::try_from(room).unwrap_or(i64::MAX))
            .execute(&self.pool)
            .await
            .map_err(driver)?;
        Ok(())
    }
}

sql::sql_store!(
    PgStore,
    PgConnection,
    next_fence = "nextval('samekey_fence')",
    locking = "FOR UPDATE SKIP LOCKED",
    now = ("samekey_now(", ")"),
    ts = ("samekey_ts(", ")"),
    ms = ("samekey_ms(", ")"),
    json_list = ("SELECT jsonb_array_elements_text(CAST(", " AS jsonb))"),
    kind = "postgres",
    clock = Own,
    wait_settled = wait_notified
);

/// The statements of `postgres/` say what this file's macro glued together, word for word: whitespace
/// and `--` comments aside, each file is the statement it replaces.
#[cfg(test)]
mod same_statements {
    use super::{sql, PgStore, SCHEMA};
    use crate::store::sql::{normalized, sql_files};

    macro_rules! file {
        ($name:literal) => {
            ($name, include_str!(concat!("postgres/", $name)))
        };
    }

    #[test]
    fn every_file_is_the_statement_it_replaces() {
        let later: Vec<&str> = PgStore::LATER_INDEXES.iter().map(|i| i.1).collect();
        let pairs = [
            (file!("schema.sql"), SCHEMA),
            (file!("migrations/migrated.sql"), PgStore::MIGRATED_SQL),
            (file!("migrations/receipts_orphans.sql"), later[0]),
            (file!("migrations/receipts_created.sql"), later[1]),
            (file!("migrations/receipts_scope_created.sql"), later[2]),
            (file!("statements/claim.sql"), PgStore::CLAIM_SQL),
            (file!("statements/take_over.sql"), PgStore::TAKE_OVER_SQL),
            (
                file!("statements/extend_lease.sql"),
                PgStore::EXTEND_LEASE_SQL,
            ),
            (file!("statements/complete.sql"), PgStore::COMPLETE_SQL),
            (
                file!("statements/mark_unknown.sql"),
                PgStore::MARK_UNKNOWN_SQL,
            ),
            (file!("statements/release.sql"), sql::RELEASE),
            (file!("statements/forget.sql"), sql::FORGET),
            (file!("statements/key_row.sql"), PgStore::KEY_ROW_SQL),
            (file!("statements/live_row.sql"), PgStore::LIVE_ROW_SQL),
            (file!("statements/mark_waited.sql"), PgStore::WAITED_SQL),
            (file!("statements/by_call_id.sql"), PgStore::BY_CALL_ID_SQL),
            (
                file!("statements/by_call_ids.sql"),
                PgStore::BY_CALL_IDS_SQL,
            ),
            (file!("statements/now.sql"), PgStore::NOW_SQL),
            (file!("statements/purge_expired.sql"), PgStore::PURGE_SQL),
            (
                file!("statements/count_expired.sql"),
                PgStore::COUNT_EXPIRED_SQL,
            ),
            (file!("statements/list_receipts.sql"), PgStore::LIST_SQL),
            (
                file!("statements/list_receipts_of_scope.sql"),
                PgStore::LIST_SCOPE_SQL,
            ),
            (file!("statements/orphans.sql"), PgStore::ORPHANS_SQL),
            (file!("statements/enqueue.sql"), PgStore::ENQUEUE_SQL),
            (file!("statements/take_due.sql"), PgStore::TAKE_DUE_SQL),
            (file!("statements/reschedule.sql"), PgStore::RESCHEDULE_SQL),
            (file!("statements/escalate.sql"), PgStore::ESCALATE_SQL),
            (file!("statements/finish.sql"), sql::FINISH),
            (file!("statements/taker.sql"), sql::TAKER),
            (
                file!("statements/list_compensations.sql"),
                PgStore::LIST_COMPENSATIONS_SQL,
            ),
            (
                file!("statements/append_journal.sql"),
                PgStore::APPEND_JOURNAL_SQL,
            ),
            (
                file!("statements/journal_by_key.sql"),
                PgStore::JOURNAL_BY_KEY_SQL,
            ),
            (
                file!("statements/journal_by_call.sql"),
                PgStore::JOURNAL_BY_CALL_SQL,
            ),
            (file!("statements/journaled_keys.sql"), sql::JOURNALED_KEYS),
            (
                file!("statements/purge_journal.sql"),
                PgStore::PURGE_JOURNAL_SQL,
            ),
        ];
        for ((name, file), old) in pairs {
            assert_eq!(normalized(file), normalized(old), "postgres/{name}");
        }
        let compared: std::collections::BTreeSet<String> = pairs
            .iter()
            .map(|((name, _), _)| name.to_string())
            .collect();
        assert_eq!(compared, sql_files("src/store/postgres"));
    }
}
