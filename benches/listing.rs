//! Listing receipts by time at 10⁴ and at 10⁶ receipts, per backend, in one run: a page of 1 000 from the
//! middle of the day (the page a reconciliation or `samekey ls` reads), and the same page of one scope.
//! An index by creation time keeps a page's cost flat as the store grows.
//!
//! ```text
//! cargo bench --bench listing                                           # memory
//! eval "$(scripts/services start)"
//! cargo bench --bench listing --features sqlite,postgres,redis          # every backend
//! ```
//!
//! The receipts are written as a service writes them (claims and completions) on the memory store
//! and on Redis, and in bulk (one `INSERT … SELECT` of rows in the stores' own format) on SQLite and
//! PostgreSQL, whose claims are bound by the disk's flushes; the bench removes its rows at the end.

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use samekey::store::{Claim, Claimed, Completion, Cursor, ReceiptQuery};
use samekey::{CallId, Key, ReceiptState, Store};

const SMALL: u64 = 10_000;
const LARGE: u64 = 1_000_000;
const PAGE: usize = 1_000;
const SCOPES: u64 = 4;

/// One backend under test: how to add receipts `from..to` of the bench's day to it.
#[allow(clippy::large_enum_variant)]
enum Backend {
    /// Written through the store's own claims and completions.
    Calls,
    #[cfg(feature = "sqlite")]
    Sqlite(samekey::sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(samekey::sqlx::PgPool),
}

fn scope(i: u64) -> String {
    format!("bench.list.s{}", i % SCOPES)
}

fn state(i: u64) -> ReceiptState {
    match i % 20 {
        0 => ReceiptState::Failed,
        1 => ReceiptState::Unknown,
        _ => ReceiptState::Success,
    }
}

/// Writes receipts `from..to` through the store, 64 at a time; the time is the caller's (memory),
/// or the server's (Redis): `day_start + i` ms on the memory store.
async fn through_calls(store: &Arc<dyn Store>, day_start: u64, from: u64, to: u64) {
    let mut set = tokio::task::JoinSet::new();
    for chunk in (from..to)
        .collect::<Vec<_>>()
        .chunks(((to - from) / 64).max(1) as usize)
    {
        let chunk = chunk.to_vec();
        let store = store.clone();
        set.spawn(async move {
            for i in chunk {
                let key = Key::build(&scope(i), &("receipt", i));
                let call_id = CallId::new("lst", "n1").expect("callId");
                let now = day_start + i;
                let claim = Claim {
                    key: key.clone(),
                    call_id,
                    fingerprint: None,
                    lease_ms: 60_000,
                    now_ms: now,
                };
                let Ok(Claimed::Acquired(fence)) = store.claim(claim).await else {
                    panic!("a fresh key");
                };
                if state(i) == ReceiptState::Unknown {
                    store.mark_unknown(&key, fence, now).await.expect("unknown");
                } else {
                    let done = Completion {
                        state: state(i),
                        outcome: Some(Arc::from(&b"1"[..])),
                        ttl_ms: 3 * 86_400_000,
                    };
                    store
                        .complete(&key, fence, done, now)
                        .await
                        .expect("complete");
                }
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("writer");
    }
}

impl Backend {
    async fn add(&self, store: &Arc<dyn Store>, day_start: u64, from: u64, to: u64) {
        match self {
            Backend::Calls => through_calls(store, day_start, from, to).await,
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(pool) => {
                // A recursive CTE counts `from..to`; digests are random, call ids made of `i`.
                samekey::sqlx::query(
                    "WITH RECURSIVE n(i) AS (SELECT $1 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < $2)
INSERT INTO samekey_receipts
    (key, scope, call_id, state, fence, lease_until, expires_at, fingerprint, outcome, created, updated)
SELECT randomblob(32), 'bench.list.s' || (i % 4), printf('lst-%d-%016x-n1', $3 + i, i),
    CASE i % 20 WHEN 0 THEN 'FAILED' WHEN 1 THEN 'UNKNOWN' ELSE 'SUCCESS' END, 1, NULL,
    CASE i % 20 WHEN 1 THEN NULL ELSE $3 + i + 259200000 END, NULL, x'31', $3 + i, $3 + i
FROM n",
                )
                .bind(i64::try_from(from).expect("fits"))
                .bind(i64::try_from(to).expect("fits"))
                .bind(i64::try_from(day_start).expect("fits"))
                .execute(pool)
                .await
                .expect("bulk insert");
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(pool) => {
                samekey::sqlx::query(
                    "INSERT INTO samekey_receipts
    (key, scope, call_id, state, fence, lease_until, expires_at, fingerprint, outcome, created, updated)
SELECT sha256(('bench.list.' || $3 || '.' || i)::bytea), 'bench.list.s' || (i % 4),
    'lst-' || ($3 + i) || '-' || lpad(to_hex(i), 16, '0') || '-n1',
    CASE i % 20 WHEN 0 THEN 'FAILED' WHEN 1 THEN 'UNKNOWN' ELSE 'SUCCESS' END, 1, NULL,
    CASE i % 20 WHEN 1 THEN NULL ELSE samekey_ts($3 + i + 259200000) END, NULL, '\\x31',
    samekey_ts($3 + i), samekey_ts($3 + i)
FROM generate_series($1, $2 - 1) AS i",
                )
                .bind(i64::try_from(from).expect("fits"))
                .bind(i64::try_from(to).expect("fits"))
                .bind(i64::try_from(day_start).expect("fits"))
                .execute(pool)
                .await
                .expect("bulk insert");
            }
        }
    }

    async fn clean(&self) {
        match self {
            Backend::Calls => {}
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => {}
            #[cfg(feature = "postgres")]
            Backend::Postgres(pool) => {
                samekey::sqlx::query(
                    "DELETE FROM samekey_receipts WHERE scope LIKE 'bench.list.%'",
                )
                .execute(pool)
                .await
                .expect("clean");
            }
        }
    }
}

async fn backends() -> Vec<(&'static str, Arc<dyn Store>, Backend)> {
    // Pushed to by the backends this build has features for.
    #[allow(unused_mut)]
    let mut all: Vec<(&'static str, Arc<dyn Store>, Backend)> = vec![(
        "memory",
        Arc::new(samekey::MemoryStore::new()),
        Backend::Calls,
    )];
    #[cfg(feature = "sqlite")]
    {
        let dir = std::env::temp_dir().join(format!(
            "samekey-bench-list-{:x}",
            samekey::TraceId::new().as_u128()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let store = samekey::store::SqliteStore::open(dir.join("b.db"))
            .await
            .expect("open SQLite");
        let pool = store.pool().clone();
        all.push(("sqlite", Arc::new(store), Backend::Sqlite(pool)));
    }
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("SAMEKEY_PG_URL") {
        let store = samekey::store::PgStore::connect(&url)
            .await
            .expect("connect to PostgreSQL");
        let pool = store.pool().clone();
        let backend = Backend::Postgres(pool);
        backend.clean().await;
        all.push(("postgres", Arc::new(store), backend));
    }
    #[cfg(feature = "redis")]
    if let Ok(url) = std::env::var("SAMEKEY_REDIS_URL") {
        let prefix = format!("bench-list-{:x}", samekey::TraceId::new().as_u128());
        let store = samekey::store::RedisStore::connect_with_prefix(&url, &prefix)
            .await
            .expect("connect to Redis");
        all.push(("redis", Arc::new(store), Backend::Calls));
    }
    all
}

/// The cursor at the middle of what `query` lists (walked once, untimed).
async fn middle(store: &dyn Store, query: &ReceiptQuery, now: u64, pages: usize) -> Option<Cursor> {
    let mut at = None;
    for _ in 0..pages / 2 {
        let mut q = query.clone();
        q.after = at;
        at = store.list_receipts(&q, now).await.expect("list").next;
    }
    at
}

fn listing(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("tokio");
    let backends = rt.block_on(backends());
    let mut group = c.benchmark_group("listing");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(PAGE as u64));
    for (name, store, backend) in &backends {
        // The day: the last 24 h by the store's clock, so that the receipts are live where the
        // server judges expiry.
        let now = rt.block_on(store.now_ms(1_800_000_000_000)).expect("now");
        let day_start = now - 86_400_000;
        let mut held = 0;
        for size in [SMALL, LARGE] {
            rt.block_on(backend.add(store, day_start, held, size));
            held = size;
            let until = rt.block_on(store.now_ms(now)).expect("now") + 86_400_000;
            let day = ReceiptQuery::created_between(day_start, until).limit(PAGE);
            let one_scope = day.clone().scope(scope(1));
            let pages = usize::try_from(size).expect("fits") / PAGE;
            for (what, query) in [("day", day), ("scope", one_scope)] {
                let at = rt.block_on(middle(&**store, &query, now, pages));
                let mut query = query;
                query.after = at;
                let label = format!("{what}/{name}/{size}");
                group.bench_function(label, |b| {
                    b.to_async(&rt).iter(|| async {
                        let page = store.list_receipts(&query, now).await.expect("list");
                        assert!(!page.receipts.is_empty());
                    });
                });
            }
        }
        rt.block_on(backend.clean());
    }
    group.finish();
}

criterion_group!(benches, listing);
criterion_main!(benches);
