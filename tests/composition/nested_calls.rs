//! Features composed, not only alone, on the in-memory store with paused time: a call nested in
//! another one's body (its refusal passed up with `?`, its place in its parent's concurrency limit or
//! in another dependency's), and a duplicate waiting on a full bounded store. (A worker and a caller
//! on one key, a cache in front, a callback during a reversal: `compensation::on_every_store`,
//! `call::promise`, `call::callbacks`, on every backend; tower's timeouts and the layer:
//! `samekey-http`'s `wire::server` tests.)
//!
//! (Was `tests/composition.rs`.)

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use samekey::{
    clock::TokioClock, idempotent, limits::ConcurrencyLimit, Error, ReceiptState, Runtime,
};
use support::TestError;
use tokio::sync::Notify;

/// An order service whose `place` charges, then ships through a nested `#[idempotent]` call.
struct Shop {
    rt: Runtime,
    charges: AtomicU32,
    shipments: AtomicU32,
    /// How many more shipments the shipping provider answers 429.
    rate_limited: AtomicU32,
    /// Holds a shipment in flight until notified.
    ship_gate: Notify,
    hold_shipments: std::sync::atomic::AtomicBool,
}

impl Shop {
    fn new(rt: Runtime) -> Arc<Shop> {
        Arc::new(Shop {
            rt,
            charges: AtomicU32::new(0),
            shipments: AtomicU32::new(0),
            rate_limited: AtomicU32::new(0),
            ship_gate: Notify::new(),
            hold_shipments: false.into(),
        })
    }

    /// Charges the order, then ships it: a nested call, on the same (the runtime's) dependency.
    #[idempotent(key = "order", scope = "shop.place", runtime = &self.rt, retries = 3,
                 backoff = "10ms..100ms")]
    async fn place(&self, order: u64) -> Result<u64, TestError> {
        self.charges.fetch_add(1, Ordering::SeqCst);
        self.ship(order).await?;
        Ok(order)
    }

    #[idempotent(key = "order", scope = "shop.ship", runtime = &self.rt, retries = 3,
                 backoff = "10ms..100ms", on_busy = "reject")]
    async fn ship(&self, order: u64) -> Result<u64, TestError> {
        let limited = self
            .rate_limited
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if limited.is_ok() {
            return Err(TestError::RateLimited { retry_after_ms: 10 });
        }
        if self.hold_shipments.load(Ordering::SeqCst) {
            self.ship_gate.notified().await;
        }
        // The provider takes a moment: orders placed together are in flight together.
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.shipments.fetch_add(1, Ordering::SeqCst);
        Ok(order)
    }
}

fn runtime() -> Runtime {
    Runtime::builder()
        .node("shop")
        .clock(TokioClock::new())
        .jitter_seed(5)
        .concurrency_limit(ConcurrencyLimit::adaptive().max(8))
        .retry_budget(samekey::limits::RetryBudget::unlimited())
        .build()
        .unwrap()
}

/// Defect 1 of issue 24: after one `RateLimited` answer with two calls in flight the limit is 1, the
/// outer call holds that place for its whole life, and its nested call used to wait for a place
/// forever (then `Overloaded`, which lowered the limit again): every nested order refused, for good.
/// A nested call runs on its parent's place, and the limit recovers once the provider does.
#[tokio::test(start_paused = true)]
async fn a_nested_call_never_waits_for_its_parent_s_place_and_the_limit_recovers() {
    let shop = Shop::new(runtime());
    // A shipment answered 429 on each of its four attempts: the limit drops to 1.
    shop.rate_limited.store(4, Ordering::SeqCst);
    assert!(matches!(
        shop.ship(1).await,
        Err(TestError::RateLimited { .. })
    ));
    assert_eq!(shop.rt.concurrency_limit(None), Some(1));
    // The provider has recovered: every later nested order goes through, one after the other, and
    // then eight at a time, whose successes open the limit again.
    for order in 10..20 {
        assert_eq!(shop.place(order).await, Ok(order), "order {order}");
    }
    for batch in 0..10u64 {
        let mut orders = tokio::task::JoinSet::new();
        for n in 0..8 {
            let shop = shop.clone();
            let order = 100 + batch * 8 + n;
            orders.spawn(async move { (order, shop.place(order).await) });
        }
        while let Some(done) = orders.join_next().await {
            let (order, placed) = done.unwrap();
            assert_eq!(placed, Ok(order), "order {order}");
        }
    }
    assert_eq!(shop.charges.load(Ordering::SeqCst), 90);
    assert_eq!(shop.shipments.load(Ordering::SeqCst), 90);
    assert_eq!(
        shop.rt.stats().overloaded,
        0,
        "no call was refused for want of a place"
    );
    assert_eq!(shop.rt.concurrency_limit(None), None, "unlimited again");
}

/// Defect 9 of issue 24: the outer body charged, then its nested call found its key busy
/// (`on_busy = "reject"`) and answered `InProgress`, passed up with `?`. Classified "known not
/// executed", the outer call retried (charging again) and, its retries spent, gave its key back: the
/// customer's retry charged once more. A samekey refusal passed up from a nested call leaves the outer
/// call `UNKNOWN`, its key held, one charge.
#[tokio::test(start_paused = true)]
async fn a_nested_refusal_never_gives_the_outer_key_back() {
    let shop = Shop::new(runtime());
    // Shipment 7 is held in flight by a call of its own.
    shop.hold_shipments.store(true, Ordering::SeqCst);
    let shipping = tokio::spawn({
        let shop = shop.clone();
        async move { shop.ship(7).await }
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    let placed = shop.place(7).await;
    assert!(
        matches!(placed, Err(TestError::Samekey(Error::Unknown { .. }))),
        "the outer call's outcome is unknown, not a plain failure: {placed:?}"
    );
    assert_eq!(
        shop.charges.load(Ordering::SeqCst),
        1,
        "charged once, not retried"
    );
    // The customer retries: the outer key is still held, nothing is charged again.
    let again = shop.place(7).await;
    assert!(
        matches!(again, Err(TestError::Samekey(Error::Unknown { .. }))),
        "{again:?}"
    );
    assert_eq!(
        shop.charges.load(Ordering::SeqCst),
        1,
        "never charged twice"
    );
    let key = samekey::Key::build("shop.place", &7u64);
    let receipt = shop.rt.store().get(&key, 0).await.unwrap();
    assert_eq!(receipt.map(|r| r.state), Some(ReceiptState::Unknown));
    assert_eq!(shop.rt.compensations().await.unwrap().len(), 1);
    shop.ship_gate.notify_waiters();
    assert_eq!(shipping.await.unwrap(), Ok(7));
}

/// Charges on a bounded in-memory store, one record at most.
struct Bounded {
    rt: Runtime,
    charges: AtomicU32,
}

impl Bounded {
    #[idempotent(key = "order", scope = "bounded.charge", runtime = &self.rt)]
    async fn charge(&self, order: u64) -> Result<u64, TestError> {
        self.charges.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(order * 100)
    }
}

/// Defect 4 of issue 24: the typical state of a full store, a duplicate parked on a call in flight.
/// The first call's completion wakes the duplicate; before it reads, a new key evicts the finished
/// receipt to make room. The duplicate used to find nothing, claim afresh and charge again; it is
/// handed the settled receipt and replays it.
#[tokio::test(start_paused = true)]
async fn a_duplicate_woken_on_a_full_store_replays_the_receipt_it_waited_for() {
    let shop = Arc::new(Bounded {
        rt: Runtime::builder()
            .node("bounded")
            .clock(TokioClock::new())
            .store(samekey::MemoryStore::with_capacity(1))
            .build()
            .unwrap(),
        charges: AtomicU32::new(0),
    });
    // The second branch hands back the duplicate's task, to be awaited after the new key's call.
    #[allow(clippy::async_yields_async)]
    let (first, duplicate) = tokio::join!(shop.charge(1), async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let shop = shop.clone();
        tokio::spawn(async move { shop.charge(1).await })
    });
    assert_eq!(first, Ok(100));
    // In the same poll as the first call's completion, before the woken duplicate runs: a new key
    // takes the store's only place.
    assert_eq!(shop.charge(2).await, Ok(200));
    assert_eq!(duplicate.await.unwrap(), Ok(100), "the first call's result");
    assert_eq!(
        shop.charges.load(Ordering::SeqCst),
        2,
        "order 1 charged once"
    );
}

/// A shop whose shipping is a dependency of its own (`budget = "shipping"`), with a limit of its own.
struct TwoDependencies {
    rt: Runtime,
    charges: AtomicU32,
    rate_limited: AtomicU32,
    hold: Notify,
}

impl TwoDependencies {
    #[idempotent(key = "order", scope = "two.place", runtime = &self.rt, retries = 0)]
    async fn place(&self, order: u64) -> Result<u64, TestError> {
        self.charges.fetch_add(1, Ordering::SeqCst);
        self.ship(order, false).await?;
        Ok(order)
    }

    #[idempotent(key = "order", scope = "two.ship", runtime = &self.rt, retries = 3,
                 backoff = "10ms..100ms", budget = "shipping")]
    async fn ship(&self, order: u64, hold: bool) -> Result<u64, TestError> {
        let limited = self
            .rate_limited
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if limited.is_ok() {
            return Err(TestError::RateLimited { retry_after_ms: 10 });
        }
        if hold {
            self.hold.notified().await;
        }
        Ok(order)
    }
}

/// A nested call runs on its parent's place only in its parent's own limiter: on another dependency,
/// whose limit is full, it waits for a place there like any call, and is refused `Overloaded` — which
/// leaves the outer call `UNKNOWN` (its body charged), never retried or given back.
#[tokio::test(start_paused = true)]
async fn a_nested_call_on_another_dependency_waits_in_its_own_limit() {
    let shop = Arc::new(TwoDependencies {
        rt: Runtime::builder()
            .node("two")
            .clock(TokioClock::new())
            .concurrency(
                "shipping",
                ConcurrencyLimit::adaptive().max_wait(Duration::from_millis(100)),
            )
            .retry_budget(samekey::limits::RetryBudget::unlimited())
            .build()
            .unwrap(),
        charges: AtomicU32::new(0),
        rate_limited: AtomicU32::new(4),
        hold: Notify::new(),
    });
    // Shipping's limit down to 1, and its one place held by a shipment in flight.
    assert!(shop.ship(1, false).await.is_err());
    assert_eq!(shop.rt.concurrency_limit(Some("shipping")), Some(1));
    let held = tokio::spawn({
        let shop = shop.clone();
        async move { shop.ship(2, true).await }
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    let placed = shop.place(3).await;
    assert!(
        matches!(placed, Err(TestError::Samekey(Error::Unknown { .. }))),
        "{placed:?}"
    );
    assert_eq!(shop.charges.load(Ordering::SeqCst), 1);
    assert!(shop.place(3).await.is_err(), "the key is held");
    assert_eq!(
        shop.charges.load(Ordering::SeqCst),
        1,
        "never charged twice"
    );
    assert_eq!(shop.rt.stats().overloaded, 1);
    shop.hold.notify_waiters();
    assert_eq!(held.await.unwrap(), Ok(2));
}
