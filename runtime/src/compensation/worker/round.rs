//! One round of one taken entry: the worker takes the call's key over, asks the remote side, and
//! records the answer — or leaves the call `UNKNOWN` and the entry to its next round, and escalates it
//! to `MANUAL` after the last.

use std::time::Duration;

use super::{completion, Compensator, Counter, PassReport, Work};
use crate::classify::RemoteStatus;
use crate::clock::ms;
use crate::codec::message_bytes;
use crate::compensation::contradiction;
use crate::compensation::entry::{CompensationEntry, CompensationState};
use crate::compensation::operations::NotReceivedPolicy;
use crate::error::{Error, StoreError};
use crate::journal::{CompensationStep, EventKind, LookupOutcome};
use crate::receipt::{Fence, ReceiptState};
use crate::takeover::{self, Reversal as Begun, TakenOver};

impl Compensator {
    /// Works one taken entry: take the call's key over, ask, record — or put it back for later.
    pub(super) async fn work(
        &self,
        entry: CompensationEntry,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let store = self.rt.store();
        let now = self.rt.now_ms();
        let Some(record) = self.record_of(&entry.key, &entry.call_id).await? else {
            // Gone, or the key is another call's now: this call was settled (or expired) elsewhere.
            return self.settled_elsewhere(&entry, w).await;
        };
        if record.state.is_terminal() {
            return self.found_settled(entry, record.state, w).await;
        }
        let Some(operation) = self.operations.get(entry.key.scope()).cloned() else {
            let reason = format!("no operation registered for scope `{}`", entry.key.scope());
            return self.later(entry, &reason, w).await;
        };
        let fence = match takeover::take_over(&self.rt, &record, ms(self.lease), now).await? {
            TakenOver::Acquired(fence) => fence,
            // Settled meanwhile (a duplicate, a callback), or gone, or another call's now.
            TakenOver::Existing(r) if r.call_id != entry.call_id => {
                return self.settled_elsewhere(&entry, w).await;
            }
            TakenOver::Existing(r) if r.state.is_terminal() => {
                return self.found_settled(entry, r.state, w).await;
            }
            TakenOver::Gone => return self.settled_elsewhere(&entry, w).await,
            // A call holds the key and runs: it settles the entry, or the next round looks again.
            TakenOver::Existing(_) => {
                return self
                    .later(entry, "the call's key is held by a running call", w)
                    .await;
            }
            // A reversal an earlier worker began: done and undisputed (record it), interrupted (never
            // run twice), or disputed by a callback meanwhile (the counterparty says otherwise).
            TakenOver::Reversal { fence, reversal } => {
                let why = match reversal {
                    Begun {
                        step: CompensationStep::Reversed,
                        disputed: false,
                    } => return self.reversed(entry, fence, &operation, w).await,
                    Begun { disputed: true, .. } => {
                        "a callback reported the call's outcome while its reversal ran: the two may disagree; reconcile them by hand"
                    }
                    Begun { .. } => {
                        "a reversal an earlier worker began has no end in the journal: it may have run; check it before resolving"
                    }
                };
                return self.escalate_held(entry, fence, why, w).await;
            }
        };
        tracing::info!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
            attempt = 0u32, round = entry.round, fence = fence.0, "compensation: asking the receipt");
        // The key kept for as long as the lookup runs (a duplicate that took it over would send the
        // call), and the lookup bounded (one that never answers would hold up the pass).
        let asking = std::pin::pin!((operation.lookup)(entry.call_id.clone()));
        let owner = self.owner(&entry, fence);
        let kept = owner.keep_alive(asking);
        let answer = match tokio::time::timeout(self.lookup_timeout, kept).await {
            Ok(answer) => answer,
            Err(_) => Err(format!(
                "the lookup did not answer within {}",
                humane(self.lookup_timeout)
            )),
        };
        let (seen, error) = match &answer {
            Ok(RemoteStatus::Succeeded(_)) => (LookupOutcome::Succeeded, None),
            Ok(RemoteStatus::Failed(_)) => (LookupOutcome::Failed, None),
            Ok(RemoteStatus::NotReceived) => (LookupOutcome::NotReceived, None),
            Ok(RemoteStatus::Processing) => (LookupOutcome::Processing, None),
            Err(e) => (LookupOutcome::NoAnswer, Some(e.clone())),
        };
        let taken = EventKind::Compensation {
            round: entry.round,
            step: CompensationStep::Taken,
            detail: String::new(),
        };
        let asked = EventKind::Lookup {
            answer: seen,
            error,
        };
        w.note(self.rt.event(&entry.call_id, taken));
        w.note(self.rt.event(&entry.call_id, asked));
        let ttl = operation.ttl;
        let (written, counter): (Result<(), StoreError>, Counter) = match answer {
            Ok(RemoteStatus::Succeeded(bytes)) => (
                self.record(&entry, fence, ReceiptState::Success, bytes, ttl)
                    .await,
                |p| &mut p.succeeded,
            ),
            Ok(RemoteStatus::Failed(message)) => (
                self.record(
                    &entry,
                    fence,
                    ReceiptState::Failed,
                    Some(message_bytes(&message)),
                    ttl,
                )
                .await,
                |p| &mut p.failed,
            ),
            Ok(RemoteStatus::NotReceived) => match operation.not_received {
                NotReceivedPolicy::Reverse => {
                    return self.reverse(entry, fence, &operation, w).await
                }
                NotReceivedPolicy::Rerun => return self.rerun(entry, fence, &operation, w).await,
                NotReceivedPolicy::Hold => {
                    let why = "not received yet; its first request may still arrive, so the key is kept (a re-run under its callId, or a person, settles it)";
                    return self.undecided(entry, fence, why, w).await;
                }
                NotReceivedPolicy::Release { refused_after }
                | NotReceivedPolicy::Fail { refused_after } => {
                    if let Some(why) = self.still_acceptable(&entry, refused_after).await? {
                        return self.undecided(entry, fence, &why, w).await;
                    }
                    if matches!(operation.not_received, NotReceivedPolicy::Release { .. }) {
                        (store.release(&entry.key, fence).await, |p| &mut p.released)
                    } else {
                        let message = "not received by the remote side, which refuses it now; given up by compensation";
                        (
                            self.record(
                                &entry,
                                fence,
                                ReceiptState::Failed,
                                Some(message_bytes(message)),
                                ttl,
                            )
                            .await,
                            |p| &mut p.failed,
                        )
                    }
                }
            },
            Ok(RemoteStatus::Processing) | Err(_) => {
                if let Err(e) = &answer {
                    tracing::info!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
                        attempt = 0u32, error = %e, "compensation: lookup failed");
                }
                // Undecided: the call goes back to UNKNOWN, the entry to a later round.
                return self
                    .undecided(entry, fence, "the remote side has not decided yet", w)
                    .await;
            }
        };
        let settled = match seen {
            LookupOutcome::Succeeded => EventKind::Recorded {
                state: ReceiptState::Success,
                by: "compensation".to_owned(),
            },
            LookupOutcome::NotReceived
                if matches!(operation.not_received, NotReceivedPolicy::Release { .. }) =>
            {
                EventKind::Released {
                    reason: "not received by the remote side, which refuses it now".to_owned(),
                    by: "compensation".to_owned(),
                }
            }
            _ => EventKind::Recorded {
                state: ReceiptState::Failed,
                by: "compensation".to_owned(),
            },
        };
        self.settled(entry, written, settled, counter, w).await
    }

    /// Why a call not received may still be: its first request could arrive and take effect until its
    /// callId is `refused_after` old (by the store's clock where nodes share one). `None` once the
    /// remote refuses it.
    async fn still_acceptable(
        &self,
        entry: &CompensationEntry,
        refused_after: Duration,
    ) -> Result<Option<String>, Error> {
        let now = self.rt.store().now_ms(self.rt.now_ms()).await?;
        let refused_from = entry.call_id.unix_ms().saturating_add(ms(refused_after));
        Ok((now < refused_from).then(|| {
            format!(
                "not received yet; its first request may still arrive for {} more (the remote refuses it after {})",
                humane(Duration::from_millis(refused_from - now)),
                humane(refused_after),
            )
        }))
    }

    /// After the worker's write of a call's outcome: journaled and the entry removed, or — fenced out
    /// of the key, another owner holds the call — the entry to a later round.
    pub(super) async fn settled(
        &self,
        entry: CompensationEntry,
        written: Result<(), StoreError>,
        what: EventKind,
        counter: Counter,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        match written {
            Ok(()) => {
                w.note(self.rt.event(&entry.call_id, what));
                self.finish(&entry, w, counter).await
            }
            Err(StoreError::Fenced { .. }) => {
                self.later(entry, "the call's key was taken over meanwhile", w)
                    .await
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Puts the call of an entry the worker holds under `fence` back to `UNKNOWN` (a duplicate
    /// still asks first); a worker fenced out meanwhile leaves it to the key's owner.
    async fn back_to_unknown(&self, entry: &CompensationEntry, fence: Fence) -> Result<(), Error> {
        match self
            .rt
            .store()
            .mark_unknown(&entry.key, fence, self.rt.now_ms())
            .await
        {
            Ok(_) | Err(StoreError::Fenced { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Records the call's outcome under the worker's fence on its key.
    pub(super) async fn record(
        &self,
        entry: &CompensationEntry,
        fence: Fence,
        state: ReceiptState,
        bytes: Option<Vec<u8>>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let now = self.rt.now_ms();
        self.rt
            .store()
            .complete(&entry.key, fence, completion(state, bytes, ttl), now)
            .await
            .map(drop)
    }

    /// Removes a settled entry, counting it under `counter`.
    async fn finish(
        &self,
        entry: &CompensationEntry,
        w: &mut Work<'_>,
        counter: Counter,
    ) -> Result<(), Error> {
        match self
            .rt
            .store()
            .finish_compensation(&entry.call_id, Some(entry.fence))
            .await
        {
            Ok(()) => {
                *counter(w.pass) += 1;
                // A contradiction reported while this worker settled the call found the entry
                // still queued (and queued nothing): it is queued again.
                contradiction::requeue_if_contradicted(&self.rt, &entry.key, &entry.call_id).await;
            }
            Err(StoreError::Fenced { .. }) => w.pass.lost += 1,
            Err(e) => return Err(e.into()),
        }
        tracing::info!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
            attempt = 0u32, round = entry.round, "compensation: settled");
        Ok(())
    }

    /// Removes the entry of a call settled elsewhere meanwhile (a duplicate, a callback, its owner).
    /// An entry whose call's record is settled (`state`): done — unless what happened contradicts the
    /// record (see [`Compensator::contradicted`]): then a person must reconcile the two, and the entry
    /// goes `MANUAL` through the escalation hook.
    async fn found_settled(
        &self,
        entry: CompensationEntry,
        state: ReceiptState,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        if self.contradicted(&entry, state).await? {
            let why = format!("the call is recorded {state}, but what happened contradicts it: reconcile by hand (resolve it toward what happened)");
            return self.escalate_entry(entry, &why, w).await;
        }
        self.settled_elsewhere(&entry, w).await
    }

    /// Whether what happened to the call of `entry` contradicts its record (`state`): the entry is
    /// marked so ([`contradiction::marked`]), or the call's journal reports it (its owner's
    /// [`EventKind::Contradicted`], a refused callback). A journal that cannot be read (an event a
    /// newer release wrote) is logged, and the entry's marker alone decides: one unreadable event
    /// must not stop the worker's passes.
    pub(super) async fn contradicted(
        &self,
        entry: &CompensationEntry,
        state: ReceiptState,
    ) -> Result<bool, StoreError> {
        if contradiction::marked(entry, state) {
            return Ok(true);
        }
        match self
            .rt
            .store()
            .journal_of_call(&entry.call_id, self.rt.now_ms())
            .await
        {
            Ok(events) => Ok(contradiction::reported(&events, state)),
            Err(StoreError::Corrupt(e)) => {
                tracing::warn!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
                    attempt = 0u32, error = %e, "compensation: the call's journal cannot be read");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    async fn settled_elsewhere(
        &self,
        entry: &CompensationEntry,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let step = EventKind::Compensation {
            round: entry.round,
            step: CompensationStep::SettledElsewhere,
            detail: String::new(),
        };
        w.note(self.rt.event(&entry.call_id, step));
        self.finish(entry, w, |p| &mut p.settled_elsewhere).await
    }

    /// Leaves a call undecided this round: back to `UNKNOWN` (a duplicate still asks first), and the
    /// entry to its next round.
    pub(super) async fn undecided(
        &self,
        entry: CompensationEntry,
        fence: Fence,
        why: &str,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        self.back_to_unknown(&entry, fence).await?;
        self.later(entry, why, w).await
    }

    /// Puts an undecided entry to its next round, or escalates it after the last.
    async fn later(
        &self,
        entry: CompensationEntry,
        why: &str,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let Some(delay) = self.rounds.get(entry.round as usize).copied() else {
            return self.escalate_entry(entry, why, w).await;
        };
        let round = entry.round.saturating_add(1);
        let done = self
            .rt
            .store()
            .reschedule_compensation(
                &entry.call_id,
                entry.fence,
                round,
                ms(delay),
                self.rt.now_ms(),
            )
            .await;
        if done.is_ok() {
            w.pass.rescheduled += 1;
            tracing::info!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
                attempt = 0u32, round, delay_ms = ms(delay), why, "compensation: next round");
            let step = EventKind::Compensation {
                round,
                step: CompensationStep::Rescheduled,
                detail: format!("{why}; next round in {}", humane(delay)),
            };
            w.note(self.rt.event(&entry.call_id, step));
        }
        lost_or(done, w.pass)
    }

    /// Escalates at once the entry of a call whose key the worker holds under `fence`: the call goes
    /// back to `UNKNOWN` (a duplicate asks first), the entry to `MANUAL`.
    pub(super) async fn escalate_held(
        &self,
        entry: CompensationEntry,
        fence: Fence,
        why: &str,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        self.back_to_unknown(&entry, fence).await?;
        self.escalate_entry(entry, why, w).await
    }

    /// Marks an entry `MANUAL` for a person, and runs the escalation hook: once the store said the
    /// entry is `MANUAL`, and also when its answer was lost (the entry may be `MANUAL`, and no worker
    /// takes a `MANUAL` entry again; if the write did not apply, the entry's next take escalates it
    /// again and the hook runs a second time — twice rather than never). Not when another worker took
    /// the entry meanwhile (its round escalates it) or it is gone.
    async fn escalate_entry(
        &self,
        mut entry: CompensationEntry,
        why: &str,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let done = self
            .rt
            .store()
            .escalate_compensation(&entry.call_id, entry.fence, self.rt.now_ms())
            .await;
        if !matches!(done, Err(StoreError::Fenced { .. } | StoreError::NotFound)) {
            w.pass.escalated += 1;
            tracing::warn!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
                attempt = 0u32, rounds = entry.round, why, answer_lost = done.is_err(),
                "compensation: needs a person (MANUAL)");
            let step = EventKind::Compensation {
                round: entry.round,
                step: CompensationStep::Escalated,
                detail: why.to_owned(),
            };
            w.note(self.rt.event(&entry.call_id, step));
            entry.state = CompensationState::Manual;
            if let Some(hook) = &self.escalate {
                hook(&entry);
            }
            if done.is_err() {
                return Ok(());
            }
        }
        lost_or(done, w.pass)
    }
}

/// A fenced write of an entry: refused (another worker took it, or it is gone) counts as lost.
fn lost_or(done: Result<(), StoreError>, pass: &mut PassReport) -> Result<(), Error> {
    match done {
        Ok(()) => Ok(()),
        Err(StoreError::Fenced { .. } | StoreError::NotFound) => {
            pass.lost += 1;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// A delay as people write it: `90s`, `5m`, `2h`.
fn humane(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{}ms", d.as_millis()),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
