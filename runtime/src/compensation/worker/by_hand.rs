//! What a person does to a queued entry: resolve it by hand ([`Compensator::resolve`], with a
//! [`ManualResolution`]), make it due now ([`Compensator::retry`]) or escalate it before its rounds run out
//! ([`Compensator::escalate`]) — each logged and journaled with who and why.

use super::{completion, Compensator};
use crate::call_id::CallId;
use crate::clock::ms;
use crate::codec::message_bytes;
use crate::compensation::entry::{CompensationEntry, CompensationState};
use crate::error::{Error, StoreError};
use crate::journal::{CompensationStep, EventKind};
use crate::receipt::ReceiptState;
use crate::store::Claimed;
use crate::takeover::{self, TakenOver};

/// How a person resolves an entry by hand ([`Compensator::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManualResolution {
    /// It took effect: record `SUCCESS` with this JSON value (what the function would have returned).
    Succeeded(serde_json::Value),
    /// It failed: record `FAILED` with this message.
    Failed(String),
    /// It never happened: give the key back.
    Release,
}

impl Compensator {
    /// Resolves an entry by hand (a `MANUAL` one, usually), as `who` decided for `why`: records the
    /// outcome or gives the key back, then removes the entry. Logged and journaled with who and why. A
    /// call settled meanwhile keeps its outcome: a resolution that agrees removes the entry, one that
    /// does not is [`Error::AlreadySettled`] — unless the record contradicts what happened (recorded
    /// `FAILED` although its request took effect, or a callback reported the other outcome: what the
    /// worker escalated the entry for). Then the person's answer replaces the record, under a new
    /// fence ([`Store::reopen`](crate::store::Store::reopen)): duplicates are told what happened from
    /// then on. A call whose key a running call holds is [`Error::InProgress`].
    pub async fn resolve(
        &self,
        call_id: &CallId,
        resolution: ManualResolution,
        who: &str,
        why: &str,
    ) -> Result<(), Error> {
        let store = self.rt.store();
        let entry = store
            .list_compensations()
            .await?
            .into_iter()
            .find(|e| &e.call_id == call_id)
            .ok_or(Error::Store(StoreError::NotFound))?;
        let now = self.rt.now_ms();
        let mut record = self.record_of(&entry.key, call_id).await?;
        // The call's receipt as it stands: taken over to write the person's answer, or already
        // settled — then the answer must agree with it.
        let fence = loop {
            let Some(r) = record.filter(|r| &r.call_id == call_id) else {
                break None;
            };
            if r.state.is_terminal() {
                let agrees = matches!(
                    (&resolution, r.state),
                    (ManualResolution::Succeeded(_), ReceiptState::Success)
                        | (ManualResolution::Failed(_), ReceiptState::Failed)
                );
                if agrees {
                    break None;
                }
                if !self.contradicted(&entry, r.state).await? {
                    return Err(Error::AlreadySettled {
                        call_id: call_id.clone(),
                        state: r.state,
                    });
                }
                // The record contradicts what happened: the person's answer replaces it, under a
                // new fence (duplicates meanwhile find the call running).
                match self
                    .rt
                    .store()
                    .reopen(&r.key, r.fence, ms(self.lease), now)
                    .await?
                {
                    Claimed::Acquired(fence) => break Some(fence),
                    Claimed::Existing(next) if next.fence != r.fence || next.state != r.state => {
                        record = Some(next);
                        continue;
                    }
                    Claimed::Existing(_) => {
                        return Err(Error::InProgress {
                            call_id: call_id.clone(),
                        })
                    }
                }
            }
            match takeover::take_over(&self.rt, &r, ms(self.lease), now).await? {
                // A person's answer settles even a call whose reversal was begun: that is what
                // the worker escalated it for.
                TakenOver::Acquired(fence) | TakenOver::Reversal { fence, .. } => {
                    break Some(fence)
                }
                TakenOver::Gone => record = None,
                TakenOver::Existing(next) if next.fence != r.fence || next.state != r.state => {
                    record = Some(*next);
                }
                TakenOver::Existing(_) => {
                    return Err(Error::InProgress {
                        call_id: call_id.clone(),
                    })
                }
            }
        };
        let state = match &resolution {
            ManualResolution::Succeeded(_) => ReceiptState::Success,
            ManualResolution::Failed(_) => ReceiptState::Failed,
            ManualResolution::Release => ReceiptState::Received,
        };
        if let Some(fence) = fence {
            let ttl = self.keep(&entry.key);
            match resolution {
                ManualResolution::Release => store.release(&entry.key, fence).await?,
                ManualResolution::Succeeded(value) => {
                    let bytes = serde_json::to_vec(&value)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    let done = completion(ReceiptState::Success, Some(bytes), ttl);
                    store.complete(&entry.key, fence, done, now).await?;
                }
                ManualResolution::Failed(message) => {
                    let done = completion(ReceiptState::Failed, Some(message_bytes(&message)), ttl);
                    store.complete(&entry.key, fence, done, now).await?;
                }
            }
        }
        store.finish_compensation(call_id, None).await?;
        tracing::warn!(target: "samekey", call_id = %call_id, key = %entry.key.short(), attempt = 0u32,
            who, why, "compensation resolved by hand");
        let resolved = EventKind::Resolved {
            state,
            who: who.to_owned(),
            why: why.to_owned(),
        };
        self.journal(call_id, &entry.key, resolved).await;
        Ok(())
    }

    /// Makes a queued entry due now, as `who` decided for `why` (a person who fixed what made it fail,
    /// or who wants the next round without waiting): a `MANUAL` entry goes back to the workers for
    /// one more round, a pending one is due at once. Logged and journaled with who and why.
    /// [`Error::InProgress`] while a worker holds the entry (its lease has not ended);
    /// [`StoreError::NotFound`] when no entry is queued for the call.
    pub async fn retry(&self, call_id: &CallId, who: &str, why: &str) -> Result<(), Error> {
        let entry = self.held_by_nobody(call_id).await?;
        // The round stays: a `MANUAL` entry whose rounds ran out gets one more, then is `MANUAL` again.
        self.rt
            .store()
            .reschedule_compensation(call_id, entry.fence, entry.round, 0, self.rt.now_ms())
            .await?;
        tracing::warn!(target: "samekey", call_id = %call_id, key = %entry.key.short(), attempt = 0u32,
            who, why, "compensation: made due by hand");
        self.by_hand(&entry, CompensationStep::RetriedByHand, who, why)
            .await;
        Ok(())
    }

    /// Marks a queued entry `MANUAL` before its rounds run out, as `who` decided for `why` (the
    /// counterparty is known to need a person), and runs the escalation hook. Logged and journaled
    /// with who and why. [`Error::InProgress`] while a worker holds the entry;
    /// [`StoreError::NotFound`] when no entry is queued for the call.
    pub async fn escalate(&self, call_id: &CallId, who: &str, why: &str) -> Result<(), Error> {
        let entry = self.held_by_nobody(call_id).await?;
        self.rt
            .store()
            .escalate_compensation(call_id, entry.fence, self.rt.now_ms())
            .await?;
        tracing::warn!(target: "samekey", call_id = %call_id, key = %entry.key.short(), attempt = 0u32,
            who, why, "compensation: escalated by hand");
        self.by_hand(&entry, CompensationStep::EscalatedByHand, who, why)
            .await;
        if let Some(hook) = &self.escalate {
            let mut escalated = entry;
            escalated.state = CompensationState::Manual;
            hook(&escalated);
        }
        Ok(())
    }

    /// The queued entry of `call_id`, if no worker holds it now.
    async fn held_by_nobody(&self, call_id: &CallId) -> Result<CompensationEntry, Error> {
        let entry = self
            .rt
            .store()
            .list_compensations()
            .await?
            .into_iter()
            .find(|e| &e.call_id == call_id)
            .ok_or(Error::Store(StoreError::NotFound))?;
        let now = self.rt.store().now_ms(self.rt.now_ms()).await?;
        match entry.state {
            CompensationState::Taken { lease_until_ms } if lease_until_ms > now => {
                Err(Error::InProgress {
                    call_id: call_id.clone(),
                })
            }
            _ => Ok(entry),
        }
    }

    /// Journals what a person did to an entry.
    async fn by_hand(
        &self,
        entry: &CompensationEntry,
        step: CompensationStep,
        who: &str,
        why: &str,
    ) {
        let what = EventKind::Compensation {
            round: entry.round,
            step,
            detail: format!("by {who}: {why}"),
        };
        self.journal(&entry.call_id, &entry.key, what).await;
    }
}
