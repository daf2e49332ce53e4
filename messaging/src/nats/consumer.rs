//! The JetStream consumer: a durable pull consumer with explicit acks that runs an [`Inbox`], and
//! tells the stream what the inbox decided only after the inbox returned.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::{self, MessagesErrorKind};
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer};
use async_nats::jetstream::{self, AckKind, Context};
use futures_util::StreamExt;
use samekey_runtime::{Classify, Error};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::delivery::{Delivery, Disposition, Handled, HEADER_DEAD_LETTER_REASON};
use crate::inbox::Inbox;
use crate::message::Message;
use crate::nats::{JetStreamPublisher, NatsError, HEADER_MSG_ID};

/// The pause before a message is delivered again after its dead letter could not be published.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(1);

/// The longest pause between two tries to pull messages again after an error.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A consumer that runs an [`Inbox`] over a durable JetStream pull consumer with explicit acks.
///
/// # Guarantees
///
/// * A message's work runs through [`Inbox::handle`] — at most once per message identity, whatever
///   JetStream redelivers — and the stream is told what the inbox decided only after it returned:
///   [`Disposition::Ack`] is an ack that waits for the server's confirmation (a double ack),
///   [`Disposition::Requeue`], [`Disposition::Busy`] and [`Disposition::Deferred`] a `nak` with the disposition's delay,
///   [`Disposition::DeadLetter`] a publish of the message (body, headers, its `Nats-Msg-Id`, and
///   `x-samekey-dead-letter-reason`) to the [dead-letter subject](JetStreamConsumerBuilder::dead_letters)
///   that waits for its JetStream ack, and only then a `term` of the original.
/// * A consumer that stops before its ack (a crash, a lost connection, a shutdown) leaves the
///   message unacknowledged: JetStream redelivers it after the ack wait, and the inbox answers the
///   redelivery from the receipt without running the work again.
/// * The inbox, not JetStream, gives up on a message: the consumer has no `max_deliver` of its own
///   (JetStream would count busy deliveries too — redeliveries answered while a dead consumer's
///   claim waits for its lease to end — and drop a message never worked); the inbox counts the
///   deliveries that reached the handler and failed, in its journal, and dead-letters after its `max_deliveries`.
/// * [`run`](JetStreamConsumer::run) ends between two messages when its shutdown future completes,
///   never in the middle of one; it survives a server restart (async-nats reconnects, and the
///   consumer pulls again).
///
/// Messages are worked one at a time, in the order the consumer receives them; run several
/// consumers on one durable name to work several at once (the inbox keeps two deliveries of one
/// message apart).
pub struct JetStreamConsumer {
    context: Context,
    consumer: PullConsumer,
    inbox: Inbox,
    dead_letters: Option<String>,
    batch: usize,
    heartbeat: Duration,
    messages: Option<pull::Stream>,
    dead_letter_publisher: JetStreamPublisher,
}

impl std::fmt::Debug for JetStreamConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let info = self.consumer.cached_info();
        f.debug_struct("JetStreamConsumer")
            .field("stream", &info.stream_name)
            .field("consumer", &info.name)
            .field("inbox", &self.inbox)
            .field("dead_letters", &self.dead_letters)
            .field("batch", &self.batch)
            .field("pulling", &self.messages.is_some())
            .finish()
    }
}

/// Settings of a [`JetStreamConsumer`], made by [`JetStreamConsumer::builder`].
#[derive(Debug, Clone)]
pub struct JetStreamConsumerBuilder {
    context: Context,
    stream: String,
    durable: String,
    filter_subject: Option<String>,
    ack_wait: Duration,
    dead_letters: Option<String>,
    batch: usize,
    heartbeat: Duration,
}

/// A message as the consumer received it: the JetStream message, and what the inbox reads of it
/// ([`Received::delivery`]).
#[derive(Debug)]
pub struct Received {
    message: jetstream::Message,
    headers: Vec<(String, String)>,
    message_id: Option<String>,
    delivered: Option<u64>,
    stream_sequence: u64,
}

/// What became of one message ([`JetStreamConsumer::next`], [`JetStreamConsumer::process`]).
#[derive(Debug)]
pub struct Settled<R, E> {
    /// What the inbox made of it: the handler's answer (now, or from the receipt), or its error.
    pub handled: Handled<R, E>,
    /// What the inbox said to tell JetStream.
    pub disposition: Disposition,
    /// The message's `Nats-Msg-Id`, if it has one.
    pub message_id: Option<String>,
    /// JetStream's count of this message's deliveries, 1 for the first.
    pub delivered: Option<u64>,
    /// The message's sequence in its stream.
    pub stream_sequence: u64,
    /// The server confirmed what it was told (the ack, `nak` or `term`, and for a dead letter its
    /// publish). `false`: it may not have got it — the message then comes again after the ack wait,
    /// and the inbox answers from the receipt; or the dead letter could not be published, and the
    /// message was given back to be dead-lettered again.
    pub confirmed: bool,
}

impl JetStreamConsumer {
    /// The settings of a consumer of `stream` under the durable name `durable` (JetStream remembers
    /// its progress under that name): a 30 s ack wait, no dead-letter subject, an immediate `nak`,
    /// 10 messages per pull.
    pub fn builder(
        context: Context,
        stream: impl Into<String>,
        durable: impl Into<String>,
    ) -> JetStreamConsumerBuilder {
        JetStreamConsumerBuilder {
            context,
            stream: stream.into(),
            durable: durable.into(),
            filter_subject: None,
            ack_wait: Duration::from_secs(30),
            dead_letters: None,
            batch: 10,
            heartbeat: Duration::from_secs(5),
        }
    }

    /// The inbox it runs.
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// The JetStream consumer it pulls from (for its info: pending and unacknowledged counts).
    pub fn consumer(&self) -> &PullConsumer {
        &self.consumer
    }

    /// The next message from the stream. Errors that pass (a lost connection, a missed heartbeat,
    /// a pull that failed) are logged and the consumer pulls again, with a backoff; the consumer
    /// deleted, or refused as not a pull consumer, is an error. Cancel-safe: dropped while it
    /// waits, no message is lost (one already pulled comes again after the ack wait).
    pub async fn receive(&mut self) -> Result<Received, NatsError> {
        let mut backoff = Duration::from_millis(50);
        loop {
            if self.messages.is_none() {
                match self.open().await {
                    Ok(messages) => self.messages = Some(messages),
                    Err(e) => {
                        tracing::warn!(target: "samekey", error = %e,
                            "samekey: cannot pull from JetStream; trying again");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                }
            }
            let Some(messages) = self.messages.as_mut() else {
                continue;
            };
            match messages.next().await {
                Some(Ok(message)) => return Ok(Received::new(message)),
                Some(Err(e)) => match e.kind() {
                    MessagesErrorKind::ConsumerDeleted
                    | MessagesErrorKind::PushBasedConsumer
                    | MessagesErrorKind::RequestLimitExceeded => {
                        self.messages = None;
                        return Err(NatsError::Messages(e));
                    }
                    kind => {
                        tracing::debug!(target: "samekey", error = %e,
                            "samekey: pulling from JetStream failed; pulling again");
                        // A missed heartbeat: the pull may be lost (a server restart); a new one.
                        if kind == MessagesErrorKind::MissingHeartbeat {
                            self.messages = None;
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                },
                None => {
                    self.messages = None;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    async fn open(&self) -> Result<pull::Stream, NatsError> {
        Ok(self
            .consumer
            .stream()
            .max_messages_per_batch(self.batch)
            .heartbeat(self.heartbeat)
            .expires(self.heartbeat * 4)
            .messages()
            .await?)
    }

    /// Works a received message through the inbox ([`Inbox::handle`]) and then tells JetStream
    /// what the inbox decided (see the type's guarantees).
    pub async fn process<T, R, E, F, Fut>(&self, received: &Received, handler: F) -> Settled<R, E>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + std::fmt::Display,
    {
        let handled = self.inbox.handle(&received.delivery(), handler).await;
        let disposition = handled.disposition();
        let confirmed = match &disposition {
            Disposition::Ack => self.tell(received, AckKind::Ack).await,
            Disposition::Requeue { delay, .. }
            | Disposition::Busy { delay }
            | Disposition::Deferred { delay, .. } => {
                self.tell(received, AckKind::Nak(Some(*delay))).await
            }
            Disposition::DeadLetter { reason } => self.dead_letter(received, reason).await,
        };
        Settled {
            handled,
            disposition,
            message_id: received.message_id.clone(),
            delivered: received.delivered,
            stream_sequence: received.stream_sequence,
            confirmed,
        }
    }

    /// The next message, worked and settled: [`receive`](JetStreamConsumer::receive), then
    /// [`process`](JetStreamConsumer::process).
    pub async fn next<T, R, E, F, Fut>(&mut self, handler: F) -> Result<Settled<R, E>, NatsError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + std::fmt::Display,
    {
        let received = self.receive().await?;
        Ok(self.process(&received, handler).await)
    }

    /// Works messages with `handler` until `shutdown` completes: a message being worked then is
    /// worked to its end and settled first; messages pulled and not yet worked are left to
    /// JetStream, which delivers them again after the ack wait. Ends with an error only when the
    /// consumer is gone (deleted, or not a pull consumer).
    pub async fn run<T, R, E, F, Fut>(
        &mut self,
        handler: F,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), NatsError>
    where
        T: Serialize + DeserializeOwned,
        F: Fn(T) -> Fut,
        Fut: Future<Output = Result<R, E>>,
        R: Serialize + DeserializeOwned,
        E: Classify + From<Error> + std::fmt::Display,
    {
        tokio::pin!(shutdown);
        loop {
            let received = tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                received = self.receive() => received?,
            };
            let settled = self.process(&received, &handler).await;
            tracing::debug!(target: "samekey", id = ?settled.message_id,
                delivered = ?settled.delivered, disposition = settled.disposition.name(),
                confirmed = settled.confirmed, "samekey: a JetStream message settled");
        }
    }

    /// Tells the server `kind` about the message and waits for its confirmation.
    async fn tell(&self, received: &Received, kind: AckKind) -> bool {
        match received.message.double_ack_with(kind).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(target: "samekey", id = ?received.message_id,
                    sequence = received.stream_sequence, error = %e,
                    "samekey: JetStream did not confirm an ack; the message may come again");
                false
            }
        }
    }

    /// Publishes the message to the dead letters and waits for their ack, then terminates it; a
    /// dead letter that cannot be published gives the message back, to be dead-lettered again.
    async fn dead_letter(&self, received: &Received, reason: &str) -> bool {
        let Some(subject) = &self.dead_letters else {
            tracing::warn!(target: "samekey", id = ?received.message_id,
                sequence = received.stream_sequence, %reason,
                "samekey: a dead letter and no dead-letter subject: the message is terminated");
            return self.tell(received, AckKind::Term).await;
        };
        let letter = received.dead_letter(subject, reason);
        match self.dead_letter_publisher.publish_confirmed(&letter).await {
            Ok(()) => self.tell(received, AckKind::Term).await,
            Err(e) => {
                tracing::error!(target: "samekey", id = %letter.id, subject = %subject, error = %e,
                    "samekey: a dead letter could not be published; the message is given back");
                self.tell(received, AckKind::Nak(Some(DEAD_LETTER_RETRY)))
                    .await;
                false
            }
        }
    }

    /// The JetStream context it works through.
    pub fn context(&self) -> &Context {
        &self.context
    }
}

impl JetStreamConsumerBuilder {
    /// Only the stream's messages whose subject matches `subject` (wildcards allowed).
    pub fn filter_subject(mut self, subject: impl Into<String>) -> JetStreamConsumerBuilder {
        self.filter_subject = Some(subject.into());
        self
    }

    /// How long JetStream waits for a message's ack before it delivers it again (default 30 s):
    /// longer than a message's work takes.
    pub fn ack_wait(mut self, ack_wait: Duration) -> JetStreamConsumerBuilder {
        self.ack_wait = ack_wait;
        self
    }

    /// Dead letters are published to `subject`, which a stream **other than the consumer's** must
    /// hold (a stream's duplicate window would drop a dead letter that keeps its message's
    /// `Nats-Msg-Id`, as it does). Without one, a dead letter is only terminated (`term`): the
    /// stream keeps it under its retention, and the server's advisory names it.
    pub fn dead_letters(mut self, subject: impl Into<String>) -> JetStreamConsumerBuilder {
        self.dead_letters = Some(subject.into());
        self
    }

    /// How many messages one pull asks for (default 10; at least 1). Pulled messages wait their
    /// turn within the ack wait: keep `batch` × a message's work below it.
    pub fn batch(mut self, batch: usize) -> JetStreamConsumerBuilder {
        self.batch = batch.max(1);
        self
    }

    /// How often the server tells an idle pull it is still there (default 5 s): a pull that hears
    /// nothing for twice as long is made again (after a server restart).
    pub fn heartbeat(mut self, heartbeat: Duration) -> JetStreamConsumerBuilder {
        self.heartbeat = heartbeat.max(Duration::from_millis(100));
        self
    }

    /// Creates the durable consumer (or takes the one of that name, updated to these settings):
    /// explicit acks, the ack wait, no `max_deliver` (the inbox decides when to give up).
    pub async fn create(self, inbox: Inbox) -> Result<JetStreamConsumer, NatsError> {
        let config = pull::Config {
            durable_name: Some(self.durable.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_deliver: -1,
            filter_subject: self.filter_subject.clone().unwrap_or_default(),
            ..Default::default()
        };
        let consumer = self
            .context
            .create_consumer_on_stream(config, &self.stream)
            .await
            .map_err(|source| NatsError::Consumer {
                stream: self.stream.clone(),
                consumer: self.durable.clone(),
                source,
            })?;
        Ok(JetStreamConsumer {
            dead_letter_publisher: JetStreamPublisher::new(self.context.clone()),
            context: self.context,
            consumer,
            inbox,
            dead_letters: self.dead_letters,
            batch: self.batch,
            heartbeat: self.heartbeat,
            messages: None,
        })
    }
}

impl Received {
    fn new(message: jetstream::Message) -> Received {
        let mut headers = Vec::new();
        if let Some(map) = &message.headers {
            for (name, values) in map.iter() {
                for value in values {
                    headers.push((name.to_string(), value.as_str().to_owned()));
                }
            }
        }
        let message_id = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(HEADER_MSG_ID))
            .map(|(_, value)| value.clone());
        let (delivered, stream_sequence) = match message.info() {
            Ok(info) => (u64::try_from(info.delivered).ok(), info.stream_sequence),
            Err(_) => (None, 0),
        };
        Received {
            message,
            headers,
            message_id,
            delivered,
            stream_sequence,
        }
    }

    /// The message as the inbox reads it: its body, its headers as text, its `Nats-Msg-Id` as the
    /// message id, JetStream's delivery count, and `redelivered` when that count is above 1.
    pub fn delivery(&self) -> Delivery<'_> {
        Delivery {
            body: &self.message.payload,
            headers: &self.headers,
            message_id: self.message_id.as_deref(),
            delivery: self.delivered,
            redelivered: self.delivered.is_some_and(|n| n > 1),
        }
    }

    /// The JetStream message (its subject, its payload, its ack methods).
    pub fn message(&self) -> &jetstream::Message {
        &self.message
    }

    /// Its `Nats-Msg-Id`, if it has one.
    pub fn message_id(&self) -> Option<&str> {
        self.message_id.as_deref()
    }

    /// JetStream's count of its deliveries, 1 for the first.
    pub fn delivered(&self) -> Option<u64> {
        self.delivered
    }

    /// Its sequence in its stream.
    pub fn stream_sequence(&self) -> u64 {
        self.stream_sequence
    }

    /// Its dead letter to `subject`: its body and headers (less the server's own `Nats-*` ones),
    /// the reason, and its `Nats-Msg-Id` — or, for a message without one, `<stream>.<sequence>` of
    /// the original, so that a dead letter published twice is one.
    fn dead_letter(&self, subject: &str, reason: &str) -> Message {
        let id = match &self.message_id {
            Some(id) => id.clone(),
            None => match self.message.info() {
                Ok(info) => format!("{}.{}", info.stream, info.stream_sequence),
                Err(_) => format!("{}.{}", self.message.subject, self.stream_sequence),
            },
        };
        let mut headers: Vec<(String, String)> = self
            .headers
            .iter()
            .filter(|(name, _)| {
                !name
                    .get(..5)
                    .is_some_and(|p| p.eq_ignore_ascii_case("nats-"))
                    && !name.eq_ignore_ascii_case(HEADER_DEAD_LETTER_REASON)
            })
            .cloned()
            .collect();
        headers.push((
            HEADER_DEAD_LETTER_REASON.to_owned(),
            reason.replace(['\r', '\n'], " "),
        ));
        Message {
            id,
            destination: subject.to_owned(),
            headers,
            body: self.message.payload.to_vec(),
        }
    }
}
