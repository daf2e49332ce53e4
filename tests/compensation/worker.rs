//! The compensation worker, with paused time: every `UNKNOWN` call ends recorded, released, failed or
//! `MANUAL`; one worker per entry; a worker that crashed is taken over; a person resolves by hand.
//!
//! (Was `tests/compensator.rs`.)

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use samekey::{
    clock::TokioClock, compensation::CompensationOperation, compensation::CompensationState,
    compensation::ManualResolution, compensation::NotReceivedPolicy, idempotent, CallId,
    Compensator, Error, RemoteStatus, Runtime,
};
use support::{Fault, Remote, TestError};

struct Svc {
    rt: Runtime,
    remote: Remote,
}

impl Svc {
    fn new() -> Svc {
        Svc {
            rt: Runtime::builder()
                .node("test")
                .clock(TokioClock::new())
                .build()
                .unwrap(),
            remote: Remote::default(),
        }
    }

    /// The same operation, for a caller that may ask the receipt.
    #[idempotent(key = "order", scope = "orders.charge", runtime = &self.rt, timeout = "1s", lookup = |c| self.remote.status(c))]
    async fn charge_checked(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    /// Without `lookup`: an unknown outcome is left to compensation at once.
    #[idempotent(key = "order", scope = "orders.charge", runtime = &self.rt, timeout = "1s", on_unknown = "hold")]
    async fn charge(&self, order: &str, amount: u64) -> Result<u64, TestError> {
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
        Compensator::new(&self.rt)
            .operation("orders.charge", self.operation())
            .rounds([Duration::from_secs(1), Duration::from_secs(2)])
    }

    /// A call whose reply (or request) is lost: `UNKNOWN`, queued.
    async fn unknown(&self, order: &str, fault: Fault) -> CallId {
        self.remote.script([fault]);
        match self.charge(order, 500).await {
            Err(TestError::Samekey(Error::Unknown { call_id })) => call_id,
            other => panic!("{other:?}"),
        }
    }

    /// Keeps its inputs in the compensation entry, for a reversal or a re-run.
    #[idempotent(key = "order", scope = "orders.charge", runtime = &self.rt, timeout = "1s",
                 on_unknown = "hold", inputs = "order, amount")]
    async fn charge_keeping_inputs(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    async fn queued(&self) -> Vec<samekey::compensation::CompensationEntry> {
        self.rt.compensations().await.unwrap()
    }
}

/// An escalation hook that counts the entries it pages a person for (each `MANUAL`), and the count.
fn pager() -> (
    Arc<AtomicU32>,
    impl Fn(&samekey::compensation::CompensationEntry) + Send + Sync + 'static,
) {
    let paged = Arc::new(AtomicU32::new(0));
    let hook = {
        let paged = paged.clone();
        move |entry: &samekey::compensation::CompensationEntry| {
            assert_eq!(entry.state, CompensationState::Manual);
            paged.fetch_add(1, Ordering::SeqCst);
        }
    };
    (paged, hook)
}

/// The provider calls back "charged" for `call_id`, whose record says otherwise: refused.
async fn refused_charged_callback(rt: &Runtime, call_id: &CallId) {
    let refused = rt
        .apply_callback(
            call_id,
            samekey::callback::Callback::succeeded(&500u64).unwrap(),
        )
        .await;
    assert!(
        matches!(refused, Err(samekey::Error::TransitionRefused { .. })),
        "{refused:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_charge_whose_reply_was_lost_is_recorded_as_it_happened() {
    let svc = Svc::new();
    let call_id = svc.unknown("o-1", Fault::LoseReply).await;
    assert_eq!(svc.queued().await.len(), 1);
    let pass = svc.worker().run_once().await.unwrap();
    assert_eq!((pass.taken, pass.succeeded), (1, 1));
    assert!(svc.queued().await.is_empty());
    let receipt = svc.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, samekey::ReceiptState::Success);
    // A duplicate now replays the outcome the worker recorded; nothing is charged again.
    assert_eq!(svc.charge("o-1", 500).await, Ok(500));
    assert_eq!(svc.remote.effects("o-1"), 1);
}

/// Defect 5 of issue 24: "not received" is true when said, not for good. The worker used to give the
/// key back by default; the next call then ran under a new callId, and the first request, arriving
/// late, charged a second time. By default the call stays `UNKNOWN` through its rounds, then goes to
/// a person: the late request is the only charge.
#[tokio::test(start_paused = true)]
async fn a_charge_not_received_yet_keeps_its_key_through_its_rounds() {
    let svc = Svc::new();
    let call_id = svc.unknown("o-2", Fault::LoseRequest).await;
    let pass = svc.worker().settle().await.unwrap();
    assert_eq!((pass.released, pass.failed), (0, 0), "{pass:?}");
    assert_eq!((pass.rescheduled, pass.escalated), (2, 1), "{pass:?}");
    assert_eq!(svc.queued().await[0].state, CompensationState::Manual);
    let receipt = svc.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, samekey::ReceiptState::Unknown);
    // A duplicate does not run it under a new callId.
    assert!(matches!(
        svc.charge("o-2", 500).await,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));
    // The first request arrives after all: it is the one charge.
    svc.remote.call_as(&call_id, "o-2", || 500).await.unwrap();
    assert!(svc.charge("o-2", 500).await.is_err());
    assert_eq!(svc.remote.effects("o-2"), 1, "charged once");
}

/// Giving the key back is an opt-in with the age past which the remote refuses the callId: before it,
/// the call is held like any undecided one; after it, the key goes back and the next call runs.
#[tokio::test(start_paused = true)]
async fn a_charge_never_received_gives_its_key_back_once_the_remote_refuses_it() {
    let svc = Svc::new();
    svc.unknown("o-2b", Fault::LoseRequest).await;
    let worker = Compensator::new(&svc.rt)
        .operation(
            "orders.charge",
            svc.operation().not_received(NotReceivedPolicy::Release {
                refused_after: Duration::from_secs(90),
            }),
        )
        .rounds([Duration::from_secs(60), Duration::from_secs(60)]);
    let first = worker.run_once().await.unwrap();
    assert_eq!((first.released, first.rescheduled), (0, 1), "{first:?}");
    let key = samekey::Key::build("orders.charge", &"o-2b");
    let told: Vec<String> = svc
        .rt
        .history_of_key(&key)
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| e.what.to_string())
        .collect();
    assert!(
        told.iter().any(|t| t.contains("may still arrive")),
        "{told:?}"
    );
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(worker.run_once().await.unwrap().rescheduled, 1, "60 s old");
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(worker.run_once().await.unwrap().released, 1, "120 s old");
    assert!(svc.queued().await.is_empty());
    assert_eq!(svc.charge("o-2b", 500).await, Ok(500), "the next call runs");
    assert_eq!(svc.remote.effects("o-2b"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_charge_never_received_may_be_failed_instead() {
    let svc = Svc::new();
    let call_id = svc.unknown("o-3", Fault::LoseRequest).await;
    let worker = Compensator::new(&svc.rt).operation(
        "orders.charge",
        svc.operation().not_received(NotReceivedPolicy::Fail {
            refused_after: Duration::from_secs(30),
        }),
    );
    assert_eq!(worker.run_once().await.unwrap().rescheduled, 1, "too young");
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(worker.run_once().await.unwrap().failed, 1);
    match svc.charge("o-3", 500).await {
        Err(TestError::Samekey(Error::Failed {
            call_id: failed,
            message,
        })) => {
            assert_eq!(failed, call_id);
            assert!(message.contains("not received"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(svc.remote.effects("o-3"), 0);
}

#[tokio::test(start_paused = true)]
async fn an_undecided_call_waits_for_later_rounds_then_asks_a_person_once() {
    let svc = Svc::new();
    let call_id = svc.unknown("o-4", Fault::LoseReply).await;
    svc.remote.script_lookups(std::iter::repeat_n(true, 3));
    let escalated = Arc::new(AtomicU32::new(0));
    let worker = svc.worker().on_escalate({
        let escalated = escalated.clone();
        move |_| {
            escalated.fetch_add(1, Ordering::SeqCst);
        }
    });
    assert_eq!(worker.run_once().await.unwrap().rescheduled, 1);
    assert_eq!(
        worker.run_once().await.unwrap().taken,
        0,
        "not due before 1 s"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(worker.run_once().await.unwrap().rescheduled, 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(worker.run_once().await.unwrap().escalated, 1);
    assert_eq!(escalated.load(Ordering::SeqCst), 1);
    let queued = svc.queued().await;
    assert_eq!(queued[0].state, CompensationState::Manual);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(
        worker.run_once().await.unwrap().taken,
        0,
        "a MANUAL entry is a person's"
    );
    // Meanwhile a duplicate still asks first: the receipt went back to UNKNOWN after each round.
    let receipt = svc.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, samekey::ReceiptState::Unknown);

    // The person checked with the provider: it was charged.
    worker
        .resolve(
            &call_id,
            ManualResolution::Succeeded(serde_json::json!(500)),
            "alice",
            "confirmed on the provider's dashboard",
        )
        .await
        .unwrap();
    assert!(svc.queued().await.is_empty());
    assert_eq!(svc.charge("o-4", 500).await, Ok(500));
    assert_eq!(svc.remote.effects("o-4"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_resolution_that_disagrees_with_a_settled_call_is_refused() {
    let svc = Svc::new();
    let call_id = svc.unknown("o-9", Fault::LoseReply).await;
    // A duplicate that may ask settles the call: it was charged.
    assert_eq!(svc.charge_checked("o-9", 500).await, Ok(500));
    let key = svc.rt.receipt(&call_id).await.unwrap().unwrap().key;
    let now = svc.rt.now_ms();
    svc.rt
        .store()
        .enqueue_compensation(samekey::compensation::CompensationEntry::new(
            call_id.clone(),
            key,
            "stale",
            now,
        ))
        .await
        .unwrap();
    let worker = svc.worker();
    let refused = worker
        .resolve(
            &call_id,
            ManualResolution::Release,
            "bob",
            "customer says unpaid",
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(Error::AlreadySettled {
                state: samekey::ReceiptState::Success,
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(svc.queued().await.len(), 1, "the entry stays");
    worker
        .resolve(
            &call_id,
            ManualResolution::Succeeded(serde_json::json!(500)),
            "bob",
            "agrees with the receipt",
        )
        .await
        .unwrap();
    assert!(svc.queued().await.is_empty());
}

/// Two workers drain one queue at once, in batches of 3 whose lookups yield to the other worker: both
/// get entries, and each entry is taken, asked about and settled once.
#[tokio::test(start_paused = true)]
async fn two_workers_never_work_one_entry() {
    let svc = Svc::new();
    for i in 0..10 {
        svc.unknown(&format!("o-race-{i}"), Fault::LoseReply).await;
    }
    let worker = || {
        let remote = svc.remote.clone();
        Compensator::new(&svc.rt).batch(3).operation(
            "orders.charge",
            CompensationOperation::new(move |call: CallId| {
                let remote = remote.clone();
                async move {
                    // A lookup that waits on its remote (a `yield_now` would not do: the worker keeps
                    // the key alive around the lookup, and polls it again at once).
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    remote.status(&call).await
                }
            }),
        )
    };
    let (a, b) = (worker(), worker());
    let drain = |w: Compensator| async move {
        let mut total = samekey::compensation::PassReport::default();
        loop {
            let pass = w.run_once().await.unwrap();
            if pass.taken == 0 {
                return total;
            }
            total += pass;
        }
    };
    let (pa, pb) = tokio::join!(drain(a), drain(b));
    assert!(pa.taken > 0 && pb.taken > 0, "both worked: {pa:?} {pb:?}");
    assert_eq!(pa.taken + pb.taken, 10);
    assert_eq!(pa.succeeded + pb.succeeded, 10);
    assert_eq!(pa.lost + pb.lost, 0);
    assert_eq!(svc.remote.lookups(), 10, "each call asked about once");
    assert!(svc.queued().await.is_empty());
}

/// A worker over `svc`'s operation whose lookup answers from `answers`, one per question (the last
/// repeated), counting the questions.
fn answering(
    svc: &Svc,
    answers: Vec<RemoteStatus<u64, TestError>>,
    asked: Arc<AtomicU32>,
) -> Compensator {
    let answers = Arc::new(answers);
    Compensator::new(&svc.rt)
        .operation(
            "orders.charge",
            CompensationOperation::new(move |_call: CallId| {
                let (answers, asked) = (answers.clone(), asked.clone());
                async move {
                    let n = asked.fetch_add(1, Ordering::SeqCst) as usize;
                    Ok::<_, TestError>(answers[n.min(answers.len() - 1)].clone())
                }
            }),
        )
        .rounds([Duration::from_secs(1), Duration::from_secs(2)])
}

#[tokio::test(start_paused = true)]
async fn a_charge_the_remote_declined_is_recorded_failed_and_replayed() {
    let svc = Svc::new();
    let call_id = svc.unknown("o-declined", Fault::LoseRequest).await;
    let asked = Arc::new(AtomicU32::new(0));
    let worker = answering(&svc, vec![RemoteStatus::Failed(TestError::Rejected)], asked);
    let pass = worker.run_once().await.unwrap();
    assert_eq!((pass.taken, pass.failed), (1, 1), "{pass:?}");
    let receipt = svc.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, samekey::ReceiptState::Failed);
    assert!(svc.queued().await.is_empty());
    // Recorded by its message (the worker holds the lookup's error, not the function's codec).
    match svc.charge("o-declined", 500).await {
        Err(TestError::Samekey(Error::Failed {
            call_id: replayed,
            message,
        })) => {
            assert_eq!((replayed, message.as_str()), (call_id, "rejected for good"));
        }
        other => panic!("a duplicate replays the remote's failure: {other:?}"),
    }
    assert_eq!(svc.remote.effects("o-declined"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_charge_still_processing_there_waits_for_the_next_round() {
    let svc = Svc::new();
    let call_id = svc.unknown("o-slow", Fault::LoseReply).await;
    let asked = Arc::new(AtomicU32::new(0));
    let worker = answering(
        &svc,
        vec![RemoteStatus::Processing, RemoteStatus::Succeeded(500)],
        asked.clone(),
    );
    let first = worker.run_once().await.unwrap();
    assert_eq!((first.taken, first.rescheduled), (1, 1), "{first:?}");
    let entry = &svc.queued().await[0];
    assert_eq!((entry.state, entry.round), (CompensationState::Pending, 1));
    assert_eq!(
        svc.rt.receipt(&call_id).await.unwrap().unwrap().state,
        samekey::ReceiptState::Unknown
    );
    assert_eq!(worker.run_once().await.unwrap().taken, 0, "not due yet");
    tokio::time::advance(Duration::from_secs(1)).await;
    let second = worker.run_once().await.unwrap();
    assert_eq!((second.taken, second.succeeded), (1, 1), "{second:?}");
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    assert_eq!(svc.charge("o-slow", 500).await, Ok(500));
    assert_eq!(svc.remote.effects("o-slow"), 1);
}

/// A worker whose lookup stalls past its lease on the entry: another worker takes the entry over and
/// settles it, and the first, back, is fenced out — it records nothing and counts the entry lost.
#[tokio::test(start_paused = true)]
async fn a_worker_stalled_past_its_lease_is_fenced_out() {
    let svc = Svc::new();
    let call_id = svc.unknown("o-stall", Fault::LoseReply).await;
    let (asked, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let stalled = {
        let (asked, release) = (asked.clone(), release.clone());
        Compensator::new(&svc.rt)
            .lease(Duration::from_secs(10))
            .operation(
                "orders.charge",
                CompensationOperation::new(move |_call: CallId| {
                    let (asked, release) = (asked.clone(), release.clone());
                    async move {
                        asked.notify_one();
                        release.notified().await;
                        // What the remote says by now is beside the point: the entry is not
                        // this worker's any more.
                        Ok::<_, TestError>(RemoteStatus::<u64, TestError>::NotReceived)
                    }
                }),
            )
    };
    let first = tokio::spawn(async move { stalled.run_once().await });
    asked.notified().await;
    tokio::time::advance(Duration::from_secs(11)).await;
    let second = svc.worker().run_once().await.unwrap();
    assert_eq!((second.taken, second.succeeded), (1, 1), "{second:?}");
    release.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!(
        (first.taken, first.lost, first.released),
        (1, 1, 0),
        "{first:?}"
    );
    let receipt = svc.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, samekey::ReceiptState::Success);
    assert!(svc.queued().await.is_empty());
    assert_eq!(svc.charge("o-stall", 500).await, Ok(500));
    assert_eq!(svc.remote.effects("o-stall"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_crashed_holding_entries_is_taken_over_after_its_lease() {
    let svc = Svc::new();
    svc.unknown("o-5", Fault::LoseReply).await;
    // A worker takes the entry and dies before doing anything with it.
    let now = svc.rt.now_ms();
    let taken = svc
        .rt
        .store()
        .take_due_compensations(now, 10, 60_000)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    let worker = svc.worker();
    assert_eq!(
        worker.run_once().await.unwrap().taken,
        0,
        "leased to the dead worker"
    );
    tokio::time::advance(Duration::from_secs(61)).await;
    let pass = worker.run_once().await.unwrap();
    assert_eq!((pass.taken, pass.succeeded), (1, 1));
    // The dead worker's fence no longer holds the entry (it is gone, too).
    assert!(svc
        .rt
        .store()
        .finish_compensation(&taken[0].call_id, Some(taken[0].fence))
        .await
        .is_ok());
    assert_eq!(svc.charge("o-5", 500).await, Ok(500));
    assert_eq!(svc.remote.effects("o-5"), 1);
}

#[tokio::test(start_paused = true)]
async fn an_entry_settled_by_a_duplicate_is_removed_without_asking() {
    let svc = Svc::new();
    let call_id = svc.unknown("o-7", Fault::LoseReply).await;
    // A duplicate that may ask (`lookup`) takes the call over and records it; it removes the entry.
    assert_eq!(svc.charge_checked("o-7", 500).await, Ok(500));
    assert!(svc.queued().await.is_empty());
    // Had its removal failed, the worker finds the call settled and only removes the entry.
    let key = svc.rt.receipt(&call_id).await.unwrap().unwrap().key;
    let now = svc.rt.now_ms();
    svc.rt
        .store()
        .enqueue_compensation(samekey::compensation::CompensationEntry::new(
            call_id, key, "left", now,
        ))
        .await
        .unwrap();
    let lookups = svc.remote.lookups();
    let pass = svc.worker().run_once().await.unwrap();
    assert_eq!(pass.settled_elsewhere, 1);
    assert_eq!(svc.remote.lookups(), lookups, "nothing asked");
    assert!(svc.queued().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_entry_of_a_scope_without_an_operation_ends_with_a_person() {
    let svc = Svc::new();
    svc.unknown("o-6", Fault::LoseReply).await;
    // No operation registered: the entry waits; a person resolves it later. Meanwhile nothing breaks.
    let blind = Compensator::new(&svc.rt).rounds([Duration::from_secs(1)]);
    assert_eq!(blind.run_once().await.unwrap().rescheduled, 1);
    assert_eq!(svc.remote.lookups(), 0);
    tokio::time::advance(Duration::from_secs(1)).await;
    let pass = blind.run_once().await.unwrap();
    assert_eq!(
        pass.escalated, 1,
        "no operation for the scope: a person decides"
    );
}

#[tokio::test(start_paused = true)]
async fn an_orphan_of_a_crashed_owner_is_swept_into_the_queue_and_resolved() {
    use samekey::store::{Claim, Claimed};
    let svc = Svc::new();
    // A process claimed the key, sent the charge, and crashed: PROCESSING, nothing queued.
    let call_id = CallId::new("pay", "crashed").unwrap();
    let key = samekey::Key::build("orders.charge", &"o-8");
    let now = svc.rt.now_ms();
    let claimed = svc
        .rt
        .store()
        .claim(Claim {
            key: key.clone(),
            call_id: call_id.clone(),
            fingerprint: None,
            lease_ms: 2_000,
            now_ms: now,
        })
        .await
        .unwrap();
    assert!(matches!(claimed, Claimed::Acquired(_)));
    svc.remote.call_as(&call_id, "o-8", || 500).await.unwrap();
    let worker = svc.worker();
    assert_eq!(
        worker.sweep().await.unwrap(),
        0,
        "its lease is still running"
    );
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(worker.sweep().await.unwrap(), 1);
    assert_eq!(
        worker.sweep().await.unwrap(),
        0,
        "a queued orphan is not listed again"
    );
    assert_eq!(svc.queued().await.len(), 1);
    let pass = worker.run_once().await.unwrap();
    assert_eq!(pass.succeeded, 1, "the gateway charged it: recorded");
    assert!(svc.queued().await.is_empty());
    assert_eq!(worker.sweep().await.unwrap(), 0, "no orphan left");
    assert_eq!(svc.charge("o-8", 500).await, Ok(500));
    assert_eq!(svc.remote.effects("o-8"), 1);
}

/// The entry carries what the worker needs: the attempts, how the last one ended, and the inputs the
/// function keeps (decoded as the tuple `inputs` names).
#[tokio::test(start_paused = true)]
async fn an_entry_carries_its_attempts_last_error_and_inputs() {
    let svc = Svc::new();
    svc.remote.script([Fault::LoseReply]);
    assert!(svc.charge_keeping_inputs("o-9", 700).await.is_err());
    let entry = svc.queued().await.remove(0);
    assert_eq!(entry.attempts, 1);
    assert_eq!(
        entry.last_error,
        Some(samekey::journal::AttemptOutcome::Unknown)
    );
    let inputs: (String, u64) = entry.inputs().expect("kept").expect("decodes");
    assert_eq!(inputs, ("o-9".to_owned(), 700));
    // A function that keeps none: none.
    svc.unknown("o-10", Fault::Slow(Duration::from_secs(5)))
        .await;
    let plain = svc
        .queued()
        .await
        .into_iter()
        .find(|e| e.key != entry.key)
        .unwrap();
    assert_eq!(
        plain.last_error,
        Some(samekey::journal::AttemptOutcome::TimedOut)
    );
    assert!(plain.inputs::<(String, u64)>().is_none());
}

fn reversal_counting(svc: &Svc, runs: Arc<AtomicU32>, fail_first: u32) -> CompensationOperation {
    svc.operation()
        .reversal(move |entry: samekey::compensation::CompensationEntry| {
            let runs = runs.clone();
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst);
                let (order, _amount): (String, u64) = entry.inputs().unwrap().unwrap();
                assert_eq!(order, "o-11");
                if n < fail_first {
                    // The stock service is down: refused before processing, nothing released.
                    Err(TestError::Refused)
                } else {
                    Ok(())
                }
            }
        })
}

/// Not received: the reversal undoes this side's part (with the kept inputs), once, and the call is
/// recorded `FAILED`; a reversal that fails is tried again at the next round.
#[tokio::test(start_paused = true)]
async fn a_charge_never_received_is_reversed_once_and_failed() {
    let svc = Svc::new();
    svc.remote.script([Fault::LoseRequest]);
    assert!(svc.charge_keeping_inputs("o-11", 700).await.is_err());
    let runs = Arc::new(AtomicU32::new(0));
    let worker = Compensator::new(&svc.rt)
        .operation("orders.charge", reversal_counting(&svc, runs.clone(), 1))
        .rounds([Duration::from_secs(1)]);
    let first = worker.run_once().await.unwrap();
    assert_eq!((first.reversed, first.rescheduled), (0, 1), "{first:?}");
    tokio::time::advance(Duration::from_secs(2)).await;
    let second = worker.run_once().await.unwrap();
    assert_eq!(second.reversed, 1, "{second:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(svc.queued().await.is_empty());
    match svc.charge_keeping_inputs("o-11", 700).await {
        Err(TestError::Samekey(Error::Failed { message, .. })) => {
            assert!(message.contains("reversed"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(svc.remote.effects("o-11"), 0);
}

/// A worker (lease 10 s) takes the queued call, journals its reversal's intent and dies while the
/// reversal runs (counted in `runs`, never ending); then its lease lapses.
async fn died_mid_reversal(svc: &Svc, runs: &Arc<AtomicU32>) {
    let hanging = slow_reversal(svc, runs.clone(), Arc::new(tokio::sync::Notify::new()));
    let dying = Compensator::new(&svc.rt)
        .operation("orders.charge", hanging)
        .lease(Duration::from_secs(10));
    // The worker's process dies mid-reversal: its pass is dropped.
    assert!(
        tokio::time::timeout(Duration::from_secs(1), dying.run_once())
            .await
            .is_err()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    tokio::time::advance(Duration::from_secs(30)).await;
}

/// A worker that dies while its reversal runs: the next one finds the intent with no end in the
/// journal and asks a person instead of reversing again.
#[tokio::test(start_paused = true)]
async fn a_worker_that_died_while_reversing_is_not_followed_by_a_second_reversal() {
    let svc = Svc::new();
    svc.remote.script([Fault::LoseRequest]);
    let _ = svc.charge_keeping_inputs("o-12", 700).await;
    let runs = Arc::new(AtomicU32::new(0));
    died_mid_reversal(&svc, &runs).await;
    let escalated = Arc::new(AtomicU32::new(0));
    let next = Compensator::new(&svc.rt)
        .operation("orders.charge", reversal_counting(&svc, runs.clone(), 0))
        .on_escalate({
            let escalated = escalated.clone();
            move |_| {
                escalated.fetch_add(1, Ordering::SeqCst);
            }
        });
    let pass = next.run_once().await.unwrap();
    assert_eq!((pass.escalated, pass.reversed), (1, 0), "{pass:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the reversal never runs twice"
    );
    assert_eq!(escalated.load(Ordering::SeqCst), 1);
    let entry = svc.queued().await.remove(0);
    assert_eq!(entry.state, CompensationState::Manual);
}

/// Issue 38, defect 2: the reversal releases the stock and its answer is lost (`Unknown`). It may
/// have acted: the reversal stays open and the entry goes to a person at once. A duplicate with
/// `lookup` that comes for the call answers `Unknown` and sends nothing — it never charges beside the
/// released stock — and no later round reverses it again.
#[tokio::test(start_paused = true)]
async fn a_reversal_whose_answer_was_lost_stays_open_and_goes_to_a_person() {
    let svc = Svc::new();
    svc.remote.script([Fault::LoseRequest]);
    assert!(svc.charge_keeping_inputs("o-12", 700).await.is_err());
    let runs = Arc::new(AtomicU32::new(0));
    let escalated = Arc::new(AtomicU32::new(0));
    let worker = Compensator::new(&svc.rt)
        .operation(
            "orders.charge",
            svc.operation().reversal({
                let runs = runs.clone();
                move |_entry| {
                    let runs = runs.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        // Released, and the stock service's reply was lost.
                        Err::<(), _>(TestError::Reset)
                    }
                }
            }),
        )
        .rounds([Duration::from_secs(1)])
        .on_escalate({
            let escalated = escalated.clone();
            move |_| {
                escalated.fetch_add(1, Ordering::SeqCst);
            }
        });
    let pass = worker.run_once().await.unwrap();
    assert_eq!((pass.escalated, pass.rescheduled), (1, 0), "{pass:?}");
    assert_eq!(escalated.load(Ordering::SeqCst), 1, "a person is paged");
    assert_eq!(svc.queued().await[0].state, CompensationState::Manual);
    assert!(
        matches!(
            svc.charge_checked("o-12", 700).await,
            Err(TestError::Samekey(Error::Unknown { .. }))
        ),
        "the duplicate answers Unknown"
    );
    assert_eq!(
        svc.remote.effects("o-12"),
        0,
        "nothing charged beside the reversal"
    );
    tokio::time::advance(Duration::from_secs(5)).await;
    worker.run_once().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never reversed again");
}

/// Issue 38, defect 2 (the skeptical reader's case): a reversal that released the stock and then
/// could not read the stock service's reply answers an error that stands (`Permanent`), not one that
/// says nothing ran: the reversal stays open and goes to a person, and a duplicate never charges
/// beside it.
#[tokio::test(start_paused = true)]
async fn a_reversal_that_answered_an_error_that_stands_stays_open() {
    let svc = Svc::new();
    svc.remote.script([Fault::LoseRequest]);
    assert!(svc.charge_keeping_inputs("o-15", 700).await.is_err());
    let worker = Compensator::new(&svc.rt).operation(
        "orders.charge",
        svc.operation().reversal(|_entry| async {
            Err::<(), _>(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the stock service's reply cannot be read",
            ))
        }),
    );
    let pass = worker.run_once().await.unwrap();
    assert_eq!((pass.escalated, pass.rescheduled), (1, 0), "{pass:?}");
    assert!(matches!(
        svc.charge_checked("o-15", 700).await,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));
    assert_eq!(svc.remote.effects("o-15"), 0);
}

/// Not received, with a re-run: the worker sends the call again under its callId and records it.
#[tokio::test(start_paused = true)]
async fn a_charge_never_received_may_be_sent_again_under_its_callid() {
    let svc = Svc::new();
    svc.remote.script([Fault::LoseRequest]);
    let _ = svc.charge_keeping_inputs("o-13", 700).await;
    let remote = svc.remote.clone();
    let worker = Compensator::new(&svc.rt).operation(
        "orders.charge",
        svc.operation()
            .rerun(move |entry: samekey::compensation::CompensationEntry| {
                let remote = remote.clone();
                async move {
                    let (order, amount): (String, u64) = entry.inputs().unwrap().unwrap();
                    remote.call_as(&entry.call_id, &order, || amount).await
                }
            }),
    );
    let pass = worker.run_once().await.unwrap();
    assert_eq!(pass.succeeded, 1, "{pass:?}");
    assert_eq!(svc.remote.effects("o-13"), 1);
    assert_eq!(svc.charge_keeping_inputs("o-13", 700).await, Ok(700));
    assert_eq!(svc.remote.effects("o-13"), 1, "a duplicate replays it");
}

/// Issue 38 (suspected, confirmed): a worker hears "not received" and stalls past its lease; a
/// duplicate with `lookup` takes the call over, asks, sends and records it. Back, the worker's re-run
/// confirms under its fence that the key is still its own before sending, finds it lost, and sends
/// nothing: the remote, which executes every request that arrives, charged once.
#[tokio::test(start_paused = true)]
async fn a_worker_stalled_after_its_lookup_never_re_runs_a_call_taken_over() {
    let svc = Arc::new(Svc::new());
    svc.remote.script([Fault::LoseRequest]);
    let _ = svc.charge_keeping_inputs("o-14", 700).await;
    let (answered, resume) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let remote = svc.remote.clone();
    let rerun_remote = svc.remote.clone();
    let stalled = Compensator::new(&svc.rt)
        .lease(Duration::from_secs(10))
        .operation(
            "orders.charge",
            CompensationOperation::new({
                let (answered, resume) = (answered.clone(), resume.clone());
                move |call: CallId| {
                    let (remote, answered, resume) =
                        (remote.clone(), answered.clone(), resume.clone());
                    async move {
                        let status = remote.status(&call).await;
                        // The answer is in; the worker stalls before it acts on it.
                        answered.notify_one();
                        resume.notified().await;
                        status
                    }
                }
            })
            .rerun(move |entry: samekey::compensation::CompensationEntry| {
                let remote = rerun_remote.clone();
                async move {
                    let (order, amount): (String, u64) = entry.inputs().unwrap().unwrap();
                    remote.call_as(&entry.call_id, &order, || amount).await
                }
            }),
        );
    let first = tokio::spawn(async move { stalled.run_once().await });
    answered.notified().await;
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(svc.charge_checked("o-14", 700).await, Ok(700));
    resume.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!((first.taken, first.lost), (1, 1), "{first:?}");
    assert_eq!(svc.remote.effects("o-14"), 1, "charged once");
}

#[tokio::test(start_paused = true)]
async fn a_person_makes_an_entry_due_now_or_escalates_it_and_the_journal_says_who() {
    let svc = Svc::new();
    let call_id = svc.unknown("o-20", Fault::LoseReply).await;
    svc.remote.script_lookups([true]);
    let escalated = Arc::new(AtomicU32::new(0));
    let worker = svc.worker().on_escalate({
        let escalated = escalated.clone();
        move |_| {
            escalated.fetch_add(1, Ordering::SeqCst);
        }
    });
    assert_eq!(worker.run_once().await.unwrap().rescheduled, 1);
    assert_eq!(worker.run_once().await.unwrap().taken, 0, "due in 1 s");

    // The provider's receipts are back: a person does not wait for the round.
    worker
        .retry(&call_id, "alice", "provider's status page is green")
        .await
        .unwrap();
    svc.remote.script_lookups([true]);
    let pass = worker.run_once().await.unwrap();
    assert_eq!((pass.taken, pass.rescheduled), (1, 1), "{pass:?}");

    // Another person knows this one needs a human: escalated before its rounds ran out.
    worker
        .escalate(&call_id, "bob", "provider asks for a ticket")
        .await
        .unwrap();
    assert_eq!(escalated.load(Ordering::SeqCst), 1, "the hook ran once");
    assert_eq!(svc.queued().await[0].state, CompensationState::Manual);

    // Made due again: one more round, then MANUAL again — here the receipt answers.
    worker
        .retry(&call_id, "bob", "ticket answered")
        .await
        .unwrap();
    assert_eq!(worker.run_once().await.unwrap().succeeded, 1);
    assert!(svc.queued().await.is_empty());

    let by_hand: Vec<String> = svc
        .rt
        .history(&call_id)
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| e.what.to_string())
        .filter(|text| text.contains("by hand"))
        .collect();
    assert_eq!(
        by_hand,
        [
            "compensation round 1: retried by hand (by alice: provider's status page is green)",
            "compensation round 2: escalated by hand (by bob: provider asks for a ticket)",
            "compensation round 2: retried by hand (by bob: ticket answered)",
        ]
    );
    let gone = worker.retry(&call_id, "carol", "again").await;
    assert!(
        matches!(
            gone,
            Err(Error::Store(samekey::store::StoreError::NotFound))
        ),
        "{gone:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_holding_an_entry_keeps_it_from_a_person() {
    let svc = Svc::new();
    let call_id = svc.unknown("o-21", Fault::LoseReply).await;
    let taken = svc
        .rt
        .store()
        .take_due_compensations(svc.rt.now_ms(), 10, 60_000)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    let worker = svc.worker();
    for refused in [
        worker.retry(&call_id, "alice", "now").await,
        worker.escalate(&call_id, "alice", "now").await,
    ] {
        assert!(
            matches!(refused, Err(Error::InProgress { .. })),
            "{refused:?}"
        );
    }
    tokio::time::advance(Duration::from_secs(61)).await;
    worker
        .retry(&call_id, "alice", "the worker is gone")
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_finished_call_is_forgotten_by_hand_and_runs_again_but_an_undecided_one_is_not() {
    let svc = Svc::new();
    assert_eq!(svc.charge("o-22", 500).await, Ok(500));
    assert_eq!(svc.charge("o-22", 500).await, Ok(500), "a replay");
    assert_eq!(svc.remote.effects("o-22"), 1);
    let mut key = samekey::key::KeyBuilder::new("orders.charge");
    key.part("o-22");
    let key = key.finish();

    let forgotten = svc
        .rt
        .forget(&key, "alice", "ticket 4711: customer redoes the order")
        .await
        .unwrap();
    assert_eq!(forgotten.state, samekey::ReceiptState::Success);
    assert_eq!(svc.charge("o-22", 500).await, Ok(500));
    assert_eq!(svc.remote.effects("o-22"), 2, "the new call ran");
    let history = svc.rt.history(&forgotten.call_id).await.unwrap();
    assert_eq!(
        history.events.last().map(|e| e.what.to_string()),
        Some(
            "forgotten by alice (ticket 4711: customer redoes the order): its SUCCESS outcome is gone, the key may be claimed again"
                .to_owned()
        )
    );

    let unknown = svc.unknown("o-23", Fault::LoseReply).await;
    let mut key = samekey::key::KeyBuilder::new("orders.charge");
    key.part("o-23");
    let refused = svc.rt.forget(&key.finish(), "alice", "redo").await;
    match refused {
        Err(e @ Error::NotFinished { .. }) => assert_eq!(
            e.to_string(),
            format!("call {unknown} is UNKNOWN, not finished: only a SUCCESS or FAILED call can be forgotten; its outcome is not known: resolve it first (Compensator::resolve, samekey compensation resolve)")
        ),
        other => panic!("{other:?}"),
    }
    let mut nothing = samekey::key::KeyBuilder::new("orders.charge");
    nothing.part("o-none");
    assert!(matches!(
        svc.rt.forget(&nothing.finish(), "alice", "redo").await,
        Err(Error::Store(samekey::store::StoreError::NotFound))
    ));
}

/// An owner that stalls (its process paused) before its request goes out, over a store that holds its
/// lease renewal at a gate.
struct Paused {
    rt: Runtime,
    remote: Remote,
    store: Arc<support::faulty::Faulty>,
}

impl Paused {
    fn new() -> Arc<Paused> {
        let store = Arc::new(support::faulty::Faulty::new(Arc::new(
            samekey::MemoryStore::new(),
        )));
        Arc::new(Paused {
            rt: Runtime::builder()
                .node("paused")
                .clock(TokioClock::new())
                .lease(Duration::from_secs(3))
                .shared_store(store.clone())
                .build()
                .unwrap(),
            remote: Remote::default(),
            store,
        })
    }

    /// Sends the charge 2 s in: its lease (3 s) is renewed every second while it runs.
    #[idempotent(key = "order", scope = "orders.charge", runtime = &self.rt)]
    async fn charge(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.remote.call(order, || amount).await
    }

    fn worker(&self, not_received: NotReceivedPolicy) -> Compensator {
        let remote = self.remote.clone();
        Compensator::new(&self.rt)
            .operation(
                "orders.charge",
                CompensationOperation::new(move |call: CallId| {
                    let remote = remote.clone();
                    async move { remote.status(&call).await }
                })
                .not_received(not_received),
            )
            .rounds([Duration::from_secs(1)])
    }

    /// The owner's charge, paused at its first lease renewal (1 s in, before its request goes out)
    /// until its lease has ended and a worker swept it up and heard "not received" — true then.
    /// Returns the owner's task and the gate that un-pauses it.
    async fn paused_owner_swept(
        self: &Arc<Self>,
        not_received: NotReceivedPolicy,
    ) -> (
        tokio::task::JoinHandle<Result<u64, TestError>>,
        support::faulty::Gate,
        samekey::compensation::PassReport,
    ) {
        let pause = support::faulty::Gate::new();
        self.store.plan(
            "extend_lease",
            [support::faulty::Act::Before(pause.clone())],
        );
        let owner = tokio::spawn({
            let svc = self.clone();
            async move { svc.charge("o-paused", 500).await }
        });
        pause.reached().await;
        tokio::time::advance(Duration::from_secs(4)).await;
        let worker = self.worker(not_received);
        assert_eq!(worker.sweep().await.unwrap(), 1, "an orphan");
        let pass = worker.run_once().await.unwrap();
        assert_eq!(self.remote.effects("o-paused"), 0, "nothing sent yet");
        (owner, pause, pass)
    }
}

/// Defect 5 of issue 24, the paused owner: the worker that hears "not received" holds the call (the
/// default). The owner wakes, its request charges, its completion is fenced out, and it answers what
/// it knows: the charge. The next round finds it and records it.
#[tokio::test(start_paused = true)]
async fn a_paused_owner_s_late_charge_is_answered_and_then_recorded() {
    let svc = Paused::new();
    let (owner, pause, pass) = svc.paused_owner_swept(NotReceivedPolicy::Hold).await;
    assert_eq!((pass.rescheduled, pass.failed), (1, 0), "{pass:?}");
    pause.open();
    assert_eq!(
        owner.await.unwrap(),
        Ok(500),
        "the owner answers its charge"
    );
    assert_eq!(svc.remote.effects("o-paused"), 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    let next = svc
        .worker(NotReceivedPolicy::Hold)
        .run_once()
        .await
        .unwrap();
    assert_eq!(next.succeeded, 1, "{next:?}");
    assert_eq!(svc.charge("o-paused", 500).await, Ok(500), "replayed");
    assert_eq!(svc.remote.effects("o-paused"), 1);
}

/// The same with `Fail` opted into for a remote that is said to refuse old callIds but does not: the
/// worker records `FAILED`, the late request charges anyway. The fenced-out owner never answers the
/// recorded failure it knows to be false: it answers the charge, and the journal says the two
/// disagree, for a person.
#[tokio::test(start_paused = true)]
async fn a_fenced_out_owner_never_answers_a_recorded_outcome_it_knows_is_false() {
    let svc = Paused::new();
    let fail = NotReceivedPolicy::Fail {
        refused_after: Duration::ZERO,
    };
    let (owner, pause, pass) = svc.paused_owner_swept(fail).await;
    assert_eq!(pass.failed, 1, "{pass:?}");
    pause.open();
    assert_eq!(owner.await.unwrap(), Ok(500), "told what happened");
    assert_eq!(svc.remote.effects("o-paused"), 1);
    let key = samekey::Key::build("orders.charge", &"o-paused");
    let history = svc.rt.history_of_key(&key).await.unwrap();
    assert!(
        history.events.iter().any(|e| matches!(
            e.what,
            samekey::journal::EventKind::Contradicted {
                recorded: samekey::ReceiptState::Failed,
                known: samekey::ReceiptState::Success,
            }
        )),
        "{:?}",
        history.events
    );
    let queued = svc.rt.compensations().await.unwrap();
    assert_eq!(queued.len(), 1, "queued for a person");
    // Issue 38, defect 4: the call queued the contradiction `MANUAL` itself, and the hook that pages a
    // person never ran. It is queued for the worker, which escalates it through the hook, once.
    let paged = Arc::new(std::sync::Mutex::new(Vec::new()));
    let worker = svc.worker(NotReceivedPolicy::Hold).on_escalate({
        let paged = paged.clone();
        move |entry| paged.lock().unwrap().push(entry.call_id.clone())
    });
    tokio::time::advance(Duration::from_secs(2)).await;
    let pass = worker.run_once().await.unwrap();
    assert_eq!((pass.escalated, pass.settled_elsewhere), (1, 0), "{pass:?}");
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(
        worker.settle().await.unwrap().taken,
        0,
        "MANUAL: never taken again"
    );
    assert_eq!(
        *paged.lock().unwrap(),
        vec![queued[0].call_id.clone()],
        "paged once"
    );
    let queued = svc.rt.compensations().await.unwrap();
    assert_eq!(queued.len(), 1, "kept for a person");
    assert_eq!(queued[0].state, CompensationState::Manual);

    // Defect 5: support follows "the customer must redo it" and forgets the FAILED call; the redo
    // would charge a second time. Forget is refused while the entry is open, and says why.
    match svc
        .rt
        .forget(&key, "bob", "ticket 12: the customer redoes the order")
        .await
    {
        Err(e @ samekey::Error::OpenCompensation { .. }) => {
            let said = e.to_string();
            assert!(said.contains("resolve it first"), "{said}");
            assert!(said.contains("took effect"), "{said}");
        }
        other => panic!("forget must wait for the person's resolution: {other:?}"),
    }
    assert_eq!(
        svc.charge("o-paused", 500).await.ok(),
        None,
        "still FAILED, never run again"
    );
    assert_eq!(svc.remote.effects("o-paused"), 1);

    // Defect 6: the person checked the provider — charged — and records the truth. Before, only a
    // resolution agreeing with the record was accepted (`AlreadySettled { FAILED }`), and every
    // duplicate kept being told "failed" for a charge that happened.
    let call_id = queued[0].call_id.clone();
    worker
        .resolve(
            &call_id,
            ManualResolution::Succeeded(serde_json::json!(500)),
            "alice",
            "the provider's dashboard shows the charge",
        )
        .await
        .expect("a contradiction is resolved toward what happened");
    assert!(svc.rt.compensations().await.unwrap().is_empty());
    assert_eq!(
        svc.charge("o-paused", 500).await,
        Ok(500),
        "duplicates are told the truth"
    );
    assert_eq!(svc.remote.effects("o-paused"), 1);
    let receipt = svc.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, samekey::ReceiptState::Success);
    let history = svc.rt.history_of_key(&key).await.unwrap();
    assert!(
        history.events.iter().any(|e| matches!(&e.what,
            samekey::journal::EventKind::Resolved { state: samekey::ReceiptState::Success, who, .. }
                if who == "alice")),
        "journaled with who and why: {:?}",
        history.events
    );
}

/// A person's resolution of a contradiction stops between its two writes: the record was reopened
/// (`PROCESSING` under a new fence, the lease of the resolver) and the resolver's process died before
/// it wrote the answer. The call took effect: a duplicate after that lease has ended must not run it
/// again (the record now says "running", its owner gone), nor answer a failure; the entry stays open
/// for the person, whose second try settles it.
#[tokio::test(start_paused = true)]
async fn a_resolution_that_stops_after_reopening_never_lets_the_call_run_again() {
    let svc = Paused::new();
    let fail = NotReceivedPolicy::Fail {
        refused_after: Duration::ZERO,
    };
    let (owner, pause, _) = svc.paused_owner_swept(fail).await;
    pause.open();
    assert_eq!(owner.await.unwrap(), Ok(500));
    let worker = svc.worker(NotReceivedPolicy::Hold);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(worker.run_once().await.unwrap().escalated, 1);
    let key = samekey::Key::build("orders.charge", &"o-paused");
    let queued = svc.rt.compensations().await.unwrap();
    let call_id = queued[0].call_id.clone();
    let recorded = svc.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(recorded.state, samekey::ReceiptState::Failed);

    // The resolver's first write, then nothing: its process is gone.
    let now = svc.rt.now_ms();
    let reopened = svc
        .rt
        .store()
        .reopen(&key, recorded.fence, 30_000, now)
        .await
        .unwrap();
    assert!(
        matches!(reopened, samekey::store::Claimed::Acquired(_)),
        "{reopened:?}"
    );
    tokio::time::advance(Duration::from_secs(120)).await;

    // A duplicate long after the resolver's lease ended.
    let duplicate = svc.charge("o-paused", 500).await;
    // Taken over as an uncertain call (its lookup-less function cannot ask): unknown, never a
    // failure, never a second charge.
    assert!(
        matches!(
            duplicate,
            Err(TestError::Samekey(samekey::Error::Unknown { .. }))
        ),
        "{duplicate:?}"
    );
    assert_eq!(svc.remote.effects("o-paused"), 1, "never run again");
    assert_eq!(
        svc.rt.compensations().await.unwrap().len(),
        1,
        "still open for the person"
    );

    // The person tries again, and it settles.
    worker
        .resolve(
            &call_id,
            ManualResolution::Succeeded(serde_json::json!(500)),
            "alice",
            "second try: the provider shows the charge",
        )
        .await
        .expect("the person's second try settles it");
    assert_eq!(svc.charge("o-paused", 500).await, Ok(500));
    assert_eq!(svc.remote.effects("o-paused"), 1);
    assert!(svc.rt.compensations().await.unwrap().is_empty());
}

/// Issue 38, defect 4, found by the simulation (seed 30): the worker escalates an entry and the
/// store's answer is lost although the write applied. The entry is `MANUAL` — no worker takes it
/// again — and the hook that pages a person never ran. It runs when the answer is lost, too.
#[tokio::test(start_paused = true)]
async fn an_escalation_whose_answer_was_lost_still_pages_a_person() {
    let svc = Paused::new();
    svc.remote.script([Fault::LoseRequest]);
    assert!(svc.charge("o-lost", 500).await.is_err());
    let (paged, hook) = pager();
    let worker = svc.worker(NotReceivedPolicy::Hold).on_escalate(hook);
    assert_eq!(worker.run_once().await.unwrap().rescheduled, 1);
    svc.store.plan(
        "escalate_compensation",
        [support::faulty::Act::Lose(
            samekey::store::StoreError::Unavailable("connection reset".to_owned()),
        )],
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(worker.run_once().await.unwrap().escalated, 1);
    assert_eq!(
        paged.load(Ordering::SeqCst),
        1,
        "paged, though the answer was lost"
    );
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(worker.settle().await.unwrap().taken, 0);
    assert_eq!(paged.load(Ordering::SeqCst), 1, "once");
    let queued = svc.rt.compensations().await.unwrap();
    assert_eq!(queued[0].state, CompensationState::Manual);
    assert_eq!(svc.remote.effects("o-lost"), 0);
}

/// Issue 38's suspicion, confirmed: a callback that contradicts a recorded outcome was journaled and
/// refused, but nothing reached a person — unlike the owner's own contradiction. The charge was
/// declined and recorded `FAILED`; the provider later calls back "charged". The first such callback
/// queues the call, the worker marks it `MANUAL` through the hook, and repeats page no one again.
#[tokio::test(start_paused = true)]
async fn a_callback_that_contradicts_the_record_reaches_a_person_once() {
    let svc = Svc::new();
    svc.remote.script([Fault::Reject]);
    assert!(svc.charge("o-cb", 500).await.is_err());
    let call_id: CallId = svc.remote.call_ids()[0].parse().unwrap();
    let recorded = svc.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(recorded.state, samekey::ReceiptState::Failed);
    let (paged, hook) = pager();
    let worker = svc.worker().on_escalate(hook);
    for _ in 0..3 {
        refused_charged_callback(&svc.rt, &call_id).await;
        let pass = worker.run_once().await.unwrap();
        assert_eq!(pass.settled_elsewhere, 0, "{pass:?}");
    }
    assert_eq!(paged.load(Ordering::SeqCst), 1, "paged once");
    let queued = svc.queued().await;
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].state, CompensationState::Manual);
    let refusals = svc
        .rt
        .history(&call_id)
        .await
        .unwrap()
        .events
        .iter()
        .filter(|e| matches!(e.what, samekey::journal::EventKind::CallbackRefused { .. }))
        .count();
    assert_eq!(refusals, 1, "repeats are not journaled");
}

/// Issue 38's suspicion, confirmed: the worker awaited an entry's lookup with no time limit and without
/// keeping the call's key: a lookup slower than the worker's lease let a duplicate take the call over,
/// hear "not received" and charge while the worker still waited — and a lookup that never answered held
/// up the whole pass. The key is kept while the lookup runs, and a stuck lookup ends the round.
#[tokio::test(start_paused = true)]
async fn a_slow_lookup_keeps_the_key_and_a_stuck_one_ends_the_round() {
    let svc = Arc::new(Svc::new());
    let _ = svc.unknown("o-slow", Fault::LoseRequest).await;
    let stuck = Arc::new(tokio::sync::Notify::new());
    let worker = Compensator::new(&svc.rt)
        .operation(
            "orders.charge",
            CompensationOperation::new({
                let (remote, stuck) = (svc.remote.clone(), stuck.clone());
                move |call: CallId| {
                    let (remote, stuck) = (remote.clone(), stuck.clone());
                    async move {
                        stuck.notified().await;
                        remote.status(&call).await
                    }
                }
            }),
        )
        .lease(Duration::from_secs(3))
        .lookup_timeout(Duration::from_secs(20))
        .rounds([Duration::from_secs(1)]);
    let pass = tokio::spawn(async move { worker.run_once().await });
    // Four leases into the lookup, a duplicate that may ask comes: the key is still the worker's, so
    // it waits.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let duplicate = tokio::spawn({
        let svc = svc.clone();
        async move { svc.charge_checked("o-slow", 500).await }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        svc.remote.effects("o-slow"),
        0,
        "nothing sent beside the lookup"
    );
    // The lookup never answers: the round ends at its limit, and the entry waits for the next.
    let pass = pass.await.unwrap().unwrap();
    assert_eq!((pass.rescheduled, pass.succeeded), (1, 0), "{pass:?}");
    // Then the duplicate takes the call over, asks, hears "not received" (the first request was
    // lost) and sends it: one charge.
    assert_eq!(duplicate.await.unwrap(), Ok(500));
    assert_eq!(svc.remote.effects("o-slow"), 1);
    let history = svc
        .rt
        .history_of_key(&samekey::Key::build("orders.charge", &"o-slow"))
        .await
        .unwrap();
    assert!(
        history.events.iter().any(|e| matches!(&e.what,
            samekey::journal::EventKind::Lookup { error: Some(error), .. }
                if error.contains("did not answer within 20s"))),
        "{:?}",
        history.events
    );
}

/// Found by the skeptical reader: a contradiction reported while the worker settles the call is lost.
/// The worker hears "failed" and records `FAILED`; as it removes the entry, the provider calls back
/// "charged" — refused, journaled, and queued onto the entry still there (a no-op); the worker's
/// removal then deleted it, and no one was paged. Whoever removes a settled call's entry looks at
/// the journal after, and queues a reported contradiction again.
#[tokio::test(start_paused = true)]
async fn a_contradiction_reported_while_the_worker_settles_still_reaches_a_person() {
    let svc = Paused::new();
    svc.remote.script([Fault::LoseRequest]);
    assert!(svc.charge("o-settling", 500).await.is_err());
    let call_id = svc.rt.compensations().await.unwrap()[0].call_id.clone();
    let (paged, hook) = pager();
    let worker = Compensator::new(&svc.rt)
        .operation(
            "orders.charge",
            CompensationOperation::new(|_call: CallId| async {
                Ok::<_, String>(samekey::RemoteStatus::<u64, String>::Failed(
                    "card declined".to_owned(),
                ))
            }),
        )
        .on_escalate(hook);
    let removing = support::faulty::Gate::new();
    svc.store.plan(
        "finish_compensation",
        [support::faulty::Act::Before(removing.clone())],
    );
    let pass = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_once().await }
    });
    removing.reached().await;
    refused_charged_callback(&svc.rt, &call_id).await;
    removing.open();
    assert_eq!(pass.await.unwrap().unwrap().failed, 1);
    let queued = svc.rt.compensations().await.unwrap();
    assert_eq!(queued.len(), 1, "queued again for a person");
    assert_eq!(worker.run_once().await.unwrap().escalated, 1);
    assert_eq!(paged.load(Ordering::SeqCst), 1);
}

/// Found by the skeptical reader: a refused callback is journaled first and queued second; when the
/// queueing failed, every repeat found the journaled refusal and queued nothing. A repeat queues it
/// again (a no-op while it is queued), until a person resolved it.
#[tokio::test(start_paused = true)]
async fn a_contradiction_whose_queueing_failed_is_queued_on_the_repeat() {
    let svc = Paused::new();
    svc.remote.script([Fault::Reject]);
    assert!(svc.charge("o-repeat", 500).await.is_err());
    let call_id: CallId = svc.remote.call_ids()[0].parse().unwrap();
    svc.store.plan(
        "enqueue_compensation",
        [support::faulty::Act::Fail(
            samekey::store::StoreError::Unavailable("connection reset".to_owned()),
        )],
    );
    for delivery in 0..3 {
        refused_charged_callback(&svc.rt, &call_id).await;
        let queued = svc.rt.compensations().await.unwrap().len();
        assert_eq!(queued, usize::from(delivery > 0), "delivery {delivery}");
    }
    let worker = svc.worker(NotReceivedPolicy::Hold);
    assert_eq!(worker.run_once().await.unwrap().escalated, 1);
    worker
        .resolve(
            &call_id,
            ManualResolution::Failed("the provider confirms the decline".to_owned()),
            "bob",
            "their callback was sent in error",
        )
        .await
        .unwrap();
    refused_charged_callback(&svc.rt, &call_id).await;
    assert!(
        svc.rt.compensations().await.unwrap().is_empty(),
        "resolved by a person: the provider's repeats page no one again"
    );
}

/// A reversal that waits for `release` before it ends, counting its runs.
fn slow_reversal(
    svc: &Svc,
    runs: Arc<AtomicU32>,
    release: Arc<tokio::sync::Notify>,
) -> CompensationOperation {
    svc.operation().reversal(move |_entry| {
        let (runs, release) = (runs.clone(), release.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            release.notified().await;
            Ok::<(), samekey::Error>(())
        }
    })
}

/// Defect 6 of issue 24: a reversal slower than the worker's lease left the key open; a duplicate took
/// it over, heard "not received" and charged, while the order was being reversed. The lease is kept
/// alive for as long as the reversal runs: the duplicate never sends.
#[tokio::test(start_paused = true)]
async fn a_reversal_slower_than_the_lease_keeps_the_key_from_a_duplicate() {
    let svc = Arc::new(Svc::new());
    svc.remote.script([Fault::LoseRequest]);
    let _ = svc.charge_keeping_inputs("o-14", 700).await;
    let (runs, release) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(tokio::sync::Notify::new()),
    );
    let worker = Compensator::new(&svc.rt)
        .operation(
            "orders.charge",
            slow_reversal(&svc, runs.clone(), release.clone()),
        )
        .lease(Duration::from_secs(10));
    let reversing = tokio::spawn(async move { worker.run_once().await });
    support::until_started(&runs).await;
    // Three leases into the reversal, a duplicate that may ask comes.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let duplicate = tokio::spawn({
        let svc = svc.clone();
        async move { svc.charge_checked("o-14", 700).await }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    release.notify_one();
    assert_eq!(reversing.await.unwrap().unwrap().reversed, 1);
    match duplicate.await.unwrap() {
        Err(TestError::Samekey(Error::Failed { message, .. })) => {
            assert!(message.contains("reversed"), "{message}")
        }
        other => panic!("the duplicate replays the reversal: {other:?}"),
    }
    assert_eq!(svc.remote.effects("o-14"), 0, "never charged");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Defect 6, without any timing: a worker dies mid-reversal, its intent left in the journal. A
/// duplicate that takes the lapsed key over used to hear "not received" and charge; it now finds the
/// intent and leaves the call to the worker, which asks a person. A callback about the call meanwhile
/// is not applied either.
#[tokio::test(start_paused = true)]
async fn every_take_over_respects_a_reversal_an_earlier_worker_began() {
    let svc = Svc::new();
    svc.remote.script([Fault::LoseRequest]);
    let _ = svc.charge_keeping_inputs("o-15", 700).await;
    let call_id = svc.queued().await[0].call_id.clone();
    let runs = Arc::new(AtomicU32::new(0));
    died_mid_reversal(&svc, &runs).await;
    match svc.charge_checked("o-15", 700).await {
        Err(TestError::Samekey(Error::Unknown { call_id: unknown })) => {
            assert_eq!(unknown, call_id)
        }
        other => panic!("the duplicate must not act: {other:?}"),
    }
    assert_eq!(svc.remote.effects("o-15"), 0, "never charged");
    let callback = samekey::callback::Callback::succeeded(&700u64).unwrap();
    assert!(matches!(
        svc.rt.apply_callback(&call_id, callback).await,
        Err(Error::Unknown { .. })
    ));
    let receipt = svc.rt.receipt(&call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, samekey::ReceiptState::Unknown);
    tokio::time::advance(Duration::from_secs(60)).await;
    let pass = svc.worker().run_once().await.unwrap();
    assert_eq!(pass.escalated, 1, "{pass:?}");
    assert_eq!(svc.queued().await[0].state, CompensationState::Manual);
}

/// A duplicate takes an `UNKNOWN` call over and is dropped while the take-over reads the journal (for
/// a reversal begun): the key is left under a fence nobody holds, for one lease, never released; the
/// worker then settles the call by its lookup, and the charge happened once.
#[tokio::test(start_paused = true)]
async fn a_duplicate_dropped_while_its_take_over_reads_the_journal_releases_nothing() {
    let svc = Paused::new();
    svc.remote.script([Fault::LoseReply]);
    assert!(matches!(
        svc.charge("o-16", 500).await,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));
    assert_eq!(svc.remote.effects("o-16"), 1);
    let reading = support::faulty::Gate::new();
    svc.store
        .plan("journal", [support::faulty::Act::Before(reading.clone())]);
    let duplicate = tokio::spawn({
        let svc = svc.clone();
        async move { svc.charge("o-16", 500).await }
    });
    reading.reached().await;
    duplicate.abort();
    assert!(duplicate.await.unwrap_err().is_cancelled());
    reading.open();
    let key = samekey::Key::build("orders.charge", &"o-16");
    let held = svc.rt.store().get(&key, svc.rt.now_ms()).await.unwrap();
    assert!(held.is_some(), "never released");
    tokio::time::advance(Duration::from_secs(4)).await;
    let pass = svc
        .worker(NotReceivedPolicy::Hold)
        .run_once()
        .await
        .unwrap();
    assert_eq!(pass.succeeded, 1, "{pass:?}");
    assert_eq!(svc.charge("o-16", 500).await, Ok(500), "replayed");
    assert_eq!(svc.remote.effects("o-16"), 1, "charged once");
}

/// A lookup that answers a value JSON cannot carry: the worker wrote `Some(NaN)` as `null`, and every
/// duplicate was answered `Ok(None)` for a reading the remote side says was `Some(NaN)`. The call is
/// recorded `SUCCESS` without an outcome: duplicates are told it took effect (`NotReplayable`), and it
/// never runs again.
#[tokio::test(start_paused = true)]
async fn a_lookup_value_json_cannot_carry_is_never_replayed_as_another() {
    struct Gauges {
        rt: Runtime,
        runs: AtomicU32,
    }
    impl Gauges {
        #[idempotent(key = "id", scope = "gauges.read", runtime = &self.rt, on_unknown = "hold")]
        async fn read(&self, id: u64) -> Result<Option<f64>, TestError> {
            if self.runs.fetch_add(1, Ordering::SeqCst) == 0 {
                // The reading was taken; its reply is lost.
                return Err(TestError::Samekey(Error::Unknown {
                    call_id: samekey::current().call_id().clone(),
                }));
            }
            Ok(Some(id as f64))
        }
    }
    let gauges = Gauges {
        rt: Runtime::builder()
            .node("test")
            .clock(TokioClock::new())
            .build()
            .unwrap(),
        runs: AtomicU32::new(0),
    };
    assert!(matches!(
        gauges.read(1).await,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));
    let nan = CompensationOperation::new(|_call: CallId| async {
        Ok::<_, String>(RemoteStatus::<Option<f64>, String>::Succeeded(Some(
            f64::NAN,
        )))
    });
    let pass = Compensator::new(&gauges.rt)
        .operation("gauges.read", nan)
        .run_once()
        .await
        .unwrap();
    assert_eq!(
        (pass.taken, pass.succeeded),
        (1, 1),
        "recorded, not retried forever"
    );
    match gauges.read(1).await {
        Err(TestError::Samekey(Error::NotReplayable { .. })) => {}
        other => panic!("a duplicate is told the call took effect, never Ok(None): {other:?}"),
    }
    assert_eq!(gauges.runs.load(Ordering::SeqCst), 1, "it never ran again");
}
