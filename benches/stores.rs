//! The durable backends, side by side in one run with their raw drivers sending the same statements:
//! a fresh call (claim + complete) and a replay, at 1, 16 and 64 concurrent callers; how late a
//! duplicate waiting for a busy key hears the outcome, notified and polled; and a PostgreSQL-backed
//! replay straight, through the Redis front cache, and through the in-process `LocalCache`.
//!
//! ```text
//! eval "$(scripts/services start)"
//! cargo bench --bench stores --features sqlite,postgres,mysql,redis
//! ```
//!
//! Each iteration is one call; the callers run concurrently on a 2-thread tokio runtime, so criterion's
//! time per iteration is the inverse of the throughput (its `elem/s`), and the latency one caller sees
//! is that time multiplied by the number of callers. A backend whose URL is not set is skipped.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use futures_util::StreamExt as _;
use samekey::store::{CachedStore, LocalCache, MySqlStore, PgStore, RedisStore, SqliteStore};
use samekey::{idempotent, Classify, ErrorClass, Runtime, Store};
use samekey::{redis, sqlx};
use serde::{Deserialize, Serialize};

const CALLERS: [u64; 3] = [1, 16, 64];

#[derive(Debug, Serialize, Deserialize)]
struct BenchError;

impl Classify for BenchError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}

impl From<samekey::Error> for BenchError {
    fn from(e: samekey::Error) -> BenchError {
        panic!("store failed during the benchmark: {e}")
    }
}

struct Service {
    rt: Runtime,
}

impl Service {
    fn on(store: Arc<dyn Store>) -> Arc<Service> {
        Arc::new(Service {
            rt: Runtime::builder()
                .shared_store(store)
                .build()
                .expect("runtime"),
        })
    }

    #[idempotent(key = "run + id", scope = "bench.stores", runtime = &self.rt)]
    async fn call(&self, run: u64, id: u64) -> Result<u64, BenchError> {
        Ok(id)
    }
}

/// Runs `iters` calls of `f(caller, n)` spread over `callers` concurrent tasks; the time they took.
async fn concurrently<F, Fut>(iters: u64, callers: u64, f: F) -> Duration
where
    F: Fn(u64, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let per = iters.div_ceil(callers).max(1);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let f = f.clone();
        set.spawn(async move {
            for n in 0..per {
                f(caller, n).await;
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("caller task");
    }
    start
        .elapsed()
        .mul_f64(iters as f64 / (per * callers) as f64)
}

/// A key digest no other run or benchmark uses.
fn digest(run: u64, n: u64) -> [u8; 32] {
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&run.to_le_bytes());
    d[8..16].copy_from_slice(&n.to_le_bytes());
    d[31] = (n % 251) as u8;
    d
}

fn unique_run() -> u64 {
    samekey::TraceId::new().as_u128() as u64
}

/// The statements a fresh call and a replay send, through the raw driver.
#[derive(Clone)]
enum Raw {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
    MySql(sqlx::MySqlPool),
    Redis(redis::aio::ConnectionManager, redis::Script, redis::Script),
}

/// The time every raw statement is sent at (SQLite judges by it; PostgreSQL, MySQL and Redis by their
/// clocks).
const NOW: i64 = 1_700_000_000_000;
/// The lease of a raw claim and the ttl of a raw completion (ms).
const LEASE: i64 = 30_000;
const TTL: i64 = 86_400_000;

impl Raw {
    /// The claim statement or script; the fence when it took the key, `None` when the key is held.
    async fn claim(&self, key: [u8; 32]) -> Option<i64> {
        match self {
            Raw::Sqlite(pool) => {
                let fence: Vec<i64> = sqlx::query_scalar(SqliteStore::CLAIM_SQL)
                    .bind(key.as_slice())
                    .bind("bench.raw")
                    .bind("raw-1-00000000000000ff-n")
                    .bind(NOW << 16)
                    .bind(LEASE)
                    .bind(None::<&[u8]>)
                    .bind(NOW)
                    .fetch_all(pool)
                    .await
                    .expect("claim");
                fence.first().copied()
            }
            Raw::Postgres(pool) => {
                let row = sqlx::query(PgStore::CLAIM_SQL)
                    .bind(key.as_slice())
                    .bind("bench.raw")
                    .bind("raw-1-00000000000000ff-n")
                    .bind(LEASE)
                    .bind(None::<&[u8]>)
                    .bind(NOW)
                    .fetch_one(pool)
                    .await
                    .expect("claim");
                let acquired: bool = sqlx::Row::get(&row, "acquired");
                acquired.then(|| sqlx::Row::get(&row, "fence"))
            }
            Raw::MySql(pool) => {
                // One text batch, as the store sends it: the claim (its OK packet answers whether it
                // took the key, and the fence) and the read of the key's live row.
                let batch = mysql_claim_batch(&key);
                let mut answers =
                    sqlx::raw_sql(sqlx::AssertSqlSafe(batch.as_str())).fetch_many(pool);
                let mut taken = None;
                while let Some(answer) = answers.next().await {
                    if let sqlx::Either::Left(done) = answer.expect("claim") {
                        taken.get_or_insert((done.rows_affected(), done.last_insert_id()));
                    }
                }
                match taken {
                    Some((1 | 2, fence)) if fence > 0 => Some(fence as i64),
                    _ => None,
                }
            }
            Raw::Redis(conn, claim, _) => {
                let answer: Vec<redis::Value> = claim
                    .key(redis_key(&key))
                    .arg("bench.raw")
                    .arg("raw-1-00000000000000ff-n")
                    .arg(LEASE)
                    .arg("")
                    .arg(key.as_slice())
                    .invoke_async(&mut conn.clone())
                    .await
                    .expect("claim");
                let taken: i64 = redis::from_redis_value(answer[0].clone()).expect("code");
                (taken == 1).then(|| {
                    let fence: String = redis::from_redis_value(answer[1].clone()).expect("fence");
                    fence.parse().expect("numeric fence")
                })
            }
        }
    }

    /// Claim + complete on a new key.
    async fn fresh(&self, key: [u8; 32]) {
        let fence = self.claim(key).await.expect("a fresh key is taken");
        match self {
            Raw::Sqlite(pool) => {
                complete(sqlx::query(SqliteStore::COMPLETE_SQL), key, fence)
                    .execute(pool)
                    .await
                    .expect("complete");
            }
            Raw::Postgres(pool) => {
                complete(sqlx::query(PgStore::COMPLETE_SQL), key, fence)
                    .execute(pool)
                    .await
                    .expect("complete");
            }
            Raw::MySql(pool) => {
                complete(sqlx::query(MySqlStore::COMPLETE_SQL), key, fence)
                    .execute(pool)
                    .await
                    .expect("complete");
            }
            Raw::Redis(conn, _, write) => {
                let name = redis_key(&key);
                // The callId index entry goes out with the completion, as the store sends it.
                let mut completion = write.key(&name);
                completion
                    .arg(fence)
                    .arg("RECEIVED PROCESSING UNKNOWN")
                    .arg(86_460_000)
                    .arg(format!("updated:0 expires_at:{TTL}"))
                    .arg("state")
                    .arg("SUCCESS")
                    .arg("outcome")
                    .arg("42")
                    .arg("lease_until")
                    .arg("");
                let mut pipe = redis::pipe();
                pipe.cmd("SET")
                    .arg(format!("bench-raw:c:{{{}}}", hex(&key)))
                    .arg(key.as_slice())
                    .arg("PX")
                    .arg(86_400_000)
                    .ignore()
                    .invoke_script(&completion);
                let _: (redis::Value,) =
                    pipe.query_async(&mut conn.clone()).await.expect("complete");
            }
        }
    }

    /// What a replay sends: the claim of a finished key (and, on SQLite, the read of its row; MySQL's
    /// claim batch reads it).
    async fn replay(&self, key: [u8; 32]) {
        assert!(self.claim(key).await.is_none(), "the key is held");
        if let Raw::Sqlite(pool) = self {
            sqlx::query(SqliteStore::ROW_SQL)
                .bind(key.as_slice())
                .fetch_one(pool)
                .await
                .expect("row");
        }
    }
}

/// A value of MySQL's claim batch, as `MySqlStore` writes it.
enum Literal<'a> {
    Bytes(&'a [u8]),
    Text(&'a str),
    Int(i64),
    Null,
}

/// MySQL's claim batch for `key`: `MySqlStore::CLAIM_SQL` and `MySqlStore::LIVE_ROW_SQL` without
/// their comment lines, each `?` a literal (bytes and strings in hexadecimal, integers in decimal).
fn mysql_claim_batch(key: &[u8; 32]) -> String {
    use std::fmt::Write as _;
    fn fill(out: &mut String, statement: &str, values: &[Literal<'_>]) {
        let mut values = values.iter();
        for line in statement.lines() {
            if line.trim_start().starts_with("--") {
                continue;
            }
            for c in line.chars() {
                if c != '?' {
                    out.push(c);
                    continue;
                }
                let hex = |out: &mut String, bytes: &[u8]| {
                    out.push_str("X'");
                    for b in bytes {
                        let _ = write!(out, "{b:02x}");
                    }
                    out.push('\'');
                };
                match values.next().expect("a value per ?") {
                    Literal::Bytes(bytes) => hex(out, bytes),
                    Literal::Text(text) => {
                        out.push_str("CONVERT(");
                        hex(out, text.as_bytes());
                        out.push_str(" USING utf8mb4)");
                    }
                    Literal::Int(v) => {
                        let _ = write!(out, "{v}");
                    }
                    Literal::Null => out.push_str("NULL"),
                }
            }
            out.push('\n');
        }
    }
    let mut out = String::with_capacity(2_600);
    let claim = [
        Literal::Bytes(key),
        Literal::Text("bench.raw"),
        Literal::Text("raw-1-00000000000000ff-n"),
        Literal::Int(LEASE),
        Literal::Null,
    ];
    fill(&mut out, MySqlStore::CLAIM_SQL, &claim);
    out.push_str(";\n");
    fill(
        &mut out,
        MySqlStore::LIVE_ROW_SQL,
        &[Literal::Bytes(key), Literal::Int(0)],
    );
    out
}

/// The arguments of a completion statement (the same on every SQL backend).
fn complete<'q, DB: sqlx::Database>(
    query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>,
    key: [u8; 32],
    fence: i64,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>
where
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Vec<u8>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    query
        .bind("SUCCESS")
        .bind(b"42".to_vec())
        .bind(TTL)
        .bind(NOW)
        .bind(key.to_vec())
        .bind(fence)
}

fn redis_key(key: &[u8; 32]) -> String {
    format!("bench-raw:r:{{{}}}", hex(key))
}

fn hex(digest: &[u8; 32]) -> String {
    samekey::Key::from_digest("", *digest).to_hex()
}

fn backend(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    name: &str,
    store: Arc<dyn Store>,
    raw: Raw,
) {
    let service = Service::on(store);
    let run = unique_run();
    let next = Arc::new(AtomicU64::new(0));

    let mut group = c.benchmark_group(format!("{name}/fresh"));
    group.throughput(Throughput::Elements(1));
    for callers in CALLERS {
        group.bench_function(BenchmarkId::new("samekey", format!("c{callers}")), |b| {
            b.to_async(rt).iter_custom(|iters| {
                let (service, next) = (service.clone(), next.clone());
                concurrently(iters, callers, move |_, _| {
                    let (service, next) = (service.clone(), next.clone());
                    async move {
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        service.call(run, id).await.expect("call");
                    }
                })
            })
        });
        group.bench_function(BenchmarkId::new("raw", format!("c{callers}")), |b| {
            b.to_async(rt).iter_custom(|iters| {
                let (raw, next) = (raw.clone(), next.clone());
                concurrently(iters, callers, move |_, _| {
                    let (raw, next) = (raw.clone(), next.clone());
                    async move {
                        raw.fresh(digest(run, next.fetch_add(1, Ordering::Relaxed)))
                            .await;
                    }
                })
            })
        });
    }
    group.finish();

    // Replays: each caller replays a finished key of its own (one row per caller, as duplicates of
    // different operations would).
    let replay_run = unique_run();
    rt.block_on(async {
        for caller in 0..64 {
            service.call(replay_run, caller).await.expect("prime");
            raw.fresh(digest(replay_run, caller)).await;
        }
    });
    let mut group = c.benchmark_group(format!("{name}/replay"));
    group.throughput(Throughput::Elements(1));
    for callers in CALLERS {
        group.bench_function(BenchmarkId::new("samekey", format!("c{callers}")), |b| {
            b.to_async(rt).iter_custom(|iters| {
                let service = service.clone();
                concurrently(iters, callers, move |caller, _| {
                    let service = service.clone();
                    async move {
                        service.call(replay_run, caller).await.expect("replay");
                    }
                })
            })
        });
        group.bench_function(BenchmarkId::new("raw", format!("c{callers}")), |b| {
            b.to_async(rt).iter_custom(|iters| {
                let raw = raw.clone();
                concurrently(iters, callers, move |caller, _| {
                    let raw = raw.clone();
                    async move { raw.replay(digest(replay_run, caller)).await }
                })
            })
        });
    }
    group.finish();
}

/// How late a duplicate that waits for a busy key hears the owner's outcome: the time from the owner's
/// completion (acknowledged by the store) to the waiter's return, with the store's notification
/// (`wait_settled`: LISTEN/NOTIFY on PostgreSQL, pub/sub on Redis) beside polling
/// (`samekey::store::poll_settled`, 20 ms growing to 1 s), and one plain round trip (`get`) for scale.
fn waiter(c: &mut Criterion, rt: &tokio::runtime::Runtime, name: &str, store: Arc<dyn Store>) {
    let mut group = c.benchmark_group(format!("{name}/waiter"));
    let run = unique_run();
    let next = Arc::new(AtomicU64::new(0));
    for how in ["notified", "polled"] {
        group.bench_function(how, |b| {
            b.to_async(rt).iter_custom(|iters| {
                let (store, next) = (store.clone(), next.clone());
                async move {
                    let mut late = Duration::ZERO;
                    for _ in 0..iters {
                        let key = samekey::Key::build(
                            "bench.waiter",
                            &(run, next.fetch_add(1, Ordering::Relaxed)),
                        );
                        let claim = samekey::store::Claim {
                            key: key.clone(),
                            call_id: samekey::CallId::new("wait", "bench").expect("labels"),
                            fingerprint: None,
                            lease_ms: 30_000,
                            now_ms: 0,
                        };
                        let Ok(samekey::store::Claimed::Acquired(fence)) = store.claim(claim).await
                        else {
                            panic!("a fresh key is taken")
                        };
                        let waiter = tokio::spawn({
                            let (store, key) = (store.clone(), key.clone());
                            async move {
                                let limit = Duration::from_secs(10);
                                let settled = if how == "notified" {
                                    store.wait_settled(&key, limit, 0).await
                                } else {
                                    samekey::store::poll_settled(&*store, &key, limit, 0).await
                                };
                                assert!(settled
                                    .expect("wait")
                                    .is_some_and(|r| r.state.is_terminal()));
                                Instant::now()
                            }
                        });
                        // The waiter subscribes and looks (a few round trips) before the owner finishes.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        let completion = samekey::store::Completion {
                            state: samekey::ReceiptState::Success,
                            outcome: Some(Arc::from(&b"1"[..])),
                            ttl_ms: 60_000,
                        };
                        store
                            .complete(&key, fence, completion, 0)
                            .await
                            .expect("complete");
                        let completed = Instant::now();
                        let heard = waiter.await.expect("waiter");
                        late += heard.saturating_duration_since(completed);
                    }
                    late
                }
            })
        });
    }
    let key = samekey::Key::build("bench.waiter", &(run, u64::MAX));
    group.bench_function("round_trip", |b| {
        b.to_async(rt).iter(|| {
            let (store, key) = (store.clone(), key.clone());
            async move { store.get(&key, 0).await.expect("get") }
        })
    });
    group.finish();
}

fn cache(c: &mut Criterion, rt: &tokio::runtime::Runtime, pg: &str, redis_url: &str) {
    let (plain, cached, local) = rt.block_on(async {
        let pg_store = PgStore::connect(pg).await.expect("postgres");
        let cached = CachedStore::connect(pg_store.clone(), redis_url)
            .await
            .expect("redis");
        let local = LocalCache::new(pg_store.clone(), 100_000);
        (
            Service::on(Arc::new(pg_store)),
            Service::on(Arc::new(cached)),
            Service::on(Arc::new(local)),
        )
    });
    let run = unique_run();
    rt.block_on(async {
        for caller in 0..64 {
            plain.call(run, caller).await.expect("prime");
            // Completed through the plain store, so the cache learns them from this first replay.
            cached.call(run, caller).await.expect("fill the cache");
            local
                .call(run, caller)
                .await
                .expect("fill the process's receipts");
        }
    });
    let mut group = c.benchmark_group("postgres/replay_cache");
    group.throughput(Throughput::Elements(1));
    for callers in CALLERS {
        for (label, service) in [
            ("postgres", &plain),
            ("redis_cache", &cached),
            ("local_cache", &local),
        ] {
            group.bench_function(BenchmarkId::new(label, format!("c{callers}")), |b| {
                b.to_async(rt).iter_custom(|iters| {
                    let service = service.clone();
                    concurrently(iters, callers, move |caller, _| {
                        let service = service.clone();
                        async move {
                            service.call(run, caller).await.expect("replay");
                        }
                    })
                })
            });
        }
    }
    group.finish();
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10)
        .configure_from_args();

    let dir = std::env::temp_dir().join(format!("samekey-bench-{}", unique_run()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sqlite = rt
        .block_on(SqliteStore::open(dir.join("bench.db")))
        .expect("sqlite");
    let raw = Raw::Sqlite(sqlite.pool().clone());
    backend(&mut c, &rt, "sqlite", Arc::new(sqlite), raw);

    match std::env::var("SAMEKEY_PG_URL") {
        Ok(url) => {
            let store = rt.block_on(PgStore::connect(&url)).expect("postgres");
            let raw = Raw::Postgres(store.pool().clone());
            let store = Arc::new(store);
            backend(&mut c, &rt, "postgres", store.clone(), raw);
            waiter(&mut c, &rt, "postgres", store);
        }
        Err(_) => println!("skipped: set SAMEKEY_PG_URL to benchmark PostgreSQL"),
    }
    match std::env::var("SAMEKEY_MYSQL_URL") {
        Ok(url) => {
            let store = rt.block_on(MySqlStore::connect(&url)).expect("mysql");
            let raw = Raw::MySql(store.pool().clone());
            let store = Arc::new(store);
            backend(&mut c, &rt, "mysql", store.clone(), raw);
            // MySQL has no LISTEN: its "notified" is the polling (`MySqlStore`'s documentation).
            waiter(&mut c, &rt, "mysql", store);
        }
        Err(_) => println!("skipped: set SAMEKEY_MYSQL_URL to benchmark MySQL"),
    }
    match std::env::var("SAMEKEY_REDIS_URL") {
        Ok(url) => {
            let store = rt
                .block_on(RedisStore::connect_with_prefix(&url, "bench"))
                .expect("redis");
            let conn = rt
                .block_on(async {
                    redis::Client::open(url.as_str())
                        .expect("url")
                        .get_connection_manager()
                        .await
                })
                .expect("redis connection");
            let raw = Raw::Redis(
                conn,
                redis::Script::new(RedisStore::CLAIM_SCRIPT),
                redis::Script::new(RedisStore::WRITE_SCRIPT),
            );
            let store = Arc::new(store);
            backend(&mut c, &rt, "redis", store.clone(), raw);
            waiter(&mut c, &rt, "redis", store);
        }
        Err(_) => println!("skipped: set SAMEKEY_REDIS_URL to benchmark Redis"),
    }
    if let (Ok(pg), Ok(redis_url)) = (
        std::env::var("SAMEKEY_PG_URL"),
        std::env::var("SAMEKEY_REDIS_URL"),
    ) {
        cache(&mut c, &rt, &pg, &redis_url);
    }
    c.final_summary();
}
