//! The errors samekey itself reports. The user's error type converts from [`Error`] (`From<Error>`), so a
//! function keeps its signature.

use serde::{Deserialize, Serialize};

use crate::call_id::CallId;
use crate::classify::{Classify, ErrorClass};
use crate::receipt::ReceiptState;

/// Why samekey answered instead of running (or finishing) the call.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Error {
    /// The key was used before with different `verify` parts: a different request under the same key.
    /// Nothing ran.
    #[error("idempotency key reused with a different request (verify fingerprint differs from call {call_id})")]
    KeyReuse {
        /// The call that holds the key.
        call_id: CallId,
    },
    /// Another call holds the key and is still running (`on_busy = "reject"`, or the wait ran out).
    #[error("call {call_id} holding this key is still in progress")]
    InProgress {
        /// The call that holds the key.
        call_id: CallId,
    },
    /// The outcome could not be established; the call is recorded `UNKNOWN` and queued for compensation.
    /// Never to be read as a failure: the effect may have happened.
    #[error("outcome of call {call_id} is unknown; it was handed to compensation")]
    Unknown {
        /// The call whose outcome is unknown.
        call_id: CallId,
    },
    /// Every attempt was refused before taking effect; the claim was released, nothing ran.
    #[error("call {call_id} gave up after {attempts} attempts; nothing took effect")]
    Exhausted {
        /// The call.
        call_id: CallId,
        /// How many attempts were made.
        attempts: u32,
    },
    /// The store failed; the call failed closed: nothing ran. Should the store have written the
    /// call's claim before it failed to answer, a task gives the claim back once the store answers
    /// again within 7/8 of its lease. Otherwise (later, under a callId adopted from an inbound request,
    /// without a tokio runtime, beyond 1 024 such tasks, or a take-over's answer lost: the earlier
    /// owner may have run) the key is left to its lease, as a vanished owner's.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stored outcome of an earlier call could not be decoded into this function's types.
    #[error("stored outcome of call {call_id} cannot be decoded: {reason}")]
    Decode {
        /// The call whose outcome is stored.
        call_id: CallId,
        /// The decoder's message.
        reason: String,
    },
    /// The earlier call succeeded but its result could not be stored, so it cannot be replayed: its
    /// `Serialize` failed, or the value held a NaN or an infinite float anywhere (JSON has none, and
    /// `Some(f64::NAN)` would be read back as `None`; finding one runs the value's `Serialize` a second
    /// time, when its JSON holds a `null`). The call took effect: it is never run again for its key.
    #[error("call {call_id} took effect but its outcome was not stored and cannot be replayed")]
    NotReplayable {
        /// The call.
        call_id: CallId,
    },
    /// Two different operations (a trait's default method for two implementors, a generic `impl` for
    /// two types, same-named methods of two `impl` blocks in one module) would share one default key
    /// scope, and so each other's keys. Nothing ran and nothing was claimed.
    #[error("operations {first} and {second} share the default key scope `{scope}`: each would replay the other's outcome; give each its own `#[idempotent(scope = \"...\")]`, or put `#[samekey::scoped]` on their `impl` blocks")]
    ScopeClash {
        /// The scope both would use.
        scope: String,
        /// The operation that used it first.
        first: String,
        /// The operation that was refused.
        second: String,
    },
    /// The first call under this key failed for good, and its error type is stored by its message (it
    /// does not implement serde): a duplicate gets this error, carrying that message, through the
    /// function's `From<samekey::Error>`. An error type that implements `Serialize` and `Deserialize`
    /// is replayed exactly instead.
    #[error("call {call_id} failed: {message}")]
    Failed {
        /// The call that failed.
        call_id: CallId,
        /// The failure's message (its `Display`), as the first call saw it.
        message: String,
    },
    /// A top-level key part is `None` (`key = "request_id"` with `request_id: Option<String>`): calls
    /// without it would all share the key of `None` and replay each other's outcomes. Nothing ran and
    /// nothing was claimed. `#[idempotent(on_missing_key = "run")]` runs such calls without
    /// idempotency instead.
    #[error("idempotency key part `{part}` is missing (None): nothing ran; pass it, or opt in with `#[idempotent(on_missing_key = \"run\")]` to run calls without it unprotected")]
    MissingKey {
        /// The key part, as written in `key = "..."`.
        part: String,
    },
    /// A key part's value has no stable encoding (a float inside a JSON value). Nothing ran and nothing
    /// was claimed.
    #[error("idempotency key part `{part}` cannot be encoded: {reason}")]
    InvalidKey {
        /// The key part, as written in `key = "..."`.
        part: String,
        /// Why.
        reason: String,
    },
    /// The store knows no receipt of this call (never made here, or expired): a callback about it
    /// ([`Runtime::apply_callback`](crate::Runtime::apply_callback)) has nothing to apply to.
    #[error("no receipt of call {call_id}: never made here, or expired")]
    NoReceipt {
        /// The call.
        call_id: CallId,
    },
    /// A callback would move a finished receipt to another outcome (`SUCCESS` → `FAILED` or back):
    /// receipts only move forward, so it was refused and nothing changed.
    #[error("call {call_id} is {from}: a callback saying {to} is refused (a receipt only moves forward)")]
    TransitionRefused {
        /// The call.
        call_id: CallId,
        /// Its recorded state.
        from: ReceiptState,
        /// The state the callback asked for.
        to: ReceiptState,
    },
    /// A person's resolution of a compensation entry
    /// ([`Compensator::resolve`](crate::Compensator::resolve)) disagrees with the outcome the call has
    /// meanwhile: it was not applied, and the entry stays.
    #[error("call {call_id} is already {state}: the resolution was not applied")]
    AlreadySettled {
        /// The call.
        call_id: CallId,
        /// Its recorded state.
        state: ReceiptState,
    },
    /// [`Runtime::forget`](crate::Runtime::forget) refused a call that has not finished: one
    /// `PROCESSING` may be running (forgetting it would let a second call run beside it), one `UNKNOWN`
    /// may have taken effect (resolve it first).
    #[error("call {call_id} is {state}, not finished: only a SUCCESS or FAILED call can be forgotten{}", not_finished_hint(*state))]
    NotFinished {
        /// The call.
        call_id: CallId,
        /// Its state.
        state: ReceiptState,
    },
    /// [`Runtime::forget`](crate::Runtime::forget) refused a finished call that a compensation entry
    /// still covers: the entry says its outcome is in doubt (a call recorded `FAILED` whose request
    /// took effect, queued `MANUAL` for a person), and forgetting it would let the customer's redo run
    /// a second time. Resolve the entry first ([`Compensator::resolve`](crate::Compensator::resolve),
    /// toward what happened), then forget the call if it must run again.
    #[error("call {call_id} is {state}, but its compensation entry is still open ({reason}): resolve it first (Compensator::resolve, samekey compensation resolve), then forget it if it must run again")]
    OpenCompensation {
        /// The call.
        call_id: CallId,
        /// Its recorded state.
        state: ReceiptState,
        /// Why the entry was queued.
        reason: String,
    },
    /// The dependency answered "rate limited", its [concurrency limit](crate::limits#concurrency-limits) is full, and
    /// no place freed up within the limit's `max_wait`. Refused before claiming: nothing ran and no key
    /// is held, so the same call may be made again later. Classified `Unknown`, as `InProgress` and
    /// `Exhausted` are: see [`Error`]'s [`Classify`] impl.
    #[error("dependency `{dependency}` is rate limited: {limit} calls in flight allowed, and no place freed up in time; nothing ran")]
    Overloaded {
        /// The dependency (`budget = "…"`, or `runtime`).
        dependency: String,
        /// Its concurrency limit when the call gave up.
        limit: u32,
    },
    /// [`Runtime::install_default`](crate::Runtime::install_default) was called after the default runtime
    /// was set or first used.
    #[error("the default samekey runtime is already set; install it before the first call")]
    DefaultAlreadySet,
}

/// How samekey's own answers classify, for an error type that delegates to it (`PayError::Samekey(e)
/// => e.classify()`): what matters is what they say when passed up (with `?`) from a call nested in
/// another `#[idempotent]` call's body, to that outer call.
///
/// * `Unknown` and `Store` are `Unknown`: the outcome is not established.
/// * `InProgress`, `Exhausted` and `Overloaded` are `Unknown` too. Nothing ran in the call that
///   answered them, but the outer body may have acted before it (charged, then found the nested
///   call's key busy), so the outer call never retries blindly and never gives its own key back on
///   their strength: it asks its `lookup`, re-runs under its callId (`on_unknown = "rerun"`), or is
///   recorded `UNKNOWN` and queued for compensation. (Converted into an `io::Error`, they keep the
///   kind `WouldBlock`.)
/// * Everything else is `Permanent`, `MissingKey` and `InvalidKey` included: an answer that stands.
impl Classify for Error {
    fn classify(&self) -> ErrorClass {
        match self {
            Error::Unknown { .. } | Error::Store(_) => ErrorClass::Unknown,
            // Nothing ran in the call that answered them; but passed up from a call nested in another
            // one's body, they say nothing about what the outer body did before it, so the outer
            // call must never take them for "known not executed" (retry, or give its key back).
            Error::InProgress { .. } | Error::Exhausted { .. } | Error::Overloaded { .. } => {
                ErrorClass::Unknown
            }
            Error::KeyReuse { .. }
            | Error::Decode { .. }
            | Error::NotReplayable { .. }
            | Error::ScopeClash { .. }
            | Error::Failed { .. }
            | Error::NoReceipt { .. }
            | Error::TransitionRefused { .. }
            | Error::AlreadySettled { .. }
            | Error::NotFinished { .. }
            | Error::OpenCompensation { .. }
            | Error::DefaultAlreadySet => ErrorClass::Permanent,
            // Not `Rejected`: passed up from a call nested in another one's body, it must not give
            // the outer key back, since the outer body may have acted before it.
            Error::MissingKey { .. } | Error::InvalidKey { .. } => ErrorClass::Permanent,
        }
    }
}

/// So that a function returning `io::Result<T>` can be `#[idempotent]`: the `io::Error` carries the
/// samekey error (`get_ref()` and `downcast_ref::<samekey::Error>()` give it back) and keeps its
/// [`ErrorClass`]; its kind is `WouldBlock` for "not now" (`InProgress`, `Exhausted`, `Overloaded`),
/// `TimedOut` for an uncertain outcome (`Unknown`, a store failure), and `Other` otherwise.
impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        use std::io::ErrorKind;
        let kind = match &e {
            Error::InProgress { .. } | Error::Exhausted { .. } | Error::Overloaded { .. } => {
                ErrorKind::WouldBlock
            }
            e if e.classify() == ErrorClass::Unknown => ErrorKind::TimedOut,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// A store operation that failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or did not answer.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The write presented an older fencing token than the record's: a newer owner took over.
    #[error("stale owner: fence {presented} was superseded by fence {current}")]
    Fenced {
        /// The token the writer presented.
        presented: u64,
        /// The record's token.
        current: u64,
    },
    /// No record for that key.
    #[error("no record for this key")]
    NotFound,
    /// A stored record could not be read: corrupted, or written by something else.
    #[error("corrupt store record: {0}")]
    Corrupt(String),
    /// The store is configured so that it may lose an acknowledged claim (a Redis that evicts, or does
    /// not persist): samekey refuses to use it as the store of record.
    #[error("store may lose claims: {0}")]
    NotDurable(String),
    /// The store is full of calls in flight and `UNKNOWN` receipts, which it never evicts: the claim
    /// is refused and the call fails closed (nothing ran). See
    /// [`MemoryStore::with_capacity`](crate::MemoryStore::with_capacity).
    #[error("store full: its {capacity} records are calls in flight or UNKNOWN, which are never evicted; nothing ran")]
    Full {
        /// The records the store holds at most.
        capacity: u64,
    },
    /// The receipt state machine refused the change.
    #[error("receipt cannot move from {from} to {to}")]
    InvalidTransition {
        /// The current state.
        from: ReceiptState,
        /// The refused target.
        to: ReceiptState,
    },
}

impl StoreError {
    /// Whether an owner's write was refused because the key is no longer that owner's: another owner
    /// took it over (`Fenced`), it is gone (`NotFound`), or it moved on (`InvalidTransition`).
    pub(crate) fn lost_key(&self) -> bool {
        matches!(
            self,
            StoreError::Fenced { .. } | StoreError::NotFound | StoreError::InvalidTransition { .. }
        )
    }
}

/// What to do about a call [`Error::NotFinished`] refused.
fn not_finished_hint(state: ReceiptState) -> &'static str {
    match state {
        ReceiptState::Unknown => {
            "; its outcome is not known: resolve it first (Compensator::resolve, samekey compensation resolve)"
        }
        _ => "; it may be running: wait until it finishes",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_made_from_a_samekey_error_keeps_its_class_and_the_error() {
        let call_id = CallId::new("ord", "api-7").unwrap();
        let cases = [
            (
                Error::Unknown {
                    call_id: call_id.clone(),
                },
                ErrorClass::Unknown,
            ),
            (
                Error::InProgress {
                    call_id: call_id.clone(),
                },
                ErrorClass::Unknown,
            ),
            (
                Error::MissingKey {
                    part: "request_id".into(),
                },
                ErrorClass::Permanent,
            ),
            (Error::KeyReuse { call_id }, ErrorClass::Permanent),
        ];
        for (error, class) in cases {
            let io: std::io::Error = error.clone().into();
            assert_eq!(io.classify(), class, "{error}");
            let inner = io.get_ref().and_then(|e| e.downcast_ref::<Error>());
            assert_eq!(inner, Some(&error));
            assert_eq!(io.to_string(), error.to_string());
        }
    }
}
