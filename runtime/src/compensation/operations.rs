//! The operations a worker resolves, registered by scope: how to ask the remote side about a callId
//! ([`CompensationOperation::new`]), what to do when it never received the call ([`NotReceivedPolicy`]: hold, release or
//! fail past a known age, reverse this side's part, or send it again), and how long an outcome recorded
//! by the worker is kept.

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::call_id::CallId;
use crate::classify::{Classify, ErrorClass, RemoteStatus};
use crate::compensation::entry::CompensationEntry;

/// What a lookup answered, encoded for the receipt: the success value's JSON (`None` when it cannot
/// be stored, see [`stored`]), or the failure's message.
type CallAnswer = Result<RemoteStatus<Option<Vec<u8>>, String>, String>;

/// A value the remote side says the call returned, as its receipt stores it: `None` when JSON cannot
/// carry it (a NaN or an infinite float, which would be read back as something else) or it cannot be
/// encoded. The call took effect all the same: it is recorded `SUCCESS` without an outcome, and
/// duplicates get `Error::NotReplayable` — never another value, never a second run.
fn stored<T: Serialize>(value: &T, whose: &'static str) -> Option<Vec<u8>> {
    match crate::codec::stored_json(value) {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            tracing::error!(target: "samekey", error = %e,
                "{whose} value cannot be stored; duplicates will get NotReplayable");
            None
        }
    }
}
type Lookup = Arc<dyn Fn(CallId) -> Pin<Box<dyn Future<Output = CallAnswer> + Send>> + Send + Sync>;
type Reversal = Arc<
    dyn Fn(CompensationEntry) -> Pin<Box<dyn Future<Output = Result<(), ReversalError>> + Send>>
        + Send
        + Sync,
>;

/// A reversal's error, as the worker judges it: whether it says plainly that nothing ran.
pub(super) struct ReversalError {
    /// Classified `Rejected`, `Retryable` or `RateLimited`: the reversal did not act (as a call's
    /// key is given back for these alone). Otherwise — `Unknown` (a timeout, a lost reply),
    /// `Permanent` (an answer that stands, which may follow the effect: "already released", a reply
    /// that cannot be read) — it may have.
    pub(super) nothing_ran: bool,
    /// Its message.
    pub(super) message: String,
}
type Rerun = Arc<
    dyn Fn(CompensationEntry) -> Pin<Box<dyn Future<Output = CallAnswer> + Send>> + Send + Sync,
>;

/// What the worker does with a call the remote side says it never received.
///
/// "Not received" is true when it is said, not for good: the call's first request may still be on
/// its way (a slow network, an owner paused before it sent, past its lease). Giving the key back lets
/// the next call run under a **new** callId, which the remote cannot tell from the late first request:
/// it charges twice. Recording `FAILED` tells the caller "failed" for a request that may yet charge.
/// So, as the call path does, the worker never releases or fails an uncertain call by default: it
/// re-sends it under its callId ([`CompensationOperation::rerun`]: the remote deduplicates), or keeps it `UNKNOWN`
/// through its rounds and then asks a person ([`NotReceivedPolicy::Hold`]). Releasing or failing it is safe
/// only once the first request can no longer take effect — when the remote refuses a request whose
/// callId is older than a known age — and is opted into with that age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReceivedPolicy {
    /// Keep the call `UNKNOWN` (a duplicate still asks first) and look again next round; after the
    /// last, `MANUAL`. The default.
    Hold,
    /// Give the key back (the next call with this key runs, under a new callId) — once the call is
    /// older than `refused_after`; until then, as [`NotReceivedPolicy::Hold`].
    ///
    /// Safe only if the remote refuses any request whose callId was made more than `refused_after`
    /// ago (judged by the time the callId carries, [`CallId::unix_ms`]): then the first request, if
    /// it arrives late, is refused rather than charged. Add the margin by which your nodes' clocks
    /// may disagree; the worker judges the age by the store's clock where nodes share one.
    Release {
        /// The age past which the remote refuses the call's callId.
        refused_after: Duration,
    },
    /// Record the call `FAILED` ("not received by the remote"), so duplicates get that failure —
    /// once the call is older than `refused_after`, on the same condition as
    /// [`NotReceivedPolicy::Release`]; until then, as [`NotReceivedPolicy::Hold`].
    Fail {
        /// The age past which the remote refuses the call's callId.
        refused_after: Duration,
    },
    /// Run the operation's [reversal](CompensationOperation::reversal) (undo this side's part: release the
    /// stock held for the order), then record the call `FAILED`. Set by [`CompensationOperation::reversal`].
    ///
    /// Like [`NotReceivedPolicy::Release`], safe only if the call's first request can no longer take
    /// effect when the reversal runs (the remote refuses a late, old callId): one that arrives after
    /// it performs a call this side reversed. Register a reversal for such a remote, or prefer
    /// [`CompensationOperation::rerun`].
    Reverse,
    /// Send the call again under its callId with the operation's [re-run](CompensationOperation::rerun), and
    /// record what it answers. Set by [`CompensationOperation::rerun`].
    Rerun,
}

/// One operation (scope) the worker can resolve: how to ask about a callId, and what to do then.
pub struct CompensationOperation {
    pub(super) lookup: Lookup,
    pub(super) ttl: Duration,
    pub(super) not_received: NotReceivedPolicy,
    pub(super) reversal: Option<Reversal>,
    pub(super) rerun: Option<Rerun>,
}

impl CompensationOperation {
    /// An operation whose calls are asked about with `lookup`, the same contract as the
    /// `#[idempotent(lookup = …)]` argument: `Succeeded(T)` and `Failed(E)` are recorded as the call's
    /// outcome (a failure by its message: duplicates get `samekey::Error::Failed`), `NotReceived`
    /// follows [`CompensationOperation::not_received`], `Processing` or an `Err` wait for the next round.
    pub fn new<T, E, LE, F, Fut>(lookup: F) -> CompensationOperation
    where
        T: Serialize,
        E: Display,
        LE: Display,
        F: Fn(CallId) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<RemoteStatus<T, E>, LE>> + Send + 'static,
    {
        let lookup: Lookup = Arc::new(move |call_id| {
            let asked = lookup(call_id);
            Box::pin(async move {
                match asked.await {
                    Ok(RemoteStatus::Succeeded(value)) => {
                        Ok(RemoteStatus::Succeeded(stored(&value, "the lookup's")))
                    }
                    Ok(RemoteStatus::Failed(error)) => Ok(RemoteStatus::Failed(error.to_string())),
                    Ok(RemoteStatus::NotReceived) => Ok(RemoteStatus::NotReceived),
                    Ok(RemoteStatus::Processing) => Ok(RemoteStatus::Processing),
                    Err(e) => Err(e.to_string()),
                }
            })
        });
        CompensationOperation {
            lookup,
            ttl: Duration::from_secs(24 * 60 * 60),
            not_received: NotReceivedPolicy::Hold,
            reversal: None,
            rerun: None,
        }
    }

    /// Undoes this side's part of a call the remote side never received — release the stock held for
    /// the order, cancel the pending row — then records the call `FAILED` ("not received; reversed"),
    /// so that duplicates get that failure. The function gets the call's entry: its callId, key,
    /// attempts and, when its function keeps them (`#[idempotent(inputs = …)]`), its
    /// [inputs](CompensationEntry::inputs).
    ///
    /// An `Err` is judged by its [class](Classify), for the reversal as a whole: one that says
    /// nothing ran (`Rejected`, `Retryable`, `RateLimited`, the classes a call's key is given back
    /// for) leaves the call to the next round, which reverses it again; any other (`Unknown`: a
    /// timeout, a lost reply; `Permanent`: an answer that stands, which may follow the effect) keeps
    /// the reversal open — a duplicate or a callback answers `Error::Unknown`, nothing sends the call
    /// — and escalates the entry to `MANUAL` at once, for a person to check what the reversal did.
    /// A reversal of several steps answers for all of them: an error that says nothing ran, after a
    /// step that acted, would have the call sent beside it.
    ///
    /// **At most once per call, and never beside an execution**, across workers and crashes: the
    /// worker journals its intent before the reversal runs, confirms it still holds the call's key,
    /// and keeps that key's lease alive for as long as the reversal runs, so no duplicate takes the
    /// call over and sends it meanwhile. A taker that finds an intent with no end (its worker crashed
    /// or stalled while reversing) acts on nothing: a duplicate call or a callback answers
    /// `Error::Unknown`, and the next worker escalates the entry to `MANUAL` for a person to check
    /// instead of reversing again. Sets [`not_received`](CompensationOperation::not_received) to
    /// [`NotReceivedPolicy::Reverse`].
    pub fn reversal<E, F, Fut>(mut self, reverse: F) -> CompensationOperation
    where
        E: Classify + Display,
        F: Fn(CompensationEntry) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
    {
        self.reversal = Some(Arc::new(move |entry| {
            let reversing = reverse(entry);
            Box::pin(async move {
                reversing.await.map_err(|e| ReversalError {
                    nothing_ran: matches!(
                        e.classify(),
                        ErrorClass::Rejected
                            | ErrorClass::Retryable
                            | ErrorClass::RateLimited { .. }
                    ),
                    message: e.to_string(),
                })
            })
        }));
        self.not_received = NotReceivedPolicy::Reverse;
        self
    }

    /// Sends a call the remote side never received again, under its callId (the remote deduplicates
    /// by it, so a first request that arrives late changes nothing), with the call's entry and its
    /// [inputs](CompensationEntry::inputs). `Ok(value)` is recorded `SUCCESS`; an error that stands
    /// (`Permanent`, `Rejected`) is recorded `FAILED` by its message; any other error leaves the call
    /// to the next round. Sets [`not_received`](CompensationOperation::not_received) to [`NotReceivedPolicy::Rerun`].
    pub fn rerun<T, E, F, Fut>(mut self, rerun: F) -> CompensationOperation
    where
        T: Serialize,
        E: Classify + Display,
        F: Fn(CompensationEntry) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        self.rerun = Some(Arc::new(move |entry| {
            let sent = rerun(entry);
            Box::pin(async move {
                match sent.await {
                    Ok(value) => Ok(RemoteStatus::Succeeded(stored(&value, "the re-run's"))),
                    Err(e) => match e.classify() {
                        ErrorClass::Permanent | ErrorClass::Rejected => {
                            Ok(RemoteStatus::Failed(e.to_string()))
                        }
                        _ => Err(e.to_string()),
                    },
                }
            })
        }));
        self.not_received = NotReceivedPolicy::Rerun;
        self
    }

    /// How long an outcome the worker records is kept (the function's `ttl`; default 24 h).
    pub fn ttl(mut self, ttl: Duration) -> CompensationOperation {
        self.ttl = ttl;
        self
    }

    /// What a "not received" answer leads to (default [`NotReceivedPolicy::Hold`]).
    pub fn not_received(mut self, then: NotReceivedPolicy) -> CompensationOperation {
        self.not_received = then;
        self
    }
}
