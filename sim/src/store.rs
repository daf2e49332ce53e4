//! The store every node shares, and each node's connection to it.
//!
//! * [`SharedStore`]: the in-memory store judged by the **true** clock, whatever time a node sends —
//!   as PostgreSQL or Redis judge leases and expiries by their own clock ([`StoreClock::Own`]).
//! * [`NodeStore`]: one node's connection, where the faults are: an operation that fails before it
//!   reached the store, one that applied and whose answer was lost, one that is slow; a node paused
//!   (its tasks stand still, timers included, and what it sends waits until it resumes); a node that crashed (nothing it sends arrives, nothing
//!   comes back to it: a dead process's tasks never finish).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use samekey::compensation::CompensationEntry;
use samekey::journal::Event;
use samekey::receipt::{Fence, Transition};
use samekey::store::{
    async_trait, Claim, Claimed, Completion, ReceiptPage, ReceiptQuery, StoreClock, StoreError,
    StoreFuture, StoreWrapper,
};
use samekey::{Key, MemoryStore, Receipt, Store};
use tokio::time::Instant;

use crate::clock::TrueClock;
use crate::coverage::{Fault, Surface};
use crate::world::Shared;

/// The in-memory store, judging time by the true clock: the one store all nodes share.
pub struct SharedStore {
    inner: MemoryStore,
    truth: Arc<TrueClock>,
}

impl SharedStore {
    /// An empty store on the true clock.
    pub fn new(truth: Arc<TrueClock>) -> SharedStore {
        SharedStore {
            inner: MemoryStore::new(),
            truth,
        }
    }

    fn now(&self) -> u64 {
        self.truth.now_ms()
    }
}

#[async_trait]
impl StoreWrapper for SharedStore {
    type Inner = MemoryStore;

    fn wrapped(&self) -> &MemoryStore {
        &self.inner
    }

    fn clock(_this: &Self) -> StoreClock {
        StoreClock::Own
    }

    async fn now_ms(this: &Self, _caller_now_ms: u64) -> Result<u64, StoreError> {
        Ok(this.now())
    }

    async fn claim(this: &Self, mut claim: Claim) -> Result<Claimed, StoreError> {
        claim.now_ms = this.now();
        this.inner.claim(claim).await
    }

    async fn take_over(
        this: &Self,
        key: &Key,
        expected: Fence,
        lease_ms: u64,
        _now_ms: u64,
    ) -> Result<Claimed, StoreError> {
        this.inner
            .take_over(key, expected, lease_ms, this.now())
            .await
    }

    async fn extend_lease(
        this: &Self,
        key: &Key,
        fence: Fence,
        lease_ms: u64,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        this.inner
            .extend_lease(key, fence, lease_ms, this.now())
            .await
    }

    async fn complete(
        this: &Self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        _now_ms: u64,
    ) -> Result<Transition, StoreError> {
        this.inner
            .complete(key, fence, completion, this.now())
            .await
    }

    async fn mark_unknown(
        this: &Self,
        key: &Key,
        fence: Fence,
        _now_ms: u64,
    ) -> Result<Transition, StoreError> {
        this.inner.mark_unknown(key, fence, this.now()).await
    }

    async fn get(this: &Self, key: &Key, _now_ms: u64) -> Result<Option<Receipt>, StoreError> {
        this.inner.get(key, this.now()).await
    }

    async fn wait_settled(
        this: &Self,
        key: &Key,
        timeout: Duration,
        _now_ms: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        this.inner.wait_settled(key, timeout, this.now()).await
    }

    async fn take_due_compensations(
        this: &Self,
        _now_ms: u64,
        limit: usize,
        lease_ms: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        let mut taken = this
            .inner
            .take_due_compensations(this.now(), limit, lease_ms)
            .await?;
        in_a_fixed_order(&mut taken);
        Ok(taken)
    }

    async fn list_compensations(this: &Self) -> Result<Vec<CompensationEntry>, StoreError> {
        let mut all = this.inner.list_compensations().await?;
        in_a_fixed_order(&mut all);
        Ok(all)
    }

    async fn reschedule_compensation(
        this: &Self,
        call_id: &samekey::CallId,
        fence: Fence,
        round: u32,
        delay_ms: u64,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        this.inner
            .reschedule_compensation(call_id, fence, round, delay_ms, this.now())
            .await
    }

    async fn escalate_compensation(
        this: &Self,
        call_id: &samekey::CallId,
        fence: Fence,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        this.inner
            .escalate_compensation(call_id, fence, this.now())
            .await
    }

    async fn append_journal(
        this: &Self,
        key: &Key,
        events: &[Event],
        keep_ms: u64,
        _now_ms: u64,
    ) -> Result<(), StoreError> {
        this.inner
            .append_journal(key, events, keep_ms, this.now())
            .await
    }

    async fn journal(this: &Self, key: &Key, _now_ms: u64) -> Result<Vec<Event>, StoreError> {
        this.inner.journal(key, this.now()).await
    }

    async fn journal_of_call(
        this: &Self,
        call_id: &samekey::CallId,
        _now_ms: u64,
    ) -> Result<Vec<Event>, StoreError> {
        this.inner.journal_of_call(call_id, this.now()).await
    }

    async fn list_receipts(
        this: &Self,
        query: &ReceiptQuery,
        _now_ms: u64,
    ) -> Result<ReceiptPage, StoreError> {
        this.inner.list_receipts(query, this.now()).await
    }

    async fn list_orphans(
        this: &Self,
        _now_ms: u64,
        limit: usize,
    ) -> Result<Vec<Receipt>, StoreError> {
        this.inner.list_orphans(this.now(), limit).await
    }

    async fn count_expired(this: &Self, _now_ms: u64) -> Result<usize, StoreError> {
        this.inner.count_expired(this.now()).await
    }

    async fn purge_expired(this: &Self, _now_ms: u64) -> Result<usize, StoreError> {
        this.inner.purge_expired(this.now()).await
    }
}

/// Entries in the order the memory store gives (due, then queued), ties broken by key digest and
/// callId instead of by the order of a hash map seeded per process: what keeps a seed's history the
/// same from one process to the next.
fn in_a_fixed_order(entries: &mut [CompensationEntry]) {
    entries.sort_by(|a, b| {
        (
            a.next_at_ms,
            a.enqueued_ms,
            a.key.digest(),
            a.call_id.as_str(),
        )
            .cmp(&(
                b.next_at_ms,
                b.enqueued_ms,
                b.key.digest(),
                b.call_id.as_str(),
            ))
    });
}

/// One incarnation of a node: alive until it crashes, paused for a while now and then. Everything the
/// node sends (store operations, requests, publishes) goes through [`Life::io`], and every answer
/// through [`Life::answered`].
pub struct Life {
    /// The node's name and incarnation (`node2#1`).
    pub name: String,
    dead: AtomicBool,
    paused_until: Mutex<Option<Instant>>,
}

impl Life {
    /// A live incarnation.
    pub fn new(name: String) -> Life {
        Life {
            name,
            dead: AtomicBool::new(false),
            paused_until: Mutex::new(None),
        }
    }

    /// Kills it: nothing it sends from now on leaves, no answer reaches it.
    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    /// Whether it was killed.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// Pauses it until `until` (a GC pause, a SIGSTOP, a VM migration), or longer if it already is:
    /// its tasks stand still ([`Life::freezes`]) and what it sends waits.
    pub fn pause_until(&self, until: Instant) {
        let mut paused = self.paused_until.lock().unwrap_or_else(|p| p.into_inner());
        *paused = Some(paused.map_or(until, |already| already.max(until)));
    }

    /// Until when it is paused, if it ever was.
    pub fn paused_until(&self) -> Option<Instant> {
        *self.paused_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before the node sends anything: waits while it is paused; never returns once it is dead.
    pub async fn io(&self) {
        while let Some(until) = self.paused_until().filter(|t| *t > Instant::now()) {
            tokio::time::sleep_until(until).await;
        }
        self.answered().await;
    }

    /// Before an answer reaches the node: never returns once it is dead.
    pub async fn answered(&self) {
        if self.is_dead() {
            std::future::pending::<()>().await;
        }
    }

    /// `work` as a task of this incarnation: while the node is paused it is not polled at all, its
    /// timers included — a stopped process runs nothing — and it resumes where it stood. What became
    /// ready meanwhile races the timers that expired meanwhile, as in a process that wakes up: tokio's
    /// `timeout` polls its work before its timer, so a send that was due goes out even when its
    /// timeout "fired" during the pause.
    pub fn freezes<F: Future>(self: &Arc<Self>, work: F) -> Freezes<F> {
        Freezes {
            life: Arc::clone(self),
            resume: None,
            work: Box::pin(work),
        }
    }
}

/// A task that stands still while its node is paused ([`Life::freezes`]).
pub struct Freezes<F> {
    life: Arc<Life>,
    resume: Option<Pin<Box<tokio::time::Sleep>>>,
    work: Pin<Box<F>>,
}

impl<F: Future> Future for Freezes<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        while let Some(until) = this.life.paused_until().filter(|t| *t > Instant::now()) {
            let resume = this
                .resume
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
            if resume.deadline() != until {
                resume.as_mut().reset(until);
            }
            if resume.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        this.resume = None;
        this.work.as_mut().poll(cx)
    }
}

/// The store operations a fault may hit through the shared draws. The lease renewal draws its own
/// (`Draws::renewal_wait`): how many renewals a call makes depends on how long its work runs.
const FAULTED: &[&str] = &[
    "claim",
    "take_over",
    "complete",
    "mark_unknown",
    "release",
    "get",
    "get_by_call_id",
    "wait_settled",
    "enqueue_compensation",
    "take_due_compensations",
    "reschedule_compensation",
    "finish_compensation",
    "escalate_compensation",
    "append_journal",
];

impl NodeStore {
    /// Issue 38, defect 3: a lease renewal that waits (on the row lock of the work's own
    /// transaction, before its `COMMIT`) must never stop the work it keeps alive. Drawn from the
    /// renewals' own stream ([`Draws::renewal_wait`](crate::rng::Draws::renewal_wait)).
    async fn renewal_wait(&self) {
        let draws = &self.world.draws;
        let Some(wait) = draws.renewal_wait() else {
            return;
        };
        if draws.keep(Some(Fault::StoreSlow), Surface::Lease).is_none() {
            return;
        }
        self.world.cover(Fault::StoreSlow, Surface::Lease);
        self.world.history.log(
            &self.life.name,
            None,
            format!("store extend_lease: waits {} ms", wait.as_millis()),
        );
        tokio::time::sleep(wait).await;
    }

    /// The fence that owns `key` now, read from the store itself (no fault, no wait).
    async fn owner(&self, key: &Key) -> Option<Fence> {
        self.shared
            .get(key, 0)
            .await
            .ok()
            .flatten()
            .map(|r| r.fence)
    }

    /// Records a write the store accepted from a fence that did not own the key.
    fn watch(&self, op: &str, key: &Key, fence: Fence, owner: Option<Fence>, accepted: bool) {
        if accepted && owner.is_some_and(|owner| owner != fence) {
            self.world.stale_write(format!(
                "{} accepted {op} under fence {} on key {} while fence {} owned it",
                self.life.name,
                fence.0,
                key.short(),
                owner.map(|f| f.0).unwrap_or_default(),
            ));
        }
    }
}

/// One node's connection to the [`SharedStore`], with the faults of a network and a server between.
pub struct NodeStore {
    shared: Arc<SharedStore>,
    life: Arc<Life>,
    world: Arc<Shared>,
}

impl NodeStore {
    /// The connection of the node incarnation `life`.
    pub fn new(shared: Arc<SharedStore>, life: Arc<Life>, world: Arc<Shared>) -> NodeStore {
        NodeStore {
            shared,
            life,
            world,
        }
    }
}

#[async_trait]
impl StoreWrapper for NodeStore {
    type Inner = SharedStore;

    fn wrapped(&self) -> &SharedStore {
        &self.shared
    }

    fn clock(_this: &Self) -> StoreClock {
        StoreClock::Own
    }

    // The owner's writes, watched: the store must refuse every one whose fence no longer owns the
    // key (a stale owner's), whatever the outcome it writes.
    async fn complete(
        this: &Self,
        key: &Key,
        fence: Fence,
        completion: Completion,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let write = Box::pin(async move {
            let owner = this.owner(key).await;
            let written = this.shared.complete(key, fence, completion, now_ms).await;
            this.watch("complete", key, fence, owner, written.is_ok());
            written
        });
        this.around("complete", write).await
    }

    async fn mark_unknown(
        this: &Self,
        key: &Key,
        fence: Fence,
        now_ms: u64,
    ) -> Result<Transition, StoreError> {
        let write = Box::pin(async move {
            let owner = this.owner(key).await;
            let written = this.shared.mark_unknown(key, fence, now_ms).await;
            this.watch("mark_unknown", key, fence, owner, written.is_ok());
            written
        });
        this.around("mark_unknown", write).await
    }

    async fn release(this: &Self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        let write = Box::pin(async move {
            let owner = this.owner(key).await;
            let written = this.shared.release(key, fence).await;
            this.watch("release", key, fence, owner, written.is_ok());
            written
        });
        this.around("release", write).await
    }

    fn around<'a, T: Send + 'a>(
        &'a self,
        op: &'static str,
        call: StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            self.life.io().await;
            let faulted = FAULTED.contains(&op);
            if faulted {
                self.world.draws.shuffle().await;
            }
            let draws = &self.world.draws;
            // The compensation queue's operations are the worker's surface; the rest, the store's.
            let surface = if op.contains("compensation") {
                Surface::Compensation
            } else {
                Surface::Store
            };
            let fault = if faulted && draws.fault(3) {
                draws.keep(
                    Some(match draws.below(3) {
                        0 => Fault::StoreFailBefore,
                        1 => Fault::StoreFailAfter,
                        _ => Fault::StoreSlow,
                    }),
                    surface,
                )
            } else {
                None
            };
            if op == "extend_lease" {
                self.renewal_wait().await;
            }
            let answer = match fault {
                None => call.await,
                Some(fault) => {
                    self.world.cover(fault, surface);
                    self.world
                        .history
                        .log(&self.life.name, None, format!("store {op}: {fault:?}"));
                    match fault {
                        Fault::StoreFailBefore => Err(StoreError::Unavailable(format!(
                            "sim: {op} never reached the store"
                        ))),
                        Fault::StoreFailAfter => {
                            let _applied = call.await;
                            Err(StoreError::Unavailable(format!(
                                "sim: {op} applied, its answer lost"
                            )))
                        }
                        _ => {
                            tokio::time::sleep(draws.ms(200, 3_000)).await;
                            call.await
                        }
                    }
                }
            };
            self.life.answered().await;
            answer
        })
    }
}
