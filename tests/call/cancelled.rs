//! A caller that goes away after the body's outcome is known but could not be written: neither the
//! completion nor the `UNKNOWN` mark reached the store, and the caller is dropped while the call
//! writes its journal (the one write left after them). The drop guard must then still hold the
//! outcome (`Phase::Recording`) and write it — or `UNKNOWN` — once the store is healthy again: the key
//! is never given back, so a duplicate never runs the body a second time. Before issue 25's split
//! the flag that told the guard so was cleared before the journal's write, and a cancel there
//! released a key whose request took effect.
//!
//! Also: what the journal of such a call says of its claim (its fence), as before the split.
//!
//! Each scenario runs on every backend, through [`support::faulty`] (a `StoreWrapper`): the in-memory
//! store too goes through the store's API, not the runtime's direct calls.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use samekey::journal::EventKind;
use samekey::{idempotent, store::StoreError, CallId, Error, ReceiptState, Runtime, Store};
use support::faulty::{Act, Faulty, Gate};
use support::stores::*;
use support::{Remote, TestError};

struct Svc {
    rt: Runtime,
    remote: Remote,
    store: Arc<Faulty>,
    /// The order every call of the test is about: a key of the test's own.
    order: String,
}

impl Svc {
    fn on(store: Arc<dyn Store>) -> Arc<Svc> {
        let store = Arc::new(Faulty::new(store));
        Arc::new(Svc {
            rt: Runtime::builder()
                .node("cancelled")
                .store(Arc::clone(&store))
                .build()
                .unwrap(),
            remote: Remote::default(),
            store,
            order: format!("o-{:x}", samekey::TraceId::new().as_u128()),
        })
    }

    #[idempotent(key = "order", scope = "cancelled.charge", runtime = &self.rt)]
    async fn plain(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    #[idempotent(key = "order", scope = "cancelled.charge", runtime = &self.rt, timeout = "1s",
                 on_unknown = "hold")]
    async fn hold(&self, order: &str, amount: u64) -> Result<u64, TestError> {
        self.remote.call(order, || amount).await
    }

    fn key(&self) -> samekey::Key {
        samekey::Key::build("cancelled.charge", &self.order.as_str())
    }

    fn first_call_id(&self) -> CallId {
        self.remote.call_ids()[0].parse().unwrap()
    }

    async fn state(&self, call_id: &CallId) -> Option<ReceiptState> {
        self.rt.receipt(call_id).await.unwrap().map(|r| r.state)
    }

    /// Waits (up to 10 s) until the receipt of `call_id` is `state`: the drop guard writes in a task
    /// of its own, after the caller is gone.
    async fn until_state(&self, call_id: &CallId, state: ReceiptState) {
        for _ in 0..1000 {
            if self.state(call_id).await == Some(state) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "receipt of {call_id} never became {state} (the key given back?): {:?}",
            self.rt.receipt(call_id).await
        );
    }

    /// Runs `plain` in a task of its own with the completion failing `complete_fails` times and the
    /// `UNKNOWN` mark once, and goes away (aborts it) while it writes its journal, which it never
    /// finishes: the store holds that write at a gate that is never opened.
    async fn dropped_while_journaling(self: &Arc<Svc>, complete_fails: usize) {
        self.store.plan(
            "complete",
            std::iter::repeat_with(|| Act::Fail(unavailable())).take(complete_fails),
        );
        self.store.plan("mark_unknown", [Act::Fail(unavailable())]);
        let journal = Gate::new();
        self.store
            .plan("append_journal", [Act::Before(journal.clone())]);
        let svc = self.clone();
        let task = tokio::spawn(async move { svc.plain(&svc.order, 500).await });
        tokio::time::timeout(Duration::from_secs(10), journal.reached())
            .await
            .expect("the call never wrote its journal");
        assert_eq!(
            self.remote.effects(&self.order),
            1,
            "the charge took effect"
        );
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }
}

fn unavailable() -> StoreError {
    StoreError::Unavailable("connection reset (test)".into())
}

/// The body charged, the outcome and the `UNKNOWN` mark could not be written, the caller went away
/// while the journal was written, then the store answered again: the drop guard records the success,
/// and a duplicate replays it instead of charging again.
async fn dropped_while_journaling_an_outcome_nothing_could_write(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.dropped_while_journaling(1).await;
    let call_id = svc.first_call_id();
    svc.until_state(&call_id, ReceiptState::Success).await;
    assert_eq!(svc.plain(&svc.order, 500).await, Ok(500), "replayed");
    assert_eq!(svc.remote.effects(&svc.order), 1, "charged once");
}

/// As above, but the drop guard's own completion fails too: it leaves the call `UNKNOWN` (queued),
/// never free, and a duplicate without a lookup answers `Unknown` instead of charging again.
async fn dropped_while_journaling_and_the_guard_s_write_fails_too(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.dropped_while_journaling(2).await;
    let call_id = svc.first_call_id();
    svc.until_state(&call_id, ReceiptState::Unknown).await;
    assert_eq!(
        svc.hold(&svc.order, 500).await,
        Err(TestError::Samekey(Error::Unknown { call_id })),
        "left to compensation"
    );
    assert_eq!(svc.remote.effects(&svc.order), 1, "charged once");
}

/// The outcome could not be written, and the call left itself `UNKNOWN` (queued) instead: its journal
/// starts with its claim, under the fence it held (as before issue 25's split). On HEAD the call
/// leaves `Phase::Recording` for `Phase::Free` before it journals, and the claim it brings with the
/// first event is written with fence 0 ("claimed" instead of "claimed (fence N)").
async fn an_outcome_left_unknown_journals_the_claim_s_fence(store: Arc<dyn Store>) {
    let svc = Svc::on(store);
    svc.store.plan("complete", [Act::Fail(unavailable())]);
    assert_eq!(
        svc.plain(&svc.order, 500).await,
        Ok(500),
        "the known outcome"
    );
    let call_id = svc.first_call_id();
    let record = svc.rt.receipt(&call_id).await.unwrap().expect("a record");
    assert_eq!(record.state, ReceiptState::Unknown);
    let events = svc
        .rt
        .store()
        .journal(&svc.key(), svc.rt.now_ms())
        .await
        .unwrap();
    let whats: Vec<&EventKind> = events.iter().map(|e| &e.what).collect();
    assert!(
        matches!(
            whats.as_slice(),
            [EventKind::Claimed { .. }, EventKind::Unknown { .. }]
        ),
        "{whats:?}"
    );
    assert_eq!(
        whats[0],
        &EventKind::Claimed {
            fence: record.fence.0
        },
        "the claim's fence, as the record holds it"
    );
}

support::on_stores!(memory, local_cache, sqlite if "sqlite", postgres if "postgres", mysql if "mysql", redis if "redis" => {
    dropped_while_journaling_an_outcome_nothing_could_write,
    dropped_while_journaling_and_the_guard_s_write_fails_too,
    an_outcome_left_unknown_journals_the_claim_s_fence,
});
