//! Record the outcome (the decision table in `docs/rules.md`, step 3, `Ok` and `Permanent`; a lookup's `Succeeded` and `Failed`): the
//! final receipt written under the call's fence, and answered.
//!
//! # Guarantees
//!
//! * An outcome that happened is answered as it happened, whether or not its write succeeds: a write
//!   refused by another owner goes to `fenced.rs`; a failed one leaves the call `UNKNOWN` and queued,
//!   with the known outcome in the reason.
//! * A taken-over call's compensation entry is removed only once its outcome is recorded.

use std::future::Future;
use std::sync::Arc;

use crate::call_id::CallId;
use crate::clock::ms;
use crate::journal::EventKind;
use crate::key::Key;
use crate::receipt::ReceiptState;
use crate::runtime::Runtime;
use crate::store::Completion;

use super::give_up::leave_unknown;
use super::{Call, Phase, Step};

impl<T, E> Call<T, E> {
    // `succeed` and `fail` hand out `settle`'s future rather than wrap it in one of their own.
    pub(super) fn succeed(&mut self, value: T) -> impl Future<Output = Step<T, E>> + use<'_, T, E> {
        let outcome = self.encoded((self.codec.encode_ok)(&value));
        self.settle(ReceiptState::Success, outcome, Ok(value))
    }

    pub(super) fn fail(&mut self, error: E) -> impl Future<Output = Step<T, E>> + use<'_, T, E> {
        let outcome = self.encoded((self.codec.errors.encode)(&error));
        self.settle(ReceiptState::Failed, outcome, Err(error))
    }

    /// The outcome as it is stored, if a duplicate can read it back as it was (the codec refuses it
    /// otherwise: see [`replayable_json`](crate::codec::replayable_json)). One that cannot be stored
    /// is not — duplicates get [`Error::NotReplayable`](crate::Error::NotReplayable), which says that
    /// the call took effect, never a decoding error.
    pub(super) fn encoded(&self, encoded: serde_json::Result<Arc<[u8]>>) -> Option<Arc<[u8]>> {
        encoded
            .map_err(|e| {
                call_event!(ERROR, self;
                    error = %e, "outcome cannot be stored; duplicates will get NotReplayable");
            })
            .ok()
    }

    /// Records the final outcome and answers it: it happened. If the caller goes away during the write,
    /// the drop guard finishes it. A refused write means another owner holds the key
    /// ([`Call::fenced_out`]); a failed one leaves the call `UNKNOWN` and queued, with the known outcome
    /// in the reason. The compensation entry of a taken-over call is removed only once the outcome is
    /// recorded.
    pub(super) async fn settle(
        &mut self,
        state: ReceiptState,
        outcome: Option<Arc<[u8]>>,
        out: Result<T, E>,
    ) -> Step<T, E> {
        let Some(fence) = self.phase.fence() else {
            return self.done(out);
        };
        self.phase = Phase::Recording {
            fence,
            state,
            outcome: outcome.clone(),
        };
        let now = self.rt.now_ms();
        let completion = Completion {
            state,
            outcome,
            ttl_ms: ms(self.spec.ttl),
        };
        let written = match self.rt.memory() {
            // The in-process store answers at once: no future to make and move.
            Some(memory) => memory.complete_now(&self.ids.key, fence, completion, now),
            None => {
                let store = self.rt.store();
                store.complete(&self.ids.key, fence, completion, now).await
            }
        };
        match written {
            Ok(transition) => {
                // Settled: nothing is left for the drop guard to do, whatever happens next.
                self.phase = Phase::Free;
                call_event!(DEBUG, self; state = %state, transition = ?transition, "recorded");
                if self.worth_journaling() {
                    self.note(EventKind::Recorded {
                        state,
                        by: "call".to_owned(),
                    });
                    self.flush().await;
                }
                if self.tally.took_over {
                    finish_compensation(&self.rt, &self.ids.key, &self.ids.call_id).await;
                }
                self.done(out)
            }
            Err(e) if e.lost_key() => {
                self.phase = Phase::Owner(fence);
                call_event!(WARN, self;
                    state = %state, error = %e, "outcome refused: another owner holds the key");
                Box::pin(self.fenced_out(Some(out))).await
            }
            Err(e) => {
                // The outcome is known and true: the caller gets it. The record cannot say so, so it
                // is left UNKNOWN and queued with what is known (the drop guard, should the caller go
                // away meanwhile, still knows the outcome and tries again).
                call_event!(ERROR, self; state = %state, error = %e,
                    "outcome could not be recorded; leaving the call unknown");
                let reason = format!("the outcome {state} is known but could not be recorded: {e}");
                let entry = self.entry(reason.clone(), now);
                let left = Box::pin(leave_unknown(self.rt.store(), fence, entry, now)).await;
                if let Err(e) = &left {
                    call_event!(ERROR, self;
                        error = %e, "could not leave the call unknown either; its lease will end");
                }
                // The journal after the writes that decide the call, not before them; noted while the
                // call still holds its fence, which the journal's claim event names.
                self.note(EventKind::Unknown { reason });
                if left.is_ok() {
                    // UNKNOWN and queued: compensation resolves it, the drop guard has nothing to do.
                    self.phase = Phase::Free;
                }
                // Otherwise still `Recording`: a caller that goes away during the journal's write
                // leaves the drop guard to write the known outcome (or `UNKNOWN`) once more — never
                // to release a key whose request took effect.
                self.flush().await;
                self.done(out)
            }
        }
    }
}

pub(super) async fn finish_compensation(rt: &Runtime, key: &Key, call_id: &CallId) {
    if let Err(e) = rt.store().finish_compensation(call_id, None).await {
        call_event!(WARN, call_id, key, 0u32; error = %e, "could not clear the compensation entry");
        return;
    }
    // A contradiction reported meanwhile found the entry still queued: it is queued again. Boxed: a
    // path of taken-over calls only, kept out of every call's future.
    Box::pin(crate::compensation::contradiction::requeue_if_contradicted(
        rt, key, call_id,
    ))
    .await;
}
