//! [`RedisStore`] and what it needs; its documentation is on the type, where users read it.
//!
//! This file holds the type, the names of its keys and its one [`Store`] impl, which hands each method
//! to the file of the store's contract it belongs to:
//!
//! * `receipts.rs`: the records — claim, take-over, the owner's fenced writes, reads and waits (and
//!   the entries of a [`CachedStore`]);
//! * `index.rs`: the callId and creation-time index entries a claim writes beside its record;
//! * `queue.rs`: the compensation queue;
//! * `journal.rs`: the journals;
//! * `listings.rs`: listings, counts and purges;
//! * `connection.rs`: one server or a cluster, the durability check, scans of every primary;
//! * `scripts.rs`: the server-side scripts (`scripts/*.lua`) and how their answers are read;
//! * `cache.rs`: [`CachedStore`], a front cache over a durable store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::{Claim, Claimed, Completion, ReceiptPage, ReceiptQuery, Store, StoreClock};
use crate::call_id::CallId;
use crate::compensation::CompensationEntry;
use crate::error::StoreError;
use crate::journal::Event;
use crate::key::Key;
use crate::receipt::{Fence, Receipt, Transition};

mod cache;
mod connection;
mod index;
mod journal;
mod listings;
mod queue;
mod receipts;
mod scripts;

pub use cache::CachedStore;

use connection::Connection;
use index::Unindexed;
use scripts::Scripts;

/// How long the callId index keeps an entry (a receipt older than this is found by key only).
pub const DEFAULT_INDEX_TTL: Duration = Duration::from_secs(8 * 24 * 3600);

/// A standalone [`Store`] in Redis.
///
/// The Redis store (feature `redis`): a standalone [`Store`] whose every transition is one server-side
/// script on one key, and [`CachedStore`], a front cache over a durable store.
///
/// # Keys and Redis Cluster
///
/// A record lives in the hash `samekey:r:{<digest>}`, its journal in the list `samekey:j:{<digest>}`,
/// the callId index in `samekey:c:{<callId>}`, the creation-time index (for
/// [`Store::list_receipts`]) in 16 sorted sets `samekey:{created-<0..f>}` (by the digest's first hex
/// digit), the compensation queue in the hash `samekey:{queue}`.
/// The part in braces is a hash tag: every script reads and writes the keys of one slot only (a record
/// and its journal share one), and commands on keys of two slots (a claim and its index entry) are
/// sent side by side, not as one pipeline or transaction.
/// [`RedisStore::connect_cluster`] uses redis-rs's cluster client, which routes each command to its
/// slot's node, and [`Store::purge_expired`] scans every primary. The conformance suite runs against a
/// three-primary cluster in CI (`scripts/services`), and a test checks that keys spread over its nodes.
///
/// # Durability
///
/// Redis keeps what it acknowledged only as far as its settings say, and a claim it forgets is a call
/// that runs twice. As the store of record it must:
///
/// * never evict: `maxmemory-policy noeviction` (an evicted claim frees its key);
/// * persist every write: `appendonly yes`, with `appendfsync always` (`everysec` loses up to a second
///   of claims in a crash);
/// * not fail over to a replica that lags: Redis replicates asynchronously, so a promoted replica may
///   lack the last claims. Run without automatic failover, or put [`CachedStore`] in front of
///   PostgreSQL instead.
///
/// [`RedisStore::connect`] and the other checked constructors read `maxmemory-policy` and `appendonly`
/// of every primary (`CONFIG GET`) and refuse with [`StoreError::NotDurable`] when one says the server
/// may lose claims, or cannot be asked. [`RedisStore::connect_unverified`] skips the check: for the
/// cache of a [`CachedStore`] (which may evict at will: the durable store decides every claim), or for
/// a managed Redis whose durability you vouch for. `scripts/services` runs Redis as a store of record.
///
/// # The callId index
///
/// A claim is one read-only script when the key is held (a replay costs one round trip and writes
/// nothing); when it takes the key, the callId index entry is written in the background while the call
/// goes on (no round trip is waited for), so that any process finds a call in flight by its callId a
/// round trip after its claim, and so is its creation-time index entry. Should that write fail, the call's next write (its completion, a lease
/// renewal, `UNKNOWN`) sends it again, in its own round trip; meanwhile the owning process finds the
/// call by callId, and every process by key.
///
/// # Fences and time
///
/// Every script that judges or writes a time reads it from the server (`TIME`), on the node that holds
/// the record: leases and expiries are the server's, never an instance's, so instances whose clocks
/// disagree still agree on whose lease is alive. A record's first fence is the server's time in µs'
/// worth of ms; a reused record's fence is its previous one plus one. A finished record carries
/// `expires_at`, and Redis removes it on its own a while after that (`PEXPIRE`, relative).
///
/// [`CachedStore`] keeps finished receipts of the durable store: an entry expires (by Redis's own
/// relative `PEXPIRE`) when the receipt does, as far as the instance that wrote it can tell; the
/// durable store alone decides every claim once the entry is gone.
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    /// The client of a single server, for the subscriptions of waiters (a cluster's waiters poll).
    client: Option<redis::Client>,
    prefix: String,
    index_ttl: Duration,
    scripts: Scripts,
    /// Keys this store claimed whose callId index entry is not written yet: it goes out with the next
    /// write of that key (its completion, usually), in the same round trip, so that a replay stays one
    /// read-only script and losing claims leave no index entries behind.
    unindexed: Arc<Mutex<HashMap<[u8; 32], Unindexed>>>,
}

/// How many sorted sets the creation-time index is spread over (by the digest's first 4 bits), so
/// that a cluster spreads its writes over several nodes.
const TIME_SHARDS: u8 = 16;

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

impl RedisStore {
    fn record_key(&self, key: &Key) -> String {
        format!("{}:r:{{{}}}", self.prefix, key.to_hex())
    }

    /// The journal of a key: a list in the slot of its record.
    fn journal_key(&self, key: &Key) -> String {
        format!("{}:j:{{{}}}", self.prefix, key.to_hex())
    }

    /// One shard (`0..TIME_SHARDS`) of the creation-time index: a sorted set of key digests (hex)
    /// scored by their record's creation time, ordered as [`Store::list_receipts`] pages.
    fn time_key(&self, shard: u8) -> String {
        format!("{}:{{created-{shard:x}}}", self.prefix)
    }

    fn index_key(&self, call_id: &CallId) -> String {
        format!("{}:c:{{{}}}", self.prefix, call_id)
    }

    fn queue_key(&self) -> String {
        format!("{}:{{queue}}", self.prefix)
    }

    fn conn(&self) -> Connection {
        self.conn.clone()
    }
}

#[async_trait]
impl Store for RedisStore {
    // The receipts (`receipts.rs`).

    async fn claim(&self, claim: Claim) -> Result<Claimed, StoreError> {
        self.claim_record(claim).await
    }

    async fn take_over(
        &self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        _now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        self.take_over_record(key, expected, lease_ms, false).await
    }

    async fn reopen(
        &self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        _now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        self.take_over_record(key, expected, lease_ms, true).await
    }

    async fn extend_lease(
        &self,
        key: &Key,
        fence: Fence,
        lease_ms: u64,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        self.extend_record_lease(key, fence, lease_ms).await
    }

    async fn complete(
        &self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        _now_ms: u64,
    ) -> Result<Transition, StoreError> {
        self.complete_record(key, fence, completion).await
    }

    async fn mark_unknown(
        &self,
        key: &Key,
        fence: Fence,
        _now_ms: u64,
    ) -> Result<Transition, StoreError> {
        self.mark_record_unknown(key, fence).await
    }

    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        self.release_record(key, fence).await
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn forget(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        self.forget_record(key, fence).await
    }

    async fn get(&self, key: &Key, _now_ms: u64) -> Result<Option<Receipt>, StoreError> {
        self.read(key, "").await
    }

    /// Waits by subscription on a single server: subscribe first, then mark the record waited-for and
    /// look at it, so that no change falls between the look and the subscription; the record's next
    /// change is published by the script that makes it. A cluster's waiters poll.
    async fn wait_settled(
        &self,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        self.wait_record_settled(key, timeout, now_ms).await
    }

    fn clock(&self) -> StoreClock {
        StoreClock::Own
    }

    async fn now_ms(&self, _caller_now_ms: u64) -> Result<u64, StoreError> {
        self.server_time_ms().await
    }

    async fn get_by_call_id(&self, call_id: &CallId) -> Result<Option<Receipt>, StoreError> {
        self.record_of_call(call_id).await
    }

    // Listings and purges (`listings.rs`).

    async fn purge_expired(&self, _now_ms: u64) -> Result<usize, StoreError> {
        self.purge_expired_records().await
    }

    /// Reads every record's expiry (pipelined, in batches) against the server's clock.
    async fn count_expired(&self, now_ms: u64) -> Result<usize, StoreError> {
        self.count_expired_records(now_ms).await
    }

    /// Reads a page from the creation-time index (16 sorted sets, each ordered by creation time and
    /// key digest, as the pages are): each set gives its first `limit + 1` keys after the cursor, the
    /// merge the page's `limit`, and only those records are read, side by side. A page costs the
    /// same at 10⁶ receipts as at 10³.
    async fn list_receipts(
        &self,
        query: &ReceiptQuery,
        _now_ms: u64,
    ) -> Result<ReceiptPage, StoreError> {
        self.receipt_page(query).await
    }

    /// Scans every record (`SCAN` on every primary): a sweep's cost grows with the keys held, so run
    /// it at the pace of the compensation worker, not per call.
    async fn list_orphans(&self, _now_ms: u64, limit: usize) -> Result<Vec<Receipt>, StoreError> {
        self.orphan_records(limit).await
    }

    // The compensation queue (`queue.rs`).

    async fn enqueue_compensation(&self, entry: CompensationEntry) -> Result<(), StoreError> {
        self.enqueue_entry(entry).await
    }

    async fn take_due_compensations(
        &self,
        _now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        self.take_due_entries(limit, lease_ms).await
    }

    async fn reschedule_compensation(
        &self,
        call_id: &CallId,
        fence: Fence,
        round: u32,
        delay_ms: u64,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        self.reschedule_entry(call_id, fence, round, delay_ms).await
    }

    async fn finish_compensation(
        &self,
        call_id: &CallId,
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        self.finish_entry(call_id, fence).await
    }

    async fn escalate_compensation(
        &self,
        call_id: &CallId,
        fence: Fence,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        self.escalate_entry(call_id, fence).await
    }

    async fn list_compensations(&self) -> Result<Vec<CompensationEntry>, StoreError> {
        self.queued_entries().await
    }

    // The journal (`journal.rs`).

    async fn append_journal(
        &self,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        self.append_events(key, events, keep_ms).await
    }

    async fn journal(&self, key: &Key, _now_ms: u64) -> Result<Vec<Event>, StoreError> {
        self.events_of_key(key).await
    }

    /// Scans every journal (`SCAN` on every primary) for each page: an audit's cost grows with the
    /// journals held (few: the happy path writes none), not with the receipts.
    async fn journaled_keys(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        self.journaled_keys_page(after, limit).await
    }

    async fn journal_of_call(
        &self,
        call_id: &CallId,
        now_ms: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.events_of_call(call_id, now_ms).await
    }
}
