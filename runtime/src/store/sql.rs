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
use crate::key::{Fingerprint, Key};
use crate::receipt::{Fence, Receipt, ReceiptState, Transition};

/// The state written for a released claim: a tombstone that reads as "no record".
pub(crate) const RELEASED: &str = "RELEASED";

/// The columns of a receipt row, in `SELECT` order.
pub(crate) const RECEIPT_COLUMNS: &str =
    "key, scope, call_id, state, fence, lease_until, expires_at, fingerprint, outcome, created, updated";

/// The columns of a compensation row, in `SELECT` order.
pub(crate) const COMPENSATION_COLUMNS: &str =
    "call_id, key, scope, reason, round, next_at, state, lease_until, enqueued";

/// A `u64` as the `BIGINT` the databases store.
pub(crate) fn int(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{v} does not fit a BIGINT")))
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

/// Reads a receipt row (columns as in [`RECEIPT_COLUMNS`]); `Ok(None)` for a released tombstone.
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

/// Reads a compensation row (columns as in [`COMPENSATION_COLUMNS`]).
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
    Ok(CompensationEntry {
        call_id: call_id_of(&call_id)?,
        key: key_of(&digest, scope)?,
        reason: row.try_get("reason").map_err(driver)?,
        round: u32::try_from(round)
            .map_err(|_| StoreError::Corrupt(format!("compensation round {round}")))?,
        next_at_ms: uint(row.try_get("next_at").map_err(driver)?, "due time")?,
        state,
        enqueued_ms: uint(row.try_get("enqueued").map_err(driver)?, "enqueue time")?,
    })
}

/// A fence read back from a `BIGINT`.
pub(crate) fn fence_of(v: i64) -> Result<Fence, StoreError> {
    u64::try_from(v)
        .map(Fence)
        .map_err(|_| StoreError::Corrupt(format!("negative fence {v}")))
}

/// `NotFound` when an update of a compensation entry changed no row.
pub(crate) fn found(rows: u64) -> Result<(), StoreError> {
    if rows == 0 {
        Err(StoreError::NotFound)
    } else {
        Ok(())
    }
}

/// Why a write that needs `PROCESSING` under `fence` changed no row: no record, another fence, or
/// another state.
pub(crate) fn not_owned(current: Option<&Receipt>, fence: Fence, to: ReceiptState) -> StoreError {
    match current {
        None => StoreError::NotFound,
        Some(current) if current.fence != fence => StoreError::Fenced {
            presented: fence.0,
            current: current.fence.0,
        },
        Some(current) => StoreError::InvalidTransition {
            from: current.state,
            to,
        },
    }
}

/// Why a fenced write changed no row, from the row as it is (`None`: no live record): the same answer
/// the in-memory store gives.
pub(crate) fn refusal(
    current: Option<&Receipt>,
    fence: Fence,
    target: ReceiptState,
) -> Result<Transition, StoreError> {
    let Some(current) = current else {
        return Err(StoreError::NotFound);
    };
    if current.fence != fence {
        return Err(StoreError::Fenced {
            presented: fence.0,
            current: current.fence.0,
        });
    }
    match current.state.advance(target) {
        Ok(Transition::AlreadyApplied) => Ok(Transition::AlreadyApplied),
        // The write's own condition would have applied it: the row changed in between. Report what is
        // there now as a refusal rather than guess.
        Ok(Transition::Applied) => Err(StoreError::InvalidTransition {
            from: current.state,
            to: target,
        }),
        Err(e) => Err(StoreError::InvalidTransition {
            from: e.from,
            to: e.to,
        }),
    }
}

/// The states `UNKNOWN` may be written over.
pub(crate) const UNDECIDED: &str = "('RECEIVED', 'PROCESSING')";
