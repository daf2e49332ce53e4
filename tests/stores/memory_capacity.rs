//! A bounded in-memory store under calls (`MemoryStore::with_capacity`): at steady state it holds its
//! capacity, a duplicate inside the window replays, and a store full of calls in flight fails new
//! calls closed (nothing runs) instead of evicting one.

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use samekey::{clock::TokioClock, idempotent, store::StoreError, Error, MemoryStore, Runtime};
use support::TestError;

struct Svc {
    rt: Runtime,
    runs: AtomicU32,
}

impl Svc {
    fn new(capacity: usize) -> Svc {
        Svc {
            rt: Runtime::builder()
                .node("capacity")
                .clock(TokioClock::new())
                .store(MemoryStore::with_capacity(capacity))
                .build()
                .unwrap(),
            runs: AtomicU32::new(0),
        }
    }

    #[idempotent(key = "order", scope = "capacity.charge", runtime = &self.rt)]
    async fn charge(&self, order: u64, hold: Duration) -> Result<u64, TestError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(hold).await;
        Ok(order)
    }

    fn len(&self) -> usize {
        let memory = self.rt.store() as &dyn std::any::Any;
        memory
            .downcast_ref::<MemoryStore>()
            .map_or(0, MemoryStore::len)
    }
}

#[tokio::test(start_paused = true)]
async fn a_bounded_store_keeps_its_capacity_and_replays_inside_it() {
    let svc = Svc::new(6_400);
    for order in 0..30_000 {
        assert_eq!(svc.charge(order, Duration::ZERO).await, Ok(order));
    }
    assert_eq!(svc.len(), 6_400);
    // The last thousand are still there: a duplicate replays.
    for order in 29_000..30_000 {
        assert_eq!(svc.charge(order, Duration::ZERO).await, Ok(order));
    }
    assert_eq!(svc.runs.load(Ordering::SeqCst), 30_000);
}

#[tokio::test(start_paused = true)]
async fn a_store_full_of_calls_in_flight_fails_new_calls_closed() {
    // Room for one record: the call in flight holds it.
    let svc = std::sync::Arc::new(Svc::new(1));
    let slow = tokio::spawn({
        let svc = svc.clone();
        async move { svc.charge(0, Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let refused = svc.charge(1, Duration::ZERO).await;
    assert!(
        matches!(
            refused,
            Err(TestError::Samekey(Error::Store(StoreError::Full {
                capacity: 1
            })))
        ),
        "{refused:?}"
    );
    assert_eq!(
        svc.runs.load(Ordering::SeqCst),
        1,
        "the refused call did not run"
    );
    assert_eq!(
        slow.await.unwrap(),
        Ok(0),
        "the call in flight kept its claim"
    );
    // Finished, the first receipt gives way to the next key.
    assert_eq!(svc.charge(1, Duration::ZERO).await, Ok(1));
    assert_eq!(svc.len(), 1);
}
