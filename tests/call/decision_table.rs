//! One test per row of the runtime's decision table (`docs/rules.md`), through `#[idempotent]` functions and a
//! scripted remote side, with paused tokio time.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::store::{Claim, Claimed};
use samekey::{
    compensation::CompensationState, context::InboundCall, idempotent, store::StoreError, CallId,
    Error, MemoryStore, ReceiptState, Runtime, Store,
};
use support::faulty::Faulty;
use support::{Fault, Remote, TestError};
use tokio::time::Instant;

/// A runtime on tokio's (paused) time: `tokio::time::advance` ends leases and TTLs.
fn runtime() -> samekey::runtime::RuntimeBuilder {
    Runtime::builder().clock(samekey::clock::TokioClock::new())
}

struct Payments {
    rt: Runtime,
    remote: Remote,
    /// The callId and attempt number every attempt saw.
    attempts: Mutex<Vec<(CallId, u32, Instant)>>,
}

impl Payments {
    fn new() -> Payments {
        Payments::on(runtime().node("test").build().unwrap())
    }

    fn on(rt: Runtime) -> Payments {
        Payments::with(rt, Remote::default())
    }

    fn with(rt: Runtime, remote: Remote) -> Payments {
        Payments {
            rt,
            remote,
            attempts: Mutex::new(Vec::new()),
        }
    }

    fn note_attempt(&self) -> CallId {
        let cx = samekey::current();
        self.attempts
            .lock()
            .unwrap()
            .push((cx.call_id().clone(), cx.attempt(), Instant::now()));
        cx.call_id().clone()
    }

    fn attempts(&self) -> Vec<(CallId, u32, Instant)> {
        self.attempts.lock().unwrap().clone()
    }

    #[idempotent(key = "order", runtime = &self.rt, backoff = "100ms..1s")]
    async fn plain(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.note_attempt();
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", runtime = &self.rt, timeout = "1s", lookup = |c| self.remote.status(c))]
    async fn with_lookup(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.note_attempt();
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", runtime = &self.rt, timeout = "1s", on_unknown = "hold")]
    async fn hold(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.note_attempt();
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", runtime = &self.rt, timeout = "1s", on_unknown = "rerun")]
    async fn rerun(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.note_attempt();
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", runtime = &self.rt, on_busy = "reject")]
    async fn reject_busy(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.note_attempt();
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", verify = "amount", runtime = &self.rt)]
    async fn verified(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.note_attempt();
        self.remote.call(order, || amount).await
    }

    /// A key held by a call that crashed: claimed under `call_id`, lease ended, never finished.
    async fn abandoned_claim(&self, scope: &str, order: &str) -> CallId {
        let call_id = CallId::new("crash", "gone").unwrap();
        let now = self.rt.now_ms();
        let claimed = self
            .rt
            .store()
            .claim(Claim {
                key: samekey::Key::build(scope, &order),
                call_id: call_id.clone(),
                fingerprint: None,
                lease_ms: 10,
                now_ms: now,
            })
            .await
            .unwrap();
        assert!(matches!(claimed, Claimed::Acquired(_)));
        tokio::time::advance(Duration::from_millis(20)).await;
        call_id
    }
}

/// Starts `plain("o-1", 500)` in the background and lets it claim the key.
async fn first_call_holding(p: &Arc<Payments>) -> tokio::task::JoinHandle<Result<u64, TestError>> {
    let first = tokio::spawn({
        let p = p.clone();
        async move { p.plain("o-1", 500).await }
    });
    tokio::task::yield_now().await;
    first
}

fn scope_of(name: &str) -> String {
    format!("call::decision_table::{name}")
}

async fn state_of(p: &Payments, call_id: &CallId) -> Option<ReceiptState> {
    p.rt.receipt(call_id).await.unwrap().map(|r| r.state)
}

async fn queued(p: &Payments) -> Vec<CallId> {
    p.rt.compensations()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.call_id)
        .collect()
}

// Row 1: claim — the winner records PROCESSING, then SUCCESS with the encoded result.
#[tokio::test(start_paused = true)]
async fn claim_then_success_records_the_receipt() {
    let p = Payments::new();
    assert_eq!(p.plain("o-1", 500).await, Ok(500));
    let (call_id, attempt, _) = p.attempts()[0].clone();
    assert_eq!(attempt, 1);
    let receipt = p.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, ReceiptState::Success);
    assert_eq!(receipt.outcome.as_deref(), Some(&b"500"[..]));
    assert_eq!(receipt.key, samekey::Key::build(&scope_of("plain"), &"o-1"));
    assert_eq!(p.remote.effects("o-1"), 1);
}

// Row 2a: a duplicate of a SUCCESS gets the stored first result; nothing runs again.
#[tokio::test(start_paused = true)]
async fn duplicate_replays_the_first_success() {
    let p = Payments::new();
    assert_eq!(p.plain("o-1", 500).await, Ok(500));
    // Same key, different amount: without `verify`, the first outcome is the answer.
    assert_eq!(p.plain("o-1", 999).await, Ok(500));
    assert_eq!(p.remote.effects("o-1"), 1);
    assert_eq!(p.attempts().len(), 1);
}

// Row 2a: a stored permanent FAILED is replayed too.
#[tokio::test(start_paused = true)]
async fn duplicate_replays_a_permanent_failure() {
    let p = Payments::new();
    p.remote.script([Fault::Reject]);
    assert_eq!(p.plain("o-1", 500).await, Err(TestError::Rejected));
    assert_eq!(p.plain("o-1", 500).await, Err(TestError::Rejected));
    assert_eq!(p.remote.call_ids().len(), 1);
    let (call_id, _, _) = p.attempts()[0].clone();
    assert_eq!(state_of(&p, &call_id).await, Some(ReceiptState::Failed));
}

// Row 3: `Rejected` (nothing took effect) → no retry, the claim is released, nothing is replayed: the
// same key may be tried again at once.
#[tokio::test(start_paused = true)]
async fn a_rejection_releases_the_key() {
    let p = Payments::new();
    p.remote.script([Fault::Decline]);
    assert_eq!(p.plain("o-1", 500).await, Err(TestError::Declined));
    assert_eq!(p.remote.call_ids().len(), 1, "not retried");
    let (call_id, _, _) = p.attempts()[0].clone();
    assert_eq!(state_of(&p, &call_id).await, None, "nothing stored");
    assert_eq!(p.rt.stats().released, 1);
    assert_eq!(p.plain("o-1", 500).await, Ok(500), "tried again, and ran");
    assert_eq!(p.remote.effects("o-1"), 1);
    assert_eq!(p.plain("o-1", 500).await, Ok(500));
    assert_eq!(p.remote.call_ids().len(), 2);
}

// Row 3: after an attempt whose outcome is unknown, a rejection may answer that attempt ("already
// done"): without a lookup it is recorded FAILED, never given back.
#[tokio::test(start_paused = true)]
async fn a_rejection_after_an_uncertain_attempt_is_recorded() {
    let p = Payments::with(
        runtime().node("test").build().unwrap(),
        Remote::default().deduplicating(),
    );
    p.remote.script([Fault::LoseRequest, Fault::Decline]);
    assert_eq!(p.rerun("o-1", 500).await, Err(TestError::Declined));
    let (call_id, _, _) = p.attempts()[0].clone();
    assert_eq!(state_of(&p, &call_id).await, Some(ReceiptState::Failed));
    assert_eq!(p.rerun("o-1", 500).await, Err(TestError::Declined));
    assert_eq!(
        p.remote.call_ids().len(),
        2,
        "the duplicate was answered from the store"
    );
    assert_eq!(p.rt.stats().released, 0);
}

// Row 3: a rejection after an uncertain attempt, with a `lookup` that knows nothing of the callId: the
// refusal is the remote's answer; it is recorded, not sent a third time.
#[tokio::test(start_paused = true)]
async fn a_rejection_the_receipt_knows_nothing_of_is_recorded() {
    let p = Payments::new();
    p.remote.script([Fault::LoseRequest, Fault::Decline]);
    assert_eq!(p.with_lookup("o-1", 500).await, Err(TestError::Declined));
    assert_eq!(p.remote.lookups(), 2);
    assert_eq!(
        p.remote.call_ids().len(),
        2,
        "not sent again after the refusal"
    );
    let (call_id, _, _) = p.attempts()[0].clone();
    assert_eq!(state_of(&p, &call_id).await, Some(ReceiptState::Failed));
    assert_eq!(p.with_lookup("o-1", 500).await, Err(TestError::Declined));
    assert_eq!(p.remote.effects("o-1"), 0);
}

// Row 2a: `verify` fingerprint mismatch → KeyReuse, nothing runs.
#[tokio::test(start_paused = true)]
async fn verify_mismatch_is_key_reuse() {
    let p = Payments::new();
    assert_eq!(p.verified("o-1", 500).await, Ok(500));
    assert_eq!(p.verified("o-1", 500).await, Ok(500));
    let first = p.attempts()[0].0.clone();
    assert_eq!(
        p.verified("o-1", 700).await,
        Err(TestError::Samekey(Error::KeyReuse { call_id: first }))
    );
    assert_eq!(p.remote.effects("o-1"), 1);
}

// Row 2b: PROCESSING with a live lease, on_busy = wait → waits (notified) and answers with the outcome.
#[tokio::test(start_paused = true)]
async fn busy_duplicate_waits_for_the_outcome() {
    let p = Arc::new(Payments::new());
    p.remote.script([Fault::Slow(Duration::from_secs(5))]);
    let started = Instant::now();
    let first = first_call_holding(&p).await;
    let second = p.plain("o-1", 500).await;
    assert_eq!(second, Ok(500));
    // Exactly when the first finished: a notification, not a poll (polling at growing intervals would
    // notice it at one of its own ticks, later).
    assert_eq!(Instant::now() - started, Duration::from_secs(5));
    assert_eq!(p.rt.stats().waits, 1);
    assert_eq!(p.rt.stats().replays, 1);
    assert_eq!(first.await.unwrap(), Ok(500));
    assert_eq!(p.remote.effects("o-1"), 1);
}

// Row 2b + leases: a body slower than the lease keeps its claim (the lease is renewed while it runs), so
// a duplicate keeps waiting instead of taking over.
#[tokio::test(start_paused = true)]
async fn slow_body_keeps_its_lease() {
    let rt = runtime().lease(Duration::from_secs(3)).build().unwrap();
    let p = Arc::new(Payments::on(rt));
    p.remote.script([Fault::Slow(Duration::from_secs(10))]);
    let first = first_call_holding(&p).await;
    let started = Instant::now();
    assert_eq!(p.plain("o-1", 500).await, Ok(500));
    assert_eq!(Instant::now() - started, Duration::from_secs(10));
    assert_eq!(first.await.unwrap(), Ok(500));
    assert_eq!(p.remote.effects("o-1"), 1);
    assert_eq!(p.attempts().len(), 1, "the duplicate never took over");
}

// Row 2b + leases (issue 38, defect 3): the renewals run beside the body. A renewal that waits for
// the store — here for ever, as one waiting on a row lock the body's own transaction holds before its
// `COMMIT` (`complete_in`) — neither stops the body nor delays it.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_waits_never_stalls_the_body() {
    let store = Arc::new(Faulty::new(Arc::new(MemoryStore::new())));
    let held = support::faulty::Gate::new();
    store.plan("extend_lease", [support::faulty::Act::Before(held.clone())]);
    let rt = runtime()
        .lease(Duration::from_secs(3))
        .store(Arc::clone(&store))
        .build()
        .unwrap();
    let p = Arc::new(Payments::on(rt));
    p.remote.script([Fault::Slow(Duration::from_secs(10))]);
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(60), p.plain("o-1", 500)).await;
    assert_eq!(
        out.ok(),
        Some(Ok(500)),
        "the body was not polled while its lease's renewal waited"
    );
    assert_eq!(Instant::now() - started, Duration::from_secs(10));
    assert!(
        store.take_ops().contains(&"extend_lease"),
        "a renewal was sent"
    );
    assert_eq!(p.remote.effects("o-1"), 1);
}

// Row 2b: on_busy = reject → InProgress with the holder's callId.
#[tokio::test(start_paused = true)]
async fn busy_duplicate_rejected() {
    let p = Arc::new(Payments::new());
    p.remote.script([Fault::Slow(Duration::from_secs(5))]);
    let first = tokio::spawn({
        let p = p.clone();
        async move { p.reject_busy("o-1", 500).await }
    });
    tokio::task::yield_now().await;
    let holder = p.attempts()[0].0.clone();
    assert_eq!(
        p.reject_busy("o-1", 500).await,
        Err(TestError::Samekey(Error::InProgress { call_id: holder }))
    );
    assert_eq!(first.await.unwrap(), Ok(500));
    assert_eq!(p.remote.effects("o-1"), 1);
}

// Row 2b: the wait is bounded: past the runtime's busy_wait, InProgress.
#[tokio::test(start_paused = true)]
async fn busy_wait_is_bounded() {
    let rt = runtime().busy_wait(Duration::from_secs(1)).build().unwrap();
    let p = Arc::new(Payments::on(rt));
    p.remote.script([Fault::Slow(Duration::from_secs(5))]);
    let first = first_call_holding(&p).await;
    let started = Instant::now();
    let second = p.plain("o-1", 500).await;
    assert!(matches!(
        second,
        Err(TestError::Samekey(Error::InProgress { .. }))
    ));
    assert_eq!(Instant::now() - started, Duration::from_secs(1));
    assert_eq!(first.await.unwrap(), Ok(500));
}

// Row 2c: an expired lease is resolved through `lookup` with the recorded callId; "not received" allows
// the execution, under that same callId.
#[tokio::test(start_paused = true)]
async fn expired_lease_not_received_runs_with_the_recorded_call_id() {
    let p = Payments::new();
    let crashed = p.abandoned_claim(&scope_of("with_lookup"), "o-1").await;
    assert_eq!(p.with_lookup("o-1", 500).await, Ok(500));
    assert_eq!(p.remote.lookups(), 1);
    assert_eq!(p.remote.call_ids(), [crashed.to_string()]);
    assert_eq!(state_of(&p, &crashed).await, Some(ReceiptState::Success));
}

// Row 2c: the lookup says it succeeded → record and return it, nothing runs.
#[tokio::test(start_paused = true)]
async fn expired_lease_already_succeeded_is_recorded_not_rerun() {
    let p = Payments::new();
    let crashed = p.abandoned_claim(&scope_of("with_lookup"), "o-1").await;
    // The crashed owner's request did reach the remote.
    p.remote.call_as(&crashed, "o-1", || 500).await.unwrap();
    assert_eq!(p.with_lookup("o-1", 500).await, Ok(500));
    assert_eq!(p.remote.effects("o-1"), 1);
    assert!(p.attempts().is_empty(), "no attempt ran");
    assert_eq!(state_of(&p, &crashed).await, Some(ReceiptState::Success));
}

// Row 2c: without lookup, `hold` answers Unknown and leaves the key to compensation.
#[tokio::test(start_paused = true)]
async fn expired_lease_without_lookup_holds() {
    let p = Payments::new();
    let crashed = p.abandoned_claim(&scope_of("hold"), "o-1").await;
    assert_eq!(
        p.hold("o-1", 500).await,
        Err(TestError::Samekey(Error::Unknown {
            call_id: crashed.clone()
        }))
    );
    assert!(p.remote.call_ids().is_empty());
    assert_eq!(state_of(&p, &crashed).await, Some(ReceiptState::Unknown));
    assert_eq!(queued(&p).await, [crashed]);
}

// Row 2c: without lookup, `rerun` takes over with the recorded callId (the remote dedups by it).
#[tokio::test(start_paused = true)]
async fn expired_lease_rerun_keeps_the_recorded_call_id() {
    let p = Payments::with(
        runtime().build().unwrap(),
        Remote::default().deduplicating(),
    );
    let crashed = p.abandoned_claim(&scope_of("rerun"), "o-1").await;
    assert_eq!(p.rerun("o-1", 500).await, Ok(500));
    assert_eq!(p.remote.call_ids(), [crashed.to_string()]);
}

// Row 2c + fencing: an owner presumed gone that comes back late cannot overwrite the new owner's outcome.
#[tokio::test(start_paused = true)]
async fn stale_owner_completion_is_refused() {
    let p = Payments::new();
    let key = samekey::Key::build(&scope_of("with_lookup"), &"o-1");
    let store = p.rt.store();
    let crashed = p.abandoned_claim(&scope_of("with_lookup"), "o-1").await;
    let old = store.get(&key, p.rt.now_ms()).await.unwrap().unwrap().fence;
    assert_eq!(p.with_lookup("o-1", 500).await, Ok(500));
    let late = samekey::store::Completion {
        state: ReceiptState::Failed,
        outcome: None,
        ttl_ms: 1_000,
    };
    assert!(matches!(
        store.complete(&key, old, late, p.rt.now_ms()).await,
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(state_of(&p, &crashed).await, Some(ReceiptState::Success));
}

// Row 2c: an UNKNOWN record whose lookup says it succeeded is resolved, and its compensation entry
// cleared.
#[tokio::test(start_paused = true)]
async fn unknown_record_resolved_by_lookup_clears_compensation() {
    let p = Payments::new();
    p.remote.script([Fault::LoseReply]);
    // The lookup fails on every retry the call has.
    p.remote.script_lookups(std::iter::repeat_n(true, 3));
    let first = p.with_lookup("o-1", 500).await;
    let call_id = p.attempts()[0].0.clone();
    assert_eq!(
        first,
        Err(TestError::Samekey(Error::Unknown {
            call_id: call_id.clone()
        }))
    );
    assert_eq!(queued(&p).await, vec![call_id.clone()]);
    assert_eq!(p.with_lookup("o-1", 500).await, Ok(500));
    assert_eq!(p.remote.effects("o-1"), 1);
    assert_eq!(state_of(&p, &call_id).await, Some(ReceiptState::Success));
    assert!(queued(&p).await.is_empty());
}

// Row 3: Ok → SUCCESS; the callId is the same on every attempt and the attempt number counts up.
#[tokio::test(start_paused = true)]
async fn call_id_is_the_same_on_every_attempt() {
    let p = Payments::new();
    p.remote.script([Fault::Unavailable, Fault::Unavailable]);
    assert_eq!(p.plain("o-1", 500).await, Ok(500));
    let attempts = p.attempts();
    assert_eq!(attempts.len(), 3);
    assert!(attempts.iter().all(|(id, _, _)| id == &attempts[0].0));
    let numbers: Vec<u32> = attempts.iter().map(|a| a.1).collect();
    assert_eq!(numbers, [1, 2, 3]);
    let seen = p.remote.call_ids();
    assert!(seen.iter().all(|s| s == &attempts[0].0.to_string()));
}

// Row 3: Permanent → no retry, FAILED.
#[tokio::test(start_paused = true)]
async fn permanent_error_is_not_retried() {
    let p = Payments::new();
    p.remote.script([Fault::Reject]);
    assert_eq!(p.plain("o-1", 500).await, Err(TestError::Rejected));
    assert_eq!(p.attempts().len(), 1);
}

// Row 3: Retryable → exponential backoff with ±20 % jitter, same callId, then success.
#[tokio::test(start_paused = true)]
async fn retryable_error_backs_off_exponentially() {
    let p = Payments::new();
    p.remote
        .script([Fault::Unavailable, Fault::Unavailable, Fault::Unavailable]);
    assert_eq!(p.plain("o-1", 500).await, Ok(500));
    let times: Vec<Instant> = p.attempts().iter().map(|a| a.2).collect();
    assert_eq!(times.len(), 4);
    for (n, nominal_ms) in [100u64, 200, 400].into_iter().enumerate() {
        let gap = (times[n + 1] - times[n]).as_millis() as u64;
        assert!(
            gap >= nominal_ms * 8 / 10 && gap <= nominal_ms * 12 / 10,
            "gap {n} = {gap} ms, nominal {nominal_ms} ms"
        );
    }
    assert_eq!(p.remote.effects("o-1"), 1);
}

// Row 3: RateLimited → waits at least retry_after (here longer than the backoff), and it counts as an
// attempt.
#[tokio::test(start_paused = true)]
async fn rate_limit_waits_at_least_retry_after() {
    let p = Payments::new();
    p.remote
        .script([Fault::RateLimited(Duration::from_millis(800))]);
    assert_eq!(p.plain("o-1", 500).await, Ok(500));
    let times: Vec<Instant> = p.attempts().iter().map(|a| a.2).collect();
    assert_eq!(times.len(), 2);
    assert!(times[1] - times[0] >= Duration::from_millis(800));
    assert_eq!(p.rt.stats().attempts, 2);
}

// Row 3: a retry-after beyond the function's backoff cap (1 s here) is still waited: "at least
// retry_after" holds up to the runtime's max_retry_after.
#[tokio::test(start_paused = true)]
async fn rate_limit_beyond_the_backoff_cap_is_waited() {
    let p = Payments::new();
    p.remote
        .script([Fault::RateLimited(Duration::from_millis(5_000))]);
    assert_eq!(p.plain("o-1", 500).await, Ok(500));
    let times: Vec<Instant> = p.attempts().iter().map(|a| a.2).collect();
    assert_eq!(times.len(), 2);
    assert!(times[1] - times[0] >= Duration::from_secs(5));
    assert_eq!(p.remote.effects("o-1"), 1);
}

// Row 3: a retry-after beyond max_retry_after is not slept on: the caller gets the rate limit at once
// (nothing ran, the claim is released).
#[tokio::test(start_paused = true)]
async fn rate_limit_beyond_max_retry_after_returns_at_once() {
    let p = Payments::on(
        runtime()
            .max_retry_after(Duration::from_secs(30))
            .build()
            .unwrap(),
    );
    p.remote
        .script([Fault::RateLimited(Duration::from_millis(60_000))]);
    let started = Instant::now();
    assert_eq!(
        p.plain("o-1", 500).await,
        Err(TestError::RateLimited {
            retry_after_ms: 60_000
        })
    );
    assert_eq!(Instant::now(), started);
    let call_id = p.attempts()[0].0.clone();
    assert_eq!(state_of(&p, &call_id).await, None);
}

// Row 3: Unknown (timeout) → lookup → succeeded: recorded and returned, no second execution.
#[tokio::test(start_paused = true)]
async fn timeout_then_lookup_succeeded() {
    let p = Payments::new();
    p.remote.script([Fault::Slow(Duration::from_millis(1_500))]);
    // The remote finishes at 1.5 s; the attempt times out at 1 s; the first lookup says "processing",
    // the next one (after a backoff) "succeeded".
    assert_eq!(p.with_lookup("o-1", 500).await, Ok(500));
    assert_eq!(p.remote.effects("o-1"), 1);
    assert_eq!(p.attempts().len(), 1);
    assert!(p.remote.lookups() >= 2);
}

// Row 3: Unknown (reply lost) → lookup → succeeded.
#[tokio::test(start_paused = true)]
async fn lost_reply_is_found_by_lookup() {
    let p = Payments::new();
    p.remote.script([Fault::LoseReply]);
    assert_eq!(p.with_lookup("o-1", 500).await, Ok(500));
    assert_eq!(p.remote.effects("o-1"), 1);
    assert_eq!(p.attempts().len(), 1);
    assert_eq!(p.remote.lookups(), 1);
}

// Row 3: Unknown → lookup → not received → retry with the same callId.
#[tokio::test(start_paused = true)]
async fn lost_request_is_retried_after_lookup() {
    let p = Payments::new();
    p.remote.script([Fault::LoseRequest, Fault::Hang]);
    assert_eq!(p.with_lookup("o-1", 500).await, Ok(500));
    let seen = p.remote.call_ids();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|s| s == &seen[0]));
    assert_eq!(p.remote.effects("o-1"), 1);
    assert_eq!(p.remote.lookups(), 2);
}

// Row 3: Unknown → lookup → "processing" every time → after the poll limit, UNKNOWN; once the remote
// finishes, a duplicate resolves it through lookup.
#[tokio::test(start_paused = true)]
async fn lookup_processing_too_long_leaves_the_call_unknown() {
    let p = Payments::new();
    p.remote.script([Fault::Slow(Duration::from_secs(120))]);
    let out = p.with_lookup("o-1", 500).await;
    let call_id = p.attempts()[0].0.clone();
    assert_eq!(
        out,
        Err(TestError::Samekey(Error::Unknown {
            call_id: call_id.clone()
        }))
    );
    assert_eq!(
        p.remote.lookups(),
        1 + u64::from(samekey::runtime::DEFAULT_LOOKUP_POLLS)
    );
    assert_eq!(queued(&p).await, vec![call_id.clone()]);
    tokio::time::advance(Duration::from_secs(120)).await;
    tokio::task::yield_now().await;
    assert_eq!(p.with_lookup("o-1", 500).await, Ok(500));
    assert_eq!(p.remote.effects("o-1"), 1);
    assert!(queued(&p).await.is_empty());
}

// Row 4 + late arrivals: after an uncertain attempt, "not received" allows retrying with the same
// callId, but not releasing the key when the retries run out (the first request may still arrive):
// the call ends UNKNOWN.
#[tokio::test(start_paused = true)]
async fn not_received_then_exhausted_is_unknown_not_released() {
    let p = Payments::new();
    p.remote.script([
        Fault::LoseRequest,
        Fault::Unavailable,
        Fault::Unavailable,
        Fault::Unavailable,
    ]);
    let out = p.with_lookup("o-1", 500).await;
    assert!(matches!(
        out,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));
    let call_id = p.attempts()[0].0.clone();
    assert_eq!(state_of(&p, &call_id).await, Some(ReceiptState::Unknown));
    assert_eq!(queued(&p).await, vec![call_id]);
}

// Row 3: after an uncertain attempt, a permanent error is not recorded as FAILED: the receipt is asked.
#[tokio::test(start_paused = true)]
async fn permanent_after_uncertain_asks_the_receipt() {
    let p = Payments::new();
    // Attempt 1 is lost (uncertain; the lookup says "not received"), attempt 2 is refused with a 4xx:
    // the refusal is checked against the receipt before anything is recorded.
    p.remote.script([Fault::LoseRequest, Fault::Reject]);
    let out = p.with_lookup("o-1", 500).await;
    // The remote recorded attempt 2 as declined: that is the call's receipt, and it is what is stored.
    assert_eq!(out, Err(TestError::Rejected));
    assert_eq!(
        p.remote.lookups(),
        2,
        "the refusal was checked against the receipt"
    );
}

// Row 3: Unknown → the lookup itself keeps failing → it is asked again while retries last (each failed
// lookup uses one), then UNKNOWN, compensation, Error::Unknown.
#[tokio::test(start_paused = true)]
async fn failing_lookup_leaves_the_call_unknown() {
    let p = Payments::new();
    p.remote.script([Fault::LoseReply]);
    p.remote.script_lookups(std::iter::repeat_n(true, 3));
    let out = p.with_lookup("o-1", 500).await;
    let call_id = p.attempts()[0].0.clone();
    assert_eq!(
        out,
        Err(TestError::Samekey(Error::Unknown {
            call_id: call_id.clone()
        }))
    );
    assert_eq!(state_of(&p, &call_id).await, Some(ReceiptState::Unknown));
    let entries = p.rt.compensations().await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].call_id, call_id);
    assert_eq!(entries[0].state, CompensationState::Pending);
    assert_eq!(p.remote.lookups(), 3, "asked once per retry left");
    assert_eq!(p.remote.call_ids().len(), 1, "a lookup re-sends nothing");
}

// Row 3: Unknown without lookup, `hold` (the default) → no retry, UNKNOWN, compensation.
#[tokio::test(start_paused = true)]
async fn unknown_without_lookup_holds() {
    let p = Payments::new();
    p.remote.script([Fault::Hang]);
    let out = p.hold("o-1", 500).await;
    assert!(matches!(
        out,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));
    assert_eq!(p.attempts().len(), 1);
    assert_eq!(queued(&p).await.len(), 1);
}

// Row 3: Unknown without lookup, `rerun` → retried with the same callId.
#[tokio::test(start_paused = true)]
async fn unknown_without_lookup_reruns_with_the_same_call_id() {
    let p = Payments::with(
        runtime().build().unwrap(),
        Remote::default().deduplicating(),
    );
    p.remote.script([Fault::Hang, Fault::LoseRequest]);
    assert_eq!(p.rerun("o-1", 500).await, Ok(500));
    let seen = p.remote.call_ids();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|s| s == &seen[0]));
}

// Row 4: exhausted and nothing ran → claim released, last error returned, the key is free again.
#[tokio::test(start_paused = true)]
async fn exhausted_with_nothing_run_releases_the_claim() {
    let p = Payments::new();
    p.remote.script([Fault::Unavailable; 4]);
    assert_eq!(p.plain("o-1", 500).await, Err(TestError::Refused));
    assert_eq!(p.attempts().len(), 4, "1 + 3 retries");
    let call_id = p.attempts()[0].0.clone();
    assert_eq!(state_of(&p, &call_id).await, None, "claim released");
    assert!(queued(&p).await.is_empty());
    assert_eq!(p.plain("o-1", 500).await, Ok(500));
    assert_eq!(p.remote.effects("o-1"), 1);
}

// Row 4: exhausted with an uncertain outcome → UNKNOWN, compensation, Error::Unknown (never a plain
// failure).
#[tokio::test(start_paused = true)]
async fn exhausted_with_uncertain_outcome_is_unknown() {
    let p = Payments::new();
    // The first attempt hangs (did it arrive?), then every retry is refused.
    p.remote.script([
        Fault::Hang,
        Fault::Unavailable,
        Fault::Unavailable,
        Fault::Unavailable,
    ]);
    let out = p.rerun("o-1", 500).await;
    let call_id = p.attempts()[0].0.clone();
    assert_eq!(
        out,
        Err(TestError::Samekey(Error::Unknown {
            call_id: call_id.clone()
        }))
    );
    assert_eq!(state_of(&p, &call_id).await, Some(ReceiptState::Unknown));
    assert_eq!(queued(&p).await, [call_id]);
    // A duplicate takes over with the recorded callId (the function declared that the remote dedups
    // by it) instead of running under a new one.
    assert_eq!(p.rerun("o-1", 500).await, Ok(500));
    let seen = p.remote.call_ids();
    assert_eq!(seen.len(), 5);
    assert!(seen.iter().all(|s| s == &seen[0]));
    assert_eq!(p.remote.effects("o-1"), 1);
}

// A store outage fails closed: a typed error, and nothing runs.
#[tokio::test(start_paused = true)]
async fn store_outage_fails_closed() {
    let p = Payments::on(runtime().store(Faulty::down()).build().unwrap());
    let out = p.plain("o-1", 500).await;
    assert!(matches!(
        out,
        Err(TestError::Samekey(Error::Store(StoreError::Unavailable(_))))
    ));
    assert!(p.remote.call_ids().is_empty());
    assert!(p.attempts().is_empty());
}

// receipt(callId) is answered from the store alone: no lookup reaches the remote.
#[tokio::test(start_paused = true)]
async fn receipt_is_answered_from_the_store() {
    let p = Payments::new();
    assert_eq!(p.with_lookup("o-1", 500).await, Ok(500));
    let call_id = p.attempts()[0].0.clone();
    let receipt = p.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, ReceiptState::Success);
    assert_eq!(p.remote.lookups(), 0);
    let stranger = CallId::new("ord", "elsewhere").unwrap();
    assert_eq!(p.rt.receipt(&stranger).await.unwrap(), None);
}

// A call cancelled during its attempt leaves UNKNOWN + compensation; a later call resolves it through
// lookup instead of running it a second time.
#[tokio::test(start_paused = true)]
async fn cancelled_call_is_resolved_not_rerun() {
    let p = Payments::new();
    p.remote.script([Fault::Slow(Duration::from_secs(10))]);
    let cancelled = tokio::time::timeout(Duration::from_millis(500), p.plain("o-1", 500)).await;
    assert!(cancelled.is_err(), "the caller gave up");
    tokio::task::yield_now().await; // the drop guard's task runs
    let call_id = p.attempts()[0].0.clone();
    assert_eq!(state_of(&p, &call_id).await, Some(ReceiptState::Unknown));
    assert_eq!(queued(&p).await, vec![call_id.clone()]);
    tokio::time::advance(Duration::from_secs(10)).await; // the remote executes the first request
    tokio::task::yield_now().await;
    assert_eq!(p.remote.effects("o-1"), 1);
    // A duplicate (no lookup: hold) does not run it again.
    let again = p.plain("o-1", 500).await;
    assert!(matches!(
        again,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));
    assert_eq!(p.remote.effects("o-1"), 1);
}

// A call cancelled before anything could run releases its claim.
#[tokio::test(start_paused = true)]
async fn cancelled_during_backoff_releases_the_claim() {
    let p = Payments::new();
    p.remote.script([Fault::Unavailable]);
    let cancelled = tokio::time::timeout(Duration::from_millis(50), p.plain("o-1", 500)).await;
    assert!(cancelled.is_err());
    tokio::task::yield_now().await;
    let call_id = p.attempts()[0].0.clone();
    assert_eq!(state_of(&p, &call_id).await, None);
    assert_eq!(p.plain("o-1", 500).await, Ok(500));
    assert_eq!(p.remote.effects("o-1"), 1);
}

// An inbound callId (from X-Call-Id) is adopted by the first call in its scope, and its traceId by all.
#[tokio::test(start_paused = true)]
async fn inbound_call_id_is_adopted_once() {
    let p = Payments::new();
    let inbound = CallId::new("gw", "edge").unwrap();
    let trace = samekey::TraceId::new();
    let (a, b) = InboundCall::new()
        .call_id(inbound.clone())
        .trace_id(trace)
        .scope(async { (p.plain("o-1", 1).await, p.plain("o-2", 2).await) })
        .await;
    assert_eq!((a, b), (Ok(1), Ok(2)));
    let attempts = p.attempts();
    assert_eq!(attempts[0].0, inbound);
    assert_ne!(attempts[1].0, inbound);
}

// A replay first in an inbound scope adopts the inbound callId, as any first call does (a replay the
// in-process store answers at once takes the same way while the callId waits to be adopted), and the
// next call makes its own; counted as a call and a replay, never a claim.
#[tokio::test(start_paused = true)]
async fn a_replay_first_in_an_inbound_scope_adopts_its_call_id() {
    let p = Payments::new();
    assert_eq!(p.plain("o-1", 1).await, Ok(1));
    let before = p.rt.stats();
    let inbound = CallId::new("gw", "edge").unwrap();
    let (a, b) = InboundCall::new()
        .call_id(inbound.clone())
        .scope(async { (p.plain("o-1", 1).await, p.plain("o-2", 2).await) })
        .await;
    assert_eq!((a, b), (Ok(1), Ok(2)));
    let attempts = p.attempts();
    assert_eq!(attempts.len(), 2, "o-1 ran once, o-2 once");
    assert_ne!(attempts[1].0, inbound, "the replay took the inbound callId");
    // Outside any scope, replays are answered at once from the in-memory store: counted as calls
    // and replays, no claim.
    for _ in 0..3 {
        assert_eq!(p.plain("o-1", 1).await, Ok(1));
    }
    let after = p.rt.stats();
    assert_eq!(after.calls - before.calls, 2 + 3);
    assert_eq!(after.replays - before.replays, 1 + 3);
    assert_eq!(after.claims - before.claims, 1, "o-2 only");
    assert_eq!(p.remote.effects("o-1"), 1);
}

// Time windows: the same key in another day is another operation.
#[tokio::test(start_paused = true)]
async fn window_buckets_split_days() {
    struct SignIn {
        rt: Runtime,
        count: Mutex<u32>,
    }
    impl SignIn {
        #[idempotent(key = "user", window = "1d", runtime = &self.rt)]
        async fn sign_in(&self, user: u64) -> Result<u32, TestError> {
            let mut c = self.count.lock().unwrap();
            *c += 1;
            Ok(*c)
        }
    }
    let s = SignIn {
        rt: runtime().build().unwrap(),
        count: Mutex::new(0),
    };
    let first = s.sign_in(7).await.unwrap();
    assert_eq!(s.sign_in(7).await.unwrap(), first);
    tokio::time::advance(Duration::from_secs(86_400)).await;
    assert_eq!(s.sign_in(7).await.unwrap(), first + 1);
}

// A window longer than the default ttl (24 h) keeps its key for the whole window: the ttl defaults to
// the window, so a second call two days into the same week replays instead of running again.
#[tokio::test(start_paused = true)]
async fn window_longer_than_the_default_ttl_keeps_the_key() {
    /// The start of a 7-day bucket, then tokio's (paused) time.
    struct WeekStart(Instant);
    impl samekey::clock::Clock for WeekStart {
        fn now_ms(&self) -> u64 {
            2_900 * 604_800_000 + u64::try_from(self.0.elapsed().as_millis()).unwrap()
        }
    }
    struct Bonus {
        rt: Runtime,
        count: Mutex<u32>,
    }
    impl Bonus {
        #[idempotent(key = "user", window = "7d", runtime = &self.rt)]
        async fn weekly(&self, user: u64) -> Result<u32, TestError> {
            let mut c = self.count.lock().unwrap();
            *c += 1;
            Ok(*c)
        }
    }
    let b = Bonus {
        rt: runtime().clock(WeekStart(Instant::now())).build().unwrap(),
        count: Mutex::new(0),
    };
    assert_eq!(b.weekly(7).await, Ok(1));
    tokio::time::advance(Duration::from_secs(2 * 86_400)).await;
    assert_eq!(b.weekly(7).await, Ok(1), "same week: replayed");
    tokio::time::advance(Duration::from_secs(5 * 86_400)).await;
    assert_eq!(b.weekly(7).await, Ok(2), "next week: runs");
}

// The store can be shared, and keys expire after their ttl.
#[tokio::test(start_paused = true)]
async fn keys_expire_after_ttl() {
    struct Once {
        rt: Runtime,
        count: Mutex<u32>,
    }
    impl Once {
        #[idempotent(key = "id", ttl = "1h", runtime = &self.rt)]
        async fn run(&self, id: u64) -> Result<u32, TestError> {
            let mut c = self.count.lock().unwrap();
            *c += 1;
            Ok(*c)
        }
    }
    let store = Arc::new(MemoryStore::new());
    let rt = runtime().shared_store(store.clone()).build().unwrap();
    let o = Once {
        rt,
        count: Mutex::new(0),
    };
    assert_eq!(o.run(1).await, Ok(1));
    assert_eq!(o.run(1).await, Ok(1));
    tokio::time::advance(Duration::from_secs(3_600)).await;
    assert_eq!(o.run(1).await, Ok(2));
    tokio::time::advance(Duration::from_secs(7_200)).await;
    assert_eq!(store.purge_expired(o.rt.now_ms()).await.unwrap(), 1);
    assert!(store.is_empty());
}

// On the system clock, a replay that the in-process store answers judges expiry by the coarse clock
// (a few milliseconds behind, never ahead): a receipt is replayed for its ttl, and not long after.
#[tokio::test]
async fn a_replay_on_the_system_clock_ends_with_its_ttl() {
    struct Brief {
        rt: Runtime,
        count: Mutex<u32>,
    }
    impl Brief {
        #[idempotent(key = "id", ttl = "500ms", retries = 0, runtime = &self.rt)]
        async fn run_briefly(&self, id: u64) -> Result<u32, TestError> {
            let mut c = self.count.lock().unwrap();
            *c += 1;
            Ok(*c)
        }
    }
    let o = Brief {
        rt: Runtime::new(),
        count: Mutex::new(0),
    };
    assert_eq!(o.run_briefly(1).await, Ok(1));
    assert_eq!(o.run_briefly(1).await, Ok(1), "within its ttl: replayed");
    assert_eq!(o.rt.stats().replays, 1);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        o.run_briefly(1).await,
        Ok(2),
        "100 ms past its ttl: runs again"
    );
}

// A first attempt is stamped with its claim's reading of the clock (on the in-process store nothing
// waits between them): on a clock that moves on every read, it starts at its callId's time, the
// reading the claim was made with. A retry, after its backoff, reads the clock again.
#[tokio::test(start_paused = true)]
async fn a_first_attempt_starts_at_its_claim_s_reading_of_the_clock() {
    /// Moves one millisecond forward on every read.
    struct Ticking(std::sync::atomic::AtomicU64);
    impl samekey::clock::Clock for Ticking {
        fn now_ms(&self) -> u64 {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        }
    }
    struct Stamps {
        rt: Runtime,
        /// Each attempt's callId time, start, and the expiry of a receipt written then.
        seen: Mutex<Vec<(u64, u64, u64)>>,
    }
    impl Stamps {
        #[idempotent(key = "id", ttl = "1h", runtime = &self.rt)]
        async fn stamp(&self, id: u64) -> Result<u64, TestError> {
            let context = samekey::current();
            let mut seen = self.seen.lock().unwrap();
            seen.push((
                context.call_id().unix_ms(),
                context.started_ms(),
                context.expires_at_ms(),
            ));
            if seen.len() == 1 {
                return Err(TestError::Refused);
            }
            Ok(context.started_ms())
        }
    }
    let s = Stamps {
        rt: Runtime::builder()
            .clock(Ticking(std::sync::atomic::AtomicU64::new(
                1_800_000_000_000,
            )))
            .build()
            .unwrap(),
        seen: Mutex::new(Vec::new()),
    };
    s.stamp(1).await.unwrap();
    let seen = s.seen.lock().unwrap().clone();
    let [(called, first, first_expiry), (called_again, second, _)] = seen[..] else {
        panic!("two attempts, not {seen:?}");
    };
    assert_eq!(called_again, called, "one callId for both attempts");
    assert_eq!(
        first, called,
        "the first attempt starts at its claim's reading"
    );
    assert!(
        first_expiry > first + 3_600_000,
        "a receipt written now lives its ttl from now, a tick after the start: {first_expiry}"
    );
    assert!(
        second > first,
        "a retry reads the clock again: {second} after {first}"
    );
}

// The signature and the body keep their meaning: `&mut self` is lent to every attempt, `?` and an early
// `return` end the attempt with their value, and the callId carries the `prefix`.
#[tokio::test(start_paused = true)]
async fn body_keeps_its_meaning_across_attempts() {
    struct Counter {
        rt: Runtime,
        attempts_seen: Vec<u32>,
        prefixes: Vec<String>,
    }
    impl Counter {
        #[idempotent(key = "id", prefix = "cnt", runtime = &self.rt, backoff = "10ms..100ms")]
        async fn bump(&mut self, id: u64, fail_until: u32) -> Result<usize, TestError> {
            let cx = samekey::current();
            self.attempts_seen.push(cx.attempt());
            self.prefixes.push(cx.call_id().prefix().to_owned());
            if cx.attempt() <= fail_until {
                Err(TestError::Refused)?;
            }
            if id == 0 {
                return Ok(0);
            }
            Ok(self.attempts_seen.len())
        }
    }
    let mut c = Counter {
        rt: runtime().build().unwrap(),
        attempts_seen: Vec::new(),
        prefixes: Vec::new(),
    };
    assert_eq!(c.bump(7, 2).await, Ok(3));
    assert_eq!(c.attempts_seen, [1, 2, 3]);
    assert!(c.prefixes.iter().all(|p| p == "cnt"));
    assert_eq!(c.bump(0, 0).await, Ok(0));
    assert_eq!(c.bump(7, 0).await, Ok(3), "replayed");
}

// Issue 38's suspicion, confirmed: a success holding a NaN was stored as `null` (JSON has no NaN), and
// every duplicate got `Error::Decode` — "cannot read the outcome" — for a call that took effect. An
// outcome that cannot be read back is not stored: the first caller gets its value, duplicates
// `Error::NotReplayable` (the call took effect and its outcome was not kept), and the body never runs
// again. A `null` that reads back (`None`) is stored as before.
#[tokio::test]
async fn an_outcome_json_cannot_carry_is_not_stored_and_never_runs_again() {
    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Reading {
        celsius: f64,
        note: Option<String>,
    }
    struct Sensor {
        rt: Runtime,
        runs: std::sync::atomic::AtomicU32,
    }
    impl Sensor {
        #[idempotent(key = "id", scope = "sensors.read", runtime = &self.rt)]
        async fn read(&self, id: u64, celsius: f64) -> Result<Reading, TestError> {
            self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Reading {
                celsius,
                note: None,
            })
        }
    }
    let sensor = Sensor {
        rt: Runtime::builder().build().unwrap(),
        runs: Default::default(),
    };
    let first = sensor.read(1, f64::NAN).await.unwrap();
    assert!(first.celsius.is_nan(), "the first caller gets its value");
    match sensor.read(1, f64::NAN).await {
        Err(TestError::Samekey(Error::NotReplayable { .. })) => {}
        other => panic!("a duplicate is told the call took effect, not {other:?}"),
    }
    assert_eq!(sensor.runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    // A `null` that reads back is stored and replayed.
    let kept = sensor.read(2, 21.5).await.unwrap();
    assert_eq!(sensor.read(2, 21.5).await, Ok(kept));
    assert_eq!(sensor.runs.load(std::sync::atomic::Ordering::SeqCst), 2);
}

// The same gap, one level down: `Some(NaN)` is written `null` too, and *reads back* — as `None`. The
// check that read the encoding back passed it, and every duplicate was answered `Ok(None)` for a
// reading the first caller got as `Some(NaN)`: a wrong answer, not a refusal. A value holding a
// non-finite float anywhere is refused by its encoding; a real `None` is stored and replayed.
#[tokio::test]
async fn a_nan_inside_an_option_is_never_replayed_as_none() {
    struct Gauge {
        rt: Runtime,
        runs: std::sync::atomic::AtomicU32,
    }
    impl Gauge {
        #[idempotent(key = "id", scope = "gauges.read", runtime = &self.rt)]
        async fn read(&self, id: u64, value: Option<f64>) -> Result<Option<f64>, TestError> {
            self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(value)
        }
    }
    let gauge = Gauge {
        rt: Runtime::builder().build().unwrap(),
        runs: Default::default(),
    };
    let first = gauge.read(1, Some(f64::NAN)).await.unwrap();
    assert!(
        first.is_some_and(f64::is_nan),
        "the first caller gets its value"
    );
    match gauge.read(1, Some(f64::NAN)).await {
        Err(TestError::Samekey(Error::NotReplayable { .. })) => {}
        other => panic!("a duplicate is told the call took effect, never Ok(None): {other:?}"),
    }
    assert_eq!(gauge.read(2, None).await, Ok(None));
    assert_eq!(gauge.read(2, None).await, Ok(None), "a real None replays");
    assert_eq!(gauge.runs.load(std::sync::atomic::Ordering::SeqCst), 2);
}
