//! Many duplicates of one key at once: one execution, the same answer for all.
//!
//! (Was `tests/concurrency.rs`; the concurrency limit is `limits::concurrency_limit`.)

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use samekey::{idempotent, Runtime};
use support::TestError;

struct Orders {
    rt: Runtime,
    executions: AtomicU32,
}

impl Orders {
    #[idempotent(key = "order_id", runtime = &self.rt)]
    async fn create(&self, order_id: u64) -> Result<(u64, u32), TestError> {
        let n = self.executions.fetch_add(1, Ordering::SeqCst) + 1;
        // Long enough that every duplicate arrives while the first is still running.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok((order_id, n))
    }
}

async fn thousand_duplicates() {
    let orders = Arc::new(Orders {
        rt: Runtime::new(),
        executions: AtomicU32::new(0),
    });
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..1_000 {
        let orders = orders.clone();
        set.spawn(async move { orders.create(42).await });
    }
    let mut results = Vec::with_capacity(1_000);
    while let Some(joined) = set.join_next().await {
        results.push(joined.expect("task"));
    }
    assert_eq!(orders.executions.load(Ordering::SeqCst), 1, "one execution");
    assert_eq!(results.len(), 1_000);
    assert!(
        results.iter().all(|r| r == &Ok((42, 1))),
        "1,000 identical results"
    );
}

#[tokio::test(start_paused = true)]
async fn thousand_duplicates_one_thread_paused_time() {
    thousand_duplicates().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_duplicates_four_threads() {
    thousand_duplicates().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn distinct_keys_run_in_parallel() {
    let orders = Arc::new(Orders {
        rt: Runtime::new(),
        executions: AtomicU32::new(0),
    });
    let mut set = tokio::task::JoinSet::new();
    for id in 0..500u64 {
        for _ in 0..2 {
            let orders = orders.clone();
            set.spawn(async move { (id, orders.create(id).await) });
        }
    }
    while let Some(joined) = set.join_next().await {
        let (id, result) = joined.expect("task");
        assert_eq!(result.map(|r| r.0), Ok(id));
    }
    assert_eq!(orders.executions.load(Ordering::SeqCst), 500);
}
