//! The task-local call context: inside an `#[idempotent]` function, [`current()`] tells the callId,
//! traceId, key and attempt number of the running call; a server or gateway sets an [`InboundCall`] context
//! so that the call it serves keeps the callId and traceId it arrived with.
//!
//! # Guarantees
//!
//! * Every attempt of a call sees the same callId, traceId and key; only the attempt number changes.
//! * A call made inside another call (check → debit → notify) gets its own callId and inherits the
//!   traceId, so a chain shares one traceId.
//! * An inbound callId is adopted by the **first** `#[idempotent]` call in its scope only: it identifies
//!   one call, and handing it to a second call would make two calls share an identity.
//! * Each attempt numbers the messages it makes from 0 ([`Context::next_message_seq`]), so the n-th
//!   message of every attempt of a call gets the same number.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::call_id::{CallId, ShortLabel, TraceId};
use crate::key::Key;
use crate::receipt::Fence;

tokio::task_local! {
    static SCOPE: Scope;
}

#[derive(Clone)]
enum Scope {
    Call(Context),
    InboundCall(InboundCall),
}

/// What the running call knows about itself. Read it with [`current()`].
#[derive(Debug, Clone)]
pub struct Context {
    call_id: CallId,
    trace_id: TraceId,
    key: Key,
    attempt: u32,
    /// The messages this attempt made so far ([`Context::next_message_seq`]).
    messages: MessageCount,
    fence: Fence,
    started_ms: u64,
    expires_at_ms: u64,
    protected: bool,
    places: Places,
}

/// The concurrency limiters in which the running call and the calls it is nested in hold a place
/// (each named by its address, which its call keeps alive by holding the limiter's dependency).
///
/// A call nested in another (an `#[idempotent]` call made inside a body) that finds its dependency's
/// limit full does not wait when one of them holds a place in that limiter: it runs on its parent's
/// place. Waiting would be waiting for itself, since the parent gives its place back only once the
/// nested call has answered (the limit at 1, it would never find one). Up to [`Places::DEPTH`]
/// distinct limiters are kept; a chain through more (rare: each is a dependency of its own) keeps the
/// innermost, and a call nested under the others takes a place as any call does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Places([usize; Places::DEPTH]);

impl Places {
    pub(crate) const DEPTH: usize = 4;

    /// Whether a place is held in the limiter at `limiter`.
    pub(crate) fn holds(&self, limiter: usize) -> bool {
        limiter != 0 && self.0.contains(&limiter)
    }

    /// These places and one in the limiter at `limiter`.
    pub(crate) fn with(mut self, limiter: usize) -> Places {
        if limiter == 0 || self.holds(limiter) {
            return self;
        }
        self.0.rotate_right(1);
        self.0[0] = limiter;
        self
    }
}

impl Context {
    pub(crate) fn new(
        call_id: CallId,
        trace_id: TraceId,
        key: Key,
        attempt: u32,
        fence: Fence,
        started_ms: u64,
        expires_at_ms: u64,
    ) -> Context {
        Context {
            call_id,
            trace_id,
            key,
            attempt,
            messages: MessageCount::default(),
            fence,
            started_ms,
            expires_at_ms,
            protected: true,
            places: Places::default(),
        }
    }

    /// The context of a call that runs on these places (its own and its enclosing calls').
    pub(crate) fn holding(mut self, places: Places) -> Context {
        self.places = places;
        self
    }

    /// The context of a call that runs without idempotency.
    pub(crate) fn unprotected(mut self) -> Context {
        self.protected = false;
        self
    }

    /// Whether the call is protected by a claimed key: `false` only when a top-level key part was
    /// missing and the function opted in with `on_missing_key = "run"`. Such a call has no claim and no
    /// receipt: its [`key`](Context::key) is the key of the missing value, shared by every such call
    /// (do not send it anywhere as an idempotency key), its [`fence`](Context::fence) is 0, and
    /// `PgStore::complete_in` writes nothing for it. Its callId is its own, as always.
    pub fn is_protected(&self) -> bool {
        self.protected
    }

    /// The callId: the same on every attempt. Send it to the remote side so it can deduplicate and
    /// answer receipt lookups.
    pub fn call_id(&self) -> &CallId {
        &self.call_id
    }

    /// The traceId of the business chain this call belongs to.
    pub fn trace_id(&self) -> TraceId {
        self.trace_id
    }

    /// The idempotency key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The attempt number, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The number of the next message (an envelope, an event) made by the running attempt: 0 for
    /// its first, counted anew for each attempt, so that the n-th message of every attempt of a call
    /// gets the same number and a retried publish repeats the first's `(callId, number)` — as long
    /// as the attempt makes its messages in the same order. `None` outside an `#[idempotent]` call.
    ///
    /// It counts on the running attempt's own context, not on a copy of it ([`current()`] answers a
    /// copy, which does not count).
    pub fn next_message_seq() -> Option<u64> {
        SCOPE
            .try_with(|scope| match scope {
                Scope::Call(context) => Some(context.messages.0.fetch_add(1, Ordering::Relaxed)),
                Scope::InboundCall(_) => None,
            })
            .ok()
            .flatten()
    }

    /// The fencing token under which this attempt owns the key: a store write made by the body in its
    /// own transaction (`PgStore::complete_in`) presents it.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// When this attempt started, in the runtime's Unix milliseconds.
    pub fn started_ms(&self) -> u64 {
        self.started_ms
    }

    /// When a receipt written now would expire: the attempt's start plus the function's `ttl`.
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// `f` with this context as the current one. Not an `async fn`: its future would hold the
    /// context twice (itself, and the task-local's copy).
    pub(crate) fn scope<F: Future>(self, f: F) -> impl Future<Output = F::Output> {
        SCOPE.scope(Scope::Call(self), f)
    }
}

/// How many messages an attempt made ([`Context::next_message_seq`]). A copy of a context takes the
/// count as it stands and does not count further for the attempt.
#[derive(Debug, Default)]
struct MessageCount(AtomicU64);

impl Clone for MessageCount {
    fn clone(&self) -> MessageCount {
        MessageCount(AtomicU64::new(self.0.load(Ordering::Relaxed)))
    }
}

/// The context of the running `#[idempotent]` call.
///
/// # Panics
///
/// Outside the body of an `#[idempotent]` function. Use [`try_current`] where that can happen.
pub fn current() -> Context {
    match try_current() {
        Some(context) => context,
        None => panic!(
            "samekey::current() called outside an #[idempotent] function; use samekey::context::try_current()"
        ),
    }
}

/// The context of the running `#[idempotent]` call, or `None` outside one.
pub fn try_current() -> Option<Context> {
    SCOPE
        .try_with(|scope| match scope {
            Scope::Call(context) => Some(context.clone()),
            Scope::InboundCall(_) => None,
        })
        .ok()
        .flatten()
}

/// Identity that arrived with a request (`X-Call-Id`, `X-Trace-Id`, message attributes): run the handler
/// inside [`InboundCall::scope`] and the `#[idempotent]` call it makes keeps that callId and traceId.
///
/// ```
/// # async fn handler() {}
/// # async fn demo(header: &str) {
/// use samekey_runtime::{CallId, context::InboundCall};
/// let call_id: CallId = header.parse().unwrap();
/// InboundCall::new().call_id(call_id).scope(handler()).await;
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct InboundCall {
    call_id: Option<CallId>,
    trace_id: Option<TraceId>,
    adopted: Arc<AtomicBool>,
}

impl InboundCall {
    /// An empty inbound context: calls in it get new callIds and one shared new traceId.
    pub fn new() -> InboundCall {
        InboundCall::default()
    }

    /// The callId the request carried, for the first call in the scope to adopt.
    pub fn call_id(mut self, call_id: CallId) -> InboundCall {
        self.call_id = Some(call_id);
        self
    }

    /// The traceId the request carried, for every call in the scope.
    pub fn trace_id(mut self, trace_id: TraceId) -> InboundCall {
        self.trace_id = Some(trace_id);
        self
    }

    /// The inbound context the current task runs in, to carry into a task it spawns (task-locals do
    /// not follow `tokio::spawn`): the same context — the callId still adopted by the first call only —
    /// or, inside a call, its traceId. `None` outside both.
    pub fn current() -> Option<InboundCall> {
        SCOPE
            .try_with(|scope| match scope {
                Scope::InboundCall(inbound) => inbound.clone(),
                Scope::Call(call) => InboundCall::new().trace_id(call.trace_id),
            })
            .ok()
    }

    /// Runs `f` with this inbound context.
    pub async fn scope<F: Future>(mut self, f: F) -> F::Output {
        self.trace_id.get_or_insert_with(TraceId::new);
        SCOPE.scope(Scope::InboundCall(self), f).await
    }
}

/// Whether this task runs in an [`InboundCall`] scope whose callId no call has adopted yet.
pub(crate) fn inbound_pending() -> bool {
    SCOPE
        .try_with(|scope| match scope {
            Scope::InboundCall(inbound) => {
                inbound.call_id.is_some() && !inbound.adopted.load(Ordering::Acquire)
            }
            Scope::Call(_) => false,
        })
        .unwrap_or(false)
}

/// Who a starting call is: its callId, its traceId, whether the callId was adopted, and the places
/// the calls it is nested in hold.
pub(crate) struct Identity {
    pub(crate) call_id: CallId,
    pub(crate) trace_id: TraceId,
    /// The callId was adopted from an inbound context: other calls (the caller's retries, arriving
    /// as requests of their own) may carry it too, whereas a new one is this call's alone.
    pub(crate) adopted: bool,
    /// The places held by the enclosing calls (none outside a call).
    pub(crate) places: Places,
}

/// The identity of a call that is starting: its callId adopted from an inbound context when one is
/// waiting, else new; its traceId inherited from the enclosing call or inbound context.
pub(crate) fn identify(prefix: &'static str, node: &ShortLabel, now_ms: u64) -> Identity {
    let found = SCOPE.try_with(|scope| match scope {
        Scope::Call(outer) => (None, outer.trace_id, outer.places),
        Scope::InboundCall(inbound) => {
            let adopted = match &inbound.call_id {
                Some(id) if !inbound.adopted.swap(true, Ordering::AcqRel) => Some(id.clone()),
                _ => None,
            };
            (
                adopted,
                inbound.trace_id.unwrap_or_default(),
                Places::default(),
            )
        }
    });
    let (adopted, trace_id, places) =
        found.unwrap_or_else(|_| (None, TraceId::new(), Places::default()));
    let (call_id, adopted) = match adopted {
        Some(call_id) => (call_id, true),
        None => (
            CallId::generate_at(ShortLabel::from_static(prefix), node.clone(), now_ms),
            false,
        ),
    };
    Identity {
        call_id,
        trace_id,
        adopted,
        places,
    }
}

#[cfg(test)]
mod tests {
    use super::Places;

    #[test]
    fn places_keep_the_innermost_limiters_once_each() {
        let places = Places::default().with(1).with(2).with(1);
        assert!(places.holds(1) && places.holds(2));
        assert!(!places.holds(0), "0 names no limiter");
        let deep = (1..=Places::DEPTH + 1).fold(Places::default(), Places::with);
        assert!(!deep.holds(1), "the outermost is the one let go");
        assert!((2..=Places::DEPTH + 1).all(|n| deep.holds(n)));
    }
}
