//! The journal: what happened to a call, event by event — the claim, every attempt with its error
//! class, every backoff, every `lookup` and its answer, every take-over, every receipt transition and
//! every compensation step, each with its time, node and callId.
//!
//! # Guarantees
//!
//! * **The happy path writes nothing.** A call whose first attempt settles it leaves its receipt and
//!   nothing else: its timeline (claimed, recorded) is read from the receipt. Events are written only
//!   once something else happens (a retry, a lookup, an unknown, a take-over, a cancellation), and
//!   then with the writes the call makes anyway: before a backoff's sleep, with the outcome.
//! * **Bounded.** A key's journal keeps its latest [`JOURNAL_LIMIT`] events.
//! * **Expiring with the receipt.** A key's journal lives as long as the key's record, and at least
//!   `keep_ms` (the function's `ttl`) after its latest event, so that a call given back (whose record
//!   went) can still be read for that long.
//! * **Readable from anywhere.** By callId and by key, from any process that shares the store,
//!   including while the call is still running. Times are the writing node's clock (Unix ms);
//!   the order is the order the store received the events in.

use serde::{Deserialize, Serialize};

use crate::call_id::CallId;
use crate::classify::ErrorClass;
use crate::receipt::{Receipt, ReceiptState};

/// The most events a key's journal keeps: the latest ones.
pub const JOURNAL_LIMIT: usize = 256;

/// One thing that happened to a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The call it happened to.
    pub call_id: CallId,
    /// When (Unix ms, by the clock of the node that wrote it).
    pub at_ms: u64,
    /// The node that wrote it (a runtime's node name).
    pub node: String,
    /// What happened.
    #[serde(flatten)]
    pub what: EventKind,
}

/// What happened, in an [`Event`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// The call claimed its key under `fence`.
    Claimed {
        /// The owner's fence.
        fence: u64,
    },
    /// The call took over a key whose owner's outcome was uncertain (`from`: `UNKNOWN`, or
    /// `PROCESSING` past its lease), under a new fence and the same callId.
    TookOver {
        /// The state it took the key over from.
        from: ReceiptState,
        /// The new owner's fence.
        fence: u64,
    },
    /// One attempt of the body, from `started_ms` to the event's time.
    Attempt {
        /// The attempt's number (1 for the first).
        attempt: u32,
        /// When it started (Unix ms).
        started_ms: u64,
        /// How it ended.
        outcome: AttemptOutcome,
        /// The error it ended with, as its message.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// The call backed off before its next attempt (or lookup).
    Backoff {
        /// The attempt the backoff follows.
        attempt: u32,
        /// How long it waits.
        delay_ms: u64,
    },
    /// A `lookup` (receipt query by callId) and its answer.
    Lookup {
        /// What the remote side answered.
        answer: LookupOutcome,
        /// Why the lookup failed, for [`LookupOutcome::NoAnswer`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// The outcome was recorded: the receipt went to `state`.
    Recorded {
        /// `SUCCESS` or `FAILED`.
        state: ReceiptState,
        /// Who recorded it: `call`, `compensation`, `callback`, or a person's name.
        by: String,
    },
    /// The outcome stays unknown: the receipt is `UNKNOWN` and the call queued for compensation.
    Unknown {
        /// Why.
        reason: String,
    },
    /// The claim was given back: nothing took effect, the key may be claimed again.
    Released {
        /// Why.
        reason: String,
        /// Who gave it back: `call`, `compensation`, or a person's name.
        by: String,
    },
    /// A write of this owner was refused: another owner holds the key (it stalled past its lease).
    FencedOut,
    /// The caller went away (the call's future was dropped) before the call finished.
    Cancelled {
        /// What was done with the key it held.
        left: String,
    },
    /// A compensation worker acted on the call's queue entry.
    Compensation {
        /// The entry's round.
        round: u32,
        /// What it did.
        step: CompensationStep,
        /// Details (the lookup's failure, the delay, the reason given).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        detail: String,
    },
    /// A person resolved the call by hand.
    Resolved {
        /// The outcome they gave it: `SUCCESS`, `FAILED`, or `RECEIVED` for "given back".
        state: ReceiptState,
        /// Who.
        who: String,
        /// Why.
        why: String,
    },
    /// A person forgot the call's finished outcome (`Runtime::forget`, `samekey forget`): the key may be
    /// claimed again, and a new call on it runs.
    Forgotten {
        /// The outcome that was forgotten: `SUCCESS` or `FAILED`.
        state: ReceiptState,
        /// Who.
        who: String,
        /// Why.
        why: String,
    },
    /// A callback (the counterparty's notification) was delivered for the call.
    Callback {
        /// The state it reported.
        state: ReceiptState,
        /// Whether it changed the receipt (`false`: a repeat, already applied).
        applied: bool,
    },
    /// A callback asked for a transition the receipt cannot make (backwards, or to another outcome).
    CallbackRefused {
        /// The receipt's state.
        from: ReceiptState,
        /// The state the callback reported.
        to: ReceiptState,
    },
    /// A broker delivered the call's message to an inbox (a redelivery, or a delivery the inbox did
    /// not acknowledge as worked), and what the inbox told the broker.
    Delivered {
        /// The broker's count of this message's deliveries, 1 for the first, where it keeps one
        /// (a RabbitMQ quorum queue's `x-delivery-count` + 1, JetStream's `num_delivered`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        delivery: Option<u64>,
        /// The broker's `redelivered` flag: it may have delivered the message before.
        redelivered: bool,
        /// What the inbox answered: `ack`, `requeue` or `dead-letter`.
        disposition: String,
        /// Why, for a requeue or a dead letter.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        detail: String,
    },
    /// An owner fenced out of its key (it stalled past its lease, and another owner recorded the call
    /// `FAILED` meanwhile) knows its request took effect: it answered its success. Duplicates replay
    /// the recorded failure, so the call is queued `MANUAL` for a person to reconcile the two.
    Contradicted {
        /// The outcome recorded by the other owner.
        recorded: ReceiptState,
        /// The outcome this owner knows.
        known: ReceiptState,
    },
}

impl std::fmt::Display for EventKind {
    /// One line for people: `attempt 2: retryable (503)`, `lookup: succeeded`, `recorded SUCCESS by
    /// compensation`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let because = |f: &mut std::fmt::Formatter<'_>, detail: &str| {
            if detail.is_empty() {
                Ok(())
            } else {
                write!(f, " ({detail})")
            }
        };
        match self {
            // Fence 0: a claim the receipt implies (its fence is the receipt's).
            EventKind::Claimed { fence: 0 } => f.write_str("claimed"),
            EventKind::Claimed { fence } => write!(f, "claimed (fence {fence})"),
            EventKind::TookOver { from, fence } => write!(f, "took over from {from} (fence {fence})"),
            EventKind::Attempt {
                attempt,
                outcome,
                error,
                ..
            } => {
                write!(f, "attempt {attempt}: {outcome}")?;
                because(f, error.as_deref().unwrap_or_default())
            }
            EventKind::Backoff { delay_ms, .. } => write!(f, "backing off {delay_ms} ms"),
            EventKind::Lookup { answer, error } => {
                write!(f, "lookup: {answer}")?;
                because(f, error.as_deref().unwrap_or_default())
            }
            EventKind::Recorded { state, by } => write!(f, "recorded {state} by {by}"),
            EventKind::Unknown { reason } => write!(f, "left UNKNOWN for compensation ({reason})"),
            EventKind::Released { reason, by } => write!(f, "claim given back by {by} ({reason})"),
            EventKind::Delivered {
                delivery,
                redelivered,
                disposition,
                detail,
            } => {
                f.write_str("delivered")?;
                match (delivery, redelivered) {
                    (Some(n), _) => write!(f, " (delivery {n})")?,
                    (None, true) => f.write_str(" (redelivered)")?,
                    (None, false) => {}
                }
                write!(f, ": {disposition}")?;
                because(f, detail)
            }
            EventKind::FencedOut => write!(f, "fenced out: another owner holds the key"),
            EventKind::Contradicted { recorded, known } => write!(
                f,
                "the owner knows {known}, but {recorded} was recorded meanwhile: answered {known}; reconcile by hand"
            ),
            EventKind::Cancelled { left } => write!(f, "cancelled by its caller; {left}"),
            EventKind::Compensation {
                round,
                step,
                detail,
            } => {
                write!(f, "compensation round {round}: {step}")?;
                because(f, detail)
            }
            EventKind::Resolved { state, who, why } => {
                write!(f, "resolved by hand as {state} by {who} ({why})")
            }
            EventKind::Forgotten { state, who, why } => write!(
                f,
                "forgotten by {who} ({why}): its {state} outcome is gone, the key may be claimed again"
            ),
            EventKind::Callback { state, applied } => {
                let how = if *applied {
                    "applied"
                } else {
                    "already applied"
                };
                write!(f, "callback {state}: {how}")
            }
            EventKind::CallbackRefused { from, to } => write!(f, "callback refused: {from} → {to}"),
        }
    }
}

/// The snake-case name serde gives a unit variant (`timed_out`), for display.
fn name_of<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name.replace('_', " "),
        _ => String::new(),
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// It answered a value.
    Ok,
    /// It ran past the function's `timeout`: outcome unknown.
    TimedOut,
    /// `Permanent`: the answer stands.
    Permanent,
    /// `Rejected`: nothing took effect.
    Rejected,
    /// `Retryable`: known not to have taken effect.
    Retryable,
    /// `RateLimited`: the remote asked to slow down.
    RateLimited,
    /// `Unknown`: the outcome is not known.
    Unknown,
}

impl std::fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&name_of(self))
    }
}

impl From<ErrorClass> for AttemptOutcome {
    fn from(class: ErrorClass) -> AttemptOutcome {
        match class {
            ErrorClass::Permanent => AttemptOutcome::Permanent,
            ErrorClass::Rejected => AttemptOutcome::Rejected,
            ErrorClass::Retryable => AttemptOutcome::Retryable,
            ErrorClass::RateLimited { .. } => AttemptOutcome::RateLimited,
            ErrorClass::Unknown => AttemptOutcome::Unknown,
        }
    }
}

/// What a `lookup` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LookupOutcome {
    /// The remote side has it, succeeded.
    Succeeded,
    /// The remote side has it, failed.
    Failed,
    /// The remote side never received it.
    NotReceived,
    /// The remote side is still working on it.
    Processing,
    /// No answer (an error, or no answer in time).
    NoAnswer,
}

impl std::fmt::Display for LookupOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&name_of(self))
    }
}

/// A compensation worker's step, in [`EventKind::Compensation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompensationStep {
    /// The call was queued for compensation.
    Queued,
    /// A worker's sweep found the call's owner gone (`PROCESSING` past its lease, nothing queued)
    /// and queued it.
    Swept,
    /// A worker took the entry for a round.
    Taken,
    /// The worker is about to run the operation's reversal (the call had not been received): written
    /// before it runs, so that a worker that crashes while it runs is never followed by a second run.
    Reversing,
    /// The worker ran the operation's reversal.
    Reversed,
    /// The reversal failed; the entry goes on to its next round.
    ReversalFailed,
    /// The worker sent the call again under its callId (the operation's re-run).
    Rerun,
    /// Nothing settled this round: the entry waits for the next one.
    Rescheduled,
    /// The rounds ran out: the entry is `MANUAL`, for a person.
    Escalated,
    /// The call had been settled elsewhere meanwhile: the entry was removed.
    SettledElsewhere,
    /// A person made the entry due now (`Compensator::retry`, `samekey compensation retry`).
    RetriedByHand,
    /// A person marked the entry `MANUAL` before its rounds ran out (`Compensator::escalate`).
    EscalatedByHand,
}

impl std::fmt::Display for CompensationStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&name_of(self))
    }
}

/// What is known of a call: its receipt (if the store still has one) and its journal.
#[derive(Debug, Clone, PartialEq)]
pub struct CallHistory {
    /// The call's receipt, or `None` (given back, or expired).
    pub receipt: Option<Receipt>,
    /// The call's events, oldest first, as the journal holds them.
    pub events: Vec<Event>,
}

impl CallHistory {
    /// The call's timeline: its journal, with the claim and the outcome that the receipt holds added
    /// where the journal has none of its own (the happy path journals nothing: see the
    /// [module documentation](self)). Events the receipt implies carry the node named in the callId.
    pub fn timeline(&self) -> Vec<Event> {
        let Some(receipt) = &self.receipt else {
            return self.events.clone();
        };
        let ours = |e: &&Event| e.call_id == receipt.call_id;
        let mut timeline = Vec::with_capacity(self.events.len() + 2);
        let claimed = self.events.iter().filter(ours).any(|e| {
            matches!(
                e.what,
                EventKind::Claimed { .. }
                    | EventKind::TookOver { .. }
                    | EventKind::Attempt { attempt: 1, .. }
            )
        });
        let implied = |at_ms, what| Event {
            call_id: receipt.call_id.clone(),
            at_ms,
            node: receipt.call_id.node().to_owned(),
            what,
        };
        if !claimed {
            timeline.push(implied(receipt.created_ms, EventKind::Claimed { fence: 0 }));
        }
        timeline.extend(self.events.iter().cloned());
        let recorded = self.events.iter().filter(ours).any(
            |e| matches!(&e.what, EventKind::Recorded { state, .. } if *state == receipt.state),
        );
        if receipt.state.is_terminal() && !recorded {
            let by = "call".to_owned();
            let what = EventKind::Recorded {
                state: receipt.state,
                by,
            };
            timeline.push(implied(receipt.updated_ms, what));
        }
        timeline
    }
}

/// The serialized form of an event, as the stores that serialize keep it.
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis",
    test
))]
pub(crate) fn encode(event: &Event) -> Result<String, crate::error::StoreError> {
    serde_json::to_string(event)
        .map_err(|e| crate::error::StoreError::Corrupt(format!("a journal event: {e}")))
}

/// An event from its serialized form.
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis",
    test
))]
pub(crate) fn decode(text: &[u8]) -> Result<Event, crate::error::StoreError> {
    serde_json::from_slice(text)
        .map_err(|e| crate::error::StoreError::Corrupt(format!("a journal event: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_as_flat_json() {
        let call_id = CallId::new("c", "n1").expect("a valid callId");
        let event = Event {
            call_id,
            at_ms: 5,
            node: "n1".into(),
            what: EventKind::Attempt {
                attempt: 2,
                started_ms: 3,
                outcome: AttemptOutcome::Retryable,
                error: Some("503".into()),
            },
        };
        let text = encode(&event).expect("encodes");
        assert!(text.contains(r#""event":"attempt""#), "{text}");
        assert!(text.contains(r#""outcome":"retryable""#), "{text}");
        assert_eq!(decode(text.as_bytes()).expect("decodes"), event);
    }
}
