//! The store contract: one async trait that every backend (memory now; SQLite, PostgreSQL, Redis next)
//! implements, and one [conformance suite](crate::conformance) that every backend passes.
//!
//! # Contract
//!
//! * **Atomic claim.** [`Store::claim`] creates the record of a key if (and only if) there is none, or the
//!   one there has expired, in one atomic step (an entry API, a unique index, `SET NX`). Exactly one of any
//!   number of concurrent claims of one key gets [`Claimed::Acquired`]; the others get the record.
//! * **Fencing.** Every claim and take-over hands out a [`Fence`] larger than any the store handed out
//!   before for that key (the in-memory store counts per shard of keys; a backend may count per
//!   key, as long as a key's fences never repeat, even after its record expired). Every write of an
//!   owner ([`Store::complete`], [`Store::mark_unknown`], [`Store::release`], [`Store::extend_lease`])
//!   presents its fence and is refused with [`StoreError::Fenced`] if the record now carries another
//!   one.
//! * **Forward only.** Writes follow [`ReceiptState::advance`]: the same transition again reports
//!   [`Transition::AlreadyApplied`] and changes nothing; a backward one is
//!   [`StoreError::InvalidTransition`]. [`Store::take_over`] is the one move out of `UNKNOWN` or an
//!   expired `PROCESSING` that is not an outcome: it starts a new owner (new fence) on the same callId.
//! * **TTL.** A terminal record lives until its `expires_at_ms`; after that the key may be claimed anew
//!   and the record may be evicted. Records without an expiry (claims, `UNKNOWN`s) are kept.
//! * **Receipts from the store alone.** [`Store::get_by_call_id`] answers from stored data only.
//! * **Compensation queue.** Uncertain calls are enqueued once per callId, taken by one worker at a time
//!   (a lease, like `FOR UPDATE SKIP LOCKED`), rescheduled at growing intervals, and either finished or
//!   escalated to `MANUAL` — never dropped.
//! * **Time is judged where it is shared.** Leases and expiries are durations (`lease_ms`, `ttl_ms`)
//!   that the store turns into times, and the store alone compares them with "now". Every operation
//!   that depends on time also takes the caller's `now_ms` (Unix milliseconds): a store that one
//!   process or one machine owns (memory, SQLite) judges by it, so tests drive time; a store that
//!   several nodes share (PostgreSQL, Redis) judges by its own clock and ignores the caller's, since
//!   nodes disagree about time. [`Store::clock`] says whose clock that is, [`Store::now_ms`] what it
//!   reads now. The compensation queue's leases and rounds are judged the same way (an entry's
//!   `next_at_ms` when queued is the caller's time: it is due at once).
//! * **Journal.** Events appended to a key's journal are read back in order, by key and by callId
//!   (also while the call runs, from another process); a key keeps its latest
//!   [`JOURNAL_LIMIT`](crate::journal::JOURNAL_LIMIT) events, for as long as its record lives and at
//!   least the `keep_ms` of the latest append.
//! * **Failing closed.** An unreachable store answers [`StoreError::Unavailable`]; callers run nothing.
//!   A write the store may have applied before it failed to answer (a crash after the commit, a
//!   connection reset) must fail with [`StoreError::Unavailable`] or [`StoreError::Corrupt`], never
//!   with a refusal: the caller then reads the key again and releases its claim if it finds it as
//!   written (`PROCESSING`, its callId, `updated_ms == created_ms`, and on a [`StoreClock::Caller`]
//!   store `created_ms` the claim's `now_ms`). So a claim's record is created with `updated_ms` equal
//!   to `created_ms`, and a take-over sets `updated_ms` later than `created_ms`.

mod local;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "redis")]
pub use self::redis::{CachedStore, RedisStore, DEFAULT_INDEX_TTL};
pub use crate::error::StoreError;
pub use local::{LocalCache, DEFAULT_LOCAL_MAX_AGE};
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::PgStore;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

use std::time::Duration;

/// The attribute that [`Store`] implementations put on their `impl` block (re-exported so that a backend
/// needs no dependency of its own for it).
#[doc(hidden)]
pub use async_trait::async_trait;

use crate::call_id::CallId;
use crate::compensation::CompensationEntry;
use crate::journal::Event;
use crate::key::{Fingerprint, Key};
use crate::receipt::{Fence, Receipt, ReceiptState, Transition};

/// A request to claim a key.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The key to claim.
    pub key: Key,
    /// The call that claims it.
    pub call_id: CallId,
    /// The fingerprint of the `verify` parts, kept to check replays.
    pub fingerprint: Option<Fingerprint>,
    /// How long the owner's lease lasts from the claim (ms).
    pub lease_ms: u64,
    /// The caller's time (Unix ms); see the module docs for who judges time.
    pub now_ms: u64,
}

/// The answer to a [`Claim`] or a take-over.
// `Existing` is the answer every replay gets: returned by value, not boxed, to spare it an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Claimed {
    /// The caller owns the key (receipt `PROCESSING`) under this fence.
    Acquired(Fence),
    /// The key is held: here is its record.
    Existing(Receipt),
}

/// The final outcome of a call, as written by [`Store::complete`].
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// `SUCCESS` or `FAILED`.
    pub state: ReceiptState,
    /// The encoded result or error; `None` if it could not be encoded.
    pub outcome: Option<std::sync::Arc<[u8]>>,
    /// How long the finished record is kept from now (ms): the function's `ttl`.
    pub ttl_ms: u64,
}

/// Which receipts [`Store::list_receipts`] answers: those created in `[since_ms, until_ms)`, of one
/// scope and some states if asked, after a cursor; ordered by creation time, then key digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptQuery {
    /// Created at or after this time (Unix ms).
    pub since_ms: u64,
    /// Created before this time (Unix ms).
    pub until_ms: u64,
    /// Only this scope.
    pub scope: Option<String>,
    /// Only these states (empty: every state).
    pub states: Vec<ReceiptState>,
    /// Continue after this position (from [`ReceiptPage::next`]).
    pub after: Option<Cursor>,
    /// At most this many rows are read for one page.
    pub limit: usize,
}

impl ReceiptQuery {
    /// The receipts created in `[since_ms, until_ms)`, 1 000 rows a page.
    pub fn created_between(since_ms: u64, until_ms: u64) -> ReceiptQuery {
        ReceiptQuery {
            since_ms,
            until_ms,
            scope: None,
            states: Vec::new(),
            after: None,
            limit: 1_000,
        }
    }

    /// Only the receipts of `scope`.
    pub fn scope(mut self, scope: impl Into<String>) -> ReceiptQuery {
        self.scope = Some(scope.into());
        self
    }

    /// Only the receipts in one of `states`.
    pub fn states(mut self, states: impl IntoIterator<Item = ReceiptState>) -> ReceiptQuery {
        self.states = states.into_iter().collect();
        self
    }

    /// The page after `cursor`.
    pub fn after(mut self, cursor: Cursor) -> ReceiptQuery {
        self.after = Some(cursor);
        self
    }

    /// How many rows a page reads (at least 1).
    pub fn limit(mut self, limit: usize) -> ReceiptQuery {
        self.limit = limit.max(1);
        self
    }

    /// Whether `r` passes the query's filters (not its time range or cursor).
    pub fn admits(&self, r: &Receipt) -> bool {
        self.scope.as_deref().is_none_or(|s| r.key.scope() == s)
            && (self.states.is_empty() || self.states.contains(&r.state))
    }
}

/// A position in the order of [`Store::list_receipts`]: a receipt's creation time and key digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cursor {
    /// The creation time (Unix ms).
    pub created_ms: u64,
    /// The key digest.
    pub digest: [u8; 32],
}

impl Cursor {
    /// The position of `r`.
    pub fn of(r: &Receipt) -> Cursor {
        Cursor {
            created_ms: r.created_ms,
            digest: *r.key.digest(),
        }
    }
}

/// One page of [`Store::list_receipts`].
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptPage {
    /// The receipts of the page that pass the filters, in order.
    pub receipts: Vec<Receipt>,
    /// Where the next page starts; `None` when this one is the last.
    pub next: Option<Cursor>,
}

/// Whose clock judges a store's leases and expiries (see the [module documentation](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreClock {
    /// The caller's `now_ms`: a store one process or one machine owns (memory, SQLite).
    Caller,
    /// The store's own: a store that several nodes share (PostgreSQL, Redis).
    Own,
}

/// A receipt store. See the [module documentation](self) for the contract every implementation keeps.
#[async_trait]
pub trait Store: std::any::Any + Send + Sync {
    /// Claims `claim.key` for `claim.call_id`, atomically: [`Claimed::Acquired`] with a new fence if the
    /// key had no live record, else [`Claimed::Existing`] with that record.
    async fn claim(&self, claim: Claim) -> Result<Claimed, StoreError>;

    /// Takes over a key whose record carries `expected` and is `UNKNOWN`, or `RECEIVED`/`PROCESSING`
    /// with a lease that has ended (by the store's judge of time): the record becomes `PROCESSING`
    /// under a new fence and a lease of `lease_ms`, with its callId unchanged. Otherwise answers
    /// [`Claimed::Existing`] with the current record (the lease is alive, someone else took over, or the
    /// owner finished). [`StoreError::NotFound`] if there is no record.
    async fn take_over(
        &self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Claimed, StoreError>;

    /// Extends the lease of the owner holding `fence` to `lease_ms` from now.
    async fn extend_lease(
        &self,
        key: &Key,
        fence: Fence,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError>;

    /// Records the final outcome, if `fence` still owns the key.
    async fn complete(
        &self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        now_ms: u64,
    ) -> Result<Transition, StoreError>;

    /// Marks the outcome `UNKNOWN` (kept until resolved), if `fence` still owns the key.
    async fn mark_unknown(
        &self,
        key: &Key,
        fence: Fence,
        now_ms: u64,
    ) -> Result<Transition, StoreError>;

    /// Deletes the claim of an owner that proved nothing ran, so the key can be claimed again.
    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError>;

    /// Deletes the finished record (`SUCCESS` or `FAILED`) of `key` held under `fence`, so that the key
    /// may be claimed again: a person's decision (a customer may redo the operation), made through
    /// [`Runtime::forget`](crate::Runtime::forget). The key's journal stays.
    /// [`StoreError::InvalidTransition`] for a record that is not finished (its call may still take
    /// effect), [`StoreError::Fenced`] when `fence` is not the record's, [`StoreError::NotFound`] when
    /// there is none.
    async fn forget(&self, key: &Key, fence: Fence) -> Result<(), StoreError>;

    /// The record of a key, if it has one that has not expired at `now_ms`.
    async fn get(&self, key: &Key, now_ms: u64) -> Result<Option<Receipt>, StoreError>;

    /// The record owned by `call_id`, from stored data only.
    async fn get_by_call_id(&self, call_id: &CallId) -> Result<Option<Receipt>, StoreError>;

    /// The records owned by `call_ids` that the store holds, in any order: what a reconciliation asks
    /// for a page of the counterparty's records at once. The default asks
    /// [`Store::get_by_call_id`] for each; the SQL stores answer in one statement.
    async fn get_by_call_ids(&self, call_ids: &[CallId]) -> Result<Vec<Receipt>, StoreError> {
        let mut found = Vec::new();
        for call_id in call_ids {
            if let Some(receipt) = self.get_by_call_id(call_id).await? {
                found.push(receipt);
            }
        }
        Ok(found)
    }

    /// Waits until the record of `key` changes from `PROCESSING` (completed, marked unknown, released,
    /// taken over) or `timeout` passes, then returns the record as it is. It may return earlier (when
    /// the owner's lease ends, say): the caller looks again. The default implementation polls
    /// [`Store::get`] at growing intervals; backends with notifications override it.
    async fn wait_settled(
        &self,
        key: &Key,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        poll_settled(self, key, timeout, now_ms).await
    }

    /// What kind of store this is, for metrics (`samekey_store_errors_total{backend}`): `memory`,
    /// `sqlite`, `postgres`, `redis`, `cached`; `custom` by default.
    fn kind(&self) -> &'static str {
        "custom"
    }

    /// Whose clock judges this store's leases and expiries.
    fn clock(&self) -> StoreClock {
        StoreClock::Caller
    }

    /// The time this store judges leases and expiries by (Unix ms): `caller_now_ms` for a store that
    /// takes the caller's time (the default), the store's own clock for one that several nodes share.
    async fn now_ms(&self, caller_now_ms: u64) -> Result<u64, StoreError> {
        Ok(caller_now_ms)
    }

    /// Evicts records that expired by now; returns how many.
    async fn purge_expired(&self, now_ms: u64) -> Result<usize, StoreError>;

    /// How many records [`Store::purge_expired`] would evict now, evicting nothing (a dry run).
    async fn count_expired(&self, now_ms: u64) -> Result<usize, StoreError>;

    /// One page of the receipts `query` selects that have not expired by now (released keys are not
    /// receipts). Pages are read in the order of creation time, then key digest, `query.limit` rows at
    /// a time, so that a day of receipts is walked in bounded memory; the filters (scope, states)
    /// may make a page shorter than the limit without it being the last: follow
    /// [`ReceiptPage::next`] until it is `None`.
    async fn list_receipts(
        &self,
        query: &ReceiptQuery,
        now_ms: u64,
    ) -> Result<ReceiptPage, StoreError>;

    /// Up to `limit` records still `PROCESSING` whose owner's lease ended by now and that no
    /// compensation entry covers (an owner that crashed mid-call: nothing queued it), earliest lease
    /// first. The compensation worker's sweep queues them; once queued, a record is not listed again.
    /// "Now" is the store's clock where nodes share it.
    async fn list_orphans(&self, now_ms: u64, limit: usize) -> Result<Vec<Receipt>, StoreError>;

    /// Queues an uncertain call for compensation. Enqueuing a callId that is already queued changes
    /// nothing.
    async fn enqueue_compensation(&self, entry: CompensationEntry) -> Result<(), StoreError>;

    /// Takes, atomically, up to `limit` entries due now (pending and due, or taken under a lease that
    /// lapsed), oldest due first, and leases each to the caller for `lease_ms` under a new worker
    /// fence ([`CompensationEntry::fence`], larger than any earlier take of that entry), so that no
    /// other worker takes it meanwhile and a worker whose lease lapsed and whose entry was taken again
    /// is refused by the fenced operations below. "Now" is the store's clock where nodes share it.
    async fn take_due_compensations(
        &self,
        now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError>;

    /// Puts an entry the caller took under `fence` back for round `round`, due `delay_ms` from now.
    /// [`StoreError::Fenced`] when another worker took it since; [`StoreError::NotFound`] when it is
    /// gone.
    async fn reschedule_compensation(
        &self,
        call_id: &CallId,
        fence: Fence,
        round: u32,
        delay_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError>;

    /// Removes a resolved entry: whoever holds it (`None`: the call's key was resolved by its owner,
    /// or by a person), or only if the caller still holds it (`Some(fence)`, else
    /// [`StoreError::Fenced`]). Removing one that is not queued changes nothing.
    async fn finish_compensation(
        &self,
        call_id: &CallId,
        fence: Option<Fence>,
    ) -> Result<(), StoreError>;

    /// Marks an entry the caller took under `fence` `MANUAL`: it stays, visible, for a person.
    /// [`StoreError::Fenced`] when another worker took it since; [`StoreError::NotFound`] when it is
    /// gone.
    async fn escalate_compensation(
        &self,
        call_id: &CallId,
        fence: Fence,
        now_ms: u64,
    ) -> Result<(), StoreError>;

    /// All queued entries, pending and manual, oldest first (for inspection).
    async fn list_compensations(&self) -> Result<Vec<CompensationEntry>, StoreError>;

    /// Appends `events` (in order) to the journal of `key`. The journal keeps the key's latest
    /// [`JOURNAL_LIMIT`](crate::journal::JOURNAL_LIMIT) events, and lives as long as the key's record
    /// does, and at least `keep_ms` from now (by the store's judge of time). See [`crate::journal`].
    async fn append_journal(
        &self,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        now_ms: u64,
    ) -> Result<(), StoreError>;

    /// The journal of `key`: the events of every call on it that the store still keeps, in the order
    /// they were appended.
    async fn journal(&self, key: &Key, now_ms: u64) -> Result<Vec<Event>, StoreError>;

    /// Up to `limit` keys that have a journal, in the order of their digests, after the digest `after`:
    /// what an audit walks to read every journal (most keys have none, since the happy path writes
    /// nothing). The keys carry no scope; a key listed may answer an empty [`Store::journal`] (its
    /// journal expired meanwhile).
    async fn journaled_keys(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError>;

    /// The events of one call that the store still keeps, in the order they were appended — also for
    /// a call still running in another process, and for one whose claim was given back.
    async fn journal_of_call(
        &self,
        call_id: &CallId,
        now_ms: u64,
    ) -> Result<Vec<Event>, StoreError>;
}

/// A page of [`Store::journaled_keys`] from the digests of every key with a journal (in any order,
/// once each): those after `after`, in order, at most `limit`.
pub(crate) fn page_of_keys(
    digests: impl Iterator<Item = [u8; 32]>,
    after: Option<[u8; 32]>,
    limit: usize,
) -> Vec<Key> {
    let mut page: Vec<[u8; 32]> = digests
        .filter(|d| after.is_none_or(|after| *d > after))
        .collect();
    page.sort_unstable();
    page.truncate(limit);
    page.into_iter().map(|d| Key::from_digest("", d)).collect()
}

/// [`Store::wait_settled`] by polling [`Store::get`] at growing intervals (20 ms to 1 s): the default,
/// and what a backend without notifications for some of its deployments falls back to.
pub async fn poll_settled<S: Store + ?Sized>(
    store: &S,
    key: &Key,
    timeout: Duration,
    now_ms: u64,
) -> Result<Option<Receipt>, StoreError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let start = tokio::time::Instant::now();
    let mut interval = Duration::from_millis(20);
    loop {
        let elapsed = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let record = store.get(key, now_ms.saturating_add(elapsed)).await?;
        let settled = record
            .as_ref()
            .is_none_or(|r| r.state != ReceiptState::Processing);
        if settled || tokio::time::Instant::now() >= deadline {
            return Ok(record);
        }
        tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + interval)).await;
        interval = (interval * 2).min(Duration::from_secs(1));
    }
}

/// Why an owner's write (under `fence`, towards `to`) changed nothing, from the record as it is now
/// (`None`: no live record): the answer every backend whose write is one conditional statement or
/// script gives after the condition failed.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
pub(crate) fn not_owned(current: Option<&Receipt>, fence: Fence, to: ReceiptState) -> StoreError {
    match current {
        None => StoreError::NotFound,
        Some(current) if current.fence != fence => StoreError::Fenced {
            presented: fence.0,
            current: current.fence.0,
        },
        Some(current) => StoreError::InvalidTransition {
            from: current.state,
            to,
        },
    }
}

/// Like [`not_owned`], for a transition that may be repeated: a record already in `target` under
/// `fence` is the same write again ([`Transition::AlreadyApplied`]).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
pub(crate) fn already_or_not_owned(
    current: Option<&Receipt>,
    fence: Fence,
    target: ReceiptState,
) -> Result<Transition, StoreError> {
    match current {
        Some(c) if c.fence == fence && c.state == target => Ok(Transition::AlreadyApplied),
        other => Err(not_owned(other, fence, target)),
    }
}
