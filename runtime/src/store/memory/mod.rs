//! [`MemoryStore`] and what it needs; its documentation is on the type, where users read it.
//!
//! This file holds the type, its shards and its one [`Store`] impl, which hands each method to the
//! file of the store's contract it belongs to:
//!
//! * `receipts.rs`: the records — claim, take-over, the owner's fenced writes, reads and waits;
//! * `eviction.rs`: expired records evicted, and room made in a bounded store;
//! * `queue.rs`: the compensation queue;
//! * `journal.rs`: the journals;
//! * `listings.rs`: listings, counts and purges;
//! * `records.rs`, `finished.rs`, `calls.rs`: a shard's table of records, its finished records in
//!   the order they may go, and the callId index.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

use super::{Claim, Claimed, Completion, ReceiptPage, ReceiptQuery, Store};
use crate::call_id::CallId;
use crate::codec::Kept;
use crate::compensation::CompensationEntry;
use crate::error::StoreError;
use crate::journal::Event;
use crate::key::Key;
use crate::receipt::{Fence, Receipt, ReceiptState, Transition};

mod calls;
mod eviction;
mod finished;
mod journal;
mod listings;
mod outcome;
mod queue;
mod receipts;
mod records;

use calls::CallIndex;
use finished::Lanes;
use journal::Journals;
use outcome::Outcome;
use records::Records;

const SHARDS: usize = 64;
/// Expired records a claim evicts from its shard, at most.
const EVICT_PER_CLAIM: usize = 4;

type Digest = [u8; 32];

/// Hashes values that are already uniformly random (key digests, callId entropy) by folding them.
#[derive(Default)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8).take(1) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = self.0.rotate_left(17) ^ v;
    }

    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<PreHashed>>;

struct Entry {
    /// The receipt but for its outcome, which is kept in `outcome` (here, always `None`): hand it
    /// out through [`Entry::receipt`].
    head: Receipt,
    /// The receipt's outcome.
    outcome: Outcome,
    /// The duplicates parked on this record while it is `PROCESSING`.
    waiters: Option<Arc<Waiters>>,
    /// The `SUCCESS` outcome decoded by a replay, for the next ones (see `Keeper`): lives and dies
    /// with the record, which never changes once it succeeded.
    kept: Option<Kept>,
}

impl Entry {
    /// The record's receipt, outcome included.
    fn receipt(&self) -> Receipt {
        Receipt {
            outcome: self.outcome.shared(),
            ..self.head.clone()
        }
    }

    /// Wakes the record's waiters after a change. A record that settled (no longer `PROCESSING`) is
    /// handed to them with the wake-up, and waiters that come after (the record taken over,
    /// `PROCESSING` again) wait on a new [`Waiters`] of their own. A record still `PROCESSING` (taken
    /// over by a new owner) keeps its waiters: they look again, and whatever the new owner settles is
    /// handed to them too, even if a full store evicts it before they read.
    fn wake(&mut self) {
        if self.head.state == ReceiptState::Processing {
            if let Some(waiters) = &self.waiters {
                waiters.notify.notify_waiters();
            }
        } else if let Some(waiters) = self.waiters.take() {
            let _ = waiters.settled.set(self.receipt());
            waiters.notify.notify_waiters();
        }
    }
}

/// A waiter's registration on a `PROCESSING` record, and where the record is handed over.
type Waiting = (Pin<Box<OwnedNotified>>, Arc<Waiters>);

/// The duplicates waiting for one record to settle, and the record as it settled.
///
/// Handed over with the wake-up rather than read again afterwards, since a woken waiter reads only
/// once it is polled, and meanwhile a full store may evict the finished record for a new key (or a
/// short `ttl` end it): the waiter would find nothing and run the call a second time.
#[derive(Default)]
struct Waiters {
    notify: Arc<Notify>,
    settled: std::sync::OnceLock<Receipt>,
}

#[derive(Default)]
struct Shard {
    /// The records, side by side, found by the digest each holds.
    records: Records,
    /// The finished records, in the order they may go.
    finished: Lanes,
    /// The last fence this shard gave out. A key always falls in the same shard, so each claim or
    /// take-over of a key gets a larger fence than any before it, with no counter shared between
    /// shards (one more contended cache line per claim).
    fence: u64,
}

impl Shard {
    /// Removes the finished record that `next` names (the lanes' next entry in some order), skipping
    /// entries that outlived their record; `None` when the lanes run out first.
    ///
    /// Asks for the records the next removals will read ahead of them: the next one's outcome, and
    /// the record after it (whose outcome the removal after this one asks for in turn).
    fn take_finished(
        &mut self,
        mut next: impl FnMut(&mut Lanes) -> Option<finished::Finished>,
    ) -> Option<Entry> {
        while let Some(finished) = next(&mut self.finished) {
            let [following, after] = self.finished.upcoming();
            if let Some(slot) = after {
                self.records.prefetch(slot);
            }
            if let Some(slot) = following {
                self.records.prefetch_outcome(slot);
            }
            let taken = self.records.remove_finished(finished.slot, finished.fence);
            if taken.is_some() {
                return taken;
            }
        }
        None
    }
}

/// The in-memory [`Store`]. Cheap to create; everything lives as long as the store.
///
/// The embedded in-memory store: the default, needing no server.
///
/// Keys are spread over 64 mutex-guarded shards by their digest (already uniform, so it is used as its own
/// hash). Each shard keeps its finished records in the order they finished, one queue per `ttl`: every
/// claim evicts a few expired records of its shard, and [`Store::purge_expired`] evicts all of them,
/// so the records held stay bounded by the keys claimed within one `ttl`. Claims and `UNKNOWN`
/// records never expire. Waiters on a busy key park on a per-key [`Notify`] that every change of the
/// record wakes: no polling.
///
/// A shard keeps its records side by side, about 350 bytes each with an outcome of up to 62 bytes
/// inside (a longer one is allocated beside it), and reuses the room a record leaves for the next
/// one: after a burst, a shard keeps the room its busiest moment needed until
/// [`Store::purge_expired`] gives back what its records no longer fill (the room at the end of each
/// shard, in 64-record chunks; later claims fill the room left lowest first). Run a purge now and
/// then after bursts where memory matters, or bound the store with [`MemoryStore::with_capacity`].
///
/// # Capacity
///
/// [`MemoryStore::with_capacity`] bounds the records the store holds, whatever the `ttl`s (the
/// default store, [`MemoryStore::new`], is bounded by them alone). When a new key finds the store
/// full, it makes room by evicting a **finished** receipt (`SUCCESS`, `FAILED`), expired or not: the
/// one that finished first in the new key's shard, or, when that shard holds none, the one that
/// finished first in the whole store. (Keys spread evenly over the 64 shards, so the first is about the
/// oldest of the store, and costs no look beyond the shard the claim locks anyway.) A duplicate that
/// comes after its receipt was evicted runs again, as after its `ttl`; a duplicate that waits for a
/// call in flight is handed the receipt as it settles, so an eviction between the wake-up and its
/// read never makes it run again. Calls in flight
/// (`PROCESSING`) and `UNKNOWN` receipts are never evicted: a store full of them refuses new claims
/// with [`StoreError::Full`], and the call fails closed (nothing runs) instead of losing a claim.
/// Size it above the calls in flight at peak plus the duplicates' window: at 1 000 calls a second,
/// 10⁶ records keep every receipt about 17 minutes.
///
/// Listing receipts ([`Store::list_receipts`]) scans the records once per page (no index is kept up
/// on the claim path): a page costs about 40 ms at 10⁶ records (`BENCHMARKS.md`). The durable stores
/// index receipts by creation time.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// The records the store holds at most (`usize::MAX`: unbounded).
    capacity: usize,
    /// The records it holds, while bounded: a claim takes a place before it inserts, an eviction
    /// gives one back.
    held: AtomicUsize,
    calls: Box<[Mutex<CallIndex>]>,
    queue: Mutex<HashMap<CallId, CompensationEntry>>,
    journals: Mutex<Journals>,
}

impl Default for MemoryStore {
    fn default() -> MemoryStore {
        MemoryStore::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard lock cannot leave a record half-written (each update is a plain
    // assignment), so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl MemoryStore {
    /// An empty store, bounded by the records' `ttl`s alone.
    pub fn new() -> MemoryStore {
        MemoryStore::bounded(usize::MAX)
    }

    /// An empty store that holds `records` records at most (at least 1; see [Capacity](#capacity)).
    pub fn with_capacity(records: usize) -> MemoryStore {
        MemoryStore::bounded(records.clamp(1, usize::MAX - 1))
    }

    fn bounded(capacity: usize) -> MemoryStore {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            capacity,
            held: AtomicUsize::new(0),
            calls: (0..SHARDS).map(|_| Mutex::default()).collect(),
            queue: Mutex::default(),
            journals: Mutex::default(),
        }
    }

    /// How many records the store holds (expired ones not yet evicted included).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).records.len()).sum()
    }

    /// The records the store holds at most (`None`: bounded by their `ttl`s alone).
    pub fn capacity(&self) -> Option<usize> {
        (self.capacity != usize::MAX).then_some(self.capacity)
    }

    fn bounded_store(&self) -> bool {
        self.capacity != usize::MAX
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, digest: &Digest) -> MutexGuard<'_, Shard> {
        self.shard_at(shard_index(digest))
    }

    fn shard_at(&self, index: usize) -> MutexGuard<'_, Shard> {
        lock(&self.shards[index])
    }

    fn calls_of(&self, call_id: &CallId) -> MutexGuard<'_, CallIndex> {
        lock(&self.calls[((call_id.entropy() >> 40) % SHARDS as u64) as usize])
    }
}

/// The shard of `digest`. Chosen from other bits than the ones a shard's table hashes by (the first
/// digest bytes, the entropy's low bits), so that the keys of one shard still spread over its whole
/// table.
fn shard_index(digest: &Digest) -> usize {
    usize::from(digest[31]) % SHARDS
}

#[async_trait]
impl Store for MemoryStore {
    // The receipts (`receipts.rs`).

    async fn claim(&self, claim: Claim) -> Result<Claimed, StoreError> {
        self.claim_now(claim)
    }

    async fn take_over(
        &self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        self.take_over_now(key, expected, lease_ms, now_ms, false)
    }

    async fn reopen(
        &self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        self.take_over_now(key, expected, lease_ms, now_ms, true)
    }

    async fn extend_lease(
        &self,
        key: &Key,
        fence: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.extend_lease_now(key, fence, lease_ms, now_ms)
    }

    async fn complete(
        &self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        self.complete_now(key, fence, completion, now_ms)
    }

    async fn mark_unknown(
        &self,
        key: &Key,
        fence: Fence,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        self.mark_unknown_now(key, fence, now_ms)
    }

    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        self.release_now(key, fence)
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn forget(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        self.forget_now(key, fence)
    }

    async fn get(&self, key: &Key, now_ms: u64) -> Result<Option<Receipt>, StoreError> {
        self.get_now(key, now_ms)
    }

    async fn get_by_call_id(&self, call_id: &CallId) -> Result<Option<Receipt>, StoreError> {
        self.get_by_call_id_now(call_id)
    }

    async fn wait_settled(
        &self,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        self.settled_within(key, timeout, now_ms).await
    }

    // Listings and purges (`listings.rs`).

    async fn purge_expired(&self, now_ms: u64) -> Result<usize, StoreError> {
        self.purge_expired_now(now_ms)
    }

    async fn count_expired(&self, now_ms: u64) -> Result<usize, StoreError> {
        self.count_expired_now(now_ms)
    }

    async fn list_receipts(
        &self,
        query: &ReceiptQuery,
        now_ms: u64,
    ) -> Result<ReceiptPage, StoreError> {
        self.list_receipts_now(query, now_ms)
    }

    async fn list_orphans(&self, now_ms: u64, limit: usize) -> Result<Vec<Receipt>, StoreError> {
        self.list_orphans_now(now_ms, limit)
    }

    // The compensation queue (`queue.rs`).

    async fn enqueue_compensation(&self, entry: CompensationEntry) -> Result<(), StoreError> {
        self.enqueue_compensation_now(entry)
    }

    async fn take_due_compensations(
        &self,
        now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        self.take_due_compensations_now(now_ms, limit, lease_ms)
    }

    async fn reschedule_compensation(
        &self,
        call_id: &CallId,
        fence: Fence,
        round: u32,
        delay_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.reschedule_compensation_now(call_id, fence, round, delay_ms, now_ms)
    }

    async fn finish_compensation(
        &self,
        call_id: &CallId,
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        self.finish_compensation_now(call_id, fence)
    }

    async fn escalate_compensation(
        &self,
        call_id: &CallId,
        fence: Fence,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.escalate_compensation_now(call_id, fence, now_ms)
    }

    async fn list_compensations(&self) -> Result<Vec<CompensationEntry>, StoreError> {
        self.list_compensations_now()
    }

    // The journal (`journal.rs`).

    async fn append_journal(
        &self,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.append_journal_now(key, events, keep_ms, now_ms)
    }

    async fn journal(&self, key: &Key, now_ms: u64) -> Result<Vec<Event>, StoreError> {
        self.journal_now(key, now_ms)
    }

    async fn journaled_keys(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        self.journaled_keys_now(after, limit)
    }

    async fn journal_of_call(
        &self,
        call_id: &CallId,
        now_ms: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.journal_of_call_now(call_id, now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call_id::ShortLabel;
    use crate::store::Store;

    /// With a steady stream of new keys and a short TTL, claims alone (no purge) keep the store small:
    /// memory is bounded by the keys made within one TTL, not by all keys ever made.
    #[tokio::test]
    async fn eviction_on_claim_bounds_memory() {
        let store = MemoryStore::new();
        let node = ShortLabel::from_static("test");
        for i in 0..20_000u64 {
            let now = 1_000_000 + i;
            let key = Key::build("bounded", &i);
            let call_id = CallId::generate_at(ShortLabel::from_static("b"), node.clone(), now);
            let fence = match store.claim_now(Claim {
                key: key.clone(),
                call_id,
                fingerprint: None,
                lease_ms: 10,
                now_ms: now,
            }) {
                Ok(Claimed::Acquired(fence)) => fence,
                other => panic!("fresh key: {other:?}"),
            };
            let completion = Completion {
                state: ReceiptState::Success,
                outcome: None,
                ttl_ms: 100,
            };
            store.complete_now(&key, fence, completion, now).unwrap();
        }
        // 100 keys are live; a few more per shard wait for that shard's next claim.
        assert!(
            store.len() < 100 + SHARDS * EVICT_PER_CLAIM,
            "{} records",
            store.len()
        );
        let calls: usize = store.calls.iter().map(|c| lock(c).len()).sum();
        assert_eq!(
            calls,
            store.len(),
            "the callId index shrinks with the records"
        );
        assert!(store.purge_expired(u64::MAX).await.unwrap() > 0);
        assert!(store.is_empty());
    }

    /// `n` keys of `scope` that fall into one shard.
    fn same_shard(scope: &'static str, n: usize) -> Vec<Key> {
        let first = Key::build(scope, &0u64);
        let shard = shard_index(first.digest());
        (0u64..)
            .map(|i| Key::build(scope, &i))
            .filter(|k| shard_index(k.digest()) == shard)
            .take(n)
            .collect()
    }

    fn claim(store: &MemoryStore, key: &Key, now_ms: u64) -> Result<Claimed, StoreError> {
        store.claim_now(Claim {
            key: key.clone(),
            call_id: CallId::generate_at(
                ShortLabel::from_static("cap"),
                ShortLabel::from_static("test"),
                now_ms,
            ),
            fingerprint: None,
            lease_ms: 60_000,
            now_ms,
        })
    }

    fn finish(store: &MemoryStore, key: &Key, fence: Fence, now_ms: u64, ttl_ms: u64) {
        let completion = Completion {
            state: ReceiptState::Success,
            outcome: None,
            ttl_ms,
        };
        store.complete_now(key, fence, completion, now_ms).unwrap();
    }

    fn acquired(c: Result<Claimed, StoreError>) -> Fence {
        match c {
            Ok(Claimed::Acquired(fence)) => fence,
            other => panic!("a fresh key: {other:?}"),
        }
    }

    /// A lane entry names its record by slot and fence: one that outlived its receipt (forgotten,
    /// then claimed anew) never evicts the key's new record, which a lookup by its callId still finds
    /// (and the old callId no longer does); the key's fences keep growing across it all.
    #[tokio::test]
    async fn a_lane_entry_that_outlived_its_receipt_evicts_nothing() {
        let store = MemoryStore::new();
        let keys = same_shard("stale", 2);
        let (key, other) = (&keys[0], &keys[1]);
        let first_call = CallId::generate_at(
            ShortLabel::from_static("s"),
            ShortLabel::from_static("n"),
            10,
        );
        let claim_as = |call_id: &CallId, now_ms| {
            acquired(store.claim_now(Claim {
                key: key.clone(),
                call_id: call_id.clone(),
                fingerprint: None,
                lease_ms: 60_000,
                now_ms,
            }))
        };
        let first = claim_as(&first_call, 10);
        finish(&store, key, first, 10, 100);
        store.forget(key, first).await.unwrap();
        let second_call = CallId::generate_at(
            ShortLabel::from_static("s"),
            ShortLabel::from_static("n"),
            20,
        );
        let second = claim_as(&second_call, 20);
        assert!(
            second > first,
            "fences grow across a forget: {second:?} after {first:?}"
        );
        finish(&store, key, second, 20, 1_000);
        // The forgotten receipt's entry (expiring at 110) is due when the shard's next claim comes.
        acquired(claim(&store, other, 200));
        let kept = store
            .get(key, 200)
            .await
            .unwrap()
            .expect("the new record stays");
        assert_eq!(kept.call_id, second_call);
        let by_call = store.get_by_call_id(&second_call).await.unwrap();
        assert_eq!(by_call.map(|r| r.fence), Some(second));
        assert_eq!(store.get_by_call_id(&first_call).await.unwrap(), None);
        // Its own entry evicts it when it expires, and a claim after that gets a larger fence still.
        assert_eq!(store.purge_expired(1_020).await.unwrap(), 1);
        assert_eq!(store.get_by_call_id(&second_call).await.unwrap(), None);
        let third = claim_as(&first_call, 1_030);
        assert!(third > second);
    }

    /// Fences are counted per shard, and other keys of the owner's shard move the count while the
    /// owner stalls past its lease: the take-over still gets a larger fence than the owner's, every
    /// late write of the owner is fenced out, and the record it reads back is the new owner's outcome.
    #[tokio::test]
    async fn a_stalled_owner_is_fenced_out_whatever_its_shard_counted_meanwhile() {
        let store = MemoryStore::new();
        let keys = same_shard("stall", 4);
        let key = &keys[0];
        let owner = acquired(claim(&store, key, 10));
        // While it stalls, its shard's other keys are claimed and finished.
        for (i, other) in keys[1..].iter().enumerate() {
            let t = 20 + i as u64;
            let f = acquired(claim(&store, other, t));
            finish(&store, other, f, t, 86_400_000);
        }
        // Its lease (60 s) ends; another caller takes the key over.
        let past = 10 + 60_000 + 1;
        let Ok(Claimed::Acquired(taker)) = store.take_over(key, owner, 60_000, past).await else {
            panic!("an ended lease is taken over");
        };
        assert!(taker > owner);
        let fenced = |e| {
            matches!(e, Err(StoreError::Fenced { presented, current })
            if presented == owner.0 && current == taker.0)
        };
        assert!(fenced(store.extend_lease(key, owner, 60_000, past).await));
        let late = Completion {
            state: ReceiptState::Failed,
            outcome: None,
            ttl_ms: 86_400_000,
        };
        assert!(fenced(
            store.complete_now(key, owner, late, past).map(|_| ())
        ));
        assert!(fenced(store.release(key, owner).await));
        let settled = Completion {
            state: ReceiptState::Success,
            outcome: Some(Arc::from(&b"500"[..])),
            ttl_ms: 86_400_000,
        };
        store.complete_now(key, taker, settled, past + 1).unwrap();
        let read = store.get(key, past + 2).await.unwrap().expect("the record");
        assert_eq!(read.state, ReceiptState::Success);
        assert_eq!(read.fence, taker);
        assert_eq!(read.outcome.as_deref(), Some(&b"500"[..]));
    }

    /// A full store evicts a finished receipt of the new key's shard, the first finished first,
    /// expired or not; it never evicts a call in flight or an `UNKNOWN`, and refuses a claim instead.
    #[tokio::test]
    async fn a_full_store_evicts_finished_receipts_oldest_first_and_never_a_call_in_flight() {
        let store = MemoryStore::with_capacity(3);
        assert_eq!(store.capacity(), Some(3));
        let keys = same_shard("cap", 7);
        // Three finished receipts, finished at t = 10, 20, 30 (the second with the shorter ttl: the
        // order is by when they finished).
        for (i, key) in keys[..3].iter().enumerate() {
            let t = 10 * (i as u64 + 1);
            let f = acquired(claim(&store, key, t));
            finish(
                &store,
                key,
                f,
                t,
                if i == 1 { 3_600_000 } else { 86_400_000 },
            );
        }
        // The fourth key makes room by evicting the first to finish.
        let f3 = acquired(claim(&store, &keys[3], 40));
        assert_eq!(store.get(&keys[0], 40).await.unwrap(), None, "evicted");
        assert!(store.get(&keys[1], 40).await.unwrap().is_some());
        assert_eq!(store.len(), 3);
        // A claim in flight and an UNKNOWN are never evicted.
        let f4 = acquired(claim(&store, &keys[4], 50));
        store.mark_unknown(&keys[4], f4, 50).await.unwrap();
        assert_eq!(store.get(&keys[1], 50).await.unwrap(), None, "evicted next");
        acquired(claim(&store, &keys[5], 60));
        assert_eq!(store.get(&keys[2], 60).await.unwrap(), None);
        // Now the store holds only calls in flight and an UNKNOWN: the claim is refused, and
        // nothing held is lost.
        assert_eq!(
            claim(&store, &keys[6], 70),
            Err(StoreError::Full { capacity: 3 })
        );
        for key in &keys[3..6] {
            assert!(store.get(key, 70).await.unwrap().is_some());
        }
        // A duplicate of a held key still gets its record.
        assert!(matches!(
            claim(&store, &keys[3], 70),
            Ok(Claimed::Existing(_))
        ));
        // Once one finishes, the next claim has room.
        finish(&store, &keys[3], f3, 80, 86_400_000);
        acquired(claim(&store, &keys[6], 90));
        assert_eq!(store.get(&keys[3], 90).await.unwrap(), None);
        assert_eq!(store.len(), 3);
    }

    /// The bound is the store's, not a shard's: a store of 100 takes 100 calls in flight wherever
    /// their keys fall, refuses the 101st, and a new key whose shard holds nothing finished evicts
    /// the store's oldest finished receipt.
    #[tokio::test]
    async fn the_bound_is_the_whole_stores() {
        let store = MemoryStore::with_capacity(100);
        let fences: Vec<Fence> = (0..100u64)
            .map(|i| acquired(claim(&store, &Key::build("whole", &i), 10 + i)))
            .collect();
        assert_eq!(
            claim(&store, &Key::build("whole", &100u64), 200),
            Err(StoreError::Full { capacity: 100 })
        );
        // Two finish, the first at 300; a key of a shard holding neither takes the older's place.
        let (first, second) = (Key::build("whole", &0u64), Key::build("whole", &1u64));
        finish(&store, &first, fences[0], 300, 86_400_000);
        finish(&store, &second, fences[1], 310, 86_400_000);
        let shard = |k: &Key| shard_index(k.digest());
        let (a, b) = (shard(&first), shard(&second));
        let newcomer = (1_000u64..)
            .map(|i| Key::build("whole", &i))
            .find(|k| {
                let s = shard(k);
                s != a && s != b && lock(&store.shards[s]).records.len() == 0
            })
            .unwrap();
        acquired(claim(&store, &newcomer, 400));
        assert_eq!(
            store.get(&first, 400).await.unwrap(),
            None,
            "the oldest went"
        );
        assert!(store.get(&second, 400).await.unwrap().is_some());
        assert_eq!(store.len(), 100);
    }

    /// At steady state a bounded store holds its capacity, whatever the ttl.
    #[test]
    fn a_bounded_store_stays_within_its_capacity() {
        let store = MemoryStore::with_capacity(1_000);
        for i in 0..50_000u64 {
            let key = Key::build("steady", &i);
            let Ok(Claimed::Acquired(fence)) = claim(&store, &key, i) else {
                panic!("fresh key")
            };
            finish(&store, &key, fence, i, 86_400_000);
        }
        assert_eq!(store.len(), 1_000);
        let lanes: usize = store.shards.iter().map(|s| lock(s).finished.len()).sum();
        assert_eq!(lanes, store.len(), "every evicted receipt left its lane");
    }

    /// A waiter registered on a claim is woken by whatever happens to the key next, even when the
    /// record it looked at is released and the key claimed anew before anything settles: it then
    /// answers the new record (or its absence) at once instead of sleeping out its timeout.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_woken_across_a_release_and_a_new_claim() {
        let store = Arc::new(MemoryStore::new());
        let key = Key::build("wake", &1u64);
        let claim = |call: &str| Claim {
            key: key.clone(),
            call_id: CallId::new("w", call).unwrap(),
            fingerprint: None,
            lease_ms: 60_000,
            now_ms: 1_000,
        };
        let Ok(Claimed::Acquired(first)) = store.claim_now(claim("first")) else {
            panic!("fresh key")
        };
        let waiter = tokio::spawn({
            let (store, key) = (store.clone(), key.clone());
            async move {
                let started = tokio::time::Instant::now();
                let out = store
                    .wait_settled(&key, Duration::from_secs(30), 1_000)
                    .await;
                (out, started.elapsed())
            }
        });
        tokio::task::yield_now().await;
        store.release(&key, first).await.unwrap();
        let Ok(Claimed::Acquired(_)) = store.claim_now(claim("second")) else {
            panic!("released key")
        };
        let (out, waited) = waiter.await.unwrap();
        assert!(
            waited < Duration::from_secs(1),
            "woken at once, after {waited:?}"
        );
        let record = out.unwrap();
        assert!(record.is_none_or(|r| r.call_id.to_string().contains("second")));
    }

    /// Defect 4 of issue 24: a bounded store that is full evicts the oldest finished receipt for a
    /// new key, and used to evict one whose duplicates had just been woken by its completion and had
    /// not read it yet: they found nothing and ran the call again. The settled record is handed to
    /// them with the wake-up.
    #[tokio::test(start_paused = true)]
    async fn a_full_store_never_takes_a_settled_record_from_its_waiters() {
        let store = Arc::new(MemoryStore::with_capacity(1));
        let keys = same_shard("handed", 2);
        let fence = acquired(claim(&store, &keys[0], 1_000));
        let waiter = tokio::spawn({
            let (store, key) = (store.clone(), keys[0].clone());
            async move {
                store
                    .wait_settled(&key, Duration::from_secs(30), 1_000)
                    .await
            }
        });
        tokio::task::yield_now().await;
        finish(&store, &keys[0], fence, 1_010, 60_000);
        // Before the waiter reads, a new key takes the only place: the settled record goes.
        acquired(claim(&store, &keys[1], 1_011));
        assert_eq!(store.get(&keys[0], 1_011).await.unwrap(), None, "evicted");
        let settled = waiter.await.unwrap().unwrap().expect("the settled record");
        assert_eq!(settled.state, ReceiptState::Success);
        assert_eq!(settled.fence, fence);
    }

    mod model;
}
