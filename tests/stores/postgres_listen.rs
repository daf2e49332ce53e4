//! A duplicate waiting on a busy PostgreSQL key hears the owner's commit by `LISTEN`, not by polling,
//! whichever way the store is handed to it: the store itself, an `Arc` of it (issue 25's
//! `impl Store for Arc<S>`), a `Box<dyn Store>`, a `LocalCache` or (with Redis) a `CachedStore` in
//! front (each a `StoreWrapper` over a `ClaimTracker` since issue 25). Polling (`poll_settled`: 20 ms,
//! then doubling) would hear a commit made 350 ms into the wait only at 620 ms; a notification is
//! heard a few round trips after it. (Review of issue 25, reviewer 2.)
#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use samekey::store::{Claim, Claimed, Completion, LocalCache, PgStore};
use samekey::{CallId, Key, ReceiptState, Store, TraceId};

/// Claims a fresh key on `pg`, waits on it through `waiter`, completes it 350 ms in: how long after
/// the completion the waiter answered, and what.
async fn heard_after(pg: &PgStore, waiter: Arc<dyn Store>) -> (Duration, Option<ReceiptState>) {
    let key = Key::build("listen.review", &TraceId::new().as_u128());
    let claim = Claim {
        key: key.clone(),
        call_id: CallId::new("listen", "n1").unwrap(),
        fingerprint: None,
        lease_ms: 60_000,
        now_ms: 0,
    };
    let Claimed::Acquired(fence) = pg.claim(claim).await.unwrap() else {
        panic!("a fresh key is taken");
    };
    let waiting = {
        let key = key.clone();
        tokio::spawn(async move {
            let answer = waiter
                .wait_settled(&key, Duration::from_secs(10), 0)
                .await
                .unwrap();
            (Instant::now(), answer.map(|r| r.state))
        })
    };
    tokio::time::sleep(Duration::from_millis(350)).await;
    let completion = Completion {
        state: ReceiptState::Success,
        outcome: Some(Arc::from(&b"1"[..])),
        ttl_ms: 60_000,
    };
    pg.complete(&key, fence, completion, 0).await.unwrap();
    let completed = Instant::now();
    let (answered, state) = waiting.await.unwrap();
    (answered.saturating_duration_since(completed), state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_the_commit_through_every_wrapper() {
    let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
        samekey::conformance::skipped(
            "set SAMEKEY_PG_URL (scripts/services start) to run the PostgreSQL LISTEN checks",
        );
        return;
    };
    let pg = PgStore::connect(&url).await.expect("connect");
    let boxed: Box<dyn Store> = Box::new(pg.clone());
    let ways: [(&str, Arc<dyn Store>); 4] = [
        ("the store", Arc::new(pg.clone())),
        ("an Arc of it", Arc::new(Arc::new(pg.clone()))),
        ("a Box<dyn Store>", Arc::new(boxed)),
        (
            "a LocalCache in front",
            Arc::new(LocalCache::new(pg.clone(), 100)),
        ),
    ];
    #[allow(unused_mut)]
    let mut ways = Vec::from(ways);
    #[cfg(feature = "redis")]
    if let Ok(redis) = std::env::var("SAMEKEY_REDIS_URL") {
        let cached = samekey::store::CachedStore::connect(pg.clone(), &redis)
            .await
            .expect("connect the cache");
        ways.push(("a CachedStore in front", Arc::new(cached)));
    }
    for (way, waiter) in ways {
        let (after, state) = heard_after(&pg, waiter).await;
        assert_eq!(state, Some(ReceiptState::Success), "{way}");
        assert!(
            after < Duration::from_millis(200),
            "{way}: heard {after:?} after the commit (polling, not LISTEN?)"
        );
    }
}
