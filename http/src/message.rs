//! Messages: the callId and traceId of a logical call in a message's attributes and in its body, and
//! an inbox that does a redelivered message's work once (seed 003 §4, the consumer's side).

use std::fmt::Display;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use samekey_runtime::__private::{KeyBuilder, MessageErrors as _, OnBusy, OnUnknown, Probe, Spec};
use samekey_runtime::{CallId, Classify, Error, Inbound, ParseCallIdError, Runtime, TraceId};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::once;

/// The attribute (header) that carries a message's callId.
pub const ATTR_CALL_ID: &str = "x-call-id";
/// The attribute (header) that carries a message's traceId.
pub const ATTR_TRACE_ID: &str = "x-trace-id";

/// A message with the identity of the call that sent it: the body a producer publishes (JSON with
/// `call_id`, `trace_id`, `payload`) and, through [`Envelope::attributes`], the broker's attributes —
/// so that a consumer that reads only one of the two still has them.
///
/// Publish from inside an `#[idempotent]` call: every attempt of that call (a publish retried after a
/// timeout) sends the same callId, and the consumer's [`Inbox`] does the work once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// The callId of the logical call the message belongs to.
    pub call_id: CallId,
    /// The traceId of its business chain.
    pub trace_id: TraceId,
    /// The message itself.
    pub payload: T,
}

impl<T> Envelope<T> {
    /// A message of the current `#[idempotent]` call (its callId and traceId); outside one, new ids
    /// (callId prefix `msg`, the default runtime's node).
    pub fn new(payload: T) -> Envelope<T> {
        match samekey_runtime::try_current() {
            Some(cx) => Envelope {
                call_id: cx.call_id().clone(),
                trace_id: cx.trace_id(),
                payload,
            },
            None => {
                let node = samekey_runtime::default_runtime().node().to_owned();
                let call_id = CallId::new("msg", &node)
                    .or_else(|_| CallId::new("msg", "node"))
                    .expect("`msg` and `node` are valid labels");
                Envelope {
                    call_id,
                    trace_id: TraceId::new(),
                    payload,
                }
            }
        }
    }

    /// The message's attributes: `x-call-id` and `x-trace-id`, for the broker's headers.
    pub fn attributes(&self) -> [(&'static str, String); 2] {
        [
            (ATTR_CALL_ID, self.call_id.to_string()),
            (ATTR_TRACE_ID, self.trace_id.to_string()),
        ]
    }

    /// A message read from a body without envelope and its attributes (`get` reads one by name): the
    /// callId must be there and valid; a missing traceId is a new one.
    pub fn from_attributes(
        payload: T,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Envelope<T>, ParseCallIdError> {
        let call_id = get(ATTR_CALL_ID).unwrap_or_default().parse()?;
        let trace_id = match get(ATTR_TRACE_ID) {
            Some(text) => text.parse()?,
            None => TraceId::new(),
        };
        Ok(Envelope {
            call_id,
            trace_id,
            payload,
        })
    }

    /// The message's identity as an inbound context: run a handler in [`Inbound::scope`] and the
    /// first `#[idempotent]` call it makes keeps the message's callId.
    pub fn inbound(&self) -> Inbound {
        Inbound::new()
            .call_id(self.call_id.clone())
            .trace_id(self.trace_id)
    }
}

/// A consumer's inbox: runs a message's handler **at most once per callId** — a message redelivered
/// (by the broker, or republished by a producer that retried) gets the first delivery's outcome
/// without running again — claimed and recorded in the runtime's store like any `#[idempotent]` call
/// (key: the inbox's scope and the callId).
///
/// The handler runs once per delivery; its error decides what the broker should do: a `Retryable`,
/// `RateLimited` or `Rejected` one gives the key back (nack: the redelivery runs it again), a
/// `Permanent` one is recorded (the redelivery gets it), an `Unknown` one leaves the message `UNKNOWN`
/// for the compensation worker. A redelivery that arrives while the first still runs waits for its
/// outcome.
#[derive(Debug)]
pub struct Inbox {
    runtime: Option<Runtime>,
    scope: String,
    ttl: Duration,
    spec: OnceLock<&'static Spec>,
}

impl Inbox {
    /// The inbox of one consumer (`scope` names it: `"shipping.on_paid"`), on the ambient runtime,
    /// remembering what it did for 7 days (longer than a broker keeps redelivering).
    pub fn new(scope: impl Into<String>) -> Inbox {
        Inbox {
            runtime: None,
            scope: scope.into(),
            ttl: Duration::from_secs(7 * 24 * 60 * 60),
            spec: OnceLock::new(),
        }
    }

    /// On `runtime`'s store.
    pub fn runtime(mut self, runtime: &Runtime) -> Inbox {
        self.runtime = Some(runtime.clone());
        self
    }

    /// How long a delivered message is remembered (default 7 days).
    pub fn ttl(mut self, ttl: Duration) -> Inbox {
        self.ttl = ttl;
        self.spec = OnceLock::new();
        self
    }

    fn spec(&self) -> &'static Spec {
        self.spec.get_or_init(|| {
            once::spec(
                "Inbox::deliver",
                "msg",
                self.ttl,
                OnBusy::Wait,
                OnUnknown::Hold,
            )
        })
    }

    /// Runs `handler` on the message's payload, under its callId and traceId, unless a delivery of
    /// the same callId already did: then answers that delivery's outcome (a failure by its message, as
    /// `samekey::Error::Failed`, through `E: From<samekey::Error>`).
    pub async fn deliver<T, R, E, F, Fut>(&self, message: Envelope<T>, handler: F) -> Result<R, E>
    where
        F: FnOnce(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + Display,
    {
        let inbound = message.inbound();
        let Envelope {
            call_id, payload, ..
        } = message;
        let mut key = KeyBuilder::new(&self.scope);
        key.part(call_id.as_str());
        let spec = self.spec();
        let runtime = self.runtime.as_ref();
        inbound
            .scope(once::run(
                runtime,
                spec,
                key,
                None,
                Probe::<E>::new().codec(),
                || handler(payload),
                // One attempt per delivery (no retries): never asked for twice.
                || once::exhausted(&call_id),
            ))
            .await
    }
}
