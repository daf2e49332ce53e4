//! A claim whose answer never came back: the store failed while answering it (a connection reset, a
//! server that crashed after its commit), or the caller went away while it was on its way (a dropped
//! future). The claim may have been written, under a fence the call never learned, and nothing ran
//! under it. Left alone it would hold the key until its lease ended, and then look like an owner that
//! vanished mid-attempt: a later call would have to ask `lookup`, or leave `UNKNOWN` a call that never
//! ran.
//!
//! So the call hands it to a task of its own, which reads the key's record and, if it is still this
//! call's `PROCESSING` claim, releases it under the fence it read.
//!
//! # Guarantees
//!
//! * Only a record that is this call's claim as written is released: it carries the call's callId,
//!   is `PROCESSING`, was never updated since it was created (a take-over or a callback's state
//!   updates it), and, on a store that keeps the caller's time, was stamped with the claim's
//!   time. The release is fenced with the fence read: a change between the read and the release makes
//!   the store refuse it.
//! * And only a record read before the claim's lease could end: the read must be answered within 7/8
//!   of the lease, counted from just before the claim was sent on a monotonic clock (a store that
//!   judges by its own clock starts the lease when it applies the claim, later) and from the claim's
//!   stamp on the runtime's clock (a store that judges by the caller's clock starts it there). Until
//!   the lease ends nobody can take the key over; the margin of 1/8 covers clocks that run apart, and
//!   the "never updated" check holds whatever they do.
//! * Only a callId the call made itself is trusted so: one adopted from an inbound request may be
//!   carried by other calls too (the caller's retries, each a request of its own), one of which may
//!   hold the key and be running. A claim under an adopted callId is left to its lease.
//! * No record found is asked again twice (after a pause of 100 ms, then of 300 ms) before the task
//!   concludes that the claim was never written: a statement the server runs on after its client went
//!   away may still commit. A claim that lands later still is left to its lease.
//! * Past the window, without a tokio runtime to run the task, or beyond [`MAX_PENDING`] tasks, the
//!   claim is left to its lease, as any vanished owner's: the next call takes it over and asks
//!   `lookup`, or leaves it `UNKNOWN`.
//! * A store that stays down is read at growing intervals (25 ms doubling to 1 s, jittered), and a
//!   runtime keeps at most [`MAX_PENDING`] such tasks at once, so the reads an outage causes are
//!   bounded (a claim that failed before it left the process, a pool that timed out, is asked about
//!   too: the error does not say).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use crate::call_id::CallId;
use crate::clock::ms;
use crate::error::StoreError;
use crate::journal::{Event, EventKind};
use crate::key::Key;
use crate::receipt::{Receipt, ReceiptState};
use crate::retry::Backoff;
use crate::runtime::Runtime;
use crate::store::StoreClock;

/// At most this many unanswered claims are being given back by one runtime at once; beyond it, a
/// claim is left to its lease (logged).
pub(crate) const MAX_PENDING: usize = 1024;

/// The pauses before each read that asks again after one found no record: a claim sent just before
/// its caller went away may still be on its way.
const ABSENT_PAUSES: [Duration; 2] = [Duration::from_millis(100), Duration::from_millis(300)];

/// How a store failure leaves a claim: `true` when the store may have written it before failing.
/// A refusal the store makes before writing anything (a store that may lose claims, a full one) is
/// not such a failure.
pub(crate) fn may_have_been_written(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(_) | StoreError::Corrupt(_))
}

/// Whether `record` is the claim that `call_id` (made by its call, not adopted) sent stamped
/// `stamped_ms`, as written and never touched since: that callId, `PROCESSING`, never updated (a
/// take-over, or a callback's state, would have updated it), and, on a store that keeps the caller's
/// time (`caller_clock`), stamped with the claim's time. Nobody else writes a record under a callId a
/// call made, and nobody took this one over.
pub(crate) fn written_as_sent(
    record: &Receipt,
    call_id: &CallId,
    stamped_ms: u64,
    caller_clock: bool,
) -> bool {
    record.call_id == *call_id
        && record.state == ReceiptState::Processing
        && record.updated_ms == record.created_ms
        && (!caller_clock || record.created_ms == stamped_ms)
}

/// A place among the claims a runtime is giving back (at most [`MAX_PENDING`]), given back when
/// dropped.
struct Place(Runtime);

impl Place {
    fn take(rt: &Runtime) -> Option<Place> {
        rt.unanswered()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_PENDING).then_some(n + 1)
            })
            .ok()
            .map(|_| Place(rt.clone()))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.unanswered().fetch_sub(1, Ordering::AcqRel);
    }
}

/// A claim sent to the store whose answer never came.
pub(crate) struct Unanswered {
    pub key: Key,
    pub call_id: CallId,
    /// Just before the claim was sent.
    pub sent: Instant,
    /// The runtime's time the claim was stamped with.
    pub stamped_ms: u64,
    /// The lease the claim asked for.
    pub lease: Duration,
    /// How long the key's journal keeps the release (the function's `ttl`).
    pub keep_ms: u64,
    /// What became of the answer: `"the store failed while answering it: …"`, `"its caller went
    /// away"`.
    pub why: String,
}

impl Unanswered {
    /// Gives the claim back in a task of its own, if a tokio runtime is there to run it and the runtime
    /// has room for one more (else the claim is left to its lease).
    pub(crate) fn give_back(self, rt: &Runtime) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(target: "samekey", call_id = %self.call_id, key = %self.key.short(),
                attempt = 0u32, why = %self.why,
                "claim unanswered and no tokio runtime to give it back; it is left to its lease");
            return;
        };
        let Some(place) = Place::take(rt) else {
            tracing::warn!(target: "samekey", call_id = %self.call_id, key = %self.key.short(),
                attempt = 0u32, why = %self.why, pending = MAX_PENDING,
                "claim unanswered and too many being given back already; it is left to its lease");
            return;
        };
        handle.spawn(async move { self.settle(&place.0).await });
    }

    async fn settle(self, rt: &Runtime) {
        let store = rt.store();
        let caller_clock = store.clock() == StoreClock::Caller;
        let window = self.lease - self.lease / 8;
        let deadline = self.sent + window;
        let deadline_ms = self.stamped_ms.saturating_add(ms(window));
        let backoff = Backoff::new(Duration::from_millis(25), Duration::from_secs(1), 0.5);
        let mut rng = self.call_id.entropy();
        let mut absent = ABSENT_PAUSES.iter();
        let mut released = None;
        for n in 0u32.. {
            // Answered in time, by the runtime's clock too: a record read later may be a taker's,
            // under this call's callId.
            let read =
                match tokio::time::timeout_at(deadline, store.get(&self.key, rt.now_ms())).await {
                    Ok(read) if rt.now_ms() < deadline_ms => read,
                    _ => break,
                };
            let (pause, error) = match read {
                Ok(None) => {
                    if let Some(fence) = released {
                        // A release that was applied although its answer failed.
                        self.released(rt, fence).await;
                        return;
                    }
                    // The claim may still be on its way to the store (a statement the server runs
                    // on after its client went away): ask again before concluding.
                    match absent.next() {
                        Some(pause) => (*pause, None),
                        None => {
                            tracing::debug!(target: "samekey", call_id = %self.call_id,
                                key = %self.key.short(), attempt = 0u32, "unanswered claim was never written");
                            return;
                        }
                    }
                }
                Ok(Some(record))
                    if written_as_sent(&record, &self.call_id, self.stamped_ms, caller_clock) =>
                {
                    released = Some(record.fence.0);
                    match store.release(&self.key, record.fence).await {
                        Ok(()) => {
                            self.released(rt, record.fence.0).await;
                            return;
                        }
                        // Another owner holds the key now: it resolves it.
                        Err(e) if e.lost_key() => return,
                        Err(e) => (backoff.delay(n, &mut rng), Some(e)),
                    }
                }
                // Another call's record (or one that moved on): this claim was never written, was
                // given back by a release whose answer failed, or is no longer a claim nobody ran
                // under.
                Ok(Some(_)) => {
                    if let Some(fence) = released {
                        self.released(rt, fence).await;
                    }
                    return;
                }
                Err(e) => (backoff.delay(n, &mut rng), Some(e)),
            };
            if let Some(error) = error {
                tracing::debug!(target: "samekey", call_id = %self.call_id, key = %self.key.short(),
                    attempt = 0u32, error = %error, pause_ms = ms(pause), "unanswered claim: store failed; asking again");
            }
            if Instant::now() + pause >= deadline {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        tracing::warn!(target: "samekey", call_id = %self.call_id, key = %self.key.short(),
            attempt = 0u32, why = %self.why,
            "claim unanswered and not settled within 7/8 of its lease; it is left to its lease");
    }

    /// Logs and journals the release.
    async fn released(&self, rt: &Runtime, fence: u64) {
        tracing::info!(target: "samekey", call_id = %self.call_id, key = %self.key.short(),
            attempt = 0u32, fence, why = %self.why, "gave back a claim whose answer never came; nothing ran");
        let event = |at_ms, what| Event {
            call_id: self.call_id.clone(),
            at_ms,
            node: rt.node().to_owned(),
            what,
        };
        let events = [
            event(self.stamped_ms, EventKind::Claimed { fence }),
            event(
                rt.now_ms(),
                EventKind::Released {
                    reason: format!("the claim's answer never came ({}); nothing ran", self.why),
                    by: "call".to_owned(),
                },
            ),
        ];
        if let Err(e) = rt
            .store()
            .append_journal(&self.key, &events, self.keep_ms, rt.now_ms())
            .await
        {
            tracing::warn!(target: "samekey", call_id = %self.call_id, key = %self.key.short(),
                attempt = 0u32, error = %e, "could not journal the release of an unanswered claim");
        }
    }
}
