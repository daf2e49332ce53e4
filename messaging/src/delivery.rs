//! A message as a broker delivered it, and what the consumer tells the broker about it.

use samekey_runtime::CallId;
use serde::de::DeserializeOwned;

use crate::envelope::{Envelope, ATTR_CALL_ID};

/// A message as a broker delivered it to a consumer: what [`Inbox::handle`](crate::Inbox::handle)
/// reads. The RabbitMQ and NATS consumers of this crate make it from their deliveries; make one
/// yourself for another broker.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    /// The body.
    pub body: &'a [u8],
    /// The headers whose values are text (AMQP headers, NATS headers).
    pub headers: &'a [(String, String)],
    /// The broker's message id (AMQP `message_id`, NATS `Nats-Msg-Id`), if the message has one.
    pub message_id: Option<&'a str>,
    /// The broker's count of this message's deliveries, 1 for the first, where it keeps one (a
    /// RabbitMQ quorum queue's `x-delivery-count` + 1, JetStream's `num_delivered`); `None` where
    /// it keeps none (a RabbitMQ classic queue). Journaled; the inbox counts the deliveries that
    /// go toward its `max_deliveries` from its journal, whatever the broker.
    pub delivery: Option<u64>,
    /// The broker's `redelivered` flag: it may have delivered the message before.
    pub redelivered: bool,
}

impl<'a> Delivery<'a> {
    /// A first delivery of `body` with `headers` and no message id.
    pub fn new(body: &'a [u8], headers: &'a [(String, String)]) -> Delivery<'a> {
        Delivery {
            body,
            headers,
            message_id: None,
            delivery: None,
            redelivered: false,
        }
    }

    /// The value of header `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&'a str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The message: an envelope in the body; else a payload whose ids are in the headers; else a
    /// payload known by its broker message id. `Err` says why none of these reads.
    pub(crate) fn read<T: DeserializeOwned>(&self) -> Result<Read<T>, String> {
        if let Ok(envelope) = serde_json::from_slice::<Envelope<T>>(self.body) {
            return Ok(Read::Envelope(envelope));
        }
        let payload: T = serde_json::from_slice(self.body).map_err(|e| {
            format!("the body is neither a samekey envelope nor the handler's payload: {e}")
        })?;
        // Ids in the headers; a header of that name that is not samekey's (another system's
        // `X-Call-Id`, a UUID) leaves the message to its broker message id, when it has one.
        let ids = self.header(ATTR_CALL_ID).map(|_| {
            Envelope::<()>::from_attributes((), |name| self.header(name).map(str::to_owned))
        });
        let foreign = self.message_id.filter(|id| !id.is_empty());
        match (ids, foreign) {
            (Some(Ok(ids)), _) => Ok(Read::Envelope(Envelope {
                call_id: ids.call_id,
                seq: ids.seq,
                trace_id: ids.trace_id,
                traceparent: ids.traceparent,
                payload,
            })),
            (_, Some(id)) => Ok(Read::Foreign {
                id: id.to_owned(),
                payload,
            }),
            (Some(Err(e)), None) => Err(format!("the message's ids are invalid: {e}")),
            (None, None) => Err(format!(
                "the message has no identity: no samekey envelope, no `{ATTR_CALL_ID}` header and no message id"
            )),
        }
    }
}

/// A delivery's message, read.
pub(crate) enum Read<T> {
    /// With samekey's ids.
    Envelope(Envelope<T>),
    /// From a producer without samekey: known by its broker message id.
    Foreign { id: String, payload: T },
}

/// What identifies a message to the inbox.
pub(crate) enum Identity {
    /// A samekey message: its call's callId and its number.
    Envelope { call_id: CallId, seq: u64 },
    /// A message without envelope: its broker message id.
    Foreign(String),
}

/// What a consumer tells the broker about a delivery ([`Handled::disposition`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Acknowledge: the message's outcome is recorded (or owned by compensation).
    Ack,
    /// Give it back for a redelivery after `delay` (AMQP `basic.nack` with requeue once the delay
    /// passed, JetStream `nak` with the delay): nothing of it was recorded. Counts toward
    /// [`Inbox::max_deliveries`](crate::Inbox::max_deliveries).
    Requeue {
        /// Why.
        reason: String,
        /// How long to wait before the redelivery: the inbox's backoff, doubling with each
        /// delivery.
        delay: std::time::Duration,
    },
    /// Another delivery of the message is being worked right now (its claim is alive): give this
    /// one back after `delay` without counting it; if that worker died, its lease runs out and a
    /// later delivery takes the message over.
    Busy {
        /// How long to wait before the redelivery.
        delay: std::time::Duration,
    },
    /// samekey could not begin the message's work — the runtime's [concurrency
    /// limit](samekey_runtime::limits#concurrency-limits) was full, or its store could not be reached
    /// or was full before the message was claimed — so nothing ran and nothing was recorded: give it
    /// back after `delay` without counting it toward
    /// [`Inbox::max_deliveries`](crate::Inbox::max_deliveries), which counts the deliveries that
    /// reached the handler. A message is never dead-lettered for the consumer's own overload.
    Deferred {
        /// Why.
        reason: String,
        /// How long to wait before the redelivery.
        delay: std::time::Duration,
    },
    /// Move it to the dead letters (a dead-letter queue or subject) and acknowledge it: it failed
    /// for good, or ran out of deliveries, or cannot be read.
    DeadLetter {
        /// Why: carried to the dead letter in its `x-samekey-dead-letter-reason` header.
        reason: String,
    },
}

impl Disposition {
    /// `ack`, `requeue`, `busy`, `deferred` or `dead-letter`: as the journal names it.
    pub fn name(&self) -> &'static str {
        match self {
            Disposition::Ack => "ack",
            Disposition::Requeue { .. } => "requeue",
            Disposition::Busy { .. } => "busy",
            Disposition::Deferred { .. } => "deferred",
            Disposition::DeadLetter { .. } => "dead-letter",
        }
    }

    /// Why, for anything but an ack.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Disposition::Ack => None,
            Disposition::Busy { .. } => Some("another delivery of the message is being worked"),
            Disposition::Requeue { reason, .. }
            | Disposition::Deferred { reason, .. }
            | Disposition::DeadLetter { reason } => Some(reason),
        }
    }

    /// How long to wait before giving the message back: for `Requeue`, `Busy` and `Deferred`.
    pub fn delay(&self) -> Option<std::time::Duration> {
        match self {
            Disposition::Requeue { delay, .. }
            | Disposition::Busy { delay }
            | Disposition::Deferred { delay, .. } => Some(*delay),
            Disposition::Ack | Disposition::DeadLetter { .. } => None,
        }
    }
}

/// The header that carries a dead letter's reason.
pub const HEADER_DEAD_LETTER_REASON: &str = "x-samekey-dead-letter-reason";

/// What [`Inbox::handle`](crate::Inbox::handle) made of a delivery.
#[derive(Debug)]
pub enum Handled<R, E> {
    /// Worked now, or answered from the receipt of an earlier delivery: acknowledge.
    Done(R),
    /// The handler failed, or the inbox refused the delivery (a reused identity); the disposition
    /// says what to tell the broker.
    Failed {
        /// The error.
        error: E,
        /// What to tell the broker.
        disposition: Disposition,
    },
    /// The message cannot be read (not the handler's payload, no identity): dead-letter it; nothing
    /// ran.
    Unreadable {
        /// Why.
        reason: String,
    },
}

impl<R, E> Handled<R, E> {
    /// What to tell the broker.
    pub fn disposition(&self) -> Disposition {
        match self {
            Handled::Done(_) => Disposition::Ack,
            Handled::Failed { disposition, .. } => disposition.clone(),
            Handled::Unreadable { reason } => Disposition::DeadLetter {
                reason: reason.clone(),
            },
        }
    }
}
