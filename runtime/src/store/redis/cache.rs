//! [`CachedStore`]: a front cache in Redis over a durable store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Semaphore;

use super::RedisStore;
use crate::call_id::CallId;
use crate::error::StoreError;
use crate::key::Key;
use crate::receipt::{Fence, Receipt, Transition};
use crate::store::{
    get_each_by_call_id, Claim, ClaimTracker, Claimed, Completion, Store, StoreClock, StoreWrapper,
};

/// A front cache over a durable store: replays and receipt queries are served from Redis, and the
/// durable store still decides every claim.
///
/// Only finished receipts (`SUCCESS`, `FAILED`) are cached: they never change again (transitions only
/// move forward), so an entry is never stale; it expires with the receipt. An entry is written only
/// after the durable store committed the receipt, never before:
///
/// - **on completion**: when a call that claimed its key through this store completes, the receipt is
///   written to Redis in a task of its own once the durable store's completion returned, so that the
///   first replay is already served from Redis and the caller does not wait for the cache;
/// - **read-through**: a finished receipt the durable store answers (a replay that missed the cache, a
///   receipt query, a key completed by another process) is written in a task of its own too, to
///   expire when the durable store's clock says the receipt does (it asks that store for its time;
///   a query by callId carries no time of the caller's, and gives a durable store that takes the
///   caller's time the system clock's).
///
/// A key [forgotten](Store::forget) through this store goes from the cache at once: the forget waits
/// for this instance's background writes, and none of them writes an answer the durable store gave
/// before the forget (a read, a claim or a completion still on its way) after it. Another instance
/// over the same cache may still write one it read just before the forget, replayed until that entry
/// expires.
///
/// A cache that is down or answers nonsense is logged and bypassed for a cool-down (5 s): every
/// operation then goes to the durable store. Background writes are bounded (at most 1,024 in flight;
/// beyond that a completion is left to read-through); [`CachedStore::flush`] waits for them, for
/// tests and before a shutdown.
pub struct CachedStore<D> {
    /// The durable store, through what the claims taken through this store know of their receipts,
    /// so that a completion's receipt can be cached.
    durable: Arc<ClaimTracker<D>>,
    cache: Arc<Cache>,
}

/// How long a cache entry is kept.
enum Keep {
    /// This long (a completion: its ttl).
    For(u64),
    /// Until the receipt expires by the durable store's clock (asked with this caller's time).
    UntilExpiry(u64),
}

/// The Redis side of a [`CachedStore`], shared with its background writes.
struct Cache {
    redis: RedisStore,
    /// After a cache failure, the cache is bypassed until this many ms after `epoch`, so that a cache
    /// that is down costs one failed request per cool-down, not one per call.
    bypass_until: AtomicU64,
    epoch: std::time::Instant,
    /// One permit per background cache write that may be in flight.
    writes: Arc<Semaphore>,
    /// How many forgets went through this store: a receipt the durable store answered to an
    /// operation that started before one is not written to the cache after it.
    forgets: AtomicU64,
}

/// How long a failed cache is bypassed before it is tried again.
const CACHE_COOL_DOWN: Duration = Duration::from_secs(5);

/// At most this many background cache writes in flight; completions beyond it are cached on read.
const MAX_BACKGROUND_WRITES: usize = 1024;

impl<D: Store> CachedStore<D> {
    /// `durable` behind a cache at `redis_url`, with keys prefixed `samekey-cache`. A cache may evict
    /// and need not persist (the durable store decides every claim): its settings are not checked.
    pub async fn connect(durable: D, redis_url: &str) -> Result<CachedStore<D>, StoreError> {
        let cache = RedisStore::connect_unverified(redis_url, "samekey-cache").await?;
        Ok(CachedStore::new(durable, cache))
    }

    /// `durable` behind an already connected cache (connect it with
    /// [`RedisStore::connect_unverified`]: a cache's durability does not matter).
    pub fn new(durable: D, cache: RedisStore) -> CachedStore<D> {
        CachedStore {
            durable: Arc::new(ClaimTracker::new(durable)),
            cache: Arc::new(Cache {
                redis: cache,
                bypass_until: AtomicU64::new(0),
                epoch: std::time::Instant::now(),
                writes: Arc::new(Semaphore::new(MAX_BACKGROUND_WRITES)),
                forgets: AtomicU64::new(0),
            }),
        }
    }

    /// The durable store.
    pub fn durable(&self) -> &D {
        self.durable.inner()
    }

    /// Waits until every cache write started in the background so far has finished (or failed, which
    /// is logged and bypasses the cache). Completions during the wait are left to read-through.
    pub async fn flush(&self) {
        // Every permit back means no write in flight. (`acquire_many` fails only on a closed semaphore,
        // and this one is never closed.)
        let all = u32::try_from(MAX_BACKGROUND_WRITES).unwrap_or(u32::MAX);
        drop(self.cache.writes.acquire_many(all).await);
    }

    /// The cached finished receipt of `key`: one Redis still holds (its entry expires with the receipt)
    /// and, when the durable store judges time by the caller's clock, not expired by it.
    async fn cached(&self, key: &Key, now_ms: u64, what: &str) -> Option<Receipt> {
        let hit = self.cache.cached(key, what).await?;
        match self.durable().clock() {
            StoreClock::Caller if hit.expired(now_ms) => None,
            _ => Some(hit),
        }
    }

    /// How many forgets went through this store so far, read before the durable store is asked for
    /// something whose answer may be cached.
    fn forgets(&self) -> u64 {
        self.cache.forgets.load(Ordering::SeqCst)
    }

    /// Writes a finished `receipt` to the cache in a task of its own (if a tokio runtime runs this call
    /// and fewer than [`MAX_BACKGROUND_WRITES`] are in flight; otherwise a later read caches it), unless
    /// a forget went through since the durable store was asked for it (when this store had counted
    /// `forgets`): that answer may precede the forget. The entry expires by Redis's relative
    /// `PEXPIRE`: after `keep`, or when the receipt expires by the durable store's clock (never by this
    /// instance's).
    fn write_behind(&self, receipt: Receipt, keep: Keep, forgets: u64) {
        if !receipt.state.is_terminal() || !self.cache.usable() || self.forgets() != forgets {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(permit) = self.cache.writes.clone().try_acquire_owned() else {
            return;
        };
        let (cache, durable) = (self.cache.clone(), self.durable.clone());
        runtime.spawn(async move {
            let keep = match keep {
                Keep::For(ms) => Some(ms),
                Keep::UntilExpiry(caller_now) => {
                    match (
                        receipt.expires_at_ms,
                        durable.inner().now_ms(caller_now).await,
                    ) {
                        (Some(expires_at), Ok(now)) => Some(expires_at.saturating_sub(now)),
                        _ => None,
                    }
                }
            };
            // Checked again under the permit: a forget counts itself, then waits for every permit
            // (`flush`) before it deletes the entry, so this write is refused or lands before that.
            let forgotten = cache.forgets.load(Ordering::SeqCst) != forgets;
            if let Some(keep) = keep.filter(|&ms| ms > 0 && !forgotten) {
                cache.remember(&receipt, keep).await;
            }
            drop(permit);
        });
    }
}

impl Cache {
    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the cache is worth asking (not in a cool-down after a failure).
    fn usable(&self) -> bool {
        self.elapsed_ms() >= self.bypass_until.load(Ordering::Relaxed)
    }

    fn bypass(&self, e: &StoreError, what: &str) {
        let until = self
            .elapsed_ms()
            .saturating_add(CACHE_COOL_DOWN.as_millis() as u64);
        self.bypass_until.store(until, Ordering::Relaxed);
        tracing::warn!(target: "samekey", error = %e,
            "receipt cache unavailable for {what}; using the durable store for {CACHE_COOL_DOWN:?}");
    }

    /// Writes a finished receipt's entry, to be kept `keep` ms (unless the cache went down meanwhile).
    async fn remember(&self, receipt: &Receipt, keep: u64) {
        if self.usable() {
            if let Err(e) = self.redis.cache_put(receipt, keep).await {
                self.bypass(&e, "a write");
            }
        }
    }

    /// The cached finished receipt of `key`, if the cache is usable and has one (an entry is gone once
    /// its receipt expired: Redis drops it).
    async fn cached(&self, key: &Key, what: &str) -> Option<Receipt> {
        if !self.usable() {
            return None;
        }
        match self.redis.record(key).await {
            Ok(Some(hit)) if hit.state.is_terminal() => Some(hit),
            Ok(_) => None,
            Err(e) => {
                self.bypass(&e, what);
                None
            }
        }
    }
}

impl<D> std::fmt::Debug for CachedStore<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedStore").finish_non_exhaustive()
    }
}

/// Claims, reads, forgets and reopens go through the cache; every other method is the durable
/// store's.
#[async_trait]
impl<D: Store> StoreWrapper for CachedStore<D> {
    type Inner = ClaimTracker<D>;

    fn wrapped(&self) -> &ClaimTracker<D> {
        &self.durable
    }

    async fn claim(this: &Self, claim: Claim) -> Result<Claimed, StoreError> {
        if let Some(hit) = this.cached(&claim.key, claim.now_ms, "a claim").await {
            return Ok(Claimed::Existing(hit));
        }
        let now = claim.now_ms;
        let forgets = this.forgets();
        let claimed = this.durable.claim(claim).await?;
        if let Claimed::Existing(record) = &claimed {
            this.write_behind(record.clone(), Keep::UntilExpiry(now), forgets);
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
        // Before the durable store commits: a forget can only follow the commit.
        let forgets = this.forgets();
        let (transition, finished) = this
            .durable
            .complete_tracked(key, fence, completion, now_ms)
            .await?;
        if let Some(receipt) = finished {
            // The durable store committed it: the receipt it now holds, as the durable store wrote
            // it, kept until its expiry as far as this instance's clock tells (the cache entry
            // expires by Redis's relative `PEXPIRE`, from it).
            let keep = receipt
                .expires_at_ms
                .map_or(0, |at| at.saturating_sub(now_ms));
            this.write_behind(receipt, Keep::For(keep), forgets);
        }
        Ok(transition)
    }

    fn kind(_: &Self) -> &'static str {
        "cached"
    }

    /// Forgets the durable record, and the cache's entry before and after. No cache write of this
    /// store lands after it: once the durable store answered, the forget is counted (an answer the
    /// durable store gave before it is not written to the cache any more, whatever its key), every
    /// background write in flight is waited for ([`CachedStore::flush`]), and the entry is deleted
    /// again. Another instance over the same cache that read the record just before the forget and
    /// writes it after may still have it replayed until that entry expires.
    async fn forget(this: &Self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        // A cache that cannot delete the entry now would replay it once it answers again: the
        // forget fails before anything is forgotten.
        this.cache.redis.cache_forget(key).await?;
        // Whatever the durable store answers (a forget it applied may have failed to answer).
        let forgotten = this.durable.forget(key, fence).await;
        this.cache.forgets.fetch_add(1, Ordering::SeqCst);
        this.flush().await;
        let deleted = this.cache.redis.cache_forget(key).await;
        forgotten.and(deleted)
    }

    /// Reopens the durable record, the cache's entry deleted before and after, as for a forget: a
    /// record being corrected is never answered from the cache as it was.
    async fn reopen(
        this: &Self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        this.cache.redis.cache_forget(key).await?;
        let reopened = this.durable.reopen(key, expected, lease_ms, now_ms).await;
        this.cache.forgets.fetch_add(1, Ordering::SeqCst);
        this.flush().await;
        let deleted = this.cache.redis.cache_forget(key).await;
        let reopened = reopened?;
        deleted?;
        Ok(reopened)
    }

    async fn get(this: &Self, key: &Key, now_ms: u64) -> Result<Option<Receipt>, StoreError> {
        if let Some(hit) = this.cached(key, now_ms, "a read").await {
            return Ok(Some(hit));
        }
        let forgets = this.forgets();
        let found = this.durable.get(key, now_ms).await?;
        if let Some(record) = &found {
            this.write_behind(record.clone(), Keep::UntilExpiry(now_ms), forgets);
        }
        Ok(found)
    }

    async fn get_by_call_id(this: &Self, call_id: &CallId) -> Result<Option<Receipt>, StoreError> {
        if this.cache.usable() {
            match this.cache.redis.get_by_call_id(call_id).await {
                Ok(Some(hit)) if hit.state.is_terminal() => return Ok(Some(hit)),
                Ok(_) => {}
                Err(e) => this.cache.bypass(&e, "a receipt query"),
            }
        }
        let forgets = this.forgets();
        let found = this.durable.get_by_call_id(call_id).await?;
        if let Some(record) = &found {
            // Kept until the receipt expires by the durable store's time, as on the other read paths
            // (not by the record's last write, which kept it a whole ttl again). A query by callId
            // carries no caller's time: a store that takes the caller's is given the system clock's.
            let now_ms = crate::clock::unix_ms_now();
            this.write_behind(record.clone(), Keep::UntilExpiry(now_ms), forgets);
        }
        Ok(found)
    }

    /// Each callId as [`Store::get_by_call_id`] answers it here: from the cache where it holds the
    /// receipt.
    async fn get_by_call_ids(this: &Self, call_ids: &[CallId]) -> Result<Vec<Receipt>, StoreError> {
        get_each_by_call_id(this, call_ids).await
    }

    async fn purge_expired(this: &Self, now_ms: u64) -> Result<usize, StoreError> {
        // Background writes started before the purge land first, so that it sees them.
        this.flush().await;
        if this.cache.usable() {
            if let Err(e) = this.cache.redis.purge_expired(now_ms).await {
                this.cache.bypass(&e, "a purge");
            }
        }
        this.durable.purge_expired(now_ms).await
    }
}
