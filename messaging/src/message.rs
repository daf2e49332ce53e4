//! A message on its way to a broker, and what a publisher promises about it.

use std::future::Future;
use std::time::Duration;

use samekey_runtime::{Classify, ErrorClass};

/// A message for a broker: its identity, where it goes, its headers and its body. Made from an
/// [`Envelope`](crate::Envelope) by [`Envelope::to_message`](crate::Envelope::to_message), kept in
/// an outbox until a relay publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The message's identity, the broker's message id (AMQP `message_id`, NATS `Nats-Msg-Id`):
    /// every publish of this message carries the same one.
    pub id: String,
    /// Where it goes: the routing key (AMQP) or the subject (NATS).
    pub destination: String,
    /// Its headers (the envelope's attributes: `x-call-id`, `x-message-seq`, `x-trace-id`,
    /// `traceparent`).
    pub headers: Vec<(String, String)>,
    /// Its body (the envelope's JSON).
    pub body: Vec<u8>,
}

impl Message {
    /// The value of header `name` (ASCII case-insensitive), if the message has it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Why a publish did not end with the broker's confirmation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The message was sent but its confirmation never came (a timeout, the connection lost after
    /// sending): the broker may have it. Publish it again **under the same id** — the broker's
    /// duplicate window or the consumer's inbox drops the copy — never with a new one.
    #[error("no confirmation from the broker for message {id}: it may have been taken ({reason})")]
    Unconfirmed {
        /// The message's id.
        id: String,
        /// What happened instead.
        reason: String,
    },
    /// The broker answered that it did not take the message (an AMQP `basic.nack`, a JetStream
    /// error, no queue or stream for its destination).
    #[error("the broker refused message {id}: {reason}")]
    Refused {
        /// The message's id.
        id: String,
        /// The broker's reason.
        reason: String,
    },
    /// The message was not sent: no connection, or no channel.
    #[error("the broker is unreachable: {0}")]
    Unavailable(String),
}

impl Classify for PublishError {
    /// `Unconfirmed` is [`ErrorClass::Unknown`] (the broker may have the message); `Refused` and
    /// `Unavailable` are [`ErrorClass::Retryable`] (it has not).
    fn classify(&self) -> ErrorClass {
        match self {
            PublishError::Unconfirmed { .. } => ErrorClass::Unknown,
            PublishError::Refused { .. } | PublishError::Unavailable(_) => ErrorClass::Retryable,
        }
    }
}

/// A publisher with confirmations: [`publish`](Publish::publish) returns once the broker confirmed
/// it has the message (an AMQP publisher confirm, a JetStream ack), and only then.
///
/// Implemented by the RabbitMQ and NATS publishers of this crate; the outbox's relay publishes
/// through any implementation.
pub trait Publish: Send + Sync {
    /// Publishes `message` and waits for the broker's confirmation.
    fn publish(&self, message: &Message) -> impl Future<Output = Result<(), PublishError>> + Send;
}

impl<P: Publish + ?Sized> Publish for &P {
    fn publish(&self, message: &Message) -> impl Future<Output = Result<(), PublishError>> + Send {
        (**self).publish(message)
    }
}

impl<P: Publish + ?Sized> Publish for std::sync::Arc<P> {
    fn publish(&self, message: &Message) -> impl Future<Output = Result<(), PublishError>> + Send {
        (**self).publish(message)
    }
}

/// How often a publish whose confirmation did not come is sent again, under the same id, before
/// [`PublishError::Unconfirmed`] goes to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Confirms {
    /// How long to wait for one confirmation (default 5 s).
    pub timeout: Duration,
    /// Publishes after the first, each under the same id (default 2).
    pub republishes: u32,
    /// The pause before the first republish, doubled for each next (default 100 ms).
    pub backoff: Duration,
}

impl Default for Confirms {
    fn default() -> Confirms {
        Confirms {
            timeout: Duration::from_secs(5),
            republishes: 2,
            backoff: Duration::from_millis(100),
        }
    }
}

impl Confirms {
    /// Publishes `message` through `publish` (one send and its confirmation), again under the same id
    /// when the confirmation did not come or the broker was unreachable, up to
    /// [`republishes`](Confirms::republishes) times; a refusal ends it at once. The caller gets
    /// `Unconfirmed` if any send may have reached the broker — also when a later one was refused or
    /// found the broker unreachable — and never an error that says "not taken" after one that may
    /// have been.
    pub async fn publish<F, Fut>(
        &self,
        message: &Message,
        mut publish: F,
    ) -> Result<(), PublishError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), PublishError>>,
    {
        let mut delay = self.backoff;
        let mut uncertain: Option<PublishError> = None;
        for attempt in 0..=self.republishes {
            if attempt > 0 {
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2);
            }
            let error = match tokio::time::timeout(self.timeout, publish()).await {
                Ok(Ok(())) => return Ok(()),
                // Refused now, but an earlier send may have reached the broker: still unknown.
                Ok(Err(e @ PublishError::Refused { .. })) => {
                    return Err(match uncertain {
                        Some(u @ PublishError::Unconfirmed { .. }) => u,
                        _ => e,
                    })
                }
                Ok(Err(e)) => e,
                Err(_) => PublishError::Unconfirmed {
                    id: message.id.clone(),
                    reason: format!("no confirmation within {:?}", self.timeout),
                },
            };
            tracing::debug!(target: "samekey", id = %message.id, attempt, error = %error,
                "samekey: publish not confirmed; publishing again under the same id");
            if matches!(error, PublishError::Unconfirmed { .. }) || uncertain.is_none() {
                uncertain = Some(error);
            }
        }
        Err(uncertain.unwrap_or_else(|| PublishError::Unavailable("no publish was made".into())))
    }
}
