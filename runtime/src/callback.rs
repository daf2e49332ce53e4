//! Callbacks: the other side tells, once or ten times, in any order, what became of a call.
//! [`Runtime::apply_callback`] moves the call's receipt to that outcome at most once.
//!
//! # Guarantees
//!
//! * **Forward only, re-entrant.** The first delivery records the outcome (`Applied`); a repeat of the
//!   same outcome changes nothing (`AlreadyApplied`); a delivery that would move a finished receipt
//!   to another outcome (`SUCCESS` → `FAILED`, `FAILED` → `SUCCESS`) is refused with
//!   [`Error::TransitionRefused`] and changes nothing — and, the first time, queues the call for a
//!   person: the worker marks it `MANUAL` and runs the escalation hook.
//! * **One writer.** An `UNKNOWN` call, or one whose owner's lease ended, is taken over (a new receipt
//!   fence) before the outcome is written: the owner, should it come back, is fenced out and answers
//!   the recorded outcome. A call whose owner is still running is waited for (bounded), then judged.
//! * **Across processes**, on every store: the store's atomic take-over and fenced completion decide.

use std::time::Duration;

use serde::Serialize;

use crate::call_id::CallId;
use crate::clock::ms;
use crate::codec::message_bytes;
use crate::compensation::contradiction;
use crate::error::{Error, StoreError};
use crate::journal::{Event, EventKind};
use crate::receipt::ReceiptState;
use crate::runtime::Runtime;
use crate::store::Completion;
use crate::takeover::{self, TakenOver};

/// What a callback says became of a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Callback {
    state: ReceiptState,
    outcome: Vec<u8>,
    ttl: Duration,
}

impl Callback {
    /// It took effect with `value` (what the function would have returned: duplicates replay it).
    pub fn succeeded<T: Serialize>(value: &T) -> Result<Callback, Error> {
        let outcome = crate::codec::stored_json(value).map_err(|e| {
            Error::Store(StoreError::Corrupt(format!(
                "the callback's value cannot be encoded: {e}"
            )))
        })?;
        Ok(Callback {
            state: ReceiptState::Success,
            outcome,
            ttl: Duration::from_secs(24 * 60 * 60),
        })
    }

    /// It failed for good, with this message (duplicates get `samekey::Error::Failed`).
    pub fn failed(message: impl std::fmt::Display) -> Callback {
        Callback {
            state: ReceiptState::Failed,
            outcome: message_bytes(&message.to_string()),
            ttl: Duration::from_secs(24 * 60 * 60),
        }
    }

    /// How long the recorded outcome is kept: the function's `ttl` (default 24 h).
    pub fn ttl(mut self, ttl: Duration) -> Callback {
        self.ttl = ttl;
        self
    }
}

/// What a delivery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// This delivery recorded the outcome.
    Applied,
    /// The receipt already had this outcome: nothing changed.
    AlreadyApplied,
}

/// How many times a delivery looks at a receipt that others keep changing before it gives up.
const MAX_LOOKS: u32 = 16;

impl Runtime {
    /// A callback about a call whose reversal was begun: the provider's word and the reversal may
    /// disagree, and that is a person's to settle — the worker reads this refusal in the journal and
    /// escalates the entry. Journaled once: repeats are not, so that a provider that keeps delivering
    /// cannot push the reversal's intent out of the bounded journal.
    async fn dispute(
        &self,
        key: &crate::key::Key,
        call_id: &CallId,
        callback: &Callback,
        reversal: takeover::Reversal,
    ) {
        tracing::warn!(target: "samekey", call_id = %call_id, key = %key.short(),
            attempt = 0u32, state = %callback.state,
            "callback not applied: a reversal of the call was begun; left to a person");
        if !reversal.disputed {
            let refused = EventKind::CallbackRefused {
                from: ReceiptState::Unknown,
                to: callback.state,
            };
            self.journal(key, &[self.event(call_id, refused)], callback.ttl)
                .await;
        }
    }

    /// A callback that contradicts the call's recorded outcome (`FAILED` recorded, the provider says it
    /// took effect; or the other way round): the record is what duplicates replay, so a person must
    /// reconcile the two. The first such callback is journaled ([`EventKind::CallbackRefused`]) and
    /// queues the call for compensation, marked, whose worker marks the entry `MANUAL` and runs the
    /// escalation hook; repeats are not journaled (a provider that keeps delivering must not push the
    /// journal's history out) and queue it again only if the first queueing failed — never once a
    /// person resolved it.
    async fn contradicted(&self, record: &crate::receipt::Receipt, callback: &Callback) {
        let (call_id, key) = (&record.call_id, &record.key);
        tracing::warn!(target: "samekey", call_id = %call_id, key = %key.short(),
            attempt = 0u32, from = %record.state, to = %callback.state,
            "callback refused: it contradicts the recorded outcome; left to a person");
        // A journal that cannot be read says nothing: report it (twice rather than never).
        let events = self
            .store()
            .journal_of_call(call_id, self.now_ms())
            .await
            .unwrap_or_default();
        let refused = |event: &Event| {
            matches!(event.what, EventKind::CallbackRefused { from, to }
                if from == record.state && to == callback.state)
        };
        let reported = events.iter().rposition(refused);
        if let Some(at) = reported {
            if events[at..]
                .iter()
                .any(|event| matches!(event.what, EventKind::Resolved { .. }))
            {
                // A person settled it since: the provider's repeats page no one again.
                return;
            }
        } else {
            let refused = EventKind::CallbackRefused {
                from: record.state,
                to: callback.state,
            };
            self.journal(key, &[self.event(call_id, refused)], callback.ttl)
                .await;
        }
        // Journaled first, queued second (see `compensation::contradiction`); queued again on a
        // repeat, in case the first queueing failed: a call queued already stays as it is.
        let reason = format!(
            "a callback says {}, but the call is recorded {}: reconcile by hand",
            callback.state, record.state
        );
        let entry = contradiction::entry(call_id, key, record.state, reason, self.now_ms());
        if let Err(e) = self.store().enqueue_compensation(entry).await {
            tracing::error!(target: "samekey", call_id = %call_id, key = %key.short(),
                attempt = 0u32, error = %e, "could not queue the contradiction for a person");
        }
    }

    /// Applies a callback about `call_id` to its receipt, at most once (see the [module
    /// docs](crate::callback)). Run the downstream work (ship the order) after `Applied` **and** after
    /// `AlreadyApplied`, through an `#[idempotent]` function keyed by the business reference: it then
    /// runs once however many deliveries come, and a process that crashed between recording and
    /// shipping ships on the provider's next delivery.
    ///
    /// Errors: [`Error::TransitionRefused`] for a backwards delivery, [`Error::NoReceipt`] when the
    /// store knows no receipt of `call_id` (never made here, or expired), [`Error::InProgress`] when
    /// the call's owner (or a worker reversing it) kept running through the runtime's busy wait,
    /// [`Error::Unknown`] when a reversal of the call was begun (compensation settles it),
    /// [`Error::Store`].
    pub async fn apply_callback(
        &self,
        call_id: &CallId,
        callback: Callback,
    ) -> Result<Applied, Error> {
        let store = self.store();
        let mut record = store
            .get_by_call_id(call_id)
            .await?
            .ok_or_else(|| Error::NoReceipt {
                call_id: call_id.clone(),
            })?;
        for _ in 0..MAX_LOOKS {
            if record.call_id != *call_id {
                // The key belongs to another call now: this one's receipt is gone.
                return Err(Error::NoReceipt {
                    call_id: call_id.clone(),
                });
            }
            // The lease is judged by the store's clock where nodes share it, as the store will.
            let now = store.now_ms(self.now_ms()).await?;
            if record.state.is_terminal() {
                if record.state == callback.state {
                    tracing::info!(target: "samekey", call_id = %call_id, key = %record.key.short(),
                        attempt = 0u32, state = %record.state, "callback: already applied");
                    let repeat = EventKind::Callback {
                        state: callback.state,
                        applied: false,
                    };
                    self.journal(&record.key, &[self.event(call_id, repeat)], callback.ttl)
                        .await;
                    return Ok(Applied::AlreadyApplied);
                }
                self.contradicted(&record, &callback).await;
                return Err(Error::TransitionRefused {
                    call_id: call_id.clone(),
                    from: record.state,
                    to: callback.state,
                });
            }
            if record.lease_alive(now) {
                // The owner is still running: its own outcome, or its lease's end, comes first.
                let wait = self.busy_wait();
                record = match store.wait_settled(&record.key, wait, now).await? {
                    None => {
                        return Err(Error::NoReceipt {
                            call_id: call_id.clone(),
                        })
                    }
                    Some(next) => {
                        let later = store.now_ms(self.now_ms()).await?;
                        let unchanged = next.fence == record.fence && next.state == record.state;
                        if unchanged && next.lease_alive(later) {
                            // A worker reversing the call keeps its lease: the provider's word
                            // then disputes the reversal, which the worker reads before it records.
                            if let Some(reversal) =
                                takeover::open_reversal(self, &next.key, call_id).await?
                            {
                                self.dispute(&next.key, call_id, &callback, reversal).await;
                                return Err(Error::Unknown {
                                    call_id: call_id.clone(),
                                });
                            }
                            return Err(Error::InProgress {
                                call_id: call_id.clone(),
                            });
                        }
                        next
                    }
                };
                continue;
            }
            let key = record.key.clone();
            let fence = match takeover::take_over(self, &record, ms(self.lease()), now).await? {
                TakenOver::Acquired(fence) => fence,
                TakenOver::Existing(newer) => {
                    record = *newer;
                    continue;
                }
                TakenOver::Gone => {
                    return Err(Error::NoReceipt {
                        call_id: call_id.clone(),
                    })
                }
                TakenOver::Reversal { fence, reversal } => {
                    // Journaled before the key goes back: a worker that takes it over next reads
                    // the dispute.
                    self.dispute(&key, call_id, &callback, reversal).await;
                    takeover::hand_back(self, &key, fence).await;
                    return Err(Error::Unknown {
                        call_id: call_id.clone(),
                    });
                }
            };
            let completion = Completion {
                state: callback.state,
                outcome: Some(callback.outcome.clone().into()),
                ttl_ms: ms(callback.ttl),
            };
            match store.complete(&key, fence, completion, self.now_ms()).await {
                Ok(_) => {
                    if let Err(e) = store.finish_compensation(call_id, None).await {
                        tracing::warn!(target: "samekey", call_id = %call_id, key = %key.short(),
                            attempt = 0u32, error = %e, "callback: could not clear the compensation entry");
                    }
                    tracing::info!(target: "samekey", call_id = %call_id, key = %key.short(),
                        attempt = 0u32, state = %callback.state, "callback: applied");
                    let applied = EventKind::Callback {
                        state: callback.state,
                        applied: true,
                    };
                    self.journal(&key, &[self.event(call_id, applied)], callback.ttl)
                        .await;
                    return Ok(Applied::Applied);
                }
                // Another delivery (or the owner) got there first: look again.
                Err(StoreError::Fenced { .. } | StoreError::InvalidTransition { .. }) => {
                    record =
                        store
                            .get(&key, self.now_ms())
                            .await?
                            .ok_or_else(|| Error::NoReceipt {
                                call_id: call_id.clone(),
                            })?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::InProgress {
            call_id: call_id.clone(),
        })
    }
}
