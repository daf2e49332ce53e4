//! A store wrapper that models the timing and the failures of a real backend around any [`Store`]: an
//! operation can be made to fail, to wait for a gate before it reaches the store (a slow round trip, a
//! pool acquire) or after it was applied (a process that stalls once its write went through: a GC
//! pause, a SIGSTOP). It also records the name of every operation asked of it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use samekey::store::{async_trait, Claim, Claimed, StoreFuture, StoreWrapper};
use samekey::{store::StoreError, Store};
use tokio::sync::Semaphore;

/// What the next call of one operation does.
#[derive(Clone)]
pub enum Act {
    /// Reaches the store and answers, as without a plan (to hold a later call of the operation).
    Pass,
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
            None | Some(Act::Pass) => call.await,
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

/// Every operation goes through [`Faulty::run`]; `claim` also knows [`Act::Resend`].
#[async_trait]
impl StoreWrapper for Faulty {
    type Inner = dyn Store;

    fn wrapped(&self) -> &dyn Store {
        &*self.inner
    }

    fn around<'a, T: Send + 'a>(
        &'a self,
        op: &'static str,
        call: StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        Box::pin(self.run(op, call))
    }

    async fn claim(this: &Self, claim: Claim) -> Result<Claimed, StoreError> {
        let resend = {
            let mut plan = this.plan.lock().unwrap();
            let next = plan.get_mut("claim");
            match next {
                Some(acts) if matches!(acts.front(), Some(Act::Resend)) => {
                    acts.pop_front().is_some()
                }
                _ => false,
            }
        };
        if resend && !this.down.load(Ordering::SeqCst) {
            this.ops.lock().unwrap().push("claim");
            this.inner.claim(claim.clone()).await?;
            return this.inner.claim(claim).await;
        }
        this.run("claim", this.inner.claim(claim)).await
    }

    /// Not the wrapped store's: the metrics label a test store `custom`.
    fn kind(_: &Self) -> &'static str {
        "custom"
    }
}
