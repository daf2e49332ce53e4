//! The task-local call context: inside an `#[idempotent]` function, [`current()`] tells the callId,
//! traceId, key and attempt number of the running call; a server or gateway sets an [`Inbound`] context
//! so that the call it serves keeps the callId and traceId it arrived with.
//!
//! # Guarantees
//!
//! * Every attempt of a call sees the same callId, traceId and key; only the attempt number changes.
//! * A call made inside another call (check → debit → notify) gets its own callId and inherits the
//!   traceId, so a chain shares one traceId.
//! * An inbound callId is adopted by the **first** `#[idempotent]` call in its scope only: it identifies
//!   one call, and handing it to a second call would make two calls share an identity.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::call_id::{CallId, Label, TraceId};
use crate::key::Key;
use crate::receipt::Fence;

tokio::task_local! {
    static SCOPE: Scope;
}

#[derive(Clone)]
enum Scope {
    Call(Context),
    Inbound(Inbound),
}

/// What the running call knows about itself. Read it with [`current()`].
#[derive(Debug, Clone)]
pub struct Context {
    call_id: CallId,
    trace_id: TraceId,
    key: Key,
    attempt: u32,
    fence: Fence,
    started_ms: u64,
    expires_at_ms: u64,
    protected: bool,
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
            fence,
            started_ms,
            expires_at_ms,
            protected: true,
        }
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

/// The context of the running `#[idempotent]` call.
///
/// # Panics
///
/// Outside the body of an `#[idempotent]` function. Use [`try_current`] where that can happen.
pub fn current() -> Context {
    match try_current() {
        Some(context) => context,
        None => panic!(
            "samekey::current() called outside an #[idempotent] function; use samekey::try_current()"
        ),
    }
}

/// The context of the running `#[idempotent]` call, or `None` outside one.
pub fn try_current() -> Option<Context> {
    SCOPE
        .try_with(|scope| match scope {
            Scope::Call(context) => Some(context.clone()),
            Scope::Inbound(_) => None,
        })
        .ok()
        .flatten()
}

/// Identity that arrived with a request (`X-Call-Id`, `X-Trace-Id`, message attributes): run the handler
/// inside [`Inbound::scope`] and the `#[idempotent]` call it makes keeps that callId and traceId.
///
/// ```
/// # async fn handler() {}
/// # async fn demo(header: &str) {
/// use samekey_runtime::{CallId, Inbound};
/// let call_id: CallId = header.parse().unwrap();
/// Inbound::new().call_id(call_id).scope(handler()).await;
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Inbound {
    call_id: Option<CallId>,
    trace_id: Option<TraceId>,
    adopted: Arc<AtomicBool>,
}

impl Inbound {
    /// An empty inbound context: calls in it get new callIds and one shared new traceId.
    pub fn new() -> Inbound {
        Inbound::default()
    }

    /// The callId the request carried, for the first call in the scope to adopt.
    pub fn call_id(mut self, call_id: CallId) -> Inbound {
        self.call_id = Some(call_id);
        self
    }

    /// The traceId the request carried, for every call in the scope.
    pub fn trace_id(mut self, trace_id: TraceId) -> Inbound {
        self.trace_id = Some(trace_id);
        self
    }

    /// The inbound context the current task runs in, to carry into a task it spawns (task-locals do
    /// not follow `tokio::spawn`): the same context — the callId still adopted by the first call only —
    /// or, inside a call, its traceId. `None` outside both.
    pub fn current() -> Option<Inbound> {
        SCOPE
            .try_with(|scope| match scope {
                Scope::Inbound(inbound) => inbound.clone(),
                Scope::Call(call) => Inbound::new().trace_id(call.trace_id),
            })
            .ok()
    }

    /// Runs `f` with this inbound context.
    pub async fn scope<F: Future>(mut self, f: F) -> F::Output {
        self.trace_id.get_or_insert_with(TraceId::new);
        SCOPE.scope(Scope::Inbound(self), f).await
    }
}

/// Whether this task runs in an [`Inbound`] scope whose callId no call has adopted yet.
pub(crate) fn inbound_pending() -> bool {
    SCOPE
        .try_with(|scope| match scope {
            Scope::Inbound(inbound) => {
                inbound.call_id.is_some() && !inbound.adopted.load(Ordering::Acquire)
            }
            Scope::Call(_) => false,
        })
        .unwrap_or(false)
}

/// The callId and traceId of a call that is starting: adopted from an inbound context when one is
/// waiting, else new; the traceId is inherited from the enclosing call or inbound context. The flag
/// says whether the callId was adopted: other calls (the caller's retries, arriving as requests of
/// their own) may carry it too, whereas a new one is this call's alone.
pub(crate) fn identify(prefix: &'static str, node: &Label, now_ms: u64) -> (CallId, TraceId, bool) {
    let found = SCOPE.try_with(|scope| match scope {
        Scope::Call(outer) => (None, outer.trace_id),
        Scope::Inbound(inbound) => {
            let adopted = match &inbound.call_id {
                Some(id) if !inbound.adopted.swap(true, Ordering::AcqRel) => Some(id.clone()),
                _ => None,
            };
            (adopted, inbound.trace_id.unwrap_or_default())
        }
    });
    let (adopted, trace_id) = found.unwrap_or_else(|_| (None, TraceId::new()));
    match adopted {
        Some(call_id) => (call_id, trace_id, true),
        None => (
            CallId::generate_at(Label::from_static(prefix), node.clone(), now_ms),
            trace_id,
            false,
        ),
    }
}
