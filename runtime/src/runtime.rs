//! [`Runtime`]: the store, the node name and the clock that `#[idempotent]` calls use.

use std::any::Any;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::call_id::{validate_node, CallId, ParseCallIdError, ShortLabel};
use crate::clock::{Clock, RuntimeClock, SystemClock};
use crate::compensation::CompensationEntry;
use crate::error::{Error, StoreError};
use crate::journal::{CallHistory, Event, EventKind};
use crate::key::Key;
use crate::limits::{Budget, ConcurrencyLimit, Dependencies, Dependency, Policies, RetryBudget};
use crate::observe::{Counter, Counters, RuntimeStats};
use crate::receipt::Receipt;
use crate::store::{MemoryStore, Store};

/// Default lease of a claim when the function has no `timeout`.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default bound on how long a duplicate waits for a busy key (`on_busy = "wait"`).
pub const DEFAULT_BUSY_WAIT: Duration = Duration::from_secs(30);
/// Default number of times a lookup answering "processing" is asked again.
pub const DEFAULT_LOOKUP_POLLS: u32 = 5;
/// Default longest `retry_after` a rate-limited call waits before its next attempt.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// How long, at least, a key's journal keeps a [`Runtime::forget`] (and the events before it).
pub const FORGOTTEN_KEEP: Duration = Duration::from_secs(30 * 24 * 3600);

/// Where calls claim keys and keep receipts, and how they behave around them. Cheap to clone (one `Arc`);
/// clones share everything.
///
/// ```
/// use samekey_runtime::{MemoryStore, Runtime};
/// let rt = Runtime::builder().store(MemoryStore::new()).node("node07").build().unwrap();
/// assert_eq!(rt.node(), "node07");
/// ```
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    /// The same store when it is the in-memory one: its claim and completion are then called directly,
    /// without a boxed future.
    memory: Option<Arc<MemoryStore>>,
    node: ShortLabel,
    clock: RuntimeClock,
    lease: Duration,
    busy_wait: Duration,
    lookup_polls: u32,
    max_retry_after: Duration,
    jitter_seed: Option<u64>,
    calls_begun: AtomicU64,
    counters: Counters,
    dependencies: Dependencies,
    /// The unanswered claims this runtime is giving back (`crate::unanswered`).
    unanswered: AtomicUsize,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("node", &self.inner.node)
            .field("lease", &self.inner.lease)
            .field("busy_wait", &self.inner.busy_wait)
            .field("lookup_polls", &self.inner.lookup_polls)
            .finish_non_exhaustive()
    }
}

impl Default for Runtime {
    fn default() -> Runtime {
        Runtime::new()
    }
}

impl Runtime {
    /// A runtime on a new in-memory store, with the default settings and node name.
    pub fn new() -> Runtime {
        Runtime::from_parts(
            StoreHandle::new(Arc::new(MemoryStore::new())),
            default_node(),
            Settings::default(),
            None,
            Policies::default(),
        )
    }

    /// Configures a runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    fn from_parts(
        store: StoreHandle,
        node: ShortLabel,
        b: Settings,
        clock: Option<Arc<dyn Clock>>,
        policies: Policies,
    ) -> Runtime {
        let StoreHandle { store, memory } = store;
        Runtime {
            inner: Arc::new(Inner {
                store,
                memory,
                node,
                clock: match clock {
                    Some(clock) => RuntimeClock::Custom(clock),
                    None => RuntimeClock::System(SystemClock),
                },
                lease: b.lease,
                busy_wait: b.busy_wait,
                lookup_polls: b.lookup_polls,
                max_retry_after: b.max_retry_after,
                jitter_seed: b.jitter_seed,
                calls_begun: AtomicU64::new(0),
                counters: Counters::default(),
                dependencies: Dependencies::new(policies),
                unanswered: AtomicUsize::new(0),
            }),
        }
    }

    /// The dependency `name` (its retry budget and concurrency limit), or the runtime's own.
    pub(crate) fn dependency(&self, name: Option<&str>) -> Arc<Dependency> {
        self.inner.dependencies.get(name)
    }

    /// The in-process store, when it is the runtime's store (its calls skip the future).
    pub(crate) fn memory(&self) -> Option<&MemoryStore> {
        self.inner.memory.as_deref()
    }

    /// Whether the dependency `name` (or the runtime's own) has a concurrency limit in force.
    pub(crate) fn limited(&self, name: Option<&str>) -> bool {
        self.inner.dependencies.limited(name)
    }

    /// The current [concurrency limit](crate::limits#concurrency-limits) of the dependency `name`
    /// (`budget = "…"`; `None`: the runtime's own calls): `None` while it is unlimited, as it is until
    /// the dependency answers `RateLimited`.
    pub fn concurrency_limit(&self, dependency: Option<&str>) -> Option<u32> {
        self.dependency(dependency).limiter.limit()
    }

    /// The lookup budget.
    pub(crate) fn lookup_budget(&self) -> &Budget {
        self.inner.dependencies.lookups()
    }

    /// The store.
    pub fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// The node name written into callIds.
    pub fn node(&self) -> &str {
        self.inner.node.as_str()
    }

    pub(crate) fn node_label(&self) -> &ShortLabel {
        &self.inner.node
    }

    /// The runtime's clock (a context carries it, for "now" at a write its body makes).
    pub(crate) fn clock(&self) -> &RuntimeClock {
        &self.inner.clock
    }

    /// The runtime's time: Unix milliseconds from its [`Clock`] (the system clock, read fresh, unless
    /// [`RuntimeBuilder::clock`] gave another).
    pub fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// Now, or a few milliseconds before: see `RuntimeClock::recent_ms`.
    pub(crate) fn recent_ms(&self) -> u64 {
        self.inner.clock.recent_ms()
    }

    pub(crate) fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// The unanswered claims this runtime is giving back.
    pub(crate) fn unanswered(&self) -> &AtomicUsize {
        &self.inner.unanswered
    }

    pub(crate) fn busy_wait(&self) -> Duration {
        self.inner.busy_wait
    }

    pub(crate) fn lookup_polls(&self) -> u32 {
        self.inner.lookup_polls
    }

    pub(crate) fn max_retry_after(&self) -> Duration {
        self.inner.max_retry_after
    }

    /// The seed of a new call's jitter: from the configured seed and the call's rank when there is one
    /// (reproducible runs), else from the callId's random entropy.
    pub(crate) fn jitter_seed(&self, call_id: &CallId) -> u64 {
        match self.inner.jitter_seed {
            Some(seed) => {
                let rank = self.inner.calls_begun.fetch_add(1, Ordering::Relaxed);
                seed ^ rank.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            }
            None => call_id.entropy() ^ 0x5851_f42d_4c95_7f2d,
        }
    }

    /// What this runtime (and its clones) did so far, in this process: counters of calls, claims,
    /// replays, attempts, lookups, retries, waits, unknowns, releases and store failures (see
    /// [`RuntimeStats`]). A snapshot, cheap to take (relaxed atomic reads); other processes on the same store
    /// keep their own.
    ///
    /// ```
    /// let rt = samekey_runtime::Runtime::new();
    /// let stats = rt.stats();
    /// assert_eq!((stats.calls, stats.replays), (0, 0));
    /// ```
    pub fn stats(&self) -> RuntimeStats {
        self.inner.counters.snapshot()
    }

    pub(crate) fn count(&self, counter: Counter) {
        self.inner.counters.add(counter);
    }

    /// The receipt of `call_id` — its key, state (`PROCESSING`, `SUCCESS`, `FAILED`, `UNKNOWN`, …), fence,
    /// lease and expiry, and stored outcome — answered from the store alone (nothing downstream is
    /// called). `None` when the store has no record of that callId: never claimed, released (every
    /// attempt refused before taking effect, or `Rejected`), or expired after its `ttl`.
    ///
    /// ```
    /// # async fn demo(rt: samekey_runtime::Runtime, call_id: samekey_runtime::CallId) -> Result<(), samekey_runtime::Error> {
    /// use samekey_runtime::ReceiptState;
    /// if let Some(receipt) = rt.receipt(&call_id).await? {
    ///     if receipt.state == ReceiptState::Unknown {
    ///         // Ask the counterparty, then resolve it (or leave it to compensation).
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn receipt(&self, call_id: &CallId) -> Result<Option<Receipt>, Error> {
        Ok(self.inner.store.get_by_call_id(call_id).await?)
    }

    /// What is known of a call: its receipt and its journal (every attempt, backoff, lookup, take-over,
    /// transition and compensation step: see [`journal`](crate::journal)), read from the store alone —
    /// also for a call still running in another process, and for one whose claim was given back.
    /// [`CallHistory::timeline`] adds what the receipt implies (the claim, the outcome) to the journal.
    ///
    /// ```
    /// # async fn demo(rt: samekey_runtime::Runtime, call_id: samekey_runtime::CallId) -> Result<(), samekey_runtime::Error> {
    /// for event in rt.history(&call_id).await?.timeline() {
    ///     println!("{} {} {:?}", event.at_ms, event.node, event.what);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn history(&self, call_id: &CallId) -> Result<CallHistory, Error> {
        let store = self.store();
        let receipt = store.get_by_call_id(call_id).await?;
        let events = store.journal_of_call(call_id, self.now_ms()).await?;
        Ok(CallHistory { receipt, events })
    }

    /// What is known of a key: the receipt it holds now and the journal of every call on it that the
    /// store still keeps (a call given back, then the next one that claimed the key).
    pub async fn history_of_key(&self, key: &Key) -> Result<CallHistory, Error> {
        let store = self.store();
        let now = self.now_ms();
        let receipt = store.get(key, now).await?;
        let events = store.journal(key, now).await?;
        Ok(CallHistory { receipt, events })
    }

    /// Forgets the finished call on `key` — its `SUCCESS` or `FAILED` outcome — so that the key may be
    /// claimed again and a new call on it runs: what a support engineer does when a customer must
    /// redo an operation. `who` decided it for `why`; both are logged and journaled (the key's
    /// journal keeps the call's events and the forgetting for [`FORGOTTEN_KEEP`] at least). Answers
    /// the receipt that was forgotten.
    ///
    /// Refused ([`Error::NotFinished`]) for a call that has not finished: a `PROCESSING` one may be
    /// running, and an `UNKNOWN` one may have taken effect (resolve it first, with
    /// [`Compensator::resolve`](crate::Compensator::resolve)). Refused too
    /// ([`Error::OpenCompensation`]) for a finished call that a compensation entry still covers: a
    /// `FAILED` record whose request took effect waits in the queue for a person, and a redo after
    /// forgetting it would run a second time. [`StoreError::NotFound`] when the key holds nothing; a
    /// call that settled or moved on meanwhile is refused by the store's fence.
    ///
    /// ```
    /// # async fn demo(rt: samekey_runtime::Runtime) -> Result<(), samekey_runtime::Error> {
    /// let mut key = samekey_runtime::key::KeyBuilder::new("orders.charge");
    /// key.part("o-1");
    /// let forgotten = rt.forget(&key.finish(), "alice", "ticket 4711: customer redoes the order").await;
    /// # let _ = forgotten; Ok(()) }
    /// ```
    pub async fn forget(&self, key: &Key, who: &str, why: &str) -> Result<Receipt, Error> {
        let store = self.store();
        let record = store
            .get(key, self.now_ms())
            .await?
            .ok_or(StoreError::NotFound)?;
        if !record.state.is_terminal() {
            return Err(Error::NotFinished {
                call_id: record.call_id,
                state: record.state,
            });
        }
        // A rare, manual operation: reading the queue through is affordable here.
        if let Some(entry) = store
            .list_compensations()
            .await?
            .into_iter()
            .find(|entry| entry.call_id == record.call_id)
        {
            return Err(Error::OpenCompensation {
                call_id: record.call_id,
                state: record.state,
                reason: entry.reason,
            });
        }
        store.forget(key, record.fence).await?;
        tracing::warn!(target: "samekey", call_id = %record.call_id, key = %key.short(),
            state = %record.state, who, why, "finished call forgotten by hand");
        let forgotten = EventKind::Forgotten {
            state: record.state,
            who: who.to_owned(),
            why: why.to_owned(),
        };
        let event = self.event(&record.call_id, forgotten);
        self.journal(key, &[event], FORGOTTEN_KEEP).await;
        Ok(record)
    }

    /// Appends events to a key's journal, warning (not failing) when the store refuses: the journal
    /// informs people; it decides nothing.
    pub(crate) async fn journal(&self, key: &Key, events: &[Event], keep: Duration) {
        let keep_ms = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
        if let Err(e) = self
            .store()
            .append_journal(key, events, keep_ms, self.now_ms())
            .await
        {
            tracing::warn!(target: "samekey", key = %key.short(), error = %e, events = events.len(),
                "could not write to the journal");
        }
    }

    /// An event of `call_id` written by this runtime now.
    pub(crate) fn event(&self, call_id: &CallId, what: EventKind) -> Event {
        Event {
            call_id: call_id.clone(),
            at_ms: self.now_ms(),
            node: self.node().to_owned(),
            what,
        }
    }

    /// The compensation queue: every call left `UNKNOWN` (its outcome could not be established) that is
    /// pending or escalated, with its callId, key, reason, rounds and due time. A call whose outcome is
    /// later recorded (a duplicate took it over and `lookup` answered) leaves the queue.
    pub async fn compensations(&self) -> Result<Vec<CompensationEntry>, Error> {
        Ok(self.inner.store.list_compensations().await?)
    }

    /// Makes this runtime the process-wide default, used by functions without `runtime = …`. Do it before
    /// the first call: once the default is set or used, this answers [`Error::DefaultAlreadySet`].
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// samekey_runtime::Runtime::builder().node("api-7").build()?.install_default()?;
    /// # Ok(()) }
    /// ```
    pub fn install_default(self) -> Result<(), Error> {
        DEFAULT.set(self).map_err(|_| Error::DefaultAlreadySet)
    }

    /// Runs `future` with this runtime in place of the default: every `#[idempotent]` call made in it
    /// (in this task) that has no `runtime = …` uses this runtime, its store and its clock. This is how
    /// a test gets a fresh store of its own although the process-wide default cannot be reset; a
    /// service can use it to give one request path another store. Nested scopes: the innermost wins.
    ///
    /// ```
    /// # use samekey_runtime::Runtime;
    /// # async fn demo() {
    /// let rt = Runtime::builder().node("test").build().unwrap();
    /// rt.scope(async {
    ///     // `charge("o-1").await` here claims its key in `rt`'s store, not the default one.
    /// })
    /// .await;
    /// assert_eq!(rt.stats().calls, 0);
    /// # }
    /// ```
    pub async fn scope<F: std::future::Future>(&self, future: F) -> F::Output {
        SCOPED.scope(self.clone(), future).await
    }
}

static DEFAULT: OnceLock<Runtime> = OnceLock::new();

tokio::task_local! {
    static SCOPED: Runtime;
}

/// The runtime a call without `runtime = …` uses: the one of the enclosing [`Runtime::scope`], else the
/// process-wide default.
pub(crate) fn ambient_runtime() -> Runtime {
    SCOPED
        .try_with(Runtime::clone)
        .unwrap_or_else(|_| default_runtime().clone())
}

/// The runtime a call without `runtime = …` uses here: the one of the enclosing [`Runtime::scope`],
/// else the process-wide default ([`default_runtime`]). For an integration that reads the store its
/// calls run on (a message inbox deciding what to tell the broker).
pub fn ambient() -> Runtime {
    ambient_runtime()
}

/// The process-wide default runtime: the installed one, else an in-memory one made on first use.
pub fn default_runtime() -> &'static Runtime {
    DEFAULT.get_or_init(Runtime::new)
}

/// The node name when none is configured: `SAMEKEY_NODE`, else `HOSTNAME`, made into a valid node name
/// (other characters become `_`, cut to 63 bytes), else `local`.
fn default_node() -> ShortLabel {
    ["SAMEKEY_NODE", "HOSTNAME"]
        .iter()
        .filter_map(|var| std::env::var(var).ok())
        .map(|raw| {
            raw.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                        c
                    } else {
                        '_'
                    }
                })
                .take(crate::call_id::MAX_NODE_LEN)
                .collect::<String>()
        })
        .find(|s| validate_node(s).is_ok())
        .map(ShortLabel::from)
        .unwrap_or(ShortLabel::from_static("local"))
}

#[derive(Clone, Copy)]
struct Settings {
    lease: Duration,
    busy_wait: Duration,
    lookup_polls: u32,
    max_retry_after: Duration,
    jitter_seed: Option<u64>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            lease: DEFAULT_LEASE,
            busy_wait: DEFAULT_BUSY_WAIT,
            lookup_polls: DEFAULT_LOOKUP_POLLS,
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
            jitter_seed: None,
        }
    }
}

/// A store, and the same store as the in-memory one when it is.
struct StoreHandle {
    store: Arc<dyn Store>,
    memory: Option<Arc<MemoryStore>>,
}

impl StoreHandle {
    /// The runtime's store. An `Arc<dyn Store>` or an `Arc<MemoryStore>` handed over as the store
    /// (`.store(Arc::clone(&shared))`) is seen through: the runtime holds the shared store itself, so a
    /// downcast of [`Runtime::store`] finds its type, not `Arc`'s, and the in-memory store keeps its
    /// direct calls. A store that wraps the in-memory one never gets them: it sees every call.
    fn new(store: Arc<dyn Store>) -> StoreHandle {
        let any: Arc<dyn Any + Send + Sync> = store.clone();
        let store = match any.downcast::<Arc<dyn Store>>() {
            Ok(shared) => Arc::clone(&*shared),
            Err(any) => match any.downcast::<Arc<MemoryStore>>() {
                Ok(memory) => Arc::clone(&*memory) as Arc<dyn Store>,
                Err(_) => store,
            },
        };
        let any: Arc<dyn Any + Send + Sync> = store.clone();
        StoreHandle {
            memory: any.downcast::<MemoryStore>().ok(),
            store,
        }
    }
}

/// Configures a [`Runtime`].
#[derive(Default)]
pub struct RuntimeBuilder {
    store: Option<StoreHandle>,
    node: Option<String>,
    settings: Settings,
    clock: Option<Arc<dyn Clock>>,
    policies: Policies,
}

impl RuntimeBuilder {
    /// The store (default: a new [`MemoryStore`]). A store kept by other code too is handed over as
    /// an `Arc` (`.store(Arc::clone(&store))`): the runtime and that code then use the one store. An
    /// `Arc<dyn Store>` or an `Arc<MemoryStore>` is that store itself to the runtime: a downcast of
    /// [`Runtime::store`] finds its type, not `Arc`'s, and the in-memory store keeps its direct calls.
    pub fn store(self, store: impl Store) -> RuntimeBuilder {
        self.shared_store(Arc::new(store))
    }

    /// A store shared with other code.
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> RuntimeBuilder {
        self.store = Some(StoreHandle::new(store));
        self
    }

    /// The node name written into callIds (their last field): 1–63 ASCII letters, digits, `_`, `.` or
    /// `-`, so a host or pod name is a node name as it is (`"api-7"`). Default: `SAMEKEY_NODE`, else
    /// `HOSTNAME` (other characters replaced by `_`), else `local`. [`build`](RuntimeBuilder::build) refuses
    /// anything else with an error that names the node.
    pub fn node(mut self, node: impl Into<String>) -> RuntimeBuilder {
        self.node = Some(node.into());
        self
    }

    /// How long a claim holds a key when the function has no `timeout` (default 30 s). After it, the
    /// owner is presumed gone and a duplicate resolves the key through `lookup`. While an attempt runs,
    /// the call renews its lease every third of it, so a slow body keeps its key.
    ///
    /// A function with a `timeout` does not use this setting: its lease is its timeout plus the
    /// larger of the timeout and one second (`timeout = "3s"` holds the key 6 s at a time), since no
    /// attempt outlives its timeout.
    ///
    /// At least one millisecond (a shorter lease is taken as 1 ms): a take-over then always comes at a
    /// later millisecond than the claim it takes over, which is how a claim as written is told from a
    /// taken-over one.
    pub fn lease(mut self, lease: Duration) -> RuntimeBuilder {
        self.settings.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// How long a duplicate waits for a busy key before [`Error::InProgress`] (default 30 s).
    pub fn busy_wait(mut self, wait: Duration) -> RuntimeBuilder {
        self.settings.busy_wait = wait;
        self
    }

    /// How many times a lookup answering "processing" is asked again before the call is left `UNKNOWN`
    /// (default 5).
    pub fn lookup_polls(mut self, polls: u32) -> RuntimeBuilder {
        self.settings.lookup_polls = polls;
        self
    }

    /// The retry budget of this runtime's calls (default [`DEFAULT_RETRY_BUDGET`](crate::limits::DEFAULT_RETRY_BUDGET): over 10 s, 10 retries
    /// per second plus 20 % of the calls), shared by every function that names no dependency;
    /// [`RetryBudget::unlimited`] switches it off. See [retry budgets](crate::limits#retry-budgets).
    pub fn retry_budget(mut self, budget: RetryBudget) -> RuntimeBuilder {
        self.policies.retries = budget;
        self
    }

    /// The budget of `lookup`s (default [`DEFAULT_LOOKUP_BUDGET`](crate::limits::DEFAULT_LOOKUP_BUDGET): over 10 s, 20 per second plus one
    /// per call): a lookup is a read, not a retry, and draws from this budget only.
    pub fn lookup_budget(mut self, budget: RetryBudget) -> RuntimeBuilder {
        self.policies.lookups = Some(budget);
        self
    }

    /// The retry budget of the dependency `name`, for the functions that name it
    /// (`#[idempotent(budget = "payments")]`): a window of its own, so that one failing dependency
    /// does not spend the retries of others. A name never set here gets the runtime's retry policy,
    /// in a window of its own.
    pub fn budget(mut self, name: impl Into<String>, budget: RetryBudget) -> RuntimeBuilder {
        self.policies.named_retries.insert(name.into(), budget);
        self
    }

    /// The adaptive concurrency limit of this runtime's calls (default
    /// [`DEFAULT_CONCURRENCY_LIMIT`](crate::limits::DEFAULT_CONCURRENCY_LIMIT): unlimited until the
    /// dependency answers `RateLimited`, then AIMD), shared by every function that names no
    /// dependency; [`ConcurrencyLimit::off`] switches it off. See
    /// [concurrency limits](crate::limits#concurrency-limits).
    pub fn concurrency_limit(mut self, limit: ConcurrencyLimit) -> RuntimeBuilder {
        self.policies.concurrency = limit;
        self
    }

    /// The adaptive concurrency limit of the dependency `name`, for the functions that name it
    /// (`#[idempotent(budget = "payments")]`): one dependency's `RateLimited` answers slow down its
    /// own calls only. A name never set here gets the runtime's policy, with a limit of its own.
    pub fn concurrency(
        mut self,
        name: impl Into<String>,
        limit: ConcurrencyLimit,
    ) -> RuntimeBuilder {
        self.policies.named_concurrency.insert(name.into(), limit);
        self
    }

    /// The longest `retry_after` (from [`ErrorClass::RateLimited`](crate::ErrorClass::RateLimited)) a
    /// call waits before its next attempt (default 60 s). A rate-limited attempt is always followed by
    /// a wait of at least its `retry_after`, even beyond the function's backoff cap; a `retry_after`
    /// longer than this ends the call at once instead (nothing ran: the claim is released and the
    /// caller gets the rate-limit error, with the `retry_after` it carries).
    pub fn max_retry_after(mut self, max: Duration) -> RuntimeBuilder {
        self.settings.max_retry_after = max;
        self
    }

    /// The clock this runtime stamps callIds with, buckets `window` keys by and hands to stores that
    /// take the caller's time (default: [`SystemClock`]). A test with tokio's time paused gives a
    /// [`TokioClock`](crate::clock::TokioClock), so that `tokio::time::advance` ends leases and TTLs; a
    /// simulation or a test of clock skew gives its own. The shared stores (PostgreSQL, Redis) judge
    /// leases and expiries by their own clock whatever this one says.
    pub fn clock(mut self, clock: impl Clock) -> RuntimeBuilder {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Draws backoff jitter from this seed instead of from each callId's random entropy, so that a
    /// simulation or a test with the same inputs waits the same delays (default: random). Production
    /// code leaves it unset: jitter exists to spread clients apart.
    pub fn jitter_seed(mut self, seed: u64) -> RuntimeBuilder {
        self.settings.jitter_seed = Some(seed);
        self
    }

    /// The runtime; fails if the node name is not valid (see [`node`](RuntimeBuilder::node)).
    pub fn build(self) -> Result<Runtime, ParseCallIdError> {
        let node = match self.node {
            Some(node) => {
                validate_node(&node)?;
                ShortLabel::from(node)
            }
            None => default_node(),
        };
        let store = self
            .store
            .unwrap_or_else(|| StoreHandle::new(Arc::new(MemoryStore::new())));
        Ok(Runtime::from_parts(
            store,
            node,
            self.settings,
            self.clock,
            self.policies,
        ))
    }
}
