//! The drop guard: what a run dropped mid-way (its future cancelled) does with the key it owns.
//!
//! # Guarantees
//!
//! * Told apart by the call's phase: a claim still on its way is given back if it was written (under
//!   the call's own callId); a known outcome being written is written; an attempt that may have run,
//!   or any uncertain outcome, is marked `UNKNOWN` and queued; only a call whose every attempt was
//!   refused before taking effect releases its claim.
//! * The work runs in a task of its own; without a tokio runtime to run it, the lease runs out and
//!   the next call resolves the key through `lookup`.

use std::sync::Arc;

use crate::clock::ms;
use crate::journal::{Event, EventKind};
use crate::receipt::ReceiptState;
use crate::store::Completion;

use super::give_up::leave_unknown;
use super::record::finish_compensation;
use super::{Call, Phase};

/// What the drop guard of a cancelled run does with the key it owns.
enum Leftover {
    /// Every attempt was refused before taking effect: release the claim.
    Release,
    /// The outcome is known: record it.
    Record(ReceiptState, Option<Arc<[u8]>>),
    /// An attempt may have run: mark `UNKNOWN` and queue for compensation.
    Unknown,
}

impl<T, E> Drop for Call<T, E> {
    fn drop(&mut self) {
        if std::mem::take(&mut self.place.admitted) {
            self.place.dependency.limiter.leave();
        }
        let (fence, leftover) = match std::mem::replace(&mut self.phase, Phase::Free) {
            Phase::Free => return,
            Phase::Claiming(sent) => {
                self.unanswered(sent, "its caller went away".to_owned());
                return;
            }
            Phase::Recording {
                fence,
                state,
                outcome,
            } => (fence, Leftover::Record(state, outcome)),
            Phase::Attempting(fence) => (fence, Leftover::Unknown),
            Phase::JustClaimed(fence) | Phase::Owner(fence) if self.tally.uncertain => {
                (fence, Leftover::Unknown)
            }
            Phase::JustClaimed(fence) | Phase::Owner(fence) => (fence, Leftover::Release),
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let rt = self.rt.clone();
        let key = self.ids.key.clone();
        let call_id = self.ids.call_id.clone();
        let took_over = self.tally.took_over;
        let ttl = ms(self.spec.ttl);
        let mut journal = std::mem::take(&mut self.trail.journal);
        let mut entry = self.entry(String::new(), self.rt.now_ms());
        handle.spawn(async move {
            let store = rt.store();
            let now = rt.now_ms();
            let (what, result) = match leftover {
                Leftover::Release => ("released", store.release(&key, fence).await),
                Leftover::Record(state, outcome) => {
                    let completion = Completion {
                        state,
                        outcome,
                        ttl_ms: ttl,
                    };
                    match store.complete(&key, fence, completion, now).await {
                        Ok(_) => {
                            if took_over {
                                finish_compensation(&rt, &key, &call_id).await;
                            }
                            ("recorded its outcome", Ok(()))
                        }
                        // Another owner holds the key: it resolves the call.
                        Err(e) if e.lost_key() => ("left to the owner that took it over", Err(e)),
                        Err(e) => {
                            entry.reason = format!(
                                "call was cancelled; its outcome {state} could not be recorded: {e}"
                            );
                            let left = leave_unknown(store, fence, entry, now).await;
                            ("marked unknown", left)
                        }
                    }
                }
                Leftover::Unknown => {
                    entry.reason = "call was cancelled".to_owned();
                    let left = leave_unknown(store, fence, entry, now).await;
                    ("marked unknown", left)
                }
            };
            journal.push(Event {
                call_id: call_id.clone(),
                at_ms: rt.now_ms(),
                node: rt.node().to_owned(),
                what: EventKind::Cancelled {
                    left: what.to_owned(),
                },
            });
            if let Err(e) = store.append_journal(&key, &journal, ttl, rt.now_ms()).await {
                call_event!(WARN, call_id, key, 0u32;
                    error = %e, "could not write the cancelled call's journal");
            }
            match result {
                Ok(()) => call_event!(WARN, call_id, key, 0u32;
                    what, "call dropped before it finished"),
                Err(e) => call_event!(ERROR, call_id, key, 0u32;
                    what, error = %e, "call dropped before it finished; the store refused its last write"),
            }
        });
    }
}
