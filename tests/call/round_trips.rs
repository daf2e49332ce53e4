//! What a call asks of its store: a fresh call is a claim and a completion, a replay is one claim, on
//! every backend (each of these operations is one statement or one script on PostgreSQL and Redis).
//! The server backends run when their URL is set (see `scripts/services`), and print a skip otherwise.

use crate::support;

use std::sync::Arc;

use samekey::{idempotent, MemoryStore, Runtime, Store};
use support::faulty::Faulty;
use support::TestError;

struct Svc {
    rt: Runtime,
}

impl Svc {
    #[idempotent(key = "tag + id", runtime = &self.rt)]
    async fn run(&self, tag: &str, id: u64) -> Result<u64, TestError> {
        tokio::task::yield_now().await;
        Ok(id)
    }
}

async fn check<S: Store>(store: S) {
    let counted = Arc::new(Faulty::new(Arc::new(store)));
    let svc = Svc {
        rt: Runtime::builder()
            .shared_store(counted.clone())
            .build()
            .unwrap(),
    };
    let tag = format!("{:x}", samekey::TraceId::new().as_u128());
    assert_eq!(svc.run(&tag, 1).await, Ok(1));
    assert_eq!(counted.take_ops(), ["claim", "complete"], "a fresh call");
    assert_eq!(svc.run(&tag, 1).await, Ok(1));
    assert_eq!(counted.take_ops(), ["claim"], "a replay");
}

#[tokio::test]
async fn memory() {
    check(MemoryStore::new()).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "round-trips-{:x}",
        samekey::TraceId::new().as_u128()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    check(
        samekey::store::SqliteStore::open(dir.join("s.db"))
            .await
            .unwrap(),
    )
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres() {
    let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
        samekey::conformance::skipped("set SAMEKEY_PG_URL (scripts/services start)");
        return;
    };
    check(samekey::store::PgStore::connect(&url).await.unwrap()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis() {
    let Ok(url) = std::env::var("SAMEKEY_REDIS_URL") else {
        samekey::conformance::skipped("set SAMEKEY_REDIS_URL (scripts/services start)");
        return;
    };
    check(samekey::store::RedisStore::connect(&url).await.unwrap()).await;
}

/// Through the Redis front cache: a fresh call asks the durable store for a claim and a completion, and
/// the completion is then written to Redis, so that the replay is answered by Redis alone.
#[cfg(all(feature = "sqlite", feature = "redis"))]
#[tokio::test]
async fn redis_cache_over_sqlite() {
    let Ok(url) = std::env::var("SAMEKEY_REDIS_URL") else {
        samekey::conformance::skipped("set SAMEKEY_REDIS_URL (scripts/services start)");
        return;
    };
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "round-trips-cache-{:x}",
        samekey::TraceId::new().as_u128()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let durable = Faulty::new(Arc::new(
        samekey::store::SqliteStore::open(dir.join("s.db"))
            .await
            .unwrap(),
    ));
    let cached = Arc::new(
        samekey::store::CachedStore::connect(durable, &url)
            .await
            .unwrap(),
    );
    let svc = Svc {
        rt: Runtime::builder()
            .shared_store(cached.clone())
            .build()
            .unwrap(),
    };
    let tag = format!("{:x}", samekey::TraceId::new().as_u128());
    assert_eq!(svc.run(&tag, 7).await, Ok(7));
    assert_eq!(
        cached.durable().take_ops(),
        ["claim", "complete"],
        "a fresh call"
    );
    cached.flush().await;
    assert_eq!(svc.run(&tag, 7).await, Ok(7));
    assert_eq!(
        cached.durable().take_ops(),
        Vec::<&str>::new(),
        "the first replay is answered by Redis"
    );
}
