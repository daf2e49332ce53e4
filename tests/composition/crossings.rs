//! Features composed, as a skeptical reviewer of issue 24 attacked them (each of the first six made
//! the library act twice, answer wrong or lose a call before its fix; the doc comments tell the
//! attack): a bounded memory store whose waiter is woken by a take-over, an inbox on the producer's
//! own runtime and store, a provider that keeps calling back during a reversal, a callback during a
//! reversal whose lease lapsed, a worker behind a `LocalCache`; and compositions that held: the core
//! dropped during its lookup, a nested call dropped by its parent's timeout, a duplicate during a
//! slow re-run. In-memory, paused time.
//!
//! (Was `tests/composition_attacks.rs`: two features whose paths cross on one call, one key or one
//! queue entry.)

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::{
    callback::Callback, clock::TokioClock, compensation::CompensationOperation,
    compensation::CompensationState, idempotent, CallId, Compensator, Error, ReceiptState,
    RemoteStatus, Runtime,
};
use samekey_messaging::{Envelope, Inbox};
use support::{Fault, Remote, TestClock, TestError};

// ---------------------------------------------------------------------------------------------
// 1. A bounded memory store: a duplicate parked on a call in flight is woken by a take-over, not
//    by the settlement, and so is handed nothing; the settled receipt is evicted before it reads.
// ---------------------------------------------------------------------------------------------

/// Charges on a memory store that holds one record; the first attempt of order 1 hangs (its owner
/// stalls), every other one charges at once. The remote answers every lookup "succeeded".
struct Tiny {
    rt: Runtime,
    charges: Mutex<HashMap<u64, u32>>,
}

impl Tiny {
    fn charged(&self, order: u64) -> u32 {
        self.charges
            .lock()
            .unwrap()
            .get(&order)
            .copied()
            .unwrap_or(0)
    }

    async fn status(&self, _call: &CallId) -> Result<RemoteStatus<u64, TestError>, String> {
        Ok(RemoteStatus::Succeeded(100))
    }

    #[idempotent(key = "order", scope = "review.tiny", runtime = &self.rt, lookup = |c| self.status(c))]
    async fn charge(&self, order: u64) -> Result<u64, TestError> {
        let n = {
            let mut charges = self.charges.lock().unwrap();
            let n = charges.entry(order).or_default();
            *n += 1;
            *n
        };
        if order == 1 && n == 1 {
            // The first owner stalls after it charged (a GC pause, a SIGSTOP): its reply never comes.
            std::future::pending::<()>().await;
        }
        Ok(order * 100)
    }
}

/// Defect 4 of issue 24 was fixed for a waiter woken by the settlement; a waiter woken by a
/// take-over (the record still PROCESSING) is handed nothing and reads the key again when it is
/// polled. Meanwhile the taker settles the call and a new key evicts the settled receipt: the waiter
/// finds no record, claims afresh under a new callId and charges order 1 a second time.
#[tokio::test(flavor = "current_thread")]
async fn a_waiter_woken_by_a_take_over_is_handed_what_the_new_owner_settles() {
    let clock = TestClock::default();
    let shop = Arc::new(Tiny {
        rt: Runtime::builder()
            .node("tiny")
            .clock(clock.clone())
            .store(samekey::MemoryStore::with_capacity(1))
            .lease(Duration::from_secs(60))
            .build()
            .unwrap(),
        charges: Mutex::new(HashMap::new()),
    });
    // A: charges order 1, then stalls.
    let owner = tokio::spawn({
        let shop = shop.clone();
        async move { shop.charge(1).await }
    });
    tokio::task::yield_now().await;
    assert_eq!(shop.charged(1), 1);
    // D1: a duplicate, parked on A's claim (its lease is alive).
    let waiter = tokio::spawn({
        let shop = shop.clone();
        async move { shop.charge(1).await }
    });
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    // A stalled past its lease (by the store's clock).
    clock.advance(Duration::from_secs(3600));
    // D2 takes the key over (waking D1 with a record still PROCESSING), asks the remote (charged)
    // and records SUCCESS; then a new key, on the full store, evicts that receipt. All before D1 is
    // polled again.
    assert_eq!(
        shop.charge(1).await,
        Ok(100),
        "the taker records the charge"
    );
    assert_eq!(shop.charge(2).await, Ok(200));
    let waited = waiter.await.unwrap();
    owner.abort();
    assert_eq!(
        shop.charged(1),
        1,
        "order 1 charged {} times: the duplicate that waited for the call in flight ran it again \
         (it answered {waited:?})",
        shop.charged(1)
    );
}

// ---------------------------------------------------------------------------------------------
// 2. An inbox on the producer's own runtime: the first message's work runs under the producer's
//    callId, so two records of one store share a callId.
// ---------------------------------------------------------------------------------------------

/// Charges an order and publishes "charged" to an in-process outbox from the call's body, as
/// `Envelope::new` is meant to be used; the provider's reply never comes (1 s timeout, held).
struct Orders {
    rt: Runtime,
    outbox: Mutex<Vec<Envelope<String>>>,
}

impl Orders {
    fn new() -> Orders {
        Orders {
            rt: Runtime::builder()
                .node("orders")
                .clock(TokioClock::new())
                .build()
                .unwrap(),
            outbox: Mutex::new(Vec::new()),
        }
    }

    #[idempotent(key = "order", scope = "review.orders.charge", runtime = &self.rt,
                 timeout = "1s", on_unknown = "hold")]
    async fn charge(&self, order: &str) -> Result<u64, TestError> {
        self.outbox
            .lock()
            .unwrap()
            .push(Envelope::new(order.to_owned()));
        // The payment provider took it; its reply is lost.
        std::future::pending::<()>().await;
        Ok(500)
    }

    /// The charge, left UNKNOWN, and the message it published.
    async fn unknown_charge(&self, order: &str) -> (CallId, Envelope<String>) {
        let call_id = match self.charge(order).await {
            Err(TestError::Samekey(Error::Unknown { call_id })) => call_id,
            other => panic!("{other:?}"),
        };
        let message = self.outbox.lock().unwrap().pop().unwrap();
        assert_eq!(
            message.call_id, call_id,
            "the message carries the call's id"
        );
        (call_id, message)
    }

    /// A charge left UNKNOWN and its message's work, on an inbox of the same runtime, UNKNOWN too.
    async fn both_unknown(order: &str) -> (Orders, Inbox, CallId, Envelope<String>) {
        let orders = Orders::new();
        let inbox = Inbox::new("review.shipping.on_charged").runtime(&orders.rt);
        let (call_id, message) = orders.unknown_charge(order).await;
        orders.deliver_unknown(&inbox, message.clone()).await;
        (orders, inbox, call_id, message)
    }

    /// The consumer's delivery, whose handler's outcome is unknown too (its label printer timed
    /// out): the inbox leaves it UNKNOWN for compensation.
    async fn deliver_unknown(&self, inbox: &Inbox, message: Envelope<String>) {
        let delivered = inbox
            .deliver(message, |_order| async move {
                Err::<u64, TestError>(TestError::Reset)
            })
            .await;
        assert!(
            matches!(delivered, Err(TestError::Samekey(Error::Unknown { .. }))),
            "{delivered:?}"
        );
    }
}

/// The payment provider's callback about the charge (by the charge's callId) used to land on the
/// inbox's record, which carried the same callId: the charge stayed UNKNOWN with its compensation
/// entry removed (lost), and the message's redelivery replayed the payment's amount as the handler's
/// result. The work now has a callId of its own: the callback settles the charge.
#[tokio::test(start_paused = true)]
async fn a_callback_about_a_call_never_lands_on_its_message_s_work() {
    let (orders, inbox, call_id, message) = Orders::both_unknown("o-1").await;

    let applied = orders
        .rt
        .apply_callback(&call_id, Callback::succeeded(&500u64).unwrap())
        .await;
    let charge_key = samekey::Key::build("review.orders.charge", &"o-1");
    let charge = orders
        .rt
        .store()
        .get(&charge_key, 0)
        .await
        .unwrap()
        .unwrap();
    let queued = orders.rt.compensations().await.unwrap();
    let redelivered = inbox
        .deliver(message, |_order| async move { Ok::<u64, TestError>(1) })
        .await;
    assert_eq!(applied, Ok(samekey::callback::Applied::Applied));
    assert_eq!(
        charge.state,
        ReceiptState::Success,
        "the callback settled the charge"
    );
    // What is left queued is the message's work, under a callId of its own, still undecided.
    let queued: Vec<CallId> = queued.into_iter().map(|e| e.call_id).collect();
    assert_eq!(queued.len(), 1, "{queued:?}");
    assert_ne!(queued[0], call_id);
    assert!(
        matches!(
            redelivered,
            Err(TestError::Samekey(Error::Unknown { call_id: ref work })) if *work == queued[0]
        ),
        "the redelivery answers the work's own outcome, not the payment's: {redelivered:?}"
    );
}

/// Both the charge and its message's work are UNKNOWN. The store queues one compensation entry per
/// callId, so under one callId the second was dropped: the inbox's call stayed UNKNOWN with nothing
/// queued. Each now has its own entry, and the worker settles both.
#[tokio::test(start_paused = true)]
async fn the_work_of_a_message_is_compensated_beside_its_producer() {
    let (orders, inbox, _call_id, message) = Orders::both_unknown("o-2").await;

    let succeeded = |value: u64| {
        CompensationOperation::new(move |_call: CallId| async move {
            Ok::<_, String>(RemoteStatus::<u64, String>::Succeeded(value))
        })
    };
    let pass = Compensator::new(&orders.rt)
        .operation("review.orders.charge", succeeded(500))
        .operation("review.shipping.on_charged", succeeded(7))
        .settle()
        .await
        .unwrap();
    let unknown: Vec<_> = orders
        .rt
        .store()
        .list_receipts(
            &samekey::store::ReceiptQuery::created_between(0, u64::MAX)
                .states([ReceiptState::Unknown]),
            orders.rt.now_ms(),
        )
        .await
        .unwrap()
        .receipts;
    let queued = orders.rt.compensations().await.unwrap();
    let redelivered = inbox
        .deliver(message, |_order| async move { Ok::<u64, TestError>(1) })
        .await;
    assert!(
        unknown.is_empty() && queued.is_empty(),
        "after the worker settled everything it was given ({pass:?}), {} receipt(s) remain \
         UNKNOWN ({:?}), {} queued",
        unknown.len(),
        unknown
            .iter()
            .map(|r| r.key.scope().to_owned())
            .collect::<Vec<_>>(),
        queued.len()
    );
    assert_eq!(
        pass.succeeded, 2,
        "the charge and its message's work, each its own entry"
    );
    assert_eq!(redelivered, Ok(7), "the work's recorded outcome");
}

// ---------------------------------------------------------------------------------------------
// 3. A reversal begun and never ended stops every take-over — as long as the bounded journal
//    still holds its intent.
// ---------------------------------------------------------------------------------------------

struct Pay {
    rt: Runtime,
    remote: Remote,
}

impl Pay {
    fn new(rt: Runtime) -> Pay {
        Pay {
            rt,
            remote: Remote::default(),
        }
    }

    #[idempotent(key = "order", scope = "review.pay", runtime = &self.rt, timeout = "1s",
                 lookup = |c| self.remote.status(c))]
    async fn charge_checked(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", scope = "review.pay", runtime = &self.rt, timeout = "1s",
                 on_unknown = "hold", inputs = "order, amount")]
    async fn charge(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    fn lookup(&self) -> CompensationOperation {
        let remote = self.remote.clone();
        CompensationOperation::new(move |call: CallId| {
            let remote = remote.clone();
            async move { remote.status(&call).await }
        })
    }

    /// A reversal that counts its runs and ends when `release` is notified.
    fn reversing(
        &self,
        runs: Arc<AtomicU32>,
        release: Arc<tokio::sync::Notify>,
    ) -> CompensationOperation {
        self.lookup().reversal(move |_entry| {
            let (runs, release) = (runs.clone(), release.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                release.notified().await;
                Ok::<(), samekey::Error>(())
            }
        })
    }

    /// The provider's callback "succeeded" about a call being reversed: not applied, `Unknown`.
    async fn callback_left_to_a_person(&self, call_id: &CallId) {
        let callback = self
            .rt
            .apply_callback(call_id, Callback::succeeded(&700u64).unwrap())
            .await;
        assert!(
            matches!(callback, Err(Error::Unknown { .. })),
            "{callback:?}"
        );
    }

    /// A charge whose request was lost: UNKNOWN and queued; its remote says "not received".
    async fn lost(&self, order: &str) -> CallId {
        self.remote.script([Fault::LoseRequest]);
        match self.charge(order, 700).await {
            Err(TestError::Samekey(Error::Unknown { call_id })) => call_id,
            other => panic!("{other:?}"),
        }
    }
}

/// A worker dies mid-reversal: its intent (`Reversing`) stays in the journal and every take-over
/// must act on nothing. The provider keeps delivering its callback; each delivery is refused and
/// journals one event, and the key's journal keeps its latest 256 events only. Once the intent has
/// been pushed out, a duplicate takes the key over, hears "not received" and charges: the order is
/// both reversed and performed, beside a MANUAL entry a person has not checked yet.
#[tokio::test(start_paused = true)]
async fn repeated_callbacks_never_push_a_reversal_out_of_the_journal() {
    let pay = Pay::new(
        Runtime::builder()
            .node("pay")
            .clock(TokioClock::new())
            .build()
            .unwrap(),
    );
    let call_id = pay.lost("o-3").await;
    let runs = Arc::new(AtomicU32::new(0));
    let never = Arc::new(tokio::sync::Notify::new());
    let dying = Compensator::new(&pay.rt)
        .operation("review.pay", pay.reversing(runs.clone(), never))
        .lease(Duration::from_secs(10));
    // The worker's process dies mid-reversal: its pass is dropped.
    assert!(
        tokio::time::timeout(Duration::from_secs(1), dying.run_once())
            .await
            .is_err()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the reversal began");
    tokio::time::advance(Duration::from_secs(30)).await;
    // The next worker finds the intent and asks a person.
    let pass = Compensator::new(&pay.rt)
        .operation("review.pay", pay.lookup())
        .run_once()
        .await
        .unwrap();
    assert_eq!(pass.escalated, 1, "{pass:?}");
    // The provider retries its callback (every few minutes over a day or so): refused each time.
    let key = samekey::Key::build("review.pay", &"o-3");
    let intent_kept = || async {
        pay.rt
            .history_of_key(&key)
            .await
            .unwrap()
            .events
            .iter()
            .any(|e| {
                matches!(
                    e.what,
                    samekey::journal::EventKind::Compensation {
                        step: samekey::journal::CompensationStep::Reversing,
                        ..
                    }
                )
            })
    };
    let mut deliveries = 0;
    while intent_kept().await && deliveries < 400 {
        let callback = Callback::succeeded(&700u64).unwrap();
        let answer = pay.rt.apply_callback(&call_id, callback).await;
        assert!(matches!(answer, Err(Error::Unknown { .. })), "{answer:?}");
        deliveries += 1;
    }
    // A duplicate that may ask.
    let duplicate = pay.charge_checked("o-3", 700).await;
    let entry = pay.rt.compensations().await.unwrap();
    assert_eq!(
        pay.remote.effects("o-3"),
        0,
        "after {deliveries} refused callback deliveries the journal no longer held the reversal's \
         intent: a duplicate charged ({duplicate:?}) an order whose reversal began; the MANUAL \
         entry is now {:?}",
        entry.first().map(|e| e.state)
    );
}

// ---------------------------------------------------------------------------------------------
// 4. A callback during a reversal whose worker stalled past its lease.
// ---------------------------------------------------------------------------------------------

/// The worker reverses a charge the provider said it never received, and stalls past its lease (the
/// store's clock moves on, its renewals do not come). The provider's callback says the charge went
/// through after all: it takes the key over, finds the reversal begun and is answered `Unknown`,
/// "left to compensation, a person settles it" (callback.rs). The worker then records the call
/// `FAILED` ("reversed") at its next round: a charge the provider confirmed is reported failed to
/// every duplicate, and no person is asked.
#[tokio::test(flavor = "current_thread")]
async fn a_callback_refused_during_a_reversal_goes_to_a_person() {
    let clock = TestClock::default();
    let pay = Arc::new(Pay::new(
        Runtime::builder()
            .node("pay")
            .clock(clock.clone())
            .build()
            .unwrap(),
    ));
    let call_id = pay.lost("o-4").await;
    let runs = Arc::new(AtomicU32::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let escalated = Arc::new(AtomicU32::new(0));
    let worker = Compensator::new(&pay.rt)
        .operation("review.pay", pay.reversing(runs.clone(), release.clone()))
        .lease(Duration::from_secs(30))
        .rounds([Duration::from_secs(1), Duration::from_secs(1)])
        .on_escalate({
            let escalated = escalated.clone();
            move |_| {
                escalated.fetch_add(1, Ordering::SeqCst);
            }
        });
    let reversing = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_once().await }
    });
    support::until_started(&runs).await;
    // The worker stalls: the store's clock passes its lease before any renewal.
    clock.advance(Duration::from_secs(120));
    pay.callback_left_to_a_person(&call_id).await;
    release.notify_one();
    let first = reversing.await.unwrap().unwrap();
    clock.advance(Duration::from_secs(5));
    let second = worker.run_once().await.unwrap();
    let receipt = pay.rt.receipt(&call_id).await.unwrap().unwrap();
    let queued = pay.rt.compensations().await.unwrap();
    assert!(
        receipt.state != ReceiptState::Failed
            || queued.iter().any(|e| e.state == CompensationState::Manual),
        "the provider's callback said the charge went through and was told \"unknown, left to \
         compensation\"; the worker then recorded it {} ({first:?}, then {second:?}), no entry is \
         left for a person (escalated {} times)",
        receipt.state,
        escalated.load(Ordering::SeqCst)
    );
}

// ---------------------------------------------------------------------------------------------
// 5. LocalCache in front of a shared store, and the compensation worker.
// ---------------------------------------------------------------------------------------------

/// Process 1 keeps a finished receipt in its `LocalCache`; an operator forgets the key through
/// process 2 (the customer may redo it), and the redo's charge is left `UNKNOWN` and queued. Process
/// 1's compensation worker reads the key through its cache, finds the old call's `SUCCESS`, takes the
/// entry for "settled elsewhere" and removes it: the redo stays `UNKNOWN` with nothing queued, lost.
/// (The cache's docs accept that process 1 *replays* a key forgotten elsewhere for `max_age`; not that
/// its worker drops another call's compensation.)
#[tokio::test(start_paused = true)]
async fn a_worker_behind_a_local_cache_keeps_the_entry_of_a_redo_after_a_forget() {
    let shared: Arc<dyn samekey::Store> = Arc::new(samekey::MemoryStore::new());
    let runtime = |node: &str, store: Arc<dyn samekey::Store>| {
        Runtime::builder()
            .node(node)
            .clock(TokioClock::new())
            .shared_store(store)
            .build()
            .unwrap()
    };
    let cached: Arc<dyn samekey::Store> = Arc::new(samekey::store::LocalCache::new(
        support::faulty::Faulty::new(shared.clone()),
        100,
    ));
    let first = Pay::new(runtime("p1", cached));
    let second = Pay::new(runtime("p2", shared.clone()));
    assert_eq!(first.charge("o-9", 700).await, Ok(700));
    let key = samekey::Key::build("review.pay", &"o-9");
    second
        .rt
        .forget(&key, "ops", "the customer may redo it")
        .await
        .unwrap();
    second.remote.script([Fault::LoseReply]);
    let redo = match second.charge("o-9", 700).await {
        Err(TestError::Samekey(Error::Unknown { call_id })) => call_id,
        other => panic!("{other:?}"),
    };
    let pass = Compensator::new(&first.rt)
        .operation(
            "review.pay",
            CompensationOperation::new(|_call: CallId| async move {
                Ok::<_, String>(RemoteStatus::<u64, String>::Succeeded(700))
            }),
        )
        .run_once()
        .await
        .unwrap();
    let record = shared.get(&key, first.rt.now_ms()).await.unwrap().unwrap();
    let queued = second.rt.compensations().await.unwrap();
    assert!(
        record.state != ReceiptState::Unknown || !queued.is_empty(),
        "the redo {redo} is {} with {} compensation entries after the worker's pass {pass:?}: its \
         entry was removed as settled elsewhere, on the strength of the cache's old receipt",
        record.state,
        queued.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Compositions that hold.
// ---------------------------------------------------------------------------------------------

/// A shipment on the public core, asking the carrier by callId after a timeout.
static SHIP: samekey::at_most_once::AtMostOnce =
    samekey::at_most_once::AtMostOnce::new("review.ship")
        .prefix("shp")
        .retries(2)
        .timeout(Duration::from_secs(1))
        .backoff(Duration::from_millis(10), Duration::from_millis(100));

/// `AtMostOnce::run_asking` with a timeout, its caller dropped while the lookup after the timeout is
/// still out: the key is not given back (the attempt may have run): it is `UNKNOWN` and queued, and
/// the next call takes it over, asks, and records the shipment that happened — one shipment.
#[tokio::test(start_paused = true)]
async fn at_most_once_dropped_during_its_lookup_keeps_the_key_and_the_next_call_asks() {
    let rt = Runtime::builder()
        .node("ship")
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let shipped = Arc::new(AtomicU32::new(0));
    let ship = |lookup_answers: bool| {
        let (rt, shipped) = (rt.clone(), shipped.clone());
        async move {
            SHIP.key(&"o-6")
                .runtime(&rt)
                .run_asking(
                    || {
                        let shipped = shipped.clone();
                        async move {
                            shipped.fetch_add(1, Ordering::SeqCst);
                            // Shipped; the carrier's reply is lost.
                            std::future::pending::<()>().await;
                            Ok::<u64, TestError>(0)
                        }
                    },
                    move |_call: CallId| async move {
                        if !lookup_answers {
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, String>(RemoteStatus::<u64, TestError>::Succeeded(42))
                    },
                )
                .await
        }
    };
    // Dropped half a second into the lookup.
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), ship(false))
            .await
            .is_err()
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    let key = samekey::Key::build("review.ship", &"o-6");
    let left = rt.store().get(&key, rt.now_ms()).await.unwrap().unwrap();
    assert_eq!(left.state, ReceiptState::Unknown, "not given back");
    assert_eq!(rt.compensations().await.unwrap().len(), 1);
    assert_eq!(
        ship(true).await,
        Ok(42),
        "the next call asks and records it"
    );
    assert_eq!(shipped.load(Ordering::SeqCst), 1, "shipped once");
    assert!(rt.compensations().await.unwrap().is_empty());
}

/// An outer call on the public core whose body makes a nested `#[idempotent]` call.
struct Chain {
    rt: Runtime,
    notified: AtomicU32,
}

impl Chain {
    /// Notifies once; its first request's reply never comes.
    #[idempotent(key = "order", scope = "review.chain.notify", runtime = &self.rt, on_unknown = "hold")]
    async fn notify(&self, order: &str) -> Result<(), TestError> {
        let _ = order;
        if self.notified.fetch_add(1, Ordering::SeqCst) == 0 {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

static PLACE: samekey::at_most_once::AtMostOnce =
    samekey::at_most_once::AtMostOnce::new("review.chain.place")
        .retries(2)
        .timeout(Duration::from_secs(1))
        .backoff(Duration::from_millis(10), Duration::from_millis(100));

/// The outer call's timeout drops its nested call mid-flight; the outer's lookup says "not received"
/// and it retries: the nested key, left `UNKNOWN` by the nested call's drop guard, is never run
/// again, and the outer call ends `UNKNOWN`, never "failed", both queued.
#[tokio::test(start_paused = true)]
async fn a_nested_call_dropped_by_its_parent_s_timeout_is_never_run_again() {
    let chain = Chain {
        rt: Runtime::builder()
            .node("chain")
            .clock(TokioClock::new())
            .retry_budget(samekey::limits::RetryBudget::unlimited())
            .build()
            .unwrap(),
        notified: AtomicU32::new(0),
    };
    let chain = &chain;
    let placed: Result<(), TestError> =
        PLACE
            .key(&"o-7")
            .runtime(&chain.rt)
            .run_asking(
                || async move { chain.notify("o-7").await },
                |_call: CallId| async move {
                    Ok::<_, String>(RemoteStatus::<(), TestError>::NotReceived)
                },
            )
            .await;
    assert!(
        matches!(placed, Err(TestError::Samekey(Error::Unknown { .. }))),
        "{placed:?}"
    );
    assert_eq!(chain.notified.load(Ordering::SeqCst), 1, "notified once");
    for scope in ["review.chain.place", "review.chain.notify"] {
        let key = samekey::Key::build(scope, &"o-7");
        let record = chain.rt.store().get(&key, chain.rt.now_ms()).await.unwrap();
        assert_eq!(
            record.map(|r| r.state),
            Some(ReceiptState::Unknown),
            "{scope}"
        );
    }
    assert_eq!(chain.rt.compensations().await.unwrap().len(), 2);
}

/// A worker re-sends a call not received (slower than its lease) while the caller comes back with a
/// duplicate: the duplicate waits for the worker (its lease kept alive) and replays what the
/// re-run recorded; one charge.
#[tokio::test(start_paused = true)]
async fn a_duplicate_during_a_slow_rerun_waits_and_replays_it() {
    let pay = Arc::new(Pay::new(
        Runtime::builder()
            .node("pay")
            .clock(TokioClock::new())
            .build()
            .unwrap(),
    ));
    pay.lost("o-8").await;
    let (started, release) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(tokio::sync::Notify::new()),
    );
    let remote = pay.remote.clone();
    let worker = Compensator::new(&pay.rt)
        .operation(
            "review.pay",
            pay.lookup().rerun({
                let (started, release) = (started.clone(), release.clone());
                move |entry: samekey::compensation::CompensationEntry| {
                    let (remote, started, release) =
                        (remote.clone(), started.clone(), release.clone());
                    async move {
                        started.fetch_add(1, Ordering::SeqCst);
                        release.notified().await;
                        remote.call_as(&entry.call_id, "o-8", || 700).await
                    }
                }
            }),
        )
        .lease(Duration::from_secs(10));
    let rerunning = tokio::spawn(async move { worker.run_once().await });
    support::until_started(&started).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let duplicate = tokio::spawn({
        let pay = pay.clone();
        async move { pay.charge_checked("o-8", 700).await }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    release.notify_one();
    assert_eq!(rerunning.await.unwrap().unwrap().succeeded, 1);
    assert_eq!(duplicate.await.unwrap(), Ok(700));
    assert_eq!(pay.remote.effects("o-8"), 1, "charged once");
}

// ---------------------------------------------------------------------------------------------
// A second reading of the same changes.
// ---------------------------------------------------------------------------------------------

/// A callback that comes while a live worker reverses the call (its lease kept alive) waits, then
/// finds the reversal open: it is answered `Unknown` and disputes it, and the worker, once its
/// reversal ran, asks a person instead of recording the call `FAILED` ("reversed").
#[tokio::test(start_paused = true)]
async fn a_callback_during_a_live_reversal_goes_to_a_person() {
    let pay = Arc::new(Pay::new(
        Runtime::builder()
            .node("pay")
            .clock(TokioClock::new())
            .busy_wait(Duration::from_secs(1))
            .build()
            .unwrap(),
    ));
    let call_id = pay.lost("o-10").await;
    let (runs, release) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(tokio::sync::Notify::new()),
    );
    let worker = Compensator::new(&pay.rt)
        .operation("review.pay", pay.reversing(runs.clone(), release.clone()))
        .lease(Duration::from_secs(30));
    let reversing = tokio::spawn(async move { worker.run_once().await });
    support::until_started(&runs).await;
    pay.callback_left_to_a_person(&call_id).await;
    release.notify_one();
    let pass = reversing.await.unwrap().unwrap();
    assert_eq!((pass.escalated, pass.reversed), (1, 0), "{pass:?}");
    let receipt = pay.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, ReceiptState::Unknown, "not recorded FAILED");
    let queued = pay.rt.compensations().await.unwrap();
    assert_eq!(queued[0].state, CompensationState::Manual);
}

/// One callId adopted by two keys (two requests that carried the same `X-Call-Id`): the first is
/// `UNKNOWN` and queued, the second settled. The worker reads the first key's record by its key, not
/// the second's by callId: the entry is worked (here: still undecided, rescheduled), never dropped as
/// "settled elsewhere".
#[tokio::test(start_paused = true)]
async fn a_call_id_on_two_keys_keeps_each_key_s_entry() {
    let pay = Pay::new(
        Runtime::builder()
            .node("pay")
            .clock(TokioClock::new())
            .build()
            .unwrap(),
    );
    let shared = CallId::new("req", "client").unwrap();
    pay.remote.script([Fault::LoseReply]);
    let first = samekey::context::InboundCall::new()
        .call_id(shared.clone())
        .scope(pay.charge("o-11", 700))
        .await;
    assert!(matches!(
        first,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));
    let second = samekey::context::InboundCall::new()
        .call_id(shared.clone())
        .scope(pay.charge("o-12", 700))
        .await;
    assert_eq!(second, Ok(700));
    let undecided = CompensationOperation::new(|_call: CallId| async {
        Ok::<_, String>(RemoteStatus::<u64, String>::Processing)
    });
    let pass = Compensator::new(&pay.rt)
        .operation("review.pay", undecided)
        .run_once()
        .await
        .unwrap();
    assert_eq!(
        (pass.settled_elsewhere, pass.rescheduled),
        (0, 1),
        "{pass:?}"
    );
    let key = samekey::Key::build("review.pay", &"o-11");
    let record = pay.rt.store().get(&key, 0).await.unwrap().unwrap();
    assert_eq!(record.state, ReceiptState::Unknown);
    assert_eq!(pay.rt.compensations().await.unwrap().len(), 1, "kept");
}

/// The public core builds the body's future inside the call's context: a plain closure that reads
/// `current()` before any await sees its own call, not an enclosing one (nor panics at top level).
#[tokio::test(start_paused = true)]
async fn the_core_s_body_is_made_in_its_own_call_s_context() {
    static READ: samekey::at_most_once::AtMostOnce =
        samekey::at_most_once::AtMostOnce::new("review.read").prefix("read");
    let rt = Runtime::new();
    let own = READ
        .key("top")
        .runtime(&rt)
        .run(|| std::future::ready(Ok::<_, TestError>(samekey::current().call_id().clone())))
        .await
        .unwrap();
    assert_eq!(own.prefix(), "read");
}
