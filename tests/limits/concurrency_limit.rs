//! Adaptive concurrency, simulated with paused time: a dependency that answers "rate limited" beyond a
//! capacity gets fewer calls at once (and far fewer 429s) than without the limiter; a call that finds
//! no place in time is refused before it claims anything; successes open the limit again; one
//! dependency's limit does not slow down another.
//!
//! (Was `tests/rate_limits.rs`.)

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::{clock::TokioClock, idempotent, limits::ConcurrencyLimit, Error, Runtime};
use support::TestError;

/// A dependency that serves `capacity` requests at once (50 ms each) and answers 429 to any request
/// beyond, asking for 100 ms. Counts what it served, what it refused, and the effects per order.
struct Remote {
    capacity: AtomicU64,
    in_flight: AtomicU64,
    peak: AtomicU64,
    served: AtomicU64,
    refused: AtomicU64,
    effects: Mutex<HashMap<u64, u32>>,
}

impl Remote {
    fn new(capacity: u64) -> Remote {
        Remote {
            capacity: AtomicU64::new(capacity),
            in_flight: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            served: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            effects: Mutex::default(),
        }
    }

    async fn send(&self, order: u64) -> Result<u64, TestError> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        if now > self.capacity.load(Ordering::SeqCst) {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.refused.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(2)).await;
            return Err(TestError::RateLimited {
                retry_after_ms: 100,
            });
        }
        self.peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        *self.effects.lock().unwrap().entry(order).or_default() += 1;
        self.served.fetch_add(1, Ordering::SeqCst);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(order)
    }
}

struct Svc {
    rt: Runtime,
    payments: Remote,
    search: Remote,
}

impl Svc {
    fn new(limit: ConcurrencyLimit, capacity: u64) -> Arc<Svc> {
        Svc::on(limit, capacity, Arc::new(samekey::MemoryStore::new()))
    }

    /// A service over `store`, which another node may share.
    fn on(limit: ConcurrencyLimit, capacity: u64, store: Arc<dyn samekey::Store>) -> Arc<Svc> {
        Arc::new(Svc {
            rt: Runtime::builder()
                .node("limits")
                .clock(TokioClock::new())
                .jitter_seed(11)
                .concurrency_limit(limit)
                .retry_budget(samekey::limits::RetryBudget::unlimited())
                .shared_store(store)
                .build()
                .unwrap(),
            payments: Remote::new(capacity),
            search: Remote::new(1_000),
        })
    }

    #[idempotent(key = "order", scope = "limits.charge", runtime = &self.rt, retries = 10,
                 backoff = "20ms..200ms")]
    async fn charge(&self, order: u64) -> Result<u64, TestError> {
        self.payments.send(order).await
    }

    /// A charge with a timeout: its lease is the timeout and as long again (at least 1 s), and no
    /// renewal while it runs.
    #[idempotent(key = "order", scope = "limits.within", runtime = &self.rt, timeout = "1s",
                 on_unknown = "hold")]
    async fn charge_within(&self, order: u64) -> Result<u64, TestError> {
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.payments.send(order).await
    }

    /// Holds a place in the limit for 5 s.
    #[idempotent(key = "order", scope = "limits.hold", runtime = &self.rt)]
    async fn hold(&self, order: u64) -> Result<u64, TestError> {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok(order)
    }

    #[idempotent(key = "query", scope = "limits.search", runtime = &self.rt, retries = 3,
                 backoff = "20ms..200ms", budget = "search")]
    async fn search(&self, query: u64) -> Result<u64, TestError> {
        self.search.send(query).await
    }

    /// `bursts` bursts of `size` charges, one burst every 150 ms, each charge in a task of its own;
    /// answers (succeeded, overloaded, other failures).
    async fn load(self: &Arc<Self>, first: u64, bursts: u64, size: u64) -> (u64, u64, u64) {
        let mut running = tokio::task::JoinSet::new();
        for burst in 0..bursts {
            for n in 0..size {
                let svc = self.clone();
                let order = first + burst * size + n;
                running.spawn(async move { svc.charge(order).await });
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let (mut ok, mut overloaded, mut other) = (0, 0, 0);
        while let Some(done) = running.join_next().await {
            match done.expect("task") {
                Ok(_) => ok += 1,
                Err(TestError::Samekey(Error::Overloaded { .. })) => overloaded += 1,
                Err(e) => {
                    eprintln!("failed: {e}");
                    other += 1
                }
            }
        }
        (ok, overloaded, other)
    }

    fn no_double_effect(&self) {
        let effects = self.payments.effects.lock().unwrap();
        assert!(
            effects.values().all(|n| *n == 1),
            "an order took effect twice"
        );
    }
}

/// 50 bursts of 16 charges, one every 150 ms, against a capacity of 8 at once (50 ms each): the
/// dependency can serve them all, 8 at a time, but not all at once.
async fn run(limit: ConcurrencyLimit) -> (Arc<Svc>, (u64, u64, u64)) {
    let svc = Svc::new(limit, 8);
    let outcome = svc.load(0, 50, 16).await;
    (svc, outcome)
}

#[tokio::test(start_paused = true)]
async fn rate_limited_answers_lower_the_calls_in_flight() {
    let (limited, (ok, overloaded, other)) = run(ConcurrencyLimit::adaptive().max(64)).await;
    let (unlimited, (ok_off, _, other_off)) = run(ConcurrencyLimit::off()).await;
    let refused = limited.payments.refused.load(Ordering::SeqCst);
    let refused_off = unlimited.payments.refused.load(Ordering::SeqCst);
    println!(
        "capacity 8, 50 bursts of 16: adaptive limit → {refused} answers 429, {ok} succeeded, \
         {overloaded} refused by the limit, {other} failed (final limit {:?}); no limit → \
         {refused_off} answers 429, {ok_off} succeeded, {other_off} failed (retries spent)",
        limited.rt.concurrency_limit(None),
    );
    assert_eq!(
        (ok, overloaded, other),
        (800, 0, 0),
        "the limit only spaced the calls out: none waited its max_wait, none ran out of retries"
    );
    assert_eq!(ok_off + other_off, 800);
    assert_eq!(limited.rt.stats().overloaded, overloaded);
    assert_eq!(
        limited.payments.served.load(Ordering::SeqCst),
        ok,
        "every success took effect once, and nothing else did"
    );
    limited.no_double_effect();
    unlimited.no_double_effect();
    assert!(
        refused * 4 < refused_off,
        "the limiter should send far fewer requests into the rate limit: {refused} vs {refused_off}"
    );
    assert!(limited.rt.concurrency_limit(None).is_some());
}

#[tokio::test(start_paused = true)]
async fn a_call_that_finds_no_place_is_refused_before_it_claims() {
    let svc = Svc::new(
        ConcurrencyLimit::adaptive()
            .min(2)
            .max_wait(Duration::from_millis(10)),
        2,
    );
    // Three at once against a capacity of 2: the third is rate limited, and the limit drops to 2.
    let mut first = tokio::task::JoinSet::new();
    for n in 0..3 {
        let svc = svc.clone();
        first.spawn(async move { svc.charge(n).await });
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(svc.rt.concurrency_limit(None), Some(2));
    // Both places are taken (two served, one waiting out its 429): a fourth call waits 10 ms, then
    // is refused, with nothing claimed.
    let refused = svc.charge(99).await;
    assert!(
        matches!(refused, Err(TestError::Samekey(Error::Overloaded { ref dependency, limit: 2 })) if dependency == "runtime"),
        "{refused:?}"
    );
    assert_eq!(svc.rt.stats().overloaded, 1);
    let key = samekey::Key::build("limits.charge", &99u64);
    assert_eq!(
        svc.rt.store().get(&key, 0).await.unwrap(),
        None,
        "nothing claimed"
    );
    while let Some(done) = first.join_next().await {
        assert!(done.unwrap().is_ok());
    }
    // Later, the same key runs.
    assert_eq!(svc.charge(99).await.unwrap(), 99);
}

#[tokio::test(start_paused = true)]
async fn successes_open_the_limit_again() {
    let svc = Svc::new(ConcurrencyLimit::adaptive().max(16), 4);
    let (ok, _, other) = svc.load(0, 20, 8).await;
    assert_eq!(other, 0);
    assert!(ok > 0);
    let lowered = svc.rt.concurrency_limit(None).expect("limited");
    assert!(lowered <= 8, "limit {lowered}");
    // The dependency scales up: calls at the limit raise it until it opens.
    svc.payments.capacity.store(1_000, Ordering::SeqCst);
    let (ok, overloaded, other) = svc.load(10_000, 40, 20).await;
    assert_eq!((ok, overloaded, other), (800, 0, 0));
    assert_eq!(svc.rt.concurrency_limit(None), None, "unlimited again");
    svc.no_double_effect();
}

#[tokio::test(start_paused = true)]
async fn one_dependency_limit_does_not_slow_another() {
    let svc = Svc::new(ConcurrencyLimit::adaptive(), 2);
    let _ = svc.load(0, 10, 8).await;
    assert!(svc.rt.concurrency_limit(None).is_some());
    assert_eq!(svc.rt.concurrency_limit(Some("search")), None);
    let mut searches = tokio::task::JoinSet::new();
    for q in 0..50 {
        let svc = svc.clone();
        searches.spawn(async move { svc.search(q).await });
    }
    while let Some(done) = searches.join_next().await {
        assert!(done.unwrap().is_ok());
    }
    assert_eq!(
        svc.search.peak.load(Ordering::SeqCst),
        50,
        "all at once: search was never limited"
    );
}

/// Every `.await` is a place the caller can vanish: a call dropped while it waits for a place holds
/// nothing (no place, no claim), and a call dropped while its attempt runs gives its place back (its
/// claim is the drop guard's, as for any call).
#[tokio::test(start_paused = true)]
async fn a_dropped_call_gives_its_place_back() {
    let svc = Svc::new(
        ConcurrencyLimit::adaptive().max_wait(Duration::from_millis(10)),
        1,
    );
    // Two at once against a capacity of 1: one is rate limited, and the limit drops.
    let (a, b) = tokio::join!(svc.charge(1), svc.charge(2));
    assert_eq!((a.unwrap(), b.unwrap()), (1, 2));
    let limit = svc.rt.concurrency_limit(None).expect("limited") as u64;
    svc.payments.capacity.store(1_000, Ordering::SeqCst);
    // Every place taken by a call in flight (50 ms each); one more waits, and is dropped waiting.
    let holders = spawn_charges(&svc, 10, limit);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let waiting = tokio::time::timeout(Duration::from_millis(5), svc.charge(100)).await;
    assert!(waiting.is_err(), "still waiting for a place when dropped");
    let key = samekey::Key::build("limits.charge", &100u64);
    assert_eq!(
        svc.rt.store().get(&key, 0).await.unwrap(),
        None,
        "nothing claimed"
    );
    for done in holders.join_all().await {
        assert!(done.is_ok());
    }
    // A call dropped during its attempt.
    let dropped = tokio::time::timeout(Duration::from_millis(10), svc.charge(101)).await;
    assert!(dropped.is_err(), "dropped mid-attempt");
    // As many calls at once as the limit allows all find a place (a leaked place would leave one
    // waiting past its 10 ms, then refused, while the others take 50 ms).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let limit = svc.rt.concurrency_limit(None).map_or(16, u64::from);
    for done in spawn_charges(&svc, 200, limit).join_all().await {
        assert!(done.is_ok(), "{done:?}");
    }
    assert_eq!(svc.rt.stats().overloaded, 0);
    // The key of the call dropped mid-attempt was claimed and its attempt ran: it is not run twice.
    let _ = svc.charge(101).await;
    svc.no_double_effect();
}

/// A node of its own over `store` (another process sharing it), unlimited, with the same function as
/// [`Svc::charge_within`].
struct OtherNode {
    rt: Runtime,
    svc: Arc<Svc>,
}

impl OtherNode {
    #[idempotent(key = "order", scope = "limits.within", runtime = &self.rt, timeout = "1s",
                 on_unknown = "hold")]
    async fn charge_within(&self, order: u64) -> Result<u64, TestError> {
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.svc.payments.send(order).await
    }
}

/// A call that waited for a place claims its key at the time it claims it. Its lease (here its 1 s
/// timeout and 1 s more) counted from before a 5 s wait would already have ended: another node would
/// take the key over while the attempt runs, and charge twice.
#[tokio::test(start_paused = true)]
async fn a_call_that_waited_for_a_place_leases_its_key_from_its_claim() {
    let store: Arc<dyn samekey::Store> = Arc::new(samekey::MemoryStore::new());
    let svc = Svc::on(
        ConcurrencyLimit::adaptive().max_wait(Duration::from_secs(10)),
        1,
        store.clone(),
    );
    let other = OtherNode {
        rt: Runtime::builder()
            .node("other")
            .clock(TokioClock::new())
            .shared_store(store)
            .build()
            .unwrap(),
        svc: svc.clone(),
    };
    // Two at once against a capacity of 1: one is rate limited, and the limit drops.
    let (a, b) = tokio::join!(svc.charge(1), svc.charge(2));
    assert_eq!((a.unwrap(), b.unwrap()), (1, 2));
    let limit = svc.rt.concurrency_limit(None).expect("limited") as u64;
    svc.payments.capacity.store(1_000, Ordering::SeqCst);
    // Every place held for 5 s; one more call waits for a place, then claims order 20.
    let mut holders = tokio::task::JoinSet::new();
    for order in 10..10 + limit {
        let svc = svc.clone();
        holders.spawn(async move { svc.hold(order).await });
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    let waiting = {
        let svc = svc.clone();
        tokio::spawn(async move { svc.charge_within(20).await })
    };
    // While its attempt runs (it claimed at about 5 s), a duplicate on the other node.
    tokio::time::sleep(Duration::from_millis(5_200)).await;
    let duplicate = other.charge_within(20).await;
    assert_eq!(waiting.await.unwrap().unwrap(), 20);
    assert_eq!(duplicate.unwrap(), 20);
    for done in holders.join_all().await {
        assert!(done.is_ok());
    }
    svc.no_double_effect();
    assert_eq!(svc.payments.effects.lock().unwrap().get(&20), Some(&1));
}

/// `n` charges from `first` on, each in a task of its own.
fn spawn_charges(
    svc: &Arc<Svc>,
    first: u64,
    n: u64,
) -> tokio::task::JoinSet<Result<u64, TestError>> {
    let mut set = tokio::task::JoinSet::new();
    for order in first..first + n {
        let svc = svc.clone();
        set.spawn(async move { svc.charge(order).await });
    }
    set
}
