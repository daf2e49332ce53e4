//! The outbox relay's throughput beside a bare publisher, in one run: 256 messages (256 ordering keys)
//! moved from `samekey_outbox` on PostgreSQL to a RabbitMQ queue by `Relay::run_once` (take the keys'
//! heads `FOR UPDATE SKIP LOCKED`, publish with confirms, 16 at a time, mark sent, commit), against
//! the same 256 messages published straight by `AmqpPublisher`, 16 at a time, each confirmed. The
//! staging is not timed (it is the business transaction's part).
//!
//! ```text
//! eval "$(scripts/services start)"
//! cargo bench -p samekey-messaging --bench relay --features postgres,rabbitmq
//! ```

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

#[cfg(all(feature = "postgres", feature = "rabbitmq"))]
mod on_servers {
    use super::*;
    use samekey::sqlx::{self, PgPool};
    use samekey_messaging::amqp::{declare_queue, AmqpPublisher, QueueType};
    use samekey_messaging::outbox::{PgOutbox, Relay};
    use samekey_messaging::{Envelope, Message, Publish};

    const MESSAGES: u64 = 256;
    const AT_ONCE: usize = 16;

    fn message(queue: &str, run: u64, n: u64) -> Message {
        Envelope::new(format!("order-{run}-{n}"))
            .to_message(queue)
            .expect("a JSON body")
    }

    async fn stage(outbox: &PgOutbox, queue: &str, run: u64) {
        let mut tx = outbox.pool().begin().await.expect("a transaction");
        for n in 0..MESSAGES {
            let message = message(queue, run, n);
            outbox
                .stage(&mut tx, &format!("order-{run}-{n}"), &message)
                .await
                .expect("staged");
        }
        tx.commit().await.expect("committed");
    }

    async fn purge(pool: &PgPool, queue: &str, publisher: &AmqpPublisher) {
        let _ = sqlx::query("DELETE FROM samekey_outbox WHERE sent IS NOT NULL")
            .execute(pool)
            .await;
        if let Ok(channel) = publisher.channel().await {
            let _ = channel.queue_purge(queue.into(), Default::default()).await;
        }
    }

    pub fn relay(c: &mut Criterion, pg_url: &str, amqp_url: &str) {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let queue = format!("bench.relay.{}", std::process::id());
        let (outbox, publisher) = tokio.block_on(async {
            let pool = PgPool::connect(pg_url).await.expect("PostgreSQL");
            let outbox = PgOutbox::from_pool(pool);
            outbox.migrate().await.expect("the outbox's table");
            let publisher = AmqpPublisher::new(amqp_url);
            let channel = publisher.channel().await.expect("RabbitMQ");
            declare_queue(&channel, &queue, QueueType::Classic)
                .await
                .expect("the queue");
            (outbox, publisher)
        });
        let relay = Relay::new(outbox.clone(), AmqpPublisher::new(amqp_url))
            .batch_size(u32::try_from(MESSAGES).unwrap_or(u32::MAX))
            .concurrency(AT_ONCE)
            .keep_sent(Duration::from_secs(3600));
        let mut run = 0u64;
        let mut g = c.benchmark_group("relay/256 messages");
        g.throughput(Throughput::Elements(MESSAGES));
        g.sample_size(20);
        g.bench_function("bare publisher (16 at a time)", |b| {
            b.iter_custom(|iters| {
                tokio.block_on(async {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        run += 1;
                        let messages: Vec<Message> =
                            (0..MESSAGES).map(|n| message(&queue, run, n)).collect();
                        let started = Instant::now();
                        for chunk in messages.chunks(AT_ONCE) {
                            let sends = chunk.iter().map(|m| publisher.publish(m));
                            for sent in futures_util::future::join_all(sends).await {
                                sent.expect("confirmed");
                            }
                        }
                        spent += started.elapsed();
                        purge(outbox.pool(), &queue, &publisher).await;
                    }
                    spent
                })
            })
        });
        g.bench_function("outbox relay (16 at a time)", |b| {
            b.iter_custom(|iters| {
                tokio.block_on(async {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        run += 1;
                        stage(&outbox, &queue, run).await;
                        let started = Instant::now();
                        let mut moved = 0;
                        while moved < MESSAGES {
                            let batch = relay.run_once().await.expect("a batch");
                            moved += u64::try_from(batch.published).unwrap_or(0);
                        }
                        spent += started.elapsed();
                        purge(outbox.pool(), &queue, &publisher).await;
                    }
                    spent
                })
            })
        });
        g.finish();
    }
}

fn relay(c: &mut Criterion) {
    #[cfg(all(feature = "postgres", feature = "rabbitmq"))]
    match (
        std::env::var("SAMEKEY_PG_URL"),
        std::env::var("SAMEKEY_AMQP_URL"),
    ) {
        (Ok(pg), Ok(amqp)) => on_servers::relay(c, &pg, &amqp),
        _ => eprintln!("skipped: relay: set SAMEKEY_PG_URL and SAMEKEY_AMQP_URL"),
    }
    #[cfg(not(all(feature = "postgres", feature = "rabbitmq")))]
    {
        let _ = (c, Duration::ZERO, Instant::now(), Throughput::Elements(0));
        eprintln!("skipped: relay: run with --features postgres,rabbitmq");
    }
}

criterion_group!(benches, relay);
criterion_main!(benches);
