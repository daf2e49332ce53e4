//! What the SQL backends share: the columns of a stored receipt or compensation entry, their checked
//! conversion into the contract's types (a corrupted or foreign row is a [`StoreError::Corrupt`], never a
//! panic), and the mapping of driver errors.
//!
//! Both SQL backends keep one row per key in `samekey_receipts` (the key's digest is the primary key:
//! the unique index that is the last line of defence) and one row per queued call in
//! `samekey_compensation`. A released claim stays as a `RELEASED` tombstone until it is purged, so that
//! the key's next claim continues its fence sequence.

use std::sync::Arc;

use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::call_id::CallId;
use crate::compensation::{CompensationEntry, CompensationState};
use crate::error::StoreError;
use crate::journal::AttemptOutcome;
use crate::key::{Fingerprint, Key};
use crate::receipt::{Fence, Receipt, ReceiptState};

/// The state written for a released claim: a tombstone that reads as "no record".
pub(crate) const RELEASED: &str = "RELEASED";

/// A `u64` as the `BIGINT` the databases store.
pub(crate) fn int(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{v} does not fit a BIGINT")))
}

/// The latest time a query bound is taken as: 9999-12-31T23:59:59.999Z, within PostgreSQL's
/// `timestamptz` and SQLite's `BIGINT` (no stored time is later).
const LATEST_MS: u64 = 253_402_300_799_999;

/// A time bound of a query as a `BIGINT`: past the latest time, the latest, so that
/// `created_between(0, u64::MAX)` lists everything, as on the other stores.
pub(crate) fn bound(v: u64) -> i64 {
    i64::try_from(v.min(LATEST_MS)).unwrap_or(i64::MAX)
}

fn uint(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("negative {what}: {v}")))
}

fn opt_uint(v: Option<i64>, what: &str) -> Result<Option<u64>, StoreError> {
    v.map(|v| uint(v, what)).transpose()
}

/// Maps a driver error: a row that cannot be decoded is corrupt; anything else means the database did
/// not answer as it should, and the call fails closed.
pub(crate) fn driver(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::Decode(_) => StoreError::Corrupt(e.to_string()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

fn key_of(digest: &[u8], scope: String) -> Result<Key, StoreError> {
    let digest: [u8; 32] = digest
        .try_into()
        .map_err(|_| StoreError::Corrupt(format!("a key is 32 bytes, found {}", digest.len())))?;
    Ok(Key::from_digest(scope, digest))
}

fn call_id_of(text: &str) -> Result<CallId, StoreError> {
    text.parse()
        .map_err(|e| StoreError::Corrupt(format!("stored callId: {e}")))
}

/// Reads a receipt row (the columns of [`receipt_columns!`], times in Unix ms); `Ok(None)` for a
/// released tombstone.
pub(crate) fn receipt<R>(row: &R) -> Result<Option<Receipt>, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
{
    let state: String = row.try_get("state").map_err(driver)?;
    if state == RELEASED {
        return Ok(None);
    }
    let state: ReceiptState = state
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("stored state: {e}")))?;
    let digest: Vec<u8> = row.try_get("key").map_err(driver)?;
    let scope: String = row.try_get("scope").map_err(driver)?;
    let call_id: String = row.try_get("call_id").map_err(driver)?;
    let fingerprint: Option<Vec<u8>> = row.try_get("fingerprint").map_err(driver)?;
    let fingerprint = match fingerprint {
        None => None,
        Some(bytes) => Some(Fingerprint(bytes.as_slice().try_into().map_err(|_| {
            StoreError::Corrupt(format!("a fingerprint is 32 bytes, found {}", bytes.len()))
        })?)),
    };
    let outcome: Option<Vec<u8>> = row.try_get("outcome").map_err(driver)?;
    Ok(Some(Receipt {
        key: key_of(&digest, scope)?,
        call_id: call_id_of(&call_id)?,
        state,
        fence: fence_of(row.try_get("fence").map_err(driver)?)?,
        lease_until_ms: opt_uint(row.try_get("lease_until").map_err(driver)?, "lease")?,
        expires_at_ms: opt_uint(row.try_get("expires_at").map_err(driver)?, "expiry")?,
        fingerprint,
        outcome: outcome.map(Arc::from),
        created_ms: uint(row.try_get("created").map_err(driver)?, "creation time")?,
        updated_ms: uint(row.try_get("updated").map_err(driver)?, "update time")?,
    }))
}

/// Reads a compensation row (the columns of [`compensation_columns!`], times in Unix ms).
pub(crate) fn compensation<R>(row: &R) -> Result<CompensationEntry, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
{
    let call_id: String = row.try_get("call_id").map_err(driver)?;
    let digest: Vec<u8> = row.try_get("key").map_err(driver)?;
    let scope: String = row.try_get("scope").map_err(driver)?;
    let state: String = row.try_get("state").map_err(driver)?;
    let lease: Option<i64> = row.try_get("lease_until").map_err(driver)?;
    let state = match (state.as_str(), lease) {
        ("PENDING", _) => CompensationState::Pending,
        ("TAKEN", Some(until)) => CompensationState::Taken {
            lease_until_ms: uint(until, "lease")?,
        },
        ("MANUAL", _) => CompensationState::Manual,
        (other, _) => {
            return Err(StoreError::Corrupt(format!(
                "compensation state `{other}` (PENDING, TAKEN with a lease, MANUAL)"
            )))
        }
    };
    let round: i64 = row.try_get("round").map_err(driver)?;
    let taker: i64 = row.try_get("taker").map_err(driver)?;
    let attempts: i64 = row.try_get("attempts").map_err(driver)?;
    let last_error: Option<String> = row.try_get("last_error").map_err(driver)?;
    let inputs: Option<Vec<u8>> = row.try_get("inputs").map_err(driver)?;
    Ok(CompensationEntry {
        call_id: call_id_of(&call_id)?,
        key: key_of(&digest, scope)?,
        reason: row.try_get("reason").map_err(driver)?,
        round: u32::try_from(round)
            .map_err(|_| StoreError::Corrupt(format!("compensation round {round}")))?,
        next_at_ms: uint(row.try_get("next_at").map_err(driver)?, "due time")?,
        state,
        enqueued_ms: uint(row.try_get("enqueued").map_err(driver)?, "enqueue time")?,
        fence: fence_of(taker)?,
        attempts: u32::try_from(attempts)
            .map_err(|_| StoreError::Corrupt(format!("compensation attempts {attempts}")))?,
        last_error: last_error.map(|class| outcome_of(&class)).transpose()?,
        encoded_inputs: inputs.map(Arc::from),
    })
}

/// An attempt's outcome as the compensation table keeps it (`timed_out`, `unknown`, …).
pub(crate) fn outcome_name(outcome: AttemptOutcome) -> String {
    serde_json::to_value(outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn outcome_of(name: &str) -> Result<AttemptOutcome, StoreError> {
    serde_json::from_value(serde_json::Value::String(name.to_owned()))
        .map_err(|_| StoreError::Corrupt(format!("an attempt's outcome `{name}`")))
}

/// A fence read back from a `BIGINT`.
pub(crate) fn fence_of(v: i64) -> Result<Fence, StoreError> {
    uint(v, "fence").map(Fence)
}

/// The columns of a receipt row (what [`receipt`] reads), each stored time written between `$open`
/// and `$close`: the conversion that reads it as Unix ms (`samekey_ms(` `)` on PostgreSQL, whose
/// columns are `timestamptz`; nothing on SQLite, whose are ms already). A converted column keeps its
/// name, so a row decodes the same on both; a statement that orders by a time column names it with
/// its table (`ORDER BY samekey_receipts.created`), or PostgreSQL would order by the converted
/// output column and not use the index.
macro_rules! receipt_columns {
    ($open:literal, $close:literal) => {
        concat!(
            "key, scope, call_id, state, fence, ",
            $open,
            "lease_until",
            $close,
            " AS lease_until, ",
            $open,
            "expires_at",
            $close,
            " AS expires_at,\n    fingerprint, outcome, ",
            $open,
            "created",
            $close,
            " AS created, ",
            $open,
            "updated",
            $close,
            " AS updated"
        )
    };
}

/// The columns of a compensation row (what [`compensation`] reads), times converted as in
/// [`receipt_columns!`].
macro_rules! compensation_columns {
    ($open:literal, $close:literal) => {
        concat!(
            "call_id, key, scope, reason, round, ",
            $open,
            "next_at",
            $close,
            " AS next_at, state, ",
            $open,
            "lease_until",
            $close,
            " AS lease_until, ",
            $open,
            "enqueued",
            $close,
            " AS enqueued, taker,\n    attempts, last_error, inputs"
        )
    };
}

pub(crate) use {compensation_columns, receipt_columns};

pub(crate) const RELEASE: &str = "UPDATE samekey_receipts
SET state = 'RELEASED', lease_until = NULL, outcome = NULL, expires_at = updated
WHERE key = $1 AND fence = $2 AND state = 'PROCESSING'";

pub(crate) const FORGET: &str = "UPDATE samekey_receipts
SET state = 'RELEASED', lease_until = NULL, outcome = NULL, expires_at = updated
WHERE key = $1 AND fence = $2 AND state IN ('SUCCESS', 'FAILED')";

/// Keys that have a journal, after `$1` (a digest), `$2` at most, in digest order.
pub(crate) const JOURNALED_KEYS: &str =
    "SELECT DISTINCT key FROM samekey_journal WHERE key > $1 ORDER BY key LIMIT $2";

/// Removes an entry (`$1`), whoever holds it (`$2` null) or only its holder (`$2` the worker fence).
pub(crate) const FINISH: &str =
    "DELETE FROM samekey_compensation WHERE call_id = $1 AND ($2 IS NULL OR taker = $2)";

/// The worker fence of an entry (`$1`), to tell "gone" from "taken by another worker".
pub(crate) const TAKER: &str = "SELECT taker FROM samekey_compensation WHERE call_id = $1";

/// Keeps the latest `$2` journal events of the key `$1`.
#[cfg(feature = "sqlite")]
pub(crate) const TRIM_JOURNAL: &str = "DELETE FROM samekey_journal WHERE key = $1 AND seq <= (
    SELECT seq FROM samekey_journal WHERE key = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)";

/// Everything of [`Store`](super::Store) the SQL backends do alike, for a store type with a `pool`
/// field (an sqlx pool of `$conn` connections) and an inherent `claim_row` (the claim is where their
/// dialects differ most). Some fragments differ too: `next_fence`, the SQL expression of a taken-over
/// row's new fence; `locking`, the clause after the `LIMIT` of the statement that takes due
/// compensation entries (`FOR UPDATE SKIP LOCKED` on PostgreSQL); `now = (open, close)`, what is
/// written around the caller's time parameter to get the time the store judges by, in Unix ms
/// (nothing on SQLite, which takes the caller's time; `samekey_now(...)` on PostgreSQL, which ignores
/// it and reads the server's clock); `ts = (open, close)`, what is written around a time in Unix ms
/// to store it or compare it with a time column, and `ms = (open, close)`, what is written around a
/// time column to read it as Unix ms (`samekey_ts(...)` and `samekey_ms(...)` on PostgreSQL, whose
/// columns are `timestamptz`; nothing on SQLite, whose columns are ms). A comparison converts the
/// bound time, never the column, so that the indexes on the columns serve it. Every statement uses
/// `$n` placeholders, which PostgreSQL and SQLite both read; the code is the same for both pools.
macro_rules! sql_store {
    ($store:ty, $conn:ty, next_fence = $next_fence:literal, locking = $locking:literal,
     now = ($now_open:literal, $now_close:literal), ts = ($ts_open:literal, $ts_close:literal),
     ms = ($ms_open:literal, $ms_close:literal),
     json_list = ($list_open:literal, $list_close:literal), kind = $kind:literal,
     clock = $clock:ident
     $(, wait_settled = $wait:ident)?) => {
        impl $store {
            /// The statement a completion sends (`$1` state, `$2` outcome, `$3` ttl, `$4` now, `$5` key,
            /// `$6` fence); it changes one row or none.
            pub const COMPLETE_SQL: &'static str = concat!(
                "UPDATE samekey_receipts
SET state = $1, outcome = $2, lease_until = NULL, expires_at = ",
                $ts_open,
                $now_open,
                "$4",
                $now_close,
                " + $3",
                $ts_close,
                ", updated = ",
                $ts_open,
                $now_open,
                "$4",
                $now_close,
                $ts_close,
                "
WHERE key = $5 AND fence = $6 AND state IN ('RECEIVED', 'PROCESSING', 'UNKNOWN')"
            );

            /// A lease extension (`$1` lease, `$2` key, `$3` fence, `$4` now).
            const EXTEND_LEASE_SQL: &'static str = concat!(
                "UPDATE samekey_receipts SET lease_until = ",
                $ts_open,
                $now_open,
                "$4",
                $now_close,
                " + $1",
                $ts_close,
                "
WHERE key = $2 AND fence = $3 AND state = 'PROCESSING'"
            );

            /// `UNKNOWN` (`$1` now, `$2` key, `$3` fence).
            const MARK_UNKNOWN_SQL: &'static str = concat!(
                "UPDATE samekey_receipts
SET state = 'UNKNOWN', lease_until = NULL, expires_at = NULL, updated = ",
                $ts_open,
                $now_open,
                "$1",
                $now_close,
                $ts_close,
                "
WHERE key = $2 AND fence = $3 AND state IN ('RECEIVED', 'PROCESSING')"
            );

            /// Evicts expired rows (`$1` now).
            const PURGE_SQL: &'static str = concat!(
                "DELETE FROM samekey_receipts WHERE expires_at IS NOT NULL AND expires_at <= ",
                $ts_open,
                $now_open,
                "$1",
                $now_close,
                $ts_close
            );

            /// How many rows `PURGE_SQL` would delete (`$1` now).
            const COUNT_EXPIRED_SQL: &'static str = concat!(
                "SELECT COUNT(*) FROM samekey_receipts WHERE expires_at IS NOT NULL AND expires_at <= ",
                $ts_open,
                $now_open,
                "$1",
                $now_close,
                $ts_close
            );

            /// A key's row, whatever its expiry (`$1` key).
            const KEY_ROW_SQL: &'static str = concat!(
                "SELECT ",
                $crate::store::sql::receipt_columns!($ms_open, $ms_close),
                "
FROM samekey_receipts WHERE key = $1"
            );

            /// A key's row unless it expired (`$1` key, `$2` now).
            const LIVE_ROW_SQL: &'static str = concat!(
                "SELECT ",
                $crate::store::sql::receipt_columns!($ms_open, $ms_close),
                "
FROM samekey_receipts WHERE key = $1 AND (expires_at IS NULL OR expires_at > ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                $ts_close,
                ")"
            );

            /// The live record of a callId (`$1`), whatever its expiry.
            const BY_CALL_ID_SQL: &'static str = concat!(
                "SELECT ",
                $crate::store::sql::receipt_columns!($ms_open, $ms_close),
                "
FROM samekey_receipts WHERE call_id = $1 AND state <> 'RELEASED' LIMIT 1"
            );

            /// The live records of the callIds in the JSON array `$1`.
            const BY_CALL_IDS_SQL: &'static str = concat!(
                "SELECT ",
                $crate::store::sql::receipt_columns!($ms_open, $ms_close),
                "
FROM samekey_receipts WHERE call_id IN (",
                $list_open,
                "$1",
                $list_close,
                ") AND state <> 'RELEASED'"
            );

            /// The time the store judges by (`$1` the caller's), in Unix ms.
            const NOW_SQL: &'static str = concat!("SELECT ", $now_open, "$1", $now_close);

            /// The statement a take-over sends: the record becomes `PROCESSING` under a new fence if it
            /// still carries the expected one and is `UNKNOWN` or past its lease (`$1` lease, `$2` now,
            /// `$3` key, `$4` expected fence).
            const TAKE_OVER_SQL: &'static str = concat!(
                "UPDATE samekey_receipts
SET state = 'PROCESSING', fence = ",
                $next_fence,
                ", lease_until = ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                " + $1",
                $ts_close,
                ", updated = ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                $ts_close,
                "
WHERE key = $3 AND fence = $4
    AND (state = 'UNKNOWN'
         OR (state IN ('RECEIVED', 'PROCESSING')
             AND (lease_until IS NULL OR lease_until <= ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                $ts_close,
                ")))
RETURNING fence"
            );

            /// Queues an entry (`$1` callId, `$2` key, `$3` scope, `$4` reason, `$5` round, `$6` due
            /// time, `$7` enqueue time, `$8` attempts, `$9` last error, `$10` inputs), unless its callId
            /// is queued already.
            const ENQUEUE_SQL: &'static str = concat!(
                "INSERT INTO samekey_compensation
    (call_id, key, scope, reason, round, next_at, state, lease_until, enqueued, attempts,
     last_error, inputs)
VALUES ($1, $2, $3, $4, $5, ",
                $ts_open,
                "$6",
                $ts_close,
                ", 'PENDING', NULL, ",
                $ts_open,
                "$7",
                $ts_close,
                ", $8, $9, $10)
ON CONFLICT (call_id) DO NOTHING"
            );

            /// Every compensation entry, in the order they were queued.
            const LIST_COMPENSATIONS_SQL: &'static str = concat!(
                "SELECT ",
                $crate::store::sql::compensation_columns!($ms_open, $ms_close),
                "
FROM samekey_compensation ORDER BY samekey_compensation.enqueued, call_id"
            );

            /// The statement that takes due compensation entries (`$1` lease length, `$2` now, `$3`
            /// limit), each under a new worker fence.
            const TAKE_DUE_SQL: &'static str = concat!(
                "UPDATE samekey_compensation SET state = 'TAKEN', lease_until = ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                " + $1",
                $ts_close,
                ", taker = taker + 1
WHERE call_id IN (
    SELECT call_id FROM samekey_compensation
    WHERE (state = 'PENDING' AND next_at <= ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                $ts_close,
                ")
        OR (state = 'TAKEN' AND lease_until <= ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                $ts_close,
                ")
    ORDER BY next_at, enqueued LIMIT $3 ",
                $locking,
                ")
RETURNING ",
                $crate::store::sql::compensation_columns!($ms_open, $ms_close)
            );

            /// A page of receipts (`$1` until, `$2` now, `$3` cursor time, `$4` cursor key, `$5`
            /// limit): the cursor is just before the range (`since - 1`, all-ones) for the first page.
            /// The cursor and bounds are converted, not the column: the `(created, key)` index serves
            /// the range and the order.
            const LIST_SQL: &'static str = concat!(
                "SELECT ",
                $crate::store::sql::receipt_columns!($ms_open, $ms_close),
                "
FROM samekey_receipts
WHERE (created, key) > (",
                $ts_open,
                "$3",
                $ts_close,
                ", $4) AND created < ",
                $ts_open,
                "$1",
                $ts_close,
                " AND state <> 'RELEASED'
    AND (expires_at IS NULL OR expires_at > ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                $ts_close,
                ")
ORDER BY samekey_receipts.created, key LIMIT $5"
            );

            /// [`LIST_SQL`](Self::LIST_SQL) of one scope (`$6`), on the index by scope.
            const LIST_SCOPE_SQL: &'static str = concat!(
                "SELECT ",
                $crate::store::sql::receipt_columns!($ms_open, $ms_close),
                "
FROM samekey_receipts
WHERE scope = $6 AND (created, key) > (",
                $ts_open,
                "$3",
                $ts_close,
                ", $4) AND created < ",
                $ts_open,
                "$1",
                $ts_close,
                " AND state <> 'RELEASED'
    AND (expires_at IS NULL OR expires_at > ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                $ts_close,
                ")
ORDER BY samekey_receipts.created, key LIMIT $5"
            );

            /// Records `PROCESSING` past their lease (`$1` now, `$2` limit).
            const ORPHANS_SQL: &'static str = concat!(
                "SELECT ",
                $crate::store::sql::receipt_columns!($ms_open, $ms_close),
                "
FROM samekey_receipts r WHERE state = 'PROCESSING' AND lease_until <= ",
                $ts_open,
                $now_open,
                "$1",
                $now_close,
                $ts_close,
                "
    AND NOT EXISTS (SELECT 1 FROM samekey_compensation c WHERE c.call_id = r.call_id)
ORDER BY r.lease_until LIMIT $2"
            );

            /// Puts a held entry back (`$1` round, `$2` now, `$3` delay, `$4` callId, `$5` fence).
            const RESCHEDULE_SQL: &'static str = concat!(
                "UPDATE samekey_compensation
SET round = $1, next_at = ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                " + $3",
                $ts_close,
                ", state = 'PENDING', lease_until = NULL
WHERE call_id = $4 AND taker = $5"
            );

            /// Marks a held entry `MANUAL` (`$1` now, `$2` callId, `$3` fence).
            const ESCALATE_SQL: &'static str = concat!(
                "UPDATE samekey_compensation SET state = 'MANUAL', next_at = ",
                $ts_open,
                $now_open,
                "$1",
                $now_close,
                $ts_close,
                ", lease_until = NULL
WHERE call_id = $2 AND taker = $3"
            );

            /// A key's journal rows (`$1` key, `$2` now) that are still kept: within their own
            /// `keep_until`, or while the key has a live record. In the journal's order.
            const JOURNAL_BY_KEY_SQL: &'static str = concat!(
                "SELECT CAST(j.event AS TEXT) FROM samekey_journal j WHERE j.key = $1",
                " AND (j.keep_until > ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                $ts_close,
                " OR EXISTS (SELECT 1 FROM samekey_receipts r WHERE r.key = j.key
        AND r.state <> 'RELEASED' AND (r.expires_at IS NULL OR r.expires_at > ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                $ts_close,
                ")))
ORDER BY j.seq"
            );

            /// A call's journal rows (`$1` callId, `$2` now), kept as in `JOURNAL_BY_KEY_SQL`.
            const JOURNAL_BY_CALL_SQL: &'static str = concat!(
                "SELECT CAST(j.event AS TEXT) FROM samekey_journal j WHERE j.call_id = $1",
                " AND (j.keep_until > ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                $ts_close,
                " OR EXISTS (SELECT 1 FROM samekey_receipts r WHERE r.key = j.key
        AND r.state <> 'RELEASED' AND (r.expires_at IS NULL OR r.expires_at > ",
                $ts_open,
                $now_open,
                "$2",
                $now_close,
                $ts_close,
                ")))
ORDER BY j.seq"
            );

            /// Evicts journal rows past their `keep_until` whose key has no live record (`$1` now).
            const PURGE_JOURNAL_SQL: &'static str = concat!(
                "DELETE FROM samekey_journal WHERE keep_until <= ",
                $ts_open,
                $now_open,
                "$1",
                $now_close,
                $ts_close,
                " AND NOT EXISTS (SELECT 1 FROM samekey_receipts r
    WHERE r.key = samekey_journal.key AND r.state <> 'RELEASED'
        AND (r.expires_at IS NULL OR r.expires_at > ",
                $ts_open,
                $now_open,
                "$1",
                $now_close,
                $ts_close,
                "))"
            );

            /// The journal rows `statement` reads (`$1` `value`, `$2` now).
            async fn journal_rows(
                &self,
                statement: &'static str,
                value: impl for<'q> sqlx::Encode<'q, <$conn as sqlx::Connection>::Database>
                    + sqlx::Type<<$conn as sqlx::Connection>::Database>
                    + Send,
                now_ms: u64,
            ) -> Result<Vec<$crate::journal::Event>, $crate::error::StoreError> {
                use $crate::store::sql::{driver, int};
                let rows: Vec<String> = sqlx::query_scalar(statement)
                    .bind(value)
                    .bind(int(now_ms)?)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(driver)?;
                rows.iter()
                    .map(|text| $crate::journal::decode(text.as_bytes()))
                    .collect()
            }

            /// Why a fenced update of the entry `call_id` changed nothing: it is gone (`NotFound`), or
            /// another worker took it (`Fenced`).
            async fn entry_refusal(
                &self,
                call_id: &$crate::call_id::CallId,
                fence: $crate::receipt::Fence,
            ) -> $crate::error::StoreError {
                use $crate::store::sql::{driver, TAKER};
                let taker: Result<Option<i64>, _> = sqlx::query_scalar(TAKER)
                    .bind(call_id.to_string())
                    .fetch_optional(&self.pool)
                    .await;
                match taker {
                    Err(e) => driver(e),
                    Ok(None) => $crate::error::StoreError::NotFound,
                    Ok(Some(current)) => $crate::error::StoreError::Fenced {
                        presented: fence.0,
                        current: u64::try_from(current).unwrap_or(0),
                    },
                }
            }

            /// The key's row on `conn`, whatever its expiry (`None` for no row or a released one).
            async fn row_on(
                conn: &mut $conn,
                key: &$crate::key::Key,
            ) -> Result<Option<$crate::receipt::Receipt>, $crate::error::StoreError> {
                let row = sqlx::query(Self::KEY_ROW_SQL)
                    .bind(key.digest().as_slice())
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err($crate::store::sql::driver)?;
                match row {
                    Some(row) => $crate::store::sql::receipt(&row),
                    None => Ok(None),
                }
            }

            /// Runs `sql`, an update of the key's row (`$1`) held under `fence` (`$2`); answers
            /// whether it changed it.
            async fn fenced(
                &self,
                sql: &'static str,
                key: &$crate::key::Key,
                fence: $crate::receipt::Fence,
            ) -> Result<bool, $crate::error::StoreError> {
                use $crate::store::sql::{driver, int};
                let done = sqlx::query(sql)
                    .bind(key.digest().as_slice())
                    .bind(int(fence.0)?)
                    .execute(&self.pool)
                    .await
                    .map_err(driver)?;
                Ok(done.rows_affected() == 1)
            }

            /// The key's row, whatever its expiry.
            async fn row(
                &self,
                key: &$crate::key::Key,
            ) -> Result<Option<$crate::receipt::Receipt>, $crate::error::StoreError> {
                let mut conn = self
                    .pool
                    .acquire()
                    .await
                    .map_err($crate::store::sql::driver)?;
                Self::row_on(&mut conn, key).await
            }

            /// Writes a completion on `conn`: a pooled connection, or the caller's transaction.
            async fn complete_on(
                conn: &mut $conn,
                key: &$crate::key::Key,
                fence: $crate::receipt::Fence,
                completion: $crate::store::Completion,
                now_ms: u64,
            ) -> Result<$crate::receipt::Transition, $crate::error::StoreError> {
                use $crate::store::already_or_not_owned;
                use $crate::store::sql::{driver, int};
                let done = sqlx::query(Self::COMPLETE_SQL)
                    .bind(completion.state.as_str())
                    .bind(completion.outcome.as_deref())
                    .bind(int(completion.ttl_ms)?)
                    .bind(int(now_ms)?)
                    .bind(key.digest().as_slice())
                    .bind(int(fence.0)?)
                    .execute(&mut *conn)
                    .await
                    .map_err(driver)?;
                if done.rows_affected() == 1 {
                    return Ok($crate::receipt::Transition::Applied);
                }
                let current = Self::row_on(conn, key).await?;
                already_or_not_owned(current.as_ref(), fence, completion.state)
            }
        }

        #[::async_trait::async_trait]
        impl $crate::store::Store for $store {
            async fn claim(
                &self,
                claim: $crate::store::Claim,
            ) -> Result<$crate::store::Claimed, $crate::error::StoreError> {
                self.claim_row(claim).await
            }

            async fn take_over(
                &self,
                key: &$crate::key::Key,
                expected: $crate::receipt::Fence,
                lease_ms: u64,
                now_ms: u64,
            ) -> Result<$crate::store::Claimed, $crate::error::StoreError> {
                use $crate::store::sql::{driver, fence_of, int};
                use $crate::store::Claimed;
                // `fetch_all`: on SQLite a statement commits when it runs to its end, and only then is
                // a failed commit reported.
                let taken: Vec<i64> = sqlx::query_scalar(Self::TAKE_OVER_SQL)
                    .bind(int(lease_ms)?)
                    .bind(int(now_ms)?)
                    .bind(key.digest().as_slice())
                    .bind(int(expected.0)?)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(driver)?;
                match taken.first() {
                    Some(&fence) => Ok(Claimed::Acquired(fence_of(fence)?)),
                    None => match self.row(key).await? {
                        Some(record) => Ok(Claimed::Existing(record)),
                        None => Err($crate::error::StoreError::NotFound),
                    },
                }
            }

            async fn extend_lease(
                &self,
                key: &$crate::key::Key,
                fence: $crate::receipt::Fence,
                lease_ms: u64,
                now_ms: u64,
            ) -> Result<(), $crate::error::StoreError> {
                use $crate::store::not_owned;
                use $crate::store::sql::{driver, int};
                let done = sqlx::query(Self::EXTEND_LEASE_SQL)
                    .bind(int(lease_ms)?)
                    .bind(key.digest().as_slice())
                    .bind(int(fence.0)?)
                    .bind(int(now_ms)?)
                    .execute(&self.pool)
                    .await
                    .map_err(driver)?;
                if done.rows_affected() == 1 {
                    return Ok(());
                }
                let current = self.row(key).await?;
                Err(not_owned(
                    current.as_ref(),
                    fence,
                    $crate::receipt::ReceiptState::Processing,
                ))
            }

            async fn complete(
                &self,
                key: &$crate::key::Key,
                fence: $crate::receipt::Fence,
                completion: $crate::store::Completion,
                now_ms: u64,
            ) -> Result<$crate::receipt::Transition, $crate::error::StoreError> {
                let mut conn = self
                    .pool
                    .acquire()
                    .await
                    .map_err($crate::store::sql::driver)?;
                Self::complete_on(&mut conn, key, fence, completion, now_ms).await
            }

            async fn mark_unknown(
                &self,
                key: &$crate::key::Key,
                fence: $crate::receipt::Fence,
                now_ms: u64,
            ) -> Result<$crate::receipt::Transition, $crate::error::StoreError> {
                use $crate::store::already_or_not_owned;
                use $crate::store::sql::{driver, int};
                let done = sqlx::query(Self::MARK_UNKNOWN_SQL)
                    .bind(int(now_ms)?)
                    .bind(key.digest().as_slice())
                    .bind(int(fence.0)?)
                    .execute(&self.pool)
                    .await
                    .map_err(driver)?;
                if done.rows_affected() == 1 {
                    return Ok($crate::receipt::Transition::Applied);
                }
                let current = self.row(key).await?;
                already_or_not_owned(
                    current.as_ref(),
                    fence,
                    $crate::receipt::ReceiptState::Unknown,
                )
            }

            async fn release(
                &self,
                key: &$crate::key::Key,
                fence: $crate::receipt::Fence,
            ) -> Result<(), $crate::error::StoreError> {
                use $crate::store::not_owned;
                if self.fenced($crate::store::sql::RELEASE, key, fence).await? {
                    return Ok(());
                }
                match self.row(key).await? {
                    None => Ok(()),
                    Some(current) => Err(not_owned(
                        Some(&current),
                        fence,
                        $crate::receipt::ReceiptState::Received,
                    )),
                }
            }

            fn kind(&self) -> &'static str {
                $kind
            }

            async fn forget(
                &self,
                key: &$crate::key::Key,
                fence: $crate::receipt::Fence,
            ) -> Result<(), $crate::error::StoreError> {
                use $crate::store::not_owned;
                if self.fenced($crate::store::sql::FORGET, key, fence).await? {
                    return Ok(());
                }
                Err(not_owned(
                    self.row(key).await?.as_ref(),
                    fence,
                    $crate::receipt::ReceiptState::Received,
                ))
            }

            async fn get(
                &self,
                key: &$crate::key::Key,
                now_ms: u64,
            ) -> Result<Option<$crate::receipt::Receipt>, $crate::error::StoreError> {
                use $crate::store::sql::{driver, int, receipt};
                let row = sqlx::query(Self::LIVE_ROW_SQL)
                    .bind(key.digest().as_slice())
                    .bind(int(now_ms)?)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(driver)?;
                match row {
                    Some(row) => receipt(&row),
                    None => Ok(None),
                }
            }

            $(
                async fn wait_settled(
                    &self,
                    key: &$crate::key::Key,
                    timeout: ::std::time::Duration,
                    now_ms: u64,
                ) -> Result<Option<$crate::receipt::Receipt>, $crate::error::StoreError> {
                    self.$wait(key, timeout, now_ms).await
                }
            )?

            fn clock(&self) -> $crate::store::StoreClock {
                $crate::store::StoreClock::$clock
            }

            async fn now_ms(&self, caller_now_ms: u64) -> Result<u64, $crate::error::StoreError> {
                use $crate::store::sql::{driver, int};
                if $crate::store::StoreClock::$clock == $crate::store::StoreClock::Caller {
                    return Ok(caller_now_ms);
                }
                let now: i64 = sqlx::query_scalar(Self::NOW_SQL)
                    .bind(int(caller_now_ms)?)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(driver)?;
                u64::try_from(now).map_err(|_| {
                    $crate::error::StoreError::Corrupt(format!("the store's time is {now}"))
                })
            }

            async fn get_by_call_id(
                &self,
                call_id: &$crate::call_id::CallId,
            ) -> Result<Option<$crate::receipt::Receipt>, $crate::error::StoreError> {
                use $crate::store::sql::{driver, receipt};
                let row = sqlx::query(Self::BY_CALL_ID_SQL)
                    .bind(call_id.to_string())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(driver)?;
                match row {
                    Some(row) => receipt(&row),
                    None => Ok(None),
                }
            }

            async fn get_by_call_ids(
                &self,
                call_ids: &[$crate::call_id::CallId],
            ) -> Result<Vec<$crate::receipt::Receipt>, $crate::error::StoreError> {
                use $crate::store::sql::{driver, receipt};
                if call_ids.is_empty() {
                    return Ok(Vec::new());
                }
                let ids: Vec<&str> = call_ids.iter().map(|c| c.as_str()).collect();
                let list = serde_json::to_string(&ids)
                    .map_err(|e| $crate::error::StoreError::Corrupt(e.to_string()))?;
                let rows = sqlx::query(Self::BY_CALL_IDS_SQL)
                    .bind(list)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(driver)?;
                rows.iter()
                    .filter_map(|row| receipt(row).transpose())
                    .collect()
            }

            async fn purge_expired(&self, now_ms: u64) -> Result<usize, $crate::error::StoreError> {
                use $crate::store::sql::{driver, int};
                let done = sqlx::query(Self::PURGE_SQL)
                    .bind(int(now_ms)?)
                    .execute(&self.pool)
                    .await
                    .map_err(driver)?;
                sqlx::query(Self::PURGE_JOURNAL_SQL)
                    .bind(int(now_ms)?)
                    .execute(&self.pool)
                    .await
                    .map_err(driver)?;
                Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
            }

            async fn count_expired(&self, now_ms: u64) -> Result<usize, $crate::error::StoreError> {
                use $crate::store::sql::{driver, int};
                let count: i64 = sqlx::query_scalar(Self::COUNT_EXPIRED_SQL)
                    .bind(int(now_ms)?)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(driver)?;
                Ok(usize::try_from(count).unwrap_or(0))
            }

            async fn list_receipts(
                &self,
                query: &$crate::store::ReceiptQuery,
                now_ms: u64,
            ) -> Result<$crate::store::ReceiptPage, $crate::error::StoreError> {
                use $crate::store::sql::{bound, driver, int, receipt};
                let limit = query.limit.max(1);
                // The position to start after, as one row value the index range starts at: the
                // cursor, or just before the range (no 32-byte digest is above all-ones).
                let (after_ms, after_key) = match &query.after {
                    Some(c) if c.created_ms >= query.since_ms => {
                        (int(c.created_ms)?, c.digest.to_vec())
                    }
                    _ => (bound(query.since_ms) - 1, vec![0xff; 32]),
                };
                let statement = match query.scope {
                    Some(_) => Self::LIST_SCOPE_SQL,
                    None => Self::LIST_SQL,
                };
                let mut listing = sqlx::query(statement)
                    .bind(bound(query.until_ms))
                    .bind(int(now_ms)?)
                    .bind(after_ms)
                    .bind(after_key)
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX));
                if let Some(scope) = &query.scope {
                    listing = listing.bind(scope.as_str());
                }
                let rows = listing.fetch_all(&self.pool).await.map_err(driver)?;
                let mut read = rows
                    .iter()
                    .filter_map(|row| receipt(row).transpose())
                    .collect::<Result<Vec<_>, _>>()?;
                let next = (rows.len() == limit)
                    .then(|| read.last().map($crate::store::Cursor::of))
                    .flatten();
                read.retain(|r| query.admits(r));
                Ok($crate::store::ReceiptPage {
                    receipts: read,
                    next,
                })
            }

            async fn list_orphans(
                &self,
                now_ms: u64,
                limit: usize,
            ) -> Result<Vec<$crate::receipt::Receipt>, $crate::error::StoreError> {
                use $crate::store::sql::{driver, int, receipt};
                let rows = sqlx::query(Self::ORPHANS_SQL)
                    .bind(int(now_ms)?)
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(driver)?;
                rows.iter()
                    .filter_map(|row| receipt(row).transpose())
                    .collect()
            }

            async fn enqueue_compensation(
                &self,
                entry: $crate::compensation::CompensationEntry,
            ) -> Result<(), $crate::error::StoreError> {
                use $crate::store::sql::{driver, int};
                sqlx::query(Self::ENQUEUE_SQL)
                    .bind(entry.call_id.to_string())
                    .bind(entry.key.digest().as_slice())
                    .bind(entry.key.scope())
                    .bind(&entry.reason)
                    .bind(i64::from(entry.round))
                    .bind(int(entry.next_at_ms)?)
                    .bind(int(entry.enqueued_ms)?)
                    .bind(i64::from(entry.attempts))
                    .bind(entry.last_error.map($crate::store::sql::outcome_name))
                    .bind(entry.encoded_inputs.as_deref())
                    .execute(&self.pool)
                    .await
                    .map_err(driver)?;
                Ok(())
            }

            async fn take_due_compensations(
                &self,
                now_ms: u64,
                limit: usize,
                lease_ms: u64,
            ) -> Result<Vec<$crate::compensation::CompensationEntry>, $crate::error::StoreError>
            {
                use $crate::store::sql::{compensation, driver, int};
                let rows = sqlx::query(Self::TAKE_DUE_SQL)
                    .bind(int(lease_ms)?)
                    .bind(int(now_ms)?)
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(driver)?;
                let mut taken = rows
                    .iter()
                    .map(compensation)
                    .collect::<Result<Vec<_>, _>>()?;
                taken.sort_by_key(|e| (e.next_at_ms, e.enqueued_ms));
                Ok(taken)
            }

            async fn reschedule_compensation(
                &self,
                call_id: &$crate::call_id::CallId,
                fence: $crate::receipt::Fence,
                round: u32,
                delay_ms: u64,
                now_ms: u64,
            ) -> Result<(), $crate::error::StoreError> {
                use $crate::store::sql::{driver, int};
                let done = sqlx::query(Self::RESCHEDULE_SQL)
                    .bind(i64::from(round))
                    .bind(int(now_ms)?)
                    .bind(int(delay_ms)?)
                    .bind(call_id.to_string())
                    .bind(int(fence.0)?)
                    .execute(&self.pool)
                    .await
                    .map_err(driver)?;
                if done.rows_affected() == 0 {
                    return Err(self.entry_refusal(call_id, fence).await);
                }
                Ok(())
            }

            async fn finish_compensation(
                &self,
                call_id: &$crate::call_id::CallId,
                fence: Option<$crate::receipt::Fence>,
            ) -> Result<(), $crate::error::StoreError> {
                use $crate::store::sql::{driver, int, FINISH};
                let done = sqlx::query(FINISH)
                    .bind(call_id.to_string())
                    .bind(fence.map(|f| int(f.0)).transpose()?)
                    .execute(&self.pool)
                    .await
                    .map_err(driver)?;
                match fence {
                    Some(fence) if done.rows_affected() == 0 => {
                        match self.entry_refusal(call_id, fence).await {
                            // Gone already: finishing it again changes nothing.
                            $crate::error::StoreError::NotFound => Ok(()),
                            refused => Err(refused),
                        }
                    }
                    _ => Ok(()),
                }
            }

            async fn escalate_compensation(
                &self,
                call_id: &$crate::call_id::CallId,
                fence: $crate::receipt::Fence,
                now_ms: u64,
            ) -> Result<(), $crate::error::StoreError> {
                use $crate::store::sql::{driver, int};
                let done = sqlx::query(Self::ESCALATE_SQL)
                    .bind(int(now_ms)?)
                    .bind(call_id.to_string())
                    .bind(int(fence.0)?)
                    .execute(&self.pool)
                    .await
                    .map_err(driver)?;
                if done.rows_affected() == 0 {
                    return Err(self.entry_refusal(call_id, fence).await);
                }
                Ok(())
            }

            async fn list_compensations(
                &self,
            ) -> Result<Vec<$crate::compensation::CompensationEntry>, $crate::error::StoreError>
            {
                use $crate::store::sql::{compensation, driver};
                let rows = sqlx::query(Self::LIST_COMPENSATIONS_SQL)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(driver)?;
                rows.iter().map(compensation).collect()
            }

            async fn append_journal(
                &self,
                key: &$crate::key::Key,
                events: &[$crate::journal::Event],
                keep_ms: u64,
                now_ms: u64,
            ) -> Result<(), $crate::error::StoreError> {
                if events.is_empty() {
                    return Ok(());
                }
                self.append_rows(key, events, keep_ms, now_ms).await
            }

            async fn journal(
                &self,
                key: &$crate::key::Key,
                now_ms: u64,
            ) -> Result<Vec<$crate::journal::Event>, $crate::error::StoreError> {
                self.journal_rows(Self::JOURNAL_BY_KEY_SQL, key.digest().to_vec(), now_ms).await
            }

            async fn journaled_keys(
                &self,
                after: Option<[u8; 32]>,
                limit: usize,
            ) -> Result<Vec<$crate::key::Key>, $crate::error::StoreError> {
                use $crate::store::sql::{driver, JOURNALED_KEYS};
                let after = after.map_or_else(Vec::new, |d| d.to_vec());
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                let rows: Vec<Vec<u8>> = sqlx::query_scalar(JOURNALED_KEYS)
                    .bind(after)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(driver)?;
                rows.into_iter()
                    .map(|digest| {
                        let digest: [u8; 32] = digest.as_slice().try_into().map_err(|_| {
                            $crate::error::StoreError::Corrupt(format!(
                                "a journal key of {} bytes, not 32",
                                digest.len()
                            ))
                        })?;
                        Ok($crate::key::Key::from_digest("", digest))
                    })
                    .collect()
            }

            async fn journal_of_call(
                &self,
                call_id: &$crate::call_id::CallId,
                now_ms: u64,
            ) -> Result<Vec<$crate::journal::Event>, $crate::error::StoreError> {
                self.journal_rows(Self::JOURNAL_BY_CALL_SQL, call_id.to_string(), now_ms).await
            }
        }
    };
}

pub(crate) use sql_store;

/// A statement as its meaning is compared: `--` comments dropped, every run of whitespace one space,
/// none inside parentheses, trimmed. Quoted text (`'…'`) is kept as it is.
#[cfg(test)]
pub(crate) fn normalized(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    let mut quoted = false;
    let mut space = false;
    while let Some(c) = chars.next() {
        if quoted {
            out.push(c);
            quoted = c != '\'';
            continue;
        }
        if c == '-' && chars.peek() == Some(&'-') {
            for c in chars.by_ref() {
                if c == '\n' {
                    break;
                }
            }
            space = true;
            continue;
        }
        if c.is_whitespace() {
            space = true;
            continue;
        }
        if space && !out.is_empty() && !out.ends_with('(') && c != ')' {
            out.push(' ');
        }
        space = false;
        quoted = c == '\'';
        out.push(c);
    }
    out
}

/// The names of the `.sql` files under `dir` (relative to this crate), to check that a comparison
/// covers every one.
#[cfg(test)]
pub(crate) fn sql_files(dir: &str) -> std::collections::BTreeSet<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut names = std::collections::BTreeSet::new();
    let mut todo = vec![dir.clone()];
    while let Some(at) = todo.pop() {
        for entry in std::fs::read_dir(&at).expect("a folder of statements") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "sql") {
                let name = path.strip_prefix(&dir).expect("under the folder");
                names.insert(name.to_string_lossy().into_owned());
            }
        }
    }
    names
}

#[cfg(test)]
mod normalized_tests {
    use super::normalized;

    #[test]
    fn comments_and_whitespace_only() {
        assert_eq!(
            normalized("-- what it does\nSELECT a,\n    b -- why\nFROM t WHERE x IN ( 'a  b' )\n"),
            "SELECT a, b FROM t WHERE x IN ('a  b')"
        );
        assert_ne!(normalized("SELECT a"), normalized("SELECT b"));
        assert_ne!(normalized("'x  y'"), normalized("'x y'"));
    }
}
