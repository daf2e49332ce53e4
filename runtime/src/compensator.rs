//! The compensation worker: drives every queued `UNKNOWN` call to an end — its outcome recorded, its key
//! given back, or a person asked — in bounded rounds, one worker per entry at a time.
//!
//! # Guarantees
//!
//! * **One worker per entry.** An entry is taken under a lease and a worker fence; a worker whose lease
//!   lapsed and whose entry another worker took is refused every write to that entry, so it cannot
//!   reschedule, finish or escalate it.
//! * **One owner per key.** Before acting on a call, the worker takes its key over (a new receipt
//!   fence, as a duplicate call would), so a stalled caller that comes back is fenced out, and two
//!   workers never record two outcomes.
//! * **Bounded.** Every round that settles nothing moves the entry to the next, later round; after the
//!   last one the entry becomes `MANUAL` and the escalation hook runs. Nothing is retried forever and
//!   nothing disappears: an entry ends recorded, released, failed, or `MANUAL`.
//! * **Once an attempt may have run, nothing releases its key** — the call path's rule, kept here:
//!   "not received" does not release or fail a call by default ([`NotReceived`]): it is sent again
//!   under its callId, reversed, or kept `UNKNOWN` until a person decides. Releasing or failing is an
//!   opt-in that waits until the remote refuses the call's callId.
//! * **Whatever may act keeps the key.** While a reversal or a re-run runs, the worker's lease on the
//!   call's key is renewed, so no duplicate takes it over and acts beside it; a reversal begun and not
//!   finished stops every later take-over (see [`Operation::reversal`]).

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::call_id::CallId;
use crate::classify::{Classify, ErrorClass, RemoteStatus};
use crate::clock::ms;
use crate::codec::message_bytes;
use crate::compensation::{CompensationEntry, CompensationState};
use crate::error::{Error, StoreError};
use crate::journal::{CompensationStep, Event, LookupOutcome, What};
use crate::key::Key;
use crate::lease::Owner;
use crate::receipt::{Fence, Receipt, ReceiptState};
use crate::runtime::Runtime;
use crate::store::Completion;
use crate::takeover::{self, Reversal as Begun, TakenOver};

/// The default rounds: the delay before each next look at an entry that is still undecided.
pub const DEFAULT_COMPENSATION_ROUNDS: [Duration; 5] = [
    Duration::from_secs(60),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 60 * 60),
    Duration::from_secs(12 * 60 * 60),
];

/// What a lookup answered, encoded for the receipt: the success value's JSON, or the failure's message.
type Answer = Result<RemoteStatus<Vec<u8>, String>, String>;
type Lookup = Arc<dyn Fn(CallId) -> Pin<Box<dyn Future<Output = Answer> + Send>> + Send + Sync>;
type Reversal = Arc<
    dyn Fn(CompensationEntry) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>
        + Send
        + Sync,
>;
type Rerun =
    Arc<dyn Fn(CompensationEntry) -> Pin<Box<dyn Future<Output = Answer> + Send>> + Send + Sync>;

/// What the worker does with a call the remote side says it never received.
///
/// "Not received" is true when it is said, not for good: the call's first request may still be on
/// its way (a slow network, an owner paused before it sent, past its lease). Giving the key back lets
/// the next call run under a **new** callId, which the remote cannot tell from the late first request:
/// it charges twice. Recording `FAILED` tells the caller "failed" for a request that may yet charge.
/// So, as the call path does, the worker never releases or fails an uncertain call by default: it
/// re-sends it under its callId ([`Operation::rerun`]: the remote deduplicates), or keeps it `UNKNOWN`
/// through its rounds and then asks a person ([`NotReceived::Hold`]). Releasing or failing it is safe
/// only once the first request can no longer take effect — when the remote refuses a request whose
/// callId is older than a known age — and is opted into with that age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReceived {
    /// Keep the call `UNKNOWN` (a duplicate still asks first) and look again next round; after the
    /// last, `MANUAL`. The default.
    Hold,
    /// Give the key back (the next call with this key runs, under a new callId) — once the call is
    /// older than `refused_after`; until then, as [`NotReceived::Hold`].
    ///
    /// Safe only if the remote refuses any request whose callId was made more than `refused_after`
    /// ago (judged by the time the callId carries, [`CallId::unix_ms`]): then the first request, if
    /// it arrives late, is refused rather than charged. Add the margin by which your nodes' clocks
    /// may disagree; the worker judges the age by the store's clock where nodes share one.
    Release {
        /// The age past which the remote refuses the call's callId.
        refused_after: Duration,
    },
    /// Record the call `FAILED` ("not received by the remote"), so duplicates get that failure —
    /// once the call is older than `refused_after`, on the same condition as
    /// [`NotReceived::Release`]; until then, as [`NotReceived::Hold`].
    Fail {
        /// The age past which the remote refuses the call's callId.
        refused_after: Duration,
    },
    /// Run the operation's [reversal](Operation::reversal) (undo this side's part: release the
    /// stock held for the order), then record the call `FAILED`. Set by [`Operation::reversal`].
    ///
    /// Like [`NotReceived::Release`], safe only if the call's first request can no longer take
    /// effect when the reversal runs (the remote refuses a late, old callId): one that arrives after
    /// it performs a call this side reversed. Register a reversal for such a remote, or prefer
    /// [`Operation::rerun`].
    Reverse,
    /// Send the call again under its callId with the operation's [re-run](Operation::rerun), and
    /// record what it answers. Set by [`Operation::rerun`].
    Rerun,
}

/// One operation (scope) the worker can resolve: how to ask about a callId, and what to do then.
pub struct Operation {
    lookup: Lookup,
    ttl: Duration,
    not_received: NotReceived,
    reversal: Option<Reversal>,
    rerun: Option<Rerun>,
}

impl Operation {
    /// An operation whose calls are asked about with `lookup`, the same contract as the
    /// `#[idempotent(lookup = …)]` argument: `Succeeded(T)` and `Failed(E)` are recorded as the call's
    /// outcome (a failure by its message: duplicates get `samekey::Error::Failed`), `NotReceived`
    /// follows [`Operation::not_received`], `Processing` or an `Err` wait for the next round.
    pub fn new<T, E, LE, F, Fut>(lookup: F) -> Operation
    where
        T: Serialize,
        E: Display,
        LE: Display,
        F: Fn(CallId) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<RemoteStatus<T, E>, LE>> + Send + 'static,
    {
        let lookup: Lookup = Arc::new(move |call_id| {
            let asked = lookup(call_id);
            Box::pin(async move {
                match asked.await {
                    Ok(RemoteStatus::Succeeded(value)) => serde_json::to_vec(&value)
                        .map(RemoteStatus::Succeeded)
                        .map_err(|e| format!("the lookup's value cannot be encoded: {e}")),
                    Ok(RemoteStatus::Failed(error)) => Ok(RemoteStatus::Failed(error.to_string())),
                    Ok(RemoteStatus::NotReceived) => Ok(RemoteStatus::NotReceived),
                    Ok(RemoteStatus::Processing) => Ok(RemoteStatus::Processing),
                    Err(e) => Err(e.to_string()),
                }
            })
        });
        Operation {
            lookup,
            ttl: Duration::from_secs(24 * 60 * 60),
            not_received: NotReceived::Hold,
            reversal: None,
            rerun: None,
        }
    }

    /// Undoes this side's part of a call the remote side never received — release the stock held for
    /// the order, cancel the pending row — then records the call `FAILED` ("not received; reversed"),
    /// so that duplicates get that failure. The function gets the call's entry: its callId, key,
    /// attempts and, when its function keeps them (`#[idempotent(inputs = …)]`), its
    /// [inputs](CompensationEntry::inputs). An `Err` leaves the call to the next round.
    ///
    /// **At most once per call, and never beside an execution**, across workers and crashes: the
    /// worker journals its intent before the reversal runs, confirms it still holds the call's key,
    /// and keeps that key's lease alive for as long as the reversal runs, so no duplicate takes the
    /// call over and sends it meanwhile. A taker that finds an intent with no end (its worker crashed
    /// or stalled while reversing) acts on nothing: a duplicate call or a callback answers
    /// `Error::Unknown`, and the next worker escalates the entry to `MANUAL` for a person to check
    /// instead of reversing again. Sets [`not_received`](Operation::not_received) to
    /// [`NotReceived::Reverse`].
    pub fn reversal<E, F, Fut>(mut self, reverse: F) -> Operation
    where
        E: Display,
        F: Fn(CompensationEntry) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
    {
        self.reversal = Some(Arc::new(move |entry| {
            let reversing = reverse(entry);
            Box::pin(async move { reversing.await.map_err(|e| e.to_string()) })
        }));
        self.not_received = NotReceived::Reverse;
        self
    }

    /// Sends a call the remote side never received again, under its callId (the remote deduplicates
    /// by it, so a first request that arrives late changes nothing), with the call's entry and its
    /// [inputs](CompensationEntry::inputs). `Ok(value)` is recorded `SUCCESS`; an error that stands
    /// (`Permanent`, `Rejected`) is recorded `FAILED` by its message; any other error leaves the call
    /// to the next round. Sets [`not_received`](Operation::not_received) to [`NotReceived::Rerun`].
    pub fn rerun<T, E, F, Fut>(mut self, rerun: F) -> Operation
    where
        T: Serialize,
        E: Classify + Display,
        F: Fn(CompensationEntry) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        self.rerun = Some(Arc::new(move |entry| {
            let sent = rerun(entry);
            Box::pin(async move {
                match sent.await {
                    Ok(value) => serde_json::to_vec(&value)
                        .map(RemoteStatus::Succeeded)
                        .map_err(|e| format!("the re-run's value cannot be encoded: {e}")),
                    Err(e) => match e.classify() {
                        ErrorClass::Permanent | ErrorClass::Rejected => {
                            Ok(RemoteStatus::Failed(e.to_string()))
                        }
                        _ => Err(e.to_string()),
                    },
                }
            })
        }));
        self.not_received = NotReceived::Rerun;
        self
    }

    /// How long an outcome the worker records is kept (the function's `ttl`; default 24 h).
    pub fn ttl(mut self, ttl: Duration) -> Operation {
        self.ttl = ttl;
        self
    }

    /// What a "not received" answer leads to (default [`NotReceived::Hold`]).
    pub fn not_received(mut self, then: NotReceived) -> Operation {
        self.not_received = then;
        self
    }
}

/// What one pass of the worker did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pass {
    /// Entries taken.
    pub taken: usize,
    /// Calls recorded `SUCCESS` from the remote's answer.
    pub succeeded: usize,
    /// Calls recorded `FAILED` (the remote's failure, or "not received" under [`NotReceived::Fail`]
    /// once the call was older than its age).
    pub failed: usize,
    /// Keys given back (not received, [`NotReceived::Release`], once the call was older than its age).
    pub released: usize,
    /// Calls reversed and recorded `FAILED` (not received, [`NotReceived::Reverse`]).
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
impl std::ops::AddAssign for Pass {
    fn add_assign(&mut self, pass: Pass) {
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

/// Which count of a [`Pass`] an entry adds to.
type Counter = fn(&mut Pass) -> &mut usize;

/// How a person resolves an entry by hand ([`Compensator::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// It took effect: record `SUCCESS` with this JSON value (what the function would have returned).
    Succeeded(serde_json::Value),
    /// It failed: record `FAILED` with this message.
    Failed(String),
    /// It never happened: give the key back.
    Release,
}

type Hook = Arc<dyn Fn(&CompensationEntry) + Send + Sync>;

/// The compensation worker. Register each operation's lookup by scope, then run passes — in a task of
/// the service ([`Compensator::run`]) or in a process of its own; several workers may run at once.
///
/// ```
/// # use samekey_runtime::{Compensator, Operation, RemoteStatus, Runtime};
/// # async fn status(call: &str) -> Result<RemoteStatus<u64, String>, String> { Ok(RemoteStatus::NotReceived) }
/// # async fn demo(rt: Runtime) {
/// let worker = Compensator::new(&rt)
///     .operation("orders.charge", Operation::new(|call| async move { status(&call).await }))
///     .on_escalate(|entry| eprintln!("call {} needs a person: {}", entry.call_id, entry.reason));
/// let pass = worker.run_once().await;
/// # let _ = pass;
/// # }
/// ```
#[derive(Clone)]
pub struct Compensator {
    rt: Runtime,
    operations: HashMap<String, Arc<Operation>>,
    rounds: Vec<Duration>,
    lease: Duration,
    batch: usize,
    sweep_every: Duration,
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
            escalate: None,
        }
    }

    /// Registers the operation of a scope (the `scope` of its `#[idempotent]`, or its default scope,
    /// `module::path::fn_name`). Entries of scopes with no operation wait for rounds like undecided
    /// ones, and end `MANUAL`.
    pub fn operation(mut self, scope: impl Into<String>, operation: Operation) -> Compensator {
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
            let step = What::Compensation {
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
    pub async fn run_once(&self) -> Result<Pass, Error> {
        let now = self.rt.now_ms();
        let taken = self
            .rt
            .store()
            .take_due_compensations(now, self.batch, ms(self.lease))
            .await?;
        let mut pass = Pass {
            taken: taken.len(),
            ..Pass::default()
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
            crate::metrics::compensation(outcome, n);
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
    pub async fn settle(&self) -> Result<Pass, Error> {
        let mut total = Pass::default();
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

    /// Resolves an entry by hand (a `MANUAL` one, usually), as `who` decided for `why`: records the
    /// outcome or gives the key back, then removes the entry. Logged with who and why. A call settled
    /// meanwhile keeps its outcome: a resolution that agrees removes the entry, one that does not is
    /// [`Error::AlreadySettled`]; a call whose key a running call holds is [`Error::InProgress`].
    pub async fn resolve(
        &self,
        call_id: &CallId,
        resolution: Resolution,
        who: &str,
        why: &str,
    ) -> Result<(), Error> {
        let store = self.rt.store();
        let entry = store
            .list_compensations()
            .await?
            .into_iter()
            .find(|e| &e.call_id == call_id)
            .ok_or(Error::Store(StoreError::NotFound))?;
        let now = self.rt.now_ms();
        let mut record = self.record_of(&entry.key, call_id).await?;
        // The call's receipt as it stands: taken over to write the person's answer, or already
        // settled — then the answer must agree with it.
        let fence = loop {
            let Some(r) = record.filter(|r| &r.call_id == call_id) else {
                break None;
            };
            if r.state.is_terminal() {
                let agrees = matches!(
                    (&resolution, r.state),
                    (Resolution::Succeeded(_), ReceiptState::Success)
                        | (Resolution::Failed(_), ReceiptState::Failed)
                );
                if !agrees {
                    return Err(Error::AlreadySettled {
                        call_id: call_id.clone(),
                        state: r.state,
                    });
                }
                break None;
            }
            match takeover::take_over(&self.rt, &r, ms(self.lease), now).await? {
                // A person's answer settles even a call whose reversal was begun: that is what
                // the worker escalated it for.
                TakenOver::Acquired(fence) | TakenOver::Reversal { fence, .. } => {
                    break Some(fence)
                }
                TakenOver::Gone => record = None,
                TakenOver::Existing(next) if next.fence != r.fence || next.state != r.state => {
                    record = Some(*next);
                }
                TakenOver::Existing(_) => {
                    return Err(Error::InProgress {
                        call_id: call_id.clone(),
                    })
                }
            }
        };
        let state = match &resolution {
            Resolution::Succeeded(_) => ReceiptState::Success,
            Resolution::Failed(_) => ReceiptState::Failed,
            Resolution::Release => ReceiptState::Received,
        };
        if let Some(fence) = fence {
            let ttl = self.keep(&entry.key);
            match resolution {
                Resolution::Release => store.release(&entry.key, fence).await?,
                Resolution::Succeeded(value) => {
                    let bytes = serde_json::to_vec(&value)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    let done = completion(ReceiptState::Success, bytes, ttl);
                    store.complete(&entry.key, fence, done, now).await?;
                }
                Resolution::Failed(message) => {
                    let done = completion(ReceiptState::Failed, message_bytes(&message), ttl);
                    store.complete(&entry.key, fence, done, now).await?;
                }
            }
        }
        store.finish_compensation(call_id, None).await?;
        tracing::warn!(target: "samekey", call_id = %call_id, key = %entry.key.short(), attempt = 0u32,
            who, why, "compensation resolved by hand");
        let resolved = What::Resolved {
            state,
            who: who.to_owned(),
            why: why.to_owned(),
        };
        self.journal(call_id, &entry.key, resolved).await;
        Ok(())
    }

    /// Makes a queued entry due now, as `who` decided for `why` (a person who fixed what made it fail,
    /// or who wants the next round without waiting): a `MANUAL` entry goes back to the workers for
    /// one more round, a pending one is due at once. Logged and journaled with who and why.
    /// [`Error::InProgress`] while a worker holds the entry (its lease has not ended);
    /// [`StoreError::NotFound`] when no entry is queued for the call.
    pub async fn retry(&self, call_id: &CallId, who: &str, why: &str) -> Result<(), Error> {
        let entry = self.held_by_nobody(call_id).await?;
        // The round stays: a `MANUAL` entry whose rounds ran out gets one more, then is `MANUAL` again.
        self.rt
            .store()
            .reschedule_compensation(call_id, entry.fence, entry.round, 0, self.rt.now_ms())
            .await?;
        tracing::warn!(target: "samekey", call_id = %call_id, key = %entry.key.short(), attempt = 0u32,
            who, why, "compensation: made due by hand");
        self.by_hand(&entry, CompensationStep::RetriedByHand, who, why)
            .await;
        Ok(())
    }

    /// Marks a queued entry `MANUAL` before its rounds run out, as `who` decided for `why` (the
    /// counterparty is known to need a person), and runs the escalation hook. Logged and journaled
    /// with who and why. [`Error::InProgress`] while a worker holds the entry;
    /// [`StoreError::NotFound`] when no entry is queued for the call.
    pub async fn escalate(&self, call_id: &CallId, who: &str, why: &str) -> Result<(), Error> {
        let entry = self.held_by_nobody(call_id).await?;
        self.rt
            .store()
            .escalate_compensation(call_id, entry.fence, self.rt.now_ms())
            .await?;
        tracing::warn!(target: "samekey", call_id = %call_id, key = %entry.key.short(), attempt = 0u32,
            who, why, "compensation: escalated by hand");
        self.by_hand(&entry, CompensationStep::EscalatedByHand, who, why)
            .await;
        if let Some(hook) = &self.escalate {
            let mut escalated = entry;
            escalated.state = CompensationState::Manual;
            hook(&escalated);
        }
        Ok(())
    }

    /// The queued entry of `call_id`, if no worker holds it now.
    async fn held_by_nobody(&self, call_id: &CallId) -> Result<CompensationEntry, Error> {
        let entry = self
            .rt
            .store()
            .list_compensations()
            .await?
            .into_iter()
            .find(|e| &e.call_id == call_id)
            .ok_or(Error::Store(StoreError::NotFound))?;
        let now = self.rt.store().now_ms(self.rt.now_ms()).await?;
        match entry.state {
            CompensationState::Taken { lease_until_ms } if lease_until_ms > now => {
                Err(Error::InProgress {
                    call_id: call_id.clone(),
                })
            }
            _ => Ok(entry),
        }
    }

    /// Journals what a person did to an entry.
    async fn by_hand(
        &self,
        entry: &CompensationEntry,
        step: CompensationStep,
        who: &str,
        why: &str,
    ) {
        let what = What::Compensation {
            round: entry.round,
            step,
            detail: format!("by {who}: {why}"),
        };
        self.journal(&entry.call_id, &entry.key, what).await;
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

    /// Works one taken entry: take the call's key over, ask, record — or put it back for later.
    async fn work(&self, entry: CompensationEntry, w: &mut Work<'_>) -> Result<(), Error> {
        let store = self.rt.store();
        let now = self.rt.now_ms();
        let Some(record) = self.record_of(&entry.key, &entry.call_id).await? else {
            // Gone, or the key is another call's now: this call was settled (or expired) elsewhere.
            return self.settled_elsewhere(&entry, w).await;
        };
        if record.state.is_terminal() {
            return self.settled_elsewhere(&entry, w).await;
        }
        let Some(operation) = self.operations.get(entry.key.scope()).cloned() else {
            let reason = format!("no operation registered for scope `{}`", entry.key.scope());
            return self.later(entry, &reason, w).await;
        };
        let fence = match takeover::take_over(&self.rt, &record, ms(self.lease), now).await? {
            TakenOver::Acquired(fence) => fence,
            // Settled meanwhile (a duplicate, a callback), or gone, or another call's now.
            TakenOver::Existing(r) if r.call_id != entry.call_id || r.state.is_terminal() => {
                return self.settled_elsewhere(&entry, w).await;
            }
            TakenOver::Gone => return self.settled_elsewhere(&entry, w).await,
            // A call holds the key and runs: it settles the entry, or the next round looks again.
            TakenOver::Existing(_) => {
                return self
                    .later(entry, "the call's key is held by a running call", w)
                    .await;
            }
            // A reversal an earlier worker began: done and undisputed (record it), interrupted (never
            // run twice), or disputed by a callback meanwhile (the counterparty says otherwise).
            TakenOver::Reversal { fence, reversal } => {
                let why = match reversal {
                    Begun {
                        step: CompensationStep::Reversed,
                        disputed: false,
                    } => return self.reversed(entry, fence, &operation, w).await,
                    Begun { disputed: true, .. } => {
                        "a callback reported the call's outcome while its reversal ran: the two may disagree; reconcile them by hand"
                    }
                    Begun { .. } => {
                        "a reversal an earlier worker began has no end in the journal: it may have run; check it before resolving"
                    }
                };
                return self.escalate_held(entry, fence, why, w).await;
            }
        };
        tracing::info!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
            attempt = 0u32, round = entry.round, fence = fence.0, "compensation: asking the receipt");
        let answer = (operation.lookup)(entry.call_id.clone()).await;
        let (seen, error) = match &answer {
            Ok(RemoteStatus::Succeeded(_)) => (LookupOutcome::Succeeded, None),
            Ok(RemoteStatus::Failed(_)) => (LookupOutcome::Failed, None),
            Ok(RemoteStatus::NotReceived) => (LookupOutcome::NotReceived, None),
            Ok(RemoteStatus::Processing) => (LookupOutcome::Processing, None),
            Err(e) => (LookupOutcome::NoAnswer, Some(e.clone())),
        };
        let taken = What::Compensation {
            round: entry.round,
            step: CompensationStep::Taken,
            detail: String::new(),
        };
        let asked = What::Lookup {
            answer: seen,
            error,
        };
        w.note(self.rt.event(&entry.call_id, taken));
        w.note(self.rt.event(&entry.call_id, asked));
        let ttl = operation.ttl;
        let (written, counter): (Result<(), StoreError>, Counter) = match answer {
            Ok(RemoteStatus::Succeeded(bytes)) => (
                self.record(&entry, fence, ReceiptState::Success, bytes, ttl)
                    .await,
                |p| &mut p.succeeded,
            ),
            Ok(RemoteStatus::Failed(message)) => (
                self.record(
                    &entry,
                    fence,
                    ReceiptState::Failed,
                    message_bytes(&message),
                    ttl,
                )
                .await,
                |p| &mut p.failed,
            ),
            Ok(RemoteStatus::NotReceived) => match operation.not_received {
                NotReceived::Reverse => return self.reverse(entry, fence, &operation, w).await,
                NotReceived::Rerun => return self.rerun(entry, fence, &operation, w).await,
                NotReceived::Hold => {
                    let why = "not received yet; its first request may still arrive, so the key is kept (a re-run under its callId, or a person, settles it)";
                    return self.undecided(entry, fence, why, w).await;
                }
                NotReceived::Release { refused_after } | NotReceived::Fail { refused_after } => {
                    if let Some(why) = self.still_acceptable(&entry, refused_after).await? {
                        return self.undecided(entry, fence, &why, w).await;
                    }
                    if matches!(operation.not_received, NotReceived::Release { .. }) {
                        (store.release(&entry.key, fence).await, |p| &mut p.released)
                    } else {
                        let message = "not received by the remote side, which refuses it now; given up by compensation";
                        (
                            self.record(
                                &entry,
                                fence,
                                ReceiptState::Failed,
                                message_bytes(message),
                                ttl,
                            )
                            .await,
                            |p| &mut p.failed,
                        )
                    }
                }
            },
            Ok(RemoteStatus::Processing) | Err(_) => {
                if let Err(e) = &answer {
                    tracing::info!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
                        attempt = 0u32, error = %e, "compensation: lookup failed");
                }
                // Undecided: the call goes back to UNKNOWN, the entry to a later round.
                return self
                    .undecided(entry, fence, "the remote side has not decided yet", w)
                    .await;
            }
        };
        let settled = match seen {
            LookupOutcome::Succeeded => What::Recorded {
                state: ReceiptState::Success,
                by: "compensation".to_owned(),
            },
            LookupOutcome::NotReceived
                if matches!(operation.not_received, NotReceived::Release { .. }) =>
            {
                What::Released {
                    reason: "not received by the remote side, which refuses it now".to_owned(),
                    by: "compensation".to_owned(),
                }
            }
            _ => What::Recorded {
                state: ReceiptState::Failed,
                by: "compensation".to_owned(),
            },
        };
        self.settled(entry, written, settled, counter, w).await
    }

    /// Why a call not received may still be: its first request could arrive and take effect until its
    /// callId is `refused_after` old (by the store's clock where nodes share one). `None` once the
    /// remote refuses it.
    async fn still_acceptable(
        &self,
        entry: &CompensationEntry,
        refused_after: Duration,
    ) -> Result<Option<String>, Error> {
        let now = self.rt.store().now_ms(self.rt.now_ms()).await?;
        let refused_from = entry.call_id.unix_ms().saturating_add(ms(refused_after));
        Ok((now < refused_from).then(|| {
            format!(
                "not received yet; its first request may still arrive for {} more (the remote refuses it after {})",
                humane(Duration::from_millis(refused_from - now)),
                humane(refused_after),
            )
        }))
    }

    /// After the worker's write of a call's outcome: journaled and the entry removed, or — fenced out
    /// of the key, another owner holds the call — the entry to a later round.
    async fn settled(
        &self,
        entry: CompensationEntry,
        written: Result<(), StoreError>,
        what: What,
        counter: Counter,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        match written {
            Ok(()) => {
                w.note(self.rt.event(&entry.call_id, what));
                self.finish(&entry, w, counter).await
            }
            Err(StoreError::Fenced { .. }) => {
                self.later(entry, "the call's key was taken over meanwhile", w)
                    .await
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Puts the call of an entry the worker holds under `fence` back to `UNKNOWN` (a duplicate
    /// still asks first); a worker fenced out meanwhile leaves it to the key's owner.
    async fn back_to_unknown(&self, entry: &CompensationEntry, fence: Fence) -> Result<(), Error> {
        match self
            .rt
            .store()
            .mark_unknown(&entry.key, fence, self.rt.now_ms())
            .await
        {
            Ok(_) | Err(StoreError::Fenced { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Records the call's outcome under the worker's fence on its key.
    async fn record(
        &self,
        entry: &CompensationEntry,
        fence: Fence,
        state: ReceiptState,
        bytes: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let now = self.rt.now_ms();
        self.rt
            .store()
            .complete(&entry.key, fence, completion(state, bytes, ttl), now)
            .await
            .map(drop)
    }

    /// Removes a settled entry, counting it under `counter`.
    async fn finish(
        &self,
        entry: &CompensationEntry,
        w: &mut Work<'_>,
        counter: Counter,
    ) -> Result<(), Error> {
        match self
            .rt
            .store()
            .finish_compensation(&entry.call_id, Some(entry.fence))
            .await
        {
            Ok(()) => *counter(w.pass) += 1,
            Err(StoreError::Fenced { .. }) => w.pass.lost += 1,
            Err(e) => return Err(e.into()),
        }
        tracing::info!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
            attempt = 0u32, round = entry.round, "compensation: settled");
        Ok(())
    }

    /// Removes the entry of a call settled elsewhere meanwhile (a duplicate, a callback, its owner).
    async fn settled_elsewhere(
        &self,
        entry: &CompensationEntry,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let step = What::Compensation {
            round: entry.round,
            step: CompensationStep::SettledElsewhere,
            detail: String::new(),
        };
        w.note(self.rt.event(&entry.call_id, step));
        self.finish(entry, w, |p| &mut p.settled_elsewhere).await
    }

    /// How long what the worker records on `key` is kept: its operation's `ttl` (24 h without one).
    fn keep(&self, key: &Key) -> Duration {
        self.operations
            .get(key.scope())
            .map_or(Duration::from_secs(24 * 60 * 60), |op| op.ttl)
    }

    /// Journals one step of the worker on the call `call_id` of `key`.
    async fn journal(&self, call_id: &CallId, key: &Key, what: What) {
        let event = self.rt.event(call_id, what);
        self.rt.journal(key, &[event], self.keep(key)).await;
    }

    /// Runs the operation's reversal for a call not received, at most once (see
    /// [`Operation::reversal`]), then records the call `FAILED`.
    async fn reverse(
        &self,
        entry: CompensationEntry,
        fence: Fence,
        operation: &Operation,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let Some(reversal) = operation.reversal.clone() else {
            let why = "not received, and no reversal is registered";
            return self.escalate_held(entry, fence, why, w).await;
        };
        let store = self.rt.store();
        // The intent first, durably: should this worker die while the reversal runs, the next one
        // finds it and does not run it again.
        let intent = self.rt.event(
            &entry.call_id,
            What::Compensation {
                round: entry.round,
                step: CompensationStep::Reversing,
                detail: String::new(),
            },
        );
        let keep = ms(self.keep(&entry.key));
        let mut steps = std::mem::take(&mut w.steps);
        steps.push(intent);
        if let Err(e) = store
            .append_journal(&entry.key, &steps, keep, self.rt.now_ms())
            .await
        {
            tracing::warn!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
                attempt = 0u32, error = %e, "compensation: could not journal the reversal's intent; not reversing");
            // The steps before it are written with the entry's others; the intent is not (nothing
            // ran).
            steps.pop();
            w.steps = steps;
            let why = "the reversal's intent could not be journaled";
            return self.undecided(entry, fence, why, w).await;
        }
        // Then, after the intent: still the call's owner? A worker that stalled past its lease is
        // fenced out here, before anything runs (its successor reads the intent).
        match store
            .extend_lease(&entry.key, fence, ms(self.lease), self.rt.now_ms())
            .await
        {
            Ok(()) => {}
            Err(e) if e.lost_key() => {
                w.pass.lost += 1;
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        tracing::info!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
            attempt = 0u32, round = entry.round, "compensation: not received; reversing");
        // Its lease kept alive for as long as it runs: a duplicate that took the key over meanwhile
        // would hear "not received" too, and send the call while it is being reversed.
        let reversing = std::pin::pin!(reversal(entry.clone()));
        match self.owner(&entry, fence).keep_alive(reversing).await {
            Ok(()) => {
                let done = What::Compensation {
                    round: entry.round,
                    step: CompensationStep::Reversed,
                    detail: String::new(),
                };
                w.note(self.rt.event(&entry.call_id, done));
                // A callback that came while it ran (refused: the key was this worker's) says the
                // counterparty's side of it: a person reconciles the two.
                let open = takeover::open_reversal(&self.rt, &entry.key, &entry.call_id).await;
                let disputed = !matches!(
                    open,
                    Ok(None
                        | Some(Begun {
                            disputed: false,
                            ..
                        }))
                );
                if disputed {
                    let why = "a callback reported the call's outcome while its reversal ran (or the journal could not say): reconcile them by hand";
                    return self.escalate_held(entry, fence, why, w).await;
                }
                self.reversed(entry, fence, operation, w).await
            }
            Err(e) => {
                tracing::warn!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
                    attempt = 0u32, error = %e, "compensation: the reversal failed");
                let failed = What::Compensation {
                    round: entry.round,
                    step: CompensationStep::ReversalFailed,
                    detail: e.clone(),
                };
                w.note(self.rt.event(&entry.call_id, failed));
                let why = format!("the reversal failed: {e}");
                self.undecided(entry, fence, &why, w).await
            }
        }
    }

    /// Records a reversed call `FAILED` and removes its entry.
    async fn reversed(
        &self,
        entry: CompensationEntry,
        fence: Fence,
        operation: &Operation,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let message = "not received by the remote side; reversed by compensation";
        let written = self
            .record(
                &entry,
                fence,
                ReceiptState::Failed,
                message_bytes(message),
                operation.ttl,
            )
            .await;
        let recorded = What::Recorded {
            state: ReceiptState::Failed,
            by: "compensation".to_owned(),
        };
        self.settled(entry, written, recorded, |p| &mut p.reversed, w)
            .await
    }

    /// Sends a call not received again under its callId, and records what it answers.
    async fn rerun(
        &self,
        entry: CompensationEntry,
        fence: Fence,
        operation: &Operation,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let Some(rerun) = operation.rerun.clone() else {
            let why = "not received, and no re-run is registered";
            return self.escalate_held(entry, fence, why, w).await;
        };
        tracing::info!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
            attempt = 0u32, round = entry.round, "compensation: not received; sending it again");
        let answer = self
            .owner(&entry, fence)
            .keep_alive(std::pin::pin!(rerun(entry.clone())))
            .await;
        let detail = match &answer {
            Ok(RemoteStatus::Succeeded(_)) => "succeeded".to_owned(),
            Ok(RemoteStatus::Failed(e)) => format!("failed: {e}"),
            Ok(_) => "undecided".to_owned(),
            Err(e) => format!("no answer: {e}"),
        };
        let step = What::Compensation {
            round: entry.round,
            step: CompensationStep::Rerun,
            detail,
        };
        w.note(self.rt.event(&entry.call_id, step));
        let (state, bytes, counter): (ReceiptState, Vec<u8>, Counter) = match answer {
            Ok(RemoteStatus::Succeeded(bytes)) => {
                (ReceiptState::Success, bytes, |p| &mut p.succeeded)
            }
            Ok(RemoteStatus::Failed(message)) => {
                (ReceiptState::Failed, message_bytes(&message), |p| {
                    &mut p.failed
                })
            }
            Ok(_) | Err(_) => {
                return self
                    .undecided(entry, fence, "the re-run did not settle the call", w)
                    .await;
            }
        };
        let written = self
            .record(&entry, fence, state, bytes, operation.ttl)
            .await;
        let recorded = What::Recorded {
            state,
            by: "compensation".to_owned(),
        };
        self.settled(entry, written, recorded, counter, w).await
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

    /// Leaves a call undecided this round: back to `UNKNOWN` (a duplicate still asks first), and the
    /// entry to its next round.
    async fn undecided(
        &self,
        entry: CompensationEntry,
        fence: Fence,
        why: &str,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        self.back_to_unknown(&entry, fence).await?;
        self.later(entry, why, w).await
    }

    /// Puts an undecided entry to its next round, or escalates it after the last.
    async fn later(
        &self,
        entry: CompensationEntry,
        why: &str,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let Some(delay) = self.rounds.get(entry.round as usize).copied() else {
            return self.escalate_entry(entry, why, w).await;
        };
        let round = entry.round.saturating_add(1);
        let done = self
            .rt
            .store()
            .reschedule_compensation(
                &entry.call_id,
                entry.fence,
                round,
                ms(delay),
                self.rt.now_ms(),
            )
            .await;
        if done.is_ok() {
            w.pass.rescheduled += 1;
            tracing::info!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
                attempt = 0u32, round, delay_ms = ms(delay), why, "compensation: next round");
            let step = What::Compensation {
                round,
                step: CompensationStep::Rescheduled,
                detail: format!("{why}; next round in {}", humane(delay)),
            };
            w.note(self.rt.event(&entry.call_id, step));
        }
        lost_or(done, w.pass)
    }

    /// Escalates at once the entry of a call whose key the worker holds under `fence`: the call goes
    /// back to `UNKNOWN` (a duplicate asks first), the entry to `MANUAL`.
    async fn escalate_held(
        &self,
        entry: CompensationEntry,
        fence: Fence,
        why: &str,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        self.back_to_unknown(&entry, fence).await?;
        self.escalate_entry(entry, why, w).await
    }

    /// Marks an entry `MANUAL` for a person, and runs the escalation hook.
    async fn escalate_entry(
        &self,
        entry: CompensationEntry,
        why: &str,
        w: &mut Work<'_>,
    ) -> Result<(), Error> {
        let done = self
            .rt
            .store()
            .escalate_compensation(&entry.call_id, entry.fence, self.rt.now_ms())
            .await;
        if done.is_ok() {
            w.pass.escalated += 1;
            tracing::warn!(target: "samekey", call_id = %entry.call_id, key = %entry.key.short(),
                attempt = 0u32, rounds = entry.round, why, "compensation: needs a person (MANUAL)");
            let step = What::Compensation {
                round: entry.round,
                step: CompensationStep::Escalated,
                detail: why.to_owned(),
            };
            w.note(self.rt.event(&entry.call_id, step));
            if let Some(hook) = &self.escalate {
                hook(&entry);
            }
        }
        lost_or(done, w.pass)
    }
}

/// One entry being worked: the pass it counts in, and the journal steps it took, written together
/// when it is done.
struct Work<'p> {
    pass: &'p mut Pass,
    steps: Vec<Event>,
}

impl Work<'_> {
    fn note(&mut self, event: Event) {
        self.steps.push(event);
    }
}

/// A fenced write of an entry: refused (another worker took it, or it is gone) counts as lost.
fn lost_or(done: Result<(), StoreError>, pass: &mut Pass) -> Result<(), Error> {
    match done {
        Ok(()) => Ok(()),
        Err(StoreError::Fenced { .. } | StoreError::NotFound) => {
            pass.lost += 1;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

fn completion(state: ReceiptState, bytes: Vec<u8>, ttl: Duration) -> Completion {
    Completion {
        state,
        outcome: Some(Arc::from(bytes)),
        ttl_ms: ms(ttl),
    }
}

/// A delay as people write it: `90s`, `5m`, `2h`.
fn humane(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{}ms", d.as_millis()),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
