//! Every metric in the table of `samekey::observe::metrics`, read back from a recorder (feature `metrics`):
//! names, labels (a scope, never a key or a callId) and counts.
#![cfg(feature = "metrics")]

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use samekey::{
    clock::TokioClock, compensation::CompensationOperation, idempotent, limits::ConcurrencyLimit,
    limits::RetryBudget, CallId, Compensator, Runtime,
};
use support::faulty::Faulty;
use support::{Fault, Remote, TestError};

struct Svc {
    rt: Runtime,
    remote: Remote,
}

impl Svc {
    fn new(builder: samekey::runtime::RuntimeBuilder) -> Svc {
        Svc {
            rt: builder
                .node("metrics")
                .clock(TokioClock::new())
                .build()
                .unwrap(),
            remote: Remote::default(),
        }
    }

    #[idempotent(key = "order", scope = "shop.charge", runtime = &self.rt, timeout = "1s",
                 backoff = "10ms..100ms", lookup = |c| self.remote.status(c))]
    async fn charge(&self, order: &str) -> Result<u64, TestError> {
        self.remote.call(order, || 100).await
    }

    #[idempotent(key = "order", scope = "shop.ship", runtime = &self.rt, timeout = "1s",
                 backoff = "10ms..100ms", on_unknown = "hold", budget = "shipping")]
    async fn ship(&self, order: &str) -> Result<u64, TestError> {
        self.remote.call(order, || 1).await
    }
}

/// The counters by (name, sorted labels), and the histograms' sample counts.
type Seen = BTreeMap<(String, Vec<(String, String)>), u64>;

/// Everything the recorder holds, read once (a snapshot takes the values).
type Snapshot = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

fn read(snapshot: Snapshot) -> Seen {
    let mut seen = Seen::new();
    for (key, _, _, value) in snapshot {
        let (kind, key) = (key.kind(), key.key().clone());
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let n = match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => n,
            (MetricKind::Histogram, DebugValue::Histogram(samples)) => samples.len() as u64,
            // The gauge's last value (a limit: a whole number).
            (MetricKind::Gauge, DebugValue::Gauge(value)) => value.into_inner() as u64,
            _ => continue,
        };
        *seen.entry((key.name().to_owned(), labels)).or_default() += n;
    }
    seen
}

/// The smallest sample of the histograms named `name`.
fn smallest_sample(snapshot: &Snapshot, name: &str) -> Option<f64> {
    snapshot
        .iter()
        .filter(|(key, ..)| key.key().name() == name)
        .filter_map(|(.., value)| match value {
            DebugValue::Histogram(samples) => {
                samples.iter().map(|s| s.into_inner()).reduce(f64::min)
            }
            _ => None,
        })
        .reduce(f64::min)
}

fn get(seen: &Seen, name: &str, labels: &[(&str, &str)]) -> u64 {
    let mut want: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    want.sort();
    seen.get(&(name.to_owned(), want)).copied().unwrap_or(0)
}

#[test]
fn every_metric_reaches_the_recorder() {
    let recorder = DebuggingRecorder::new();
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        tokio.block_on(async {
            let svc = Svc::new(
                Runtime::builder()
                    .budget(
                        "shipping",
                        RetryBudget::new(Duration::from_secs(10), 0, 0.0),
                    )
                    .concurrency_limit(ConcurrencyLimit::adaptive().max_wait(Duration::ZERO)),
            );
            // A fresh call, then its replay.
            assert_eq!(svc.charge("o-1").await, Ok(100));
            assert_eq!(svc.charge("o-1").await, Ok(100));
            // A retry after a 503.
            svc.remote.script([Fault::Unavailable]);
            assert_eq!(svc.charge("o-2").await, Ok(100));
            // A lost reply: the lookup finds the charge.
            svc.remote.script([Fault::LoseReply]);
            assert_eq!(svc.charge("o-3").await, Ok(100));
            // A declined card changes nothing: the claim is given back.
            svc.remote.script([Fault::Decline]);
            assert!(svc.charge("o-4").await.is_err());
            // A lost reply without lookup: UNKNOWN, queued; the worker settles it.
            svc.remote.script([Fault::LoseReply]);
            assert!(svc.ship("o-5").await.is_err());
            let remote = svc.remote.clone();
            let worker = Compensator::new(&svc.rt).operation(
                "shop.ship",
                CompensationOperation::new(move |call: CallId| {
                    let remote = remote.clone();
                    async move { remote.status(&call).await }
                }),
            );
            assert_eq!(worker.run_once().await.unwrap().succeeded, 1);
            // A 503 on a dependency whose budget allows no retry.
            svc.remote.script([Fault::Unavailable]);
            assert!(svc.ship("o-6").await.is_err());
            // A duplicate waits for a busy key.
            svc.remote.script([Fault::Slow(Duration::from_millis(300))]);
            let (a, b) = tokio::join!(svc.charge("o-7"), async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                svc.charge("o-7").await
            });
            assert_eq!((a, b), (Ok(100), Ok(100)));
            // A store that fails: the call fails closed.
            let down = Svc::new(Runtime::builder().store(Faulty::down()));
            assert!(down.charge("o-8").await.is_err());
            // A 429: retried after its wait; the dependency's limit drops to 1 call in flight, and
            // the success raises it to 2.
            svc.remote
                .script([Fault::RateLimited(Duration::from_millis(20))]);
            assert_eq!(svc.charge("o-9").await, Ok(100));
            assert_eq!(svc.rt.concurrency_limit(None), Some(2));
            // Two calls in flight fill the limit; a third is refused at once (max_wait 0).
            svc.remote.script([
                Fault::Slow(Duration::from_millis(100)),
                Fault::Slow(Duration::from_millis(100)),
            ]);
            let (a, b, c) = tokio::join!(svc.charge("o-10"), svc.charge("o-11"), async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                svc.charge("o-12").await
            });
            assert_eq!((a, b), (Ok(100), Ok(100)));
            assert!(c.is_err());
        })
    });

    // Durations to the nanosecond, by the monotonic clock: a replay takes well under a millisecond,
    // and is not recorded as 0.
    let snapshot = recorder.snapshotter().snapshot().into_vec();
    let fastest = smallest_sample(&snapshot, "samekey_call_seconds").expect("durations");
    assert!(fastest > 0.0 && fastest < 0.001, "{fastest}");
    let seen = read(snapshot);
    let charge = [("scope", "shop.charge")];
    let ship = [("scope", "shop.ship")];
    assert_eq!(get(&seen, "samekey_calls_total", &charge), 7 + 1 + 4);
    assert_eq!(
        get(&seen, "samekey_claims_total", &charge),
        5 + 3,
        "the failing store's claim is not one: {seen:#?}"
    );
    assert_eq!(get(&seen, "samekey_replays_total", &charge), 2);
    assert_eq!(get(&seen, "samekey_attempts_total", &charge), 6 + 4);
    for (class, n) in [("retryable", 1), ("rate_limited", 1), ("unknown", 0)] {
        assert_eq!(
            get(
                &seen,
                "samekey_retries_total",
                &[("scope", "shop.charge"), ("class", class)]
            ),
            n,
            "{class}"
        );
    }
    assert_eq!(get(&seen, "samekey_overloaded_total", &charge), 1);
    assert_eq!(
        get(&seen, "samekey_concurrency_limit", &[("budget", "runtime")]),
        3,
        "the limit's last value: 2, and the two successes that filled it raised it to 3"
    );
    assert_eq!(
        get(
            &seen,
            "samekey_lookups_total",
            &[("scope", "shop.charge"), ("answer", "succeeded")]
        ),
        1
    );
    assert_eq!(get(&seen, "samekey_waits_total", &charge), 1);
    assert_eq!(get(&seen, "samekey_released_total", &charge), 1);
    assert_eq!(get(&seen, "samekey_unknown_total", &ship), 1);
    assert_eq!(get(&seen, "samekey_released_total", &ship), 1);
    assert_eq!(
        get(
            &seen,
            "samekey_budget_spent_total",
            &[("scope", "shop.ship"), ("budget", "shipping")]
        ),
        1
    );
    assert_eq!(get(&seen, "samekey_failed_closed_total", &charge), 1);
    assert_eq!(
        get(
            &seen,
            "samekey_store_errors_total",
            &[("backend", "custom")]
        ),
        1
    );
    assert_eq!(
        get(
            &seen,
            "samekey_compensation_total",
            &[("outcome", "succeeded")]
        ),
        1
    );
    assert!(
        get(
            &seen,
            "samekey_call_seconds",
            &[("scope", "shop.charge"), ("outcome", "ok")]
        ) >= 6 + 3
    );
    assert!(
        get(
            &seen,
            "samekey_call_seconds",
            &[("scope", "shop.charge"), ("outcome", "error")]
        ) > 2
    );
    assert_eq!(get(&seen, "samekey_call_attempts", &ship), 2);
    // Every metric of the table, and only they; no label carries a key or a callId.
    let names: std::collections::BTreeSet<&str> = seen.keys().map(|(n, _)| n.as_str()).collect();
    let table = [
        "samekey_attempts_total",
        "samekey_budget_spent_total",
        "samekey_call_attempts",
        "samekey_call_seconds",
        "samekey_calls_total",
        "samekey_claims_total",
        "samekey_compensation_total",
        "samekey_concurrency_limit",
        "samekey_failed_closed_total",
        "samekey_lookups_total",
        "samekey_overloaded_total",
        "samekey_released_total",
        "samekey_replays_total",
        "samekey_retries_total",
        "samekey_store_errors_total",
        "samekey_unknown_total",
        "samekey_waits_total",
    ];
    assert_eq!(names.into_iter().collect::<Vec<_>>(), table);
    for (_, labels) in seen.keys() {
        for (name, value) in labels {
            assert!(
                ["scope", "answer", "budget", "backend", "outcome", "class"]
                    .contains(&name.as_str()),
                "{name}"
            );
            assert!(
                !value.contains("o-") && !value.starts_with("cha-"),
                "{value}"
            );
        }
    }
}
