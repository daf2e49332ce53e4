//! The broker's side of the pipeline: RabbitMQ or NATS JetStream, the relay's publisher with its
//! faults, the shipping consumer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use samekey::sqlx::{self, PgPool};
use samekey::Runtime;
use samekey_messaging::amqp::{declare_queue, AmqpConsumer, AmqpPublisher, QueueType, Settled};
use samekey_messaging::nats::{create_stream, JetStreamConsumer, JetStreamPublisher};
use samekey_messaging::outbox::{PgOutbox, Relay};
use samekey_messaging::{Disposition, Inbox, Message, OnUnknown, Publish, PublishError};

use super::{ship, Charged, PipelineError};

type BoxError = Box<dyn std::error::Error>;

/// The broker a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broker {
    /// RabbitMQ: a durable classic queue, its dead-letter queue beside it.
    RabbitMq,
    /// NATS JetStream: a stream, a durable pull consumer, a dead-letter subject.
    Nats,
}

impl Broker {
    pub(super) fn url_var(self) -> &'static str {
        match self {
            Broker::RabbitMq => "SAMEKEY_AMQP_URL",
            Broker::Nats => "SAMEKEY_NATS_URL",
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Broker::RabbitMq => "rabbitmq",
            Broker::Nats => "nats",
        }
    }

    pub(super) fn display(self) -> &'static str {
        match self {
            Broker::RabbitMq => "RabbitMQ",
            Broker::Nats => "NATS JetStream",
        }
    }

    pub(super) fn from_name(name: &str) -> Result<Broker, String> {
        match name {
            "rabbitmq" => Ok(Broker::RabbitMq),
            "nats" => Ok(Broker::Nats),
            other => Err(format!("unknown broker `{other}`")),
        }
    }

    /// Makes the run's queue (or stream) and its dead letters; answers the destination the order
    /// service stages its messages for.
    pub(super) async fn declare(self, url: &str, run: i64) -> Result<String, BoxError> {
        match self {
            Broker::RabbitMq => {
                let publisher = AmqpPublisher::new(url);
                let channel = publisher.channel().await?;
                declare_queue(&channel, &queue(run), QueueType::Classic).await?;
                declare_queue(&channel, &dead_letters(run), QueueType::Classic).await?;
                Ok(queue(run))
            }
            Broker::Nats => {
                let publisher = JetStreamPublisher::connect(url).await?;
                let subject = subject(run);
                create_stream(
                    publisher.context(),
                    &stream(run),
                    &[subject.as_str(), dead_subject(run).as_str()],
                    Duration::from_secs(120),
                )
                .await?;
                Ok(subject)
            }
        }
    }

    /// Restarts the broker (`scripts/services restart-…`): its connections drop, its unacknowledged
    /// messages are delivered again.
    pub(super) fn restart(self) -> std::io::Result<()> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services");
        let what = match self {
            Broker::RabbitMq => "restart-rabbitmq",
            Broker::Nats => "restart-nats",
        };
        let status = std::process::Command::new(script).arg(what).status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("{script} {what}: {status}")))
        }
    }
}

/// Where every message of a run goes starts with this: its relay takes those only.
pub(super) fn destinations(run: i64) -> String {
    format!("pipeline.{run}.")
}

fn queue(run: i64) -> String {
    format!("pipeline.{run}.shipping")
}

fn dead_letters(run: i64) -> String {
    format!("pipeline.{run}.shipping.dead")
}

fn stream(run: i64) -> String {
    format!("PIPELINE_{run}")
}

fn subject(run: i64) -> String {
    format!("pipeline.{run}.charged")
}

fn dead_subject(run: i64) -> String {
    format!("pipeline.{run}.dead")
}

/// The relay's publisher, with the run's faults: every `lose_every`-th publish reaches the broker
/// but its confirmation is "lost" (answered `Unconfirmed`); after its `crash_after`-th publish the
/// process ends before the relay marks the message sent. Every publish that reached the broker is
/// counted in `pipeline_publishes`.
struct Faulty<P> {
    inner: P,
    pool: PgPool,
    run: i64,
    published: AtomicU64,
    crash_after: Option<u64>,
    lose_every: u64,
}

impl<P> Faulty<P> {
    fn new(
        inner: P,
        pool: &PgPool,
        run: i64,
        crash_after: Option<u64>,
        lose_every: u64,
    ) -> Faulty<P> {
        Faulty {
            inner,
            pool: pool.clone(),
            run,
            published: AtomicU64::new(0),
            crash_after,
            lose_every,
        }
    }
}

impl<P: Publish> Publish for Faulty<P> {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        self.inner.publish(message).await?;
        let n = self.published.fetch_add(1, Ordering::SeqCst) + 1;
        let lost = self.lose_every > 0 && n.is_multiple_of(self.lose_every);
        let _ = sqlx::query(
            "INSERT INTO pipeline_publishes (run, message_id, confirmed) VALUES ($1, $2, $3)",
        )
        .bind(self.run)
        .bind(&message.id)
        .bind(!lost)
        .execute(&self.pool)
        .await;
        if self.crash_after == Some(n) {
            // Published, not marked: the relay dies in its worst window.
            std::process::exit(86);
        }
        if lost {
            return Err(PublishError::Unconfirmed {
                id: message.id.clone(),
                reason: "the confirmation was lost (injected)".to_owned(),
            });
        }
        Ok(())
    }
}

/// The relay's main: the outbox's staged messages to the broker until the parent stops it.
pub(super) async fn relay(
    url: &str,
    run: i64,
    pool: PgPool,
    crash_after: Option<u64>,
    lose_every: u64,
) -> Result<(), BoxError> {
    let outbox = PgOutbox::from_pool(pool.clone());
    outbox.migrate().await?;
    let forever = std::future::pending::<()>();
    match Broker::from_name(&std::env::var(super::BROKER_VAR)?)? {
        Broker::RabbitMq => {
            let relay = Relay::new(
                outbox,
                Faulty::new(AmqpPublisher::new(url), &pool, run, crash_after, lose_every),
            )
            .destinations(destinations(run))
            .interval(Duration::from_millis(50))
            .retry_backoff(Duration::from_millis(50), Duration::from_millis(500));
            relay.run(forever).await;
        }
        Broker::Nats => {
            let relay = Relay::new(
                outbox,
                Faulty::new(
                    JetStreamPublisher::connect(url).await?,
                    &pool,
                    run,
                    crash_after,
                    lose_every,
                ),
            )
            .destinations(destinations(run))
            .interval(Duration::from_millis(50))
            .retry_backoff(Duration::from_millis(50), Duration::from_millis(500));
            relay.run(forever).await;
        }
    }
    Ok(())
}

/// Records one delivery in `pipeline_deliveries`.
async fn record(pool: &PgPool, run: i64, id: Option<&str>, redelivered: bool, d: &Disposition) {
    let _ = sqlx::query(
        "INSERT INTO pipeline_deliveries (run, message_id, redelivered, disposition) VALUES ($1, $2, $3, $4)",
    )
    .bind(run)
    .bind(id)
    .bind(redelivered)
    .bind(d.name())
    .execute(pool)
    .await;
}

/// The shipping consumer's main: the inbox over the run's queue until the parent kills it.
pub(super) async fn consume(
    url: &str,
    run: i64,
    rt: &Runtime,
    pool: PgPool,
    node: String,
) -> Result<(), BoxError> {
    // Its handler's shipment commits with its receipt: a take-over may run it again.
    let inbox = Inbox::new("example.pipeline.shipping")
        .runtime(rt)
        .on_unknown(OnUnknown::Rerun);
    let handler = |charged: Charged| {
        let pool = pool.clone();
        let node = node.clone();
        async move { ship(&pool, &node, charged).await }
    };
    match Broker::from_name(&std::env::var(super::BROKER_VAR)?)? {
        Broker::RabbitMq => {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Settled>();
            let recorder = {
                let pool = pool.clone();
                tokio::spawn(async move {
                    while let Some(settled) = rx.recv().await {
                        let id = settled.message_id.as_deref();
                        record(&pool, run, id, settled.redelivered, &settled.disposition).await;
                    }
                })
            };
            let consumer = AmqpConsumer::new(url, queue(run))
                .prefetch(4)
                .dead_letters(dead_letters(run))
                .on_settled(move |settled| {
                    let _ = tx.send(settled.clone());
                });
            consumer
                .run::<Charged, i64, PipelineError, _, _>(&inbox, handler, std::future::pending())
                .await?;
            recorder.abort();
        }
        Broker::Nats => {
            let publisher = JetStreamPublisher::connect(url).await?;
            let mut consumer =
                JetStreamConsumer::builder(publisher.context().clone(), stream(run), "shipping")
                    .filter_subject(subject(run))
                    .dead_letters(dead_subject(run))
                    .ack_wait(Duration::from_secs(2))
                    .create(inbox)
                    .await?;
            loop {
                let settled = consumer
                    .next::<Charged, i64, PipelineError, _, _>(&handler)
                    .await?;
                let redelivered = settled.delivered.is_some_and(|n| n > 1);
                let id = settled.message_id.as_deref();
                record(&pool, run, id, redelivered, &settled.disposition).await;
            }
        }
    }
    Ok(())
}
