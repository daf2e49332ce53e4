//! The [`Store`] trait, in its four contracts (receipts, the compensation queue, the journal, listings)
//! and what a store says of itself, with the values its receipt methods take and answer.
//!
//! The guarantees are the [module documentation](super)'s: every method's own doc states its share.
//! The defaults' bodies are here too: [`poll_settled`] (waiting) and the batch lookup by callId.

use std::time::Duration;

use async_trait::async_trait;

use super::{ReceiptPage, ReceiptQuery};
use crate::call_id::CallId;
use crate::compensation::CompensationEntry;
use crate::error::StoreError;
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

/// Whose clock judges a store's leases and expiries (see the [module documentation](super)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreClock {
    /// The caller's `now_ms`: a store one process or one machine owns (memory, SQLite).
    Caller,
    /// The store's own: a store that several nodes share (PostgreSQL, Redis).
    Own,
}

/// A receipt store. See the [module documentation](super) for the contract every implementation
/// keeps; a store that wraps another implements [`StoreWrapper`](super::StoreWrapper) instead and
/// writes only the methods it changes.
///
/// The methods come as four contracts, in this order, then what the store says of itself:
///
/// # Receipts
///
/// Claims, an owner's writes under its fence, reads by key and by callId, waiting for an owner:
/// [`claim`](Store::claim), [`take_over`](Store::take_over), [`extend_lease`](Store::extend_lease),
/// [`complete`](Store::complete), [`mark_unknown`](Store::mark_unknown), [`release`](Store::release),
/// [`forget`](Store::forget), [`get`](Store::get), [`get_by_call_id`](Store::get_by_call_id),
/// [`get_by_call_ids`](Store::get_by_call_ids), [`wait_settled`](Store::wait_settled).
///
/// # The compensation queue
///
/// Uncertain calls, queued once per callId and leased to one worker at a time:
/// [`enqueue_compensation`](Store::enqueue_compensation),
/// [`take_due_compensations`](Store::take_due_compensations),
/// [`reschedule_compensation`](Store::reschedule_compensation),
/// [`finish_compensation`](Store::finish_compensation),
/// [`escalate_compensation`](Store::escalate_compensation),
/// [`list_compensations`](Store::list_compensations).
///
/// # The journal
///
/// The events of every call on a key, in the order they were appended:
/// [`append_journal`](Store::append_journal), [`journal`](Store::journal),
/// [`journal_of_call`](Store::journal_of_call), [`journaled_keys`](Store::journaled_keys).
///
/// # Listings
///
/// Walks over many records in bounded memory, and the sweep of expired ones:
/// [`list_receipts`](Store::list_receipts), [`list_orphans`](Store::list_orphans),
/// [`count_expired`](Store::count_expired), [`purge_expired`](Store::purge_expired).
///
/// # The store itself
///
/// What kind of store it is, and whose clock judges its time: [`kind`](Store::kind),
/// [`clock`](Store::clock), [`now_ms`](Store::now_ms).
#[async_trait]
pub trait Store: std::any::Any + Send + Sync {
    // # Receipts

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

    /// Takes back a finished record — `SUCCESS` or `FAILED` — that carries `expected`, for a person's
    /// correction of what it says ([`Compensator::resolve`](crate::Compensator::resolve) of a call
    /// whose record contradicts what happened): the record becomes `PROCESSING` under a new fence and
    /// a lease of `lease_ms`, with its callId unchanged, and the caller then writes the outcome with
    /// [`Store::complete`] (or gives the key back). Duplicates meanwhile find the call running. A store
    /// that keeps finished receipts in front of another (a cache) drops its copy first, as for
    /// [`Store::forget`]. Otherwise answers [`Claimed::Existing`] with the current record;
    /// [`StoreError::NotFound`] if there is none.
    async fn reopen(
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
        get_each_by_call_id(self, call_ids).await
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

    // # The compensation queue

    /// Queues an uncertain call for compensation. Enqueuing a callId that is already queued changes
    /// nothing. The entry is due `next_at_ms - enqueued_ms` after now by the store's judge of time
    /// (its server's clock where nodes share it, as [`Store::take_due_compensations`] judges "due"),
    /// so a queuing node whose clock runs ahead or behind queues it due on time.
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

    // # The journal

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

    /// The events of one call that the store still keeps, in the order they were appended — also for
    /// a call still running in another process, and for one whose claim was given back.
    async fn journal_of_call(
        &self,
        call_id: &CallId,
        now_ms: u64,
    ) -> Result<Vec<Event>, StoreError>;

    /// Up to `limit` keys that have a journal, in the order of their digests, after the digest `after`:
    /// what an audit walks to read every journal (most keys have none, since the happy path writes
    /// nothing). The keys carry no scope; a key listed may answer an empty [`Store::journal`] (its
    /// journal expired meanwhile).
    async fn journaled_keys(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError>;

    // # Listings

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

    /// How many records [`Store::purge_expired`] would evict now, evicting nothing (a dry run).
    async fn count_expired(&self, now_ms: u64) -> Result<usize, StoreError>;

    /// Evicts records that expired by now; returns how many.
    async fn purge_expired(&self, now_ms: u64) -> Result<usize, StoreError>;

    // # The store itself

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
}

/// [`Store::get_by_call_ids`] by asking [`Store::get_by_call_id`] for each callId: the default, and what
/// a wrapper that answers single queries itself (a cache) keeps for the batch.
pub(crate) async fn get_each_by_call_id<S: Store + ?Sized>(
    store: &S,
    call_ids: &[CallId],
) -> Result<Vec<Receipt>, StoreError> {
    let mut found = Vec::new();
    for call_id in call_ids {
        if let Some(receipt) = store.get_by_call_id(call_id).await? {
            found.push(receipt);
        }
    }
    Ok(found)
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
