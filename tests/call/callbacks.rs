//! Callback dedup on every backend: a payment callback delivered three times at once and again after
//! a restart applies once, the downstream work runs once, a backwards delivery is refused.

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use samekey::{
    callback::Applied, callback::Callback, idempotent, journal::EventKind, CallId, Error,
    ReceiptState, Runtime, Store,
};
use support::stores::*;
use support::{Fault, Remote, TestError};

struct Shop {
    rt: Runtime,
    remote: Remote,
    shipped: Arc<AtomicU32>,
}

impl Shop {
    fn on(store: Arc<dyn Store>, shipped: Arc<AtomicU32>) -> Shop {
        Shop {
            rt: Runtime::builder()
                .node("shop")
                .shared_store(store)
                .build()
                .unwrap(),
            remote: Remote::default(),
            shipped,
        }
    }

    #[idempotent(key = "order", scope = "callbacks.charge", runtime = &self.rt, timeout = "1s", on_unknown = "hold")]
    async fn charge(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    /// A charge that takes a while (no timeout: its owner holds the key while it runs).
    #[idempotent(key = "order", scope = "callbacks.slow", runtime = &self.rt)]
    async fn charge_slowly(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    /// The downstream work: idempotent by the order, so it runs once however often it is asked.
    #[idempotent(key = "order", scope = "callbacks.ship", runtime = &self.rt)]
    async fn ship(&self, order: &str) -> Result<u32, TestError> {
        Ok(self.shipped.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// The provider's callback handler.
    async fn on_paid(&self, call_id: &CallId, order: &str, amount: u64) -> Result<Applied, Error> {
        let applied = self
            .rt
            .apply_callback(call_id, Callback::succeeded(&amount)?)
            .await?;
        self.ship(order).await.expect("ship");
        Ok(applied)
    }
}

fn order(what: &str) -> String {
    format!("{what}-{:x}", samekey::TraceId::new().as_u128())
}

async fn callback_scenarios(store: Arc<dyn Store>) {
    let shipped = Arc::new(AtomicU32::new(0));
    let shop = Arc::new(Shop::on(store.clone(), shipped.clone()));
    let order = order("cb");
    // The charge's reply is lost: UNKNOWN, queued; the provider charged and will call back.
    shop.remote.script([Fault::LoseReply]);
    let call_id = match shop.charge(&order, 500).await {
        Err(TestError::Samekey(Error::Unknown { call_id })) => call_id,
        other => panic!("{other:?}"),
    };

    let mut deliveries = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let (shop, call_id, order) = (shop.clone(), call_id.clone(), order.clone());
        deliveries.spawn(async move { shop.on_paid(&call_id, &order, 500).await });
    }
    let mut applied = Vec::new();
    while let Some(done) = deliveries.join_next().await {
        applied.push(done.unwrap().unwrap());
    }
    applied.sort_by_key(|a| *a == Applied::AlreadyApplied);
    assert_eq!(
        applied,
        [
            Applied::Applied,
            Applied::AlreadyApplied,
            Applied::AlreadyApplied
        ]
    );
    assert_eq!(shipped.load(Ordering::SeqCst), 1, "shipped once");
    let receipt = shop.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, ReceiptState::Success);
    assert!(
        shop.rt
            .compensations()
            .await
            .unwrap()
            .iter()
            .all(|e| e.call_id != call_id),
        "the callback settled the queued call"
    );
    assert_eq!(
        shop.charge(&order, 500).await,
        Ok(500),
        "a duplicate replays"
    );

    // A restart: another process on the same store gets the provider's next delivery.
    let restarted = Shop::on(store, shipped.clone());
    assert_eq!(
        restarted.on_paid(&call_id, &order, 500).await.unwrap(),
        Applied::AlreadyApplied
    );
    assert_eq!(shipped.load(Ordering::SeqCst), 1, "still shipped once");

    // A late "declined" for a paid call is refused and changes nothing.
    match restarted
        .rt
        .apply_callback(&call_id, Callback::failed("card declined"))
        .await
    {
        Err(Error::TransitionRefused { from, to, .. }) => {
            assert_eq!((from, to), (ReceiptState::Success, ReceiptState::Failed));
        }
        other => panic!("{other:?}"),
    }
    let receipt = restarted.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, ReceiptState::Success);
    // The provider contradicts the record: queued for a person (the worker pages them), once.
    let queued = |entries: Vec<samekey::compensation::CompensationEntry>| {
        entries.iter().filter(|e| e.call_id == call_id).count()
    };
    assert_eq!(queued(restarted.rt.compensations().await.unwrap()), 1);
    assert!(matches!(
        restarted
            .rt
            .apply_callback(&call_id, Callback::failed("card declined"))
            .await,
        Err(Error::TransitionRefused { .. })
    ));
    assert_eq!(queued(restarted.rt.compensations().await.unwrap()), 1);

    let stranger = CallId::new("pay", "elsewhere").unwrap();
    assert!(matches!(
        restarted
            .rt
            .apply_callback(&stranger, Callback::failed("?"))
            .await,
        Err(Error::NoReceipt { .. })
    ));

    // The journal, read by another process: the lost reply, the deliveries, the refusal.
    let whats: Vec<EventKind> = restarted
        .rt
        .history(&call_id)
        .await
        .unwrap()
        .events
        .into_iter()
        .map(|e| e.what)
        .collect();
    assert!(
        whats.iter().any(|w| matches!(w, EventKind::Unknown { .. })),
        "{whats:?}"
    );
    let deliveries = |applied: bool| {
        whats
            .iter()
            .filter(|w| {
                **w == EventKind::Callback {
                    state: ReceiptState::Success,
                    applied,
                }
            })
            .count()
    };
    assert_eq!((deliveries(true), deliveries(false)), (1, 3), "{whats:?}");
    assert_eq!(
        whats.last(),
        Some(&EventKind::CallbackRefused {
            from: ReceiptState::Success,
            to: ReceiptState::Failed
        })
    );
}

/// A callback that arrives while the call's owner still runs waits for it, then judges.
async fn callback_before_the_reply(store: Arc<dyn Store>) {
    let shipped = Arc::new(AtomicU32::new(0));
    let shop = Arc::new(Shop::on(store, shipped));
    let order = order("early");
    shop.remote
        .script([Fault::Slow(std::time::Duration::from_millis(300))]);
    let owner = tokio::spawn({
        let (shop, order) = (shop.clone(), order.clone());
        async move { shop.charge_slowly(&order, 500).await }
    });
    let call_id: CallId = loop {
        if let Some(seen) = shop.remote.call_ids().first() {
            break seen.parse().unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    let applied = shop
        .rt
        .apply_callback(&call_id, Callback::succeeded(&500u64).unwrap())
        .await
        .unwrap();
    assert_eq!(
        applied,
        Applied::AlreadyApplied,
        "the owner recorded it first"
    );
    assert_eq!(owner.await.unwrap(), Ok(500));
    assert_eq!(shop.remote.effects(&order), 1);
}

/// A "paid" callback for a charge this side recorded as declined is refused, journaled, and ships
/// nothing: the receipt stays FAILED, in this process and after a restart. The first refusal queues
/// the call for a person (the provider says it took effect); the repeat neither journals nor queues
/// again.
async fn a_late_success_for_a_declined_call_is_refused(store: Arc<dyn Store>) {
    let shipped = Arc::new(AtomicU32::new(0));
    let shop = Shop::on(store.clone(), shipped.clone());
    let order = order("declined");
    shop.remote.script([Fault::Reject]);
    let (out, report) = samekey::observe::observed(shop.charge(&order, 500)).await;
    assert!(matches!(out, Err(TestError::Rejected)), "{out:?}");
    let call_id = report.expect("reported").call_id().clone();

    let restarted = Shop::on(store, shipped.clone());
    for shop in [&shop, &restarted] {
        match shop.on_paid(&call_id, &order, 500).await {
            Err(Error::TransitionRefused { from, to, .. }) => {
                assert_eq!((from, to), (ReceiptState::Failed, ReceiptState::Success));
            }
            other => panic!("{other:?}"),
        }
        let receipt = shop.rt.receipt(&call_id).await.unwrap().unwrap();
        assert_eq!(receipt.state, ReceiptState::Failed);
    }
    assert_eq!(shipped.load(Ordering::SeqCst), 0, "nothing shipped");
    let refused = restarted
        .rt
        .history(&call_id)
        .await
        .unwrap()
        .events
        .into_iter()
        .filter(|e| {
            e.what
                == EventKind::CallbackRefused {
                    from: ReceiptState::Failed,
                    to: ReceiptState::Success,
                }
        })
        .count();
    assert_eq!(
        refused, 1,
        "the first refusal journaled, the repeat only logged"
    );
    let queued: Vec<_> = restarted
        .rt
        .compensations()
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.call_id == call_id)
        .collect();
    assert_eq!(queued.len(), 1, "queued for a person");
    assert_eq!(
        queued[0].last_error,
        Some(samekey::journal::AttemptOutcome::Ok),
        "it took effect, by the provider's word"
    );
}

support::on_stores!(memory, local_cache, sqlite if "sqlite", postgres if "postgres", mysql if "mysql", mysql_cached if "mysql" & "redis", redis if "redis" => {
    callback_scenarios,
    callback_before_the_reply,
    a_late_success_for_a_declined_call_is_refused,
});

/// A delivery that stalls while writing the outcome (its process paused, or its caller gone) past
/// its lease: the key is never released, a later delivery takes over and applies, and the stalled
/// one, fenced out, answers what is recorded.
#[tokio::test]
async fn a_delivery_stalled_at_its_write_is_fenced_out_and_the_next_applies() {
    use std::time::Duration;
    use support::faulty::{Act, Faulty, Gate};
    let faulty = Arc::new(Faulty::new(Arc::new(samekey::MemoryStore::new())));
    let shipped = Arc::new(AtomicU32::new(0));
    let shop = Arc::new(Shop {
        rt: Runtime::builder()
            .node("shop")
            .lease(Duration::from_millis(200))
            .shared_store(faulty.clone())
            .build()
            .unwrap(),
        remote: Remote::default(),
        shipped: shipped.clone(),
    });
    let first = order("stall");
    shop.remote.script([Fault::LoseReply]);
    let call_id = match shop.charge(&first, 500).await {
        Err(TestError::Samekey(Error::Unknown { call_id })) => call_id,
        other => panic!("{other:?}"),
    };
    let gate = Gate::new();
    faulty.plan("complete", [Act::Before(gate.clone())]);
    let stalled = tokio::spawn({
        let (shop, call_id, order) = (shop.clone(), call_id.clone(), first.clone());
        async move { shop.on_paid(&call_id, &order, 500).await }
    });
    gate.reached().await;
    // The stalled delivery took the key over and waits at its write: nothing released meanwhile.
    let receipt = shop.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, ReceiptState::Processing);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        shop.on_paid(&call_id, &first, 500).await.unwrap(),
        Applied::Applied,
        "the next delivery takes the lapsed key over"
    );
    gate.open();
    assert_eq!(
        stalled.await.unwrap().unwrap(),
        Applied::AlreadyApplied,
        "fenced out, it answers the recorded outcome"
    );
    assert_eq!(shipped.load(Ordering::SeqCst), 1);

    // Dropped at the same step: the key stays with the dropped delivery until its lease ends.
    let second = order("dropped");
    shop.remote.script([Fault::LoseReply]);
    let call_id = match shop.charge(&second, 500).await {
        Err(TestError::Samekey(Error::Unknown { call_id })) => call_id,
        other => panic!("{other:?}"),
    };
    let gate = Gate::new();
    faulty.plan("complete", [Act::Before(gate.clone())]);
    let dropped = tokio::spawn({
        let (shop, call_id, order) = (shop.clone(), call_id.clone(), second.clone());
        async move { shop.on_paid(&call_id, &order, 500).await }
    });
    gate.reached().await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    let receipt = shop.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, ReceiptState::Processing, "not released");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        shop.on_paid(&call_id, &second, 500).await.unwrap(),
        Applied::Applied
    );
    assert_eq!(
        shipped.load(Ordering::SeqCst),
        2,
        "two orders, one parcel each"
    );
}
