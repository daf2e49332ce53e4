//! Messages: the callId and traceId of a logical call in a message's attributes and in its body, and
//! an inbox that does a redelivered message's work once (seed 003 §4, the consumer's side).
//!
//! A message's identity is its call's callId and its number among the messages that call's attempt
//! made (`seq`, from 0): the n-th message of every attempt of a call has the same identity, so a
//! publish retried after a lost acknowledgement repeats its messages' identities, while two messages
//! of one call (two line items, two events) have identities of their own.

use std::fmt::{self, Display};
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use samekey_runtime::at_most_once::{AtMostOnce, OnBusy, OnUnknown};
use samekey_runtime::{
    call_id::ParseCallIdError, context::Context, context::InboundCall, key::KeyBuilder,
    key::KeyEncoder, CallId, Classify, Error, KeyPart, Runtime, TraceId, TraceParent,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::once;

/// The attribute (header) that carries a message's callId.
pub const ATTR_CALL_ID: &str = "x-call-id";
/// The attribute (header) that carries a message's number among those its call made
/// ([`Envelope::seq`]), in decimal.
pub const ATTR_MESSAGE_SEQ: &str = "x-message-seq";
/// The attribute (header) that carries a message's traceId.
pub const ATTR_TRACE_ID: &str = "x-trace-id";
/// The attribute (header) that carries a message's W3C `traceparent` ([`Envelope::traceparent`]).
pub const ATTR_TRACEPARENT: &str = "traceparent";

/// A message with the identity of the call that sent it: the body a producer publishes (JSON with
/// `call_id`, `seq`, `trace_id`, `traceparent`, `payload`) and, through [`Envelope::attributes`], the
/// broker's attributes — so that a consumer that reads only one of the two still has them.
///
/// Publish from inside an `#[idempotent]` call: every attempt of that call (a publish retried after a
/// timeout) sends its messages with the same identities — the call's callId and each message's
/// [`seq`](Envelope::seq) — and the consumer's [`Inbox`] does each message's work once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// The callId of the logical call the message belongs to.
    pub call_id: CallId,
    /// The message's number among the messages its call's attempt made, from 0 (see
    /// [`Envelope::new`]): with the callId, the message's identity. A body without it (an envelope
    /// from before it was added) reads as 0, the first message of its call.
    #[serde(default)]
    pub seq: u64,
    /// The traceId of its business chain.
    pub trace_id: TraceId,
    /// The W3C `traceparent` the producer's call passes on
    /// ([`Context::traceparent`](samekey_runtime::context::Context::traceparent)), for consumers that
    /// run OpenTelemetry: its trace-id is the traceId, and it wins over `trace_id` where the two
    /// disagree, as over `X-Trace-Id` on HTTP. `None` in a body without it (from before it was added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<TraceParent>,
    /// The message itself.
    pub payload: T,
}

impl<T> Envelope<T> {
    /// A message of the current `#[idempotent]` call: its callId, traceId and `traceparent`, and the
    /// next number of the running attempt ([`Context::next_message_seq`]: 0 for the attempt's first
    /// message, 1 for its second, …, counted anew on each attempt). An attempt that makes its
    /// messages in the same order as the one before makes them with the same identities. Outside a
    /// call, a new callId (prefix `msg`, the default runtime's node) and `seq` 0, with the trace of
    /// the [`InboundCall`] scope it is made in
    /// ([`outbound_traceparent`](samekey_runtime::context::outbound_traceparent)), else a new one.
    pub fn new(payload: T) -> Envelope<T> {
        match samekey_runtime::context::try_current() {
            Some(cx) => {
                let traceparent = cx.traceparent();
                Envelope {
                    call_id: cx.call_id().clone(),
                    seq: Context::next_message_seq().unwrap_or(0),
                    trace_id: traceparent.trace_id(),
                    traceparent: Some(traceparent),
                    payload,
                }
            }
            None => {
                let node = samekey_runtime::runtime::default_runtime()
                    .node()
                    .to_owned();
                let call_id = CallId::new("msg", &node)
                    .or_else(|_| CallId::new("msg", "node"))
                    .expect("`msg` and `node` are valid labels");
                let traceparent = samekey_runtime::context::outbound_traceparent()
                    .unwrap_or_else(|| TraceParent::new(TraceId::new(), 0, 0));
                Envelope {
                    call_id,
                    seq: 0,
                    trace_id: traceparent.trace_id(),
                    traceparent: Some(traceparent),
                    payload,
                }
            }
        }
    }

    /// The message's attributes: `x-call-id`, `x-message-seq`, `x-trace-id` and, when the envelope
    /// has one, `traceparent`, for the broker's headers.
    pub fn attributes(&self) -> Vec<(&'static str, String)> {
        let mut attributes = vec![
            (ATTR_CALL_ID, self.call_id.to_string()),
            (ATTR_MESSAGE_SEQ, self.seq.to_string()),
            (ATTR_TRACE_ID, self.trace_id.to_string()),
        ];
        if let Some(tp) = self.traceparent {
            attributes.push((ATTR_TRACEPARENT, tp.to_string()));
        }
        attributes
    }

    /// A message read from a body without envelope and its attributes (`get` reads one by name): the
    /// callId must be there and valid; a missing `x-message-seq` is 0 (a producer from before it was
    /// added), one that is not a decimal number an error; a missing traceId is a new one. As on HTTP, a
    /// valid `traceparent` gives the traceId (over `x-trace-id`), and a malformed one is ignored
    /// (W3C Trace Context §3.2: the trace restarts), while a malformed `x-trace-id` is an error.
    pub fn from_attributes(
        payload: T,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Envelope<T>, AttributeError> {
        let call_id = get(ATTR_CALL_ID).unwrap_or_default().parse()?;
        let seq = match get(ATTR_MESSAGE_SEQ) {
            Some(text) => text.parse().map_err(|_| AttributeError::Seq(text))?,
            None => 0,
        };
        let trace_id = match get(ATTR_TRACE_ID) {
            Some(text) => Some(text.parse()?),
            None => None,
        };
        let traceparent = get(ATTR_TRACEPARENT).and_then(|text| match text.trim().parse::<TraceParent>() {
            Ok(tp) => Some(tp),
            Err(e) => {
                tracing::debug!(error = %e, "samekey: a malformed `traceparent` attribute is ignored");
                None
            }
        });
        let trace_id = match (traceparent, trace_id) {
            (Some(tp), _) => tp.trace_id(),
            (None, Some(trace_id)) => trace_id,
            (None, None) => TraceId::new(),
        };
        Ok(Envelope {
            call_id,
            seq,
            trace_id,
            traceparent,
            payload,
        })
    }

    /// The message's identity as an inbound context: run a handler in [`InboundCall::scope`] and the
    /// first `#[idempotent]` call it makes keeps the callId of the message's work — the message's
    /// callId with `.<seq>` after its prefix (`ord.0-1710000000000-<mixed random bits>-node07` for the
    /// first message of `ord-1710000000000-9f3c2a7d41b0e855-node07`, `ord.1-…` for the second, the
    /// prefix shortened to fit its 32 characters; its random bits a fixed mix of the producer's and
    /// the `seq`): the same on every redelivery, tied to the producer's call by its prefix, time and
    /// node, and never the producer's own nor, along a chain of consumers, an earlier work's. (Producer and
    /// consumer often share a store: under one callId, a callback or a compensation entry about the
    /// producer's call would land on the consumer's work.) Every call in the scope has the message's
    /// traceId — its `traceparent`'s trace-id when it has one, which wins over `trace_id` — and passes
    /// the `traceparent` on ([`InboundCall::traceparent`]).
    pub fn inbound(&self) -> InboundCall {
        let mut inbound = InboundCall::new().trace_id(self.trace_id);
        if let Some(tp) = self.traceparent {
            inbound = inbound.traceparent(tp);
        }
        match self.work_call_id() {
            Some(call_id) => inbound.call_id(call_id),
            // Not reached for a valid callId; the work's call then makes a callId of its own.
            None => inbound,
        }
    }

    /// The callId of the message's work (see [`Envelope::inbound`]); `None` if it cannot be made.
    fn work_call_id(&self) -> Option<CallId> {
        let suffix = format!(".{}", self.seq);
        let prefix = self.call_id.prefix();
        // ASCII (a valid prefix): any byte is a character boundary.
        let kept = prefix
            .get(..prefix.len().min(MAX_LABEL_LEN.saturating_sub(suffix.len())))
            .unwrap_or(prefix);
        format!(
            "{kept}{suffix}-{}-{:016x}-{}",
            self.call_id.unix_ms(),
            work_entropy(self.call_id.entropy(), self.seq),
            self.call_id.node()
        )
        .parse()
        .ok()
    }
}

/// The random bits of the work of message `seq` of a call whose callId has `entropy`: a fixed mix of
/// the two (splitmix64's finalizer), so that every redelivery gets the same callId, and works of works
/// (a consumer that publishes in turn) never come back to a callId already used — a prefix cut to fit
/// its 32 characters could otherwise repeat along such a chain.
fn work_entropy(entropy: u64, seq: u64) -> u64 {
    let mut z = entropy ^ seq.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The longest callId prefix, in bytes (the runtime's limit).
const MAX_LABEL_LEN: usize = 32;

/// Why a message's attributes do not make an [`Envelope`] ([`Envelope::from_attributes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttributeError {
    /// The callId is missing or invalid, or the traceId invalid.
    Ids(ParseCallIdError),
    /// `x-message-seq` is not a decimal number (its text).
    Seq(String),
}

impl Display for AttributeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttributeError::Ids(e) => e.fmt(f),
            AttributeError::Seq(text) => write!(
                f,
                "invalid {ATTR_MESSAGE_SEQ} `{text}`: a message's number must be a decimal number"
            ),
        }
    }
}

impl std::error::Error for AttributeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AttributeError::Ids(e) => Some(e),
            AttributeError::Seq(_) => None,
        }
    }
}

impl From<ParseCallIdError> for AttributeError {
    fn from(e: ParseCallIdError) -> AttributeError {
        AttributeError::Ids(e)
    }
}

/// A payload's JSON value as a `verify` part: its kinds kept apart, an object's members in the order
/// of their names (so that a map whose order varies, a `HashMap`, fingerprints alike), a number by its
/// JSON text. `None` (no JSON encoding) refuses it: the delivery fails with `Error::InvalidKey`.
struct Payload(Option<serde_json::Value>);

impl KeyPart for Payload {
    fn encode_key(&self, out: &mut KeyEncoder) {
        match &self.0 {
            Some(value) => json(value, out),
            None => out.refuse("the message's payload has no JSON encoding"),
        }
    }
}

fn json(value: &serde_json::Value, out: &mut KeyEncoder) {
    use serde_json::Value;
    match value {
        Value::Null => out.unit(),
        Value::Bool(b) => out.boolean(*b),
        Value::Number(n) => {
            out.variant("number", 1);
            out.str(&n.to_string());
        }
        Value::String(s) => out.str(s),
        Value::Array(items) => {
            out.seq(items.len());
            for item in items {
                json(item, out);
            }
        }
        Value::Object(members) => {
            let mut members: Vec<_> = members.iter().collect();
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.map(members.len());
            for (name, value) in members {
                out.str(name);
                json(value, out);
            }
        }
    }
}

/// A consumer's inbox: runs a message's handler **at most once per message identity** (its callId
/// and [`seq`](Envelope::seq)) — a message redelivered (by the broker, or republished by a producer
/// that retried) gets its first delivery's outcome without running again, and each message of a call
/// that published several is worked — claimed and recorded in the runtime's store like any
/// `#[idempotent]` call, under the callId of the message's work ([`Envelope::inbound`]).
///
/// | delivery | answer |
/// |---|---|
/// | a message's first | its handler runs, under the message's traceId |
/// | the same message again (same callId, `seq`, payload) | the first delivery's outcome; the handler does not run |
/// | another message of the same call (another `seq`) | its own handler run: a message of its own |
/// | the identity of a message already delivered with another payload | `samekey::Error::KeyReuse`; nothing runs |
/// | a payload with no JSON encoding | `samekey::Error::InvalidKey`; nothing runs |
///
/// The key is the inbox's scope, the callId and, from the second message of a call on, its `seq` (a
/// call's first message keeps the key it had before messages were numbered); the payload's JSON
/// value is the call's `verify` fingerprint (object members in name order).
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
    spec: OnceLock<&'static AtMostOnce>,
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

    fn spec(&self) -> &'static AtMostOnce {
        self.spec.get_or_init(|| {
            once::operation(
                "Inbox::deliver",
                "msg",
                self.ttl,
                OnBusy::Wait,
                OnUnknown::Hold,
            )
        })
    }

    /// Runs `handler` on the message's payload, under the callId of its work and its traceId, unless a
    /// delivery of the same message (callId and `seq`) already did: then answers that delivery's
    /// outcome (a failure by its message, as `samekey::Error::Failed`, through
    /// `E: From<samekey::Error>`). A delivery of that identity with another payload is
    /// `samekey::Error::KeyReuse`, and nothing runs.
    pub async fn deliver<T, R, E, F, Fut>(&self, message: Envelope<T>, handler: F) -> Result<R, E>
    where
        T: Serialize,
        F: FnOnce(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + Display,
    {
        let inbound = message.inbound();
        let Envelope {
            call_id,
            seq,
            payload,
            ..
        } = message;
        let mut key = KeyBuilder::new(&self.scope);
        key.part(call_id.as_str());
        if seq != 0 {
            key.part(&seq);
        }
        let mut verify = KeyBuilder::new(&self.scope);
        verify.verify_part(&Payload(serde_json::to_value(&payload).ok()), "payload");
        let spec = self.spec();
        let runtime = self.runtime.as_ref();
        inbound
            .scope(once::run(runtime, spec, key, verify, || handler(payload)))
            .await
    }
}
