//! The in-memory store's records in slots (a removed record's slot is the next one filled, and a
//! finished-receipt lane entry names its record by slot and fence) and its outcomes kept inline
//! up to 62 bytes: every receipt handed out carries its own outcome, byte for byte, and a slot refilled
//! under a lane entry that outlived its record never loses the new record.
//!
//! Keys of one shard are picked by the last byte of their digest (the store's shard is
//! `digest[31] % 64`): the LIFO slot reuse is per shard.

use std::sync::Arc;
use std::time::Duration;

use samekey::receipt::Fence;
use samekey::store::{Claim, Claimed, Completion, ReceiptQuery, Store, StoreError};
use samekey::{CallId, Key, MemoryStore, Receipt, ReceiptState};

/// Outcome lengths around the inline bound (62 bytes).
const LENS: [usize; 8] = [0, 1, 61, 62, 63, 64, 255, 4096];

fn shard(key: &Key) -> u8 {
    key.digest()[31] % 64
}

/// `n` keys of `scope` in one shard.
fn same_shard(scope: &str, n: usize) -> Vec<Key> {
    let first = shard(&Key::build(scope, &0u64));
    (0u64..)
        .map(|i| Key::build(scope, &i))
        .filter(|k| shard(k) == first)
        .take(n)
        .collect()
}

fn bytes(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ salt)
        .collect()
}

fn call(name: &str) -> CallId {
    CallId::new("slots", name).unwrap()
}

async fn acquire(store: &MemoryStore, key: &Key, call_id: &CallId, now_ms: u64) -> Fence {
    match store
        .claim(Claim {
            key: key.clone(),
            call_id: call_id.clone(),
            fingerprint: None,
            lease_ms: 1_000,
            now_ms,
        })
        .await
    {
        Ok(Claimed::Acquired(fence)) => fence,
        other => panic!("a fresh key: {other:?}"),
    }
}

async fn existing(store: &MemoryStore, key: &Key, now_ms: u64) -> Receipt {
    match store
        .claim(Claim {
            key: key.clone(),
            call_id: call("dup"),
            fingerprint: None,
            lease_ms: 1_000,
            now_ms,
        })
        .await
    {
        Ok(Claimed::Existing(r)) => r,
        other => panic!("a held key: {other:?}"),
    }
}

/// What a completion writes: a state, an outcome, when, and for how long.
struct Done {
    state: ReceiptState,
    outcome: Option<Vec<u8>>,
    now_ms: u64,
    ttl_ms: u64,
}

/// `SUCCESS` with `outcome` at `now_ms`, for `ttl_ms`.
fn succeeded(outcome: Vec<u8>, now_ms: u64, ttl_ms: u64) -> Done {
    done(ReceiptState::Success, Some(outcome), now_ms, ttl_ms)
}

fn done(state: ReceiptState, outcome: Option<Vec<u8>>, now_ms: u64, ttl_ms: u64) -> Done {
    Done {
        state,
        outcome,
        now_ms,
        ttl_ms,
    }
}

async fn finish(store: &MemoryStore, key: &Key, fence: Fence, done: Done) {
    let completion = Completion {
        state: done.state,
        outcome: done.outcome.map(Arc::from),
        ttl_ms: done.ttl_ms,
    };
    store
        .complete(key, fence, completion, done.now_ms)
        .await
        .unwrap();
}

/// Every way a receipt leaves the store hands out its outcome byte for byte: an empty one stays
/// `Some(empty)` (not `None`), 62 bytes (the last kept inline) and 63 (the first shared) alike, for
/// `SUCCESS` and `FAILED`: `get`, `get_by_call_id`, a duplicate's claim, a take-over and a reopen
/// refused, a listing, a waiter handed the record as it settles, and one that comes after.
#[tokio::test(start_paused = true)]
async fn holds_every_receipt_handed_out_carries_its_outcome_byte_for_byte() {
    let store = Arc::new(MemoryStore::new());
    let keys = same_shard("inline", LENS.len() * 2);
    for (i, key) in keys.iter().enumerate() {
        let len = LENS[i % LENS.len()];
        let state = if i < LENS.len() {
            ReceiptState::Success
        } else {
            ReceiptState::Failed
        };
        let want = bytes(len, i as u8);
        let call_id = call(&format!("c{i}"));
        let now = 1_000 + i as u64;
        let fence = acquire(&store, key, &call_id, now).await;
        let waiter = tokio::spawn({
            let (store, key) = (store.clone(), key.clone());
            async move { store.wait_settled(&key, Duration::from_secs(30), now).await }
        });
        tokio::task::yield_now().await;
        finish(
            &store,
            key,
            fence,
            done(state, Some(want.clone()), now, 60_000),
        )
        .await;
        let ctx = format!("{state} with {len} bytes");
        let settled = waiter.await.unwrap().unwrap().expect("settled");
        assert_eq!(settled.outcome.as_deref(), Some(&want[..]), "{ctx}: waiter");
        let later = store
            .wait_settled(key, Duration::from_secs(1), now)
            .await
            .unwrap()
            .expect("settled");
        assert_eq!(later.outcome.as_deref(), Some(&want[..]), "{ctx}: later");
        let got = store.get(key, now).await.unwrap().expect("held");
        assert_eq!(got.outcome.as_deref(), Some(&want[..]), "{ctx}: get");
        let by_call = store.get_by_call_id(&call_id).await.unwrap().expect("held");
        assert_eq!(by_call, got, "{ctx}: by callId");
        assert_eq!(existing(&store, key, now).await, got, "{ctx}: claim");
        match store.take_over(key, fence, 1_000, now).await {
            Ok(Claimed::Existing(r)) => assert_eq!(r, got, "{ctx}: take-over"),
            other => panic!("{ctx}: a finished record is not taken over: {other:?}"),
        }
        match store.reopen(key, Fence(fence.0 + 100), 1_000, now).await {
            Ok(Claimed::Existing(r)) => assert_eq!(r, got, "{ctx}: reopen, another fence"),
            other => panic!("{ctx}: a reopen with a wrong fence: {other:?}"),
        }
    }
    let page = store
        .list_receipts(&ReceiptQuery::created_between(0, u64::MAX), 2_000)
        .await
        .unwrap();
    assert_eq!(page.receipts.len(), keys.len());
    for r in &page.receipts {
        let i = keys.iter().position(|k| k == &r.key).unwrap();
        let want = bytes(LENS[i % LENS.len()], i as u8);
        assert_eq!(r.outcome.as_deref(), Some(&want[..]), "listed {i}");
    }
}

/// A finished receipt reopened hands out no old outcome (as `PROCESSING`, or to `list_orphans` once
/// its lease ends), its waiters get the new one, and the lane entry of its first outcome, due first,
/// does not evict it: it goes at its new expiry.
#[tokio::test(start_paused = true)]
async fn holds_a_reopened_receipt_hands_out_only_its_new_outcome() {
    let store = Arc::new(MemoryStore::new());
    let key = &same_shard("reopen", 1)[0];
    let call_id = call("first");
    let first = acquire(&store, key, &call_id, 10).await;
    finish(&store, key, first, succeeded(bytes(62, 1), 10, 100)).await;
    let Ok(Claimed::Acquired(second)) = store.reopen(key, first, 50, 20).await else {
        panic!("a finished record reopens")
    };
    let open = store.get(key, 20).await.unwrap().expect("held");
    assert_eq!((open.state, open.outcome), (ReceiptState::Processing, None));
    assert_eq!(existing(&store, key, 20).await.outcome, None);
    assert_eq!(
        store
            .get_by_call_id(&call_id)
            .await
            .unwrap()
            .unwrap()
            .outcome,
        None
    );
    let orphans = store.list_orphans(80, 10).await.unwrap();
    assert_eq!(orphans.len(), 1);
    assert_eq!(orphans[0].outcome, None, "an orphan with its old outcome");
    let waiter = tokio::spawn({
        let (store, key) = (store.clone(), key.clone());
        async move { store.wait_settled(&key, Duration::from_secs(30), 30).await }
    });
    tokio::task::yield_now().await;
    finish(
        &store,
        key,
        second,
        done(ReceiptState::Failed, Some(bytes(63, 2)), 30, 1_000),
    )
    .await;
    let settled = waiter.await.unwrap().unwrap().expect("settled");
    assert_eq!(settled.outcome.as_deref(), Some(&bytes(63, 2)[..]));
    // The first outcome's expiry (110) passes: the record stays until 1 030.
    assert_eq!(store.purge_expired(500).await.unwrap(), 0);
    let kept = store.get(key, 500).await.unwrap().expect("still held");
    assert_eq!(kept.outcome.as_deref(), Some(&bytes(63, 2)[..]));
    assert_eq!(kept.fence, second);
    assert_eq!(store.purge_expired(1_030).await.unwrap(), 1);
    assert!(store.is_empty());
}

/// A forgotten receipt's slot goes to the next key of its shard; when the forgotten one's expiry
/// comes, its lane entry evicts nothing, whether the slot holds another key (finished with a longer
/// ttl, in flight, or `UNKNOWN`) or the same key claimed anew.
#[tokio::test(start_paused = true)]
async fn holds_a_slot_refilled_under_a_stale_lane_entry_keeps_its_new_record() {
    let store = MemoryStore::new();
    let keys = same_shard("refill", 4);
    // Key 0 finishes (expiring at 110) and is forgotten; key 1 takes its slot and finishes later.
    let f0 = acquire(&store, &keys[0], &call("k0"), 10).await;
    finish(&store, &keys[0], f0, succeeded(bytes(8, 0), 10, 100)).await;
    store.forget(&keys[0], f0).await.unwrap();
    let f1 = acquire(&store, &keys[1], &call("k1"), 20).await;
    finish(&store, &keys[1], f1, succeeded(bytes(70, 1), 20, 10_000)).await;
    // Key 1 forgotten too; key 2 takes the slot, stays in flight; key 3 is UNKNOWN in the next one.
    let f2a = acquire(&store, &keys[2], &call("k2a"), 30).await;
    let f3 = acquire(&store, &keys[3], &call("k3"), 30).await;
    store.mark_unknown(&keys[3], f3, 31).await.unwrap();
    finish(
        &store,
        &keys[2],
        f2a,
        done(ReceiptState::Failed, Some(bytes(5, 2)), 32, 100),
    )
    .await;
    store.forget(&keys[2], f2a).await.unwrap();
    // Key 0 again, into the slot key 2 left (its old entry says 110; key 2's says 132).
    let f0b = acquire(&store, &keys[0], &call("k0b"), 40).await;
    finish(&store, &keys[0], f0b, succeeded(bytes(62, 9), 40, 5_000)).await;
    assert_eq!(
        store.purge_expired(200).await.unwrap(),
        0,
        "stale entries only"
    );
    for (key, want) in [
        (&keys[0], Some(bytes(62, 9))),
        (&keys[1], Some(bytes(70, 1))),
    ] {
        let r = store.get(key, 200).await.unwrap().expect("kept");
        assert_eq!(r.outcome, want.map(Arc::from));
    }
    assert_eq!(
        store.get(&keys[3], 200).await.unwrap().map(|r| r.state),
        Some(ReceiptState::Unknown)
    );
    assert_eq!(store.len(), 3);
    assert_eq!(store.purge_expired(10_020).await.unwrap(), 2);
    assert_eq!(store.len(), 1, "the UNKNOWN stays");
}

/// Two keys of one shard whose digests share their first 8 bytes (the table's hash; made here with
/// `Key::from_digest`, by chance one in 2⁶⁴): each is read, forgotten and evicted as itself.
#[tokio::test]
async fn holds_two_keys_sharing_their_table_hash_stay_apart() {
    let store = MemoryStore::new();
    let mut a = [7u8; 32];
    let mut b = a;
    a[20] = 1;
    b[20] = 2;
    let (ka, kb) = (Key::from_digest("twin", a), Key::from_digest("twin", b));
    let (ca, cb) = (call("a"), call("b"));
    let fa = acquire(&store, &ka, &ca, 10).await;
    let fb = acquire(&store, &kb, &cb, 10).await;
    finish(&store, &ka, fa, succeeded(bytes(3, 1), 10, 100)).await;
    finish(&store, &kb, fb, succeeded(bytes(3, 2), 10, 100)).await;
    // A forgotten, and claimed anew in its slot with a longer ttl: the entry of its first outcome
    // and b's (both at 110) must take b alone.
    store.forget(&ka, fa).await.unwrap();
    let fa2 = acquire(&store, &ka, &ca, 20).await;
    finish(&store, &ka, fa2, succeeded(bytes(64, 3), 20, 1_000)).await;
    assert_eq!(
        store
            .get_by_call_id(&cb)
            .await
            .unwrap()
            .and_then(|r| r.outcome),
        Some(Arc::from(bytes(3, 2)))
    );
    assert_eq!(store.purge_expired(110).await.unwrap(), 1);
    assert_eq!(store.get(&kb, 110).await.unwrap(), None);
    let left = store.get(&ka, 110).await.unwrap().expect("a stays");
    assert_eq!(left.outcome.as_deref(), Some(&bytes(64, 3)[..]));
    assert_eq!(
        store.get_by_call_id(&ca).await.unwrap().map(|r| r.fence),
        Some(fa2)
    );
}

/// A bounded store counts its places across every way a record goes or comes back (forget, release,
/// reopen, expiry, eviction to make room): after it all, it takes exactly its capacity of calls in
/// flight and refuses the next.
#[tokio::test]
async fn holds_a_bounded_stores_places_do_not_drift_with_slots() {
    let store = MemoryStore::with_capacity(4);
    let keys = same_shard("places", 12);
    for round in 0..5u64 {
        let t = 1_000 * (round + 1);
        let f: Vec<Fence> = {
            let mut f = Vec::new();
            for (i, key) in keys[..4].iter().enumerate() {
                f.push(acquire(&store, key, &call(&format!("r{round}k{i}")), t).await);
            }
            f
        };
        finish(&store, &keys[0], f[0], succeeded(bytes(62, 0), t, 10)).await;
        finish(&store, &keys[1], f[1], succeeded(bytes(63, 0), t, 500)).await;
        store.forget(&keys[1], f[1]).await.unwrap();
        store.release(&keys[2], f[2]).await.unwrap();
        finish(
            &store,
            &keys[3],
            f[3],
            done(ReceiptState::Failed, None, t, 500),
        )
        .await;
        let Ok(Claimed::Acquired(f3)) = store.reopen(&keys[3], f[3], 1_000, t + 1).await else {
            panic!("reopened")
        };
        finish(&store, &keys[3], f3, succeeded(vec![], t + 2, 500)).await;
        // Key 0 expired (t + 10), key 3 finished: both may go; two places are free.
        let mut held = Vec::new();
        for (i, key) in keys[4..].iter().enumerate() {
            match store
                .claim(Claim {
                    key: key.clone(),
                    call_id: call(&format!("r{round}n{i}")),
                    fingerprint: None,
                    lease_ms: 1_000,
                    now_ms: t + 20,
                })
                .await
            {
                Ok(Claimed::Acquired(fence)) => held.push((key, fence)),
                Err(StoreError::Full { capacity: 4 }) => break,
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(
            held.len(),
            4,
            "round {round}: calls in flight a store of 4 takes"
        );
        assert_eq!(store.len(), 4, "round {round}");
        for (key, fence) in held {
            store.release(key, fence).await.unwrap();
        }
        assert!(store.is_empty(), "round {round}");
    }
}

/// A full store evicts "the one that finished first in the new key's shard". A receipt reopened and
/// finished again with another ttl so that its new expiry equals its old one is named only by the
/// lane entry of its second outcome (a fence of its own), and goes after a receipt that did finish
/// before it. (Found by a review: the hash-and-expiry check lane entries made before matched the
/// first entry too, and evicted it as if it had finished then.)
#[tokio::test]
async fn a_full_store_evicts_the_receipt_that_finished_first_even_after_a_reopen() {
    let store = MemoryStore::with_capacity(2);
    let keys = same_shard("order", 3);
    // Key 0 finishes at 10 (ttl 1 000: expires 1 010); key 1 finishes at 15 (expires 1 015).
    let f0 = acquire(&store, &keys[0], &call("k0"), 10).await;
    finish(&store, &keys[0], f0, succeeded(bytes(4, 0), 10, 1_000)).await;
    let f1 = acquire(&store, &keys[1], &call("k1"), 15).await;
    finish(&store, &keys[1], f1, succeeded(bytes(4, 1), 15, 1_000)).await;
    // Key 0 reopened, finished again at 30 with a ttl of 980: expires 1 010 again.
    let Ok(Claimed::Acquired(f0b)) = store.reopen(&keys[0], f0, 1_000, 20).await else {
        panic!("reopened")
    };
    finish(&store, &keys[0], f0b, succeeded(bytes(4, 2), 30, 980)).await;
    // Full: a new key of the shard evicts the one that finished first, key 1 (at 15).
    acquire(&store, &keys[2], &call("k2"), 40).await;
    assert!(
        store.get(&keys[0], 40).await.unwrap().is_some(),
        "key 0, finished at 30, was evicted before key 1, finished at 15: a duplicate of key 0 \
         runs again while an older receipt is kept"
    );
    assert_eq!(store.get(&keys[1], 40).await.unwrap(), None);
}
