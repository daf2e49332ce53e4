//! The store conformance suite on the in-memory store, and on stores that wrap it: through an `Arc`,
//! through a `Box<dyn Store>`, and through `StoreWrapper`s that write one method or only `around`, so
//! that every method the forwarding base forwards is checked whole.
//!
//! (Was `tests/memory_conformance.rs`.)

samekey_runtime::store_conformance_tests!(std::sync::Arc::new(samekey_runtime::MemoryStore::new()));

/// The suite's store is an `Arc<dyn Store>` whose store is itself an `Arc`: `Arc<S>`'s own `Store`.
mod through_an_arc {
    samekey_runtime::store_conformance_tests!(std::sync::Arc::new(std::sync::Arc::new(
        samekey_runtime::MemoryStore::new()
    )));
}

/// `Box<dyn Store>`'s own `Store`: a backend picked at run time.
mod through_a_box {
    use samekey_runtime::{MemoryStore, Store};

    fn boxed() -> Box<dyn Store> {
        Box::new(MemoryStore::new())
    }

    samekey_runtime::store_conformance_tests!(std::sync::Arc::new(boxed()));
}

/// A wrapper that writes `get` alone (it counts the reads): the other 27 methods are the forwarding
/// base's.
mod through_a_wrapper_that_writes_one_method {
    use std::sync::atomic::{AtomicU64, Ordering};

    use samekey_runtime::store::{async_trait, StoreWrapper};
    use samekey_runtime::{store::StoreError, Key, MemoryStore, Receipt, Store};

    pub struct CountedReads {
        store: MemoryStore,
        reads: AtomicU64,
    }

    #[async_trait]
    impl StoreWrapper for CountedReads {
        type Inner = MemoryStore;

        fn wrapped(&self) -> &MemoryStore {
            &self.store
        }

        async fn get(this: &Self, key: &Key, now_ms: u64) -> Result<Option<Receipt>, StoreError> {
            this.reads.fetch_add(1, Ordering::Relaxed);
            this.store.get(key, now_ms).await
        }
    }

    fn counted() -> CountedReads {
        CountedReads {
            store: MemoryStore::new(),
            reads: AtomicU64::new(0),
        }
    }

    samekey_runtime::store_conformance_tests!(std::sync::Arc::new(counted()));

    /// The one method written is the wrapper's, the others the wrapped store's.
    #[tokio::test]
    async fn the_method_written_is_the_wrapper_s() {
        let store = counted();
        let key = Key::build("wrapper", &1u64);
        assert_eq!(store.get(&key, 1_000).await, Ok(None));
        assert_eq!(store.reads.load(Ordering::Relaxed), 1);
        assert_eq!(store.journal(&key, 1_000).await, Ok(Vec::new()));
        assert_eq!(
            store.reads.load(Ordering::Relaxed),
            1,
            "a journal read is no get"
        );
        assert_eq!(store.kind(), "memory");
    }
}

/// A wrapper that writes `around` alone (it counts every operation and delays each by a yield): every
/// forwarded method passes through it.
mod through_a_wrapper_around_every_operation {
    use std::sync::atomic::{AtomicU64, Ordering};

    use samekey_runtime::store::{StoreFuture, StoreWrapper};
    use samekey_runtime::{Key, MemoryStore, Store};

    pub struct Around {
        store: MemoryStore,
        operations: AtomicU64,
    }

    impl StoreWrapper for Around {
        type Inner = MemoryStore;

        fn wrapped(&self) -> &MemoryStore {
            &self.store
        }

        fn around<'a, T: Send + 'a>(
            &'a self,
            _op: &'static str,
            call: StoreFuture<'a, T>,
        ) -> StoreFuture<'a, T> {
            self.operations.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move {
                tokio::task::yield_now().await;
                call.await
            })
        }
    }

    fn around() -> Around {
        Around {
            store: MemoryStore::new(),
            operations: AtomicU64::new(0),
        }
    }

    samekey_runtime::store_conformance_tests!(std::sync::Arc::new(around()));

    #[tokio::test]
    async fn every_operation_passes_around() {
        let store = around();
        let key = Key::build("wrapper", &2u64);
        assert_eq!(store.get(&key, 1_000).await, Ok(None));
        assert_eq!(store.journal(&key, 1_000).await, Ok(Vec::new()));
        assert_eq!(store.now_ms(1_000).await, Ok(1_000));
        assert_eq!(store.operations.load(Ordering::Relaxed), 3);
        assert_eq!(
            store.kind(),
            "memory",
            "not an operation: the wrapped store's"
        );
    }
}
