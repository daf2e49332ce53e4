//! The store conformance suite on PostgreSQL. Needs a server: `SAMEKEY_PG_URL` (see
//! `scripts/services`); without it every test prints that it was skipped.
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
