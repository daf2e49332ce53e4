//! The store conformance suite through a `LocalCache`: over the in-memory store (its clock the
//! caller's), a bounded one, and PostgreSQL (a clock of its own: needs `SAMEKEY_PG_URL`, else every
//! test of that module prints that it was skipped). Receipts kept in process must not change what the
//! store contract promises: expiry, forgetting, and every claim of a key not finished going through.

mod over_memory {
    samekey_runtime::store_conformance_tests!(std::sync::Arc::new(
        samekey_runtime::store::LocalCache::new(samekey_runtime::MemoryStore::new(), 1_000)
    ));
}

mod over_a_small_bounded_memory {
    // A cache far smaller than what the tests finish: its own eviction is in play too.
    samekey_runtime::store_conformance_tests!(std::sync::Arc::new(
        samekey_runtime::store::LocalCache::new(
            samekey_runtime::MemoryStore::with_capacity(100_000),
            16
        )
    ));
}

#[cfg(feature = "postgres")]
mod over_postgres {
    use std::sync::Arc;

    use samekey_runtime::store::{LocalCache, PgStore};

    async fn store() -> Option<Arc<LocalCache<PgStore>>> {
        let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
            samekey_runtime::conformance::skipped(
                "set SAMEKEY_PG_URL (scripts/services start) to run the PostgreSQL suite",
            );
            return None;
        };
        let store = PgStore::connect(&url)
            .await
            .expect("connect to SAMEKEY_PG_URL");
        Some(Arc::new(LocalCache::new(store, 1_000)))
    }

    samekey_runtime::store_conformance_tests!(optional: store().await);
}
