//! The cost of `#[idempotent]` on the in-memory store, side by side with a bare `async fn` and with a
//! bare retry wrapper from backon, in one run:
//!
//! ```text
//! cargo bench --bench call
//! ```
//!
//! * `bare` — the function alone;
//! * `backon_retry` — the same function through `backon::Retryable` (no key, no store: the floor of any
//!   retry wrapper);
//! * `idempotent_first_call` — a new key each iteration: key hash, callId, claim, one attempt, encode,
//!   complete;
//! * `idempotent_replay` — the same key each iteration: key hash, callId, claim finds the record, decode.

use std::hint::black_box;
use std::time::Instant;

use backon::{ExponentialBuilder, Retryable};
use criterion::{criterion_group, criterion_main, Criterion};
use samekey::{idempotent, Classify, ErrorClass, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum BenchError {
    Samekey(samekey::Error),
}

impl Classify for BenchError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}

impl From<samekey::Error> for BenchError {
    fn from(e: samekey::Error) -> BenchError {
        BenchError::Samekey(e)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Charge {
    order_id: u64,
    amount: u64,
}

#[inline(never)]
async fn bare(order_id: u64, amount: u64) -> Result<Charge, BenchError> {
    Ok(black_box(Charge { order_id, amount }))
}

struct Service {
    samekey: Runtime,
}

impl Service {
    #[idempotent(key = "order_id", runtime = &self.samekey)]
    async fn charge(&self, order_id: u64, amount: u64) -> Result<Charge, BenchError> {
        bare(order_id, amount).await
    }
}

fn calls(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    let service = Service {
        samekey: Runtime::new(),
    };
    rt.block_on(service.charge(7, 500))
        .expect("prime the replay key");

    let mut group = c.benchmark_group("call");
    group.bench_function("bare", |b| {
        b.to_async(&rt)
            .iter(|| async { bare(black_box(7), black_box(500)).await })
    });
    group.bench_function("backon_retry", |b| {
        b.to_async(&rt).iter(|| async {
            (|| bare(black_box(7), black_box(500)))
                .retry(ExponentialBuilder::default())
                .await
        })
    });
    // A new key each iteration, into a store that starts empty for each sample and grows through it
    // (new records, new table space, up to ~10^5 keys): dropping the store is not timed.
    group.bench_function("idempotent_first_call", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let fresh = Service {
                samekey: Runtime::new(),
            };
            let start = Instant::now();
            for order_id in 0..iters {
                let _ = black_box(fresh.charge(black_box(order_id), black_box(500)).await);
            }
            let elapsed = start.elapsed();
            drop(fresh);
            elapsed
        })
    });
    // The same, without a retry budget: what a fresh call's two deposits (retries, lookups) cost.
    group.bench_function("idempotent_first_call_unbudgeted", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let fresh = Service {
                samekey: Runtime::builder()
                    .retry_budget(samekey::RetryBudget::unlimited())
                    .lookup_budget(samekey::RetryBudget::unlimited())
                    .build()
                    .expect("runtime"),
            };
            let start = Instant::now();
            for order_id in 0..iters {
                let _ = black_box(fresh.charge(black_box(order_id), black_box(500)).await);
            }
            let elapsed = start.elapsed();
            drop(fresh);
            elapsed
        })
    });
    group.bench_function("idempotent_replay", |b| {
        b.to_async(&rt)
            .iter(|| async { service.charge(black_box(7), black_box(500)).await })
    });
    group.finish();
}

criterion_group!(benches, calls);
criterion_main!(benches);
