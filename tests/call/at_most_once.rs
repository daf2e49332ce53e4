//! The public at-most-once core without the attribute (`AtMostOnce`): the same decisions as
//! `#[idempotent]`, driven by a closure — replay, `verify`, an uncertain outcome asked about or left
//! to compensation, failures stored by message or exactly, inputs kept for the worker, a bad prefix
//! refused before anything runs. In-memory, paused time.

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use samekey::at_most_once::{AtMostOnce, OnUnknown};
use samekey::{clock::TokioClock, CallId, Error, ReceiptState, Runtime};
use support::{Fault, Remote, TestError};

static CHARGE: AtMostOnce = AtMostOnce::new("core.charge")
    .prefix("chg")
    .retries(2)
    .backoff(Duration::from_millis(10), Duration::from_millis(100));

static CHARGE_WITHIN: AtMostOnce = AtMostOnce::new("core.charge_within")
    .prefix("chg")
    .timeout(Duration::from_secs(1));

static CHARGE_RERUN: AtMostOnce = AtMostOnce::new("core.charge_rerun")
    .prefix("chg")
    .timeout(Duration::from_secs(1))
    .on_unknown(OnUnknown::Rerun);

fn runtime() -> Runtime {
    Runtime::builder()
        .node("core")
        .clock(TokioClock::new())
        .build()
        .unwrap()
}

/// Charges `amount` for `order` through `remote`, under `op`.
async fn charge(
    op: &'static AtMostOnce,
    rt: &Runtime,
    remote: &Remote,
    order: &str,
    amount: u64,
) -> Result<u64, TestError> {
    op.key(order)
        .verify(&amount)
        .runtime(rt)
        .run(|| remote.call(order, || amount))
        .await
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_replays_the_first_outcome_and_another_amount_is_key_reuse() {
    let (rt, remote) = (runtime(), Remote::default());
    assert_eq!(charge(&CHARGE, &rt, &remote, "o-1", 500).await, Ok(500));
    assert_eq!(charge(&CHARGE, &rt, &remote, "o-1", 500).await, Ok(500));
    assert_eq!(remote.effects("o-1"), 1, "the body ran once");
    assert!(matches!(
        charge(&CHARGE, &rt, &remote, "o-1", 900).await,
        Err(TestError::Samekey(Error::KeyReuse { .. }))
    ));
    assert_eq!(remote.effects("o-1"), 1);
}

#[tokio::test(start_paused = true)]
async fn every_attempt_carries_the_same_call_id() {
    let (rt, remote) = (runtime(), Remote::default());
    remote.script([Fault::Unavailable, Fault::Unavailable]);
    assert_eq!(charge(&CHARGE, &rt, &remote, "o-2", 500).await, Ok(500));
    let ids = remote.call_ids();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.iter().all(|id| id == &ids[0]), "{ids:?}");
    assert!(
        ids[0].starts_with("chg-"),
        "the operation's prefix: {}",
        ids[0]
    );
}

#[tokio::test(start_paused = true)]
async fn an_uncertain_outcome_is_left_to_compensation_without_a_lookup() {
    let (rt, remote) = (runtime(), Remote::default());
    remote.script([Fault::LoseReply]);
    let out = charge(&CHARGE_WITHIN, &rt, &remote, "o-3", 500).await;
    assert!(
        matches!(out, Err(TestError::Samekey(Error::Unknown { .. }))),
        "{out:?}"
    );
    // Never released: a duplicate does not charge again.
    let again = charge(&CHARGE_WITHIN, &rt, &remote, "o-3", 500).await;
    assert!(matches!(
        again,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));
    assert_eq!(remote.effects("o-3"), 1);
    assert_eq!(rt.compensations().await.unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_uncertain_outcome_is_asked_about_by_its_call_id() {
    let (rt, remote) = (runtime(), Remote::default());
    remote.script([Fault::LoseReply]);
    let asked = AtomicU32::new(0);
    let out = CHARGE_WITHIN
        .key("o-4")
        .runtime(&rt)
        .run_asking(
            || remote.call("o-4", || 500),
            |call: CallId| {
                asked.fetch_add(1, Ordering::SeqCst);
                let remote = remote.clone();
                async move { remote.status(&call).await }
            },
        )
        .await;
    assert_eq!(out, Ok(500), "the lookup found the charge");
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(remote.effects("o-4"), 1, "nothing sent twice");
    assert!(rt.compensations().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn rerun_sends_again_under_the_same_call_id() {
    let (rt, remote) = (runtime(), Remote::default().deduplicating());
    remote.script([Fault::LoseReply]);
    assert_eq!(
        charge(&CHARGE_RERUN, &rt, &remote, "o-5", 500).await,
        Ok(500)
    );
    let ids = remote.call_ids();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], ids[1]);
    assert_eq!(remote.effects("o-5"), 1, "the remote deduplicated");
}

#[tokio::test(start_paused = true)]
async fn failures_are_replayed_by_message_or_exactly() {
    let rt = runtime();
    static REFUSE: AtMostOnce = AtMostOnce::new("core.refuse").prefix("ref");
    let runs = AtomicU32::new(0);
    let refuse = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<u64, _>(TestError::Rejected)
    };
    let first = REFUSE.key("by-message").runtime(&rt).run(refuse).await;
    assert_eq!(first, Err(TestError::Rejected));
    match REFUSE.key("by-message").runtime(&rt).run(refuse).await {
        Err(TestError::Samekey(Error::Failed { message, .. })) => {
            assert_eq!(message, "rejected for good")
        }
        other => panic!("replayed by its message: {other:?}"),
    }
    let exact = || REFUSE.key("exact").runtime(&rt).exact_errors().run(refuse);
    assert_eq!(exact().await, Err(TestError::Rejected));
    assert_eq!(
        exact().await,
        Err(TestError::Rejected),
        "replayed as itself"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each key ran once");
}

#[tokio::test(start_paused = true)]
async fn inputs_go_to_the_compensation_entry() {
    let (rt, remote) = (runtime(), Remote::default());
    remote.script([Fault::LoseReply]);
    let out = CHARGE_WITHIN
        .key("o-6")
        .inputs(&("o-6", 700u64))
        .runtime(&rt)
        .run(|| remote.call("o-6", || 700))
        .await;
    assert!(matches!(
        out,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));
    let entry = rt.compensations().await.unwrap().remove(0);
    let inputs: (String, u64) = entry.inputs().expect("kept").expect("decodes");
    assert_eq!(inputs, ("o-6".to_owned(), 700));
    let receipt = rt.receipt(&entry.call_id).await.unwrap().unwrap();
    assert_eq!(receipt.state, ReceiptState::Unknown);
}

#[tokio::test(start_paused = true)]
async fn a_bad_prefix_is_refused_before_anything_runs() {
    static BAD: AtMostOnce = AtMostOnce::new("core.bad").prefix("no-dashes");
    assert!(BAD.check().is_err());
    let runs = AtomicU32::new(0);
    let out = BAD
        .key("o-7")
        .runtime(&runtime())
        .run(|| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, TestError>(1)
        })
        .await;
    assert!(
        matches!(out, Err(TestError::Samekey(Error::InvalidKey { ref part, .. })) if part == "prefix"),
        "{out:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Issue 38, defect 10: `run_once` on an operation that allows retries makes one attempt. Its work
/// answered "unavailable" (nothing ran): the call ends as spent retries do — with that answer, the key
/// given back, nothing queued (it ended `UNKNOWN` for compensation before) — and the next call runs.
#[tokio::test(start_paused = true)]
async fn run_once_makes_one_attempt_whatever_the_operation_s_retries() {
    let (rt, remote) = (runtime(), Remote::default());
    remote.script([Fault::Unavailable]);
    let out = CHARGE
        .key("o-once")
        .runtime(&rt)
        .run_once(|| remote.call("o-once", || 500))
        .await;
    assert_eq!(out, Err(TestError::Refused));
    assert_eq!(remote.call_ids().len(), 1, "one attempt");
    assert!(
        rt.compensations().await.unwrap().is_empty(),
        "nothing queued"
    );
    let again = CHARGE
        .key("o-once")
        .runtime(&rt)
        .run_once(|| remote.call("o-once", || 500))
        .await;
    assert_eq!(again, Ok(500), "the key was given back");
    assert_eq!(remote.effects("o-once"), 1);
}
