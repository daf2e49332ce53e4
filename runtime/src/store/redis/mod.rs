//! [`RedisStore`] and what it needs; its documentation is on the type, where users read it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncCommands, RedisFuture, Script};
use serde::{Deserialize, Serialize};

use super::{
    already_or_not_owned, not_owned, Claim, Claimed, Completion, Cursor, ReceiptPage, ReceiptQuery,
    Store, StoreClock,
};
use crate::call_id::CallId;
use crate::compensation::{CompensationEntry, CompensationState};
use crate::error::StoreError;
use crate::journal::{self, AttemptOutcome, Event, JOURNAL_LIMIT};
use crate::key::{digest_from_hex, hex, Fingerprint, Key};
use crate::receipt::{Fence, Receipt, ReceiptState, Transition};

/// How long the callId index keeps an entry (a receipt older than this is found by key only).
pub const DEFAULT_INDEX_TTL: Duration = Duration::from_secs(8 * 24 * 3600);

/// How long after its `expires_at` Redis drops a finished record by itself.
const EXPIRY_GRACE_MS: u64 = 60_000;

// The scripts, in `scripts/`: each reads and writes only its `KEYS[1]` (one slot of a cluster), and
// those that judge time read it from the server first (`now.lua`).

const CLAIM: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/claim.lua")
);

const TAKE_OVER: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/take_over.lua")
);

const WRITE: &str = include_str!("scripts/write.lua");

const READ: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/read.lua")
);

const PURGE_ONE: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/purge_one.lua")
);

const TAKE_DUE: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/take_due.lua")
);

const JOURNAL: &str = include_str!("scripts/journal.lua");

const UPDATE_ENTRY: &str = concat!(
    include_str!("scripts/now.lua"),
    include_str!("scripts/update_entry.lua")
);

/// The JSON form of a queued entry (numbers as strings: Lua's numbers are doubles).
#[derive(Serialize, Deserialize)]
struct QueuedEntry {
    call_id: String,
    key: String,
    scope: String,
    reason: String,
    round: String,
    next_at: String,
    state: String,
    lease_until: String,
    enqueued: String,
    /// The worker fence of the latest take (absent in entries of an earlier release: 0).
    #[serde(default = "never_taken")]
    taker: String,
    /// Attempts the call made before it was queued (absent in entries of an earlier release).
    #[serde(default)]
    attempts: u32,
    /// How its last attempt ended.
    #[serde(default)]
    last_error: Option<AttemptOutcome>,
    /// Its inputs (the JSON text), when its function keeps them.
    #[serde(default)]
    inputs: Option<String>,
}

fn never_taken() -> String {
    "0".into()
}

/// One server (reconnecting), or a Redis Cluster (routing each command to its slot's node).
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, redis::Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

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

/// A claim whose index entries (its callId's, its creation time's) are not known written yet.
#[derive(Clone, Debug, PartialEq)]
struct Unindexed {
    call_id: CallId,
    created_ms: u64,
}

/// How many sorted sets the creation-time index is spread over (by the digest's first 4 bits), so
/// that a cluster spreads its writes over several nodes.
const TIME_SHARDS: u8 = 16;

#[derive(Clone)]
struct Scripts {
    claim: Script,
    take_over: Script,
    write: Script,
    read: Script,
    purge_one: Script,
    take_due: Script,
    update_entry: Script,
    journal: Script,
}

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
    /// Connects to `url` (`redis://host:port/`) with a reconnecting connection, keys prefixed
    /// `samekey`.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::connect_with_prefix(url, "samekey").await
    }

    /// Connects with another key prefix (several applications on one Redis), and checks that the server
    /// keeps what it acknowledges (see [Durability](RedisStore#durability)).
    pub async fn connect_with_prefix(url: &str, prefix: &str) -> Result<RedisStore, StoreError> {
        let store = RedisStore::connect_unverified(url, prefix).await?;
        store.verify_durable().await?;
        Ok(store)
    }

    /// Connects without checking the server's durability settings: for the cache of a
    /// [`CachedStore`], or a server whose durability you vouch for (a managed service that hides
    /// `CONFIG`, say).
    pub async fn connect_unverified(url: &str, prefix: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL `{url}`: {e}")))?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(unavailable)?;
        let mut store = RedisStore::on(Connection::Single(conn), prefix);
        store.client = Some(client);
        Ok(store)
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port/` each), keys prefixed
    /// `samekey`; commands go to the node that serves their key's slot.
    pub async fn connect_cluster(nodes: &[&str]) -> Result<RedisStore, StoreError> {
        RedisStore::connect_cluster_with_prefix(nodes, "samekey").await
    }

    /// Connects to a Redis Cluster with another key prefix, and checks that every primary keeps what it
    /// acknowledges.
    pub async fn connect_cluster_with_prefix(
        nodes: &[&str],
        prefix: &str,
    ) -> Result<RedisStore, StoreError> {
        let store = RedisStore::connect_cluster_unverified(nodes, prefix).await?;
        store.verify_durable().await?;
        Ok(store)
    }

    /// Connects to a Redis Cluster without checking its durability settings (see
    /// [`RedisStore::connect_unverified`]).
    pub async fn connect_cluster_unverified(
        nodes: &[&str],
        prefix: &str,
    ) -> Result<RedisStore, StoreError> {
        let client = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| StoreError::Unavailable(format!("invalid Redis Cluster nodes: {e}")))?;
        let conn = client.get_async_connection().await.map_err(unavailable)?;
        Ok(RedisStore::on(Connection::Cluster(conn), prefix))
    }

    fn on(conn: Connection, prefix: &str) -> RedisStore {
        RedisStore {
            conn,
            client: None,
            prefix: prefix.to_owned(),
            index_ttl: DEFAULT_INDEX_TTL,
            unindexed: Arc::default(),
            scripts: Scripts {
                claim: Script::new(CLAIM),
                take_over: Script::new(TAKE_OVER),
                write: Script::new(WRITE),
                read: Script::new(READ),
                purge_one: Script::new(PURGE_ONE),
                take_due: Script::new(TAKE_DUE),
                update_entry: Script::new(UPDATE_ENTRY),
                journal: Script::new(JOURNAL),
            },
        }
    }

    /// The script a claim runs (in the same round trip as the callId index entry).
    pub const CLAIM_SCRIPT: &'static str = CLAIM;

    /// The script every fenced write (completion, lease, unknown, release) runs.
    pub const WRITE_SCRIPT: &'static str = WRITE;

    /// How long the callId index keeps an entry (default 8 days).
    pub fn with_index_ttl(mut self, ttl: Duration) -> RedisStore {
        self.index_ttl = ttl;
        self
    }

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

    async fn record(&self, key: &Key) -> Result<Option<Receipt>, StoreError> {
        let fields: Vec<(String, Vec<u8>)> = self
            .conn()
            .hgetall(self.record_key(key))
            .await
            .map_err(unavailable)?;
        parse_record(key.scope(), &fields)
    }

    /// A fenced write through the `WRITE` script: `Ok(true)` if applied, else the record (or `None`) as
    /// it is, to explain the refusal.
    async fn write(
        &self,
        key: &Key,
        fence: Fence,
        from: &str,
        expiry: &str,
        times: &str,
        fields: &[(&str, Vec<u8>)],
    ) -> Result<Result<(), Option<Receipt>>, StoreError> {
        let mut invocation = self.scripts.write.key(self.record_key(key));
        invocation.key(self.journal_key(key));
        invocation
            .arg(fence.0.to_string())
            .arg(from)
            .arg(expiry)
            .arg(times);
        for (name, value) in fields {
            invocation.arg(*name).arg(value.as_slice());
        }
        let unindexed = self
            .unindexed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key.digest());
        let answer = match unindexed {
            None => invocation
                .invoke_async(&mut self.conn())
                .await
                .map_err(unavailable)?,
            Some(entry) => {
                // Keys of several slots: sent together, not as one pipeline, so that a cluster can
                // route each; on one server they still share the round trip.
                let indexed = self.send_index(key.digest(), &entry);
                let mut conn = self.conn();
                let written = invocation.invoke_async::<redis::Value>(&mut conn);
                match tokio::join!(indexed, written) {
                    (Ok(()), Ok(answer)) => answer,
                    (indexed, written) => {
                        // Not sent, or not known to be: the next write of the key sends it again.
                        self.index_later(key, entry);
                        indexed.map_err(unavailable)?;
                        written.map_err(unavailable)?
                    }
                }
            }
        };
        match answer_code(&answer)? {
            1 => Ok(Ok(())),
            -1 => Ok(Err(None)),
            _ => Ok(Err(parse_record(key.scope(), &answer_fields(&answer)?)?)),
        }
    }
}

impl RedisStore {
    /// The record of `key` unless it expired by the server's clock, through the `READ` script
    /// (`mode` = `wait` also marks a `PROCESSING` record waited-for).
    async fn read(&self, key: &Key, mode: &str) -> Result<Option<Receipt>, StoreError> {
        let (now, record) = self.read_at(key, mode).await?;
        Ok(record.filter(|r| !r.expired(now)))
    }

    /// A record as it is, whatever its expiry, and the server's time it was read at.
    async fn read_at(&self, key: &Key, mode: &str) -> Result<(u64, Option<Receipt>), StoreError> {
        let answer: redis::Value = self
            .scripts
            .read
            .key(self.record_key(key))
            .arg(mode)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let now = match answer_items(&answer)?.first() {
            Some(redis::Value::BulkString(now)) => number(now, "the server's time")?,
            other => return Err(corrupt(format!("unexpected time {other:?}"))),
        };
        Ok((now, parse_record(key.scope(), &answer_fields(&answer)?)?))
    }

    /// Every record `keep` admits, judged at the server's time it was read at.
    async fn records_where(
        &self,
        keep: impl Fn(&Receipt, u64) -> bool,
    ) -> Result<Vec<Receipt>, StoreError> {
        let prefix = format!("{}:r:{{", self.prefix);
        let mut kept = Vec::new();
        for name in self.record_names().await? {
            let Some(digest) = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix('}'))
                .and_then(digest_from_hex)
            else {
                continue;
            };
            let (now, record) = self.read_at(&Key::from_digest("", digest), "").await?;
            if let Some(r) = record.filter(|r| keep(r, now)) {
                kept.push(r);
            }
        }
        Ok(kept)
    }

    /// The names of every record key, from every primary (`SCAN`, in batches).
    async fn record_names(&self) -> Result<Vec<String>, StoreError> {
        self.names(&format!("{}:r:*", self.prefix)).await
    }

    /// The names of every key `pattern` matches, from every primary (`SCAN`, in batches), sorted.
    async fn names(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        let mut names = Vec::new();
        for node in self.primaries().await? {
            let mut cursor: u64 = 0;
            loop {
                let scan = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1_000)
                    .clone();
                let (next, batch): (u64, Vec<String>) = match (&node, self.conn()) {
                    (Some(route), Connection::Cluster(mut c)) => {
                        let answer = c
                            .route_command(scan.clone(), RoutingInfo::SingleNode(route.clone()))
                            .await
                            .map_err(unavailable)?;
                        redis::from_redis_value(answer).map_err(corrupt)?
                    }
                    (_, mut conn) => scan.query_async(&mut conn).await.map_err(unavailable)?,
                };
                names.extend(batch);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        // `SCAN` may return a key more than once.
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }

    /// Writes the callId index entry of a claim that took `key`, in the background: the call goes on
    /// at once, and another process finds the call by its callId a round trip later. Until the entry
    /// is known written, it also waits in [`RedisStore::index_later`]: this process finds the call
    /// meanwhile, and should the background write fail, the key's next write sends it again.
    fn index_soon(&self, key: &Key, entry: Unindexed) {
        self.index_later(key, entry.clone());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.clone();
        let digest = *key.digest();
        runtime.spawn(async move {
            if store.send_index(&digest, &entry).await.is_ok() {
                let mut waiting = store.unindexed.lock().unwrap_or_else(|p| p.into_inner());
                if waiting.get(&digest) == Some(&entry) {
                    waiting.remove(&digest);
                }
            }
        });
    }

    /// Up to `want` positions of one shard of the creation-time index in `[from_ms, until_ms)` that
    /// come after `after`, in order.
    async fn indexed_after(
        &self,
        shard: u8,
        from_ms: u64,
        until_ms: u64,
        after: Option<Cursor>,
        want: usize,
    ) -> Result<Vec<Cursor>, StoreError> {
        let mut found = Vec::new();
        let mut offset = 0usize;
        loop {
            let batch: Vec<(String, f64)> = redis::cmd("ZRANGE")
                .arg(self.time_key(shard))
                .arg(from_ms)
                .arg(format!("({until_ms}"))
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(offset)
                .arg(want)
                .arg("WITHSCORES")
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            let full = batch.len() == want;
            offset += batch.len();
            for (member, score) in batch {
                let Some(digest) = digest_from_hex(&member) else {
                    continue;
                };
                // Creation times are whole milliseconds, exact in a score (a double).
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let at = Cursor {
                    created_ms: score as u64,
                    digest,
                };
                if after.is_none_or(|after| at > after) {
                    found.push(at);
                }
            }
            // Only keys at the cursor's own millisecond are skipped: another batch is rare.
            if found.len() >= want || !full {
                found.truncate(want);
                return Ok(found);
            }
        }
    }

    /// Removes from the creation-time index the keys whose record is gone (Redis expired it).
    async fn prune_time_index(&self) -> Result<(), StoreError> {
        const BATCH: usize = 1_000;
        for shard in 0..TIME_SHARDS {
            let set = self.time_key(shard);
            let mut start = 0usize;
            loop {
                let members: Vec<String> = redis::cmd("ZRANGE")
                    .arg(&set)
                    .arg(start)
                    .arg(start + BATCH - 1)
                    .query_async(&mut self.conn())
                    .await
                    .map_err(unavailable)?;
                let records: Vec<String> = members
                    .iter()
                    .map(|member| format!("{}:r:{{{member}}}", self.prefix))
                    .collect();
                let exists: Vec<Result<bool, StoreError>> = futures_util::stream::iter(records)
                    .map(|record| {
                        let mut conn = self.conn();
                        async move {
                            redis::cmd("EXISTS")
                                .arg(record)
                                .query_async::<bool>(&mut conn)
                                .await
                                .map_err(unavailable)
                        }
                    })
                    .buffered(64)
                    .collect()
                    .await;
                let mut gone = Vec::new();
                for (member, exists) in members.iter().zip(exists) {
                    if !exists? {
                        gone.push(member.as_str());
                    }
                }
                if !gone.is_empty() {
                    let _: usize = redis::cmd("ZREM")
                        .arg(&set)
                        .arg(&gone)
                        .query_async(&mut self.conn())
                        .await
                        .map_err(unavailable)?;
                }
                if members.len() < BATCH {
                    break;
                }
                start += BATCH - gone.len();
            }
        }
        Ok(())
    }

    fn index_later(&self, key: &Key, entry: Unindexed) {
        self.unindexed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(*key.digest(), entry);
    }

    /// Writes a claim's index entries: its callId's (to its key) and its creation time's (the key in
    /// the time-ordered set of its shard), side by side.
    async fn send_index(&self, digest: &[u8; 32], entry: &Unindexed) -> redis::RedisResult<()> {
        let by_call = redis::cmd("SET")
            .arg(self.index_key(&entry.call_id))
            .arg(digest.as_slice())
            .arg("PX")
            .arg(u64::try_from(self.index_ttl.as_millis()).unwrap_or(u64::MAX))
            .clone();
        let by_time = redis::cmd("ZADD")
            .arg(self.time_key(digest[0] >> 4))
            .arg(entry.created_ms)
            .arg(hex(digest))
            .clone();
        let (mut a, mut b) = (self.conn(), self.conn());
        let (called, timed) = tokio::join!(
            by_call.query_async::<()>(&mut a),
            by_time.query_async::<()>(&mut b)
        );
        called.and(timed)
    }
}

fn answer_items(answer: &redis::Value) -> Result<&[redis::Value], StoreError> {
    match answer {
        redis::Value::Array(items) => Ok(items),
        other => Err(corrupt(format!("unexpected script answer {other:?}"))),
    }
}

/// The code a script answered with; `-2` (the script found a stored value it cannot read) is
/// [`StoreError::Corrupt`].
fn answer_code(answer: &redis::Value) -> Result<i64, StoreError> {
    let items = answer_items(answer)?;
    match items.first() {
        Some(redis::Value::Int(-2)) => Err(corrupt(match items.get(1) {
            Some(redis::Value::BulkString(why)) => String::from_utf8_lossy(why).into_owned(),
            _ => "unreadable record".to_owned(),
        })),
        Some(redis::Value::Int(code)) => Ok(*code),
        other => Err(corrupt(format!("unexpected script answer {other:?}"))),
    }
}

fn answer_fields(answer: &redis::Value) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let items = answer_items(answer)?;
    let Some(redis::Value::Array(flat)) = items.get(1) else {
        return Ok(Vec::new());
    };
    let mut fields = Vec::with_capacity(flat.len() / 2);
    for pair in flat.chunks(2) {
        match pair {
            [redis::Value::BulkString(name), redis::Value::BulkString(value)] => fields.push((
                String::from_utf8(name.clone()).map_err(corrupt)?,
                value.clone(),
            )),
            other => return Err(corrupt(format!("unexpected record field {other:?}"))),
        }
    }
    Ok(fields)
}

/// The decimal number a script answered at `index`.
fn answer_number(answer: &redis::Value, index: usize, what: &str) -> Result<u64, StoreError> {
    match answer_items(answer)?.get(index) {
        Some(redis::Value::BulkString(text)) => number(text, what),
        other => Err(corrupt(format!("unexpected {what} {other:?}"))),
    }
}

fn answer_fence(answer: &redis::Value) -> Result<Fence, StoreError> {
    match answer_items(answer)?.get(1) {
        Some(redis::Value::BulkString(text)) => std::str::from_utf8(text)
            .ok()
            .and_then(|t| t.parse().ok())
            .map(Fence)
            .ok_or_else(|| corrupt("a fence is a decimal number")),
        other => Err(corrupt(format!("unexpected fence {other:?}"))),
    }
}

fn text(value: &[u8], what: &str) -> Result<String, StoreError> {
    String::from_utf8(value.to_vec()).map_err(|_| corrupt(format!("{what} is not UTF-8")))
}

fn number(value: &[u8], what: &str) -> Result<u64, StoreError> {
    text(value, what)?
        .parse()
        .map_err(|_| corrupt(format!("{what} is not a number")))
}

fn optional_number(value: Option<&Vec<u8>>, what: &str) -> Result<Option<u64>, StoreError> {
    match value {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => number(v, what).map(Some),
    }
}

/// A record from its hash fields; `None` for no record or a released tombstone. A field that is
/// missing or malformed is [`StoreError::Corrupt`].
fn parse_record(
    scope_hint: &str,
    fields: &[(String, Vec<u8>)],
) -> Result<Option<Receipt>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let get = |name: &str| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    let need = |name: &str| get(name).ok_or_else(|| corrupt(format!("record without `{name}`")));
    let state = text(need("state")?, "state")?;
    if state == "RELEASED" {
        return Ok(None);
    }
    let state: ReceiptState = state.parse().map_err(corrupt)?;
    let scope = get("scope")
        .map(|s| text(s, "scope"))
        .transpose()?
        .unwrap_or_else(|| scope_hint.to_owned());
    let fingerprint = match get("fingerprint") {
        Some(bytes) if !bytes.is_empty() => Some(Fingerprint(
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| corrupt("a fingerprint is 32 bytes"))?,
        )),
        _ => None,
    };
    let key_digest: [u8; 32] = need("digest")?
        .as_slice()
        .try_into()
        .map_err(|_| corrupt("a key is 32 bytes"))?;
    Ok(Some(Receipt {
        key: Key::from_digest(scope, key_digest),
        call_id: text(need("call_id")?, "callId")?.parse().map_err(corrupt)?,
        state,
        fence: Fence(number(need("fence")?, "fence")?),
        lease_until_ms: optional_number(get("lease_until"), "lease")?,
        expires_at_ms: optional_number(get("expires_at"), "expiry")?,
        fingerprint,
        outcome: get("outcome")
            .filter(|o| !o.is_empty())
            .map(|o| o.as_slice().into()),
        created_ms: number(need("created")?, "creation time")?,
        updated_ms: number(need("updated")?, "update time")?,
    }))
}

#[async_trait]
impl Store for RedisStore {
    async fn claim(&self, claim: Claim) -> Result<Claimed, StoreError> {
        let mut invocation = self.scripts.claim.key(self.record_key(&claim.key));
        invocation
            .arg(claim.key.scope())
            .arg(claim.call_id.to_string())
            .arg(claim.lease_ms)
            .arg(
                claim
                    .fingerprint
                    .as_ref()
                    .map(|f| f.0.to_vec())
                    .unwrap_or_default(),
            )
            .arg(claim.key.digest().as_slice());
        let answer: redis::Value = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if answer_code(&answer)? == 1 {
            let fence = answer_fence(&answer)?;
            let created_ms = answer_number(&answer, 2, "creation time")?;
            let entry = Unindexed {
                call_id: claim.call_id,
                created_ms,
            };
            self.index_soon(&claim.key, entry);
            return Ok(Claimed::Acquired(fence));
        }
        match parse_record(claim.key.scope(), &answer_fields(&answer)?)? {
            Some(record) => {
                if record.call_id == claim.call_id {
                    // This claim's own record: the client sent the script again after a reset, once
                    // the first had taken the key. Its indexes were never written; the call may own it.
                    let entry = Unindexed {
                        call_id: claim.call_id,
                        created_ms: record.created_ms,
                    };
                    self.index_soon(&claim.key, entry);
                }
                Ok(Claimed::Existing(record))
            }
            None => Err(StoreError::Unavailable(
                "the key's record changed during the claim".into(),
            )),
        }
    }

    async fn take_over(
        &self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        _now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        let answer: redis::Value = self
            .scripts
            .take_over
            .key(self.record_key(key))
            .arg(expected.0.to_string())
            .arg(lease_ms)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        match answer_code(&answer)? {
            1 => {
                let fence = answer_fence(&answer)?;
                // The record may never have been indexed (its owner died before its first write).
                if let Some(redis::Value::BulkString(id)) = answer_items(&answer)?.get(2) {
                    let call_id = text(id, "callId")?.parse().map_err(corrupt)?;
                    let created_ms = answer_number(&answer, 3, "creation time")?;
                    let entry = Unindexed {
                        call_id,
                        created_ms,
                    };
                    self.index_later(key, entry);
                }
                Ok(Claimed::Acquired(fence))
            }
            -1 => Err(StoreError::NotFound),
            _ => match parse_record(key.scope(), &answer_fields(&answer)?)? {
                Some(record) => Ok(Claimed::Existing(record)),
                None => Err(StoreError::NotFound),
            },
        }
    }

    async fn extend_lease(
        &self,
        key: &Key,
        fence: Fence,
        lease_ms: u64,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        let times = format!("lease_until:{lease_ms}");
        self.write(key, fence, "PROCESSING", "", &times, &[])
            .await?
            .map_err(|current| not_owned(current.as_ref(), fence, ReceiptState::Processing))
    }

    async fn complete(
        &self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        _now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let keep = completion.ttl_ms.saturating_add(EXPIRY_GRACE_MS).max(1);
        let fields = [
            ("state", completion.state.as_str().as_bytes().to_vec()),
            (
                "outcome",
                completion.outcome.as_deref().unwrap_or_default().to_vec(),
            ),
            ("lease_until", Vec::new()),
        ];
        let times = format!("updated:0 expires_at:{}", completion.ttl_ms);
        match self
            .write(
                key,
                fence,
                "RECEIVED PROCESSING UNKNOWN",
                &keep.to_string(),
                &times,
                &fields,
            )
            .await?
        {
            Ok(()) => Ok(Transition::Applied),
            Err(current) => already_or_not_owned(current.as_ref(), fence, completion.state),
        }
    }

    async fn mark_unknown(
        &self,
        key: &Key,
        fence: Fence,
        _now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let fields = [
            ("state", b"UNKNOWN".to_vec()),
            ("lease_until", Vec::new()),
            ("expires_at", Vec::new()),
        ];
        match self
            .write(key, fence, "RECEIVED PROCESSING", "0", "updated:0", &fields)
            .await?
        {
            Ok(()) => Ok(Transition::Applied),
            Err(current) => already_or_not_owned(current.as_ref(), fence, ReceiptState::Unknown),
        }
    }

    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        match self.mark_released(key, fence, "PROCESSING").await? {
            Ok(()) | Err(None) => Ok(()),
            Err(current) => Err(not_owned(current.as_ref(), fence, ReceiptState::Received)),
        }
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn forget(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        match self.mark_released(key, fence, "SUCCESS FAILED").await? {
            Ok(()) => Ok(()),
            Err(current) => Err(not_owned(current.as_ref(), fence, ReceiptState::Received)),
        }
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
        let Some(client) = &self.client else {
            return super::poll_settled(self, key, timeout, now_ms).await;
        };
        let mut subscription =
            tokio::time::timeout(Duration::from_secs(2), client.get_async_pubsub())
                .await
                .map_err(|_| StoreError::Unavailable("no Redis connection within 2s".into()))?
                .map_err(unavailable)?;
        subscription
            .subscribe(format!("{}:settled", self.record_key(key)))
            .await
            .map_err(unavailable)?;
        let record = self.read(key, "wait").await?;
        if record
            .as_ref()
            .is_none_or(|r| r.state != ReceiptState::Processing)
        {
            return Ok(record);
        }
        {
            let mut messages = std::pin::pin!(subscription.on_message());
            // A message, a lost connection or the end of the wait: look again either way.
            let _ = tokio::time::timeout(timeout, messages.next()).await;
        }
        drop(subscription);
        self.read(key, "").await
    }

    fn clock(&self) -> StoreClock {
        StoreClock::Own
    }

    async fn now_ms(&self, _caller_now_ms: u64) -> Result<u64, StoreError> {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(secs * 1000 + micros / 1000)
    }

    async fn get_by_call_id(&self, call_id: &CallId) -> Result<Option<Receipt>, StoreError> {
        let Some(key) = self.key_of_call(call_id).await? else {
            return Ok(None);
        };
        Ok(self.record(&key).await?.filter(|r| &r.call_id == call_id))
    }

    async fn purge_expired(&self, _now_ms: u64) -> Result<usize, StoreError> {
        let names = self.record_names().await?;
        let mut purged = 0;
        for name in names {
            let gone: i64 = self
                .scripts
                .purge_one
                .key(name)
                .invoke_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
            purged += usize::from(gone == 1);
        }
        self.prune_time_index().await?;
        Ok(purged)
    }

    /// Reads every record's expiry (pipelined, in batches) against the server's clock.
    async fn count_expired(&self, now_ms: u64) -> Result<usize, StoreError> {
        let now = self.now_ms(now_ms).await?;
        let mut expired = 0;
        for batch in self.record_names().await?.chunks(500) {
            let mut pipe = redis::pipe();
            for name in batch {
                pipe.hget(name, "expires_at");
            }
            let expiries: Vec<Option<u64>> = match self.conn() {
                Connection::Cluster(mut c) => {
                    // A cluster pipeline's commands go to their keys' nodes one by one.
                    let mut all = Vec::with_capacity(batch.len());
                    for name in batch {
                        all.push(c.hget(name, "expires_at").await.map_err(unavailable)?);
                    }
                    all
                }
                mut conn => pipe.query_async(&mut conn).await.map_err(unavailable)?,
            };
            expired += expiries
                .into_iter()
                .filter(|at| at.is_some_and(|at| at <= now))
                .count();
        }
        Ok(expired)
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
        let limit = query.limit.max(1);
        let from_ms = query
            .after
            .map_or(query.since_ms, |c| c.created_ms.max(query.since_ms));
        // This process's claims whose index entries are still on their way, read before the index:
        // an entry that leaves this set was written to the index first, so the reads below see it
        // (read after them, an entry written meanwhile would be in neither).
        let mut candidates: Vec<Cursor> = self
            .unindexed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(digest, entry)| Cursor {
                created_ms: entry.created_ms,
                digest: *digest,
            })
            .filter(|c| {
                (from_ms..query.until_ms).contains(&c.created_ms)
                    && query.after.is_none_or(|after| *c > after)
            })
            .collect();
        if from_ms < query.until_ms {
            // A shard holds about a sixteenth of a page: each is asked for twice that first, and
            // only a shard that had more and whose last asked-for key falls inside the page is asked
            // for a whole page.
            let first_want = (limit / usize::from(TIME_SHARDS) * 2 + 16).min(limit + 1);
            let ask = |shard: u8, want: usize| {
                self.indexed_after(shard, from_ms, query.until_ms, query.after, want)
            };
            let mut shards: Vec<Vec<Cursor>> =
                futures_util::future::try_join_all((0..TIME_SHARDS).map(|s| ask(s, first_want)))
                    .await?;
            let cut = shards
                .iter()
                .filter(|got| got.len() == first_want)
                .filter_map(|got| got.last().copied())
                .min();
            if let Some(cut) = cut {
                let settled = shards.iter().flatten().filter(|c| **c <= cut).count();
                if settled <= limit {
                    for (shard, got) in (0..TIME_SHARDS).zip(shards.iter_mut()) {
                        if got.len() == first_want {
                            *got = ask(shard, limit + 1).await?;
                        }
                    }
                }
            }
            candidates.extend(shards.into_iter().flatten());
        }
        candidates.sort_unstable();
        candidates.dedup();
        let next = (candidates.len() > limit).then(|| candidates[limit - 1]);
        candidates.truncate(limit);
        // Plain reads (side by side on the connection), judged by one reading of the server's clock.
        let now = self.now_ms(0).await?;
        let read: Vec<Result<(Cursor, Option<Receipt>), StoreError>> =
            futures_util::stream::iter(candidates)
                .map(|c| async move {
                    let record = self.record(&Key::from_digest("", c.digest)).await?;
                    Ok((c, record))
                })
                .buffered(64)
                .collect()
                .await;
        let mut receipts = Vec::with_capacity(read.len());
        for row in read {
            let (at, record) = row?;
            // Gone (expired, given back), or claimed again since (listed at its new time).
            if let Some(r) = record.filter(|r| {
                !r.expired(now)
                    && Cursor::of(r) == at
                    && (query.since_ms..query.until_ms).contains(&r.created_ms)
                    && query.after.is_none_or(|after| Cursor::of(r) > after)
                    && query.admits(r)
            }) {
                receipts.push(r);
            }
        }
        receipts.sort_unstable_by_key(Cursor::of);
        Ok(ReceiptPage { receipts, next })
    }

    /// Scans every record (`SCAN` on every primary): a sweep's cost grows with the keys held, so run
    /// it at the pace of the compensation worker, not per call.
    async fn list_orphans(&self, _now_ms: u64, limit: usize) -> Result<Vec<Receipt>, StoreError> {
        let candidates = self
            .records_where(|r, now| r.state == ReceiptState::Processing && !r.lease_alive(now))
            .await?;
        let mut orphans = Vec::new();
        for r in candidates {
            let queued: bool = self
                .conn()
                .hexists(self.queue_key(), r.call_id.to_string())
                .await
                .map_err(unavailable)?;
            if !queued {
                orphans.push(r);
            }
        }
        orphans.sort_by_key(|r| r.lease_until_ms);
        orphans.truncate(limit);
        Ok(orphans)
    }

    async fn enqueue_compensation(&self, entry: CompensationEntry) -> Result<(), StoreError> {
        let queued = QueuedEntry {
            call_id: entry.call_id.to_string(),
            key: hex(entry.key.digest()),
            scope: entry.key.scope().to_owned(),
            reason: entry.reason,
            round: entry.round.to_string(),
            next_at: entry.next_at_ms.to_string(),
            state: "PENDING".into(),
            lease_until: "0".into(),
            enqueued: entry.enqueued_ms.to_string(),
            taker: entry.fence.0.to_string(),
            attempts: entry.attempts,
            last_error: entry.last_error,
            inputs: entry
                .encoded_inputs
                .as_deref()
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned()),
        };
        let json = serde_json::to_string(&queued).map_err(corrupt)?;
        let _: bool = self
            .conn()
            .hset_nx(self.queue_key(), &queued.call_id, json)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn take_due_compensations(
        &self,
        _now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        let taken: Vec<String> = self
            .scripts
            .take_due
            .key(self.queue_key())
            .arg(limit)
            .arg(lease_ms)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        taken.iter().map(|s| parse_entry(s)).collect()
    }

    async fn reschedule_compensation(
        &self,
        call_id: &CallId,
        fence: Fence,
        round: u32,
        delay_ms: u64,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        self.update_entry(
            call_id,
            Some(fence),
            &["reschedule", &round.to_string(), &delay_ms.to_string()],
        )
        .await
    }

    async fn finish_compensation(
        &self,
        call_id: &CallId,
        fence: Option<Fence>,
    ) -> Result<(), StoreError> {
        match self.update_entry(call_id, fence, &["finish"]).await {
            // Gone already: finishing it again changes nothing.
            Err(StoreError::NotFound) => Ok(()),
            done => done,
        }
    }

    async fn escalate_compensation(
        &self,
        call_id: &CallId,
        fence: Fence,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        self.update_entry(call_id, Some(fence), &["escalate"]).await
    }

    async fn list_compensations(&self) -> Result<Vec<CompensationEntry>, StoreError> {
        let all: Vec<String> = self
            .conn()
            .hvals(self.queue_key())
            .await
            .map_err(unavailable)?;
        let mut entries = all
            .iter()
            .map(|s| parse_entry(s))
            .collect::<Result<Vec<_>, _>>()?;
        // As the SQL stores list them: by enqueue time, then by callId as text.
        entries.sort_by_cached_key(|e| (e.enqueued_ms, e.call_id.to_string()));
        Ok(entries)
    }

    async fn append_journal(
        &self,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut invocation = self.scripts.journal.key(self.record_key(key));
        invocation
            .key(self.journal_key(key))
            .arg(keep_ms)
            .arg(JOURNAL_LIMIT);
        for event in &events[events.len().saturating_sub(JOURNAL_LIMIT)..] {
            invocation.arg(journal::encode(event)?);
        }
        invocation
            .invoke_async::<()>(&mut self.conn())
            .await
            .map_err(unavailable)
    }

    async fn journal(&self, key: &Key, _now_ms: u64) -> Result<Vec<Event>, StoreError> {
        let all: Vec<Vec<u8>> = self
            .conn()
            .lrange(self.journal_key(key), 0, -1)
            .await
            .map_err(unavailable)?;
        all.iter().map(|text| journal::decode(text)).collect()
    }

    /// Scans every journal (`SCAN` on every primary) for each page: an audit's cost grows with the
    /// journals held (few: the happy path writes none), not with the receipts.
    async fn journaled_keys(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        let prefix = format!("{}:j:{{", self.prefix);
        let names = self.names(&format!("{prefix}*")).await?;
        let digests = names
            .iter()
            .filter_map(|name| digest_from_hex(name.strip_prefix(&prefix)?.strip_suffix('}')?));
        Ok(super::page_of_keys(digests, after, limit))
    }

    async fn journal_of_call(
        &self,
        call_id: &CallId,
        now_ms: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let Some(key) = self.key_of_call(call_id).await? else {
            return Ok(Vec::new());
        };
        let mut events = self.journal(&key, now_ms).await?;
        events.retain(|e| &e.call_id == call_id);
        Ok(events)
    }
}

impl RedisStore {
    /// The key `call_id` claimed (its digest, without scope), from the callId index, or from this
    /// process's claims whose index entry is not known written yet.
    async fn key_of_call(&self, call_id: &CallId) -> Result<Option<Key>, StoreError> {
        let digest: Option<Vec<u8>> = self
            .conn()
            .get(self.index_key(call_id))
            .await
            .map_err(unavailable)?;
        let digest = match digest {
            Some(digest) => digest,
            None => match self
                .unindexed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .find(|(_, owner)| owner.call_id == *call_id)
            {
                Some((digest, _)) => digest.to_vec(),
                None => return Ok(None),
            },
        };
        let digest: [u8; 32] = digest
            .as_slice()
            .try_into()
            .map_err(|_| corrupt("a key is 32 bytes"))?;
        Ok(Some(Key::from_digest("", digest)))
    }
}

impl RedisStore {
    /// Checks, on every primary, the settings that decide whether Redis may lose an acknowledged claim:
    /// `maxmemory-policy` must be `noeviction` and `appendonly` must be `yes`. A server that cannot be
    /// asked (`CONFIG` disabled or renamed) is refused too: use [`RedisStore::connect_unverified`] for
    /// one whose durability you know.
    pub async fn verify_durable(&self) -> Result<(), StoreError> {
        for node in self.primaries().await? {
            let where_ = match &node {
                Some(SingleNodeRoutingInfo::ByAddress { host, port }) => {
                    format!(" on {host}:{port}")
                }
                _ => String::new(),
            };
            let setting = |name: &'static str| {
                let node = node.clone();
                let mut conn = self.conn();
                async move {
                    let get = redis::cmd("CONFIG").arg("GET").arg(name).clone();
                    let answer: redis::RedisResult<Vec<String>> = match (&node, &mut conn) {
                        (Some(route), Connection::Cluster(c)) => c
                            .route_command(get, RoutingInfo::SingleNode(route.clone()))
                            .await
                            .and_then(|v| redis::from_redis_value(v).map_err(Into::into)),
                        (_, conn) => get.query_async(conn).await,
                    };
                    match answer {
                        Ok(pair) => pair
                            .get(1)
                            .cloned()
                            .ok_or_else(|| format!("`CONFIG GET {name}` answered nothing")),
                        Err(e) => Err(format!("`CONFIG GET {name}` failed ({e})")),
                    }
                }
            };
            let problems: Vec<String> = match (
                setting("maxmemory-policy").await,
                setting("appendonly").await,
            ) {
                (Ok(policy), Ok(aof)) => {
                    let mut problems = Vec::new();
                    if policy != "noeviction" {
                        problems.push(format!("maxmemory-policy is `{policy}`, so Redis may evict a claim and free its key (set `noeviction`)"));
                    }
                    if aof != "yes" {
                        problems.push(format!("appendonly is `{aof}`, so a restart loses the claims since the last snapshot (set `appendonly yes`, `appendfsync always`)"));
                    }
                    problems
                }
                (Err(e), _) | (_, Err(e)) => {
                    vec![format!("its durability settings cannot be read: {e}")]
                }
            };
            if !problems.is_empty() {
                return Err(StoreError::NotDurable(format!(
                    "Redis{where_} is not safe as the store of record: {}; a forgotten claim is a call that runs twice. Use RedisStore::connect_unverified for a cache, or for a server whose durability you vouch for",
                    problems.join("; ")
                )));
            }
        }
        Ok(())
    }

    /// Runs `action` (`update_entry.lua`) on the entry of `call_id`, for the worker holding it under
    /// `fence` (`None`: whoever holds it).
    async fn update_entry(
        &self,
        call_id: &CallId,
        fence: Option<Fence>,
        action: &[&str],
    ) -> Result<(), StoreError> {
        let mut invocation = self.scripts.update_entry.key(self.queue_key());
        invocation
            .arg(call_id.to_string())
            .arg(fence.map(|f| f.0.to_string()).unwrap_or_default());
        for arg in action {
            invocation.arg(*arg);
        }
        let answer: Vec<i64> = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        match answer.as_slice() {
            [1] => Ok(()),
            [0] => Err(StoreError::NotFound),
            [-1, current] => Err(StoreError::Fenced {
                presented: fence.map_or(0, |f| f.0),
                current: u64::try_from(*current).unwrap_or(0),
            }),
            other => Err(corrupt(format!(
                "unexpected answer {other:?} to a compensation update"
            ))),
        }
    }
}

fn parse_entry(json: &str) -> Result<CompensationEntry, StoreError> {
    let q: QueuedEntry = serde_json::from_str(json).map_err(corrupt)?;
    let num = |v: &str, what: &str| number(v.as_bytes(), what);
    let digest = digest_from_hex(&q.key).ok_or_else(|| corrupt("a queued key is 64 hex digits"))?;
    let state = match q.state.as_str() {
        "PENDING" => CompensationState::Pending,
        "TAKEN" => CompensationState::Taken {
            lease_until_ms: num(&q.lease_until, "lease")?,
        },
        "MANUAL" => CompensationState::Manual,
        other => return Err(corrupt(format!("compensation state `{other}`"))),
    };
    Ok(CompensationEntry {
        call_id: q.call_id.parse().map_err(corrupt)?,
        key: Key::from_digest(q.scope, digest),
        reason: q.reason,
        round: u32::try_from(num(&q.round, "round")?).map_err(corrupt)?,
        next_at_ms: num(&q.next_at, "due time")?,
        state,
        enqueued_ms: num(&q.enqueued, "enqueue time")?,
        fence: Fence(num(&q.taker, "worker fence")?),
        attempts: q.attempts,
        last_error: q.last_error,
        encoded_inputs: q.inputs.map(|text| Arc::from(text.into_bytes())),
    })
}

impl RedisStore {
    /// The nodes a full scan must visit: the one server, or every primary of a cluster (from
    /// `CLUSTER NODES`).
    async fn primaries(&self) -> Result<Vec<Option<SingleNodeRoutingInfo>>, StoreError> {
        let Connection::Cluster(mut c) = self.conn() else {
            return Ok(vec![None]);
        };
        let answer = c
            .route_command(
                redis::cmd("CLUSTER").arg("NODES").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .map_err(unavailable)?;
        let text: String = redis::from_redis_value(answer).map_err(corrupt)?;
        let mut nodes = Vec::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(address), Some(flags)) = (fields.get(1), fields.get(2)) else {
                continue;
            };
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                continue;
            }
            // `host:port@cport`
            let host_port = address.split('@').next().unwrap_or(address);
            let Some((host, port)) = host_port.rsplit_once(':') else {
                continue;
            };
            let Ok(port) = port.parse::<u16>() else {
                continue;
            };
            nodes.push(Some(SingleNodeRoutingInfo::ByAddress {
                host: host.to_owned(),
                port,
            }));
        }
        if nodes.is_empty() {
            return Err(corrupt("CLUSTER NODES lists no primary"));
        }
        Ok(nodes)
    }

    /// Marks the record of `key` held under `fence` in one of the states `from` (space-separated)
    /// `RELEASED`, kept a day as a tombstone: a release, or a forget. The refusal as [`Self::write`]
    /// explains it.
    async fn mark_released(
        &self,
        key: &Key,
        fence: Fence,
        from: &str,
    ) -> Result<Result<(), Option<Receipt>>, StoreError> {
        let fields = [
            ("state", b"RELEASED".to_vec()),
            ("lease_until", Vec::new()),
            ("outcome", Vec::new()),
        ];
        let day = (24 * 3600 * 1000u64).to_string();
        self.write(key, fence, from, &day, "", &fields).await
    }

    /// Deletes the cache entry of `key` (its callId index entry expires by itself, and finds no record).
    async fn cache_forget(&self, key: &Key) -> Result<(), StoreError> {
        self.conn()
            .del::<_, ()>(self.record_key(key))
            .await
            .map_err(unavailable)
    }

    /// Writes a finished receipt as a cache entry (record and callId index), expiring with it.
    async fn cache_put(&self, receipt: &Receipt, keep: u64) -> Result<(), StoreError> {
        let Some(expires_at) = receipt.expires_at_ms else {
            return Ok(());
        };
        let record = self.record_key(&receipt.key);
        let fields: Vec<(&str, Vec<u8>)> = vec![
            ("digest", receipt.key.digest().to_vec()),
            ("scope", receipt.key.scope().as_bytes().to_vec()),
            ("call_id", receipt.call_id.to_string().into_bytes()),
            ("state", receipt.state.as_str().as_bytes().to_vec()),
            ("fence", receipt.fence.0.to_string().into_bytes()),
            ("expires_at", expires_at.to_string().into_bytes()),
            (
                "fingerprint",
                receipt
                    .fingerprint
                    .map(|f| f.0.to_vec())
                    .unwrap_or_default(),
            ),
            (
                "outcome",
                receipt.outcome.as_deref().unwrap_or_default().to_vec(),
            ),
            ("created", receipt.created_ms.to_string().into_bytes()),
            ("updated", receipt.updated_ms.to_string().into_bytes()),
        ];
        // The entry and its expiry in one MULTI on the record's own key (one slot), so an entry never
        // outlives its receipt; the callId index entry, on another key, expires with it.
        let mut entry = redis::pipe();
        entry
            .atomic()
            .hset_multiple(&record, &fields)
            .ignore()
            .pexpire(&record, i64::try_from(keep).unwrap_or(i64::MAX))
            .ignore();
        entry
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(unavailable)?;
        redis::cmd("SET")
            .arg(self.index_key(&receipt.call_id))
            .arg(receipt.key.digest().as_slice())
            .arg("PX")
            .arg(keep)
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(unavailable)
    }
}

mod cache;

pub use cache::CachedStore;
