//! The promise at the edges: a call never takes effect twice and never answers wrong when its caller
//! goes away mid-write, when its owner stalls past its lease and comes back, when a lookup or a
//! release fails. Each scenario runs on every backend: the in-memory store, SQLite (feature `sqlite`),
//! PostgreSQL and Redis (features `postgres`, `redis`, with `SAMEKEY_PG_URL`, `SAMEKEY_REDIS_URL`),
//! through a wrapper ([`support::faulty`]) that holds an operation at a gate or fails it, the way a
//! slow pool acquire, a GC pause or a store outage would. Ordering comes from the gates. A lease ends by
//! moving the runtime's clock ([`support::TestClock`]) on the stores that judge by it, and by waiting
//! it out on the shared stores, which judge by their own.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use samekey::journal::EventKind;
use samekey::store::StoreClock;
use samekey::{
    context::InboundCall, idempotent, store::StoreError, CallId, Error, ReceiptState, Runtime,
    Store,
};
use support::faulty::{Act, Faulty, Gate};
use support::stores::*;
use support::{Fault, Remote, TestClock, TestError};

/// Four functions over one operation (one explicit scope), one per way of resolving an unknown outcome.
struct Svc {
    rt: Runtime,
    remote: Remote,
    store: Arc<Faulty>,
    clock: TestClock,
    /// The order every call of the test is about: a key of the test's own.
    order: String,
}

impl Svc {
    fn on(store: Arc<dyn Store>) -> Arc<Svc> {
        let order = format!("o-{:x}", samekey::TraceId::new().as_u128());
        Svc::on_node(store, TestClock::default(), order)
    }

    /// A node of its own (runtime, clock, remote side) over `store`, about `order`.
    fn on_node(store: Arc<dyn Store>, clock: TestClock, order: String) -> Arc<Svc> {
        let store = Arc::new(Faulty::new(store));
        Arc::new(Svc {
            rt: Runtime::builder()
                .node("promise")
                .shared_store(store.clone())
                .clock(clock.clone())
                .build()
                .unwrap(),
            remote: Remote::default(),
            store,
            clock,
            order,
        })
    }

    #[idempotent(key = "order", scope = "promise.charge", runtime = &self.rt)]
    async fn plain(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", scope = "promise.charge", runtime = &self.rt, timeout = "1s",
                 lookup = |c| self.remote.status(c))]
    async fn with_lookup(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", scope = "promise.charge", runtime = &self.rt, timeout = "1s",
                 on_unknown = "hold")]
    async fn hold(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", scope = "promise.charge", runtime = &self.rt, timeout = "1s",
                 on_unknown = "rerun")]
    async fn rerun(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    /// Its lookup fails with a proxy's whole error page (70 kB).
    #[idempotent(key = "order", scope = "promise.charge", runtime = &self.rt, timeout = "1s",
                 lookup = |_c| async { Err::<samekey::RemoteStatus<u64, TestError>, _>("<html>".repeat(12_000)) })]
    async fn with_a_verbose_lookup(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    /// Lets the 2 s lease of the timed functions (and a backoff's extension of it) end.
    async fn pass_lease(&self) {
        match self.store.clock() {
            StoreClock::Caller => self.clock.advance(Duration::from_secs(3)),
            StoreClock::Own => tokio::time::sleep(Duration::from_millis(2_400)).await,
        }
    }

    async fn state(&self, call_id: &CallId) -> Option<ReceiptState> {
        self.rt.receipt(call_id).await.unwrap().map(|r| r.state)
    }

    /// The key of every call of the test.
    fn key(&self) -> samekey::Key {
        samekey::Key::build("promise.charge", &self.order.as_str())
    }

    /// This test's entries in the compensation queue (a shared database holds other tests' too).
    async fn queued(&self) -> Vec<CallId> {
        let key = self.key();
        let entries = self.rt.compensations().await.unwrap();
        entries
            .into_iter()
            .filter(|e| e.key == key)
            .map(|e| e.call_id)
            .collect()
    }

    /// A duplicate (`hold`: no lookup) of a call whose claim was given back: it runs (bounded at 10 s,
    /// well short of the 30 s it would wait for a live claim on a store that judges by the caller's
    /// clock; on the others a claim left to its lease would answer `Unknown`).
    async fn duplicate_in_time(&self) -> Result<u64, TestError> {
        tokio::time::timeout(Duration::from_secs(10), self.hold(&self.order, 500))
            .await
            .expect("the duplicate waited for a claim that should have been given back")
    }

    /// Waits (up to 10 s) until the key's journal says that a claim whose answer never came was given
    /// back, and `why`: the task that gave it back journals it after the release.
    async fn assert_given_back(&self, why: &str) {
        for _ in 0..1000 {
            let history = self.rt.history_of_key(&self.key()).await.unwrap();
            if history.events.iter().any(|e| {
                matches!(&e.what, EventKind::Released { reason, by } if by == "call" && reason.contains(why))
            }) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "no release journaled: {:?}",
            self.rt.history_of_key(&self.key()).await
        );
    }

    /// Waits (up to 10 s) until `call_id` is queued for compensation: the drop guard's task does its
    /// writes after the caller is gone.
    async fn until_queued(&self, call_id: &CallId) {
        for _ in 0..1000 {
            if self.queued().await.contains(call_id) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{call_id} never queued: {:?}", self.queued().await);
    }

    /// Starts `call` in a task of its own and answers once the store holds it just before `step`,
    /// with the task and the gate that lets it reach the store; `then` are the step's next acts.
    async fn held_before<F, Fut>(
        self: &Arc<Svc>,
        step: &'static str,
        then: impl IntoIterator<Item = Act>,
        call: F,
    ) -> (tokio::task::JoinHandle<Result<u64, TestError>>, Gate)
    where
        F: FnOnce(Arc<Svc>) -> Fut,
        Fut: std::future::Future<Output = Result<u64, TestError>> + Send + 'static,
    {
        let gate = Gate::new();
        self.store
            .plan(step, std::iter::once(Act::Before(gate.clone())).chain(then));
        let task = tokio::spawn(call(self.clone()));
        gate.reached().await;
        (task, gate)
    }

    fn first_call_id(&self) -> CallId {
        self.remote.call_ids()[0].parse().unwrap()
    }

    /// Waits (up to 10 s) until the receipt of `call_id` is `state`.
    async fn until_state(&self, call_id: &CallId, state: ReceiptState) {
        for _ in 0..1000 {
            if self.state(call_id).await == Some(state) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "receipt of {call_id} never became {state}: {:?}",
            self.state(call_id).await
        );
    }
}

fn unavailable() -> StoreError {
    StoreError::Unavailable("connection reset (test)".into())
}

/// The call failed closed on the store's `unavailable()`.
fn failed_closed(out: Result<u64, TestError>) {
    assert_eq!(out, Err(TestError::Samekey(Error::Store(unavailable()))));
}

/// An uncertain call (`hold`, its reply lost: handed to compensation) in a task of its own, held just
/// before `step`, with the gate that lets it on.
async fn uncertain_call_held_before(
    store: Arc<dyn Store>,
    step: &'static str,
) -> (
    Arc<Svc>,
    tokio::task::JoinHandle<Result<u64, TestError>>,
    Gate,
) {
    let svc = Svc::on(store);
    svc.remote.script([Fault::LoseReply]);
    let (task, gate) = svc
        .held_before(
            step,
            [],
            |svc| async move { svc.hold(&svc.order, 500).await },
        )
        .await;
    (svc, task, gate)
}

/// Waits (up to 10 s) until the task that gives an unanswered claim back reads the key, held at `reads`.
async fn until_asked(reads: &Gate) {
    tokio::time::timeout(Duration::from_secs(10), reads.reached())
        .await
        .expect("nothing asked the store whether the unanswered claim was written");
}

/// The caller of a held call goes away.
async fn cancel(task: tokio::task::JoinHandle<Result<u64, TestError>>) {
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
}

/// Issue 6, case 1: the attempt succeeded, and the caller went away while the outcome was being
/// written. The outcome is still recorded and the key is never released: a duplicate replays it.
async fn cancelled_while_recording_a_success(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    let (first, _gate) = svc
        .held_before("complete", [], |svc| async move {
            svc.plain(&svc.order, 500).await
        })
        .await;
    cancel(first).await;
    let call_id = svc.first_call_id();
    svc.until_state(&call_id, ReceiptState::Success).await;
    assert_eq!(svc.plain(&svc.order, 500).await, Ok(500));
    assert_eq!(svc.remote.effects(&svc.order), 1, "the duplicate replayed");
    assert!(svc.queued().await.is_empty());
}

/// Issue 6, case 1, for a permanent failure: recorded `FAILED` although the caller went away.
async fn cancelled_while_recording_a_failure(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.remote.script([Fault::Reject]);
    let (first, _gate) = svc
        .held_before("complete", [], |svc| async move {
            svc.plain(&svc.order, 500).await
        })
        .await;
    cancel(first).await;
    let call_id = svc.first_call_id();
    svc.until_state(&call_id, ReceiptState::Failed).await;
    assert_eq!(svc.plain(&svc.order, 500).await, Err(TestError::Rejected));
    assert_eq!(svc.remote.call_ids().len(), 1, "the duplicate sent nothing");
}

/// Issue 6, case 1: when the cancelled call's outcome cannot be written either, the call is left
/// `UNKNOWN` and queued, never released.
async fn cancelled_and_the_write_fails(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    let (first, _gate) = svc
        .held_before("complete", [Act::Fail(unavailable())], |svc| async move {
            svc.plain(&svc.order, 500).await
        })
        .await;
    cancel(first).await;
    let call_id = svc.first_call_id();
    svc.until_state(&call_id, ReceiptState::Unknown).await;
    svc.until_queued(&call_id).await;
    assert_eq!(svc.queued().await, [call_id]);
}

/// Issue 6, case 5: a duplicate takes over an `UNKNOWN` call, the lookup says it succeeded, and the
/// completion fails. The compensation entry stays until a completion is applied.
async fn take_over_whose_completion_fails(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.remote.script([Fault::LoseReply]);
    let out = svc.hold(&svc.order, 500).await;
    let call_id = svc.first_call_id();
    assert_eq!(
        out,
        Err(TestError::Samekey(Error::Unknown {
            call_id: call_id.clone()
        }))
    );
    assert_eq!(svc.queued().await, std::slice::from_ref(&call_id));
    svc.store.plan("complete", [Act::Fail(unavailable())]);
    // The true answer reaches the caller, but it could not be recorded: the entry stays.
    assert_eq!(svc.with_lookup(&svc.order, 500).await, Ok(500));
    assert_eq!(svc.queued().await, std::slice::from_ref(&call_id));
    assert_ne!(svc.state(&call_id).await, Some(ReceiptState::Success));
    // Once the taking-over call's lease ends, the next duplicate resolves it and clears the entry.
    svc.pass_lease().await;
    assert_eq!(svc.with_lookup(&svc.order, 500).await, Ok(500));
    assert_eq!(svc.state(&call_id).await, Some(ReceiptState::Success));
    assert!(svc.queued().await.is_empty());
    assert_eq!(svc.remote.effects(&svc.order), 1);
}

/// Issue 6, case 6: the owner stalls (a GC pause) before it marks its uncertain call `UNKNOWN`; its
/// lease ends, a duplicate takes the call over, finds through `lookup` that it succeeded and records
/// it. The owner comes back, is fenced out, and answers the recorded success, queueing nothing.
async fn owner_back_after_a_take_over_answers_the_outcome(store: Arc<dyn Store>) {
    owner_back_from(store, "mark_unknown").await;
}

/// The owner stalls at `step` of handing its uncertain call to compensation, past its lease; a
/// duplicate takes the call over, finds through `lookup` that it succeeded and records it. Back, the
/// owner is fenced out: it answers the recorded success, and no entry stays beside it (one it wrote
/// late is removed: a settled call needs none).
async fn owner_back_from(store: Arc<dyn Store>, step: &'static str) {
    let (svc, owner, stall) = uncertain_call_held_before(store, step).await;
    owner_back_after_a_take_over(&svc, owner, stall, step).await;
}

/// The owner, held at `step` (`stall`), past its lease: a duplicate takes the call over, finds through
/// `lookup` that it succeeded and records it. Back, the owner answers the recorded success, nothing is
/// queued beside it, and the order was charged once.
async fn owner_back_after_a_take_over(
    svc: &Svc,
    owner: tokio::task::JoinHandle<Result<u64, TestError>>,
    stall: Gate,
    step: &str,
) {
    svc.pass_lease().await;
    assert_eq!(svc.with_lookup(&svc.order, 500).await, Ok(500));
    stall.open();
    assert_eq!(owner.await.unwrap(), Ok(500));
    let call_id = svc.first_call_id();
    assert_eq!(svc.state(&call_id).await, Some(ReceiptState::Success));
    assert!(
        svc.queued().await.is_empty(),
        "{step}: nothing queued beside SUCCESS"
    );
    assert_eq!(svc.remote.effects(&svc.order), 1);
}

/// Runs `rerun` as the owner until `stall` holds it at the store, lets its lease pass while a duplicate
/// takes the call over and runs it to its end, then lets the owner on: both answer the one outcome,
/// which took effect once.
async fn owner_stalled_past_a_take_over(svc: &Arc<Svc>, stall: &Gate) {
    let owner = tokio::spawn({
        let svc = svc.clone();
        async move { svc.rerun(&svc.order, 500).await }
    });
    stall.reached().await;
    svc.pass_lease().await;
    assert_eq!(svc.rerun(&svc.order, 500).await, Ok(500));
    stall.open();
    assert_eq!(owner.await.unwrap(), Ok(500));
    assert_eq!(svc.remote.effects(&svc.order), 1);
}

/// Issue 6, case 6: the owner stalls right after it extended its lease for a backoff; meanwhile the key
/// is taken over and the call run to its end under the same callId. Back, the owner confirms its key
/// before sending again, finds it lost, and answers the recorded outcome: nothing is sent twice.
async fn owner_confirms_its_key_before_a_retry(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.remote.script([Fault::Unavailable]);
    let stall = Gate::new();
    svc.store.plan("extend_lease", [Act::After(stall.clone())]);
    owner_stalled_past_a_take_over(&svc, &stall).await;
    assert_eq!(
        svc.remote.call_ids().len(),
        2,
        "the owner sent nothing after its stall"
    );
}

/// Issue 38, defect 9: a taker hears "not received" and stalls before it sends (a GC pause, a
/// blocked thread) past its lease; a duplicate takes the call over, asks, sends and records the
/// charge. Back, the first confirms under its fence that the key is still its own before sending,
/// finds it lost, and answers the recorded charge: the remote, which executes every request that
/// arrives, charged once.
async fn a_taker_confirms_its_key_after_its_lookup(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.remote.script([Fault::LoseRequest]);
    let first = svc.hold(&svc.order, 500).await;
    assert!(
        matches!(first, Err(TestError::Samekey(Error::Unknown { .. }))),
        "{first:?}"
    );
    // The taker's first lease extension covers its lookup; the next is the confirmation, held
    // before it reaches the store: the stall.
    let stall = Gate::new();
    svc.store
        .plan("extend_lease", [Act::Pass, Act::Before(stall.clone())]);
    let taker = tokio::spawn({
        let svc = svc.clone();
        async move { svc.with_lookup(&svc.order, 500).await }
    });
    let confirmed = tokio::time::timeout(Duration::from_secs(5), stall.reached()).await;
    assert!(
        confirmed.is_ok(),
        "after \"not received\" the taker sent without confirming it still owns the key (the \
         remote saw {:?})",
        svc.remote.call_ids()
    );
    svc.pass_lease().await;
    svc.pass_lease().await;
    assert_eq!(svc.with_lookup(&svc.order, 500).await, Ok(500));
    stall.open();
    assert_eq!(taker.await.unwrap(), Ok(500), "told the recorded charge");
    assert_eq!(svc.remote.effects(&svc.order), 1, "charged once");
    assert_eq!(
        svc.state(&svc.first_call_id()).await,
        Some(ReceiptState::Success)
    );
}

/// Issue 38, defect 8: a call whose every lookup failed with a long error text (a proxy's 70 kB
/// error page) is left `UNKNOWN` and queued, on every store: the entry's reason quotes the error, cut
/// to [`samekey::compensation::MAX_REASON_CHARS`] characters, and is written whatever the error's
/// length (MySQL's strict mode refused the whole row before).
async fn a_long_lookup_error_still_queues_the_call(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.remote.script([Fault::LoseReply]);
    let out = svc.with_a_verbose_lookup(&svc.order, 500).await;
    let call_id = svc.first_call_id();
    assert_eq!(
        out,
        Err(TestError::Samekey(Error::Unknown {
            call_id: call_id.clone()
        }))
    );
    assert_eq!(svc.state(&call_id).await, Some(ReceiptState::Unknown));
    let entries = svc.rt.compensations().await.unwrap();
    let entry = entries
        .iter()
        .find(|e| e.call_id == call_id)
        .expect("the call is queued");
    assert!(entry.reason.contains("<html>"), "{}", entry.reason);
    assert!(
        entry.reason.chars().count() <= samekey::compensation::MAX_REASON_CHARS + 1,
        "{} characters",
        entry.reason.chars().count()
    );
}

/// Issue 6, case 7: a lookup that fails once is asked again (it re-sends nothing); the call ends with
/// the true answer instead of `UNKNOWN`.
async fn a_failed_lookup_is_asked_again(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.remote.script([Fault::LoseReply]);
    svc.remote.script_lookups([true]);
    assert_eq!(svc.with_lookup(&svc.order, 500).await, Ok(500));
    assert_eq!(svc.remote.lookups(), 2);
    assert_eq!(svc.remote.call_ids().len(), 1);
    assert!(svc.queued().await.is_empty());
}

/// Issue 6, case 8: every attempt was refused, and releasing the claim fails (the store went down):
/// the caller is not told a plain failure; the call is `UNKNOWN` and queued.
async fn a_failed_release_is_not_a_plain_failure(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.remote.script([Fault::Unavailable; 4]);
    svc.store.plan("release", [Act::Fail(unavailable())]);
    let out = svc.plain(&svc.order, 500).await;
    let call_id = svc.first_call_id();
    assert_eq!(
        out,
        Err(TestError::Samekey(Error::Unknown {
            call_id: call_id.clone()
        }))
    );
    assert_eq!(svc.state(&call_id).await, Some(ReceiptState::Unknown));
    assert_eq!(svc.queued().await, [call_id]);
}

/// Issue 6, case 8: the owner's release is refused because, while it stalled, another node took the key
/// over and charged under the same callId. The owner answers that charge, not "failed".
async fn a_refused_release_answers_the_charge(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.remote.script([Fault::Unavailable; 4]);
    let (owner, stall) = svc
        .held_before("release", [], |svc| async move {
            svc.rerun(&svc.order, 500).await
        })
        .await;
    svc.pass_lease().await;
    assert_eq!(svc.rerun(&svc.order, 500).await, Ok(500));
    stall.open();
    assert_eq!(owner.await.unwrap(), Ok(500), "told what happened: charged");
    assert_eq!(svc.remote.effects(&svc.order), 1);
    assert!(svc.queued().await.is_empty());
}

/// A call is never `UNKNOWN` without its compensation entry, whichever of the two writes fails (or
/// is the last a dying process makes): the entry is written first. Without it the record stays
/// `PROCESSING`, an orphan the sweep finds once the lease ends; with it and no mark, the entry is
/// there. Either way the next duplicate takes the call over and resolves it, once.
async fn an_unknown_is_never_without_its_entry(store: Arc<dyn Store>) {
    for failing in ["enqueue_compensation", "mark_unknown"] {
        let svc = Svc::on(store.clone());
        svc.remote.script([Fault::LoseReply]);
        svc.store.plan(failing, [Act::Fail(unavailable())]);
        assert!(
            matches!(
                svc.hold(&svc.order, 500).await,
                Err(TestError::Samekey(Error::Unknown { .. }))
            ),
            "{failing}"
        );
        let call_id = svc.first_call_id();
        assert_eq!(
            svc.state(&call_id).await,
            Some(ReceiptState::Processing),
            "{failing}: not UNKNOWN"
        );
        let queued = svc.queued().await;
        match failing {
            "enqueue_compensation" => {
                assert!(queued.is_empty(), "{queued:?}");
                svc.pass_lease().await;
                let orphans = svc
                    .store
                    .list_orphans(svc.rt.now_ms(), 10_000)
                    .await
                    .unwrap();
                assert!(
                    orphans.iter().any(|r| r.call_id == call_id),
                    "the sweep finds it"
                );
            }
            _ => {
                assert_eq!(queued, std::slice::from_ref(&call_id));
                svc.pass_lease().await;
            }
        }
        assert_eq!(svc.with_lookup(&svc.order, 500).await, Ok(500), "{failing}");
        assert_eq!(svc.state(&call_id).await, Some(ReceiptState::Success));
        assert!(svc.queued().await.is_empty(), "{failing}: entry cleared");
        assert_eq!(svc.remote.effects(&svc.order), 1);
    }
}

/// The caller goes away while its uncertain call is being queued (before the mark): the drop guard
/// finishes the hand-over — queued, then `UNKNOWN` — and the key is never released.
async fn dropped_while_being_queued(store: Arc<dyn Store>) {
    let (svc, first, _gate) = uncertain_call_held_before(store, "enqueue_compensation").await;
    cancel(first).await;
    let call_id = svc.first_call_id();
    svc.until_state(&call_id, ReceiptState::Unknown).await;
    svc.until_queued(&call_id).await;
    assert_eq!(svc.queued().await, [call_id]);
    assert_eq!(svc.remote.effects(&svc.order), 1);
}

/// The caller goes away after its uncertain call was queued, while it is being marked: the drop
/// guard queues it again (the same entry) and marks it, and the key is never released.
async fn dropped_while_being_marked(store: Arc<dyn Store>) {
    let (svc, first, _gate) = uncertain_call_held_before(store, "mark_unknown").await;
    let call_id = svc.first_call_id();
    assert_eq!(
        svc.queued().await,
        std::slice::from_ref(&call_id),
        "queued first"
    );
    cancel(first).await;
    svc.until_state(&call_id, ReceiptState::Unknown).await;
    assert_eq!(svc.queued().await, [call_id], "one entry");
    assert_eq!(svc.remote.effects(&svc.order), 1);
}

/// The owner stalls while queueing its uncertain call, past its lease: its mark is fenced out, and
/// the entry it wrote late is removed.
async fn owner_back_from_queueing_answers_the_outcome(store: Arc<dyn Store>) {
    owner_back_from(store, "enqueue_compensation").await;
}

/// The owner's attempt succeeded and the owner stalls before it records that, past its lease; a
/// duplicate takes the call over, finds through `lookup` that it succeeded and records it. Back, the
/// owner's completion carries its old fence and is refused: it answers the recorded outcome, and
/// nothing was charged twice.
async fn owner_back_from_completing_answers_the_recorded_outcome(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    let (owner, stall) = svc
        .held_before("complete", [], |svc| async move {
            svc.with_lookup(&svc.order, 500).await
        })
        .await;
    owner_back_after_a_take_over(&svc, owner, stall, "complete").await;
    assert_eq!(svc.remote.call_ids().len(), 1, "the duplicate only asked");
}

/// Starts `hold`, whose caller goes away once `gate` holds it at the store, before anything was sent; a
/// duplicate then runs the call (its key given back), once, with nothing queued.
async fn dropped_then_duplicated(svc: &Arc<Svc>, gate: &Gate) {
    let first = tokio::spawn({
        let svc = svc.clone();
        async move { svc.hold(&svc.order, 500).await }
    });
    gate.reached().await;
    cancel(first).await;
    assert!(svc.remote.call_ids().is_empty(), "nothing sent");
    assert_eq!(svc.duplicate_in_time().await, Ok(500));
    assert_eq!(svc.remote.effects(&svc.order), 1);
    assert!(svc.queued().await.is_empty());
}

/// The caller goes away while its claim is answered (the claim written, the answer not yet back):
/// the call never learned its fence, and nothing ran. A task of its own gives the claim back, so a
/// duplicate of a function without `lookup` (which could only leave a vanished owner's call
/// `UNKNOWN`) runs at once, without waiting for the lease; the key's journal says why.
async fn dropped_while_claiming_gives_the_key_back(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    let gate = Gate::new();
    svc.store.plan("claim", [Act::After(gate.clone())]);
    dropped_then_duplicated(&svc, &gate).await;
    svc.assert_given_back("its caller went away").await;
}

/// The store takes the claim and fails before it answers (a server that crashed after its commit):
/// the call fails closed, as for any store failure, and its claim, written under a fence it never
/// learned, is given back once the store answers again. The next call runs, once.
async fn a_claim_whose_answer_is_lost_is_given_back(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.store.plan("claim", [Act::Lose(unavailable())]);
    failed_closed(svc.hold(&svc.order, 500).await);
    assert!(svc.remote.call_ids().is_empty(), "failed closed");
    assert_eq!(svc.duplicate_in_time().await, Ok(500));
    assert_eq!(svc.remote.effects(&svc.order), 1);
    assert_eq!(svc.remote.call_ids().len(), 1);
    svc.assert_given_back("the store failed while answering it")
        .await;
}

/// As above, but the store's answer to the read comes only after the claim's lease could have ended:
/// a record read then may be a taker's (which continues under the same callId), so the claim is left
/// to its lease, as any vanished owner's. A duplicate without `lookup` takes it over and holds it
/// `UNKNOWN`; nothing runs.
async fn an_unanswered_claim_is_left_to_its_lease_once_it_may_have_ended(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    let reads = Gate::new();
    svc.store.plan("claim", [Act::Lose(unavailable())]);
    svc.store.plan("get", [Act::After(reads.clone())]);
    failed_closed(svc.hold(&svc.order, 500).await);
    until_asked(&reads).await;
    svc.pass_lease().await;
    reads.open();
    // The read answers now, too late: the claim must still be there once the task acted on it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let record = svc.store.inner().get(&svc.key(), svc.rt.now_ms()).await;
    assert!(
        matches!(&record, Ok(Some(r)) if r.state == ReceiptState::Processing),
        "{record:?}"
    );
    let out = svc.hold(&svc.order, 500).await;
    assert!(
        matches!(out, Err(TestError::Samekey(Error::Unknown { .. }))),
        "{out:?}"
    );
    assert!(svc.remote.call_ids().is_empty(), "nothing ran");
    let history = svc.rt.history_of_key(&svc.key()).await.unwrap();
    assert!(
        !history
            .events
            .iter()
            .any(|e| matches!(e.what, EventKind::Released { .. })),
        "{history:?}"
    );
}

/// A callId adopted from an inbound request may be carried by other calls too: a caller retries with
/// the same `X-Call-Id`, each retry a request of its own. The first request's claim fails (it was never
/// written) and the retry claims the key under the same callId and runs. Nothing may take the record
/// under that callId for the first request's unanswered claim and give it back while the retry runs:
/// the retry records its outcome, and a third request replays it.
async fn an_unanswered_claim_under_an_adopted_call_id_is_left_alone(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    let call_id = CallId::new("gw", "edge").unwrap();
    let request = |svc: Arc<Svc>, call_id: CallId| async move {
        InboundCall::new()
            .call_id(call_id)
            .scope(svc.hold(&svc.order, 500))
            .await
    };
    // Were the first request's claim handed to a task, the task's read would answer only now that
    // the retry holds the key.
    let reads = Gate::new();
    svc.store.plan("claim", [Act::Fail(unavailable())]);
    svc.store.plan("get", [Act::Before(reads.clone())]);
    failed_closed(request(svc.clone(), call_id.clone()).await);
    let (retry, recording) = svc
        .held_before("complete", [], {
            let call_id = call_id.clone();
            move |svc| request(svc, call_id)
        })
        .await;
    reads.open();
    // Whatever runs in the background meanwhile: the retry's claim stays the retry's.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let record = svc.store.inner().get(&svc.key(), svc.rt.now_ms()).await;
    assert!(
        matches!(&record, Ok(Some(r)) if r.state == ReceiptState::Processing && r.call_id == call_id),
        "{record:?}"
    );
    recording.open();
    assert_eq!(retry.await.unwrap(), Ok(500));
    assert_eq!(svc.hold(&svc.order, 500).await, Ok(500));
    assert_eq!(svc.remote.effects(&svc.order), 1);
}

/// Nodes whose clocks run apart, on a store that judges leases by the caller's clock: a duplicate on a
/// node 3 s ahead takes over the unanswered claim while, by the first node's clock, the claim's lease
/// still runs, and re-runs the call under the same callId. The first node's task then reads a
/// `PROCESSING` record under its callId within its window: the taker's, running. It must stay
/// (a take-over updates the record, a claim as written never was).
async fn a_taker_s_record_is_never_given_back_whatever_the_clocks_say(store: Arc<dyn Store>) {
    if store.clock() == StoreClock::Own {
        // One clock judges every node's lease there: nothing to run apart.
        return;
    }
    let svc = Svc::on(store.clone());
    let ahead = TestClock::default();
    ahead.advance(Duration::from_secs(3));
    let other_node = Svc::on_node(store, ahead, svc.order.clone());
    let reads = Gate::new();
    svc.store.plan("claim", [Act::Lose(unavailable())]);
    svc.store.plan("get", [Act::Before(reads.clone())]);
    failed_closed(svc.rerun(&svc.order, 500).await);
    until_asked(&reads).await;
    let (taker, recording) = other_node
        .held_before("complete", [], |svc| async move {
            svc.rerun(&svc.order, 500).await
        })
        .await;
    let taken = svc.store.inner().get(&svc.key(), svc.rt.now_ms()).await;
    reads.open();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let now = svc.store.inner().get(&svc.key(), svc.rt.now_ms()).await;
    assert!(
        matches!((&taken, &now), (Ok(Some(a)), Ok(Some(b)))
            if b.state == ReceiptState::Processing && a.fence == b.fence),
        "{taken:?} then {now:?}"
    );
    recording.open();
    assert_eq!(taker.await.unwrap(), Ok(500));
    assert_eq!(other_node.remote.effects(&svc.order), 1);
    assert_eq!(svc.hold(&svc.order, 500).await, Ok(500), "replayed");
    assert!(
        svc.remote.call_ids().is_empty(),
        "the first node sent nothing"
    );
}

/// The store applies the claim, and the client sends it again after a reset (as the Redis Cluster
/// client does): the second answer is the record the first wrote, this call's own claim. The call owns
/// the key under that claim's fence and runs, once; it neither waits for itself nor leaves itself
/// `UNKNOWN`.
async fn a_claim_sent_twice_is_the_call_s_own(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.store.plan("claim", [Act::Resend]);
    let first = tokio::time::timeout(Duration::from_secs(10), svc.hold(&svc.order, 500))
        .await
        .expect("the call waited for its own claim");
    assert_eq!(first, Ok(500));
    assert_eq!(svc.remote.effects(&svc.order), 1);
    assert_eq!(svc.hold(&svc.order, 500).await, Ok(500), "replayed");
    assert_eq!(svc.remote.effects(&svc.order), 1);
    assert!(svc.queued().await.is_empty());
}

/// The call owns its own claim, answered again as existing, and stalls while renewing its lease, past
/// the lease; a duplicate takes the call over and runs it to its end under the same callId. Back, the
/// owner's renewal carries the old fence and is refused: it answers the recorded outcome, and nothing
/// was sent twice.
async fn owner_back_from_renewing_its_own_claim_answers_the_recorded_outcome(
    store: Arc<dyn Store>,
) {
    let svc = Svc::on(store);
    let stall = Gate::new();
    svc.store.plan("claim", [Act::Resend]);
    svc.store.plan("extend_lease", [Act::Before(stall.clone())]);
    owner_stalled_past_a_take_over(&svc, &stall).await;
    assert_eq!(svc.remote.call_ids().len(), 1, "the owner sent nothing");
}

/// The caller goes away while the call renews the lease of its own claim, answered again as existing:
/// nothing ran, so the claim is released and a duplicate runs, once.
async fn dropped_while_renewing_its_own_claim_gives_the_key_back(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    let gate = Gate::new();
    svc.store.plan("claim", [Act::Resend]);
    svc.store.plan("extend_lease", [Act::Before(gate.clone())]);
    dropped_then_duplicated(&svc, &gate).await;
}

support::on_stores!(memory, local_cache, sqlite if "sqlite", postgres if "postgres", mysql if "mysql", mysql_cached if "mysql" & "redis", redis if "redis" => {
    an_unknown_is_never_without_its_entry,
    dropped_while_being_queued,
    dropped_while_being_marked,
    owner_back_from_queueing_answers_the_outcome,
    cancelled_while_recording_a_success,
    cancelled_while_recording_a_failure,
    cancelled_and_the_write_fails,
    take_over_whose_completion_fails,
    owner_back_after_a_take_over_answers_the_outcome,
    owner_confirms_its_key_before_a_retry,
    a_taker_confirms_its_key_after_its_lookup,
    a_long_lookup_error_still_queues_the_call,
    a_failed_lookup_is_asked_again,
    a_failed_release_is_not_a_plain_failure,
    a_refused_release_answers_the_charge,
    owner_back_from_completing_answers_the_recorded_outcome,
    dropped_while_claiming_gives_the_key_back,
    a_claim_whose_answer_is_lost_is_given_back,
    an_unanswered_claim_is_left_to_its_lease_once_it_may_have_ended,
    an_unanswered_claim_under_an_adopted_call_id_is_left_alone,
    a_taker_s_record_is_never_given_back_whatever_the_clocks_say,
    a_claim_sent_twice_is_the_call_s_own,
    owner_back_from_renewing_its_own_claim_answers_the_recorded_outcome,
    dropped_while_renewing_its_own_claim_gives_the_key_back,
});
