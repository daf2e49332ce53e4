//! What every check shares: the fixed times the checks start from ([`T0`], [`PURGE_T0`]), fresh keys
//! and callIds of their own (so checks may share a database), claims and completions as the runtime
//! writes them, and the checks' timeline (the caller's time, or real time for a store with its own
//! clock).

use std::sync::Arc;
use std::time::Duration;

use crate::call_id::{CallId, TraceId};
use crate::journal::{Event, EventKind};
use crate::key::{Fingerprint, Key};
use crate::receipt::{Fence, ReceiptState};
use crate::store::{Claim, Claimed, Completion, Store, StoreClock};

/// A fixed point in time for the checks: 2024-03-09T16:00:00Z. A store that takes the caller's time
/// is driven from it; one that judges by its own clock ignores it, and the checks that need time to
/// pass sleep for real (briefly: their leases and TTLs are a few hundred ms).
pub const T0: u64 = 1_710_000_000_000;

/// The time of the checks that purge: a day before [`T0`], so that their purges (which evict every
/// record expired by then, in a database the checks may share) never reach another check's records.
pub const PURGE_T0: u64 = T0 - 86_400_000;

pub(super) fn fresh_key(test: &str) -> Key {
    Key::build("samekey.conformance", &(test, TraceId::new().as_u128()))
}

pub(super) fn call() -> CallId {
    CallId::new("conf", "suite").expect("valid labels")
}

pub(super) fn claim(key: &Key, call_id: &CallId, now: u64, lease_ms: u64) -> Claim {
    Claim {
        key: key.clone(),
        call_id: call_id.clone(),
        fingerprint: Some(Fingerprint([7; 32])),
        lease_ms,
        now_ms: now,
    }
}

/// The checks' time: the caller's (`now`, moved by [`Timeline::pass`]) for a store that takes it, real
/// time for a store that judges by its own clock.
pub(super) struct Timeline {
    pub(super) now: u64,
    pub(super) own_clock: bool,
}

impl Timeline {
    pub(super) async fn of(store: &dyn Store, start: u64) -> Timeline {
        let own_clock = store.clock() == StoreClock::Own;
        let judged = store.now_ms(start).await.expect("the store's time");
        assert_eq!(
            judged == start,
            !own_clock,
            "a store that judges by the caller's clock answers the caller's time, and only it"
        );
        Timeline {
            now: start,
            own_clock,
        }
    }

    /// Lets `ms` pass: moves the caller's time, or sleeps while the store's own clock moves.
    pub(super) async fn pass(&mut self, ms: u64) {
        if self.own_clock {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        self.now += ms;
    }

    /// The store's time now, as it judges it.
    pub(super) async fn store_now(&self, store: &dyn Store) -> u64 {
        store.now_ms(self.now).await.expect("the store's time")
    }
}

pub(super) async fn acquire(store: &dyn Store, key: &Key, call_id: &CallId, now: u64) -> Fence {
    match store.claim(claim(key, call_id, now, 1_000)).await {
        Ok(Claimed::Acquired(fence)) => fence,
        other => panic!("a fresh key must be acquired, got {other:?}"),
    }
}

pub(super) fn success(payload: &[u8], ttl_ms: u64) -> Completion {
    Completion {
        state: ReceiptState::Success,
        outcome: Some(Arc::from(payload)),
        ttl_ms,
    }
}

/// A journal event of `call_id` for the checks, its time and content told apart by `n`.
pub(super) fn note(call_id: &CallId, n: u64) -> Event {
    Event {
        call_id: call_id.clone(),
        at_ms: T0 + n,
        node: "suite".into(),
        what: EventKind::Backoff {
            attempt: u32::try_from(n).unwrap_or(u32::MAX),
            delay_ms: n,
        },
    }
}
