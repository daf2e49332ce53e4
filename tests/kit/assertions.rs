//! The test kit (`samekey::testing`) on functions that are safe to retry and on functions that are
//! not: each assertion passes on the first and fails on the second, naming the key, the calls and
//! the callIds, and the schedule to replay.
//!
//! (Was `tests/kit.rs`.)

use std::time::Duration;

use samekey::store::{Claim, Claimed};
use samekey::testing::{Fault, FaultMix, Remote, RemoteError, Schedule, TestKit, ToldOutcome};
use samekey::{idempotent, CallId, Classify, ErrorClass, Key, ReceiptState, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
enum PayError {
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for PayError {
    fn classify(&self) -> ErrorClass {
        match self {
            PayError::Remote(e) => e.classify(),
            PayError::Samekey(e) => e.classify(),
        }
    }
}

/// A mistake: a timeout taken for "not sent" (retryable) or for a definite failure (permanent).
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
enum CarelessError {
    #[error("{0}")]
    Remote(RemoteError),
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl From<RemoteError> for CarelessError {
    fn from(e: RemoteError) -> CarelessError {
        CarelessError::Remote(e)
    }
}

impl Classify for CarelessError {
    fn classify(&self) -> ErrorClass {
        match self {
            CarelessError::Remote(RemoteError::TimedOut) => ErrorClass::Retryable,
            CarelessError::Remote(e) => e.classify(),
            CarelessError::Samekey(e) => e.classify(),
        }
    }
}

struct Payments {
    rt: Runtime,
    gateway: Remote<u64, PayError>,
    careless: Remote<u64, CarelessError>,
}

impl Payments {
    fn on(kit: &TestKit, gateway: Remote<u64, PayError>) -> Payments {
        Payments {
            rt: kit.runtime().clone(),
            gateway,
            careless: Remote::new(Schedule::healthy()),
        }
    }

    #[idempotent(key = "order", scope = "pay", runtime = &self.rt, timeout = "1s",
                 lookup = |call| self.gateway.status(call))]
    async fn charge(&self, order: &str, cents: u64) -> Result<u64, PayError> {
        self.gateway.call(order, || cents).await
    }

    #[idempotent(key = "order", scope = "pay.held", runtime = &self.rt, timeout = "1s",
                 on_unknown = "hold")]
    async fn charge_held(&self, order: &str, cents: u64) -> Result<u64, PayError> {
        self.gateway.call(order, || cents).await
    }

    #[idempotent(key = "order", scope = "pay.careless", runtime = &self.rt)]
    async fn charge_carelessly(&self, order: &str, cents: u64) -> Result<u64, CarelessError> {
        self.careless.call(order, || cents).await
    }

    /// A retry loop around samekey that makes a new key per try: every try is a new call.
    async fn charge_with_a_key_per_try(&self, order: &str, cents: u64) -> Result<u64, PayError> {
        let mut last = None;
        for attempt in 0..3 {
            match self.charge(&format!("{order}#{attempt}"), cents).await {
                Ok(v) => return Ok(v),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(PayError::Remote(RemoteError::Unavailable)))
    }
}

#[tokio::test(start_paused = true)]
async fn a_function_with_a_lookup_is_safe_under_every_fault() {
    let kit = TestKit::new();
    let gateway = Remote::new([
        Fault::LoseReply,
        Fault::LoseRequest,
        Fault::Slow(Duration::from_secs(3)),
        Fault::Unavailable,
        Fault::RateLimited(Duration::from_millis(300)),
        Fault::Reject,
        Fault::Crash,
    ]);
    let payments = Payments::on(&kit, gateway.clone());
    for order in ["o-1", "o-1", "o-2", "o-3", "o-4", "o-4", "o-5", "o-6"] {
        kit.call(payments.charge(order, 500)).await;
    }
    let told = kit.told();
    assert!(
        told.iter().any(|t| t.outcome == ToldOutcome::Crashed),
        "{told:?}"
    );
    kit.settle("pay", &gateway).await.unwrap();
    kit.assert_safe(&gateway).await;
    let effects = gateway.effects_per_key();
    assert!(effects.values().all(|&n| n == 1), "{effects:?}");
    // Every delivery of one call carried that call's callId, and the receipts say how each ended.
    for t in told.iter().filter(|t| t.outcome == ToldOutcome::Succeeded) {
        let call_id: CallId = t.call_id.as_deref().unwrap().parse().unwrap();
        kit.assert_receipt(&call_id, ReceiptState::Success).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_timeout_taken_for_not_sent_is_caught_as_a_second_effect() {
    let kit = TestKit::new();
    let mut payments = Payments::on(&kit, Remote::new(Schedule::healthy()));
    payments.careless = Remote::new([Fault::LoseReply]);
    let out = kit.call(payments.charge_carelessly("o-1", 500)).await;
    assert_eq!(out, Some(Ok(500)), "the retry went through");
    let broken = kit.check(&payments.careless).await.unwrap_err();
    assert!(broken.contains("key `o-1` took effect 2 times"), "{broken}");
    assert!(
        broken.contains("attempt 1 LoseReply, took effect, call #1"),
        "{broken}"
    );
    assert!(
        broken.contains("attempt 2 Ok, took effect, call #1"),
        "{broken}"
    );
    assert!(
        broken.contains("remote schedule: Schedule::of([Fault::LoseReply])"),
        "{broken}"
    );
    let panicked = tokio::spawn(async move {
        kit.assert_effects_at_most_once(&payments.careless);
    })
    .await
    .unwrap_err();
    assert!(panicked.is_panic());
}

#[tokio::test(start_paused = true)]
async fn a_failure_told_after_the_effect_is_caught() {
    let kit = TestKit::new();
    let mut payments = Payments::on(&kit, Remote::new(Schedule::healthy()));
    // The reply is lost, the retry meets a 4xx: the caller hears "rejected", yet it was charged.
    payments.careless = Remote::new([Fault::LoseReply, Fault::Reject]);
    let out = kit.call(payments.charge_carelessly("o-1", 500)).await;
    assert!(
        matches!(out, Some(Err(CarelessError::Remote(RemoteError::Rejected)))),
        "{out:?}"
    );
    let broken = kit.check(&payments.careless).await.unwrap_err();
    assert!(
        broken.contains("call #1 was told it failed (rejected for good), but its request"),
        "{broken}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_key_per_try_is_caught_as_several_call_ids_in_one_call() {
    let kit = TestKit::new();
    let gateway = Remote::new([
        Fault::Unavailable,
        Fault::Unavailable,
        Fault::Unavailable,
        Fault::Unavailable,
    ]);
    let payments = Payments::on(&kit, gateway.clone());
    kit.call(payments.charge_with_a_key_per_try("o-1", 500))
        .await;
    let broken = kit.check(&gateway).await.unwrap_err();
    assert!(broken.contains("call #1 sent 2 callIds"), "{broken}");
}

#[tokio::test(start_paused = true)]
async fn an_unknown_call_nothing_will_resolve_is_caught() {
    let kit = TestKit::new();
    let gateway: Remote<u64, PayError> = Remote::new(Schedule::healthy());
    // A call left UNKNOWN behind the runtime's back: claimed, marked, never queued.
    let store = kit.runtime().store();
    let key = Key::build("pay", "o-9");
    let call_id = CallId::new("pay", "test").unwrap();
    let now = kit.runtime().now_ms();
    let Claimed::Acquired(fence) = store
        .claim(Claim {
            key: key.clone(),
            call_id: call_id.clone(),
            fingerprint: None,
            lease_ms: 1_000,
            now_ms: now,
        })
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    store.mark_unknown(&key, fence, now).await.unwrap();
    let broken = kit.check(&gateway).await.unwrap_err();
    assert!(
        broken.contains(&format!(
            "calls left UNKNOWN with nothing to resolve them:\n  call {call_id}"
        )),
        "{broken}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_held_unknown_is_queued_then_settled_by_the_remote_s_answer() {
    let kit = TestKit::new();
    let gateway = Remote::new([Fault::LoseReply]);
    let payments = Payments::on(&kit, gateway.clone());
    let out = kit.call(payments.charge_held("o-1", 500)).await;
    assert!(
        matches!(
            out,
            Some(Err(PayError::Samekey(samekey::Error::Unknown { .. })))
        ),
        "{out:?}"
    );
    kit.assert_every_unknown_resolved_or_queued().await;
    let told = kit.told();
    assert!(
        matches!(told[0].outcome, ToldOutcome::Undecided(_)),
        "{told:?}"
    );
    let call_id: CallId = told[0].call_id.as_deref().unwrap().parse().unwrap();
    kit.assert_receipt(&call_id, ReceiptState::Unknown).await;
    let pass = kit.settle("pay.held", &gateway).await.unwrap();
    assert_eq!(pass.succeeded, 1);
    kit.assert_receipt(&call_id, ReceiptState::Success).await;
    assert_eq!(
        kit.call(payments.charge_held("o-1", 500)).await,
        Some(Ok(500))
    );
    kit.assert_safe(&gateway).await;
}

#[tokio::test(start_paused = true)]
async fn a_seeded_schedule_replays_the_same_run() {
    let run = |seed| async move {
        let kit = TestKit::new();
        let gateway = Remote::new(Schedule::seeded(seed, FaultMix::default()));
        let payments = Payments::on(&kit, gateway.clone());
        for n in 0..40 {
            kit.call(payments.charge(&format!("o-{}", n % 25), 100))
                .await;
        }
        kit.settle("pay", &gateway).await.unwrap();
        kit.assert_safe(&gateway).await;
        gateway
            .deliveries()
            .into_iter()
            .map(|d| (d.key, d.attempt, d.fault, d.took_effect))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(11).await, run(11).await);
    assert_ne!(run(11).await, run(12).await);
}

#[tokio::test(start_paused = true)]
async fn several_scopes_are_settled_by_one_worker() {
    let kit = TestKit::new();
    // The held call asks nothing; the other's lookups all fail: both end UNKNOWN, queued.
    let gateway = Remote::new([Fault::LoseReply, Fault::LoseReply]).failing_lookups([true; 8]);
    let payments = Payments::on(&kit, gateway.clone());
    kit.call(payments.charge_held("o-1", 500)).await;
    kit.call(payments.charge("o-2", 500)).await;
    assert_eq!(kit.runtime().compensations().await.unwrap().len(), 2);
    let worker = kit
        .compensator()
        .operation("pay", gateway.operation())
        .operation("pay.held", gateway.operation());
    let pass = kit.settle_with(&worker).await.unwrap();
    assert_eq!(pass.succeeded, 2, "{pass:?}");
    assert!(kit.runtime().compensations().await.unwrap().is_empty());
    kit.assert_safe(&gateway).await;
}
