//! The at-most-once core without the attribute: what `#[idempotent]` expands to, as an API for code
//! that cannot put an attribute on a function — a tower layer, a message inbox, a gRPC service, a
//! closure.
//!
//! An [`AtMostOnce`] names one operation and its policy (the attribute's arguments); each call gives
//! its key, optionally `verify` parts and inputs, and its body as a closure that runs once per attempt:
//!
//! ```
//! use std::time::Duration;
//! use samekey_runtime::at_most_once::AtMostOnce;
//! use samekey_runtime::{Classify, ErrorClass, Runtime};
//!
//! #[derive(Debug, thiserror::Error)]
//! enum PayError {
//!     #[error("declined")]
//!     Declined,
//!     #[error(transparent)]
//!     Samekey(#[from] samekey_runtime::Error),
//! }
//!
//! impl Classify for PayError {
//!     fn classify(&self) -> ErrorClass {
//!         match self {
//!             PayError::Declined => ErrorClass::Permanent,
//!             PayError::Samekey(e) => e.classify(),
//!         }
//!     }
//! }
//!
//! // Made once, as a static: the operation's policy is fixed for the process.
//! static CHARGE: AtMostOnce = AtMostOnce::new("orders.charge")
//!     .prefix("chg")
//!     .retries(3)
//!     .ttl(Duration::from_secs(24 * 60 * 60));
//!
//! async fn charge(rt: &Runtime, order_id: &str, cents: u64) -> Result<u64, PayError> {
//!     CHARGE
//!         .key(&order_id)
//!         .verify(&cents)
//!         .runtime(rt)
//!         .run(|| async move {
//!             // The same callId on every attempt: send it, so the gateway can deduplicate.
//!             let _call_id = samekey_runtime::current().call_id().clone();
//!             Ok(cents)
//!         })
//!         .await
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let rt = Runtime::new();
//! assert_eq!(charge(&rt, "o-1", 500).await.unwrap(), 500);
//! // A duplicate replays the first result; the body does not run again.
//! assert_eq!(charge(&rt, "o-1", 500).await.unwrap(), 500);
//! # }
//! ```
//!
//! # Guarantees
//!
//! Those of the attribute, by the same code (the call's steps, the one take-over, the drop guard):
//!
//! * The key and the callId are fixed before the first attempt; every attempt sees the same callId
//!   ([`current`](crate::current) in the body).
//! * Nothing runs without a claim; a store that fails makes the call fail closed.
//! * A duplicate gets the stored first outcome; one that comes while the first runs waits for it
//!   ([`OnBusy::Wait`]) or is refused ([`OnBusy::Reject`]).
//! * **Once an attempt may have run, nothing releases the key** — not exhaustion, not a cancelled
//!   caller, not a failed write. An uncertain outcome is asked about by callId
//!   ([`Invocation::run_asking`]), retried under the same callId ([`OnUnknown::Rerun`]), or recorded
//!   `UNKNOWN`, queued for compensation and answered [`Error::Unknown`].
//! * The lease is kept alive while the body runs (without a `timeout`); an owner that stalls past it
//!   and comes back is fenced out and answers the recorded outcome, never one that contradicts what
//!   it knows happened.
//!
//! The error type needs [`Classify`](crate::Classify) (which failures may be retried) and
//! `From<samekey::Error>` (samekey's own answers); its failures are stored by their message (a
//! duplicate gets [`Error::Failed`]), or exactly with serde after
//! [`Invocation::exact_errors`].

use std::fmt::Display;
use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::call::{begin, Begun, CallError, CallOutput, LookupAnswer, Spec, Step};
pub use crate::call::{OnBusy, OnUnknown};
use crate::call_id::{validate_label, CallId, ParseCallIdError};
pub use crate::codec::StoredByMessage;
use crate::codec::{ErrorCodec, ExactErrors, MessageErrors, Probe};
use crate::error::Error;
use crate::key::{KeyBuilder, KeyPart};
use crate::observe::metrics::MetricsCell;
use crate::runtime::Runtime;
use crate::scope::OperationCell;

/// One operation run at most once per key, and its policy: the arguments `#[idempotent(…)]` takes.
/// Build it once (a `static`, or [`AtMostOnce::leak`] for settings read at start-up) and call it with
/// [`AtMostOnce::key`].
///
/// The defaults are the attribute's: 3 retries, backoff 100 ms to 10 s (×2), ±20 % jitter, no
/// per-attempt timeout (the lease is renewed while the body runs), keys kept 24 h, duplicates wait,
/// an unknown outcome held for compensation, the runtime's retry budget and concurrency limit.
#[derive(Debug)]
pub struct AtMostOnce {
    spec: Spec,
    /// The callId prefix is not a valid label: every call fails closed with it.
    bad_prefix: bool,
}

impl AtMostOnce {
    /// The operation of `scope`: the key's name space, stable across builds (`"orders.charge"`). Two
    /// operations never share a scope.
    pub const fn new(scope: &'static str) -> AtMostOnce {
        AtMostOnce {
            spec: Spec {
                scope,
                scope_given: true,
                operation: OperationCell::new(),
                prefix: "call",
                name: scope,
                retries: 3,
                budget: None,
                metrics: MetricsCell::new(),
                backoff_base: Duration::from_millis(100),
                backoff_cap: Duration::from_secs(10),
                jitter: 0.2,
                timeout: None,
                ttl: Duration::from_secs(24 * 60 * 60),
                window: None,
                on_busy: OnBusy::Wait,
                on_unknown: OnUnknown::Hold,
                has_lookup: false,
                on_missing_key: crate::call::OnMissingKey::Error,
            },
            bad_prefix: false,
        }
    }

    /// The callId prefix (default `call`): 1 to 32 ASCII letters, digits, `_` or `.`. Another prefix
    /// makes every call fail closed with [`Error::InvalidKey`] (check it at start-up with
    /// [`AtMostOnce::check`]).
    pub const fn prefix(mut self, prefix: &'static str) -> AtMostOnce {
        self.spec.prefix = prefix;
        self.bad_prefix = !valid_label(prefix.as_bytes());
        self
    }

    /// The operation's name in traces (default its scope).
    pub const fn name(mut self, name: &'static str) -> AtMostOnce {
        self.spec.name = name;
        self
    }

    /// Retries after the first attempt (default 3; at most 10).
    pub const fn retries(mut self, retries: u32) -> AtMostOnce {
        self.spec.retries = if retries > 10 { 10 } else { retries };
        self
    }

    /// The exponential backoff's first and largest delay (default 100 ms and 10 s).
    pub const fn backoff(mut self, base: Duration, cap: Duration) -> AtMostOnce {
        self.spec.backoff_base = base;
        self.spec.backoff_cap = cap;
        self
    }

    /// The ± fraction applied to every delay, in `0.0..=1.0` (default 0.2; clamped).
    pub const fn jitter(mut self, jitter: f64) -> AtMostOnce {
        self.spec.jitter = if jitter.is_nan() || jitter < 0.0 {
            0.0
        } else if jitter > 1.0 {
            1.0
        } else {
            jitter
        };
        self
    }

    /// The per-attempt limit: an attempt that outlasts it has an unknown outcome (default none).
    /// Give it with [`Invocation::run_asking`], or [`OnUnknown::Rerun`] when the remote
    /// deduplicates by callId; else an expiry leaves the call to compensation.
    pub const fn timeout(mut self, timeout: Duration) -> AtMostOnce {
        self.spec.timeout = Some(timeout);
        self
    }

    /// How long a finished key stays claimed and its outcome replayed (default 24 h).
    pub const fn ttl(mut self, ttl: Duration) -> AtMostOnce {
        self.spec.ttl = ttl;
        self
    }

    /// What a duplicate does while the first call runs (default [`OnBusy::Wait`]).
    pub const fn on_busy(mut self, on_busy: OnBusy) -> AtMostOnce {
        self.spec.on_busy = on_busy;
        self
    }

    /// Without a lookup, what an unknown outcome leads to (default [`OnUnknown::Hold`]).
    pub const fn on_unknown(mut self, on_unknown: OnUnknown) -> AtMostOnce {
        self.spec.on_unknown = on_unknown;
        self
    }

    /// The named dependency whose retry budget and concurrency limit the calls draw on (default the
    /// runtime's own), as `#[idempotent(budget = "…")]`.
    pub const fn budget(mut self, dependency: &'static str) -> AtMostOnce {
        self.spec.budget = Some(dependency);
        self
    }

    /// The operation of work that runs at most once per call and is never attempted twice by it: an
    /// inbound request's handler, a message's work (what the HTTP and gRPC layers and the message
    /// inbox run). Scope `samekey.once` (the integration scopes its keys itself, with
    /// [`AtMostOnce::with_key`]), one attempt, no lookup, no per-attempt timeout (the lease is renewed
    /// while the work runs); run its calls with [`Invocation::run_once`]. Leaked: make it once per
    /// layer or inbox, not once per call.
    pub fn inbound_work(
        name: &'static str,
        prefix: &'static str,
        ttl: Duration,
        on_busy: OnBusy,
        on_unknown: OnUnknown,
    ) -> &'static AtMostOnce {
        AtMostOnce::new("samekey.once")
            .name(name)
            .prefix(prefix)
            .retries(0)
            .backoff(Duration::from_millis(100), Duration::from_secs(1))
            .ttl(ttl)
            .on_busy(on_busy)
            .on_unknown(on_unknown)
            .leak()
    }

    /// Kept for the life of the process, for an operation whose settings are read at start-up (a
    /// layer's builder). Leak one per operation, not one per call.
    pub fn leak(self) -> &'static AtMostOnce {
        Box::leak(Box::new(self))
    }

    /// Whether the operation's settings can make callIds: `Err` names what is wrong with the prefix.
    pub fn check(&self) -> Result<(), ParseCallIdError> {
        validate_label(self.spec.prefix)
    }

    /// The operation's scope.
    pub fn scope(&self) -> &'static str {
        self.spec.scope
    }

    /// A call of the operation under the key made of `part` (more with [`Invocation::part`]).
    pub fn key<K: KeyPart + ?Sized>(&'static self, part: &K) -> Invocation<'static, ByMessage> {
        let mut key = KeyBuilder::new(self.spec.scope);
        key.part(part);
        self.with_key(key)
    }

    /// A call of the operation under a key built by hand, with a scope of its own: an integration
    /// that names its keys itself (an HTTP layer scopes them by method and route) builds them with
    /// [`KeyBuilder::new`]. Keys of different operations must never share a scope.
    pub fn with_key(&'static self, key: KeyBuilder) -> Invocation<'static, ByMessage> {
        Invocation {
            op: self,
            runtime: None,
            key,
            verify: None,
            inputs: None,
            errors: PhantomData,
        }
    }
}

/// Whether `label` is 1 to 32 ASCII letters, digits, `_` or `.` (a const form of
/// [`validate_label`]).
const fn valid_label(label: &[u8]) -> bool {
    if label.is_empty() || label.len() > 32 {
        return false;
    }
    let mut i = 0;
    while i < label.len() {
        let b = label[i];
        if !(b.is_ascii_alphanumeric() || b == b'_' || b == b'.') {
            return false;
        }
        i += 1;
    }
    true
}

/// How a call's failures are stored: by their message (the default) or exactly. Implemented by
/// [`ByMessage`] and [`Exactly`] only (sealed).
pub trait ErrorStorage<E>: sealed::Sealed {
    /// The codec of `E`'s failures.
    #[doc(hidden)]
    fn codec() -> ErrorCodec<E>;
}

/// Failures stored by their `Display` message: a duplicate gets
/// [`Error::Failed`] with it, through `From<samekey::Error>`.
#[derive(Debug, Clone, Copy)]
pub struct ByMessage;

/// Failures stored with serde: a duplicate gets the error itself.
#[derive(Debug, Clone, Copy)]
pub struct Exactly;

mod sealed {
    /// Keeps [`ErrorStorage`](super::ErrorStorage) to the two ways this crate stores failures.
    pub trait Sealed {}
    impl Sealed for super::ByMessage {}
    impl Sealed for super::Exactly {}
}

impl<E: Display> ErrorStorage<E> for ByMessage {
    fn codec() -> ErrorCodec<E> {
        <Probe<E> as MessageErrors<E>>::codec(&Probe::new())
    }
}

impl<E: Serialize + DeserializeOwned> ErrorStorage<E> for Exactly {
    fn codec() -> ErrorCodec<E> {
        <&Probe<E> as ExactErrors<E>>::codec(&&Probe::new())
    }
}

/// One call of an [`AtMostOnce`] operation, being set up: its key, runtime, `verify` parts and
/// inputs; then [`run`](Invocation::run) or [`run_asking`](Invocation::run_asking).
#[must_use = "a call does nothing until it is run"]
pub struct Invocation<'r, S> {
    op: &'static AtMostOnce,
    runtime: Option<&'r Runtime>,
    key: KeyBuilder,
    verify: Option<KeyBuilder>,
    inputs: Option<serde_json::Value>,
    errors: PhantomData<S>,
}

impl<'r, S> Invocation<'r, S> {
    /// One more part of the key.
    pub fn part<K: KeyPart + ?Sized>(mut self, part: &K) -> Invocation<'r, S> {
        self.key.part(part);
        self
    }

    /// A part whose fingerprint must match on a replay (`verify = …`): the same key with another
    /// value is [`Error::KeyReuse`] and nothing runs. Several calls add parts.
    pub fn verify<K: KeyPart + ?Sized>(mut self, part: &K) -> Invocation<'r, S> {
        self.verify
            .get_or_insert_with(|| KeyBuilder::new(self.op.spec.scope))
            .part(part);
        self
    }

    /// On `runtime` when it is `Some`, else the ambient one (see [`runtime`](Invocation::runtime)):
    /// for an integration that takes a runtime optionally.
    pub fn runtime_or_ambient<'s>(self, runtime: Option<&'s Runtime>) -> Invocation<'s, S>
    where
        'r: 's,
    {
        Invocation {
            op: self.op,
            runtime: runtime.or(self.runtime),
            key: self.key,
            verify: self.verify,
            inputs: self.inputs,
            errors: self.errors,
        }
    }

    /// `verify` parts built by hand (a request's method, path and body), in place of those given by
    /// [`verify`](Invocation::verify).
    pub fn verify_with(mut self, verify: KeyBuilder) -> Invocation<'r, S> {
        self.verify = Some(verify);
        self
    }

    /// On `runtime` (default: the ambient one, [`Runtime::scope`]'s, else the process-wide default).
    pub fn runtime<'s>(self, runtime: &'s Runtime) -> Invocation<'s, S> {
        Invocation {
            op: self.op,
            runtime: Some(runtime),
            key: self.key,
            verify: self.verify,
            inputs: self.inputs,
            errors: self.errors,
        }
    }

    /// Keeps `inputs` (encoded) in the call's compensation entry, for a worker's reversal or re-run
    /// (`inputs = …`). Inputs that cannot be encoded are left out (logged).
    pub fn inputs<I: Serialize + ?Sized>(mut self, inputs: &I) -> Invocation<'r, S> {
        // A NaN would be kept as `null` and a re-run would send other inputs under this callId.
        let encoded =
            crate::finite::refuse_non_finite(inputs).and_then(|()| serde_json::to_value(inputs));
        match encoded {
            Ok(value) => self.inputs = Some(value),
            Err(e) => {
                tracing::warn!(target: "samekey", scope = self.op.spec.scope, error = %e,
                    "the call's inputs cannot be encoded; its compensation entry goes without them");
            }
        }
        self
    }

    /// Stores the call's failures exactly, with serde (a duplicate gets the error itself).
    pub fn exact_errors(self) -> Invocation<'r, Exactly> {
        Invocation {
            op: self.op,
            runtime: self.runtime,
            key: self.key,
            verify: self.verify,
            inputs: self.inputs,
            errors: PhantomData,
        }
    }

    /// Runs the call: `body` once per attempt (in the call's context, see
    /// [`current`](crate::current)) if the key is the first of its kind, else the recorded outcome.
    /// An uncertain outcome is retried under the same callId with [`OnUnknown::Rerun`], else left
    /// `UNKNOWN` to compensation.
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        S: ErrorStorage<E>,
        T: CallOutput,
        E: CallError,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.drive(
            body,
            None::<fn(CallId) -> std::future::Ready<NoLookup<T, E>>>,
            false,
        )
        .await
    }

    /// Runs `work` at most once, for work that must never be attempted twice by this call (an inbound
    /// request's handler, a message's work): the key's first call runs it, a duplicate gets the
    /// recorded outcome. The call makes one attempt, whatever the operation's `retries`: where a
    /// retry would come, it ends as spent retries do — with the work's answer that says nothing ran,
    /// the key given back — and after an uncertain outcome `UNKNOWN`, for compensation.
    pub async fn run_once<T, E, W, Fut>(self, work: W) -> Result<T, E>
    where
        S: ErrorStorage<E>,
        T: CallOutput,
        E: CallError,
        W: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut work = Some(work);
        let body = move || {
            let work = work.take();
            async move {
                match work {
                    Some(work) => work().await,
                    // Never asked: the run makes one attempt at most.
                    None => Err(E::from(Error::Exhausted {
                        call_id: crate::current().call_id().clone(),
                        attempts: 1,
                    })),
                }
            }
        };
        self.drive(
            body,
            None::<fn(CallId) -> std::future::Ready<NoLookup<T, E>>>,
            true,
        )
        .await
    }

    /// Runs the call as [`run`](Invocation::run) does, asking `lookup` by the call's callId what
    /// became of an uncertain attempt (a timeout, a reset) before anything is sent again, as
    /// `#[idempotent(lookup = …)]` does: `Succeeded` and `Failed` are recorded, `NotReceived` lets
    /// the call retry under the same callId, `Processing` is asked again, an `Err` (the lookup itself
    /// failed) uses a retry.
    pub async fn run_asking<T, E, F, Fut, L, LFut>(self, body: F, lookup: L) -> Result<T, E>
    where
        S: ErrorStorage<E>,
        T: CallOutput,
        E: CallError,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        L: FnMut(CallId) -> LFut,
        LFut: Future,
        LFut::Output: LookupAnswer<T, E>,
    {
        self.drive(body, Some(lookup), false).await
    }

    /// Runs the call; `once`: one attempt at most ([`Invocation::run_once`]).
    async fn drive<T, E, F, Fut, L, LFut>(
        self,
        mut body: F,
        mut lookup: Option<L>,
        once: bool,
    ) -> Result<T, E>
    where
        S: ErrorStorage<E>,
        T: CallOutput,
        E: CallError,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        L: FnMut(CallId) -> LFut,
        LFut: Future,
        LFut::Output: LookupAnswer<T, E>,
    {
        let op = self.op;
        if op.bad_prefix {
            let reason = match op.check() {
                Err(e) => e.to_string(),
                Ok(()) => "invalid".to_owned(),
            };
            return Err(E::from(Error::InvalidKey {
                part: "prefix".to_owned(),
                reason,
            }));
        }
        let begun = begin::<Result<T, E>>(
            self.runtime,
            &op.spec,
            "",
            self.key,
            self.verify,
            S::codec(),
            None,
        );
        let mut run = match begun {
            Begun::Answered(out) => return out,
            Begun::Run(run) => run,
        };
        if lookup.is_some() {
            run.asking();
        }
        if once {
            run.at_most_one_attempt();
        }
        if let Some(inputs) = &self.inputs {
            run.keep_inputs(inputs);
        }
        let mut step = run.start().await;
        loop {
            step = match step {
                Step::Done(out) => return out,
                // Made inside the attempt's context: a body that reads `current()` before its first
                // await (a plain closure) sees this call, not an enclosing one.
                Step::Attempt => run.attempt(async { body().await }).await,
                Step::Lookup(call_id) => match lookup.as_mut() {
                    Some(lookup) => run.resolve(lookup(call_id)).await,
                    None => run.no_lookup().await,
                },
            };
        }
    }
}

/// The lookup answer of a call without one (never asked for).
type NoLookup<T, E> = Result<crate::classify::RemoteStatus<T, E>, String>;
