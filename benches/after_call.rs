//! After the call: how fast the compensation worker settles queued `UNKNOWN` calls, and how fast a
//! day of receipts reconciles, per backend, in one run:
//!
//! ```text
//! cargo bench --bench after_call                                        # memory
//! eval "$(scripts/services start)"
//! cargo bench --bench after_call --features sqlite,postgres,redis       # every backend
//! ```
//!
//! * `compensation/<store>` — one entry: the worker takes it (in batches of 100), reads the receipt,
//!   takes the key over, asks the lookup (answers at once), records `SUCCESS`, removes the entry.
//! * `reconcile/<store>` — one counterparty record and one receipt of a day of 10⁴ (looked up by
//!   callId, a thousand at once, then walked in pages of 1 000); `reconcile/<store>/by_reference`,
//!   the same day matched by business reference (one read of the store per record).
//! * `journal/<store>` — the journal of one call retried once: its two writes (before the backoff's
//!   sleep, with the outcome), five events. The happy path writes none.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use samekey::journal::AttemptOutcome;
use samekey::reconcile::{Reconciler, RemoteOutcome, RemoteRecord};
use samekey::store::{Claim, Claimed, Completion, ReceiptQuery};
use samekey::{
    compensation::CompensationEntry, compensation::CompensationOperation, journal::Event,
    journal::EventKind, CallId, Compensator, Key, ReceiptState, RemoteStatus, Runtime, Store,
};

async fn stores() -> Vec<(&'static str, Arc<dyn Store>)> {
    // Pushed to by the backends this build has features for.
    #[allow(unused_mut)]
    let mut all: Vec<(&'static str, Arc<dyn Store>)> =
        vec![("memory", Arc::new(samekey::MemoryStore::new()))];
    #[cfg(feature = "sqlite")]
    {
        let dir = std::env::temp_dir().join(format!(
            "samekey-bench-after-{:x}",
            samekey::TraceId::new().as_u128()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let store = samekey::store::SqliteStore::open(dir.join("b.db"))
            .await
            .expect("open SQLite");
        all.push(("sqlite", Arc::new(store)));
    }
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("SAMEKEY_PG_URL") {
        let store = samekey::store::PgStore::connect(&url)
            .await
            .expect("connect to PostgreSQL");
        all.push(("postgres", Arc::new(store)));
    }
    #[cfg(feature = "redis")]
    if let Ok(url) = std::env::var("SAMEKEY_REDIS_URL") {
        let prefix = format!("bench-after-{:x}", samekey::TraceId::new().as_u128());
        let store = samekey::store::RedisStore::connect_with_prefix(&url, &prefix)
            .await
            .expect("connect to Redis");
        all.push(("redis", Arc::new(store)));
    }
    all
}

/// A new call claiming a key of its own in `scope`, as a caller would: its callId, key, fence, time.
async fn claimed(rt: &Runtime, scope: &str) -> (CallId, Key, samekey::receipt::Fence, u64) {
    let call_id = CallId::new("pay", "bench").expect("callId");
    let key = Key::build(scope, &call_id.to_string());
    let now = rt.now_ms();
    let claim = Claim {
        key: key.clone(),
        call_id: call_id.clone(),
        fingerprint: None,
        lease_ms: 60_000,
        now_ms: now,
    };
    let Ok(Claimed::Acquired(fence)) = rt.store().claim(claim).await else {
        panic!("a fresh key is claimed")
    };
    (call_id, key, fence, now)
}

/// Leaves `n` calls as a failed caller leaves them: claimed, marked `UNKNOWN`, queued.
async fn unknown_calls(rt: &Runtime, scope: &str, n: u64) {
    let store = rt.store();
    for _ in 0..n {
        let (call_id, key, fence, now) = claimed(rt, scope).await;
        store.mark_unknown(&key, fence, now).await.expect("mark");
        let entry = CompensationEntry::new(call_id, key, "bench", now);
        store.enqueue_compensation(entry).await.expect("enqueue");
    }
}

fn compensation(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let stores = tokio.block_on(stores());
    let mut group = c.benchmark_group("compensation");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    for (name, store) in &stores {
        let rt = Runtime::builder()
            .node("bench")
            .shared_store(store.clone())
            .build()
            .expect("runtime");
        let scope = format!("bench.compensation.{name}");
        let worker = Compensator::new(&rt).operation(
            scope.clone(),
            CompensationOperation::new(|_call: CallId| async {
                Ok::<_, String>(RemoteStatus::<u64, String>::Succeeded(500))
            }),
        );
        group.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                tokio.block_on(async {
                    unknown_calls(&rt, &scope, iters).await;
                    let started = Instant::now();
                    let mut settled = 0u64;
                    while settled < iters {
                        let pass = worker.run_once().await.expect("pass");
                        settled += pass.succeeded as u64;
                        if pass.taken == 0 {
                            break;
                        }
                    }
                    started.elapsed()
                })
            })
        });
    }
    group.finish();
}

const DAY: u64 = 10_000;

fn reconcile(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let stores = tokio.block_on(stores());
    let mut group = c.benchmark_group("reconcile");
    group.throughput(Throughput::Elements(DAY));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    for (name, store) in &stores {
        let rt = Runtime::builder()
            .node("bench")
            .shared_store(store.clone())
            .build()
            .expect("runtime");
        let scope = format!(
            "bench.reconcile.{name}.{:x}",
            samekey::TraceId::new().as_u128()
        );
        let (since, remote) = tokio.block_on(async {
            let since = store.now_ms(rt.now_ms()).await.expect("time");
            let mut remote = Vec::with_capacity(DAY as usize);
            for _ in 0..DAY {
                let (call_id, key, fence, now) = claimed(&rt, &scope).await;
                let done = Completion {
                    state: ReceiptState::Success,
                    outcome: Some(Arc::from(&b"500"[..])),
                    ttl_ms: 86_400_000,
                };
                store
                    .complete(&key, fence, done, now)
                    .await
                    .expect("complete");
                remote.push(RemoteRecord {
                    call_id: Some(call_id),
                    reference: None,
                    outcome: RemoteOutcome::Succeeded,
                    amount: Some(500),
                });
            }
            (since, remote)
        });
        let query = ReceiptQuery::created_between(since.saturating_sub(1_000), since + 86_400_000)
            .scope(scope.clone());
        group.bench_function(*name, |b| {
            b.iter(|| {
                tokio.block_on(async {
                    let report = Reconciler::new(&rt, query.clone())
                        .run(remote.iter().cloned().map(Ok))
                        .await
                        .expect("reconcile");
                    assert!(report.is_clean(), "{report:?}");
                })
            })
        });
        // The same records as a counterparty without callIds sends them: by the reference this
        // bench's keys are made of.
        let by_reference: Vec<RemoteRecord> = remote
            .iter()
            .map(|r| RemoteRecord {
                call_id: None,
                reference: r.call_id.as_ref().map(ToString::to_string),
                ..r.clone()
            })
            .collect();
        group.bench_function(format!("{name}/by_reference"), |b| {
            b.iter(|| {
                tokio.block_on(async {
                    let scope = scope.clone();
                    let report = Reconciler::new(&rt, query.clone())
                        .by_reference(move |reference| Some(Key::build(&scope, reference)))
                        .run(by_reference.iter().cloned().map(Ok))
                        .await
                        .expect("reconcile");
                    assert!(report.is_clean(), "{report:?}");
                })
            })
        });
    }
    group.finish();
}

/// What a call retried once writes to its journal, in the two writes it makes: before its backoff's
/// sleep (the claim, the failed attempt, the backoff) and with its outcome (the attempt that
/// succeeded, the recording).
fn retried_call_events(call_id: &CallId, now: u64) -> [Vec<Event>; 2] {
    let event = |what| Event {
        call_id: call_id.clone(),
        at_ms: now,
        node: "bench".into(),
        what,
    };
    let attempt = |n, outcome, error: Option<&str>| EventKind::Attempt {
        attempt: n,
        started_ms: now,
        outcome,
        error: error.map(str::to_owned),
    };
    [
        vec![
            event(EventKind::Claimed { fence: 1 }),
            event(attempt(
                1,
                AttemptOutcome::Retryable,
                Some("gateway unavailable (503)"),
            )),
            event(EventKind::Backoff {
                attempt: 1,
                delay_ms: 200,
            }),
        ],
        vec![
            event(attempt(2, AttemptOutcome::Ok, None)),
            event(EventKind::Recorded {
                state: ReceiptState::Success,
                by: "call".into(),
            }),
        ],
    ]
}

fn journal(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let stores = tokio.block_on(stores());
    let mut group = c.benchmark_group("journal");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    for (name, store) in &stores {
        let rt = Runtime::builder()
            .node("bench")
            .shared_store(store.clone())
            .build()
            .expect("runtime");
        let scope = format!("bench.journal.{name}");
        group.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                tokio.block_on(async {
                    let mut calls = Vec::new();
                    for _ in 0..iters {
                        let (call_id, key, fence, now) = claimed(&rt, &scope).await;
                        calls.push((key, retried_call_events(&call_id, now), now, fence));
                    }
                    let started = Instant::now();
                    for (key, writes, now, _) in &calls {
                        for events in writes {
                            store
                                .append_journal(key, events, 86_400_000, *now)
                                .await
                                .expect("append");
                        }
                    }
                    let took = started.elapsed();
                    // Settled, so that no claim is left for an orphan sweep to find.
                    for (key, _, now, fence) in calls {
                        let done = Completion {
                            state: ReceiptState::Success,
                            outcome: None,
                            ttl_ms: 60_000,
                        };
                        store
                            .complete(&key, fence, done, now)
                            .await
                            .expect("complete");
                    }
                    took
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, compensation, reconcile, journal);
criterion_main!(benches);
