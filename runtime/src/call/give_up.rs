//! Give up (the decision table in `docs/rules.md`, step 4, and every uncertain end): a claim released when nothing can have run, else
//! the call queued for compensation, marked `UNKNOWN` and answered [`Error::Unknown`].
//!
//! # Guarantees
//!
//! * A claim is released only when no attempt may have taken effect, and a plain failure is answered
//!   only once the release was applied: a refused release reads the receipt again, a failed one
//!   leaves the call `UNKNOWN`.
//! * The compensation entry is written before the `UNKNOWN` mark, so that a record is never `UNKNOWN`
//!   without one, whenever the process dies.

use crate::compensation::CompensationEntry;
use crate::error::{Error, StoreError};
use crate::journal::EventKind;
use crate::observe::Counter;
use crate::receipt::Fence;
use crate::store::Store;

use super::{Call, Phase, Step};

impl<T, E> Call<T, E> {
    /// No attempt left: release the claim if nothing can have run, else leave the call `UNKNOWN`. A plain
    /// failure is answered only when the release was applied.
    pub(super) async fn exhausted(&mut self) -> Step<T, E> {
        if self.tally.uncertain {
            let now = self.rt.now_ms();
            return self
                .give_up_unknown("retries exhausted with an uncertain outcome", now)
                .await;
        }
        self.give_back("retries exhausted; nothing ran").await
    }

    /// Releases the claim of a call that took no effect (`why` says how it ended) and answers its last
    /// error, once the release was applied; a release that fails leaves the call `UNKNOWN`.
    pub(super) async fn give_back(&mut self, why: &'static str) -> Step<T, E> {
        let now = self.rt.now_ms();
        if let Some(fence) = self.phase.fence() {
            match self.rt.store().release(&self.ids.key, fence).await {
                // Gone already (evicted): nothing of this call's is left to release.
                Ok(()) | Err(StoreError::NotFound) => {}
                Err(e) if e.lost_key() => {
                    call_event!(WARN, self;
                        error = %e, "release refused: another owner holds the key");
                    return self.fenced_out(None).await;
                }
                Err(e) => {
                    call_event!(WARN, self;
                        error = %e, "could not release the claim; the call is not reported failed");
                    return self
                        .give_up_unknown(
                            &format!("{why}; the claim could not be released: {e}"),
                            now,
                        )
                        .await;
                }
            }
        }
        self.count(Counter::Released);
        call_event!(INFO, self; why, "claim released");
        self.phase = Phase::Free;
        if self.worth_journaling() {
            self.note(EventKind::Released {
                reason: why.to_owned(),
                by: "call".to_owned(),
            });
            self.flush().await;
        }
        self.plain_failure()
    }

    /// The answer of a call that took no effect: its last error, or [`Error::Exhausted`].
    pub(super) fn plain_failure(&mut self) -> Step<T, E> {
        match self.tally.last_error.take() {
            Some(error) => self.done(Err(error)),
            None => {
                let error = Error::Exhausted {
                    call_id: self.ids.call_id.clone(),
                    attempts: self.tally.attempts,
                };
                self.fail_with(error)
            }
        }
    }

    /// Queues the call for compensation, records `UNKNOWN` if it holds the key ([`leave_unknown`]:
    /// the entry first), and answers [`Error::Unknown`]. If the entry cannot be written, the record
    /// stays `PROCESSING` and the orphan sweep queues it once its lease ends. If the mark is refused
    /// (another owner holds the key), the call answers what that owner recorded instead (the entry is
    /// removed by that owner, or by the worker as settled).
    pub(super) async fn give_up_unknown(&mut self, reason: &str, now: u64) -> Step<T, E> {
        call_event!(WARN, self; reason, "outcome unknown; handed to compensation");
        self.count(Counter::Unknown);
        let entry = self.entry(reason, now);
        let store = self.rt.store();
        let handed = match self.phase.fence() {
            Some(fence) => leave_unknown(store, fence, entry, now).await,
            None => store.enqueue_compensation(entry).await,
        };
        match handed {
            Ok(()) => {}
            Err(e) if e.lost_key() => {
                call_event!(WARN, self;
                    error = %e, "mark unknown refused: another owner holds the key");
                // Boxed: a call fenced out with an uncertain outcome comes back here, keyless.
                return Box::pin(self.fenced_out(None)).await;
            }
            Err(e) => {
                call_event!(ERROR, self; error = %e,
                    "could not hand the call to compensation: a record left PROCESSING is found by the orphan sweep, an entry left without its mark resolves it");
            }
        }
        self.answer_unknown(reason).await
    }

    /// Journals the hand-over and answers [`Error::Unknown`].
    pub(super) async fn answer_unknown(&mut self, reason: &str) -> Step<T, E> {
        self.note(EventKind::Unknown {
            reason: reason.to_owned(),
        });
        self.flush().await;
        let call_id = self.ids.call_id.clone();
        self.fail_with(Error::Unknown { call_id })
    }

    /// The compensation entry of this call, queued now for `reason`.
    pub(super) fn entry(&self, reason: impl Into<String>, now: u64) -> CompensationEntry {
        let mut entry =
            CompensationEntry::new(self.ids.call_id.clone(), self.ids.key.clone(), reason, now);
        entry.attempts = self.tally.attempts;
        entry.last_error = self.tally.last_outcome;
        entry.encoded_inputs = self.ids.inputs.clone();
        entry
    }
}

/// Queues an owner's call for compensation, then marks it `UNKNOWN`.
pub(super) async fn leave_unknown(
    store: &dyn Store,
    fence: Fence,
    entry: CompensationEntry,
    now: u64,
) -> Result<(), StoreError> {
    // The entry first: a record is never UNKNOWN without one, whenever the process dies. Without
    // it, the record stays PROCESSING and the orphan sweep queues it once the lease ends; with a
    // mark refused because another owner holds the key, that owner (or the worker, finding the call
    // settled) removes it.
    let key = entry.key.clone();
    store.enqueue_compensation(entry).await?;
    store.mark_unknown(&key, fence, now).await.map(drop)
}
