//! Taking a key over from an owner whose outcome is uncertain: the one copy of the rules that every
//! taker follows — a duplicate call, a callback, the compensation worker, a person resolving by hand.
//!
//! # Guarantees
//!
//! * **The store judges.** A key is taken over only when the store finds, atomically and by its own
//!   clock where nodes share it, that the record is `UNKNOWN` or its owner's lease ended, and that
//!   nobody took it over first. The taker then owns it under a new fence: the earlier owner, should it
//!   come back, is refused every write and answers what the record says (or what it knows itself
//!   happened, never a contradiction of it).
//! * **An open reversal stops every taker.** A compensation worker journals `Reversing` before it
//!   runs a call's reversal and `Reversed` once it ran. A journal that holds either with nothing
//!   recorded after means the call may have been undone; executing it now (a duplicate that hears
//!   "not received" and sends) would both reverse and perform it. So the taker acts on nothing: the
//!   key goes back to `UNKNOWN` under its fence ([`TakenOver::Reversal`], [`hand_back`]) and the
//!   worker, which finds the same journal, settles it (`Reversed`: recorded `FAILED`) or asks a person
//!   (`Reversing`: `MANUAL`).

use crate::call_id::CallId;
use crate::error::StoreError;
use crate::journal::{CompensationStep, EventKind};
use crate::key::Key;
use crate::receipt::{Fence, Receipt};
use crate::runtime::Runtime;
use crate::store::Claimed;

/// What came of a take-over.
#[derive(Debug)]
pub(crate) enum TakenOver {
    /// The key is the taker's, under this fence, and nothing stands in its way.
    Acquired(Fence),
    /// The store refused: the owner's lease is alive, or someone changed the record first (a newer
    /// fence, a settled outcome, another call's claim). The record as it is now.
    Existing(Box<Receipt>),
    /// The record is gone (released, forgotten, expired).
    Gone,
    /// The key is the taker's under `fence`, but a reversal of the call was begun (`Reversing`) or
    /// done (`Reversed`) with no outcome recorded after: the taker acts on nothing but the reversal's
    /// rules. Anyone but the worker [`hand_back`]s the key.
    Reversal {
        /// The taker's fence.
        fence: Fence,
        /// The reversal as the journal tells it.
        reversal: Reversal,
    },
}

/// A reversal begun and not closed by a recorded outcome, as the journal tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reversal {
    /// Its last step: `Reversing` (it may have run) or `Reversed` (it ran).
    pub(crate) step: CompensationStep,
    /// A callback reported an outcome of the call after the reversal began (and was refused): the
    /// counterparty's word and the reversal may disagree, which only a person can settle.
    pub(crate) disputed: bool,
}

/// Takes the key of `record` over for one `lease_ms` from `now_ms`, if the store finds its owner's
/// outcome uncertain (see [the module](self)).
pub(crate) async fn take_over(
    rt: &Runtime,
    record: &Receipt,
    lease_ms: u64,
    now_ms: u64,
) -> Result<TakenOver, StoreError> {
    let fence = match rt
        .store()
        .take_over(&record.key, record.fence, lease_ms, now_ms)
        .await
    {
        Ok(Claimed::Acquired(fence)) => fence,
        Ok(Claimed::Existing(newer)) => return Ok(TakenOver::Existing(Box::new(newer))),
        Err(StoreError::NotFound) => return Ok(TakenOver::Gone),
        Err(e) => return Err(e),
    };
    // A journal that cannot say fails the take-over: nothing may act on the call before it can. The
    // key stays the taker's until its lease lapses (not marked UNKNOWN: an orphan nobody queued would
    // then be out of the sweep's sight), and the next taker asks again.
    let Some(reversal) = open_reversal(rt, &record.key, &record.call_id).await? else {
        return Ok(TakenOver::Acquired(fence));
    };
    tracing::warn!(target: "samekey", call_id = %record.call_id, key = %record.key.short(),
        attempt = 0u32, step = ?reversal.step, disputed = reversal.disputed, fence = fence.0,
        "took over a call whose reversal was begun; acting on nothing but the reversal's rules");
    Ok(TakenOver::Reversal { fence, reversal })
}

/// The reversal the journal holds for `call_id`, if one was begun (`Reversing`) and no outcome was
/// recorded after: its last step, and whether a callback was refused since it began. A
/// `ReversalFailed` closes the reversal: nothing ran.
///
/// The journal keeps a key's latest [`JOURNAL_LIMIT`](crate::journal::JOURNAL_LIMIT) events; what
/// writes to it while a reversal is open is bounded (a refused callback is journaled once, a
/// duplicate writes nothing), so the intent stays within them.
pub(crate) async fn open_reversal(
    rt: &Runtime,
    key: &Key,
    call_id: &CallId,
) -> Result<Option<Reversal>, StoreError> {
    // The key's journal, the call's events in it: one callId may have been adopted by two keys.
    let events = rt.store().journal(key, rt.now_ms()).await?;
    let events = events.iter().filter(|e| &e.call_id == call_id);
    let mut last: Option<CompensationStep> = None;
    let mut disputed = false;
    // From the newest event back to the intent that began the reversal.
    for event in events.rev() {
        match &event.what {
            EventKind::Recorded { .. }
            | EventKind::Resolved { .. }
            | EventKind::Released { .. } => return Ok(None),
            EventKind::CallbackRefused { .. } => disputed = true,
            EventKind::Compensation { step, .. } => match step {
                CompensationStep::ReversalFailed if last.is_none() => return Ok(None),
                CompensationStep::Reversed => {
                    last.get_or_insert(*step);
                }
                CompensationStep::Reversing => {
                    let step = *last.get_or_insert(*step);
                    return Ok(Some(Reversal { step, disputed }));
                }
                _ => {}
            },
            _ => {}
        }
    }
    // A `Reversed` whose intent the journal no longer holds: it ran all the same.
    Ok(last.map(|step| Reversal { step, disputed }))
}

/// Puts a key taken over under `fence` back to `UNKNOWN` for the compensation worker, without acting
/// on it. A refusal (another owner took it meanwhile) leaves it to that owner; a failure is logged,
/// and the taker's lease runs out.
pub(crate) async fn hand_back(rt: &Runtime, key: &Key, fence: Fence) {
    match rt.store().mark_unknown(key, fence, rt.now_ms()).await {
        Ok(_) => {}
        Err(e) if e.lost_key() => {}
        Err(e) => {
            tracing::warn!(target: "samekey", key = %key.short(), attempt = 0u32, error = %e,
                "could not hand a taken-over key back to compensation; its lease will end");
        }
    }
}
