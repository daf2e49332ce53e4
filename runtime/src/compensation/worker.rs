//! The compensation worker, [`Compensator`]: its configuration and its passes (take the due entries,
//! work each once, sweep for orphans, run until stopped or settled). What one entry's round does is in
//! `round` (take the key over, ask, record or reschedule, escalate), the two answers to "not received"
//! that act are in `reverse` and `rerun`, and what a person does to an entry is in `by_hand`. The
//! module [`compensation`](crate::compensation) states what the worker guarantees.

pub(super) mod by_hand;
mod rerun;
mod reverse;
mod round;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::call_id::CallId;
use crate::clock::ms;
use crate::compensation::entry::{CompensationEntry, CompensationState};
use crate::compensation::operations::CompensationOperation;
use crate::error::{Error, StoreError};
use crate::journal::{CompensationStep, Event, EventKind};
use crate::key::Key;
use crate::lease::Owner;
use crate::receipt::{Fence, Receipt, ReceiptState};
use crate::runtime::Runtime;
use crate::store::Completion;

/// The default rounds: the delay before each next look at an entry that is still undecided.
pub const DEFAULT_COMPENSATION_ROUNDS: [Duration; 5] = [
    Duration::from_secs(60),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 60 * 60),
    Duration::from_secs(12 * 60 * 60),
];

/// What one pass of the worker did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PassReport {
    /// Entries taken.
    pub taken: usize,
    /// Calls recorded `SUCCESS` from the remote's answer.
    pub succeeded: usize,
    /// Calls recorded `FAILED` (the remote's failure, or "not received" under
    /// [`NotReceivedPolicy::Fail`](super::NotReceivedPolicy::Fail) once the call was older than its age).
    pub failed: usize,
    /// Keys given back (not received, [`NotReceivedPolicy::Release`](super::NotReceivedPolicy::Release), once the
    /// call was older than its age).
    pub released: usize,
    /// Calls reversed and recorded `FAILED` (not received,
    /// [`NotReceivedPolicy::Reverse`](super::NotReceivedPolicy::Reverse)).
    pub reversed: usize,
    /// Entries whose call was settled elsewhere meanwhile (a duplicate took it over), now removed.
    pub settled_elsewhere: usize,
    /// Entries put back for a later round.
    pub rescheduled: usize,
    /// Entries that ran out of rounds: now `MANUAL`.
    pub escalated: usize,
    /// Entries another worker took meanwhile (this one's lease lapsed): left to it.
    pub lost: usize,
    /// Entries of the batch not worked: half their lease had gone by working the others. They are
    /// taken again (by any worker) once the lease lapses.
    pub deferred: usize,
}

/// The counts of several passes added up.
impl std::ops::AddAssign for PassReport {
    fn add_assign(&mut self, pass: PassReport) {
        self.taken += pass.taken;
        self.succeeded += pass.succeeded;
        self.failed += pass.failed;
        self.released += pass.released;
        self.reversed += pass.reversed;
        self.settled_elsewhere += pass.settled_elsewhere;
        self.rescheduled += pass.rescheduled;
        self.escalated += pass.escalated;
        self.lost += pass.lost;
        self.deferred += pass.deferred;
    }
}

/// Which count of a [`PassReport`] an entry adds to.
type Counter = fn(&mut PassReport) -> &mut usize;

type Hook = Arc<dyn Fn(&CompensationEntry) + Send + Sync>;

/// The compensation worker. Register each operation's lookup by scope, then run passes — in a task of
/// the service ([`Compensator::run`]) or in a process of its own; several workers may run at once.
///
/// ```
/// # use samekey_runtime::{Compensator, compensation::CompensationOperation, RemoteStatus, Runtime};
/// # async fn status(call: &str) -> Result<RemoteStatus<u64, String>, String> { Ok(RemoteStatus::NotReceived) }
/// # async fn demo(rt: Runtime) {
/// let worker = Compensator::new(&rt)
///     .operation("orders.charge", CompensationOperation::new(|call| async move { status(&call).await }))
///     .on_escalate(|entry| eprintln!("call {} needs a person: {}", entry.call_id, entry.reason));
/// let pass = worker.run_once().await;
/// # let _ = pass;
/// # }
/// ```
#[derive(Clone)]
pub struct Compensator {
    rt: Runtime,
    operations: HashMap<String, Arc<CompensationOperation>>,
    rounds: Vec<Duration>,
    lease: Duration,
    batch: usize,
    sweep_every: Duration,
    lookup_timeout: Duration,
    escalate: Option<Hook>,
}
impl Compensator {
    /// A worker on the runtime's store and clock, with the [`DEFAULT_COMPENSATION_ROUNDS`], a 60 s lease per
    /// entry, and batches of 100.
    pub fn new(rt: &Runtime) -> Compensator {
        Compensator {
            rt: rt.clone(),
            operations: HashMap::new(),
            rounds: DEFAULT_COMPENSATION_ROUNDS.to_vec(),
            lease: Duration::from_secs(60),
            batch: 100,
            sweep_every: Duration::from_secs(10 * 60),
            lookup_timeout: Duration::from_secs(10),
            escalate: None,
        }
    }

    /// Registers the operation of a scope (the `scope` of its `#[idempotent]`, or its default scope,
    /// `module::path::fn_name`). Entries of scopes with no operation wait for rounds like undecided
    /// ones, and end `MANUAL`.
    pub fn operation(
        mut self,
        scope: impl Into<String>,
        operation: CompensationOperation,
    ) -> Compensator {
        self.operations.insert(scope.into(), Arc::new(operation));
        self
    }

    /// The delays before each next round of an undecided entry; after the last, it becomes `MANUAL`.
    pub fn rounds(mut self, rounds: impl IntoIterator<Item = Duration>) -> Compensator {
        self.rounds = rounds.into_iter().collect();
        self
    }

    /// How long a taken entry is this worker's (default 60 s). A pass works its batch while less than
    /// half of it went by, and leaves the rest for a later take: make it several lookups long.
    pub fn lease(mut self, lease: Duration) -> Compensator {
        self.lease = lease;
        self
    }

    /// How many due entries a pass takes at once (default 100; at least 1). Smaller batches spread a
    /// queue over more workers; each take is one store round trip.
    pub fn batch(mut self, batch: usize) -> Compensator {
        self.batch = batch.max(1);
        self
    }

    /// How long an entry's lookup may take (default 10 s): one that has not answered by then is a
    /// failed lookup, and the entry waits for its next round. While it runs, the worker keeps the
    /// call's key (its lease renewed), so no duplicate takes the call over and sends it meanwhile;
    /// the limit keeps one stuck lookup from holding up the rest of the pass.
    pub fn lookup_timeout(mut self, limit: Duration) -> Compensator {
        self.lookup_timeout = limit;
        self
    }

    /// How often [`Compensator::run`] sweeps the store for orphans (default 10 min): a sweep reads
    /// through the records (an index on PostgreSQL and SQLite, a `SCAN` of every key on Redis).
    pub fn sweep_every(mut self, every: Duration) -> Compensator {
        self.sweep_every = every;
        self
    }

    /// Queues the orphans: calls still `PROCESSING` after their owner's lease ended (an owner that
    /// crashed mid-call queued nothing, and only a new call on the key would otherwise resolve it).
    /// Answers how many it queued; they are worked like any entry, by the next passes.
    pub async fn sweep(&self) -> Result<usize, Error> {
        let store = self.rt.store();
        let now = self.rt.now_ms();
        let orphans = store.list_orphans(now, self.batch).await?;
        for orphan in &orphans {
            let reason = "its owner's lease ended while PROCESSING (the owner crashed?)";
            let entry =
                CompensationEntry::new(orphan.call_id.clone(), orphan.key.clone(), reason, now);
            store.enqueue_compensation(entry).await?;
            tracing::warn!(target: "samekey", call_id = %orphan.call_id, key = %orphan.key.short(),
                attempt = 0u32, "compensation: queued an orphan");
            let step = EventKind::Compensation {
                round: 0,
                step: CompensationStep::Swept,
                detail: reason.to_owned(),
            };
            self.journal(&orphan.call_id, &orphan.key, step).await;
        }
        Ok(orphans.len())
    }

    /// Runs when an entry becomes `MANUAL` (page someone, open a ticket). Called once per entry, by the
    /// worker that escalated it.
    pub fn on_escalate(
        mut self,
        hook: impl Fn(&CompensationEntry) + Send + Sync + 'static,
    ) -> Compensator {
        self.escalate = Some(Arc::new(hook));
        self
    }

    /// One pass: takes the entries due now and works each once. A store that fails ends the pass
    /// early; what it took is taken again once its lease lapses.
    pub async fn run_once(&self) -> Result<PassReport, Error> {
        let now = self.rt.now_ms();
        let taken = self
            .rt
            .store()
            .take_due_compensations(now, self.batch, ms(self.lease))
            .await?;
        let mut pass = PassReport {
            taken: taken.len(),
            ..PassReport::default()
        };
        // An entry is this worker's for one lease from the take: one worked after most of it went by
        // could be taken by another worker meanwhile. Past half the lease, the rest waits.
        let taken_at = tokio::time::Instant::now();
        for entry in taken {
            if taken_at.elapsed() > self.lease / 2 {
                pass.deferred += 1;
                continue;
            }
            let key = entry.key.clone();
            let mut w = Work {
                pass: &mut pass,
                steps: Vec::new(),
            };
            let worked = self.work(entry, &mut w).await;
            // The entry's steps in one write, whatever came of them.
            self.rt.journal(&key, &w.steps, self.keep(&key)).await;
            worked?;
        }
        for (outcome, n) in [
            ("succeeded", pass.succeeded),
            ("failed", pass.failed),
            ("released", pass.released),
            ("reversed", pass.reversed),
            ("settled_elsewhere", pass.settled_elsewhere),
            ("rescheduled", pass.rescheduled),
            ("escalated", pass.escalated),
            ("lost", pass.lost),
            ("deferred", pass.deferred),
        ] {
            crate::observe::metrics::compensation(outcome, n);
        }
        Ok(pass)
    }

    /// Runs passes every `every` until `stop` resolves (e.g. a shutdown signal), and a
    /// [sweep](Compensator::sweep) for orphans first and then every [`sweep_every`](Compensator::sweep_every).
    /// A pass that fails is logged and the next one runs on time.
    pub async fn run(&self, every: Duration, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut swept: Option<tokio::time::Instant> = None;
        loop {
            if swept.is_none_or(|at| at.elapsed() >= self.sweep_every) {
                swept = Some(tokio::time::Instant::now());
                if let Err(e) = self.sweep().await {
                    tracing::warn!(target: "samekey", error = %e, "compensation sweep failed");
                }
            }
            if let Err(e) = self.run_once().await {
                tracing::warn!(target: "samekey", error = %e, "compensation pass failed");
            }
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    }

    /// Passes until the queue holds nothing but `MANUAL` entries, sleeping until each next due
    /// entry (every round of every entry, so up to the last round's delay: instant under tokio's
    /// paused time, as in a simulation or a test). Answers the passes' totals. A store that fails
    /// ends it with the error.
    pub async fn settle(&self) -> Result<PassReport, Error> {
        let mut total = PassReport::default();
        loop {
            total += self.run_once().await?;
            let now = self.rt.now_ms();
            let next = self
                .rt
                .compensations()
                .await?
                .iter()
                .filter(|e| e.state != CompensationState::Manual)
                .map(|e| e.next_at_ms)
                .min();
            let Some(next) = next else {
                return Ok(total);
            };
            tokio::time::sleep(Duration::from_millis(next.saturating_sub(now).max(1))).await;
        }
    }

    /// The record of the call `call_id` on `key`, if the key holds it: read by key, and by callId when
    /// the key answers another call's record — a cache in front may answer a receipt it kept of an
    /// earlier call on the key, forgotten since in another process, while the store holds this
    /// call's. (Not by callId alone: one callId may have been adopted by two keys.)
    async fn record_of(&self, key: &Key, call_id: &CallId) -> Result<Option<Receipt>, StoreError> {
        let store = self.rt.store();
        match store.get(key, self.rt.now_ms()).await? {
            Some(record) if &record.call_id == call_id => Ok(Some(record)),
            _ => Ok(store
                .get_by_call_id(call_id)
                .await?
                .filter(|record| &record.key == key)),
        }
    }

    /// How long what the worker records on `key` is kept: its operation's `ttl` (24 h without one).
    fn keep(&self, key: &Key) -> Duration {
        self.operations
            .get(key.scope())
            .map_or(Duration::from_secs(24 * 60 * 60), |op| op.ttl)
    }

    /// Journals one step of the worker on the call `call_id` of `key`.
    async fn journal(&self, call_id: &CallId, key: &Key, what: EventKind) {
        let event = self.rt.event(call_id, what);
        self.rt.journal(key, &[event], self.keep(key)).await;
    }

    /// The worker as the owner of an entry's key under `fence`, to keep its lease alive while it acts.
    fn owner<'a>(&'a self, entry: &'a CompensationEntry, fence: Fence) -> Owner<'a> {
        Owner {
            rt: &self.rt,
            key: &entry.key,
            call_id: &entry.call_id,
            fence,
            lease: self.lease,
            attempt: 0,
        }
    }
}

/// One entry being worked: the pass it counts in, and the journal steps it took, written together
/// when it is done.
struct Work<'p> {
    pass: &'p mut PassReport,
    steps: Vec<Event>,
}

impl Work<'_> {
    fn note(&mut self, event: Event) {
        self.steps.push(event);
    }
}

/// What the worker records for a call: its state and encoded outcome, kept for `ttl`.
fn completion(state: ReceiptState, bytes: Option<Vec<u8>>, ttl: Duration) -> Completion {
    Completion {
        state,
        outcome: bytes.map(Arc::from),
        ttl_ms: ms(ttl),
    }
}
