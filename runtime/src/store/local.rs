//! [`LocalCache`]: finished receipts kept in process, in front of any store.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::{Claim, ClaimTracker, Claimed, Completion, Store, StoreClock, StoreWrapper};
use crate::error::StoreError;
use crate::key::Key;
use crate::receipt::{Fence, Receipt, Transition};

const SHARDS: usize = 16;

/// How long a receipt is answered from the process at most, by default.
pub const DEFAULT_LOCAL_MAX_AGE: Duration = Duration::from_secs(60);

/// Finished receipts kept in process, in front of any store: a repeat of a finished call is answered
/// in nanoseconds, without the store's round trip (PostgreSQL ~170 µs, Redis ~65 µs here).
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use samekey_runtime::store::{LocalCache, PgStore};
///
/// let durable = PgStore::connect("postgres://app@db/app").await?;
/// let store = LocalCache::new(durable, 100_000); // up to 10⁵ finished receipts
/// let rt = samekey_runtime::Runtime::builder().store(store).build()?;
/// # let _ = rt; Ok(()) }
/// ```
///
/// Only finished receipts (`SUCCESS`, `FAILED`) are kept: transitions only move forward, so a
/// finished receipt does not change until it expires. A receipt is kept once the wrapped store has
/// committed it: when a call that claimed its key through this cache completes, and when the store
/// answers a finished receipt to a claim or a read (a call finished by another process). What the
/// wrapped store still does:
///
/// - **every claim of a key this process holds no finished receipt for**: a new call, a duplicate
///   of a call in flight, a duplicate of a call another process finished (which this one then keeps);
/// - every write, every query by callId, listing, the compensation queue and the journal.
///
/// A receipt is answered from the process until the earlier of its expiry and `max_age` (default
/// [`DEFAULT_LOCAL_MAX_AGE`], 60 s) after it was kept. Its expiry is judged by the clock of the store
/// that keeps it: a completion made here keeps it for the completion's `ttl` from then, and a receipt
/// read from a store with a clock of its own is kept for what that store's time says is left (the
/// store is asked for it). `max_age` is what a key [forgotten](Store::forget) or a record
/// [corrected](Store::reopen) by another process costs: this one replays it, as it was, up to
/// `max_age` longer (a person's correction of a contradiction, `Compensator::resolve` on another
/// node, reaches this process's duplicates up to `max_age` late). Forgotten through this store, it
/// goes at once, and no answer the store gave before the forget is kept after it: a claim or a read
/// that found the receipt, or a completion, whose answer was still on its way when the forget went
/// through keeps nothing (nor does one of another key in the same of its 16 shards, kept at its
/// next read instead), so the next claim of the key reaches the wrapped store. The cache holds
/// `capacity` receipts at most, the first kept going first.
pub struct LocalCache<S> {
    /// The wrapped store, through what the claims taken through this cache know of their receipts,
    /// so that a completion's receipt can be kept (bounded like the receipts: past it, a completion
    /// is kept at its first read).
    inner: ClaimTracker<S>,
    shards: Box<[Mutex<Shard>]>,
    shard_capacity: usize,
    max_age_ms: u64,
}

#[derive(Default)]
struct Shard {
    receipts: HashMap<[u8; 32], Kept>,
    order: VecDeque<[u8; 32]>,
    /// How many forgets of the shard's keys went through this cache: a receipt the store answered
    /// to a read that started before one is not kept after it.
    forgets: u64,
}

/// A shard's count of forgets when a read of the store started (see [`Shard::forgets`]).
#[derive(Clone, Copy)]
struct Seen(u64);

struct Kept {
    receipt: Receipt,
    /// Answered from the process until this time, by the caller's clock.
    until_ms: u64,
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // Every update is a plain insert or remove: a poisoned shard is still consistent.
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<S: Store> LocalCache<S> {
    /// `inner` behind a cache of at most `capacity` finished receipts (rounded up to a multiple of 16).
    pub fn new(inner: S, capacity: usize) -> LocalCache<S> {
        let shard_capacity = capacity.div_ceil(SHARDS).max(1);
        LocalCache {
            inner: ClaimTracker::new(inner).limit(shard_capacity.saturating_mul(SHARDS)),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            shard_capacity,
            max_age_ms: DEFAULT_LOCAL_MAX_AGE.as_millis() as u64,
        }
    }

    /// How long a receipt is answered from the process at most (see the type's documentation).
    pub fn max_age(mut self, max_age: Duration) -> LocalCache<S> {
        self.max_age_ms = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        self.inner.inner()
    }

    /// How many receipts the process keeps now (some may be past their time, until touched).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).receipts.len()).sum()
    }

    /// Whether the process keeps no receipt.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &Key) -> MutexGuard<'_, Shard> {
        lock(&self.shards[usize::from(key.digest()[30]) % SHARDS])
    }

    /// The kept receipt of `key`, if its time has not run out at `now_ms`; else what its shard has
    /// seen of forgets, for the read of the store that follows.
    fn hit(&self, key: &Key, now_ms: u64) -> Result<Receipt, Seen> {
        let mut shard = self.shard(key);
        let seen = Seen(shard.forgets);
        let Some(kept) = shard.receipts.get(key.digest()) else {
            return Err(seen);
        };
        if kept.until_ms > now_ms {
            return Ok(kept.receipt.clone());
        }
        shard.receipts.remove(key.digest());
        Err(seen)
    }

    /// What the shard of `key` has seen of forgets, before a write whose answer may be kept.
    fn seen(&self, key: &Key) -> Seen {
        Seen(self.shard(key).forgets)
    }

    /// Keeps `receipt`, read from the store just now by a read that started when its shard had
    /// `seen` forgets, if it is finished: until it expires (by its store's clock) or for `max_age`.
    async fn keep_read(&self, receipt: &Receipt, now_ms: u64, seen: Seen) {
        let Some(expires_at_ms) = receipt.expires_at_ms else {
            return;
        };
        if !receipt.state.is_terminal() {
            return;
        }
        let store_now_ms = match self.inner().clock() {
            StoreClock::Caller => now_ms,
            // A read answered just now: the store's time, to turn its expiry into this clock's.
            StoreClock::Own => match self.inner().now_ms(now_ms).await {
                Ok(t) => t,
                Err(_) => return,
            },
        };
        let left = expires_at_ms.saturating_sub(store_now_ms);
        self.keep(receipt.clone(), now_ms, left, seen);
    }

    /// Keeps a finished `receipt` for `left_ms` from `now_ms` (at most `max_age`), unless a forget
    /// of its shard's keys went through since the store was asked for it (when the shard had `seen`
    /// forgets): the store may have answered the receipt before that forget deleted it.
    fn keep(&self, receipt: Receipt, now_ms: u64, left_ms: u64, seen: Seen) {
        let until_ms = now_ms.saturating_add(left_ms.min(self.max_age_ms));
        if until_ms <= now_ms || !receipt.state.is_terminal() {
            return;
        }
        let digest = *receipt.key.digest();
        let mut shard = self.shard(&receipt.key);
        if shard.forgets != seen.0 {
            return;
        }
        let kept = Kept { receipt, until_ms };
        if shard.receipts.insert(digest, kept).is_some() {
            return;
        }
        shard.order.push_back(digest);
        while shard.receipts.len() > self.shard_capacity {
            let Some(oldest) = shard.order.pop_front() else {
                break;
            };
            shard.receipts.remove(&oldest);
        }
        // Entries of receipts dropped at their time leave the order queue when they reach its front.
        if shard.order.len() > 2 * self.shard_capacity {
            let Shard {
                receipts, order, ..
            } = &mut *shard;
            order.retain(|d| receipts.contains_key(d));
        }
    }

    /// Drops the kept receipt of `key`, forgotten in the store, and counts the forget: no answer
    /// the store gave before it is kept after it.
    fn forgotten(&self, key: &Key) {
        let mut shard = self.shard(key);
        shard.forgets = shard.forgets.wrapping_add(1);
        shard.receipts.remove(key.digest());
    }
}

/// Claims, reads, forgets and reopens go through the kept receipts; every other method is the
/// wrapped store's.
#[async_trait]
impl<S: Store> StoreWrapper for LocalCache<S> {
    type Inner = ClaimTracker<S>;

    fn wrapped(&self) -> &ClaimTracker<S> {
        &self.inner
    }

    async fn claim(this: &Self, claim: Claim) -> Result<Claimed, StoreError> {
        let seen = match this.hit(&claim.key, claim.now_ms) {
            Ok(receipt) => return Ok(Claimed::Existing(receipt)),
            Err(seen) => seen,
        };
        let now_ms = claim.now_ms;
        let claimed = this.inner.claim(claim).await?;
        if let Claimed::Existing(receipt) = &claimed {
            this.keep_read(receipt, now_ms, seen).await;
        }
        Ok(claimed)
    }

    async fn complete(
        this: &Self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        // Before the store commits: a forget can only follow the commit.
        let seen = this.seen(key);
        let ttl_ms = completion.ttl_ms;
        let (transition, finished) = this
            .inner
            .complete_tracked(key, fence, completion, now_ms)
            .await?;
        if let Some(receipt) = finished {
            // Committed: the receipt the store now holds. Its `ttl` runs from the store's commit,
            // which this clock measures from its own now as well as the store's clock does.
            this.keep(receipt, now_ms, ttl_ms, seen);
        }
        Ok(transition)
    }

    async fn forget(this: &Self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        let forgotten = this.inner.forget(key, fence).await;
        // Once the store answered, whatever it answered (a forget it applied may have failed to
        // answer): the receipt goes, and so does any answer to a read, a claim or a completion
        // that was in flight meanwhile, kept or not yet.
        this.forgotten(key);
        forgotten
    }

    /// The kept receipt goes as for a forget: the record is being corrected, and no answer the store
    /// gave before is kept after.
    async fn reopen(
        this: &Self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        let reopened = this.inner.reopen(key, expected, lease_ms, now_ms).await;
        this.forgotten(key);
        reopened
    }

    async fn get(this: &Self, key: &Key, now_ms: u64) -> Result<Option<Receipt>, StoreError> {
        let seen = match this.hit(key, now_ms) {
            Ok(receipt) => return Ok(Some(receipt)),
            Err(seen) => seen,
        };
        let found = this.inner.get(key, now_ms).await?;
        if let Some(receipt) = &found {
            this.keep_read(receipt, now_ms, seen).await;
        }
        Ok(found)
    }

    async fn purge_expired(this: &Self, now_ms: u64) -> Result<usize, StoreError> {
        for shard in this.shards.iter() {
            let mut shard = lock(shard);
            let Shard {
                receipts, order, ..
            } = &mut *shard;
            receipts.retain(|_, kept| kept.until_ms > now_ms);
            order.retain(|d| receipts.contains_key(d));
        }
        this.inner.purge_expired(now_ms).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call_id::CallId;
    use crate::receipt::ReceiptState;
    use crate::MemoryStore;

    fn claim(key: &Key, now_ms: u64) -> Claim {
        Claim {
            key: key.clone(),
            call_id: CallId::new("loc", "test").unwrap(),
            fingerprint: None,
            lease_ms: 10_000,
            now_ms,
        }
    }

    async fn finished(store: &LocalCache<MemoryStore>, key: &Key, ttl_ms: u64) -> Fence {
        let Ok(Claimed::Acquired(fence)) = store.claim(claim(key, 1_000)).await else {
            panic!("a fresh key")
        };
        let completion = Completion {
            state: ReceiptState::Success,
            outcome: Some(b"42".as_slice().into()),
            ttl_ms,
        };
        store.complete(key, fence, completion, 1_000).await.unwrap();
        fence
    }

    /// A call completed through the cache is answered without the store from its first duplicate on:
    /// shown by taking the receipt out of the store behind the cache's back, which the cache does not
    /// see until its `max_age` runs out.
    #[tokio::test]
    async fn repeats_are_answered_in_process_until_max_age() {
        let store = LocalCache::new(MemoryStore::new(), 100).max_age(Duration::from_secs(5));
        let key = Key::build("local", &1u64);
        let fence = finished(&store, &key, 60_000).await;
        assert_eq!(store.len(), 1, "kept once the store committed it");
        assert_eq!(store.inner.tracked(), 0);
        store.inner().forget(&key, fence).await.unwrap();
        let Ok(Claimed::Existing(first)) = store.claim(claim(&key, 2_000)).await else {
            panic!("answered in process")
        };
        assert_eq!(first.state, ReceiptState::Success);
        assert_eq!(first.outcome.as_deref(), Some(b"42".as_slice()));
        assert_eq!(store.get(&key, 5_999).await.unwrap(), Some(first));
        // Kept at 1 000 for 5 s: at 6 000 the store is asked again, and it forgot the key.
        assert!(matches!(
            store.claim(claim(&key, 6_000)).await,
            Ok(Claimed::Acquired(_))
        ));
    }

    /// An owner that stalled past its lease and was taken over writes with its old fence: the store
    /// refuses it, the cache keeps nothing of it, and the key answers the new owner's outcome.
    #[tokio::test]
    async fn a_stale_owner_s_completion_is_fenced_out_and_not_kept() {
        let store = LocalCache::new(MemoryStore::new(), 100);
        let key = Key::build("local", &7u64);
        let Ok(Claimed::Acquired(stale)) = store.claim(claim(&key, 1_000)).await else {
            panic!("a fresh key")
        };
        // The lease (10 s) ends; another node takes the key over, through the store itself.
        let Ok(Claimed::Acquired(current)) =
            store.inner().take_over(&key, stale, 10_000, 20_000).await
        else {
            panic!("an ended lease is taken over")
        };
        let outcome = |bytes: &'static [u8]| Completion {
            state: ReceiptState::Success,
            outcome: Some(bytes.into()),
            ttl_ms: 60_000,
        };
        store
            .inner()
            .complete(&key, current, outcome(b"new"), 21_000)
            .await
            .unwrap();
        // The stalled owner comes back.
        let late = store.complete(&key, stale, outcome(b"old"), 22_000).await;
        assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
        assert!(store.is_empty(), "nothing kept of the refused write");
        let Ok(Claimed::Existing(answer)) = store.claim(claim(&key, 23_000)).await else {
            panic!("a finished key")
        };
        assert_eq!(answer.outcome.as_deref(), Some(b"new".as_slice()));
    }

    /// A receipt another process finished is kept from the first read that finds it.
    #[tokio::test]
    async fn a_receipt_finished_elsewhere_is_kept_from_its_first_read() {
        let store = LocalCache::new(MemoryStore::new(), 100);
        let key = Key::build("local", &4u64);
        let Ok(Claimed::Acquired(fence)) = store.inner().claim(claim(&key, 1_000)).await else {
            panic!("a fresh key")
        };
        let completion = Completion {
            state: ReceiptState::Success,
            outcome: Some(b"7".as_slice().into()),
            ttl_ms: 60_000,
        };
        store
            .inner()
            .complete(&key, fence, completion, 1_000)
            .await
            .unwrap();
        assert!(store.is_empty());
        assert!(matches!(
            store.claim(claim(&key, 2_000)).await,
            Ok(Claimed::Existing(_))
        ));
        assert_eq!(store.len(), 1);
    }

    /// A claim given back, or left `UNKNOWN`, keeps nothing.
    #[tokio::test]
    async fn a_claim_that_does_not_finish_keeps_nothing() {
        let store = LocalCache::new(MemoryStore::new(), 100);
        let (a, b) = (Key::build("local", &5u64), Key::build("local", &6u64));
        let Ok(Claimed::Acquired(fa)) = store.claim(claim(&a, 1_000)).await else {
            panic!("a fresh key")
        };
        let Ok(Claimed::Acquired(fb)) = store.claim(claim(&b, 1_000)).await else {
            panic!("a fresh key")
        };
        assert_eq!(store.inner.tracked(), 2);
        store.release(&a, fa).await.unwrap();
        store.mark_unknown(&b, fb, 1_000).await.unwrap();
        assert_eq!(store.inner.tracked(), 0);
        assert!(store.is_empty());
    }

    #[tokio::test]
    async fn a_receipt_goes_at_its_expiry_and_when_forgotten_through_the_cache() {
        let store = LocalCache::new(MemoryStore::new(), 100);
        let key = Key::build("local", &2u64);
        finished(&store, &key, 3_000).await;
        assert!(store.get(&key, 2_000).await.unwrap().is_some());
        assert_eq!(store.len(), 1);
        // The receipt expires at 4 000: the cache does not answer it after.
        assert!(matches!(
            store.claim(claim(&key, 4_000)).await,
            Ok(Claimed::Acquired(_))
        ));
        let other = Key::build("local", &3u64);
        let fence_other = finished(&store, &other, 60_000).await;
        assert!(store.get(&other, 2_000).await.unwrap().is_some());
        store.forget(&other, fence_other).await.unwrap();
        assert_eq!(store.get(&other, 2_000).await.unwrap(), None);
    }

    #[tokio::test]
    async fn the_cache_holds_its_capacity() {
        let store = LocalCache::new(MemoryStore::new(), 32);
        for i in 0..1_000u64 {
            let key = Key::build("local", &i);
            finished(&store, &key, 60_000).await;
            assert!(store.get(&key, 2_000).await.unwrap().is_some());
        }
        assert!(store.len() <= 32, "{}", store.len());
        let order: usize = store.shards.iter().map(|s| lock(s).order.len()).sum();
        assert_eq!(order, store.len());
    }
}
