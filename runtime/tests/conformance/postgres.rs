//! The store conformance suite on PostgreSQL. Needs a server: `SAMEKEY_PG_URL` (see
//! `scripts/services`); without it every test prints that it was skipped.
//!
//! (Was `tests/postgres_conformance.rs`.)
#![cfg(feature = "postgres")]

use std::sync::Arc;

use samekey_runtime::store::PgStore;

async fn store() -> Option<Arc<PgStore>> {
    let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
        samekey_runtime::conformance::skipped(
            "set SAMEKEY_PG_URL (scripts/services start) to run the PostgreSQL suite",
        );
        return None;
    };
    Some(Arc::new(
        PgStore::connect(&url)
            .await
            .expect("connect to SAMEKEY_PG_URL"),
    ))
}

samekey_runtime::store_conformance_tests!(optional: store().await);

/// An upgrade on an existing database builds the indexes a later release added (concurrently, outside
/// the schema's transaction), and a second migration finds everything in place.
#[tokio::test]
async fn a_missing_later_index_is_built_by_migrate() {
    let Some(store) = store().await else {
        return;
    };
    let index_ok = |store: Arc<PgStore>| async move {
        samekey_runtime::sqlx::query_scalar::<_, bool>(
            "SELECT COALESCE((SELECT indisvalid FROM pg_index
                WHERE indexrelid = to_regclass('samekey_receipts_scope_created')), false)",
        )
        .fetch_one(store.pool())
        .await
        .expect("ask")
    };
    samekey_runtime::sqlx::raw_sql(
        "DROP INDEX CONCURRENTLY IF EXISTS samekey_receipts_scope_created",
    )
    .execute(store.pool())
    .await
    .expect("drop the index, as a database of an earlier release lacks it");
    assert!(!index_ok(store.clone()).await);
    store.migrate().await.expect("migrate");
    assert!(index_ok(store.clone()).await, "built, and valid");
    store.migrate().await.expect("migrate again");
}
