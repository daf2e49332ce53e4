//! Property, through the test kit: under generated fault schedules (every `Fault`: lost requests,
//! lost replies, slow replies past the timeout, 503s, 429s, 4xx, hangs, callers that crash
//! mid-call), failing lookups, duplicate and concurrent calls, and callers that give up, for each way
//! of handling an unknown outcome (`lookup`, `hold`, `rerun` against a remote that deduplicates by
//! callId): no key takes effect twice, no caller is told "failed" for a call that took effect (nor
//! "succeeded" for one that did not), every attempt of a call carries its callId, and every call left
//! `UNKNOWN` is queued or resolved — then the compensation worker settles them.
//!
//! ```text
//! cargo test --release --test kit properties::                       # 10 000 schedules, memory store
//! cargo test --release --test kit --features sqlite properties::     # and 1 000 on SQLite
//! ```
//! `SAMEKEY_KIT_CASES` overrides the memory store's count.
//!
//! (Was `tests/kit_properties.rs`.)

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use samekey::testing::{schedules, Remote, RemoteError, Schedule, TestKit};
use samekey::{idempotent, Classify, ErrorClass, Runtime};
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

/// How the function under test handles an unknown outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Policy {
    Lookup,
    Hold,
    Rerun,
}

impl Policy {
    fn scope(self) -> &'static str {
        match self {
            Policy::Lookup => "prop.lookup",
            Policy::Hold => "prop.hold",
            Policy::Rerun => "prop.rerun",
        }
    }
}

struct Payments {
    rt: Runtime,
    gateway: Remote<u64, PayError>,
}

impl Payments {
    #[idempotent(key = "order", scope = "prop.lookup", runtime = &self.rt, timeout = "1s",
                 retries = 3, backoff = "100ms..1s", lookup = |call| self.gateway.status(call))]
    async fn lookup(&self, order: &str, cents: u64) -> Result<u64, PayError> {
        self.gateway.call(order, || cents).await
    }

    #[idempotent(key = "order", scope = "prop.hold", runtime = &self.rt, timeout = "1s",
                 retries = 3, backoff = "100ms..1s", on_unknown = "hold")]
    async fn hold(&self, order: &str, cents: u64) -> Result<u64, PayError> {
        self.gateway.call(order, || cents).await
    }

    #[idempotent(key = "order", scope = "prop.rerun", runtime = &self.rt, timeout = "1s",
                 retries = 3, backoff = "100ms..1s", on_unknown = "rerun")]
    async fn rerun(&self, order: &str, cents: u64) -> Result<u64, PayError> {
        self.gateway.call(order, || cents).await
    }

    async fn charge(&self, policy: Policy, order: &str) -> Result<u64, PayError> {
        match policy {
            Policy::Lookup => self.lookup(order, 100).await,
            Policy::Hold => self.hold(order, 100).await,
            Policy::Rerun => self.rerun(order, 100).await,
        }
    }
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::Lookup),
        Just(Policy::Hold),
        Just(Policy::Rerun)
    ]
}

/// One step: the order (of 3), whether a duplicate of it is sent at the same time, and whether its
/// caller gives up after that many ×100 ms.
type Step = (u8, bool, Option<u8>);

/// The scenario on `kit`: the steps' calls, the worker, then every guarantee checked.
async fn scenario(
    kit: Arc<TestKit>,
    policy: Policy,
    schedule: Schedule,
    failing_lookups: Vec<bool>,
    steps: Vec<Step>,
) -> Result<(), String> {
    let gateway = match policy {
        // `rerun` is only correct against a remote that deduplicates by callId: its contract.
        Policy::Rerun => Remote::new(schedule).deduplicating(),
        Policy::Lookup | Policy::Hold => Remote::new(schedule),
    }
    .failing_lookups(failing_lookups);
    let payments = Payments {
        rt: kit.runtime().clone(),
        gateway: gateway.clone(),
    };
    let call = |order: String, give_up: Option<u8>| {
        let (kit, payments) = (&kit, &payments);
        async move {
            let charge = payments.charge(policy, &order);
            match give_up {
                Some(n) => {
                    let patience = std::time::Duration::from_millis(u64::from(n) * 100);
                    kit.call_giving_up_after(patience, charge).await
                }
                None => kit.call(charge).await,
            }
        }
    };
    for (order, concurrent, give_up) in steps {
        let order = format!("o-{}", order % 3);
        if concurrent {
            tokio::join!(call(order.clone(), give_up), call(order, None));
        } else {
            call(order, give_up).await;
        }
    }
    kit.check(&gateway).await?;
    kit.settle(policy.scope(), &gateway)
        .await
        .map_err(|e| format!("the worker failed: {e}"))?;
    // After the worker, a caller asking again is answered, and still nothing ran twice.
    for order in ["o-0", "o-1", "o-2"] {
        kit.call(payments.charge(policy, order)).await;
    }
    kit.check(&gateway).await
}

fn memory_cases() -> u32 {
    std::env::var("SAMEKEY_KIT_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000)
}

proptest! {
    // A failing schedule is kept beside this file (properties.proptest-regressions) and run
    // first next time.
    #![proptest_config(ProptestConfig {
        cases: memory_cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn under_any_schedule_nothing_runs_twice_and_nothing_is_lost(
        policy in policy(),
        schedule in schedules(12),
        failing_lookups in proptest::collection::vec(proptest::bool::weighted(0.2), 0..6),
        steps in proptest::collection::vec(
            (0u8..3, proptest::bool::weighted(0.3), proptest::option::weighted(0.2, 0u8..40)),
            1..8,
        ),
    ) {
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let kit = Arc::new(TestKit::new());
        let checked = tokio.block_on(scenario(kit, policy, schedule, failing_lookups, steps));
        prop_assert!(checked.is_ok(), "{}", checked.unwrap_err());
    }
}

/// 1 000 seeded schedules on SQLite (a file per schedule), in real time — its pool's timers must not
/// be skipped ahead — with the function's timings shortened by a runtime of short leases and rounds,
/// 16 schedules at a time.
#[cfg(feature = "sqlite")]
#[test]
fn on_sqlite_under_a_thousand_schedules_nothing_runs_twice() {
    use samekey::testing::FaultMix;
    use std::time::Duration;

    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = std::env::temp_dir().join(format!(
        "samekey-kit-properties-{:x}",
        samekey::TraceId::new().as_u128()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let started = std::time::Instant::now();
    let failures = tokio.block_on(async {
        let mut failures = Vec::new();
        let mut running = tokio::task::JoinSet::new();
        for seed in 0..1_000u64 {
            if running.len() == 16 {
                if let Some(Err(e)) = running.join_next().await.transpose().unwrap() {
                    failures.push(e);
                }
            }
            let path = dir.join(format!("{seed}.db"));
            running.spawn(async move {
                let store = samekey::store::SqliteStore::open(&path)
                    .await
                    .map_err(|e| format!("seed {seed}: {e}"))?;
                let rt = Runtime::builder()
                    .node("test")
                    .jitter_seed(seed)
                    .lease(Duration::from_millis(300))
                    .store(store)
                    .build()
                    .unwrap();
                let kit = Arc::new(
                    TestKit::with_runtime(rt)
                        .rounds([Duration::from_millis(20), Duration::from_millis(50)]),
                );
                // Slow replies past the 1 s timeout are the slow part: fewer, shorter than the
                // memory run's.
                let mix = FaultMix {
                    slow_requests: 3,
                    slow: Duration::from_millis(1_200),
                    retry_after: Duration::from_millis(20),
                    ..FaultMix::default()
                };
                let policy = [Policy::Lookup, Policy::Hold, Policy::Rerun][(seed % 3) as usize];
                let steps: Vec<Step> = (0..6)
                    .map(|i| ((seed + i) as u8 % 3, (seed + i) % 4 == 0, None))
                    .collect();
                let failing_lookups = vec![seed % 5 == 0];
                let out = scenario(
                    kit,
                    policy,
                    Schedule::seeded(seed, mix),
                    failing_lookups,
                    steps,
                )
                .await;
                let _ = std::fs::remove_file(&path);
                out.map_err(|e| format!("seed {seed}, {policy:?}:\n{e}"))
            });
        }
        while let Some(done) = running.join_next().await {
            if let Err(e) = done.unwrap() {
                failures.push(e);
            }
        }
        failures
    });
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "1 000 schedules on SQLite in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
