//! NATS JetStream (feature `nats`): a publisher whose publish ends with the stream's ack, under the
//! message's own `Nats-Msg-Id`, and a durable pull consumer that runs an [`Inbox`](crate::Inbox).
//!
//! # Guarantees
//!
//! * [`JetStreamPublisher`]: a publish is `Ok` only once a stream acked it (a `duplicate` ack too:
//!   the stream already had it). A publish whose ack never came is
//!   [`PublishError::Unconfirmed`](crate::PublishError::Unconfirmed) and is published again under
//!   the same `Nats-Msg-Id` ([`JetStreamPublisher::publish_envelope`], through
//!   [`Confirms`](crate::Confirms)), never a new one.
//! * [`JetStreamConsumer`]: a message's work runs through [`Inbox::handle`](crate::Inbox::handle),
//!   at most once per message identity; the message is acked (and the ack confirmed by the server)
//!   only after the inbox recorded its outcome. A consumer that crashes before the ack gets the
//!   message redelivered after the ack wait, and the redelivery is answered from the receipt.
//! * A message that fails for good, runs out of deliveries (the inbox's
//!   [`max_deliveries`](crate::Inbox::max_deliveries), counted in its journal) or
//!   cannot be read goes to the dead-letter subject, with its `Nats-Msg-Id` and the
//!   `x-samekey-dead-letter-reason` header, acked by JetStream before the original is terminated.
//! * A message from a producer without samekey (no envelope, a `Nats-Msg-Id`) is worked once per
//!   `Nats-Msg-Id`.
//!
//! # Two horizons
//!
//! JetStream's duplicate window is **short**: a stream drops a copy with a `Nats-Msg-Id` it has
//! seen within its `duplicate_window`, 2 minutes by default. A copy published later — a relay that
//! crashed between publish and mark and came back after an hour, a producer retrying after an
//! outage — is stored and delivered again. The inbox is the long horizon: it remembers a message for
//! its [`ttl`](crate::Inbox::ttl) (7 days by default) and answers that copy from the receipt.
//!
//! # Producer
//!
//! ```no_run
//! use samekey_messaging::nats::{create_stream, JetStreamPublisher};
//! use samekey_messaging::Envelope;
//! # use std::time::Duration;
//! # async fn produce() -> Result<(), Box<dyn std::error::Error>> {
//! let publisher = JetStreamPublisher::connect("nats://127.0.0.1:4222").await?;
//! let window = Duration::from_secs(120); // JetStream's duplicate window: short
//! create_stream(publisher.context(), "ORDERS", &["orders.>"], window).await?;
//! // Inside an #[idempotent] call, the envelope carries the call's ids: a retried call publishes
//! // the same message under the same Nats-Msg-Id.
//! let message = Envelope::new("order-7".to_owned());
//! publisher.publish_envelope("orders.paid", &message).await?; // returns after the JetStream ack
//! # Ok(()) }
//! ```
//!
//! # Consumer
//!
//! ```no_run
//! use samekey_messaging::nats::{create_stream, JetStreamConsumer};
//! use samekey_messaging::Inbox;
//! # use std::time::Duration;
//! # #[derive(Debug, thiserror::Error)] #[error("x")] struct ShipError(#[from] samekey::Error);
//! # impl samekey::Classify for ShipError { fn classify(&self) -> samekey::ErrorClass { self.0.classify() } }
//! # async fn consume(shutdown: tokio::sync::oneshot::Receiver<()>) -> Result<(), Box<dyn std::error::Error>> {
//! use samekey_messaging::nats::async_nats;
//! let js = async_nats::jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
//! create_stream(&js, "ORDERS_DEAD", &["orders_dead.>"], Duration::from_secs(120)).await?;
//! let mut consumer = JetStreamConsumer::builder(js, "ORDERS", "shipping")
//!     .filter_subject("orders.paid")
//!     .dead_letters("orders_dead.paid")
//!     .create(Inbox::new("shipping.on_paid").max_deliveries(5))
//!     .await?;
//! let ship = |order: String| async move { Ok::<_, ShipError>(format!("shipped {order}")) };
//! consumer.run(ship, async { let _ = shutdown.await; }).await?; // acks once the receipt is recorded
//! # Ok(()) }
//! ```

mod consumer;
mod publisher;

use std::time::Duration;

use async_nats::jetstream::consumer::pull::MessagesError;
use async_nats::jetstream::consumer::StreamError;
use async_nats::jetstream::context::CreateStreamError;
use async_nats::jetstream::stream::{self, ConsumerError, StorageType};
use async_nats::jetstream::Context;

pub use consumer::{JetStreamConsumer, JetStreamConsumerBuilder, Received, Settled};
pub use publisher::{Acked, JetStreamPublisher};

/// The async-nats this module is built on, for its `Client`, `jetstream::Context` and settings.
pub use async_nats;

/// The header that carries a message's id, which a stream's duplicate window reads.
pub const HEADER_MSG_ID: &str = "Nats-Msg-Id";

/// Why setting up NATS or pulling from it failed (a publish says [`PublishError`](crate::PublishError)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// No connection to the server.
    #[error("cannot connect to NATS: {0}")]
    Connect(#[from] async_nats::ConnectError),
    /// The stream could not be created or read.
    #[error("cannot create stream `{stream}`: {source}")]
    Stream {
        /// The stream's name.
        stream: String,
        /// The server's or the client's error.
        #[source]
        source: CreateStreamError,
    },
    /// The consumer could not be created.
    #[error("cannot create consumer `{consumer}` on stream `{stream}`: {source}")]
    Consumer {
        /// The stream's name.
        stream: String,
        /// The consumer's durable name.
        consumer: String,
        /// The server's or the client's error.
        #[source]
        source: ConsumerError,
    },
    /// A pull could not be started.
    #[error("cannot pull from JetStream: {0}")]
    Pull(#[from] StreamError),
    /// The consumer's messages ended for good: the consumer was deleted, or is not a pull consumer.
    #[error("the consumer's messages ended: {0}")]
    Messages(#[from] MessagesError),
}

/// Creates the stream `name` (file storage, so that it outlives a server restart) over `subjects`,
/// whose duplicate window drops a copy with a `Nats-Msg-Id` seen within `duplicate_window`; a
/// stream of that name that exists already is taken as it is. For the stream's other settings, make
/// it with async-nats's own `Context::create_stream`.
pub async fn create_stream(
    context: &Context,
    name: &str,
    subjects: &[&str],
    duplicate_window: Duration,
) -> Result<stream::Stream, NatsError> {
    let config = stream::Config {
        name: name.to_owned(),
        subjects: subjects.iter().map(|s| (*s).to_owned()).collect(),
        duplicate_window,
        storage: StorageType::File,
        ..Default::default()
    };
    context
        .get_or_create_stream(config)
        .await
        .map_err(|source| NatsError::Stream {
            stream: name.to_owned(),
            source,
        })
}
