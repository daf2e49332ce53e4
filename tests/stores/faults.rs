//! Stores that fail: a corrupted or foreign record gives a typed error (no panic, no execution); a Redis
//! front cache that goes down falls back to the durable store; a Redis store restarted mid-run loses no
//! completed receipt and runs nothing twice. The Redis tests start Redis servers of their own (they
//! need `redis-server` on the PATH, which `scripts/services` installs).
//!
//! (Was `tests/store_faults.rs`.)
#![cfg(all(feature = "sqlite", feature = "redis"))]

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use samekey::sqlx;
use samekey::store::{CachedStore, RedisStore, SqliteStore};
use samekey::{idempotent, store::StoreError, Error, Key, Runtime, Store};
use support::TestError;

struct Svc {
    rt: Runtime,
    runs: AtomicU32,
}

impl Svc {
    fn on(store: Arc<dyn Store>) -> Svc {
        Svc {
            rt: Runtime::builder().shared_store(store).build().unwrap(),
            runs: AtomicU32::new(0),
        }
    }

    #[idempotent(key = "id", scope = "faults", runtime = &self.rt)]
    async fn run(&self, id: u64) -> Result<u64, TestError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(id * 10)
    }

    fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

fn temp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "faults-{name}-{:x}",
        samekey::TraceId::new().as_u128()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn is_corrupt(out: &Result<u64, TestError>) -> bool {
    matches!(
        out,
        Err(TestError::Samekey(Error::Store(StoreError::Corrupt(_))))
    )
}

#[tokio::test]
async fn a_corrupted_sqlite_row_is_a_typed_error_and_runs_nothing() {
    let store = SqliteStore::open(temp("sqlite").join("s.db"))
        .await
        .unwrap();
    let key = Key::build("faults", &7u64);
    // A row written by something else: a state samekey never writes, a callId that is not one.
    sqlx::query(
        "INSERT INTO samekey_receipts (key, scope, call_id, state, fence, created, updated)
         VALUES (?1, 'faults', 'not a call id', 'DONE', 1, 0, 0)",
    )
    .bind(key.digest().as_slice())
    .execute(store.pool())
    .await
    .unwrap();
    let svc = Svc::on(Arc::new(store.clone()));
    let out = svc.run(7).await;
    assert!(is_corrupt(&out), "{out:?}");
    assert_eq!(svc.runs(), 0, "nothing ran");
    // A key of the wrong length, found by callId.
    sqlx::query(
        "INSERT INTO samekey_receipts (key, scope, call_id, state, fence, created, updated)
         VALUES (x'0102', 'faults', 'ord-1-00000000000000ff-n', 'SUCCESS', 1, 0, 0)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let id: samekey::CallId = "ord-1-00000000000000ff-n".parse().unwrap();
    assert!(matches!(
        svc.rt.receipt(&id).await,
        Err(Error::Store(StoreError::Corrupt(_)))
    ));
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_corrupted_postgres_row_is_a_typed_error_and_runs_nothing() {
    let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
        samekey::conformance::skipped(
            "set SAMEKEY_PG_URL (scripts/services start) to run the PostgreSQL fault test",
        );
        return;
    };
    let store = samekey::store::PgStore::connect(&url).await.unwrap();
    let scope = format!("faults-{:x}", samekey::TraceId::new().as_u128());
    let key = Key::build(&scope, &7u64);
    sqlx::query(
        "INSERT INTO samekey_receipts (key, scope, call_id, state, fence, created, updated)
         VALUES ($1, $2, 'ord-1-00000000000000ff-n', 'SUCCESS', -5, samekey_ts(0), samekey_ts(0))",
    )
    .bind(key.digest().as_slice())
    .bind(&scope)
    .execute(store.pool())
    .await
    .unwrap();
    let claim = samekey::store::Claim {
        key,
        call_id: samekey::CallId::new("t", "t").unwrap(),
        fingerprint: None,
        lease_ms: 9,
        now_ms: 1,
    };
    assert!(matches!(
        store.claim(claim).await,
        Err(StoreError::Corrupt(_))
    ));
}

#[tokio::test]
async fn a_corrupted_redis_record_is_a_typed_error_and_runs_nothing() {
    let Some(redis) = own_redis("corrupt") else {
        return;
    };
    let client = samekey::redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = Key::build("faults", &7u64);
    // A hash written by something else under samekey's key name: no fence, a state samekey never
    // writes.
    let name = format!("samekey:r:{{{}}}", key.to_hex());
    let _: () = samekey::redis::cmd("HSET")
        .arg(&name)
        .arg("state")
        .arg("DONE")
        .arg("call_id")
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let svc = Svc::on(Arc::new(RedisStore::connect(&redis.url()).await.unwrap()));
    let out = svc.run(7).await;
    assert!(is_corrupt(&out), "{out:?}");
    assert_eq!(svc.runs(), 0, "nothing ran");
}

/// A Redis server of the test's own, on a free loopback port, persisting to `dir` with an fsync per
/// write.
struct OwnRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl OwnRedis {
    fn start(dir: &Path) -> Option<OwnRedis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        OwnRedis::start_on(dir, port)
    }

    fn start_on(dir: &Path, port: u16) -> Option<OwnRedis> {
        OwnRedis::start_with(
            dir,
            port,
            &["--appendonly", "yes", "--appendfsync", "always"],
        )
    }

    fn start_with(dir: &Path, port: u16, settings: &[&str]) -> Option<OwnRedis> {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(settings)
            .arg("--dir")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let server = OwnRedis {
            child,
            port,
            dir: dir.to_owned(),
        };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(server);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (no shutdown save: only what was fsynced survives).
    fn kill(mut self) -> (PathBuf, u16) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        (self.dir.clone(), self.port)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Redis that may lose claims (one that evicts, one that does not persist) is refused as the store of
/// record, with a typed error that says which setting and why; it still serves as a cache.
#[tokio::test]
async fn a_redis_that_may_lose_claims_is_refused() {
    for (name, settings, says) in [
        (
            "evicting",
            &["--appendonly", "yes", "--maxmemory-policy", "allkeys-lru"][..],
            "maxmemory-policy is `allkeys-lru`",
        ),
        (
            "volatile",
            &["--appendonly", "no"][..],
            "appendonly is `no`",
        ),
    ] {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let Some(redis) = OwnRedis::start_with(&temp(name), port, settings) else {
            samekey::conformance::skipped(
                "no `redis-server` to start (scripts/services installs it)",
            );
            return;
        };
        match RedisStore::connect(&redis.url()).await {
            Err(StoreError::NotDurable(why)) => assert!(why.contains(says), "{why}"),
            other => panic!("{name}: expected NotDurable, got {other:?}"),
        }
        let cache = RedisStore::connect_unverified(&redis.url(), "cache").await;
        assert!(cache.is_ok(), "{name}: a cache is not checked");
    }
}

fn own_redis(name: &str) -> Option<OwnRedis> {
    let server = OwnRedis::start(&temp(name));
    if server.is_none() {
        samekey::conformance::skipped("no `redis-server` to start (scripts/services installs it)");
    }
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_cache_that_goes_down_falls_back_to_the_durable_store() {
    let Some(redis) = own_redis("cache-down") else {
        return;
    };
    let durable = SqliteStore::open(temp("cache-down-db").join("s.db"))
        .await
        .unwrap();
    let cached = CachedStore::connect(durable, &redis.url()).await.unwrap();
    let svc = Svc::on(Arc::new(cached));
    for id in 0..20 {
        assert_eq!(svc.run(id).await, Ok(id * 10));
        assert_eq!(svc.run(id).await, Ok(id * 10), "replay, now cached");
    }
    assert_eq!(svc.runs(), 20);
    drop(redis.kill());
    // The cache is gone: replays and new calls go to the durable store, nothing runs twice.
    for id in 0..30 {
        assert_eq!(svc.run(id).await, Ok(id * 10));
    }
    assert_eq!(svc.runs(), 30);
    assert_eq!(svc.rt.stats().failed_closed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_loses_no_completed_receipt() {
    let Some(redis) = own_redis("restart") else {
        return;
    };
    let url = redis.url();
    let svc = Svc::on(Arc::new(RedisStore::connect(&url).await.unwrap()));
    for id in 0..50 {
        assert_eq!(svc.run(id).await, Ok(id * 10));
    }
    // Killed, not shut down: only what was fsynced (every write, `appendfsync always`) survives.
    let (dir, port) = redis.kill();
    let down = svc.run(1_000).await;
    assert!(
        matches!(
            down,
            Err(TestError::Samekey(Error::Store(StoreError::Unavailable(_))))
        ),
        "a store that is down fails closed: {down:?}"
    );
    assert_eq!(svc.runs(), 50, "nothing ran while it was down");
    let _back = OwnRedis::start_on(&dir, port).expect("restart redis");
    // The same connection reconnects; every completed receipt is still there.
    let replays_before = svc.rt.stats().replays;
    for id in 0..50 {
        let out = svc.run(id).await;
        if out.is_err() {
            // The first command after the restart may hit the old connection once.
            assert_eq!(svc.run(id).await, Ok(id * 10));
        } else {
            assert_eq!(out, Ok(id * 10));
        }
    }
    assert_eq!(
        svc.rt.stats().replays - replays_before,
        50,
        "every completed call was answered from its receipt"
    );
    assert_eq!(
        svc.runs(),
        50,
        "every completed call replayed; nothing ran twice"
    );
    assert_eq!(
        svc.run(1_000).await,
        Ok(10_000),
        "the call refused while down runs now"
    );
}
