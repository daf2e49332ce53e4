//! The journal through `#[idempotent]` calls, the compensation worker, callbacks and a person's
//! resolution, with paused tokio time: every path leaves the timeline an operator reads, and the happy
//! path leaves none.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use samekey::journal::{AttemptOutcome, CompensationStep, LookupOutcome};
use samekey::Store;
use samekey::{
    callback::Callback, compensation::CompensationOperation, compensation::ManualResolution,
    idempotent, journal::EventKind, observe::observed, CallId, Compensator, MemoryStore,
    ReceiptState, Runtime,
};
use support::faulty::{Act, Faulty, Gate};
use support::{Fault, Remote, TestError};

struct Payments {
    rt: Runtime,
    remote: Remote,
}

impl Payments {
    fn new() -> Payments {
        Payments::on(Arc::new(MemoryStore::new()))
    }

    fn on(store: Arc<dyn samekey::Store>) -> Payments {
        let rt = Runtime::builder()
            .clock(samekey::clock::TokioClock::new())
            .node("api-1")
            .shared_store(store)
            .build()
            .unwrap();
        Payments {
            rt,
            remote: Remote::default(),
        }
    }

    #[idempotent(key = "order", scope = "pay", runtime = &self.rt, backoff = "100ms..1s", retries = 2)]
    async fn plain(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", scope = "pay", runtime = &self.rt, timeout = "1s",
                 lookup = |c| self.remote.status(c))]
    async fn with_lookup(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", scope = "pay", runtime = &self.rt, timeout = "1s", on_unknown = "rerun",
                 backoff = "100ms..1s", retries = 2)]
    async fn rerun(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", scope = "pay", runtime = &self.rt, timeout = "1s", on_unknown = "hold")]
    async fn hold(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }
}

/// The `EventKind` of each event, in order.
fn whats(events: &[samekey::journal::Event]) -> Vec<EventKind> {
    events.iter().map(|e| e.what.clone()).collect()
}

async fn call_id_of<F: std::future::Future>(fut: F) -> (F::Output, CallId) {
    let (out, report) = observed(fut).await;
    (out, report.expect("a report").call_id().clone())
}

#[tokio::test(start_paused = true)]
async fn the_happy_path_journals_nothing_and_its_timeline_comes_from_the_receipt() {
    let p = Payments::new();
    let (out, call_id) = call_id_of(p.plain("o-1", 5)).await;
    assert_eq!(out, Ok(5));
    let history = p.rt.history(&call_id).await.unwrap();
    assert!(history.events.is_empty(), "{:?}", history.events);
    let timeline = history.timeline();
    assert!(matches!(timeline[0].what, EventKind::Claimed { .. }));
    assert_eq!(
        timeline[1].what,
        EventKind::Recorded {
            state: ReceiptState::Success,
            by: "call".into()
        }
    );
    assert_eq!(timeline[0].node, "api-1");
}

#[tokio::test(start_paused = true)]
async fn a_retried_call_journals_each_attempt_its_class_and_backoff() {
    let p = Payments::new();
    p.remote.script([Fault::Unavailable]);
    let (out, call_id) = call_id_of(p.plain("o-1", 5)).await;
    assert_eq!(out, Ok(5));
    let events = p.rt.history(&call_id).await.unwrap().events;
    let whats = whats(&events);
    assert!(matches!(whats[0], EventKind::Claimed { .. }), "{whats:?}");
    match &whats[1] {
        EventKind::Attempt {
            attempt: 1,
            outcome: AttemptOutcome::Retryable,
            error: Some(error),
            ..
        } => assert!(error.contains("Refused"), "{error}"),
        other => panic!("the first attempt, retryable: {other:?}"),
    }
    assert!(
        matches!(whats[2], EventKind::Backoff { attempt: 1, delay_ms } if delay_ms > 0),
        "{whats:?}"
    );
    assert!(
        matches!(
            whats[3],
            EventKind::Attempt {
                attempt: 2,
                outcome: AttemptOutcome::Ok,
                ..
            }
        ),
        "{whats:?}"
    );
    assert_eq!(
        whats[4],
        EventKind::Recorded {
            state: ReceiptState::Success,
            by: "call".into()
        }
    );
    assert_eq!(whats.len(), 5);
    assert!(events
        .iter()
        .all(|e| e.call_id == call_id && e.node == "api-1"));
    // The timeline adds nothing the journal already has.
    assert_eq!(p.rt.history(&call_id).await.unwrap().timeline(), events);
}

#[tokio::test(start_paused = true)]
async fn the_retry_path_costs_one_journal_write_per_backoff_and_one_with_the_outcome() {
    let store = Arc::new(Faulty::new(Arc::new(MemoryStore::new())));
    let p = Payments::on(store.clone());
    p.remote.script([Fault::Unavailable, Fault::Unavailable]);
    assert_eq!(p.plain("o-1", 5).await, Ok(5));
    let ops = store.take_ops();
    let journal_writes = ops.iter().filter(|op| **op == "append_journal").count();
    assert_eq!(journal_writes, 3, "{ops:?}");
}

#[tokio::test(start_paused = true)]
async fn a_timeout_journals_the_lookup_and_its_answer() {
    let p = Payments::new();
    p.remote.script([Fault::LoseReply]);
    let (out, call_id) = call_id_of(p.with_lookup("o-1", 5)).await;
    assert_eq!(out, Ok(5));
    let whats = whats(&p.rt.history(&call_id).await.unwrap().events);
    assert!(
        whats.contains(&EventKind::Lookup {
            answer: LookupOutcome::Succeeded,
            error: None
        }),
        "{whats:?}"
    );
    assert!(matches!(
        whats[1],
        EventKind::Attempt {
            outcome: AttemptOutcome::Unknown,
            ..
        }
    ));
}

#[tokio::test(start_paused = true)]
async fn a_call_given_back_is_read_by_its_callid_with_why() {
    let p = Payments::new();
    p.remote
        .script([Fault::Unavailable, Fault::Unavailable, Fault::Unavailable]);
    let (out, call_id) = call_id_of(p.plain("o-1", 5)).await;
    assert_eq!(out, Err(TestError::Refused));
    let history = p.rt.history(&call_id).await.unwrap();
    assert_eq!(history.receipt, None, "the claim was given back");
    assert_eq!(
        history.events.last().map(|e| e.what.clone()),
        Some(EventKind::Released {
            reason: "retries exhausted; nothing ran".into(),
            by: "call".into()
        })
    );
    let attempts = history
        .events
        .iter()
        .filter(|e| matches!(e.what, EventKind::Attempt { .. }))
        .count();
    assert_eq!(attempts, 3);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_then_the_worker_resolving_it_reads_as_one_timeline() {
    let p = Payments::new();
    p.remote.script([Fault::LoseReply]);
    let (out, call_id) = call_id_of(p.hold("o-1", 5)).await;
    assert!(matches!(
        out,
        Err(TestError::Samekey(samekey::Error::Unknown { .. }))
    ));
    let remote = p.remote.clone();
    let worker = Compensator::new(&p.rt).operation(
        "pay",
        CompensationOperation::new(move |call: CallId| {
            let remote = remote.clone();
            async move { remote.status(&call).await }
        }),
    );
    let pass = worker.run_once().await.unwrap();
    assert_eq!(pass.succeeded, 1);
    let events = p.rt.history(&call_id).await.unwrap().events;
    let whats = whats(&events);
    let unknown = whats
        .iter()
        .position(|w| matches!(w, EventKind::Unknown { .. }))
        .expect("the unknown");
    assert_eq!(
        whats[unknown + 1..],
        [
            EventKind::Compensation {
                round: 0,
                step: CompensationStep::Taken,
                detail: String::new()
            },
            EventKind::Lookup {
                answer: LookupOutcome::Succeeded,
                error: None
            },
            EventKind::Recorded {
                state: ReceiptState::Success,
                by: "compensation".into()
            },
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_take_over_a_cancellation_a_callback_and_a_person_are_journaled() {
    let p = Payments::new();
    // Cancelled mid-attempt: the drop guard leaves the call UNKNOWN and says so.
    p.remote.script([Fault::Hang]);
    let cancelled = tokio::time::timeout(Duration::from_millis(100), p.hold("o-1", 5)).await;
    assert!(cancelled.is_err());
    tokio::time::sleep(Duration::from_millis(10)).await;
    let queued = p.rt.compensations().await.unwrap();
    let history = p.rt.history_of_key(&queued[0].key).await.unwrap();
    let call_id = history.receipt.as_ref().expect("a receipt").call_id.clone();
    assert_eq!(
        history.receipt.as_ref().map(|r| r.state),
        Some(ReceiptState::Unknown)
    );
    assert_eq!(
        history.events.last().map(|e| e.what.clone()),
        Some(EventKind::Cancelled {
            left: "marked unknown".into()
        })
    );
    // A duplicate takes it over (and, without a lookup, leaves it UNKNOWN again).
    let _ = p.hold("o-1", 5).await;
    let taken = whats(&p.rt.history(&call_id).await.unwrap().events);
    assert!(
        taken.iter().any(|w| matches!(
            w,
            EventKind::TookOver {
                from: ReceiptState::Unknown,
                ..
            }
        )),
        "{taken:?}"
    );
    // A person resolves it; then the provider's callback arrives twice.
    Compensator::new(&p.rt)
        .resolve(
            &call_id,
            ManualResolution::Succeeded(serde_json::json!(5)),
            "ana",
            "provider's dashboard shows it charged",
        )
        .await
        .unwrap();
    for _ in 0..2 {
        p.rt.apply_callback(&call_id, Callback::succeeded(&5u64).unwrap())
            .await
            .unwrap();
    }
    let whats = whats(&p.rt.history(&call_id).await.unwrap().events);
    let tail = &whats[whats.len() - 3..];
    assert_eq!(
        tail,
        [
            EventKind::Resolved {
                state: ReceiptState::Success,
                who: "ana".into(),
                why: "provider's dashboard shows it charged".into()
            },
            EventKind::Callback {
                state: ReceiptState::Success,
                applied: false
            },
            EventKind::Callback {
                state: ReceiptState::Success,
                applied: false
            },
        ]
    );
}

/// The journal's writes are places the caller can vanish and the owner can stall: the write before a
/// backoff (after an attempt that may have run) holds the call until the test lets it go.
#[tokio::test(start_paused = true)]
async fn a_caller_gone_during_a_journal_write_leaves_the_call_unknown_not_released() {
    let store = Arc::new(Faulty::new(Arc::new(MemoryStore::new())));
    let p = Payments::on(store.clone());
    let gate = Gate::new();
    store.plan("append_journal", [Act::Before(gate.clone())]);
    // The reply is lost after the charge: the attempt may have run; the backoff's journal write stalls.
    p.remote.script([Fault::LoseReply]);
    let call = tokio::spawn(async move {
        let _ = p.rerun("o-1", 5).await;
    });
    gate.reached().await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_millis(10)).await;
    gate.open();
    let queued = store.list_compensations().await.unwrap();
    assert_eq!(queued.len(), 1, "queued for compensation, not given back");
    let receipt = store.get(&queued[0].key, u64::MAX / 2).await.unwrap();
    assert_eq!(receipt.map(|r| r.state), Some(ReceiptState::Unknown));
}

/// An owner that stalls in that write past its lease is fenced out when it comes back: the duplicate
/// that took the call over records the outcome, and the stalled owner answers that outcome.
#[tokio::test(start_paused = true)]
async fn an_owner_stalled_in_a_journal_write_is_fenced_out_and_answers_the_outcome() {
    let store = Arc::new(Faulty::new(Arc::new(MemoryStore::new())));
    // The remote dedups by callId, as `on_unknown = "rerun"` requires.
    let mut payments = Payments::on(store.clone());
    payments.remote = Remote::default().deduplicating();
    let p = Arc::new(payments);
    let remote = p.remote.clone();
    let gate = Gate::new();
    store.plan("append_journal", [Act::Before(gate.clone())]);
    remote.script([Fault::LoseReply]);
    let stalled = tokio::spawn({
        let p = p.clone();
        async move { p.rerun("o-1", 5).await }
    });
    gate.reached().await;
    // Past the stalled owner's lease (2 × its 1 s timeout), a duplicate takes the call over, re-runs
    // it under the same callId (the remote dedups it) and records it.
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(p.rerun("o-1", 5).await, Ok(5));
    gate.open();
    assert_eq!(stalled.await.unwrap(), Ok(5), "the recorded outcome");
    assert_eq!(remote.effects("o-1"), 1);
}
