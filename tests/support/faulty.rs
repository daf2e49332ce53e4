//! A store wrapper that models the timing and the failures of a real backend around any [`Store`]: an
//! operation can be made to fail, to wait for a gate before it reaches the store (a slow round trip, a
//! pool acquire) or after it was applied (a process that stalls once its write went through: a GC
//! pause, a SIGSTOP). It also records the name of every operation asked of it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::store::{async_trait, Claim, Claimed, Completion, StoreClock};
use samekey::{
    compensation::CompensationEntry, journal::Event, receipt::Fence, receipt::Transition,
    store::StoreError, CallId, Key, Receipt, Store,
};
use tokio::sync::Semaphore;

/// What the next call of one operation does.
#[derive(Clone)]
pub enum Act {
    /// Waits for the gate, then reaches the store.
    Before(Gate),
    /// Reaches the store, then waits for the gate before it answers.
    After(Gate),
    /// Fails with this error without reaching the store.
    Fail(StoreError),
    /// Reaches the store, then fails with this error: the operation took effect and its answer was
    /// lost (a server that crashed after its commit, a connection reset).
    Lose(StoreError),
    /// Reaches the store twice, and answers the second time: a client that re-sent the operation
    /// after a reset, once the first had taken effect (the Redis Cluster client does). `claim` only.
    Resend,
}

/// A gate an operation waits at until the test opens it. Cloning shares it.
#[derive(Clone)]
pub struct Gate {
    permits: Arc<Semaphore>,
    reached: Arc<Semaphore>,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            permits: Arc::new(Semaphore::new(0)),
            reached: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Lets one waiting (or future) operation through.
    pub fn open(&self) {
        self.permits.add_permits(1);
    }

    /// Waits until an operation arrived at the gate.
    pub async fn reached(&self) {
        self.reached
            .acquire()
            .await
            .expect("gate semaphore is never closed")
            .forget();
    }

    async fn pass(&self) {
        self.reached.add_permits(1);
        self.permits
            .acquire()
            .await
            .expect("gate semaphore is never closed")
            .forget();
    }
}

/// The wrapper. Share it as `Arc<Faulty>` between the runtime and the test.
pub struct Faulty {
    inner: Arc<dyn Store>,
    plan: Mutex<HashMap<&'static str, VecDeque<Act>>>,
    ops: Mutex<Vec<&'static str>>,
    down: AtomicBool,
}

impl Faulty {
    pub fn new(inner: Arc<dyn Store>) -> Faulty {
        Faulty {
            inner,
            plan: Mutex::new(HashMap::new()),
            ops: Mutex::new(Vec::new()),
            down: AtomicBool::new(false),
        }
    }

    /// A store that is down: every operation fails with [`StoreError::Unavailable`].
    pub fn down() -> Faulty {
        let store = Faulty::new(Arc::new(samekey::MemoryStore::new()));
        store.set_down(true);
        store
    }

    /// What the next calls of `op` (a [`Store`] method's name) do, in order; after them, calls pass.
    pub fn plan(&self, op: &'static str, acts: impl IntoIterator<Item = Act>) {
        self.plan
            .lock()
            .unwrap()
            .entry(op)
            .or_default()
            .extend(acts);
    }

    /// Makes every operation fail with [`StoreError::Unavailable`] (or pass again).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// The operations asked so far, in order, and forgets them.
    pub fn take_ops(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.ops.lock().unwrap())
    }

    /// The store under the wrapper.
    pub fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn run<R>(
        &self,
        op: &'static str,
        call: impl std::future::Future<Output = Result<R, StoreError>>,
    ) -> Result<R, StoreError> {
        self.ops.lock().unwrap().push(op);
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("store is down (test)".into()));
        }
        let act = self
            .plan
            .lock()
            .unwrap()
            .get_mut(op)
            .and_then(VecDeque::pop_front);
        match act {
            None => call.await,
            Some(Act::Resend) => panic!("Act::Resend is for claim only"),
            Some(Act::Fail(e)) => Err(e),
            Some(Act::Lose(e)) => call.await.and(Err(e)),
            Some(Act::Before(gate)) => {
                gate.pass().await;
                call.await
            }
            Some(Act::After(gate)) => {
                let out = call.await;
                gate.pass().await;
                out
            }
        }
    }
}

#[async_trait]
impl Store for Faulty {
    async fn claim(&self, claim: Claim) -> Result<Claimed, StoreError> {
        let resend = {
            let mut plan = self.plan.lock().unwrap();
            let next = plan.get_mut("claim");
            match next {
                Some(acts) if matches!(acts.front(), Some(Act::Resend)) => {
                    acts.pop_front().is_some()
                }
                _ => false,
            }
        };
        if resend && !self.down.load(Ordering::SeqCst) {
            self.ops.lock().unwrap().push("claim");
            self.inner.claim(claim.clone()).await?;
            return self.inner.claim(claim).await;
        }
        self.run("claim", self.inner.claim(claim)).await
    }
    async fn take_over(&self, key: &Key, f: Fence, l: u64, n: u64) -> Result<Claimed, StoreError> {
        self.run("take_over", self.inner.take_over(key, f, l, n))
            .await
    }
    async fn extend_lease(&self, key: &Key, f: Fence, l: u64, n: u64) -> Result<(), StoreError> {
        self.run("extend_lease", self.inner.extend_lease(key, f, l, n))
            .await
    }
    async fn complete(
        &self,
        key: &Key,
        f: Fence,
        c: Completion,
        n: u64,
    ) -> Result<Transition, StoreError> {
        self.run("complete", self.inner.complete(key, f, c, n))
            .await
    }
    async fn mark_unknown(&self, key: &Key, f: Fence, n: u64) -> Result<Transition, StoreError> {
        self.run("mark_unknown", self.inner.mark_unknown(key, f, n))
            .await
    }
    async fn release(&self, key: &Key, f: Fence) -> Result<(), StoreError> {
        self.run("release", self.inner.release(key, f)).await
    }
    async fn forget(&self, key: &Key, f: Fence) -> Result<(), StoreError> {
        self.run("forget", self.inner.forget(key, f)).await
    }
    async fn get(&self, key: &Key, n: u64) -> Result<Option<Receipt>, StoreError> {
        self.run("get", self.inner.get(key, n)).await
    }
    async fn get_by_call_id(&self, id: &CallId) -> Result<Option<Receipt>, StoreError> {
        self.run("get_by_call_id", self.inner.get_by_call_id(id))
            .await
    }
    async fn wait_settled(
        &self,
        key: &Key,
        t: Duration,
        n: u64,
    ) -> Result<Option<Receipt>, StoreError> {
        self.run("wait_settled", self.inner.wait_settled(key, t, n))
            .await
    }
    fn clock(&self) -> StoreClock {
        self.inner.clock()
    }
    async fn now_ms(&self, n: u64) -> Result<u64, StoreError> {
        self.run("now_ms", self.inner.now_ms(n)).await
    }
    async fn purge_expired(&self, n: u64) -> Result<usize, StoreError> {
        self.run("purge_expired", self.inner.purge_expired(n)).await
    }
    async fn list_receipts(
        &self,
        q: &samekey::store::ReceiptQuery,
        n: u64,
    ) -> Result<samekey::store::ReceiptPage, StoreError> {
        self.run("list_receipts", self.inner.list_receipts(q, n))
            .await
    }
    async fn list_orphans(&self, n: u64, l: usize) -> Result<Vec<Receipt>, StoreError> {
        self.run("list_orphans", self.inner.list_orphans(n, l))
            .await
    }
    async fn enqueue_compensation(&self, e: CompensationEntry) -> Result<(), StoreError> {
        self.run("enqueue_compensation", self.inner.enqueue_compensation(e))
            .await
    }
    async fn take_due_compensations(
        &self,
        n: u64,
        l: usize,
        u: u64,
    ) -> Result<Vec<CompensationEntry>, StoreError> {
        self.run(
            "take_due_compensations",
            self.inner.take_due_compensations(n, l, u),
        )
        .await
    }
    async fn reschedule_compensation(
        &self,
        id: &CallId,
        f: Fence,
        r: u32,
        d: u64,
        n: u64,
    ) -> Result<(), StoreError> {
        self.run(
            "reschedule_compensation",
            self.inner.reschedule_compensation(id, f, r, d, n),
        )
        .await
    }
    async fn finish_compensation(&self, id: &CallId, f: Option<Fence>) -> Result<(), StoreError> {
        self.run("finish_compensation", self.inner.finish_compensation(id, f))
            .await
    }
    async fn escalate_compensation(&self, id: &CallId, f: Fence, n: u64) -> Result<(), StoreError> {
        self.run(
            "escalate_compensation",
            self.inner.escalate_compensation(id, f, n),
        )
        .await
    }
    async fn list_compensations(&self) -> Result<Vec<CompensationEntry>, StoreError> {
        self.run("list_compensations", self.inner.list_compensations())
            .await
    }
    async fn append_journal(
        &self,
        k: &Key,
        events: &[Event],
        keep: u64,
        n: u64,
    ) -> Result<(), StoreError> {
        self.run(
            "append_journal",
            self.inner.append_journal(k, events, keep, n),
        )
        .await
    }
    async fn journaled_keys(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        self.run("journaled_keys", self.inner.journaled_keys(after, limit))
            .await
    }
    async fn count_expired(&self, n: u64) -> Result<usize, StoreError> {
        self.run("count_expired", self.inner.count_expired(n)).await
    }
    async fn journal(&self, k: &Key, n: u64) -> Result<Vec<Event>, StoreError> {
        self.run("journal", self.inner.journal(k, n)).await
    }
    async fn journal_of_call(&self, id: &CallId, n: u64) -> Result<Vec<Event>, StoreError> {
        self.run("journal_of_call", self.inner.journal_of_call(id, n))
            .await
    }
}
