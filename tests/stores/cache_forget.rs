//! A key forgotten through a cache in front of the store goes at once: a read, a claim or a completion
//! whose answer was in flight when the forget went through is not kept after it, so the redo that the
//! forget allows reaches the store (issue 24, defect 7). `LocalCache` in process; with feature `redis`
//! and `SAMEKEY_REDIS_URL`, the Redis front cache (`CachedStore`) too.

use crate::support;

use std::sync::Arc;

use samekey::store::{Claim, Claimed, Completion, LocalCache};
use samekey::{
    clock::Clock, clock::SystemClock, receipt::Transition, CallId, Key, MemoryStore, Receipt,
    ReceiptState, Runtime, Store,
};
use support::faulty::{Act, Faulty, Gate};

fn now() -> u64 {
    SystemClock.now_ms()
}

fn claim(key: &Key, now_ms: u64) -> Claim {
    Claim {
        key: key.clone(),
        call_id: CallId::new("forget", "test").unwrap(),
        fingerprint: None,
        lease_ms: 10_000,
        now_ms,
    }
}

fn success(ttl_ms: u64) -> Completion {
    Completion {
        state: ReceiptState::Success,
        outcome: Some(b"42".as_slice().into()),
        ttl_ms,
    }
}

/// A call on `key` finished at `now_ms`, straight in `store` (behind any cache in front of it).
async fn finished_behind(store: &dyn Store, key: &Key, now_ms: u64, ttl_ms: u64) -> Receipt {
    let Ok(Claimed::Acquired(fence)) = store.claim(claim(key, now_ms)).await else {
        panic!("a fresh key")
    };
    store
        .complete(key, fence, success(ttl_ms), now_ms)
        .await
        .unwrap();
    store.get(key, now_ms).await.unwrap().expect("finished")
}

/// A `LocalCache` over a `Faulty` memory store, and a runtime on it (whose `forget` the operator uses).
fn local() -> (Arc<LocalCache<Faulty>>, Runtime) {
    let faulty = Faulty::new(Arc::new(MemoryStore::new()));
    let store = Arc::new(LocalCache::new(faulty, 100));
    let rt = Runtime::builder()
        .node("forget")
        .shared_store(store.clone())
        .build()
        .unwrap();
    (store, rt)
}

/// After a forget, the key's next claim through the cache reaches the store and acquires it.
async fn the_redo_reaches_the_store(store: &LocalCache<Faulty>, key: &Key) {
    store.inner().take_ops();
    let redo = store.claim(claim(key, now())).await.unwrap();
    assert!(
        matches!(redo, Claimed::Acquired(_)),
        "the forgotten key is answered {redo:?}"
    );
    assert_eq!(store.inner().take_ops(), ["claim"], "asked of the store");
}

/// A duplicate's claim read the finished record before the operator's forget and is answered after
/// it: the cache does not keep that receipt, and the redo runs.
#[tokio::test]
async fn local_cache_keeps_no_claim_answered_across_a_forget() {
    let (store, rt) = local();
    let key = Key::build("forget", &1u64);
    let record = finished_behind(store.inner(), &key, now(), 60_000).await;
    let gate = Gate::new();
    store.inner().plan("claim", [Act::After(gate.clone())]);
    let duplicate = tokio::spawn({
        let store = store.clone();
        let key = key.clone();
        async move { store.claim(claim(&key, now())).await }
    });
    gate.reached().await;
    rt.forget(&key, "alice", "the customer redoes it")
        .await
        .unwrap();
    gate.open();
    // The duplicate was answered before the forget: the record as it was.
    assert_eq!(duplicate.await.unwrap().unwrap(), Claimed::Existing(record));
    the_redo_reaches_the_store(&store, &key).await;
}

/// The same for a read (`get`) answered before the forget and returned after it.
#[tokio::test]
async fn local_cache_keeps_no_read_answered_across_a_forget() {
    let (store, rt) = local();
    let key = Key::build("forget", &2u64);
    let record = finished_behind(store.inner(), &key, now(), 60_000).await;
    let gate = Gate::new();
    store.inner().plan("get", [Act::After(gate.clone())]);
    let read = tokio::spawn({
        let store = store.clone();
        let key = key.clone();
        async move { store.get(&key, now()).await }
    });
    gate.reached().await;
    rt.forget(&key, "alice", "the customer redoes it")
        .await
        .unwrap();
    gate.open();
    assert_eq!(read.await.unwrap().unwrap(), Some(record));
    the_redo_reaches_the_store(&store, &key).await;
}

/// A call that completed through the cache, whose completion the store applied but answered only
/// after the operator forgot the key (found finished meanwhile): the cache does not keep it either.
#[tokio::test]
async fn local_cache_keeps_no_completion_answered_across_a_forget() {
    let (store, rt) = local();
    let key = Key::build("forget", &3u64);
    let Ok(Claimed::Acquired(fence)) = store.claim(claim(&key, now())).await else {
        panic!("a fresh key")
    };
    let gate = Gate::new();
    store.inner().plan("complete", [Act::After(gate.clone())]);
    let completing = tokio::spawn({
        let store = store.clone();
        let key = key.clone();
        async move { store.complete(&key, fence, success(60_000), now()).await }
    });
    gate.reached().await;
    let forgotten = rt
        .forget(&key, "alice", "the customer redoes it")
        .await
        .unwrap();
    assert_eq!(forgotten.fence, fence);
    gate.open();
    assert_eq!(completing.await.unwrap().unwrap(), Transition::Applied);
    the_redo_reaches_the_store(&store, &key).await;
}

/// The Redis front cache over a `Faulty` memory store (feature `redis`, `SAMEKEY_REDIS_URL`).
#[cfg(feature = "redis")]
mod front_cache {
    use std::time::Duration;

    use samekey::store::{CachedStore, RedisStore};

    use super::*;

    /// A `CachedStore` over a `Faulty` memory store, its cache on a key prefix of its own; `None`
    /// (said past the output capture) without `SAMEKEY_REDIS_URL`.
    async fn cached() -> Option<Arc<CachedStore<Faulty>>> {
        let Ok(url) = std::env::var("SAMEKEY_REDIS_URL") else {
            samekey::conformance::skipped(
                "set SAMEKEY_REDIS_URL (scripts/services start) to run the front cache's cases",
            );
            return None;
        };
        let prefix = format!("cache-forget-{:x}", samekey::TraceId::new().as_u128());
        let cache = RedisStore::connect_unverified(&url, &prefix)
            .await
            .expect("connect to SAMEKEY_REDIS_URL");
        let durable = Faulty::new(Arc::new(MemoryStore::new()));
        Some(Arc::new(CachedStore::new(durable, cache)))
    }

    /// Once every cache write has landed, the key's next claim reaches the durable store.
    async fn the_redo_reaches_the_store(store: &CachedStore<Faulty>, key: &Key) {
        store.flush().await;
        store.durable().take_ops();
        let redo = store.claim(claim(key, now())).await.unwrap();
        assert!(
            matches!(redo, Claimed::Acquired(_)),
            "the forgotten key is answered {redo:?}"
        );
        assert_eq!(store.durable().take_ops(), ["claim"], "asked of the store");
    }

    /// A read-through's cache write still pending (held where it asks the durable store for its time)
    /// when the key is forgotten does not land after the forget.
    #[tokio::test]
    async fn front_cache_forget_orders_after_a_pending_cache_write() {
        let Some(store) = cached().await else { return };
        let key = Key::build("forget", &11u64);
        let record = finished_behind(store.durable(), &key, now(), 60_000).await;
        let gate = Gate::new();
        store.durable().plan("now_ms", [Act::Before(gate.clone())]);
        assert_eq!(store.get(&key, now()).await.unwrap(), Some(record.clone()));
        gate.reached().await;
        let mut forget = tokio::spawn({
            let (store, key) = (store.clone(), key.clone());
            async move { store.forget(&key, record.fence).await }
        });
        // A forget that does not wait for the write is done long before this; one that does waits
        // for the gate.
        let done = tokio::time::timeout(Duration::from_millis(300), &mut forget).await;
        gate.open();
        match done {
            Ok(forgotten) => forgotten.unwrap().unwrap(),
            Err(_) => forget.await.unwrap().unwrap(),
        }
        the_redo_reaches_the_store(&store, &key).await;
    }

    /// A completion the durable store applied and answered only after the key was forgotten (found
    /// finished meanwhile) is not written to the cache after the forget.
    #[tokio::test]
    async fn front_cache_caches_no_completion_answered_across_a_forget() {
        let Some(store) = cached().await else { return };
        let key = Key::build("forget", &12u64);
        let Ok(Claimed::Acquired(fence)) = store.claim(claim(&key, now())).await else {
            panic!("a fresh key")
        };
        let gate = Gate::new();
        store.durable().plan("complete", [Act::After(gate.clone())]);
        let completing = tokio::spawn({
            let (store, key) = (store.clone(), key.clone());
            async move { store.complete(&key, fence, success(60_000), now()).await }
        });
        gate.reached().await;
        store.forget(&key, fence).await.unwrap();
        gate.open();
        assert_eq!(completing.await.unwrap().unwrap(), Transition::Applied);
        the_redo_reaches_the_store(&store, &key).await;
    }

    /// A receipt found by its callId is cached until it expires by the durable store's time (here the
    /// caller's clock), not for its whole ttl again from when it was last written.
    #[tokio::test]
    async fn front_cache_keeps_a_receipt_found_by_call_id_until_its_expiry() {
        let Some(store) = cached().await else { return };
        let key = Key::build("forget", &13u64);
        // Finished 58 s ago with a ttl of 60 s: it expires in 2 s.
        let record = finished_behind(store.durable(), &key, now() - 58_000, 60_000).await;
        let expires_at = record.expires_at_ms.expect("a finished record expires");
        let found = store.get_by_call_id(&record.call_id).await.unwrap();
        assert_eq!(found.as_ref(), Some(&record));
        store.flush().await;
        store.durable().take_ops();
        let cached = store.get_by_call_id(&record.call_id).await.unwrap();
        assert_eq!(cached.map(|r| r.fence), Some(record.fence));
        assert!(
            store.durable().take_ops().is_empty(),
            "answered by the cache"
        );
        // Past its expiry, and purged from the durable store: found nowhere.
        let left = expires_at.saturating_sub(now());
        tokio::time::sleep(Duration::from_millis(left + 200)).await;
        assert_eq!(store.durable().purge_expired(now()).await.unwrap(), 1);
        let late = store.get_by_call_id(&record.call_id).await.unwrap();
        assert_eq!(late, None, "an expired receipt answered by the cache");
    }
}
