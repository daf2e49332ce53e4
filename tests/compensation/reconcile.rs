//! Reconciliation of a constructed day, on every backend: every kind of discrepancy is found, with
//! its callId, and nothing else.

use crate::support;

use std::sync::Arc;

use samekey::reconcile::{
    read_csv, read_jsonl, Discrepancy, ReconcileReport, Reconciler, RemoteOutcome,
};
use samekey::store::ReceiptQuery;
use samekey::{idempotent, observe::observed, CallId, Error, ReceiptState, Runtime, Store};
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
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", scope = "reconcile.by_reference", runtime = &self.rt, timeout = "1s", on_unknown = "hold")]
    async fn pay_by_reference(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
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

/// This side's day: five orders paid (order 1 as the counterparty has it, 2 for another amount, 3
/// declined here, 4 left `UNKNOWN`, 5 never mentioned there), and when it started by the store's clock.
struct Planted {
    day: Day,
    start: u64,
    run: String,
    matched: CallId,
    other_amount: CallId,
    declined_here: CallId,
    unknown_here: CallId,
    not_there: CallId,
}

impl Planted {
    async fn on(store: Arc<dyn Store>, by_reference: bool) -> Planted {
        let rt = Runtime::builder()
            .node("day")
            .shared_store(store.clone())
            .build()
            .unwrap();
        let start = store.now_ms(rt.now_ms()).await.unwrap();
        let day = Day {
            rt,
            remote: Remote::default(),
            by_reference,
        };
        let run = format!("{:x}", samekey::TraceId::new().as_u128());
        let order = |n: u8| format!("{run}-{n}");
        Planted {
            matched: day.paid(&order(1), 500, Fault::Ok).await,
            other_amount: day.paid(&order(2), 700, Fault::Ok).await,
            declined_here: day.paid(&order(3), 900, Fault::Reject).await,
            unknown_here: day.paid(&order(4), 300, Fault::LoseReply).await,
            not_there: day.paid(&order(5), 100, Fault::Ok).await,
            day,
            start,
            run,
        }
    }

    fn order(&self, n: u8) -> String {
        format!("{}-{n}", self.run)
    }

    /// The receipts of the day in `scope`, two a page.
    fn query(&self, scope: &str) -> ReceiptQuery {
        ReceiptQuery::created_between(self.start.saturating_sub(1_000), self.start + 3_600_000)
            .scope(scope)
            .limit(2)
    }

    /// What both ways of matching find on this day: one match, the other amount, the two states
    /// that differ, the receipt never mentioned there, and one record missing here.
    fn assert_found(&self, report: &ReconcileReport) {
        assert_eq!(report.receipts, 5);
        assert_eq!(report.matched, 1);
        assert_eq!(report.amount_mismatches, 1);
        assert_eq!(report.state_mismatches, 2);
        assert_eq!(report.missing_here, 1);
        assert_eq!(report.missing_there, 1);
        assert!(!report.is_clean());
        let has = |d: &Discrepancy| report.examples.contains(d);
        assert!(has(&Discrepancy::AmountMismatch {
            call_id: self.other_amount.clone(),
            here: 700,
            there: 750
        }));
        assert!(has(&Discrepancy::StateMismatch {
            call_id: self.declined_here.clone(),
            here: ReceiptState::Failed,
            there: RemoteOutcome::Succeeded
        }));
        assert!(has(&Discrepancy::StateMismatch {
            call_id: self.unknown_here.clone(),
            here: ReceiptState::Unknown,
            there: RemoteOutcome::Succeeded
        }));
        assert!(has(&Discrepancy::MissingThere {
            call_id: self.not_there.clone(),
            state: ReceiptState::Success
        }));
    }
}

async fn a_day_is_reconciled(store: Arc<dyn Store>) {
    let p = Planted::on(store, false).await;
    let (day, order) = (&p.day, |n| p.order(n));
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
        line(&p.matched, "succeeded", 500),
        line(&p.other_amount, "succeeded", 750),
        line(&p.declined_here, "succeeded", 900),
        line(&p.unknown_here, "succeeded", 300),
        line(&never_here, "succeeded", 50),
        line(&p.matched, "succeeded", 500),
        line(&other_scope, "succeeded", 1),
        "{\"call_id\": \"garbled\"}\n".to_owned(),
    ]
    .concat();

    let report = Reconciler::new(&day.rt, p.query("reconcile.pay"))
        .amount(|r| serde_json::from_slice::<i64>(r.outcome.as_deref()?).ok())
        .run(read_jsonl(file.as_bytes()))
        .await
        .unwrap();

    assert_eq!(report.remote_records, 7);
    assert_eq!(report.repeated, 1, "a line repeating a callId");
    assert_eq!(report.outside_query, 1, "another scope's call");
    assert_eq!(report.unreadable, 1);
    p.assert_found(&report);
    assert!(report.examples.contains(&Discrepancy::MissingHere {
        call_id: Some(never_here),
        reference: None,
    }));
}

/// The same day, from a counterparty that never kept the callId: its records name the order, and
/// this side's key is rebuilt from it. An `UNKNOWN` call is found as well as a finished one.
async fn a_day_is_reconciled_by_reference(store: Arc<dyn Store>) {
    let p = Planted::on(store, true).await;
    let order = |n| p.order(n);

    let file = format!(
        "reference,status,amount\n{},paid,500\n{},paid,750\n{},paid,900\n{},paid,300\n{},paid,50\n{},paid,500\n,paid,1\n",
        order(1),
        order(2),
        order(3),
        order(4),
        order(7),
        order(1),
    );
    let report = Reconciler::new(&p.day.rt, p.query("reconcile.by_reference"))
        .amount(|r| serde_json::from_slice::<i64>(r.outcome.as_deref()?).ok())
        .by_reference(|order| Some(samekey::Key::build("reconcile.by_reference", order)))
        .run(read_csv(file.as_bytes()))
        .await
        .unwrap();

    assert_eq!(report.remote_records, 6);
    assert_eq!(report.repeated, 1, "a line repeating a reference");
    assert_eq!(report.unreadable, 1, "a line without a reference");
    p.assert_found(&report);
    assert!(report.examples.contains(&Discrepancy::MissingHere {
        call_id: None,
        reference: Some(order(7)),
    }));
}

support::on_stores!(memory, sqlite if "sqlite", postgres if "postgres", mysql if "mysql", redis if "redis" => {
    a_day_is_reconciled,
    a_day_is_reconciled_by_reference,
});
