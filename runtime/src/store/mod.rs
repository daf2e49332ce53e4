//! The store contract: one async trait, [`Store`], that every backend (memory, SQLite, PostgreSQL,
//! Redis) implements, and one [conformance suite](crate::conformance) that every backend passes.
//!
//! # Contract
//!
//! Four contracts, in the order the trait lists their methods, and two rules that hold for all of
//! them.
//!
//! ## Receipts
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
//!   [`Store::reopen`] is the one move out of an outcome, for a person's correction of a record that
//!   contradicts what happened: it, too, starts a new owner on the same callId.
//! * **TTL.** A terminal record lives until its `expires_at_ms`; after that the key may be claimed anew
//!   and the record may be evicted. Records without an expiry (claims, `UNKNOWN`s) are kept.
//! * **Receipts from the store alone.** [`Store::get_by_call_id`] answers from stored data only.
//!
//! ## The compensation queue
//!
//! Uncertain calls are enqueued once per callId, taken by one worker at a time (a lease, like
//! `FOR UPDATE SKIP LOCKED`), rescheduled at growing intervals, and either finished or escalated to
//! `MANUAL` — never dropped.
//!
//! ## The journal
//!
//! Events appended to a key's journal are read back in order, by key and by callId (also while the
//! call runs, from another process); a key keeps its latest
//! [`JOURNAL_LIMIT`](crate::journal::JOURNAL_LIMIT) events, for as long as its record lives and at
//! least the `keep_ms` of the latest append.
//!
//! ## Listings
//!
//! Walks over many records, in bounded memory: [`Store::list_receipts`] answers the receipts that
//! have not expired, a page of at most `query.limit` rows at a time, in the order of creation time,
//! then key digest; [`Store::list_orphans`] the `PROCESSING` records whose lease ended
//! and that no compensation entry covers, up to a limit; [`Store::count_expired`] counts what
//! [`Store::purge_expired`] evicts.
//!
//! ## Every operation
//!
//! * **Time is judged where it is shared.** Leases and expiries are durations (`lease_ms`, `ttl_ms`)
//!   that the store turns into times, and the store alone compares them with "now". Every operation
//!   that depends on time also takes the caller's `now_ms` (Unix milliseconds): a store that one
//!   process or one machine owns (memory, SQLite) judges by it, so tests drive time; a store that
//!   several nodes share (PostgreSQL, Redis) judges by its own clock and ignores the caller's, since
//!   nodes disagree about time. [`Store::clock`] says whose clock that is, [`Store::now_ms`] what it
//!   reads now. The compensation queue's leases and rounds are judged the same way (an entry's
//!   `next_at_ms` when queued is the caller's time: it is due at once).
//! * **Failing closed.** An unreachable store answers [`StoreError::Unavailable`]; callers run nothing.
//!   A write the store may have applied before it failed to answer (a crash after the commit, a
//!   connection reset) must fail with [`StoreError::Unavailable`] or [`StoreError::Corrupt`], never
//!   with a refusal: the caller then reads the key again and releases its claim if it finds it as
//!   written (`PROCESSING`, its callId, `updated_ms == created_ms`, and on a [`StoreClock::Caller`]
//!   store `created_ms` the claim's `now_ms`). So a claim's record is created with `updated_ms` equal
//!   to `created_ms`, and a take-over sets `updated_ms` later than `created_ms`.
//!
//! # Stores that compose
//!
//! * **`Arc<S>` and `Box<S>` are `S`**, method for method: one store is handed to a runtime and kept
//!   by the code that inspects it (`Runtime::builder().store(Arc::clone(&store))`), and a
//!   `Box<dyn Store>` is a backend picked at run time. (`Any` sees the wrapper's type: an
//!   `Arc<MemoryStore>` downcasts as itself, not as a `MemoryStore`. So
//!   [`RuntimeBuilder::store`](crate::runtime::RuntimeBuilder::store) takes an `Arc<dyn Store>` or an `Arc<MemoryStore>`
//!   as the shared store itself, and [`Runtime::store`](crate::Runtime::store) is that store.)
//! * **A wrapper is the store it wraps, but for what it writes.** A [`StoreWrapper`] (a cache in
//!   front, metrics, fault injection) writes the methods it changes; every other one forwards to the
//!   same method of the wrapped store — those with a default in [`Store`] too (`get_by_call_ids`,
//!   `wait_settled`, `now_ms`, `kind`, `clock`), so the wrapped store's own answer stands: its single
//!   statement for a batch, its notifications, its clock, its kind in the metrics.
//! * **Forwarding adds no allocation.** A forwarded operation hands on the wrapped store's own
//!   future (boxed once, by that store); nothing boxes it again unless
//!   [`StoreWrapper::around`] does.
//!
//! [`LocalCache`] and `CachedStore` are such wrappers, over a [`ClaimTracker`]: what the claims taken
//! through a cache know of their receipts, so that a completion's receipt is kept without a read.
//!
//! [`Fence`]: crate::receipt::Fence
//! [`ReceiptState::advance`]: crate::ReceiptState::advance
//! [`StoreError::Corrupt`]: crate::store::StoreError::Corrupt
//! [`StoreError::Fenced`]: crate::store::StoreError::Fenced
//! [`StoreError::InvalidTransition`]: crate::store::StoreError::InvalidTransition
//! [`StoreError::Unavailable`]: crate::store::StoreError::Unavailable
//! [`Transition::AlreadyApplied`]: crate::receipt::Transition::AlreadyApplied

mod claims;
mod contract;
mod forward;
mod local;
mod memory;
#[cfg(feature = "mysql")]
mod mysql;
mod open;
#[cfg(feature = "postgres")]
mod postgres;
mod query;
#[cfg(feature = "redis")]
mod redis;
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]
mod refused;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "redis")]
pub use self::redis::{CachedStore, RedisStore, DEFAULT_INDEX_TTL};
pub use crate::error::StoreError;
pub use claims::ClaimTracker;
#[cfg(feature = "redis")]
pub(crate) use contract::get_each_by_call_id;
pub use contract::{poll_settled, Claim, Claimed, Completion, Store, StoreClock};
pub use forward::{StoreFuture, StoreWrapper};
pub use local::{LocalCache, DEFAULT_LOCAL_MAX_AGE};
pub use memory::MemoryStore;
#[cfg(feature = "mysql")]
pub use mysql::MySqlStore;
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]
use open::Backend;
pub use open::{open_existing, OpenError, OpenOptions};
#[cfg(feature = "postgres")]
pub use postgres::PgStore;
pub use query::{Cursor, ReceiptPage, ReceiptQuery};
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]
pub(crate) use refused::{already_or_not_owned, not_owned};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

/// The attribute that [`Store`] implementations put on their `impl` block (re-exported so that a backend
/// needs no dependency of its own for it).
#[doc(hidden)]
pub use async_trait::async_trait;

use crate::key::Key;

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
