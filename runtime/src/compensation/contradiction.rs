//! Contradictions: a finished record that what happened contradicts — recorded `FAILED` although the
//! call's request took effect (its fenced-out owner knows, or the provider's callback says so), or
//! `SUCCESS` where the provider says it failed. Duplicates replay the record, so a person must
//! reconcile the two: the call is queued, and the worker that takes the entry marks it `MANUAL`
//! through the escalation hook.
//!
//! # Guarantees
//!
//! * **The entry says it itself.** A contradiction is queued with a marker in the entry's
//!   `last_error` — `Ok` beside a `FAILED` record, `Permanent` beside a `SUCCESS` — so the worker
//!   knows it without the journal, which is best effort.
//! * **Never removed unseen.** Whoever reports a contradiction journals it first and queues it
//!   second; whoever removes the entry of a settled call removes it first and looks at the journal
//!   second ([`requeue_if_contradicted`]), and queues the call again if a contradiction is there. In
//!   every ordering of the two, the call ends queued: an entry removed by a worker (or an owner)
//!   that recorded the outcome while the contradiction was reported is put back.

use crate::call_id::CallId;
use crate::compensation::CompensationEntry;
use crate::error::StoreError;
use crate::journal::{AttemptOutcome, Event, EventKind};
use crate::key::Key;
use crate::receipt::ReceiptState;
use crate::runtime::Runtime;

/// Whether `events` (a call's journal) report that what happened contradicts a record in `state`.
pub(crate) fn reported(events: &[Event], state: ReceiptState) -> bool {
    events.iter().any(|event| match event.what {
        EventKind::Contradicted { recorded, known } => recorded == state && known != state,
        EventKind::CallbackRefused { from, to } => from == state && to.is_terminal() && to != state,
        _ => false,
    })
}

/// Whether `entry` is marked a contradiction of a record in `state` (see the module).
pub(crate) fn marked(entry: &CompensationEntry, state: ReceiptState) -> bool {
    matches!(
        (state, entry.last_error),
        (ReceiptState::Failed, Some(AttemptOutcome::Ok))
            | (ReceiptState::Success, Some(AttemptOutcome::Permanent))
    )
}

/// The entry that queues a contradiction of a record in `state`, marked (see the module).
pub(crate) fn entry(
    call_id: &CallId,
    key: &Key,
    state: ReceiptState,
    reason: impl Into<String>,
    now_ms: u64,
) -> CompensationEntry {
    let mut entry = CompensationEntry::new(call_id.clone(), key.clone(), reason, now_ms);
    entry.last_error = match state {
        ReceiptState::Failed => Some(AttemptOutcome::Ok),
        _ => Some(AttemptOutcome::Permanent),
    };
    entry
}

/// After the compensation entry of `call_id` was removed because its call settled: if the call's
/// record is finished and its journal reports a contradiction of it, the call is queued again, for a
/// person. Best effort: a store that cannot say is logged (the reporter queued the call too).
pub(crate) async fn requeue_if_contradicted(rt: &Runtime, key: &Key, call_id: &CallId) {
    if let Err(e) = requeue(rt, key, call_id).await {
        tracing::warn!(target: "samekey", call_id = %call_id, key = %key.short(), attempt = 0u32,
            error = %e, "could not look for a contradiction after settling the call");
    }
}

async fn requeue(rt: &Runtime, key: &Key, call_id: &CallId) -> Result<(), StoreError> {
    let store = rt.store();
    let now = rt.now_ms();
    let Some(record) = store.get(key, now).await?.filter(|r| &r.call_id == call_id) else {
        return Ok(());
    };
    if !record.state.is_terminal() {
        return Ok(());
    }
    let events = store.journal_of_call(call_id, now).await?;
    if !reported(&events, record.state) {
        return Ok(());
    }
    tracing::warn!(target: "samekey", call_id = %call_id, key = %key.short(), attempt = 0u32,
        state = %record.state, "a contradiction was reported as the call settled: queued again");
    let reason = format!(
        "what happened contradicts the recorded {}: reconcile by hand",
        record.state
    );
    store
        .enqueue_compensation(entry(call_id, key, record.state, reason, now))
        .await
}
