//! [`SqliteStore`] and what it needs; its documentation is on the type, where users read it.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::sql::{self, driver, int};
use super::{Claim, Claimed};
use crate::error::StoreError;
use crate::journal::{self, Event, JOURNAL_LIMIT};
use crate::key::Key;

/// The schema, idempotent: run by [`SqliteStore::open`] and [`SqliteStore::migrate`].
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS samekey_receipts (
    key         BLOB PRIMARY KEY NOT NULL,  -- SHA-256 of scope and key parts: the unique index
    scope       TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    state       TEXT NOT NULL,              -- RECEIVED PROCESSING UNKNOWN SUCCESS FAILED, or RELEASED
    fence       INTEGER NOT NULL,
    lease_until INTEGER,
    expires_at  INTEGER,
    fingerprint BLOB,
    outcome     BLOB,
    created     INTEGER NOT NULL,
    updated     INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS samekey_receipts_call_id ON samekey_receipts (call_id);
CREATE INDEX IF NOT EXISTS samekey_receipts_expires_at ON samekey_receipts (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS samekey_receipts_orphans ON samekey_receipts (lease_until)
    WHERE state = 'PROCESSING';
CREATE INDEX IF NOT EXISTS samekey_receipts_created ON samekey_receipts (created, key);
CREATE INDEX IF NOT EXISTS samekey_receipts_scope_created ON samekey_receipts (scope, created, key);
CREATE TABLE IF NOT EXISTS samekey_compensation (
    call_id     TEXT PRIMARY KEY NOT NULL,
    key         BLOB NOT NULL,
    scope       TEXT NOT NULL,
    reason      TEXT NOT NULL,
    round       INTEGER NOT NULL,
    next_at     INTEGER NOT NULL,
    state       TEXT NOT NULL,              -- PENDING TAKEN MANUAL
    lease_until INTEGER,
    enqueued    INTEGER NOT NULL,
    taker       INTEGER NOT NULL DEFAULT 0, -- the worker fence of the latest take
    attempts    INTEGER NOT NULL DEFAULT 0, -- attempts the call made before it was queued
    last_error  TEXT,                       -- how its last attempt ended: timed_out, unknown, …
    inputs      BLOB                        -- its inputs (JSON), when its function keeps them
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS samekey_journal (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    key         BLOB NOT NULL,              -- the key's digest (samekey_receipts.key)
    call_id     TEXT NOT NULL,
    at          INTEGER NOT NULL,           -- Unix ms, by the writing node's clock
    keep_until  INTEGER NOT NULL,           -- kept until then at least, and while the key's record lives
    event       TEXT NOT NULL               -- JSON: call_id, at_ms, node, event and its fields
);
CREATE INDEX IF NOT EXISTS samekey_journal_key ON samekey_journal (key, seq);
CREATE INDEX IF NOT EXISTS samekey_journal_call_id ON samekey_journal (call_id, seq);
CREATE INDEX IF NOT EXISTS samekey_journal_keep ON samekey_journal (keep_until);
";

/// A [`Store`](crate::Store) in an SQLite file.
///
/// The SQLite store (feature `sqlite`): embedded and durable across restarts, one file, the key's digest
/// as primary key (the unique index). The natural choice for one machine; several processes may share
/// the file (WAL mode, a busy timeout, and every operation one atomic statement).
///
/// A claim is one `INSERT … ON CONFLICT DO UPDATE … WHERE <free> RETURNING` statement: it creates the
/// row, or reuses a released or expired one, or changes nothing and the record is read back. Waiting for
/// a busy key polls (the trait's default), as SQLite has no notifications across processes.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

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
        let store = SqliteStore { pool };
        store.migrate().await?;
        Ok(store)
    }

    /// A store on a pool the caller made; call [`SqliteStore::migrate`] once before use.
    pub fn from_pool(pool: SqlitePool) -> SqliteStore {
        SqliteStore { pool }
    }

    /// The statement a claim sends: it takes the key (a new row, or a released or expired one) and
    /// answers its fence, or changes nothing (the key is held: its row is read next).
    pub const CLAIM_SQL: &'static str = "INSERT INTO samekey_receipts
    (key, scope, call_id, state, fence, lease_until, expires_at, fingerprint, outcome, created, updated)
VALUES (?1, ?2, ?3, 'PROCESSING', ?4, ?7 + ?5, NULL, ?6, NULL, ?7, ?7)
ON CONFLICT (key) DO UPDATE SET
    scope = excluded.scope, call_id = excluded.call_id, state = 'PROCESSING',
    fence = samekey_receipts.fence + 1, lease_until = excluded.lease_until, expires_at = NULL,
    fingerprint = excluded.fingerprint, outcome = NULL, created = excluded.created,
    updated = excluded.updated
WHERE samekey_receipts.state = 'RELEASED' OR samekey_receipts.expires_at <= ?7
RETURNING fence";

    /// The statement that reads a key's row.
    pub const ROW_SQL: &'static str = Self::KEY_ROW_SQL;

    /// The columns of the compensation queue added since its first release, and how to add each.
    const ADDED_COLUMNS: [(&'static str, &'static str); 4] = [
        (
            "taker",
            "ALTER TABLE samekey_compensation ADD COLUMN taker INTEGER NOT NULL DEFAULT 0",
        ),
        (
            "attempts",
            "ALTER TABLE samekey_compensation ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0",
        ),
        (
            "last_error",
            "ALTER TABLE samekey_compensation ADD COLUMN last_error TEXT",
        ),
        (
            "inputs",
            "ALTER TABLE samekey_compensation ADD COLUMN inputs BLOB",
        ),
    ];

    /// Whether the compensation queue has the column `$1` (1) or not (0).
    const HAS_COLUMN_SQL: &'static str =
        "SELECT COUNT(*) FROM pragma_table_info('samekey_compensation') WHERE name = $1";

    /// Creates the tables and indexes if they are missing. Idempotent.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::raw_sql(SCHEMA)
            .execute(&self.pool)
            .await
            .map_err(driver)?;
        // A file made by an earlier release: its queue lacks the columns added since.
        for (column, add) in Self::ADDED_COLUMNS {
            let has: i64 = sqlx::query_scalar(Self::HAS_COLUMN_SQL)
                .bind(column)
                .fetch_one(&self.pool)
                .await
                .map_err(driver)?;
            if has == 0 {
                match sqlx::query(add).execute(&self.pool).await {
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

    /// The connection pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

impl SqliteStore {
    async fn claim_row(&self, claim: Claim) -> Result<Claimed, StoreError> {
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
                .fetch_all(&self.pool)
                .await
                .map_err(driver)?;
            if let Some(&fence) = acquired.first() {
                return Ok(Claimed::Acquired(sql::fence_of(fence)?));
            }
            if let Some(existing) = self.row(&claim.key).await? {
                return Ok(Claimed::Existing(existing));
            }
        }
        Err(StoreError::Unavailable(
            "the key's row kept changing during the claim".into(),
        ))
    }
}

impl SqliteStore {
    /// Appends one journal row (`$1` key, `$2` callId, `$3` time, `$4` now, `$5` keep, `$6` event).
    const INSERT_JOURNAL_SQL: &'static str =
        "INSERT INTO samekey_journal (key, call_id, at, keep_until, event)
VALUES ($1, $2, $3, $4 + $5, $6)";

    /// Appends journal rows and trims the key's journal to its latest events, in one transaction.
    async fn append_rows(
        &self,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(driver)?;
        for event in events {
            sqlx::query(Self::INSERT_JOURNAL_SQL)
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
        sqlx::query(sql::TRIM_JOURNAL)
            .bind(key.digest().as_slice())
            .bind(i64::try_from(JOURNAL_LIMIT).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await
            .map_err(driver)?;
        tx.commit().await.map_err(driver)
    }
}

sql::sql_store!(
    SqliteStore,
    sqlx::sqlite::SqliteConnection,
    next_fence = "fence + 1",
    locking = "",
    now = ("", ""),
    ts = ("", ""),
    ms = ("", ""),
    json_list = ("SELECT value FROM json_each(", ")"),
    kind = "sqlite",
    clock = Caller
);

/// The fence of a key's new row: `now_ms << 16`, larger than any fence the key had at an earlier
/// millisecond (at most 65 535 take-overs per millisecond).
fn fresh_fence(now_ms: u64) -> Result<i64, StoreError> {
    now_ms
        .checked_mul(1 << 16)
        .and_then(|f| i64::try_from(f).ok())
        .ok_or_else(|| StoreError::Corrupt(format!("time {now_ms} ms is out of range")))
}

/// The statements of `sqlite/` say what this file's macro glued together, word for word: whitespace
/// and `--` comments aside, each file is the statement it replaces. (`NOW_SQL`, `SELECT $1`, has no
/// file: a store judged by the caller's clock answers the time without asking the database.)
#[cfg(test)]
mod same_statements {
    use super::{sql, SqliteStore, SCHEMA};
    use crate::store::sql::{normalized, sql_files};

    macro_rules! file {
        ($name:literal) => {
            ($name, include_str!(concat!("sqlite/", $name)))
        };
    }

    #[test]
    fn every_file_is_the_statement_it_replaces() {
        let added: Vec<&str> = SqliteStore::ADDED_COLUMNS.iter().map(|c| c.1).collect();
        let pairs = [
            (file!("schema.sql"), SCHEMA),
            (
                file!("migrations/compensation_has_column.sql"),
                SqliteStore::HAS_COLUMN_SQL,
            ),
            (file!("migrations/compensation_taker.sql"), added[0]),
            (file!("migrations/compensation_attempts.sql"), added[1]),
            (file!("migrations/compensation_last_error.sql"), added[2]),
            (file!("migrations/compensation_inputs.sql"), added[3]),
            (file!("statements/claim.sql"), SqliteStore::CLAIM_SQL),
            (
                file!("statements/take_over.sql"),
                SqliteStore::TAKE_OVER_SQL,
            ),
            (
                file!("statements/extend_lease.sql"),
                SqliteStore::EXTEND_LEASE_SQL,
            ),
            (file!("statements/complete.sql"), SqliteStore::COMPLETE_SQL),
            (
                file!("statements/mark_unknown.sql"),
                SqliteStore::MARK_UNKNOWN_SQL,
            ),
            (file!("statements/release.sql"), sql::RELEASE),
            (file!("statements/forget.sql"), sql::FORGET),
            (file!("statements/key_row.sql"), SqliteStore::KEY_ROW_SQL),
            (file!("statements/live_row.sql"), SqliteStore::LIVE_ROW_SQL),
            (
                file!("statements/by_call_id.sql"),
                SqliteStore::BY_CALL_ID_SQL,
            ),
            (
                file!("statements/by_call_ids.sql"),
                SqliteStore::BY_CALL_IDS_SQL,
            ),
            (
                file!("statements/purge_expired.sql"),
                SqliteStore::PURGE_SQL,
            ),
            (
                file!("statements/count_expired.sql"),
                SqliteStore::COUNT_EXPIRED_SQL,
            ),
            (file!("statements/list_receipts.sql"), SqliteStore::LIST_SQL),
            (
                file!("statements/list_receipts_of_scope.sql"),
                SqliteStore::LIST_SCOPE_SQL,
            ),
            (file!("statements/orphans.sql"), SqliteStore::ORPHANS_SQL),
            (file!("statements/enqueue.sql"), SqliteStore::ENQUEUE_SQL),
            (file!("statements/take_due.sql"), SqliteStore::TAKE_DUE_SQL),
            (
                file!("statements/reschedule.sql"),
                SqliteStore::RESCHEDULE_SQL,
            ),
            (file!("statements/escalate.sql"), SqliteStore::ESCALATE_SQL),
            (file!("statements/finish.sql"), sql::FINISH),
            (file!("statements/taker.sql"), sql::TAKER),
            (
                file!("statements/list_compensations.sql"),
                SqliteStore::LIST_COMPENSATIONS_SQL,
            ),
            (
                file!("statements/insert_journal.sql"),
                SqliteStore::INSERT_JOURNAL_SQL,
            ),
            (file!("statements/trim_journal.sql"), sql::TRIM_JOURNAL),
            (
                file!("statements/journal_by_key.sql"),
                SqliteStore::JOURNAL_BY_KEY_SQL,
            ),
            (
                file!("statements/journal_by_call.sql"),
                SqliteStore::JOURNAL_BY_CALL_SQL,
            ),
            (file!("statements/journaled_keys.sql"), sql::JOURNALED_KEYS),
            (
                file!("statements/purge_journal.sql"),
                SqliteStore::PURGE_JOURNAL_SQL,
            ),
        ];
        for ((name, file), old) in pairs {
            assert_eq!(normalized(file), normalized(old), "sqlite/{name}");
        }
        let compared: std::collections::BTreeSet<String> = pairs
            .iter()
            .map(|((name, _), _)| name.to_string())
            .collect();
        assert_eq!(compared, sql_files("src/store/sqlite"));
    }
}
