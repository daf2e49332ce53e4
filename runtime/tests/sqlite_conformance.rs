//! The store conformance suite on SQLite, each test on a fresh database file.
#![cfg(feature = "sqlite")]

use std::sync::Arc;

use samekey_runtime::store::SqliteStore;

async fn fresh() -> Arc<SqliteStore> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "sqlite-conformance-{}",
        samekey_runtime::TraceId::new()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    Arc::new(
        SqliteStore::open(dir.join("receipts.db"))
            .await
            .expect("open SQLite"),
    )
}

samekey_runtime::store_conformance_tests!(fresh().await);
