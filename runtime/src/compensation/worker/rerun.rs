//! The re-run of a call the remote side never received ([`NotReceivedPolicy::Rerun`]): sent again under its
//! callId (the remote deduplicates by it) once the worker confirmed under its fence that the key is
//! still its own, its key's lease kept alive while it runs, and what it answers recorded.
//!
//! [`NotReceivedPolicy::Rerun`]: crate::compensation::NotReceivedPolicy::Rerun

use super::{Compensator, Counter, Work};
use crate::classify::RemoteStatus;
use crate::codec::message_bytes;
use crate::compensation::entry::CompensationEntry;
use crate::compensation::operations::CompensationOperation;
use crate::error::Error;
use crate::journal::{CompensationStep, EventKind};
use crate::receipt::{Fence, ReceiptState};

impl Compensator {
    /// Sends a call not received again under its callId, and records what it answers.
    pub(super) async fn rerun(
        &self,
        entry: CompensationEntry,
        fence: Fence,
        operation: &CompensationOperation,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let Some(rerun) = operation.rerun.clone() else {
            let why = "not received, and no re-run is registered";
            return self.escalate_held(entry, fence, why, w).await;
        };
        // The wait for the lookup's answer is where a worker stalls past its lease while a duplicate
        // takes the call over and sends it: still the call's owner, under its fence, before
        // anything is sent again?
        if !self.still_owner(&entry, fence, w).await? {
            return Ok(());
        }
        tracing::info!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
            attempt = 0u32, round = entry.round, "compensation: not received; sending it again");
        let answer = self
            .owner(&entry, fence)
            .keep_alive(std::pin::pin!(rerun(entry.clone())))
            .await;
        let detail = match &answer {
            Ok(RemoteStatus::Succeeded(_)) => "succeeded".to_owned(),
            Ok(RemoteStatus::Failed(e)) => format!("failed: {e}"),
            Ok(_) => "undecided".to_owned(),
            Err(e) => format!("no answer: {e}"),
        };
        let step = EventKind::Compensation {
            round: entry.round,
            step: CompensationStep::Rerun,
            detail,
        };
        w.note(self.rt.event(&entry.call_id, step));
        let (state, bytes, counter): (ReceiptState, Option<Vec<u8>>, Counter) = match answer {
            Ok(RemoteStatus::Succeeded(bytes)) => {
                (ReceiptState::Success, bytes, |p| &mut p.succeeded)
            }
            Ok(RemoteStatus::Failed(message)) => {
                (ReceiptState::Failed, Some(message_bytes(&message)), |p| {
                    &mut p.failed
                })
            }
            Ok(_) | Err(_) => {
                return self
                    .undecided(entry, fence, "the re-run did not settle the call", w)
                    .await;
            }
        };
        let written = self
            .record(&entry, fence, state, bytes, operation.ttl)
            .await;
        let recorded = EventKind::Recorded {
            state,
            by: "compensation".to_owned(),
        };
        self.settled(entry, written, recorded, counter, w).await
    }
}
