//! [`TestKit`]: a deterministic runtime for tests, the calls made through it, and the assertions
//! that read like the guarantee.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::remote::Remote;
use super::scope::CallScope;
use crate::call_id::CallId;
use crate::classify::{Classify, ErrorClass};
use crate::clock::TokioClock;
use crate::compensation::{Compensator, PassReport};
use crate::error::Error;
use crate::journal::CallHistory;
use crate::observe::{observed, CallAnswer};
use crate::receipt::{Receipt, ReceiptState};
use crate::runtime::Runtime;
use crate::store::{MemoryStore, ReceiptQuery, Store};

/// What one [`TestKit::call`] told its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Told {
    /// The call's number, from 1, in the order they were made.
    pub number: u64,
    /// The callId the answer came under (for a replay, the first call's); `None` when the caller
    /// crashed, or the call made no `#[idempotent]` call.
    pub call_id: Option<String>,
    /// What the caller was told.
    pub outcome: ToldOutcome,
}

/// What a caller was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToldOutcome {
    /// A value.
    Succeeded,
    /// A failure that says how it ended (permanent, rejected, or retries spent on failures that
    /// changed nothing): the caller acts on it as "it did not happen".
    Failed(String),
    /// The outcome is not known yet (`Unknown`, a store failure) or samekey answered without running
    /// (`InProgress`, `KeyReuse`, …): not a claim that it failed.
    Undecided(String),
    /// The caller crashed mid-call ([`Fault::Crash`](super::Fault::Crash)).
    Crashed,
    /// The caller gave up waiting ([`TestKit::call_giving_up_after`]) and dropped the call.
    GaveUp,
}

/// A runtime for tests, and the record of the calls made through it.
///
/// Deterministic where it can be: node `test`, jitter from a fixed seed, a fresh in-memory store per
/// kit (or [a store of yours](TestKit::on_store)), and the clock of tokio's time, so that
/// `#[tokio::test(start_paused = true)]` skips backoffs, timeouts and leases instead of waiting.
/// Give its [`runtime`](TestKit::runtime) to the functions under test (`runtime = &self.rt`), make
/// their calls through [`call`](TestKit::call), and check what happened with the `assert_*` methods
/// or [`check`](TestKit::check).
pub struct TestKit {
    rt: Runtime,
    calls: AtomicU64,
    told: Mutex<Vec<Told>>,
    rounds: Vec<Duration>,
}

impl Default for TestKit {
    fn default() -> TestKit {
        TestKit::new()
    }
}

impl TestKit {
    /// A kit on a fresh in-memory store.
    pub fn new() -> TestKit {
        TestKit::on_store(Arc::new(MemoryStore::new()))
    }

    /// A kit on a store of yours (SQLite on a temporary file, a test database): the same runtime
    /// settings. A store that does I/O may need real time rather than tokio's paused time.
    pub fn on_store(store: Arc<dyn Store>) -> TestKit {
        let rt = Runtime::builder()
            .node("test")
            .jitter_seed(0x5a3e_4e11)
            .clock(TokioClock::new())
            .shared_store(store)
            .build();
        let Ok(rt) = rt else {
            unreachable!("`test` is a valid node name");
        };
        TestKit::with_runtime(rt)
    }

    /// A kit around a runtime you built (its own lease, budgets, clock).
    pub fn with_runtime(rt: Runtime) -> TestKit {
        TestKit {
            rt,
            calls: AtomicU64::new(0),
            told: Mutex::new(Vec::new()),
            rounds: crate::compensation::DEFAULT_COMPENSATION_ROUNDS.to_vec(),
        }
    }

    /// The compensation rounds [`settle`](TestKit::settle) works with (default: the worker's,
    /// 1 min … 12 h, free under paused time; make them short for a store that needs real time).
    pub fn rounds(mut self, rounds: impl IntoIterator<Item = Duration>) -> TestKit {
        self.rounds = rounds.into_iter().collect();
        self
    }

    /// The runtime to give the functions under test.
    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// Makes one call as a caller would — `kit.call(payments.charge("o-1", 500))` — and records what
    /// it was told. `None` when the caller crashed mid-call (a [`Fault::Crash`](super::Fault::Crash)
    /// dropped its future, as a process that dies does).
    pub async fn call<T, E, F>(&self, call: F) -> Option<Result<T, E>>
    where
        F: Future<Output = Result<T, E>>,
        E: Classify + std::fmt::Display,
    {
        self.make(call, None).await
    }

    /// [`call`](TestKit::call) by a caller who gives up after `patience` and drops the call (a
    /// client's own deadline, a user who closes the tab): `None` then, as for a crash.
    pub async fn call_giving_up_after<T, E, F>(
        &self,
        patience: Duration,
        call: F,
    ) -> Option<Result<T, E>>
    where
        F: Future<Output = Result<T, E>>,
        E: Classify + std::fmt::Display,
    {
        self.make(call, Some(patience)).await
    }

    async fn make<T, E, F>(&self, call: F, patience: Option<Duration>) -> Option<Result<T, E>>
    where
        F: Future<Output = Result<T, E>>,
        E: Classify + std::fmt::Display,
    {
        let number = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let scope = CallScope::new(number);
        let crashed = scope.crashed();
        let ran = scope.enter(async move {
            let deadline = async {
                match patience {
                    Some(patience) => tokio::time::sleep(patience).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                (out, report) = observed(call) => Ok((out, report)),
                () = crashed.notified() => Err(ToldOutcome::Crashed),
                () = deadline => Err(ToldOutcome::GaveUp),
            }
        });
        let (told, out) = match ran.await {
            Err(dropped) => (
                Told {
                    number,
                    call_id: None,
                    outcome: dropped,
                },
                None,
            ),
            Ok((out, report)) => {
                let call_id = report.as_ref().map(|r| r.call_id().to_string());
                let refused = report.as_ref().map(|r| r.answer()) == Some(CallAnswer::Refused);
                let outcome = match &out {
                    Ok(_) => ToldOutcome::Succeeded,
                    Err(e) if refused || e.classify() == ErrorClass::Unknown => {
                        ToldOutcome::Undecided(e.to_string())
                    }
                    Err(e) => ToldOutcome::Failed(e.to_string()),
                };
                (
                    Told {
                        number,
                        call_id,
                        outcome,
                    },
                    Some(out),
                )
            }
        };
        self.told
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(told);
        out
    }

    /// What every [`call`](TestKit::call) was told, in order.
    pub fn told(&self) -> Vec<Told> {
        self.told
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The receipt of `call_id`, if the store holds one.
    pub async fn receipt(&self, call_id: &CallId) -> Result<Option<Receipt>, Error> {
        self.rt.receipt(call_id).await
    }

    /// The journal of `call_id`: every claim, attempt, backoff, lookup and compensation step.
    pub async fn journal(&self, call_id: &CallId) -> Result<CallHistory, Error> {
        self.rt.history(call_id).await
    }

    /// Asserts that the receipt of `call_id` is in `state`.
    ///
    /// # Panics
    ///
    /// With the receipt (or its absence) and the call's journal, when it is not.
    pub async fn assert_receipt(&self, call_id: &CallId, state: ReceiptState) {
        let receipt = self.receipt(call_id).await;
        if matches!(&receipt, Ok(Some(r)) if r.state == state) {
            return;
        }
        let journal = match self.journal(call_id).await {
            Ok(history) => history
                .timeline()
                .iter()
                .map(|e| format!("\n  {}", e.what))
                .collect::<String>(),
            Err(e) => format!(" (unreadable: {e})"),
        };
        panic!(
            "call {call_id}: expected a {state} receipt, found {}; its journal:{journal}",
            match receipt {
                Ok(Some(r)) => format!("a {} receipt", r.state),
                Ok(None) => "none".to_owned(),
                Err(e) => format!("a store error: {e}"),
            }
        );
    }

    /// Works the compensation queue of `scope` with `remote`'s `status` as its lookup until every
    /// entry is settled or handed to a person (`MANUAL`), skipping ahead to each entry's next round:
    /// what a service's [`Compensator`] does over hours, at once under paused time. It first waits
    /// out the runtime's lease and sweeps, so that a call whose caller crashed while it was
    /// `PROCESSING` is queued too. Answers the passes' totals.
    ///
    /// The worker takes every due entry: one of another scope, with no operation here, goes through
    /// its rounds and ends `MANUAL`. With several scopes, register each on
    /// [`compensator`](TestKit::compensator) and use [`settle_with`](TestKit::settle_with).
    pub async fn settle<T, E>(
        &self,
        scope: &str,
        remote: &Remote<T, E>,
    ) -> Result<PassReport, Error>
    where
        T: Clone + Send + serde::Serialize + 'static,
        E: From<super::RemoteError> + std::fmt::Display + 'static,
    {
        let worker = self.compensator().operation(scope, remote.operation());
        self.settle_with(&worker).await
    }

    /// A compensation worker on the kit's runtime, with the kit's [`rounds`](TestKit::rounds).
    pub fn compensator(&self) -> Compensator {
        Compensator::new(&self.rt).rounds(self.rounds.iter().copied())
    }

    /// [`settle`](TestKit::settle) with a worker of yours (every scope's operation registered).
    pub async fn settle_with(&self, worker: &Compensator) -> Result<PassReport, Error> {
        tokio::time::sleep(self.rt.lease()).await;
        worker.sweep().await?;
        worker.settle().await
    }

    /// Every check below, at once — and that no caller was told "succeeded" for a call whose
    /// requests reached `remote` without taking effect: `Err` lists each broken guarantee with the
    /// calls, attempts and callIds involved, and the remote's schedule to replay it (for a property
    /// test to report).
    pub async fn check<T, E>(&self, remote: &Remote<T, E>) -> Result<(), String>
    where
        T: Clone + Send + 'static,
        E: From<super::RemoteError>,
    {
        let mut broken = String::new();
        for problem in [
            effects_at_most_once(remote),
            self.no_failed_call_took_effect(remote),
            self.no_success_without_effect(remote),
            self.one_call_id_per_call(remote),
            self.unknowns_resolved_or_queued().await,
        ]
        .into_iter()
        .flatten()
        {
            let _ = writeln!(broken, "- {problem}");
        }
        if broken.is_empty() {
            Ok(())
        } else {
            Err(format!("{broken}remote schedule: {}", remote.schedule()))
        }
    }

    /// Asserts every guarantee of [`check`](TestKit::check).
    ///
    /// # Panics
    ///
    /// With every broken guarantee, its calls and callIds, and the schedule to replay.
    pub async fn assert_safe<T, E>(&self, remote: &Remote<T, E>)
    where
        T: Clone + Send + 'static,
        E: From<super::RemoteError>,
    {
        if let Err(broken) = self.check(remote).await {
            panic!("not safe to retry:\n{broken}");
        }
    }

    /// Asserts that no key took effect more than once on `remote`.
    ///
    /// # Panics
    ///
    /// Naming each key, the callIds and attempts that took effect, and the schedule.
    pub fn assert_effects_at_most_once<T, E>(&self, remote: &Remote<T, E>)
    where
        T: Clone + Send + 'static,
        E: From<super::RemoteError>,
    {
        if let Some(problem) = effects_at_most_once(remote) {
            panic!("{problem}\nremote schedule: {}", remote.schedule());
        }
    }

    /// Asserts that no call told its caller it failed while its request took effect on `remote`
    /// (the "failed, but charged" a naive retry loop produces).
    ///
    /// # Panics
    ///
    /// Naming each such call, what it was told, and its callId.
    pub fn assert_no_call_failed_after_effect<T, E>(&self, remote: &Remote<T, E>)
    where
        T: Clone + Send + 'static,
        E: From<super::RemoteError>,
    {
        if let Some(problem) = self.no_failed_call_took_effect(remote) {
            panic!("{problem}\nremote schedule: {}", remote.schedule());
        }
    }

    /// Asserts that every attempt of each [`call`](TestKit::call) carried one callId to `remote`.
    ///
    /// # Panics
    ///
    /// Naming the call, its attempts and the callIds they carried.
    pub fn assert_same_call_id_on_every_attempt<T, E>(&self, remote: &Remote<T, E>)
    where
        T: Clone + Send + 'static,
        E: From<super::RemoteError>,
    {
        if let Some(problem) = self.one_call_id_per_call(remote) {
            panic!("{problem}\nremote schedule: {}", remote.schedule());
        }
    }

    /// Asserts that every call left `UNKNOWN` has its compensation entry (or was resolved).
    ///
    /// # Panics
    ///
    /// Naming each `UNKNOWN` receipt with no entry.
    pub async fn assert_every_unknown_resolved_or_queued(&self) {
        if let Some(problem) = self.unknowns_resolved_or_queued().await {
            panic!("{problem}");
        }
    }

    fn no_failed_call_took_effect<T, E>(&self, remote: &Remote<T, E>) -> Option<String>
    where
        T: Clone + Send + 'static,
        E: From<super::RemoteError>,
    {
        let mut found = String::new();
        for told in self.told() {
            let (ToldOutcome::Failed(message), Some(call_id)) = (&told.outcome, &told.call_id)
            else {
                continue;
            };
            if remote.took_effect(call_id) {
                let _ = write!(
                    found,
                    "\n  call #{} was told it failed ({message}), but its request {call_id} took effect{}",
                    told.number,
                    attempts_of(remote, |d| d.call_id == *call_id)
                );
            }
        }
        (!found.is_empty()).then(|| format!("calls told they failed took effect:{found}"))
    }

    /// Calls told they succeeded whose requests reached `remote` without any taking effect (calls
    /// that never sent it anything are not its business).
    fn no_success_without_effect<T, E>(&self, remote: &Remote<T, E>) -> Option<String>
    where
        T: Clone + Send + 'static,
        E: From<super::RemoteError>,
    {
        let deliveries = remote.deliveries();
        let mut found = String::new();
        for told in self.told() {
            let (ToldOutcome::Succeeded, Some(call_id)) = (&told.outcome, &told.call_id) else {
                continue;
            };
            let sent = deliveries.iter().any(|d| d.call_id == *call_id);
            if sent && !remote.took_effect(call_id) {
                let _ = write!(
                    found,
                    "\n  call #{} was told it succeeded, but no request of {call_id} took effect{}",
                    told.number,
                    attempts_of(remote, |d| d.call_id == *call_id)
                );
            }
        }
        (!found.is_empty()).then(|| format!("calls told they succeeded took no effect:{found}"))
    }

    fn one_call_id_per_call<T, E>(&self, remote: &Remote<T, E>) -> Option<String>
    where
        T: Clone + Send + 'static,
        E: From<super::RemoteError>,
    {
        let mut by_call: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
        for d in remote.deliveries() {
            if let Some(caller) = d.caller {
                by_call.entry(caller).or_default().insert(d.call_id);
            }
        }
        let mut found = String::new();
        for (number, ids) in by_call.iter().filter(|(_, ids)| ids.len() > 1) {
            let _ = write!(
                found,
                "\n  call #{number} sent {} callIds:{}",
                ids.len(),
                attempts_of(remote, |d| d.caller == Some(*number))
            );
        }
        (!found.is_empty())
            .then(|| format!("attempts of one call carried different callIds:{found}"))
    }

    /// The calls `UNKNOWN` with no compensation entry (the runtime writes the entry first, so none
    /// is ever in between).
    async fn unknowns_resolved_or_queued(&self) -> Option<String> {
        match self.unqueued_unknowns().await {
            Ok(missing) if missing.is_empty() => None,
            Ok(missing) => Some(format!(
                "calls left UNKNOWN with nothing to resolve them:{}",
                missing.concat()
            )),
            Err(e) => Some(e),
        }
    }

    async fn unqueued_unknowns(&self) -> Result<Vec<String>, String> {
        let queued: BTreeSet<String> = match self.rt.compensations().await {
            Ok(entries) => entries.iter().map(|e| e.call_id.to_string()).collect(),
            Err(e) => return Err(format!("the compensation queue cannot be read: {e}")),
        };
        let mut query = ReceiptQuery::created_between(0, u64::MAX).states([ReceiptState::Unknown]);
        let mut missing = Vec::new();
        loop {
            let page = self
                .rt
                .store()
                .list_receipts(&query, self.rt.now_ms())
                .await
                .map_err(|e| format!("the receipts cannot be listed: {e}"))?;
            for r in page.receipts {
                if !queued.contains(r.call_id.as_str()) {
                    missing.push(format!("\n  call {} (key {})", r.call_id, r.key.short()));
                }
            }
            match page.next {
                Some(next) => query = query.after(next),
                None => return Ok(missing),
            }
        }
    }
}

/// The keys that took effect more than once on `remote`, with the requests that did.
fn effects_at_most_once<T, E>(remote: &Remote<T, E>) -> Option<String>
where
    T: Clone + Send + 'static,
    E: From<super::RemoteError>,
{
    let mut found = String::new();
    for (key, n) in remote.effects_per_key().iter().filter(|(_, n)| **n > 1) {
        let _ = write!(
            found,
            "\n  key `{key}` took effect {n} times:{}",
            attempts_of(remote, |d| d.key == *key && d.took_effect)
        );
    }
    (!found.is_empty()).then(|| format!("keys took effect more than once:{found}"))
}

/// The deliveries `which` selects, one per line: callId, attempt, fault, effect, caller.
fn attempts_of<T, E>(remote: &Remote<T, E>, which: impl Fn(&super::Delivery) -> bool) -> String
where
    T: Clone + Send + 'static,
    E: From<super::RemoteError>,
{
    let mut lines = String::new();
    for d in remote.deliveries().iter().filter(|d| which(d)) {
        let _ = write!(
            lines,
            "\n    {} attempt {} {:?}{}{}",
            d.call_id,
            d.attempt,
            d.fault,
            if d.took_effect { ", took effect" } else { "" },
            d.caller.map(|n| format!(", call #{n}")).unwrap_or_default()
        );
    }
    lines
}
