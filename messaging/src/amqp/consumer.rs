//! The consumer: an [`Inbox`] over a queue, manual acknowledgement, dead letters confirmed before
//! their original is acked, and a new connection after a broker restart.

use std::fmt::{self, Display};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, BasicRejectOptions, ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Confirmation, Connection, Consumer};
use samekey_runtime::{Classify, Error};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{
    bounded, broker_error, declare_queue, header_text, short, AmqpError, Endpoint, QueueType,
};
use crate::{Delivery, Disposition, Inbox, HEADER_DEAD_LETTER_REASON};

/// The header in which a RabbitMQ quorum queue counts a message's earlier deliveries.
const DELIVERY_COUNT: &str = "x-delivery-count";

/// A consumer of one RabbitMQ queue that works each delivery through an [`Inbox`] and tells the
/// broker what the inbox decided, with manual acknowledgement:
///
/// | [`Disposition`] | what the consumer does |
/// |---|---|
/// | `Ack` | `basic.ack` — only after [`Inbox::handle`] returned, the receipt recorded |
/// | `Requeue`, `Busy`, `Deferred` | `basic.nack` with requeue once the disposition's delay has passed (RabbitMQ redelivers a requeued message at once; the consumer waits, holding its turn): the broker delivers it again |
/// | `DeadLetter` | publishes body, headers, `message_id` and [`x-samekey-dead-letter-reason`](HEADER_DEAD_LETTER_REASON) to the [`dead_letters`](AmqpConsumer::dead_letters) queue, waits for its confirm, then `basic.ack`; a dead letter not confirmed leaves the original requeued. Without a dead-letter queue: `basic.reject` without requeue (the queue's own `x-dead-letter-exchange`, if it has one, takes it) |
///
/// Deliveries are worked one at a time, in the order they come; [`prefetch`](AmqpConsumer::prefetch)
/// bounds how many the broker sends ahead (run several consumers for parallel work). A connection
/// lost (a broker restart) is opened again with a backoff, and consuming goes on; deliveries that
/// were not acked come again, redelivered, and the inbox answers those it recorded.
pub struct AmqpConsumer {
    endpoint: Endpoint,
    queue: String,
    prefetch: u16,
    dead_letters: Option<String>,
    declare: Option<QueueType>,
    confirm_timeout: Duration,
    connect_timeout: Duration,
    backoff: (Duration, Duration),
    observer: Option<Observer>,
}

/// What [`AmqpConsumer::on_settled`] calls.
type Observer = Arc<dyn Fn(&Settled) + Send + Sync>;

impl fmt::Debug for AmqpConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpConsumer")
            .field("endpoint", &self.endpoint)
            .field("queue", &self.queue)
            .field("prefetch", &self.prefetch)
            .field("dead_letters", &self.dead_letters)
            .field("declare", &self.declare)
            .finish_non_exhaustive()
    }
}

/// What the consumer did with one delivery, for [`AmqpConsumer::on_settled`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settled {
    /// The delivery's AMQP `message_id`.
    pub message_id: Option<String>,
    /// The broker's `redelivered` flag.
    pub redelivered: bool,
    /// The broker's count of the message's deliveries (a quorum queue's), 1 for the first.
    pub delivery: Option<u64>,
    /// What the inbox decided.
    pub disposition: Disposition,
    /// What the consumer told the broker.
    pub settlement: Settlement,
}

/// What the consumer told the broker about a delivery ([`Settled::settlement`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settlement {
    /// `basic.ack`.
    Acked,
    /// `basic.nack` with requeue: asked for, or because its dead letter was not confirmed.
    Requeued,
    /// Published to the dead-letter queue (confirmed), then acked.
    DeadLettered {
        /// The dead-letter queue.
        queue: String,
    },
    /// `basic.reject` without requeue (no dead-letter queue configured).
    Rejected,
    /// Nothing reached the broker: the channel was lost. The broker delivers the message again.
    Lost {
        /// Why.
        reason: String,
    },
}

/// How a session with the broker ended.
enum Ended {
    Shutdown,
    Lost(String),
}

/// An open session: the connection (when the consumer opened it), the consuming channel, the
/// channel in confirm mode for dead letters, the consumer.
struct Session {
    connection: Option<Connection>,
    channel: Channel,
    dead_letters: Option<Channel>,
    consumer: Consumer,
}

impl AmqpConsumer {
    /// A consumer of `queue` over `endpoint` (a URL, or a [`lapin::Connection`]), prefetching 10,
    /// without a dead-letter queue, declaring nothing.
    pub fn new(endpoint: impl Into<Endpoint>, queue: impl Into<String>) -> AmqpConsumer {
        AmqpConsumer {
            endpoint: endpoint.into(),
            queue: queue.into(),
            prefetch: 10,
            dead_letters: None,
            declare: None,
            confirm_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
            backoff: (Duration::from_millis(100), Duration::from_secs(5)),
            observer: None,
        }
    }

    /// How many unacknowledged deliveries the broker sends ahead (`basic.qos`; at least 1).
    pub fn prefetch(mut self, prefetch: u16) -> AmqpConsumer {
        self.prefetch = prefetch.max(1);
        self
    }

    /// The queue that receives the dead letters (through the default exchange), each confirmed
    /// before its original is acked.
    pub fn dead_letters(mut self, queue: impl Into<String>) -> AmqpConsumer {
        self.dead_letters = Some(queue.into());
        self
    }

    /// Declares the queue, durable, as `kind` — and the dead-letter queue, durable and classic — on
    /// every connection before consuming. A quorum queue's `x-delivery-count` is read as the
    /// delivery count, its absence as a first delivery.
    pub fn declare(mut self, kind: QueueType) -> AmqpConsumer {
        self.declare = Some(kind);
        self
    }

    /// How long a dead letter's confirm may take (default 5 s): past it, the original is requeued.
    pub fn confirm_timeout(mut self, timeout: Duration) -> AmqpConsumer {
        self.confirm_timeout = timeout;
        self
    }

    /// How long connecting may take — the connection, its channels, the declarations, the
    /// `basic.consume` (default 10 s); past it, the consumer tries again.
    pub fn connect_timeout(mut self, timeout: Duration) -> AmqpConsumer {
        self.connect_timeout = timeout;
        self
    }

    /// The pause before connecting again after a connection failed, from `first`, doubled up to
    /// `max` (default 100 ms to 5 s).
    pub fn reconnect_backoff(mut self, first: Duration, max: Duration) -> AmqpConsumer {
        self.backoff = (first, max.max(first));
        self
    }

    /// Calls `observer` after each delivery was settled with the broker (metrics, logs, tests).
    pub fn on_settled(
        mut self,
        observer: impl Fn(&Settled) + Send + Sync + 'static,
    ) -> AmqpConsumer {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Consumes the queue until `shutdown` completes, working each delivery through `inbox` with
    /// `handler` ([`Inbox::handle`]) and settling it as the inbox decided (see the type's
    /// documentation). On shutdown, the delivery being worked is finished and settled first; the
    /// consumer is cancelled and the deliveries prefetched but not worked go back to the queue.
    /// A lost connection is opened again with a backoff (for a URL); `run` ends with an error only
    /// when the broker refuses the queue (declared with other settings, missing, no access) or the
    /// given connection is closed.
    pub async fn run<T, R, E, F, Fut>(
        &self,
        inbox: &Inbox,
        handler: F,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), AmqpError>
    where
        T: Serialize + DeserializeOwned,
        F: Fn(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + Display,
    {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut pause = self.backoff.0;
        loop {
            let opened = tokio::select! {
                biased;
                () = shutdown.as_mut() => return Ok(()),
                opened = tokio::time::timeout(self.connect_timeout, self.open()) => {
                    opened.unwrap_or_else(|_| Err(AmqpError::Connect {
                        reason: format!("not consuming within {:?}", self.connect_timeout),
                        source: None,
                    }))
                }
            };
            match opened {
                Ok(mut session) => {
                    pause = self.backoff.0;
                    match self
                        .consume(&mut session, inbox, &handler, shutdown.as_mut())
                        .await
                    {
                        Ended::Shutdown => {
                            self.close(session).await;
                            return Ok(());
                        }
                        Ended::Lost(reason) => {
                            tracing::warn!(target: "samekey", queue = %self.queue, %reason,
                                "samekey: the RabbitMQ consumer lost its channel; connecting again");
                        }
                    }
                }
                Err(e @ (AmqpError::Closed | AmqpError::Broker { .. } | AmqpError::Name(_))) => {
                    return Err(e)
                }
                Err(e) => {
                    tracing::warn!(target: "samekey", queue = %self.queue, error = %e, ?pause,
                        "samekey: the RabbitMQ consumer cannot connect; trying again");
                }
            }
            tokio::select! {
                biased;
                () = shutdown.as_mut() => return Ok(()),
                () = tokio::time::sleep(pause) => {}
            }
            pause = pause.saturating_mul(2).min(self.backoff.1);
        }
    }

    /// A connection, the channels, the queues declared, the consumer.
    async fn open(&self) -> Result<Session, AmqpError> {
        let mut connection = None;
        let channel = self
            .endpoint
            .channel(&mut connection, self.connect_timeout)
            .await?;
        let lost = |what: &str, e: lapin::Error| {
            broker_error(format!("{what} (queue `{}`)", self.queue), e)
        };
        if let Some(kind) = self.declare {
            declare_queue(&channel, &self.queue, kind).await?;
            if let Some(dead_letters) = &self.dead_letters {
                declare_queue(&channel, dead_letters, QueueType::Classic).await?;
            }
        }
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| lost("set the prefetch", e))?;
        let dead_letters = match &self.dead_letters {
            Some(_) => {
                let publisher = self
                    .endpoint
                    .channel(&mut connection, self.connect_timeout)
                    .await?;
                publisher
                    .confirm_select(ConfirmSelectOptions::default())
                    .await
                    .map_err(|e| lost("put the dead letters' channel in confirm mode", e))?;
                Some(publisher)
            }
            None => None,
        };
        let consumer = channel
            .basic_consume(
                short(&self.queue, "a queue name")?,
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| lost("consume", e))?;
        Ok(Session {
            connection,
            channel,
            dead_letters,
            consumer,
        })
    }

    /// Works the session's deliveries until shutdown or until the channel is lost.
    async fn consume<T, R, E, F, Fut>(
        &self,
        session: &mut Session,
        inbox: &Inbox,
        handler: &F,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Ended
    where
        T: Serialize + DeserializeOwned,
        F: Fn(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + Display,
    {
        loop {
            let next = tokio::select! {
                biased;
                () = shutdown.as_mut() => return Ended::Shutdown,
                next = std::future::poll_fn(|cx| Pin::new(&mut session.consumer).poll_next(cx)) => next,
            };
            let delivery = match next {
                Some(Ok(delivery)) => delivery,
                Some(Err(e)) => return Ended::Lost(e.to_string()),
                None => return Ended::Lost("the broker cancelled the consumer".to_owned()),
            };
            let settled = self.work(session, inbox, handler, delivery).await;
            if let Some(observer) = &self.observer {
                observer(&settled);
            }
            if let Settlement::Lost { reason } = settled.settlement {
                // A channel that lost an acknowledgement is not one to go on with: a new one gets
                // the deliveries it did not settle again.
                return Ended::Lost(reason);
            }
        }
    }

    /// Works one delivery and settles it.
    async fn work<T, R, E, F, Fut>(
        &self,
        session: &Session,
        inbox: &Inbox,
        handler: &F,
        delivery: AmqpDelivery,
    ) -> Settled
    where
        T: Serialize + DeserializeOwned,
        F: Fn(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + Display,
    {
        let headers: Vec<(String, String)> = delivery
            .properties
            .headers()
            .as_ref()
            .map(|table| {
                table
                    .inner()
                    .iter()
                    .filter_map(|(name, value)| {
                        header_text(value).map(|text| (name.as_str().to_owned(), text))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned());
        let count = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(DELIVERY_COUNT))
            .and_then(|(_, n)| n.parse::<u64>().ok())
            .map(|n| n.saturating_add(1))
            .or(match self.declare {
                Some(QueueType::Quorum) => Some(1),
                _ => None,
            });
        let read = Delivery {
            body: &delivery.data,
            headers: &headers,
            message_id: message_id.as_deref(),
            delivery: count,
            redelivered: delivery.redelivered,
        };
        let disposition = inbox.handle(&read, handler).await.disposition();
        let settlement = match &disposition {
            Disposition::Ack => self.ack(session, &delivery).await,
            // RabbitMQ redelivers a requeued message at once: the inbox's delay is waited here,
            // holding this consumer (it works one delivery at a time).
            Disposition::Requeue { delay, .. }
            | Disposition::Busy { delay }
            | Disposition::Deferred { delay, .. } => {
                tokio::time::sleep(*delay).await;
                self.requeue(session, &delivery).await
            }
            Disposition::DeadLetter { reason } => {
                self.dead_letter(session, &delivery, reason).await
            }
        };
        Settled {
            message_id,
            redelivered: delivery.redelivered,
            delivery: count,
            disposition,
            settlement,
        }
    }

    /// Publishes `delivery` to the dead letters with `reason`, and acks it once confirmed; requeues
    /// it when the dead letter is not confirmed.
    async fn dead_letter(
        &self,
        session: &Session,
        delivery: &AmqpDelivery,
        reason: &str,
    ) -> Settlement {
        let (Some(queue), Some(channel)) = (&self.dead_letters, &session.dead_letters) else {
            let rejected = delivery.acker.reject(BasicRejectOptions { requeue: false });
            return settled(
                bounded(&session.channel, self.confirm_timeout, rejected).await,
                Settlement::Rejected,
            );
        };
        let mut headers = delivery.properties.headers().clone().unwrap_or_default();
        headers.insert(
            HEADER_DEAD_LETTER_REASON.into(),
            AMQPValue::LongString(reason.into()),
        );
        let properties = delivery
            .properties
            .clone()
            .with_headers(headers)
            .with_delivery_mode(2);
        let routing_key = match short(queue, "a queue name") {
            Ok(key) => key,
            Err(e) => return self.keep(session, delivery, &e.to_string()).await,
        };
        let sent = match channel
            .basic_publish(
                "".into(),
                routing_key,
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &delivery.data,
                properties,
            )
            .await
        {
            Ok(confirm) => bounded(channel, self.confirm_timeout, confirm).await,
            Err(e) => return self.keep(session, delivery, &e.to_string()).await,
        };
        match sent {
            Ok(Confirmation::Ack(None)) => match self.ack(session, delivery).await {
                Settlement::Acked => Settlement::DeadLettered {
                    queue: queue.clone(),
                },
                other => other,
            },
            Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned))) => {
                self.keep(
                    session,
                    delivery,
                    &format!("returned: {} {}", returned.reply_code, returned.reply_text),
                )
                .await
            }
            Ok(other) => self.keep(session, delivery, &format!("{other:?}")).await,
            Err(reason) => self.keep(session, delivery, &reason).await,
        }
    }

    /// A dead letter that was not confirmed: the original goes back to the queue, after a pause
    /// (so that a missing dead-letter queue does not spin the message).
    async fn keep(&self, session: &Session, delivery: &AmqpDelivery, why: &str) -> Settlement {
        tracing::warn!(target: "samekey", queue = %self.queue,
            dead_letters = ?self.dead_letters, %why,
            "samekey: a dead letter was not confirmed; its original is requeued");
        tokio::time::sleep(self.backoff.0).await;
        self.requeue(session, delivery).await
    }

    /// `basic.ack`.
    async fn ack(&self, session: &Session, delivery: &AmqpDelivery) -> Settlement {
        let acked = delivery.acker.ack(BasicAckOptions::default());
        settled(
            bounded(&session.channel, self.confirm_timeout, acked).await,
            Settlement::Acked,
        )
    }

    /// `basic.nack` with requeue.
    async fn requeue(&self, session: &Session, delivery: &AmqpDelivery) -> Settlement {
        let nacked = delivery.acker.nack(BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        });
        settled(
            bounded(&session.channel, self.confirm_timeout, nacked).await,
            Settlement::Requeued,
        )
    }

    /// Ends a session: cancels the consumer, closes the channels (the broker requeues what was not
    /// acked) and the connection the consumer opened.
    async fn close(&self, session: Session) {
        let Session {
            connection,
            channel,
            dead_letters,
            consumer,
        } = session;
        let timeout = self.confirm_timeout;
        let reason = "samekey consumer shut down";
        let _ = bounded(
            &channel,
            timeout,
            channel.basic_cancel(consumer.tag(), BasicCancelOptions::default()),
        )
        .await;
        let _ = tokio::time::timeout(timeout, channel.close(200, reason.into())).await;
        if let Some(dead_letters) = dead_letters {
            let _ = tokio::time::timeout(timeout, dead_letters.close(200, reason.into())).await;
        }
        if let Some(connection) = connection {
            let _ = tokio::time::timeout(timeout, connection.close(200, reason.into())).await;
        }
    }
}

/// What an acknowledgement's answer means for the delivery.
fn settled(sent: Result<bool, String>, done: Settlement) -> Settlement {
    match sent {
        Ok(true) => done,
        Ok(false) => Settlement::Lost {
            reason: "the channel was closed: the broker delivers the message again".to_owned(),
        },
        Err(reason) => Settlement::Lost { reason },
    }
}
