//! The reversal of a call the remote side never received ([`NotReceivedPolicy::Reverse`]): at most once per
//! call and never beside an execution — its intent journaled first, the key's ownership confirmed, its
//! lease kept alive while it runs — then the call recorded `FAILED`.
//!
//! [`NotReceivedPolicy::Reverse`]: crate::compensation::NotReceivedPolicy::Reverse

use super::{Compensator, Work};
use crate::clock::ms;
use crate::codec::message_bytes;
use crate::compensation::entry::CompensationEntry;
use crate::compensation::operations::CompensationOperation;
use crate::error::Error;
use crate::journal::{CompensationStep, EventKind};
use crate::receipt::{Fence, ReceiptState};
use crate::takeover::{self, Reversal as Begun};

impl Compensator {
    /// Runs the operation's reversal for a call not received, at most once (see
    /// [`CompensationOperation::reversal`]), then records the call `FAILED`.
    pub(super) async fn reverse(
        &self,
        entry: CompensationEntry,
        fence: Fence,
        operation: &CompensationOperation,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let Some(reversal) = operation.reversal.clone() else {
            let why = "not received, and no reversal is registered";
            return self.escalate_held(entry, fence, why, w).await;
        };
        let store = self.rt.store();
        // The intent first, durably: should this worker die while the reversal runs, the next one
        // finds it and does not run it again.
        let intent = self.rt.event(
            &entry.call_id,
            EventKind::Compensation {
                round: entry.round,
                step: CompensationStep::Reversing,
                detail: String::new(),
            },
        );
        let keep = ms(self.keep(&entry.key));
        let mut steps = std::mem::take(&mut w.steps);
        steps.push(intent);
        if let Err(e) = store
            .append_journal(&entry.key, &steps, keep, self.rt.now_ms())
            .await
        {
            tracing::warn!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
                attempt = 0u32, error = %e, "compensation: could not journal the reversal's intent; not reversing");
            // The steps before it are written with the entry's others; the intent is not (nothing
            // ran).
            steps.pop();
            w.steps = steps;
            let why = "the reversal's intent could not be journaled";
            return self.undecided(entry, fence, why, w).await;
        }
        // Then, after the intent: still the call's owner? A worker that stalled past its lease is
        // fenced out here, before anything runs (its successor reads the intent).
        if !self.still_owner(&entry, fence, w).await? {
            return Ok(());
        }
        tracing::info!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
            attempt = 0u32, round = entry.round, "compensation: not received; reversing");
        // Its lease kept alive for as long as it runs: a duplicate that took the key over meanwhile
        // would hear "not received" too, and send the call while it is being reversed.
        let reversing = std::pin::pin!(reversal(entry.clone()));
        match self.owner(&entry, fence).keep_alive(reversing).await {
            Ok(()) => {
                let done = EventKind::Compensation {
                    round: entry.round,
                    step: CompensationStep::Reversed,
                    detail: String::new(),
                };
                w.note(self.rt.event(&entry.call_id, done));
                // A callback that came while it ran (refused: the key was this worker's) says the
                // counterparty's side of it: a person reconciles the two.
                let open = takeover::open_reversal(&self.rt, &entry.key, &entry.call_id).await;
                let disputed = !matches!(
                    open,
                    Ok(None
                        | Some(Begun {
                            disputed: false,
                            ..
                        }))
                );
                if disputed {
                    let why = "a callback reported the call's outcome while its reversal ran (or the journal could not say): reconcile them by hand";
                    return self.escalate_held(entry, fence, why, w).await;
                }
                self.reversed(entry, fence, operation, w).await
            }
            Err(e) if e.nothing_ran => {
                tracing::warn!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
                    attempt = 0u32, error = %e.message, "compensation: the reversal failed");
                let failed = EventKind::Compensation {
                    round: entry.round,
                    step: CompensationStep::ReversalFailed,
                    detail: e.message.clone(),
                };
                w.note(self.rt.event(&entry.call_id, failed));
                let why = format!("the reversal failed: {}", e.message);
                self.undecided(entry, fence, &why, w).await
            }
            Err(e) => {
                // It may have acted (its answer was lost): the intent stays the newest step, so the
                // reversal stays open — no taker sends the call beside it, none reverses it again —
                // and a person checks what it did.
                tracing::warn!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
                    attempt = 0u32, error = %e.message,
                    "compensation: the reversal's outcome is unknown; escalating");
                let why = format!(
                    "the reversal's outcome is unknown ({}): it may have run; check it before resolving",
                    e.message
                );
                self.escalate_held(entry, fence, &why, w).await
            }
        }
    }

    /// Whether the worker still owns the entry's key under `fence`, confirmed by extending its lease
    /// (before it acts: after a wait, it may have stalled past the lease while another took the call
    /// over). `false` counts the entry as lost to this worker.
    pub(super) async fn still_owner(
        &self,
        entry: &CompensationEntry,
        fence: Fence,
        w: &mut Work<'_>,
    ) -> Result<bool, Error> {
        match self
            .rt
            .store()
            .extend_lease(&entry.key, fence, ms(self.lease), self.rt.now_ms())
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if e.lost_key() => {
                w.pass.lost += 1;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Records a reversed call `FAILED` and removes its entry.
    pub(super) async fn reversed(
        &self,
        entry: CompensationEntry,
        fence: Fence,
        operation: &CompensationOperation,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let message = "not received by the remote side; reversed by compensation";
        let written = self
            .record(
                &entry,
                fence,
                ReceiptState::Failed,
                Some(message_bytes(message)),
                operation.ttl,
            )
            .await;
        let recorded = EventKind::Recorded {
            state: ReceiptState::Failed,
            by: "compensation".to_owned(),
        };
        self.settled(entry, written, recorded, |p| &mut p.reversed, w)
            .await
    }
}
