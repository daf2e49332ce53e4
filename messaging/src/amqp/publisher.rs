//! The publisher: a channel in confirm mode; a publish ends with the broker's confirm.

use std::future::Future;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ErrorKind};
use serde::Serialize;

use super::{bounded, short, AmqpError, Endpoint};
use crate::{Confirms, Envelope, Message, Publish, PublishError};

/// The content type of every message the publisher sends: the envelope's JSON.
const CONTENT_TYPE: &str = "application/json";

/// A RabbitMQ publisher with publisher confirms ([`Publish`]): each publish goes to its exchange
/// (the default exchange `""` unless [`exchange`](AmqpPublisher::exchange) says otherwise) with the
/// [`Message::destination`] as routing key, the [`Message::id`] as AMQP `message_id`, the
/// [`Message::headers`] as headers (long strings), persistent (`delivery_mode` 2), as
/// `application/json` and `mandatory` — and ends when the broker confirmed it:
///
/// | the broker | [`Publish::publish`] |
/// |---|---|
/// | `basic.ack` | `Ok(())`: the broker has the message (on disk, for a durable queue) |
/// | `basic.nack`, or the message returned as unroutable (no queue bound to its routing key) | [`PublishError::Refused`]: it does not |
/// | no confirm within [`Confirms::timeout`], the connection lost after the send | [`PublishError::Unconfirmed`]: it may have it |
/// | no connection, no channel | [`PublishError::Unavailable`]: nothing was sent |
///
/// A lost connection (a broker restart) is opened again by the next publish, for a publisher made
/// from a URL. [`AmqpPublisher::publish_envelope`] publishes an [`Envelope`] again under the same
/// `message_id` while its confirm does not come ([`Confirms::publish`]). Publishes may run
/// concurrently from several tasks: they share one channel.
#[derive(Debug)]
pub struct AmqpPublisher {
    endpoint: Endpoint,
    exchange: String,
    confirms: Confirms,
    connect_timeout: Duration,
    link: tokio::sync::Mutex<Link>,
}

/// The publisher's connection (when it opened it) and its channel in confirm mode.
#[derive(Debug, Default)]
struct Link {
    connection: Option<Connection>,
    channel: Option<Channel>,
}

impl AmqpPublisher {
    /// A publisher over `endpoint` (a URL, or a [`lapin::Connection`]) to the default exchange,
    /// waiting 5 s for a confirm and republishing twice ([`Confirms::default`]). It connects on its
    /// first publish.
    pub fn new(endpoint: impl Into<Endpoint>) -> AmqpPublisher {
        AmqpPublisher {
            endpoint: endpoint.into(),
            exchange: String::new(),
            confirms: Confirms::default(),
            connect_timeout: Duration::from_secs(10),
            link: tokio::sync::Mutex::new(Link::default()),
        }
    }

    /// Publishes to `exchange` (which must exist) instead of the default exchange.
    pub fn exchange(mut self, exchange: impl Into<String>) -> AmqpPublisher {
        self.exchange = exchange.into();
        self
    }

    /// How long one publish waits for its confirm ([`Confirms::timeout`]) and how often
    /// [`publish_envelope`](AmqpPublisher::publish_envelope) publishes again under the same id.
    pub fn confirms(mut self, confirms: Confirms) -> AmqpPublisher {
        self.confirms = confirms;
        self
    }

    /// How long opening a connection or a channel may take (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> AmqpPublisher {
        self.connect_timeout = timeout;
        self
    }

    /// The publisher's channel, in confirm mode, opened (with its connection, for a URL) if it is
    /// not open: to declare the queues it publishes to ([`declare_queue`](super::declare_queue)).
    pub async fn channel(&self) -> Result<Channel, AmqpError> {
        let mut link = self.link.lock().await;
        if let Some(channel) = link.channel.as_ref().filter(|c| c.status().connected()) {
            return Ok(channel.clone());
        }
        link.channel = None;
        let channel = self
            .endpoint
            .channel(&mut link.connection, self.connect_timeout)
            .await?;
        tokio::time::timeout(
            self.connect_timeout,
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        .map_err(|_| AmqpError::Connect {
            reason: format!("no confirm mode within {:?}", self.connect_timeout),
            source: None,
        })?
        .map_err(|e| AmqpError::Connect {
            reason: format!("no confirm mode: {e}"),
            source: Some(e),
        })?;
        link.channel = Some(channel.clone());
        Ok(channel)
    }

    /// Publishes `envelope` to `routing_key` ([`Envelope::to_message`]: its JSON body, its identity as
    /// `message_id`, its ids as headers) and waits for the confirm, publishing it again under the
    /// **same** `message_id` when the confirm does not come ([`Confirms::publish`]); answers the
    /// message id. Inside an `#[idempotent]` call, every attempt of the call publishes its messages
    /// with the same ids ([`Envelope::new`]), so a consumer's inbox works each once.
    pub async fn publish_envelope<T: Serialize>(
        &self,
        routing_key: &str,
        envelope: &Envelope<T>,
    ) -> Result<String, AmqpError> {
        let message = envelope.to_message(routing_key).map_err(AmqpError::Body)?;
        self.confirms
            .publish(&message, || self.publish_once(&message))
            .await?;
        Ok(message.id)
    }

    /// One publish and its confirm.
    async fn publish_once(&self, message: &Message) -> Result<(), PublishError> {
        let refused = |e: AmqpError| PublishError::Refused {
            id: message.id.clone(),
            reason: e.to_string(),
        };
        let exchange = short(&self.exchange, "an exchange name").map_err(refused)?;
        let routing_key = short(&message.destination, "a routing key").map_err(refused)?;
        let message_id = short(&message.id, "a message id").map_err(refused)?;
        let mut headers = FieldTable::default();
        for (name, value) in &message.headers {
            headers.insert(
                short(name, "a header name").map_err(refused)?,
                AMQPValue::LongString(value.as_str().into()),
            );
        }
        let properties = BasicProperties::default()
            .with_message_id(message_id)
            .with_headers(headers)
            .with_delivery_mode(2)
            .with_content_type(CONTENT_TYPE.into());

        let channel = self
            .channel()
            .await
            .map_err(|e| PublishError::Unavailable(e.to_string()))?;
        let unconfirmed = |reason: String| PublishError::Unconfirmed {
            id: message.id.clone(),
            reason,
        };
        let confirm = match channel
            .basic_publish(
                exchange,
                routing_key,
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &message.body,
                properties,
            )
            .await
        {
            Ok(confirm) => confirm,
            // The channel or connection was closed before anything was sent.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidConnectionState(_)
                ) =>
            {
                self.forget(&channel).await;
                return Err(PublishError::Unavailable(e.to_string()));
            }
            Err(e) => {
                self.forget(&channel).await;
                return Err(unconfirmed(format!("the send failed: {e}")));
            }
        };
        match bounded(&channel, self.confirms.timeout, confirm).await {
            Err(reason) => {
                // A channel that keeps its confirms, or lost them, is not one to publish on again.
                self.forget(&channel).await;
                Err(unconfirmed(format!("no confirm: {reason}")))
            }
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned))) => {
                Err(PublishError::Refused {
                    id: message.id.clone(),
                    reason: format!(
                        "returned unroutable from exchange `{}` with routing key `{}`: {} {}",
                        self.exchange,
                        message.destination,
                        returned.reply_code,
                        returned.reply_text
                    ),
                })
            }
            Ok(Confirmation::Nack(None)) => Err(PublishError::Refused {
                id: message.id.clone(),
                reason: "basic.nack".to_owned(),
            }),
            Ok(Confirmation::NotRequested) => {
                self.forget(&channel).await;
                Err(unconfirmed("the channel is not in confirm mode".to_owned()))
            }
        }
    }

    /// Drops `channel` as the publisher's: the next publish opens another.
    async fn forget(&self, channel: &Channel) {
        let mut link = self.link.lock().await;
        if link.channel.as_ref() == Some(channel) {
            link.channel = None;
        }
    }
}

impl Publish for AmqpPublisher {
    /// One publish of `message` and its confirm (see the type's documentation): not republished —
    /// [`Confirms::publish`] or the outbox's relay does that, under the same id.
    fn publish(&self, message: &Message) -> impl Future<Output = Result<(), PublishError>> + Send {
        self.publish_once(message)
    }
}
