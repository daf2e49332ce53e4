//! The rows of the SQL stores read back: the columns of a stored receipt or compensation entry, their
//! checked conversion into the contract's types (a corrupted or foreign row is a
//! [`StoreError::Corrupt`], never a panic), the values bound in their place, and the mapping of driver
//! errors.

use std::sync::Arc;

use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::call_id::CallId;
use crate::compensation::{CompensationEntry, CompensationState};
use crate::error::StoreError;
use crate::journal::AttemptOutcome;
use crate::key::{Fingerprint, Key};
use crate::receipt::{Fence, Receipt, ReceiptState};

/// The state written for a released claim: a tombstone that reads as "no record".
const RELEASED: &str = "RELEASED";

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

/// Reads a receipt row (`key, scope, call_id, state, fence, lease_until, expires_at, fingerprint,
/// outcome, created, updated`, times in Unix ms, as every statement that answers receipts selects
/// them); `Ok(None)` for a released tombstone.
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

/// Reads a compensation row (`call_id, key, scope, reason, round, next_at, state, lease_until,
/// enqueued, taker, attempts, last_error, inputs`, times in Unix ms, as every statement that answers
/// entries selects them).
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
