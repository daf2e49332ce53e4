//! The store conformance suite, written once and run against every backend: each function checks one
//! clause of the [`Store`] contract and panics (it is a test) when the store breaks it.
//!
//! A backend's test file runs the whole suite with one line; the expression makes a fresh store for each
//! test (it may share a database: every check uses keys and callIds of its own):
//!
//! ```text
//! samekey_runtime::store_conformance_tests!(std::sync::Arc::new(samekey_runtime::MemoryStore::new()));
//! ```

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::call_id::{CallId, TraceId};
use crate::compensation::{CompensationEntry, CompensationState};
use crate::error::StoreError;
use crate::journal::{Event, What, JOURNAL_LIMIT};
use crate::key::{Fingerprint, Key};
use crate::receipt::{Fence, ReceiptState, Transition};
use crate::store::{Claim, Claimed, Completion, Cursor, ReceiptQuery, Store, StoreClock};

/// A fixed point in time for the checks: 2024-03-09T16:00:00Z. A store that takes the caller's time
/// is driven from it; one that judges by its own clock ignores it, and the checks that need time to
/// pass sleep for real (briefly: their leases and TTLs are a few hundred ms).
pub const T0: u64 = 1_710_000_000_000;

/// The time of the checks that purge: a day before [`T0`], so that their purges (which evict every
/// record expired by then, in a database the checks may share) never reach another check's records.
pub const PURGE_T0: u64 = T0 - 86_400_000;

fn fresh_key(test: &str) -> Key {
    Key::build("samekey.conformance", &(test, TraceId::new().as_u128()))
}

fn call() -> CallId {
    CallId::new("conf", "suite").expect("valid labels")
}

fn claim(key: &Key, call_id: &CallId, now: u64, lease_ms: u64) -> Claim {
    Claim {
        key: key.clone(),
        call_id: call_id.clone(),
        fingerprint: Some(Fingerprint([7; 32])),
        lease_ms,
        now_ms: now,
    }
}

/// The checks' time: the caller's (`now`, moved by [`Timeline::pass`]) for a store that takes it, real
/// time for a store that judges by its own clock.
struct Timeline {
    now: u64,
    own_clock: bool,
}

impl Timeline {
    async fn of(store: &dyn Store, start: u64) -> Timeline {
        let own_clock = store.clock() == StoreClock::Own;
        let judged = store.now_ms(start).await.expect("the store's time");
        assert_eq!(
            judged == start,
            !own_clock,
            "a store that judges by the caller's clock answers the caller's time, and only it"
        );
        Timeline {
            now: start,
            own_clock,
        }
    }

    /// Lets `ms` pass: moves the caller's time, or sleeps while the store's own clock moves.
    async fn pass(&mut self, ms: u64) {
        if self.own_clock {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        self.now += ms;
    }

    /// The store's time now, as it judges it.
    async fn store_now(&self, store: &dyn Store) -> u64 {
        store.now_ms(self.now).await.expect("the store's time")
    }
}

async fn acquire(store: &dyn Store, key: &Key, call_id: &CallId, now: u64) -> Fence {
    match store.claim(claim(key, call_id, now, 1_000)).await {
        Ok(Claimed::Acquired(fence)) => fence,
        other => panic!("a fresh key must be acquired, got {other:?}"),
    }
}

fn success(payload: &[u8], ttl_ms: u64) -> Completion {
    Completion {
        state: ReceiptState::Success,
        outcome: Some(Arc::from(payload)),
        ttl_ms,
    }
}

/// Of many concurrent claims of one key, exactly one acquires it; the others see its record.
pub async fn claim_is_exclusive(store: Arc<dyn Store>) {
    let key = fresh_key("exclusive");
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (store, key) = (store.clone(), key.clone());
        set.spawn(async move {
            let me = call();
            let got = store.claim(claim(&key, &me, T0, 10_000)).await;
            (me, got)
        });
    }
    let mut winners = Vec::new();
    let mut seen = Vec::new();
    while let Some(joined) = set.join_next().await {
        let (me, got) = joined.expect("claim task");
        match got.expect("claim") {
            Claimed::Acquired(_) => winners.push(me),
            Claimed::Existing(record) => seen.push(record.call_id),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim must win");
    assert!(
        seen.iter().all(|c| c == &winners[0]),
        "losers see the winner's record"
    );
}

/// A claim records `PROCESSING` with the claimer's callId, lease and fingerprint.
pub async fn claim_records_processing(store: Arc<dyn Store>) {
    let key = fresh_key("processing");
    let me = call();
    let fence = acquire(&*store, &key, &me, T0).await;
    let record = store.get(&key, T0).await.expect("get").expect("record");
    assert_eq!(record.state, ReceiptState::Processing);
    assert_eq!(record.call_id, me);
    assert_eq!(record.fence, fence);
    assert_eq!(record.lease_until_ms, Some(record.updated_ms + 1_000));
    assert_eq!(record.created_ms, record.updated_ms);
    if !Timeline::of(&*store, T0).await.own_clock {
        assert_eq!(record.created_ms, T0);
    }
    assert_eq!(record.fingerprint, Some(Fingerprint([7; 32])));
    assert_eq!(record.key, key);
    let by_call = store.get_by_call_id(&me).await.expect("get_by_call_id");
    assert_eq!(by_call.map(|r| r.key), Some(key));
    assert_eq!(store.get_by_call_id(&call()).await.expect("get"), None);
}

/// A key's fences grow across its claims and take-overs, even after a release.
pub async fn fences_grow(store: Arc<dyn Store>) {
    let key = fresh_key("fence");
    let first = acquire(&*store, &key, &call(), T0).await;
    store.release(&key, first).await.expect("release");
    let second = acquire(&*store, &key, &call(), T0).await;
    assert!(second > first);
    store.mark_unknown(&key, second, T0).await.expect("mark");
    match store
        .take_over(&key, second, 500, T0)
        .await
        .expect("take over")
    {
        Claimed::Acquired(third) => assert!(third > second),
        other => panic!("an UNKNOWN record must be taken over, got {other:?}"),
    }
}

/// Completion is fenced, forward-only and re-entrant, and keeps the outcome.
pub async fn complete_is_fenced_and_reentrant(store: Arc<dyn Store>) {
    let key = fresh_key("complete");
    let fence = acquire(&*store, &key, &call(), T0).await;
    let stale = Fence(fence.0.wrapping_sub(1));
    assert!(matches!(
        store.complete(&key, stale, success(b"1", 60_000), T0).await,
        Err(StoreError::Fenced { .. })
    ));
    let first = store
        .complete(&key, fence, success(b"\"ok\"", 60_000), T0 + 5)
        .await;
    assert_eq!(first, Ok(Transition::Applied));
    let again = store
        .complete(&key, fence, success(b"\"ok\"", 60_000), T0 + 6)
        .await;
    assert_eq!(again, Ok(Transition::AlreadyApplied));
    let other = Completion {
        state: ReceiptState::Failed,
        outcome: None,
        ttl_ms: 60_000,
    };
    assert!(matches!(
        store.complete(&key, fence, other, T0 + 7).await,
        Err(StoreError::InvalidTransition { .. })
    ));
    assert!(matches!(
        store.mark_unknown(&key, fence, T0 + 8).await,
        Err(StoreError::InvalidTransition { .. })
    ));
    let record = store
        .get(&key, T0 + 10)
        .await
        .expect("get")
        .expect("record");
    assert_eq!(record.state, ReceiptState::Success);
    assert_eq!(record.outcome.as_deref(), Some(&b"\"ok\""[..]));
    assert_eq!(record.lease_until_ms, None);
    assert_eq!(record.expires_at_ms, Some(record.updated_ms + 60_000));
    if !Timeline::of(&*store, T0).await.own_clock {
        assert_eq!(record.updated_ms, T0 + 5);
    }
    assert!(matches!(
        store
            .complete(&fresh_key("none"), fence, success(b"1", 0), T0)
            .await,
        Err(StoreError::NotFound)
    ));
}

/// What a callback delivery asks of a store ([`Runtime::apply_callback`](crate::Runtime::apply_callback)):
/// of two deliveries racing for an `UNKNOWN` call, one takes it over and moves it forward; the owner
/// that left it is fenced out; a finished receipt is never taken over again and never moved to
/// another outcome (`SUCCESS` → `FAILED` and `FAILED` → `SUCCESS` are refused).
pub async fn callback_transitions(store: Arc<dyn Store>) {
    let time = Timeline::of(&*store, T0).await;
    for (to, other) in [
        (ReceiptState::Success, ReceiptState::Failed),
        (ReceiptState::Failed, ReceiptState::Success),
    ] {
        let key = fresh_key("callback");
        let owner = acquire(&*store, &key, &call(), time.now).await;
        store
            .mark_unknown(&key, owner, time.now)
            .await
            .expect("mark unknown");
        let (a, b) = tokio::join!(
            store.take_over(&key, owner, 30_000, time.now),
            store.take_over(&key, owner, 30_000, time.now)
        );
        let taken: Vec<Fence> = [a.expect("take over"), b.expect("take over")]
            .into_iter()
            .filter_map(|c| match c {
                Claimed::Acquired(fence) => Some(fence),
                Claimed::Existing(_) => None,
            })
            .collect();
        let [delivery] = taken[..] else {
            panic!("exactly one of two deliveries takes an UNKNOWN call over, got {taken:?}");
        };
        let completion = |state| Completion {
            state,
            outcome: Some(Arc::from(&b"\"paid\""[..])),
            ttl_ms: 60_000,
        };
        assert!(matches!(
            store.complete(&key, owner, completion(to), time.now).await,
            Err(StoreError::Fenced { .. })
        ));
        assert_eq!(
            store
                .complete(&key, delivery, completion(to), time.now)
                .await,
            Ok(Transition::Applied)
        );
        assert!(matches!(
            store
                .complete(&key, delivery, completion(other), time.now)
                .await,
            Err(StoreError::InvalidTransition { .. })
        ));
        match store
            .take_over(&key, delivery, 30_000, time.now + 60_000)
            .await
            .expect("take over")
        {
            Claimed::Existing(r) => assert_eq!(r.state, to),
            other => panic!("a finished receipt must not be taken over, got {other:?}"),
        }
        let record = store
            .get(&key, time.now)
            .await
            .expect("get")
            .expect("record");
        assert_eq!((record.state, record.fence), (to, delivery));
    }
}

/// `UNKNOWN` is kept without expiry and moves forward to an outcome.
pub async fn unknown_moves_forward(store: Arc<dyn Store>) {
    let key = fresh_key("unknown");
    let fence = acquire(&*store, &key, &call(), T0).await;
    assert_eq!(
        store.mark_unknown(&key, fence, T0 + 1).await,
        Ok(Transition::Applied)
    );
    assert_eq!(
        store.mark_unknown(&key, fence, T0 + 2).await,
        Ok(Transition::AlreadyApplied)
    );
    let record = store.get(&key, T0 + 3).await.expect("get").expect("record");
    assert_eq!(record.state, ReceiptState::Unknown);
    assert_eq!(record.expires_at_ms, None);
    assert_eq!(
        store.complete(&key, fence, success(b"2", 10), T0 + 4).await,
        Ok(Transition::Applied)
    );
}

/// Releasing a claim frees the key; only the owner may, and only while `PROCESSING`.
pub async fn release_frees_the_key(store: Arc<dyn Store>) {
    let key = fresh_key("release");
    let fence = acquire(&*store, &key, &call(), T0).await;
    assert!(matches!(
        store
            .release(&key, Fence(fence.0.wrapping_add(1_000_000)))
            .await,
        Err(StoreError::Fenced { .. })
    ));
    store.release(&key, fence).await.expect("release");
    assert_eq!(store.get(&key, T0).await.expect("get"), None);
    store
        .release(&key, fence)
        .await
        .expect("a second release changes nothing");
    let again = acquire(&*store, &key, &call(), T0).await;
    assert!(again > fence);
    store
        .complete(&key, again, success(b"3", 1_000), T0)
        .await
        .expect("complete");
    assert!(matches!(
        store.release(&key, again).await,
        Err(StoreError::InvalidTransition { .. })
    ));
}

/// Records are found by callIds a batch at a time: those the store holds, none for a callId it does not
/// know or whose claim was given back.
pub async fn receipts_are_found_by_call_ids(store: Arc<dyn Store>) {
    let (a, b, released, stranger) = (call(), call(), call(), call());
    let keys: Vec<Key> = (0..3).map(|i| fresh_key(&format!("by-ids-{i}"))).collect();
    let fa = acquire(&*store, &keys[0], &a, T0).await;
    store
        .complete(&keys[0], fa, success(b"1", 60_000), T0)
        .await
        .expect("complete");
    acquire(&*store, &keys[1], &b, T0).await;
    let fr = acquire(&*store, &keys[2], &released, T0).await;
    store.release(&keys[2], fr).await.expect("release");
    let asked = [a.clone(), stranger, released, b.clone()];
    let mut found: Vec<CallId> = store
        .get_by_call_ids(&asked)
        .await
        .expect("by callIds")
        .into_iter()
        .map(|r| r.call_id)
        .collect();
    found.sort_by(|x, y| x.as_str().cmp(y.as_str()));
    let mut want = vec![a, b];
    want.sort_by(|x, y| x.as_str().cmp(y.as_str()));
    assert_eq!(found, want);
    assert!(store.get_by_call_ids(&[]).await.expect("none").is_empty());
}

/// Forgetting a finished call frees its key for a new call; only the record's own fence may, only
/// once the call finished (`SUCCESS` or `FAILED`), and the key's journal stays.
pub async fn forget_frees_a_finished_key(store: Arc<dyn Store>) {
    let key = fresh_key("forget");
    let first = call();
    let fence = acquire(&*store, &key, &first, T0).await;
    assert!(
        matches!(
            store.forget(&key, fence).await,
            Err(StoreError::InvalidTransition { .. })
        ),
        "a PROCESSING call may be running: not forgotten"
    );
    store
        .append_journal(&key, &[note(&first, 1)], 60_000, T0)
        .await
        .expect("append");
    store
        .complete(&key, fence, success(b"1", 60_000), T0)
        .await
        .expect("complete");
    assert!(matches!(
        store
            .forget(&key, Fence(fence.0.wrapping_add(1_000_000)))
            .await,
        Err(StoreError::Fenced { .. })
    ));
    store.forget(&key, fence).await.expect("forget");
    assert_eq!(store.get(&key, T0).await.expect("get"), None);
    assert_eq!(store.get_by_call_id(&first).await.expect("get"), None);
    assert!(
        matches!(store.forget(&key, fence).await, Err(StoreError::NotFound)),
        "forgotten once: nothing is left to forget"
    );
    assert_eq!(
        store.journal(&key, T0).await.expect("journal"),
        vec![note(&first, 1)],
        "the journal outlives the forgotten record"
    );
    let second = call();
    let again = acquire(&*store, &key, &second, T0).await;
    assert!(
        again > fence,
        "a new call claims the key, under a larger fence"
    );
    let unknown = store.mark_unknown(&key, again, T0).await.expect("unknown");
    assert_eq!(unknown, Transition::Applied);
    assert!(
        matches!(
            store.forget(&key, again).await,
            Err(StoreError::InvalidTransition { .. })
        ),
        "an UNKNOWN call may have taken effect: not forgotten"
    );
}

/// Take-over: refused while the lease is alive or when the fence moved on; allowed after the lease or
/// from `UNKNOWN`, keeping the callId; the stale owner is fenced out afterwards.
pub async fn take_over_rules(store: Arc<dyn Store>) {
    let key = fresh_key("takeover");
    let owner = call();
    let mut time = Timeline::of(&*store, T0).await;
    let fence = match store
        .claim(claim(&key, &owner, time.now, 300))
        .await
        .expect("claim")
    {
        Claimed::Acquired(fence) => fence,
        other => panic!("a fresh key must be acquired, got {other:?}"),
    };
    match store
        .take_over(&key, fence, 5_000, time.now + 10)
        .await
        .expect("take over")
    {
        Claimed::Existing(r) => assert_eq!(r.fence, fence),
        other => panic!("a live lease must not be taken over, got {other:?}"),
    }
    time.pass(301).await;
    let newer = match store
        .take_over(&key, fence, 5_000, time.now)
        .await
        .expect("take over")
    {
        Claimed::Acquired(f) => f,
        other => panic!("an expired lease must be taken over, got {other:?}"),
    };
    assert!(newer > fence);
    let record = store
        .get(&key, time.now)
        .await
        .expect("get")
        .expect("record");
    assert_eq!(record.state, ReceiptState::Processing);
    assert_eq!(record.call_id, owner, "take-over keeps the recorded callId");
    assert_eq!(record.lease_until_ms, Some(record.updated_ms + 5_000));
    // What tells a taker's record from the claim as written (`crate::unanswered`).
    assert!(
        record.updated_ms > record.created_ms,
        "a take-over updates the record: {record:?}"
    );
    match store
        .take_over(&key, fence, 5_000, time.now + 9_000)
        .await
        .expect("take over")
    {
        Claimed::Existing(r) => assert_eq!(r.fence, newer),
        other => panic!("a stale expected fence must not take over, got {other:?}"),
    }
    assert!(matches!(
        store
            .complete(&key, fence, success(b"4", 60_000), time.now)
            .await,
        Err(StoreError::Fenced { .. })
    ));
    assert!(matches!(
        store
            .take_over(&fresh_key("absent"), fence, 0, time.now)
            .await,
        Err(StoreError::NotFound)
    ));
}

/// Leases extend for their owner only, to the given length from now.
pub async fn extend_lease_is_fenced(store: Arc<dyn Store>) {
    let key = fresh_key("lease");
    let fence = acquire(&*store, &key, &call(), T0).await;
    let time = Timeline::of(&*store, T0).await;
    let before = time.store_now(&*store).await;
    store
        .extend_lease(&key, fence, 9_000, T0)
        .await
        .expect("extend");
    let after = time.store_now(&*store).await;
    let record = store.get(&key, T0).await.expect("get").expect("record");
    let until = record.lease_until_ms.expect("a lease");
    assert!(
        (before + 9_000..=after + 9_000).contains(&until),
        "lease until {until}, asked at {before}..{after} for 9 s"
    );
    assert!(matches!(
        store
            .extend_lease(&key, Fence(fence.0.wrapping_add(1_000_000)), 0, T0)
            .await,
        Err(StoreError::Fenced { .. })
    ));
}

/// Finished records expire at their TTL: then the key may be claimed anew and purging evicts them.
pub async fn ttl_expiry(store: Arc<dyn Store>) {
    let key = fresh_key("ttl");
    let mut time = Timeline::of(&*store, PURGE_T0).await;
    let fence = acquire(&*store, &key, &call(), time.now).await;
    store
        .complete(&key, fence, success(b"5", 300), time.now)
        .await
        .expect("complete");
    assert!(store.get(&key, time.now).await.expect("get").is_some());
    match store
        .claim(claim(&key, &call(), time.now + 50, 1_000))
        .await
        .expect("claim")
    {
        Claimed::Existing(r) => assert_eq!(r.state, ReceiptState::Success),
        other => panic!("a live record must be returned, got {other:?}"),
    }
    time.pass(300).await;
    assert_eq!(store.get(&key, time.now).await.expect("get"), None);
    let renewed = acquire(&*store, &key, &call(), time.now).await;
    assert!(renewed > fence);
    // Made after the last claim, which may evict expired records on its own (the in-memory store does).
    let other = fresh_key("ttl-purge");
    let f = acquire(&*store, &other, &call(), time.now).await;
    store
        .complete(&other, f, success(b"6", 100), time.now)
        .await
        .expect("complete");
    time.pass(100).await;
    let counted = store.count_expired(time.now).await.expect("count");
    assert!(
        counted >= 1 || time.own_clock,
        "a dry run counts the expired record"
    );
    let purged = store.purge_expired(time.now).await.expect("purge");
    // A store that several nodes share may be shared by the other checks too: one of their purges may
    // have evicted it first.
    assert!(
        purged >= 1 || time.own_clock,
        "the expired record is purged"
    );
    assert_eq!(store.get(&other, time.now).await.expect("get"), None);
    assert!(
        store
            .get(&key, time.now + 100)
            .await
            .expect("get")
            .is_some(),
        "claims never expire"
    );
}

/// A waiter on a busy key wakes when it settles, and returns the record as it is on timeout.
pub async fn wait_settled_wakes(store: Arc<dyn Store>) {
    let key = fresh_key("wait");
    let fence = acquire(&*store, &key, &call(), T0).await;
    let timed_out = store
        .wait_settled(&key, Duration::from_millis(30), T0)
        .await
        .expect("wait")
        .expect("record");
    assert_eq!(timed_out.state, ReceiptState::Processing);
    let completer = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            store.complete(&key, fence, success(b"7", 60_000), T0).await
        })
    };
    let settled = store
        .wait_settled(&key, Duration::from_secs(10), T0)
        .await
        .expect("wait")
        .expect("record");
    assert_eq!(settled.state, ReceiptState::Success);
    assert_eq!(completer.await.expect("join"), Ok(Transition::Applied));
    let gone = fresh_key("wait-gone");
    assert_eq!(
        store
            .wait_settled(&gone, Duration::from_secs(10), T0)
            .await
            .expect("wait"),
        None
    );
}

/// The compensation queue: once per callId, leased to one taker under a worker fence, rescheduled,
/// escalated, finished; a worker whose lease lapsed and whose entry was taken again is refused.
pub async fn compensation_queue(store: Arc<dyn Store>) {
    let key = fresh_key("comp");
    let (a, b) = (call(), call());
    let mut time = Timeline::of(&*store, T0).await;
    let entry = |id: &CallId, now| CompensationEntry::new(id.clone(), key.clone(), "test", now);
    store
        .enqueue_compensation(entry(&a, time.now))
        .await
        .expect("enqueue");
    store
        .enqueue_compensation(entry(&a, time.now + 1))
        .await
        .expect("enqueue twice");
    // `b` carries what a worker needs to act, and keeps it through every move below.
    let mut carrying = entry(&b, time.now + 2);
    carrying.attempts = 3;
    carrying.last_error = Some(crate::journal::AttemptOutcome::TimedOut);
    carrying.encoded_inputs = Some(Arc::from(&br#"["o-1",700]"#[..]));
    store
        .enqueue_compensation(carrying.clone())
        .await
        .expect("enqueue");
    let carries = |e: &CompensationEntry| {
        e.attempts == carrying.attempts
            && e.last_error == carrying.last_error
            && e.encoded_inputs == carrying.encoded_inputs
    };
    let mine = |entries: Vec<CompensationEntry>| -> Vec<CompensationEntry> {
        entries
            .into_iter()
            .filter(|e| e.call_id == a || e.call_id == b)
            .collect()
    };
    let listed = mine(store.list_compensations().await.expect("list"));
    assert_eq!(
        listed.iter().map(|e| &e.call_id).collect::<Vec<_>>(),
        [&a, &b],
        "one entry per callId, oldest first"
    );
    assert!(listed.iter().all(|e| e.fence == Fence(0)), "never taken");
    assert!(
        carries(&listed[1]),
        "an entry keeps its attempts, last error and inputs: {listed:?}"
    );
    assert_eq!((listed[0].attempts, listed[0].last_error), (0, None));
    assert_eq!(listed[0].encoded_inputs, None);
    time.pass(10).await;
    let taken = mine(
        store
            .take_due_compensations(time.now, 100, 300)
            .await
            .expect("take"),
    );
    assert_eq!(taken.len(), 2);
    assert!(taken.iter().any(carries), "taken entries keep them too");
    assert!(taken
        .iter()
        .all(|e| matches!(e.state, CompensationState::Taken { .. }) && e.fence > Fence(0)));
    let first = taken
        .iter()
        .find(|e| e.call_id == a)
        .expect("a taken")
        .fence;
    let b_fence = taken
        .iter()
        .find(|e| e.call_id == b)
        .expect("b taken")
        .fence;
    let again = mine(
        store
            .take_due_compensations(time.now + 1, 100, 300)
            .await
            .expect("take"),
    );
    assert!(again.is_empty(), "leased entries stay with their taker");

    // The lease lapses; another worker takes `a` under a larger fence, and the first is refused.
    time.pass(400).await;
    let retaken = mine(
        store
            .take_due_compensations(time.now, 100, 60_000)
            .await
            .expect("take"),
    );
    let second = retaken
        .iter()
        .find(|e| e.call_id == a)
        .expect("a is due again once its lease lapsed")
        .fence;
    assert!(second > first, "a new take, a larger fence");
    let b_fence = retaken
        .iter()
        .find(|e| e.call_id == b)
        .map_or(b_fence, |e| e.fence);
    assert!(matches!(
        store
            .reschedule_compensation(&a, first, 1, 5_000, time.now)
            .await,
        Err(StoreError::Fenced { .. })
    ));
    assert!(matches!(
        store.escalate_compensation(&a, first, time.now).await,
        Err(StoreError::Fenced { .. })
    ));
    assert!(matches!(
        store.finish_compensation(&a, Some(first)).await,
        Err(StoreError::Fenced { .. })
    ));
    store
        .reschedule_compensation(&a, second, 1, 5_000, time.now)
        .await
        .expect("the holder reschedules");
    store
        .escalate_compensation(&b, b_fence, time.now)
        .await
        .expect("the holder escalates");
    time.pass(1_000).await;
    let later = mine(
        store
            .take_due_compensations(time.now, 100, 60_000)
            .await
            .expect("take"),
    );
    assert!(later.is_empty(), "not due yet, or manual");
    let all = mine(store.list_compensations().await.expect("list"));
    let a_entry = all.iter().find(|e| e.call_id == a).expect("a stays");
    assert_eq!(
        (a_entry.round, a_entry.state),
        (1, CompensationState::Pending)
    );
    let b_entry = all.iter().find(|e| e.call_id == b).expect("b stays");
    assert_eq!(b_entry.state, CompensationState::Manual);
    store
        .finish_compensation(&a, Some(second))
        .await
        .expect("the holder finishes");
    store
        .finish_compensation(&a, Some(second))
        .await
        .expect("finish twice");
    store
        .finish_compensation(&b, None)
        .await
        .expect("a person finishes a manual entry");
    assert!(mine(store.list_compensations().await.expect("list")).is_empty());
    assert!(matches!(
        store
            .reschedule_compensation(&a, second, 2, 0, time.now)
            .await,
        Err(StoreError::NotFound)
    ));
    compensation_take_is_exclusive(store).await;
}

/// Of many workers taking due entries at once, each entry goes to exactly one. (Part of
/// [`compensation_queue`]: a store's queue is shared, and two checks taking from it at once would take
/// each other's entries.)
async fn compensation_take_is_exclusive(store: Arc<dyn Store>) {
    let key = fresh_key("comp-race");
    let time = Timeline::of(&*store, T0).await;
    let ids: Vec<CallId> = (0..20).map(|_| call()).collect();
    for id in &ids {
        store
            .enqueue_compensation(CompensationEntry::new(
                id.clone(),
                key.clone(),
                "race",
                time.now,
            ))
            .await
            .expect("enqueue");
    }
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let store = store.clone();
        let now = time.now + 10;
        set.spawn(async move { store.take_due_compensations(now, 5, 60_000).await });
    }
    let mut taken = Vec::new();
    while let Some(joined) = set.join_next().await {
        taken.extend(
            joined
                .expect("task")
                .expect("take")
                .into_iter()
                .filter(|e| ids.contains(&e.call_id))
                .map(|e| e.call_id),
        );
    }
    let mut unique = taken.clone();
    unique.sort_by_key(CallId::to_string);
    unique.dedup();
    assert_eq!(unique.len(), taken.len(), "an entry went to two workers");
    for id in &ids {
        store.finish_compensation(id, None).await.expect("finish");
    }
}

/// Receipts are listed by creation time in pages that follow each other without gaps or repeats,
/// filtered by scope and state; released keys and expired receipts are not listed.
pub async fn receipts_are_listed(store: Arc<dyn Store>) {
    let scope = format!("samekey.listing.{:x}", TraceId::new().as_u128());
    let mut time = Timeline::of(&*store, T0).await;
    let start = store.now_ms(time.now).await.expect("the store's time");
    let mut keys = Vec::new();
    let mut fences = Vec::new();
    for i in 0..7u32 {
        let key = Key::build(&scope, &i);
        let fence = acquire(&*store, &key, &call(), time.now).await;
        keys.push(key);
        fences.push(fence);
        time.pass(2).await;
    }
    // Two succeed, one is released (no longer a receipt), one expires soon.
    for i in [0, 1] {
        store
            .complete(&keys[i], fences[i], success(b"1", 600_000), time.now)
            .await
            .expect("complete");
    }
    store.release(&keys[2], fences[2]).await.expect("release");
    store
        .complete(&keys[3], fences[3], success(b"1", 100), time.now)
        .await
        .expect("complete");
    time.pass(300).await;
    let query = ReceiptQuery::created_between(start.saturating_sub(60_000), start + 3_600_000)
        .scope(scope.clone())
        .limit(2);
    let mut listed = Vec::new();
    let mut page_query = query.clone();
    let mut pages = 0;
    loop {
        let page = store
            .list_receipts(&page_query, time.now)
            .await
            .expect("list");
        pages += 1;
        listed.extend(page.receipts);
        match page.next {
            Some(next) => page_query = query.clone().after(next),
            None => break,
        }
        assert!(pages < 100, "pages never end");
    }
    let expected: Vec<Key> = [0, 1, 4, 5, 6].iter().map(|&i| keys[i].clone()).collect();
    let mut got: Vec<Key> = listed.iter().map(|r| r.key.clone()).collect();
    let cursors: Vec<Cursor> = listed.iter().map(Cursor::of).collect();
    assert!(
        cursors.windows(2).all(|w| w[0] < w[1]),
        "in order, without repeats"
    );
    got.sort_by_key(|k| *k.digest());
    let mut want = expected.clone();
    want.sort_by_key(|k| *k.digest());
    assert_eq!(got, want, "every receipt once; no released, no expired one");
    let succeeded = store
        .list_receipts(
            &query.clone().limit(1_000).states([ReceiptState::Success]),
            time.now,
        )
        .await
        .expect("list");
    assert_eq!(succeeded.receipts.len(), 2);
    assert!(succeeded.next.is_none());
    // The widest range lists the same: bounds past what a store can hold mean "no bound".
    let everything = store
        .list_receipts(
            &ReceiptQuery::created_between(0, u64::MAX)
                .scope(scope.clone())
                .limit(1_000),
            time.now,
        )
        .await
        .expect("list the widest range");
    assert_eq!(everything.receipts.len(), expected.len());
    let other_scope = store
        .list_receipts(&query.clone().scope("samekey.nothing.here"), time.now)
        .await
        .expect("list");
    assert!(other_scope.receipts.is_empty());
}

/// A day listed in pages of many receipts: every receipt once, in order, whatever page size (a
/// backend that merges several indexes must merge them right).
pub async fn receipts_are_paged(store: Arc<dyn Store>) {
    let scope = format!("samekey.paging.{:x}", TraceId::new().as_u128());
    let time = Timeline::of(&*store, T0).await;
    let start = store.now_ms(time.now).await.expect("the store's time");
    let mut claims = tokio::task::JoinSet::new();
    for i in 0..400u32 {
        let (store, key) = (store.clone(), Key::build(&scope, &i));
        let now = time.now + u64::from(i % 7);
        claims.spawn(async move { acquire(&*store, &key, &call(), now).await });
    }
    while let Some(claimed) = claims.join_next().await {
        claimed.expect("claim");
    }
    let day = ReceiptQuery::created_between(start.saturating_sub(60_000), start + 3_600_000);
    let one_scope = day.clone().scope(scope.clone());
    for (query, limit) in [(one_scope.clone(), 40), (one_scope, 7), (day, 1_000)] {
        let mut query = query.limit(limit);
        let mut seen = Vec::new();
        loop {
            let page = store.list_receipts(&query, time.now).await.expect("list");
            seen.extend(
                page.receipts
                    .iter()
                    .filter(|r| r.key.scope() == scope)
                    .map(Cursor::of),
            );
            match page.next {
                Some(next) => query = query.after(next),
                None => break,
            }
        }
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            seen, sorted,
            "pages in order, each receipt once (limit {limit})"
        );
        assert_eq!(seen.len(), 400, "every receipt (limit {limit})");
    }
}

/// A record still `PROCESSING` after its owner's lease is an orphan (the owner crashed) until someone
/// resolves it; a live claim, an `UNKNOWN` one and a finished one are not.
pub async fn orphans_are_listed(store: Arc<dyn Store>) {
    let (crashed, alive, finished) = (fresh_key("orphan"), fresh_key("alive"), fresh_key("done"));
    let mut time = Timeline::of(&*store, T0).await;
    let mine = |records: Vec<crate::receipt::Receipt>| -> Vec<Key> {
        records
            .into_iter()
            .map(|r| r.key)
            .filter(|k| k == &crashed || k == &alive || k == &finished)
            .collect()
    };
    let claim_for = |key: &Key, now, lease| {
        let store = store.clone();
        let claim = claim(key, &call(), now, lease);
        async move {
            match store.claim(claim).await.expect("claim") {
                Claimed::Acquired(fence) => fence,
                Claimed::Existing(r) => panic!("fresh key held: {r:?}"),
            }
        }
    };
    // Leases long enough for a store that scans its whole keyspace to list (Redis).
    claim_for(&crashed, time.now, 1_000).await;
    let done = claim_for(&finished, time.now, 1_000).await;
    let early = store.list_orphans(time.now, 10_000).await.expect("list");
    assert!(
        mine(early.clone()).is_empty(),
        "leases still running: {early:?}"
    );
    store
        .complete(&finished, done, success(b"1", 60_000), time.now)
        .await
        .expect("complete");
    time.pass(1_100).await;
    claim_for(&alive, time.now, 60_000).await;
    let listed = store.list_orphans(time.now, 10_000).await.expect("list");
    let orphan = listed
        .iter()
        .find(|r| r.key == crashed)
        .expect("the crashed owner's record")
        .clone();
    assert_eq!(
        mine(listed),
        std::slice::from_ref(&crashed),
        "only the crashed owner's record"
    );
    store
        .enqueue_compensation(CompensationEntry::new(
            orphan.call_id.clone(),
            crashed.clone(),
            "orphan",
            time.now,
        ))
        .await
        .expect("enqueue");
    assert!(
        mine(store.list_orphans(time.now, 10_000).await.expect("list")).is_empty(),
        "a queued orphan is not listed again"
    );
    store
        .finish_compensation(&orphan.call_id, None)
        .await
        .expect("finish");
}

/// Of many concurrent take-overs of one uncertain record, exactly one wins; the stale owner's writes
/// are all refused afterwards.
pub async fn take_over_is_exclusive_and_fences_out(store: Arc<dyn Store>) {
    let key = fresh_key("takeover-race");
    let owner = call();
    let old = acquire(&*store, &key, &owner, T0).await;
    store.mark_unknown(&key, old, T0 + 1).await.expect("mark");
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let (store, key) = (store.clone(), key.clone());
        set.spawn(async move { store.take_over(&key, old, 10_000, T0 + 2).await });
    }
    let mut winners = Vec::new();
    while let Some(joined) = set.join_next().await {
        if let Claimed::Acquired(f) = joined.expect("task").expect("take over") {
            winners.push(f);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one take-over wins");
    assert!(matches!(
        store.mark_unknown(&key, old, T0 + 3).await,
        Err(StoreError::Fenced { .. })
    ));
    assert!(matches!(
        store.release(&key, old).await,
        Err(StoreError::Fenced { .. })
    ));
    assert!(matches!(
        store.extend_lease(&key, old, 20_000, T0 + 3).await,
        Err(StoreError::Fenced { .. })
    ));
    let record = store
        .get_by_call_id(&owner)
        .await
        .expect("get")
        .expect("record");
    assert_eq!(
        record.fence, winners[0],
        "the receipt follows the take-over"
    );
    assert_eq!(record.state, ReceiptState::Processing);
}

/// A waiter wakes when the claim is released (and then finds no record).
pub async fn wait_settled_wakes_on_release(store: Arc<dyn Store>) {
    let key = fresh_key("wait-release");
    let fence = acquire(&*store, &key, &call(), T0).await;
    let releaser = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            store.release(&key, fence).await
        })
    };
    let after = store
        .wait_settled(&key, Duration::from_secs(10), T0)
        .await
        .expect("wait");
    assert_eq!(after, None);
    releaser.await.expect("join").expect("release");
}

/// Says that a suite did not run, and why: prints `skipped: {reason}` on standard error, once per reason
/// in a test process. It writes past the test harness's output capture (which hides a passing test's
/// `println!`), so that a plain `cargo test` shows what it did not test. Suites that need a server call
/// it when the server's URL is not set.
pub fn skipped(reason: &str) {
    static SAID: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let mut said = SAID.lock().unwrap_or_else(PoisonError::into_inner);
    if said.insert(reason.to_owned()) {
        // Nothing to do if standard error is gone.
        let _ = writeln!(std::io::stderr().lock(), "skipped: {reason}");
    }
}

fn note(call_id: &CallId, n: u64) -> Event {
    Event {
        call_id: call_id.clone(),
        at_ms: T0 + n,
        node: "suite".into(),
        what: What::Backoff {
            attempt: u32::try_from(n).unwrap_or(u32::MAX),
            delay_ms: n,
        },
    }
}

/// The keys that have a journal are listed in digest order, paged; a key with no journal is not.
pub async fn journaled_keys_are_listed(store: Arc<dyn Store>) {
    let mut keys: Vec<Key> = (0..5)
        .map(|i| fresh_key(&format!("journaled-{i}")))
        .collect();
    for key in &keys {
        store
            .append_journal(key, &[note(&call(), 1)], 60_000, T0)
            .await
            .expect("append");
    }
    let silent = fresh_key("journaled-none");
    acquire(&*store, &silent, &call(), T0).await;
    keys.sort_by_key(|k| *k.digest());
    // Other tests share the store: walk every page, keep the keys of this test.
    let (mut after, mut seen) = (None, Vec::new());
    loop {
        let page = store.journaled_keys(after, 2).await.expect("list");
        assert!(page.len() <= 2, "a page holds at most its limit");
        let Some(last) = page.last() else { break };
        after = Some(*last.digest());
        seen.extend(page.iter().map(|k| *k.digest()));
    }
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "in digest order, once each"
    );
    let mine: Vec<[u8; 32]> = seen
        .into_iter()
        .filter(|d| keys.iter().any(|k| k.digest() == d) || d == silent.digest())
        .collect();
    let want: Vec<[u8; 32]> = keys.iter().map(|k| *k.digest()).collect();
    assert_eq!(
        mine, want,
        "every journaled key, and no key without a journal"
    );
}

/// The journal keeps a key's events in the order they were appended, readable by key and by callId,
/// bounded to the latest [`JOURNAL_LIMIT`]; a callId nobody journaled has no events.
pub async fn journal_is_kept_in_order(store: Arc<dyn Store>) {
    let key = fresh_key("journal");
    let first = call();
    let fence = acquire(&*store, &key, &first, T0).await;
    let events: Vec<Event> = (1..=3).map(|n| note(&first, n)).collect();
    store
        .append_journal(&key, &events[..2], 60_000, T0)
        .await
        .expect("append");
    store
        .append_journal(&key, &events[2..], 60_000, T0)
        .await
        .expect("append");
    store
        .append_journal(&key, &[], 60_000, T0)
        .await
        .expect("an empty append changes nothing");
    assert_eq!(store.journal(&key, T0).await.expect("journal"), events);
    assert_eq!(
        store.journal_of_call(&first, T0).await.expect("journal"),
        events,
        "a call in flight is read by its callId"
    );
    assert_eq!(
        store.journal_of_call(&call(), T0).await.expect("journal"),
        Vec::new(),
        "a callId nobody journaled has no events"
    );
    // A second call on the key after the first gave it back: the key's journal holds both, each
    // callId its own.
    store.release(&key, fence).await.expect("release");
    let second = call();
    acquire(&*store, &key, &second, T0).await;
    store
        .append_journal(&key, &[note(&second, 4)], 60_000, T0)
        .await
        .expect("append");
    let both = store.journal(&key, T0).await.expect("journal");
    assert_eq!(both.len(), 4);
    assert_eq!(both[3].call_id, second);
    assert_eq!(
        store.journal_of_call(&first, T0).await.expect("journal"),
        events,
        "a call given back is still read by its callId"
    );
    assert_eq!(
        store.journal_of_call(&second, T0).await.expect("journal"),
        vec![note(&second, 4)]
    );
    // Bounded: the latest events are kept.
    let many: Vec<Event> = (10..10 + JOURNAL_LIMIT as u64 + 5)
        .map(|n| note(&second, n))
        .collect();
    store
        .append_journal(&key, &many[..10], 60_000, T0)
        .await
        .expect("append");
    store
        .append_journal(&key, &many[10..], 60_000, T0)
        .await
        .expect("append");
    let kept = store.journal(&key, T0).await.expect("journal");
    assert_eq!(kept.len(), JOURNAL_LIMIT, "a key keeps its latest events");
    assert_eq!(kept[..], many[many.len() - JOURNAL_LIMIT..]);
}

/// A key's journal lives as long as its record — a claim without expiry outlives the `keep_ms` of
/// its events, a finished record keeps them until it expires — and at least `keep_ms` after the
/// latest append, also once the record is given back; a purge keeps both.
pub async fn journal_lives_with_its_record(store: Arc<dyn Store>) {
    let mut time = Timeline::of(&*store, PURGE_T0).await;
    let key = fresh_key("journal-life");
    let me = call();
    let fence = acquire(&*store, &key, &me, time.now).await;
    store
        .append_journal(&key, &[note(&me, 1)], 100, time.now)
        .await
        .expect("append");
    time.pass(250).await;
    store.purge_expired(time.now).await.expect("purge");
    assert_eq!(
        store.journal(&key, time.now).await.expect("journal").len(),
        1,
        "a call in flight keeps its journal past keep_ms"
    );
    store
        .complete(&key, fence, success(b"1", 5_000), time.now)
        .await
        .expect("complete");
    time.pass(150).await;
    store.purge_expired(time.now).await.expect("purge");
    assert_eq!(
        store
            .journal_of_call(&me, time.now)
            .await
            .expect("journal")
            .len(),
        1,
        "a finished record keeps its journal until it expires"
    );
    // Given back: kept for keep_ms after the latest append.
    let released = fresh_key("journal-released");
    let gone = call();
    let fence = acquire(&*store, &released, &gone, time.now).await;
    store.release(&released, fence).await.expect("release");
    store
        .append_journal(&released, &[note(&gone, 2)], 5_000, time.now)
        .await
        .expect("append");
    time.pass(100).await;
    store.purge_expired(time.now).await.expect("purge");
    assert_eq!(
        store
            .journal_of_call(&gone, time.now)
            .await
            .expect("journal"),
        vec![note(&gone, 2)],
        "a call given back keeps its journal for keep_ms"
    );
}

/// Generates one `#[tokio::test]` per conformance check, each on a store made by `$make` (an
/// expression of type `Arc<S>` for a `Store` `S`). With `optional:`, the expression gives an `Option`, and
/// `None` (no server configured) makes each test print why it was skipped and pass.
#[macro_export]
macro_rules! store_conformance_tests {
    (optional: $make:expr) => {
        $crate::store_conformance_tests!(@all $make;);
    };
    ($make:expr) => {
        $crate::store_conformance_tests!(@all ::core::option::Option::Some($make););
    };
    (@all $make:expr;) => {
        $crate::store_conformance_tests!(@tests $make;
            claim_is_exclusive claim_records_processing fences_grow complete_is_fenced_and_reentrant
            callback_transitions unknown_moves_forward release_frees_the_key forget_frees_a_finished_key receipts_are_found_by_call_ids
            take_over_rules extend_lease_is_fenced
            ttl_expiry wait_settled_wakes compensation_queue take_over_is_exclusive_and_fences_out
            wait_settled_wakes_on_release orphans_are_listed receipts_are_listed
            journal_is_kept_in_order journal_lives_with_its_record journaled_keys_are_listed receipts_are_paged);
    };
    (@tests $make:expr; $($check:ident)+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let made = $make;
                let ::core::option::Option::Some(made) = made else {
                    return;
                };
                let store: ::std::sync::Arc<dyn $crate::Store> = made;
                $crate::conformance::$check(store).await;
            }
        )+
    };
}
