//! What a caller may learn about a finished call without changing the function's signature:
//! [`observed`] runs a future and reports the first `#[idempotent]` call made in it — its callId, its
//! key, and whether its answer was a replay of an earlier call's outcome.
//!
//! A server reads it to set `Idempotent-Replayed: true`; an operator logs the callId of every call.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::call_id::{CallId, TraceId};
use crate::key::Key;

tokio::task_local! {
    static OBSERVER: Slot;
}

/// How many [`observed`] scopes are running in the process: while none is, a call does not look for
/// one (a task-local lookup on every call otherwise).
static SCOPES: AtomicUsize = AtomicUsize::new(0);

/// Where the observed call writes its report.
#[derive(Clone, Default)]
pub(crate) struct Slot(Arc<Mutex<SlotState>>);

#[derive(Default)]
struct SlotState {
    taken: bool,
    report: Option<CallReport>,
}

impl Slot {
    /// Whether any [`observed`] scope runs in the process (one relaxed load).
    pub(crate) fn any() -> bool {
        SCOPES.load(Ordering::Relaxed) != 0
    }

    /// The slot of the enclosing [`observed`] scope, if this is the first call made in it.
    pub(crate) fn take() -> Option<Slot> {
        if SCOPES.load(Ordering::Relaxed) == 0 {
            return None;
        }
        OBSERVER
            .try_with(|slot| {
                let mut state = slot.0.lock().unwrap_or_else(PoisonError::into_inner);
                if state.taken {
                    None
                } else {
                    state.taken = true;
                    Some(slot.clone())
                }
            })
            .ok()
            .flatten()
    }

    pub(crate) fn report(&self, report: CallReport) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).report = Some(report);
    }
}

/// How an `#[idempotent]` call was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallAnswer {
    /// This call ran (or resolved) the operation: its answer is its own.
    Executed,
    /// The key was already settled by an earlier call: its stored outcome was replayed and nothing ran.
    Replayed,
    /// samekey answered without running or replaying anything (`InProgress`, `KeyReuse`, `MissingKey`,
    /// a store that failed, …): the answer is a samekey error.
    Refused,
    /// A top-level key part was missing and the function opted in (`on_missing_key = "run"`): the
    /// body ran once without idempotency (no claim, no retry, no receipt).
    Unprotected,
}

/// A finished `#[idempotent]` call, as [`observed`] reports it.
#[derive(Debug, Clone)]
pub struct CallReport {
    pub(crate) call_id: CallId,
    pub(crate) trace_id: TraceId,
    pub(crate) key: Key,
    pub(crate) answer: CallAnswer,
    pub(crate) attempts: u32,
}

impl CallReport {
    /// The callId: this call's own, or — for a replay — the callId of the call whose outcome was
    /// replayed, which is the one the remote side and the receipt know.
    pub fn call_id(&self) -> &CallId {
        &self.call_id
    }

    /// The traceId of the business chain.
    pub fn trace_id(&self) -> TraceId {
        self.trace_id
    }

    /// The idempotency key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// How the call was answered.
    pub fn answer(&self) -> CallAnswer {
        self.answer
    }

    /// Whether the answer is an earlier call's stored outcome (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.answer == CallAnswer::Replayed
    }

    /// How many attempts of the body this call made (0 for a replay).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

/// Runs `future` and reports the first `#[idempotent]` call it makes (`None` if it made none, or the
/// call did not finish). Calls nested inside that call's body, and later calls, are not reported.
///
/// ```
/// # use samekey_runtime::observe::observed;
/// # async fn charge(_: &str) -> Result<u64, std::io::Error> { Ok(1) }
/// # async fn demo() {
/// let (result, report) = observed(charge("o-1")).await;
/// if let Some(report) = report {
///     tracing::info!(call_id = %report.call_id(), replayed = report.replayed(), "charged");
/// }
/// # let _ = result;
/// # }
/// ```
pub async fn observed<F: Future>(future: F) -> (F::Output, Option<CallReport>) {
    let slot = Slot::default();
    let output = {
        let _counted = Counted::enter();
        OBSERVER.scope(slot.clone(), future).await
    };
    let report = slot
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .report
        .take();
    (output, report)
}

/// Counts one running [`observed`] scope, until dropped (also when the scope's future is).
struct Counted;

impl Counted {
    fn enter() -> Counted {
        SCOPES.fetch_add(1, Ordering::Relaxed);
        Counted
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        SCOPES.fetch_sub(1, Ordering::Relaxed);
    }
}
