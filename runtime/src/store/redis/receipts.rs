//! The receipts on Redis: a key's record is the hash `samekey:r:{<digest>}`, and every transition of it
//! is one server-side script on that one key — the claim, the take-over, the owner's fenced writes
//! (lease, outcome, `UNKNOWN`, release, forget) — as are the reads that judge its expiry by the
//! server's clock; a waiter on a single server is woken by the script that settles the record. The
//! cache entries of a [`CachedStore`](super::CachedStore) are written here too.

use std::time::Duration;

use futures_util::StreamExt;
use redis::AsyncCommands;

use super::index::Unindexed;
use super::scripts::{
    answer_code, answer_fence, answer_fields, answer_items, answer_number, number, optional_number,
    text,
};
use super::{corrupt, unavailable, RedisStore};
use crate::call_id::CallId;
use crate::error::StoreError;
use crate::key::{Fingerprint, Key};
use crate::receipt::{Fence, Receipt, ReceiptState, Transition};
#[cfg(doc)]
use crate::store::Store;
use crate::store::{already_or_not_owned, not_owned, Claim, Claimed, Completion};

/// How long after its `expires_at` Redis drops a finished record by itself.
const EXPIRY_GRACE_MS: u64 = 60_000;

impl RedisStore {
    /// [`Store::claim`]: the `CLAIM` script; a claim that takes the key writes its index entries soon.
    pub(super) async fn claim_record(&self, claim: Claim) -> Result<Claimed, StoreError> {
        let mut invocation = self.scripts.claim.key(self.record_key(&claim.key));
        invocation
            .arg(claim.key.scope())
            .arg(claim.call_id.to_string())
            .arg(claim.lease_ms)
            .arg(
                claim
                    .fingerprint
                    .as_ref()
                    .map(|f| f.0.to_vec())
                    .unwrap_or_default(),
            )
            .arg(claim.key.digest().as_slice());
        let answer: redis::Value = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if answer_code(&answer)? == 1 {
            let fence = answer_fence(&answer)?;
            let created_ms = answer_number(&answer, 2, "creation time")?;
            let entry = Unindexed {
                call_id: claim.call_id,
                created_ms,
            };
            self.index_soon(&claim.key, entry);
            return Ok(Claimed::Acquired(fence));
        }
        match parse_record(claim.key.scope(), &answer_fields(&answer)?)? {
            Some(record) => {
                if record.call_id == claim.call_id {
                    // This claim's own record: the client sent the script again after a reset, once
                    // the first had taken the key. Its indexes were never written; the call may own it.
                    let entry = Unindexed {
                        call_id: claim.call_id,
                        created_ms: record.created_ms,
                    };
                    self.index_soon(&claim.key, entry);
                }
                Ok(Claimed::Existing(record))
            }
            None => Err(StoreError::Unavailable(
                "the key's record changed during the claim".into(),
            )),
        }
    }

    /// [`Store::take_over`] (or, `finished`, [`Store::reopen`]): the `TAKE_OVER` script.
    pub(super) async fn take_over_record(
        &self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        finished: bool,
    ) -> Result<Claimed, StoreError> {
        let answer: redis::Value = self
            .scripts
            .take_over
            .key(self.record_key(key))
            .arg(expected.0.to_string())
            .arg(lease_ms)
            .arg(if finished { "finished" } else { "" })
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        match answer_code(&answer)? {
            1 => {
                let fence = answer_fence(&answer)?;
                // The record may never have been indexed (its owner died before its first write).
                if let Some(redis::Value::BulkString(id)) = answer_items(&answer)?.get(2) {
                    let call_id = text(id, "callId")?.parse().map_err(corrupt)?;
                    let created_ms = answer_number(&answer, 3, "creation time")?;
                    let entry = Unindexed {
                        call_id,
                        created_ms,
                    };
                    self.index_later(key, entry);
                }
                Ok(Claimed::Acquired(fence))
            }
            -1 => Err(StoreError::NotFound),
            _ => match parse_record(key.scope(), &answer_fields(&answer)?)? {
                Some(record) => Ok(Claimed::Existing(record)),
                None => Err(StoreError::NotFound),
            },
        }
    }

    /// [`Store::extend_lease`]: a fenced write of the lease.
    pub(super) async fn extend_record_lease(
        &self,
        key: &Key,
        fence: Fence,
        lease_ms: u64,
    ) -> Result<(), StoreError> {
        let times = format!("lease_until:{lease_ms}");
        self.write(key, fence, "PROCESSING", "", &times, &[])
            .await?
            .map_err(|current| not_owned(current.as_ref(), fence, ReceiptState::Processing))
    }

    /// [`Store::complete`]: a fenced write of the outcome, the record kept a while past its expiry.
    pub(super) async fn complete_record(
        &self,
        key: &Key,
        fence: Fence,
        completion: Completion,
    ) -> Result<Transition, StoreError> {
        let keep = completion.ttl_ms.saturating_add(EXPIRY_GRACE_MS).max(1);
        let fields = [
            ("state", completion.state.as_str().as_bytes().to_vec()),
            (
                "outcome",
                completion.outcome.as_deref().unwrap_or_default().to_vec(),
            ),
            ("lease_until", Vec::new()),
        ];
        let times = format!("updated:0 expires_at:{}", completion.ttl_ms);
        match self
            .write(
                key,
                fence,
                "RECEIVED PROCESSING UNKNOWN",
                &keep.to_string(),
                &times,
                &fields,
            )
            .await?
        {
            Ok(()) => Ok(Transition::Applied),
            Err(current) => already_or_not_owned(current.as_ref(), fence, completion.state),
        }
    }

    /// [`Store::mark_unknown`]: a fenced write of `UNKNOWN`, without expiry.
    pub(super) async fn mark_record_unknown(
        &self,
        key: &Key,
        fence: Fence,
    ) -> Result<Transition, StoreError> {
        let fields = [
            ("state", b"UNKNOWN".to_vec()),
            ("lease_until", Vec::new()),
            ("expires_at", Vec::new()),
        ];
        match self
            .write(key, fence, "RECEIVED PROCESSING", "0", "updated:0", &fields)
            .await?
        {
            Ok(()) => Ok(Transition::Applied),
            Err(current) => already_or_not_owned(current.as_ref(), fence, ReceiptState::Unknown),
        }
    }

    /// [`Store::release`]: a claim given back (a tombstone).
    pub(super) async fn release_record(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        match self.mark_released(key, fence, "PROCESSING").await? {
            Ok(()) | Err(None) => Ok(()),
            Err(current) => Err(not_owned(current.as_ref(), fence, ReceiptState::Received)),
        }
    }

    /// [`Store::forget`]: a finished record given back (a tombstone).
    pub(super) async fn forget_record(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        match self.mark_released(key, fence, "SUCCESS FAILED").await? {
            Ok(()) => Ok(()),
            Err(current) => Err(not_owned(current.as_ref(), fence, ReceiptState::Received)),
        }
    }

    /// [`Store::wait_settled`] (see the method's documentation on [`RedisStore`]).
    pub(super) async fn wait_record_settled(
        &self,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        let Some(client) = &self.client else {
            return crate::store::poll_settled(self, key, timeout, now_ms).await;
        };
        let mut subscription =
            tokio::time::timeout(Duration::from_secs(2), client.get_async_pubsub())
                .await
                .map_err(|_| StoreError::Unavailable("no Redis connection within 2s".into()))?
                .map_err(unavailable)?;
        subscription
            .subscribe(format!("{}:settled", self.record_key(key)))
            .await
            .map_err(unavailable)?;
        let record = self.read(key, "wait").await?;
        if record
            .as_ref()
            .is_none_or(|r| r.state != ReceiptState::Processing)
        {
            return Ok(record);
        }
        {
            let mut messages = std::pin::pin!(subscription.on_message());
            // A message, a lost connection or the end of the wait: look again either way.
            let _ = tokio::time::timeout(timeout, messages.next()).await;
        }
        drop(subscription);
        self.read(key, "").await
    }

    /// [`Store::now_ms`]: the server's clock (`TIME`).
    pub(super) async fn server_time_ms(&self) -> Result<u64, StoreError> {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// [`Store::get_by_call_id`]: the key from the callId index, then its record.
    pub(super) async fn record_of_call(
        &self,
        call_id: &CallId,
    ) -> Result<Option<Receipt>, StoreError> {
        let Some(key) = self.key_of_call(call_id).await? else {
            return Ok(None);
        };
        Ok(self.record(&key).await?.filter(|r| &r.call_id == call_id))
    }

    pub(super) async fn record(&self, key: &Key) -> Result<Option<Receipt>, StoreError> {
        let fields: Vec<(String, Vec<u8>)> = self
            .conn()
            .hgetall(self.record_key(key))
            .await
            .map_err(unavailable)?;
        parse_record(key.scope(), &fields)
    }

    /// A fenced write through the `WRITE` script: `Ok(true)` if applied, else the record (or `None`) as
    /// it is, to explain the refusal.
    async fn write(
        &self,
        key: &Key,
        fence: Fence,
        from: &str,
        expiry: &str,
        times: &str,
        fields: &[(&str, Vec<u8>)],
    ) -> Result<Result<(), Option<Receipt>>, StoreError> {
        let mut invocation = self.scripts.write.key(self.record_key(key));
        invocation.key(self.journal_key(key));
        invocation
            .arg(fence.0.to_string())
            .arg(from)
            .arg(expiry)
            .arg(times);
        for (name, value) in fields {
            invocation.arg(*name).arg(value.as_slice());
        }
        // Left waiting until known written: a write that fails, or is dropped mid-way (a lease's
        // renewal dropped as its work ends), leaves it for the key's next write.
        let unindexed = self
            .unindexed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key.digest())
            .cloned();
        let answer = match unindexed {
            None => invocation
                .invoke_async(&mut self.conn())
                .await
                .map_err(unavailable)?,
            Some(entry) => {
                // Keys of several slots: sent together, not as one pipeline, so that a cluster can
                // route each; on one server they still share the round trip.
                let indexed = self.send_index(key.digest(), &entry);
                let mut conn = self.conn();
                let written = invocation.invoke_async::<redis::Value>(&mut conn);
                let (indexed, written) = tokio::join!(indexed, written);
                if indexed.is_ok() {
                    self.indexed(key.digest(), &entry);
                }
                indexed.map_err(unavailable)?;
                written.map_err(unavailable)?
            }
        };
        match answer_code(&answer)? {
            1 => Ok(Ok(())),
            -1 => Ok(Err(None)),
            _ => Ok(Err(parse_record(key.scope(), &answer_fields(&answer)?)?)),
        }
    }

    /// The record of `key` unless it expired by the server's clock, through the `READ` script
    /// (`mode` = `wait` also marks a `PROCESSING` record waited-for).
    pub(super) async fn read(&self, key: &Key, mode: &str) -> Result<Option<Receipt>, StoreError> {
        let (now, record) = self.read_at(key, mode).await?;
        Ok(record.filter(|r| !r.expired(now)))
    }

    /// A record as it is, whatever its expiry, and the server's time it was read at.
    pub(super) async fn read_at(
        &self,
        key: &Key,
        mode: &str,
    ) -> Result<(u64, Option<Receipt>), StoreError> {
        let answer: redis::Value = self
            .scripts
            .read
            .key(self.record_key(key))
            .arg(mode)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let now = match answer_items(&answer)?.first() {
            Some(redis::Value::BulkString(now)) => number(now, "the server's time")?,
            other => return Err(corrupt(format!("unexpected time {other:?}"))),
        };
        Ok((now, parse_record(key.scope(), &answer_fields(&answer)?)?))
    }

    /// Marks the record of `key` held under `fence` in one of the states `from` (space-separated)
    /// `RELEASED`, kept a day as a tombstone: a release, or a forget. The refusal as [`Self::write`]
    /// explains it.
    async fn mark_released(
        &self,
        key: &Key,
        fence: Fence,
        from: &str,
    ) -> Result<Result<(), Option<Receipt>>, StoreError> {
        let fields = [
            ("state", b"RELEASED".to_vec()),
            ("lease_until", Vec::new()),
            ("outcome", Vec::new()),
        ];
        let day = (24 * 3600 * 1000u64).to_string();
        self.write(key, fence, from, &day, "", &fields).await
    }

    /// Deletes the cache entry of `key` (its callId index entry expires by itself, and finds no record).
    pub(super) async fn cache_forget(&self, key: &Key) -> Result<(), StoreError> {
        self.conn()
            .del::<_, ()>(self.record_key(key))
            .await
            .map_err(unavailable)
    }

    /// Writes a finished receipt as a cache entry (record and callId index), expiring with it.
    pub(super) async fn cache_put(&self, receipt: &Receipt, keep: u64) -> Result<(), StoreError> {
        let Some(expires_at) = receipt.expires_at_ms else {
            return Ok(());
        };
        let record = self.record_key(&receipt.key);
        let fields: Vec<(&str, Vec<u8>)> = vec![
            ("digest", receipt.key.digest().to_vec()),
            ("scope", receipt.key.scope().as_bytes().to_vec()),
            ("call_id", receipt.call_id.to_string().into_bytes()),
            ("state", receipt.state.as_str().as_bytes().to_vec()),
            ("fence", receipt.fence.0.to_string().into_bytes()),
            ("expires_at", expires_at.to_string().into_bytes()),
            (
                "fingerprint",
                receipt
                    .fingerprint
                    .map(|f| f.0.to_vec())
                    .unwrap_or_default(),
            ),
            (
                "outcome",
                receipt.outcome.as_deref().unwrap_or_default().to_vec(),
            ),
            ("created", receipt.created_ms.to_string().into_bytes()),
            ("updated", receipt.updated_ms.to_string().into_bytes()),
        ];
        // The entry and its expiry in one MULTI on the record's own key (one slot), so an entry never
        // outlives its receipt; the callId index entry, on another key, expires with it.
        let mut entry = redis::pipe();
        entry
            .atomic()
            .hset_multiple(&record, &fields)
            .ignore()
            .pexpire(&record, i64::try_from(keep).unwrap_or(i64::MAX))
            .ignore();
        entry
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(unavailable)?;
        redis::cmd("SET")
            .arg(self.index_key(&receipt.call_id))
            .arg(receipt.key.digest().as_slice())
            .arg("PX")
            .arg(keep)
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(unavailable)
    }
}

/// A record from its hash fields; `None` for no record or a released tombstone. A field that is
/// missing or malformed is [`StoreError::Corrupt`].
fn parse_record(
    scope_hint: &str,
    fields: &[(String, Vec<u8>)],
) -> Result<Option<Receipt>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let get = |name: &str| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    let need = |name: &str| get(name).ok_or_else(|| corrupt(format!("record without `{name}`")));
    let state = text(need("state")?, "state")?;
    if state == "RELEASED" {
        return Ok(None);
    }
    let state: ReceiptState = state.parse().map_err(corrupt)?;
    let scope = get("scope")
        .map(|s| text(s, "scope"))
        .transpose()?
        .unwrap_or_else(|| scope_hint.to_owned());
    let fingerprint = match get("fingerprint") {
        Some(bytes) if !bytes.is_empty() => Some(Fingerprint(
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| corrupt("a fingerprint is 32 bytes"))?,
        )),
        _ => None,
    };
    let key_digest: [u8; 32] = need("digest")?
        .as_slice()
        .try_into()
        .map_err(|_| corrupt("a key is 32 bytes"))?;
    Ok(Some(Receipt {
        key: Key::from_digest(scope, key_digest),
        call_id: text(need("call_id")?, "callId")?.parse().map_err(corrupt)?,
        state,
        fence: Fence(number(need("fence")?, "fence")?),
        lease_until_ms: optional_number(get("lease_until"), "lease")?,
        expires_at_ms: optional_number(get("expires_at"), "expiry")?,
        fingerprint,
        outcome: get("outcome")
            .filter(|o| !o.is_empty())
            .map(|o| o.as_slice().into()),
        created_ms: number(need("created")?, "creation time")?,
        updated_ms: number(need("updated")?, "update time")?,
    }))
}
