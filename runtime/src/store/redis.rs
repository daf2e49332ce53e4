//! The Redis store (feature `redis`): a standalone [`Store`] whose every transition is one server-side
//! script on one key, and [`CachedStore`], a front cache over a durable store.
//!
//! # Keys and Redis Cluster
//!
//! A record lives in the hash `samekey:r:{<digest>}`, the callId index in `samekey:c:{<callId>}`, the
//! compensation queue in the hash `samekey:{queue}`. The part in braces is a hash tag, and every script
//! reads and writes only its one `KEYS[1]`, so every script runs within one slot; commands on two keys
//! (a completion and its index entry) are sent side by side, not as one pipeline or transaction.
//! [`RedisStore::connect_cluster`] uses redis-rs's cluster client, which routes each command to its
//! slot's node, and [`Store::purge_expired`] scans every primary. The conformance suite runs against a
//! three-primary cluster in CI (`scripts/services`), and a test checks that keys spread over its nodes.
//!
//! # Durability
//!
//! Redis keeps what it acknowledged only as far as its settings say, and a claim it forgets is a call
//! that runs twice. As the store of record it must:
//!
//! * never evict: `maxmemory-policy noeviction` (an evicted claim frees its key);
//! * persist every write: `appendonly yes`, with `appendfsync always` (`everysec` loses up to a second
//!   of claims in a crash);
//! * not fail over to a replica that lags: Redis replicates asynchronously, so a promoted replica may
//!   lack the last claims. Run without automatic failover, or put [`CachedStore`] in front of
//!   PostgreSQL instead.
//!
//! [`RedisStore::connect`] and the other checked constructors read `maxmemory-policy` and `appendonly`
//! of every primary (`CONFIG GET`) and refuse with [`StoreError::NotDurable`] when one says the server
//! may lose claims, or cannot be asked. [`RedisStore::connect_unverified`] skips the check: for the
//! cache of a [`CachedStore`] (which may evict at will: the durable store decides every claim), or for
//! a managed Redis whose durability you vouch for. `scripts/services` runs Redis as a store of record.
//!
//! # The callId index
//!
//! A claim is one read-only script when the key is held (a replay costs one round trip and writes
//! nothing); when it takes the key, the callId index entry goes out with the call's next write (its
//! completion, a lease renewal, `UNKNOWN`), in that write's round trip. Until then, a call in flight is
//! found by callId from the process that owns it, and by key from anywhere.
//!
//! # Fences and time
//!
//! Every script that judges or writes a time reads it from the server (`TIME`), on the node that holds
//! the record: leases and expiries are the server's, never an instance's, so instances whose clocks
//! disagree still agree on whose lease is alive. A record's first fence is the server's time in µs'
//! worth of ms; a reused record's fence is its previous one plus one. A finished record carries
//! `expires_at`, and Redis removes it on its own a while after that (`PEXPIRE`, relative).
//!
//! [`CachedStore`] keeps finished receipts of the durable store: an entry expires (by Redis's own
//! relative `PEXPIRE`) when the receipt does, as far as the instance that wrote it can tell; the
//! durable store alone decides every claim once the entry is gone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncCommands, RedisFuture, Script};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use super::{already_or_not_owned, not_owned, Claim, Claimed, Completion, Store, StoreClock};
use crate::call_id::CallId;
use crate::compensation::{CompensationEntry, CompensationState};
use crate::error::StoreError;
use crate::key::{digest_from_hex, hex, Fingerprint, Key};
use crate::receipt::{Fence, Receipt, ReceiptState, Transition};

/// How long the callId index keeps an entry (a receipt older than this is found by key only).
pub const DEFAULT_INDEX_TTL: Duration = Duration::from_secs(8 * 24 * 3600);

/// How long after its `expires_at` Redis drops a finished record by itself.
const EXPIRY_GRACE_MS: u64 = 60_000;

/// The server's time in ms, for the scripts that judge time.
macro_rules! lua_now {
    () => {
        "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    };
}

/// ARGV: scope, callId, lease (ms), fingerprint, digest.
const CLAIM: &str = concat!(
    "local r = KEYS[1]\n",
    lua_now!(),
    r#"
local h = redis.call('HMGET', r, 'state', 'expires_at', 'fence')
local state, exp, fence = h[1], h[2], h[3]
if (exp and exp ~= '' and not tonumber(exp)) or (fence and not tonumber(fence)) then
  return {-2, 'a stored expiry or fence is not a number'}
end
local free = (not state) or state == 'RELEASED' or (exp and exp ~= '' and tonumber(exp) <= now)
if not free then
  return {0, redis.call('HGETALL', r)}
end
-- A new record's fence is the time in microseconds' worth of ms (exact in Lua's doubles): larger than
-- any fence an earlier record of the key had, unless it was taken over a thousand times in one ms.
local f = now * 1000
if fence then f = tonumber(fence) + 1 end
f = string.format('%.0f', f)
redis.call('DEL', r)
local at = string.format('%.0f', now)
redis.call('HSET', r, 'digest', ARGV[5], 'scope', ARGV[1], 'call_id', ARGV[2], 'state', 'PROCESSING',
  'fence', f, 'lease_until', string.format('%.0f', now + tonumber(ARGV[3])), 'fingerprint', ARGV[4],
  'created', at, 'updated', at)
return {1, f}
"#
);

/// ARGV: expected fence, lease (ms).
const TAKE_OVER: &str = concat!(
    "local r = KEYS[1]\n",
    lua_now!(),
    r#"
local h = redis.call('HMGET', r, 'state', 'fence', 'lease_until')
local state, fence, lease = h[1], h[2], h[3]
if not state or state == 'RELEASED' then return {-1} end
if not tonumber(fence) or (lease and lease ~= '' and not tonumber(lease)) then
  return {-2, 'a stored fence or lease is not a number'}
end
local open = state == 'UNKNOWN' or ((state == 'RECEIVED' or state == 'PROCESSING')
  and (not lease or lease == '' or tonumber(lease) <= now))
if fence ~= ARGV[1] or not open then
  return {0, redis.call('HGETALL', r)}
end
local f = string.format('%.0f', tonumber(fence) + 1)
redis.call('HSET', r, 'state', 'PROCESSING', 'fence', f,
  'lease_until', string.format('%.0f', now + tonumber(ARGV[2])), 'updated', string.format('%.0f', now))
if redis.call('HEXISTS', r, 'waited') == 1 then redis.call('PUBLISH', r .. ':settled', 'PROCESSING') end
return {1, f, redis.call('HGET', r, 'call_id')}
"#
);

/// ARGV: fence, allowed states (space-separated), a relative expiry in ms for the whole record ("" to
/// keep it, "0" to persist), times to write (space-separated `field:offset`, each set to the server's
/// time plus `offset` ms), then field/value pairs to set; a field whose value is the empty string is
/// removed. Answers 1, or the record (0) / nothing (-1) to explain the refusal.
const WRITE: &str = r#"
local r = KEYS[1]
local h = redis.call('HMGET', r, 'state', 'fence')
local state, fence = h[1], h[2]
if not state or state == 'RELEASED' then return {-1} end
if fence ~= ARGV[1] or not string.find(' ' .. ARGV[2] .. ' ', ' ' .. state .. ' ', 1, true) then
  return {0, redis.call('HGETALL', r)}
end
for i = 5, #ARGV, 2 do
  if ARGV[i + 1] == '' then redis.call('HDEL', r, ARGV[i]) else redis.call('HSET', r, ARGV[i], ARGV[i + 1]) end
end
if ARGV[4] ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for field, offset in string.gmatch(ARGV[4], '(%S+):(%d+)') do
    redis.call('HSET', r, field, string.format('%.0f', now + tonumber(offset)))
  end
end
if ARGV[3] == '0' then redis.call('PERSIST', r) elseif ARGV[3] ~= '' then redis.call('PEXPIRE', r, ARGV[3]) end
local now_state = redis.call('HGET', r, 'state')
if now_state ~= state and redis.call('HEXISTS', r, 'waited') == 1 then
  redis.call('PUBLISH', r .. ':settled', now_state)
end
return {1}
"#;

/// A record as it is and the server's time, to judge its expiry by: `{now, fields}`. With `ARGV[1]` =
/// `wait`, a `PROCESSING` record is marked waited-for first: its next change is published on
/// `KEYS[1]:settled`.
const READ: &str = concat!(
    lua_now!(),
    r#"
if ARGV[1] == 'wait' and redis.call('HGET', KEYS[1], 'state') == 'PROCESSING' then
  redis.call('HSET', KEYS[1], 'waited', '1')
end
return {string.format('%.0f', now), redis.call('HGETALL', KEYS[1])}
"#
);

const PURGE_ONE: &str = concat!(
    lua_now!(),
    r#"
local exp = redis.call('HGET', KEYS[1], 'expires_at')
if exp and exp ~= '' and tonumber(exp) <= now then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"#
);

const TAKE_DUE: &str = r#"
local q = KEYS[1]
local now = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local all = redis.call('HGETALL', q)
local due = {}
for i = 1, #all, 2 do
  -- An entry that cannot be read is left where it is (listing the queue reports it), so that it
  -- does not hold up the others.
  local ok, e = pcall(cjson.decode, all[i + 1])
  if ok and type(e) == 'table' and tonumber(e.next_at) and tonumber(e.enqueued) then
    if (e.state == 'PENDING' and tonumber(e.next_at) <= now)
       or (e.state == 'TAKEN' and tonumber(e.lease_until) and tonumber(e.lease_until) <= now) then
      table.insert(due, {all[i], e})
    end
  end
end
table.sort(due, function(a, b)
  if tonumber(a[2].next_at) ~= tonumber(b[2].next_at) then
    return tonumber(a[2].next_at) < tonumber(b[2].next_at)
  end
  return tonumber(a[2].enqueued) < tonumber(b[2].enqueued)
end)
local out = {}
for i = 1, math.min(limit, #due) do
  local e = due[i][2]
  e.state = 'TAKEN'
  e.lease_until = ARGV[3]
  local s = cjson.encode(e)
  redis.call('HSET', q, due[i][1], s)
  table.insert(out, s)
end
return out
"#;

/// ARGV: callId, then field/value pairs. Answers 0 when the entry is missing.
const UPDATE_ENTRY: &str = r#"
local s = redis.call('HGET', KEYS[1], ARGV[1])
if not s then return 0 end
local e = cjson.decode(s)
for i = 2, #ARGV, 2 do e[ARGV[i]] = ARGV[i + 1] end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(e))
return 1
"#;

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
    unindexed: Arc<Mutex<HashMap<[u8; 32], CallId>>>,
}

#[derive(Clone)]
struct Scripts {
    claim: Script,
    take_over: Script,
    write: Script,
    read: Script,
    purge_one: Script,
    take_due: Script,
    update_entry: Script,
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
    /// keeps what it acknowledges (see [Durability](self#durability)).
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
            Some(call_id) => {
                // Two keys, two slots: sent together, not as one pipeline, so that a cluster can
                // route each; on one server they still share the round trip.
                let mut conn = self.conn();
                let index = redis::cmd("SET")
                    .arg(self.index_key(&call_id))
                    .arg(key.digest().as_slice())
                    .arg("PX")
                    .arg(u64::try_from(self.index_ttl.as_millis()).unwrap_or(u64::MAX))
                    .clone();
                let indexed = async move { index.query_async::<()>(&mut conn).await };
                let mut conn = self.conn();
                let written = invocation.invoke_async::<redis::Value>(&mut conn);
                match tokio::join!(indexed, written) {
                    (Ok(()), Ok(answer)) => answer,
                    (indexed, written) => {
                        // Not sent, or not known to be: the next write of the key sends it again.
                        self.index_later(key, call_id);
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
        Ok(parse_record(key.scope(), &answer_fields(&answer)?)?.filter(|r| !r.expired(now)))
    }

    fn index_later(&self, key: &Key, call_id: CallId) {
        self.unindexed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(*key.digest(), call_id);
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
            self.index_later(&claim.key, claim.call_id);
            return Ok(Claimed::Acquired(fence));
        }
        match parse_record(claim.key.scope(), &answer_fields(&answer)?)? {
            Some(record) => Ok(Claimed::Existing(record)),
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
                    self.index_later(key, call_id);
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
        let fields = [
            ("state", b"RELEASED".to_vec()),
            ("lease_until", Vec::new()),
            ("outcome", Vec::new()),
        ];
        let day = (24 * 3600 * 1000u64).to_string();
        match self
            .write(key, fence, "PROCESSING", &day, "", &fields)
            .await?
        {
            Ok(()) | Err(None) => Ok(()),
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
        let digest: Option<Vec<u8>> = self
            .conn()
            .get(self.index_key(call_id))
            .await
            .map_err(unavailable)?;
        let digest = match digest {
            Some(digest) => digest,
            // Claimed here and not written since: the index entry is still waiting in this process.
            None => match self
                .unindexed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .find(|(_, owner)| *owner == call_id)
            {
                Some((digest, _)) => digest.to_vec(),
                None => return Ok(None),
            },
        };
        let digest: [u8; 32] = digest
            .as_slice()
            .try_into()
            .map_err(|_| corrupt("a key is 32 bytes"))?;
        let key = Key::from_digest("", digest);
        Ok(self.record(&key).await?.filter(|r| &r.call_id == call_id))
    }

    async fn purge_expired(&self, _now_ms: u64) -> Result<usize, StoreError> {
        let pattern = format!("{}:r:*", self.prefix);
        let mut names = Vec::new();
        for node in self.primaries().await? {
            let mut cursor: u64 = 0;
            loop {
                let scan = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
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
        Ok(purged)
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
        now_ms: u64,
        limit: usize,
        lease_until_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        let taken: Vec<String> = self
            .scripts
            .take_due
            .key(self.queue_key())
            .arg(now_ms)
            .arg(limit)
            .arg(lease_until_ms.to_string())
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        taken.iter().map(|s| parse_entry(s)).collect()
    }

    async fn reschedule_compensation(
        &self,
        call_id: &CallId,
        round: u32,
        next_at_ms: u64,
    ) -> Result<(), StoreError> {
        self.update_entry(
            call_id,
            &[
                ("round", round.to_string()),
                ("next_at", next_at_ms.to_string()),
                ("state", "PENDING".into()),
                ("lease_until", "0".into()),
            ],
        )
        .await
    }

    async fn finish_compensation(&self, call_id: &CallId) -> Result<(), StoreError> {
        let _: i64 = self
            .conn()
            .hdel(self.queue_key(), call_id.to_string())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn escalate_compensation(&self, call_id: &CallId, now_ms: u64) -> Result<(), StoreError> {
        self.update_entry(
            call_id,
            &[
                ("state", "MANUAL".into()),
                ("next_at", now_ms.to_string()),
                ("lease_until", "0".into()),
            ],
        )
        .await
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

    async fn update_entry(
        &self,
        call_id: &CallId,
        fields: &[(&str, String)],
    ) -> Result<(), StoreError> {
        let mut invocation = self.scripts.update_entry.key(self.queue_key());
        invocation.arg(call_id.to_string());
        for (name, value) in fields {
            invocation.arg(*name).arg(value);
        }
        let found: i64 = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if found == 1 {
            Ok(())
        } else {
            Err(StoreError::NotFound)
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
///   receipt query, a key completed by another process) is written before the answer is returned.
///
/// A cache that is down or answers nonsense is logged and bypassed for a cool-down (5 s): every
/// operation then goes to the durable store. Background writes are bounded (at most 1,024 in flight;
/// beyond that a completion is left to read-through); [`CachedStore::flush`] waits for them, for
/// tests and before a shutdown.
pub struct CachedStore<D> {
    durable: Arc<D>,
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
    /// Keys claimed through this store and not finished yet: what their receipt holds beyond the
    /// completion, so that it can be cached when they complete.
    owned: Mutex<HashMap<[u8; 32], Owned>>,
    /// One permit per background cache write that may be in flight.
    writes: Arc<Semaphore>,
}

/// What a claim taken through a [`CachedStore`] knows of its receipt.
struct Owned {
    fence: Fence,
    call_id: CallId,
    fingerprint: Option<Fingerprint>,
    created_ms: u64,
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
            durable: Arc::new(durable),
            cache: Arc::new(Cache {
                redis: cache,
                bypass_until: AtomicU64::new(0),
                epoch: std::time::Instant::now(),
                owned: Mutex::new(HashMap::new()),
                writes: Arc::new(Semaphore::new(MAX_BACKGROUND_WRITES)),
            }),
        }
    }

    /// The durable store.
    pub fn durable(&self) -> &D {
        &self.durable
    }

    /// Waits until every cache write started in the background so far has finished (or failed, which
    /// is logged and bypasses the cache). Completions during the wait are left to read-through.
    pub async fn flush(&self) {
        // Every permit back means no write in flight. (`acquire_many` fails only on a closed semaphore,
        // and this one is never closed.)
        let all = u32::try_from(MAX_BACKGROUND_WRITES).unwrap_or(u32::MAX);
        drop(self.cache.writes.acquire_many(all).await);
    }

    /// Forgets what a claim of `key` knew, and returns it if it was taken under `fence`.
    fn disown(&self, key: &Key, fence: Fence) -> Option<Owned> {
        let mut owned = self.cache.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned.remove(key.digest()).filter(|o| o.fence == fence)
    }

    /// The cached finished receipt of `key`: one Redis still holds (its entry expires with the receipt)
    /// and, when the durable store judges time by the caller's clock, not expired by it.
    async fn cached(&self, key: &Key, now_ms: u64, what: &str) -> Option<Receipt> {
        let hit = self.cache.cached(key, what).await?;
        match self.durable.clock() {
            StoreClock::Caller if hit.expired(now_ms) => None,
            _ => Some(hit),
        }
    }

    /// Writes a finished `receipt` to the cache in a task of its own (if a tokio runtime runs this call
    /// and fewer than [`MAX_BACKGROUND_WRITES`] are in flight; otherwise a later read caches it). The
    /// entry expires by Redis's relative `PEXPIRE`: after `keep`, or when the receipt expires by the
    /// durable store's clock (never by this instance's).
    fn write_behind(&self, receipt: Receipt, keep: Keep) {
        if !receipt.state.is_terminal() || !self.cache.usable() {
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
                    match (receipt.expires_at_ms, durable.now_ms(caller_now).await) {
                        (Some(expires_at), Ok(now)) => Some(expires_at.saturating_sub(now)),
                        _ => None,
                    }
                }
            };
            if let Some(keep) = keep.filter(|&ms| ms > 0) {
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

    async fn remember(&self, receipt: &Receipt, keep: u64) {
        if receipt.state.is_terminal() && self.usable() {
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

#[async_trait]
impl<D: Store> Store for CachedStore<D> {
    async fn claim(&self, claim: Claim) -> Result<Claimed, StoreError> {
        if let Some(hit) = self.cached(&claim.key, claim.now_ms, "a claim").await {
            return Ok(Claimed::Existing(hit));
        }
        let (digest, now) = (*claim.key.digest(), claim.now_ms);
        let (call_id, fingerprint) = (claim.call_id.clone(), claim.fingerprint);
        let claimed = self.durable.claim(claim).await?;
        match &claimed {
            Claimed::Acquired(fence) => {
                let owned = Owned {
                    fence: *fence,
                    call_id,
                    fingerprint,
                    created_ms: now,
                };
                let mut all = self.cache.owned.lock().unwrap_or_else(|e| e.into_inner());
                all.insert(digest, owned);
            }
            Claimed::Existing(record) => {
                self.write_behind(record.clone(), Keep::UntilExpiry(now));
            }
        }
        Ok(claimed)
    }

    async fn take_over(
        &self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        self.durable
            .take_over(key, expected, lease_ms, now_ms)
            .await
    }

    async fn extend_lease(
        &self,
        key: &Key,
        fence: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.durable
            .extend_lease(key, fence, lease_ms, now_ms)
            .await
    }

    fn clock(&self) -> StoreClock {
        self.durable.clock()
    }

    async fn now_ms(&self, caller_now_ms: u64) -> Result<u64, StoreError> {
        self.durable.now_ms(caller_now_ms).await
    }

    async fn complete(
        &self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let owned = self.disown(key, fence);
        // The durable store's expiry as far as this instance's clock tells: the cache entry expires by
        // Redis's relative `PEXPIRE`, from it.
        let (state, outcome, expires_at_ms) = (
            completion.state,
            completion.outcome.clone(),
            now_ms.saturating_add(completion.ttl_ms),
        );
        let transition = self
            .durable
            .complete(key, fence, completion, now_ms)
            .await?;
        if let (Transition::Applied, Some(owned)) = (transition, owned) {
            // The durable store committed it: the receipt it now holds, as the durable store wrote it.
            let receipt = Receipt {
                key: key.clone(),
                call_id: owned.call_id,
                state,
                fence,
                lease_until_ms: None,
                expires_at_ms: Some(expires_at_ms),
                fingerprint: owned.fingerprint,
                outcome,
                created_ms: owned.created_ms,
                updated_ms: now_ms,
            };
            self.write_behind(receipt, Keep::For(expires_at_ms.saturating_sub(now_ms)));
        }
        Ok(transition)
    }

    async fn mark_unknown(
        &self,
        key: &Key,
        fence: Fence,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        self.disown(key, fence);
        self.durable.mark_unknown(key, fence, now_ms).await
    }

    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        self.disown(key, fence);
        self.durable.release(key, fence).await
    }

    async fn get(&self, key: &Key, now_ms: u64) -> Result<Option<Receipt>, StoreError> {
        if let Some(hit) = self.cached(key, now_ms, "a read").await {
            return Ok(Some(hit));
        }
        let found = self.durable.get(key, now_ms).await?;
        if let Some(record) = &found {
            self.write_behind(record.clone(), Keep::UntilExpiry(now_ms));
        }
        Ok(found)
    }

    async fn get_by_call_id(&self, call_id: &CallId) -> Result<Option<Receipt>, StoreError> {
        if self.cache.usable() {
            match self.cache.redis.get_by_call_id(call_id).await {
                Ok(Some(hit)) if hit.state.is_terminal() => return Ok(Some(hit)),
                Ok(_) => {}
                Err(e) => self.cache.bypass(&e, "a receipt query"),
            }
        }
        let found = self.durable.get_by_call_id(call_id).await?;
        if let Some(record) = &found {
            self.write_behind(record.clone(), Keep::UntilExpiry(record.updated_ms));
        }
        Ok(found)
    }

    async fn wait_settled(
        &self,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        self.durable.wait_settled(key, timeout, now_ms).await
    }

    async fn purge_expired(&self, now_ms: u64) -> Result<usize, StoreError> {
        // Background writes started before the purge land first, so that it sees them.
        self.flush().await;
        if self.cache.usable() {
            if let Err(e) = self.cache.redis.purge_expired(now_ms).await {
                self.cache.bypass(&e, "a purge");
            }
        }
        self.durable.purge_expired(now_ms).await
    }

    async fn enqueue_compensation(&self, entry: CompensationEntry) -> Result<(), StoreError> {
        self.durable.enqueue_compensation(entry).await
    }

    async fn take_due_compensations(
        &self,
        now_ms: u64,
        limit: usize,
        lease_until_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        self.durable
            .take_due_compensations(now_ms, limit, lease_until_ms)
            .await
    }

    async fn reschedule_compensation(
        &self,
        call_id: &CallId,
        round: u32,
        next_at_ms: u64,
    ) -> Result<(), StoreError> {
        self.durable
            .reschedule_compensation(call_id, round, next_at_ms)
            .await
    }

    async fn finish_compensation(&self, call_id: &CallId) -> Result<(), StoreError> {
        self.durable.finish_compensation(call_id).await
    }

    async fn escalate_compensation(&self, call_id: &CallId, now_ms: u64) -> Result<(), StoreError> {
        self.durable.escalate_compensation(call_id, now_ms).await
    }

    async fn list_compensations(&self) -> Result<Vec<CompensationEntry>, StoreError> {
        self.durable.list_compensations().await
    }
}
