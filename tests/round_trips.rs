//! What a call asks of its store: a fresh call is a claim and a completion, a replay is one claim, on
//! every backend (each of these operations is one statement or one script on PostgreSQL and Redis).
//! The server backends run when their URL is set (see `scripts/services`), and print a skip otherwise.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::store::{async_trait, Claim, Claimed, Completion};
use samekey::{
    idempotent, CallId, CompensationEntry, Fence, Key, MemoryStore, Receipt, Runtime, Store,
    StoreError, Transition,
};
use support::TestError;

/// A store that records the name of every operation asked of it.
struct Counted<S> {
    inner: S,
    ops: Mutex<Vec<&'static str>>,
}

impl<S> Counted<S> {
    fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.ops.lock().unwrap())
    }

    fn note(&self, op: &'static str) {
        self.ops.lock().unwrap().push(op);
    }
}

#[async_trait]
impl<S: Store> Store for Counted<S> {
    async fn claim(&self, claim: Claim) -> Result<Claimed, StoreError> {
        self.note("claim");
        self.inner.claim(claim).await
    }
    async fn take_over(&self, key: &Key, f: Fence, l: u64, n: u64) -> Result<Claimed, StoreError> {
        self.note("take_over");
        self.inner.take_over(key, f, l, n).await
    }
    async fn extend_lease(&self, key: &Key, f: Fence, l: u64, n: u64) -> Result<(), StoreError> {
        self.note("extend_lease");
        self.inner.extend_lease(key, f, l, n).await
    }
    async fn complete(
        &self,
        key: &Key,
        f: Fence,
        c: Completion,
        n: u64,
    ) -> Result<Transition, StoreError> {
        self.note("complete");
        self.inner.complete(key, f, c, n).await
    }
    async fn mark_unknown(&self, key: &Key, f: Fence, n: u64) -> Result<Transition, StoreError> {
        self.note("mark_unknown");
        self.inner.mark_unknown(key, f, n).await
    }
    async fn release(&self, key: &Key, f: Fence) -> Result<(), StoreError> {
        self.note("release");
        self.inner.release(key, f).await
    }
    async fn get(&self, key: &Key, n: u64) -> Result<Option<Receipt>, StoreError> {
        self.note("get");
        self.inner.get(key, n).await
    }
    async fn get_by_call_id(&self, id: &CallId) -> Result<Option<Receipt>, StoreError> {
        self.note("get_by_call_id");
        self.inner.get_by_call_id(id).await
    }
    async fn wait_settled(
        &self,
        key: &Key,
        t: Duration,
        n: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        self.note("wait_settled");
        self.inner.wait_settled(key, t, n).await
    }
    async fn purge_expired(&self, n: u64) -> Result<usize, StoreError> {
        self.note("purge_expired");
        self.inner.purge_expired(n).await
    }
    async fn enqueue_compensation(&self, e: CompensationEntry) -> Result<(), StoreError> {
        self.note("enqueue_compensation");
        self.inner.enqueue_compensation(e).await
    }
    async fn take_due_compensations(
        &self,
        n: u64,
        l: usize,
        u: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        self.note("take_due_compensations");
        self.inner.take_due_compensations(n, l, u).await
    }
    async fn reschedule_compensation(&self, id: &CallId, r: u32, n: u64) -> Result<(), StoreError> {
        self.note("reschedule_compensation");
        self.inner.reschedule_compensation(id, r, n).await
    }
    async fn finish_compensation(&self, id: &CallId) -> Result<(), StoreError> {
        self.note("finish_compensation");
        self.inner.finish_compensation(id).await
    }
    async fn escalate_compensation(&self, id: &CallId, n: u64) -> Result<(), StoreError> {
        self.note("escalate_compensation");
        self.inner.escalate_compensation(id, n).await
    }
    async fn list_compensations(&self) -> Result<Vec<CompensationEntry>, StoreError> {
        self.note("list_compensations");
        self.inner.list_compensations().await
    }
}

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
    let counted = Arc::new(Counted {
        inner: store,
        ops: Mutex::new(Vec::new()),
    });
    let svc = Svc {
        rt: Runtime::builder()
            .shared_store(counted.clone())
            .build()
            .unwrap(),
    };
    let tag = format!("{:x}", samekey::TraceId::new().as_u128());
    assert_eq!(svc.run(&tag, 1).await, Ok(1));
    assert_eq!(counted.take(), ["claim", "complete"], "a fresh call");
    assert_eq!(svc.run(&tag, 1).await, Ok(1));
    assert_eq!(counted.take(), ["claim"], "a replay");
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
    let durable = Counted {
        inner: samekey::store::SqliteStore::open(dir.join("s.db"))
            .await
            .unwrap(),
        ops: Mutex::new(Vec::new()),
    };
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
        cached.durable().take(),
        ["claim", "complete"],
        "a fresh call"
    );
    cached.flush().await;
    assert_eq!(svc.run(&tag, 7).await, Ok(7));
    assert_eq!(
        cached.durable().take(),
        Vec::<&str>::new(),
        "the first replay is answered by Redis"
    );
}
