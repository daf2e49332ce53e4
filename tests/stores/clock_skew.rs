//! Nodes disagree about time: two runtimes on one shared store, one of them with a clock 5 s ahead (or
//! behind). The store's clock judges leases and expiries, so the fast node neither takes over a live
//! lease nor finds a finished record expired early, and the slow one does not keep a dead owner's
//! lease alive. Runs on PostgreSQL (`SAMEKEY_PG_URL`), MySQL (`SAMEKEY_MYSQL_URL`) and Redis
//! (`SAMEKEY_REDIS_URL`), in real time.
#![cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use samekey::{idempotent, Error, Runtime, Store};
use support::stores::*;
use support::{TestClock, TestError};
use tokio::sync::Notify;

/// A service on one node: its own runtime (and clock) over the shared store.
struct Node {
    rt: Runtime,
    runs: Arc<AtomicU32>,
    /// While set, a charge holds its key until the gate opens (at most 900 ms: under its timeout).
    hold: AtomicBool,
    gate: Arc<Notify>,
}

impl Node {
    fn on(store: Arc<dyn Store>, skew: Skew, runs: Arc<AtomicU32>, gate: Arc<Notify>) -> Node {
        let clock = TestClock::default();
        let rt = Runtime::builder().node("skewed").shared_store(store);
        let rt = match skew {
            Skew::None => rt,
            Skew::Ahead(by) => {
                clock.advance(by);
                rt.clock(clock)
            }
            Skew::Behind(by) => rt.clock(TestClock::behind(by)),
        };
        Node {
            rt: rt.build().unwrap(),
            runs,
            hold: AtomicBool::new(false),
            gate,
        }
    }

    /// A charge; its lease is 2 s.
    #[idempotent(key = "order", scope = "skew.charge", runtime = &self.rt, timeout = "1s",
                 on_unknown = "rerun", on_busy = "reject", retries = 0, ttl = "3s")]
    async fn charge(&self, order: &str) -> Result<u32, TestError> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        if self.hold.load(Ordering::SeqCst) {
            let _ = tokio::time::timeout(Duration::from_millis(900), self.gate.notified()).await;
        }
        Ok(n)
    }
}

#[derive(Clone, Copy)]
enum Skew {
    None,
    Ahead(Duration),
    Behind(Duration),
}

fn order() -> String {
    format!("o-{:x}", samekey::TraceId::new().as_u128())
}

fn nodes(store: Arc<dyn Store>, second: Skew) -> (Node, Node) {
    let runs = Arc::new(AtomicU32::new(0));
    let gate = Arc::new(Notify::new());
    (
        Node::on(store.clone(), Skew::None, runs.clone(), gate.clone()),
        Node::on(store, second, runs, gate),
    )
}

/// A node 5 s ahead sees a live 2 s lease as long expired by its own clock: it must still find the
/// key busy, not take it over and run the charge a second time.
async fn fast_node_does_not_take_over_a_live_lease(store: Arc<dyn Store>) {
    let (a, b) = nodes(store, Skew::Ahead(Duration::from_secs(5)));
    let a = Arc::new(a);
    a.hold.store(true, Ordering::SeqCst);
    let order = order();
    let first = tokio::spawn({
        let (a, order) = (a.clone(), order.clone());
        async move { a.charge(&order).await }
    });
    while a.runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = b.charge(&order).await;
    assert!(
        matches!(second, Err(TestError::Samekey(Error::InProgress { .. }))),
        "{second:?}"
    );
    a.gate.notify_waiters();
    assert_eq!(first.await.unwrap(), Ok(1));
    assert_eq!(a.runs.load(Ordering::SeqCst), 1, "the charge ran once");
    assert_eq!(b.charge(&order).await, Ok(1), "and is replayed");
}

/// A node 5 s ahead finds a record finished with a 3 s ttl expired by its own clock: it must still
/// replay it, not run the charge again.
async fn fast_node_does_not_expire_a_record_early(store: Arc<dyn Store>) {
    let (a, b) = nodes(store, Skew::Ahead(Duration::from_secs(5)));
    let order = order();
    assert_eq!(a.charge(&order).await, Ok(1));
    assert_eq!(b.charge(&order).await, Ok(1), "replayed, not run again");
    assert_eq!(a.runs.load(Ordering::SeqCst), 1);
}

/// A node 5 s behind sees a dead owner's lease as still running by its own clock: once the lease
/// ended by the store's clock, it takes the key over (here: `rerun`, with the recorded callId).
async fn slow_node_takes_over_an_ended_lease(store: Arc<dyn Store>) {
    let (a, b) = nodes(store.clone(), Skew::Behind(Duration::from_secs(5)));
    let order = order();
    // The owner claims and vanishes (its future dropped without a runtime to clean up is modelled by
    // a claim made straight on the store, whose 300 ms lease then ends).
    let claimed = store
        .claim(samekey::store::Claim {
            key: samekey::Key::build("skew.charge", &order.as_str()),
            call_id: samekey::CallId::new("cha", "gone").unwrap(),
            fingerprint: None,
            lease_ms: 300,
            now_ms: a.rt.now_ms(),
        })
        .await
        .unwrap();
    assert!(matches!(claimed, samekey::store::Claimed::Acquired(_)));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(b.charge(&order).await, Ok(1), "taken over and run");
}

/// `store` behind an in-process `LocalCache` (its concrete store: the cache wraps one by value).
fn behind_local_cache(store: &Arc<dyn Store>) -> Arc<dyn Store> {
    let any: Arc<dyn std::any::Any + Send + Sync> = store.clone();
    #[cfg(feature = "postgres")]
    let any = match any.downcast::<samekey::store::PgStore>() {
        Ok(pg) => return Arc::new(samekey::store::LocalCache::new((*pg).clone(), 100)),
        Err(other) => other,
    };
    #[cfg(feature = "mysql")]
    let any = match any.downcast::<samekey::store::MySqlStore>() {
        Ok(mysql) => return Arc::new(samekey::store::LocalCache::new((*mysql).clone(), 100)),
        Err(other) => other,
    };
    #[cfg(feature = "redis")]
    let any = match any.downcast::<samekey::store::RedisStore>() {
        Ok(redis) => return Arc::new(samekey::store::LocalCache::new((*redis).clone(), 100)),
        Err(other) => other,
    };
    let _ = any;
    panic!("a PostgreSQL, MySQL or Redis store")
}

/// A node 5 s behind keeps a receipt it read in process (`LocalCache`) only as long as the store's
/// clock says the receipt lives: after its 3 s ttl a charge runs again there, though by the node's
/// own clock the receipt expires 5 s later.
async fn slow_node_s_local_cache_keeps_a_receipt_no_longer_than_the_store(store: Arc<dyn Store>) {
    let runs = Arc::new(AtomicU32::new(0));
    let gate = Arc::new(Notify::new());
    let a = Node::on(store.clone(), Skew::None, runs.clone(), gate.clone());
    let b = Node::on(
        behind_local_cache(&store),
        Skew::Behind(Duration::from_secs(5)),
        runs,
        gate,
    );
    let order = order();
    assert_eq!(a.charge(&order).await, Ok(1));
    assert_eq!(
        b.charge(&order).await,
        Ok(1),
        "replayed, and kept in process"
    );
    assert_eq!(b.charge(&order).await, Ok(1));
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(
        b.charge(&order).await,
        Ok(2),
        "expired by the store's clock: run again"
    );
}

support::on_stores!(postgres if "postgres", mysql if "mysql", redis if "redis" => {
    fast_node_does_not_take_over_a_live_lease,
    fast_node_does_not_expire_a_record_early,
    slow_node_takes_over_an_ended_lease,
    slow_node_s_local_cache_keeps_a_receipt_no_longer_than_the_store,
});
