//! The envelope: the callId and traceId of a logical call in a message's attributes and in its body
//! (`docs/rules.md`, *Field lessons*: a broker that redelivers a re-serialized body loses what only the body had).
//!
//! A message's identity is its call's callId and its number among the messages that call's attempt
//! made (`seq`, from 0): the n-th message of every attempt of a call has the same identity, so a
//! publish retried after a lost acknowledgement repeats its messages' identities, while two messages
//! of one call (two line items, two events) have identities of their own.

use std::fmt::{self, Display};

use samekey_runtime::{
    call_id::ParseCallIdError, context::Context, context::InboundCall, CallId, TraceId, TraceParent,
};
use serde::{Deserialize, Serialize};

use crate::message::Message;

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
/// [`seq`](Envelope::seq) — and the consumer's [`Inbox`](crate::Inbox) does each message's work once.
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

    /// The message's identity as one string, `<callId>/<seq>`: the broker's own message id (AMQP
    /// `message_id`, NATS `Nats-Msg-Id`), so that a broker's duplicate window and a consumer that
    /// reads no envelope still tell a copy from a new message.
    pub fn message_id(&self) -> String {
        format!("{}/{}", self.call_id, self.seq)
    }

    /// The message for a broker, to `destination` (a routing key, a subject): the envelope as its JSON
    /// body, its identity as the broker's message id ([`Envelope::message_id`]), and its
    /// [`attributes`](Envelope::attributes) as headers — the ids in both places.
    pub fn to_message(&self, destination: impl Into<String>) -> Result<Message, serde_json::Error>
    where
        T: Serialize,
    {
        Ok(Message {
            id: self.message_id(),
            destination: destination.into(),
            headers: self
                .attributes()
                .into_iter()
                .map(|(name, value)| (name.to_owned(), value))
                .collect(),
            body: serde_json::to_vec(self)?,
        })
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
    pub(crate) fn work_call_id(&self) -> Option<CallId> {
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
