//! Reconciliation of a constructed day, on every backend: every kind of discrepancy is found, with
//! its callId, and nothing else.

mod support;

use std::sync::Arc;

use samekey::reconcile::{read_csv, read_jsonl, Discrepancy, Reconciler, RemoteOutcome};
use samekey::store::ReceiptQuery;
use samekey::{idempotent, observed, CallId, Error, ReceiptState, Runtime, Store};
use support::stores::*;
use support::{Fault, Remote, TestError};

struct Day {
    rt: Runtime,
    remote: Remote,
    /// Pays through `pay_by_reference` (its own scope: the two days run at once on a shared store).
    by_reference: bool,
}

impl Day {
    #[idempotent(key = "order", scope = "reconcile.pay", runtime = &self.rt, timeout = "1s", on_unknown = "hold")]
    async fn pay(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        let cx = samekey::current();
        self.remote.charge(cx.call_id(), order, amount).await
    }

    #[idempotent(key = "order", scope = "reconcile.by_reference", runtime = &self.rt, timeout = "1s", on_unknown = "hold")]
    async fn pay_by_reference(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        let cx = samekey::current();
        self.remote.charge(cx.call_id(), order, amount).await
    }

    #[idempotent(key = "order", scope = "reconcile.refund", runtime = &self.rt)]
    async fn refund(&self, order: &str) -> Result<u64, TestError> {
        Ok(1)
    }

    /// Pays, and answers the call's callId.
    async fn paid(&self, order: &str, amount: u64, fault: Fault) -> CallId {
        self.remote.script([fault]);
        let (_, report) = if self.by_reference {
            observed(self.pay_by_reference(order, amount)).await
        } else {
            observed(self.pay(order, amount)).await
        };
        report.expect("reported").call_id().clone()
    }
}

async fn a_day_is_reconciled(store: Arc<dyn Store>) {
    let rt = Runtime::builder()
        .node("day")
        .shared_store(store.clone())
        .build()
        .unwrap();
    let start = store.now_ms(rt.now_ms()).await.unwrap();
    let day = Day {
        rt: rt.clone(),
        remote: Remote::new(),
        by_reference: false,
    };
    let run = format!("{:x}", samekey::TraceId::new().as_u128());
    let order = |n: u8| format!("{run}-{n}");
    let matched = day.paid(&order(1), 500, Fault::None).await;
    let other_amount = day.paid(&order(2), 700, Fault::None).await;
    let declined_here = day.paid(&order(3), 900, Fault::Declined).await;
    let unknown_here = day.paid(&order(4), 300, Fault::ReplyLost).await;
    let not_there = day.paid(&order(5), 100, Fault::None).await;
    let never_here = CallId::new("pay", "elsewhere").unwrap();
    let (_, refund) = observed(day.refund(&order(6))).await;
    let other_scope = refund.unwrap().call_id().clone();
    assert!(matches!(
        day.pay(&order(4), 300).await,
        Err(TestError::Samekey(Error::Unknown { .. }))
    ));

    let line = |id: &CallId, status: &str, amount: u64| {
        format!("{{\"call_id\": \"{id}\", \"status\": \"{status}\", \"amount\": {amount}}}\n")
    };
    let file = [
        line(&matched, "succeeded", 500),
        line(&other_amount, "succeeded", 750),
        line(&declined_here, "succeeded", 900),
        line(&unknown_here, "succeeded", 300),
        line(&never_here, "succeeded", 50),
        line(&matched, "succeeded", 500),
        line(&other_scope, "succeeded", 1),
        "{\"call_id\": \"garbled\"}\n".to_owned(),
    ]
    .concat();

    let query = ReceiptQuery::created_between(start.saturating_sub(1_000), start + 3_600_000)
        .scope("reconcile.pay")
        .limit(2);
    let report = Reconciler::new(&rt, query)
        .amount(|r| serde_json::from_slice::<i64>(r.outcome.as_deref()?).ok())
        .run(read_jsonl(file.as_bytes()))
        .await
        .unwrap();

    assert_eq!(report.remote_records, 7);
    assert_eq!(report.repeated, 1, "a line repeating a callId");
    assert_eq!(report.outside_query, 1, "another scope's call");
    assert_eq!(report.receipts, 5);
    assert_eq!(report.matched, 1);
    assert_eq!(report.amount_mismatches, 1);
    assert_eq!(report.state_mismatches, 2);
    assert_eq!(report.missing_here, 1);
    assert_eq!(report.missing_there, 1);
    assert_eq!(report.unreadable, 1);
    assert!(!report.is_clean());
    let has = |d: &Discrepancy| report.examples.contains(d);
    assert!(has(&Discrepancy::AmountMismatch {
        call_id: other_amount,
        here: 700,
        there: 750
    }));
    assert!(has(&Discrepancy::StateMismatch {
        call_id: declined_here,
        here: ReceiptState::Failed,
        there: RemoteOutcome::Succeeded
    }));
    assert!(has(&Discrepancy::StateMismatch {
        call_id: unknown_here,
        here: ReceiptState::Unknown,
        there: RemoteOutcome::Succeeded
    }));
    assert!(has(&Discrepancy::MissingHere {
        call_id: Some(never_here),
        reference: None,
    }));
    assert!(has(&Discrepancy::MissingThere {
        call_id: not_there,
        state: ReceiptState::Success
    }));
}

/// The same day, from a counterparty that never kept the callId: its records name the order, and
/// this side's key is rebuilt from it. An `UNKNOWN` call is found as well as a finished one.
async fn a_day_is_reconciled_by_reference(store: Arc<dyn Store>) {
    let rt = Runtime::builder()
        .node("day")
        .shared_store(store.clone())
        .build()
        .unwrap();
    let start = store.now_ms(rt.now_ms()).await.unwrap();
    let day = Day {
        rt: rt.clone(),
        remote: Remote::new(),
        by_reference: true,
    };
    let run = format!("{:x}", samekey::TraceId::new().as_u128());
    let order = |n: u8| format!("{run}-{n}");
    day.paid(&order(1), 500, Fault::None).await;
    let other_amount = day.paid(&order(2), 700, Fault::None).await;
    let declined_here = day.paid(&order(3), 900, Fault::Declined).await;
    let unknown_here = day.paid(&order(4), 300, Fault::ReplyLost).await;
    let not_there = day.paid(&order(5), 100, Fault::None).await;

    let file = format!(
        "reference,status,amount\n{},paid,500\n{},paid,750\n{},paid,900\n{},paid,300\n{},paid,50\n{},paid,500\n,paid,1\n",
        order(1),
        order(2),
        order(3),
        order(4),
        order(7),
        order(1),
    );
    let query = ReceiptQuery::created_between(start.saturating_sub(1_000), start + 3_600_000)
        .scope("reconcile.by_reference")
        .limit(2);
    let report = Reconciler::new(&rt, query)
        .amount(|r| serde_json::from_slice::<i64>(r.outcome.as_deref()?).ok())
        .by_reference(|order| Some(samekey::Key::build("reconcile.by_reference", order)))
        .run(read_csv(file.as_bytes()))
        .await
        .unwrap();

    assert_eq!(report.remote_records, 6);
    assert_eq!(report.repeated, 1, "a line repeating a reference");
    assert_eq!(report.unreadable, 1, "a line without a reference");
    assert_eq!(report.receipts, 5);
    assert_eq!(report.matched, 1);
    assert_eq!(report.amount_mismatches, 1);
    assert_eq!(report.state_mismatches, 2);
    assert_eq!(report.missing_here, 1);
    assert_eq!(report.missing_there, 1);
    let has = |d: &Discrepancy| report.examples.contains(d);
    assert!(has(&Discrepancy::AmountMismatch {
        call_id: other_amount,
        here: 700,
        there: 750
    }));
    assert!(has(&Discrepancy::StateMismatch {
        call_id: declined_here,
        here: ReceiptState::Failed,
        there: RemoteOutcome::Succeeded
    }));
    assert!(has(&Discrepancy::StateMismatch {
        call_id: unknown_here,
        here: ReceiptState::Unknown,
        there: RemoteOutcome::Succeeded
    }));
    assert!(has(&Discrepancy::MissingHere {
        call_id: None,
        reference: Some(order(7)),
    }));
    assert!(has(&Discrepancy::MissingThere {
        call_id: not_there,
        state: ReceiptState::Success
    }));
}

support::on_stores!(memory, sqlite if "sqlite", postgres if "postgres", redis if "redis" => {
    a_day_is_reconciled,
    a_day_is_reconciled_by_reference,
});
