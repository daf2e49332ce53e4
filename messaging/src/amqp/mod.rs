//! RabbitMQ (AMQP 0-9-1, through [`lapin`]): a publisher whose publishes end with the broker's
//! confirmation, and a consumer that runs an [`Inbox`](crate::Inbox) over a queue with manual
//! acknowledgement.
//!
//! # Guarantees
//!
//! * **A publish ends with a confirm, or is published again under the same id.**
//!   [`AmqpPublisher`] publishes on a channel in confirm mode, persistent (`delivery_mode` 2) and
//!   `mandatory`, the message's identity in `message_id` and its ids in the headers. A broker's `ack`
//!   is `Ok`; a `nack` or a message returned as unroutable is [`PublishError::Refused`]; a confirm
//!   that never comes (a timeout, the connection lost after the send) is
//!   [`PublishError::Unconfirmed`], and [`AmqpPublisher::publish_envelope`] publishes it again under
//!   the **same** `message_id` ([`Confirms`](crate::Confirms)), never a new one. A connection lost
//!   (the broker restarted) is opened again on the next publish.
//! * **A message is acknowledged only after its receipt is recorded.** [`AmqpConsumer`] hands each
//!   delivery to [`Inbox::handle`](crate::Inbox::handle) and carries out the
//!   [`Disposition`](crate::Disposition) it answers only after it returned: `basic.ack`,
//!   `basic.nack` with requeue, or a dead letter. A consumer that dies before its ack leaves the
//!   message unacknowledged; RabbitMQ delivers it again and the inbox answers it from the receipt —
//!   its handler does not run twice.
//! * **A dead letter is confirmed before its original is acknowledged.** A message that failed for
//!   good, ran out of deliveries ([`Inbox::max_deliveries`](crate::Inbox::max_deliveries)) or cannot
//!   be read is published to the dead-letter queue ([`AmqpConsumer::dead_letters`]) with its body,
//!   its headers, its `message_id` and the reason in
//!   [`x-samekey-dead-letter-reason`](crate::HEADER_DEAD_LETTER_REASON), and the original is acked
//!   only once the broker confirmed the dead letter (else it is requeued).
//! * **The inbox is the horizon.** RabbitMQ keeps no duplicate window at all: a copy published again
//!   (a lost confirm, a relay that crashed between publish and mark) is a second message in the
//!   queue. It is the inbox, for its [`ttl`](crate::Inbox::ttl), that tells it from a new one — by
//!   the envelope's identity, or for a producer without samekey by its `message_id`.
//!
//! lapin is built without TLS: for `amqps://` URLs, enable one of its TLS features (`rustls`,
//! `native-tls`, `openssl`) in your own `Cargo.toml` — features add up.
//!
//! A classic queue keeps no count of a message's deliveries (only its `redelivered` flag): the inbox
//! counts them from its journal. A quorum queue ([`QueueType::Quorum`]) counts them in
//! `x-delivery-count`, which the consumer passes on as [`Delivery::delivery`](crate::Delivery).
//!
//! **A quorum queue's delivery limit.** RabbitMQ 4 gives every quorum queue a delivery limit of 20
//! by default (3.x: none), and it counts *every* requeue — also the busy ones the inbox answers while
//! a dead consumer's claim waits for its lease to end — so a message never worked can be dropped, or
//! sent to the queue's own dead-letter exchange, behind the inbox's back. The inbox is meant to decide
//! (its [`max_deliveries`](crate::Inbox::max_deliveries), counted without the busy deliveries):
//! lift the broker's limit with a policy, `rabbitmqctl set_policy samekey-unlimited "^orders\."
//! '{"delivery-limit": -1}' --apply-to quorum_queues` on RabbitMQ 4, or keep it well above
//! `max_deliveries` plus the runtime's lease over the inbox's one-second busy pause.
//!
//! # A producer
//!
//! ```no_run
//! use samekey_messaging::amqp::{declare_queue, AmqpPublisher, QueueType};
//! use samekey_messaging::Envelope;
//!
//! # async fn producer() -> Result<(), samekey_messaging::amqp::AmqpError> {
//! let publisher = AmqpPublisher::new("amqp://guest:guest@127.0.0.1:5672/%2f");
//! declare_queue(&publisher.channel().await?, "orders.charged", QueueType::Quorum).await?;
//! // Inside an #[idempotent] call, every attempt publishes the same ids.
//! let charged = Envelope::new(("order-7".to_owned(), 4200u64));
//! // Confirmed, or published again under the same message id.
//! let id = publisher.publish_envelope("orders.charged", &charged).await?;
//! println!("published {id}");
//! # Ok(()) }
//! ```
//!
//! # A consumer
//!
//! ```no_run
//! use samekey_messaging::amqp::{AmqpConsumer, QueueType};
//! use samekey_messaging::Inbox;
//!
//! # #[derive(Debug, thiserror::Error)] #[error("x")] struct ShipError(#[from] samekey::Error);
//! # impl samekey::Classify for ShipError { fn classify(&self) -> samekey::ErrorClass { self.0.classify() } }
//! # async fn consumer() -> Result<(), samekey_messaging::amqp::AmqpError> {
//! let inbox = Inbox::new("shipping.on_charged").max_deliveries(5);
//! let consumer = AmqpConsumer::new("amqp://guest:guest@127.0.0.1:5672/%2f", "orders.charged")
//!     .declare(QueueType::Quorum) // the queue and its dead letters, durable
//!     .dead_letters("orders.charged.dead")
//!     .prefetch(16);
//! let ship = |(order, amount): (String, u64)| async move {
//!     Ok::<_, ShipError>(format!("shipped {order} ({amount})"))
//! };
//! let (_stop, stopped) = tokio::sync::oneshot::channel::<()>(); // or ctrl-c, a cancellation token
//! // Until stopped (the delivery being worked is finished first); reconnects after a broker restart.
//! consumer.run(&inbox, ship, async { let _ = stopped.await; }).await
//! # }
//! ```

mod consumer;
mod publisher;

use std::future::Future;
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties};
use samekey_runtime::{Classify, ErrorClass};

pub use consumer::{AmqpConsumer, Settled, Settlement};
pub use publisher::AmqpPublisher;

/// The `lapin` this module is built on, for a [`Connection`] to give to [`Endpoint`].
pub use lapin;

use crate::PublishError;

/// Where a publisher or a consumer gets its connection: a URL (`amqp://user:pass@host:port/vhost`),
/// which it connects to and connects to again when the connection is lost, or a [`Connection`]
/// opened by the caller, on which it opens its channels — and which it cannot open again: once that
/// connection is closed, a publish is [`PublishError::Unavailable`] and a consumer's `run` ends with
/// [`AmqpError::Closed`].
pub enum Endpoint {
    /// A URL to connect to.
    Url(String),
    /// A connection the caller opened.
    Connection(Connection),
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // The URL may hold a password.
            Endpoint::Url(_) => f.write_str("Endpoint::Url(..)"),
            Endpoint::Connection(c) => f.debug_tuple("Endpoint::Connection").field(c).finish(),
        }
    }
}

impl From<&str> for Endpoint {
    fn from(url: &str) -> Endpoint {
        Endpoint::Url(url.to_owned())
    }
}

impl From<String> for Endpoint {
    fn from(url: String) -> Endpoint {
        Endpoint::Url(url)
    }
}

impl From<&String> for Endpoint {
    fn from(url: &String) -> Endpoint {
        Endpoint::Url(url.clone())
    }
}

impl From<Connection> for Endpoint {
    fn from(connection: Connection) -> Endpoint {
        Endpoint::Connection(connection)
    }
}

impl Endpoint {
    /// A new channel: on the connection held in `owned` while it is open, else on a new one
    /// (a URL), else on the caller's connection while it is open.
    async fn channel(
        &self,
        owned: &mut Option<Connection>,
        timeout: Duration,
    ) -> Result<Channel, AmqpError> {
        let connection = match self {
            Endpoint::Connection(connection) => {
                if !connection.status().connected() {
                    return Err(AmqpError::Closed);
                }
                connection
            }
            Endpoint::Url(url) => {
                if !owned.as_ref().is_some_and(|c| c.status().connected()) {
                    let connection = tokio::time::timeout(
                        timeout,
                        Connection::connect(url, ConnectionProperties::default()),
                    )
                    .await
                    .map_err(|_| AmqpError::Connect {
                        reason: format!("no connection within {timeout:?}"),
                        source: None,
                    })?
                    .map_err(|e| AmqpError::Connect {
                        reason: e.to_string(),
                        source: Some(e),
                    })?;
                    *owned = Some(connection);
                }
                match owned.as_ref() {
                    Some(connection) => connection,
                    None => return Err(AmqpError::Closed),
                }
            }
        };
        tokio::time::timeout(timeout, connection.create_channel())
            .await
            .map_err(|_| AmqpError::Connect {
                reason: format!("no channel within {timeout:?}"),
                source: None,
            })?
            .map_err(|e| AmqpError::Connect {
                reason: format!("no channel: {e}"),
                source: Some(e),
            })
    }
}

/// The kind of a queue [`declare_queue`] declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueType {
    /// A classic queue: it keeps no count of a message's deliveries, only the `redelivered` flag;
    /// the inbox counts them from its journal.
    #[default]
    Classic,
    /// A quorum queue (`x-queue-type: quorum`), replicated, which counts a message's deliveries in
    /// its `x-delivery-count` header.
    Quorum,
}

/// Declares a **durable** queue `name` of `kind` (a no-op when it exists with these settings; an
/// [`AmqpError::Broker`] when it exists with others, such as another type; an
/// [`AmqpError::Connect`] when the connection was lost meanwhile).
pub async fn declare_queue(
    channel: &Channel,
    name: &str,
    kind: QueueType,
) -> Result<(), AmqpError> {
    let mut arguments = FieldTable::default();
    if kind == QueueType::Quorum {
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
    }
    channel
        .queue_declare(
            short(name, "a queue name")?,
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await
        .map(|_| ())
        .map_err(|e| broker_error(format!("declare queue `{name}`"), e))
}

/// lapin's error about `what`: [`AmqpError::Broker`] when the broker refused it (a channel-level
/// AMQP error: not found, precondition failed, access refused), else [`AmqpError::Connect`] (the
/// connection was lost: try again).
fn broker_error(what: String, e: lapin::Error) -> AmqpError {
    if e.is_amqp_soft_error() {
        AmqpError::Broker { what, source: e }
    } else {
        AmqpError::Connect {
            reason: format!("{what}: {e}"),
            source: Some(e),
        }
    }
}

/// Waits for `operation` on `channel` — an acknowledgement, a publish's confirm — for at most
/// `timeout`, and no longer than the channel lives: lapin may never answer an operation queued as
/// its connection died.
pub(crate) async fn bounded<T>(
    channel: &Channel,
    timeout: Duration,
    operation: impl Future<Output = lapin::Result<T>>,
) -> Result<T, String> {
    let mut operation = std::pin::pin!(operation);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        tokio::select! {
            biased;
            done = operation.as_mut() => return done.map_err(|e| e.to_string()),
            () = tokio::time::sleep(CHANNEL_CHECK) => {
                if !channel.status().connected() {
                    return Err("the channel was closed".to_owned());
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!("no answer within {timeout:?}"));
                }
            }
        }
    }
}

/// How often a wait for the broker checks that its channel still lives.
const CHANNEL_CHECK: Duration = Duration::from_millis(50);

/// `text` as an AMQP short string (at most 255 bytes): a routing key, a queue name, a message id.
fn short(text: &str, what: &str) -> Result<ShortString, AmqpError> {
    ShortString::try_new(text).map_err(|e| AmqpError::Name(format!("{what} `{text}`: {e}")))
}

/// An AMQP header's value as text, where it is text (a string, an integer, a boolean).
fn header_text(value: &AMQPValue) -> Option<String> {
    Some(match value {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok()?,
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        _ => return None,
    })
}

/// Why a RabbitMQ publisher or consumer could not do what it was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AmqpError {
    /// No connection or no channel could be opened (the broker is down, the URL is wrong): a
    /// consumer tries again with a backoff; a caller may too.
    #[error("cannot connect to RabbitMQ: {reason}")]
    Connect {
        /// Why.
        reason: String,
        /// lapin's error, where it gave one.
        #[source]
        source: Option<lapin::Error>,
    },
    /// The connection given as [`Endpoint::Connection`] is closed, and cannot be opened again.
    #[error("the RabbitMQ connection given to the publisher or consumer is closed")]
    Closed,
    /// The broker refused an operation (a queue declared with other settings, a queue that does not
    /// exist, no access): retrying does not help until someone changes the broker or the settings.
    #[error("RabbitMQ refused to {what}: {source}")]
    Broker {
        /// What was asked.
        what: String,
        /// lapin's error.
        #[source]
        source: lapin::Error,
    },
    /// A name that AMQP cannot carry (a routing key, a queue name, a message id over 255 bytes).
    #[error("invalid AMQP name: {0}")]
    Name(String),
    /// The envelope cannot be serialized as JSON.
    #[error("the message's body cannot be serialized: {0}")]
    Body(#[source] serde_json::Error),
    /// A publish that did not end with the broker's confirmation.
    #[error(transparent)]
    Publish(#[from] PublishError),
}

impl Classify for AmqpError {
    /// `Connect` and `Closed` are [`ErrorClass::Retryable`] (nothing was sent); `Publish` is its
    /// [`PublishError`]'s class (`Unconfirmed` is [`ErrorClass::Unknown`]); `Broker`, `Name` and
    /// `Body` are [`ErrorClass::Permanent`].
    fn classify(&self) -> ErrorClass {
        match self {
            AmqpError::Connect { .. } | AmqpError::Closed => ErrorClass::Retryable,
            AmqpError::Publish(e) => e.classify(),
            AmqpError::Broker { .. } | AmqpError::Name(_) | AmqpError::Body(_) => {
                ErrorClass::Permanent
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_headers_read_strings_and_numbers() {
        assert_eq!(
            header_text(&AMQPValue::LongString("a".into())).as_deref(),
            Some("a")
        );
        assert_eq!(
            header_text(&AMQPValue::LongLongInt(3)).as_deref(),
            Some("3")
        );
        assert_eq!(header_text(&AMQPValue::Void), None);
        assert!(short(&"x".repeat(256), "a routing key").is_err());
    }
}
