//! [`Relay`]: publishes what the outbox staged, in order per ordering key, and marks it sent.

use std::future::Future;
use std::time::Duration;

use super::backend::Row;
use super::{Backend, Outbox, OutboxError};
use crate::message::{Publish, PublishError};

/// What one [`Relay::run_once`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Batch {
    /// Messages taken: the heads of as many keys, each its key's oldest unsent message.
    pub taken: usize,
    /// Published (the broker confirmed) and marked sent.
    pub published: usize,
    /// Publishes that failed: recorded in the row (`attempts`, `last_error`), to be tried again.
    pub failed: usize,
    /// Taken but not tried: the broker was unreachable (given back as they were), or, on SQLite, the
    /// batch's lease ended and another relay took them.
    pub left: usize,
    /// Sent rows deleted, past [`Relay::keep_sent`].
    pub purged: u64,
    /// Whether a publish found the broker unreachable ([`PublishError::Unavailable`]): the batch
    /// stopped there, and [`Relay::run`] backs off.
    pub broker_down: bool,
}

/// Publishes the messages an [`Outbox`] staged, through any [`Publish`]er (which returns once the
/// broker confirmed), **in order per ordering key**, and marks them sent. See the
/// [module documentation](super) for the guarantees.
///
/// Each batch takes the heads of up to [`batch_size`](Relay::batch_size) keys — each key's oldest
/// unsent message, none another relay holds — publishes them, oldest first, up to
/// [`concurrency`](Relay::concurrency) at once, and marks each sent once confirmed. A key's next message is taken by a later batch, after this one was marked:
///
/// | publish of a key's head | the row | the key's later messages |
/// |---|---|---|
/// | confirmed | marked sent (deleted after `keep_sent`) | the next is the key's head |
/// | [`Unavailable`](PublishError::Unavailable) (no broker) | `attempts` + 1, `last_error`; due again at once | wait; the batch starts no further publishes, the relay backs off |
/// | [`Refused`](PublishError::Refused), [`Unconfirmed`](PublishError::Unconfirmed) | `attempts` + 1, `last_error`; due again after [`retry_backoff`](Relay::retry_backoff) | wait |
/// | the relay dies before the mark | unsent: published again under the same id | wait |
///
/// On PostgreSQL a batch is one transaction: its heads are locked `FOR UPDATE SKIP LOCKED`, published,
/// marked, and committed together, so a relay that dies anywhere in it leaves its heads unsent (the
/// ones it published are published again, under their ids) and other relays skip them meanwhile.
/// On SQLite a batch takes its heads under a lease ([`lease`](Relay::lease)) in one
/// `UPDATE … RETURNING`, and marks each in a statement of its own; the heads of a relay that died
/// are taken again once the lease ended, by the database's clock. The lease is renewed before each
/// group of [`concurrency`](Relay::concurrency) publishes, and must outlast one group (it does by
/// default: a 60 s lease, a 30 s [`publish_timeout`](Relay::publish_timeout)), or a head could be
/// published by another relay while its first relay still works.
pub struct Relay<DB: Backend, P: Publish> {
    outbox: Outbox<DB>,
    publisher: P,
    batch_size: u32,
    interval: Duration,
    max_backoff: Duration,
    retry_backoff: (Duration, Duration),
    lease: Duration,
    keep_sent: Duration,
    destinations: String,
    concurrency: usize,
    publish_timeout: Duration,
}

impl<DB: Backend, P: Publish> std::fmt::Debug for Relay<DB, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("outbox", &self.outbox)
            .field("batch_size", &self.batch_size)
            .field("interval", &self.interval)
            .field("max_backoff", &self.max_backoff)
            .field("retry_backoff", &self.retry_backoff)
            .field("lease", &self.lease)
            .field("keep_sent", &self.keep_sent)
            .field("destinations", &self.destinations)
            .field("concurrency", &self.concurrency)
            .field("publish_timeout", &self.publish_timeout)
            .finish_non_exhaustive()
    }
}

impl<DB: Backend, P: Publish> Relay<DB, P> {
    /// A relay of `outbox` through `publisher`: batches of 64 keys' heads, 16 publishes in flight at
    /// once, polled every 200 ms, backing
    /// off up to 30 s while the broker is unreachable, a refused message retried after 1 s doubling
    /// up to 5 min, a 60 s lease (SQLite), sent rows kept 1 h.
    pub fn new(outbox: Outbox<DB>, publisher: P) -> Relay<DB, P> {
        Relay {
            outbox,
            publisher,
            batch_size: 64,
            interval: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            retry_backoff: (Duration::from_secs(1), Duration::from_secs(300)),
            lease: Duration::from_secs(60),
            keep_sent: Duration::from_secs(60 * 60),
            destinations: String::new(),
            concurrency: 16,
            publish_timeout: Duration::from_secs(30),
        }
    }

    /// How long the relay waits for one publish to end (default 30 s, longer than a publisher's own
    /// confirmation timeouts and republishes, [`Confirms`](crate::Confirms)): a publish that has not
    /// ended by then is [`PublishError::Unconfirmed`] — the broker may have the message — and is
    /// tried again later under the same id, so that a publisher that hangs does not hold its
    /// batch's keys for ever.
    pub fn publish_timeout(mut self, timeout: Duration) -> Relay<DB, P> {
        self.publish_timeout = timeout;
        self
    }

    /// How many publishes a batch has in flight at once (default 16; at least 1): each is the head of
    /// another key, so a key's order is kept whatever it is; 1 publishes one message at a time. The
    /// rows are marked in the order of their ids once their publishes ended.
    pub fn concurrency(mut self, n: usize) -> Relay<DB, P> {
        self.concurrency = n.max(1);
        self
    }

    /// How many keys' heads one batch takes (default 64; at least 1). On PostgreSQL, one batch is one
    /// transaction: a relay that dies in it publishes up to that many messages again.
    pub fn batch_size(mut self, n: u32) -> Relay<DB, P> {
        self.batch_size = n.max(1);
        self
    }

    /// How long [`Relay::run`] waits between batches when the last one found less than a full batch
    /// (default 200 ms). A full batch is followed by the next at once.
    pub fn interval(mut self, interval: Duration) -> Relay<DB, P> {
        self.interval = interval;
        self
    }

    /// The longest wait of [`Relay::run`] while the broker or the database is unreachable: the wait
    /// doubles from the interval up to it (default 30 s), and is back to the interval once a
    /// publish is confirmed.
    pub fn max_backoff(mut self, max: Duration) -> Relay<DB, P> {
        self.max_backoff = max;
        self
    }

    /// How long a message the broker refused or did not confirm waits before it is tried again: `base`
    /// after the first failure, doubled for each next, up to `max` (default 1 s to 5 min). Its key's
    /// later messages wait behind it.
    pub fn retry_backoff(mut self, base: Duration, max: Duration) -> Relay<DB, P> {
        self.retry_backoff = (base, max);
        self
    }

    /// On SQLite, how long a batch holds its heads (default 60 s), renewed before each
    /// [`concurrency`](Relay::concurrency) publishes: longer than [`publish_timeout`](Relay::publish_timeout).
    /// A relay that dies leaves its heads to the others when it ends. (On PostgreSQL the batch's
    /// transaction holds them: unused.)
    pub fn lease(mut self, lease: Duration) -> Relay<DB, P> {
        self.lease = lease;
        self
    }

    /// Takes only the messages whose destination starts with `prefix` (default: all): the relay of
    /// one broker, where one table stages messages for several (`"orders."` for RabbitMQ's queues,
    /// `"events."` for JetStream's subjects) — a publisher must never be handed another broker's
    /// message, which it could only refuse. Order per key still holds across them: a key whose oldest
    /// unsent message goes elsewhere waits for the other relay to publish it.
    pub fn destinations(mut self, prefix: impl Into<String>) -> Relay<DB, P> {
        self.destinations = prefix.into();
        self
    }

    /// How long a sent row stays in the table, for people to read (default 1 h): the relay deletes
    /// older ones, a bounded number per batch. Zero deletes a row when it is marked sent.
    pub fn keep_sent(mut self, keep: Duration) -> Relay<DB, P> {
        self.keep_sent = keep;
        self
    }

    /// The outbox.
    pub fn outbox(&self) -> &Outbox<DB> {
        &self.outbox
    }

    /// Publishes one batch (see the type's documentation) and says what it did. A publish that fails
    /// is recorded in its row, not returned: `Err` is the database's.
    pub async fn run_once(&self) -> Result<Batch, OutboxError> {
        let pool = self.outbox.pool();
        let lease_ms = millis(self.lease);
        let (mut taking, mut rows) =
            DB::take(pool, self.batch_size, lease_ms, &self.destinations).await?;
        rows.sort_unstable_by_key(|row| row.id);
        let mut batch = Batch {
            taken: rows.len(),
            ..Batch::default()
        };
        // The heads are of distinct keys: publishing several at once keeps each key's order.
        for (n, chunk) in rows.chunks(self.concurrency).enumerate() {
            if batch.broker_down {
                batch.left += chunk.len();
                continue;
            }
            // After the first chunk, hold the next one's rows again (SQLite: the lease renewed),
            // and leave those another relay took meanwhile.
            let chunk: Vec<&Row> = if n == 0 {
                chunk.iter().collect()
            } else {
                let ids: Vec<i64> = chunk.iter().map(|row| row.id).collect();
                let held = DB::hold(&mut taking, pool, &ids, lease_ms).await?;
                batch.left += chunk.len() - held.len();
                chunk.iter().filter(|row| held.contains(&row.id)).collect()
            };
            let outcomes = join_all(chunk.iter().map(|row| self.publish(row))).await;
            let mut sent = Vec::with_capacity(chunk.len());
            for (row, outcome) in chunk.into_iter().zip(outcomes) {
                match outcome {
                    Ok(()) => sent.push(row),
                    Err(failure) => self.failed(&mut taking, row, failure, &mut batch).await?,
                }
            }
            self.sent(&mut taking, &sent, &mut batch).await?;
        }
        DB::finish(taking, pool).await?;
        if !self.keep_sent.is_zero() {
            batch.purged = DB::purge(pool, millis(self.keep_sent), 1_000).await?;
        }
        Ok(batch)
    }

    /// Publishes a taken row, within [`publish_timeout`](Relay::publish_timeout).
    async fn publish(&self, row: &Row) -> Result<(), Failure> {
        let message = row
            .message
            .as_ref()
            .map_err(|reason| Failure::Unreadable(reason.clone()))?;
        match tokio::time::timeout(self.publish_timeout, self.publisher.publish(message)).await {
            Ok(published) => published.map_err(Failure::Publish),
            Err(_) => Err(Failure::Publish(PublishError::Unconfirmed {
                id: message.id.clone(),
                reason: format!(
                    "no answer from the publisher within {:?}",
                    self.publish_timeout
                ),
            })),
        }
    }

    /// Marks the rows the broker confirmed sent, in one statement.
    async fn sent(
        &self,
        taking: &mut DB::Taking,
        rows: &[&Row],
        batch: &mut Batch,
    ) -> Result<(), OutboxError> {
        if rows.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
        DB::mark_sent(taking, self.outbox.pool(), &ids, self.keep_sent.is_zero()).await?;
        batch.published += rows.len();
        for row in rows {
            let id = row.message.as_ref().map(|m| m.id.as_str()).unwrap_or("?");
            tracing::debug!(target: "samekey", id, ordering_key = %row.ordering_key,
                attempts = row.attempts + 1, "samekey: outbox message published");
        }
        Ok(())
    }

    /// Records a row's failed publish (and when it is due again).
    async fn failed(
        &self,
        taking: &mut DB::Taking,
        row: &Row,
        failure: Failure,
        batch: &mut Batch,
    ) -> Result<(), OutboxError> {
        let pool = self.outbox.pool();
        let id = row.message.as_ref().map(|m| m.id.as_str()).unwrap_or("?");
        let retry = match failure {
            Failure::Publish(PublishError::Unavailable(_)) => {
                batch.broker_down = true;
                0
            }
            _ => self.retry_ms(row.attempts),
        };
        let error = failure.to_string();
        DB::mark_failed(taking, pool, row.id, &error, retry).await?;
        batch.failed += 1;
        tracing::warn!(target: "samekey", id, row = row.id, ordering_key = %row.ordering_key,
            attempts = row.attempts + 1, retry_in_ms = retry, %error,
            "samekey: outbox message not published; its key waits");
        Ok(())
    }

    /// Publishes batches until `shutdown` completes: the next batch at once after a full one, after
    /// [`interval`](Relay::interval) otherwise, and after a wait that doubles up to
    /// [`max_backoff`](Relay::max_backoff) while the broker or the database is unreachable (a
    /// database error is logged, and the relay goes on). A batch under way when `shutdown` completes
    /// is finished first.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut wait = self.interval;
        loop {
            let next = match self.run_once().await {
                Ok(batch) if batch.broker_down => {
                    wait = wait
                        .saturating_mul(2)
                        .min(self.max_backoff)
                        .max(self.interval);
                    wait
                }
                Ok(batch) => {
                    wait = self.interval;
                    if batch.taken >= self.batch_size as usize {
                        Duration::ZERO
                    } else {
                        self.interval
                    }
                }
                Err(error) => {
                    wait = wait
                        .saturating_mul(2)
                        .min(self.max_backoff)
                        .max(self.interval);
                    tracing::warn!(target: "samekey", %error, retry_in_ms = millis(wait),
                        "samekey: the outbox relay cannot reach its database");
                    wait
                }
            };
            if tokio::time::timeout(next, shutdown.as_mut()).await.is_ok() {
                tracing::debug!(target: "samekey", "samekey: the outbox relay stops");
                return;
            }
        }
    }

    /// The wait before a message that failed `attempts` times before this failure is due again.
    fn retry_ms(&self, attempts: i64) -> u64 {
        let (base, max) = self.retry_backoff;
        let doublings = u32::try_from(attempts.clamp(0, 30)).unwrap_or(30);
        millis(base.saturating_mul(1u32 << doublings).min(max))
    }
}

/// Why a taken row was not published.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// The publisher's error.
    #[error(transparent)]
    Publish(PublishError),
    /// The row does not decode.
    #[error("the row cannot be read: {0}")]
    Unreadable(String),
}

/// Runs `futures` at once, and answers their outputs in their order.
async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if let Some(f) = future {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(out) => {
                        *output = Some(out);
                        *future = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// A duration in ms, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
