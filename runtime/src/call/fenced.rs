//! An owner fenced out: a write refused because another owner holds the key now.
//!
//! # Guarantees
//!
//! * The receipt is read again: a final outcome recorded there is the answer, except `FAILED` for a
//!   request this owner knows took effect — its success is answered, journaled as contradicted and
//!   queued `MANUAL` for a person. A known failure never overrides a recorded success.
//! * Without a final record, the outcome this owner knows is answered; else nothing is queued for a
//!   call another owner now holds, and with no record of the call left, an uncertain one is queued
//!   for compensation and one that never ran answers its plain failure.

use crate::error::Error;
use crate::journal::{AttemptOutcome, EventKind};
use crate::receipt::ReceiptState;

use super::record::finish_compensation;
use super::{Call, Phase, Step};

impl<T, E> Call<T, E> {
    /// The answer of a call whose write was refused because another owner holds its key now (it stalled
    /// past its lease and the key was taken over, under the same callId). It reads the receipt: a final
    /// outcome recorded there is the call's answer — unless it is `FAILED` and this run knows its
    /// request took effect (`known` is a value): that is answered, journaled as
    /// [`EventKind::Contradicted`] and queued `MANUAL` for a person; a known failure never overrides a
    /// recorded success. Without a final record, the known outcome, else [`Error::Unknown`] — queued
    /// only when no other owner holds the call, since the one that does resolves it.
    pub(super) async fn fenced_out(&mut self, known: Option<Result<T, E>>) -> Step<T, E> {
        self.phase = Phase::Free;
        self.note(EventKind::FencedOut);
        self.flush().await;
        let now = self.rt.now_ms();
        let record = self.rt.store().get(&self.ids.key, now).await;
        let held_by_another = match &record {
            Ok(Some(r)) if r.call_id == self.ids.call_id => {
                if r.state.is_terminal() {
                    // Told "failed" for a request this owner knows took effect (a worker that heard
                    // "not received" before its late request arrived): it answers what it knows,
                    // and asks a person to reconcile the record.
                    if let (ReceiptState::Failed, Some(Ok(value))) = (r.state, known) {
                        return Box::pin(self.contradicted(value, now)).await;
                    }
                    call_event!(INFO, self;
                        state = %r.state, "another owner recorded the outcome; answering it");
                    let r = r.clone();
                    // An entry this run queued before it was fenced out is not needed by a settled
                    // call.
                    finish_compensation(&self.rt, &self.ids.key, &self.ids.call_id).await;
                    return self.replay(&r);
                }
                true
            }
            // The store cannot say: whoever fenced this run out holds the call.
            Err(_) => true,
            // Gone, or the key now belongs to another call.
            Ok(_) => false,
        };
        if let Some(out) = known {
            return self.done(out);
        }
        if held_by_another {
            call_event!(WARN, self; "another owner is resolving this call; answering unknown");
            let call_id = self.ids.call_id.clone();
            return self.fail_with(Error::Unknown { call_id });
        }
        if self.tally.uncertain {
            // No record covers the call any more: the queue entry is what is left of it.
            return self
                .give_up_unknown("lost its key with an uncertain outcome", now)
                .await;
        }
        call_event!(INFO, self; "lost its key; nothing of this call ran");
        self.plain_failure()
    }

    /// Answers `value`, the call's success, although another owner recorded it `FAILED` meanwhile: the
    /// record is what duplicates replay, so a person must reconcile the two. Journaled
    /// ([`EventKind::Contradicted`]), logged, and queued for compensation with its last attempt
    /// `Ok`: the worker that takes the entry finds the record `FAILED` beside an attempt that took
    /// effect, marks the entry `MANUAL` and runs the escalation hook — every `MANUAL` entry reaches a
    /// person through the hook, whoever found it. Journaled first and queued second: whoever removes a
    /// settled call's entry looks at the journal after, and queues it again
    /// (`compensation::contradiction`).
    pub(super) async fn contradicted(&mut self, value: T, now: u64) -> Step<T, E> {
        call_event!(ERROR, self;
            "another owner recorded FAILED, but this owner's request took effect; answering its success, and asking a person to reconcile");
        self.note(EventKind::Contradicted {
            recorded: ReceiptState::Failed,
            known: ReceiptState::Success,
        });
        self.flush().await;
        let reason =
            "the owner's request took effect after the call was recorded FAILED: reconcile by hand";
        let mut entry = self.entry(reason, now);
        // Marked: the worker knows the contradiction without the journal.
        entry.last_error = Some(AttemptOutcome::Ok);
        if let Err(e) = self.rt.store().enqueue_compensation(entry).await {
            call_event!(ERROR, self; error = %e, "could not queue the contradiction for a person");
        }
        self.done(Ok(value))
    }
}
