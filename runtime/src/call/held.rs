//! A key already present (the decision table in `docs/rules.md`, step 2): a finished receipt replayed (a `verify` mismatch refused),
//! a live owner waited for or refused (`on_busy`), an uncertain owner taken over through
//! [`crate::takeover`] before anything is resolved.
//!
//! # Guarantees
//!
//! * Whether an owner's lease ended is the store's to judge: the key is taken over only when the
//!   store hands it over, under a new fence and the recorded callId — never a new one.
//! * A taken-over call is asked about before anything is sent (`lookup`), re-run only under
//!   `on_unknown = "rerun"`, else answered [`Error::Unknown`] and left to compensation; one whose
//!   reversal a compensation worker began is never run by a duplicate.
//! * Waiting for a live owner is bounded (the runtime's busy wait, and a bound on the looks).

use crate::clock::ms;
use crate::error::Error;
use crate::journal::EventKind;
use crate::observe::Counter;
use crate::receipt::{Receipt, ReceiptState};
use crate::takeover::{self, TakenOver};

use super::{Call, OnBusy, OnUnknown, Phase, Step};

/// How many times a call looks at a record held by others (waits, take-overs lost to someone else)
/// before it answers `InProgress`: a bound against a store that keeps answering the same record.
const MAX_LOOKS: u32 = 64;

/// The next step after a look at a record held by someone else.
pub(super) enum Held<T, E> {
    Step(Step<T, E>),
    /// The record disappeared (released or evicted): claim again.
    Reclaim,
}

impl<T, E> Call<T, E> {
    /// Acts on a record of this key that another call holds.
    pub(super) async fn held(&mut self, mut record: Receipt) -> Held<T, E> {
        for _ in 0..MAX_LOOKS {
            if let (Some(ours), Some(theirs)) = (self.ids.fingerprint, record.fingerprint) {
                if ours != theirs {
                    call_event!(WARN, record.call_id, self.ids.key, 0u32;
                        "key reused with a different request");
                    return Held::Step(self.fail_with(Error::KeyReuse {
                        call_id: record.call_id,
                    }));
                }
            }
            if record.state.is_terminal() {
                if let Some(observer) = &mut self.observer {
                    observer.replayed = Some(record.call_id.clone());
                }
                return Held::Step(self.replay(&record));
            }
            // `UNKNOWN`, or an owner's claim: whether that owner's lease ended is the store's to judge
            // (by its own clock, where nodes share it), so ask it to hand the key over. It refuses, with
            // the record as it is, while the lease is alive.
            let seen = record.fence;
            record = match self.take_over(record).await {
                Ok(step) => return Held::Step(step),
                Err(None) => return Held::Reclaim,
                Err(Some(next)) => next,
            };
            let alive = record.fence == seen
                && matches!(
                    record.state,
                    ReceiptState::Processing | ReceiptState::Received
                );
            if !alive {
                continue;
            }
            if self.spec.on_busy == OnBusy::Reject {
                return Held::Step(self.fail_with(Error::InProgress {
                    call_id: record.call_id,
                }));
            }
            let left = self.rt.busy_wait().saturating_sub(self.tally.waited);
            if left.is_zero() {
                return Held::Step(self.fail_with(Error::InProgress {
                    call_id: record.call_id,
                }));
            }
            call_event!(DEBUG, record.call_id, self.ids.key, 0u32; "key busy; waiting for its outcome");
            self.count(Counter::Waits);
            // Woken by the outcome, or at the latest after one lease (this function's), to ask again
            // whether the owner is still there.
            let started = tokio::time::Instant::now();
            let settled = self
                .rt
                .store()
                .wait_settled(&self.ids.key, left.min(self.lease()), self.rt.now_ms())
                .await;
            self.tally.waited += started.elapsed();
            match settled {
                Err(e) => return Held::Step(self.store_failed(e)),
                Ok(None) => return Held::Reclaim,
                Ok(Some(next)) => record = next,
            }
        }
        Held::Step(self.fail_with(Error::InProgress {
            call_id: record.call_id,
        }))
    }

    /// Resolves a key whose owner's outcome is uncertain (`UNKNOWN`, or `PROCESSING` past its lease):
    /// continue under the recorded callId, and only after asking (`lookup`) or when the remote dedups
    /// (`on_unknown = "rerun"`). `Err` hands back a newer record (or `None`: gone) to look at again.
    pub(super) async fn take_over(
        &mut self,
        record: Receipt,
    ) -> Result<Step<T, E>, Option<Receipt>> {
        let now = self.rt.now_ms();
        // The store checks, atomically, that the lease really ended (or the record is UNKNOWN) and
        // that nobody took over first; only then does this call own the key, under a new fence.
        let fence = match takeover::take_over(&self.rt, &record, ms(self.lease()), now).await {
            Ok(TakenOver::Gone) => return Err(None),
            Err(e) => return Ok(self.store_failed(e)),
            Ok(TakenOver::Existing(newer)) => return Err(Some(*newer)),
            Ok(TakenOver::Acquired(fence)) => fence,
            Ok(TakenOver::Reversal { fence, .. }) => {
                // The call may have been undone: it is the worker's (and perhaps a person's) to
                // settle, never this duplicate's to send.
                takeover::hand_back(&self.rt, &self.ids.key, fence).await;
                return Ok(self.fail_with(Error::Unknown {
                    call_id: record.call_id,
                }));
            }
        };
        call_event!(INFO, record.call_id, self.ids.key, 0u32;
            from = %record.state, fence = fence.0, "took over an uncertain call");
        self.ids.call_id = record.call_id;
        self.phase = Phase::Owner(fence);
        self.tally.took_over = true;
        self.tally.uncertain = true;
        self.count(Counter::Claims);
        self.note(EventKind::TookOver {
            from: record.state,
            fence: fence.0,
        });
        if self.has_lookup {
            return Ok(Step::Lookup(self.ids.call_id.clone()));
        }
        match self.spec.on_unknown {
            OnUnknown::Rerun => Ok(Step::Attempt),
            // Nothing to ask and no permission to re-run: record what is known (an owner that comes
            // back is fenced out) and leave it to compensation.
            OnUnknown::Hold => Ok(self
                .give_up_unknown("owner's outcome unknown; no lookup to ask", now)
                .await),
        }
    }

    /// Answers with the outcome an earlier call stored.
    pub(super) fn replay(&mut self, record: &Receipt) -> Step<T, E> {
        self.count(Counter::Replays);
        call_event!(DEBUG, record.call_id, self.ids.key, 0u32; state = %record.state, "replay");
        let Some(bytes) = record.outcome.as_deref() else {
            return self.fail_with(Error::NotReplayable {
                call_id: record.call_id.clone(),
            });
        };
        let decoded = if record.state == ReceiptState::Success {
            (self.codec.decode_ok)(bytes).map(Ok)
        } else {
            (self.codec.errors.decode)(bytes).map(|stored| {
                Err(stored.unwrap_or_else(|message| {
                    (self.codec.from_error)(Error::Failed {
                        call_id: record.call_id.clone(),
                        message,
                    })
                }))
            })
        };
        match decoded {
            Ok(out) => self.done(out),
            Err(e) => self.fail_with(Error::Decode {
                call_id: record.call_id.clone(),
                reason: e.to_string(),
            }),
        }
    }
}
