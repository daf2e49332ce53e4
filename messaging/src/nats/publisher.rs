//! The JetStream publisher: a publish ends with the stream's ack, under the message's own
//! `Nats-Msg-Id`.

use std::error::Error as _;

use async_nats::connection::State;
use async_nats::jetstream::context::{PublishError as JsPublishError, PublishErrorKind};
use async_nats::jetstream::{self, Context};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use serde::Serialize;

use crate::envelope::Envelope;
use crate::message::{Confirms, Message, Publish, PublishError};
use crate::nats::{NatsError, HEADER_MSG_ID};

/// A publisher to NATS JetStream with acks: [`Publish::publish`] sends a [`Message`] to its
/// subject ([`Message::destination`]) with its headers and `Nats-Msg-Id` = [`Message::id`], and
/// returns once the stream acked it.
///
/// # Guarantees
///
/// * `Ok` only after a JetStream ack: a stream holds the message. An ack that says `duplicate` is
///   `Ok` too — the stream already had a message with that id within its duplicate window and
///   dropped this copy (traced at debug level).
/// * Every publish of one message carries the same `Nats-Msg-Id`, so a republished copy is dropped
///   by the stream's duplicate window, and after the window by the consumer's
///   [`Inbox`](crate::Inbox).
/// * The errors say whether the stream may have the message:
///   [`PublishError::Unconfirmed`] (sent, no ack in time, or the connection lost after the send:
///   publish again under the same id), [`PublishError::Refused`] (a JetStream error: no stream
///   for the subject, a header NATS cannot carry, a message over the server's limit),
///   [`PublishError::Unavailable`] (not connected: nothing was sent).
#[derive(Debug, Clone)]
pub struct JetStreamPublisher {
    context: Context,
    confirms: Confirms,
}

/// A JetStream publish ack ([`JetStreamPublisher::publish_acked`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    /// The stream that holds the message.
    pub stream: String,
    /// The message's sequence in that stream (the earlier copy's for a duplicate).
    pub sequence: u64,
    /// The stream already had a message with this `Nats-Msg-Id` within its duplicate window, and
    /// dropped this copy.
    pub duplicate: bool,
}

impl JetStreamPublisher {
    /// A publisher over a JetStream context, with [`Confirms::default`] for
    /// [`publish_envelope`](JetStreamPublisher::publish_envelope) and
    /// [`publish_confirmed`](JetStreamPublisher::publish_confirmed).
    pub fn new(context: Context) -> JetStreamPublisher {
        JetStreamPublisher {
            context,
            confirms: Confirms::default(),
        }
    }

    /// Connects to the NATS server at `url` (async-nats reconnects on its own after that).
    pub async fn connect(url: &str) -> Result<JetStreamPublisher, NatsError> {
        let client = async_nats::connect(url).await?;
        Ok(JetStreamPublisher::new(jetstream::new(client)))
    }

    /// How long to wait for an ack, and how often to republish (under the same id) when none came.
    pub fn confirms(mut self, confirms: Confirms) -> JetStreamPublisher {
        self.confirms = confirms;
        self
    }

    /// The JetStream context it publishes through.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Publishes `envelope` to `subject` ([`Envelope::to_message`]: its JSON body, its ids in the
    /// headers and as `Nats-Msg-Id`) and waits for the stream's ack, publishing again **under the
    /// same id** when none came ([`Confirms::publish`]). An envelope whose payload has no JSON
    /// encoding is [`PublishError::Refused`], and nothing is sent.
    pub async fn publish_envelope<T: Serialize>(
        &self,
        subject: &str,
        envelope: &Envelope<T>,
    ) -> Result<(), PublishError> {
        let message = envelope
            .to_message(subject)
            .map_err(|e| PublishError::Refused {
                id: envelope.message_id(),
                reason: format!("the envelope has no JSON encoding: {e}"),
            })?;
        self.publish_confirmed(&message).await
    }

    /// Publishes `message` and waits for the stream's ack, publishing again under the same id when
    /// none came, as [`Confirms::publish`] says (a relay's publish of a staged message).
    pub async fn publish_confirmed(&self, message: &Message) -> Result<(), PublishError> {
        self.confirms
            .publish(message, || self.publish(message))
            .await
    }

    /// One publish of `message` and its ack (no republish), answered with the ack: whether the
    /// stream took it now or already had it ([`Acked::duplicate`]).
    pub async fn publish_acked(&self, message: &Message) -> Result<Acked, PublishError> {
        let headers = headers_of(message)?;
        let state = self.context.client().connection_state();
        if state != State::Connected {
            return Err(PublishError::Unavailable(format!(
                "not connected to NATS ({state})"
            )));
        }
        let ack = self
            .context
            .publish_with_headers(
                message.destination.clone(),
                headers,
                Bytes::from(message.body.clone()),
            )
            .await
            .map_err(|e| not_sent(&message.id, e))?;
        let ack = ack.await.map_err(|e| not_acked(&message.id, e))?;
        if ack.duplicate {
            tracing::debug!(target: "samekey", id = %message.id, stream = %ack.stream,
                sequence = ack.sequence,
                "samekey: JetStream already had this message (duplicate window): the copy is dropped");
        }
        Ok(Acked {
            stream: ack.stream,
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }
}

impl Publish for JetStreamPublisher {
    /// One publish and its JetStream ack: see [`JetStreamPublisher`].
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        self.publish_acked(message).await.map(|_| ())
    }
}

/// `message`'s headers for NATS, `Nats-Msg-Id` = its id over any the headers had; a name or value
/// NATS cannot carry is a refusal.
fn headers_of(message: &Message) -> Result<HeaderMap, PublishError> {
    let refused = |reason: String| PublishError::Refused {
        id: message.id.clone(),
        reason,
    };
    let mut headers = HeaderMap::new();
    for (name, value) in &message.headers {
        if name.eq_ignore_ascii_case(HEADER_MSG_ID) {
            continue;
        }
        let header: HeaderName = name
            .parse()
            .map_err(|_| refused(format!("`{name}` is not a NATS header name")))?;
        let text: HeaderValue = value
            .parse()
            .map_err(|_| refused(format!("the value of header `{name}` has a line break")))?;
        headers.append(header, text);
    }
    let id: HeaderValue = message
        .id
        .parse()
        .map_err(|_| refused("the message id has a line break".to_owned()))?;
    headers.insert(HeaderName::from_static(HEADER_MSG_ID), id);
    Ok(headers)
}

/// A publish that failed before it was sent.
fn not_sent(id: &str, error: JsPublishError) -> PublishError {
    match error.kind() {
        PublishErrorKind::MaxPayloadExceeded => PublishError::Refused {
            id: id.to_owned(),
            reason: error.to_string(),
        },
        // An invalid subject is the client's refusal; anything else left the message unsent.
        PublishErrorKind::Other
            if error
                .source()
                .is_some_and(|s| s.is::<async_nats::SubjectError>()) =>
        {
            PublishError::Refused {
                id: id.to_owned(),
                reason: format!("invalid subject: {error}"),
            }
        }
        _ => PublishError::Unavailable(format!("message {id} was not sent: {error}")),
    }
}

/// A publish that was sent and got no ack, or an answer that is not one.
fn not_acked(id: &str, error: JsPublishError) -> PublishError {
    let refused = || PublishError::Refused {
        id: id.to_owned(),
        reason: error.to_string(),
    };
    match error.kind() {
        PublishErrorKind::StreamNotFound
        | PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::WrongLastSequence
        | PublishErrorKind::MaxPayloadExceeded => refused(),
        // A JetStream error answered: the stream did not take it.
        PublishErrorKind::Other
            if error
                .source()
                .is_some_and(|s| s.is::<async_nats::jetstream::Error>()) =>
        {
            refused()
        }
        // No ack in time, the connection lost after the send, an answer that does not read.
        _ => PublishError::Unconfirmed {
            id: id.to_owned(),
            reason: error.to_string(),
        },
    }
}
