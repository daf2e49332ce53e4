//! The receipts contract: claims are exclusive and record `PROCESSING`, fences grow, completion is
//! fenced and re-entrant, transitions only move forward, release and forget free a key, receipts are
//! found by callId, take-over follows its rules and fences out the owner it replaces, leases are
//! extended under the owner's fence, records expire by their TTL, and waiters wake when a key settles.

use std::sync::Arc;
use std::time::Duration;

use super::support::{acquire, call, claim, fresh_key, note, success, Timeline, PURGE_T0, T0};
use crate::call_id::CallId;
use crate::error::StoreError;
use crate::key::{Fingerprint, Key};
use crate::receipt::{Fence, ReceiptState, Transition};
use crate::store::{Claimed, Completion, Store};

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

/// A finished record is reopened (a person's correction) only under its own fence and only once it
/// finished: it becomes `PROCESSING` under a larger fence, with its callId and without its outcome, so
/// a duplicate finds the call running; the new outcome is then written under the new fence, and the
/// old fence is refused.
pub async fn reopen_corrects_a_finished_record(store: Arc<dyn Store>) {
    let key = fresh_key("reopen");
    let first = call();
    let fence = acquire(&*store, &key, &first, T0).await;
    assert!(
        matches!(
            store.reopen(&key, fence, 60_000, T0).await,
            Ok(Claimed::Existing(r)) if r.state == ReceiptState::Processing && r.fence == fence
        ),
        "a PROCESSING call is not finished: not reopened"
    );
    store
        .complete(
            &key,
            fence,
            Completion {
                state: ReceiptState::Failed,
                outcome: Some(Arc::from(&b"declined"[..])),
                ttl_ms: 60_000,
            },
            T0,
        )
        .await
        .expect("complete");
    assert!(
        matches!(
            store.reopen(&key, Fence(fence.0.wrapping_add(1_000_000)), 60_000, T0).await,
            Ok(Claimed::Existing(r)) if r.state == ReceiptState::Failed
        ),
        "another fence does not reopen it"
    );
    let Claimed::Acquired(reopened) = store.reopen(&key, fence, 60_000, T0).await.expect("reopen")
    else {
        panic!("the record's own fence reopens it");
    };
    assert!(reopened > fence, "under a larger fence");
    let record = store.get(&key, T0).await.expect("get").expect("kept");
    assert_eq!(
        (record.state, &record.call_id, record.outcome.as_deref()),
        (ReceiptState::Processing, &first, None)
    );
    assert!(record.lease_alive(T0), "a duplicate finds it running");
    assert!(
        matches!(
            store.complete(&key, fence, success(b"7", 60_000), T0).await,
            Err(StoreError::Fenced { .. })
        ),
        "the old fence is refused"
    );
    store
        .complete(&key, reopened, success(b"7", 60_000), T0)
        .await
        .expect("the correction");
    let corrected = store
        .get_by_call_id(&first)
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(
        (corrected.state, corrected.outcome.as_deref()),
        (ReceiptState::Success, Some(&b"7"[..]))
    );
    assert!(matches!(
        store
            .reopen(&fresh_key("reopen-none"), fence, 60_000, T0)
            .await,
        Err(StoreError::NotFound)
    ));
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
