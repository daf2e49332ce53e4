//! The retry budget, simulated with paused time: against a dependency failing every call, retries stay
//! within the budget's share of the calls and its floor; when the dependency recovers, the budget
//! refills; against a healthy one, it never refuses a retry; a named dependency spends only its own.
//!
//! (Was `tests/budget.rs`.)

use crate::support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::{clock::TokioClock, idempotent, limits::RetryBudget, Runtime};
use support::TestError;

/// A dependency that refuses before processing (retryable, nothing ran) while it is down, and, when it
/// is up, the first request for every `fail_every`-th order (0: none).
#[derive(Default)]
struct Dependency {
    down: AtomicBool,
    fail_every: AtomicU64,
    sent: AtomicU64,
    seen: Mutex<HashSet<u64>>,
}

impl Dependency {
    async fn send(&self, order: u64) -> Result<u64, TestError> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.sent.fetch_add(1, Ordering::SeqCst);
        let every = self.fail_every.load(Ordering::SeqCst);
        let first = self.seen.lock().unwrap().insert(order);
        if self.down.load(Ordering::SeqCst) || (every > 0 && order.is_multiple_of(every) && first) {
            return Err(TestError::Refused);
        }
        Ok(order)
    }
}

struct Svc {
    rt: Runtime,
    payments: Arc<Dependency>,
    search: Arc<Dependency>,
}

impl Svc {
    fn new(rt: samekey::runtime::RuntimeBuilder) -> Arc<Svc> {
        Arc::new(Svc {
            rt: rt.clock(TokioClock::new()).jitter_seed(7).build().unwrap(),
            payments: Arc::default(),
            search: Arc::default(),
        })
    }

    #[idempotent(key = "order", scope = "budget.charge", runtime = &self.rt, retries = 3,
                 backoff = "50ms..200ms")]
    async fn charge(&self, order: u64) -> Result<u64, TestError> {
        self.payments.send(order).await
    }

    #[idempotent(key = "order", scope = "budget.pay", runtime = &self.rt, retries = 3,
                 backoff = "50ms..200ms", budget = "payments")]
    async fn pay(&self, order: u64) -> Result<u64, TestError> {
        self.payments.send(order).await
    }

    #[idempotent(key = "query", scope = "budget.search", runtime = &self.rt, retries = 3,
                 backoff = "50ms..200ms", budget = "search")]
    async fn search(&self, query: u64) -> Result<u64, TestError> {
        self.search.send(query).await
    }

    /// `calls` calls of `op` at `per_sec` calls a second, each in a task of its own (as a service's
    /// requests), waited for; answers how many failed.
    async fn load(self: &Arc<Self>, op: Op, first: u64, calls: u64, per_sec: u64) -> u64 {
        let gap = Duration::from_millis(1_000 / per_sec);
        let mut running = tokio::task::JoinSet::new();
        for n in first..first + calls {
            let svc = self.clone();
            running.spawn(async move {
                match op {
                    Op::Charge => svc.charge(n).await,
                    Op::Pay => svc.pay(n).await,
                    Op::Search => svc.search(n).await,
                }
            });
            tokio::time::sleep(gap).await;
        }
        let mut failed = 0;
        while let Some(done) = running.join_next().await {
            failed += u64::from(!matches!(done, Ok(Ok(_))));
        }
        failed
    }
}

#[derive(Clone, Copy)]
enum Op {
    Charge,
    Pay,
    Search,
}

/// 20 % of the calls, plus the floor of 10 per second over the span of the run and one window more (a
/// window's allowance is available at once).
fn allowance(calls: u64, span: Duration) -> u64 {
    calls / 5 + 10 * (span.as_secs() + 10)
}

#[tokio::test(start_paused = true)]
async fn a_failing_dependency_gets_its_share_of_retries_not_three_per_call() {
    let svc = Svc::new(Runtime::builder().node("budget"));
    svc.payments.down.store(true, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    // 60 s at 50 calls a second: with three retries each, 9 000 retries without a budget.
    let failed = svc.load(Op::Charge, 0, 3_000, 50).await;
    let span = started.elapsed();
    assert_eq!(failed, 3_000, "the dependency is down: every call fails");
    let stats = svc.rt.stats();
    println!(
        "dependency down: 3 000 calls over {span:?}: {} retries (allowance {}), {} refused",
        stats.retries,
        allowance(3_000, span),
        stats.budget_spent
    );
    assert!(
        stats.retries <= allowance(3_000, span),
        "{} retries for 3 000 calls over {span:?}: more than 20 % + the floor",
        stats.retries
    );
    assert!(stats.retries >= 3_000 / 5, "the share is spent: {stats:?}");
    assert!(stats.budget_spent > 0);
    assert_eq!(
        svc.payments.sent.load(Ordering::SeqCst),
        3_000 + stats.retries,
        "every call sent once, and only the retries the budget allowed"
    );
    // Nothing ran: every call's claim was given back, none is left UNKNOWN.
    assert_eq!(stats.unknown, 0);

    // The dependency recovers: its successful calls refill the window, and a failure is retried
    // again.
    svc.payments.down.store(false, Ordering::SeqCst);
    svc.payments.fail_every.store(4, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = svc.rt.stats();
    let failed = svc.load(Op::Charge, 10_000, 1_000, 50).await;
    let after = svc.rt.stats();
    assert_eq!(failed, 0, "every failure after the recovery was retried");
    assert_eq!(after.budget_spent, before.budget_spent, "nothing refused");
    assert!(after.retries - before.retries >= 1_000 / 4 - 1);
}

#[tokio::test(start_paused = true)]
async fn a_healthy_dependency_never_meets_the_budget() {
    let svc = Svc::new(Runtime::builder().node("budget"));
    // One request in ten fails, once: 10 % of the calls need a retry, under the 20 % share.
    svc.payments.fail_every.store(10, Ordering::SeqCst);
    let failed = svc.load(Op::Charge, 0, 5_000, 200).await;
    let stats = svc.rt.stats();
    assert_eq!(failed, 0);
    assert_eq!(stats.budget_spent, 0, "{stats:?}");
    assert!(stats.retries >= 450, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn a_failing_dependency_spends_only_its_own_budget() {
    let svc = Svc::new(
        Runtime::builder()
            .node("budget")
            .budget("search", RetryBudget::new(Duration::from_secs(10), 1, 0.1)),
    );
    svc.search.down.store(true, Ordering::SeqCst);
    let failed = svc.load(Op::Search, 0, 1_000, 50).await;
    assert_eq!(failed, 1_000);
    let spent = svc.rt.stats().budget_spent;
    assert!(spent > 0);
    let searched = svc.rt.stats().retries;
    assert!(
        searched <= 1_000 / 10 + 30,
        "{searched} retries: the search budget is its own policy"
    );

    // Payments, a dependency of its own, still gets every retry it needs.
    svc.payments.fail_every.store(3, Ordering::SeqCst);
    let failed = svc.load(Op::Pay, 5_000, 300, 50).await;
    assert_eq!(failed, 0);
    assert_eq!(
        svc.rt.stats().budget_spent,
        spent,
        "no payments retry was refused"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unlimited_budget_retries_every_call_three_times() {
    let svc = Svc::new(
        Runtime::builder()
            .node("budget")
            .retry_budget(RetryBudget::unlimited()),
    );
    svc.payments.down.store(true, Ordering::SeqCst);
    let failed = svc.load(Op::Charge, 0, 500, 50).await;
    assert_eq!(failed, 500);
    assert_eq!(svc.rt.stats().retries, 1_500);
    let refused = svc.charge(0).await;
    assert!(
        matches!(refused, Err(TestError::Refused)),
        "a replay of nothing: the key was given back, the call runs again: {refused:?}"
    );
}
