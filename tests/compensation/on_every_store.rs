//! The compensation worker on every backend, in real time (the shared stores judge leases and rounds
//! by their own clocks): a lost reply recorded, two workers racing, a worker that died holding an
//! entry, rounds ending `MANUAL`; and with a caller on the same key (issue 24): "not received" keeps
//! the key, a reversal keeps its lease, a reversal begun stops every taker, a paused owner back after
//! the worker held its call. A store's queue is shared by everything on it, so each backend's
//! scenarios run one after the other, and they look at their own calls only.
//!
//! (Was `tests/compensation_stores.rs`.)

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use samekey::{
    compensation::CompensationOperation, compensation::CompensationState, idempotent, CallId,
    Compensator, Error, ReceiptState, Runtime, Store,
};
use support::stores::*;
use support::{Fault, Remote, TestError};

struct Svc {
    rt: Runtime,
    remote: Remote,
}

impl Svc {
    fn on(store: Arc<dyn Store>) -> Svc {
        Svc {
            rt: Runtime::builder()
                .node("worker-test")
                .shared_store(store)
                .build()
                .unwrap(),
            remote: Remote::default(),
        }
    }

    #[idempotent(key = "order", scope = "compensation_stores.charge", runtime = &self.rt, timeout = "1s", on_unknown = "hold")]
    async fn charge(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    /// The same operation, for a duplicate that may ask the receipt.
    #[idempotent(key = "order", scope = "compensation_stores.charge", runtime = &self.rt, timeout = "1s",
                 lookup = |c| self.remote.status(c))]
    async fn charge_checked(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    fn operation(&self) -> CompensationOperation {
        let remote = self.remote.clone();
        CompensationOperation::new(move |call: CallId| {
            let remote = remote.clone();
            async move { remote.status(&call).await }
        })
    }

    fn worker(&self) -> Compensator {
        self.worker_with(self.operation())
    }

    fn worker_with(&self, operation: CompensationOperation) -> Compensator {
        Compensator::new(&self.rt)
            .operation("compensation_stores.charge", operation)
            .rounds([Duration::from_millis(50), Duration::from_millis(50)])
            .lease(Duration::from_millis(300))
    }

    async fn unknown(&self, order: &str, fault: Fault) -> CallId {
        self.remote.script([fault]);
        match self.charge(order, 500).await {
            Err(TestError::Samekey(Error::Unknown { call_id })) => call_id,
            other => panic!("{other:?}"),
        }
    }

    async fn entry_state(&self, call_id: &CallId) -> Option<CompensationState> {
        self.rt
            .compensations()
            .await
            .unwrap()
            .into_iter()
            .find(|e| &e.call_id == call_id)
            .map(|e| e.state)
    }

    async fn state(&self, call_id: &CallId) -> Option<ReceiptState> {
        self.rt.receipt(call_id).await.unwrap().map(|r| r.state)
    }

    /// Runs passes until `done` holds (up to 5 s).
    async fn until(&self, worker: &Compensator, mut done: impl AsyncFnMut() -> bool) {
        for _ in 0..100 {
            worker.run_once().await.unwrap();
            if done().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the worker never got there");
    }
}

fn order(what: &str) -> String {
    format!("{what}-{:x}", samekey::TraceId::new().as_u128())
}

async fn worker_scenarios(store: Arc<dyn Store>) {
    lost_reply_is_recorded(Svc::on(store.clone())).await;
    two_workers_race(Svc::on(store.clone())).await;
    dead_worker_is_taken_over(Svc::on(store.clone())).await;
    orphan_is_swept(Svc::on(store.clone())).await;
    rounds_end_with_a_person(Svc::on(store.clone())).await;
    not_received_keeps_the_key(Svc::on(store.clone())).await;
    a_reversal_keeps_its_lease(Svc::on(store.clone())).await;
    an_open_reversal_stops_every_taker(Svc::on(store.clone())).await;
    a_node_ahead_queues_entries_due_on_time(store.clone()).await;
    a_paused_owner_answers_its_late_charge(store).await;
}

/// Issue 38's suspicion, confirmed: PostgreSQL, MySQL and Redis judge "due" by their own clock, but
/// took a new entry's due time from the queuing node's: a node 10 minutes ahead queued entries that no
/// worker would take for 10 minutes. The store's clock dates it. (A store that takes the caller's time
/// — memory, SQLite — lives on one host, whose nodes share one clock: nothing to skew.)
async fn a_node_ahead_queues_entries_due_on_time(store: Arc<dyn Store>) {
    if store.clock() == samekey::store::StoreClock::Caller {
        return;
    }
    let clock = support::TestClock::default();
    clock.advance(Duration::from_secs(600));
    let ahead = Svc {
        rt: Runtime::builder()
            .node("ahead")
            .clock(clock)
            .shared_store(store.clone())
            .build()
            .unwrap(),
        remote: Remote::default(),
    };
    let order = order("ahead");
    let call_id = ahead.unknown(&order, Fault::LoseReply).await;
    let svc = Svc::on(store);
    let worker = Compensator::new(&svc.rt).operation("compensation_stores.charge", {
        let remote = ahead.remote.clone();
        CompensationOperation::new(move |call: CallId| {
            let remote = remote.clone();
            async move { remote.status(&call).await }
        })
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while svc.state(&call_id).await != Some(ReceiptState::Success) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "an entry queued by a node 10 minutes ahead must be due now by the store's clock"
        );
        worker.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(svc.entry_state(&call_id).await, None);
}

/// Issue 24, defect 5: "not received" keeps the key (the default): the call stays `UNKNOWN` through
/// its rounds and ends `MANUAL`; a duplicate does not run it under a new callId, and the first
/// request, arriving late, is the one charge.
async fn not_received_keeps_the_key(svc: Svc) {
    let order = order("not-received");
    let call_id = svc.unknown(&order, Fault::LoseRequest).await;
    let worker = svc.worker();
    svc.until(&worker, async || {
        svc.entry_state(&call_id).await == Some(CompensationState::Manual)
    })
    .await;
    assert_eq!(svc.state(&call_id).await, Some(ReceiptState::Unknown));
    assert!(matches!(
        svc.charge(&order, 500).await,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));
    svc.remote.call_as(&call_id, &order, || 500).await.unwrap();
    assert_eq!(svc.remote.effects(&order), 1);
    svc.rt
        .store()
        .finish_compensation(&call_id, None)
        .await
        .unwrap();
}

/// A reversal that counts its runs and takes `takes` (forever: `None`).
fn reversal(svc: &Svc, runs: Arc<AtomicU32>, takes: Option<Duration>) -> CompensationOperation {
    svc.operation().reversal(move |_entry| {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            match takes {
                Some(takes) => tokio::time::sleep(takes).await,
                None => std::future::pending().await,
            }
            Ok::<(), samekey::Error>(())
        }
    })
}

/// Issue 24, defect 6: a reversal three times as long as the worker's lease keeps the key (its lease
/// renewed by the store's clock): a duplicate that may ask never takes it over and charges.
async fn a_reversal_keeps_its_lease(svc: Svc) {
    let order = order("reversal");
    let call_id = svc.unknown(&order, Fault::LoseRequest).await;
    let runs = Arc::new(AtomicU32::new(0));
    let worker = svc.worker_with(reversal(
        &svc,
        runs.clone(),
        Some(Duration::from_millis(900)),
    ));
    let (pass, duplicate) = tokio::join!(worker.run_once(), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        svc.charge_checked(&order, 500).await
    });
    assert!(pass.unwrap().reversed >= 1);
    assert!(duplicate.is_err(), "the duplicate never ran: {duplicate:?}");
    assert_eq!(
        svc.remote.effects(&order),
        0,
        "never charged beside its reversal"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(svc.state(&call_id).await, Some(ReceiptState::Failed));
}

/// Issue 24, defect 6: a worker dies mid-reversal. A duplicate that takes the lapsed key over finds
/// the intent and does not send; a callback is not applied; the next worker asks a person.
async fn an_open_reversal_stops_every_taker(svc: Svc) {
    let order = order("open-reversal");
    let call_id = svc.unknown(&order, Fault::LoseRequest).await;
    let runs = Arc::new(AtomicU32::new(0));
    let dying = svc.worker_with(reversal(&svc, runs.clone(), None));
    assert!(
        tokio::time::timeout(Duration::from_millis(200), dying.run_once())
            .await
            .is_err()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        svc.charge_checked(&order, 500).await,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));
    assert_eq!(svc.remote.effects(&order), 0, "never charged");
    let callback = samekey::callback::Callback::succeeded(&500u64).unwrap();
    assert!(matches!(
        svc.rt.apply_callback(&call_id, callback).await,
        Err(Error::Unknown { .. })
    ));
    assert_eq!(svc.state(&call_id).await, Some(ReceiptState::Unknown));
    let worker = svc.worker_with(reversal(&svc, runs.clone(), Some(Duration::ZERO)));
    svc.until(&worker, async || {
        svc.entry_state(&call_id).await == Some(CompensationState::Manual)
    })
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never reversed twice");
    svc.rt
        .store()
        .finish_compensation(&call_id, None)
        .await
        .unwrap();
}

/// An owner whose lease renewal the store holds at a gate: a process paused before its request went
/// out.
struct Paused {
    rt: Runtime,
    remote: Remote,
    /// Where the body stands while its process is paused, until the test resumes it.
    resume: tokio::sync::Notify,
}

impl Paused {
    /// Sends the charge 200 ms in, once resumed; its lease (300 ms) is renewed every 100 ms while
    /// it runs.
    #[idempotent(key = "order", scope = "compensation_stores.charge", runtime = &self.rt)]
    async fn charge(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.resume.notified().await;
        self.remote.call(order, || amount).await
    }
}

/// Issue 24, defect 5, the paused owner, on the store's clock: swept as an orphan once its lease ended,
/// its call held by the worker that hears "not received"; back, it charges, is fenced out, answers the
/// charge, and the next round records it.
async fn a_paused_owner_answers_its_late_charge(store: Arc<dyn Store>) {
    let faulty = Arc::new(support::faulty::Faulty::new(store));
    let svc = Arc::new(Paused {
        rt: Runtime::builder()
            .node("paused")
            .lease(Duration::from_millis(300))
            .shared_store(faulty.clone())
            .build()
            .unwrap(),
        remote: Remote::default(),
        resume: tokio::sync::Notify::new(),
    });
    // The process is paused: its body stands (`resume`) and so do its lease's renewals (each one
    // held until it gives up at its beat, and the next held again).
    let pause = support::faulty::Gate::new();
    faulty.plan(
        "extend_lease",
        std::iter::repeat_n(support::faulty::Act::Before(pause.clone()), 1_000),
    );
    let order = order("paused");
    let owner = tokio::spawn({
        let (svc, order) = (svc.clone(), order.clone());
        async move { svc.charge(&order, 500).await }
    });
    pause.reached().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let worker_svc = Svc {
        rt: svc.rt.clone(),
        remote: svc.remote.clone(),
    };
    let worker = worker_svc.worker();
    let mut swept = 0;
    for _ in 0..20 {
        swept += worker.sweep().await.unwrap();
        if swept > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(swept >= 1, "the paused owner's claim is an orphan");
    worker.run_once().await.unwrap();
    assert_eq!(svc.remote.effects(&order), 0, "nothing sent yet");
    pause.open();
    svc.resume.notify_one();
    assert_eq!(
        owner.await.unwrap(),
        Ok(500),
        "the owner answers its charge"
    );
    assert_eq!(svc.remote.effects(&order), 1);
    worker_svc
        .until(&worker, async || {
            svc.rt
                .store()
                .get(
                    &samekey::Key::build("compensation_stores.charge", &order.as_str()),
                    svc.rt.now_ms(),
                )
                .await
                .unwrap()
                .is_some_and(|r| r.state == ReceiptState::Success)
        })
        .await;
    assert_eq!(svc.charge(&order, 500).await, Ok(500), "replayed");
    assert_eq!(svc.remote.effects(&order), 1);
}

async fn lost_reply_is_recorded(svc: Svc) {
    let order = order("lost");
    let call_id = svc.unknown(&order, Fault::LoseReply).await;
    let worker = svc.worker();
    svc.until(&worker, async || svc.entry_state(&call_id).await.is_none())
        .await;
    assert_eq!(svc.state(&call_id).await, Some(ReceiptState::Success));
    assert_eq!(svc.charge(&order, 500).await, Ok(500));
    assert_eq!(svc.remote.effects(&order), 1);
}

async fn two_workers_race(svc: Svc) {
    let mut calls = Vec::new();
    for i in 0..6 {
        calls.push(
            svc.unknown(&order(&format!("race{i}")), Fault::LoseReply)
                .await,
        );
    }
    // Leases far longer than a pass on a loaded machine (issue 38: with the 300 ms lease of the other
    // scenarios this race failed 2 runs in 21 on MariaDB — a pass slower than half its lease defers
    // the rest of its batch, so a call was not `SUCCESS` after both passes; a take slower than the
    // other worker's lease takes its entries again, lapsed, so a call was asked twice. Both are the
    // lease doing its work, not two workers holding one live entry; the race itself is what is tested
    // here).
    let long = |svc: &Svc| {
        Compensator::new(&svc.rt)
            .operation("compensation_stores.charge", svc.operation())
            .lease(Duration::from_secs(60))
    };
    let (a, b) = (long(&svc), long(&svc));
    let (ra, rb) = tokio::join!(a.run_once(), b.run_once());
    ra.unwrap();
    rb.unwrap();
    for call_id in &calls {
        assert_eq!(svc.state(call_id).await, Some(ReceiptState::Success));
        assert_eq!(svc.entry_state(call_id).await, None);
    }
    assert_eq!(svc.remote.lookups(), 6, "each call asked about once");
}

async fn dead_worker_is_taken_over(svc: Svc) {
    let order = order("dead");
    let call_id = svc.unknown(&order, Fault::LoseReply).await;
    // A worker takes everything due and dies.
    let now = svc.rt.now_ms();
    svc.rt
        .store()
        .take_due_compensations(now, 10_000, 300)
        .await
        .unwrap();
    assert!(matches!(
        svc.entry_state(&call_id).await,
        Some(CompensationState::Taken { .. })
    ));
    let worker = svc.worker();
    svc.until(&worker, async || svc.entry_state(&call_id).await.is_none())
        .await;
    assert_eq!(svc.state(&call_id).await, Some(ReceiptState::Success));
    assert_eq!(svc.remote.effects(&order), 1);
}

async fn orphan_is_swept(svc: Svc) {
    use samekey::store::{Claim, Claimed};
    // A process claimed the key, charged, and crashed: PROCESSING, nothing queued.
    let order = order("orphan");
    let call_id = CallId::new("pay", "crashed").unwrap();
    let key = samekey::Key::build("compensation_stores.charge", &order.as_str());
    let claimed = svc
        .rt
        .store()
        .claim(Claim {
            key,
            call_id: call_id.clone(),
            fingerprint: None,
            lease_ms: 300,
            now_ms: svc.rt.now_ms(),
        })
        .await
        .unwrap();
    assert!(matches!(claimed, Claimed::Acquired(_)));
    svc.remote.call_as(&call_id, &order, || 500).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let worker = svc.worker();
    svc.until(&worker, async || {
        worker.sweep().await.unwrap();
        svc.state(&call_id).await == Some(ReceiptState::Success)
    })
    .await;
    assert_eq!(svc.entry_state(&call_id).await, None);
    assert_eq!(svc.charge(&order, 500).await, Ok(500));
    assert_eq!(svc.remote.effects(&order), 1);
}

async fn rounds_end_with_a_person(svc: Svc) {
    let call_id = svc.unknown(&order("rounds"), Fault::LoseReply).await;
    svc.remote.script_lookups(std::iter::repeat_n(true, 100));
    let escalated = Arc::new(AtomicU32::new(0));
    let worker = svc.worker().on_escalate({
        let (escalated, call_id) = (escalated.clone(), call_id.clone());
        move |entry| {
            if entry.call_id == call_id {
                escalated.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    svc.until(&worker, async || {
        svc.entry_state(&call_id).await == Some(CompensationState::Manual)
    })
    .await;
    worker.run_once().await.unwrap();
    assert_eq!(escalated.load(Ordering::SeqCst), 1, "one escalation");
    assert_eq!(svc.state(&call_id).await, Some(ReceiptState::Unknown));
    // Every round is in the call's journal, then the escalation.
    let steps: Vec<samekey::journal::CompensationStep> = svc
        .rt
        .history(&call_id)
        .await
        .unwrap()
        .events
        .into_iter()
        .filter_map(|e| match e.what {
            samekey::journal::EventKind::Compensation { step, .. } => Some(step),
            _ => None,
        })
        .collect();
    use samekey::journal::CompensationStep::{Escalated, Rescheduled, Taken};
    assert_eq!(
        steps.iter().filter(|s| **s == Taken).count(),
        3,
        "{steps:?}"
    );
    assert_eq!(
        steps.iter().filter(|s| **s == Rescheduled).count(),
        2,
        "{steps:?}"
    );
    assert_eq!(steps.last(), Some(&Escalated), "{steps:?}");
    svc.rt
        .store()
        .finish_compensation(&call_id, None)
        .await
        .unwrap();
}

support::on_stores!(memory, local_cache, sqlite if "sqlite", postgres if "postgres", mysql if "mysql", mysql_cached if "mysql" & "redis", redis if "redis" => {
    worker_scenarios,
});
