//! [`MemoryStore`] and what it needs; its documentation is on the type, where users read it.

use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

use super::{Claim, Claimed, Completion, Cursor, ReceiptPage, ReceiptQuery, Store};
use crate::call_id::CallId;
use crate::codec::Kept;
use crate::compensation::{CompensationEntry, CompensationState};
use crate::error::StoreError;
use crate::journal::{Event, JOURNAL_LIMIT};
use crate::key::Key;
use crate::receipt::{Fence, Receipt, ReceiptState, Transition};

mod calls;
mod finished;
mod records;

use calls::{CallIndex, Place};
use finished::Lanes;
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
    receipt: Receipt,
    /// The duplicates parked on this record while it is `PROCESSING`.
    waiters: Option<Arc<Waiters>>,
    /// The `SUCCESS` outcome decoded by a replay, for the next ones (see `Keeper`): lives and dies
    /// with the record, which never changes once it succeeded.
    kept: Option<Kept>,
}

impl Entry {
    /// Wakes the record's waiters after a change. A record that settled (no longer `PROCESSING`) is
    /// handed to them with the wake-up, and waiters that come after (the record taken over,
    /// `PROCESSING` again) wait on a new [`Waiters`] of their own. A record still `PROCESSING` (taken
    /// over by a new owner) keeps its waiters: they look again, and whatever the new owner settles is
    /// handed to them too, even if a full store evicts it before they read.
    fn wake(&mut self) {
        if self.receipt.state == ReceiptState::Processing {
            if let Some(waiters) = &self.waiters {
                waiters.notify.notify_waiters();
            }
        } else if let Some(waiters) = self.waiters.take() {
            let _ = waiters.settled.set(self.receipt.clone());
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
    /// Entries are boxed: a probe then touches small buckets, and a growing table moves pointers, not
    /// receipts. Found by the digest each holds.
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
    fn take_finished(
        &mut self,
        mut next: impl FnMut(&mut Lanes) -> Option<finished::Finished>,
    ) -> Option<Box<Entry>> {
        while let Some((at, hashed)) = next(&mut self.finished) {
            if let Some(entry) = self.records.remove_finished(hashed, at) {
                return Some(entry);
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
/// so memory stays bounded by the keys claimed within one `ttl`. Claims and `UNKNOWN` records never
/// expire. Waiters on a busy key park on a per-key [`Notify`] that every change of the record wakes:
/// no polling.
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

    /// Removes the record of `digest` (and its callId index entry), waking its waiters.
    fn remove(&self, shard: &mut Shard, digest: &Digest) {
        if let Some(mut entry) = shard.records.remove(digest) {
            self.let_go(&mut entry, false);
        }
    }

    /// What goes with a record removed from its shard: its waiters woken, its callId index entry,
    /// and, in a bounded store, its place, unless `keep_place` (the caller's new record takes it).
    fn let_go(&self, entry: &mut Entry, keep_place: bool) {
        entry.wake();
        let receipt = &entry.receipt;
        self.calls_of(&receipt.call_id)
            .remove(&receipt.call_id, Place::of(receipt.key.digest()));
        if !keep_place && self.bounded_store() {
            self.held.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Evicts up to `limit` records of `shard` that expired before `now_ms`; returns how many.
    fn evict(&self, shard: &mut Shard, now_ms: u64, limit: usize) -> usize {
        let mut evicted = 0;
        while evicted < limit {
            let Some(mut entry) = shard.take_finished(|lanes| lanes.pop_expired(now_ms)) else {
                break;
            };
            self.let_go(&mut entry, false);
            evicted += 1;
        }
        evicted
    }

    /// Evicts `shard`'s finished record that finished first; `keep_place`: its place goes to the
    /// caller's new record (the store's count does not move). `false` if it holds none (every record
    /// in flight or `UNKNOWN`).
    fn make_room(&self, shard: &mut Shard, keep_place: bool) -> bool {
        let Some(mut entry) = shard.take_finished(Lanes::pop_oldest) else {
            return false;
        };
        self.let_go(&mut entry, keep_place);
        true
    }

    /// Takes a place for a new record of `shard`, making room there when the store is full. `false`
    /// if the store is full and `shard` holds nothing it may evict. At steady state (full) a claim
    /// takes the place of the receipt it evicts, and the shared count is only read.
    fn take_place(&self, shard: &mut Shard) -> bool {
        if !self.bounded_store() {
            return true;
        }
        let mut held = self.held.load(Ordering::Acquire);
        while held < self.capacity {
            match self.held.compare_exchange_weak(
                held,
                held + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => held = now,
            }
        }
        self.make_room(shard, true)
    }

    /// Evicts the finished record that finished first in the whole store, one shard locked at a time
    /// (the caller holds none). `false` if the store holds none.
    fn make_room_anywhere(&self) -> bool {
        loop {
            let oldest = self
                .shards
                .iter()
                .enumerate()
                .filter_map(|(i, shard)| lock(shard).finished.oldest().map(|at| (at, i)))
                .min();
            let Some((_, i)) = oldest else {
                return false;
            };
            if self.make_room(&mut self.shard_at(i), false) {
                return true;
            }
            // That shard's oldest went meanwhile: look again.
        }
    }

    fn owned<'a>(
        shard: &'a mut Shard,
        key: &Key,
        fence: Fence,
    ) -> Result<&'a mut Entry, StoreError> {
        let entry = shard
            .records
            .get_mut(key.digest())
            .ok_or(StoreError::NotFound)?;
        if entry.receipt.fence != fence {
            return Err(StoreError::Fenced {
                presented: fence.0,
                current: entry.receipt.fence.0,
            });
        }
        Ok(entry)
    }

    /// The record of `key` if it is live at `now_ms`, or, when it is `PROCESSING`, a registration for
    /// its next change. The registration is made and enabled under the shard's lock, which every
    /// change holds while it wakes the waiters: no change can fall between the look and the
    /// registration, and a record replaced meanwhile (released and claimed anew) is never waited on.
    fn settled_or_waiter(&self, key: &Key, now_ms: u64) -> Result<Option<Receipt>, Waiting> {
        let mut shard = self.shard(key.digest());
        match shard.records.get_mut(key.digest()) {
            Some(entry) if !entry.receipt.expired(now_ms) => {
                if entry.receipt.state == ReceiptState::Processing {
                    let waiters = entry.waiters.get_or_insert_with(Default::default).clone();
                    let mut waiter = Box::pin(waiters.notify.clone().notified_owned());
                    waiter.as_mut().enable();
                    Err((waiter, waiters))
                } else {
                    Ok(Some(entry.receipt.clone()))
                }
            }
            _ => Ok(None),
        }
    }

    /// [`Store::claim`], without the future: the runtime calls it directly on its default store.
    pub(crate) fn claim_now(&self, claim: Claim) -> Result<Claimed, StoreError> {
        let digest = *claim.key.digest();
        let mut looked_elsewhere = 0;
        let mut shard = loop {
            let mut shard = self.shard(&digest);
            self.evict(&mut shard, claim.now_ms, EVICT_PER_CLAIM);
            if let Some(entry) = shard.records.get(&digest) {
                if !entry.receipt.expired(claim.now_ms) {
                    return Ok(Claimed::Existing(entry.receipt.clone()));
                }
                self.remove(&mut shard, &digest);
            }
            if self.take_place(&mut shard) {
                break shard;
            }
            // Full, and nothing this shard may evict: evict elsewhere (this shard's lock given back
            // first: one shard locked at a time), then look at the key again. A few rounds lost to
            // other claims taking the room first end as full.
            drop(shard);
            looked_elsewhere += 1;
            if looked_elsewhere > 3 || !self.make_room_anywhere() {
                return Err(StoreError::Full {
                    capacity: self.capacity as u64,
                });
            }
        };
        let fence = next_fence(&mut shard.fence);
        self.calls_of(&claim.call_id)
            .insert(&claim.call_id, Place::of(&digest));
        shard.records.insert_new(Box::new(Entry {
            receipt: Receipt {
                key: claim.key,
                call_id: claim.call_id,
                state: ReceiptState::Processing,
                fence,
                lease_until_ms: Some(claim.now_ms.saturating_add(claim.lease_ms)),
                expires_at_ms: None,
                fingerprint: claim.fingerprint,
                outcome: None,
                created_ms: claim.now_ms,
                updated_ms: claim.now_ms,
            },
            waiters: None,
            kept: None,
        }));
        Ok(Claimed::Acquired(fence))
    }

    /// What `read` makes of the fingerprint and the stored result of `key`'s `SUCCESS` receipt, if
    /// the store holds one live at `now_ms` (a replay answered without a claim), and of the slot
    /// where replays keep that result decoded (see `Keeper`). `read` runs under the shard's lock:
    /// keep it short.
    pub(crate) fn read_success<R>(
        &self,
        key: &Key,
        now_ms: u64,
        read: impl FnOnce(Option<crate::key::Fingerprint>, &[u8], &mut Option<Kept>) -> Option<R>,
    ) -> Option<R> {
        let mut shard = self.shard(key.digest());
        let Entry { receipt, kept, .. } = shard.records.get_mut(key.digest())?;
        if receipt.state != ReceiptState::Success || receipt.expired(now_ms) {
            return None;
        }
        read(receipt.fingerprint, receipt.outcome.as_deref()?, kept)
    }

    /// [`Store::complete`], without the future.
    pub(crate) fn complete_now(
        &self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let mut shard = self.shard(key.digest());
        let entry = Self::owned(&mut shard, key, fence)?;
        let transition = check(entry.receipt.state, completion.state)?;
        if transition == Transition::Applied {
            let r = &mut entry.receipt;
            r.state = completion.state;
            r.outcome = completion.outcome;
            r.lease_until_ms = None;
            let expires_at_ms = now_ms.saturating_add(completion.ttl_ms);
            r.expires_at_ms = Some(expires_at_ms);
            r.updated_ms = now_ms;
            entry.wake();
            shard.finished.push(
                completion.ttl_ms,
                expires_at_ms,
                records::hash(key.digest()),
            );
        }
        Ok(transition)
    }
}

/// The shard of `digest`. Chosen from other bits than the ones a shard's table hashes by (the first
/// digest bytes, the entropy's low bits), so that the keys of one shard still spread over its whole
/// table.
fn shard_index(digest: &Digest) -> usize {
    usize::from(digest[31]) % SHARDS
}

/// A fence larger than any its shard gave out (`last`: the shard's last one).
fn next_fence(last: &mut u64) -> Fence {
    *last += 1;
    Fence(*last)
}

fn check(from: ReceiptState, to: ReceiptState) -> Result<Transition, StoreError> {
    from.advance(to).map_err(|e| StoreError::InvalidTransition {
        from: e.from,
        to: e.to,
    })
}

#[async_trait]
impl Store for MemoryStore {
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
        let mut shard = self.shard(key.digest());
        let Shard { records, fence, .. } = &mut *shard;
        let entry = records.get_mut(key.digest()).ok_or(StoreError::NotFound)?;
        let r = &mut entry.receipt;
        let open = match r.state {
            ReceiptState::Unknown => true,
            ReceiptState::Received | ReceiptState::Processing => !r.lease_alive(now_ms),
            ReceiptState::Success | ReceiptState::Failed => false,
        };
        if r.fence != expected || !open {
            return Ok(Claimed::Existing(r.clone()));
        }
        r.fence = next_fence(fence);
        r.state = ReceiptState::Processing;
        r.lease_until_ms = Some(now_ms.saturating_add(lease_ms));
        r.updated_ms = now_ms;
        let fence = r.fence;
        entry.wake();
        Ok(Claimed::Acquired(fence))
    }

    async fn extend_lease(
        &self,
        key: &Key,
        fence: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut shard = self.shard(key.digest());
        let entry = Self::owned(&mut shard, key, fence)?;
        if entry.receipt.state != ReceiptState::Processing {
            return Err(StoreError::InvalidTransition {
                from: entry.receipt.state,
                to: ReceiptState::Processing,
            });
        }
        entry.receipt.lease_until_ms = Some(now_ms.saturating_add(lease_ms));
        Ok(())
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
        let mut shard = self.shard(key.digest());
        let entry = Self::owned(&mut shard, key, fence)?;
        let transition = check(entry.receipt.state, ReceiptState::Unknown)?;
        if transition == Transition::Applied {
            let r = &mut entry.receipt;
            r.state = ReceiptState::Unknown;
            r.lease_until_ms = None;
            r.expires_at_ms = None;
            r.updated_ms = now_ms;
            entry.wake();
        }
        Ok(transition)
    }

    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        let mut shard = self.shard(key.digest());
        let entry = match Self::owned(&mut shard, key, fence) {
            Ok(entry) => entry,
            Err(StoreError::NotFound) => return Ok(()),
            Err(e) => return Err(e),
        };
        if entry.receipt.state != ReceiptState::Processing {
            return Err(StoreError::InvalidTransition {
                from: entry.receipt.state,
                to: ReceiptState::Received,
            });
        }
        self.remove(&mut shard, key.digest());
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn forget(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        let mut shard = self.shard(key.digest());
        let entry = Self::owned(&mut shard, key, fence)?;
        if !entry.receipt.state.is_terminal() {
            return Err(StoreError::InvalidTransition {
                from: entry.receipt.state,
                to: ReceiptState::Received,
            });
        }
        self.remove(&mut shard, key.digest());
        Ok(())
    }

    async fn get(&self, key: &Key, now_ms: u64) -> Result<Option<Receipt>, StoreError> {
        let shard = self.shard(key.digest());
        Ok(shard
            .records
            .get(key.digest())
            .filter(|e| !e.receipt.expired(now_ms))
            .map(|e| e.receipt.clone()))
    }

    async fn get_by_call_id(&self, call_id: &CallId) -> Result<Option<Receipt>, StoreError> {
        // Looked up first, each shard locked after the index's lock is given back (a claim takes them
        // the other way round).
        let candidates = self.calls_of(call_id).candidates(call_id);
        Ok(candidates.into_iter().find_map(|place| {
            let shard = self.shard_at(usize::from(place.shard));
            shard
                .records
                .of_call(place.hash, call_id)
                .map(|e| e.receipt.clone())
        }))
    }

    async fn wait_settled(
        &self,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        let (notified, waiters) = match self.settled_or_waiter(key, now_ms) {
            Ok(settled) => return Ok(settled),
            Err(waiting) => waiting,
        };
        let started = tokio::time::Instant::now();
        let _ = tokio::time::timeout(timeout, notified).await;
        if let Some(settled) = waiters.settled.get() {
            return Ok(Some(settled.clone()));
        }
        let waited = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.get(key, now_ms.saturating_add(waited)).await
    }

    async fn purge_expired(&self, now_ms: u64) -> Result<usize, StoreError> {
        let mut total = 0;
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            total += self.evict(&mut shard, now_ms, usize::MAX);
        }
        self.purge_journals(now_ms);
        Ok(total)
    }

    async fn count_expired(&self, now_ms: u64) -> Result<usize, StoreError> {
        Ok(self
            .shards
            .iter()
            .map(|shard| {
                lock(shard)
                    .records
                    .values()
                    .filter(|e| e.receipt.expired(now_ms))
                    .count()
            })
            .sum())
    }

    async fn list_receipts(
        &self,
        query: &ReceiptQuery,
        now_ms: u64,
    ) -> Result<ReceiptPage, StoreError> {
        let listed = |r: &Receipt| {
            (query.since_ms..query.until_ms).contains(&r.created_ms)
                && !r.expired(now_ms)
                && query.after.is_none_or(|after| Cursor::of(r) > after)
        };
        // One pass over the records keeps the first `limit + 1` positions (a bounded max-heap), and
        // only the page's receipts are copied: no index to keep up on the claim path, and a page of
        // 10⁶ receipts costs one scan, not a sort of them all. Most records are passed over on their
        // creation time alone.
        let limit = query.limit.max(1);
        let from_ms = query
            .after
            .map_or(query.since_ms, |c| c.created_ms.max(query.since_ms));
        let mut first: BinaryHeap<Cursor> = BinaryHeap::with_capacity(limit + 2);
        let mut bound = query.until_ms;
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for entry in shard.records.values() {
                let r = &entry.receipt;
                if r.created_ms < from_ms || r.created_ms >= bound || !listed(r) {
                    continue;
                }
                let at = Cursor::of(r);
                if first.len() <= limit {
                    first.push(at);
                } else if first.peek().is_some_and(|last| at < *last) {
                    first.pop();
                    first.push(at);
                }
                if first.len() > limit {
                    // Nothing created after the heap's last can enter it any more.
                    bound = first.peek().map_or(bound, |last| last.created_ms + 1);
                }
            }
        }
        let mut page = first.into_sorted_vec();
        let next = (page.len() > limit).then(|| page[limit - 1]);
        page.truncate(limit);
        let receipts = page
            .iter()
            .filter_map(|at| {
                let shard = self.shard(&at.digest);
                let r = &shard.records.get(&at.digest)?.receipt;
                (listed(r) && Cursor::of(r) == *at && query.admits(r)).then(|| r.clone())
            })
            .collect();
        Ok(ReceiptPage { receipts, next })
    }

    async fn list_orphans(&self, now_ms: u64, limit: usize) -> Result<Vec<Receipt>, StoreError> {
        let mut orphans =
            self.receipts_where(|r| r.state == ReceiptState::Processing && !r.lease_alive(now_ms));
        // After the shards' locks are released: the queue's lock is never taken under one.
        let queue = lock(&self.queue);
        orphans.retain(|r| !queue.contains_key(&r.call_id));
        drop(queue);
        orphans.sort_by_key(|r| r.lease_until_ms);
        orphans.truncate(limit);
        Ok(orphans)
    }

    async fn enqueue_compensation(&self, entry: CompensationEntry) -> Result<(), StoreError> {
        lock(&self.queue)
            .entry(entry.call_id.clone())
            .or_insert(entry);
        Ok(())
    }

    async fn take_due_compensations(
        &self,
        now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        let lease_until_ms = now_ms.saturating_add(lease_ms);
        let mut queue = lock(&self.queue);
        let mut due: Vec<&mut CompensationEntry> = queue
            .values_mut()
            .filter(|e| match e.state {
                CompensationState::Pending => e.next_at_ms <= now_ms,
                CompensationState::Taken { lease_until_ms } => lease_until_ms <= now_ms,
                CompensationState::Manual => false,
            })
            .collect();
        due.sort_by_key(|e| (e.next_at_ms, e.enqueued_ms));
        Ok(due
            .into_iter()
            .take(limit)
            .map(|e| {
                e.state = CompensationState::Taken { lease_until_ms };
                e.fence = Fence(e.fence.0 + 1);
                e.clone()
            })
            .collect())
    }

    async fn reschedule_compensation(
        &self,
        call_id: &CallId,
        fence: Fence,
        round: u32,
        delay_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut queue = lock(&self.queue);
        let entry = held_entry(&mut queue, call_id, fence)?;
        entry.round = round;
        entry.next_at_ms = now_ms.saturating_add(delay_ms);
        entry.state = CompensationState::Pending;
        Ok(())
    }

    async fn finish_compensation(
        &self,
        call_id: &CallId,
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        let mut queue = lock(&self.queue);
        if let (Some(fence), Some(entry)) = (fence, queue.get(call_id)) {
            if entry.fence != fence {
                return Err(StoreError::Fenced {
                    presented: fence.0,
                    current: entry.fence.0,
                });
            }
        }
        queue.remove(call_id);
        Ok(())
    }

    async fn escalate_compensation(
        &self,
        call_id: &CallId,
        fence: Fence,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut queue = lock(&self.queue);
        let entry = held_entry(&mut queue, call_id, fence)?;
        entry.state = CompensationState::Manual;
        entry.next_at_ms = now_ms;
        Ok(())
    }

    async fn list_compensations(&self) -> Result<Vec<CompensationEntry>, StoreError> {
        let mut all: Vec<CompensationEntry> = lock(&self.queue).values().cloned().collect();
        all.sort_by_key(|e| e.enqueued_ms);
        Ok(all)
    }

    async fn append_journal(
        &self,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut journals = lock(&self.journals);
        let Journals { by_key, calls } = &mut *journals;
        let journal = by_key.entry(*key.digest()).or_default();
        journal.keep_until_ms = journal.keep_until_ms.max(now_ms.saturating_add(keep_ms));
        for event in events {
            calls.insert(event.call_id.clone(), *key.digest());
            journal.events.push_back(event.clone());
        }
        let excess = journal.events.len().saturating_sub(JOURNAL_LIMIT);
        journal.events.drain(..excess);
        Ok(())
    }

    async fn journal(&self, key: &Key, now_ms: u64) -> Result<Vec<Event>, StoreError> {
        Ok(self.journal_where(key.digest(), now_ms, |_| true))
    }

    async fn journaled_keys(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        let journals = lock(&self.journals);
        Ok(super::page_of_keys(
            journals.by_key.keys().copied(),
            after,
            limit,
        ))
    }

    async fn journal_of_call(
        &self,
        call_id: &CallId,
        now_ms: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let Some(digest) = lock(&self.journals).calls.get(call_id).copied() else {
            return Ok(Vec::new());
        };
        Ok(self.journal_where(&digest, now_ms, |e| &e.call_id == call_id))
    }
}

/// The journals of the in-memory store, and which key each callId's events are under.
#[derive(Default)]
struct Journals {
    by_key: FastMap<Digest, KeyJournal>,
    calls: FastMap<CallId, Digest>,
}

#[derive(Default)]
struct KeyJournal {
    events: VecDeque<Event>,
    keep_until_ms: u64,
}

impl MemoryStore {
    /// Whether `digest` has a live record at `now_ms` (taking its shard's lock: never call it holding
    /// the journals' lock).
    fn holds(&self, digest: &Digest, now_ms: u64) -> bool {
        self.shard(digest)
            .records
            .get(digest)
            .is_some_and(|e| !e.receipt.expired(now_ms))
    }

    /// The events `keep` admits of the journal of `digest`, if it is still kept at `now_ms`.
    fn journal_where(
        &self,
        digest: &Digest,
        now_ms: u64,
        keep: impl Fn(&Event) -> bool,
    ) -> Vec<Event> {
        let held = self.holds(digest, now_ms);
        let journals = lock(&self.journals);
        match journals.by_key.get(digest) {
            Some(j) if held || j.keep_until_ms > now_ms => {
                j.events.iter().filter(|e| keep(e)).cloned().collect()
            }
            _ => Vec::new(),
        }
    }

    /// Drops the journals kept past `keep_ms` whose key holds no live record.
    fn purge_journals(&self, now_ms: u64) {
        let due: Vec<Digest> = lock(&self.journals)
            .by_key
            .iter()
            .filter(|(_, j)| j.keep_until_ms <= now_ms)
            .map(|(digest, _)| *digest)
            .collect();
        let dead: Vec<Digest> = due.into_iter().filter(|d| !self.holds(d, now_ms)).collect();
        let mut journals = lock(&self.journals);
        let Journals { by_key, calls } = &mut *journals;
        for digest in dead {
            // Appended to meanwhile: kept.
            if by_key
                .get(&digest)
                .is_some_and(|j| j.keep_until_ms <= now_ms)
            {
                if let Some(j) = by_key.remove(&digest) {
                    for e in j.events {
                        if calls.get(&e.call_id) == Some(&digest) {
                            calls.remove(&e.call_id);
                        }
                    }
                }
            }
        }
    }
}

impl MemoryStore {
    /// Every record `keep` admits, one shard locked at a time.
    fn receipts_where(&self, keep: impl Fn(&Receipt) -> bool) -> Vec<Receipt> {
        let mut kept = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            kept.extend(
                shard
                    .records
                    .values()
                    .map(|e| &e.receipt)
                    .filter(|r| keep(r))
                    .cloned(),
            );
        }
        kept
    }
}

/// The queued entry of `call_id`, if the worker that presents `fence` still holds it.
// A callId's cached text form takes no part in its `Hash` and `Eq`: it is a key that does not change.
#[allow(clippy::mutable_key_type)]
fn held_entry<'q>(
    queue: &'q mut HashMap<CallId, CompensationEntry>,
    call_id: &CallId,
    fence: Fence,
) -> Result<&'q mut CompensationEntry, StoreError> {
    let entry = queue.get_mut(call_id).ok_or(StoreError::NotFound)?;
    if entry.fence != fence {
        return Err(StoreError::Fenced {
            presented: fence.0,
            current: entry.fence.0,
        });
    }
    Ok(entry)
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

    /// A lane entry names its record by hash and expiry: one that outlived its receipt (forgotten,
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
}
