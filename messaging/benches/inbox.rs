//! The inbox's added cost per message, side by side in one run: a bare consumer's work on a delivery
//! (read the envelope, run the handler) against `Inbox::handle` on the same deliveries — a fresh
//! message (claim, run, record) and a redelivery (one read, the handler does not run) — on a bounded
//! memory store at steady state and, with `SAMEKEY_PG_URL`, on PostgreSQL.
//!
//! ```text
//! cargo bench -p samekey-messaging --bench inbox                       # memory store
//! eval "$(scripts/services start)"
//! cargo bench -p samekey-messaging --bench inbox --features postgres   # and PostgreSQL
//! ```
//!
//! One current-thread tokio runtime; each iteration is one delivery.

use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{criterion_group, criterion_main, Criterion};
use samekey::store::MemoryStore;
use samekey::{Classify, ErrorClass, Runtime};
use samekey_messaging::{Delivery, Disposition, Envelope, Inbox, Message};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Charged {
    order_id: String,
    amount_cents: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ShipError(#[from] samekey::Error);

impl Classify for ShipError {
    fn classify(&self) -> ErrorClass {
        self.0.classify()
    }
}

/// The handler: what a shipping consumer does with a message, minus its own I/O.
async fn ship(charged: Charged) -> Result<String, ShipError> {
    Ok(format!("parcel for {}", charged.order_id))
}

/// Message `n` of a run: a string order id, as a service's messages are.
fn message(run: u64, n: u64) -> Message {
    Envelope::new(Charged {
        order_id: format!("order-{run}-{n}"),
        amount_cents: 1250,
    })
    .to_message("orders.charged")
    .expect("a JSON body")
}

fn bench_on(c: &mut Criterion, group: &str, tokio: &tokio::runtime::Runtime, rt: &Runtime) {
    let inbox = Inbox::new("bench.shipping").runtime(rt);
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let mut g = c.benchmark_group(group);
    let next = AtomicU64::new(0);
    g.bench_function("bare consumer", |b| {
        b.to_async(tokio).iter(|| async {
            let message = message(run, next.fetch_add(1, Ordering::Relaxed));
            let envelope: Envelope<Charged> =
                serde_json::from_slice(&message.body).expect("an envelope");
            ship(envelope.payload).await.expect("shipped")
        })
    });
    g.bench_function("inbox, fresh message", |b| {
        b.to_async(tokio).iter(|| async {
            let message = message(run, next.fetch_add(1, Ordering::Relaxed));
            let delivery = Delivery::new(&message.body, &message.headers);
            let handled = inbox.handle(&delivery, ship).await;
            assert_eq!(handled.disposition(), Disposition::Ack);
        })
    });
    let again = message(run, u64::MAX);
    tokio.block_on(async {
        let delivery = Delivery::new(&again.body, &again.headers);
        inbox.handle(&delivery, ship).await;
    });
    g.bench_function("inbox, redelivery", |b| {
        b.to_async(tokio).iter(|| async {
            let delivery = Delivery {
                redelivered: true,
                ..Delivery::new(&again.body, &again.headers)
            };
            let handled = inbox.handle(&delivery, ship).await;
            assert_eq!(handled.disposition(), Disposition::Ack);
        })
    });
    g.finish();
}

fn inbox(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // A bounded store, filled past its capacity first: the state a long-running consumer lives in.
    let memory = Runtime::builder()
        .node("bench")
        .store(MemoryStore::with_capacity(100_000))
        .build()
        .expect("a runtime");
    tokio.block_on(async {
        let inbox = Inbox::new("bench.fill").runtime(&memory);
        for n in 0..120_000 {
            let message = message(0, n);
            inbox
                .handle(&Delivery::new(&message.body, &message.headers), ship)
                .await;
        }
    });
    bench_on(c, "inbox/memory", &tokio, &memory);

    #[cfg(feature = "postgres")]
    match std::env::var("SAMEKEY_PG_URL") {
        Ok(url) => {
            let pg = tokio.block_on(async {
                let store = samekey::store::PgStore::connect(&url)
                    .await
                    .expect("PostgreSQL");
                Runtime::builder()
                    .node("bench")
                    .store(store)
                    .build()
                    .expect("a runtime")
            });
            bench_on(c, "inbox/postgres", &tokio, &pg);
        }
        Err(_) => eprintln!("skipped: inbox/postgres: set SAMEKEY_PG_URL"),
    }
    #[cfg(not(feature = "postgres"))]
    eprintln!("skipped: inbox/postgres: run with --features postgres and SAMEKEY_PG_URL");
}

criterion_group!(benches, inbox);
criterion_main!(benches);
