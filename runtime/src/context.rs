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
//! * An inbound W3C `traceparent` ([`InboundCall::traceparent`]) gives the traceId of every call in its
//!   scope, and is what they pass on ([`Context::traceparent`], [`outbound_traceparent`]): its
//!   trace-id always, its parent-id unless an OpenTelemetry span of the same trace is active (feature
//!   `opentelemetry`). samekey records no spans of its own, so it forwards the parent-id unchanged,
//!   as W3C Trace Context allows a hop that does not take part in the trace.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::call_id::{CallId, ShortLabel, TraceId, TraceParent};
use crate::clock::RuntimeClock;
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
    /// The traceId, and the parent-id and flags passed on (see [`Context::traceparent`]).
    trace: TraceParent,
    key: Key,
    attempt: u32,
    /// The messages this attempt made so far ([`Context::next_message_seq`]).
    messages: MessageCount,
    fence: Fence,
    time: AttemptTime,
    protected: bool,
    places: Places,
}

/// An attempt's times: when it started, and what a receipt it writes is dated and kept by.
#[derive(Debug, Clone)]
pub(crate) struct AttemptTime {
    /// When the attempt started, in the runtime's Unix ms.
    pub(crate) started_ms: u64,
    /// The function's `ttl`, in ms: a receipt lives this long from its write.
    pub(crate) ttl_ms: u64,
    /// The runtime's clock, for "now" at a write the body makes (`complete_in`); the system clock
    /// costs nothing to carry.
    pub(crate) clock: RuntimeClock,
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
        trace: TraceParent,
        key: Key,
        attempt: u32,
        fence: Fence,
        time: AttemptTime,
    ) -> Context {
        Context {
            call_id,
            trace,
            key,
            attempt,
            messages: MessageCount::default(),
            fence,
            time,
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
        self.trace.trace_id()
    }

    /// The W3C `traceparent` a request sent by this call carries (samekey-http's `CallHeaders`
    /// middleware sends it beside `X-Trace-Id`):
    ///
    /// * **trace-id**: the call's [traceId](Context::trace_id), always;
    /// * **parent-id**: with feature `opentelemetry`, the id of the active OpenTelemetry span (the
    ///   current `tracing` span's, through `tracing-opentelemetry`, else OpenTelemetry's current
    ///   context's) when there is a valid one of the same trace; else the parent-id of the
    ///   `traceparent` the call's request arrived with ([`InboundCall::traceparent`]), forwarded
    ///   unchanged — samekey records no spans of its own, and W3C Trace Context lets a hop that does
    ///   not take part in the trace pass it through; else a random non-zero id, fixed for the call
    ///   (a call nested in another inherits its parent's);
    /// * **flags**: those of the span whose id it names — the OpenTelemetry span's (its `sampled`
    ///   decision), else the inbound `traceparent`'s; else `00`, not sampled: samekey recorded
    ///   nothing, and a downstream sampler that follows its parent then records nothing either (run
    ///   OpenTelemetry, with the feature, to start sampled traces).
    ///
    /// The same on every attempt of the call, unless an OpenTelemetry span of each attempt names it.
    /// See <https://www.w3.org/TR/trace-context/#traceparent-header>.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use samekey_runtime::{context::InboundCall, TraceParent};
    /// let inbound: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap();
    /// // What the call of a handler sends on, as an `#[idempotent]` body would read it.
    /// let sent = InboundCall::new()
    ///     .traceparent(inbound)
    ///     .scope(async { samekey_runtime::context::outbound_traceparent() })
    ///     .await;
    /// assert_eq!(sent, Some(inbound), "passed on unchanged");
    /// # }
    /// ```
    pub fn traceparent(&self) -> TraceParent {
        #[cfg(feature = "opentelemetry")]
        if let Some(active) = crate::otel::active_traceparent(self.trace.trace_id()) {
            return active;
        }
        self.trace
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
        self.time.started_ms
    }

    /// When a receipt written now would expire: now (the runtime's clock) plus the function's `ttl`.
    /// A receipt's `ttl` counts from its write, whenever in the attempt that comes.
    pub fn expires_at_ms(&self) -> u64 {
        self.now_ms().saturating_add(self.time.ttl_ms)
    }

    /// The function's `ttl`, in milliseconds: how long a receipt lives from its write.
    pub fn ttl_ms(&self) -> u64 {
        self.time.ttl_ms
    }

    /// Now, by the runtime's clock (the clock the runtime judges leases and expiry by where the store
    /// has none of its own).
    pub fn now_ms(&self) -> u64 {
        self.time.clock.now_ms()
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
    /// The W3C `traceparent` the request carried, of the trace `trace_id` names.
    traceparent: Option<TraceParent>,
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

    /// The traceId the request carried, for every call in the scope. A
    /// [`traceparent`](InboundCall::traceparent) set before of another trace is dropped (the
    /// traceId set last wins); call this one first where both arrived.
    pub fn trace_id(mut self, trace_id: TraceId) -> InboundCall {
        self.trace_id = Some(trace_id);
        if self.traceparent.is_some_and(|tp| tp.trace_id() != trace_id) {
            self.traceparent = None;
        }
        self
    }

    /// The W3C `traceparent` the request carried: its trace-id becomes the traceId of every call in
    /// the scope (it replaces one set by [`trace_id`](InboundCall::trace_id)), and the value is kept
    /// so that every call in the scope, the calls nested in them, and a task that carries
    /// [`InboundCall::current`] along pass it on ([`Context::traceparent`],
    /// [`outbound_traceparent`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use samekey_runtime::{context::InboundCall, TraceId, TraceParent};
    /// let tp: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap();
    /// let seen = InboundCall::new()
    ///     .trace_id(TraceId::new())
    ///     .traceparent(tp)
    ///     .scope(async { InboundCall::current() })
    ///     .await;
    /// assert_eq!(seen.and_then(|inbound| inbound.inbound_traceparent()), Some(tp));
    /// # }
    /// ```
    pub fn traceparent(mut self, tp: TraceParent) -> InboundCall {
        self.trace_id = Some(tp.trace_id());
        self.traceparent = Some(tp);
        self
    }

    /// The W3C `traceparent` the request carried ([`InboundCall::traceparent`]), if any.
    pub fn inbound_traceparent(&self) -> Option<TraceParent> {
        self.traceparent
    }

    /// What a request sent in this scope outside any call carries (see [`outbound_traceparent`]).
    fn outbound(&self) -> TraceParent {
        let trace_id = self.trace_id.unwrap_or_default();
        #[cfg(feature = "opentelemetry")]
        if let Some(active) = crate::otel::active_traceparent(trace_id) {
            return active;
        }
        match self.traceparent {
            Some(tp) => tp,
            None => TraceParent::new(trace_id, 0, 0),
        }
    }

    /// The inbound context the current task runs in, to carry into a task it spawns (task-locals do
    /// not follow `tokio::spawn`): the same context — the callId still adopted by the first call only —
    /// or, inside a call, its traceId and the `traceparent` it passes on. `None` outside both.
    pub fn current() -> Option<InboundCall> {
        SCOPE
            .try_with(|scope| match scope {
                Scope::InboundCall(inbound) => inbound.clone(),
                Scope::Call(call) => InboundCall::new().traceparent(call.trace),
            })
            .ok()
    }

    /// Runs `f` with this inbound context.
    pub async fn scope<F: Future>(mut self, f: F) -> F::Output {
        self.trace_id.get_or_insert_with(TraceId::new);
        SCOPE.scope(Scope::InboundCall(self), f).await
    }
}

/// The W3C `traceparent` a request sent now carries: inside an `#[idempotent]` call, the call's
/// [`Context::traceparent`]; outside one but in an [`InboundCall`] scope, the inbound `traceparent`
/// (or, with feature `opentelemetry`, the active OpenTelemetry span of its trace), else one of the
/// scope's traceId with a random non-zero parent-id and flags `00`; `None` outside both.
///
/// ```
/// assert_eq!(samekey_runtime::context::outbound_traceparent(), None);
/// ```
pub fn outbound_traceparent() -> Option<TraceParent> {
    SCOPE
        .try_with(|scope| match scope {
            Scope::Call(call) => call.traceparent(),
            Scope::InboundCall(inbound) => inbound.outbound(),
        })
        .ok()
}

/// Makes `span` — the `samekey` span an integration opens for an inbound request, before it is
/// entered — a child of the active OpenTelemetry span when there is one, else of the remote span the
/// inbound `traceparent` names (a `SpanContext` marked remote), so that a trace exported by
/// OpenTelemetry shows the request under its caller's span.
///
/// Without feature `opentelemetry` it does nothing (OpenTelemetry is not a dependency of the default
/// build). With it, it needs `tracing-opentelemetry`'s layer in the subscriber; without one, or once
/// `span` has been entered, it does nothing either (logged at debug).
///
/// ```
/// let inbound = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().ok();
/// let span = tracing::info_span!("samekey");
/// samekey_runtime::context::parent_span(&span, inbound.as_ref());
/// ```
pub fn parent_span(span: &tracing::Span, inbound: Option<&TraceParent>) {
    #[cfg(feature = "opentelemetry")]
    crate::otel::parent_span(span, inbound);
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (span, inbound);
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
    /// The traceId, and the parent-id and flags the call passes on.
    pub(crate) trace: TraceParent,
    /// The callId was adopted from an inbound context: other calls (the caller's retries, arriving
    /// as requests of their own) may carry it too, whereas a new one is this call's alone.
    pub(crate) adopted: bool,
    /// The places held by the enclosing calls (none outside a call).
    pub(crate) places: Places,
}

/// The identity of a call that is starting: its callId adopted from an inbound context when one is
/// waiting, else new; its traceId (and `traceparent`) inherited from the enclosing call or inbound
/// context, else a new one with a random parent-id.
pub(crate) fn identify(prefix: &'static str, node: &ShortLabel, now_ms: u64) -> Identity {
    let found = SCOPE.try_with(|scope| match scope {
        Scope::Call(outer) => (None, outer.trace, outer.places),
        Scope::InboundCall(inbound) => {
            let adopted = match &inbound.call_id {
                Some(id) if !inbound.adopted.swap(true, Ordering::AcqRel) => Some(id.clone()),
                _ => None,
            };
            let trace = match inbound.traceparent {
                Some(tp) => tp,
                None => TraceParent::new(inbound.trace_id.unwrap_or_default(), 0, 0),
            };
            (adopted, trace, Places::default())
        }
    });
    let (adopted, trace, places) = found.unwrap_or_else(|_| {
        (
            None,
            TraceParent::new(TraceId::new(), 0, 0),
            Places::default(),
        )
    });
    let (call_id, adopted) = match adopted {
        Some(call_id) => (call_id, true),
        None => (
            CallId::generate_at(ShortLabel::from_static(prefix), node.clone(), now_ms),
            false,
        ),
    };
    Identity {
        call_id,
        trace,
        adopted,
        places,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::{outbound_traceparent, try_current, InboundCall, Places};
    use crate::at_most_once::AtMostOnce;
    use crate::{Classify, Error, ErrorClass, Runtime, TraceId, TraceParent};

    #[derive(Debug, thiserror::Error)]
    enum Flaky {
        #[error("not yet")]
        NotYet,
        #[error(transparent)]
        Samekey(#[from] Error),
    }

    impl Classify for Flaky {
        fn classify(&self) -> ErrorClass {
            match self {
                Flaky::NotYet => ErrorClass::Retryable,
                Flaky::Samekey(e) => e.classify(),
            }
        }
    }

    static TRACED: AtMostOnce = AtMostOnce::new("context.tests.traced")
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .jitter(0.0);
    static NESTED: AtMostOnce = AtMostOnce::new("context.tests.nested");

    /// What each attempt of a call that fails once saw, `(traceId, traceparent)`, and what a call
    /// nested in its second attempt and a task spawned from it (through `InboundCall::current`) saw.
    async fn traced(rt: &Runtime, key: &str) -> Vec<(TraceId, TraceParent)> {
        let log = Mutex::new(Vec::new());
        let seen = &log;
        TRACED
            .key(key)
            .runtime(rt)
            .run(|| async move {
                let cx = try_current().unwrap();
                seen.lock().unwrap().push((cx.trace_id(), cx.traceparent()));
                assert_eq!(outbound_traceparent(), Some(cx.traceparent()));
                if cx.attempt() == 1 {
                    return Err(Flaky::NotYet);
                }
                let nested = NESTED
                    .key(key)
                    .runtime(rt)
                    .run(|| async {
                        let cx = try_current().unwrap();
                        Ok::<_, Flaky>((cx.trace_id(), cx.traceparent()))
                    })
                    .await?;
                let carried = InboundCall::current().unwrap();
                let spawned = tokio::spawn(carried.scope(async { outbound_traceparent() }))
                    .await
                    .unwrap()
                    .unwrap();
                seen.lock().unwrap().push(nested);
                seen.lock().unwrap().push((spawned.trace_id(), spawned));
                Ok(())
            })
            .await
            .unwrap();
        log.into_inner().unwrap()
    }

    #[tokio::test]
    async fn an_inbound_traceparent_is_every_calls_trace_and_is_passed_on() {
        let rt = Runtime::new();
        let tp: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .unwrap();
        let seen = InboundCall::new()
            .trace_id(TraceId::new())
            .traceparent(tp)
            .scope(traced(&rt, "inbound"))
            .await;
        assert_eq!(seen.len(), 4, "two attempts, a nested call, a spawned task");
        for (trace_id, sent) in seen {
            assert_eq!(trace_id, tp.trace_id(), "the traceparent's trace-id wins");
            assert_eq!(sent, tp, "forwarded unchanged: samekey records no span");
        }
    }

    #[tokio::test]
    async fn a_call_without_one_sends_one_fixed_for_the_call() {
        let rt = Runtime::new();
        let trace = TraceId::new();
        let seen = InboundCall::new()
            .trace_id(trace)
            .scope(traced(&rt, "x-trace-id"))
            .await;
        let (_, first) = seen[0];
        assert_eq!(first.trace_id(), trace);
        assert_ne!(first.parent_id(), 0);
        assert_eq!(first.flags(), 0, "not sampled: samekey recorded nothing");
        assert!(seen.iter().all(|&(t, sent)| t == trace && sent == first));

        // Outside any scope: a new trace, the same on every attempt too.
        let seen = traced(&rt, "no scope").await;
        assert_ne!(seen[0].0, trace);
        assert!(seen
            .iter()
            .all(|&(t, sent)| t == seen[0].0 && sent == seen[0].1));
    }

    #[tokio::test]
    async fn outside_a_call_the_inbound_scope_answers() {
        assert_eq!(outbound_traceparent(), None);
        let tp = TraceParent::new(TraceId::new(), 7, 1);
        let sent = InboundCall::new()
            .traceparent(tp)
            .scope(async { outbound_traceparent() })
            .await;
        assert_eq!(sent, Some(tp));
        let trace = TraceId::new();
        let sent = InboundCall::new()
            .trace_id(trace)
            .scope(async { outbound_traceparent() })
            .await
            .unwrap();
        assert_eq!((sent.trace_id(), sent.flags()), (trace, 0));
        // A traceId set after a traceparent of another trace drops it.
        let other = InboundCall::new().traceparent(tp).trace_id(trace);
        assert_eq!(other.inbound_traceparent(), None);
        let same = InboundCall::new().traceparent(tp).trace_id(tp.trace_id());
        assert_eq!(same.inbound_traceparent(), Some(tp));
    }

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
