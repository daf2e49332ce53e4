//! The compensation queue on Redis: the hash `samekey:{queue}`, one JSON entry per callId (so an
//! uncertain call is queued once), taken by a server-side script (`TAKE_DUE`) and rescheduled, finished
//! or escalated by another (`UPDATE_ENTRY`), which checks the worker's fence.

use std::sync::Arc;

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use super::scripts::number;
use super::{corrupt, unavailable, RedisStore};
use crate::call_id::CallId;
use crate::compensation::{CompensationEntry, CompensationState};
use crate::error::StoreError;
use crate::journal::AttemptOutcome;
use crate::key::{digest_from_hex, hex, Key};
use crate::receipt::Fence;
#[cfg(doc)]
use crate::store::Store;

/// The JSON form of a queued entry (numbers as strings: Lua's numbers are doubles).
#[derive(Serialize, Deserialize)]
struct QueuedEntry {
    call_id: String,
    key: String,
    scope: String,
    reason: String,
    round: String,
    next_at: String,
    state: String,
    lease_until: String,
    enqueued: String,
    /// The worker fence of the latest take (absent in entries of an earlier release: 0).
    #[serde(default = "never_taken")]
    taker: String,
    /// Attempts the call made before it was queued (absent in entries of an earlier release).
    #[serde(default)]
    attempts: u32,
    /// How its last attempt ended.
    #[serde(default)]
    last_error: Option<AttemptOutcome>,
    /// Its inputs (the JSON text), when its function keeps them.
    #[serde(default)]
    inputs: Option<String>,
}

fn never_taken() -> String {
    "0".into()
}

impl RedisStore {
    /// [`Store::enqueue_compensation`]: the entry's JSON under its callId, unless one is queued (the
    /// `ENQUEUE` script, which dates it by the server's clock).
    pub(super) async fn enqueue_entry(&self, entry: CompensationEntry) -> Result<(), StoreError> {
        let queued = QueuedEntry {
            call_id: entry.call_id.to_string(),
            key: hex(entry.key.digest()),
            scope: entry.key.scope().to_owned(),
            reason: entry.reason,
            round: entry.round.to_string(),
            next_at: entry.next_at_ms.to_string(),
            state: "PENDING".into(),
            lease_until: "0".into(),
            enqueued: entry.enqueued_ms.to_string(),
            taker: entry.fence.0.to_string(),
            attempts: entry.attempts,
            last_error: entry.last_error,
            inputs: entry
                .encoded_inputs
                .as_deref()
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned()),
        };
        let json = serde_json::to_string(&queued).map_err(corrupt)?;
        // Due this long after the server's now (the `ENQUEUE` script reads it).
        let delay = entry.next_at_ms.saturating_sub(entry.enqueued_ms);
        let _: i64 = self
            .scripts
            .enqueue
            .key(self.queue_key())
            .arg(&queued.call_id)
            .arg(json)
            .arg(delay)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// [`Store::take_due_compensations`]: the `TAKE_DUE` script.
    pub(super) async fn take_due_entries(
        &self,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        let taken: Vec<String> = self
            .scripts
            .take_due
            .key(self.queue_key())
            .arg(limit)
            .arg(lease_ms)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        taken.iter().map(|s| parse_entry(s)).collect()
    }

    /// [`Store::reschedule_compensation`].
    pub(super) async fn reschedule_entry(
        &self,
        call_id: &CallId,
        fence: Fence,
        round: u32,
        delay_ms: u64,
    ) -> Result<(), StoreError> {
        self.update_entry(
            call_id,
            Some(fence),
            &["reschedule", &round.to_string(), &delay_ms.to_string()],
        )
        .await
    }

    /// [`Store::finish_compensation`].
    pub(super) async fn finish_entry(
        &self,
        call_id: &CallId,
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        match self.update_entry(call_id, fence, &["finish"]).await {
            // Gone already: finishing it again changes nothing.
            Err(StoreError::NotFound) => Ok(()),
            done => done,
        }
    }

    /// [`Store::escalate_compensation`].
    pub(super) async fn escalate_entry(
        &self,
        call_id: &CallId,
        fence: Fence,
    ) -> Result<(), StoreError> {
        self.update_entry(call_id, Some(fence), &["escalate"]).await
    }

    /// [`Store::list_compensations`].
    pub(super) async fn queued_entries(&self) -> Result<Vec<CompensationEntry>, StoreError> {
        let all: Vec<String> = self
            .conn()
            .hvals(self.queue_key())
            .await
            .map_err(unavailable)?;
        let mut entries = all
            .iter()
            .map(|s| parse_entry(s))
            .collect::<Result<Vec<_>, _>>()?;
        // As the SQL stores list them: by enqueue time, then by callId as text.
        entries.sort_by_cached_key(|e| (e.enqueued_ms, e.call_id.to_string()));
        Ok(entries)
    }

    /// Runs `action` (`update_entry.lua`) on the entry of `call_id`, for the worker holding it under
    /// `fence` (`None`: whoever holds it).
    async fn update_entry(
        &self,
        call_id: &CallId,
        fence: Option<Fence>,
        action: &[&str],
    ) -> Result<(), StoreError> {
        let mut invocation = self.scripts.update_entry.key(self.queue_key());
        invocation
            .arg(call_id.to_string())
            .arg(fence.map(|f| f.0.to_string()).unwrap_or_default());
        for arg in action {
            invocation.arg(*arg);
        }
        let answer: Vec<i64> = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        match answer.as_slice() {
            [1] => Ok(()),
            [0] => Err(StoreError::NotFound),
            [-1, current] => Err(StoreError::Fenced {
                presented: fence.map_or(0, |f| f.0),
                current: u64::try_from(*current).unwrap_or(0),
            }),
            other => Err(corrupt(format!(
                "unexpected answer {other:?} to a compensation update"
            ))),
        }
    }
}

fn parse_entry(json: &str) -> Result<CompensationEntry, StoreError> {
    let q: QueuedEntry = serde_json::from_str(json).map_err(corrupt)?;
    let num = |v: &str, what: &str| number(v.as_bytes(), what);
    let digest = digest_from_hex(&q.key).ok_or_else(|| corrupt("a queued key is 64 hex digits"))?;
    let state = match q.state.as_str() {
        "PENDING" => CompensationState::Pending,
        "TAKEN" => CompensationState::Taken {
            lease_until_ms: num(&q.lease_until, "lease")?,
        },
        "MANUAL" => CompensationState::Manual,
        other => return Err(corrupt(format!("compensation state `{other}`"))),
    };
    Ok(CompensationEntry {
        call_id: q.call_id.parse().map_err(corrupt)?,
        key: Key::from_digest(q.scope, digest),
        reason: q.reason,
        round: u32::try_from(num(&q.round, "round")?).map_err(corrupt)?,
        next_at_ms: num(&q.next_at, "due time")?,
        state,
        enqueued_ms: num(&q.enqueued, "enqueue time")?,
        fence: Fence(num(&q.taker, "worker fence")?),
        attempts: q.attempts,
        last_error: q.last_error,
        encoded_inputs: q.inputs.map(|text| Arc::from(text.into_bytes())),
    })
}
